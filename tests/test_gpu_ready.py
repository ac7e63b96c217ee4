"""The GPU-ready cache (`gpu_ready=True`): Keras's exact pixels, decoded on the
CPU once per image, and the cache's guarantees (keys, verification, bounds,
bad files, exactly-once)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from dali_loader.api import open_index  # noqa: E402
from dali_loader.formats.ready import ReadyForm, decode, encode  # noqa: E402
from dali_loader.errors import CorruptImageError, UnreadableFileError  # noqa: E402
from dali_loader.tfdata.dataset import ready_cache  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

MODES = {"grayscale": 1, "rgb": 3, "rgba": 4}


@pytest.fixture(scope="module")
def suite(pngs, tmp_path_factory):
    """Every valid PNG of `pngs` (the generated corpus: all colour types, bit depths,
    palettes, transparency, interlacing, gamma; PngSuite's 161 too where present),
    in one folder."""
    from support.helpers import valid_pngs

    root = tmp_path_factory.mktemp("suite")
    for p in valid_pngs(pngs):
        shutil.copy(p, root / p.name)
    assert len(os.listdir(root)) >= 300
    return root


def keras_pixels(path, channels):
    data = tf.io.read_file(str(path))
    return tf.image.decode_image(data, channels=channels, expand_animations=False).numpy()


def tf_decode_entries(entries, size: int = 64):
    """Compact entries decoded by the TF op (`tf_png.decode_entries`), `size` at a time."""
    from dali_loader.decode.tf_png import decode_entries
    from dali_loader.formats import compact

    out = []
    for k in range(0, len(entries), size):
        batch = [bytes(e) for e in entries[k:k + size]]
        shapes = np.asarray([compact.read_header(e).shape for e in batch], np.int32)
        sizes = np.prod(shapes, axis=1, dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        bounds = np.concatenate([[0], np.cumsum([len(e) for e in batch])]).astype(np.int64)
        pixels, ok, *_ = decode_entries(np.frombuffer(b"".join(batch), np.uint8), bounds, offsets,
                                       shapes, np.int64(sizes.sum()))
        assert ok.numpy().all()
        pixels = pixels.numpy()
        out += [pixels[o:o + n].reshape(sh) for o, n, sh in zip(offsets, sizes, shapes)]
    return out


def dali_decode_entries(entries, size: int = 64):
    """Compact entries decoded by the DALI operator (`dali_png.entry_decode`)."""
    import nvidia.dali as dali
    from nvidia.dali import fn, pipeline_def, types

    from dali_loader.decode.dali_png import entry_decode

    out = []
    for k in range(0, len(entries), size):
        batch = [np.frombuffer(bytes(e), np.uint8) for e in entries[k:k + size]]

        @pipeline_def(batch_size=len(batch), num_threads=2, device_id=None)
        def pipe():
            enc = fn.external_source(source=lambda: batch, batch=True, dtype=types.UINT8)
            return entry_decode(dali, enc, None)

        p = pipe()
        p.build()
        (got,) = p.run()
        out += [np.array(t) for t in got]
    return out


def ids(ds):
    """Red channel / 10 of every image of one epoch of `id_tree` (its file ids)."""
    xs = [x.numpy() for x, _ in ds]
    return sorted(int(round(v)) for v in np.concatenate(xs)[:, 0, 0, 0] / 10) if xs else []


@pytest.mark.parametrize("color_mode", sorted(MODES))
@pytest.mark.parametrize("form", list(ReadyForm), ids=lambda f: f.name)
def test_entries_hold_keras_pixels_exactly(suite, tmp_path, form, color_mode):
    """Every valid PNG: the entry decodes to exactly the pixels Keras decodes."""
    channels = MODES[color_mode]
    src, index = open_index(str(suite), labels=None, shuffle=False, cache_dir=str(tmp_path))
    with src:
        ready = ready_cache(src, form, channels)
        entries = [ready.bytes(p) for p in index.paths]
        assert (ready.fills, ready.hits) == (len(index.paths), 0)
    if form is ReadyForm.COMPACT:  # the TF op, and the DALI operator, in batches
        got = tf_decode_entries(entries)
        for g, d in zip(got, dali_decode_entries(entries)):
            np.testing.assert_array_equal(d, g)
    else:
        from dali_loader.decode.tf_kernels import raw_pixels

        got = [raw_pixels(tf.constant(bytes(e)), tf).numpy() for e in entries]
    for path, g, entry in zip(index.paths, got, entries):
        want = keras_pixels(path, channels)
        np.testing.assert_array_equal(g, want, err_msg=os.path.basename(path))
        np.testing.assert_array_equal(decode(entry, form), want, err_msg=os.path.basename(path))


@pytest.mark.parametrize("color_mode", sorted(MODES))
@pytest.mark.parametrize("decoder,gpu_ready", [("tf", True), ("dali", True), ("tf", "raw"),
                                               ("dali", "raw")])
def test_dataset_matches_keras_and_decodes_each_file_once(suite, tmp_path, decoder, gpu_ready,
                                                          color_mode):
    """Through image_dataset_from_directory, first and cached epoch: TF's
    kernels exactly; DALI (compact entries decoded by the native operator, raw
    entries reshaped) up to float
    rounding in the resize, for every file, including the grey-from-gAMA and
    16-bit files the uncached DALI path misses by up to 38.5 levels. CPU
    decodes: every file in epoch 0, none after."""
    kw = dict(image_size=(20, 45), shuffle=False, batch_size=32, labels=None,
              color_mode=color_mode, verbose=False)
    ref = np.concatenate([x.numpy() for x in keras.utils.image_dataset_from_directory(
        str(suite), **kw)]).astype(np.float64)
    ds = ours(str(suite), decoder=decoder, gpu_ready=gpu_ready, cache_dir=str(tmp_path), **kw)
    for _ in range(2):
        got = np.concatenate([x.numpy() for x in ds])
        diff = np.abs(got - ref)
        if decoder == "tf":
            assert diff.max() == 0
        else:
            assert diff.max() < 0.01, diff.max()
    stats = ds.loader.epoch_stats
    n = len(os.listdir(suite))
    assert [(s["epoch"], s["files"], s["cpu_decodes"]) for s in stats] == [(0, n, n), (1, n, 0)]
    assert stats[1]["cache_hits"] == n


@pytest.mark.parametrize("kw", [dict(crop_to_aspect_ratio=True), dict(pad_to_aspect_ratio=True),
                                dict(interpolation="nearest"), dict(interpolation="bicubic"),
                                dict(data_format="channels_first")], ids=str)
def test_tf_path_exact_for_every_resize_option(photo_tree, tmp_path, kw):
    kw = dict(image_size=(24, 31), shuffle=False, batch_size=8, verbose=False, **kw)
    ref = [(x.numpy(), y.numpy()) for x, y in keras.utils.image_dataset_from_directory(
        str(photo_tree), **kw)]
    ds = ours(str(photo_tree), decoder="tf", gpu_ready=True, cache_dir=str(tmp_path), **kw)
    for _ in range(2):
        got = [(x.numpy(), y.numpy()) for x, y in ds]
        assert len(got) == len(ref)
        for (gx, gy), (rx, ry) in zip(got, ref):
            assert gx.dtype == rx.dtype
            np.testing.assert_array_equal(gx, rx)
            np.testing.assert_array_equal(gy, ry)


@pytest.mark.parametrize("decoder,form", [("tf", "compact"), ("dali", "compact"), ("tf", "raw"),
                                          ("dali", "raw")])
def test_cache_is_shared_by_later_datasets_and_processes(photo_tree, tmp_path, decoder, form):
    """`dali-loader prefetch --gpu-ready` in another process fills the cache:
    the dataset's first epoch then decodes nothing on the CPU."""
    out = subprocess.run(
        [sys.executable, "-m", "dali_loader.tools.cli", "prefetch", str(photo_tree), "--gpu-ready",
         "--form", form, "--cache-dir", str(tmp_path), "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (f"21 images (rgb, {form} form): 21 decoded and cached, 0 already cached, 0 failed"
            in out.stdout)
    from dali_loader.decode import png_native

    if png_native.available():  # the fill's PNGs go through the native core
        assert "PNG decoder: Wuffs, native core (21 PNGs; 0 left to libpng)" in out.stdout
    ds = ours(str(photo_tree), decoder=decoder, gpu_ready=True if form == "compact" else form,
              cache_dir=str(tmp_path), image_size=(16, 16), shuffle=False, verbose=False)
    assert sum(len(x) for x, _ in ds) == 21
    (stats,) = ds.loader.epoch_stats
    assert (stats["cpu_decodes"], stats["cache_hits"]) == (0, 21)


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_changed_file_is_decoded_again(id_tree, tmp_path, decoder):
    """Entries are keyed by the file's size and mtime: a file rewritten in place
    is decoded again, never served stale."""
    from support.helpers import save

    root = tmp_path / "data"
    shutil.copytree(id_tree, root)
    kw = dict(image_size=(8, 8), shuffle=False, batch_size=32, verbose=False, decoder=decoder,
              gpu_ready=True, cache_dir=str(tmp_path / "cache"), interpolation="nearest")
    ds = ours(str(root), **kw)
    assert ids(ds) == list(range(23))
    arr = np.zeros((25, 30, 3), np.uint8)
    arr[..., 0] = 220  # file 4 now says 22
    target = root / "even" / "004.png"
    save(target, arr)
    os.utime(target, ns=(os.stat(target).st_atime_ns, os.stat(target).st_mtime_ns + 10**9))
    assert ids(ds) == sorted([*range(23)][:4] + [22] + [*range(23)][5:])
    assert ds.loader.epoch_stats[-1]["cpu_decodes"] == 1


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_corrupted_entry_is_detected_and_refilled(id_tree, tmp_path, decoder):
    """A cache file cut short on disk (a torn write) fails the first-use check
    of a new process (header and size; docs/gpu_ready.md): the entry is
    dropped and the file decoded again; the pixels stay right."""
    kw = dict(image_size=(8, 8), shuffle=False, batch_size=32, verbose=False, decoder=decoder,
              gpu_ready=True, cache_dir=str(tmp_path), interpolation="nearest")
    assert ids(ours(str(id_tree), **kw)) == list(range(23))
    objects = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "v1" / "objects") for f in fs]
    assert len(objects) == 23
    for path in objects:  # a new process checks each entry on first use
        os.truncate(path, os.path.getsize(path) - 20)
    ds = ours(str(id_tree), **kw)  # a new dataset: a new cache instance, nothing verified yet
    assert ids(ds) == list(range(23))
    assert ds.loader.epoch_stats[-1]["cpu_decodes"] == 23


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_bounded_cache_evicts_and_stays_exact(photo_tree, tmp_path, decoder):
    kw = dict(image_size=(16, 16), shuffle=True, seed=3, batch_size=4, verbose=False,
              decoder=decoder, gpu_ready=True, cache_dir=str(tmp_path))
    ref_ds = ours(str(photo_tree), **{**kw, "gpu_ready": False, "cache_dir": None})
    small = ours(str(photo_tree), **kw, cache_max_bytes=60_000)
    for _ in range(3):
        want = [x.numpy() for x, _ in ref_ds]
        got = [x.numpy() for x, _ in small]
        assert len(got) == len(want) == 6
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=0 if decoder == "tf" else 0.01)
    stats = small.loader.epoch_stats
    assert all(s["files"] == 21 for s in stats)
    assert stats[-1]["cpu_decodes"] > 0  # the bound forced evictions
    used = sum(os.path.getsize(os.path.join(d, f))
               for d, _, fs in os.walk(tmp_path / "v1" / "objects") for f in fs)
    assert used <= 60_000


