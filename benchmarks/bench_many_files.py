"""Scale benchmark: construction, first batch, epoch start, feed ceiling and memory per file
at 10k-300k local files, and gs:// listing of 100k objects (issue 23).

Local: N tiny 8x8 PNGs in 100 class folders on tmpfs (/dev/shm), so that decoding is
nearly free and what is left is each loader's own cost. Each loader runs in a fresh
process: keras.utils.image_dataset_from_directory, this project's CPU default, and this
project with the GPU-ready cache (`gpu_ready=True`: one filling epoch, then cached epochs).
Per process: construction time, first batch, the start of a later epoch (iterator to
first batch), the feed ceiling of a whole later epoch (images/s, and process CPU ms per
image: both cores' time), and resident memory per file after construction and after
each epoch (RSS growth over the process's baseline with TF imported, divided by N).
Then CPU per image again, the three loaders in turn in one process over several rounds
(best and median), under glibc's default malloc and a tuned one, each in its own process.

gs://: the fake GCS server (`support.fakegcs`) in its own process, 100k
objects in 100 class prefixes, 1000 per page, at 0, 20 and 50 ms per request. Per
latency, in fresh processes: a bare sequential `list_blobs(page_size=1000)`; this
project's listing alone (`RemoteSource.list_objects`, client CPU per object); the first
`image_dataset_from_directory` (lists, writes the manifest); and a new process's
construction from the manifest.

    .venv/bin/python benchmarks/bench_many_files.py                       # everything (~15 min on 2 cores)
    .venv/bin/python benchmarks/bench_many_files.py --sizes 10000 --no-gcs   # a quick look
    .venv/bin/python benchmarks/bench_many_files.py --no-local --no-gcs      # CPU per image only
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

import harness

CLASSES = 100
BATCH = 128
CHILD_TIMEOUT = 900


def settled_rss() -> int:
    """Resident bytes after a garbage collection."""
    import gc

    gc.collect()
    return harness.rss_bytes()


# ---------------------------------------------------------------------- children
def child_local(kind: str, n: int, data: str, cache: str, out: str) -> None:
    """One loader over the local tree: construction, first batch, epochs."""
    import tensorflow as tf  # noqa: F401 - imported before the baseline

    import keras

    from tf_adapter import image_dataset_from_directory as ours

    kw = dict(image_size=(8, 8), batch_size=BATCH, seed=0, verbose=False)
    base = settled_rss()
    t = time.perf_counter()
    if kind == "keras":
        ds = keras.utils.image_dataset_from_directory(data, **kw)
    elif kind == "ours":
        ds = ours(data, **kw)
    else:
        ds = ours(data, gpu_ready=True, cache_dir=cache, **kw)
    res = {"kind": kind, "n": n, "construct_s": time.perf_counter() - t}
    res["bytes_per_file_built"] = (settled_rss() - base) / n
    epochs = []
    for _ in range(3 if kind == "ours_ready" else 2):
        e = harness.epoch(ds, kind)
        epochs.append({"first_batch_s": e.first_batch_s, "img_s": e.img_s, "cpu_ms_img": e.cpu_ms,
                       "images": e.images, "bytes_per_file": (settled_rss() - base) / n})
    res["epochs"] = epochs
    harness.write_json(out, res)


def child_turns(n: int, data: str, cache: str, rounds: int, out: str) -> None:
    """CPU per image of whole epochs, the loaders in turn in one process (the VM's
    state moves between processes and over minutes: compare within a round)."""
    import tensorflow as tf  # noqa: F401

    import keras

    from tf_adapter import image_dataset_from_directory as ours

    kw = dict(image_size=(8, 8), batch_size=BATCH, seed=0, verbose=False)
    loaders = {"keras": keras.utils.image_dataset_from_directory(data, **kw),
               "ours": ours(data, **kw),
               "ours_ready": ours(data, gpu_ready=True, cache_dir=cache, **kw)}
    for ds in loaders.values():  # warm: graphs traced, the cache filled
        harness.epoch(ds)
    cpu_ms: dict[str, list[float]] = {k: [] for k in loaders}
    for _ in range(rounds):
        for kind, ds in loaders.items():
            e = harness.epoch(ds, kind)
            assert e.images == n, (kind, e.images)
            cpu_ms[kind].append(e.cpu_ms)
    harness.write_json(out, cpu_ms)


def child_gcs(kind: str, url: str, cache: str, out: str) -> None:
    """One listing of the fake server's bucket (STORAGE_EMULATOR_HOST is set)."""
    import tensorflow as tf  # noqa: F401 - imported before timing

    from dali_loader.storage.gcs import make_client
    from dali_loader.storage.remote import open_remote
    from tf_adapter import image_dataset_from_directory as ours

    bucket, _, prefix = url[len("gs://"):].partition("/")
    client = make_client()
    next(iter(client.list_blobs(bucket, max_results=1)), None)  # connect, authorise
    t, c = time.perf_counter(), harness.cpu_seconds()
    if kind == "list_blobs":
        n = sum(1 for _ in client.list_blobs(bucket, prefix=prefix + "/", page_size=1000))
    elif kind == "ours_list":
        with open_remote(url, cache_dir=cache) as src:
            n = len(src.list_objects(manifest="off"))
    else:
        ds = ours(url, image_size=(8, 8), verbose=False, cache_dir=cache,
                  manifest="refresh" if kind == "ours_first" else "use")
        n = len(ds.file_paths)
    wall, used = time.perf_counter() - t, harness.cpu_seconds() - c
    harness.write_json(out, {"kind": kind, "objects": n, "s": wall,
                             "cpu_us_obj": 1e6 * used / max(n, 1)})


