"""The native PNG core as a DALI CPU operator (`fn.dali_loader.png_decode`), and the DALI
path that decodes PNGs with it by default: real DALI on the CPU (`decoder="dali"`).

- The operator alone: where it says ok, exactly `tf.io.decode_png`'s pixels; where TF
  refuses a file, never ok; a file it leaves is an empty [0, 0, C] sample; ok exactly
  where the core (ctypes) decodes. Over hand-made variants, the generated corpus
  (`tests/support/png_corpus`) and seeded mutants of both, in 1, 3 and 4 channels.
- Through `image_dataset_from_directory`: PNGs decoded by it, exactly TF's pixels
  (the images are not resized: DALI's resize to the same size copies them); a folder
  of PNG + JPEG + BMP + corrupt files, every good file once per epoch over two
  shuffled epochs with its label, the corrupt ones named under "raise" and recorded
  under "skip"; rgb, grayscale and rgba; `png_decoder="libpng"` keeps DALI's decoder.
"""

from __future__ import annotations

import io
import os
import shutil
import struct

import numpy as np
import pytest

from support.helpers import _photo, save
from dali_loader.decode import dali_png, png_native
from support import png_corpus
from support.mutate import corpus as mutants
from support.pngs import broken_streams, chunk, encode_png, photo
from tf_adapter.dataset import image_dataset_from_directory as ours

MODES = {"grayscale": 1, "rgb": 3, "rgba": 4}


def test_operator_is_built_and_loads():
    """`make install` builds it (`python -m dali_loader.native.build_dali`)."""
    assert dali_png.available(), dali_png.unavailable_reason()


needs_op = pytest.mark.skipif(not os.path.exists(dali_png.LIBRARY),
                              reason="the operator is not built (test_operator_is_built_and_loads)")


def _png_variants(rng: np.random.Generator) -> dict[str, bytes]:
    """PNGs the core takes and PNGs it may leave: every 8-bit colour type with every
    filter, palette with and without tRNS, 16-bit, gAMA, interlaced; plus files that
    are not PNGs and broken PNGs."""
    from PIL import Image

    px = photo(rng, 23, 31)
    out = {
        "rgb.png": encode_png(px),
        "grey.png": encode_png(px[..., :1]),
        "grey_alpha.png": encode_png(np.concatenate([px[..., :1], px[..., 2:]], -1)),
        "rgba.png": encode_png(np.concatenate([px, px[..., :1]], -1)),
        "rgb_sub_only.png": encode_png(px, filters=(1,)),
        "rgb_paeth_only.png": encode_png(px, filters=(4,)),
        "palette.png": encode_png(px[..., 0] % 16, palette=rng.integers(0, 256, (16, 3))),
        "palette_trns.png": encode_png(px[..., 0] % 16, palette=rng.integers(0, 256, (16, 3)),
                                       trns=bytes(range(0, 256, 32))),
        "rgb_gama.png": encode_png(px, extra_chunks=chunk(b"gAMA", struct.pack(">I", 45455))),
        "rgb_trns.png": encode_png(px, trns=struct.pack(">HHH", *px[0, 0].tolist())),
        "one_pixel.png": encode_png(px[:1, :1]),
    }
    for name, arr in [("grey16.png", px[..., 0].astype(np.uint16) * 257),
                      ("interlaced.png", px)]:
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="PNG",
                                  **({"interlace": 1} if name.startswith("inter") else {}))
        out[name] = buf.getvalue()
    jpg = io.BytesIO()
    Image.fromarray(px).save(jpg, format="JPEG")
    out["photo.jpg"] = jpg.getvalue()
    out["not_an_image.png"] = b"hello, not an image at all"
    out.update(broken_streams(px))  # CRC-valid PNGs with bad Deflate data
    return out


def _op_outputs(samples: list[bytes], channels: int):
    """(pixels, ok) per sample, from a CPU pipeline of the operator alone."""
    from dali_loader.lazy import import_dali

    dali = import_dali()
    assert dali_png.load(), dali_png.unavailable_reason()
    arrays = [np.frombuffer(s, np.uint8) for s in samples]

    @dali.pipeline_def(batch_size=len(arrays), num_threads=2, device_id=None)
    def pipe():
        enc = dali.fn.external_source(source=lambda: arrays, batch=True, dtype=dali.types.UINT8)
        return tuple(dali_png.png_decode(dali, enc, channels, 1 << 28))

    p = pipe()
    p.build()
    px, ok = p.run()
    return [np.array(px[i]) for i in range(len(arrays))], [bool(np.array(ok[i]))
                                                          for i in range(len(arrays))]


