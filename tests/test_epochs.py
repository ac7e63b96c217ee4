"""Finite epochs: each file once, partial batch kept, reshuffled, nothing redone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from tf_adapter import image_dataset_from_directory as ours  # noqa: E402


def ids_of(batch) -> list[int]:
    return [int(round(float(x[0, 0, 0]) / 10)) for x in batch.numpy()]


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_each_file_once_partial_batch_kept_and_reshuffled(id_tree, decoder):
    ds = ours(str(id_tree), label_mode=None, image_size=(8, 8), batch_size=5, seed=4,
              decoder=decoder)
    assert int(ds.cardinality()) == 5
    orders = []
    for _ in range(3):
        sizes, order = [], []
        for b in ds:
            sizes.append(int(b.shape[0]))
            order += ids_of(b)
        assert sizes == [5, 5, 5, 5, 3]
        assert sorted(order) == list(range(23))
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]
    loader = ds.loader.engine
    # One DALI pipeline for every epoch (none when TF's kernels decode).
    assert getattr(loader, "pipeline_builds", 0) == (1 if decoder == "dali" else 0)
    assert len(loader.epoch_setup_seconds) == 3


def test_same_seed_same_epoch_orders(id_tree):
    a = ours(str(id_tree), label_mode=None, image_size=(8, 8), batch_size=23, seed=9)
    b = ours(str(id_tree), label_mode=None, image_size=(8, 8), batch_size=23, seed=9)
    for _ in range(2):
        assert ids_of(next(iter(a))) == ids_of(next(iter(b)))


def test_unshuffled_order_and_labels_match_keras(id_tree):
    ref = keras.utils.image_dataset_from_directory(str(id_tree), image_size=(8, 8),
                                                   batch_size=4, shuffle=False)
    got = ours(str(id_tree), image_size=(8, 8), batch_size=4, shuffle=False)
    for (rx, ry), (gx, gy) in zip(ref, got):
        assert ids_of(gx) == ids_of(rx)
        np.testing.assert_array_equal(gy.numpy(), ry.numpy())


def test_new_epoch_does_not_relist(tmp_path, id_tree):
    root = tmp_path / "t"
    shutil.copytree(id_tree, root)
    ds = ours(str(root), label_mode=None, image_size=(8, 8), batch_size=8, shuffle=False)
    assert sum(len(ids_of(b)) for b in ds) == 23
    shutil.copy(root / "even" / "000.png", root / "even" / "zzz.png")
    assert sum(len(ids_of(b)) for b in ds) == 23  # the index is fixed at creation
    assert ds.file_paths == sorted(ds.file_paths, key=lambda p: ("odd" in p, p))


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_abandoned_epoch_then_full_epoch(id_tree, decoder):
    ds = ours(str(id_tree), label_mode=None, image_size=(8, 8), batch_size=4, seed=1,
              decoder=decoder)
    for _ in ds.take(2):
        pass
    order = [i for b in ds for i in ids_of(b)]
    assert sorted(order) == list(range(23))


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_model_fit_runs_unchanged_with_validation(id_tree, decoder):
    train, val = ours(str(id_tree), image_size=(16, 16), batch_size=6,
                      validation_split=0.3, subset="both", seed=2, decoder=decoder)
    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2),
    ])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(train, validation_data=val, epochs=3, verbose=0)
    assert len(hist.history["loss"]) == 3 and len(hist.history["val_loss"]) == 3
    assert all(np.isfinite(hist.history["loss"]))
    assert getattr(train.loader.engine, "pipeline_builds", 0) == (1 if decoder == "dali" else 0)
    assert train.loader.epochs_started == 3


def test_dali_loader_core_works_without_tensorflow(id_tree):
    code = (
        "import sys\n"
        "from dali_loader.api import open_loader\n"
        f"L = open_loader({str(id_tree)!r}, batch_size=10, image_size=(8, 8), device='cpu')\n"
        "n = sum(len(x) for x, y in L)\n"
        "assert n == 23, n\n"
        "assert 'tensorflow' not in sys.modules and 'tf_adapter' not in sys.modules\n"
        "print('ok', len(L))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ok 3" in out.stdout


def test_batches_stay_valid_after_later_batches(id_tree):
    """Batches are zero-copy views of DALI's buffers; holding them must be safe."""
    from dali_loader.api import open_loader

    loader = open_loader(str(id_tree), batch_size=3, image_size=(8, 8), shuffle=False,
                         device="cpu")
    held = [x for x, _ in loader]  # views, kept while 7 more batches are produced
    copies = [x.copy() for x, _ in loader]
    assert len(held) == 8
    for h, c in zip(held, copies):
        np.testing.assert_array_equal(h, c)
    assert [int(round(v / 10)) for h in held for v in h[:, 0, 0, 0]] == list(range(0, 23, 2)) + list(range(1, 23, 2))


def _decode_parallelism(ds) -> list[int]:
    """`num_parallel_calls` of every parallel map in the dataset's chain (a map,
    or the decode's fused map and batch)."""
    found = []
    while ds is not None:
        calls = getattr(ds, "_num_parallel_calls", getattr(ds, "_num_parallel_calls_t", None))
        if calls is not None:
            found.append(int(calls))
        ds = getattr(ds, "_input_dataset", None)
    return found


@pytest.mark.parametrize("num_threads", [None, 1, 3])
def test_num_threads_sets_tf_decode_parallelism(id_tree, num_threads):
    ds = ours(str(id_tree), label_mode=None, image_size=(8, 8), batch_size=5, seed=4,
              decoder="tf", num_threads=num_threads)
    # By default two calls per core (issue 29); `num_threads` is taken as given.
    assert _decode_parallelism(ds) == [num_threads or 2 * len(os.sched_getaffinity(0))]
    assert sorted(i for b in ds for i in ids_of(b)) == list(range(23))


@pytest.mark.parametrize("kind", ["bytes", "paths"])
def test_feed_epochs_come_in_chunks(id_tree, kind):
    """A feed yields `chunk_size` items at a time, every file once, labels aligned
    with positions. (The TF path on a local disk asks for 16, then more: test_tf_path.)"""
    from dali_loader.api import open_index
    from dali_loader.feed.epochs import Feed
    from dali_loader.feed.items import Paths, RawBytes

    src, idx = open_index(str(id_tree), shuffle=False)
    items = RawBytes(src) if kind == "bytes" else Paths(idx.paths)
    feed = Feed(idx, items, chunk_size=4, shuffle=True, seed=3)
    chunks = list(feed)
    assert [len(c.items) for c in chunks] == [4] * 5 + [3]
    positions = [p for c in chunks for p in c.positions]
    assert sorted(positions) == list(range(23))
    for c in chunks:
        if kind == "bytes":
            assert all(isinstance(x, bytes) and x[:4] == b"\x89PNG" for x in c.items)
        else:
            assert list(c.items) == [idx.paths[p] for p in c.positions]
    with pytest.raises(ValueError, match="chunk_size=0"):
        Feed(idx, items, chunk_size=0)
    tf_path = ours(str(id_tree), image_size=(8, 8), batch_size=64, decoder="tf")
    assert tf_path.loader.engine.chunk_size == 1024  # TF_LOCAL_CHUNK (issue 29)
    # With Wuffs (the native op) the graph decodes: the same chunks of paths.
    assert ours(str(id_tree), image_size=(8, 8), batch_size=64,
                png_decoder="wuffs").loader.engine.chunk_size == 1024
