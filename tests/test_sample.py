"""The embedded sample dataset: layout, size, determinism, argument errors."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from PIL import Image

from dali_loader.tools.sample import make_sample_dataset, source_images


def _digest(root: str) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def test_layout_and_images(tmp_path):
    root = make_sample_dataset(tmp_path / "d", num_images=10, num_classes=3, size=(75, 100))
    assert root == str(tmp_path / "d")
    classes = sorted(os.listdir(root))
    assert classes == ["class_00", "class_01", "class_02"]
    counts = [len(os.listdir(os.path.join(root, c))) for c in classes]
    assert counts == [4, 3, 3]
    for c in classes:
        for f in os.listdir(os.path.join(root, c)):
            assert f.endswith(".png")
            with Image.open(os.path.join(root, c, f)) as im:
                assert im.format == "PNG" and im.mode == "RGB" and im.size == (100, 75)


def test_default_size_is_photo_like(tmp_path):
    root = make_sample_dataset(tmp_path, num_images=2, num_classes=2)
    p = os.path.join(root, "class_00", "img_00000.png")
    with Image.open(p) as im:
        assert im.size == (500, 375) and im.mode == "RGB"
        arr = np.asarray(im)
    # Photo-like: many distinct colours, and it does not compress like a drawing.
    assert len(np.unique(arr.reshape(-1, 3), axis=0)) > 10_000
    assert os.path.getsize(p) > 100_000


def test_deterministic_from_seed(tmp_path):
    a = _digest(make_sample_dataset(tmp_path / "a", num_images=6, num_classes=2, size=(40, 50)))
    b = _digest(make_sample_dataset(tmp_path / "b", num_images=6, num_classes=2, size=(40, 50)))
    c = _digest(make_sample_dataset(tmp_path / "c", num_images=6, num_classes=2, size=(40, 50),
                                    seed=1))
    assert a == b
    assert a.keys() == c.keys() and a != c


def test_classes_differ_in_colour(tmp_path):
    root = make_sample_dataset(tmp_path, num_images=40, num_classes=2, size=(40, 50))
    means = []
    for c in ("class_00", "class_01"):
        d = os.path.join(root, c)
        means.append(np.mean([np.asarray(Image.open(os.path.join(d, f))).mean(axis=(0, 1))
                              for f in os.listdir(d)], axis=0))
    assert np.abs(means[0] - means[1]).max() > 5


def test_sources_are_rgb():
    for src in source_images():
        assert src.dtype == np.uint8 and src.ndim == 3 and src.shape[2] == 3


@pytest.mark.parametrize("kwargs", [{"num_images": 0}, {"num_classes": 0}, {"size": (0, 10)},
                                    {"size": (10,)}])
def test_bad_arguments(tmp_path, kwargs):
    with pytest.raises(ValueError, match="Received"):
        make_sample_dataset(tmp_path, **kwargs)
