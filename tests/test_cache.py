"""The disk cache: verification, atomicity, LRU bound, sharing between processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dali_loader.storage.cache import DiskCache, checksum_problem, default_cache_dir
from support import pythonpath
from support.fakegcs import FakeGCS, b64_crc32c, b64_md5, write_random_tree
from dali_loader.storage.objects import ObjectInfo
from dali_loader.storage.remote import open_remote

pytestmark = pytest.mark.timeout(180)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def info(name: str, data: bytes, gen: str = "1", md5_only: bool = False) -> ObjectInfo:
    crc = None if md5_only else b64_crc32c(data)
    return ObjectInfo(name, name, len(data), gen, crc, b64_md5(data), "bkt")


def age(cache: DiskCache, o: ObjectInfo, i: int) -> None:
    """Sets entry `o`'s LRU time (its mtime) to i s after a fixed point 1000 s ago: distinct,
    ordered by `i`, and older than any touch the cache makes now (no sleeps, which a
    file system's coarse timestamp clock can merge)."""
    t = time.time() - 1000 + i
    os.utime(cache.path_for("bkt", o), (t, t))


def test_roundtrip_and_verification(tmp_path):
    cache = DiskCache(str(tmp_path), max_bytes=10**6)
    a = info("c/a.png", b"A" * 1000)
    assert cache.get("bkt", a) is None
    assert cache.put("bkt", a, b"A" * 1000)
    assert cache.get("bkt", a) == b"A" * 1000
    assert cache.get("other-bucket", a) is None  # keyed by bucket
    assert cache.get("bkt", info("c/a.png", b"A" * 1000, gen="2")) is None  # and generation
    path = cache.path_for("bkt", a)
    assert os.path.dirname(os.path.dirname(path)).startswith(str(tmp_path)) and "a.png" not in path

    blob = open(path, "rb").read()
    for bad in (blob[:-1], blob[: len(blob) // 2], blob[:-1] + bytes([blob[-1] ^ 1]), b"", b"garbage"):
        with open(path, "wb") as f:  # a partial or corrupt file is never trusted
            f.write(bad)
        assert cache.get("bkt", a) is None
        assert not os.path.exists(path)  # and removed
    m = info("m.png", b"md5 only", md5_only=True)
    cache.put("bkt", m, b"md5 only")
    assert cache.get("bkt", m) == b"md5 only"


def test_checksum_problem():
    data = b"hello"
    assert checksum_problem(data, 5, b64_crc32c(data), b64_md5(data)) is None
    assert "size" in checksum_problem(data, 6, None, None)
    assert "crc32c" in checksum_problem(b"hellp", 5, b64_crc32c(data), None)
    assert "md5" in checksum_problem(b"hellp", 5, None, b64_md5(data))
    with pytest.raises(ValueError, match="max_bytes"):
        DiskCache("/tmp/never-created-dali", max_bytes=0)


def test_lru_eviction_keeps_recently_used(tmp_path):
    cache = DiskCache(str(tmp_path), max_bytes=10_000, touch_interval_s=0)
    objs = [info(f"o{i}", bytes([i]) * 1000) for i in range(30)]
    for i, o in enumerate(objs):
        cache.put("bkt", o, bytes([i]) * 1000)
        if cache.contains("bkt", o):
            age(cache, o, i)
        if i >= 1:
            assert cache.get("bkt", objs[0]) is not None, i  # keep touching o0: it stays
        assert cache.stats().bytes <= 10_000 + 30 * 200  # payload bound (+ small headers)
    assert cache.get("bkt", objs[0]) is not None
    assert cache.get("bkt", objs[1]) is None  # the least recently used went first
    assert cache.get("bkt", objs[-1]) is not None
    assert not cache.put("bkt", info("huge", b"x" * 20_000), b"x" * 20_000)  # never fits: not cached


def test_writes_during_an_eviction_scan_keep_the_bound(tmp_path, monkeypatch):
    """A write another thread makes while an eviction scans the entries is still
    counted: the next write over the bound evicts again, and the cache ends within
    it. (Before, the eviction set the count from its scan alone, and a cache shared
    by 8 fetch threads could stay over its bound.)"""
    cache = DiskCache(str(tmp_path), max_bytes=10_000, touch_interval_s=0)
    scan = cache._entries
    late = [info(f"late{i}", b"l" * 1000) for i in range(3)]

    def scan_then_write():  # the eviction's scan; as it ends, another thread writes 3 entries
        entries = list(scan())
        monkeypatch.setattr(cache, "_entries", scan)
        for o in late:
            with monkeypatch.context() as m:
                m.setattr(cache, "evict", lambda target: 0)  # the racing writer's own check
                cache.put("bkt", o, b"l" * 1000)
        yield from entries

    i = 0
    while cache.stats().bytes < 9_000:  # just under the bound
        cache.put("bkt", info(f"o{i}", b"o" * 1000), b"o" * 1000)
        i += 1
    monkeypatch.setattr(cache, "_entries", scan_then_write)
    cache.put("bkt", info("over", b"o" * 1000), b"o" * 1000)  # evicts, while 3 more land
    assert cache.stats().bytes > 10_000  # the late writes: over the bound for now
    cache.put("bkt", info("next", b"o" * 1000), b"o" * 1000)
    assert cache.stats().bytes <= 10_000
    assert cache._approx_bytes >= cache.stats().bytes


def test_pinned_entry_survives_eviction_and_pins_refresh_lru(tmp_path):
    cache = DiskCache(str(tmp_path), max_bytes=10_000, touch_interval_s=0)
    objs = [info(f"p{i}", bytes([i]) * 1000) for i in range(8)]
    for i, o in enumerate(objs):
        cache.put("bkt", o, bytes([i]) * 1000)
        age(cache, o, i)
    pinned, offset = cache.pin("bkt", objs[0])  # the oldest entry, now held by a reader
    assert cache.pin("bkt", info("never", b"n")) is None  # not cached: no pin
    cache.evict(0)  # another writer makes room: every entry goes
    assert cache.get("bkt", objs[0]) is None
    with open(pinned, "rb") as f:  # the reader still gets the verified bytes
        f.seek(offset)
        assert f.read() == bytes([0]) * 1000
    cache.unpin(pinned)
    assert not os.path.exists(pinned)
    cache.unpin(pinned)  # idempotent

    for i, o in enumerate(objs):  # a pin is a hit: it refreshes the LRU order
        cache.put("bkt", o, bytes([i]) * 1000)
        age(cache, o, i)
    cache.unpin(cache.pin("bkt", objs[0])[0])
    cache.evict(4_500)
    assert cache.get("bkt", objs[0]) is not None  # pinned last: kept
    assert cache.get("bkt", objs[1]) is None


def test_pins_of_a_killed_process_are_removed(tmp_path):
    pins = tmp_path / "v1" / "pins"
    (pins / "999999999.deadbeef").mkdir(parents=True)
    (pins / "999999999.deadbeef" / "x.0").write_bytes(b"x")
    cache = DiskCache(str(tmp_path), max_bytes=10_000)
    assert sorted(os.listdir(pins)) == []
    o = info("a", b"a" * 10)
    cache.put("bkt", o, b"a" * 10)
    cache.pin("bkt", o)
    assert len(os.listdir(pins)) == 1
    cache.close()  # an instance's own pins go with it
    assert os.listdir(pins) == []


def test_dataset_larger_than_cache(tmp_path, monkeypatch):
    files = write_random_tree(str(tmp_path / "local"), per_class=20, size=(3000, 3000), seed=9)
    total = sum(len(v) for v in files.values())
    with FakeGCS.from_directory(str(tmp_path / "local")) as server:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint)
        with open_remote("gs://b", cache_dir=str(tmp_path / "c"), cache_max_bytes=total // 3) as src:
            objs = src.list_objects()
            for _ in range(2):
                assert {o.rel: src.fetch(o) for o in objs} == files
                src.flush()
                assert src.cache.stats().bytes <= total // 3 + len(objs) * 200
        assert server.counts["media"] > len(objs)  # evicted objects were fetched again


_WORKER = r"""
import os, sys
from concurrent.futures import ThreadPoolExecutor
from support.fakegcs import write_random_tree
from dali_loader.storage.remote import open_remote
files = write_random_tree(sys.argv[2] + "/truth-" + str(os.getpid()), per_class=30, size=(1000, 3000), seed=11)
with open_remote("gs://b", cache_dir=sys.argv[1], cache_max_bytes=10**8) as src:
    objs = src.list_objects()
    with ThreadPoolExecutor(16) as pool:
        for _ in range(2):
            got = dict(zip((o.rel for o in objs), pool.map(src.fetch, objs)))
            if got != files:
                sys.exit(3)
"""


def test_processes_share_one_cache(tmp_path, monkeypatch):
    files = write_random_tree(str(tmp_path / "local"), per_class=30, size=(1000, 3000), seed=11)
    cache_dir = str(tmp_path / "shared-cache")
    with FakeGCS.from_directory(str(tmp_path / "local")) as server:
        env = dict(os.environ, STORAGE_EMULATOR_HOST=server.endpoint, PYTHONPATH=pythonpath())
        procs = [subprocess.Popen([sys.executable, "-c", _WORKER, cache_dir, str(tmp_path)], env=env)
                 for _ in range(3)]
        codes = [p.wait(timeout=120) for p in procs]
        assert codes == [0, 0, 0]
        assert server.counts["media"] >= len(files)
    stats = DiskCache(cache_dir).stats()
    assert stats.objects == len(files) and stats.temp_files == 0


def test_stale_temp_files_removed_and_default_dir(tmp_path, monkeypatch):
    cache = DiskCache(str(tmp_path / "c"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = os.path.join(cache.root, "v1", "tmp", f"{dead}.abc.tmp")
    mine = os.path.join(cache.root, "v1", "tmp", f"{os.getpid()}.abc.tmp")
    for p in (stale, mine):
        open(p, "wb").write(b"partial")
    assert DiskCache(str(tmp_path / "c")).stats().temp_files == 1  # a live writer's file stays
    assert not os.path.exists(stale)
    os.unlink(mine)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "dali-loader")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "dali-loader")


def test_usage_is_shared_through_the_usage_file_not_a_scan(tmp_path, monkeypatch):
    """A cache opened after another wrote knows the bytes used without a stat of each entry;
    eviction rewrites the exact figure."""
    writer = DiskCache(str(tmp_path), max_bytes=10**6)
    for i in range(40):
        writer.put("bkt", info(f"o{i}", bytes([i]) * 100), bytes([i]) * 100)
    writer.close()  # records what it wrote
    scans = []
    real = DiskCache._scan_usage
    monkeypatch.setattr(DiskCache, "_scan_usage", lambda self: scans.append(1) or real(self))
    reader = DiskCache(str(tmp_path), max_bytes=10**6)
    assert not scans
    monkeypatch.undo()
    assert reader._approx_bytes == reader.stats().bytes > 4000
    reader.evict(2000)
    assert DiskCache(str(tmp_path))._approx_bytes == reader.stats().bytes <= 2000