def _tf_decode(data: bytes, channels: int):
    """`tf.io.decode_png(channels=...)` of `data`, or None where TF refuses it."""
    import tensorflow as tf

    try:
        return tf.io.decode_png(data, channels=channels).numpy()
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        return None


@needs_op
@pytest.mark.parametrize("mode", list(MODES))
def test_operator_pixels_are_tf_decode_png_where_ok(mode):
    channels = MODES[mode]
    rng = np.random.default_rng(7)
    files = _png_variants(rng)
    sound = [encode_png(photo(rng, 17, 13)), files["rgba.png"], files["grey.png"]]
    files.update(mutants(sound, 60, seed=11))
    names = sorted(files)
    pixels, ok = _op_outputs([files[n] for n in names], channels)
    taken = 0
    for name, px, good in zip(names, pixels, ok):
        want = _tf_decode(files[name], channels) if files[name][:8] == b"\x89PNG\r\n\x1a\n" \
            else None
        if good:
            assert want is not None, f"{name}: the operator decoded a file TF refuses"
            assert px.dtype == np.uint8 and px.shape == want.shape, name
            np.testing.assert_array_equal(px, want, err_msg=name)
            taken += 1
        else:
            assert px.shape == (0, 0, channels), name
    assert taken > 0  # the core took some (the exact set is the core's: tests/test_png_native.py)
    # an 8-bit, plain PNG of the output's own colour type: what every core takes
    own = {1: "grey.png", 3: "rgb.png", 4: "rgba.png"}[channels]
    assert ok[names.index(own)]


@needs_op
@pytest.mark.parametrize("mode", list(MODES))
def test_operator_on_the_generated_corpus_and_its_mutants(mode):
    """The generated corpus (every colour type x depth x interlace x ancillary variant,
    and corrupt files) and 300 of its mutants: where ok, exactly TF's pixels; never ok
    where TF refuses; ok exactly where the core (through ctypes) decodes the file."""
    channels = MODES[mode]
    files = png_corpus.corpus()
    sound = [b for n, b in sorted(files.items()) if not n.startswith("x")]
    files.update({f"m{n}": b for n, b in mutants(sound, 300, seed=27)})
    names = sorted(files)
    pixels, ok = _op_outputs([files[n] for n in names], channels)
    for name, px, good in zip(names, pixels, ok):
        core = png_native.decode_png(files[name], channels)
        assert good == isinstance(core, np.ndarray), name
        if good:
            want = _tf_decode(files[name], channels)
            assert want is not None, f"{name}: the operator decoded a file TF refuses"
            np.testing.assert_array_equal(px, want, err_msg=name)
            np.testing.assert_array_equal(px, core, err_msg=name)
        else:
            assert px.shape == (0, 0, channels), name
    assert sum(ok) > len(sound) // 2, (sum(ok), len(sound))


# ---- through the dataset ---------------------------------------------------------------

H, W = 24, 32  # every image this size, so the dataset's resize copies it


