"""Hostile input on every path: mutated PNGs, a header claiming billions of pixels,
a non-UTF-8 name, a dangling symlink, a read-only cache, a full disk.

Each case runs on the CPU default (TF's kernels), `decoder="dali"` (the GPU
path's graph on the CPU) and, where it applies, the GPU-ready cache.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from support import pythonpath  # noqa: E402
from support.mutate import MUTATIONS, corpus, huge_header_png  # noqa: E402
from tf_adapter import image_dataset_from_directory as ours  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
CHANNELS = {"rgb": 3, "grayscale": 1, "rgba": 4}
PATHS = {"cpu": {}, "dali": {"decoder": "dali"}}
SIZE = (16, 16)
# Generated stand-ins (support.png_corpus, the `pngs` fixture) for the PngSuite
# files these tests used: 8-bit RGB, grey and RGBA, 13x11, no ancillary chunks.
RGB8, GREY8, RGBA8 = "c08_i0_plain_13x11.png", "g08_i0_plain_13x11.png", "r08_i0_plain_13x11.png"


@pytest.fixture(scope="module")
def mutants(tmp_path_factory) -> pathlib.Path:
    """160 seeded mutants of the generated corpus's plain and tRNS files at 13x11 (every
    colour type and depth, interlaced or not; every mutation kind), and one PNG whose
    header claims 2**37 pixels."""
    from support.png_corpus import valid_corpus

    root = tmp_path_factory.mktemp("mutants")
    (root / "a").mkdir()
    sources = [d for n, d in sorted(valid_corpus().items())
               if n.endswith(("_plain_13x11.png", "_trns_13x11.png"))]
    for name, data in corpus(sources, 160, seed=0):
        (root / "a" / name).write_bytes(data)
    (root / "a" / "zz_bomb.png").write_bytes(huge_header_png(1 << 20, 1 << 17))
    return root


def _tf_reference(root: pathlib.Path, channels: int) -> dict[str, np.ndarray]:
    """File -> Keras's image (TF's decode, then resize) for every file TF decodes."""
    out = {}
    for p in sorted((root / "a").iterdir()):
        try:
            img = tf.io.decode_image(p.read_bytes(), channels=channels, expand_animations=False)
        except (tf.errors.OpError, ValueError):
            continue
        out[str(p)] = tf.image.resize(img, SIZE).numpy()
    return out


def _epoch(ds) -> np.ndarray:
    return np.concatenate([x.numpy() for x, _ in ds])


@pytest.mark.parametrize("mode", list(CHANNELS))
@pytest.mark.parametrize("path", list(PATHS))
def test_mutated_pngs_cost_only_themselves(mutants, path, mode):
    """Under skip, exactly the files TF decodes come out, as TF decodes them; every
    other file is recorded with what is wrong with it (never a pipeline's
    boilerplate), and the epoch goes on."""
    ref = _tf_reference(mutants, CHANNELS[mode])
    assert 20 < len(ref) < 160
    ds = ours(str(mutants), color_mode=mode, image_size=SIZE, shuffle=False, batch_size=8,
              on_error="skip", **PATHS[path])
    images = _epoch(ds)
    skipped = ds.loader.skipped
    delivered = [p for p in ds.file_paths if p not in skipped]
    assert delivered == list(ref)
    assert len(images) == len(ref)
    for reason in skipped.values():
        assert "no longer valid" not in reason and "disappeared" not in reason, reason
    assert "over the limit" in skipped[str(mutants / "a" / "zz_bomb.png")]
    want = np.stack(list(ref.values()))
    if path == "cpu":
        np.testing.assert_array_equal(images, want)
    else:  # DALI's float rounding, and 16-bit samples rounded rather than cut
        assert np.abs(images - want).mean(axis=(1, 2, 3)).max() < 1.0
    assert {n.split("_", 1)[1][:-4] for n in map(os.path.basename, skipped)} >= set(
        MUTATIONS) - {"trailing"}


@pytest.mark.parametrize("png_decoder", [None, "wuffs"])
@pytest.mark.parametrize("mode", list(CHANNELS))
def test_big_png_route_delivers_what_tf_decodes(mutants, mode, png_decoder, monkeypatch):
    """decoder="dali" on the CPU with every PNG over the big-PNG size (0 pixels):
    each is decoded by TF as its batch enters DALI, which only resizes it; the
    files TF rejects go to DALI's decoder as before, and are recorded. With
    "wuffs" the graph's other branch is the raw-entry one (`Input.FILES_OR_RAW`)."""
    from dali_loader.decode import png_cpu, png_stage

    if png_decoder == "wuffs" and not png_cpu.available():
        pytest.skip("pywuffs is not installed")
    monkeypatch.setattr(png_stage, "BIG_PNG_PIXELS", 0)
    ref = _tf_reference(mutants, CHANNELS[mode])
    ds = ours(str(mutants), color_mode=mode, image_size=SIZE, shuffle=False, batch_size=8,
              on_error="skip", decoder="dali", png_decoder=png_decoder)
    images = _epoch(ds)
    skipped = ds.loader.skipped
    assert [p for p in ds.file_paths if p not in skipped] == list(ref)
    # Batches replayed after a file killed the pipeline are decoded again.
    assert ds.loader.epoch_stats[-1]["host_png_decodes"] >= len(ref)
    want = np.stack(list(ref.values()))
    assert np.abs(images - want).mean(axis=(1, 2, 3)).max() < 1.0


