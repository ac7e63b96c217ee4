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
    "test_bench_scale": ("bench_scale.py", "--sizes", "40", "--turns-n", "40", "--rounds",
                         "1", "--objects", "40", "--latencies", "0"),
    "test_bench_gcs_loader": ("bench_gcs_loader.py", "--num-images", "8", "--latency",
                              "0.001", "--rounds", "1", "--cold-runs", "1", "--listing", "30",
                              "--skip-seed", "--decode-threads", "1"),
    "test_bench_malloc": ("bench_malloc.py", "--num-images", "8", "--epochs", "7",
                          "--size", "16"),
    "test_bench_tf_png_op": ("bench_tf_png_op.py", "--num-images", "8", "--rounds", "1",
                             "--malloc", "default", "--stage-images", "4",
                             "--tiny-images", "64"),
    "test_bench_dali_png": ("bench_dali_png.py", "--num-images", "8", "--rounds", "1",
                            "--malloc", "tuned", "--no-stage"),
    "test_bench_png_fill": ("bench_png_fill.py", "--num-images", "8", "--rounds", "1",
                            "--variants", "libpng,native"),
    "test_bench_plugin": ("bench_plugin.py", "--num-images", "8", "--epochs", "2",
                          "--batch-size", "4"),
    "test_epoch_startup": ("epoch_startup.py", "--num-images", "8", "--epochs", "2"),
    "test_bench_vs_keras": ("bench_vs_keras.py", "--format", "png", "--sizes", "8",
                            "--epochs", "1"),
    "test_bench_vs_keras_fixed_cost": ("bench_vs_keras.py", "--fixed-cost", "--epochs", "1"),
    "test_bench_png_core": ("bench_png_core.py", "--images", "4", "--rounds", "1"),
    "test_compact_entries": ("compact_entries.py", "--photos", "2", "--small", "2",
                             "--rounds", "1"),
    "test_bench_gcs": ("bench_gcs.py", "--objects", "6", "--size", "2000", "--latency",
                       "0.001", "--threads", "4", "--listing", "40", "--repeat", "1",
                       "--skip-seed"),
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


def test_bench_scaling():
    out = run("bench_scaling.py", "--num-images", "8", timeout=600)
    for name in (r"1 replica", r"2 replicas \(Mirrored\)", r"1 worker \(MWMS\)",
                 r"2 workers \(MWMS\)"):
        has_row(out, rf"^{name} +NUM +NUM ")
    has_row(out, r"none twice: yes$")


def test_bench_service():
    out = run("bench_service.py", "--num-images", "8", "--epochs", "1", timeout=600)
    has_row(out, r"^\| float32 256x256x3 \+ label, raw \(compression=None\) \| NUM \| 1\.00x \|")
    for name in (r"Keras \(baseline, in-process\)", r"in-process \(no service\)",
                 r"service, 1 worker", r"service, 2 workers",
                 r"service, 2 workers, compression=None"):
        has_row(out, rf"^\| {name} \| NUM \(NUM\) \| NUMx \|")
    has_row(out, r"^Scaling model \(workers on machines of their own\)")


def test_ab_jpeg29(tmp_path):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(2):
        (tmp_path / f"c{c}").mkdir()
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (30, 40, 3), np.uint8)).save(
                tmp_path / f"c{c}" / f"{i}.jpg", quality=90)
    out = run("ab_jpeg29.py", str(tmp_path), "1")
    for name in ("keras", "before", "after"):
        has_row(out, rf"^\| {name} \| NUM \| NUM \| NUMx \| NUM \| NUM \| NUM \|$")
    has_row(out, r"^\| keras \| .* \| 1\.00x \|")


def test_bench_dali_png():
    out = background("test_bench_dali_png")
    has_row(out, r"^## malloc tuned: images/s")
    for k in ("libpng", "native", "wuffs"):
        has_row(out, rf"decoder='dali', {k} +NUM \(NUM-NUM\) img/s +NUM ms")
    has_row(out, r"native / DALI's libpng, best/best NUMx, per round NUM-NUMx")
    has_row(out, r"PNGs by the operator per epoch: \[8\]")


def test_bench_tf_png_op():
    out = background("test_bench_tf_png_op")
    has_row(out, r"^## malloc default: best \(range\) of 1 alternating rounds")
    for k in ("libpng", "op", "op\\+cond"):
        has_row(out, rf"decode alone in tf\.data, 2 thread\(s\), {k} +NUM img/s")
    for k in ("seed", "cpu-libpng", "cpu-native", "cpu-native-tiny"):
        has_row(out, rf"^  {k} +NUM img/s .* best / seed best NUMx")
    has_row(out, r"cpu-native / cpu-libpng \(best\) NUMx")


