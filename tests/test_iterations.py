"""Each iteration owns its epoch: interleaved, abandoned and concurrent iterators
each see every file exactly once; resources are released; a cache smaller than
the dataset loses nothing."""

from __future__ import annotations

import contextlib
import gc
import threading
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from support.fakegcs import Faults  # noqa: E402
from support.helpers import batch_counter, collected, wait_for  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

pytestmark = pytest.mark.timeout(300)

DECODERS = ["tf", "dali", "tf-wuffs"]  # tf-wuffs: the native core's TF op decodes PNGs
ON_ERROR = ["raise", "skip"]


def ids(batch) -> list[int]:
    """File ids of an id_tree batch (red channel = 10 x id)."""
    return [int(round(float(v) / 10)) for v in batch.numpy()[:, 0, 0, 0]]


def decoding(decoder: str) -> dict:
    """The options of a DECODERS entry."""
    return dict(decoder="tf", png_decoder="wuffs") if decoder == "tf-wuffs" else dict(
        decoder=decoder)


def make(id_tree, decoder, on_error, **kw):
    args = dict(label_mode=None, image_size=(8, 8), batch_size=4, seed=5, verbose=False)
    args.update(kw)
    return ours(str(id_tree), on_error=on_error, **decoding(decoder), **args)


@pytest.mark.parametrize("on_error", ON_ERROR)
@pytest.mark.parametrize("decoder", DECODERS)
def test_two_interleaved_iterators_each_yield_every_file_once(id_tree, decoder, on_error):
    ds = make(id_tree, decoder, on_error)
    a, b = iter(ds), iter(ds)
    seen_a, seen_b = [], []
    for _ in range(6):  # 23 files in batches of 4: 6 batches each
        seen_a += ids(next(a))
        seen_b += ids(next(b))
    for it in (a, b):
        with pytest.raises(StopIteration):
            next(it)
    assert sorted(seen_a) == list(range(23))
    assert sorted(seen_b) == list(range(23))
    assert seen_a != seen_b  # two epochs: two permutations
    assert ds.loader.skipped == {}
    # And the epoch after them is whole too.
    assert sorted(i for x in ds for i in ids(x)) == list(range(23))


@pytest.mark.parametrize("on_error", ON_ERROR)
@pytest.mark.parametrize("decoder", DECODERS)
def test_next_iter_then_full_epochs_and_fit(id_tree, decoder, on_error):
    """`x = next(iter(ds))` in a notebook cell, the iterator still referenced,
    then whole epochs and `model.fit`."""
    keras = pytest.importorskip("keras")
    ds = make(id_tree, decoder, on_error, label_mode="int")
    it = iter(ds)
    first_x, first_y = next(it)
    assert first_x.shape[0] == 4
    for _ in range(2):
        assert sorted(i for x, _ in ds for i in ids(x)) == list(range(23))
    counts = []

    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=2, verbose=0, callbacks=[batch_counter(counts)])
    assert counts == [6, 6]
    assert sorted(i for x, _ in ds for i in ids(x)) == list(range(23))
    assert ds.loader.skipped == {}
    del it


