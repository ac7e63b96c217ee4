"""Keras scripts run unchanged on every path: after any tf.data transformation the
dataset means what Keras's own means (cardinality, every image once, labels with
their images), and a tutorial-style training script runs with the right step
counts and no warning.

Every path that runs on the CPU: TF's kernels, and DALI (the GPU path's graph)
through each handoff, each with and without the GPU-ready cache. Each chain is
applied to `keras.utils.image_dataset_from_directory` on the same folder too,
and the two are compared.
"""

from __future__ import annotations

import collections
import logging
import warnings

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from support.helpers import batch_counter  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

PATHS = {
    "tf": dict(decoder="tf"),  # TF decodes in the graph (audited)
    "tf-wuffs": dict(decoder="tf", png_decoder="wuffs"),  # the native core's TF op in the graph
    "dali-wuffs": dict(decoder="dali", handoff="plugin", png_decoder="wuffs"),
    "tf-cached": dict(decoder="tf", gpu_ready=True),
    "dali-generator": dict(decoder="dali", handoff="generator"),
    "dali-generator-cached": dict(decoder="dali", handoff="generator", gpu_ready=True),
    "dali-plugin": dict(decoder="dali", handoff="plugin"),
    "dali-plugin-cached": dict(decoder="dali", handoff="plugin", gpu_ready=True),
}
# On a machine where TF and DALI see a GPU (make gpu-check-tf), the GPU paths too.
if tf.config.list_physical_devices("GPU"):
    from dali_loader.decode.devices import dali_gpu_count

    if dali_gpu_count():
        PATHS.update({"gpu-default": dict(device="gpu"),
                      "gpu-cached": dict(device="gpu", gpu_ready=True),
                      "gpu-generator": dict(device="gpu", handoff="generator")})
KW = dict(image_size=(8, 8), batch_size=5, shuffle=False, verbose=False)  # 23 files: 5 batches


def _options():
    opts = tf.data.Options()
    opts.experimental_optimization.map_parallelization = True
    opts.deterministic = False
    return opts


CHAINS = {
    "as returned": lambda ds: ds,
    "map": lambda ds: ds.map(lambda x, y: (x * 2.0, y), num_parallel_calls=tf.data.AUTOTUNE),
    "prefetch": lambda ds: ds.prefetch(tf.data.AUTOTUNE),
    "cache": lambda ds: ds.cache(),
    "shuffle": lambda ds: ds.shuffle(8, seed=1),
    "take": lambda ds: ds.take(2),
    "skip": lambda ds: ds.skip(1),
    "filter": lambda ds: ds.filter(lambda x, y: tf.reduce_all(y >= 0)),
    "with_options": lambda ds: ds.with_options(_options()),
    "ignore_errors": lambda ds: ds.ignore_errors(),
    "unbatch-batch": lambda ds: ds.unbatch().batch(7),
    "repeat(2)": lambda ds: ds.repeat(2),
    "zip": lambda ds: tf.data.Dataset.zip((ds, tf.data.Dataset.range(100))).map(
        lambda xy, i: xy),
    "concatenate": lambda ds: ds.concatenate(ds),
    "map-prefetch-cache": lambda ds: ds.map(lambda x, y: (x + 1.0, y)).cache().prefetch(2),
}


def ids_and_labels(ds) -> list[tuple[float, int]]:
    """(red value, label) of every image of one pass over `ds`, sorted (`id_tree`:
    each file's red value is 10 * its id, before the chain's own arithmetic)."""
    out = []
    for x, y in ds:
        out += zip(x.numpy()[:, 0, 0, 0].tolist(), y.numpy().tolist())
    return sorted((float(r), int(label)) for r, label in out)


@pytest.fixture(scope="module")
def datasets(id_tree, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    made = {name: ours(str(id_tree), cache_dir=str(cache), **kw, **KW)
            for name, kw in PATHS.items()}
    yield made
    for ds in made.values():
        ds.close()


@pytest.fixture(scope="module")
def keras_ds(id_tree):
    return keras.utils.image_dataset_from_directory(str(id_tree), **KW)


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_transformations_keep_keras_semantics_on_every_path(datasets, keras_ds, chain):
    """Cardinality as Keras reports it after the same chain, and the same
    (pixel, label) multiset in one pass, on every path, twice (two epochs)."""
    make = CHAINS[chain]
    want_card = int(make(keras_ds).cardinality())
    want = ids_and_labels(make(keras_ds))
    assert want, "the reference yields nothing"
    for name, ds in datasets.items():
        out = make(ds)
        assert int(out.cardinality()) == want_card, (name, chain)
        for _ in range(2):
            got = ids_and_labels(out)
            assert len(got) == len(want), (name, chain)
            np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], atol=0.01,
                                       err_msg=f"{name}: {chain}")
            assert [g[1] for g in got] == [w[1] for w in want], (name, chain)


