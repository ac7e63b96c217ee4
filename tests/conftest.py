"""Shared fixtures: small image trees made on the fly, and the PngSuite."""

from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = pathlib.Path(__file__).resolve().parents[1]
# PngSuite is an extra corpus where present; DALI_LOADER_PNGSUITE points elsewhere (a missing
# folder runs the suite as a clone with no ../shared does).
PNGSUITE = pathlib.Path(os.environ.get("DALI_LOADER_PNGSUITE",
                                       REPO.parent / "shared" / "pngsuite"))


def _photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth, noisy, photo-like RGB image."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack(
        [
            127 + 100 * np.sin(x / rng.uniform(5, 30) + rng.uniform(0, 6)),
            127 + 100 * np.cos(y / rng.uniform(5, 30) + rng.uniform(0, 6)),
            127 + 100 * np.sin((x + y) / rng.uniform(5, 30)),
        ],
        -1,
    )
    base += rng.normal(0, 6, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def save(path: pathlib.Path, arr: np.ndarray, fmt: str = "PNG") -> pathlib.Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, format=fmt)
    return path


@pytest.fixture(scope="session")
def pngsuite() -> pathlib.Path:
    if not PNGSUITE.is_dir():
        pytest.skip(f"PngSuite not found at {PNGSUITE}")
    return PNGSUITE


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


@pytest.fixture(scope="session")
def messy_tree(tmp_path_factory, pngsuite) -> pathlib.Path:
    """Nested folders, odd names, .PNG/.Jpg extensions, mixed colour types,
    an empty class, hidden entries and non-image files."""
    root = tmp_path_factory.mktemp("messy")
    rng = np.random.default_rng(1)
    valid = sorted(p for p in pngsuite.glob("*.png") if not p.name.startswith("x"))
    (root / "b class").mkdir()
    for k, src in enumerate(valid[:12]):
        sub = root / "b class" / ("deep/er" if k % 3 == 0 else "")
        sub.mkdir(parents=True, exist_ok=True)
        name = src.stem + (".PNG" if k % 4 == 0 else ".png")
        shutil.copy(src, sub / name)
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
    from dali_loader.testing.fakegcs import FakeGCS

    return lambda root, **kw: serve(FakeGCS.from_directory(str(root), **kw))
