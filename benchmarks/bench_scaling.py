"""CPU scaling row: input throughput and files read per input pipeline under tf.distribute.

One run of four set-ups over the same data, each in its own process(es):

  1. 1 replica   a plain dataset (no strategy)
  2. 2 replicas  MirroredStrategy over 2 logical CPU devices, PER_REPLICA input
  3. 1 worker    MultiWorkerMirroredStrategy, a 1-worker cluster on loopback
  4. 2 workers   MultiWorkerMirroredStrategy, 2 worker processes on loopback

Each iterates `image_dataset_from_directory(..., input_context=ctx)` (through
`strategy.distribute_datasets_from_function`) for one warm-up epoch, in which
every image produced is fingerprinted (to count distinct and duplicated images
across pipelines), then one timed epoch (input only, no model step). The table
gives images/s for the timed epoch (the slowest worker's wall time), and per
input pipeline the loader's files per epoch (`ds.loader.num_files`) and
the images it produced. With 2 pipelines each reads about half, none twice.
On a 2-core machine 2 workers are not expected to be faster.

    .venv/bin/python benchmarks/bench_scaling.py [--data DIR] [--num-images 256]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import harness
from support.cluster import run_and_exit, run_processes, strategy as make_strategy

GLOBAL_BATCH = 64
IMAGE_SIZE = (244, 244)
CHILD_TIMEOUT = 240  # seconds, per set-up


# --------------------------------------------------------------------- child

def child(mode: str, data: str, out: str) -> None:
    """One process of a set-up: warm-up epoch (fingerprints), timed epoch; JSON to `out`."""
    import hashlib

    from tf_adapter import image_dataset_from_directory

    strategy, options = make_strategy(mode)

    made = []

    def dataset_fn(ctx=None):
        ds = image_dataset_from_directory(
            data, image_size=IMAGE_SIZE, seed=0, verbose=False, input_context=ctx,
            batch_size=ctx.get_per_replica_batch_size(GLOBAL_BATCH) if ctx else GLOBAL_BATCH)
        made.append(ds)
        return ds

    if strategy is None:
        dist, local, replicas = dataset_fn(), (lambda x: [x]), 1
    else:
        dist = strategy.distribute_datasets_from_function(dataset_fn, options)
        local, replicas = strategy.experimental_local_results, len(strategy.extended.worker_devices)

    prints = [[] for _ in range(replicas)]  # warm-up epoch: a fingerprint per image
    for x, _ in dist:
        for r, xr in enumerate(local(x)):
            prints[r] += [hashlib.blake2b(img.tobytes(), digest_size=8).hexdigest()
                          for img in xr.numpy()]

    counts, steps = [0] * replicas, 0  # timed epoch
    t0 = time.perf_counter()
    for x, _ in dist:
        steps += 1
        for r, xr in enumerate(local(x)):
            counts[r] += int(xr.shape[0])
    seconds = time.perf_counter() - t0

    result = {
        "mode": mode, "seconds": seconds, "steps": steps, "images": counts, "prints": prints,
        "pipelines": [{"shard": list(ds.loader.shard),
                       "num_files": int(ds.loader.num_files)} for ds in made],
    }
    harness.write_json(out, result)


# -------------------------------------------------------------------- parent

def run_setup(mode: str, workers: int, data: str, tmp: str) -> list[dict]:
    """Runs one set-up's processes at once; their results, in task order."""
    return run_processes(
        lambda i, out: [sys.executable, os.path.abspath(__file__), "--child", mode, data, out],
        workers, mode, tmp, timeout=CHILD_TIMEOUT, cwd=harness.ROOT)


def summarize(name: str, results: list[dict], total: int) -> dict:
    seconds = max(r["seconds"] for r in results)
    pipelines = [p for r in results for p in r["pipelines"]]
    images = [n for r in results for n in r["images"]]
    prints = [set(ps) for r in results for ps in r["prints"]]
    union = set().union(*prints)
    produced = sum(len(ps) for ps in prints)
    return {
        "name": name, "seconds": seconds, "images_per_s": sum(images) / seconds,
        "steps": sorted({r["steps"] for r in results}),
        "num_files": [p["num_files"] for p in pipelines],
        "shards": [tuple(p["shard"]) for p in pipelines],
        "images": images, "distinct": len(union), "duplicates": produced - len(union),
        "complete": len(union) == total,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        run_and_exit(child, *argv[1:4])
    args = harness.parser(__doc__, data=True, num_images=256).parse_args(argv)

    print(harness.command_line(__file__, argv))
    print(f"cores: {os.cpu_count()}, global batch {GLOBAL_BATCH}, image_size {IMAGE_SIZE}, "
          "1 warm-up epoch + 1 timed epoch, input only (no model step), CPU")
    with harness.sample_data(args.data, args.num_images, "dali-scaling-") as data, \
            tempfile.TemporaryDirectory(prefix="dali-scaling-runs-") as tmp:
        total = sum(len(files) for _, _, files in os.walk(data))
        setups = [("1 replica", "single", 1), ("2 replicas (Mirrored)", "mirrored", 1),
                  ("1 worker (MWMS)", "multi", 1), ("2 workers (MWMS)", "multi", 2)]
        rows = []
        for name, mode, workers in setups:
            t = time.perf_counter()
            rows.append(summarize(name, run_setup(mode, workers, data, tmp), total))
            print(f"  {name}: done in {time.perf_counter() - t:.1f} s (with start-up)", flush=True)

    print(f"\n{'set-up':<22} {'epoch_s':>7} {'img/s':>6} {'steps':>5}  "
          f"{'files/epoch per pipeline':<25} {'images per pipeline':<20} {'distinct':>8} {'dup':>4}")
    for r in rows:
        print(f"{r['name']:<22} {r['seconds']:7.2f} {r['images_per_s']:6.0f} "
              f"{'/'.join(map(str, r['steps'])):>5}  {' + '.join(map(str, r['num_files'])):<25} "
              f"{' + '.join(map(str, r['images'])):<20} {r['distinct']:>5}/{total:<3} "
              f"{r['duplicates']:>3}")
    ok = all(r["complete"] and r["duplicates"] == 0 and sum(r["num_files"]) == total for r in rows)
    print("\nevery image read once per epoch across pipelines, none twice:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
