"""Per-epoch start-up cost of the loader: does it grow with the epoch number?

For each of N epochs over one dataset, for both decode paths (TF kernels, the CPU
default; DALI), prints the loader's set-up time for the epoch (epoch order,
read-ahead start, DALI pipeline build if needed), the time to the first batch,
the epoch's wall time, and how many DALI pipelines were built so far.
Nothing is re-listed or re-indexed between epochs (the index is built once).

    .venv/bin/python benchmarks/epoch_startup.py [--data DIR] [--epochs 6] [--num-images 256]
"""

from __future__ import annotations

import sys
import time

import harness


def main(argv: list[str] | None = None) -> int:
    args = harness.parser(__doc__, data=True, num_images=256, epochs=6).parse_args(argv)

    from tf_adapter import image_dataset_from_directory

    with harness.sample_data(args.data, args.num_images, "dali-epochs-") as data:
        for decoder in ("tf", "dali"):
            t0 = time.perf_counter()
            ds = image_dataset_from_directory(data, batch_size=128, image_size=(244, 244),
                                              seed=1, verbose=False, decoder=decoder)
            print(f"\ndecoder={decoder!r}: listing + index + dataset "
                  f"{time.perf_counter() - t0:.3f} s (once)")
            loader = ds.loader.engine
            print("epoch  setup_ms  first_batch_s  epoch_s  img/s  pipelines_built")
            for e in range(args.epochs):
                ep = harness.epoch(ds)
                print(f"{e:5d}  {1000 * loader.epoch_setup_seconds[-1]:8.2f}  "
                      f"{ep.first_batch_s:13.3f}  {ep.stats.wall_s:7.2f}  {ep.img_s:5.0f}  "
                      f"{getattr(loader, 'pipeline_builds', 0):15d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
