"""The GPU PNG decoder's heavy imports, made on first use, each with its install hint."""


def import_numba_cuda():
    """Imports `numba.cuda` (numba-cuda); its simulator when NUMBA_ENABLE_CUDASIM=1 was set first."""
    try:
        from numba import cuda
    except ImportError as e:
        raise ImportError(
            "The batched PNG decoder's kernels need numba-cuda: pip install numba-cuda"
        ) from e
    import numpy as np

    # numba-cuda registers an overload for np.row_stack when it compiles its first kernel;
    # numpy 2.5 removed that name (seen on the H200 machine: AttributeError; docs/png_gpu.md).
    # The alias is numpy's own former definition.
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    return cuda


def import_cupy():
    """Imports CuPy (device arrays for the GPU PNG decoder)."""
    try:
        import cupy
    except ImportError as e:
        raise ImportError(
            "Decoding PNGs on the GPU needs CuPy: pip install cupy-cuda12x (or cupy-cuda13x)"
        ) from e
    return cupy


def import_nvcomp():
    """Imports nvCOMP's Python API (`nvidia.nvcomp`, nvCOMP 6)."""
    try:
        from nvidia import nvcomp
    except ImportError as e:
        raise ImportError(
            "Inflating PNGs on the GPU needs nvCOMP: pip install nvidia-nvcomp-cu12 "
            "(or nvidia-nvcomp-cu13 with a CUDA 13 driver)"
        ) from e
    return nvcomp
