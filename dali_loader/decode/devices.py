"""The GPU's probe and set-up: DALI's device count, TF sharing the card (the device is the plan's)."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def dali_gpu_count() -> int:
    """CUDA devices DALI can use (0 without a GPU or driver)."""
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return int(GetCUDADeviceCount())
    except Exception:  # no driver, no CUDA runtime: CPU only
        return 0


def share_gpu_with_dali(tf, gpus) -> None:
    """Turns on TF memory growth unless the async allocator is in use.

    TF grabs nearly all GPU memory by default, which starves DALI; memory
    growth (or `TF_GPU_ALLOCATOR=cuda_malloc_async`) lets both share one GPU.
    """
    if os.environ.get("TF_GPU_ALLOCATOR") == "cuda_malloc_async":
        return  # the async allocator does not pre-reserve the whole device
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:
            logger.warning(
                "TensorFlow's GPU is already initialised, so memory growth cannot be "
                "turned on; DALI may run out of GPU memory. Call "
                "image_dataset_from_directory before building the model, or set "
                "TF_GPU_ALLOCATOR=cuda_malloc_async."
            )
            return