def test_every_image_once_per_epoch_with_its_label(datasets):
    """The chains above compare with Keras; this pins the absolute truth on
    every path: ids 0..22 once each, each with label id % 2."""
    for name, ds in datasets.items():
        pairs = ids_and_labels(ds.map(lambda x, y: (x, y)).prefetch(2))
        ids = [int(round(r / 10)) for r, _ in pairs]
        assert sorted(ids) == list(range(23)), name
        assert all(label == i % 2 for (_, label), i in zip(pairs, ids)), name


def _tutorial(root, tmp_path, load=None, **path):
    """The Keras tutorial's script: look at a batch, augment in a map, prefetch,
    fit with validation and a checkpoint, then repeat() with steps_per_epoch,
    then evaluate. `load`: Keras's own loader (None: this one, with `path`'s options)."""
    if load is None:
        load = ours
        path = dict(path, cache_dir=str(tmp_path / "cache"))
    train, val = load(str(root), validation_split=0.25, subset="both", seed=7,
                      image_size=(16, 16), batch_size=4, verbose=False, **path)
    images, labels = next(iter(train.take(1)))
    assert images.shape == (4, 16, 16, 3) and labels.shape == (4,)
    augment = keras.Sequential([keras.layers.RandomFlip("horizontal"),
                                keras.layers.RandomRotation(0.1)])
    train_aug = train.map(lambda x, y: (augment(x, training=True), y),
                          num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    val_ready = val.cache().prefetch(tf.data.AUTOTUNE)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2),
    ])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    counts: list[int] = []
    ckpt = keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), save_best_only=True)
    history = model.fit(train_aug, validation_data=val_ready, epochs=2, verbose=0,
                        callbacks=[batch_counter(counts), ckpt])
    steps: list[int] = []
    model.fit(train.repeat(), steps_per_epoch=3, epochs=2, verbose=0,
              callbacks=[batch_counter(steps)])
    loss, acc = model.evaluate(val_ready, verbose=0)
    return counts, steps, history, (loss, acc), int(train.cardinality()), int(val.cardinality())


def _warnings_of(run) -> tuple[object, list[str]]:
    """`run()`'s result and every warning it raised or logged (WARNING and above), with
    numbers and hex addresses blanked so that two runs' messages compare."""
    import re

    handler = logging.Handler(logging.WARNING)
    records: list[logging.LogRecord] = []
    handler.emit = records.append
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = run()
    finally:
        root.removeHandler(handler)
    messages = [str(w.message) for w in caught] + [r.getMessage() for r in records]
    return result, sorted({re.sub(r"0x[0-9a-f]+|\d+", "#", m) for m in messages})


@pytest.fixture(scope="module")
def keras_run(id_tree, tmp_path_factory):
    """The tutorial script with Keras's own loader: its counts and its warnings."""
    return _warnings_of(lambda: _tutorial(
        id_tree, tmp_path_factory.mktemp("keras_run"), load=keras.utils.image_dataset_from_directory))


@pytest.mark.parametrize("path", sorted(PATHS))
def test_tutorial_script_runs_unchanged(id_tree, tmp_path, path, keras_run):
    """23 files, 25% validation: 18 train (5 batches of 4), 5 val (2 batches), on every
    path, with no warning that Keras's own loader does not give in the same script
    ("ran out of data", a cardinality warning, or any other)."""
    (counts, steps, history, (loss, acc), n_train, n_val), messages = _warnings_of(
        lambda: _tutorial(id_tree, tmp_path, **PATHS[path]))
    (k_counts, k_steps, _, _, k_train, k_val), keras_messages = keras_run
    assert (n_train, n_val) == (k_train, k_val) == (5, 2)
    assert counts == k_counts == [5, 5] and steps == k_steps == [3, 3]
    assert len(history.history["val_loss"]) == 2 and np.isfinite(loss)
    assert (tmp_path / "best.keras").exists()
    extra = [m for m in messages if m not in keras_messages]
    assert not extra, extra


def test_keras_reference_script_labels(id_tree):
    """The split the script uses, with Keras's own loader: 5 validation images, each with
    the label of its class folder (even ids 0, odd ids 1), each image once."""
    train, val = keras.utils.image_dataset_from_directory(
        str(id_tree), validation_split=0.25, subset="both", seed=7, image_size=(16, 16),
        batch_size=4, verbose=False, shuffle=False)
    assert (int(train.cardinality()), int(val.cardinality())) == (5, 2)
    pairs = [(int(round(float(x[0, 0, 0]) / 10)), int(y))
             for xs, ys in val for x, y in zip(xs.numpy(), ys.numpy())]
    want = sorted(int(p.rsplit("/", 1)[-1][:3]) for p in val.file_paths)
    assert sorted(i for i, _ in pairs) == want and len(want) == 5
    assert all(label == i % 2 for i, label in pairs), pairs
    assert collections.Counter(y for _, y in pairs) == collections.Counter(i % 2 for i in want)
