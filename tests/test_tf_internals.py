"""TF's private APIs behind one gate (issue 39, `dali_loader/tf_internals.py`): the gate
(version, import, switch), each internal's reason pointing at a real docs section, and
the TF path run with the internals off and on: the same pixels and labels, every file
once per epoch."""

from __future__ import annotations

import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from dali_loader import tf_internals  # noqa: E402
from dali_loader.tf_internals import Internal  # noqa: E402
from dali_loader import plan as plan_mod  # noqa: E402
from dali_loader.plan import Graph  # noqa: E402
from support import REPO  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def switch(monkeypatch):
    """`switch("0")`: every internal off; `switch(None)`: the default (the gate)."""
    monkeypatch.delenv(tf_internals.SINGLE_DEVICE_ENV, raising=False)
    monkeypatch.delenv(tf_internals.OFF_ENV, raising=False)

    def set_(value):
        if value is None:
            monkeypatch.delenv(tf_internals.ENV, raising=False)
        else:
            monkeypatch.setenv(tf_internals.ENV, value)
    return set_


def _tree(root, n: int, bad: tuple[int, ...] = ()) -> None:
    """n 5x3 PNGs, the file id in the first pixel's red and green and noise elsewhere,
    in 3 classes (id % 3); the ids in `bad` truncated."""
    from support.pngs import encode_png

    rng = np.random.default_rng(0)
    for i in range(n):
        arr = rng.integers(0, 256, (5, 3, 3), np.uint8)
        arr[0, 0, :2] = i % 256, i // 256
        data = encode_png(arr)
        path = root / f"c{i % 3}" / f"{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[:40] if i in bad else data)


def _epoch(ds) -> tuple[list[int], np.ndarray, np.ndarray]:
    xs, ys = [], []
    for x, y in ds:
        xs.append(x.numpy())
        ys.append(y.numpy())
    x, y = np.concatenate(xs), np.concatenate(ys)
    ids = [int(round(r)) + 256 * int(round(g)) for r, g in x[:, 0, 0, :2]]
    return ids, x, y


def _walk(ds, visit) -> None:
    visit(ds)
    for d in ds._inputs():
        _walk(d, visit)


def _functions(ds) -> list:
    funcs = []
    _walk(ds, lambda d: funcs.extend(getattr(d, "_functions", lambda: [])()))
    _walk(ds, lambda d: funcs.extend(getattr(d, f"_{n}_func") for n in ("init", "next", "finalize")
                                     if hasattr(d, f"_{n}_func")))
    return [f.function for f in funcs if b"_normalize_" not in f.function.name]


def _ops(functions) -> set[str]:
    return {node.op for f in functions for node in f.function_def.node_def}


@pytest.mark.parametrize("graph", list(Graph), ids=[g.value for g in Graph])
def test_tf_path_same_with_internals_off_and_on(tmp_path, monkeypatch, switch, graph):
    """The TF path over files, both graphs, a bad file skipped: with every internal off
    (public tf.data: `from_generator`, TF's own maps, `tf.cond`) exactly what it is with
    them on, every good file once per epoch, in the same order."""
    # The plan's graph whatever the folder's size (its `_graph` rule's pad share).
    monkeypatch.setattr(plan_mod, "FUSED_MAX_PAD_SHARE",
                        float("inf") if graph is Graph.FUSED else -1.0)
    _tree(tmp_path, 45, bad=(7,))
    expected = sorted((i for i in range(45) if i != 7), key=lambda i: (i % 3, i))
    runs = {}
    for state in ("on", "off"):
        switch(None if state == "on" else "0")
        ds = ours(str(tmp_path), image_size=(5, 3), batch_size=8, shuffle=False,
                  on_error="skip", verbose=False)
        functions = _functions(ds)
        attrs = [tf_internals.has_single_device_attribute(f) for f in functions]
        if state == "on":
            assert all(attrs) and any(f for f in functions if b"_finalize_" in f.name)
            assert ds.loader.plan.graph is graph
            if graph is Graph.FUSED:  # the pads' and the audit's branches
                assert "Switch" in _ops(functions)
        else:
            assert not any(attrs)
            assert not any(b"_finalize_" in f.name for f in functions)  # from_generator's
            assert "Switch" not in _ops(functions)
            assert ds.options().experimental_optimization.inject_prefetch is not False
        runs[state] = [_epoch(ds) for _ in range(2)]
        for ids, _, _ in runs[state]:
            assert ids == expected  # each good file once, in order
    for (ids_on, x_on, y_on), (ids_off, x_off, y_off) in zip(runs["on"], runs["off"]):
        assert ids_on == ids_off
        np.testing.assert_array_equal(x_on, x_off)
        np.testing.assert_array_equal(y_on, y_off)