def run_child(args: list[str], env: dict | None = None) -> dict:
    """This script's ``--child ARGS OUT`` in a fresh process; the JSON it wrote."""
    return harness.run_child([os.path.abspath(__file__), "--child", *args], env,
                             timeout=CHILD_TIMEOUT)


# ------------------------------------------------------------------------ parent
def bench_local(sizes: list[int], base: str) -> None:
    print(f"\n## Local: tiny 8x8 PNGs on tmpfs, {CLASSES} classes, batch {BATCH}; fresh process per loader")
    print(f"{'N':>7} {'loader':<11} {'build_s':>7} {'1st_b_s':>7} {'start_s':>7} {'img/s':>7} "
          f"{'cpu_ms':>7} {'B/file':>7} {'B/file after epochs':<24}")
    for n in sizes:
        data, cache = os.path.join(base, f"data{n}"), os.path.join(base, f"cache{n}")
        t = time.perf_counter()
        harness.tiny_tree(data, n, CLASSES)
        print(f"  (made {n} files in {time.perf_counter() - t:.1f} s)", flush=True)
        rows = {}
        for kind in ("keras", "ours", "ours_ready"):
            r = rows[kind] = run_child(["local", kind, str(n), data, cache])
            last = r["epochs"][-1]
            print(f"{n:>7} {kind:<11} {r['construct_s']:7.2f} {r['epochs'][0]['first_batch_s']:7.3f} "
                  f"{last['first_batch_s']:7.3f} {last['img_s']:7.0f} {last['cpu_ms_img']:7.3f} "
                  f"{r['bytes_per_file_built']:7.0f} "
                  f"{' / '.join(format(e['bytes_per_file'], '.0f') for e in r['epochs']):<24}", flush=True)
        k, o, g = rows["keras"], rows["ours"], rows["ours_ready"]
        print(f"{n:>7} ratios: construction ours/keras {o['construct_s'] / k['construct_s']:.2f}; CPU per image "
              f"ours/keras {o['epochs'][-1]['cpu_ms_img'] / k['epochs'][-1]['cpu_ms_img']:.2f}, cached "
              f"gpu_ready/keras {g['epochs'][-1]['cpu_ms_img'] / k['epochs'][-1]['cpu_ms_img']:.2f}", flush=True)
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