def test_bench_png_core():
    out = background("test_bench_png_core")
    for k in ("tf", "native", "native-into"):
        has_row(out, rf"^  {k} +NUM ms +NUM faults +NUMx +NUM img/s")
    has_row(out, r"^  tf +NUM ms +NUM faults +1\.00x")


def test_compact_entries():
    """Every form's row for both image sets, the PNG row, each entry checked exact."""
    out = background("test_compact_entries")
    for images in ("2 photos 500x375", "2 photos 32x32"):
        for form in ("none", "up", "sub"):
            for level in (1, 3):
                has_row(out, rf"^\| {images} \| {form} \+ zstd-{level} \| NUMx \| NUM \| NUM \| NUM \|$")
        has_row(out, rf"^\| {images} \| PNG, native core \| 1\.00x \| - \| NUM \| 1\.00 \|$")


def test_bench_png_fill():
    out = background("test_bench_png_fill")
    has_row(out, r"^best of 1 rounds")
    has_row(out, r"^  libpng +NUM img/s +1\.00x +NUM ms +1\.00x")
    has_row(out, r"^  native +NUM img/s +NUMx +NUM ms +NUMx +NUM flt")


def test_bench_plugin():
    out = background("test_bench_plugin")
    for handoff in ("generator", "plugin"):
        has_row(out, rf"^handoff='{handoff}' device=cpu batch=4")
    has_row(out, r"^    1 +NUM +NUM +NUM$")
    has_row(out, r"^later_ips \(img/s\) +NUM +NUM +NUM$")


def test_epoch_startup():
    out = background("test_epoch_startup")
    for decoder in ("tf", "dali"):
        has_row(out, rf"^decoder='{decoder}': listing \+ index \+ dataset NUM s")
    assert len(re.findall(r"(?m)^    1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9]+$", out)) == 2


def test_bench_gcs():
    out = background("test_bench_gcs")
    has_row(out, r"\(a\) seed .* skipped")
    for label in (r"\(b\) RemoteSource\.fetch x4 threads, cold cache",
                  r"\(c\) RemoteSource\.fetch x4 threads, warm cache",
                  r"\(d\) local folder read x4 threads"):
        has_row(out, rf"{label} +NUM +n/a +NUM")
    has_row(out, r"warm cache / local folder: NUM")
    # A tiny run may take less CPU than the clock's tick (it divided by zero once).
    has_row(out, r"cold pass CPU per object: client NUM ms, fake server NUM ms "
                 r"\(NUM cores: CPU bound (NUM|n/a) objects/s\)")
    has_row(out, r"list_objects\(\) of 40 objects: RSS NUM MiB before")


def test_bench_gcs_loader():
    out = background("test_bench_gcs_loader")
    has_row(out, r"loader, first epoch, cold cache, gs:// +NUM")
    has_row(out, r"decode-only: DALI decoders\.image, 1 threads, .* +NUM")
    has_row(out, r"first epoch / min\(decode-only, in-flight bound\) = / NUM +NUM +>=0\.8")
    has_row(out, r"warm epoch / local folder \(median of per-round ratios\) +NUM")
    has_row(out, r"list \+ index of 30 objects \(30 indexed\): RSS")


def test_bench_malloc():
    out = background("test_bench_malloc")
    for name in ("keras", "ours, before", "ours"):
        has_row(out, rf"^{name} +NUM +NUM +NUM +-?NUM$")


def test_bench_scale():
    out = background("test_bench_scale")
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
    has_row(out, r"^\| ours \| SingleDeviceEnds \| NUM \|$")


def test_bench_matrix(tmp_path):
    """The smallest cell of one kind (`--quick`): the table has its ratios and says the
    pixels are Keras's; the cell is in the JSON lines."""
    log = tmp_path / "matrix.json"
    out = run("bench_matrix.py", "--quick", "--only", "png8", "--data",
              str(tmp_path / "data"), "--out", str(log))
    has_row(out, r"^\| png8 \| 16 \| rgb \| NUM \| NUM \| NUMx( !)? \| NUM \| NUM \| NUMx( !)? "
                 r"\| same \|$")
    cells = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(c["kind"], c["count"], c["color_mode"]) for c in cells] == [("png8", 16, "rgb")]
    assert len(cells[0]["epochs"]["ours"]) >= 2