def test_ready_path_same_with_internals_off_and_on(tmp_path, switch):
    """The GPU-ready cache's raw entries (filled into TF's pooled buffers where on, numpy's
    where off): the same pixels and labels, each file once, filling and cached."""
    _tree(tmp_path / "data", 21)
    expected = sorted(range(21), key=lambda i: (i % 3, i))
    runs = {}
    for state in ("on", "off"):
        switch(None if state == "on" else "0")
        assert (tf_internals.pooled_empty(tf, 64) is not None) == (state == "on")
        ds = ours(str(tmp_path / "data"), decoder="tf", gpu_ready="raw",
                  cache_dir=str(tmp_path / f"cache-{state}"), image_size=(5, 3),
                  batch_size=4, shuffle=False, verbose=False)
        runs[state] = [_epoch(ds) for _ in range(2)]  # the fill, then the cache
        for ids, _, _ in runs[state]:
            assert ids == expected
    for (_, x_on, y_on), (_, x_off, y_off) in zip(runs["on"], runs["off"]):
        np.testing.assert_array_equal(x_on, x_off)
        np.testing.assert_array_equal(y_on, y_off)


def test_gate_version_switch_and_import(monkeypatch, switch):
    switch(None)
    version = tf_internals._version(tf)
    assert tf_internals.CHECKED[0] <= version <= tf_internals.CHECKED[1], (
        f"TF {tf.__version__} is outside CHECKED: run the TF-path tests on it, then widen it")
    assert tf_internals.gate(tf) is None
    assert all(tf_internals.on(tf, i) for i in Internal)
    # A TF outside the versions checked: every internal off, saying why; "1" tries them.
    monkeypatch.setattr(tf_internals, "CHECKED", ((1, 0), (1, 15)))
    assert "outside the versions checked, 1.0 to 1.15" in tf_internals.gate(tf)
    assert not any(tf_internals.on(tf, i) for i in Internal)
    switch("1")
    assert all(tf_internals.on(tf, i) for i in Internal)
    switch("0")
    assert tf_internals.gate(tf) == f"{tf_internals.ENV}=0"
    assert all(v.startswith(f"off: {tf_internals.ENV}=0; ") for v in
               tf_internals.status(tf).values())
    assert tf_internals.summary(tf) == (f"0 of 6 on (TF {tf.__version__})",
                                        f"off: all ({tf_internals.ENV}=0)")
    monkeypatch.undo()
    # The slack switch (docs/parity.md) turns the single-device functions alone off.
    monkeypatch.setenv(tf_internals.SINGLE_DEVICE_ENV, "0")
    off = [i for i in Internal if not tf_internals.on(tf, i)]
    assert off == [Internal.SINGLE_DEVICE_FUNCTIONS]
    assert tf_internals.summary(tf)[1].endswith(
        f"; off: SINGLE_DEVICE_FUNCTIONS ({tf_internals.SINGLE_DEVICE_ENV}=0)")
    monkeypatch.undo()
    # One by one, to measure each against its fallback; an unknown name is an error.
    monkeypatch.setenv(tf_internals.OFF_ENV, "switch_merge, GENERATOR_OP")
    off = [i for i in Internal if not tf_internals.on(tf, i)]
    assert off == [Internal.GENERATOR_OP, Internal.SWITCH_MERGE]
    assert tf_internals.why_off(tf, Internal.SWITCH_MERGE) == f"{tf_internals.OFF_ENV} names it"
    monkeypatch.setenv(tf_internals.OFF_ENV, "SWITCH")
    with pytest.raises(ValueError, match=r"do not exist: \['SWITCH'\].*Received"):
        tf_internals.on(tf, Internal.SWITCH_MERGE)
    monkeypatch.undo()
    # A private module gone (a future TF): every internal off, naming the import.
    monkeypatch.setattr(tf_internals, "_imported", {"error": "ImportError: no _GeneratorDataset"})
    assert "did not import (ImportError: no _GeneratorDataset)" in tf_internals.gate(tf)
    assert not any(tf_internals.on(tf, i) for i in Internal)


