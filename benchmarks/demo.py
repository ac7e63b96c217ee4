"""The main job (`make demo`): the user's problem, explained and fixed, on a CPU machine.

1. Makes the embedded sample dataset (photo-like 500x375 PNGs).
2. Serves it from a loopback GCS-protocol server with 50 ms per request (a subprocess, standing in
   for the user's bucket; the real google-cloud-storage client talks to it).
3. Runs `dali-loader diagnose` on gs://: which stage bounds throughput, with numbers.
4. `dali-loader bench`: the question's pipeline verbatim, tuned tf.data and this loader, each
   feeding a synthetic 1 s step per batch of 128 (the user's GPU time; no GPU here), alternating.
5. Trains a small Keras CNN (a stand-in: the question does not show its model) for a bounded time
   with the seed's pipeline and with `tf_adapter.image_dataset_from_directory("gs://...")`.

Prints the side-by-side tables and the chart's path. About 3-4 minutes on 2 cores.

    .venv/bin/python benchmarks/demo.py [--out out/demo] [--num-images 512] [--train-seconds 45]
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
import warnings

import harness
from dali_loader.tools.bench import results_markdown, run_bench, write_results
from dali_loader.tools.diagnose import DECODER_NAMES, format_report, run_diagnose, to_json
from dali_loader.tools.sample import make_sample_dataset


def _banner(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 74 - len(text)), flush=True)


def small_cnn(num_classes: int, image_size: tuple[int, int]):
    """A small Conv2D CNN standing in for the user's (the question does not show theirs)."""
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input((*image_size, 3)),
        layers.Rescaling(1 / 255.0),
        layers.Conv2D(16, 3, strides=2, activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(32, 3, activation="relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(num_classes),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def train_time_boxed(name: str, train_ds, val_ds, num_classes: int, seconds: float,
                     image_size: tuple[int, int], num_train: int, batch_size: int = 128) -> dict:
    """`model.fit` for at most ``seconds`` (stopping after the current batch); returns stats."""
    import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.images = self.batches = 0
            self.t0 = 0.0

        def on_train_begin(self, logs=None):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1
            self.images += max(0, min(batch_size, num_train - batch * batch_size))
            if time.perf_counter() - self.t0 > seconds:
                self.model.stop_training = True

    keras.utils.set_random_seed(0)
    model = small_cnn(num_classes, image_size)
    clock = Clock()
    t0 = time.perf_counter()
    hist = model.fit(train_ds, validation_data=val_ds, epochs=100, callbacks=[clock], verbose=0)
    wall = time.perf_counter() - t0
    h = hist.history
    return {"pipeline": name, "epochs": len(h["loss"]), "batches": clock.batches,
            "images": clock.images, "wall_s": wall, "img_s": clock.images / wall,
            "loss": h["loss"][-1], "accuracy": h["accuracy"][-1],
            "val_accuracy": h.get("val_accuracy", [float("nan")])[-1]}


def _train_table(rows: list[dict]) -> str:
    lines = ["| pipeline | epochs | batches | wall (s) | images/s | loss | accuracy | "
             "val accuracy |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['pipeline']} | {r['epochs']} | {r['batches']} | {r['wall_s']:.0f} | "
                     f"{r['img_s']:.1f} | {r['loss']:.3f} | {r['accuracy']:.2f} | "
                     f"{r['val_accuracy']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, num_images=512)
    ap.add_argument("--out", default=os.path.join(harness.ROOT, "out", "demo"))
    ap.add_argument("--latency", type=float, default=0.05, help="seconds per GCS request")
    ap.add_argument("--step-time", type=float, default=1.0, help="synthetic step, s per batch")
    ap.add_argument("--train-seconds", type=float, default=45.0, help="training budget per pipeline")
    args = ap.parse_args(argv)
    # Keras warns that the seed's dataset (unknown cardinality) "ran out of data": expected.
    warnings.filterwarnings("ignore", category=UserWarning, module="keras")
    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="dali-demo-")
    size = (244, 244)

    _banner("1. sample dataset")
    data = make_sample_dataset(os.path.join(tmp.name, "data"), num_images=args.num_images,
                               num_classes=4, size=(375, 500), seed=0)
    mb = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs) / 1e6
    print(f"{args.num_images} photo-like PNGs, 500x375, 4 classes, {mb:.0f} MB in {data}")

    _banner(f"2. fake GCS bucket, {args.latency * 1000:.0f} ms per request")
    with harness.fake_gcs("--root", data, "--bucket", "b", "--prefix", "data",
                          "--latency", str(args.latency)) as (url, _):
        os.environ["STORAGE_EMULATOR_HOST"] = url
        source = "gs://b/data"
        print(f"serving {source} at STORAGE_EMULATOR_HOST={url}")

        _banner(f"3. dali-loader diagnose {source} --step-time {args.step_time:g} --batch-size 128")
        m = run_diagnose(source, step_time=args.step_time, batch_size=128, image_size=size,
                         sample=64, loader_batches=3,
                         loader_in_flight=64)
        print(format_report(m))
        with open(os.path.join(args.out, "diagnose.json"), "w") as f:
            json.dump(to_json(m), f, indent=2)

        _banner(f"4. dali-loader bench {source} --step-time {args.step_time:g}")
        res = run_bench(source, step_time=args.step_time, batch_size=128, image_size=size,
                        rounds=2, cache_dir=os.path.join(tmp.name, "bench-cache"))
        res["command"] = f"make demo  (dali-loader bench {source} --step-time {args.step_time:g})"
        paths = write_results(res, args.out)
        print(results_markdown(res))

        _banner(f"5. train a small CNN for ~{args.train_seconds:.0f} s with each pipeline")
        from dali_loader.tools.baselines import seed_pipeline
        from tf_adapter import image_dataset_from_directory

        rows = []
        num_train = args.num_images - int(args.num_images * 0.2)
        s_train, s_val = seed_pipeline(source, batch_size=128, image_size=size)
        rows.append(train_time_boxed("seed (tf.data, question verbatim)", s_train, s_val, 4,
                                     args.train_seconds, size, num_train))
        print(_train_table(rows[-1:]), flush=True)
        l_train, l_val = image_dataset_from_directory(
            source, batch_size=128, image_size=size, shuffle=True, seed=1,
            validation_split=0.2, subset="both", cache_dir=os.path.join(tmp.name, "fit-cache"))
        rows.append(train_time_boxed("dali-loader (tf_adapter, gs://)", l_train, l_val, 4,
                                     args.train_seconds, size, num_train))
        with open(os.path.join(args.out, "training.json"), "w") as f:
            json.dump(rows, f, indent=2)
        # Release the loaders (and their read-ahead threads) while the server still answers.
        del s_train, s_val, l_train, l_val
        gc.collect()
    tmp.cleanup()

    _banner("side by side")
    v = to_json(m)
    print(f"diagnose: bottleneck = {v['bottleneck']} for the seed's pipeline "
          f"({v['latency_p50_s'] * 1000:.0f} ms per object, ~{m.cores} reads in flight); "
          f"with this loader: {v['bottleneck_with_loader']} (PNG decoder: "
          f"{DECODER_NAMES[v['png_decoder']]}).\n")
    print(f"Synthetic {args.step_time:g} s step per batch of 128 (stands in for the GPU):")
    print(results_markdown(res))
    print("Training the small CNN on this CPU (the step competes with decoding for the cores):")
    print(_train_table(rows))
    print(f"\nchart: {paths['png']}\ntables: {paths['md']}, {paths['json']}")
    print(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