@pytest.fixture(scope="module")
def many_mutants(pngs, tmp_path_factory) -> pathlib.Path:
    """300 seeded mutants of every valid file of `pngs` (the generated corpus, and
    PngSuite's where present: every chunk kind)."""
    from support.helpers import valid_pngs

    root = tmp_path_factory.mktemp("many")
    (root / "a").mkdir()
    sources = [p.read_bytes() for p in valid_pngs(pngs)]
    for name, data in corpus(sources, 300, seed=0):
        (root / "a" / name).write_bytes(data)
    return root


@pytest.mark.parametrize("mode", ["rgb", "rgba"])
def test_dali_path_delivers_what_tf_decodes_on_many_mutants(many_mutants, mode):
    """The DALI path follows libpng where DALI's decoder or Pillow (the rgba
    conversions) would be laxer: chunk types that are not letters, image data
    that ends before the last row or before its stream's end, bad row filters."""
    ref = _tf_reference(many_mutants, CHANNELS[mode])
    ds = ours(str(many_mutants), color_mode=mode, image_size=SIZE, shuffle=False,
              batch_size=16, on_error="skip", decoder="dali")
    assert len(_epoch(ds)) == len(ref)
    skipped = ds.loader.skipped
    assert [p for p in ds.file_paths if p not in skipped] == list(ref)


@pytest.fixture()
def bomb_tree(tmp_path, pngs) -> pathlib.Path:
    (tmp_path / "a").mkdir()
    for name in (RGB8, GREY8):
        shutil.copy(pngs / name, tmp_path / "a" / name)
    (tmp_path / "a" / "zz_bomb.png").write_bytes(huge_header_png(30000, 40000))
    return tmp_path


@pytest.mark.parametrize("path", ["cpu", "dali", "ready", "ready_dali"])
def test_huge_header_is_refused_naming_the_file(bomb_tree, tmp_path, path):
    """A header claiming 1.2e9 pixels (2**30 is the default limit) is refused
    before any decoder allocates it: under raise the error names the file;
    max_pixels=None lets TF's decoder see it (and fail on its data)."""
    kw = dict(PATHS.get(path, {}))
    if path.startswith("ready"):
        kw = dict(gpu_ready=True, cache_dir=str(tmp_path / "cache"))
        kw.update({"decoder": "dali"} if path == "ready_dali" else {})
    ds = ours(str(bomb_tree), image_size=SIZE, shuffle=False, batch_size=2, **kw)
    with pytest.raises(Exception, match=r"zz_bomb\.png.*30000x40000.*over the limit"):
        _epoch(ds)
    with pytest.raises(ValueError, match="Received: max_pixels=-1"):
        ours(str(bomb_tree), max_pixels=-1)
    if path != "cpu":
        return
    ds = ours(str(bomb_tree), image_size=SIZE, shuffle=False, batch_size=2,
              on_error="skip", max_pixels=None, **kw)
    assert len(_epoch(ds)) == 2
    assert "over the limit" not in ds.loader.skipped[str(bomb_tree / "a" / "zz_bomb.png")]


@pytest.mark.parametrize("path", ["cpu", "dali", "ready"])
def test_non_utf8_name_is_read(tmp_path, pngs, path):
    """A name that is not UTF-8 is read like any other on every path (the CPU
    default used to crash mid-epoch encoding it)."""
    (tmp_path / "a").mkdir()
    good = (pngs / RGB8).read_bytes()
    odd = os.fsdecode(b"caf\xe9.png")
    (tmp_path / "a" / odd).write_bytes(good)
    (tmp_path / "a" / "plain.png").write_bytes(good)
    kw = dict(PATHS.get(path, {}))
    if path == "ready":
        kw = dict(gpu_ready=True, cache_dir=str(tmp_path / "cache"))
    ds = ours(str(tmp_path), image_size=SIZE, shuffle=False, batch_size=2, on_error="skip",
              **kw)
    images = _epoch(ds)
    assert ds.loader.skipped == {}
    assert str(tmp_path / "a" / odd) in ds.file_paths
    assert len(images) == 2 and np.array_equal(images[0], images[1])


