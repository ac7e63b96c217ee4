"""Which PNG decoder runs, and the CPU decode stage that runs Wuffs.

`png_decoder` picks who decodes PNGs (`PngDecoder`), `png_route` says which
decoder runs where for given options (diagnose and bench report it):
- the TF path (the CPU default): the native core (Wuffs behind the front end,
  `native/`) as a TF op in the graph (`tf_png`), exactly TF's pixels, by default
  where the op is built (else libpng, said once); "libpng" forces TF's decoder;
- the DALI path: by default the native core as a DALI operator where it is
  built (`dali_png`; not on a GPU with JPEGs), else DALI's nvImageCodec
  (libpng), which "libpng" forces; "wuffs": Wuffs on the feed's threads (as
  for fills), PNGs entering DALI as raw pixels;
- GPU-ready cache fills: Wuffs on the feed's threads where installed (the core
  through ctypes, `png_native`, else `png_cpu`);
- the tf.data service: TF's libpng (its workers run a pure TF graph);
- "gpu": the batched GPU decoder (`png_batches`).

On the DALI path and for fills, with Wuffs every file is decoded on the feed's
read-ahead threads, where the GIL is released while Wuffs works, at most
`num_threads` at once:
- `KerasPixels`: a file's bytes -> the HxWxC uint8 pixels Keras decodes. PNGs
  through Wuffs; the PNGs it leaves (`png_cpu.Fallback`) and other formats
  through TF's own decoder, eagerly (libpng, libjpeg, as Keras).
- `PixelItems`: item reader of pixels (the base of `RawOrCheckedItems`; the TF
  path decodes in its graph instead, with the native op).
- `RawOrCheckedItems`: item reader for the DALI path: a PNG becomes a raw pixel
  entry (`ready_forms.ReadyForm.RAW`) that DALI only reshapes; other files, and
  PNGs over `BIG_PNG_PIXELS`, stay checked bytes that DALI decodes (JPEG with
  nvJPEG on a GPU; big PNGs on the CPU: TF, as their batch enters DALI).
A file TF rejects raises `CorruptImageError` naming it: the feed's `on_error`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import threading
from collections.abc import Callable

import numpy as np

from dali_loader.decode import png_cpu, png_native
from dali_loader.decode.ready_forms import encode_raw
from dali_loader.decode.tf_kernels import pixels_like_keras
from dali_loader.errors import CorruptImageError
from dali_loader.feed.checks import DEFAULT_MAX_PIXELS, image_size, prepare, size_problem, sniff
from dali_loader.feed.items import read_bytes
from dali_loader.lazy import import_tf

logger = logging.getLogger(__name__)


class PngDecoder(str, enum.Enum):
    """Who decodes PNG files."""

    # Wuffs, TF's pixels: the native core as a TF op on the TF path (`tf_png`); on
    # the feed's threads (the core through ctypes, else pywuffs) on the DALI path
    # and for GPU-ready fills
    WUFFS = "wuffs"
    LIBPNG = "libpng"  # TF's decode_png on the TF path, nvImageCodec inside DALI
    GPU = "gpu"  # the batched GPU decoder (png_batches; experimental, off by default)


PNG_DECODERS = (None, *(d.value for d in PngDecoder))
_said_missing = threading.Event()
_said_op_missing = threading.Event()


def _tf_op_available() -> bool:
    """Whether the native core's TF op is built and loads (`decode.tf_png`)."""
    from dali_loader.decode import tf_png

    return tf_png.available()


def _tf_op_missing() -> str:
    from dali_loader.decode import tf_png

    reason = tf_png.unavailable_reason() or "it is not loaded"
    return f"{reason}. Build it with: {tf_png.BUILD_STEP}"


