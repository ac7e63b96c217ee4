"""Extreme shapes (1x1, 3x400, 400x3) x stretch/crop/pad x every interpolation x every path,
against Keras (issue 29, item 4; the table is in docs/parity.md).

Keras's per-file reference is its own `_load_image_tf`, run eagerly per file, so that a
file Keras cannot resize does not hide the others. Where Keras raises:
- pad_to_aspect_ratio of 3x400 and 400x3 to 64x48 ("output dimensions must be
  positive"): the CPU default names the file and the cause (`UnresizableImageError`)
  under on_error="raise", and skips and records it under "skip" (the epoch goes on);
  the DALI path pads it without error.
- crop_to_aspect_ratio with "gaussian" or "mitchellcubic": Keras's smart_resize refuses
  the interpolation when the dataset is built; so does the CPU default (the same
  ValueError); the DALI path crops and resizes.
"""

from __future__ import annotations

import numpy as np
import pytest

from support.helpers import save

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from dali_loader.decode.spec import INTERPOLATIONS  # noqa: E402
from dali_loader.errors import UnresizableImageError  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

SIZE = (64, 48)
SHAPES = {"dot": (1, 1), "wide": (3, 400), "tall": (400, 3), "plain": (50, 40)}
MODES = ("stretch", "crop", "pad")
CROP_REFUSED = ("gaussian", "mitchellcubic")  # Keras's smart_resize refuses them


@pytest.fixture(scope="module")
def shapes_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    rng = np.random.default_rng(5)
    files = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        fmt = "JPEG" if name == "wide" else "PNG"  # the 3x400 JPEG
        path = root / ("a" if i % 2 else "b") / f"{name}.{'jpg' if fmt == 'JPEG' else 'png'}"
        save(path, rng.integers(0, 256, (*shape, 3), np.uint8), fmt)
        files[name] = str(path)
    return root, files


def _options(mode: str, interpolation: str) -> dict:
    return dict(image_size=SIZE, interpolation=interpolation,
                crop_to_aspect_ratio=mode == "crop", pad_to_aspect_ratio=mode == "pad")


def _keras_per_file(files: dict, mode: str, interpolation: str) -> dict:
    """File name -> Keras's image, or the error Keras's loader raises on it."""
    from keras.src.utils.image_dataset_utils import _load_image_tf

    out = {}
    for name, path in files.items():
        try:
            out[name] = np.asarray(_load_image_tf(tf.constant(path), SIZE, 3, interpolation,
                                                  "channels_last", mode == "crop", mode == "pad"))
        except (tf.errors.OpError, ValueError) as e:
            out[name] = e
    return out


def _epoch(ds) -> np.ndarray:
    return np.concatenate([x.numpy() for x, _ in ds])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_cpu_default_matches_keras_or_names_the_file(shapes_tree, mode, interpolation):
    root, files = shapes_tree
    ref = _keras_per_file(files, mode, interpolation)
    opts = _options(mode, interpolation)
    if mode == "crop" and interpolation in CROP_REFUSED:
        assert all(isinstance(r, ValueError) for r in ref.values())
        with pytest.raises(ValueError, match="Invalid value for argument `interpolation`"):
            keras.utils.image_dataset_from_directory(str(root), **opts)
        with pytest.raises(ValueError, match="Invalid value for argument `interpolation`"):
            ours(str(root), **opts)
        return
    failing = {n for n, r in ref.items() if isinstance(r, Exception)}
    assert failing == ({"wide", "tall"} if mode == "pad" else set())
    for r in (ref[n] for n in failing):
        assert "output dimensions must be positive" in str(r)
    ds = ours(str(root), shuffle=False, batch_size=3, on_error="skip", **opts)
    got = _epoch(ds)
    skipped = ds.loader.skipped
    assert set(skipped) == {files[n] for n in failing}
    for n in failing:  # the real cause, not storage
        assert "output dimensions must be positive" in skipped[files[n]]
        assert f"pad_to_aspect_ratio, {interpolation}" in skipped[files[n]]
    kept = [p for p in ds.loader.engine.index.paths if p not in skipped]
    assert len(got) == len(kept)
    for name, path in files.items():
        if name not in failing:
            np.testing.assert_array_equal(got[kept.index(path)], ref[name], err_msg=name)
    assert len(_epoch(ds)) == len(kept)  # the next epoch tries them again, and goes on