@pytest.mark.parametrize("decoder", ["tf", "dali"])
def test_bad_files_raise_by_name_or_are_skipped_exactly_once(pngs, id_tree, tmp_path, decoder):
    from support.helpers import corrupt_pngs

    root = tmp_path / "data"
    shutil.copytree(id_tree, root)
    bad = corrupt_pngs(pngs)  # the generated 19 (and PngSuite's 14 where present)
    assert len(bad) >= 19
    for p in bad:
        shutil.copy(p, root / "odd" / p.name)
    kw = dict(image_size=(8, 8), shuffle=True, seed=1, batch_size=5, verbose=False,
              decoder=decoder, gpu_ready=True, cache_dir=str(tmp_path / "cache"),
              interpolation="nearest")
    with pytest.raises(Exception, match=r"x\w+\.png"):
        for _ in ours(str(root), **kw):
            pass
    ds = ours(str(root), on_error="skip", **kw)
    for _ in range(2):  # the second epoch from the cache
        assert ids(ds) == list(range(23))
    assert sorted(os.path.basename(p) for p in ds.loader.skipped) == [p.name for p in bad]
    assert [s["cpu_decodes"] for s in ds.loader.epoch_stats][-1] == 0


def test_gs_source_caches_entries_not_pngs(photo_tree, tmp_path, gcs):
    """From gs://, the PNGs are downloaded (verified) once, and only the derived
    entries are kept; entries are keyed by the object's generation."""
    gcs(photo_tree)
    kw = dict(image_size=(16, 16), shuffle=False, verbose=False, decoder="tf",
              cache_dir=str(tmp_path))
    want = [x.numpy() for x, _ in ours(str(photo_tree), **{**kw, "cache_dir": None})]
    ds = ours("gs://b", gpu_ready=True, **kw)
    for _ in range(2):
        for g, w in zip([x.numpy() for x, _ in ds], want):
            np.testing.assert_array_equal(g, w)
    assert [s["cpu_decodes"] for s in ds.loader.epoch_stats] == [21, 0]
    ds.close()
    headers = []
    for d, _, fs in os.walk(tmp_path / "v1" / "objects"):
        for f in fs:
            with open(os.path.join(d, f), "rb") as fh:
                headers.append(fh.read(300))
    assert len(headers) == 21 and all(b"ready.v1/compact-up-zstd1/c3" in h for h in headers)


