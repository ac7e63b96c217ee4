"""Feed / FeedEpoch over a fake item reader: order, chunks, errors, release, close."""

from __future__ import annotations

import collections
import gc
import logging
import threading
import time

import numpy as np
import pytest

from dali_loader.errors import CorruptImageError, UnreadableFileError
from dali_loader.feed.epochs import Chunk, Feed, FeedEpoch
from dali_loader.feed.order import epoch_order
from dali_loader.index import Index
from support.helpers import collected, wait_for


class Item:
    """One read's result: a distinct object per call, so releases can be counted."""

    def __init__(self, path: str):
        self.path = path

    def __repr__(self):
        return f"Item({self.path})"


class FakeReader:
    """An item reader: `io`, `__call__(path)`, `release(item)`; counts everything."""

    def __init__(self, io=True, bad=(), unreadable=(), boom=(), block=(), delay=0.0):
        self.io = io
        self.bad, self.unreadable, self.boom = set(bad), set(unreadable), set(boom)
        self.block = set(block)
        self.gate = threading.Event()
        self.delay = delay
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.made: list[Item] = []
        self.released: collections.Counter = collections.Counter()
        self.released_other: list = []  # release() of something that is not an Item

    def __call__(self, path: str) -> Item:
        with self.lock:
            self.calls.append(path)
        if path in self.block:
            self.gate.wait(5)
        if self.delay:
            time.sleep(self.delay)
        if path in self.bad:
            raise CorruptImageError(path, "bad bytes")
        if path in self.unreadable:
            raise UnreadableFileError(path, "gone")
        if path in self.boom:
            raise RuntimeError(f"a bug reading {path}")
        item = Item(path)
        with self.lock:
            self.made.append(item)
        return item

    def release(self, item) -> None:
        with self.lock:
            if isinstance(item, Item):
                self.released[id(item)] += 1
            else:
                self.released_other.append(item)

    def times_released(self, item: Item) -> int:
        with self.lock:
            return self.released[id(item)]

    def unreleased(self) -> list[str]:
        with self.lock:
            return [it.path for it in self.made if self.released[id(it)] == 0]

    def over_released(self) -> list[str]:
        with self.lock:
            return [it.path for it in self.made if self.released[id(it)] > 1]

    def settled(self) -> bool:
        """Every read that started has finished and been accounted for (made or failed)."""
        with self.lock:
            failing = self.bad | self.unreadable | self.boom
            done = len(self.made) + sum(1 for c in self.calls if c in failing)
            return done == len(self.calls)


def make_index(n=10, labelled=True) -> Index:
    return Index([f"f{i}" for i in range(n)],
                 np.arange(n, dtype=np.int32) * 10 if labelled else None, None)


@pytest.fixture
def feeds():
    made = []

    def make(index, reader, **kw):
        kw.setdefault("chunk_size", 4)
        kw.setdefault("max_in_flight", 2)
        feed = Feed(index, reader, **kw)
        made.append(feed)
        return feed

    yield make
    for f in made:
        f.close()


def positions(epoch) -> list[int]:
    return [p for chunk in epoch for p in chunk.positions]


