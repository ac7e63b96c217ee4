"""The native PNG core's TF op (`decode/tf_png`, `native/tf_png_op.cc`), through the op
and through the dataset: exactly TF's outcome (pixels, or TF's error) for every file of the
generated corpus, photos with every filter type and seeded mutants, in rgb, grayscale and
rgba; the CPU default with it is Keras's output bit for bit, every file exactly once over two
shuffled epochs, corrupt files named under on_error="raise" and recorded under "skip".

Real TF and Keras. PngSuite (../shared/pngsuite) is an extra when present."""

from __future__ import annotations

import collections
import logging
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from support.helpers import _photo, save
from dali_loader import probes
from dali_loader.decode import tf_png
from dali_loader.plan import Options, PngDecoder, PngWhere, resolve
from dali_loader.storage.source import SourceKind
from dali_loader.errors import CorruptImageError
from support import mutate, png_corpus
from support.pngs import encode_png
from tf_adapter import image_dataset_from_directory as ours

pytestmark = pytest.mark.skipif(not tf_png.available(),
                                reason=f"the TF op is not built: {tf_png.unavailable_reason()}")

MODES = {"rgb": 3, "grayscale": 1, "rgba": 4}
SIZE = (9, 7)


def _photos() -> dict[str, bytes]:
    """Photo-like PNGs: each row filter alone and all five, 1, 3 and 4 channels."""
    rng = np.random.default_rng(5)
    out = {}
    for filters in ((0,), (1,), (2,), (3,), (4,), (0, 1, 2, 3, 4)):
        px = _photo(rng, 37, 53)
        out[f"photo_f{''.join(map(str, filters))}.png"] = encode_png(px, filters)
    px = _photo(rng, 29, 31)
    out["photo_grey.png"] = encode_png(px[:, :, :1], (4,))
    out["photo_rgba.png"] = encode_png(np.concatenate([px, px[:, :, :1]], -1), (0, 1, 2, 3, 4))
    return out


def _adam7_one_row_overruns() -> dict[str, bytes]:
    """Interlaced PNGs one row high whose zlib stream gives more data than the image
    needs and never ends: libpng refuses them; Wuffs, whose last pass with pixels is
    not the 7th, stopped reading once it was full (the core decoded them until it
    left these to libpng)."""
    import struct
    import zlib

    from support.pngs import chunk

    out = {}
    for w in (1, 2, 5, 9):
        rows = b""
        for x0, dx in ((0, 8), (4, 8), (2, 4), (1, 2)):  # Adam7's passes that touch row 0
            n = len(range(x0, w, dx))
            rows += b"\x00" + b"\x7f" * 3 * n if n else b""
        co = zlib.compressobj()
        stream = co.compress(rows + b"\xa0" * 4) + co.flush(zlib.Z_SYNC_FLUSH)
        ihdr = struct.pack(">IIBBBBB", w, 1, 8, 2, 0, 0, 1)
        out[f"adam7_{w}x1_overrun.png"] = (png_corpus.SIGNATURE + chunk(b"IHDR", ihdr)
                                           + chunk(b"IDAT", stream) + chunk(b"IEND", b""))
    return out


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    """The generated corpus, the photos, 450 seeded mutants of both, 300 of every valid
    corpus file, and interlaced one-row PNGs whose stream overruns."""
    photos = _photos()
    base = {**png_corpus.corpus(), **photos, **_adam7_one_row_overruns()}
    sources = list(photos.values()) + [v for k, v in png_corpus.valid_corpus().items()
                                       if k.endswith("13x11.png")]
    mutants = {f"m{n}": b for n, b in mutate.corpus(sources, 450, seed=27)}
    sound = [b for _, b in sorted(png_corpus.valid_corpus().items())]
    mutants.update({f"s{n}": b for n, b in mutate.corpus(sound, 300, seed=27)})
    return {**base, **mutants}


def _clean(message: str) -> str:
    """TF's error message without node and function names (they differ by graph)."""
    line = str(message).strip().splitlines()[0]
    return re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:\w+\]", "", line).strip()


def _outcome(fn, data: bytes):
    try:
        px = fn(tf.constant(data)).numpy()
    except (tf.errors.OpError, ValueError) as e:
        return ("error", type(e).__name__, _clean(getattr(e, "message", e)))
    return ("pixels", px.shape, px.tobytes())


