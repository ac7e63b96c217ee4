"""Shared fixtures: small image trees made on the fly, and the PngSuite."""

from __future__ import annotations

import gc
import os
import pathlib
import shutil
import sys
import traceback
import weakref

import numpy as np
import pytest

from support import REPO
from support.helpers import _photo, save

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# DALI_LOADER_GC_STRESS=N collects every N allocations (Python's default: 700), so that
# finalizers run in odd threads at odd moments: a stress run for `_collector_not_stuck`.
if os.environ.get("DALI_LOADER_GC_STRESS"):
    gc.set_threshold(int(os.environ["DALI_LOADER_GC_STRESS"]), 2, 2)

# PngSuite is an extra corpus where present; DALI_LOADER_PNGSUITE points elsewhere (a missing
# folder runs the suite as a clone with no ../shared does).
PNGSUITE = pathlib.Path(os.environ.get("DALI_LOADER_PNGSUITE",
                                       REPO.parent / "shared" / "pngsuite"))


@pytest.fixture(scope="session")
def pngsuite() -> pathlib.Path:
    """PngSuite itself, for the few tests that check its files by name (an optional extra)."""
    if not PNGSUITE.is_dir():
        pytest.skip(f"PngSuite not found at {PNGSUITE}")
    return PNGSUITE


def corpus_files() -> dict[str, bytes]:
    """The generated stand-in for PngSuite (`support.png_corpus`), sized for
    tests that go through every file: at 13x11 every colour type x depth x interlace x
    variant (240); at 1x1 and 3x2 (some Adam7 passes empty) the plain files (60); and the
    19 corrupt files ("x" names)."""
    from support.png_corpus import corrupt_corpus, valid_corpus

    valid = {n: d for n, d in valid_corpus().items()
             if n.endswith("_13x11.png") or "_plain_" in n}
    return {**valid, **corrupt_corpus()}


@pytest.fixture(scope="session")
def pngs(tmp_path_factory) -> pathlib.Path:
    """One folder of PNGs to run every file through: the generated corpus (`corpus_files`)
    and, where present, PngSuite's files too (names never collide). Corrupt files' names
    start with "x", valid ones' never do."""
    from support.png_corpus import write

    root = tmp_path_factory.mktemp("pngs")
    write(str(root), corpus_files())
    if PNGSUITE.is_dir():
        for p in PNGSUITE.glob("*.png"):
            shutil.copy(p, root / p.name)
    return root


@pytest.fixture(scope="session")
def photo_tree(tmp_path_factory) -> pathlib.Path:
    """3 classes x 7 photo-like PNGs of mixed sizes (21 files)."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for c in range(3):
        for i in range(7):
            h, w = int(rng.integers(60, 140)), int(rng.integers(60, 140))
            save(root / f"class_{c}" / f"img_{i:02d}.png", _photo(rng, h, w))
    return root


@pytest.fixture(scope="session")
def id_tree(tmp_path_factory) -> pathlib.Path:
    """23 solid-colour PNGs whose red channel is the file id (2 classes)."""
    root = tmp_path_factory.mktemp("ids")
    for i in range(23):
        arr = np.zeros((20 + i, 30, 3), np.uint8)
        arr[..., 0] = i * 10
        arr[..., 1] = 7
        save(root / ("even" if i % 2 == 0 else "odd") / f"{i:03d}.png", arr)
    return root


# 12 files of the generated corpus for `messy_tree`: every PNG colour type, 1- to 16-bit,
# interlaced or not, palette and grey with tRNS, gAMA, iCCP (PngSuite's first 12 valid
# files were all interlaced grey, RGB, palette and grey+alpha).
MESSY_PNGS = ("g01_i1_plain_13x11.png", "g02_i0_trns_13x11.png", "g04_i1_gamma45_13x11.png",
              "g08_i0_iccp_13x11.png", "g16_i1_plain_13x11.png", "c08_i1_trns_13x11.png",
              "c16_i0_gamma45_13x11.png", "p01_i0_plain_3x2.png", "p04_i1_trns_13x11.png",
              "p08_i0_idats_13x11.png", "a08_i1_srgb_13x11.png", "r16_i0_ancillary_13x11.png")


@pytest.fixture(scope="session")
def messy_tree(tmp_path_factory) -> pathlib.Path:
    """Nested folders, odd names, .PNG/.Jpg extensions, mixed colour types,
    an empty class, hidden entries and non-image files."""
    from support.png_corpus import valid_corpus

    root = tmp_path_factory.mktemp("messy")
    rng = np.random.default_rng(1)
    corpus = valid_corpus()
    (root / "b class").mkdir()
    for k, name in enumerate(MESSY_PNGS):
        sub = root / "b class" / ("deep/er" if k % 3 == 0 else "")
        sub.mkdir(parents=True, exist_ok=True)
        stem = name.removesuffix(".png")
        (sub / (stem + (".PNG" if k % 4 == 0 else ".png"))).write_bytes(corpus[name])
    save(root / "a_cls" / "ünï cödé name.png", _photo(rng, 50, 70))
    save(root / "a_cls" / "with space.Jpg", _photo(rng, 64, 48), "JPEG")
    save(root / "a_cls" / "x.bmp", _photo(rng, 33, 41), "BMP")
    save(root / "a_cls" / "anim.gif", _photo(rng, 30, 30), "GIF")
    save(root / "a_cls" / "sub-dir" / "1.png", _photo(rng, 40, 40))
    save(root / "a_cls" / "sub" / "2.png", _photo(rng, 40, 40))
    save(root / "a_cls" / ".hidden.png", _photo(rng, 20, 20))
    (root / "a_cls" / "notes.txt").write_text("not an image")
    (root / "c_empty").mkdir()
    (root / ".hidden_class").mkdir()
    save(root / ".hidden_class" / "h.png", _photo(rng, 20, 20))
    save(root / "toplevel.png", _photo(rng, 20, 20))
    return root


@pytest.fixture
def serve(monkeypatch):
    """Starts a `FakeGCS` on loopback and points google-cloud-storage at it."""
    servers = []

    def start(server):
        servers.append(server.start())
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint)
        return server

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def gcs(serve):
    """Serves a local folder as gs://b (`prefix=`, `faults=`... as `FakeGCS.from_directory`)."""
    from support.fakegcs import FakeGCS

    return lambda root, **kw: serve(FakeGCS.from_directory(str(root), **kw))


class _Cycle:
    pass


def _collector_stuck() -> bool:
    """Whether a reference cycle made now survives a collection: CPython runs one
    collection at a time, so a finalizer blocked in some thread stops all of them."""
    c = _Cycle()
    c.me = c
    ref = weakref.ref(c)
    del c
    gc.collect(0)
    return ref() is not None


@pytest.fixture(autouse=True)
def _collector_not_stuck():
    """Fails the test after which the garbage collector no longer collects, with every
    thread's stack (the blocked finalizer is in one of them; dali_loader/reaper.py)."""
    yield
    if _collector_stuck():
        stacks = "\n".join(f"--- thread {tid}\n" + "".join(traceback.format_stack(frame))
                           for tid, frame in sys._current_frames().items())
        pytest.fail("The garbage collector is stuck: a finalizer waits in some thread, "
                    "inside a collection, so no reference cycle is freed any more.\n" + stacks,
                    pytrace=False)