def bench_turns(n: int, rounds: int, base: str) -> None:
    """Issue 23's per-file target (CPU default and cached GPU-ready epochs within 1.5x of
    Keras's CPU per image), the loaders in turn, under glibc's default malloc and the tuned
    one (on this VM fresh memory is expensive; its cost hides the loaders' own)."""
    print(f"\n## CPU per image in turn: {n} tiny PNGs, {rounds} rounds of whole epochs per loader, "
          "one process per malloc setting")
    data, cache = os.path.join(base, f"turns{n}"), os.path.join(base, f"turns_cache{n}")
    harness.tiny_tree(data, n, CLASSES)
    try:
        for which in harness.MALLOC_SETTINGS:
            shutil.rmtree(cache, ignore_errors=True)
            ms = run_child(["turns", str(n), data, cache, str(rounds)], harness.malloc_env(which))
            ms.pop("seconds")
            kmin, kmed = min(ms["keras"]), statistics.median(ms["keras"])
            for kind, v in ms.items():
                print(f"  malloc {which:<7} {kind:<10} CPU ms/img {' '.join(f'{x:.3f}' for x in v)}; "
                      f"best {min(v):.3f} ({min(v) / kmin:.2f}x Keras's best), median "
                      f"{statistics.median(v):.3f} ({statistics.median(v) / kmed:.2f}x)", flush=True)
    finally:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


def bench_gcs(objects: int, latencies: list[float], base: str) -> None:
    print(f"\n## gs://: {objects} objects in {CLASSES} prefixes, 1000 per page, fake server in its own process")
    print(f"{'latency':>7} {'list_blobs_s':>12} {'ours_list_s':>11} {'first_build_s':>13} {'manifest_s':>10} "
          f"{'first/bare':>10} {'cpu_us/obj bare':>15} {'ours':>6}")
    for lat in latencies:
        with harness.fake_gcs("--synthetic", str(objects), "--classes", str(CLASSES),
                              "--latency", str(lat)) as (endpoint, _):
            env = {"STORAGE_EMULATOR_HOST": endpoint}
            cache = os.path.join(base, f"gcs-cache-{lat}")
            url = "gs://b/synthetic"
            r = {k: run_child(["gcs", k, url, cache], env) for k in
                 ("list_blobs", "ours_list", "ours_first", "ours_manifest")}
            assert len({v["objects"] for v in r.values()}) == 1, r
            bare = r["list_blobs"]["s"]
            print(f"{lat * 1e3:5.0f}ms {bare:12.2f} {r['ours_list']['s']:11.2f} {r['ours_first']['s']:13.2f} "
                  f"{r['ours_manifest']['s']:10.2f} {r['ours_first']['s'] / bare:10.2f} "
                  f"{r['list_blobs']['cpu_us_obj']:15.1f} {r['ours_list']['cpu_us_obj']:6.1f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        if argv[1] == "local":
            child_local(argv[2], int(argv[3]), *argv[4:7])
        elif argv[1] == "turns":
            child_turns(int(argv[2]), argv[3], argv[4], int(argv[5]), argv[6])
        else:
            child_gcs(*argv[2:6])
        return 0
    ap = harness.parser(__doc__, rounds=5)
    ap.add_argument("--sizes", default="10000,100000,300000", help="local file counts")
    ap.add_argument("--objects", type=int, default=100_000, help="gs:// objects")
    ap.add_argument("--latencies", default="0,0.02,0.05", help="seconds per request")
    ap.add_argument("--turns-n", type=int, default=10_000,
                    help="files for the in-turn CPU-per-image comparison (0: skip it)")
    ap.add_argument("--no-local", action="store_true")
    ap.add_argument("--no-gcs", action="store_true")
    ap.add_argument("--tmp", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = ap.parse_args(argv)
    harness.banner(__file__, argv)
    base = tempfile.mkdtemp(prefix="dali-scale-", dir=args.tmp)
    try:
        if not args.no_local:
            bench_local([int(s) for s in args.sizes.split(",")], base)
        if args.turns_n:
            bench_turns(args.turns_n, args.rounds, base)
        if not args.no_gcs:
            bench_gcs(args.objects, [float(x) for x in args.latencies.split(",")], base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
