"""glibc malloc settings the loader applies to its process (glibc only; a setting
the user made in the environment wins).

TensorFlow's `from_generator` sets `M_TRIM_THRESHOLD` to 128 KB when the process's
first such iterator starts (generator_dataset_op.cc: "Memory patch applied:
M_TRIM_THRESHOLD=128 kb was set"). Any explicit threshold turns off glibc's dynamic
mmap threshold (mallopt(3)), which then stays at 128 KB: every larger allocation is
a fresh `mmap` and `munmap`, its pages faulted in again each time. TF's `ReadFile`
reserves a 1 MiB buffer for every file it reads, so a `tf.io.read_file` per image
costs 3 page faults even for a 100-byte file (Keras's own pipeline, without
`from_generator`, 0.01; measured: docs/benchmarks.md, "Scale").
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt's parameters (malloc.h)
M_MMAP_THRESHOLD = -3
_TRIM_BYTES = 128 * 1024  # what TF's from_generator sets
READ_MMAP_BYTES = 2 << 20  # above TF's 1 MiB read buffer
READ_TRIM_BYTES = 4 << 20

_trim_set = False


def _mallopt():
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return None


def _user_set(*names: str) -> bool:
    """Whether the environment sets one of these thresholds (e.g. "trim_threshold")."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(f"MALLOC_{n.upper()}_" in os.environ or f"glibc.malloc.{n}" in tunables
               for n in names)


def trim_freed_memory() -> None:
    """Lets glibc hand freed heap memory back above 128 KB, once per process, as TF does.

    DALI's batches are freed and allocated again every epoch; with glibc's default
    (dynamic) trim threshold the freed tops of its heaps are kept, and RSS creeps up
    epoch after epoch (measured: 25 epochs of `DaliBatches` without TF, +34 MB after
    epoch 5; with this, +1.3 MB; docs/architecture.md, "Memory over many epochs").
    A trim threshold the user set (`MALLOC_TRIM_THRESHOLD_`, `GLIBC_TUNABLES`) wins;
    not glibc: nothing to do."""
    global _trim_set
    if _trim_set:
        return
    _trim_set = True
    mallopt = _mallopt()
    if _user_set("trim_threshold") or mallopt is None:
        return
    if mallopt(M_TRIM_THRESHOLD, _TRIM_BYTES) == 1:
        logger.debug("glibc's M_TRIM_THRESHOLD set to %d bytes", _TRIM_BYTES)


def keep_read_buffers() -> None:
    """For TF's kernels reading files (the CPU default), at each epoch's start: an
    mmap threshold of 2 MiB and a trim threshold of 4 MiB, so that TF's 1 MiB read
    buffer (and decoded images under 2 MiB) come from the heap and go back to it,
    instead of a fresh mapping per file. Both stay fixed (what glibc's dynamic
    thresholds would reach for 1 MiB buffers, capped): at most 4 MiB kept free at the
    top of each heap. Thresholds the user set in the environment win."""
    mallopt = _mallopt()
    if mallopt is None or _user_set("trim_threshold", "mmap_threshold"):
        return
    mallopt(M_MMAP_THRESHOLD, READ_MMAP_BYTES)
    mallopt(M_TRIM_THRESHOLD, READ_TRIM_BYTES)
