"""The on_error policy (SkipReport, EpochErrors) and the TF path's audit, without TF."""

from __future__ import annotations

import collections
import logging

import pytest

from dali_loader.errors import CorruptImageError, UnreadableFileError
from dali_loader.feed.epochs import Feed
from dali_loader.feed.policy import ON_ERROR, EpochErrors, SkipReport, check_on_error
from dali_loader.index import Index
from dali_loader.tfdata import audit
from dali_loader.tfdata.audit import END, AuditRegistry, Auditor

POLICY_LOGGER = "dali_loader.feed.policy"


# --- policy ---------------------------------------------------------------------------


def test_check_on_error():
    assert ON_ERROR == ("raise", "skip")
    assert check_on_error("raise") == "raise" and check_on_error("skip") == "skip"
    for bad in ("ignore", "Skip", "", None):
        with pytest.raises(ValueError, match=r'must be "raise" or "skip". Received: on_error='):
            check_on_error(bad)


def test_skip_report():
    r = SkipReport()
    assert r.as_dict() == {}
    assert r.add(CorruptImageError("a.png", "truncated")) is True
    assert r.add(UnreadableFileError("b.png", "gone")) is True
    assert r.add(CorruptImageError("a.png", "CRC mismatch")) is False  # same file again
    assert r.as_dict() == {"a.png": "CRC mismatch", "b.png": "gone"}
    assert r.of_kind("corrupt") == {"a.png": "CRC mismatch"}
    assert r.of_kind("unreadable") == {"b.png": "gone"}
    assert r.of_kind("other") == {}
    d = r.as_dict()
    d["x"] = "y"  # a copy
    assert "x" not in r.as_dict()


def test_epoch_errors_raise():
    report = SkipReport()
    errors = EpochErrors("raise", report)
    err = CorruptImageError("a.png", "truncated")
    with pytest.raises(CorruptImageError) as ei:
        errors(err)
    assert ei.value is err
    assert errors.skipped == {} and report.as_dict() == {}


def test_epoch_errors_skip_records_and_logs_once_per_file(caplog):
    report = SkipReport()
    first, second = EpochErrors("skip", report), EpochErrors("skip", report)
    with caplog.at_level(logging.WARNING, logger=POLICY_LOGGER):
        first(CorruptImageError("a.png", "truncated"))
        first(UnreadableFileError("b.png", "gone"))
        first(CorruptImageError("a.png", "truncated"))
        second(CorruptImageError("a.png", "truncated"))
    assert first.skipped == {"a.png": "truncated", "b.png": "gone"}
    assert second.skipped == {"a.png": "truncated"}
    assert report.as_dict() == {"a.png": "truncated", "b.png": "gone"}
    msgs = [r.getMessage() for r in caplog.records if r.name == POLICY_LOGGER]
    assert msgs == ["Skipping a.png: truncated [corrupt]", "Skipping b.png: gone [unreadable]"]


def test_epoch_errors_rejects_bad_policy():
    with pytest.raises(ValueError):
        EpochErrors("warn", SkipReport())


# --- Auditor ----------------------------------------------------------------------------


class Reader:
    """An inline item reader that counts releases; `boom` paths raise RuntimeError."""

    io = False

    def __init__(self, boom=(), bad=()):
        self.boom, self.bad = set(boom), set(bad)
        self.released = collections.Counter()

    def __call__(self, path):
        if path in self.boom:
            raise RuntimeError(f"a bug reading {path}")
        if path in self.bad:
            raise CorruptImageError(path, "bad bytes")
        return f"item:{path}"

    def release(self, item):
        self.released[item] += 1


def make_feed(n=10, on_error="skip", **reader_kw):
    reader = Reader(**reader_kw)
    index = Index([f"f{i}" for i in range(n)], None, None)
    return Feed(index, reader, chunk_size=4, on_error=on_error), reader


class Recover:
    """Fails every file it is asked for (CorruptImageError, or `result`), but
    those in `pixels`, whose pixels it returns."""

    def __init__(self, result=None, pixels=None):
        self.pixels = pixels or {}
        self.paths = []
        self.result = result

    def __call__(self, path):
        self.paths.append(path)
        if path in self.pixels:
            return self.pixels[path]
        if self.result is not None:
            return self.result
        return CorruptImageError(path, "TensorFlow's decoder failed on it")