def resolve_png_decoder(png_decoder, *, device: str, decoder: str | None, gpu_ready,
                        service: bool = False) -> PngDecoder:
    """The `PngDecoder` of the pipeline (what decodes each epoch's PNGs; where it
    runs: `png_route`). None picks, on the TF path (the CPU default, no
    `gpu_ready`, no `service`), the native core's TF op where it is built
    (faster, measured: docs/png_cpu.md), else libpng with one warning naming the
    build; elsewhere LIBPNG (on the DALI path `make_loader` then asks
    `dali_png.use_native` whether the native DALI operator decodes, and
    `png_route` says so; TF's libpng on the service's workers; GPU-ready fills:
    `fill_png_decoder`). "wuffs" on the TF path needs the op (an ImportError
    naming its build step); on the DALI path, `pywuffs`. Raises on a combination
    that cannot be served."""
    if png_decoder not in PNG_DECODERS and not isinstance(png_decoder, PngDecoder):
        raise ValueError('`png_decoder` must be None (the native decoder where it is built, '
                         'else libpng), "wuffs", "libpng" or "gpu" (the batched GPU decoder, '
                         f"experimental). Received: png_decoder={png_decoder!r}")
    tf_path = not (device == "gpu" or decoder == "dali") and gpu_ready is None and not service
    if png_decoder is None:
        if not tf_path:
            return PngDecoder.LIBPNG
        if _tf_op_available():
            return PngDecoder.WUFFS
        if not _said_op_missing.is_set():
            _said_op_missing.set()
            logger.warning("The native PNG decoder's TF op is not available (%s): PNGs are "
                           "decoded with TF's libpng, slower. `make install` builds it.",
                           _tf_op_missing())
        return PngDecoder.LIBPNG
    png_decoder = PngDecoder(png_decoder)
    if png_decoder is PngDecoder.WUFFS:
        if tf_path:
            if not _tf_op_available():
                raise ImportError('png_decoder="wuffs" on the CPU default decodes PNGs with the '
                                  f"native core's TF op, which is not available: "
                                  f"{_tf_op_missing()}.")
        elif not wuffs_available():
            raise ImportError('png_decoder="wuffs" needs the native PNG core or Wuffs\' Python '
                              f"bindings: {png_native.BUILD_HINT}, or pip install pywuffs==2.0.1.")
    if png_decoder is PngDecoder.GPU:
        if not (device == "gpu" or decoder == "dali"):
            raise ValueError(
                'png_decoder="gpu" feeds decoded pixels to the DALI graph; it needs '
                'device="gpu", or decoder="dali" on the CPU (where the decoder\'s '
                f'kernels run under numba-cuda\'s simulator). Received: '
                f"png_decoder={png_decoder.value!r}, device={device!r}, decoder={decoder!r}")
        if gpu_ready is not None:
            form = getattr(gpu_ready, "value", gpu_ready)
            raise ValueError('png_decoder="gpu" and `gpu_ready` cannot be combined: the GPU-ready '
                             "cache already decodes every file once. Received: "
                             f"png_decoder='gpu', gpu_ready={form!r}")
    return png_decoder


@dataclasses.dataclass(frozen=True)
class PngRoute:
    """Which PNG decoder runs for given options, and where.

    Attributes:
        decoder: what decodes the PNGs ("wuffs", "libpng" or "gpu"; with
            `gpu_ready`, the fills' decoder).
        where: "tf-op" (the native core as a TF op in tf.data's graph),
            "dali-op" (the native core as a DALI operator in DALI's graph), "tf"
            (TF's decode_png), "feed" (Wuffs on the feed's threads: the core
            through ctypes where built, else pywuffs),
            "dali" (DALI's decoder, nvImageCodec), "gpu" (the batched GPU
            decoder), "none" (raw GPU-ready entries: nothing decoded per epoch).
        fill: with `gpu_ready`, who decodes the PNGs a cache fill reads
            ("wuffs" on the feed's threads, or "libpng"); else None.
    """

    decoder: str
    where: str
    fill: str | None = None

    def describe(self) -> str:
        """One line for reports: e.g. "wuffs (native core, TF op in the graph)"."""
        where = {"tf-op": "native core, TF op in the graph",
                 "dali-op": "native core, DALI operator in the graph", "tf": "TF's decode_png",
                 "feed": "on the feed's threads", "dali": "DALI's decoder",
                 "gpu": "batched GPU decoder"}
        if self.where == "none":
            return (f"{self.fill} (GPU-ready cache fills, on the feed's threads; epochs "
                    "decode no PNG)")
        return f"{self.decoder} ({where[self.where]})"


