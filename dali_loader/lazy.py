"""Heavy dependencies, imported on first use, with an error that says what to install."""

from __future__ import annotations


def import_tf():
    """Imports TensorFlow."""
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError(
            "tf.data output needs TensorFlow: pip install tensorflow==2.21.0 "
            "(or run `make install`)."
        ) from e
    return tf


def import_dali():
    """Imports NVIDIA DALI."""
    try:
        import nvidia.dali as dali
    except ImportError as e:
        raise ImportError(
            "Decoding with DALI needs NVIDIA DALI: pip install nvidia-dali-cuda120==2.4.0 "
            "(or run `make install`)."
        ) from e
    return dali


def import_gcs():
    """Imports `google.cloud.storage`."""
    try:
        from google.cloud import storage
    except ImportError as e:
        raise ImportError(
            "Reading gs:// URLs needs google-cloud-storage: pip install google-cloud-storage"
        ) from e
    return storage


def import_dali_tf():
    """Imports the DALI TensorFlow plugin (`nvidia.dali.plugin.tf`)."""
    import_tf()
    import_dali()
    try:
        import nvidia.dali.plugin.tf as dali_tf
    except ImportError as e:
        raise ImportError(
            'handoff="plugin" needs the DALI TensorFlow plugin, compiled against the installed '
            "TensorFlow: pip install --no-build-isolation nvidia-dali-tf-plugin-cuda120==2.4.0"
        ) from e
    return dali_tf


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
