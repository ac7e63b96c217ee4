"""The native PNG core's TF op against TF's libpng: the op alone, then the CPU default.

In one process per malloc setting, over the same photo-like 500x375 PNGs (the sample
dataset), alternating in every round:

1. The decode alone, inside tf.data (no Python per image): in-memory bytes to RGB pixels
   through ``Dataset.map`` on a private pool of 1 and then 2 threads, over the sample
   dataset's PNGs (sensor noise, compression 1.67x) and over smoother photo-like PNGs
   (``support.pngs.photo``, saved by Pillow: compression about 2.2x), with
   ``tf.io.decode_png`` (libpng, what Keras and the seed run), the op alone
   (``tf_png.decode_png``) and the op behind its fallback ``tf.cond``
   (``tf_png.decode_image_like_keras``, what the dataset runs). Images/s and CPU ms per image
   (all threads of the process).
2. Epochs at 244x244, batch 128, from a local folder: the seed pipeline
   (``tools/baselines.seed_pipeline``), the CPU default with ``png_decoder="libpng"``
   (TF's decoder, the default before) and with the op (``png_decoder=None``, the default
   now). Images/s, CPU ms per image, cores busy (CPU time / wall time) and minor page
   faults per image. And the CPU default with the op over 4,000 tiny 8x8 PNGs: the per-file
   cost besides decoding.

Each malloc setting runs in its own process: glibc's default, and the ``GLIBC_TUNABLES`` of
docs/gpu_ready.md (this VM charges for fresh memory). Prints best and range per row over
the rounds, and ratios (best against best).

    .venv/bin/python benchmarks/bench_tf_png_op.py [--num-images 1024] [--rounds 5]
"""

from __future__ import annotations

import os
import sys
import tempfile

import harness

STAGE = ("libpng", "op", "op+cond")
SETS = ("sample", "photo")
EPOCHS = ("seed", "cpu-libpng", "cpu-native")
TINY = "cpu-native-tiny"


def stage_dataset(blobs: list[bytes], which: str, threads: int):
    """A tf.data pipeline decoding `blobs` to RGB with `which` on `threads` threads."""
    import tensorflow as tf

    from dali_loader.decode import tf_png

    fns = {"libpng": lambda b: tf.io.decode_png(b, channels=3),
           "op": lambda b: tf_png.decode_png(b, 3)[0],
           "op+cond": lambda b: tf_png.decode_image_like_keras(b, 3, tf)}
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = threads
    opts.autotune.enabled = False
    ds = tf.data.Dataset.from_tensor_slices(blobs).map(
        fns[which], num_parallel_calls=threads, deterministic=True)
    # Sum each image to a scalar in the graph: nothing per image reaches Python.
    ds = ds.map(lambda x: tf.reduce_sum(tf.cast(x[:1, :1], tf.int32)))
    return ds.batch(256).with_options(opts)


def measure(ds, images: int) -> dict:
    """One pass over `ds` (batches of images, or of (images, labels)): its figures."""
    e = harness.epoch(ds)
    if images is not None:
        assert e.images == images, (e.images, images)
    return {"img_s": e.img_s, "cpu_ms": e.cpu_ms, "busy": e.busy, "faults": e.faults_per_image}


def make_dataset(data: str, which: str):
    from dali_loader.tools.baselines import seed_pipeline
    from tf_adapter import image_dataset_from_directory

    if which == "seed":
        return seed_pipeline(data, batch_size=128, image_size=(244, 244))[0]
    png = {"cpu-libpng": "libpng", "cpu-native": None}[which]
    ds = image_dataset_from_directory(data, batch_size=128, image_size=(244, 244), shuffle=True,
                                      seed=1, verbose=False, png_decoder=png)
    want = {"cpu-libpng": "libpng", "cpu-native": "wuffs"}[which]
    assert ds.loader.plan.png_epoch.value == want, (which, ds.loader.plan.png_epoch)
    return ds