def png_route(png_decoder=None, *, device: str = "cpu", decoder: str | None = None,
              gpu_ready=None, service: bool = False, jpegs: bool = False) -> PngRoute:
    """Which PNG decoder runs for these options (as `make_loader` builds them),
    and where; raises as `resolve_png_decoder` does. `device` is the resolved
    device ("cpu" or "gpu"); `gpu_ready` a `ReadyForm` or None; `jpegs`: the
    folder holds JPEGs (on a GPU they keep DALI's decoder for every file). Loads
    the native op of the path it asks about (TF's or DALI's) to know."""
    png = resolve_png_decoder(png_decoder, device=device, decoder=decoder, gpu_ready=gpu_ready,
                              service=service)
    dali = device == "gpu" or decoder == "dali"
    fill = None if gpu_ready is None else fill_png_decoder(png_decoder).value
    if gpu_ready is not None:  # PNGs are decoded by the cache's fills only
        return PngRoute(fill, "none", fill)
    if png is PngDecoder.GPU:
        where = "gpu"
    elif png is PngDecoder.WUFFS:
        where = "feed" if dali else "tf-op"
    elif dali:
        from dali_loader.decode import dali_png

        if dali_png.use_native(png_decoder, gpu_with_jpegs=device == "gpu" and jpegs):
            return PngRoute(PngDecoder.WUFFS.value, "dali-op")
        where = "dali"
    else:
        where = "tf"
    return PngRoute(png.value, where, fill)


def fill_png_decoder(png_decoder) -> PngDecoder:
    """Who decodes the PNGs a GPU-ready cache fills (once per file, on the feed's
    threads): None picks Wuffs where it is installed (faster there, measured; else
    libpng, said once); "wuffs" or "libpng" as asked."""
    if png_decoder is None:
        if wuffs_available():
            return PngDecoder.WUFFS
        if not _said_missing.is_set():
            _said_missing.set()
            logger.warning("The fast PNG decoder (Wuffs) is not installed: the GPU-ready cache "
                           "is filled with libpng, about 0.7x as fast. `make install` builds it "
                           f"({png_native.BUILD_HINT}).")
        return PngDecoder.LIBPNG
    png_decoder = PngDecoder(png_decoder)
    if png_decoder is PngDecoder.WUFFS and not wuffs_available():
        raise ImportError('png_decoder="wuffs" needs the native PNG core or Wuffs\' Python '
                          f"bindings: {png_native.BUILD_HINT}, or pip install pywuffs==2.0.1.")
    return png_decoder


def wuffs_available() -> bool:
    """Whether Wuffs can decode here: the native core (built) or pywuffs."""
    return png_native.available() or png_cpu.available()


def tf_pooled_empty(nbytes: int) -> np.ndarray:
    """A writable uint8 buffer of `nbytes` from TF's CPU allocator, which pools what it
    frees: decoded pixels reuse the memory of the image before instead of fresh pages
    (what tfdata.dataset's `_pooled_empty` does for entries). numpy's otherwise."""
    tf = import_tf()
    try:
        out = tf.raw_ops.Empty(shape=[nbytes], dtype=tf.uint8, init=False)._numpy()
    except (AttributeError, TypeError, ValueError):  # pragma: no cover - a future TF
        return np.empty(nbytes, np.uint8)
    return out if out.flags.writeable else np.empty(nbytes, np.uint8)