def _decoders(channels: int):
    native = tf.function(lambda d: tf_png.decode_image_like_keras(d, channels, tf))
    keras_like = tf.function(lambda d: tf.image.decode_image(
        d, channels=channels, expand_animations=False))
    raw = tf.function(lambda d: tf_png.decode_png(d, channels))
    return native, keras_like, raw


def _check_files(files: dict[str, bytes], channels: int) -> collections.Counter:
    """Asserts the op's route gives TF's outcome for each file; counts what the op did."""
    native, keras_like, raw = _decoders(channels)
    counts = collections.Counter()
    differ = []
    for name, data in files.items():
        want = _outcome(keras_like, data)
        got = _outcome(native, data)
        img, ok = raw(tf.constant(data))
        ok = bool(ok)
        if ok:  # the op's own pixels are TF's, and it never takes a file TF rejects
            if want[0] != "pixels" or img.numpy().tobytes() != want[2] or img.shape != want[1]:
                differ.append((name, "op pixels"))
        else:
            assert img.shape == (0, 0, channels), name
        if got != want:
            differ.append((name, got[:2], want[:2]))
        counts["native" if ok else "tf"] += 1
        counts["tf_rejects"] += want[0] == "error"
    assert differ == [], differ[:10]
    return counts


@pytest.mark.parametrize("color_mode", list(MODES))
def test_op_gives_tfs_outcome(files, color_mode):
    channels = MODES[color_mode]
    counts = _check_files(files, channels)
    # The core decodes: every photo natively (a build that always falls back fails here),
    # and most of the corpus.
    _, _, raw = _decoders(channels)
    for name, data in _photos().items():
        assert bool(raw(tf.constant(data))[1]), f"{name} was not decoded by the native core"
    assert counts["native"] >= 300, counts
    assert counts["tf_rejects"] >= 19, counts


@pytest.mark.parametrize("color_mode", list(MODES))
def test_op_on_pngsuite(pngsuite, color_mode):
    files = {p.name: p.read_bytes() for p in sorted(pngsuite.glob("*.png"))}
    counts = _check_files(files, MODES[color_mode])
    assert counts["native"] >= 100, counts


def test_op_shapes_and_arguments():
    data = tf.constant(_photos()["photo_f4.png"])
    for channels in (1, 3, 4):
        img, ok = tf_png.decode_png(data, channels)
        assert bool(ok) and img.shape == (37, 53, channels) and img.dtype == tf.uint8
    spec = tf.function(lambda d: tf_png.decode_image_like_keras(d, 3, tf)).get_concrete_function(
        tf.TensorSpec((), tf.string))
    assert spec.structured_outputs.shape.as_list() == [None, None, 3]
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="channels=2"):
        tf_png.decode_png(data, 2)
    # Over max_pixels (37 x 53 > 1000): left to TF's decoder, which decodes it.
    img, ok = tf_png.decode_png(data, 3, max_pixels=1000)
    assert not bool(ok) and img.shape == (0, 0, 3)
    img, ok = tf_png.decode_png(tf.constant(mutate.huge_header_png()), 3)  # never allocates it
    assert not bool(ok) and img.shape == (0, 0, 3)


def _trees(tmp_path_factory, files):
    """(mixed, clean, corrupt names): the photos and the valid corpus in two classes,
    with mutants TF decodes; `mixed` adds the corrupt corpus and mutants TF rejects."""
    clean = tmp_path_factory.mktemp("clean")
    mixed = tmp_path_factory.mktemp("mixed")
    decode = tf.function(lambda d: tf.image.decode_image(d, channels=3, expand_animations=False))
    bad = []
    for i, (name, data) in enumerate(sorted(files.items())):
        rejects = _outcome(decode, data)[0] == "error"
        if name.startswith(("m", "s")) and i % 3:  # a third of the mutants
            continue
        cls = "a" if name.startswith(("photo", "m", "s")) else "b"
        fname = name if name.endswith(".png") else name + ".png"
        for root in (mixed,) if rejects else (mixed, clean):
            (root / cls).mkdir(exist_ok=True)
            (root / cls / fname).write_bytes(data)
        if rejects:
            bad.append(str(mixed / cls / fname))
    return mixed, clean, sorted(bad)


@pytest.fixture(scope="module")
def trees(tmp_path_factory, files):
    return _trees(tmp_path_factory, files)


