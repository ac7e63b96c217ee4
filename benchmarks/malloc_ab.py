"""The malloc A/B the PNG benchmarks share: one child process per glibc malloc setting.

This VM charges for fresh memory, so each benchmark runs once with glibc's default malloc and
once with ``MALLOC_TUNABLES`` (freed memory kept in the process; docs/gpu_ready.md), each in
its own process: the script again with ``--child --data DIR --json OUT`` and its own
arguments. Imported by the scripts beside it (``benchmarks/`` is their ``sys.path[0]``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence

MALLOC_TUNABLES = ("glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=4294967296"
                   ":glibc.malloc.top_pad=268435456")
SETTINGS = ("default", "tuned")


def malloc_env(which: str) -> dict[str, str]:
    """This process's environment under malloc setting `which` ("default" or "tuned")."""
    if which not in SETTINGS:
        raise ValueError(f"which must be one of {SETTINGS}. Received: which={which!r}")
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if which == "tuned":
        env["GLIBC_TUNABLES"] = MALLOC_TUNABLES
    return env


def sample_pngs(tmp: str, data: str | None, num_images: int) -> str:
    """`data`, or a new sample dataset of `num_images` 500x375 PNGs (4 classes) under `tmp`."""
    if data is not None:
        return data
    from dali_loader.tools.sample import make_sample_dataset

    return make_sample_dataset(os.path.join(tmp, "data"), num_images=num_images,
                               num_classes=4, size=(375, 500), seed=0)


def run_children(script: str, malloc: str, data: str, tmp: str,
                 args: Sequence[str] = ()) -> dict[str, dict]:
    """Runs `script --child --data DATA --json OUT *args` once per malloc setting (`malloc`:
    "both", "default" or "tuned"); returns each child's JSON by setting."""
    results = {}
    for which in SETTINGS if malloc == "both" else (malloc,):
        out = os.path.join(tmp, f"{which}.json")
        print(f"\nmalloc: {which}", flush=True)
        subprocess.run([sys.executable, os.path.abspath(script), "--child", "--data", data,
                        "--json", out, *args], env=malloc_env(which), check=True)
        with open(out) as f:
            results[which] = json.load(f)
    return results


def ab_main(script: str, description: str, run_one: Callable[[argparse.Namespace], dict],
            report: Callable[[str, dict], None], argv: list[str] | None = None, *,
            add_args: Callable[[argparse.ArgumentParser], None] | None = None,
            child_args: Callable[[argparse.Namespace], list[str]] = lambda args: []) -> int:
    """A PNG benchmark's `main`: `--data`, `--num-images`, `--rounds`, `--malloc` and
    `--json` (and `add_args`' own); the parent makes the data and runs `script` once per
    malloc setting (`run_children`, passing `child_args(args)` on), each child runs
    `run_one(args)`; then `report(title, result)` per setting."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--data", default=None, help="PNG folder (default: a new sample dataset)")
    ap.add_argument("--num-images", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--malloc", choices=("both", *SETTINGS), default="both")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    if add_args is not None:
        add_args(ap)
    args = ap.parse_args(argv)
    if args.child:
        with open(args.json, "w") as f:
            json.dump(run_one(args), f)
        return 0
    name = os.path.splitext(os.path.basename(script))[0].replace("_", "-")
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        data = sample_pngs(tmp, args.data, args.num_images)
        print(f"{args.num_images} PNGs 500x375 in {data}; {os.cpu_count()} cores", flush=True)
        results = run_children(script, args.malloc, data, tmp,
                               ["--rounds", str(args.rounds), *child_args(args)])
        for which, res in results.items():
            report(f"malloc {which}", res)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    return 0
