"""`pip install --no-build-isolation` builds the native core, its TF op and its DALI
operator against the installed TF and DALI (setup.py), and the installed loader runs them.

The repository's files (what `git ls-files` names) are copied to a temporary folder, an
sdist is made from them (setuptools' PEP 517 hook, as `python -m build --sdist` does),
and pip installs that sdist with this environment's TF and DALI into a `--target`
folder. A fresh Python with only that folder ahead of site-packages then imports the
installed loader (not the checkout), decodes with each native library, and
`dali-loader diagnose --json` reports the TF op as the PNG decoder. About 30-60 s of
g++ on 2 cores; Wuffs' C and the CUDA headers come from the checkout's
`dali_loader/native/_build/` where `make install` left them (else they are downloaded).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("libdlpng.so", "dl_tf_png.so", "dl_dali_png.so")
# Built too where nvcc is (setup.py's optional piece, `build_gpu --if-possible`).
GPU_LIBRARIES = ("libdlentry_gpu.so", "dl_dali_entry_gpu.so")
NATIVE_CACHES = ("wuffs", "zstd", "cuda_include", "sdist")


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _copy_checkout(dest: Path) -> Path:
    """The repository's files (tracked, and new ones git does not ignore) in `dest`, plus
    the native build's download caches."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (git ls-files names the repository's files)")
    files = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], ROOT).stdout
    for name in filter(None, files.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    for cache in NATIVE_CACHES:
        src = ROOT / "dali_loader" / "native" / "_build" / cache
        if src.is_dir():
            shutil.copytree(src, dest / "dali_loader" / "native" / "_build" / cache)
    return dest


def _sdist(src: Path, out: Path) -> Path:
    code = ("import sys; from setuptools import build_meta; "
            "print(build_meta.build_sdist(sys.argv[1]))")
    name = _run([sys.executable, "-c", code, str(out)], src).stdout.strip().splitlines()[-1]
    return out / name


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("pip")
    src = _copy_checkout(tmp / "src")
    return _sdist(src, tmp / "dist")


def test_sdist_holds_the_native_sources_and_no_built_library(sdist):
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    for source in ("png_core.cc", "png_core.h", "wuffs_impl.c", "tf_png_op.cc", "dali_png_op.cc",
                   "entry_gpu.cu", "entry_gpu.h", "dali_entry_gpu_op.cu", "build.py"):
        assert f"dali_loader/native/{source}" in names, source
    assert "setup.py" in names
    assert not [n for n in names if "_build" in n or n.endswith(".so")]


def test_skip_builds_a_wheel_without_libraries(sdist, tmp_path):
    """DL_NATIVE_BUILD=skip: the wheel holds the sources and no library (the loader then
    decodes PNGs with libpng); it is still tagged for this platform."""
    env = dict(os.environ, DL_NATIVE_BUILD="skip")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
          "--no-cache-dir", "-w", str(tmp_path), str(sdist)], tmp_path, env)
    (wheel,) = tmp_path.glob("dali_loader-*.whl")
    assert not wheel.name.endswith("-none-any.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert "dali_loader/native/png_core.cc" in names
    assert not [n for n in names if n.endswith(".so")], names


_CHECK = r"""
import json, sys
import numpy as np
from PIL import Image
import dali_loader
from dali_loader.decode import dali_png, png_native, tf_png

data = open(sys.argv[1], "rb").read()
want = np.asarray(Image.open(sys.argv[1]).convert("RGB"))
got = png_native.decode_png(data, 3)
import tensorflow as tf
image, ok = tf_png.decode_png(tf.constant(data), channels=3)
from tf_adapter.dataset import image_dataset_from_directory
ds = image_dataset_from_directory(sys.argv[2], decoder="dali", image_size=(8, 8),
                                  batch_size=4, shuffle=False, verbose=False)
n = sum(int(x.shape[0]) for x, _ in ds)
print(json.dumps({
    "file": dali_loader.__file__,
    "native": [png_native.available(), tf_png.available(), dali_png.available()],
    "core_exact": bool(np.array_equal(got, want)),
    "op_exact": bool(ok.numpy()) and bool(np.array_equal(image.numpy(), want)),
    "dali_images": n,
    "dali_png_native": ds.loader.engine.epoch_stats[-1].get("png_native"),
}))
"""


@pytest.mark.slow
def test_pip_install_builds_and_runs_the_native_decoder(sdist, tmp_path):
    import numpy as np
    from PIL import Image

    target = tmp_path / "site"
    env = dict(os.environ, DL_NATIVE_BUILD="require")
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
          "--no-cache-dir", "--target", str(target), str(sdist)], tmp_path, env)
    built = target / "dali_loader" / "native" / "_build"
    from dali_loader.native import build_gpu

    try:
        build_gpu.nvcc(), build_gpu.nvcomp_dirs()
        expected = LIBRARIES + GPU_LIBRARIES
    except build_gpu.Unavailable:
        expected = LIBRARIES
    assert sorted(p.name for p in built.iterdir()) == sorted(expected)

    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (tmp_path / "data" / cls).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 256, (12 + i, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / cls / f"{i}.png")
    # Only the installed copy ahead of site-packages; the checkout is not on the path.
    env = dict(os.environ, PYTHONPATH=str(target), TF_CPP_MIN_LOG_LEVEL="3")
    out = _run([sys.executable, "-c", _CHECK, str(tmp_path / "data" / "a" / "0.png"),
                str(tmp_path / "data")], tmp_path, env).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(target), got["file"]
    assert got["native"] == [True, True, True]
    assert got["core_exact"] and got["op_exact"]
    assert got["dali_images"] == 6 and got["dali_png_native"] == 6, got

    out = _run([sys.executable, "-m", "dali_loader.tools.cli", "diagnose", str(tmp_path / "data"),
                "--json", "--no-loader", "--sample", "6"], tmp_path, env).stdout
    report = json.loads(out[out.index("{"):])
    plan = report["plan"]
    assert plan["png_where"]["value"] == "tf-op", plan["png_where"]
    assert plan["png_epoch"]["value"] == "wuffs", plan["png_epoch"]
    assert "tf_png_op=True" in plan["facts"]["why"], plan["facts"]
