"""The two DALI handoffs side by side, on one run: the DALI TF plugin against
`from_generator`.

For each handoff, over the same sample data: images/s per epoch, the epoch's
start-up (time to its first batch: the plugin builds a new DALI pipeline per
iterator, the generator takes one from its pool), the first epoch and the mean
of the later ones, and the ratios plugin / generator. Runs on the CPU
(`decoder="dali"`, the graph the GPU runs) or, with --device gpu, on a GPU.

    .venv/bin/python benchmarks/bench_plugin.py [--data DIR] [--epochs 6] [--num-images 256]
"""

from __future__ import annotations

import sys

import harness


def run(data: str, handoff: str, args) -> list[tuple[float, float, int]]:
    """Per epoch: (seconds to the first batch, epoch seconds, images)."""
    from tf_adapter import image_dataset_from_directory

    ds = image_dataset_from_directory(data, batch_size=args.batch_size, image_size=(244, 244),
                                      seed=1, verbose=False, decoder="dali",
                                      device=args.device, handoff=handoff)
    rows = []
    for _ in range(args.epochs):
        e = harness.epoch(ds)
        rows.append((e.first_batch_s, e.stats.wall_s, e.images))
    ds.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, data=True, num_images=256, epochs=6)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    args = ap.parse_args(argv)

    with harness.sample_data(args.data, args.num_images, "dali-plugin-") as data:
        results = {}
        for handoff in ("generator", "plugin"):
            results[handoff] = rows = run(data, handoff, args)
            print(f"\nhandoff={handoff!r} device={args.device} batch={args.batch_size}")
            print("epoch  first_batch_s  epoch_s  img/s")
            for e, (first, dt, n) in enumerate(rows):
                print(f"{e:5d}  {first:13.3f}  {dt:7.2f}  {n / dt:5.0f}")

    def summary(rows):
        later = rows[1:] or rows
        return dict(
            first_epoch_startup=rows[0][0],
            later_startup=sum(r[0] for r in later) / len(later),
            first_epoch_ips=rows[0][2] / rows[0][1],
            later_ips=sum(r[2] for r in later) / sum(r[1] for r in later),
        )

    g, p = summary(results["generator"]), summary(results["plugin"])
    print(f"\n{'':28s}{'generator':>11s}{'plugin':>11s}{'plugin/gen':>12s}")
    for key, unit in (("first_epoch_startup", "s"), ("later_startup", "s"),
                      ("first_epoch_ips", "img/s"), ("later_ips", "img/s")):
        print(f"{key + ' (' + unit + ')':28s}{g[key]:11.3f}{p[key]:11.3f}{p[key] / g[key]:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
