"""The GPU-ready cache on this machine: a cached epoch against decoding the PNGs.

One run, side by side, over the same photo-like 500x375 PNGs (local disk,
page cache warm), `image_dataset_from_directory` at 244x244, batch 128:

- the PNG decode-only bound (measured before and after the rest; the higher): TF's `decode_png` of in-memory bytes on all
  cores, nothing else (no read, no resize): what any loader that decodes the
  PNGs can reach at most here;
- per decoder (TF's kernels, the CPU default; DALI on the CPU), the loader
  without the cache, the cache's first epoch (it fills), and cached epochs;
- CPU decodes per epoch (`ds.loader.epoch_stats`) and the cache's bytes
  per image against the PNG's.

Each configuration runs in its own process, one after the other: glibc's
default malloc, and `GLIBC_TUNABLES` that keep freed memory in the process
(`MALLOC_TUNABLES` below). On this project's VM fresh memory is expensive
(docs/gcs.md): a cached epoch moves about 2.4 MB of tensors per image, and
with glibc's defaults every large buffer is a fresh `mmap`.

    .venv/bin/python benchmarks/bench_gpu_ready.py [--num-images 768] [--epochs 4] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from malloc_ab import MALLOC_TUNABLES, malloc_env  # noqa: E402


def png_decode_bound(tf, files: list[str], threads: int, rounds: int = 3) -> float:
    """Images/s of `tf.io.decode_png` alone over in-memory bytes, `threads` at once."""
    blobs = [open(f, "rb").read() for f in files]
    ds = tf.data.Dataset.from_tensor_slices(blobs).map(
        lambda b: tf.shape(tf.io.decode_png(b, channels=3))[0], num_parallel_calls=threads)
    for _ in ds:  # warm-up
        pass
    best = 0.0
    for _ in range(rounds):
        t = time.perf_counter()
        n = sum(1 for _ in ds)
        best = max(best, n / (time.perf_counter() - t))
    return best


def plain_tfdata(tf, ds, image_size, rounds: int = 2) -> float:
    """Images/s of a bare tf.data pipeline over the same cached raw entries (read,
    reshape, resize per image, batch 128): the reference for the loader's own overhead."""
    import numpy as np

    from dali_loader.decode.spec import ImageSpec
    from dali_loader.decode.tf_kernels import decode_ready_like_keras, read_item

    feed = ds.loader.engine
    table = feed.items.table
    items = [table.open(i) for i in range(len(feed.index.paths))]  # open until closed below
    try:
        files = [f"/proc/self/fd/{it.fd}" for it in items]
        offsets = np.asarray([it.offset for it in items], np.int64)
        spec = ImageSpec(*image_size)
        bare = tf.data.Dataset.from_tensor_slices((files, offsets)).map(
            lambda f, o: decode_ready_like_keras(read_item(tf, f, o), spec, tf),
            num_parallel_calls=len(os.sched_getaffinity(0))).batch(128).prefetch(2)
        return max(time_epoch(((x, None) for x in bare))[0] for _ in range(rounds))
    finally:
        for it in items:
            feed.items.release(it)


