"""gs:// through the whole loader: bit-identical to the local folder, faults and all."""

from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from support.fakegcs import Faults  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

pytestmark = pytest.mark.timeout(300)

FAULTS = Faults(error_rate=0.10, reset_rate=0.05, truncate_rate=0.05, flip_rate=0.03, seed=7)


def arrays(ds):
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    return np.concatenate(xs), np.concatenate(ys)


def test_epochs_over_faulty_gcs_are_bit_identical_to_local(photo_tree, gcs, tmp_path):
    server = gcs(photo_tree, prefix="data/v1", faults=FAULTS)
    kw = dict(image_size=(40, 56), batch_size=4, shuffle=False, verbose=False)
    local = ours(str(photo_tree), **kw)
    lx, ly = arrays(local)
    cache = str(tmp_path / "cache")
    remote = ours("gs://b/data/v1", cache_dir=cache, max_in_flight=16, **kw)
    assert remote.class_names == local.class_names
    assert [p.replace("gs://b/data/v1", str(photo_tree)) for p in remote.file_paths] \
        == local.file_paths
    for _ in range(3):  # cold cache, then warm (TF reads the verified cache files)
        rx, ry = arrays(remote)
        np.testing.assert_array_equal(rx, lx)
        np.testing.assert_array_equal(ry, ly)
    source = remote.loader.engine.source
    pins = [source.pin(p) for p in remote.file_paths]  # the warm fast path: pinned entries
    assert all(p is not None for p in pins)
    for file, _ in pins:
        source.unpin(file)
    remote.loader.close()
    downloads = sum(server.media_counts.values()) if hasattr(server, "media_counts") else None
    # A new run on the same cache downloads nothing.
    server.reset_counts()
    again = ours("gs://b/data/v1", cache_dir=cache, **kw)
    np.testing.assert_array_equal(arrays(again)[0], lx)
    assert sum(server.media_counts.values()) == 0, (downloads, server.media_counts)


def test_dali_path_over_faulty_gcs_matches_local(photo_tree, gcs, tmp_path):
    """The GPU path's graph (DALI decodes the fetched bytes), here on the CPU:
    each reshuffled epoch, cold cache then warm, equals the local folder's."""
    gcs(photo_tree, faults=FAULTS)
    kw = dict(image_size=(40, 56), batch_size=4, shuffle=True, seed=3, verbose=False, decoder="dali")
    local = ours(str(photo_tree), **kw)
    remote = ours("gs://b", cache_dir=str(tmp_path / "cache"), max_in_flight=16, **kw)
    assert type(remote.loader.engine).__name__ == "DaliBatches"  # DALI decodes the fetched bytes
    for _ in range(2):
        lx, ly = arrays(local)
        rx, ry = arrays(remote)
        np.testing.assert_array_equal(rx, lx)
        np.testing.assert_array_equal(ry, ly)
    remote.loader.close()
    local.loader.close()


def test_split_and_shuffle_match_local(photo_tree, gcs, tmp_path):
    gcs(photo_tree)
    kw = dict(image_size=(16, 16), validation_split=0.3, subset="both", seed=5, verbose=False)
    lt, lv = ours(str(photo_tree), **kw)
    rt, rv = ours("gs://b", cache_dir=str(tmp_path / "c"), **kw)
    for l_ds, r_ds in ((lt, rt), (lv, rv)):
        assert [p.replace("gs://b", str(photo_tree)) for p in r_ds.file_paths] == l_ds.file_paths
    lx, _ = arrays(lv)
    rx, _ = arrays(rv)
    np.testing.assert_array_equal(rx, lx)


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_object_that_keeps_failing_is_a_read_error_not_a_bad_image(id_tree, gcs, tmp_path,
                                                                   caplog, decoder):
    server = gcs(id_tree)
    server.fail_names["odd/005.png"] = 503
    kw = dict(image_size=(8, 8), batch_size=4, shuffle=False, label_mode=None, verbose=False,
              decoder=decoder)
    ds = ours("gs://b", cache_dir=str(tmp_path / "c1"), **kw)
    with pytest.raises(tf.errors.OpError, match="Cannot read gs://b/odd/005.png") as err:
        for _ in ds:
            pass
    assert "Cannot load image file" not in str(err.value)  # not reported as a corrupt image
    caplog.set_level(logging.WARNING)
    ds = ours("gs://b", cache_dir=str(tmp_path / "c2"), on_error="skip", **kw)
    ids = sorted(int(round(float(x[0, 0, 0]) / 10)) for b in ds for x in b.numpy())
    assert ids == [i for i in range(23) if i != 5]
    assert any("gs://b/odd/005.png" in r.getMessage() for r in caplog.records)
    report = ds.loader.engine.feed.report if decoder == "dali" else ds.loader.engine.report
    assert list(report.of_kind("unreadable")) == ["gs://b/odd/005.png"]
    assert report.of_kind("corrupt") == {}


def test_kill9_during_prefetch_then_epoch_is_bit_identical(photo_tree, gcs, tmp_path):
    """SIGKILL the prefetch part-way (some objects cached, not all), then an epoch over
    the cache: Keras's pixels, the complete entries used and only the rest downloaded."""
    import os
    import signal
    import subprocess
    import sys
    import time

    def entries() -> int:
        root = os.path.join(cache, "v1", "objects")
        return sum(len(fs) for _, _, fs in os.walk(root)) if os.path.isdir(root) else 0

    # 100 ms per request, 2 in flight: the 15 objects left after the 6th take 0.75 s or more.
    server = gcs(photo_tree, faults=Faults(latency=0.1))
    cache = str(tmp_path / "cache")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dali_loader.tools.cli", "prefetch", "gs://b", "--cache-dir", cache,
         "--max-in-flight", "2", "--no-progress"],
        env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while sum(dict(server.media_counts).values()) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    fetched, cached = sum(dict(server.media_counts).values()), entries()
    assert fetched >= 6, "the prefetch never started downloading"
    assert cached < 21, "the prefetch had finished before the kill: nothing part-way to check"
    server.reset_counts()
    kw = dict(image_size=(40, 56), batch_size=4, shuffle=False, verbose=False)
    lx, ly = arrays(ours(str(photo_tree), **kw))
    rx, ry = arrays(ours("gs://b", cache_dir=cache, **kw))
    np.testing.assert_array_equal(rx, lx)
    np.testing.assert_array_equal(ry, ly)
    assert server.counts["media"] == 21 - cached  # every complete entry used, none trusted half-written
