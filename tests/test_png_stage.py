"""The fast PNG decoder through the dataset: the CPU default and decoder="dali" deliver
Keras's images (bit for bit on the CPU default), every good file once per epoch with its
label over shuffled epochs, every bad one recorded; `png_decoder` picks the decoder."""

from __future__ import annotations

import collections
import logging
import shutil

import keras
import numpy as np
import pytest

from support.helpers import _photo, save
from dali_loader import probes
from dali_loader.decode import png_cpu, png_stage
from dali_loader.decode.png_cpu import Fallback, decode_png
from dali_loader.plan import PngWhere
from dali_loader.decode.png_stage import KerasPixels, RawOrCheckedItems
from dali_loader.feed.items import Paths
from support.mutate import mutate
from support.pngs import encode_png
from tf_adapter import image_dataset_from_directory as ours

pytestmark = pytest.mark.skipif(not png_cpu.available(), reason="pywuffs is not installed")

# Generated PNGs (support.png_corpus) of every kind: grey/palette low depths,
# 16-bit, interlaced, alpha, tRNS colour keys and a gamma file (the last two partly go to
# TF's decoder). They stand in for PngSuite's basn0g01, basn0g16, basn2c16, basn3p04,
# basi2c08, basn4a08, basn6a16, tbrn2c08, tbbn3p08 and g03n2c08. The corpus's variants of
# one colour type, depth and size share their pixels, so each file here is the only one of
# its (type, depth, size): the test tells files apart by their pixels.
SUITE = ("g01_i0_plain_13x11.png", "g16_i0_plain_13x11.png", "c16_i0_plain_13x11.png",
         "p04_i0_plain_13x11.png", "c08_i1_plain_3x2.png", "a08_i0_plain_13x11.png",
         "r16_i0_plain_13x11.png", "c08_i0_trns_13x11.png", "p08_i0_trns_13x11.png",
         "r08_i0_gamma45_13x11.png")
SIZE = (17, 23)


def _make_trees(tmp_path_factory, pngs, jpeg: bool):
    """(mixed, clean): PNGs of every kind (and a JPEG: Keras decodes none in rgba),
    with corrupt PNGs; and the same tree without them (what Keras can load)."""
    clean = tmp_path_factory.mktemp("clean")
    rng = np.random.default_rng(11)
    for i in range(6):
        save(clean / "a" / f"photo_{i}.png", _photo(rng, 30 + i, 40))
    save(clean / "a" / "rgba.png", np.concatenate([_photo(rng, 25, 25),
                                                   np.full((25, 25, 1), 99, np.uint8)], -1))
    (clean / "a" / "filters.png").write_bytes(encode_png(_photo(rng, 31, 29), (0, 1, 2, 3, 4)))
    if jpeg:
        save(clean / "a" / "j.jpg", _photo(rng, 32, 36), "JPEG")
    (clean / "b").mkdir()
    for name in SUITE:
        shutil.copy(pngs / name, clean / "b" / name)
    mixed = tmp_path_factory.mktemp("mixed")
    shutil.copytree(clean, mixed, dirs_exist_ok=True)
    good = (clean / "a" / "photo_0.png").read_bytes()
    (mixed / "b" / "truncated.png").write_bytes(good[:-40])
    found = 0
    for seed in range(100):  # CRC-valid IDAT damage that TF rejects
        bad = mutate(good, "idat_flip", np.random.default_rng(seed))
        if found < 2 and isinstance(decode_png(bad, 3), Fallback):
            import tensorflow as tf

            try:
                tf.io.decode_png(bad)
            except tf.errors.OpError:
                (mixed / "b" / f"adler_{found}.png").write_bytes(bad)
                found += 1
    assert found == 2
    return mixed, clean


@pytest.fixture(scope="module")
def trees(tmp_path_factory, pngs):
    return _make_trees(tmp_path_factory, pngs, jpeg=True)


@pytest.fixture(scope="module")
def png_trees(tmp_path_factory, pngs):
    return _make_trees(tmp_path_factory, pngs, jpeg=False)


def _reference(clean, color_mode):
    """Keras's image and label for each file (relative name)."""
    ds = keras.utils.image_dataset_from_directory(
        str(clean), color_mode=color_mode, image_size=SIZE, batch_size=None, shuffle=False,
        verbose=False)
    names = [p[len(str(clean)) + 1:] for p in ds.file_paths]
    return {n: (x.numpy(), int(y)) for n, (x, y) in zip(names, ds)}


