"""Every script in benchmarks/ (and `dali-loader bench`'s opt-in rows) run once at a tiny size.

Each runs as a user runs it (`python benchmarks/NAME.py ...`, a fresh process) over a few
images, for seconds: no timing is checked, only that the report has its rows and ratios.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys

import pytest

from support import pythonpath
from support.helpers import REPO

pytestmark = pytest.mark.slow
BENCH = REPO / "benchmarks"
NUMBER = r"[0-9][0-9,]*\.?[0-9]*"


def _run(script: str, *args: str, timeout: float = 300) -> str:
    env = {**os.environ, "PYTHONPATH": pythonpath(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("GLIBC_TUNABLES", None)
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-4000:]}"
    return proc.stdout


# Runs with fixed arguments (no tmp folder, no TCP ports) by test name. They start one at a
# time in the background when this module starts, so each overlaps the foreground tests
# before it: a script's start-up (TF's import) uses one core of two, and the suite must
# stay under CI's 20 minutes. Only the selected tests' runs start.
BACKGROUND = {
    "test_bench_many_files": ("bench_many_files.py", "--sizes", "40", "--turns-n", "40", "--rounds",
                         "1", "--objects", "40", "--latencies", "0"),
    "test_bench_gcs_loader": ("bench_gcs_loader.py", "--num-images", "8", "--latency",
                              "0.001", "--rounds", "1", "--cold-runs", "1", "--listing", "30",
                              "--skip-seed", "--decode-threads", "1"),
    "test_bench_vs_keras": ("bench_vs_keras.py", "--format", "png", "--sizes", "8",
                            "--epochs", "1"),
    "test_bench_vs_keras_fixed_cost": ("bench_vs_keras.py", "--fixed-cost", "--epochs", "1"),
}
_started: dict[str, cf.Future] = {}


@pytest.fixture(scope="module", autouse=True)
def _background_runs(request):
    selected = {item.originalname or item.name for item in request.session.items
                if item.module is request.module}
    with cf.ThreadPoolExecutor(1, thread_name_prefix="smoke") as pool:
        for name, (script, *args) in BACKGROUND.items():
            if name in selected:
                _started[name] = pool.submit(_run, script, *args, timeout=600)
        yield
        for f in _started.values():
            f.cancel()
    _started.clear()


def run(script: str, *args: str, timeout: float = 300) -> str:
    """Runs `benchmarks/script ARGS` in a fresh process; its stdout and stderr together.
    Fails with their tail when it exits non-zero."""
    return _run(script, *args, timeout=timeout)


def background(test: str) -> str:
    """The output of `BACKGROUND[test]`'s run (started at the module's start)."""
    future = _started.get(test)
    return future.result() if future is not None else _run(*BACKGROUND[test], timeout=600)


def has_row(out: str, pattern: str) -> None:
    """`out` has a line matching `pattern` (a regex; NUM stands for a number)."""
    rx = re.compile(pattern.replace("NUM", NUMBER))
    assert any(rx.search(line) for line in out.splitlines()), f"no line /{pattern}/ in:\n{out}"


def test_every_script_has_a_smoke_test():
    """A script added to benchmarks/ must get a smoke run here."""
    source = open(__file__).read()
    scripts = {p.name for p in BENCH.glob("*.py")} - {"harness.py"}
    missing = sorted(s for s in scripts if f'"{s}"' not in source)
    assert not missing, f"benchmarks without a smoke run in {__file__}: {missing}"


def test_library_never_imports_the_benchmarks():
    """dali_loader (its core and its tools) and tf_adapter import nothing from benchmarks/."""
    rx = re.compile(r"^\s*(from|import)\s+(benchmarks|harness)\b", re.M)
    offenders = [str(p.relative_to(REPO)) for d in ("dali_loader", "tf_adapter")
                 for p in (REPO / d).rglob("*.py") if rx.search(p.read_text())]
    assert not offenders, offenders


@pytest.fixture(scope="module")
def harness():
    """benchmarks/harness.py, imported as the scripts import it."""
    sys.path.insert(0, str(BENCH))
    try:
        import harness as module
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_harness_epoch_child_and_malloc(harness):
    """The shared pieces on their own: the timed epoch counts images and times the first
    batch; a child's JSON comes back, its failure is raised with its stderr; the malloc
    settings are the two named."""
    import numpy as np

    e = harness.epoch([(np.zeros((3, 2)), None), (np.zeros((2, 2)), None)])
    assert (e.images, e.stats.batches, e.stats.complete) == (5, 2, True)
    assert 0 <= e.first_batch_s <= e.stats.wall_s and e.cpu_ms >= 0
    code = "import json, sys; json.dump({'a': 1}, open(sys.argv[-1], 'w'))"
    assert harness.run_child(["-c", code])["a"] == 1
    with pytest.raises(RuntimeError, match="boom"):
        harness.run_child(["-c", "raise SystemExit('boom')"])
    assert harness.malloc_env("tuned") == {"GLIBC_TUNABLES": harness.MALLOC_TUNABLES}
    assert harness.malloc_env("default") == {}
    with pytest.raises(ValueError, match="Received: which='fast'"):
        harness.malloc_env("fast")


def test_bench_cli_decode_bound_and_dali_rows(tmp_path):
    """`make bench`'s rows (what benchmarks/bench_local.py printed): the seed, the CPU
    default, decoder='dali' on the CPU and the decode-only bound, with their ratios."""
    env = {**os.environ, "PYTHONPATH": pythonpath(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-m", "dali_loader.tools.cli", "bench", str(tmp_path / "data"),
         "--sample", "8", "--only", "seed", "loader-cpu", "loader-dali", "decode-bound",
         "--batch-size", "4", "--rounds", "1", "--out", str(tmp_path / "out")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for row in ("seed", "loader-cpu", "loader-dali", "decode-bound"):
        has_row(proc.stdout, rf"^\| {row} \| .* \| NUM \| NUM \|")
    has_row(proc.stdout, r"loader-cpu/decode-bound = NUM\.")
    has_row(proc.stdout, r"loader-dali/seed = NUMx\.")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = {s["pipeline"]: s for s in res["summary"]}
    assert set(rows) == {"seed", "loader-cpu", "loader-dali", "decode-bound"}
    assert rows["decode-bound"]["cpu_decodes_per_epoch"] == 8  # every file, decoded once


def test_demo(tmp_path):
    out = run("demo.py", "--num-images", "16", "--train-seconds", "1", "--step-time", "0",
              "--latency", "0.001", "--out", str(tmp_path))
    has_row(out, r"^diagnose: bottleneck = ")
    for row in ("seed", "tuned", "loader-cpu", "loader-cpu-cached"):
        has_row(out, rf"^\| {row} \| .* \| NUM \|")
    has_row(out, r"loader-cpu/seed = NUMx\.")
    has_row(out, r"^\| seed \(tf\.data, question verbatim\) \| NUM \|")
    has_row(out, r"^\| dali-loader \(tf_adapter, gs://\) \| NUM \|")
    assert {"results.json", "results.md", "throughput.png", "diagnose.json",
            "training.json"} <= set(os.listdir(tmp_path))




def test_bench_service():
    out = run("bench_service.py", "--num-images", "8", "--epochs", "1", timeout=600)
    has_row(out, r"^\| float32 256x256x3 \+ label, raw \(compression=None\) \| NUM \| 1\.00x \|")
    for name in (r"Keras \(baseline, in-process\)", r"in-process \(no service\)",
                 r"service, 1 worker", r"service, 2 workers",
                 r"service, 2 workers, compression=None"):
        has_row(out, rf"^\| {name} \| NUM \(NUM\) \| NUMx \|")
    has_row(out, r"^Scaling model \(workers on machines of their own\)")




















def test_bench_gcs_loader():
    out = background("test_bench_gcs_loader")
    has_row(out, r"loader, first epoch, cold cache, gs:// +NUM")
    has_row(out, r"decode-only: DALI decoders\.image, 1 threads, .* +NUM")
    has_row(out, r"first epoch / min\(decode-only, in-flight bound\) = / NUM +NUM +>=0\.8")
    has_row(out, r"warm epoch / local folder \(median of per-round ratios\) +NUM")
    has_row(out, r"list \+ index of 30 objects \(30 indexed\): RSS")




def test_bench_many_files():
    out = background("test_bench_many_files")
    for kind in ("keras", "ours", "ours_ready"):
        has_row(out, rf"^ +40 {kind} +NUM +NUM +NUM +NUM +NUM +NUM")
        has_row(out, rf"malloc tuned +{kind} +CPU ms/img NUM; best NUM \(NUMx Keras's best\)")
    has_row(out, r"^ +40 ratios: construction ours/keras NUM; CPU per image ours/keras NUM")
    has_row(out, r"^ +0ms +NUM +NUM +NUM +NUM +NUM +NUM +NUM$")


def test_bench_vs_keras():
    out = background("test_bench_vs_keras")
    has_row(out, r"^\| 8 \| default \| NUM \| NUM \| NUM")


def test_bench_vs_keras_fixed_cost():
    out = background("test_bench_vs_keras_fixed_cost")
    has_row(out, r"^\| ours \| NUM / NUM \| NUM / NUM \|$")
    has_row(out, r"^\| keras \| ParallelMapDataset \| NUM \|$")
    has_row(out, r"^\| ours \| Generator \| NUM \|$")  # tf_internals.Generator


def test_bench_matrix(tmp_path):
    """The smallest cell of one kind (`--quick`): the table has its ratios and says the
    pixels are Keras's; the cell is in the JSON lines."""
    log = tmp_path / "matrix.json"
    out = run("bench_matrix.py", "--quick", "--only", "png8", "--data",
              str(tmp_path / "data"), "--out", str(log))
    has_row(out, r"^\| png8 \| 16 \| rgb \| NUM \| NUM \| NUMx( !)? \(NUMx\) \| NUM \| NUM "
                 r"\| NUMx( !)? \(NUMx\) \| NUM \| same \|$")
    cells = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(c["kind"], c["count"], c["color_mode"]) for c in cells] == [("png8", 16, "rgb")]
    assert len(cells[0]["epochs"]["ours"]) >= 2
