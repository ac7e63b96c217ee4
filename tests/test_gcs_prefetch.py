"""``dali-loader prefetch`` and ``cache info|clean``: kill -9 mid-prefetch, then a verified pass."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dali_loader.storage.cache import DiskCache
from support import pythonpath
from support.fakegcs import FakeGCS, Faults, write_random_tree
from dali_loader.storage.remote import open_remote

pytestmark = pytest.mark.timeout(180)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(args: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dali_loader.tools.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def count_entries(cache_dir: str) -> int:
    root = os.path.join(cache_dir, "v1", "objects")
    return sum(len(files) for _, _, files in os.walk(root)) if os.path.isdir(root) else 0


def test_kill9_during_prefetch_then_verified_pass(tmp_path):
    files = write_random_tree(str(tmp_path / "local"), per_class=60, size=(2000, 6000), seed=21)
    cache_dir = str(tmp_path / "cache")
    with FakeGCS.from_directory(str(tmp_path / "local"), prefix="ds", faults=Faults(latency=0.03)) as server:
        env = dict(os.environ, STORAGE_EMULATOR_HOST=server.endpoint, PYTHONPATH=pythonpath())
        proc = subprocess.Popen([sys.executable, "-m", "dali_loader.tools.cli", "prefetch", "gs://b/ds", "--cache-dir",
                                 cache_dir, "--max-in-flight", "4", "--no-progress"], env=env, cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while count_entries(cache_dir) < 20 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        cached = count_entries(cache_dir)
        assert 20 <= cached < len(files)

        # Damage one complete entry as a torn write would: it must be refetched, never used.
        entry = next(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(cache_dir, "v1", "objects")) for f in fs)
        with open(entry, "r+b") as f:
            f.truncate(os.path.getsize(entry) // 2)

        server.reset_counts()
        os.environ["STORAGE_EMULATOR_HOST"] = server.endpoint
        try:
            with open_remote("gs://b/ds", cache_dir=cache_dir, max_in_flight=16) as src:
                objs = [o for o in src.list_objects() if not o.rel.endswith("/")]
                with ThreadPoolExecutor(16) as pool:
                    assert dict(zip((o.rel for o in objs), pool.map(src.fetch, objs))) == files
                src.flush()
                assert src.cache.stats().temp_files == 0  # the dead writer's temp files are gone
        finally:
            del os.environ["STORAGE_EMULATOR_HOST"]
        assert server.counts["media"] == len(files) - cached + 1

        server.reset_counts()
        done = run_cli(["prefetch", "gs://b/ds", "--cache-dir", cache_dir, "--no-progress"], env)
        assert done.returncode == 0, done.stderr
        assert f"0 downloaded, {len(files)} already cached, 0 failed" in done.stdout
        assert server.counts["media"] == 0


def test_prefetch_progress_failures_info_and_clean(tmp_path):
    files = write_random_tree(str(tmp_path / "local"), per_class=5, size=(100, 200), seed=1)
    cache_dir = str(tmp_path / "cache")
    with FakeGCS.from_directory(str(tmp_path / "local")) as server:
        server.fail_names["cats/00001.png"] = 404
        env = dict(os.environ, STORAGE_EMULATOR_HOST=server.endpoint, PYTHONPATH=pythonpath())
        out = run_cli(["prefetch", "gs://b", "--cache-dir", cache_dir, "--max-in-flight", "8"], env)
        assert out.returncode == 1
        assert "gs://b/cats/00001.png" in out.stderr
        assert "prefetch" in out.stderr and "objects" in out.stderr  # the tqdm bar
        assert f"{len(files) - 1} downloaded, 0 already cached, 1 failed" in out.stdout
    info = run_cli(["cache", "info", "--cache-dir", cache_dir], env)
    assert info.returncode == 0 and f"objects: {len(files) - 1}" in info.stdout
    trim = run_cli(["cache", "clean", "--cache-dir", cache_dir, "--keep-bytes", "1K"], env)
    assert trim.returncode == 0
    assert 0 < DiskCache(cache_dir).stats().bytes <= 1024
    clean = run_cli(["cache", "clean", "--cache-dir", cache_dir], env)
    assert clean.returncode == 0 and "0 objects (0 bytes) left" in clean.stdout