def run_one(data: str, rounds: int, stage_images: int, tiny: str) -> dict:
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs)
    sets = {"sample": [open(p, "rb").read() for p in paths[:stage_images]],
            "photo": harness.photo_pngs(stage_images, seed=3)}
    stage = {f"{s}:{k}-{t}": [] for s in SETS for t in (1, 2) for k in STAGE}
    epochs = {k: [] for k in EPOCHS + (TINY,)}
    datasets = {k: make_dataset(data, k) for k in EPOCHS}
    from tf_adapter import image_dataset_from_directory

    datasets[TINY] = image_dataset_from_directory(tiny, batch_size=128, image_size=(8, 8),
                                                  seed=1, verbose=False)
    tiny_n = sum(len(fs) for _, _, fs in os.walk(tiny))
    seed_images = None
    for k, ds in datasets.items():  # warm up: tracing, pools, page cache
        n = harness.epoch(ds).images
        if k == "seed":
            seed_images = n  # the seed's 80% split
        else:
            assert n == (tiny_n if k == TINY else len(paths)), (k, n)
    want = {k: seed_images if k == "seed" else tiny_n if k == TINY else len(paths)
            for k in datasets}
    for s in SETS:
        for t in (1, 2):
            for k in STAGE:
                measure(stage_dataset(sets[s], k, t), len(sets[s]))
    for r in range(rounds):
        for s in SETS:
            for t in (1, 2):
                for k in STAGE:
                    stage[f"{s}:{k}-{t}"].append(
                        measure(stage_dataset(sets[s], k, t), len(sets[s])))
        for k in datasets:
            epochs[k].append(measure(datasets[k], want[k]))
        print(f"  round {r + 1}: " + ", ".join(
            f"{k} {v[-1]['img_s']:.0f} img/s {v[-1]['cpu_ms']:.2f} ms"
            for d in (stage, epochs) for k, v in d.items()), flush=True)
    return {"stage": stage, "epochs": epochs, "files": len(paths), "stage_images": stage_images,
            "seed_images": seed_images,
            "compression": {s: 375 * 500 * 3 * len(b) / sum(map(len, b))
                            for s, b in sets.items()}}


def report(name: str, res: dict) -> None:
    st, ep = res["stage"], res["epochs"]

    def row(runs):
        rates = [r["img_s"] for r in runs]
        return (f"{max(rates):7.1f} img/s ({min(rates):.1f}-{max(rates):.1f}), CPU ms/img "
                f"{min(r['cpu_ms'] for r in runs):.2f}, cores busy "
                f"{max(r['busy'] for r in runs):.2f}, faults/img "
                f"{min(r['faults'] for r in runs):.1f}")

    print(f"\n## {name}: best (range) of {len(ep['seed'])} alternating rounds")
    for s in SETS:
        print(f"  {s} PNGs, compression {res['compression'][s]:.2f}x:")
        for t in (1, 2):
            for k in STAGE:
                print(f"    decode alone in tf.data, {t} thread(s), {k:<8} "
                      f"{row(st[f'{s}:{k}-{t}'])}")
            lib = min(r["cpu_ms"] for r in st[f"{s}:libpng-{t}"])
            for k in ("op", "op+cond"):
                runs = st[f"{s}:{k}-{t}"]
                per_round = [a["cpu_ms"] / b["cpu_ms"] for a, b in zip(st[f"{s}:libpng-{t}"],
                                                                      runs)]
                print(f"      {k}: libpng's CPU per image / its own, lowest against lowest "
                      f"{lib / min(r['cpu_ms'] for r in runs):.2f}x (per round "
                      f"{min(per_round):.2f}-{max(per_round):.2f}x)")
    seed = max(r["img_s"] for r in ep["seed"])
    seed_ms = min(r["cpu_ms"] for r in ep["seed"])
    for k in EPOCHS + (TINY,):
        print(f"  {k:<15} {row(ep[k])}  best / seed best "
              f"{max(r['img_s'] for r in ep[k]) / seed:.2f}x, seed's CPU / its CPU "
              f"{seed_ms / min(r['cpu_ms'] for r in ep[k]):.2f}x")
    native, lib = (max(r["img_s"] for r in ep[k]) for k in ("cpu-native", "cpu-libpng"))
    print(f"  cpu-native / cpu-libpng (best) {native / lib:.2f}x")


def _child(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-tf-png-op-tiny-") as tiny:
        return run_one(args.data, args.rounds, args.stage_images,
                       harness.tiny_tree(tiny, args.tiny_images))


def _add_args(ap) -> None:
    ap.add_argument("--stage-images", type=int, default=300,
                    help="images of the decode-alone rows")
    ap.add_argument("--tiny-images", type=int, default=4000,
                    help="tiny 8x8 PNGs of the per-file row (cpu-native-tiny)")


def main(argv: list[str] | None = None) -> int:
    return harness.ab_main(
        __file__, __doc__, _child, report, argv,
        add_args=_add_args,
        child_args=lambda args: ["--stage-images", str(args.stage_images),
                                 "--tiny-images", str(args.tiny_images)])


if __name__ == "__main__":
    sys.exit(main())
