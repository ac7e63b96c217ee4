"""Batched PNG decoding on the GPU (issue 17; docs/png_gpu.md): host parse, one nvCOMP
Deflate call, numba-cuda kernels for the Adler-32 check, the unfilter and the channel
expansion; anything not covered goes to the CPU decoder, counted.

Opt-in (`png_decoder="gpu"`; bit-exact on a GPU: `PNG_GPU_VERIFIED`); `decode_pngs` is the API, `cpu_fallback.finish`
completes a batch's fallbacks. Heavy imports (numba, CuPy, nvCOMP, TF) are lazy.
"""

from experimental.png_gpu.decoder import (
    PNG_GPU_VERIFIED,
    Launch,
    PngDecodeStats,
    decode_pngs,
)
from experimental.png_gpu.inflate import InflateBackend, NvcompInflate, ZlibInflate
from experimental.png_gpu.parse import Fallback, PngLayout, parse_png

__all__ = ["PNG_GPU_VERIFIED", "Launch", "PngDecodeStats", "decode_pngs",
           "InflateBackend", "NvcompInflate", "ZlibInflate", "Fallback", "PngLayout", "parse_png"]