@pytest.mark.parametrize("decoder", DECODERS)
def test_many_abandoned_iterators_leave_nothing_behind(id_tree, decoder):
    """30 abandoned iterators after 10 of warm-up (the pools fill up to their bound) add no
    thread: once the thread count settles, at most 4 over its settled count after the
    warm-up, so a leak of one thread per 6 iterators fails. (Settled, not the peak:
    on a loaded machine an abandoned pipeline's threads end a moment later; a leak never
    settles back.)"""
    ds = make(id_tree, decoder, "raise", batch_size=2)
    loader = ds.loader.engine

    def abandon(n: int) -> int:
        for _ in range(n):
            it = iter(ds)
            next(it)
            del it
            gc.collect()
        return _settled_thread_count()

    warm = abandon(10)
    after = abandon(30)
    # An abandoned iterator is closed by the reaper's thread (`dali_loader/reaper.py`), a
    # moment after its collection on a loaded machine (CI measured 39 of 40 and 2 open at
    # the first look); a leak never gets there.
    # One whose generator fed out every file before its abandonment (prefetch ran ahead)
    # awaits checks that never come: kept, at most 64 (AuditRegistry), closed after.
    if decoder.startswith("tf"):  # every abandoned epoch still feeding was closed
        wait_for(lambda: ds.loader.open_iterations == 0 and
                 len(loader.epoch_tallies) + ds.loader.awaiting_checks == 40, timeout=30)
    else:
        assert len(loader._idle) <= 2  # abandoned epochs drop their pipelines
    assert after <= warm + 4, (warm, after)  # one read pool, bounded
    assert sorted(i for x in ds for i in ids(x)) == list(range(23))