def fed(auditor: Auditor) -> list[list[int]]:
    return [c.positions for c in auditor.chunks()]


def test_auditor_all_survive():
    feed, reader = make_feed(10)
    recover = Recover()
    a = Auditor(feed.epoch, recover)
    assert fed(a) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert list(a.emitted) == list(range(10)) + [END]
    assert a.check([0, 1, 2, 3])[0] is False
    assert a.check([4, 5, 6])[0] is False
    assert a.check([7, 8, 9, END])[0] is True
    assert recover.paths == []
    assert a.epoch.closed
    assert a.epoch.errors.skipped == {}
    assert reader.released == {f"item:f{i}": 1 for i in range(10)}


def test_auditor_gap_skip_records_it():
    feed, reader = make_feed(10, on_error="skip")
    recover = Recover()
    a = Auditor(feed.epoch, recover)
    fed(a)
    assert a.check([0, 1, 3])[0] is False  # 2 dropped out in TF
    assert recover.paths == ["f2"]
    assert a.epoch.errors.skipped == {"f2": "TensorFlow's decoder failed on it"}
    assert feed.skipped == {"f2": "TensorFlow's decoder failed on it"}
    assert a.check([4, 5, 6, 7, 8])[0] is False
    assert a.check([END])[0] is True  # the very last file (9) dropped out too
    assert recover.paths == ["f2", "f9"]
    assert set(feed.skipped) == {"f2", "f9"}
    # Dropped files' items are released as well as the survivors'.
    assert reader.released == {f"item:f{i}": 1 for i in range(10)}


def test_auditor_dropped_batch_recovers_the_good_files_in_order(caplog):
    """Dropped batches (2-5, then 8-9): the files that decode again come back, in
    order, before the survivors that revealed the gap; the bad ones are skipped.
    A gap with no file failing now is delivered, with a warning."""
    feed, reader = make_feed(10, on_error="skip")
    recover = Recover(pixels={"f2": "px2", "f3": "px3", "f5": "px5", "f9": "px9",
                              "f6": "px6"})
    a = Auditor(feed.epoch, recover)
    fed(a)
    assert a.check([0, 1]) == (False, [])
    assert a.check([7]) == (False, [(2, "px2"), (3, "px3"), (5, "px5"), (6, "px6")])
    assert recover.paths == ["f2", "f3", "f4", "f5", "f6"]
    assert feed.skipped == {"f4": "TensorFlow's decoder failed on it"}
    assert "dropped out" not in caplog.text
    assert a.check([END]) == (True, [(9, "px9")])  # the last batch (8, 9) dropped too
    assert set(feed.skipped) == {"f4", "f8"}
    assert reader.released == {f"item:f{i}": 1 for i in range(10)}


def test_auditor_gap_that_decodes_now_is_delivered_and_reported(caplog):
    feed, _ = make_feed(6, on_error="raise")
    a = Auditor(feed.epoch, Recover(pixels={"f2": "px2", "f3": "px3"}))
    fed(a)
    assert a.check([0, 1, 4]) == (False, [(2, "px2"), (3, "px3")])
    assert "2 file(s) from f2 on dropped out of TensorFlow's decode" in caplog.text
    assert feed.skipped == {}


def test_auditor_gap_raise():
    feed, _ = make_feed(10, on_error="raise")
    a = Auditor(feed.epoch, Recover(UnreadableFileError("f4", "gone")))
    fed(a)
    assert a.check([0, 1, 2, 3])[0] is False
    with pytest.raises(UnreadableFileError, match="gone") as ei:
        a.check([5, 6])
    assert ei.value.path == "f4"
    assert feed.skipped == {}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_auditor_gap_non_bad_file_error_is_raised(on_error):
    feed, _ = make_feed(6, on_error=on_error)
    a = Auditor(feed.epoch, Recover(RuntimeError("dropped out, but decodes now")))
    fed(a)
    with pytest.raises(RuntimeError, match="decodes now"):
        a.check([0, 2])
    assert feed.skipped == {}