class KerasPixels:
    """`(data, path) -> pixels` exactly as Keras decodes them, PNGs by Wuffs.

    Args:
        channels: 1, 3 or 4 (Keras's colour mode).
        num_threads: Decodes at once (the CPU work; reads in flight are not limited).
        max_pixels: Refuse images whose header claims more pixels (None: no limit).
        native: Wuffs through the native core (`png_native`) rather than pywuffs
            (`png_cpu`); None: the core where it is built.
        alloc: `alloc(nbytes)` -> the uint8 buffer the core decodes into; default
            `tf_pooled_empty`.

    Counts `png_fast` (PNGs Wuffs decoded) and `png_fallbacks` (PNGs left to
    TF's libpng) into a `tally`, and in `counts` since creation. `decoder` names
    the one that runs: "native" or "pywuffs".
    """

    def __init__(self, channels: int, num_threads: int,
                 max_pixels: int | None = DEFAULT_MAX_PIXELS, *, native: bool | None = None,
                 alloc: Callable[[int], np.ndarray] | None = None):
        if native is None:
            native = png_native.available()
        elif native and not png_native.available():
            raise ImportError(f"The native PNG decoder is unavailable: "
                              f"{png_native.unavailable_reason()}")
        self.decoder = "native" if native else "pywuffs"
        self._decode_png = (
            functools.partial(png_native.decode_png, alloc=alloc or tf_pooled_empty)
            if native else png_cpu.decode_png)
        self.channels = channels
        self.max_pixels = max_pixels
        self._slots = threading.BoundedSemaphore(num_threads)
        self._lock = threading.Lock()
        self.counts = {"png_fast": 0, "png_fallbacks": 0}

    def _count(self, what: str, tally) -> None:
        with self._lock:
            self.counts[what] += 1
        if tally is not None:
            tally.add(what)

    def __call__(self, data: bytes, path: str, tally=None) -> np.ndarray:
        problem = size_problem(data, self.max_pixels)
        if problem:
            raise CorruptImageError(path, problem)
        with self._slots:
            png = data[:8] == png_cpu.SIGNATURE
            if png:
                px = self._decode_png(data, self.channels)
                if not isinstance(px, png_cpu.Fallback):
                    self._count("png_fast", tally)
                    return px
                self._count("png_fallbacks", tally)
            return pixels_like_keras(data, path, self.channels, import_tf())


class PixelItems:
    """Item reader for the TF path: each file's Keras pixels (HxWxC uint8)."""

    io = True
    holds = False
    tallies = True

    def __init__(self, source, pixels: KerasPixels):
        self.source = source
        self.pixels = pixels

    def __call__(self, path: str, tally=None) -> np.ndarray:
        return self.pixels(read_bytes(self.source, path), path, tally)

    def release(self, item) -> None:
        pass


# PNGs above this many pixels (about 8200x8200) are not decoded on the feed's
# threads: decoded pixels wait in the read-ahead window, where a few such images
# would take GBs, and a raw entry is more copies of them (the decoder's, the
# entry, DALI's). On the DALI path they stay checked bytes: on the CPU, TF decodes
# them as their batch enters DALI (`dali_batches._Slot`, one copy); on a GPU,
# DALI's decoder does.
BIG_PNG_PIXELS = 1 << 26


def big_png(data: bytes) -> bool:
    """Whether `data` is a PNG whose header claims over `BIG_PNG_PIXELS` pixels."""
    if data[:8] != png_cpu.SIGNATURE:
        return False
    size = image_size(data)
    return size is not None and size[0] * size[1] > BIG_PNG_PIXELS


class RawOrCheckedItems(PixelItems):
    """Item reader for the DALI path: a PNG as a raw pixel entry (Keras's pixels,
    nothing left to decode), any other file as checked bytes for DALI's decoder
    (`jpeg` counted, the files a GPU decodes)."""

    def __call__(self, path: str, tally=None) -> bytes:
        data = read_bytes(self.source, path)
        if data[:8] == png_cpu.SIGNATURE and not big_png(data):
            return encode_raw(self.pixels(data, path, tally))
        data = prepare(data, path, rgba=self.pixels.channels == 4,
                       max_pixels=self.pixels.max_pixels)
        if tally is not None and sniff(data) == "jpeg":
            tally.add("jpeg")
        return data

    def release(self, item) -> None:
        pass
