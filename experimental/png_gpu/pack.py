"""A batch of parsed PNGs packed for the device: one input buffer, aligned offsets, per-image tables.

`pack` lays every image's raw Deflate data into one host buffer (pinned, when the
caller's `empty` allocates pinned memory) at `ALIGN`-byte offsets, so one
host-to-device copy moves the batch and nvCOMP can carve it into streams in place.
It also sizes the inflated buffer (each image's filtered rows, aligned) and the
output buffer (HxWxC per image), and the small per-image tables the kernels read.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Executor
from collections.abc import Callable, Sequence

import numpy as np

from experimental.png_gpu.parse import PngLayout

ALIGN = 256  # bytes; nvCOMP asks for 8 (Deflate), 256 keeps rows of different images apart
ADLER_THREADS = 128  # the Adler-32 kernel's most threads per block (its shared arrays)
BAD_FILTER = 1  # kernel status codes, per image
BAD_INDEX = 2


def _aligned_offsets(sizes: np.ndarray) -> tuple[np.ndarray, int]:
    padded = (sizes + ALIGN - 1) // ALIGN * ALIGN
    offsets = np.zeros(len(sizes), np.int64)
    if len(sizes) > 1:
        offsets[1:] = np.cumsum(padded[:-1])
    return offsets, int(padded.sum())


@dataclasses.dataclass
class PackedBatch:
    """Everything the device needs for one batch (host arrays).

    `src` holds the Deflate streams (`src_off`, `src_len`); the inflated rows go to
    `dst_off` (`dst_len` bytes each, `dst_total` in all); pixels to `out_off`
    (`out_total`). Per image: `width`, `height`, `bpp`, `color_type`, `trns`
    (has-key flag and up to three key samples), `palette` (256 x RGBA) and
    `num_palette`; `adler32` is each stream's stored checksum.
    """

    src: np.ndarray
    src_off: np.ndarray
    src_len: np.ndarray
    dst_off: np.ndarray
    dst_len: np.ndarray
    dst_total: int
    out_off: np.ndarray
    out_total: int
    width: np.ndarray
    height: np.ndarray
    bpp: np.ndarray
    color_type: np.ndarray
    trns: np.ndarray
    palette: np.ndarray
    num_palette: np.ndarray
    adler32: np.ndarray
    channels: int

    def __len__(self) -> int:
        return len(self.src_off)


def pack(layouts: Sequence[PngLayout], channels: int,
         empty: Callable[[int], np.ndarray] | None = None,
         executor: Executor | None = None) -> PackedBatch:
    """Packs `layouts` for output `channels`; `empty(nbytes)` allocates the input buffer;
    `executor`'s threads copy the streams in (numpy copies release the GIL)."""
    n = len(layouts)
    src_len = np.array([len(p.deflate) for p in layouts], np.int64)
    src_off, src_total = _aligned_offsets(src_len)
    src = (empty or (lambda k: np.empty(k, np.uint8)))(max(src_total, 1))

    def put(i: int) -> None:
        off = int(src_off[i])
        src[off:off + int(src_len[i])] = np.frombuffer(layouts[i].deflate, np.uint8)

    if executor is None:
        for i in range(n):
            put(i)
    else:
        list(executor.map(put, range(n)))
    dst_len = np.array([p.inflated_size for p in layouts], np.int64)
    dst_off, dst_total = _aligned_offsets(dst_len)
    out_len = np.array([p.width * p.height * channels for p in layouts], np.int64)
    out_off = np.zeros(n, np.int64)
    if n > 1:
        out_off[1:] = np.cumsum(out_len[:-1])
    trns = np.zeros((n, 4), np.int32)
    palette = np.zeros((n, 256, 4), np.uint8)
    for i, p in enumerate(layouts):
        if p.trns_key is not None:
            trns[i, 0] = 1
            trns[i, 1:1 + len(p.trns_key)] = p.trns_key
        if p.palette is not None:
            palette[i] = np.frombuffer(p.palette, np.uint8).reshape(256, 4)
    return PackedBatch(
        src=src, src_off=src_off, src_len=src_len, dst_off=dst_off, dst_len=dst_len,
        dst_total=max(dst_total, 1), out_off=out_off, out_total=max(int(out_len.sum()), 1),
        width=np.array([p.width for p in layouts], np.int64),
        height=np.array([p.height for p in layouts], np.int64),
        bpp=np.array([p.bpp for p in layouts], np.int64),
        color_type=np.array([p.color_type for p in layouts], np.int32),
        trns=trns, palette=palette,
        num_palette=np.array([p.num_palette for p in layouts], np.int32),
        adler32=np.array([p.adler32 for p in layouts], np.int64), channels=channels)
