"""The CPU default's TF graph (issue 23 item 3, issue 29): few generator calls per
file, no per-element branch for local files, the decode fused with the batch from
a few batches per epoch on (a dropped batch's good files recovered in order, the
end marker in a batch of its own) and per file below, single-device functions."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from dali_loader import plan as plan_mod  # noqa: E402
from dali_loader.feed.epochs import FeedEpoch  # noqa: E402
from dali_loader.plan import Graph, ItemReader  # noqa: E402
from support import pythonpath  # noqa: E402
from support.pngs import encode_png  # noqa: E402
from dali_loader.tfdata import tf_path as tf_path_mod  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def force_graph(monkeypatch, graph: Graph) -> Graph:
    """The plan's graph whatever the folder's size (its `_graph` rule's pad share)."""
    monkeypatch.setattr(plan_mod, "FUSED_MAX_PAD_SHARE",
                        float("inf") if graph is Graph.FUSED else -1.0)
    return graph


@pytest.fixture(params=list(Graph), ids=[g.value for g in Graph])
def batching(request, monkeypatch):
    """Both graphs of the TF path, whatever the folder's size."""
    return force_graph(monkeypatch, request.param)


def _tree(root, n: int, bad: tuple[int, ...] = ()) -> None:
    """n 4x4 PNGs whose red channel is the file id mod 256, in 2 classes (id % 2);
    the ids in `bad` are truncated."""
    for i in range(n):
        arr = np.zeros((4, 4, 3), np.uint8)
        arr[..., 0] = i % 256
        arr[..., 1] = i // 256
        data = encode_png(arr)
        path = root / f"c{i % 2}" / f"{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[:40] if i in bad else data)


def _ids(ds) -> tuple[list[int], list[int]]:
    ids, labels = [], []
    for x, y in ds:
        px = x.numpy()[:, 0, 0]
        ids += [int(round(r)) + 256 * int(round(g)) for r, g in px[:, :2]]
        labels += [int(v) for v in y.numpy()]
    return ids, labels


def test_local_chunks_grow_after_a_small_first_one(tmp_path, monkeypatch):
    """On a local disk the generator asks for 32 files, then 4x more per call up to
    1024: decoding starts early and an epoch takes few calls (each a hop through
    Python on TF's threads; issue 29)."""
    _tree(tmp_path, 600)
    asked = []
    next_chunk = FeedEpoch.next_chunk

    def spy(self, size=None):
        chunk = next_chunk(self, size)
        if chunk is not None:
            asked.append(len(chunk.items))
        return chunk

    monkeypatch.setattr(FeedEpoch, "next_chunk", spy)
    ds = ours(str(tmp_path), image_size=(4, 4), batch_size=50, shuffle=True, seed=1,
              verbose=False)
    ids, labels = _ids(ds)
    assert asked == [32, 128, 440]
    assert sorted(ids) == list(range(600))
    assert labels == [i % 2 for i in ids]
    assert [len(b[0]) for b in ds] == [50] * 12


@pytest.mark.parametrize("graph_reads", ["paths", "pinned_or_bytes"])
@pytest.mark.parametrize("batch_size", [7, None])
def test_bad_files_anywhere_are_named_and_the_rest_delivered_once(tmp_path, monkeypatch,
                                                                  graph_reads, batch_size,
                                                                  batching):
    """Bad files first, in the middle and last in the epoch's order (class c1's
    files follow c0's) are skipped and named; every other file arrives once, in
    order, with its label, though each bad file's whole batch dropped out of TF's
    fused decode (or each file alone, per file); with TF reading the paths, and
    with the graph that reads a file from an offset or takes its bytes."""
    if graph_reads != "paths":  # the plan's reader for URLs, over the local folder
        import dataclasses

        import tf_adapter.dataset as adapter_mod
        from dali_loader import api

        plan_for = api.plan_for
        monkeypatch.setattr(api, "plan_for", lambda *a: dataclasses.replace(
            plan_for(*a), item_reader=ItemReader.PINNED_OR_BYTES))
        assert adapter_mod.build is api.build
    n = 300
    bad = (0, 2, 1, 150, 151, 297, 299)  # c0: first two; c1: first, mid, last two
    _tree(tmp_path / "data", n, bad)
    ds = ours(str(tmp_path / "data"), image_size=(4, 4), batch_size=batch_size,
              shuffle=False, on_error="skip", verbose=False)
    reads = ds.loader
    for _ in range(2):
        if batch_size is None:
            got = [(int(round(x.numpy()[0, 0, 0])) + 256 * int(round(x.numpy()[0, 0, 1])),
                    int(y)) for x, y in ds]
            ids, labels = [i for i, _ in got], [y for _, y in got]
        else:
            ids, labels = _ids(ds)
        order = [int(p[-8:-4]) for p in ds.file_paths]  # unshuffled: the index's order
        assert ids == [i for i in order if i not in bad]  # in order, each once
        assert labels == [i % 2 for i in ids]
    assert sorted(reads.skipped) == sorted(str(tmp_path / "data" / f"c{i % 2}" / f"{i:04d}.png")
                                           for i in bad)
    assert _tf_epochs(ds).reads is (ItemReader.PATHS if graph_reads == "paths"
                                    else ItemReader.PINNED_OR_BYTES)


def test_headers_are_read_once_per_file_while_they_pass(tmp_path, monkeypatch):
    """The CPU default reads each local file's header once per dataset (not per
    epoch); a header over `max_pixels` is refused, named, in every epoch."""
    import struct
    import zlib

    from dali_loader.feed import items as items_mod

    _tree(tmp_path, 40)
    ihdr = struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)
    bomb = tmp_path / "c0" / "bomb.png"
    bomb.write_bytes(b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr
                     + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)))
    peeks = []
    peek = items_mod.peek_size_problem

    def counted(path, *a, **kw):
        peeks.append(path)
        return peek(path, *a, **kw)

    monkeypatch.setattr(items_mod, "peek_size_problem", counted)
    ds = ours(str(tmp_path), image_size=(4, 4), batch_size=8, on_error="skip",
              max_pixels=10**8, verbose=False)
    for epoch in range(3):
        ids, _ = _ids(ds)
        assert sorted(ids) == list(range(40))
        if epoch == 0:  # every file once
            assert sorted(peeks) == sorted(str(p) for p in tmp_path.glob("c*/*.png"))
        else:  # then only the refused one
            assert peeks[41:] == [str(bomb)] * epoch
    assert "over the limit of 100000000" in ds.loader.skipped[str(bomb)]


