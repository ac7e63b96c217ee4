"""Resumable epochs: after kill -9 mid-epoch, each file of the interrupted epoch is
trained on exactly once across the killed run and the resumed one, in the order an
uninterrupted run uses."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from support.helpers import wait_for  # noqa: E402

WORKER = pathlib.Path(__file__).resolve().parent / "resume_worker.py"
IDS = list(range(23))
STEPS = 6  # 23 files, batch 4


def run(id_tree, backup, log, sleep_s=0.0, timeout=150):
    return subprocess.Popen([sys.executable, str(WORKER), str(id_tree), str(backup), str(log),
                             str(sleep_s)], cwd=WORKER.parent.parent, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def records(log) -> list[dict]:
    return [json.loads(line) for line in pathlib.Path(log).read_text().splitlines() if line]


def steps_of(recs) -> list[tuple[int, list[int]]]:
    return [(r["epoch"], r["ids"]) for r in recs if "ids" in r]


@pytest.mark.timeout(400)
def test_kill9_mid_epoch_then_resume_uses_each_file_once(id_tree, tmp_path):
    # An uninterrupted run: the reference order.
    ref_log = tmp_path / "ref.log"
    p = run(id_tree, tmp_path / "ref-backup", ref_log)
    assert p.wait(150) == 0, p.stderr.read().decode()[-3000:]
    reference = steps_of(records(ref_log))
    assert len(reference) == 3 * STEPS
    for e in range(3):
        assert sorted(i for ep, ids in reference if ep == e for i in ids) == IDS

    backup, log = tmp_path / "backup", tmp_path / "run.log"
    p = run(id_tree, backup, log, sleep_s=0.3)
    try:
        # Kill -9 in the middle of epoch 1 (after its 3rd step: a checkpoint at 2).
        wait_for(lambda: log.exists() and len(steps_of(records(log))) >= STEPS + 3, timeout=120)
        os.kill(p.pid, signal.SIGKILL)
        assert p.wait(30) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
    killed = steps_of(records(log))
    assert killed[:len(killed)] == reference[:len(killed)]

    log.write_text("")  # the resumed run's own record
    p = run(id_tree, backup, log)
    assert p.wait(150) == 0, p.stderr.read().decode()[-3000:]
    recs = records(log)
    epoch, step = recs[0]["restored"]
    assert recs[-1]["done"]
    assert epoch == 1 and 2 <= step < STEPS and step % 2 == 0, (epoch, step)
    resumed = steps_of(recs)
    # What the checkpoint kept of the killed run, then the resumed run: exactly the
    # uninterrupted run's steps. Steps after the checkpoint were rolled back with the
    # weights and trained on again, from the same files.
    kept = killed[:epoch * STEPS + step]
    assert kept + resumed == reference
    interrupted = [i for ep, ids in kept + resumed if ep == epoch for i in ids]
    assert sorted(interrupted) == IDS  # each file of the interrupted epoch once
    assert not backup.exists()  # finished: the backup is removed
    # Same data in the same order from the same start: the same final weights.
    np.testing.assert_allclose(np.concatenate([np.ravel(w) for w in recs[-1]["weights"]]),
                               np.concatenate([np.ravel(w) for w in records(ref_log)[-1]["weights"]]),
                               rtol=1e-6, atol=1e-7)
