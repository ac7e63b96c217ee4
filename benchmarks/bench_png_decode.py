"""The fast CPU PNG decoder (Wuffs) against libpng: the decode stage alone, then every path.

In one run, over the same photo-like 500x375 PNGs (the sample dataset), alternating:

1. The decode stage alone, in-memory bytes to RGB pixels, 1 and 2 threads:
   ``tf.io.decode_png`` (libpng, what Keras and the seed run) and ``png_cpu.decode_png``
   (Wuffs behind the TF-exact front end). Time per image and the ratio, per round.
2. Epochs at 244x244, batch 128, on a local folder: the seed pipeline, the CPU default with
   ``png_decoder="libpng"`` (before) and ``"wuffs"`` (after), ``decoder="dali"`` on the CPU
   with each, and the GPU-ready cache's first (filling) epoch with each (a new cache each).

Each configuration runs in its own process, with glibc's default malloc and with
``GLIBC_TUNABLES`` that keep freed memory in the process (this VM charges for fresh
memory; docs/gpu_ready.md). Prints best and range per row, and ratios to the seed and to
libpng.

    .venv/bin/python benchmarks/bench_png_decode.py [--num-images 1024] [--rounds 5]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from malloc_ab import ab_main  # noqa: E402

STAGE = ("libpng", "wuffs")
EPOCHS = ("seed", "cpu-libpng", "cpu-wuffs", "dali-libpng", "dali-wuffs")
FILLS = ("fill-libpng", "fill-wuffs")


def stage_rates(blobs: list[bytes], threads: int) -> dict[str, tuple[float, float]]:
    """(images/s, CPU ms per image) of each decoder over `blobs` on `threads` threads."""
    import tensorflow as tf

    from dali_loader.decode.png_cpu import decode_png

    fns = {"libpng": lambda b: tf.io.decode_png(b, channels=3),
           "wuffs": lambda b: decode_png(b, 3)}
    out = {}
    for name, fn in fns.items():
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fn, blobs[:8]))  # warm up
            t0, c0 = time.perf_counter(), time.process_time()
            list(pool.map(fn, blobs))
            out[name] = (len(blobs) / (time.perf_counter() - t0),
                         1e3 * (time.process_time() - c0) / len(blobs))
    return out


def feed_ceiling(root: str, n: int = 4000) -> tuple[float, float]:
    """(images/s, CPU ms per image) of the CPU default's feed alone (read, Wuffs, batch)
    over `n` tiny 8x8 PNGs: what decoding leaves, most of it Python holding the GIL,
    the ceiling of one process however many cores decode."""
    import numpy as np

    from dali_loader.api import open_index
    from dali_loader.decode.spec import ImageSpec
    from dali_loader.tfdata.dataset import make_loader
    from dali_loader.testing.pngs import encode_png

    os.makedirs(os.path.join(root, "c"), exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        with open(os.path.join(root, "c", f"{i}.png"), "wb") as f:
            f.write(encode_png(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), (1,)))
    src, index = open_index(root)
    feed = make_loader(src, index, ImageSpec(8, 8, 3, "bilinear", False, False, False),
                       batch_size=128, shuffle=True, seed=0, device="cpu", png_decoder="wuffs")
    with feed:
        for _ in feed.epoch():  # warm up
            pass
        t0, c0 = time.perf_counter(), time.process_time()
        images = sum(len(chunk.items) for chunk in feed.epoch())
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    src.close()
    return images / wall, 1e3 * cpu / images


def make_dataset(data: str, which: str, cache: str | None = None):
    from dali_loader.tools.baselines import seed_pipeline
    from tf_adapter import image_dataset_from_directory

    if which == "seed":
        return seed_pipeline(data, batch_size=128, image_size=(244, 244))[0]
    path, png = which.rsplit("-", 1)
    kw = dict(decoder="dali") if path == "dali" else {}
    if path == "fill":
        kw = dict(gpu_ready=True, cache_dir=cache)
    return image_dataset_from_directory(data, batch_size=128, image_size=(244, 244),
                                        shuffle=True, seed=1, verbose=False, png_decoder=png,
                                        **kw)


def run_one(data: str, rounds: int) -> dict:
    from dali_loader.tools.bench import timed_epoch

    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs)
    blobs = [open(p, "rb").read() for p in paths]
    out: dict = {"stage": {f"{k}-{t}": [] for k in STAGE for t in (1, 2)},
                 "epochs": {k: [] for k in EPOCHS + FILLS},
                 "cpu_ms": {k: [] for k in [f"{k}-{t}" for k in STAGE for t in (1, 2)]
                            + list(EPOCHS + FILLS)}}
    with tempfile.TemporaryDirectory(prefix="bench-png-tiny-", dir="/dev/shm"
                                     if os.path.isdir("/dev/shm") else None) as tiny:
        out["feed_ceiling"] = feed_ceiling(tiny)
    datasets = {k: make_dataset(data, k) for k in EPOCHS}
    for ds in datasets.values():  # warm up: tracing, pools, page cache
        timed_epoch("warm-up", ds, 0.0, max_batches=1)
    with tempfile.TemporaryDirectory(prefix="bench-png-fill-") as caches:
        for r in range(rounds):
            for t in (1, 2):
                for k, (rate, cpu) in stage_rates(blobs, t).items():
                    out["stage"][f"{k}-{t}"].append(rate)
                    out["cpu_ms"][f"{k}-{t}"].append(cpu)
            for k in EPOCHS + FILLS:
                if k in FILLS:  # the first epoch of a new GPU-ready cache
                    ds = make_dataset(data, k, cache=os.path.join(caches, f"{k}-{r}"))
                else:
                    ds = datasets[k]
                s = timed_epoch(k, ds, 0.0)
                out["epochs"][k].append(s.img_s)
                out["cpu_ms"][k].append(1e3 * s.cpu_s / s.images)
                if k in FILLS:
                    ds.close()
            print(f"  round {r + 1}: " + ", ".join(
                f"{k} {v[-1]:.0f} img/s {out['cpu_ms'][k][-1]:.2f} ms"
                for d in (out["stage"], out["epochs"]) for k, v in d.items()), flush=True)
    return out


def report(name: str, res: dict) -> None:
    st, ep, cpu = res["stage"], res["epochs"], res["cpu_ms"]

    def span(v):
        return f"{max(v):7.1f} ({min(v):.1f}-{max(v):.1f})"

    print(f"\n## {name}: images/s, best (range) of {len(ep['seed'])} alternating rounds; "
          "CPU ms per image (all threads), lowest")
    for t in (1, 2):
        lib, wuf = st[f"libpng-{t}"], st[f"wuffs-{t}"]
        ratios = [w / lb for w, lb in zip(wuf, lib)]
        print(f"  decode stage, {t} thread(s): libpng {span(lib)} img/s "
              f"{min(cpu[f'libpng-{t}']):.2f} ms  Wuffs {span(wuf)} img/s "
              f"{min(cpu[f'wuffs-{t}']):.2f} ms  Wuffs/libpng per round "
              f"{min(ratios):.2f}-{max(ratios):.2f}x")
    rate, ms = res["feed_ceiling"]
    print(f"  feed alone, tiny 8x8 PNGs (per-file work besides decoding): {rate:,.0f} img/s, "
          f"{ms:.3f} ms CPU per image")
    seed = max(ep["seed"])
    for k in EPOCHS + FILLS:
        print(f"  {k:<12} {span(ep[k])} img/s  {min(cpu[k]):6.2f} ms  "
              f"best / seed best {max(ep[k]) / seed:.2f}x")
    for path in ("cpu", "dali", "fill"):
        print(f"  {path}: wuffs / libpng (best) "
              f"{max(ep[path + '-wuffs']) / max(ep[path + '-libpng']):.2f}x")


def main(argv: list[str] | None = None) -> int:
    return ab_main(__file__, __doc__.split("\n")[0],
                   lambda args: run_one(args.data, args.rounds), report, argv)


if __name__ == "__main__":
    sys.exit(main())
