"""The CPU decode stage that runs Wuffs on the feed's threads.

Which PNG decoder runs where is the plan's (`plan.PngDecoder`, `plan.PngWhere`;
`dali-loader diagnose` prints it):
- the TF path (the CPU default): the native core (Wuffs behind the front end,
  `native/`) as a TF op in the graph (`tf_png`), exactly TF's pixels, by default
  where the op is built (else libpng, said once); "libpng" forces TF's decoder;
- the DALI path: by default the native core as a DALI operator where it is
  built (`dali_png`; not on a GPU with JPEGs), else DALI's nvImageCodec
  (libpng), which "libpng" forces; "wuffs": Wuffs on the feed's threads (as
  for fills), PNGs entering DALI as raw pixels;
- GPU-ready cache fills: Wuffs on the feed's threads where installed (the core
  through ctypes, `png_native`, else `png_cpu`);
- the tf.data service: TF's libpng (its workers run a pure TF graph).

On the DALI path and for fills, with Wuffs every file is decoded on the feed's
read-ahead threads, where the GIL is released while Wuffs works, at most
`num_threads` at once:
- `KerasPixels`: a file's bytes -> the HxWxC uint8 pixels Keras decodes. PNGs
  through Wuffs; the PNGs it leaves (`formats.png.Fallback`) and other formats
  through TF's own decoder, eagerly (libpng, libjpeg, as Keras).
- `PixelItems`: item reader of pixels (the base of `RawOrCheckedItems`; the TF
  path decodes in its graph instead, with the native op).
- `RawOrCheckedItems`: item reader for the DALI path: a PNG becomes a raw pixel
  entry (`formats.ready.ReadyForm.RAW`) that DALI only reshapes; other files, and
  PNGs over `BIG_PNG_PIXELS`, stay checked bytes that DALI decodes (JPEG with
  nvJPEG on a GPU; big PNGs on the CPU: TF, as their batch enters DALI).
A file TF rejects raises `CorruptImageError` naming it: the feed's `on_error`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import numpy as np

from dali_loader import tf_internals
from dali_loader.decode import png_cpu, png_native
from dali_loader.decode.tf_kernels import pixels_like_keras
from dali_loader.errors import CorruptImageError
from dali_loader.feed.checks import over_limit, prepare
from dali_loader.feed.items import read_bytes
from dali_loader.formats import png
from dali_loader.formats.limits import BIG_PNG_PIXELS, DEFAULT_MAX_PIXELS
from dali_loader.formats.ready import encode_raw
from dali_loader.formats.sniff import image_size, sniff
from dali_loader.lazy import import_tf
from dali_loader.plan import PngDecoder  # noqa: F401 - the decoders are the plan's


def wuffs_available() -> bool:
    """Whether Wuffs can decode here: the native core (built) or pywuffs (`probes.wuffs`)."""
    return png_native.available() or png_cpu.available()


def tf_pooled_empty(nbytes: int) -> np.ndarray:
    """A writable uint8 buffer of `nbytes` from TF's CPU allocator, which pools what it
    frees: decoded pixels reuse the memory of the image before instead of fresh pages
    (`tf_internals.pooled_empty`, as tfdata.ready_path's `pooled_empty` for entries).
    numpy's where that internal is off."""
    out = tf_internals.pooled_empty(import_tf(), nbytes)
    return np.empty(nbytes, np.uint8) if out is None else out


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

    def __call__(self, data: bytes, path: str, tally=None,
                 size: tuple[int, int] | None = None) -> np.ndarray:
        """Keras's pixels of `data`; `size`: its header's (width, height) when the
        caller read it (a PNG's IHDR is then not read again here)."""
        is_png = data[:8] == png.SIGNATURE
        if self.max_pixels is not None:
            if size is None:
                size = png.size(data) if is_png else image_size(data)
            problem = over_limit(size, self.max_pixels)
            if problem:
                raise CorruptImageError(path, problem)
        with self._slots:
            if is_png:
                px = self._decode_png(data, self.channels)
                if not isinstance(px, png.Fallback):
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


def big_png(data: bytes) -> bool:
    """Whether `data` is a PNG whose header claims over `BIG_PNG_PIXELS` pixels
    (why that limit: `formats.limits`; on the CPU, TF decodes such PNGs as their
    batch enters DALI, `dali_batches.HostPixels`)."""
    return data[:8] == png.SIGNATURE and _big(png.size(data))


def _big(size: tuple[int, int] | None) -> bool:
    return size is not None and size[0] * size[1] > BIG_PNG_PIXELS


class RawOrCheckedItems(PixelItems):
    """Item reader for the DALI path: a PNG as a raw pixel entry (Keras's pixels,
    nothing left to decode), any other file as checked bytes for DALI's decoder
    (`jpeg` counted, the files a GPU decodes)."""

    def __call__(self, path: str, tally=None) -> bytes:
        data = read_bytes(self.source, path)
        if data[:8] == png.SIGNATURE:
            size = png.size(data)  # the header, read once for both limits
            if not _big(size):
                return encode_raw(self.pixels(data, path, tally, size=size))
        data = prepare(data, path, rgba=self.pixels.channels == 4,
                       max_pixels=self.pixels.max_pixels)
        if tally is not None and sniff(data) == "jpeg":
            tally.add("jpeg")
        return data

    def release(self, item) -> None:
        pass
