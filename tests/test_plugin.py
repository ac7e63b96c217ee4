"""The DALI TF plugin handoff (`handoff="plugin"`), run on the CPU (`decoder="dali"`,
DALI's `device_id=None`): the graph the GPU runs, with every guarantee of the
generator handoff checked against it: pixels, labels, exactly-once epochs,
reshuffling, interleaved iterators, cardinality, `model.fit`, bad files."""

from __future__ import annotations

import logging
import shutil
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("nvidia.dali.plugin.tf")

from test_bad_input import _good_and_one_zlib_bad, bad_tree  # noqa: E402,F401
from support.helpers import batch_counter, run_fit_script  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def ids(batch) -> list[int]:
    """File ids of an id_tree batch (red channel = 10 x id)."""
    return [int(round(float(v) / 10)) for v in np.asarray(batch)[:, 0, 0, 0]]


def make(root, handoff="plugin", **kw):
    args = dict(label_mode=None, image_size=(8, 8), batch_size=4, seed=5, verbose=False,
                decoder="dali", handoff=handoff)
    args.update(kw)
    return ours(str(root), **args)


def as_tuple(element):
    return element if isinstance(element, tuple) else (element,)


@pytest.mark.parametrize("kw", [
    dict(label_mode="int"), dict(label_mode=None), dict(label_mode="categorical"),
    dict(label_mode="binary"), dict(color_mode="grayscale", crop_to_aspect_ratio=True),
    dict(color_mode="rgba", pad_to_aspect_ratio=True), dict(data_format="channels_first"),
], ids=str)
def test_same_batches_as_the_generator_handoff(photo_tree, kw):
    if kw.get("label_mode") == "binary":  # two classes
        root = photo_tree.parent / "two_classes"
        if not root.exists():
            shutil.copytree(photo_tree / "class_0", root / "class_0")
            shutil.copytree(photo_tree / "class_1", root / "class_1")
        photo_tree = root
    args = dict(image_size=(24, 32), batch_size=5, seed=3, **kw)
    plugin, generator = make(photo_tree, **args), make(photo_tree, "generator", **args)
    assert plugin.element_spec == generator.element_spec
    assert int(plugin.cardinality()) == int(generator.cardinality()) == len(generator)
    for _ in range(2):  # two epochs, each reshuffled alike
        got = [as_tuple(e) for e in plugin]
        want = [as_tuple(e) for e in generator]
        n = len(plugin.file_paths)
        assert [int(e[0].shape[0]) for e in got] == [5] * (n // 5) + [n % 5]  # partial kept
        assert len(got) == len(want)
        for g, w in zip(got, want):
            for a, b in zip(g, w):
                assert a.dtype == b.dtype and a.shape == b.shape
                np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_every_file_once_per_epoch_and_reshuffled(id_tree):
    ds = make(id_tree)
    epochs = [[i for x in ds for i in ids(x)] for _ in range(3)]
    for seen in epochs:
        assert sorted(seen) == list(range(23))
    assert epochs[0] != epochs[1] != epochs[2]
    assert ds.loader.skipped == {}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_two_interleaved_iterators_each_yield_a_whole_epoch(id_tree, on_error):
    ds = make(id_tree, on_error=on_error)
    a, b = iter(ds), iter(ds)
    seen_a, seen_b = [], []
    for _ in range(6):  # 23 files in batches of 4
        seen_a += ids(next(a))
        seen_b += ids(next(b))
    for it in (a, b):
        with pytest.raises(StopIteration):
            next(it)
    assert sorted(seen_a) == sorted(seen_b) == list(range(23))
    assert seen_a != seen_b  # two epochs: two permutations
    assert sorted(i for x in ds for i in ids(x)) == list(range(23))


def test_fit_with_validation_subset_both_several_epochs(id_tree):
    train, val = make(id_tree, label_mode="int", validation_split=0.3, subset="both")
    n_train, n_val = len(train.file_paths), len(val.file_paths)
    assert n_train + n_val == 23
    assert int(train.cardinality()) == -(-n_train // 4)
    counts, seen = [], []

    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = model.fit(train, validation_data=val, epochs=3, verbose=0,
                         callbacks=[batch_counter(counts)])
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    assert counts == [-(-n_train // 4)] * 3
    assert len(hist.history["val_loss"]) == 3 and np.isfinite(hist.history["val_loss"]).all()
    # Pipelines: one per iteration (3 training epochs, 3 validations), all finished.
    for ds, n in ((train, n_train), (val, n_val)):
        seen = sorted(i for x, _ in ds for i in ids(x))
        assert len(seen) == n and len(set(seen)) == n
    labels = np.concatenate([y.numpy() for x, y in val])
    assert set(labels) <= {0, 1}
    xs = np.concatenate([ids(x) for x, _ in val])
    np.testing.assert_array_equal(labels, xs % 2)  # "even" is class 0, "odd" class 1


def test_raise_names_a_file_the_checks_catch(bad_tree, id_tree):
    root, bad = bad_tree
    ds = make(root, shuffle=False)
    with pytest.raises(tf.errors.OpError) as err:
        for _ in ds:
            pass
    msg = str(err.value)
    assert "Cannot load image file" in msg and any(b in msg for b in bad), msg
    assert sum(int(x.shape[0]) for x in make(id_tree)) == 23  # the process is fine


@pytest.mark.parametrize("png_decoder", ["wuffs", None])
def test_skip_keeps_every_good_file_once_and_reports_every_bad_one(bad_tree, caplog,
                                                                    png_decoder):
    """The corpus's corrupt files and the others the byte checks catch. The ones only a
    decoder can see (zlib.png; the corpus's bad zlib streams) are left out by the feed when
    Wuffs decodes PNGs before DALI; with DALI's own decoder (the default) each fails DALI's
    decode: an epoch ends with an error naming it, and it is left out of every later one."""
    root, bad = bad_tree
    caplog.set_level(logging.WARNING)
    ds = make(root, shuffle=True, seed=3, batch_size=5, on_error="skip",
              png_decoder=png_decoder)
    assert int(ds.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    if png_decoder is None:
        import re

        named = []  # one epoch cut short by each file only DALI's decoder rejects
        for _ in range(len(bad) + 1):
            try:
                for _ in ds:
                    pass
                break
            except tf.errors.InternalError as err:
                named += re.findall(r"Cannot load image file (\S+): DALI's decoder failed",
                                    str(err))[:1]
        assert len(named) == len(set(named)) and set(named) <= set(bad), named
        assert str(root / "odd" / "zlib.png") in named
    for _ in range(2):
        assert sorted(i for x in ds for i in ids(x)) == list(range(23))
    assert set(ds.loader.skipped) == set(bad)
    reported = {r.getMessage().split(": ")[0].removeprefix("Skipping ")
                .removesuffix(" from the next epoch on") for r in caplog.records}
    assert set(bad) <= reported


@pytest.mark.parametrize("png_decoder", ["wuffs", None])
def test_decode_failure_past_the_checks_names_the_file(bad_tree, tmp_path, png_decoder):
    """With Wuffs the feed names the file (TF's decoder rejects it there); with
    DALI's decoder the plugin's error is turned into one naming it."""
    only = _good_and_one_zlib_bad(bad_tree, tmp_path, 6, "3b.png")
    ds = make(only, shuffle=False, batch_size=3, png_decoder=png_decoder)
    error = tf.errors.InternalError if png_decoder is None else tf.errors.OpError
    for _ in range(2):  # and again: nothing hangs, nothing is left behind
        with pytest.raises(error, match="3b.png"):
            for _ in ds:
                pass
    assert ds.loader.skipped == {}
    assert sum(int(x.shape[0]) for x in make(only.parent / "one", "generator", shuffle=False,
                                             on_error="skip", batch_size=3)) == 6


def test_with_the_gpu_ready_cache_skip_holds_through_the_plugin(bad_tree, tmp_path):
    """With `gpu_ready=True` every file is decoded by TF in the feed before DALI
    sees its entry: the zlib file that ends a plugin epoch above is left out by
    the feed instead, in every epoch, and each good file comes once per epoch,
    first from the PNGs and then from the cache. The default handoff on a GPU
    is then the plugin for `skip` too."""
    from dali_loader.plan import Handoff
    from support.helpers import gpu_handoff

    root, bad = bad_tree
    ds = make(root, shuffle=True, seed=3, batch_size=5, on_error="skip", gpu_ready=True,
              cache_dir=str(tmp_path))
    for _ in range(3):
        assert sorted(i for x in ds for i in ids(x)) == list(range(23))
    assert set(ds.loader.skipped) == set(bad)
    assert [s["cpu_decodes"] for s in ds.loader.epoch_stats] == [23, 0, 0]
    assert gpu_handoff(on_error="skip", batch_size=8, gpu_ready=True) is Handoff.PLUGIN
    assert gpu_handoff(on_error="skip", batch_size=8) is Handoff.GENERATOR


def test_handoff_errors_echo_the_value(id_tree):
    with pytest.raises(ValueError, match="handoff='nope'"):
        make(id_tree, handoff="nope")
    with pytest.raises(ValueError, match="batch_size=None"):
        make(id_tree, batch_size=None)
    with pytest.raises(ValueError, match='decoder="dali"'):
        make(id_tree, decoder="tf")


# -- On a GPU (skipped elsewhere): placement, pixels, fit under both allocators --------
from test_gpu import needs_gpu  # noqa: E402


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("handoff,where", [(None, "CPU"), ("plugin-gpu", "GPU")])
def test_gpu_batches_placed_by_the_handoff_match_the_cpu(photo_tree, handoff, where):
    """The default hands DALI's GPU batches over on the host (and a `map` after it
    runs); plugin-gpu keeps them on the GPU. Pixels as the CPU path's, both."""
    args = dict(label_mode="int", image_size=(48, 64), batch_size=8, shuffle=False,
                verbose=False)
    gpu = ours(str(photo_tree), device="gpu", handoff=handoff, **args)
    assert gpu.loader.device == "gpu"
    assert gpu.element_spec[0].shape[1:] == (48, 64, 3)
    got = list(gpu)
    for x, y in got:
        assert where in x.device and where in y.device, (x.device, y.device)
    if handoff is None:
        assert int(gpu.map(lambda x, y: (x, y)).cardinality()) == 3
    cpu = [(x.numpy(), y.numpy()) for x, y in ours(str(photo_tree), device="cpu", **args)]
    assert len(got) == len(cpu) == 3
    for (x, y), (cx, cy) in zip(got, cpu):
        np.testing.assert_array_equal(y.numpy(), cy)
        assert np.abs(x.numpy().astype(np.float64) - cx).mean() < 0.5


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("allocator", ["", "cuda_malloc_async"])
def test_gpu_fit_through_the_plugin(photo_tree, allocator):
    code = f"""
import warnings, numpy as np, keras
from tf_adapter import image_dataset_from_directory
train, val = image_dataset_from_directory({str(photo_tree)!r}, image_size=(64, 64), batch_size=8,
                                          validation_split=0.25, subset="both", seed=1)
assert train.loader.device == "gpu" and type(train).__name__ == "NamingDataset"
train = train.map(lambda x, y: (keras.layers.RandomFlip()(x, training=True), y)).prefetch(2)
m = keras.Sequential([keras.Input((64, 64, 3)), keras.layers.Conv2D(8, 3),
                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    h = m.fit(train, validation_data=val, epochs=3, verbose=0)
assert not [x for x in w if "ran out of data" in str(x.message)]
assert np.isfinite(h.history["loss"]).all() and len(h.history["val_loss"]) == 3
print("fit-ok")
"""
    run_fit_script(code, allocator)