def _keras(clean, color_mode, **kw):
    return keras.utils.image_dataset_from_directory(
        str(clean), color_mode=color_mode, image_size=SIZE, batch_size=16, shuffle=False,
        verbose=False, **kw)


def _serialized(ds) -> bytes:
    """The graphs of every function in `ds`'s pipeline (its maps' decode among them),
    serialized. The pipeline starts at TF's `GeneratorDataset` op, which cannot be
    serialized as a whole (issue 29), so each dataset's functions are read instead."""
    out, todo, seen = [], [ds], set()
    while todo:
        d = todo.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        for fn in vars(d).values():
            graph = getattr(getattr(fn, "function", None), "graph", None)
            if graph is not None:
                out.append(graph.as_graph_def().SerializeToString())
        todo.extend(d._inputs())
    assert out, "no function found in the pipeline: this check would be vacuous"
    return b"".join(out)


@pytest.mark.parametrize("color_mode", list(MODES))
def test_dataset_is_keras_bit_for_bit(trees, color_mode):
    """In file order: every image and label exactly Keras's, through the op."""
    mixed, clean, bad = trees
    # rgba: Keras decodes no file that TF's decode_image cannot (no JPEG here).
    ref = _keras(clean, color_mode)
    ds = ours(str(clean), color_mode=color_mode, image_size=SIZE, batch_size=16, shuffle=False,
              verbose=False, png_decoder="wuffs")
    assert ds.loader.plan.png_epoch is PngDecoder.WUFFS
    assert b"DaliLoaderDecodePng" in _serialized(ds)
    got_x, got_y = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    ref_x, ref_y = zip(*[(x.numpy(), y.numpy()) for x, y in ref])
    np.testing.assert_array_equal(np.concatenate(got_y), np.concatenate(ref_y))
    np.testing.assert_array_equal(np.concatenate(got_x), np.concatenate(ref_x))


@pytest.mark.parametrize("color_mode", list(MODES))
def test_two_shuffled_epochs_exactly_once_bad_files_recorded(trees, color_mode):
    mixed, clean, bad = trees
    ref = collections.Counter(
        (x.tobytes(), int(y)) for xb, yb in _keras(clean, color_mode)
        for x, y in zip(xb.numpy(), yb.numpy()))
    ds = ours(str(mixed), color_mode=color_mode, image_size=SIZE, batch_size=16, shuffle=True,
              seed=7, on_error="skip", verbose=False)  # the default: the op where built
    assert ds.loader.plan.png_epoch is PngDecoder.WUFFS
    orders = []
    for _ in range(2):
        got = [(x.tobytes(), int(y)) for xb, yb in ds for x, y in zip(xb.numpy(), yb.numpy())]
        assert collections.Counter(got) == ref  # every good file once, with its label
        orders.append(got)
    assert orders[0] != orders[1]
    assert sorted(ds.loader.skipped) == bad


def test_corrupt_file_named_under_raise(tmp_path):
    good = _photos()
    for name, data in good.items():
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "a" / name).write_bytes(data)
    broken = tmp_path / "a" / "photo_zz_adler.png"
    broken.write_bytes(png_corpus.corrupt_corpus()["xk_bad_adler.png"])
    ds = ours(str(tmp_path), image_size=SIZE, batch_size=4, shuffle=False, verbose=False)
    assert ds.loader.plan.png_epoch is PngDecoder.WUFFS
    with pytest.raises((CorruptImageError, tf.errors.OpError)) as err:
        for _ in ds:
            pass
    msg = str(err.value)  # TF's own error for the file, named by the audit
    assert f"Cannot load image file {broken}" in msg and "Invalid PNG data" in msg, msg


def test_libpng_forces_tfs_decoder(trees):
    mixed, clean, bad = trees
    ds = ours(str(clean), image_size=SIZE, batch_size=16, shuffle=False, verbose=False,
              png_decoder="libpng")
    assert ds.loader.plan.png_epoch is PngDecoder.LIBPNG
    assert b"DaliLoaderDecodePng" not in _serialized(ds)


def _photo_tree(root, fmts: tuple[str, ...]):
    """Photos in two classes, cycling through `fmts` ("PNG", "JPEG")."""
    rng = np.random.default_rng(11)
    for i in range(12):
        fmt = fmts[i % len(fmts)]
        ext = {"PNG": "png", "JPEG": "jpg"}[fmt]
        save(root / f"c{i % 2}" / f"{i:02d}.{ext}", _photo(rng, 30 + i, 41 - i), fmt)
    return root


