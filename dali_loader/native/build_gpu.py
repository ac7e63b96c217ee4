"""Builds the GPU decode of the cache's compact entries (issue 38, item 4), where it can:
`_build/libdlentry_gpu.so` (the core, `entry_gpu.cu`: nvCOMP's batched Zstd and CRC32
and the unfilter kernel) and `_build/dl_dali_entry_gpu.so` (it as a DALI GPU operator,
`dali_entry_gpu_op.cu`).

`python -m dali_loader.native.build_gpu` (`make install` runs it with `--if-possible`).
It needs CUDA's compiler (`nvcc` on PATH, or under $CUDA_HOME) and nvCOMP's headers and
library (the `nvidia-libnvcomp-cu12` wheel that `nvidia-dali-cuda120` depends on). The
libraries link CUDA's runtime statically, from the toolkit found: they need a driver for
that CUDA release where they run. With `--if-possible` (what `make install` and pip run)
a missing compiler, nvCOMP or DALI skips the build (said once), and a failed compile is a
warning that removes the operator, so no stale one loads: `make install` never fails over
this opt-in piece (`entry_decoder="gpu"` then refuses, naming this module). Without it,
either is an error.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time

from dali_loader.native import build as core_build

logger = logging.getLogger(__name__)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD_DIR = os.path.join(HERE, "_build")
CORE_SOURCE = os.path.join(HERE, "entry_gpu.cu")
OP_SOURCE = os.path.join(HERE, "dali_entry_gpu_op.cu")
CORE_LIBRARY = os.path.join(BUILD_DIR, "libdlentry_gpu.so")
OP_LIBRARY = os.path.join(BUILD_DIR, "dl_dali_entry_gpu.so")
NVCOMP_LIBRARY = "libnvcomp.so.5"  # nvidia-libnvcomp-cu12 5.x, as DALI 2.4 depends on
# Real code for the GPUs of the last generations (Turing to Hopper), PTX for newer ones.
ARCHS = ("75", "80", "86", "89", "90")


class Unavailable(RuntimeError):
    """What the build needs is not here (no nvcc, no nvCOMP, no DALI)."""

    def __init__(self, missing: str):
        super().__init__(f"The GPU decode of compact entries is not built: {missing}.")


def nvcc() -> str:
    """CUDA's compiler: $CUDA_HOME/bin/nvcc, else `nvcc` on PATH."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    found = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not found or not os.path.exists(found):
        raise Unavailable("no CUDA compiler (nvcc on PATH, or $CUDA_HOME/bin/nvcc)")
    return found


def nvcomp_dirs() -> tuple[str, str]:
    """(include, lib64) of the nvidia-libnvcomp-cu12 wheel in this environment."""
    for key in ("purelib", "platlib"):
        base = os.path.join(sysconfig.get_paths()[key], "nvidia", "libnvcomp")
        inc, lib = os.path.join(base, "include"), os.path.join(base, "lib64")
        if (os.path.exists(os.path.join(inc, "nvcomp", "zstd.h"))
                and os.path.exists(os.path.join(lib, NVCOMP_LIBRARY))):
            return inc, lib
    raise Unavailable(f"no nvCOMP headers and {NVCOMP_LIBRARY} (pip install "
                      "nvidia-libnvcomp-cu12, which nvidia-dali-cuda120 brings)")


def _gencode() -> list[str]:
    flags = []
    for arch in ARCHS:
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    return flags + ["-gencode", f"arch=compute_{ARCHS[-1]},code=compute_{ARCHS[-1]}"]


def _compile(cmd: list[str], output: str) -> None:
    """Runs `cmd` (writing `{output}.tmp`) and renames its result into place."""
    t0 = time.perf_counter()
    logger.info("Building %s: %s", os.path.basename(output), " ".join(cmd))
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"Building {os.path.basename(output)} failed:\n{' '.join(cmd)}\n"
                           f"{run.stderr[-4000:]}")
    os.replace(f"{output}.tmp", output)
    logger.info("Built %s in %.1f s.", output, time.perf_counter() - t0)


def build() -> tuple[str, str]:
    """Compiles the core and the DALI operator; returns their paths."""
    compiler = nvcc()
    inc, lib = nvcomp_dirs()
    try:
        from nvidia.dali import sysconfig as dali_sysconfig
    except ImportError as e:
        raise Unavailable("no NVIDIA DALI (pip install nvidia-dali-cuda120==2.4.0)") from e
    core_build.build()  # the CPU core (libdlpng.so), which both link
    os.makedirs(BUILD_DIR, exist_ok=True)
    common = [compiler, "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden",
              *_gencode(), f"-I{HERE}", f"-I{ROOT}", f"-I{inc}"]
    rpath = ["-Xlinker", "-rpath", "-Xlinker", "$ORIGIN", "-Xlinker", "-rpath",
             "-Xlinker", lib]
    core_libs = [f"-L{BUILD_DIR}", "-l:libdlpng.so", f"-L{lib}", f"-l:{NVCOMP_LIBRARY}"]
    _compile([*common, CORE_SOURCE, "-o", f"{CORE_LIBRARY}.tmp", *core_libs, *rpath],
             CORE_LIBRARY)
    _compile([*common, *dali_sysconfig.get_compile_flags(), OP_SOURCE,
              "-o", f"{OP_LIBRARY}.tmp", *dali_sysconfig.get_link_flags(),
              "-l:libdlentry_gpu.so", *core_libs, *rpath], OP_LIBRARY)
    return CORE_LIBRARY, OP_LIBRARY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--if-possible", action="store_true",
                        help="skip (exit 0) where nvcc, nvCOMP or DALI is missing")
    args = parser.parse_args(argv)
    status = core_build.run_step(build, skip=(Unavailable,) if args.if_possible else ())
    if status and args.if_possible:
        if os.path.exists(OP_LIBRARY):
            os.remove(OP_LIBRARY)
        logger.warning('The GPU decode of compact entries did not build (above); '
                       'entry_decoder="gpu" stays unavailable, and nothing else uses it.')
        return 0
    return status


if __name__ == "__main__":
    sys.exit(main())
