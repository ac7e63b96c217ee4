"""The GPU-ready cache's compact entry form (issue 38): Keras's decoded pixels,
delta-filtered, in independent ~64 KB chunks of standard zstd frames.

The layout is `dali_loader/native/entry_core.h`'s (a 32-byte header: magic
`DLZ1`, version, filter, codec, height, width, channels, chunk size, chunk
count, the pixels' CRC-32; then each chunk's compressed size; then the chunks,
each one zstd frame that libzstd or nvCOMP's batched Zstd reads alone).

Writing and the fast decode are the native core's (`libdlpng.so`, through
ctypes, which releases the GIL): `encode`, `decode`, `decode_into`, `shape`.
`decode_reference` is numpy's own reading of the format (header, chunk table,
un-filter, CRC) with only each frame's zstd decompression taken from the core:
the tests compare the two.
"""

from __future__ import annotations

import ctypes
import dataclasses
import struct
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dali_loader.formats.limits import ENTRY_MAX_PIXELS

MAGIC = b"DLZ1"
VERSION = 1
FIXED_HEADER = 32
FILTER_NONE, FILTER_UP, FILTER_SUB = 0, 1, 2
CODEC_ZSTD = 1
# Chosen by measurement (docs/gpu_ready.md, "The compact form"): the row delta and
# zstd level 1 in 64 KiB chunks (nvCOMP's recommended chunk size).
FILTER = FILTER_UP
LEVEL = 1
CHUNK_BYTES = 64 * 1024
MAX_PIXELS = ENTRY_MAX_PIXELS  # the core's default too (entry_core.cc)

LIBRARY = Path(__file__).resolve().parent.parent / "native" / "_build" / "libdlpng.so"
BUILD_HINT = ("the native core is not built: run `python -m dali_loader.native.build` "
              "(`make install` does)")


class EntryError(ValueError):
    """An entry the core refuses (torn, truncated, bit-flipped or not an entry)."""


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """What an entry's header says."""

    height: int
    width: int
    channels: int
    filter: int
    codec: int
    chunk_bytes: int
    chunks: int
    crc32: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.height, self.width, self.channels

    @property
    def nbytes(self) -> int:
        return self.height * self.width * self.channels


