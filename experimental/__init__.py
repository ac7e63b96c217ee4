"""Experiments kept beside the package, not part of it (not installed; docs/png_gpu.md).

`png_gpu`: the batched GPU PNG decoder (nvCOMP + numba-cuda kernels), moved out of
`dali_loader` by issue 39; `png_gpu_check`: its device check.
"""