@pytest.mark.parametrize("io", [True, False])
def test_every_position_once_in_chunks(feeds, io):
    reader = FakeReader(io=io)
    feed = feeds(make_index(10), reader, chunk_size=4)
    assert feed.num_files == 10
    for expected_number in range(2):
        epoch = feed.epoch()
        assert isinstance(epoch, FeedEpoch) and epoch.number == expected_number
        chunks = list(epoch)
        assert all(isinstance(c, Chunk) for c in chunks)
        assert [len(c.items) for c in chunks] == [4, 4, 2]
        assert [c.positions for c in chunks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        for c in chunks:
            assert [it.path for it in c.items] == [f"f{p}" for p in c.positions]
        assert epoch.next_chunk() is None
        assert epoch.labels([8, 9]).tolist() == [80, 90]
        assert epoch.path(7) == "f7"
    assert feed.epochs_started == 2
    assert len(feed.epoch_setup_seconds) == 2
    assert collections.Counter(reader.calls) == {f"f{i}": 2 for i in range(10)}


def test_next_chunk_size_override_and_unlabelled(feeds):
    feed = feeds(make_index(7, labelled=False), FakeReader(), chunk_size=3)
    epoch = iter(feed)
    assert epoch.next_chunk(5).positions == [0, 1, 2, 3, 4]
    assert epoch.next_chunk().positions == [5, 6]
    assert epoch.next_chunk() is None
    assert epoch.labels([0, 1]) is None


def test_shuffle_permutation_per_epoch_and_reproducible(feeds):
    n = 30
    a = feeds(make_index(n), FakeReader(), chunk_size=7, shuffle=True, seed=5)
    b = feeds(make_index(n), FakeReader(io=False), chunk_size=4, shuffle=True, seed=5)
    c = feeds(make_index(n), FakeReader(), chunk_size=7, shuffle=True, seed=6)
    orders = []
    for k in range(3):
        ea, eb, ec = iter(a), iter(b), iter(c)
        pa, pb, pc = positions(ea), positions(eb), positions(ec)
        assert sorted(pa) == list(range(n))
        assert pa == ea.order.tolist() == epoch_order(n, True, 5, k).tolist()
        assert pa == pb  # same (seed, epoch): same order, whatever the chunking
        assert pc != pa  # another seed
        orders.append(pa)
    assert orders[0] != orders[1] != orders[2] != orders[0]
    assert orders[0] != list(range(n))


def test_no_shuffle_is_index_order():
    assert epoch_order(5, False, 3, 9).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("io", [True, False])
def test_two_epochs_interleaved(feeds, io):
    feed = feeds(make_index(11), FakeReader(io=io), chunk_size=3, shuffle=True, seed=1)
    e1, e2 = feed.epoch(), feed.epoch()
    got1, got2 = [], []
    c1 = c2 = True
    while c1 or c2:
        c1 = e1.next_chunk()
        if c1:
            got1 += c1.positions
            assert [it.path for it in c1.items] == [f"f{p}" for p in c1.positions]
        c2 = e2.next_chunk()
        if c2:
            got2 += c2.positions
    assert got1 == e1.order.tolist() and got2 == e2.order.tolist()
    assert sorted(got1) == sorted(got2) == list(range(11))
    assert got1 != got2
    assert (e1.number, e2.number) == (0, 1)


@pytest.mark.parametrize("io", [True, False])
def test_bad_file_raises_naming_it(feeds, io):
    feed = feeds(make_index(10), FakeReader(io=io, bad={"f5"}), on_error="raise")
    epoch = iter(feed)
    assert next(epoch).positions == [0, 1, 2, 3]
    with pytest.raises(CorruptImageError) as ei:
        next(epoch)
    assert ei.value.path == "f5"
    assert "f5" in str(ei.value) and "bad bytes" in str(ei.value)
    assert feed.skipped == {}
    epoch.close()


@pytest.mark.parametrize("io", [True, False])
def test_bad_file_skipped(feeds, io, caplog):
    reader = FakeReader(io=io, bad={"f5"}, unreadable={"f8"})
    feed = feeds(make_index(10), reader, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="dali_loader.feed.policy"):
        for _ in range(2):
            epoch = iter(feed)
            chunks = list(epoch)
            assert [c.positions for c in chunks] == [[0, 1, 2, 3], [4, 6, 7, 9]]
            assert epoch.errors.skipped == {"f5": "bad bytes", "f8": "gone"}
    assert feed.skipped == {"f5": "bad bytes", "f8": "gone"}
    assert feed.report.of_kind("corrupt") == {"f5": "bad bytes"}
    assert feed.report.of_kind("unreadable") == {"f8": "gone"}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2  # once per file, not once per epoch
    assert any("f5" in m for m in warned) and any("f8" in m for m in warned)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("io", [True, False])
def test_unexpected_reader_error_is_reraised(feeds, io, on_error):
    feed = feeds(make_index(10), FakeReader(io=io, boom={"f6"}), on_error=on_error)
    epoch = iter(feed)
    next(epoch)
    with pytest.raises(RuntimeError, match="a bug reading f6"):
        next(epoch)
    assert feed.skipped == {}
    epoch.close()


class OutOfMemoryReader(FakeReader):
    def __call__(self, path: str) -> Item:
        if path == "f3":
            raise MemoryError
        return super().__call__(path)


@pytest.mark.parametrize("io", [True, False])
def test_memory_error_is_that_files_error(feeds, io):
    """Running out of memory on one file (a huge image) is that file's error:
    recorded under skip, never an epoch killer."""
    feed = feeds(make_index(6), OutOfMemoryReader(io=io), on_error="skip")
    got = [p for chunk in feed for p in chunk.positions]
    assert got == [0, 1, 2, 4, 5]
    assert feed.skipped == {"f3": "out of memory while reading or decoding it (see max_pixels)"}


def test_argument_checks():
    reader = FakeReader()
    with pytest.raises(ValueError, match="Received: chunk_size=0"):
        Feed(make_index(), reader, chunk_size=0)
    with pytest.raises(ValueError, match="Received: max_in_flight=0"):
        Feed(make_index(), reader, chunk_size=1, max_in_flight=0)
    with pytest.raises(ValueError, match="Received: on_error=ignore"):
        Feed(make_index(), reader, chunk_size=1, on_error="ignore")


def test_items_held_until_released(feeds):
    reader = FakeReader()
    feed = feeds(make_index(10), reader, chunk_size=3, max_in_flight=2)
    epoch = iter(feed)
    c1 = next(epoch)
    c2 = next(epoch)
    assert all(reader.times_released(it) == 0 for it in c1.items + c2.items)
    epoch.release(c1.positions)
    assert [reader.times_released(it) for it in c1.items] == [1, 1, 1]
    assert all(reader.times_released(it) == 0 for it in c2.items)
    epoch.release(c1.positions)  # again: nothing
    epoch.release([p for p in range(10) if p not in c1.positions + c2.positions])  # not held
    assert [reader.times_released(it) for it in c1.items] == [1, 1, 1]
    assert all(reader.times_released(it) == 0 for it in c2.items)
    epoch.release(c2.positions[:1])
    assert [reader.times_released(it) for it in c2.items] == [1, 0, 0]
    epoch.close()
    assert [reader.times_released(it) for it in c2.items] == [1, 1, 1]
    wait_for(reader.settled)
    wait_for(lambda: not reader.unreleased())
    assert reader.over_released() == []


@pytest.mark.parametrize("io", [True, False])
def test_close_releases_everything_once(feeds, io):
    reader = FakeReader(io=io)
    feed = feeds(make_index(20), reader, chunk_size=4, max_in_flight=3)
    epoch = iter(feed)
    held = next(epoch).items + next(epoch).items
    time.sleep(0.02)  # let the read-ahead fill its window
    epoch.close()
    assert epoch.closed
    assert all(reader.times_released(it) == 1 for it in held)
    wait_for(reader.settled)
    wait_for(lambda: not reader.unreleased())
    epoch.close()  # idempotent
    epoch.release([0, 1])
    assert reader.over_released() == []
    assert epoch.next_chunk() is None
    if not io:
        assert len(reader.calls) == 8  # inline: nothing read ahead


def test_close_cancels_reads_not_started(feeds):
    # One read thread; f2 blocks, so f3..f5 are queued (not started) at close().
    reader = FakeReader(block={"f2"})
    feed = feeds(make_index(50), reader, chunk_size=2, max_in_flight=1, read_ahead=4)
    epoch = iter(feed)
    c = epoch.next_chunk()
    assert c.positions == [0, 1]
    wait_for(lambda: reader.calls == ["f0", "f1", "f2"])
    epoch.close()
    reader.gate.set()
    wait_for(reader.settled)
    wait_for(lambda: not reader.unreleased())  # f2 is released when its read ends
    time.sleep(0.05)
    assert reader.calls == ["f0", "f1", "f2"]
    assert reader.over_released() == []
    assert sorted(it.path for it in reader.made) == ["f0", "f1", "f2"]


def test_abandoned_epoch_is_released_when_collected(feeds):
    reader = FakeReader()
    feed = feeds(make_index(20), reader, chunk_size=3, max_in_flight=2)
    epoch = iter(feed)
    chunk = next(epoch)
    assert all(reader.times_released(it) == 0 for it in chunk.items)
    del epoch, chunk
    gc.collect()
    wait_for(reader.settled)
    wait_for(collected(lambda: not reader.unreleased()))
    assert reader.over_released() == []
    assert len(reader.calls) < 20  # reads stopped


def test_feed_close_is_idempotent_and_lets_go_of_the_source():
    class Source:
        acquired = released = 0

        def acquire(self):
            self.acquired += 1

        def release(self):
            self.released += 1

    src = Source()
    feed = Feed(make_index(4), FakeReader(), chunk_size=2, source=src)
    assert (src.acquired, src.released) == (1, 0)
    assert [c.positions for c in feed] == [[0, 1], [2, 3]]
    feed.close()
    feed.close()
    assert (src.acquired, src.released) == (1, 1)
    del feed
    gc.collect()
    assert src.released == 1

    src2 = Source()
    feed2 = Feed(make_index(4), FakeReader(), chunk_size=2, source=src2)
    del feed2
    gc.collect()
    assert (src2.acquired, src2.released) == (1, 1)  # dropped: released too


def test_feed_close_without_source_or_reads():
    """A feed never iterated closes (twice) without reading or starting anything, and is
    closed after: a new epoch is refused with the message that says what to do."""
    threads = threading.active_count()
    reader = FakeReader(io=False)
    feed = Feed(make_index(3), reader, chunk_size=2)
    assert not feed.closed
    feed.close()
    feed.close()
    assert feed.closed
    assert reader.calls == [] and threading.active_count() == threads
    with pytest.raises(RuntimeError, match="was closed; create a new one"):
        iter(feed)


@pytest.mark.parametrize("failure", ["bad", "boom"])
def test_items_read_before_a_raised_error_are_released_by_close(feeds, failure):
    reader = FakeReader(**{failure: {"f2"}})
    feed = feeds(make_index(10), reader, chunk_size=4, on_error="raise")
    epoch = iter(feed)
    with pytest.raises((CorruptImageError, RuntimeError)):
        next(epoch)
    epoch.close()
    wait_for(reader.settled)
    time.sleep(0.05)
    assert reader.unreleased() == []


def test_close_during_next_chunk_releases_its_items(feeds):
    # f1 blocks; the consumer thread has taken f0 and waits for f1 when close() comes.
    reader = FakeReader(block={"f1"})
    feed = feeds(make_index(20), reader, chunk_size=2, max_in_flight=2, read_ahead=4)
    epoch = iter(feed)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("chunk", epoch.next_chunk()))
    t.start()
    # f4 is submitted only once the consumer has popped f0: it then waits on f1.
    wait_for(lambda: "f4" in reader.calls)
    time.sleep(0.02)
    epoch.close()
    reader.gate.set()
    t.join(5)
    assert not t.is_alive()
    chunk = out["chunk"]
    if chunk is not None:
        epoch.release(chunk.positions)  # what a consumer does when done with it
    wait_for(reader.settled)
    time.sleep(0.05)
    assert reader.unreleased() == []


