"""The first benchmark: the seed pipeline vs this loader vs the decode-only bound, on local PNGs.

In one process, in alternating rounds, over the same folder at 244x244 and batch 128:

* ``seed``: the question's tf.data pipeline verbatim (its 80% training split);
* ``loader``: ``tf_adapter.image_dataset_from_directory(dir, batch_size=128, image_size=(244, 244),
  shuffle=True, seed=1)`` iterated as a ``tf.data.Dataset`` (on this CPU-only machine: the
  loader's index and I/O, TF's own decode/resize kernels);
* ``loader (decoder='dali')``: the same, decoded and resized by DALI on the CPU (the GPU path's
  graph), to show why the CPU default is TF's kernels;
* ``decode-bound``: the fastest CPU PNG decoder on all cores, no resize, of three candidates
  (tf.io.decode_png in a parallel tf.data map, Pillow in a thread pool, DALI decoders.image).

Prints images/s for each, loader/seed and loader/decode-bound.

    .venv/bin/python benchmarks/bench_local.py [--data DIR] [--num-images 600] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dali_loader.tools.baselines import list_pngs, seed_pipeline  # noqa: E402
from dali_loader.tools.bench import timed_epoch  # noqa: E402
from dali_loader.tools.sample import make_sample_dataset  # noqa: E402

CORES = os.cpu_count() or 1


def decode_tf(paths: list[str]) -> float:
    """images/s of tf.io.decode_png in a parallel map over in-memory bytes."""
    import tensorflow as tf

    blobs = [open(p, "rb").read() for p in paths]
    ds = tf.data.Dataset.from_tensor_slices(blobs).map(
        lambda b: tf.io.decode_png(b, channels=3), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False).batch(128).prefetch(tf.data.AUTOTUNE)
    for _ in ds.take(1):
        pass
    t0, n = time.perf_counter(), 0
    for x in ds:
        n += int(x.shape[0])
    return n / (time.perf_counter() - t0)


def decode_pillow(paths: list[str]) -> float:
    """images/s of Pillow decoding in a thread pool of ``CORES`` threads."""
    from PIL import Image

    blobs = [open(p, "rb").read() for p in paths]

    def dec(b: bytes):
        im = Image.open(io.BytesIO(b)).convert("RGB")
        im.load()
        return im.size

    with ThreadPoolExecutor(CORES) as pool:
        t0 = time.perf_counter()
        list(pool.map(dec, blobs))
        return len(blobs) / (time.perf_counter() - t0)


def decode_dali(paths: list[str], num_threads: int = CORES) -> float:
    """images/s of DALI's CPU decoder (readers.file + decoders.image, no resize)."""
    from nvidia.dali import fn, pipeline_def, types

    bs = 128

    @pipeline_def(batch_size=bs, num_threads=num_threads, device_id=None, prefetch_queue_depth=2)
    def pipe():
        enc, _ = fn.readers.file(files=paths, name="r", pad_last_batch=True)
        return fn.decoders.image(enc, device="cpu", output_type=types.RGB)

    p = pipe()
    p.build()
    steps = -(-len(paths) // bs)
    p.run()
    t0 = time.perf_counter()
    for _ in range(steps):
        p.run()
    dt = time.perf_counter() - t0
    del p
    return steps * bs / dt


def run_loader_epoch(data_dir: str, decoder: str | None = None):
    """The loader through the tf_adapter (same call as the Keras function)."""
    from tf_adapter import image_dataset_from_directory

    return image_dataset_from_directory(data_dir, batch_size=128, image_size=(244, 244),
                                        shuffle=True, seed=1, decoder=decoder, verbose=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None, help="PNG folder (default: a fresh sample dataset)")
    ap.add_argument("--num-images", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args(argv)

    tmp = None
    data = args.data
    if data is None:
        tmp = tempfile.TemporaryDirectory(prefix="dali-bench-local-")
        t0 = time.perf_counter()
        data = make_sample_dataset(os.path.join(tmp.name, "data"), num_images=args.num_images,
                                   num_classes=4, size=(375, 500), seed=0)
        print(f"sample dataset: {args.num_images} PNGs 500x375 in {data} "
              f"({time.perf_counter() - t0:.0f} s)")
    paths = list_pngs(data)
    seed_ds = seed_pipeline(data, batch_size=128, image_size=(244, 244))[0]
    try:
        loader_ds = run_loader_epoch(data)
        dali_ds = run_loader_epoch(data, decoder="dali")
        loader_err = None
    except Exception as exc:  # the adapter may be missing in a partial checkout
        loader_ds = dali_ds = None
        loader_err = f"{type(exc).__name__}: {exc}"
        print(f"loader not run: {loader_err}")

    decoders = {"tf.io.decode_png (tf.data map)": decode_tf,
                f"Pillow ({CORES} threads)": decode_pillow,
                "DALI decoders.image (cpu)": decode_dali}
    rates: dict[str, list[float]] = {"seed": [], "loader": [], "loader (decoder='dali')": [],
                                     **{k: [] for k in decoders}}
    for r in range(args.rounds):
        for name, ds in (("seed", seed_ds), ("loader", loader_ds),
                         ("loader (decoder='dali')", dali_ds)):
            if ds is None:
                continue
            if r == 0:  # warm up: graph tracing, thread pools, page cache
                timed_epoch(name, ds, 0.0, max_batches=1)
            s = timed_epoch(name, ds, 0.0)
            rates[name].append(s.img_s)
        for name, fn in decoders.items():
            try:
                rates[name].append(fn(paths))
            except Exception as exc:
                print(f"{name} failed: {type(exc).__name__}: {exc}")
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items() if v))

    med = {k: statistics.median(v) for k, v in rates.items() if v}
    dec = {k: v for k, v in med.items() if k in decoders}
    best = max(dec, key=dec.get)
    print(f"\n{CORES} cores, {len(paths)} PNGs, batch 128, 244x244, median of {args.rounds} "
          "alternating rounds (images/s):")
    for k, v in med.items():
        tag = "  <- decode-only bound" if k == best else ""
        print(f"  {k:<34} {v:8.1f}{tag}")
    out = {"cores": CORES, "images": len(paths), "rounds": args.rounds, "median_img_s": med,
           "all_img_s": rates, "decode_bound": best, "loader_error": loader_err}
    if "loader" in med:
        out["loader_over_seed"] = med["loader"] / med["seed"]
        out["loader_over_decode_bound"] = med["loader"] / dec[best]
        print(f"\n  loader / seed          = {out['loader_over_seed']:.2f}x")
        print(f"  loader / decode bound  = {out['loader_over_decode_bound']:.2f}")
    print(f"  seed / decode bound    = {med['seed'] / dec[best]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
