"""The native PNG core as a DALI CPU operator (`native/dali_png_op.cc`), loaded lazily.

`fn.dali_loader.png_decode(encoded, channels=C, max_pixels=N)` returns
`(pixels, ok)`: HWC uint8 pixels, exactly `tf.io.decode_png`'s, and a bool scalar per
sample, false where the core leaves the file to DALI's decoder (then its pixels are
empty, [0, 0, C]). It decodes on DALI's CPU thread pool, with no Python per image.
`pip install --no-build-isolation` builds it against the installed DALI (in a checkout,
`make install`: `python -m dali_loader.native.build_dali`); where it is not
built, or does not load into this DALI, the DALI path keeps DALI's decoder for PNGs
(said once).
"""

from __future__ import annotations

import logging
import os
import threading

from dali_loader.formats.limits import CORE_MAX_PIXELS as MAX_PIXELS
from dali_loader.formats.limits import ENTRY_MAX_PIXELS
from dali_loader.lazy import import_dali
from dali_loader.native import BUILD_DIR, build_hint

logger = logging.getLogger(__name__)

LIBRARY = str(BUILD_DIR / "dl_dali_png.so")
BUILD_COMMAND = build_hint("build_dali")
# The compact entries' GPU decode (`native/dali_entry_gpu_op.cu`): a DALI GPU operator,
# built where nvcc and nvCOMP are (`build_gpu`).
GPU_LIBRARY = str(BUILD_DIR / "dl_dali_entry_gpu.so")
GPU_BUILD_COMMAND = build_hint("build_gpu")

# The core's envelope (why: formats.limits; the TF op's default): larger PNGs go to
# DALI's decoder, as before. TF itself refuses PNGs of 2**29 pixels or more.
CORE_MAX_PIXELS = MAX_PIXELS

_lock = threading.Lock()
_state: dict[str, object] = {}  # "loaded": bool, "why": str (when not loaded)
_gpu_state: dict[str, object] = {}  # the same for GPU_LIBRARY


def _load_once(state: dict[str, object], library: str, command: str) -> str | None:
    """Loads `library` into DALI once per process (under `_lock`); why not, or None."""
    if "loaded" in state:
        return None if state["loaded"] else str(state["why"])
    why = None
    if not os.path.exists(library):
        why = f"{library} is not built (build it: {command})"
    else:
        dali = import_dali()
        from nvidia.dali import plugin_manager

        try:
            plugin_manager.load_library(library)
        except Exception as e:  # DALI raises RuntimeError for a library it cannot load
            why = (f"DALI could not load {library} ({e}); rebuild it against this DALI "
                   f"{dali.__version__}: {command}")
    state["loaded"] = why is None
    if why is not None:
        state["why"] = why
    return why


def load() -> bool:
    """Loads the operator into DALI once per process; False (and why, logged once)
    where it is not built or DALI refuses it."""
    with _lock:
        first = "loaded" not in _state
        why = _load_once(_state, LIBRARY, BUILD_COMMAND)
    if why is not None and first:
        logger.warning("The native PNG decoder for DALI is not available: %s. PNGs on the "
                       "DALI path are decoded by DALI's decoder (libpng).", why)
    return why is None


def available() -> bool:
    """Whether the operator is built and loads into this process's DALI."""
    return load()


def unavailable_reason() -> str | None:
    """Why `load()` returned False (None when it loaded or was not tried)."""
    return _state.get("why")  # type: ignore[return-value]


def png_decode(dali, encoded, channels: int, max_pixels: int | None):
    """`(pixels, ok)` of the operator on DataNode `encoded` (1-D uint8 per sample). It
    leaves images over `max_pixels` (None: no limit of the caller's) or over
    `CORE_MAX_PIXELS`. Raises a RuntimeError where the operator does not load."""
    if channels not in (1, 3, 4):
        raise ValueError(f"`channels` must be 1, 3 or 4. Received: channels={channels}")
    if not load():
        raise RuntimeError(f"The native PNG decoder for DALI is not available: "
                           f"{unavailable_reason()}")
    limit = CORE_MAX_PIXELS if max_pixels is None else min(int(max_pixels), CORE_MAX_PIXELS)
    return dali.fn.dali_loader.png_decode(encoded, channels=channels, max_pixels=limit)


def entry_decode(dali, entries, max_pixels: int | None):
    """HWC uint8 pixels of compact GPU-ready cache entries (DataNode, 1-D uint8 per
    sample; `formats.compact`), decoded by the operator on DALI's CPU threads. Raises a
    RuntimeError where the operator does not load."""
    if not load():
        raise RuntimeError(f"The native decoder for DALI is not available: "
                           f"{unavailable_reason()}")
    limit = ENTRY_MAX_PIXELS if max_pixels is None else int(max_pixels)
    return dali.fn.dali_loader.entry_decode(entries, max_pixels=limit)


def gpu_available() -> bool:
    """Whether the compact entries' GPU operator is built and loads into this DALI
    (said at debug level where not: it is only used when asked for)."""
    with _lock:
        first = "loaded" not in _gpu_state
        why = _load_once(_gpu_state, GPU_LIBRARY, GPU_BUILD_COMMAND)
    if why is not None and first:
        logger.debug("The GPU decode of compact entries is not available: %s", why)
    return why is None


def entry_decode_gpu(dali, entries, max_pixels: int | None):
    """HWC uint8 pixels, on the GPU, of compact GPU-ready cache entries already on the
    GPU (DataNode, 1-D uint8 per sample): nvCOMP's batched Zstd, the unfilter kernel
    and the CRC-32 check (`native/entry_gpu.cu`). Raises a RuntimeError where the
    operator does not load."""
    if not gpu_available():
        raise RuntimeError("The GPU decode of compact entries is not available: "
                           f"{_gpu_state.get('why')}")
    limit = ENTRY_MAX_PIXELS if max_pixels is None else int(max_pixels)
    return dali.fn.dali_loader.entry_decode_gpu(entries, max_pixels=limit, device="gpu")
