"""One process of the tf.distribute tests in test_multiworker.py (not a test module).

    python tests/multiworker_worker.py multi ID_TREE OUT.json      # a MultiWorkerMirroredStrategy
                                                                   # worker; TF_CONFIG set by the caller
    python tests/multiworker_worker.py mirrored ID_TREE OUT.json   # MirroredStrategy, 2 logical CPUs

Over the `id_tree` fixture (file id = red channel / 10), with
`strategy.distribute_datasets_from_function(...)`:

* "even": global batch 8 (23 files = 6 batches, 3 per pipeline): iterates 2
  epochs recording the ids each local replica saw and the steps per epoch, then
  `model.fit`s a tiny model for 2 epochs ("mirrored" also iterates a second
  distributed dataset built with the same seed: determinism);
* "uneven": global batch 10 (5 batches: 3 for pipeline 0, 2 for pipeline 1, so
  one replica gets an empty batch in the last step): 1 epoch, then 1 `fit` epoch.

The results go to OUT.json (rewritten after each part, so a later failure
leaves the earlier parts); an exception in the uneven `fit` is recorded there.

Keras 3 (3.15.1 here) cannot `fit` under a MultiWorkerMirroredStrategy of more
than one worker, whatever the dataset: `fit` first calls `strategy.reduce`
on the nested first batch, which CollectiveAllReduceStrategy cannot take
("Attempt to convert a value (PerReplica...) ... to a Tensor"; also with a plain
`tf.data.Dataset`, keras-team/keras#20585); and each step's logs are then
averaged with `strategy.reduce("MEAN", loss, axis=0)`, which fails on the
scalar loss ("Invalid reduction dimension 0 for input with 0 dimensions").
In "multi" mode `_keras_multiworker_workarounds` builds the model from this
worker's first local batch and averages the logs with axis=None; the training
steps themselves stay Keras's own.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

SEED = 5


def run_epochs(strategy, dist, epochs: int) -> list[dict]:
    """Per epoch: the ids per local replica (in the order read) and the steps run."""
    out = []
    for _ in range(epochs):
        ids = [[] for _ in strategy.extended.worker_devices]
        steps = 0
        for x, _y in dist:
            steps += 1
            for r, xr in enumerate(strategy.experimental_local_results(x)):
                ids[r] += [int(round(float(v) / 10)) for v in xr.numpy()[:, 0, 0, 0]]
        out.append({"ids": ids, "steps": steps})
    return out


def _keras_multiworker_workarounds(model, strategy) -> None:
    """Works around the two Keras 3 bugs that stop any `fit` under a
    MultiWorkerMirroredStrategy of more than one worker (module docstring)."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as tf_trainer

    def build(iterator=None, data_batch=None):  # 1. build from a local batch
        if iterator is not None:
            for _, _, it in iterator:
                batch = next(it)
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0], batch)
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = build

    original = tf_trainer.reduce_per_replica
    if getattr(original, "_scalar_mean", False):
        return

    def reduce_per_replica(values, strategy, reduction):  # 2. mean of scalars: axis=None
        if reduction in ("auto", "mean") and tf_trainer._collective_all_reduce_multi_worker(strategy):
            return tf.nest.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None)
                if isinstance(v, tf.distribute.DistributedValues) else v, values)
        return original(values, strategy, reduction)

    reduce_per_replica._scalar_mean = True
    tf_trainer.reduce_per_replica = reduce_per_replica


def main(mode: str, id_tree: str, out_path: str) -> None:
    import numpy as np

    from support.cluster import strategy as make_strategy

    if mode not in ("mirrored", "multi"):
        raise SystemExit(f"unknown mode {mode!r}")
    strategy, options = make_strategy(mode)

    import keras

    from tf_adapter import image_dataset_from_directory

    def distribute(global_batch, seed=SEED):
        made = []

        def dataset_fn(ctx):
            ds = image_dataset_from_directory(
                id_tree, label_mode="int", image_size=(8, 8),
                batch_size=ctx.get_per_replica_batch_size(global_batch), seed=seed,
                input_context=ctx, verbose=False)
            made.append(ds)
            return ds

        return strategy.distribute_datasets_from_function(dataset_fn, options), made

    def loaders(made):
        return [{"shard": list(ds.loader.shard), "num_files": int(ds.loader.num_files),
                 "epochs_started": int(ds.loader.epochs_started)} for ds in made]

    def fit(dist, epochs):
        with strategy.scope():
            model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                                      keras.layers.Dense(2)])
            model.compile(optimizer="sgd",
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if mode == "multi":
            _keras_multiworker_workarounds(model, strategy)
        losses = [float(v) for v in model.fit(dist, epochs=epochs, verbose=0).history["loss"]]
        return losses, bool(np.all(np.isfinite(losses)))

    def dump():
        with open(out_path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(out_path + ".tmp", out_path)

    result = {"mode": mode, "replicas": strategy.num_replicas_in_sync,
              "keras_workarounds": mode == "multi"}
    dist, made = distribute(8)
    even = result["even"] = {"global_batch": 8, "cardinality": int(dist.cardinality)}
    even["epochs"] = run_epochs(strategy, dist, 2)
    even["loaders"] = loaders(made)
    if mode == "mirrored":  # same seed, a fresh distributed dataset: the same lists
        again, _ = distribute(8)
        even["again"] = run_epochs(strategy, again, 2)
    even["losses"], even["losses_finite"] = fit(dist, 2)
    dump()

    dist, made = distribute(10)
    uneven = result["uneven"] = {"global_batch": 10, "cardinality": int(dist.cardinality)}
    uneven["epochs"] = run_epochs(strategy, dist, 1)
    uneven["loaders"] = loaders(made)
    dump()
    try:
        uneven["losses"], uneven["losses_finite"] = fit(dist, 1)
    except Exception as e:  # noqa: BLE001 - recorded for the test to report
        msg = " ".join(str(e).split())
        at = max(0, msg.find("Collective ops is aborted by"))  # past TF's traceback, if any
        uneven["fit_error"] = f"{type(e).__name__}: {msg[at:at + 400]}"
    dump()


if __name__ == "__main__":
    from support.cluster import run_and_exit

    run_and_exit(main, *sys.argv[1:4])