def test_the_audit_of_a_gone_dataset_passes_batches_through():
    """A weakly called target that is gone gets its default with the call's
    arguments: the audit's stand-in recovers nothing and keeps one label per
    file of a batch, none for pads or the end marker."""
    import gc

    from dali_loader.tfdata.weak import weakly

    class Target:
        def check(self, keys, empty):
            return "live", keys

    t = Target()
    call = weakly(t, "check", tf_path_mod._no_check)
    empty = np.zeros((0, 2, 2, 3), np.float32)
    assert call(np.arange(3), empty)[0] == "live"
    del t
    gc.collect()
    extra, labels, kept = call(np.arange(5, dtype=np.int64), empty)
    assert extra is empty and labels.tolist() == [0] * 5 and kept == 5
    base = 3 * tf_path_mod.KEY_STRIDE
    tail = np.asarray([base + 7, base + tf_path_mod.PAD, base + tf_path_mod.PAD])
    extra, labels, kept = call(tail, empty)
    assert extra is empty and labels.tolist() == [0] and kept == 1
    extra, labels, kept = call(np.asarray([base + tf_path_mod.MARKER]), empty)
    assert extra is empty and labels.tolist() == [] and kept == 0


TAIL = r"""
import sys
import numpy as np
from tf_adapter import image_dataset_from_directory
from dali_loader import plan
plan.FUSED_MAX_PAD_SHARE = float(sys.argv[2])
ds = image_dataset_from_directory(sys.argv[1], image_size=(4, 4), batch_size=16, shuffle=False,
                                  on_error="skip", verbose=False)
for _ in range(2):
    got = [int(round(v)) for x, _ in ds for v in x.numpy()[:, 0, 0, 0]]
    print("IDS", got, flush=True)
"""