@pytest.mark.parametrize("path", ["cpu", "dali"])
def test_dangling_symlink_named_as_such(tmp_path, pngs, path):
    (tmp_path / "a").mkdir()
    shutil.copy(pngs / RGB8, tmp_path / "a" / "good.png")
    os.symlink(tmp_path / "gone" / "target.png", tmp_path / "a" / "link.png")
    ds = ours(str(tmp_path), image_size=SIZE, shuffle=False, on_error="skip", **PATHS[path])
    assert len(_epoch(ds)) == 1
    reason = ds.loader.skipped[str(tmp_path / "a" / "link.png")]
    assert "dangling symbolic link" in reason and "target.png" in reason


_AS_NOBODY = """
import logging, os, sys, tempfile
from tf_adapter import image_dataset_from_directory as ours
root, cache, tag = sys.argv[1:4]


def epochs(cache, kw, n):
    ds = ours(root, image_size=(16, 16), batch_size=2, gpu_ready=True, cache_dir=cache,
              verbose=False, **kw)
    for _ in range(n):
        got = sum(int(x.shape[0]) for x, _ in ds)
        stats = ds.loader.epoch_stats[-1]
        yield got, stats.get("cache_hits", 0), stats.get("cache_fills", 0)


# Python lives under /root (0700): import everything lazy while still root.
with tempfile.TemporaryDirectory() as warm:
    for kw in ({}, {"decoder": "dali"}):
        list(epochs(warm, kw, 1))
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
os.setgid(65534)
os.setuid(65534)
for kw in ({}, {"decoder": "dali"}):
    for got, hits, fills in epochs(cache, kw, 2):
        print(tag, kw.get("decoder", "tf"), got, hits, fills, flush=True)
"""


