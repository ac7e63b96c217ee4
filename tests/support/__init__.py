"""Test support, never shipped nor imported by the library: the fake GCS server
(`fakegcs`), the slow FUSE mount (`slowfuse`), PNG corpora and mutants (`pngs`,
`png_corpus`, `mutate`, `fuzz_png`), process clusters (`cluster`, `service_cluster`) and
the tests' small helpers (`helpers`). The tests, benchmarks/ and device_checks/ import
it as `support` with `tests/` on `sys.path` (pytest puts it there; benchmarks/harness.py
and the device checks add it); a subprocess gets it through `pythonpath()`.
"""

from __future__ import annotations

import os
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def pythonpath(*extra: str) -> str:
    """A PYTHONPATH for a subprocess that imports this checkout's `dali_loader` and `support`."""
    return os.pathsep.join([str(REPO), str(TESTS), *extra])