def test_forms_round_trip_and_reject_bad_input():
    rng = np.random.default_rng(0)
    for c in (1, 3, 4):
        px = rng.integers(0, 256, (37, 53, c), dtype=np.uint8)
        for form in ReadyForm:
            np.testing.assert_array_equal(decode(encode(px, form), form), px)
    with pytest.raises(ValueError, match="Received: shape=\\(4, 4\\)"):
        encode(np.zeros((4, 4), np.uint8), ReadyForm.RAW)
    with pytest.raises(ValueError, match="Received: gpu_ready='yes'"):
        ours("/nonexistent", gpu_ready="yes")


def test_gpu_ready_values_and_default_off(photo_tree, tmp_path):
    from dali_loader.plan import Environment, Options, check, resolve
    from dali_loader.storage.source import SourceKind

    env = Environment(tf_gpus=0, wuffs=True, png_core=True, dali_png_op=True, cores=2,
                      source_kind=SourceKind.LOCAL_DISK, has_pngs=True)

    def form(value):
        return resolve(Options(gpu_ready=value, decoder="dali"), env).cache_form

    assert form(None) is None and form(False) is None
    assert form(True) is ReadyForm.COMPACT and form("compact") is ReadyForm.COMPACT
    assert form("raw") is ReadyForm.RAW
    # Compact entries need the native op of the engine's path; raw ones do not.
    bare = Environment(tf_gpus=0, wuffs=True, png_core=True, tf_png_op=False, dali_png_op=False,
                       cores=2, source_kind=SourceKind.LOCAL_DISK, has_pngs=True)
    for decoder, step in (("dali", "build_dali"), ("tf", "build_tf")):
        with pytest.raises(ImportError, match=f"native.{step}.*gpu_ready=\"raw\".*Received: "
                                              "gpu_ready=True"):
            check(Options(gpu_ready=True, decoder=decoder), bare)
        assert resolve(Options(gpu_ready="raw", decoder=decoder), bare).cache_form is ReadyForm.RAW
    for bad in (1, "yes", 0):
        with pytest.raises(ValueError, match=f"Received: gpu_ready={bad!r}"):
            check(Options(gpu_ready=bad), env)
    with pytest.raises(ValueError, match="gpu_ready=\"tiff\" was retired.*Received: "
                                         "gpu_ready='tiff'"):  # issue 38
        ours(str(photo_tree), gpu_ready="tiff", decoder="dali", cache_dir=str(tmp_path))
    ds = ours(str(photo_tree), image_size=(8, 8), verbose=False, cache_dir=str(tmp_path))
    sum(1 for _ in ds)
    assert ds.loader.epoch_stats[0]["cpu_decodes"] == 21  # TF decodes every PNG
    assert not os.path.exists(tmp_path / "v1")


