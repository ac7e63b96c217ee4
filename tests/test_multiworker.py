"""tf.distribute: every file once per epoch across input pipelines, and `fit` runs.

Two workers of a MultiWorkerMirroredStrategy on loopback (CPU only), and a
MirroredStrategy over 2 logical CPUs; each in subprocesses running
tests/multiworker_worker.py (TF is already initialised in this process).
"""

from __future__ import annotations

import pathlib
import sys

import pytest

from support.cluster import run_processes

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "multiworker_worker.py"
IDS = set(range(23))  # the id_tree fixture
RUN_TIMEOUT = 150  # seconds, for one run of the workers (about 15 s on 2 cores)


def _run_workers(mode: str, id_tree, tmp: pathlib.Path, num: int) -> list[dict]:
    """Runs `num` worker processes at once; their JSON results, in task order."""
    return run_processes(lambda i, out: [sys.executable, str(WORKER), mode, str(id_tree), out],
                         num, mode, str(tmp), timeout=RUN_TIMEOUT, cwd=str(HERE.parent))


def _check_epoch(ids_per_pipeline: list[list[int]], per_replica_batch: int) -> None:
    """Every file exactly once across the pipelines; counts within one batch."""
    seen = [i for ids in ids_per_pipeline for i in ids]
    assert sorted(seen) == sorted(IDS), ids_per_pipeline  # each id exactly once
    for a in range(len(ids_per_pipeline)):
        for b in range(a + 1, len(ids_per_pipeline)):
            assert not set(ids_per_pipeline[a]) & set(ids_per_pipeline[b])
    counts = [len(ids) for ids in ids_per_pipeline]
    assert max(counts) - min(counts) <= per_replica_batch, counts


@pytest.fixture(scope="module")
def multiworker(id_tree, tmp_path_factory):
    return _run_workers("multi", id_tree, tmp_path_factory.mktemp("multiworker"), 2)


@pytest.fixture(scope="module")
def mirrored(id_tree, tmp_path_factory):
    return _run_workers("mirrored", id_tree, tmp_path_factory.mktemp("mirrored"), 1)[0]


def _check_part(part: dict, ids_per_epoch: list[list[list[int]]], steps: list[list[int]],
                loaders: list[dict]) -> None:
    per_replica = part["global_batch"] // 2
    for e, ids in enumerate(ids_per_epoch):
        _check_epoch(ids, per_replica)
        assert len(set(steps[e])) == 1, f"epoch {e}: steps per worker {steps[e]}"
        batches = -(-len(IDS) // per_replica)
        assert steps[e][0] == -(-batches // 2)
    # each pipeline's loader: its shard, and as many files as it produced
    assert sorted(tuple(lo["shard"]) for lo in loaders) == [(0, 2), (1, 2)]
    for lo in loaders:
        assert lo["num_files"] == len(ids_per_epoch[0][lo["shard"][0]])


@pytest.mark.timeout(300)
def test_multiworker_mirrored_strategy(multiworker):
    """2 workers on loopback: disjoint shards covering every file each epoch, the
    same steps on both, a new order in epoch 2, and `fit` (see the Keras
    workarounds in multiworker_worker.py) with finite losses on both."""
    w0, w1 = multiworker
    assert w0["replicas"] == w1["replicas"] == 2
    for name, epochs in (("even", 2), ("uneven", 1)):
        parts = [w0[name], w1[name]]
        ids = [[parts[w]["epochs"][e]["ids"][0] for w in range(2)] for e in range(epochs)]
        steps = [[parts[w]["epochs"][e]["steps"] for w in range(2)] for e in range(epochs)]
        _check_part(w0[name], ids, steps, w0[name]["loaders"] + w1[name]["loaders"])
    ids = [w0["even"]["epochs"][e]["ids"][0] + w1["even"]["epochs"][e]["ids"][0] for e in range(2)]
    assert ids[0] != ids[1]  # reshuffled
    for w in (w0, w1):
        assert w["even"]["losses_finite"], w["even"]["losses"]
        assert len(w["even"]["losses"]) == 2
    assert w0["even"]["losses"] == w1["even"]["losses"]  # one model, trained in sync


@pytest.mark.timeout(300)
def test_multiworker_fit_with_uneven_shards(multiworker):
    """`fit` when the pipelines' batch counts differ (23 files, global batch 10)."""
    w0, w1 = multiworker
    assert w0["uneven"]["cardinality"] == w1["uneven"]["cardinality"], (
        w0["uneven"]["cardinality"], w1["uneven"]["cardinality"])
    for w in (w0, w1):
        assert "fit_error" not in w["uneven"], w["uneven"]["fit_error"]
        assert w["uneven"]["losses_finite"], w["uneven"]["losses"]


@pytest.mark.timeout(300)
def test_mirrored_strategy_per_replica_input(mirrored):
    """MirroredStrategy over 2 logical CPUs, InputReplicationMode.PER_REPLICA."""
    m = mirrored
    assert m["replicas"] == 2
    for name, epochs in (("even", 2), ("uneven", 1)):
        part = m[name]
        ids = [part["epochs"][e]["ids"] for e in range(epochs)]
        steps = [[part["epochs"][e]["steps"]] for e in range(epochs)]
        _check_part(part, ids, steps, part["loaders"])
        assert part["losses_finite"] and len(part["losses"]) == epochs, part["losses"]
    even = m["even"]
    assert even["epochs"][0]["ids"] != even["epochs"][1]["ids"]  # reshuffled
    assert even["again"] == even["epochs"]  # same seed: the same per-replica lists