@pytest.mark.parametrize("interpolation", ["bilinear", "area"])
def test_cpu_default_raise_names_the_unresizable_file(shapes_tree, interpolation):
    root, files = shapes_tree
    ds = ours(str(root), shuffle=False, batch_size=2, on_error="raise",
              **_options("pad", interpolation))
    with pytest.raises(Exception) as info:
        _epoch(ds)
    text = str(info.value)
    assert UnresizableImageError.__name__ in text or isinstance(info.value, UnresizableImageError)
    assert "Cannot resize image file" in text and "output dimensions must be positive" in text
    assert files["tall"] in text or files["wide"] in text
    assert "report this with the storage" not in text


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_dali_path_delivers_every_file(shapes_tree, mode, interpolation):
    """decoder="dali": no file fails (it pads 3x400 and crops with any interpolation);
    where Keras decodes, bilinear and nearest are within docs/parity.md's bounds
    (mean absolute difference below 0.05 and 0.5 levels)."""
    root, files = shapes_tree
    ref = _keras_per_file(files, mode, interpolation)
    ds = ours(str(root), shuffle=False, batch_size=3, on_error="skip", decoder="dali",
              **_options(mode, interpolation))
    got = _epoch(ds)
    assert ds.loader.skipped == {} and len(got) == len(files)
    paths = ds.loader.engine.feed.index.paths
    assert got.shape[1:] == (*SIZE, 3)
    bound = {"bilinear": 0.05, "nearest": 0.5}.get(interpolation)
    for name, path in files.items():
        if bound is not None and not isinstance(ref[name], Exception):
            diff = np.abs(got[paths.index(path)].astype(np.float64) - ref[name]).mean()
            assert diff < bound, (name, diff)


def _pixel_paths(tmp_path):
    """The CPU paths whose resize runs on whole batches of pixels (no audit)."""
    from dali_loader.decode import png_cpu

    paths = {"gpu_ready": dict(gpu_ready=True, cache_dir=str(tmp_path / "cache"))}
    if png_cpu.available():
        paths["wuffs"] = dict(png_decoder="wuffs")
    return paths


@pytest.mark.parametrize("interpolation", ["bilinear", "area"])
def test_pixel_paths_skip_or_name_the_unresizable_file(shapes_tree, tmp_path, interpolation):
    """gpu_ready=True (and png_decoder="wuffs" before the native op): a padded 3x400 image
    goes to on_error with TF's reason, instead of ending the epoch with TF's error."""
    root, files = shapes_tree
    ref = _keras_per_file(files, "pad", interpolation)
    for name, extra in _pixel_paths(tmp_path).items():
        opts = dict(shuffle=False, batch_size=3, **_options("pad", interpolation), **extra)
        ds = ours(str(root), on_error="skip", **opts)
        for _ in range(2):  # a gpu_ready dataset fills its cache in the first epoch
            got = _epoch(ds)
            skipped = ds.loader.skipped
            assert set(skipped) == {files["wide"], files["tall"]}, name
            assert all("output dimensions must be positive" in r for r in skipped.values())
            kept = [p for p in ds.loader.engine.index.paths if p not in skipped]
            for n in ("dot", "plain"):
                np.testing.assert_array_equal(got[kept.index(files[n])], ref[n], err_msg=name)
        with pytest.raises(Exception, match="Cannot resize image file"):
            _epoch(ours(str(root), on_error="raise", **opts))