def _entry_files(cache):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(cache / "v1" / "objects") for f in fs)


def test_fills_decode_and_write_entries_in_the_graph(tmp_path, monkeypatch):
    """A filling epoch on the TF path: the native op decodes each new PNG and writes
    its compact entry in the graph (the feed only reads the bytes and the header); a
    PNG the core leaves to libpng (a tRNS colour key) is decoded on the CPU by TF's
    decoder instead, once. Keras's pixels in both epochs; the second decodes nothing."""
    from PIL import Image

    from dali_loader.decode import png_native
    from dali_loader.decode.png_cpu import Fallback
    from dali_loader.feed.ready import ReadyCache
    from dali_loader.plan import PngWhere
    from support.helpers import save

    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    for i in range(9):
        save(root / "a" / f"p{i}.png", rng.integers(0, 256, (20 + i, 30, 3), np.uint8))
    keyed = root / "b" / "keyed.png"
    keyed.parent.mkdir()
    Image.fromarray(rng.integers(0, 256, (17, 23, 3), np.uint8)).save(keyed, transparency=(1, 2, 3))
    assert isinstance(png_native.decode_png(keyed.read_bytes(), 3), Fallback)
    on_feed = []
    real = ReadyCache.fill_pixels

    def counted(self, path, *args, **kwargs):
        on_feed.append(os.path.basename(path))
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(ReadyCache, "fill_pixels", counted)
    kw = dict(image_size=(16, 16), shuffle=False, batch_size=4, verbose=False)
    ref = np.concatenate([x.numpy() for x, _ in keras.utils.image_dataset_from_directory(
        str(root), **kw)])
    cache = tmp_path / "cache"
    ds = ours(str(root), gpu_ready=True, cache_dir=str(cache), **kw)
    assert ds.loader.plan.fill_where is PngWhere.TF_OP
    for _ in range(2):
        np.testing.assert_array_equal(np.concatenate([x.numpy() for x, _ in ds]), ref)
    assert on_feed == ["keyed.png"]
    assert [(s["epoch"], s["cpu_decodes"]) for s in ds.loader.epoch_stats] == [(0, 10), (1, 0)]
    assert len(_entry_files(cache)) == 10


