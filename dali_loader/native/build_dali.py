"""Builds the DALI CPU operator of the native PNG core: `_build/dl_dali_png.so`.

`python -m dali_loader.native.build_dali` (run by `make install` after the core's
build, `python -m dali_loader.native.build`). It compiles `dali_png_op.cc` with
`nvidia.dali.sysconfig`'s include, compile and link flags and links the shared core
(`_build/libdlpng.so`, found through $ORIGIN; `build.link_flags()`, which builds it
if needed).

DALI's headers include CUDA's (`cuda_runtime.h`, `crt/host_config.h`, `nv/target`).
No CUDA toolkit or GPU is needed: the build takes only the include folders of three
NVIDIA wheels, from the environment where all three are installed, else downloaded once
(pinned versions) with `pip download` into `_build/cuda_include/` (the wheels themselves
are not kept, and nothing is installed into the environment).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile

from dali_loader.native import build as core_build

logger = logging.getLogger(__name__)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # what `#include "dali_loader/..."` is under
BUILD_DIR = os.path.join(HERE, "_build")
OP_SOURCE = os.path.join(HERE, "dali_png_op.cc")
OP_LIBRARY = os.path.join(BUILD_DIR, "dl_dali_png.so")
CUDA_INCLUDE_DIR = os.path.join(BUILD_DIR, "cuda_include")

# The wheels whose include folders DALI's headers need, and the header that shows
# each is there: (package, folder under nvidia/, header). CUDA 12, as nvidia-dali-cuda120.
CUDA_HEADER_WHEELS = (
    ("nvidia-cuda-runtime-cu12==12.9.79", "cuda_runtime", "cuda_runtime.h"),
    ("nvidia-cuda-nvcc-cu12==12.9.86", "cuda_nvcc", os.path.join("crt", "host_config.h")),
    ("nvidia-cuda-cccl-cu12==12.9.27", "cuda_cccl", os.path.join("nv", "target")),
)


def _dali_sysconfig():
    try:
        from nvidia.dali import sysconfig as dali_sysconfig
    except ImportError as e:
        raise ImportError("The DALI PNG operator is built against NVIDIA DALI: pip install "
                          "nvidia-dali-cuda120==2.4.0 (or run `make install`).") from e
    return dali_sysconfig


def _installed_include(folder: str, header: str) -> str | None:
    """`nvidia/<folder>/include` in this environment's site-packages, if it holds `header`."""
    for key in ("purelib", "platlib"):
        inc = os.path.join(sysconfig.get_paths()[key], "nvidia", folder, "include")
        if os.path.exists(os.path.join(inc, header)):
            return inc
    return None


def _download_include(package: str, folder: str, header: str) -> str:
    """Downloads `package`'s wheel and keeps its `nvidia/<folder>/include` only."""
    dest = os.path.join(CUDA_INCLUDE_DIR, folder)
    if os.path.exists(os.path.join(dest, header)):
        return dest
    os.makedirs(CUDA_INCLUDE_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CUDA_INCLUDE_DIR) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               "--only-binary=:all:", "-d", tmp, package]
        logger.info("Fetching CUDA headers: %s", " ".join(cmd))
        run = subprocess.run(cmd, capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if run.returncode != 0 or not wheels:
            raise RuntimeError(
                f"Could not download {package} for its CUDA headers (DALI's headers include "
                f"them). pip said: {run.stderr.strip()[-500:]}. Install it (pip install "
                f"{package}) and build again.")
        prefix = f"nvidia/{folder}/include/"
        staged = os.path.join(tmp, "include")
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as whl:
            for name in whl.namelist():
                if name.startswith(prefix) and not name.endswith("/"):
                    target = os.path.join(staged, name[len(prefix):])
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with whl.open(name) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        if not os.path.exists(os.path.join(staged, header)):
            raise RuntimeError(f"{wheels[0]} has no {prefix}{header}: a different CUDA wheel "
                               f"layout than this build expects. Received: {package}")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staged, dest)
    return dest


def cuda_include_dirs() -> list[str]:
    """The include folders of CUDA's runtime, nvcc's `crt` and CCCL for DALI's headers:
    the environment's when all three are installed (one CUDA release, as pip resolved
    them), else the pinned wheels' (downloaded once), never a mix of the two."""
    installed = [_installed_include(folder, header) for _, folder, header in CUDA_HEADER_WHEELS]
    if all(installed):
        return installed  # type: ignore[return-value]
    return [_download_include(package, folder, header)
            for package, folder, header in CUDA_HEADER_WHEELS]


def build(output: str = OP_LIBRARY, cxx: str | None = None) -> str:
    """Compiles the operator into `output` (atomically; beside the core, which it finds
    through $ORIGIN) and returns its path."""
    dali_sysconfig = _dali_sysconfig()
    cxx = cxx or os.environ.get("CXX", "g++")
    os.makedirs(os.path.dirname(output), exist_ok=True)
    includes = [f"-I{d}" for d in cuda_include_dirs()]
    core_link = core_build.link_flags()  # builds the core if needed
    tmpdir = tempfile.mkdtemp(dir=os.path.dirname(output))
    try:
        tmp_out = os.path.join(tmpdir, os.path.basename(output))
        cmd = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
               OP_SOURCE, f"-I{ROOT}", *includes,
               *dali_sysconfig.get_compile_flags(), "-o", tmp_out,
               *dali_sysconfig.get_link_flags(), *core_link]
        t0 = time.perf_counter()
        logger.info("Building the DALI PNG operator: %s", " ".join(cmd))
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"Building {os.path.basename(output)} failed:\n{' '.join(cmd)}\n"
                               f"{run.stderr[-4000:]}")
        os.replace(tmp_out, output)
        logger.info("Built %s in %.1f s.", output, time.perf_counter() - t0)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return output


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    return core_build.run_step(build)


if __name__ == "__main__":
    sys.exit(main())
