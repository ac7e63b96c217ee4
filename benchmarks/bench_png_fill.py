"""The GPU-ready cache's fill (its first epoch) with each PNG decoder, side by side.

Over the same photo-like 500x375 sample PNGs (local disk, page cache warm),
`image_dataset_from_directory(gpu_ready=True)` at 244x244, batch 128, a new cache
each time; alternating rounds in one process:

- ``libpng``: ``png_decoder="libpng"`` (TF's decoder, eagerly, on the feed's threads);
- ``native``: Wuffs through the native core (`png_native`), into TF's pooled buffers
  (the default wherever the core is built);
- ``native-np``: the same into a fresh numpy array per image;
- ``pywuffs``: Wuffs through pywuffs (`png_cpu`), the fill before the core.

Prints images/s and CPU ms per image per round, then the best round of each and
its ratio to libpng. Minor page faults per image from `ru_minflt`.

    .venv/bin/python benchmarks/bench_png_fill.py [--num-images 512] [--rounds 4]
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

import harness

VARIANTS = {"libpng": ("libpng", None, None), "native": ("wuffs", True, None),
            "native-np": ("wuffs", True, lambda n: np.empty(n, np.uint8)),
            "pywuffs": ("wuffs", False, None)}


def fill_once(data: str, cache: str, variant: str):
    """(images/s, CPU ms per image, minor faults per image) of one new cache's fill."""
    import dali_loader.tfdata.dataset as dataset_module
    from dali_loader.decode import png_stage
    from tf_adapter import image_dataset_from_directory

    png, native, alloc = VARIANTS[variant]

    class Pixels(png_stage.KerasPixels):  # this variant's Wuffs binding and buffers
        def __init__(self, *args, **kwargs):
            super().__init__(*args, native=native, alloc=alloc, **kwargs)

    dataset_module.KerasPixels = Pixels
    ds = image_dataset_from_directory(data, batch_size=128, image_size=(244, 244), shuffle=True,
                                      seed=1, verbose=False, png_decoder=png, gpu_ready=True,
                                      cache_dir=cache)
    e = harness.epoch(ds, variant)
    ds.close()
    return e.img_s, e.cpu_ms, e.faults_per_image


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, data=True, num_images=512, rounds=4)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    from dali_loader.decode import png_cpu, png_native

    variants = [v for v in args.variants.split(",")
                if not (v == "pywuffs" and not png_cpu.available())
                and not (v.startswith("native") and not png_native.available())]
    with harness.sample_data(args.data, args.num_images, "bench-fill-") as data, \
            tempfile.TemporaryDirectory(prefix="bench-fill-caches-") as tmp:
        print(f"{args.num_images} PNGs 500x375 in {data}; {os.cpu_count()} cores; "
              f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(default)')}", flush=True)
        fill_once(data, os.path.join(tmp, "warm"), variants[0])  # TF start-up, page cache
        rows: dict[str, list] = {v: [] for v in variants}
        for r in range(args.rounds):
            for v in variants:
                rows[v].append(fill_once(data, os.path.join(tmp, f"{v}-{r}"), v))
            print(f"round {r}: " + ", ".join(f"{v} {x[-1][0]:.1f} img/s {x[-1][1]:.2f} ms "
                                            f"{x[-1][2]:.0f} flt" for v, x in rows.items()),
                  flush=True)
        best = {v: (max(r[0] for r in x), min(r[1] for r in x), min(r[2] for r in x))
                for v, x in rows.items()}
        print(f"best of {args.rounds} rounds: images/s (highest), CPU ms/image and minor "
              "faults/image (lowest), and the ratios to libpng's:")
        for v, (rate, ms, flt) in best.items():
            lib = best.get("libpng", (float("nan"),) * 3)
            print(f"  {v:10s} {rate:7.1f} img/s {rate / lib[0]:5.2f}x  {ms:6.2f} ms "
                  f"{lib[1] / ms:5.2f}x  {flt:6.0f} flt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