def _run_as_nobody(root: str, cache: str, tag: str, tmp: str) -> tuple[list[str], str]:
    env = dict(os.environ, PYTHONPATH=pythonpath(), HOME=tmp, TMPDIR=tmp, TF_CPP_MIN_LOG_LEVEL="3",
               KERAS_HOME=os.path.join(tmp, "keras"))
    r = subprocess.run([sys.executable, "-c", _AS_NOBODY, root, cache, tag],
                       capture_output=True, text=True, timeout=300, env=env, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return [ln for ln in r.stdout.splitlines() if ln.startswith(tag)], r.stderr


@pytest.mark.skipif(not hasattr(os, "setuid") or os.geteuid() != 0,
                    reason="runs the reader as another user (needs root to switch)")
def test_read_only_cache_as_another_user(pngs):
    """A complete GPU-ready cache the user cannot write (a read-only image of it)
    is used without its lock: nothing decoded, one log line. A cache folder the
    user cannot write at all: uncached reads and one warning, not an OSError."""
    base = tempfile.mkdtemp(prefix="dali-loader-ro-")
    tmp = tempfile.mkdtemp(prefix="dali-loader-ro-tmp-")  # the reader's own temp files
    try:
        os.chmod(base, 0o755)
        os.chmod(tmp, 0o777)
        root, cache = os.path.join(base, "data"), os.path.join(base, "cache")
        os.makedirs(os.path.join(root, "a"))
        for name in (RGB8, GREY8, RGBA8):
            shutil.copy(pngs / name, os.path.join(root, "a", name))
        for kw in ({}, {"decoder": "dali"}):  # filled by its owner: a complete cache
            ds = ours(root, image_size=SIZE, batch_size=2, gpu_ready=True, cache_dir=cache,
                      verbose=False, **kw)
            _epoch(ds)
            ds.close()
        for d, _, files in os.walk(base):
            os.chmod(d, 0o555)
            for f in files:
                os.chmod(os.path.join(d, f), 0o444)
        lines, err = _run_as_nobody(root, cache, "complete", tmp)
        assert lines == [f"complete {d} 3 3 0" for d in ("tf", "tf", "dali", "dali")]
        assert err.count("is read-only here") == 2, err[-2000:]  # one per dataset
        assert not [ln for ln in err.splitlines() if ln.startswith("WARNING ")], err[-2000:]
        empty = os.path.join(base, "data", "a")  # exists, not writable: nothing cached
        lines, err = _run_as_nobody(root, empty, "empty", tmp)
        assert lines == [f"empty {d} 3 0 3" for d in ("tf", "tf", "dali", "dali")]
        assert err.count("cannot be written") == 2, err[-2000:]
    finally:
        for d, _, _ in os.walk(base):
            os.chmod(d, 0o755)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _small_tmpfs(where: pathlib.Path, size: str):
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize("path", ["ready", "ready_dali"])
def test_full_disk_warns_once_per_cause(tmp_path, caplog, path):
    """A cache on a full disk (a 256 KiB tmpfs, writes fail with ENOSPC) loses
    nothing; one warning for the cause, then one count per epoch, not one line
    per file per epoch."""
    from support.pngs import encode_png, photo

    rng = np.random.default_rng(0)
    for i in range(24):
        p = tmp_path / "data" / "a" / f"{i:02d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(encode_png(photo(rng, 64, 64)))
    kw = {"decoder": "dali"} if path == "ready_dali" else {}
    with _small_tmpfs(tmp_path / "small", "256k") as cache:
        ds = ours(str(tmp_path / "data"), image_size=SIZE, batch_size=4, shuffle=False,
                  gpu_ready=True, cache_dir=str(cache), cache_max_bytes=2**30, **kw)
        with caplog.at_level(logging.WARNING):
            epochs = [_epoch(ds) for _ in range(3)]
        ds.close()
    assert all(len(e) == 24 for e in epochs)
    assert all(np.array_equal(e, epochs[0]) for e in epochs)
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("Could not write to the cache" in m for m in msgs) == 1, msgs
    assert "No space left on device" in next(m for m in msgs if "Could not write" in m)
    counts = [m for m in msgs if "cache writes failed" in m]
    assert 1 <= len(counts) <= 3, msgs
    assert len(msgs) <= 4, msgs


_PEAK = """
import resource, sys
limit = 8 << 30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
root, path, cache = sys.argv[1:4]
kw = {"decoder": "dali"} if "dali" in path else {}
if path.startswith("ready"):
    kw.update(gpu_ready=True, cache_dir=cache)
if path == "keras":
    import keras
    ds = keras.utils.image_dataset_from_directory(root, image_size=(64, 64), batch_size=4,
                                                  verbose=False)
else:
    from tf_adapter import image_dataset_from_directory as ours
    ds = ours(root, image_size=(64, 64), batch_size=4, verbose=False, on_error="skip", **kw)
n = [sum(int(x.shape[0]) for x, _ in ds) for _ in range(2 if "ready" in path else 1)]
loader = getattr(ds, "loader", None)
skipped = getattr(loader, "skipped", {})
host = sum(s.get("host_png_decodes", 0) for s in getattr(loader, "epoch_stats", []))
print("RESULT", n, len(skipped), host, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10)
"""


def _big_png(path: pathlib.Path, side: int) -> None:
    """A valid side x side RGB PNG (a gradient), written a row at a time."""
    import struct
    import zlib

    from support.pngs import chunk

    z = zlib.compressobj(1)
    row = np.zeros(1 + 3 * side, np.uint8)
    x = (np.arange(side) % 256).astype(np.uint8)
    idat = []
    for y in range(side):
        row[1::3], row[2::3], row[3::3] = x, y % 256, x + np.uint8(y % 256)
        idat.append(z.compress(row.tobytes()))
    idat.append(z.flush())
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"".join(idat))
                     + chunk(b"IEND", b""))


