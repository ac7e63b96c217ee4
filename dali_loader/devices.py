"""Which device runs the DALI graph: the GPU when DALI sees one, else the CPU."""

from __future__ import annotations


def dali_gpu_count() -> int:
    """CUDA devices DALI can use (0 without a GPU or driver)."""
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return int(GetCUDADeviceCount())
    except Exception:  # no driver, no CUDA runtime: CPU only
        return 0


def resolve_device(device: str | None) -> str:
    """Maps None ("auto") to "gpu" when DALI sees a GPU, else "cpu"."""
    if device not in (None, "auto", "cpu", "gpu"):
        raise ValueError(
            f'`device` must be None (auto), "cpu" or "gpu". Received: device={device}'
        )
    if device in (None, "auto"):
        return "gpu" if dali_gpu_count() > 0 else "cpu"
    if device == "gpu" and dali_gpu_count() == 0:
        raise ValueError(
            'device="gpu" was requested but DALI sees no CUDA GPU. Use device=None '
            'to pick the CPU automatically, or check the driver and CUDA_VISIBLE_DEVICES.'
        )
    return device