def _fallbacks(root, channels) -> int:
    """PNG files (by content) the fast decoder leaves to TF in this mode."""
    return sum(isinstance(decode_png(p.read_bytes(), channels), Fallback)
               for p in root.rglob("*") if p.is_file() and p.read_bytes()[:8] == png_cpu.SIGNATURE)


@pytest.mark.parametrize("color_mode", ["rgb", "grayscale", "rgba"])
@pytest.mark.parametrize("decoder", [None, "dali"])
def test_every_file_once_with_its_label_keras_pixels(trees, png_trees, decoder, color_mode):
    mixed, clean = png_trees if color_mode == "rgba" else trees
    ref = _reference(clean, color_mode)
    ds = ours(str(mixed), color_mode=color_mode, image_size=SIZE, batch_size=5, shuffle=True,
              seed=3, on_error="skip", decoder=decoder, verbose=False, png_decoder="wuffs")
    loader = ds.loader.engine
    items = loader.feed.items if decoder else loader.items
    # The CPU default decodes in TF's graph, PNGs by the native core's op (tf_png).
    assert isinstance(items, RawOrCheckedItems if decoder else Paths)
    if decoder is None:  # the graph reads its decoder from the plan
        assert loader.plan.png_where is PngWhere.TF_OP
    orders = []
    for epoch in range(2):
        got = [(x, int(y)) for xb, yb in ds for x, y in zip(xb.numpy(), yb.numpy())]
        assert len(got) == len(ref)
        matched = []
        for x, y in got:  # each delivered image is exactly one file's, with its label
            errs = {n: np.abs(x.astype(np.float64) - r).mean() for n, (r, _) in ref.items()}
            name = min(errs, key=errs.get)
            assert errs[name] == 0 if decoder is None else errs[name] < 1.0, (name, errs[name])
            assert y == ref[name][1], name
            matched.append(name)
        assert sorted(matched) == sorted(ref), "every good file exactly once"
        orders.append(matched)
    assert orders[0] != orders[1]  # shuffled per epoch
    assert sorted(loader.skipped) == sorted(str(mixed / "b" / n)
                                            for n in ("truncated.png", "adler_0.png", "adler_1.png"))
    if decoder is None:  # no Python per image in the graph: nothing counted
        return
    channels = {"rgb": 3, "grayscale": 1, "rgba": 4}[color_mode]
    stats = loader.epoch_stats[-1]
    pngs = sum(1 for p in mixed.rglob("*") if p.is_file()
               and p.read_bytes()[:8] == png_cpu.SIGNATURE)
    assert stats["png_fallbacks"] == _fallbacks(mixed, channels)
    assert stats["png_fast"] + stats["png_fallbacks"] == pngs
    assert stats["png_fast"] >= 10


@pytest.mark.parametrize("color_mode", ["rgb", "grayscale", "rgba"])
def test_big_pngs_among_raw_entries(png_trees, color_mode, monkeypatch):
    """decoder="dali" with Wuffs, the six photos over the big-PNG size: raw entries
    and PNGs TF decodes as their batch enters DALI share batches; the images are
    those of every PNG as a raw entry (TF's pixels either way, resized by DALI)."""
    mixed, clean = png_trees
    kw = dict(color_mode=color_mode, image_size=SIZE, batch_size=5, shuffle=False,
              decoder="dali", png_decoder="wuffs", verbose=False)
    want = np.concatenate([x.numpy() for x, _ in ours(str(clean), **kw)])
    monkeypatch.setattr(png_stage, "BIG_PNG_PIXELS", 30 * 40 - 1)  # the photos: 30..35 x 40
    ds = ours(str(clean), **kw)
    for _ in range(2):
        np.testing.assert_array_equal(np.concatenate([x.numpy() for x, _ in ds]), want)
        assert ds.loader.epoch_stats[-1]["host_png_decodes"] == 6


@pytest.mark.parametrize("png_decoder", [None, "libpng"])
def test_png_decoder_libpng_keeps_tfs_own_path(trees, png_decoder):
    """TF's graph decodes each epoch, PNGs by the native core's op by default
    (`tf_png`), by TF's libpng with "libpng": the same pixels, Keras's."""
    mixed, clean = trees
    ds = ours(str(clean), image_size=SIZE, batch_size=4, shuffle=False, verbose=False,
              png_decoder=png_decoder)
    assert isinstance(ds.loader.engine.items, Paths)
    ref = _reference(clean, "rgb")
    got = np.concatenate([x.numpy() for x, _ in ds])
    np.testing.assert_array_equal(got, np.stack([r for r, _ in ref.values()]))
    assert "png_fast" not in ds.loader.epoch_stats[-1]


