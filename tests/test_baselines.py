"""The tf.data baselines: the question's pipeline verbatim, and the tuned one, local and gs://."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
from PIL import Image

tf = pytest.importorskip("tensorflow")

from dali_loader.tools.baselines import infer_class_names, list_pngs, seed_pipeline, tuned_pipeline  # noqa: E402

CLASSES = ["cats", "dogs", "zebra"]
PER_CLASS = 10


def _value(k: int) -> int:
    return 40 * k + 30


@pytest.fixture(scope="module")
def solid_tree(tmp_path_factory):
    """Each class's images are one solid grey level, so a pixel tells the true class."""
    root = tmp_path_factory.mktemp("solid")
    for k, c in enumerate(CLASSES):
        os.makedirs(root / c)
        for i in range(PER_CLASS):
            h, w = 20 + i, 30 + 2 * i
            arr = np.full((h, w, 3), _value(k), np.uint8)
            Image.fromarray(arr).save(root / c / f"{i:03d}.png")
    (root / "cats" / "notes.txt").write_text("not an image")
    (root / "cats" / "UPPER.PNG").write_bytes(b"")  # the seed's glob is case-sensitive
    return str(root)


def _collect(ds):
    pixels, labels, shapes, dtypes = [], [], set(), set()
    for x, y in ds:
        shapes.add(tuple(x.shape[1:]))
        dtypes.add((x.dtype, y.dtype))
        pixels += list(x.numpy()[:, 5, 5, 0])
        labels += list(y.numpy())
    return np.array(pixels), np.array(labels), shapes, dtypes


def _true_class(pixel: float) -> int:
    return [_value(k) for k in range(len(CLASSES))].index(int(round(pixel)))


def test_listing_follows_the_seed_glob(solid_tree):
    files = list_pngs(solid_tree)
    assert len(files) == len(CLASSES) * PER_CLASS
    assert files == sorted(files)
    assert infer_class_names(solid_tree) == CLASSES


def test_seed_pipeline_matches_the_question(solid_tree):
    train, val = seed_pipeline(solid_tree, CLASSES, batch_size=8, image_size=(244, 244))
    n = len(CLASSES) * PER_CLASS
    val_size = int(n * 0.2)
    tp, tl, tshapes, tdtypes = _collect(train)
    vp, vl, _, _ = _collect(val)
    assert len(tl) == n - val_size and len(vl) == val_size
    assert tshapes == {(244, 244, 3)}
    assert tdtypes == {(tf.float32, tf.int64)}  # tf.argmax gives int64 labels
    # The question's get_label: index of the parent folder in class_names.
    assert [_true_class(p) for p in tp] == list(tl)
    assert [_true_class(p) for p in vp] == list(vl)
    # skip/take over a shuffle(reshuffle_each_iteration=False): a split, every file once.
    assert collections.Counter(list(tl) + list(vl)) == {k: PER_CLASS for k in range(3)}
    # The split is stable across epochs (no reshuffle), as in the question.
    assert sorted(_collect(val)[1]) == sorted(vl)


def test_seed_pipeline_label_rule_against_paths(solid_tree):
    class_names = np.array(CLASSES)
    files = tf.data.Dataset.list_files(solid_tree + "/*/*.png", shuffle=False)
    for f in files:
        parts = tf.strings.split(f, os.path.sep)
        expect = CLASSES.index(f.numpy().decode().split(os.sep)[-2])
        assert int(tf.argmax(parts[-2] == class_names)) == expect


def test_tuned_pipeline_reads_everything(solid_tree):
    ds = tuned_pipeline(solid_tree, batch_size=7, image_size=(32, 48), seed=3)
    p, labels, shapes, dtypes = _collect(ds)
    assert shapes == {(32, 48, 3)} and dtypes == {(tf.float32, tf.int32)}
    assert [_true_class(x) for x in p] == list(labels)
    assert collections.Counter(labels) == {k: PER_CLASS for k in range(3)}


def test_gs_sources_read_through_gcs(solid_tree, monkeypatch):
    fakegcs = pytest.importorskip("support.fakegcs")
    with fakegcs.FakeGCS.from_directory(solid_tree, bucket="b", prefix="data") as srv:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", srv.endpoint)
        assert len(list_pngs("gs://b/data")) == len(CLASSES) * PER_CLASS
        train, val = seed_pipeline("gs://b/data", batch_size=16, image_size=(24, 24))
        tp, tl, shapes, _ = _collect(train)
        vp, vl, _, _ = _collect(val)
        assert shapes == {(24, 24, 3)}
        assert [_true_class(x) for x in list(tp) + list(vp)] == list(tl) + list(vl)
        assert collections.Counter(list(tl) + list(vl)) == {k: PER_CLASS for k in range(3)}
        p, labels, _, _ = _collect(tuned_pipeline("gs://b/data", batch_size=16,
                                                  image_size=(24, 24)))
        assert [_true_class(x) for x in p] == list(labels)
        assert len(labels) == len(CLASSES) * PER_CLASS


def test_bad_arguments(solid_tree, tmp_path):
    with pytest.raises(ValueError, match="Received"):
        seed_pipeline(solid_tree, batch_size=0)
    with pytest.raises(ValueError, match="Received"):
        tuned_pipeline(solid_tree, read_parallelism=0)
    with pytest.raises(FileNotFoundError):
        tuned_pipeline(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="No .png"):
        seed_pipeline(str(tmp_path))
