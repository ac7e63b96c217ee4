"""tf.distribute on one machine, for tests and benchmarks: strategies over logical CPU
devices, and worker processes of a MultiWorkerMirroredStrategy on loopback.

`strategy(mode)` runs inside a worker process; `run_processes` starts them
(TF_CONFIG for "multi", free loopback ports, a deadline, every process killed
in the end) and returns each one's JSON result.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence

MODES = ("single", "mirrored", "multi")


def strategy(mode: str):
    """`(strategy or None, InputOptions or None)` for a worker process.

    "single": no strategy; "mirrored": MirroredStrategy over 2 logical CPU
    devices with per-replica input; "multi": MultiWorkerMirroredStrategy from
    TF_CONFIG. Call it before TF is otherwise initialised in the process.
    """
    import tensorflow as tf

    if mode == "single":
        return None, None
    if mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        return (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
                tf.distribute.InputOptions(
                    experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA))
    if mode == "multi":
        return tf.distribute.MultiWorkerMirroredStrategy(), None
    raise ValueError(f"`mode` must be one of {MODES}. Received: mode={mode!r}")


def free_ports(n: int) -> list[int]:
    """`n` free TCP ports on 127.0.0.1."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_processes(argv: Callable[[int, str], Sequence[str]], num: int, mode: str, folder: str,
                  *, timeout: float, cwd: str | None = None) -> list[dict]:
    """Runs `num` processes at once, `argv(task, out_path)` each, on the CPU; with
    mode "multi" as the workers of one cluster on loopback. Returns their JSON
    results in task order.

    Raises:
        RuntimeError: a process failed or wrote no result (with its log's tail).
    """
    ports = free_ports(num)
    procs, outs, logs = [], [], []
    try:
        for i in range(num):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
            env.pop("TF_CONFIG", None)
            if mode == "multi":
                env["TF_CONFIG"] = json.dumps({
                    "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                    "task": {"type": "worker", "index": i}})
            outs.append(os.path.join(folder, f"{mode}{num}-{i}.json"))
            logs.append(os.path.join(folder, f"{mode}{num}-{i}.log"))
            with open(logs[-1], "wb") as log:
                procs.append(subprocess.Popen(list(argv(i, outs[-1])), cwd=cwd, env=env,
                                              stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, out, log in zip(procs, outs, logs):
        if p.returncode != 0 or not os.path.exists(out):
            with open(log, errors="replace") as f:
                tail = "".join(f.readlines()[-40:])
            raise RuntimeError(f"{mode} process failed (exit {p.returncode}):\n{tail}")
        with open(out) as f:
            results.append(json.load(f))
    return results


def run_and_exit(main: Callable[..., None], *args) -> None:
    """Runs a worker's `main(*args)` and exits the process at once: 0, or 1 with
    the traceback printed. Skips interpreter teardown, where a
    MultiWorkerMirroredStrategy worker can block on its peers' coordination
    service once the work is done."""
    import sys
    import traceback

    try:
        main(*args)
        code = 0
    except BaseException:  # noqa: BLE001 - printed; the exit status says it
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
