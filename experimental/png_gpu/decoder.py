"""`decode_pngs`: a batch of PNG files to HxWxC uint8 pixels, or a `Fallback` per file.

Per batch: the host parse (`parse.parse_png`), one packed input buffer
(`pack.pack`), one inflate call (`inflate.InflateBackend`), then three kernels
(`kernels`): Adler-32 of every inflated stream, the wavefront unfilter, the
expand to the requested channels. Each image is then checked: its inflated size
equals IHDR's, its Adler-32 equals the stored one, its filter types are valid
and its palette indices in range. An image that fails, or that the parse leaves
out (16-bit, 1/2/4-bit, Adam7, RGB -> grey with a significant gamma, anything
unusual), comes back as a `Fallback`: `cpu_fallback.finish` decodes it with
TensorFlow (libpng, as Keras), which also names a corrupt file.

On a GPU (numba-cuda compiles the kernels; CuPy arrays) the pixels are CuPy
arrays, views into one output buffer. Under numba-cuda's simulator
(NUMBA_ENABLE_CUDASIM=1) the same kernels run on the CPU on numpy arrays: that
is how CI runs them, with `ZlibInflate` standing in for nvCOMP.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from concurrent.futures import Executor
from collections.abc import Sequence

import numpy as np

from experimental.png_gpu.inflate import InflateBackend
from experimental.png_gpu.pack import ADLER_THREADS, BAD_FILTER, BAD_INDEX, pack
from experimental.png_gpu.parse import Fallback, PngLayout, parse_png
from dali_loader.formats.png import PALETTE, RGB, RGBA
from experimental.png_gpu.lazy import import_cupy, import_numba_cuda

CHANNELS = (1, 3, 4)
MAX_BATCH = 65535  # the expand kernel's grid y dimension: larger batches run in parts

# Whether a GPU run has confirmed the batched PNG decoder bit-exact with libpng
# (experimental/png_gpu_check, with nvCOMP): yes, on an H200 on 2026-12-04 (docs/png_gpu.md,
# "Measured on a GPU"). It stays opt-in (`png_decoder="gpu"`): at the batch sizes of training
# (64-256) it decoded fewer images per second than the machine's 16 cores did.
PNG_GPU_VERIFIED = True


@dataclasses.dataclass(frozen=True)
class Launch:
    """Threads per block of the three kernels, and the expand kernel's blocks per image.

    The defaults suit a GPU; tests under the simulator use small ones (each
    simulated thread is a Python thread)."""

    adler_threads: int = ADLER_THREADS
    unfilter_threads: int = 128
    expand_threads: int = 256
    expand_blocks: int = 64

    def __post_init__(self):
        t = self.adler_threads
        if t < 1 or t > ADLER_THREADS or t & (t - 1):
            raise ValueError(f"`adler_threads` must be a power of 2 up to {ADLER_THREADS}. "
                             f"Received: adler_threads={t}")


class PngDecodeStats:
    """Counts of images decoded by the batched decoder and left to the CPU, by reason
    (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.batched = 0
        self.fallbacks: collections.Counter[str] = collections.Counter()

    def add(self, batched: int, reasons: Sequence[str]) -> None:
        with self._lock:
            self.batched += batched
            self.fallbacks.update(reasons)

    def as_dict(self) -> dict:
        with self._lock:
            return {"batched": self.batched, "fallback": sum(self.fallbacks.values()),
                    "fallback_reasons": dict(self.fallbacks)}


def _check_channels(channels: int) -> None:
    if channels not in CHANNELS:
        raise ValueError(f"`channels` must be 1, 3 or 4. Received: channels={channels}")


def _plan_one(data: bytes, channels: int) -> PngLayout | Fallback:
    p = parse_png(bytes(data) if not isinstance(data, bytes) else data)
    if (isinstance(p, PngLayout) and channels == 1 and p.gamma_significant
            and p.color_type in (RGB, PALETTE, RGBA)):
        p = Fallback("RGB -> grey with a significant gamma (libpng converts through gamma tables)")
    return p


def plan(blobs: Sequence[bytes], channels: int,
         executor: Executor | None = None) -> list[PngLayout | Fallback]:
    """The host parse of every file: its layout, or the `Fallback` that sends it to the CPU
    (in `executor`'s threads when given: `zlib.crc32` releases the GIL)."""
    _check_channels(channels)
    if executor is None:
        return [_plan_one(b, channels) for b in blobs]
    return list(executor.map(_plan_one, blobs, [channels] * len(blobs)))


def simulated() -> bool:
    """Whether numba.cuda is the simulator (chosen when numba.cuda was first imported)."""
    return import_numba_cuda().jit.__module__.startswith("numba.cuda.simulator")


def decode_pngs(blobs: Sequence[bytes], channels: int, *, backend: InflateBackend,
                launch: Launch | None = None, stats: PngDecodeStats | None = None,
                executor: Executor | None = None) -> list:
    """Decodes a batch of PNG files to HxWxC uint8 pixels, like `tf.io.decode_png(channels=C)`.

    Args:
        blobs: The files' bytes.
        channels: 1, 3 or 4 (grayscale, rgb, rgba).
        backend: The inflate backend (`NvcompInflate` on a GPU, `ZlibInflate`).
        launch: Kernel launch sizes (default: `Launch()`).
        stats: Counts of batched and fallback images, added to.
        executor: Threads for the host parse and packing (default: this thread).

    Returns:
        Per file, in order: the pixels (a CuPy array on a GPU, numpy under the
        simulator) or a `Fallback` for `cpu_fallback.finish`.
    """
    plans = plan(blobs, channels, executor)
    launch = launch or Launch()
    todo = [i for i, p in enumerate(plans) if isinstance(p, PngLayout)]
    results: list = list(plans)
    for s in range(0, len(todo), MAX_BATCH):
        part = todo[s:s + MAX_BATCH]
        for i, r in zip(part, _run([plans[i] for i in part], channels, backend, launch, executor)):
            results[i] = r
    if stats is not None:
        fb = [r.reason for r in results if isinstance(r, Fallback)]
        stats.add(len(results) - len(fb), fb)
    return results


def _run(layouts: list[PngLayout], channels: int, backend: InflateBackend, launch: Launch,
         executor: Executor | None):
    cuda = import_numba_cuda()
    from experimental.png_gpu.kernels import adler32, expand, unfilter

    batch = pack(layouts, channels, empty=backend.empty_host, executor=executor)
    inflated, sizes = backend.inflate(batch)
    if simulated():
        xp, dev = np, np.asarray
        inflated = np.asarray(inflated)
    else:
        xp = import_cupy()
        dev = xp.asarray
        inflated = xp.asarray(inflated)  # zlib on a GPU host: one copy of the inflated rows
    n = len(batch)
    dst_off, dst_len = dev(batch.dst_off), dev(batch.dst_len)
    width, height, bpp = dev(batch.width), dev(batch.height), dev(batch.bpp)
    adler = xp.zeros(n, np.int64)
    status = xp.zeros(n, np.int32)
    out = xp.zeros(batch.out_total, np.uint8)
    adler32[n, launch.adler_threads](inflated, dst_off, dst_len, adler)
    unfilter[n, launch.unfilter_threads](inflated, dst_off, width, height, bpp, status)
    expand[(launch.expand_blocks, n), launch.expand_threads](
        inflated, dst_off, width, height, bpp, dev(batch.color_type), dev(batch.trns),
        dev(batch.palette), dev(batch.num_palette), out, dev(batch.out_off), channels, status)
    cuda.synchronize()
    adler_h = adler if xp is np else xp.asnumpy(adler)
    status_h = status if xp is np else xp.asnumpy(status)
    results = []
    for i, p in enumerate(layouts):
        if sizes[i] != batch.dst_len[i]:
            results.append(Fallback(
                "inflated stream failed" if sizes[i] < 0 else
                f"inflated size {sizes[i]} is not IHDR's {batch.dst_len[i]}"))
        elif adler_h[i] != batch.adler32[i]:
            results.append(Fallback("Adler-32 of the inflated stream does not match"))
        elif status_h[i] == BAD_FILTER:
            results.append(Fallback("bad filter type"))
        elif status_h[i] == BAD_INDEX:
            results.append(Fallback("palette index out of range"))
        else:
            o = int(batch.out_off[i])
            results.append(out[o:o + p.height * p.width * channels].reshape(
                p.height, p.width, channels))
    return results
