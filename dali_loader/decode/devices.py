"""Which device decodes: the GPU when TF and DALI both see one, else the CPU (the one resolver)."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

DEVICES = (None, "auto", "cpu", "gpu")


def dali_gpu_count() -> int:
    """CUDA devices DALI can use (0 without a GPU or driver)."""
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return int(GetCUDADeviceCount())
    except Exception:  # no driver, no CUDA runtime: CPU only
        return 0


def resolve_device(device: str | None, tf=None) -> str:
    """Maps None ("auto") to "gpu" when DALI (and TF, when `tf` is given) see a
    GPU, else "cpu"; checks that a requested "gpu" exists.

    With `tf` (the tensorflow module), a GPU result also turns on TF memory
    growth, so that TF and DALI share the card.
    """
    if device not in DEVICES:
        raise ValueError(
            f'`device` must be None (auto), "cpu" or "gpu". Received: device={device}'
        )
    if device == "cpu":
        return "cpu"
    tf_gpus = tf.config.list_physical_devices("GPU") if tf is not None else None
    if tf_gpus is not None and not tf_gpus:
        if device == "gpu":
            raise ValueError(
                'device="gpu" was requested but TensorFlow sees no GPU. Install TensorFlow '
                "with CUDA (pip install 'tensorflow[and-cuda]') or use device=None."
            )
        return "cpu"
    if dali_gpu_count() == 0:
        if device == "gpu":
            raise ValueError(
                'device="gpu" was requested but DALI sees no CUDA GPU. Use device=None '
                "to pick the CPU automatically, or check the driver and CUDA_VISIBLE_DEVICES."
            )
        return "cpu"
    if tf_gpus:
        share_gpu_with_dali(tf, tf_gpus)
    return "gpu"


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