def time_epoch(ds) -> tuple[float, int]:
    t = time.perf_counter()
    n = sum(int(x.shape[0]) for x, _ in ds)
    return n / (time.perf_counter() - t), n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None, help="a folder of images (default: sample photos)")
    ap.add_argument("--num-images", type=int, default=768)
    ap.add_argument("--epochs", type=int, default=4, help="cached epochs per decoder")
    ap.add_argument("--decoders", default="tf,dali")
    ap.add_argument("--malloc", choices=("both", "default", "tuned"), default="both",
                    help="glibc malloc settings to run under, each in its own process")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.malloc == "both":
        results = {}
        for which in ("default", "tuned"):
            print(f"\n## malloc: {which}" + (f" (GLIBC_TUNABLES={MALLOC_TUNABLES})"
                                             if which == "tuned" else ""), flush=True)
            env = malloc_env(which)
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                cmd = [sys.executable, os.path.abspath(__file__), "--malloc", which,
                       "--json", out.name, "--num-images", str(args.num_images),
                       "--epochs", str(args.epochs), "--decoders", args.decoders]
                if args.data:
                    cmd += ["--data", args.data]
                subprocess.run(cmd, env=env, check=True)
                results[which] = json.load(open(out.name))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return 0

    import tensorflow as tf

    from dali_loader.decode.dali_graph import default_num_threads
    from dali_loader.tools.bench import new_cpu_decodes
    from dali_loader.tools.sample import make_sample_dataset
    from tf_adapter import image_dataset_from_directory

    threads = default_num_threads()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="dali-ready-") as tmp:
        data = args.data or make_sample_dataset(
            os.path.join(tmp, "data"), num_images=args.num_images, num_classes=4,
            size=(375, 500), seed=0)
        files = [os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs]
        png_bytes = sum(os.path.getsize(f) for f in files)
        bounds = [png_decode_bound(tf, files, threads)]
        print(f"{len(files)} images, {png_bytes / len(files) / 1024:.0f} KiB per PNG, "
              f"{threads} cores", flush=True)
        kw = dict(batch_size=128, image_size=(244, 244), seed=1, verbose=False)
        for decoder in args.decoders.split(","):
            cache_dir = os.path.join(tmp, f"cache-{decoder}")
            plain = image_dataset_from_directory(data, decoder=decoder, **kw)
            time_epoch(plain)  # warm-up: page cache, DALI pipeline build
            before = len(plain.loader.epoch_stats)
            plain_rate, _ = time_epoch(plain)
            rows.append(dict(decoder=decoder, epoch="no cache", img_s=plain_rate,
                             cpu_decodes=new_cpu_decodes(plain.loader, before)))
            ds = image_dataset_from_directory(data, decoder=decoder, gpu_ready=True,
                                              cache_dir=cache_dir, **kw)
            cache = ds.loader.engine.source.cache
            for e in range(1 + args.epochs):
                before = len(ds.loader.epoch_stats)
                rate, n = time_epoch(ds)
                rows.append(dict(decoder=decoder, epoch="first (fills)" if e == 0 else f"cached {e}",
                                 img_s=rate, cpu_decodes=new_cpu_decodes(ds.loader, before),
                                 bytes_per_png_byte=cache.stats().bytes / png_bytes))
            if decoder == "tf":
                rows.append(dict(decoder="tf.data alone", epoch="cached entries", img_s=plain_tfdata(
                    tf, ds, kw["image_size"]), cpu_decodes=0,
                    bytes_per_png_byte=cache.stats().bytes / png_bytes))
            ds.close()
            plain.close()
        bounds.append(png_decode_bound(tf, files, threads))
    # The best of a measurement before and one after: a conservative denominator.
    bound = max(bounds)
    print(f"PNG decode-only bound (tf.io.decode_png, in memory, {threads} threads): "
          f"{bound:.0f} img/s (best of {', '.join(f'{b:.0f}' for b in bounds)}: before, after)")
    print("\n| decoder | epoch | img/s | ÷ PNG decode bound | CPU decodes | cache bytes ÷ PNG |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        ratio = r.get("bytes_per_png_byte")
        print(f"| {r['decoder']} | {r['epoch']} | {r['img_s']:.0f} | {r['img_s'] / bound:.2f} | "
              f"{r['cpu_decodes']} | {'' if ratio is None else f'{ratio:.2f}'} |")
    for decoder in args.decoders.split(","):
        cached = [r["img_s"] for r in rows if r["decoder"] == decoder and r["epoch"].startswith("cached")]
        plain = next(r["img_s"] for r in rows if r["decoder"] == decoder and r["epoch"] == "no cache")
        med = statistics.median(cached)
        print(f"{decoder}: cached epochs ÷ PNG decode-only bound: best {max(cached) / bound:.2f}, "
              f"median {med / bound:.2f}; ÷ the loader without the cache: best "
              f"{max(cached) / plain:.2f}, median {med / plain:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"png_decode_bound": bound, "png_decode_bounds": bounds, "threads": threads, "images": len(files),
                       "malloc": args.malloc, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
