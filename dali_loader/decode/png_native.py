"""The native PNG core (`dali_loader/native/png_core.cc`) from Python, through ctypes.

The same outcome as `png_cpu.decode_png` (TF's pixels bit for bit, or a `Fallback`
for the file to go to TF's decoder), with no per-image Python beyond the call: the
front end (chunk walk, CRCs, plan, post-steps) and Wuffs run in C++, ctypes releases
the GIL for the call, and the pixels land in memory the caller owns
(`decode_png_into`, or `decode_png(..., alloc=...)` with a pooled allocator).

The core is built by `pip install --no-build-isolation` (setup.py) or, in a checkout, by
`python -m dali_loader.native.build` (`make install` runs it) into
`dali_loader/native/_build/libdlpng.so`; `available()` says whether it is there.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
from collections.abc import Callable

import numpy as np

from dali_loader.formats.limits import CORE_MAX_PIXELS as MAX_PIXELS
from dali_loader.formats.png import Fallback
from dali_loader.native import BUILD_DIR, build_hint

logger = logging.getLogger(__name__)

LIBRARY = BUILD_DIR / "libdlpng.so"
BUILD_HINT = f"the native PNG core is not built: run {build_hint('build')}"
_OK = 0


class _Plan(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in (
        "width", "height", "channels", "depth", "color_type", "interlace", "wuffs_format",
        "step")]


class _Counts(ctypes.Structure):
    _fields_ = [("buffers", ctypes.c_uint64), ("cpu_probes", ctypes.c_uint64)]


@dataclasses.dataclass(frozen=True)
class PngPlan:
    """What the core decided for one file: its output shape, and the plan to decode it."""

    shape: tuple[int, int, int]
    raw: _Plan

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.shape[2]


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_load_error: str | None = None


def _load() -> ctypes.CDLL | None:
    global _lib, _load_error
    if _lib is not None or _load_error is not None:
        return _lib
    with _lock:
        if _lib is None and _load_error is None:
            if not LIBRARY.exists():
                _load_error = f"{LIBRARY} is missing: {BUILD_HINT}"
                return None
            try:
                lib = ctypes.CDLL(str(LIBRARY))  # CDLL: the GIL is released per call
            except OSError as e:
                _load_error = f"{LIBRARY} does not load ({e}): {BUILD_HINT}"
                return None
            reason = ctypes.POINTER(ctypes.c_char_p)
            lib.dl_png_plan_decode.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                               ctypes.c_uint64, ctypes.POINTER(_Plan), reason]
            lib.dl_png_plan_decode.restype = ctypes.c_int
            lib.dl_png_decode_into.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                               ctypes.POINTER(_Plan), ctypes.c_void_p,
                                               ctypes.c_size_t, reason]
            lib.dl_png_decode_into.restype = ctypes.c_int
            lib.dl_png_get_counts.argtypes = [ctypes.POINTER(_Counts)]
            lib.dl_png_get_counts.restype = None
            _lib = lib
    return _lib


def available() -> bool:
    """Whether the native core is built and loads."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why `available()` is False (what to run), or None."""
    _load()
    return _load_error


def counts() -> dict[str, int]:
    """What the core has done so far in this process, whichever caller ran it (the TF
    op, the DALI operator, ctypes share one loaded core): `buffers`, its per-thread
    buffers' mallocs (a thread's grow to its largest image, not per image);
    `cpu_probes`, the CPU-feature probes Wuffs ran (once per feature per process)."""
    c = _Counts()
    _require().dl_png_get_counts(ctypes.byref(c))
    return {"buffers": int(c.buffers), "cpu_probes": int(c.cpu_probes)}


def _require() -> ctypes.CDLL:
    lib = _load()
    if lib is None:
        raise ImportError(f"The native PNG decoder is unavailable: {_load_error}")
    return lib


def _address(data) -> tuple[object, int]:
    """(a C pointer argument, the length) for bytes-like `data`, without a copy."""
    if isinstance(data, bytes):
        return data, len(data)
    arr = np.frombuffer(data, np.uint8)
    return arr.ctypes.data, arr.size


def plan_png(data, channels: int, max_pixels: int = MAX_PIXELS) -> PngPlan | Fallback:
    """The core's front end for one file: its `PngPlan`, or a `Fallback` (TF decodes it)."""
    if channels not in (1, 3, 4):
        raise ValueError(f"`channels` must be 1, 3 or 4. Received: channels={channels}")
    if max_pixels < 1:
        raise ValueError(f"`max_pixels` must be positive. Received: max_pixels={max_pixels}")
    lib = _require()
    ptr, n = _address(data)
    plan, why = _Plan(), ctypes.c_char_p()
    if lib.dl_png_plan_decode(ptr, n, channels, max_pixels, ctypes.byref(plan),
                              ctypes.byref(why)) != _OK:
        return Fallback((why.value or b"?").decode())
    return PngPlan((plan.height, plan.width, plan.channels), plan)


def decode_png_into(data, plan: PngPlan, out: np.ndarray) -> np.ndarray | Fallback:
    """Decodes `data` as `plan`ned into `out` (writable, C-contiguous, at least
    `plan.nbytes` bytes); returns the HxWxC uint8 view of `out`, or a `Fallback`
    (Wuffs refused the data: `out` then holds garbage)."""
    if not (out.flags.c_contiguous and out.flags.writeable) or out.nbytes < plan.nbytes:
        raise ValueError("`out` must be a writable C-contiguous buffer of at least "
                         f"{plan.nbytes} bytes. Received: out.shape={out.shape}, "
                         f"out.dtype={out.dtype}")
    lib = _require()
    ptr, n = _address(data)
    why = ctypes.c_char_p()
    if lib.dl_png_decode_into(ptr, n, ctypes.byref(plan.raw), out.ctypes.data, out.nbytes,
                              ctypes.byref(why)) != _OK:
        return Fallback("Wuffs: " + (why.value or b"?").decode())
    return out.reshape(-1).view(np.uint8)[:plan.nbytes].reshape(plan.shape)


def decode_png(data, channels: int, max_pixels: int = MAX_PIXELS,
               alloc: Callable[[int], np.ndarray] | None = None) -> np.ndarray | Fallback:
    """TF's `decode_png(data, channels)` pixels (HxWxC uint8), or a `Fallback`, like
    `png_cpu.decode_png`. `alloc(nbytes)` gives the output buffer (default: a fresh
    array); an image over `max_pixels` falls back before anything is allocated."""
    plan = plan_png(data, channels, max_pixels)
    if isinstance(plan, Fallback):
        return plan
    out = alloc(plan.nbytes) if alloc is not None else np.empty(plan.nbytes, np.uint8)
    return decode_png_into(data, plan, out)
