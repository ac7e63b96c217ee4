"""ReadAhead / Ordered: order, bounded concurrency, bounded window, close()."""

from __future__ import annotations

import gc
import random
import threading
import time

import pytest

from dali_loader.feed.readahead import ReadAhead
from support.helpers import wait_for


@pytest.fixture
def pools():
    made = []

    def make(*args, **kwargs):
        ra = ReadAhead(*args, **kwargs)
        made.append(ra)
        return ra

    yield make
    for ra in made:
        ra.close()


def test_results_in_input_order_when_later_items_finish_first(pools):
    finished = []
    done = [threading.Event() for _ in range(8)]

    def fn(i):
        if i < 7:  # each read waits for the next one: they finish in reverse order
            assert done[i + 1].wait(5)
        time.sleep(0.001)
        finished.append(i)
        done[i].set()
        return i * 10

    ra = pools(fn, max_in_flight=8)
    assert list(ra.map(range(8))) == [i * 10 for i in range(8)]
    assert finished == list(range(7, -1, -1))


def test_at_most_max_in_flight_concurrent_calls(pools):
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def fn(i):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.01)
        with lock:
            state["now"] -= 1
        return i

    ra = pools(fn, max_in_flight=3, window=12)
    assert list(ra.map(range(24))) == list(range(24))
    assert state["peak"] == 3


def test_window_bounds_read_ahead_for_a_slow_consumer(pools):
    calls = []
    pulled = []

    def fn(i):
        calls.append(i)
        return i

    def items():
        for i in range(100):
            pulled.append(i)
            yield i

    ra = pools(fn, max_in_flight=2, window=5)
    assert ra.window == 5
    it = ra.map(items())
    # The first window is submitted at once, before anything is asked for.
    wait_for(lambda: len(calls) == 5)
    time.sleep(0.03)
    assert len(pulled) == 5 and len(calls) == 5
    for consumed in range(1, 11):
        assert next(it) == consumed - 1
        time.sleep(0.01)  # a slow consumer: reads would run ahead if unbounded
        assert len(pulled) <= consumed + 5
        assert len(calls) <= consumed + 5
    wait_for(lambda: len(calls) == 15)
    time.sleep(0.03)
    assert len(calls) == 15 and len(pulled) == 15
    it.close()


def test_window_defaults_and_clamping():
    assert ReadAhead(str, 3).window == 6
    assert ReadAhead(str, 3, window=1).window == 3  # never below max_in_flight
    assert ReadAhead(str, 3, window=10).window == 10


def test_exceptions_are_returned_not_raised(pools):
    def fn(i):
        if i % 3 == 1:
            raise ValueError(f"bad {i}")
        return i

    out = list(pools(fn, max_in_flight=2).map(range(7)))
    assert len(out) == 7
    for i, r in enumerate(out):
        if i % 3 == 1:
            assert isinstance(r, ValueError) and str(r) == f"bad {i}"
        else:
            assert r == i


@pytest.mark.parametrize("end", ["close", "drop"])
def test_close_or_drop_cancels_reads_not_started(pools, end):
    calls = []
    gate = threading.Event()

    def fn(i):
        calls.append(i)
        if i == 0:
            gate.wait(5)
        return i

    discarded = []
    ra = pools(fn, max_in_flight=1, window=6)
    it = ra.map(range(100), discard=discarded.append)
    wait_for(lambda: calls == [0])
    if end == "close":
        it.close()
    else:  # dropping the result closes it
        del it
        gc.collect()
    gate.set()
    # The running read's result goes to `discard` once it completes.
    wait_for(lambda: discarded == [0])
    time.sleep(0.05)
    assert calls == [0]  # items 1..5 were queued and got cancelled; none later
    assert discarded == [0]
    if end == "close":
        with pytest.raises(StopIteration):
            next(it)


def test_close_discards_each_result_read_but_not_yielded_exactly_once(pools):
    calls = []
    lock = threading.Lock()
    gate = threading.Event()

    def fn(i):
        with lock:
            calls.append(i)
        if i == 3:
            gate.wait(5)  # still running when close() comes
        return i * 10

    discarded = []
    ra = pools(fn, max_in_flight=2, window=6)
    it = ra.map(range(100), discard=discarded.append)
    assert [next(it), next(it)] == [0, 10]
    # 0..7 submitted: 2..7 pending; 3 blocks, the other worker finishes the rest.
    wait_for(lambda: sorted(calls) == list(range(8)))
    time.sleep(0.03)
    it.close()
    # The finished ones (all but the blocked 3) are discarded, and only those.
    wait_for(lambda: len(discarded) == 5)
    assert sorted(discarded) == [20, 40, 50, 60, 70]
    gate.set()
    wait_for(lambda: len(discarded) == 6)
    it.close()  # again: nothing more
    del it
    gc.collect()  # __del__ closes again: nothing more
    time.sleep(0.03)
    assert sorted(discarded) == [20, 30, 40, 50, 60, 70]
    assert sorted(calls) == list(range(8))


def test_one_pool_serves_two_interleaved_maps(pools):
    rng = random.Random(0)
    delays = {f"{k}{i}": rng.uniform(0, 0.01) for k in "ab" for i in range(12)}
    threads = set()

    def fn(name):
        threads.add(threading.current_thread().name)
        time.sleep(delays[name])
        return name.upper()

    ra = pools(fn, max_in_flight=3)
    a = ra.map([f"a{i}" for i in range(12)])
    b = ra.map([f"b{i}" for i in range(12)])
    got_a, got_b = [], []
    for _ in range(12):
        got_a.append(next(a))
        got_b.append(next(b))
    assert got_a == [f"A{i}" for i in range(12)]
    assert got_b == [f"B{i}" for i in range(12)]
    assert next(a, "end") == "end" and next(b, "end") == "end"
    assert 1 <= len(threads) <= 3
    assert all(t.startswith("dali-loader-read") for t in threads)


def test_uneven_interleaving_keeps_each_order(pools):
    ra = pools(lambda x: x, max_in_flight=2)
    a = ra.map(range(10))
    b = ra.map(range(100, 105))
    assert [next(a) for _ in range(3)] == [0, 1, 2]
    assert list(b) == list(range(100, 105))
    assert list(a) == list(range(3, 10))


@pytest.mark.parametrize("bad", [0, -1])
def test_max_in_flight_must_be_positive(bad):
    with pytest.raises(ValueError, match=f"Received: max_in_flight={bad}"):
        ReadAhead(lambda x: x, max_in_flight=bad)
