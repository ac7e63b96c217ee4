"""Bad input: clear errors naming the file, skip mode that loses nothing, no hangs."""

from __future__ import annotations

import logging
import shutil
import struct
import zlib

import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from dali_loader.api import open_loader  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402


def _bad_zlib_png(good: bytes) -> bytes:
    """A PNG whose chunks and CRCs are sound but whose IDAT is not zlib data."""
    out, pos = bytearray(good[:8]), 8
    while pos < len(good):
        (length,) = struct.unpack(">I", good[pos : pos + 4])
        ctype = good[pos + 4 : pos + 8]
        data = good[pos + 8 : pos + 8 + length]
        if ctype == b"IDAT":
            data = bytes(b ^ 0x5A for b in data)
        out += struct.pack(">I", len(data)) + ctype + data
        out += struct.pack(">I", zlib.crc32(ctype + data))
        pos += 12 + length
    return bytes(out)


@pytest.fixture()
def bad_tree(tmp_path, id_tree, pngs):
    """id_tree with every corrupt PNG of `pngs` (generated; PngSuite's too where present)
    and a few more bad files."""
    from support.helpers import corrupt_pngs

    root = tmp_path / "bad"
    shutil.copytree(id_tree, root)
    bad = []
    for p in corrupt_pngs(pngs):
        bad.append(shutil.copy(p, root / "odd" / p.name))
    (root / "odd" / "empty.png").write_bytes(b"")
    (root / "even" / "text.png").write_text("hello, I am not a PNG")
    good = (root / "even" / "000.png").read_bytes()
    (root / "even" / "truncated.png").write_bytes(good[: len(good) // 2])
    (root / "odd" / "zlib.png").write_bytes(_bad_zlib_png(good))
    bad += [root / "odd" / n for n in ("empty.png", "zlib.png")]
    bad += [root / "even" / n for n in ("text.png", "truncated.png")]
    return root, sorted(str(b) for b in bad)


def test_missing_folder_names_it(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        ours(str(missing))


def test_no_images_is_keras_value_error(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("x")
    with pytest.raises(ValueError) as ref:
        keras.utils.image_dataset_from_directory(str(tmp_path))
    with pytest.raises(ValueError) as got:
        ours(str(tmp_path))
    assert str(got.value) == str(ref.value)


BAD_ARGS = [
    dict(labels="nope"),
    dict(labels=[0, 1], class_names=["a"]),
    dict(label_mode="sparse"),
    dict(color_mode="cmyk"),
    dict(image_size=(1, 2, 3)),
    dict(interpolation="cubic"),
    dict(validation_split=1.5, subset="training", seed=1),
    dict(validation_split=0.2),
    dict(subset="training"),
    dict(validation_split=0.2, subset="train", seed=1),
    dict(validation_split=0.2, subset="training"),
    dict(class_names=["ghost"]),
    dict(labels=[0, 1, 2]),
    dict(data_format="channels_middle"),
    dict(format="zip"),
]


@pytest.mark.parametrize("kw", BAD_ARGS, ids=str)
def test_argument_errors_match_keras(id_tree, kw):
    with pytest.raises(ValueError) as ref:
        keras.utils.image_dataset_from_directory(str(id_tree), verbose=False, **kw)
    with pytest.raises(ValueError) as got:
        ours(str(id_tree), verbose=False, **kw)
    assert str(got.value) == str(ref.value)


@pytest.mark.parametrize(
    "kw",
    [dict(on_error="ignore"), dict(num_threads=0), dict(max_in_flight=-1),
     dict(device="tpu"), dict(cache_max_bytes=0)],
    ids=str,
)
def test_loader_option_errors_echo_the_value(id_tree, kw):
    (name, value), = kw.items()
    with pytest.raises(ValueError, match=f"{name}={value}"):
        ours(str(id_tree), **kw)


def test_binary_needs_two_classes_like_keras(photo_tree):
    with pytest.raises(ValueError) as ref:
        keras.utils.image_dataset_from_directory(str(photo_tree), label_mode="binary")
    with pytest.raises(ValueError) as got:
        ours(str(photo_tree), label_mode="binary")
    assert str(got.value) == str(ref.value)


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_raise_mode_names_the_file_and_process_stays_usable(bad_tree, id_tree, decoder):
    root, bad = bad_tree
    ds = ours(str(root), shuffle=False, image_size=(8, 8), batch_size=4, decoder=decoder)
    with pytest.raises(tf.errors.OpError) as err:
        for _ in ds:
            pass
    msg = str(err.value)
    assert "Cannot load image file" in msg
    assert any(b in msg for b in bad), msg
    assert 'on_error="skip"' in msg
    # The process is fine: a good dataset still loads.
    good = ours(str(id_tree), labels=None, image_size=(8, 8), shuffle=False)
    assert sum(int(x.shape[0]) for x in good) == 23


def _good_and_one_zlib_bad(bad_tree, tmp_path, n_good: int, bad_name: str):
    """A class folder of `n_good` good PNGs and one whose zlib stream is garbage."""
    root, _ = bad_tree
    only = tmp_path / "one"
    (only / "c").mkdir(parents=True)
    for i in range(n_good):
        shutil.copy(root / "even" / f"{2 * i:03d}.png", only / "c" / f"{i}.png")
    shutil.copy(root / "odd" / "zlib.png", only / "c" / bad_name)
    return only


def test_tf_decoder_failure_past_the_checks_names_the_file(bad_tree, tmp_path):
    """TF's kernels reject a file the byte checks passed: the error still names it."""
    only = _good_and_one_zlib_bad(bad_tree, tmp_path, 5, "9z.png")  # last in the epoch
    ds = ours(str(only), shuffle=False, image_size=(8, 8), batch_size=2, decoder="tf")
    with pytest.raises(tf.errors.OpError, match="9z.png"):
        for _ in ds:
            pass
    ds = ours(str(only), shuffle=False, image_size=(8, 8), batch_size=2, decoder="tf",
              on_error="skip")
    for _ in range(2):
        assert sum(int(x.shape[0]) for x, _ in ds) == 5
    assert list(ds.loader.skipped) == [str(only / "c" / "9z.png")]


def test_decoder_failure_past_the_checks_names_the_file(bad_tree, tmp_path):
    only = _good_and_one_zlib_bad(bad_tree, tmp_path, 6, "3b.png")
    kw = dict(batch_size=3, image_size=(8, 8), shuffle=False, device="cpu")
    loader = open_loader(str(only), **kw)
    with pytest.raises(ValueError, match="3b.png"):
        list(loader)
    skip = open_loader(str(only), on_error="skip", **kw)
    for _ in range(2):  # each epoch names the bad file again and keeps the 6 good ones
        n = sum(len(x) for x, _ in skip)
        assert n == 6
    assert list(skip.skipped) == [str(only / "c" / "3b.png")]


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_skip_mode_keeps_every_good_file_once_and_reports_every_bad_one(
        bad_tree, caplog, decoder):
    root, bad = bad_tree
    caplog.set_level(logging.WARNING)
    ds = ours(str(root), shuffle=True, seed=3, image_size=(8, 8), batch_size=5,
              on_error="skip", label_mode=None, decoder=decoder)
    for _ in range(2):
        ids = sorted(int(round(float(x[0, 0, 0]) / 10)) for b in ds for x in b.numpy())
        assert ids == list(range(23))
    reported = {r.getMessage().split(": ")[0].removeprefix("Skipping ") for r in caplog.records}
    assert reported == set(bad)
    assert int(ds.cardinality()) == tf.data.UNKNOWN_CARDINALITY


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_unexpected_loader_error_is_raised_not_an_epoch_cut_short(id_tree, on_error):
    """TF's decode runs under ignore_errors(): any other error of the loader must
    still reach the caller, not end the epoch early without a word."""
    ds = ours(str(id_tree), label_mode=None, image_size=(8, 8), batch_size=5, seed=1,
              decoder="tf", on_error=on_error)
    feed = ds.loader.engine
    real_items = feed.items

    class Broken:  # an item reader with a bug on the 7th file
        io = False
        release = real_items.release
        positional = getattr(real_items, "positional", False)

        def __init__(self):
            self.calls = 0

        def __call__(self, path):
            self.calls += 1
            if self.calls == 7:
                raise RuntimeError("boom: the index went away")
            return real_items(path)

    assert sum(int(b.shape[0]) for b in ds) == 23  # a whole epoch
    feed.items = Broken()
    with pytest.raises(Exception, match="boom: the index went away"):
        for _ in ds:
            pass
    feed.items = real_items
    assert sum(int(b.shape[0]) for b in ds) == 23  # and the next epoch is whole again


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_file_deleted_after_indexing_is_a_read_error(id_tree, tmp_path, decoder):
    """TF reads local files itself on the TF path: a file gone since indexing drops out
    of its decode; the audit reads it again and reports a read error, not a bad image."""
    root = tmp_path / "t"
    shutil.copytree(id_tree, root)
    kw = dict(label_mode=None, image_size=(8, 8), batch_size=4, shuffle=False, decoder=decoder)
    ds = ours(str(root), **kw)
    skip = ours(str(root), on_error="skip", **kw)
    gone = root / "odd" / "007.png"
    gone.unlink()
    with pytest.raises(tf.errors.OpError, match="Cannot read .*007.png: the file disappeared"):
        for _ in ds:
            pass
    assert sum(int(b.shape[0]) for b in skip) == 22
    assert skip.loader.skipped == {str(gone): "the file disappeared since indexing"}