# What Keras decodes in each colour mode besides PNG: TF's BMP decoder takes 3 or 4
# channels, its JPEG decoder 1 or 3.
OTHERS = {"rgb": ("jpg", "bmp"), "grayscale": ("jpg",), "rgba": ("bmp",)}


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """Per colour mode, (good, bad): two classes of same-size files, PNGs of every 8-bit
    colour type (the ones the core takes and the ones it leaves to DALI's decoder) and
    the other formats Keras decodes in that mode; `bad` adds a CRC-valid PNG whose
    Deflate data is scrambled and a truncated JPEG or BMP."""
    from PIL import Image

    root = tmp_path_factory.mktemp("dali_png_op")
    rng = np.random.default_rng(3)
    out = {}
    for mode, others in OTHERS.items():
        good, bad = root / mode / "good", root / mode / "bad"
        for cls in ["cats", "dogs"]:
            (good / cls).mkdir(parents=True)
            for i in range(9):
                px = _photo(rng, H, W)
                if i % 3 == 0:
                    (good / cls / f"rgba_{i}.png").write_bytes(
                        encode_png(np.concatenate([px, px[..., :1]], -1)))
                elif i % 3 == 1:
                    save(good / cls / f"grey_{i}.png", px[..., 0])
                else:
                    save(good / cls / f"rgb_{i}.png", px)
            for ext in others:
                Image.fromarray(_photo(rng, H, W)).save(
                    good / cls / f"photo.{ext}", format={"jpg": "JPEG", "bmp": "BMP"}[ext])
        shutil.copytree(good, bad)
        (bad / "cats" / "scrambled.png").write_bytes(
            broken_streams(photo(rng, H, W))["scrambled.png"])
        other = (good / "dogs" / f"photo.{others[0]}").read_bytes()
        (bad / "dogs" / f"truncated.{others[0]}").write_bytes(other[:len(other) // 2])
        out[mode] = good, bad
    return out


KW = dict(image_size=(H, W), batch_size=5, verbose=False)


def _keras(root, mode):
    import keras

    ds = keras.utils.image_dataset_from_directory(str(root), shuffle=False, color_mode=mode,
                                                  **KW)
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    return np.concatenate(xs), np.concatenate(ys), list(ds.file_paths)


def _check_pixels(dist, which, paths):
    """PNGs exactly TF's pixels (the core's, or DALI's decoder's where it is exact);
    JPEG and BMP within DALI's documented tolerance (docs/parity.md)."""
    for d, k in zip(dist, which):
        assert d <= (0 if paths[k].endswith(".png") else 1), (paths[k], d)


def _epoch(ds):
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    return np.concatenate(xs), np.concatenate(ys)


def _match(got, ref):
    """Per image of `got`: the index of the closest reference image, and the distance."""
    d = np.abs(got[:, None].astype(np.float64) - ref[None]).reshape(len(got), len(ref), -1)
    d = d.max(-1)
    return d.argmin(1), d.min(1)


def _pngs(root) -> list[str]:
    return sorted(str(p) for p in root.rglob("*.png"))


@needs_op
@pytest.mark.parametrize("mode", list(MODES))
def test_dataset_pixels_exact_and_every_file_once_over_two_shuffled_epochs(trees, mode):
    good, _ = trees[mode]
    ref_x, ref_y, paths = _keras(good, mode)
    ds = ours(str(good), decoder="dali", shuffle=True, seed=5, color_mode=mode, **KW)
    loader = ds.loader.engine
    assert loader.png_native
    orders = []
    for _ in range(2):
        x, y = _epoch(ds)
        which, dist = _match(x, ref_x)
        assert sorted(which) == list(range(len(ref_x)))  # every file once
        np.testing.assert_array_equal(y, ref_y[which])
        _check_pixels(dist, which, paths)
        orders.append(list(which))
    assert orders[0] != orders[1]
    stats = loader.epoch_stats
    assert [s["files"] for s in stats] == [len(ref_x)] * 2
    assert all(0 < s["png_native"] <= len(_pngs(good)) for s in stats)
    assert stats[0]["png_native"] == stats[1]["png_native"]


@needs_op
@pytest.mark.parametrize("mode", list(MODES))
def test_libpng_keeps_dalis_decoder(trees, mode):
    good, _ = trees[mode]
    ds = ours(str(good), decoder="dali", shuffle=False, png_decoder="libpng", color_mode=mode,
              **KW)
    assert not ds.loader.engine.png_native
    x, _ = _epoch(ds)
    ref_x, _, paths = _keras(good, mode)
    assert np.abs(x.astype(np.float64) - ref_x).max() <= 1  # DALI's libpng, as before
    assert "png_native" not in ds.loader.epoch_stats[0]


@needs_op
@pytest.mark.parametrize("mode", list(MODES))
def test_corrupt_files_named_under_raise(trees, mode):
    _, bad = trees[mode]
    ds = ours(str(bad), decoder="dali", shuffle=False, color_mode=mode, **KW)
    assert ds.loader.engine.png_native
    with pytest.raises(Exception, match=r"scrambled\.png|truncated\.(jpg|bmp)"):
        for _ in ds:
            pass


@needs_op
@pytest.mark.parametrize("mode", list(MODES))
def test_corrupt_files_skipped_and_recorded_over_two_shuffled_epochs(trees, mode):
    good, bad = trees[mode]
    ref_x, ref_y, paths = _keras(good, mode)
    ds = ours(str(bad), decoder="dali", shuffle=True, seed=2, on_error="skip", color_mode=mode,
              **KW)
    assert ds.loader.engine.png_native
    for _ in range(2):
        x, y = _epoch(ds)
        which, dist = _match(x, ref_x)
        assert sorted(which) == list(range(len(ref_x)))
        _check_pixels(dist, which, paths)
        np.testing.assert_array_equal(y, ref_y[which])
    assert sorted(ds.loader.skipped) == sorted(
        [str(bad / "cats" / "scrambled.png"), str(bad / "dogs" / f"truncated.{OTHERS[mode][0]}")])


@needs_op
def test_plugin_handoff_decodes_with_the_operator(trees):
    good, _ = trees["rgb"]
    ref_x, ref_y, paths = _keras(good, "rgb")
    ds = ours(str(good), decoder="dali", shuffle=False, handoff="plugin", **KW)
    assert ds.loader.engine.png_native
    x, y = _epoch(ds)
    _check_pixels(np.abs(x.astype(np.float64) - ref_x).reshape(len(x), -1).max(-1),
                  range(len(x)), paths)
    np.testing.assert_array_equal(y, ref_y)


@needs_op
def test_big_png_route_and_the_operator_together(trees, monkeypatch, tmp_path):
    """PNGs over `BIG_PNG_PIXELS` still go to TF before DALI (`HostPixels`); the others
    to the operator."""
    from dali_loader.decode import png_stage

    monkeypatch.setattr(png_stage, "BIG_PNG_PIXELS", H * W - 1)  # every image is "big"
    small = tmp_path / "tree"
    shutil.copytree(trees["rgb"][0], small)
    tiny = _photo(np.random.default_rng(9), 4, 4)
    (small / "cats" / "tiny.png").write_bytes(encode_png(tiny))
    ds = ours(str(small), decoder="dali", shuffle=False, **KW)
    x, _ = _epoch(ds)
    ref_x, _, paths = _keras(small, "rgb")
    assert np.abs(x.astype(np.float64) - ref_x).max() < 0.01  # tiny.png is resized
    (stats,) = ds.loader.epoch_stats
    assert stats["host_png_decodes"] == len(_pngs(trees["rgb"][0]))
    assert stats["png_native"] == 1  # tiny.png


def test_selection():
    """The plan picks the operator for png_decoder=None where it loads (this machine's
    probe; tests/test_plan.py covers a GPU with JPEGs)."""
    from dali_loader import probes
    from dali_loader.plan import Options, PngWhere, resolve
    from dali_loader.storage.source import SourceKind

    def where(png_decoder):
        env = probes.environment(SourceKind.LOCAL_DISK, ["a/x.png"])
        return resolve(Options(decoder="dali", png_decoder=png_decoder), env).png_where

    assert where("libpng") is PngWhere.DALI and where("wuffs") is PngWhere.FEED
    assert (where(None) is PngWhere.DALI_OP) == dali_png.available()


def test_unbuilt_operator_keeps_dalis_decoder_said_once(monkeypatch, caplog, tmp_path, id_tree):
    monkeypatch.setattr(dali_png, "_state", {})
    monkeypatch.setattr(dali_png, "LIBRARY", str(tmp_path / "missing.so"))
    with caplog.at_level("WARNING", logger=dali_png.__name__):
        for _ in range(2):
            ds = ours(str(id_tree), decoder="dali", **KW)
            assert not ds.loader.engine.png_native
    said = [r for r in caplog.records if "not available" in r.getMessage()]
    assert len(said) == 1 and "missing.so" in said[0].getMessage()
    assert "build_dali" in said[0].getMessage()


@needs_op
def test_open_loader_decodes_pngs_with_the_operator(trees):
    """The TF-free entry point (`dali_loader.api.open_loader`) takes the same default."""
    from dali_loader.api import open_loader

    good, _ = trees["rgb"]
    loader = open_loader(str(good), batch_size=5, image_size=(H, W), shuffle=False)
    assert loader.png_native
    n = sum(len(x) for x, _ in loader)
    (stats,) = loader.epoch_stats
    assert n == stats["files"] and 0 < stats["png_native"] <= len(_pngs(good))


@needs_op
def test_batches_with_one_branch_empty(tmp_path):
    """A batch where the operator takes every file (DALI's decoder gets none) and one where
    it takes none: both branches of the graph see empty batches."""
    rng = np.random.default_rng(4)
    for i in range(4):
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "a" / f"{i}.png").write_bytes(encode_png(_photo(rng, H, W)))
        save(tmp_path / "b" / f"{i}.jpg", _photo(rng, H, W), "JPEG")
    ref_x, ref_y, paths = _keras(tmp_path, "rgb")
    ds = ours(str(tmp_path), decoder="dali", shuffle=False, color_mode="rgb",
              **dict(KW, batch_size=4))
    x, y = _epoch(ds)
    _check_pixels(np.abs(x.astype(np.float64) - ref_x).reshape(len(x), -1).max(-1),
                  range(len(x)), paths)
    np.testing.assert_array_equal(y, ref_y)
    assert ds.loader.epoch_stats[0]["png_native"] == 4