def test_an_abandoned_fill_counts_what_it_decoded(tmp_path):
    """A filling epoch abandoned after its first batch: its stats count the PNGs the op
    decoded (those read ahead, or batched but never decoded, are not fills), the next
    epoch fills the rest, and every file is decoded on the CPU exactly once in all."""
    import gc

    from support.helpers import save

    root = tmp_path / "data"
    rng = np.random.default_rng(1)
    for i in range(40):
        save(root / "a" / f"{i:02d}.png", rng.integers(0, 256, (30, 30, 3), np.uint8))
    ds = ours(str(root), image_size=(16, 16), batch_size=4, gpu_ready=True,
              cache_dir=str(tmp_path / "cache"), verbose=False)
    it = iter(ds)
    next(it)
    del it
    gc.collect()
    assert sum(int(x.shape[0]) for x, _ in ds) == 40
    first, second = ds.loader.epoch_stats
    assert 4 <= first["cache_fills"] == first["cpu_decodes"] <= first["files"] < 40
    assert second["cache_fills"] + second["cache_hits"] == 40
    assert first["cpu_decodes"] + second["cpu_decodes"] == 40
    assert sum(int(x.shape[0]) for x, _ in ds) == 40
    assert ds.loader.epoch_stats[-1]["cpu_decodes"] == 0