def test_png_decoder_arguments(trees, monkeypatch, caplog, tmp_path):
    mixed, clean = trees
    with pytest.raises(ValueError, match="Received: png_decoder='fast'"):
        ours(str(clean), png_decoder="fast", verbose=False)
    with pytest.raises(ValueError, match="service"):
        ours(str(clean), png_decoder="wuffs", service="grpc://localhost:1", verbose=False)
    monkeypatch.setattr(png_stage.png_native, "available", lambda: False)  # no native core
    monkeypatch.setattr(png_cpu, "available", lambda: False)
    with pytest.raises(ImportError, match="pip install pywuffs"):  # the DALI path's Wuffs
        ours(str(clean), png_decoder="wuffs", decoder="dali", verbose=False)
    monkeypatch.setattr(probes, "_said", set())
    with caplog.at_level(logging.WARNING, logger="dali_loader.probes"):
        ds = ours(str(clean), image_size=SIZE, verbose=False)  # the op: nothing to say
        assert isinstance(ds.loader.engine.items, Paths)
        for i in range(2):  # a GPU-ready cache fills with libpng instead: said once
            ds = ours(str(clean), image_size=SIZE, verbose=False, gpu_ready=True,
                      cache_dir=str(tmp_path / str(i)))
            assert not isinstance(ds.loader.engine.items.ready.decode, KerasPixels)
    said = [r for r in caplog.records if "Wuffs" in r.getMessage()]
    assert len(said) == 1 and "libpng" in said[0].getMessage()


def test_gpu_ready_fill_decodes_with_wuffs(trees, tmp_path):
    """The TF path's fill: the native op decodes the PNGs the core takes (Wuffs, in the
    graph); the feed's Wuffs stage (`KerasPixels`) gets only the ones it leaves, which
    it hands to TF's decoder, and the JPEGs."""
    from dali_loader.decode import png_native

    mixed, clean = trees
    ref = _reference(clean, "rgb")
    ds = ours(str(clean), image_size=SIZE, batch_size=None, shuffle=False, verbose=False,
              gpu_ready=True, cache_dir=str(tmp_path))
    assert ds.loader.plan.fill_where is PngWhere.TF_OP
    decode = ds.loader.engine.items.ready.decode
    assert isinstance(decode, KerasPixels)
    for _ in range(2):
        got = [x.numpy() for x, _ in ds]
        np.testing.assert_array_equal(np.stack(got), np.stack([r for r, _ in ref.values()]))
    pngs = [n for n in ref if n.endswith(".png")]
    left = sum(isinstance(png_native.decode_png((clean / n).read_bytes(), 3), Fallback)
               for n in pngs)
    assert len(pngs) - left >= 10  # decoded by the op
    assert (decode.counts["png_fast"], decode.counts["png_fallbacks"]) == (0, left)
    stats = ds.loader.epoch_stats
    assert stats[0]["cache_fills"] == len(ref) and stats[1].get("cache_fills", 0) == 0
    assert collections.Counter(s["cpu_decodes"] for s in stats) == {len(ref): 1, 0: 1}


def test_gpu_folder_with_jpegs_keeps_dalis_decoder(trees, png_trees):
    """On a GPU the Wuffs route is taken for folders without JPEGs only (nvJPEG keeps
    the JPEGs; a `mixed` decoder inside a per-sample branch is not documented by DALI).
    Checked on the loader, which builds no pipeline until an epoch starts."""
    from dali_loader.api import open_index
    from dali_loader.decode.dali_graph import Input
    from dali_loader.decode.spec import ImageSpec
    from dali_loader.feed.items import CheckedBytes
    from dali_loader.plan import Environment, Options, has_jpegs, resolve
    from dali_loader.tfdata.dataset import make_loader

    spec = ImageSpec(*SIZE, 3, "bilinear", False, False, False)
    for (mixed, _), input, items in ((trees, Input.FILES, CheckedBytes),
                                     (png_trees, Input.FILES_OR_RAW, RawOrCheckedItems)):
        src, index = open_index(str(mixed))
        with src:
            gpu = Environment(tf_gpus=1, dali_gpus=1, wuffs=True, png_core=True, dali_tf_plugin=True, cores=2,
                              source_kind=src.kind, has_jpegs=has_jpegs(index.paths))
            plan = resolve(Options(device="gpu", png_decoder="wuffs", batch_size=4), gpu)
            loader = make_loader(src, index, spec, plan, batch_size=4, shuffle=False, seed=0)
            assert loader.input is input and type(loader.feed.items) is items
            loader.close()
