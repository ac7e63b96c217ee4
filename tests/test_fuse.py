"""A real FUSE mount with 50 ms per open(), like gcsfuse: the loader's network-FS path (issue 30).

The mount (`support.slowfuse`) is a passthrough served by its own
process; it counts the opens in flight at once. Through `image_dataset_from_directory`
the loader must detect the mount (`NETWORK_FS`, read through the feed's
read-ahead), give every file exactly once per epoch with Keras's pixels, and keep
many reads in flight. Treated as a local disk, TF's map would read `num_threads`
(2 here) files at a time: the concurrency check then fails. Skips where FUSE is
missing (no /dev/fuse, libfuse2 or fusepy).
"""

from __future__ import annotations

import numpy as np
import pytest

from support.slowfuse import SlowMount, fuse_problem

from support.helpers import _photo, save
from support.helpers import all_rows

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

if fuse_problem():
    pytest.skip(f"FUSE is not usable here: {fuse_problem()}", allow_module_level=True)

from dali_loader.feed.items import RawBytes  # noqa: E402
from dali_loader.storage.source import SourceKind  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

FILES = 48
DELAY = 0.05
KW = dict(image_size=(40, 30), batch_size=8)


@pytest.fixture(scope="module")
def slow_mount(tmp_path_factory):
    src = tmp_path_factory.mktemp("fuse_src")
    rng = np.random.default_rng(3)
    for i in range(FILES):
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        save(src / f"class_{i % 3}" / f"img_{i:03d}.png", _photo(rng, h, w))
    mnt = tmp_path_factory.mktemp("fuse_mnt")
    mount = SlowMount(str(src), str(mnt), delay=DELAY)
    try:
        mount.__enter__()
    except RuntimeError as e:  # /dev/fuse present, but mounting refused (a container)
        if any(s in str(e) for s in ("not permitted", "Permission denied", "device not found")):
            pytest.skip(f"FUSE mounts are refused here: {e}")
        raise
    try:
        yield src, mnt, mount
    finally:
        mount.__exit__(None, None, None)


def test_fuse_mount_is_read_ahead_exactly_once_with_keras_pixels(slow_mount):
    src, mnt, m = slow_mount
    ds = ours(str(mnt), shuffle=False, **KW)
    loader = ds.loader.engine
    assert loader.source.kind is SourceKind.NETWORK_FS  # detected from /proc/mounts
    assert isinstance(loader.items, RawBytes)  # the feed reads, max_in_flight at once
    want_x, want_y = all_rows(keras.utils.image_dataset_from_directory(str(src), shuffle=False,
                                                                    **KW))
    for _ in range(2):  # every epoch: each file once, in Keras's order, Keras's pixels
        m.reset()
        x, y = all_rows(ds)
        stats = m.stats()
        assert stats["opens"] == FILES, stats  # each file opened once in the epoch
        # Reads in flight, not one per core: the concurrency a 50 ms mount needs.
        assert stats["max_in_flight"] >= 16, stats
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_array_equal(x, want_x)
    assert loader.skipped == {}


def test_fuse_mount_shuffled_epochs_hold_every_file_once(slow_mount):
    src, mnt, m = slow_mount
    ds = ours(str(mnt), shuffle=True, seed=7, **KW)
    want_x, want_y = all_rows(keras.utils.image_dataset_from_directory(str(src), shuffle=False,
                                                                    **KW))
    want = sorted((int(label), x.tobytes()) for x, label in zip(want_x, want_y))
    orders = []
    for _ in range(2):
        m.reset()
        x, y = all_rows(ds)
        assert m.stats()["opens"] == FILES
        assert sorted((int(label), r.tobytes()) for r, label in zip(x, y)) == want
        orders.append(y.tolist())
    assert orders[0] != orders[1] or len(set(want_y.tolist())) == 1  # reshuffled