class _Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in (
        "height", "width", "channels", "filter", "codec", "chunk_bytes", "chunks", "crc32")]


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL:
    """The core, loaded once; raises ImportError when it is not built."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            if not LIBRARY.exists():
                raise ImportError(f"{LIBRARY} is missing: {BUILD_HINT}")
            try:
                lib = ctypes.CDLL(str(LIBRARY))  # the GIL is released per call
            except OSError as e:
                raise ImportError(f"{LIBRARY} does not load ({e}): {BUILD_HINT}") from None
            if not hasattr(lib, "dl_entry_decode_into"):
                raise ImportError(f"{LIBRARY} predates compact entries: {BUILD_HINT}")
            reason = ctypes.POINTER(ctypes.c_char_p)
            vp, sz = ctypes.c_void_p, ctypes.c_size_t
            lib.dl_entry_info_of.argtypes = [vp, sz, ctypes.c_uint64, ctypes.POINTER(_Info), reason]
            lib.dl_entry_info_of.restype = ctypes.c_int
            lib.dl_entry_decode_into.argtypes = [vp, sz, ctypes.c_uint64, vp, sz, reason]
            lib.dl_entry_decode_into.restype = ctypes.c_int
            lib.dl_entry_encode_bound.argtypes = [ctypes.c_uint32] * 4
            lib.dl_entry_encode_bound.restype = sz
            lib.dl_entry_encode.argtypes = [vp, *[ctypes.c_uint32] * 4, ctypes.c_int,
                                            ctypes.c_uint32, vp, sz, ctypes.POINTER(sz), reason]
            lib.dl_entry_encode.restype = ctypes.c_int
            lib.dl_zstd_decompress_frame.argtypes = [vp, sz, vp, sz]
            lib.dl_zstd_decompress_frame.restype = ctypes.c_int64
            _lib = lib
    return _lib


def available() -> bool:
    """Whether the native core with compact entries is built here."""
    try:
        _load()
    except ImportError:
        return False
    return True


def _buffer(data) -> tuple[np.ndarray, int]:
    arr = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    if arr.dtype != np.uint8 or arr.ndim != 1 or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, np.uint8).reshape(-1)
    return arr, arr.ctypes.data


def encode(pixels: np.ndarray, filter: int = FILTER, level: int = LEVEL,
           chunk_bytes: int = CHUNK_BYTES) -> memoryview:
    """HxWxC uint8 `pixels` (C in 1, 3, 4) as a compact entry (the native core): a
    view of the buffer it was written into (no copy; its untouched pages, up to
    the worst-case bound, cost no memory)."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] not in (1, 3, 4):
        raise ValueError("Expected HxWxC uint8 pixels with C in (1, 3, 4). "
                         f"Received: shape={pixels.shape}, dtype={pixels.dtype}")
    lib = _load()
    pixels = np.ascontiguousarray(pixels)
    h, w, c = pixels.shape
    bound = lib.dl_entry_encode_bound(h, w, c, chunk_bytes)
    if bound == 0:
        raise ValueError("A shape or chunk size the compact form does not take (sides below "
                         f"2**20, chunks of 64 B to 1 GiB). Received: shape={pixels.shape}, "
                         f"chunk_bytes={chunk_bytes}")
    out = np.empty(bound, np.uint8)
    size, why = ctypes.c_size_t(0), ctypes.c_char_p()
    if lib.dl_entry_encode(pixels.ctypes.data, h, w, c, filter, level, chunk_bytes,
                           out.ctypes.data, bound, ctypes.byref(size), ctypes.byref(why)):
        raise ValueError(f"The core could not write the entry ({(why.value or b'').decode()}). "
                         f"Received: filter={filter}, level={level}")
    return out.data[:size.value]  # a memoryview of `out` (numpy's buffer), not a copy


def info(data, max_pixels: int | None = MAX_PIXELS) -> EntryInfo:
    """The checked header of an entry (the core: bounds, chunk table, each frame's
    header; nothing decompressed). Raises `EntryError` saying why it is refused."""
    lib = _load()
    arr, ptr = _buffer(data)
    raw, why = _Info(), ctypes.c_char_p()
    if lib.dl_entry_info_of(ptr, arr.size, max_pixels or 0, ctypes.byref(raw), ctypes.byref(why)):
        raise EntryError(f"Not a sound compact entry: {(why.value or b'').decode()}. "
                         f"Received: {arr.size} bytes")
    return EntryInfo(*(getattr(raw, f) for f, *_ in _Info._fields_))


def decode_into(data, out: np.ndarray, max_pixels: int | None = MAX_PIXELS) -> None:
    """Decodes an entry into `out` (1-D or HxWxC uint8, C-contiguous, at least the
    pixels' size) with the core; raises `EntryError` when it is refused."""
    if out.dtype != np.uint8 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("`out` must be a writable C-contiguous uint8 array. "
                         f"Received: dtype={out.dtype}, flags={out.flags}")
    lib = _load()
    arr, ptr = _buffer(data)
    why = ctypes.c_char_p()
    if lib.dl_entry_decode_into(ptr, arr.size, max_pixels or 0, out.ctypes.data, out.nbytes,
                                ctypes.byref(why)):
        raise EntryError(f"A compact entry the core refuses: {(why.value or b'').decode()}. "
                         f"Received: {arr.size} bytes")


def decode(data, alloc: Callable[[int], np.ndarray] | None = None,
           max_pixels: int | None = MAX_PIXELS) -> np.ndarray:
    """HxWxC uint8 pixels of an entry (the core), in `alloc(nbytes)`'s memory if given."""
    head = info(data, max_pixels)
    flat = np.empty(head.nbytes, np.uint8) if alloc is None else alloc(head.nbytes)[:head.nbytes]
    decode_into(data, flat, max_pixels)
    return flat.reshape(head.shape)


