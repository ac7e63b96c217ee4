"""What the benchmark scripts share, written once: the repository on ``sys.path``, their
common flags, sample data, the fake GCS server, the glibc malloc A/B, RSS/CPU/page-fault
probes, child processes that answer in JSON, and the timed epoch.

Scripts import it as ``import harness`` (``benchmarks/`` is their ``sys.path[0]``); the
import puts this checkout's root first on ``sys.path``, so the code timed is this
checkout's. The timed epoch is ``dali_loader.tools.bench.timed_epoch`` (what
``dali-loader bench`` runs); :func:`epoch` adds the page faults and per-image figures.
Nothing in ``dali_loader`` imports this module.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests")  # the test support (fake GCS, PNG makers): `support`
for _path in (TESTS, ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from dali_loader.tools.bench import RunStats, timed_epoch  # noqa: E402


# glibc's malloc kept from returning freed memory (this VM charges for fresh memory;
# docs/gpu_ready.md): the "tuned" side of every malloc A/B.
MALLOC_TUNABLES = ("glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=4294967296"
                   ":glibc.malloc.top_pad=268435456")
MALLOC_SETTINGS = ("default", "tuned")
SAMPLE_SIZE = (375, 500)  # (height, width) of the sample dataset's photo-like PNGs

__all__ = ["ROOT", "MALLOC_SETTINGS", "MALLOC_TUNABLES", "Epoch", "banner",
           "command_line", "cpu_seconds", "dali_decode_rate", "epoch", "fake_gcs", "malloc_env",
           "minor_faults", "parser", "rss_bytes", "run_child", "sample_data",
           "span", "status_kib", "timed_epoch", "tiny_tree", "write_json"]


# ------------------------------------------------------------------------ flags
def parser(doc: str | None, *, data: bool = False, num_images: int | None = None,
           rounds: int | None = None, epochs: int | None = None,
           json_out: bool = False) -> argparse.ArgumentParser:
    """A script's parser (its description: ``doc``'s first line) with the common flags asked
    for: ``--data`` (an image folder; default a new sample dataset), ``--num-images``,
    ``--rounds``, ``--epochs`` (with these defaults) and ``--json`` (also write the numbers)."""
    ap = argparse.ArgumentParser(description=(doc or "").strip().split("\n")[0])
    if data:
        ap.add_argument("--data", default=None,
                        help="an image folder (default: a new sample dataset)")
    for flag, default in (("--num-images", num_images), ("--rounds", rounds),
                          ("--epochs", epochs)):
        if default is not None:
            ap.add_argument(flag, type=int, default=default, help=f"(default: {default})")
    if json_out:
        ap.add_argument("--json", default=None, help="also write the numbers here")
    return ap


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """The command that ran ``script``, as the reports print it (``$ .venv/bin/python ...``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return "$ " + " ".join([os.path.relpath(sys.executable, ROOT),
                            os.path.relpath(os.path.abspath(script), ROOT), *argv])


def banner(script: str, argv: Sequence[str] | None) -> None:
    """Prints the command line, then the cores and the time (UTC)."""
    print(command_line(script, argv))
    print(f"cores: {len(os.sched_getaffinity(0))}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)


def write_json(path: str | None, obj: Any) -> None:
    """Writes ``obj`` to ``path`` as JSON (nothing when ``path`` is None)."""
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)


def span(values: Sequence[float]) -> str:
    """``best (lowest-highest)`` of rates over rounds."""
    return f"{max(values):7.1f} ({min(values):.1f}-{max(values):.1f})"


# ------------------------------------------------------------------------- data
@contextlib.contextmanager
def sample_data(data: str | None, num_images: int, prefix: str = "dali-bench-",
                num_classes: int = 4) -> Iterator[str]:
    """Yields ``data``, or a new sample dataset (``num_images`` photo-like 500x375 PNGs in
    ``num_classes`` class folders, ``dali_loader.tools.sample``) removed afterwards."""
    if data is not None:
        yield data
        return
    from dali_loader.tools.sample import make_sample_dataset

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        t = time.perf_counter()
        out = make_sample_dataset(os.path.join(tmp, "data"), num_images=num_images,
                                  num_classes=num_classes, size=SAMPLE_SIZE, seed=0)
        print(f"sample dataset: {num_images} photo-like PNGs 500x375, {num_classes} classes, "
              f"in {out} (made in {time.perf_counter() - t:.1f} s)", flush=True)
        yield out


def tiny_tree(root: str, n: int, classes: int = 1, size: int = 8) -> str:
    """``n`` tiny ``size``x``size`` RGB PNGs (16 distinct ones, up filter) in ``classes``
    folders under ``root``: decoding is nearly free, what is left is the per-file cost."""
    import numpy as np

    from support.pngs import encode_png

    rng = np.random.default_rng(0)
    blobs = [encode_png(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), (1,))
             for _ in range(16)]
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class_{c:03d}"), exist_ok=True)
    for i in range(n):
        with open(os.path.join(root, f"class_{i % classes:03d}", f"img_{i:07d}.png"), "wb") as f:
            f.write(blobs[i % len(blobs)])
    return root