# --- sharding by input pipeline ------------------------------------------------------------------

@pytest.mark.parametrize("n, batch, pipelines", [(23, 4, 2), (23, 4, 3), (17, 4, 2), (8, 4, 2),
                                                  (3, 4, 2), (40, 5, 4), (1, 1, 3)])
def test_shards_cover_every_file_once_per_epoch(n, batch, pipelines):
    from dali_loader.plan import shard_size

    feeds = [Feed(make_index(n), FakeReader(io=False), chunk_size=batch, shuffle=True, seed=11,
                  shard=(p, pipelines)) for p in range(pipelines)]
    for epoch in range(3):
        per_pipeline = []
        for f in feeds:
            chunks = list(f.epoch())
            positions = [p for c in chunks for p in c.positions]
            assert len(positions) == f.num_files == shard_size(n, batch, *f.shard)
            # Every batch is full but the epoch's last one.
            assert all(len(c.positions) == batch for c in chunks[:-1])
            per_pipeline.append(positions)
        everything = sorted(p for ps in per_pipeline for p in ps)
        assert everything == list(range(n))  # exactly once across the pipelines
        batches = [-(-len(ps) // batch) for ps in per_pipeline]
        assert max(batches) - min(batches) <= 1
        # The shards are this epoch's order, cut into batches dealt round-robin.
        order = epoch_order(n, True, 11, epoch).tolist()
        dealt = [order[i:i + batch] for i in range(0, n, batch)]
        assert per_pipeline == [sum(dealt[p::pipelines], []) for p in range(pipelines)]


def test_shard_argument_is_checked():
    for shard in [(2, 2), (-1, 2), (0, 0)]:
        with pytest.raises(ValueError, match="Received"):
            Feed(make_index(4), FakeReader(io=False), chunk_size=2, shard=shard)


# --- resuming: seek and start_step ---------------------------------------------------------------

@pytest.mark.parametrize("pipelines", [1, 2, 3])
def test_start_step_reads_exactly_the_rest_of_the_epoch_per_pipeline(pipelines):
    n, batch = 23, 3
    for p in range(pipelines):
        reader = FakeReader(io=False)
        feed = Feed(make_index(n), reader, chunk_size=batch, shuffle=True, seed=5,
                    shard=(p, pipelines))
        whole = [c.positions for c in feed.epoch(4)]
        for k in range(feed.num_batches + 1):
            calls = len(reader.calls)
            rest = [c.positions for c in feed.epoch(4, start_step=k)]
            assert rest == whole[k:]  # the same epoch's batches from k on
            assert len(reader.calls) - calls == sum(map(len, whole[k:]))  # nothing before k read
    feed = Feed(make_index(n), FakeReader(io=False), chunk_size=batch)
    for bad in (-1, feed.num_batches + 1, 1.5):
        with pytest.raises(ValueError, match="start_step"):
            feed.epoch(0, start_step=bad)


def test_seek_numbers_the_next_epochs():
    feed = Feed(make_index(12), FakeReader(io=False), chunk_size=4, shuffle=True, seed=2)
    orders = [[p for c in feed.epoch() for p in c.positions] for _ in range(4)]
    feed.seek(2)
    assert [p for c in feed.epoch() for p in c.positions] == orders[2]
    assert [p for c in feed.epoch() for p in c.positions] == orders[3]
    assert feed.epoch().number == 4
    with pytest.raises(ValueError, match="epoch"):
        feed.seek(-1)


def test_items_that_hold_nothing_are_not_kept(id_tree):
    """Bytes for DALI are not kept once handed out: an epoch's memory does not grow
    with its length (only pinned cache entries are tracked until released)."""
    from dali_loader.api import open_index
    from dali_loader.feed.items import CheckedBytes, PinnedOrBytes

    src, idx = open_index(str(id_tree), shuffle=False)
    feed = Feed(idx, CheckedBytes(src), chunk_size=4)
    epoch = feed.epoch()
    assert sum(len(c.items) for c in epoch) == 23
    assert epoch._held == {}
    assert PinnedOrBytes.holds and not CheckedBytes.holds
