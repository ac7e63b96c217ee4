"""Per-epoch start-up cost of the loader: does it grow with the epoch number?

For each of N epochs over one dataset, for both decode paths (TF kernels, the CPU
default; DALI), prints the loader's set-up time for the epoch (epoch order,
read-ahead start, DALI pipeline build if needed), the time to the first batch,
the epoch's wall time, and how many DALI pipelines were built so far.
Nothing is re-listed or re-indexed between epochs (the index is built once).

    .venv/bin/python benchmarks/epoch_startup.py [--data DIR] [--epochs 6] [--num-images 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--num-images", type=int, default=256)
    args = ap.parse_args(argv)

    from dali_loader.tools.sample import make_sample_dataset
    from tf_adapter import image_dataset_from_directory

    with tempfile.TemporaryDirectory(prefix="dali-epochs-") as tmp:
        data = args.data or make_sample_dataset(
            os.path.join(tmp, "data"), num_images=args.num_images, num_classes=4,
            size=(375, 500), seed=0)
        for decoder in ("tf", "dali"):
            t0 = time.perf_counter()
            ds = image_dataset_from_directory(data, batch_size=128, image_size=(244, 244),
                                              seed=1, verbose=False, decoder=decoder)
            print(f"\ndecoder={decoder!r}: listing + index + dataset "
                  f"{time.perf_counter() - t0:.3f} s (once)")
            loader = ds.loader.engine
            print("epoch  setup_ms  first_batch_s  epoch_s  img/s  pipelines_built")
            for e in range(args.epochs):
                t = time.perf_counter()
                first, n = None, 0
                for x, _ in ds:
                    first = first if first is not None else time.perf_counter() - t
                    n += int(x.shape[0])
                dt = time.perf_counter() - t
                print(f"{e:5d}  {1000 * loader.epoch_setup_seconds[-1]:8.2f}  "
                      f"{first:13.3f}  {dt:7.2f}  {n / dt:5.0f}  {getattr(loader, 'pipeline_builds', 0):15d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