def test_the_last_batch_spreads_over_the_calls_and_decodes_the_same(photo_tree, tmp_path,
                                                                     monkeypatch):
    """On the compact path only an epoch's last batch, which runs alone, is split over
    the decode calls' threads (`spread`); the op's outputs do not depend on it: the
    same pixels, refusals and written entries with spread 1 and 2."""
    import tensorflow as tf

    from dali_loader.decode.tf_png import decode_entries
    from dali_loader.tfdata import compact_path

    spreads = []
    real = compact_path._CompactEpochs.epoch

    def recorded(self):
        for batch in real(self):
            spreads.append(int(batch[-1]))
            yield batch

    monkeypatch.setattr(compact_path._CompactEpochs, "epoch", recorded)
    ds = ours(str(photo_tree), image_size=(16, 16), batch_size=4, gpu_ready=True,
              cache_dir=str(tmp_path / "cache"), num_threads=3, verbose=False)
    for _ in range(2):
        assert sum(int(x.shape[0]) for x, _ in ds) == 21
    assert spreads == 2 * ([1] * 5 + [3])

    files = sorted(str(p) for p in photo_tree.rglob("*.png"))[:7]
    blobs = [open(f, "rb").read() for f in files] + [b"\x89PNG\r\n\x1a\n broken"]
    shapes = [keras_pixels(f, 3).shape for f in files] + [(5, 5, 3)]
    sizes = np.prod(shapes, axis=1)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    bounds = np.concatenate([[0], np.cumsum([len(b) for b in blobs])])
    flat = np.frombuffer(b"".join(blobs), np.uint8)

    def run(spread):
        return [t.numpy() for t in decode_entries(
            flat, bounds, offsets, np.asarray(shapes, np.int32), int(sizes.sum()), spread=spread)]

    room = run(1)[2].size
    outs = []
    for spread in (1, 2):
        # Leave nonzero bytes where the next `filled` goes, as a long run does.
        _ = tf.fill([room], tf.constant(8, tf.uint8)).numpy()[0]
        outs.append(run(spread))
    # `filled` has room for each entry at its encode bound; only each entry's own bytes
    # are written (the slack is TF's pooled memory, whatever it held), so compare those.
    for k in (0, 1, 3, 4):
        np.testing.assert_array_equal(outs[0][k], outs[1][k])
    (_, _, fill1, at1, size1), (_, _, fill2, at2, size2) = outs
    for i in range(len(blobs)):
        np.testing.assert_array_equal(fill1[at1[i]:at1[i] + size1[i]],
                                      fill2[at2[i]:at2[i] + size2[i]])
    pixels, ok, filled, at, size = outs[1]
    assert ok.tolist() == [True] * 7 + [False] and (size[:7] > 0).all() and size[7] == 0
    for i, f in enumerate(files):
        entry = filled[at[i]:at[i] + size[i]]
        np.testing.assert_array_equal(decode(entry.tobytes(), ReadyForm.COMPACT),
                                      keras_pixels(f, 3))


def test_dali_fills_hand_their_pixels_to_the_operator(photo_tree, tmp_path, monkeypatch):
    """On the DALI path a fill stores the compact entry and hands the operator the
    pixels it just decoded (a raw entry, which the operator copies), instead of reading
    the entry back and decoding it again; the next epoch reads the compact entries.
    The same pixels in both epochs, and those of the DALI path without the cache."""
    from dali_loader.feed.ready import ReadyBytes

    heads = []
    real = ReadyBytes.__call__

    def recorded(self, pos, tally=None):
        item = real(self, pos, tally)
        heads.append(bytes(memoryview(item)[:4]))
        return item

    monkeypatch.setattr(ReadyBytes, "__call__", recorded)
    kw = dict(image_size=(16, 16), batch_size=4, shuffle=False, device="cpu", decoder="dali",
              verbose=False)
    ref = np.concatenate([x.numpy() for x, _ in ours(str(photo_tree), **kw)])
    cache = tmp_path / "cache"
    ds = ours(str(photo_tree), gpu_ready=True, cache_dir=str(cache), **kw)
    for epoch in range(2):
        np.testing.assert_array_equal(np.concatenate([x.numpy() for x, _ in ds]), ref)
        assert heads == [b"DLRW" if epoch == 0 else b"DLZ1"] * 21
        heads.clear()
    assert [s["cpu_decodes"] for s in ds.loader.epoch_stats] == [21, 0]
    assert len(_entry_files(cache)) == 21