def test_auditor_end_raises_the_held_feed_exception():
    feed, reader = make_feed(10, boom={"f6"})
    a = Auditor(feed.epoch, Recover())
    assert fed(a) == [[0, 1, 2, 3]]  # the feed failed in the second chunk: held
    assert isinstance(a.error, RuntimeError)
    assert list(a.emitted) == [0, 1, 2, 3, END]
    assert a.check([0, 1, 2, 3])[0] is False
    with pytest.raises(RuntimeError, match="a bug reading f6"):
        a.check([END])
    assert a.epoch.closed
    assert a.error is None


def test_auditor_end_raises_a_held_bad_file_error():
    feed, _ = make_feed(10, on_error="raise", bad={"f1"})
    a = Auditor(feed.epoch, Recover())
    assert fed(a) == []
    with pytest.raises(CorruptImageError) as ei:
        a.check([END])
    assert ei.value.path == "f1"
    assert a.epoch.closed


# --- AuditRegistry -------------------------------------------------------------------------


def test_registry_open_check_close():
    feed, reader = make_feed(6)
    reg = AuditRegistry()
    a1 = Auditor(feed.epoch, Recover())
    a2 = Auditor(feed.epoch, Recover())
    t1, t2 = reg.open(a1), reg.open(a2)
    assert t1 != t2 and t1 > 0 and t2 > 0
    assert len(reg) == 2
    fed(a1)
    fed(a2)
    assert reg.check(t1, [0, 1, 2, 3]) == []
    assert len(reg) == 2 and not a1.epoch.closed
    assert (reg.feeding, reg.awaiting) == (2, 0)
    reg.fed_out(t1)
    assert (reg.feeding, reg.awaiting) == (1, 1)  # `ds.loader.open_iterations`: 1
    assert reg.check(t1, [4, 5, END]) == []
    assert len(reg) == 1 and a1.epoch.closed  # closed at its marker
    assert (reg.feeding, reg.awaiting) == (1, 0)
    reg.close(t2)  # abandoned
    assert len(reg) == 0 and a2.epoch.closed
    assert (reg.feeding, reg.awaiting) == (0, 0)
    reg.close(t2)  # again: nothing
    assert reg.check(t2, [0, 1]) == []  # unknown token: an abandoned iteration
    assert reg.check(12345, [END]) == []


def test_registry_check_raises_auditor_errors():
    feed, _ = make_feed(6, on_error="raise")
    reg = AuditRegistry()
    a = Auditor(feed.epoch, Recover())
    tok = reg.open(a)
    fed(a)
    with pytest.raises(CorruptImageError, match="f0"):
        reg.check(tok, [1, 2])


def test_registry_is_bounded():
    assert audit._FINISHED_KEPT == 64
    feed, _ = make_feed(3)
    reg = AuditRegistry()
    auditors = [Auditor(feed.epoch, Recover()) for _ in range(70)]
    tokens = [reg.open(a) for a in auditors]
    live = reg.open(Auditor(feed.epoch, Recover()))  # still feeding: never dropped
    for a in auditors:
        fed(a)
    for tok in tokens[:64]:
        reg.fed_out(tok)
    assert len(reg) == 71
    assert not any(a.epoch.closed for a in auditors)
    reg.fed_out(tokens[64])  # the 65th: the oldest goes
    assert len(reg) == 70
    assert auditors[0].epoch.closed
    assert not any(a.epoch.closed for a in auditors[1:])
    for tok in tokens[65:]:
        reg.fed_out(tok)
    assert len(reg) == 65
    assert [a.epoch.closed for a in auditors] == [True] * 6 + [False] * 64
    # A dropped iteration's late check is ignored.
    assert reg.check(tokens[0], [0, 1, 2, END]) == []
    # Ones still kept finish normally.
    assert reg.check(tokens[6], [0, 1, 2, END]) == []
    assert auditors[6].epoch.closed and len(reg) == 64
    assert reg.check(live, [0]) == [] and len(reg) == 64
