"""A tf.data service on loopback, for tests and benchmarks: a dispatcher and worker
processes started with `dali-loader serve`, each stopped (SIGTERM, then SIGKILL) on exit.

    with LoopbackService(workers=2, folder=tmp) as svc:
        ds = image_dataset_from_directory(root, service=svc.target)

Every process gets a deadline (`lifetime`): a worker or dispatcher left behind by
a crashed test kills itself when it is over (`timeout` on its command line).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time


READY = {"dispatcher": "dispatcher serving at", "worker": "worker serving at"}
_BOUND = re.compile(r"(?:dispatcher|worker) serving at \S*?:(\d+)")


class LoopbackService:
    """A dispatcher on 127.0.0.1 and `workers` worker processes.

    Attributes:
        target: "grpc://127.0.0.1:PORT", for `service=`.
    """

    def __init__(self, workers: int, folder: str, *, lifetime: float = 600.0,
                 start_timeout: float = 120.0, env: dict | None = None):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.lifetime = lifetime
        self.start_timeout = start_timeout
        self.env = dict(os.environ, CUDA_VISIBLE_DEVICES="", **(env or {}))
        # Known once the dispatcher serves: it binds port 0 and logs the port it got (no
        # port is freed here and bound later, which another process could take meanwhile).
        self.port = 0
        self.target = ""
        self.workers: dict[int, subprocess.Popen] = {}
        self._num = workers
        self._dispatcher: subprocess.Popen | None = None
        self._starts = 0

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = os.path.join(self.folder, f"{name}.log")
        cmd = ["timeout", "-s", "KILL", str(int(self.lifetime)), sys.executable, "-m",
               "dali_loader.tools.cli", "serve", *args]
        with open(log, "ab") as f:
            proc = subprocess.Popen(cmd, env=self.env, stdout=f, stderr=subprocess.STDOUT)
        proc.log_path = log
        return proc

    def _wait_ready(self, proc: subprocess.Popen, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            with open(proc.log_path, errors="replace") as f:
                if f.read().count(READY[what]) >= getattr(proc, "expected", 1):
                    return
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the {what} did not start (exit {proc.poll()}):\n{self.log_tail(proc)}")

    @staticmethod
    def _bound_port(proc: subprocess.Popen) -> int:
        """The port `proc` logged it serves on (its latest start)."""
        with open(proc.log_path, errors="replace") as f:
            return int(_BOUND.findall(f.read())[-1])

    @staticmethod
    def log_tail(proc: subprocess.Popen, lines: int = 30) -> str:
        with open(proc.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def start_worker(self, i: int, port: int | None = None) -> subprocess.Popen:
        """Starts (or restarts) worker `i` on `port` (None: one the worker's server picks);
        returns once it serves, with its port in `.port`."""
        log = os.path.join(self.folder, f"worker{i}.log")
        expected = 1
        if os.path.exists(log):
            with open(log, errors="replace") as f:
                expected = f.read().count(READY["worker"]) + 1
        proc = self._spawn(f"worker{i}", ["worker", "--dispatcher", f"127.0.0.1:{self.port}",
                                          "--host", "127.0.0.1", "--port", str(port or 0)])
        proc.expected = expected
        self.workers[i] = proc
        self._wait_ready(proc, "worker")
        proc.port = self._bound_port(proc)
        return proc

    def worker_pids(self) -> list[int]:
        """The worker servers' process ids (under their `timeout` wrappers)."""
        return [c for p in self.workers.values() for c in _children(p)]

    def kill_worker(self, i: int) -> None:
        """SIGKILLs worker `i` (no goodbye to the dispatcher)."""
        proc = self.workers[i]
        _kill_child(proc)  # the server itself; its `timeout` wrapper then exits
        proc.wait(timeout=30)

    def __enter__(self) -> LoopbackService:
        try:
            self._dispatcher = self._spawn("dispatcher", ["dispatcher", "--port", "0"])
            self._wait_ready(self._dispatcher, "dispatcher")
            self.port = self._bound_port(self._dispatcher)
            self.target = f"grpc://127.0.0.1:{self.port}"
            for i in range(self._num):
                self.start_worker(i)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> list[int]:
        """Stops every process: SIGTERM, then SIGKILL after 30 s; their exit codes."""
        procs = list(self.workers.values()) + ([self._dispatcher] if self._dispatcher else [])
        self.stop_sent = time.time()
        for p in procs:
            if p.poll() is None:
                _term_child(p)
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=30))
            except subprocess.TimeoutExpired:
                p.kill()
                _kill_child(p)
                codes.append(p.wait())
        return codes


def _children(proc: subprocess.Popen) -> list[int]:
    try:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _term_child(proc: subprocess.Popen) -> None:
    """SIGTERM to the server itself (its `timeout` wrapper then exits with its status)."""
    for pid in _children(proc) or [proc.pid]:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _kill_child(proc: subprocess.Popen) -> None:
    for pid in _children(proc):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