# --------------------------------------------------------------------- fake GCS
@contextlib.contextmanager
def fake_gcs(*args: str) -> Iterator[tuple[str, int]]:
    """The loopback fake GCS server (``PYTHONPATH=tests python -m support.fakegcs ARGS``) in its
    own process, so that it does not share the GIL with the client; yields (endpoint, pid)."""
    proc = subprocess.Popen([sys.executable, "-m", "support.fakegcs", *args],
                            env=_child_env(), cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("FAKEGCS_URL "):
            raise RuntimeError(f"The fake GCS server did not start. Received: {line!r}")
        yield line.split()[1], proc.pid
    finally:
        proc.stdin.close()  # the server stops when its stdin closes
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------ probes
def rss_bytes() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def status_kib(field: str) -> int:
    """A KiB field of this process's /proc status: ``VmRSS`` (now), ``VmHWM`` (its peak)."""
    with open("/proc/self/status") as f:
        return int(f.read().split(field + ":")[1].split()[0])


def cpu_seconds(pids: Iterable[int] | None = None) -> float:
    """User + system CPU seconds of this process (``pids`` None), or summed over ``pids``
    (from /proc; a process that is gone counts 0)."""
    if pids is None:
        t = os.times()
        return t.user + t.system
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError):
            pass
    return total


def minor_faults() -> int:
    """Minor page faults of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# ------------------------------------------------------------------ timed epoch
@dataclasses.dataclass
class Epoch:
    """One timed epoch (``stats``: ``timed_epoch``'s) with what some reports add."""

    stats: RunStats
    faults: int  # minor page faults during the epoch

    @property
    def first_batch_s(self) -> float:
        """From the iterator's creation to the first batch."""
        return self.stats.first_batch_s

    @property
    def img_s(self) -> float:
        return self.stats.img_s

    @property
    def images(self) -> int:
        return self.stats.images

    @property
    def cpu_ms(self) -> float:
        """CPU ms per image, all threads of this process."""
        return 1e3 * self.stats.cpu_s / max(1, self.stats.images)

    @property
    def busy(self) -> float:
        """Cores busy: CPU time over wall time."""
        return self.stats.cpu_s / self.stats.wall_s if self.stats.wall_s > 0 else 0.0

    @property
    def faults_per_image(self) -> float:
        return self.faults / max(1, self.stats.images)


def epoch(data: Iterable, name: str = "epoch", max_batches: int | None = None) -> Epoch:
    """One pass over ``data`` (no step) by ``timed_epoch``, with the page faults."""
    f0 = minor_faults()
    stats = timed_epoch(name, data, 0.0, max_batches)
    return Epoch(stats, minor_faults() - f0)


def dali_decode_rate(paths: Sequence[str], num_threads: int, batch: int = 128) -> float:
    """Images/s of DALI's CPU decoder alone (``readers.file`` + ``decoders.image``, no resize)."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=num_threads, device_id=None,
                  prefetch_queue_depth=2)
    def pipe():
        enc, _ = fn.readers.file(files=list(paths), name="r", pad_last_batch=True)
        return fn.decoders.image(enc, device="cpu", output_type=types.RGB)

    p = pipe()
    p.build()
    steps = -(-len(paths) // batch)
    p.run()
    t0 = time.perf_counter()
    for _ in range(steps):
        p.run()
    dt = time.perf_counter() - t0
    del p
    return steps * batch / dt


# ------------------------------------------------------------- child processes
def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the checkout, ``tests/`` (``support``) and ``benchmarks/`` on
    PYTHONPATH, plus ``extra``."""
    path = os.pathsep.join(p for p in (ROOT, TESTS, HERE, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def run_child(args: Sequence[str], env: dict[str, str] | None = None,
              timeout: float | None = 900, base: dict[str, str] | None = None,
              quiet: bool = False) -> dict:
    """Runs ``python ARGS OUT`` in a fresh process (OUT: a new file, the last argument), in
    this environment (or ``base``) with ``env`` on top; returns the JSON it wrote to OUT,
    plus ``seconds`` (the child's wall time). Its stdout passes through unless ``quiet``.
    Raises RuntimeError with its stderr's tail."""
    fd, out = tempfile.mkstemp(suffix=".json", prefix="bench-child-")
    os.close(fd)
    try:
        start = time.perf_counter()
        full = _child_env(env) if base is None else {**base, **(env or {}),
                                                     "PYTHONPATH": _child_env()["PYTHONPATH"]}
        proc = subprocess.run([sys.executable, *args, out], env=full, cwd=ROOT, timeout=timeout,
                              stdout=subprocess.DEVNULL if quiet else None,
                              stderr=subprocess.PIPE, text=True)
        if proc.returncode:
            raise RuntimeError(f"Child process {args[:2]} failed ({proc.returncode}):\n"
                               f"{proc.stderr[-3000:]}")
        with open(out) as f:
            res = json.load(f)
        if isinstance(res, dict):
            res["seconds"] = time.perf_counter() - start
        return res
    finally:
        os.unlink(out)


# ---------------------------------------------------------------- malloc A/B
def malloc_env(which: str) -> dict[str, str]:
    """The environment changes of malloc setting ``which``: "default" (none) or "tuned"."""
    if which not in MALLOC_SETTINGS:
        raise ValueError(f"which must be one of {MALLOC_SETTINGS}. Received: which={which!r}")
    return {"GLIBC_TUNABLES": MALLOC_TUNABLES} if which == "tuned" else {}
