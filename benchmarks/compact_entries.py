"""The compact GPU-ready entry form (issue 38): size and native decode time per filter and level.

On photo-like sample PNGs (`dali_loader.tools.sample`, 500x375 by default) and on small
ones (32x32), each image's Keras pixels (the native PNG core, channels=3) are written as
compact entries (`formats.compact.encode`: filter none / up / sub, zstd level 1 or 3,
64 KiB chunks) and measured:

- bytes / PNG bytes (sums over the images; raw entries for comparison),
- encode ms per image (native core, one thread),
- decode ms per image (native core, `compact.decode_into` a reused buffer, one thread),
  and the same for the native PNG decode (`png_native.decode_png_into`), with their ratio.

Times are the best of `--rounds` passes, interleaved per round. Every entry is checked
to decode to the exact pixels.

With `--epochs DIR` (a folder of images, e.g. `dali-loader bench`'s sample), it times
instead whole epochs of `image_dataset_from_directory` (244x244, batch 128) through the
GPU-ready cache, compact entries (`gpu_ready=True`) against raw ones (`gpu_ready="raw"`),
on TF's kernels and on DALI (`decoder="dali"`): the filling epoch, then `--rounds`
alternating cached epochs each (median and best img/s), and the cache's bytes.

    .venv/bin/python benchmarks/compact_entries.py [--photos 96] [--small 512] [--rounds 5]
    .venv/bin/python benchmarks/compact_entries.py --epochs DIR [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from dali_loader.decode import png_native
from dali_loader.formats import compact
from dali_loader.tools.sample import make_sample_dataset

FORMS = [(f, lvl) for f in (compact.FILTER_NONE, compact.FILTER_UP, compact.FILTER_SUB)
         for lvl in (1, 3)]
NAMES = {compact.FILTER_NONE: "none", compact.FILTER_UP: "up", compact.FILTER_SUB: "sub"}


def _pngs(root: str, n: int, size: tuple[int, int]) -> list[bytes]:
    make_sample_dataset(root, num_images=n, num_classes=1, size=size, seed=1, num_workers=1)
    return [p.read_bytes() for p in sorted(Path(root).rglob("*.png"))]


def _best(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(label: str, pngs: list[bytes], rounds: int) -> list[str]:
    """One table (markdown rows) for one image set."""
    pixels = [png_native.decode_png(d, 3) for d in pngs]
    plans = [png_native.plan_png(d, 3) for d in pngs]
    out = np.empty(max(p.nbytes for p in pixels), np.uint8)
    png_bytes = sum(map(len, pngs))
    n = len(pngs)

    def png_pass():
        for d, p in zip(pngs, plans):
            png_native.decode_png_into(d, p, out[:p.nbytes])

    rows = []
    raw = sum(p.nbytes + 16 for p in pixels)
    rows.append(f"| {label} | raw | {raw / png_bytes:.2f}x | - | - | - |")
    t_png = _best(png_pass, rounds) / n
    for filt, level in FORMS:
        t0 = time.perf_counter()
        entries = [compact.encode(p, filt, level) for p in pixels]
        t_enc = (time.perf_counter() - t0) / n
        for e, p in zip(entries, pixels):
            assert np.array_equal(compact.decode(e), p)

        def entry_pass(entries=entries):
            for e, p in zip(entries, pixels):
                compact.decode_into(e, out[:p.nbytes])

        t_dec = min(_best(entry_pass, 1) for _ in range(rounds)) / n
        size = sum(map(len, entries))
        rows.append(f"| {label} | {NAMES[filt]} + zstd-{level} | {size / png_bytes:.2f}x | "
                    f"{t_enc * 1e3:.2f} | {t_dec * 1e3:.3f} | {t_dec / t_png:.2f} |")
    rows.append(f"| {label} | PNG, native core | 1.00x | - | {t_png * 1e3:.3f} | 1.00 |")
    return rows


def _epoch(ds) -> float:
    t0 = time.perf_counter()
    n = sum(int(x.shape[0]) for x, _ in ds)
    return n / (time.perf_counter() - t0)


def epochs(root: str, rounds: int) -> list[str]:
    """Filling and cached epochs, compact against raw entries, on both paths (markdown rows)."""
    import statistics

    from tf_adapter import image_dataset_from_directory

    rows, sets = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for decoder in ("tf", "dali"):
            for form in (True, "raw"):
                cache = os.path.join(tmp, f"{decoder}-{form}")
                ds = image_dataset_from_directory(root, image_size=(244, 244), batch_size=128,
                                                  decoder=decoder, gpu_ready=form,
                                                  cache_dir=cache, verbose=False)
                sets[decoder, form] = (ds, _epoch(ds), cache)
        times = {k: [] for k in sets}
        for _ in range(rounds):
            for k, (ds, _, _) in sets.items():
                times[k].append(_epoch(ds))
        src = sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())
        for (decoder, form), (ds, fill, cache) in sets.items():
            size = sum(p.stat().st_size for p in Path(cache).rglob("*") if p.is_file())
            rows.append(f"| {decoder} | {'compact' if form is True else 'raw'} | {fill:.0f} | "
                        f"{statistics.median(times[decoder, form]):.0f} | "
                        f"{max(times[decoder, form]):.0f} | {size / src:.2f}x |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=96)
    parser.add_argument("--small", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", metavar="DIR", help="time epochs over this image folder")
    args = parser.parse_args()
    if args.epochs:
        print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
              f"{os.cpu_count()} cores, {args.epochs}, img/s")
        print("| decoder | entries | filling epoch | cached, median | cached, best | cache / source |")
        print("|---|---|---:|---:|---:|---:|")
        print("\n".join(epochs(args.epochs, args.rounds)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        sets = [(f"{args.photos} photos 500x375", _pngs(os.path.join(tmp, "p"), args.photos,
                                                        (375, 500))),
                (f"{args.small} photos 32x32", _pngs(os.path.join(tmp, "s"), args.small, (32, 32)))]
        print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
              f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, one thread")
        print("| images | form | size / PNG | encode ms | decode ms | decode / PNG decode |")
        print("|---|---|---:|---:|---:|---:|")
        for label, pngs in sets:
            print("\n".join(measure(label, pngs, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