@pytest.mark.parametrize("pad_share", ["inf", "-1"], ids=["fused", "per-file"])
def test_a_recovered_batch_and_the_padded_tail_log_no_tf_errors(tmp_path, pad_share):
    """A dropped batch put back and the last files' batch less its pads are new
    tensors, not slices of the batch: TF logs no error lines about them (a slice
    alone made "Tensor RefCount not reliable" errors, four per epoch)."""
    import os
    import subprocess
    import sys

    from support.helpers import REPO

    _tree(tmp_path, 40, bad=(5,))
    env = dict(os.environ, PYTHONPATH=pythonpath(), TF_CPP_MIN_LOG_LEVEL="0")
    out = subprocess.run([sys.executable, "-c", TAIL, str(tmp_path), pad_share], env=env,
                         cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    expected = sorted((i for i in range(40) if i != 5), key=lambda i: (i % 2, i))
    ids = [line for line in out.stdout.splitlines() if line.startswith("IDS")]
    assert ids == [f"IDS {expected}"] * 2, out.stderr[-3000:]
    assert "RefCount" not in out.stderr and "tensor.h" not in out.stderr, out.stderr[-3000:]


def test_a_file_skipped_once_is_decoded_alone_in_later_epochs(tmp_path, monkeypatch, batching):
    """Fused, epoch 1: the bad file drops its batch of 16, and the audit decodes
    those 16 again; later epochs withhold it from TF, and the audit decodes it
    alone. Per file: it drops alone, and the audit decodes it to name it. Every
    epoch delivers the same files, in order."""
    calls = []
    recover = tf_path_mod._TFKernelEpochs.recover

    def counted(self, path):
        calls.append(path)
        return recover(self, path)

    monkeypatch.setattr(tf_path_mod._TFKernelEpochs, "recover", counted)
    _tree(tmp_path, 40, bad=(4,))  # c0's third file: the first batch
    ds = ours(str(tmp_path), image_size=(4, 4), batch_size=16, shuffle=False,
              on_error="skip", verbose=False)
    expected = [i for i in sorted(range(40), key=lambda i: (i % 2, i)) if i != 4]
    per_epoch = []
    for _ in range(3):
        calls.clear()
        assert _ids(ds)[0] == expected
        per_epoch.append(len(calls))
    assert per_epoch == ([16, 1, 1] if batching is Graph.FUSED else [1, 1, 1])
    assert list(ds.loader.skipped) == [str(tmp_path / "c0" / "0004.png")]


@pytest.mark.parametrize("batch_size,files,expected", [
    (16, 36, "per-file"), (16, 48, "fused"), (16, 20, "per-file"), (16, 61, "fused"),
    (None, 40, "per-file"), (None, 128, "fused"), (128, 256, "fused"), (128, 300, "per-file")])
def test_the_graph_is_fused_unless_its_pads_are_over_a_quarter(tmp_path, batch_size, files,
                                                               expected):
    """The plan's `graph`: the fused op unless its pads (to fill the last files' batch)
    would be over a quarter of the epoch's files (each costs about a decode), per file
    there; both deliver the same batches."""
    _tree(tmp_path, files)
    ds = ours(str(tmp_path), image_size=(4, 4), batch_size=batch_size, shuffle=False,
              verbose=False)
    epochs = _tf_epochs(ds)
    assert epochs.batching is Graph(expected) is ds.loader.plan.graph
    names = set()
    _walk(ds, lambda d: names.add(type(d).__name__))
    assert any("MapAndBatch" in n for n in names) == (expected == "fused")
    sizes = [len(x) for x, _ in ds] if batch_size else [len(list(ds))]
    size = batch_size or files
    assert sizes == [size] * (files // size) + ([files % size] if files % size else [])


def _walk(ds, visit) -> None:
    visit(ds)
    for d in ds._inputs():
        _walk(d, visit)


def _tf_epochs(ds):
    found = []
    _walk(ds, lambda d: found.append(d._dali_epochs) if hasattr(d, "_dali_epochs") else None)
    return found[0]


@pytest.mark.parametrize("graph", list(Graph), ids=[g.value for g in Graph])
def test_every_function_of_the_tf_path_is_single_device(tmp_path, monkeypatch, graph):
    """Issue 29: each tf.data function is instantiated again for every iterator,
    a multi-device one with grappler's pass (3-4 ms each). Every function of the
    TF path carries the single-device attribute, and the pipeline keeps TF's
    `inject_prefetch` pass, which would refuse them, off."""
    force_graph(monkeypatch, graph)
    _tree(tmp_path, 20)
    ds = ours(str(tmp_path), image_size=(4, 4), batch_size=4, verbose=False)
    funcs = []
    _walk(ds, lambda d: funcs.extend(getattr(d, "_functions", lambda: [])()))
    _walk(ds, lambda d: funcs.extend(getattr(d, f"_{n}_func") for n in ("init", "next", "finalize")
                                     if hasattr(d, f"_{n}_func")))
    # TF's `normalize` maps (of `unbatch` and `rebatch`) return their inputs: TF
    # short-circuits them, nothing instantiated.
    ours_ = [f for f in funcs if b"_normalize_" not in f.function.name]
    names = b" ".join(f.function.name for f in ours_)
    for part in (b"_init_", b"_next__", b"_finalize_", b"_decode_", b"_audit_"):
        assert part in names
    for f in ours_:
        attrs = f.function.function_def.attr
        assert attrs["experimental_ints_on_device"].b, f.function.name
    assert ds.options().experimental_optimization.inject_prefetch is False
    assert sorted(_ids(ds)[0]) == list(range(20))


def _options(**kw):
    o = tf.data.Options()
    for path, value in kw.items():
        *parents, last = path.split("__")
        obj = o
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, last, value)
    return o


@pytest.mark.parametrize("user", [
    {"deterministic": False}, {"threading__private_threadpool_size": 2},
    {"threading__max_intra_op_parallelism": 1}, {"autotune__enabled": False},
    {"experimental_optimization__map_parallelization": True},
    {"experimental_optimization__apply_default_optimizations": False},
    {"experimental_warm_start": True}])
def test_user_options_keep_every_file_once_in_order(tmp_path, user):
    """A user's `tf.data.Options` on the returned dataset (and a map after it):
    each file once, in order, with the single-device functions."""
    _tree(tmp_path, 70, bad=(3,))
    ds = ours(str(tmp_path), image_size=(4, 4), batch_size=8, shuffle=False,
              on_error="skip", verbose=False)
    expected = [i for i in sorted(range(70), key=lambda i: (i % 2, i)) if i != 3]
    mine = ds.map(lambda x, y: (x, y)).with_options(_options(**user))
    for _ in range(2):
        assert _ids(mine)[0] == expected


def test_slack_needs_the_single_device_maps_off(tmp_path, monkeypatch):
    """TF's `slack` pass refuses a single-device function of two outputs at
    `iter()`. A user who turns it on turns the maps off with
    `DALI_LOADER_SINGLE_DEVICE_MAPS=0` (docs/parity.md): every file again."""
    from dali_loader.tfdata import single_device

    _tree(tmp_path, 20)
    slack = _options(experimental_slack=True)
    ds = ours(str(tmp_path), image_size=(4, 4), batch_size=4, verbose=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="fetch node"):
        list(ds.with_options(slack))
    monkeypatch.setenv(single_device.ENV, "0")
    ds = ours(str(tmp_path), image_size=(4, 4), batch_size=4, verbose=False)
    assert sorted(_ids(ds.with_options(slack))[0]) == list(range(20))


def test_each_datasets_plan_records_what_runs(tmp_path):
    """Issue 39: `ds.loader.plan` is the plan of that dataset: the seed drawn when
    none was passed, the validation subset unshuffled, its own files' graph."""
    _tree(tmp_path, 100)
    drawn = ours(str(tmp_path), image_size=(4, 4), batch_size=16, seed=None, verbose=False)
    assert isinstance(drawn.loader.plan.options.seed, int)
    train, val = ours(str(tmp_path), image_size=(4, 4), batch_size=16, validation_split=0.2,
                      subset="both", seed=3, verbose=False)
    tp, vp = train.loader.plan, val.loader.plan
    assert tp.options.seed == vp.options.seed == 3
    assert (tp.options.shuffle, vp.options.shuffle) == (True, False)
    # 80 files in 16s: no pads, fused; 20: 12 pads, per file.
    assert (tp.graph, vp.graph) == (Graph.FUSED, Graph.PER_FILE)
    assert "80 files per epoch" in tp.why["graph"] and "20 files" in vp.why["graph"]
    assert tp.decode_calls >= 2 and "graph" in tp.format() and "decode_calls" in tp.format()