def _settled_thread_count(quiet_s: float = 0.5, timeout: float = 30.0) -> int:
    """The number of threads once it has not changed for `quiet_s` (at most `timeout`)."""
    deadline = time.monotonic() + timeout
    last, since = threading.active_count(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        n = threading.active_count()
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
    return last


def _settle(server, quiet_s: float = 0.3, timeout: float = 30.0) -> int:
    """The server's media count once nothing is in flight and the count has not moved for
    `quiet_s` (six 50 ms reads); waits on the server, not a guessed time."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        n = sum(dict(server.media_counts).values())
        if n != last or server.in_flight:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return n
        time.sleep(0.01)
    raise AssertionError(f"the server never went quiet: {last} reads, {server.in_flight} in flight")


@pytest.mark.parametrize("decoder", DECODERS)
def test_abandoned_iterator_stops_downloading(id_tree, gcs, tmp_path, decoder):
    server = gcs(id_tree, faults=Faults(latency=0.05))
    ds = ours("gs://b", label_mode=None, image_size=(8, 8), batch_size=2, shuffle=False,
              **decoding(decoder), max_in_flight=2, cache_dir=str(tmp_path / "c"), verbose=False)
    it = iter(ds)
    next(it)
    del it
    gc.collect()
    settled = _settle(server)  # reads already running finish
    time.sleep(1.0)  # 2 in flight at 50 ms: an unstopped epoch would fetch the other ~20
    assert sum(dict(server.media_counts).values()) == settled
    assert settled < 23


def test_dataset_garbage_collected_or_closed_releases_its_source(id_tree, gcs, tmp_path):
    gcs(id_tree)
    kw = dict(label_mode=None, image_size=(8, 8), batch_size=4, verbose=False,
              cache_dir=str(tmp_path / "c"))
    train, val = ours("gs://b", validation_split=0.3, subset="both", seed=1, **kw)
    source = train.loader.engine.source
    assert val.loader.engine.source is source  # one listing, one cache, one client
    for _ in train:
        pass
    train.close()
    assert source._finalizer.alive  # val still uses it
    val.close()
    assert not source._finalizer.alive

    for on_error in ON_ERROR:
        with contextlib.closing(ours("gs://b", on_error=on_error, **kw)) as ds:  # ds.close()
            assert sum(int(x.shape[0]) for x in ds) == 23
        assert not ds.loader.engine.source._finalizer.alive
        with pytest.raises(Exception, match="This dataset was closed"):  # never an empty epoch
            next(iter(ds))

    ds = ours("gs://b", **kw)
    for _ in ds:
        pass
    finalizer = ds.loader.engine.source._finalizer
    assert finalizer.alive
    del ds
    wait_for(collected(lambda: not finalizer.alive))


@pytest.fixture(scope="module")
def noise_tree(tmp_path_factory):
    """3 classes x 30 incompressible PNGs of mixed sizes (about 90 x 25 KB)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("noise")
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir()
        for i in range(30):
            h, w = rng.integers(60, 140, 2)
            img = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
            Image.fromarray(img).save(root / f"c{c}" / f"{i:02d}.png")
    return root


@pytest.mark.parametrize("on_error", ON_ERROR)
@pytest.mark.parametrize("decoder", DECODERS)
def test_cache_a_third_of_the_dataset_trains_every_file(noise_tree, gcs, tmp_path,
                                                         decoder, on_error):
    """cache_max_bytes at a third of the data: every epoch still reads every file,
    nothing is skipped, and the pixels equal the local folder's. (Before
    per-iteration pins, epochs 2 and 3 lost files here: skipped, or raised.)"""
    photo_tree = noise_tree
    gcs(photo_tree)
    total = sum(p.stat().st_size for p in photo_tree.rglob("*.png"))
    kw = dict(image_size=(24, 24), batch_size=4, shuffle=True, seed=7, verbose=False,
              **decoding(decoder), on_error=on_error)
    local = ours(str(photo_tree), **kw)
    remote = ours("gs://b", cache_dir=str(tmp_path / "c"), cache_max_bytes=total // 3,
                  max_in_flight=8, **kw)
    for _ in range(3):
        lx, ly = zip(*[(x.numpy(), y.numpy()) for x, y in local])
        rx, ry = zip(*[(x.numpy(), y.numpy()) for x, y in remote])
        np.testing.assert_array_equal(np.concatenate(rx), np.concatenate(lx))
        np.testing.assert_array_equal(np.concatenate(ry), np.concatenate(ly))
    assert remote.loader.skipped == {}
    cache = remote.loader.engine.source.remote.cache
    assert cache.stats().bytes <= total // 3  # the bound held


def _generator_of(ds):
    """The TF path's generator dataset under `ds`."""
    todo = [ds]
    while todo:
        d = todo.pop()
        if hasattr(d, "_finalize_func"):
            return d
        todo.extend(d._inputs())
    raise AssertionError("no generator dataset in the pipeline")


def _attr(func, name: str) -> bool:
    attrs = func.function.function_def.attr
    return name in attrs and attrs[name].b


def _abandon_then_whole_epoch(ds) -> None:
    """Abandoned iterators are finalized (their auditors dropped); then a whole epoch."""
    for _ in range(3):
        it = iter(ds)
        next(it)
        del it
        gc.collect()
    # Each one still feeding was closed by its finalize; one whose generator fed out
    # every file before the abandonment (prefetch ran ahead: CI saw it) awaits checks
    # that never come, kept for at most 64 (AuditRegistry).
    wait_for(lambda: ds.loader.open_iterations == 0)
    assert ds.loader.awaiting_checks <= 3
    assert sorted(i for x in ds for i in ids(x)) == list(range(23))


def test_generator_functions_are_single_device(id_tree):
    """Issue 29: the generator's functions skip grappler per iterator."""
    from dali_loader.tfdata import generators

    ds = make(id_tree, "tf", "raise")
    gen = _generator_of(ds)
    assert generators._single_device_ends(tf)
    assert _attr(gen._init_func, "experimental_ints_on_device")
    assert _attr(gen._finalize_func, "experimental_ints_on_device")
    assert _attr(gen._next_func, "experimental_ints_on_device")  # with inject_prefetch off
    assert not ds.options().experimental_optimization.inject_prefetch
    _abandon_then_whole_epoch(ds)


def test_generator_falls_back_where_tf_refuses(id_tree, monkeypatch):
    from dali_loader import tf_internals

    made = tf_internals.generator_dataset

    def refused(tf, *args, ends, every):
        if ends or every:
            raise TypeError("a TF without it")
        return made(tf, *args, ends=ends, every=every)

    monkeypatch.setattr(tf_internals, "_probes", {})  # asked again, refused
    monkeypatch.setattr(tf_internals, "generator_dataset", refused)
    ds = make(id_tree, "tf", "raise")
    assert type(_generator_of(ds)) is tf_internals.generator_class()
    _abandon_then_whole_epoch(ds)
