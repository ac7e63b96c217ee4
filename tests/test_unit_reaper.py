"""Finalizers never wait inside the garbage collector (dali_loader/reaper.py).

Before the reaper, a dropped source closed itself in whatever thread dropped or
collected it. Holding the cache's file lock there (as a cache writer does while
it writes) deadlocked that thread for good, and with it every later
`gc.collect()` in the process: `test_source_dropped_under_its_cache_lock...`
hangs its thread on that code (the test fails after 10 s instead of hanging).
"""

from __future__ import annotations

import gc
import threading

from dali_loader import reaper
from dali_loader.storage.cache import DerivedMeta
from dali_loader.storage.source import open_source
from support.helpers import wait_for


def _tree(tmp_path):
    (tmp_path / "data" / "a").mkdir(parents=True)
    (tmp_path / "data" / "a" / "x.png").write_bytes(b"not read here")
    return str(tmp_path / "data")


def test_source_dropped_under_its_cache_lock_is_closed_later_not_deadlocked(tmp_path):
    holder = [open_source(_tree(tmp_path), cache_dir=str(tmp_path / "cache"))]
    cache = holder[0].cache
    assert cache.put("derived", DerivedMeta("a/x.png", "1"), b"p" * 1000)
    assert cache._delta > 0  # closing will sync the usage file, under the file lock
    finalizer = holder[0]._finalizer
    ran_in: list[str] = []
    close = cache.close

    def recording_close():
        ran_in.append(threading.current_thread().name)
        close()

    cache.close = recording_close
    dropped = threading.Event()

    def drop_while_holding_the_cache_lock():
        with cache._locked():  # what a cache writer holds while it writes
            holder.clear()  # the last reference: the source's finalizer runs now
        dropped.set()

    threading.Thread(target=drop_while_holding_the_cache_lock, name="dropper", daemon=True).start()
    assert dropped.wait(10), "dropping a source under its cache's lock deadlocked in its finalizer"
    assert not finalizer.alive
    wait_for(lambda: ran_in and cache._delta == 0)  # closed, its usage synced
    assert ran_in == ["dali-loader-reaper"]


def test_close_runs_at_once_in_the_caller_and_once_only(tmp_path):
    src = open_source(_tree(tmp_path), cache_dir=str(tmp_path / "cache"))
    cache = src.cache
    calls: list[str] = []
    close = cache.close
    cache.close = lambda: (calls.append(threading.current_thread().name), close())
    src.close()
    assert calls == [threading.current_thread().name]  # done when close() returns
    src.close()
    del src
    gc.collect()
    wait_for(reaper.idle)
    assert len(calls) == 1


class _Owner:
    pass


def test_a_collected_cycle_queues_its_cleanup_and_a_failing_one_does_not_stop_the_next(caplog):
    ran: list[tuple[str, str]] = []

    def cleanup(name):
        ran.append((name, threading.current_thread().name))
        if name == "first":
            raise RuntimeError("boom")

    owners = [_Owner(), _Owner()]
    for owner, name in zip(owners, ("first", "second")):
        owner.me = owner  # a cycle: only the collector frees it
        owner.finalizer = reaper.Finalizer(owner, cleanup, name)
    finalizers = [o.finalizer for o in owners]
    del owners, owner
    gc.collect()  # queues both: none runs in this thread, inside the collector
    assert not any(f.alive for f in finalizers)
    wait_for(lambda: len(ran) == 2)
    assert sorted(ran) == [("first", "dali-loader-reaper"), ("second", "dali-loader-reaper")]
    wait_for(lambda: "boom" in caplog.text)


def test_a_forked_child_runs_its_own_cleanups():
    """A child made by `os.fork` has no reaper thread of its parent's: its first
    `Finalizer` starts one, and a collected cycle's cleanup runs there."""
    import os
    import time

    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only when the cleanup ran on a reaper thread
        ran: list[str] = []
        owner = _Owner()
        owner.me = owner
        owner.finalizer = reaper.Finalizer(owner, lambda: ran.append(
            threading.current_thread().name))
        del owner
        gc.collect()
        deadline = time.monotonic() + 10
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0 if ran == ["dali-loader-reaper"] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
