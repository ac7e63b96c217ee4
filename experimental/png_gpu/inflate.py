"""Inflate backends: every stream of a `PackedBatch` inflated into one buffer at `dst_off`.

Both implement `InflateBackend.inflate(batch) -> (buffer, sizes)`: the inflated
buffer (`dst_total` bytes; numpy for `ZlibInflate`, a CuPy array for
`NvcompInflate`) and each stream's inflated size (numpy int64; -1 when the
stream could not be inflated, `dst_len + 1` when it holds more than `dst_len`
bytes). Neither validates the data: the decoder checks each stream's size and
Adler-32 afterwards.

- `ZlibInflate`: zlib on the CPU (raw Deflate, `wbits=-15`), standing in for
  nvCOMP in CI and in the device check's reference runs.
- `NvcompInflate`: nvCOMP's batched Deflate on the GPU (nvCOMP 6 Python API:
  `Codec(algorithm="Deflate", bitstream_kind=RAW)`, the batch carved out of one
  device buffer with `nvcomp.as_arrays(buffer, offsets, sizes)` and decoded into
  another carved the same way: one call per batch). nvCOMP does not validate
  Deflate input (https://docs.nvidia.com/cuda/nvcomp/py_api.html). When the batch
  call raises (an output too small for a stream), each stream is retried alone
  to find the bad ones. Unverified until a device run passes
  (experimental/png_gpu_check).
"""

from __future__ import annotations

import logging
import zlib
from typing import Protocol

import numpy as np

from experimental.png_gpu.pack import PackedBatch
from experimental.png_gpu.lazy import import_cupy, import_nvcomp

logger = logging.getLogger(__name__)


class InflateBackend(Protocol):
    """Inflates a packed batch's Deflate streams."""

    name: str
    on_gpu: bool

    def empty_host(self, nbytes: int) -> np.ndarray:
        """A host buffer for `pack` (pinned for GPU backends)."""

    def inflate(self, batch: PackedBatch):
        """(inflated buffer, sizes) for every stream of `batch`."""


class ZlibInflate:
    """zlib on the CPU, one stream after another."""

    name = "zlib"
    on_gpu = False

    def empty_host(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def inflate(self, batch: PackedBatch) -> tuple[np.ndarray, np.ndarray]:
        dst = np.zeros(batch.dst_total, np.uint8)
        sizes = np.empty(len(batch), np.int64)
        for i in range(len(batch)):
            s0, n, d0, cap = (int(batch.src_off[i]), int(batch.src_len[i]),
                              int(batch.dst_off[i]), int(batch.dst_len[i]))
            try:
                d = zlib.decompressobj(-15)
                data = d.decompress(memoryview(batch.src)[s0:s0 + n], cap + 1)
            except zlib.error:
                sizes[i] = -1
                continue
            got = min(len(data), cap)
            dst[d0:d0 + got] = np.frombuffer(data, np.uint8, got)
            sizes[i] = len(data)
        return dst, sizes


class NvcompInflate:
    """nvCOMP's batched Deflate on the GPU (CuPy arrays; nvCOMP 6)."""

    name = "nvcomp"
    on_gpu = True

    def __init__(self, device_id: int = 0):
        self.cupy = import_cupy()
        self.nvcomp = import_nvcomp()
        self.stream = self.cupy.cuda.get_current_stream()
        self.codec = self.nvcomp.Codec(
            algorithm="Deflate", bitstream_kind=self.nvcomp.BitstreamKind.RAW,
            device_id=device_id, cuda_stream=self.stream.ptr)

    def empty_host(self, nbytes: int) -> np.ndarray:
        import cupyx

        return cupyx.empty_pinned(nbytes, np.uint8)

    def _carve(self, buf, offsets, sizes):
        return self.nvcomp.as_arrays(buf, [int(o) for o in offsets], [int(s) for s in sizes],
                                     cuda_stream=self.stream.ptr)

    def inflate(self, batch: PackedBatch):
        cp = self.cupy
        src = cp.asarray(batch.src)  # the one host-to-device copy (pinned source)
        dst = cp.zeros(batch.dst_total, cp.uint8)
        try:
            out = self._carve(dst, batch.dst_off, batch.dst_len)
            self.codec.decode(self._carve(src, batch.src_off, batch.src_len), out=out)
            sizes = np.array([int(x) for x in out.buffer_sizes], np.int64)
        except (ValueError, RuntimeError) as e:
            logger.info("nvCOMP batch decode failed (%s); retrying stream by stream", e)
            sizes = self._one_by_one(src, dst, batch)
        cp.cuda.runtime.deviceSynchronize()  # whichever stream nvCOMP used
        return dst, sizes

    def _one_by_one(self, src, dst, batch: PackedBatch) -> np.ndarray:
        sizes = np.empty(len(batch), np.int64)
        for i in range(len(batch)):
            s0, n = int(batch.src_off[i]), int(batch.src_len[i])
            d0, cap = int(batch.dst_off[i]), int(batch.dst_len[i])
            try:
                out = self._carve(dst, [d0], [cap])
                self.codec.decode(self._carve(src, [s0], [n]), out=out)
                sizes[i] = int(out.buffer_sizes[0])
            except (ValueError, RuntimeError):
                sizes[i] = -1
        return sizes