def _same_as_keras(root, **kw):
    """Ours (the CPU default) against Keras over `root`, in file order: bit for bit."""
    ds = ours(str(root), image_size=SIZE, batch_size=5, shuffle=False, verbose=False, **kw)
    ref = keras.utils.image_dataset_from_directory(str(root), image_size=SIZE, batch_size=5,
                                                   shuffle=False, verbose=False)
    got = [(x.numpy(), y.numpy()) for x, y in ds]
    want = [(x.numpy(), y.numpy()) for x, y in ref]
    assert len(got) == len(want) == 3
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gy, wy)
        np.testing.assert_array_equal(gx, wx)
    return ds


@pytest.mark.parametrize("png_decoder", [None, "wuffs"])
def test_jpeg_folder_graph_has_no_op(tmp_path, png_decoder):
    """No file named as a PNG: Keras's decode alone, no op nor its `tf.cond` per file
    (issue 29): the plan says so, and the pixels are Keras's."""
    ds = _same_as_keras(_photo_tree(tmp_path, ("JPEG",)), png_decoder=png_decoder)
    assert ds.loader.plan.png_where is PngWhere.TF and "no file is named .png" in dict(
        (f, why) for f, _, why in ds.loader.plan.rows())["png_epoch"]
    graphs = _serialized(ds)
    assert b"DaliLoaderDecodePng" not in graphs
    assert b"DecodeImage" in graphs  # the decode is there, TF's


def test_mixed_folder_decodes_pngs_by_the_op_and_jpegs_by_tf(tmp_path):
    ds = _same_as_keras(_photo_tree(tmp_path, ("PNG", "JPEG")))
    graphs = _serialized(ds)
    assert b"DaliLoaderDecodePng" in graphs and b"DecodeImage" in graphs


def test_png_named_otherwise_still_decodes_like_keras(tmp_path):
    """A PNG under a .jpg name in a folder with no .png: TF's decoder, Keras's pixels."""
    root = _photo_tree(tmp_path, ("JPEG",))
    png = tmp_path / "c0" / "00.jpg"
    save(png, _photo(np.random.default_rng(3), 33, 27), "PNG")
    assert png.read_bytes()[:8] == png_corpus.SIGNATURE
    ds = _same_as_keras(root)
    assert b"DaliLoaderDecodePng" not in _serialized(ds)


def test_routes():
    """Where PNGs are decoded on this machine, by its probes (tests/test_plan.py injects
    the others: a GPU, a folder with JPEGs, nothing built)."""
    from dali_loader.decode import dali_png

    def where(**options):
        env = probes.environment(SourceKind.LOCAL_DISK, ["a/x.png"])
        return resolve(Options(device="cpu", **options), env).png_where

    assert where() is PngWhere.TF_OP
    assert where(png_decoder="libpng") is PngWhere.TF
    assert where(service="grpc://localhost:1") is PngWhere.TF  # the workers: TF's graph
    assert where(decoder="dali") is (PngWhere.DALI_OP if dali_png.available() else PngWhere.DALI)
    assert where(decoder="dali", png_decoder="libpng") is PngWhere.DALI


def test_missing_build_falls_back_said_once(tmp_path, monkeypatch, caplog):
    """Without the op library: None is libpng with one warning naming `make install`;
    "wuffs" raises an ImportError naming the build step."""
    save(tmp_path / "a" / "p.png", _photo(np.random.default_rng(1), 20, 20))
    monkeypatch.setattr(tf_png, "OP_LIBRARY", tmp_path / "missing.so")
    monkeypatch.setattr(tf_png, "_ops", None)
    monkeypatch.setattr(tf_png, "_error", None)
    monkeypatch.setattr(probes, "_said", set())
    with caplog.at_level(logging.WARNING, logger="dali_loader.probes"):
        for _ in range(2):
            ds = ours(str(tmp_path), image_size=SIZE, verbose=False)
            assert ds.loader.plan.png_epoch is PngDecoder.LIBPNG
            assert len(list(ds)) == 1
    said = [r.getMessage() for r in caplog.records if "TF op" in r.getMessage()]
    assert len(said) == 1 and "make install" in said[0], said
    with pytest.raises(ImportError, match="dali_loader.native.build_tf"):
        ours(str(tmp_path), png_decoder="wuffs", verbose=False)
