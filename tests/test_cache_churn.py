"""The GPU-ready cache's cached epochs do no per-file filesystem churn (issue 23):
counted filesystem and hashing calls, not timings."""

from __future__ import annotations

import collections
import hashlib
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from dali_loader.storage import cache as cache_mod  # noqa: E402
from dali_loader.storage.cache import DiskCache  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def counted(monkeypatch):
    """Counts calls of filesystem and hashing functions the cache could make per file."""
    counts: collections.Counter[str] = collections.Counter()

    def wrap(owner, name, key=None):
        real = getattr(owner, name)

        def counting(*a, **k):
            counts[key or name] += 1
            return real(*a, **k)

        monkeypatch.setattr(owner, name, counting)

    for name in ("link", "unlink", "makedirs", "replace", "utime", "open"):
        wrap(os, name)
    real_stat = os.stat

    def stat(path, *a, **k):  # by what is statted: an image file, or anything else
        counts["stat_png" if str(path).endswith(".png") else "stat_other"] += 1
        return real_stat(path, *a, **k)

    monkeypatch.setattr(os, "stat", stat)
    wrap(hashlib, "sha256")
    wrap(cache_mod, "_crc32c", "crc32c")
    wrap(DiskCache, "_scan_usage", "scan_usage")
    return counts


def epoch(ds) -> np.ndarray:
    return np.concatenate([x.numpy() for x, _ in ds])


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_cached_epochs_open_each_entry_once_and_nothing_else(id_tree, tmp_path, counted, decoder):
    kw = dict(image_size=(8, 8), shuffle=True, seed=2, batch_size=5, verbose=False, decoder=decoder,
              gpu_ready=True, cache_dir=str(tmp_path), interpolation="nearest")
    ds = ours(str(id_tree), **kw)
    want = epoch(ds)  # fills the cache
    epoch(ds)  # first cached epoch: checks each entry's header once
    counted.clear()
    got = epoch(ds)
    assert counted["link"] == counted["unlink"] == counted["makedirs"] == counted["replace"] == 0
    assert counted["sha256"] == 0  # keys computed once per dataset
    assert counted["open"] == 23  # the entry, once per file: its descriptor is the pin
    assert counted["stat_png"] == 23  # the source file (has it changed?), once per file
    assert counted["crc32c"] == 0
    np.testing.assert_array_equal(np.sort(got, axis=0), np.sort(want, axis=0))
    assert len(ds.loader.engine.source.cache._verified) == 0  # nothing per file kept in the cache object

    # A new process: opening the cache reads its usage file, no scan of the entries;
    # its first cached epoch checks headers and sizes, no checksum over the payloads.
    counted.clear()
    again = ours(str(id_tree), **kw)
    assert counted["scan_usage"] == 0
    got = epoch(again)
    assert counted["crc32c"] == 0 and counted["link"] == counted["unlink"] == 0
    assert again.loader.epoch_stats[-1].get("cache_fills", 0) == 0
    np.testing.assert_array_equal(np.sort(got, axis=0), np.sort(want, axis=0))


def test_an_open_entry_survives_eviction_by_another_process(id_tree, tmp_path):
    """The descriptor is the pin: another cache instance (another process) evicting
    everything does not take an entry from the reader that holds it."""
    from dali_loader.api import open_index
    from dali_loader.formats.ready import ReadyForm
    from dali_loader.feed.items import OpenEntry
    from dali_loader.feed.ready import ReadyPinned
    from dali_loader.tfdata.dataset import ready_cache

    src, index = open_index(str(id_tree), shuffle=False, cache_dir=str(tmp_path))
    with src:
        ready = ready_cache(src, ReadyForm.RAW, 3)
        reader = ReadyPinned(ready, index.paths)
        first = [reader(i) for i in range(len(index))]  # filled, then opened like a hit
        assert all(isinstance(e, OpenEntry) for e in first) and ready.fills == len(index)
        entries = [os.pread(e.fd, os.fstat(e.fd).st_size - e.offset, e.offset) for e in first]
        for e in first:
            reader.release(e)
        held = [reader(i) for i in range(len(index))]
        assert all(isinstance(h, OpenEntry) for h in held) and ready.hits == len(index)
        other = DiskCache(str(tmp_path))
        assert other.evict(0) > 0 and other.stats().objects == 0
        for h, e in zip(held, entries):
            size = os.fstat(h.fd).st_size - h.offset
            assert os.pread(h.fd, size, h.offset) == e  # read whole, after the eviction
            reader.release(h)
        again = reader(0)  # gone now: filled again
        assert isinstance(again, OpenEntry) and ready.fills == len(index) + 1
        reader.release(again)