def test_diagnose_plan_says_which_internals_are_on(tmp_path, switch):
    from dali_loader.tools.diagnose import loader_plan, plan_table

    switch(None)
    _tree(tmp_path, 3)
    paths = sorted(str(p) for p in tmp_path.rglob("*.png"))
    row = plan_table(loader_plan(str(tmp_path), paths))["tf_private"]
    assert row["value"] == f"6 of 6 on (TF {tf.__version__})"
    assert row["why"] == "on: " + ", ".join(i.name for i in Internal)


def test_every_reason_cites_a_docs_section_that_exists(switch):
    """Each internal's measured gain points at a docs section: the file exists and holds
    the quoted heading (docs/benchmarks.md and the others move: this keeps the pointer)."""
    switch(None)
    for internal in Internal:
        r = internal.value
        assert r.uses and r.gain and r.fallback
        for cite in r.docs.split("; "):
            path, _, section = cite.partition(", ")
            text = (REPO / path).read_text()
            title = re.match(r"'([^']+)'", section).group(1)
            assert title in text, f"{internal.name}: {title!r} not in {path}"
        assert tf_internals.status(tf)[internal.name] == f"on: {r.gain} ({r.docs})"


def test_either_is_switch_merge_or_tf_cond(switch):
    """`either`: TF's Switch and Merge where on, `tf.cond` where off; the same values,
    and only the branch taken runs."""
    ran = []

    def then(x):
        return x * 10

    def otherwise(x):
        return tf.numpy_function(lambda v: ran.append(int(v)) or v, [x], tf.int64) - 1

    values = {}
    for state in ("on", "off"):
        switch(None if state == "on" else "0")
        ran.clear()
        ds = tf.data.Dataset.range(6).map(
            lambda x: tf_internals.either(tf, x % 2 == 0, then, otherwise, x))
        ops = _ops([ds._map_func.function])
        assert ("Switch" in ops) == (state == "on")
        assert bool({"If", "StatelessIf"} & ops) == (state == "off")
        values[state] = [int(v) for v in ds]
        assert sorted(ran) == [1, 3, 5]  # the odd ones alone took `otherwise`
    assert values["on"] == values["off"] == [0, 0, 20, 2, 40, 4]


def test_plugin_handoff_same_with_internals_off_and_on(tmp_path, switch):
    """The DALI TF plugin's handoff on the CPU: with `NAMED_DECODE_ERRORS` off the plugin's
    dataset is returned as is (DALI's own decode errors), the same batches, each file once."""
    pytest.importorskip("nvidia.dali.plugin.tf")
    _tree(tmp_path, 21)
    expected = list(range(21))
    runs = {}
    for state in ("on", "off"):
        switch(None if state == "on" else "0")
        ds = ours(str(tmp_path), image_size=(5, 3), batch_size=4, seed=5, decoder="dali",
                  handoff="plugin", verbose=False)
        assert (type(ds).__name__ == "NamingDataset") == (state == "on")
        runs[state] = [_epoch(ds) for _ in range(2)]
        for ids, _, _ in runs[state]:
            assert sorted(ids) == expected
    for (ids_on, x_on, y_on), (ids_off, x_off, y_off) in zip(runs["on"], runs["off"]):
        assert ids_on == ids_off  # reshuffled alike
        np.testing.assert_array_equal(x_on, x_off)
        np.testing.assert_array_equal(y_on, y_off)


def test_a_probe_is_asked_once_and_a_refusal_is_false(monkeypatch):
    """`probed`: each capability asked once per process under its name; an attempt
    that raises (a TF that refuses it) is False, and the fallback runs."""
    monkeypatch.setattr(tf_internals, "_probes", {})
    calls = []

    def refuses():
        calls.append("r")
        raise TypeError("a TF without it")

    def takes():
        calls.append("t")
        return True

    assert tf_internals.probed("a", refuses) is False
    assert tf_internals.probed("a", takes) is False  # kept: not asked again
    assert tf_internals.probed("b", takes) is True
    assert tf_internals.probed("b", refuses) is True
    assert calls == ["r", "t"]