@pytest.mark.slow
def test_big_image_peak_memory_close_to_keras(tmp_path):
    """One valid 20000x20000 PNG among 12 small ones, under an 8 GiB address-space
    limit that Keras passes: every path delivers every image (the big one is no
    epoch killer and no skip), and peaks within 1.5x of Keras's memory: the
    GPU-ready cache (filled, then read) on TF's kernels and on DALI, and
    `decoder="dali"`, where TF decodes the big PNG before DALI (DALI's own CPU
    PNG decoder holds two copies of its pixels: 1.65x). The GPU-ready cache on
    DALI (compact entries) peaks in its filling epoch within 1.75x: TF's
    allocator keeps the pool it decoded the big PNG into, and DALI's entry
    operator decodes the entry into DALI's own memory (1.65x measured; its later
    epochs read at Keras's peak)."""
    from support.pngs import encode_png, photo

    rng = np.random.default_rng(0)
    (tmp_path / "data" / "a").mkdir(parents=True)
    for i in range(12):
        (tmp_path / "data" / "a" / f"s{i:02d}.png").write_bytes(encode_png(photo(rng, 40, 50)))
    _big_png(tmp_path / "data" / "a" / "big.png", 20000)
    peak = {}
    for path in ("keras", "ready", "dali", "ready_dali"):
        r = subprocess.run([sys.executable, "-c", _PEAK, str(tmp_path / "data"), path,
                            str(tmp_path / f"cache_{path}")], capture_output=True, text=True,
                           timeout=600, env=dict(os.environ, PYTHONPATH=pythonpath(),
                                                 TF_CPP_MIN_LOG_LEVEL="3"))
        assert r.returncode == 0, (path, r.stderr[-3000:])
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT"))
        counts, skipped, host, rss = line.split(" ", 1)[1].rsplit(" ", 3)
        peak[path] = int(rss)
        assert counts.strip("[]").split(", ") == ["13"] * (2 if "ready" in path else 1), path
        assert skipped == "0", (path, r.stderr[-3000:])
        assert host == ("1" if path == "dali" else "0"), path  # the big PNG, decoded by TF
    print({p: f"{v / 2**30:.2f} GiB ({v / peak['keras']:.2f}x)" for p, v in peak.items()})
    assert peak["ready"] <= 1.5 * peak["keras"], peak
    assert peak["dali"] <= 1.5 * peak["keras"], peak
    assert peak["ready_dali"] <= 1.75 * peak["keras"], peak


_BATCH_32 = """
import os, sys
from tf_adapter import image_dataset_from_directory as ours
root, epochs = sys.argv[1], int(sys.argv[2])
ds = ours(root, decoder="dali", on_error="skip", image_size=(16, 16), batch_size=32,
          shuffle=False, verbose=False, max_pixels=None)
for e in range(epochs):
    n = sum(int(x.shape[0]) for x, _ in ds)
    print("EPOCH", e, n, flush=True)
for path, reason in sorted(ds.loader.skipped.items()):
    print("SKIPPED", os.path.basename(path), reason, flush=True)
"""


@pytest.mark.slow
def test_files_dalis_decoder_cannot_parse_never_reach_it(tmp_path, pngs):
    """DALI 2.4's decoder segfaults when a sample of a batch of 32 or more fails its
    header parse or allocation (`checks.decoder_header_problem`): one corrupt JPEG,
    one corrupt BMP and a 16-bit PNG claiming 32x(2**31-1) pixels (with
    `max_pixels=None`) among 63 PNGs, batch 32, `decoder="dali"`: every epoch
    completes with the 63 and the three are named. (Before, the process died with
    SIGSEGV in most runs: 20 of 22 with the JPEG alone.)"""
    import struct
    import zlib

    from support.pngs import chunk

    root = tmp_path / "data" / "a"
    root.mkdir(parents=True)
    good = [pngs / RGB8, pngs / RGBA8]
    for i in range(63):
        shutil.copy(good[i % 2], root / f"img_{i:03d}.png")
    rng = np.random.default_rng(0)
    (root / "img_000_bad.jpg").write_bytes(
        b"\xff\xd8\xff\xe0" + rng.integers(0, 256, 300, dtype=np.uint8).tobytes())
    (root / "img_001_bad.bmp").write_bytes(
        b"BM" + struct.pack("<IHHI", 400, 0, 0, 54) + struct.pack("<IiiHH", 7, 32, 32, 1, 24)
        + rng.integers(0, 256, 300, dtype=np.uint8).tobytes())
    ihdr = struct.pack(">IIBBBBB", 32, (1 << 31) - 1, 16, 2, 0, 0, 0)
    (root / "img_002_huge.png").write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 97 * 32))
        + chunk(b"IEND", b""))
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _BATCH_32,
                        str(tmp_path / "data"), "4"], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, PYTHONPATH=pythonpath(),
                                             TF_CPP_MIN_LOG_LEVEL="3"))
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    lines = r.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("EPOCH")] == [f"EPOCH {e} 63" for e in range(4)]
    skipped = {ln.split()[1]: ln for ln in lines if ln.startswith("SKIPPED")}
    assert sorted(skipped) == ["img_000_bad.jpg", "img_001_bad.bmp", "img_002_huge.png"]
    assert "cannot read its header" in skipped["img_000_bad.jpg"]
    assert "cannot read its header" in skipped["img_001_bad.bmp"]
    assert "more than this machine's memory" in skipped["img_002_huge.png"]
