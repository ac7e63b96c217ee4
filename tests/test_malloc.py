"""The loader's glibc malloc settings (dali_loader.malloc): TF's `from_generator`
fixes glibc's mmap threshold at 128 KB, so TF's 1 MiB read buffer was a fresh
mapping per file; the CPU default keeps it on the heap. Counted in page faults,
not timed."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from dali_loader import malloc  # noqa: E402
from support import pythonpath
from support.pngs import encode_png  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]

_FAULTS = """
import os, resource, sys
from tf_adapter import image_dataset_from_directory as ours
ds = ours(sys.argv[1], image_size=(8, 8), batch_size=32, verbose=False)
for e in range(4):
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    n = sum(int(x.shape[0]) for x, _ in ds)
    print("EPOCH", n, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f) / n, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_cpu_default_reads_files_without_a_fresh_mapping_each(tmp_path):
    """Later epochs of the CPU default fault under one page per image (3 per image
    before: TF's 1 MiB read buffer mapped and unmapped for every file)."""
    rng = np.random.default_rng(0)
    for i in range(400):
        path = tmp_path / f"c{i % 4}" / f"{i:03d}.png"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(encode_png(rng.integers(0, 256, (8, 8, 3), np.uint8)))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    r = subprocess.run([sys.executable, "-c", _FAULTS, str(tmp_path)], capture_output=True,
                       text=True, timeout=300,
                       env=dict(env, PYTHONPATH=pythonpath(), TF_CPP_MIN_LOG_LEVEL="3"))
    assert r.returncode == 0, r.stderr[-3000:]
    epochs = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("EPOCH")]
    assert [int(e[1]) for e in epochs] == [400] * 4
    assert max(float(e[2]) for e in epochs[2:]) < 1.0, epochs


def test_thresholds_the_user_set_win(monkeypatch):
    """`MALLOC_*_THRESHOLD_` or `GLIBC_TUNABLES` thresholds: the loader sets none."""
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    assert not malloc._user_set("trim_threshold", "mmap_threshold")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert malloc._user_set("trim_threshold", "mmap_threshold")
    assert not malloc._user_set("trim_threshold")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")
    assert malloc._user_set("trim_threshold")
    calls = []
    monkeypatch.setattr(malloc, "_mallopt", lambda: lambda *a: calls.append(a) or 1)
    malloc.keep_read_buffers()
    assert calls == []
    monkeypatch.delenv("GLIBC_TUNABLES")
    malloc.keep_read_buffers()
    assert calls == [(malloc.M_MMAP_THRESHOLD, 2 << 20), (malloc.M_TRIM_THRESHOLD, 4 << 20)]