def is_compact(head) -> bool:
    """Whether bytes start like a compact entry."""
    return bytes(head[:4]) == MAGIC


def read_header(data) -> EntryInfo:
    """The header as numpy reads it (no bounds beyond the header's own length)."""
    data = memoryview(data).cast("B")
    if len(data) < FIXED_HEADER or bytes(data[:4]) != MAGIC:
        raise EntryError(f"Not a compact entry (no {MAGIC!r} magic). Received: {len(data)} bytes")
    version, filt, codec, _ = data[4:8]
    if version != VERSION:
        raise EntryError(f"An entry version this reader does not read. Received: version={version}")
    h, w, c, chunk, chunks, crc = struct.unpack_from("<6I", data, 8)
    return EntryInfo(h, w, c, filt, codec, chunk, chunks, crc)


def unfilter(filtered: np.ndarray, head: EntryInfo) -> np.ndarray:
    """HxWxC pixels of the filtered bytes (numpy: a cumulative sum in uint8)."""
    img = filtered.reshape(head.shape)
    if head.filter == FILTER_UP:
        return np.cumsum(img, axis=0, dtype=np.uint8)
    if head.filter == FILTER_SUB:
        return np.cumsum(img, axis=1, dtype=np.uint8)
    if head.filter == FILTER_NONE:
        return img
    raise EntryError(f"An unknown filter. Received: filter={head.filter}")


def filter_pixels(pixels: np.ndarray, filt: int) -> np.ndarray:
    """The filtered bytes of HxWxC pixels (numpy; `unfilter`'s inverse)."""
    out = pixels.copy()
    if filt == FILTER_UP:
        out[1:] -= pixels[:-1]
    elif filt == FILTER_SUB:
        out[:, 1:] -= pixels[:, :-1]
    return out


def zstd_frame(frame, size: int) -> bytes:
    """One zstd frame decompressed (libzstd in the core), checked to be `size` bytes."""
    lib = _load()
    arr, ptr = _buffer(frame)
    out = np.empty(max(size, 1), np.uint8)
    got = lib.dl_zstd_decompress_frame(ptr, arr.size, out.ctypes.data, size)
    if got != size:
        raise EntryError(f"A chunk that is not one zstd frame of its size. Received: {got} "
                         f"bytes of {size}")
    return out[:size].tobytes()


def decode_reference(data, decompress: Callable[[bytes, int], bytes] = zstd_frame) -> np.ndarray:
    """HxWxC pixels of an entry, read by numpy (`decompress(frame, size)` decompresses
    each chunk): the reference the native decode is compared with."""
    view = memoryview(data).cast("B")
    head = read_header(view)
    if head.codec != CODEC_ZSTD or head.chunk_bytes == 0:
        raise EntryError(f"An unknown codec or no chunks. Received: codec={head.codec}")
    total = head.nbytes
    if head.chunks != -(-total // head.chunk_bytes):
        raise EntryError(f"A chunk count that does not match the shape. Received: {head.chunks}")
    table_end = FIXED_HEADER + 4 * head.chunks
    sizes = np.frombuffer(view[FIXED_HEADER:table_end], "<u4").astype(np.int64)
    if len(sizes) != head.chunks or table_end + int(sizes.sum()) != len(view):
        raise EntryError(f"The chunk table does not add up to the entry. Received: {len(view)} bytes")
    starts = table_end + np.concatenate([[0], np.cumsum(sizes)[:-1]])
    parts = []
    for k, (at, n) in enumerate(zip(starts, sizes)):
        want = min(head.chunk_bytes, total - k * head.chunk_bytes)
        parts.append(decompress(bytes(view[at:at + n]), want))
    pixels = unfilter(np.frombuffer(b"".join(parts), np.uint8), head)
    if zlib.crc32(pixels.tobytes()) != head.crc32:
        raise EntryError("The pixels' CRC-32 does not match the entry's. "
                         f"Received: {zlib.crc32(pixels.tobytes()):08x}, header {head.crc32:08x}")
    return pixels