@pytest.mark.parametrize("decoder", ["tf", "dali"])
@pytest.mark.parametrize("damage", ["payload", "header", "torn"])
def test_damaged_compact_entries_are_refilled_never_decoded_wrong(photo_tree, tmp_path, damage,
                                                                   decoder):
    """A compact entry damaged on disk after it was written (a bit flipped in its
    compressed pixels, in its header, or cut short): the next epoch decodes its file
    again and replaces the entry (the feed's header check, the cache's size check, or
    the native op's CRC-32 refusal: TF's op refills in the graph, DALI's failed batch
    is replayed); the pixels are the first epoch's (Keras's on TF) every epoch."""
    kw = dict(image_size=(16, 16), shuffle=False, verbose=False, batch_size=8)
    ds = ours(str(photo_tree), decoder=decoder, gpu_ready=True, cache_dir=str(tmp_path), **kw)
    want = np.concatenate([x.numpy() for x, _ in ds])
    if decoder == "tf":
        np.testing.assert_array_equal(want, np.concatenate([
            x.numpy() for x, _ in keras.utils.image_dataset_from_directory(str(photo_tree), **kw)]))
    files = _entry_files(tmp_path)
    assert len(files) == 21
    for path in files[::5]:  # 5 entries
        data = bytearray(open(path, "rb").read())
        start = data.index(b"DLZ1")
        if damage == "payload":
            data[-40] ^= 0x10
        elif damage == "header":
            data[start + 9] ^= 0x01  # the height
        else:
            del data[-7:]
        open(path, "wb").write(bytes(data))
    for epoch in (1, 2):
        np.testing.assert_array_equal(np.concatenate([x.numpy() for x, _ in ds]), want)
    feed = ds.loader.engine if decoder == "tf" else ds.loader.engine.feed
    assert feed.items.ready.fills == 21 + 5
    stats = ds.loader.epoch_stats
    # TF's op refills in the graph, outside any epoch's tally: counted in `fills` only.
    untallied = damage == "payload" and decoder == "tf"
    assert [s["cpu_decodes"] for s in stats] == ([21, 0, 0] if untallied else [21, 5, 0])
    from dali_loader.formats import compact

    for path in _entry_files(tmp_path):  # every entry sound again
        data = open(path, "rb").read()
        compact.decode(data[data.index(b"DLZ1"):])


def test_unreadable_and_corrupt_errors_name_the_file(tmp_path):
    from support.helpers import save

    root = tmp_path / "data"
    save(root / "a" / "ok.png", np.zeros((4, 4, 3), np.uint8))
    (root / "a" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    src, index = open_index(str(root), cache_dir=str(tmp_path / "c"), shuffle=False)
    ready = ready_cache(src, ReadyForm.RAW, 3)
    with pytest.raises(CorruptImageError, match="bad.png.*TensorFlow's decoder failed"):
        ready.bytes(str(root / "a" / "bad.png"))
    os.unlink(root / "a" / "ok.png")
    with pytest.raises(UnreadableFileError, match="ok.png"):
        ready.bytes(str(root / "a" / "ok.png"))
    src.close()


# -- On a GPU (skipped elsewhere) -------------------------------------------------
from test_gpu import needs_gpu  # noqa: E402


@pytest.mark.gpu
@needs_gpu
def test_gpu_cached_epochs_do_no_cpu_decode(photo_tree, tmp_path):
    kw = dict(image_size=(32, 40), shuffle=False, batch_size=8, verbose=False)
    ref = np.concatenate([x.numpy() for x, _ in keras.utils.image_dataset_from_directory(
        str(photo_tree), **kw)])
    ds = ours(str(photo_tree), device="gpu", gpu_ready=True, cache_dir=str(tmp_path), **kw)
    for _ in range(2):
        diff = np.abs(np.concatenate([x.numpy() for x, _ in ds]) - ref)
        assert diff.mean() < 0.05 and diff.max() <= 4.0  # GPU resize: float rounding
    assert [s["cpu_decodes"] for s in ds.loader.epoch_stats] == [21, 0]
