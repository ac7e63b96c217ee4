"""Builds the native core (`png_core.cc` + Wuffs, `entry_core.cc` + zstd) into `_build/libdlpng.so`.

`python -m dali_loader.native.build` (run by `make install` after the project's pip
install). Wuffs' single-file C library is taken from the `pywuffs` 2.0.1 sdist at build
time (`pip download`, about 45 s once; kept in `_build/`), never from the repository;
`DL_WUFFS_SOURCE=/path/to/wuffs-unsupported-snapshot.c` (or the sdist's .tar.gz) skips
the download. Only the modules the core needs are compiled. zstd (the compact GPU-ready
cache entries, `entry_core.h`) is taken the same way: the single-file amalgamation
`zstd/zstd.c` + `zstd/zstd.h` of the `zstandard` 0.25.0 sdist (zstd 1.5.7), or
`DL_ZSTD_SOURCE=/path/to/zstandard-0.25.0.tar.gz`; its symbols stay hidden inside the
library. Quick when up to date.

The TF op (`build_tf.py`) and the DALI operator (`build_dali.py`) import the helpers:
`include_dirs()`, `defines()`, `core_library()` and `link_flags()` (link the shared
core, found next to the op through `$ORIGIN`), or `core_objects()` (link it in).
`sanitizer_driver()` builds `fuzz_driver.cc` with the core under ASan + UBSan.
"""

from __future__ import annotations

from collections.abc import Callable

import argparse
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
BUILD_DIR = HERE / "_build"
CORE_SOURCE = HERE / "png_core.cc"
CORE_HEADER = HERE / "png_core.h"
ENTRY_SOURCE = HERE / "entry_core.cc"
ENTRY_HEADER = HERE / "entry_core.h"
DRIVER_SOURCE = HERE / "fuzz_driver.cc"
# Wuffs' implementation, with its CPU-feature probes asked once per process (why: there).
WUFFS_UNIT = HERE / "wuffs_impl.c"
LIBRARY = BUILD_DIR / "libdlpng.so"

PYWUFFS = "pywuffs==2.0.1"
WUFFS_C = "wuffs-unsupported-snapshot.c"
_WUFFS_IN_SDIST = "libs/wuffs/release/c/" + WUFFS_C
_SDIST_DIR = BUILD_DIR / "sdist"
_WUFFS_DIR = BUILD_DIR / "wuffs"
ZSTANDARD = "zstandard==0.25.0"
ZSTD_FILES = ("zstd.c", "zstd.h", "zstd_errors.h")  # under zstd/ in the sdist
_ZSTD_DIR = BUILD_DIR / "zstd"
# zstd's API hidden (-fvisibility=hidden does the rest): the core's zstd is its own.
ZSTD_DEFINES = ("-DZSTDLIB_VISIBLE=", "-DZSTDERRORLIB_VISIBLE=", "-DZDICTLIB_VISIBLE=",
                "-DZSTD_DISABLE_ASM=1")
MODULES = ("BASE", "ADLER32", "CRC32", "DEFLATE", "ZLIB", "PNG")
OPT_FLAGS = ("-O3", "-fPIC", "-fvisibility=hidden", "-g0")
SANITIZE_FLAGS = ("-O1", "-g", "-fPIC", "-fsanitize=address,undefined",
                  "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")


def defines() -> list[str]:
    """The -D flags every translation unit that includes Wuffs' header needs."""
    return ["-DWUFFS_CONFIG__MODULES", *(f"-DWUFFS_CONFIG__MODULE__{m}" for m in MODULES)]


def _compiler(name: str) -> str:
    env = {"g++": "CXX", "gcc": "CC"}[name]
    exe = os.environ.get(env) or shutil.which(name)
    if not exe:
        raise RuntimeError(f"Building dali-loader's native PNG core needs {name}, which is not on "
                           f"PATH. Install it (Debian/Ubuntu: `apt-get install g++`) or set "
                           f"${env}. Received: {env}={os.environ.get(env)!r}")
    return exe


def wuffs_source() -> Path:
    """Wuffs' single C file: $DL_WUFFS_SOURCE, or from the pywuffs sdist (downloaded once)."""
    given = os.environ.get("DL_WUFFS_SOURCE")
    if given:
        path = Path(given)
        if path.suffix == ".c" and path.is_file():
            return path
        if path.name.endswith(".tar.gz") and path.is_file():
            return _extract(path)
        raise FileNotFoundError("DL_WUFFS_SOURCE must name Wuffs' " + WUFFS_C + " or the pywuffs "
                                f"sdist (.tar.gz). Received: DL_WUFFS_SOURCE={given!r}")
    out = _WUFFS_DIR / WUFFS_C
    if out.is_file():
        return out
    sdists = sorted(_SDIST_DIR.glob("pywuffs-*.tar.gz"))
    if not sdists:
        _SDIST_DIR.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               "-d", str(_SDIST_DIR), PYWUFFS]
        logger.info("fetching Wuffs' C library: %s", shlex.join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True)
        sdists = sorted(_SDIST_DIR.glob("pywuffs-*.tar.gz"))
        if r.returncode or not sdists:
            raise RuntimeError(f"Could not download the {PYWUFFS} sdist (Wuffs' C library) with "
                               f"pip: {r.stderr.strip()[-800:]}. With no network, set "
                               "DL_WUFFS_SOURCE to a local copy of the sdist or of " + WUFFS_C)
    return _extract(sdists[-1])


def _sdist(spec: str, pattern: str) -> Path:
    """The sdist of `spec` in `_build/sdist/` (`pip download`ed once)."""
    sdists = sorted(_SDIST_DIR.glob(pattern))
    if sdists:
        return sdists[-1]
    _SDIST_DIR.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
           "-d", str(_SDIST_DIR), spec]
    logger.info("fetching %s: %s", spec, shlex.join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    sdists = sorted(_SDIST_DIR.glob(pattern))
    if r.returncode or not sdists:
        raise RuntimeError(f"Could not download the {spec} sdist with pip: "
                           f"{r.stderr.strip()[-800:]}. With no network, set DL_ZSTD_SOURCE to "
                           "a local copy of the sdist.")
    return sdists[-1]


def zstd_source() -> Path:
    """zstd's single-file `zstd.c` (with `zstd.h` beside it): from $DL_ZSTD_SOURCE (the
    `zstandard` sdist) or the sdist downloaded once into `_build/sdist/`."""
    out = _ZSTD_DIR / "zstd.c"
    given = os.environ.get("DL_ZSTD_SOURCE")
    if given and not given.endswith(".tar.gz"):
        raise FileNotFoundError("DL_ZSTD_SOURCE must name the zstandard sdist (.tar.gz). "
                                f"Received: DL_ZSTD_SOURCE={given!r}")
    if not given and all((_ZSTD_DIR / f).is_file() for f in ZSTD_FILES):
        return out
    sdist = Path(given) if given else _sdist(ZSTANDARD, "zstandard-*.tar.gz")
    with tarfile.open(sdist) as tar:
        _ZSTD_DIR.mkdir(parents=True, exist_ok=True)
        for name in ZSTD_FILES:
            member = next((m for m in tar.getmembers()
                           if m.name.endswith("/zstd/" + name) and m.isfile()), None)
            if member is None:
                raise FileNotFoundError(f"{sdist} holds no zstd/{name}")
            tmp = _ZSTD_DIR / (name + ".tmp")
            with tar.extractfile(member) as f_in, open(tmp, "wb") as f_out:
                shutil.copyfileobj(f_in, f_out)
            os.replace(tmp, _ZSTD_DIR / name)
    return out


def _extract(sdist: Path) -> Path:
    out = _WUFFS_DIR / WUFFS_C
    with tarfile.open(sdist) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith("/" + _WUFFS_IN_SDIST)), None)
        if member is None or not member.isfile():
            raise FileNotFoundError(f"{sdist} holds no {_WUFFS_IN_SDIST}")
        _WUFFS_DIR.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        with tar.extractfile(member) as f_in, open(tmp, "wb") as f_out:
            shutil.copyfileobj(f_in, f_out)
        os.replace(tmp, out)
    return out


def include_dirs() -> list[Path]:
    """Where png_core.h, Wuffs' header (its .c file, without WUFFS_IMPLEMENTATION) and
    zstd.h are."""
    return [HERE, wuffs_source().parent, zstd_source().parent]


def _key(cmd: list[str]) -> str:
    return hashlib.sha256("\0".join(cmd).encode()).hexdigest()


def _up_to_date(output: Path, inputs: list[Path], cmd: list[str]) -> bool:
    stamp = output.with_name(output.name + ".cmd")
    if not output.exists() or not stamp.exists() or stamp.read_text() != _key(cmd):
        return False
    return all(p.stat().st_mtime <= output.stat().st_mtime for p in inputs)


def _run(cmd: list[str], output: Path, inputs: list[Path]) -> Path:
    """Runs `cmd` (which writes `output`) unless output is newer than inputs and was
    built by the same command; atomic (a process that loaded the old file keeps it)."""
    if _up_to_date(output, inputs, cmd):
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    real = [str(tmp) if a == str(output) else a for a in cmd]
    logger.info("%s", shlex.join(real))
    r = subprocess.run(real, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"Building {output.name} failed:\n{shlex.join(real)}\n"
                           f"{r.stderr[-4000:]}")
    os.replace(tmp, output)
    output.with_name(output.name + ".cmd").write_text(_key(cmd))
    return output


def _objects(flags: tuple[str, ...], out_dir: Path) -> list[Path]:
    wuffs = wuffs_source()
    zstd = zstd_source()
    wuffs_o, core_o = out_dir / "wuffs.o", out_dir / "png_core.o"
    zstd_o, entry_o = out_dir / "zstd.o", out_dir / "entry_core.o"
    _run([_compiler("gcc"), "-x", "c", "-std=c99", *flags, "-Werror=implicit-function-declaration",
          "-Werror=unused-function", "-DWUFFS_IMPLEMENTATION", *defines(), f"-I{wuffs.parent}",
          "-c", str(WUFFS_UNIT), "-o", str(wuffs_o)], wuffs_o, [wuffs, WUFFS_UNIT])
    _run([_compiler("gcc"), "-x", "c", "-std=gnu99", *flags, *ZSTD_DEFINES,
          "-c", str(zstd), "-o", str(zstd_o)], zstd_o, [zstd])
    includes = [f"-I{d}" for d in include_dirs()]
    _run([_compiler("g++"), "-std=c++17", "-Wall", "-Wextra", *flags, *defines(), *includes,
          "-c", str(CORE_SOURCE), "-o", str(core_o)], core_o, [CORE_SOURCE, CORE_HEADER, wuffs])
    _run([_compiler("g++"), "-std=c++17", "-Wall", "-Wextra", *flags, *defines(), *ZSTD_DEFINES,
          *includes, "-c", str(ENTRY_SOURCE), "-o", str(entry_o)], entry_o,
         [ENTRY_SOURCE, ENTRY_HEADER, wuffs, zstd])
    return [wuffs_o, core_o, zstd_o, entry_o]


def core_objects() -> list[Path]:
    """The core's position-independent objects (Wuffs', png_core's, zstd's and
    entry_core's), -O3, built if needed."""
    return _objects(OPT_FLAGS, BUILD_DIR / "obj")


def build() -> Path:
    """Builds `_build/libdlpng.so` (exporting png_core.h's and entry_core.h's C API) if
    needed; returns its path."""
    objs = core_objects()
    return _run([_compiler("g++"), "-shared", *OPT_FLAGS, "-Wl,-soname,libdlpng.so",
                 *map(str, objs), "-pthread", "-o", str(LIBRARY)], LIBRARY, objs)


def core_library() -> Path:
    """The shared core, built if needed."""
    return build()


def link_flags() -> list[str]:
    """Flags that link an op in `_build/` to the shared core, found through $ORIGIN."""
    build()
    return [f"-L{BUILD_DIR}", "-l:libdlpng.so", "-Wl,-rpath,$ORIGIN"]


def sanitizer_driver() -> Path:
    """`_build/asan/fuzz_driver`: fuzz_driver.cc + the core + Wuffs under ASan and UBSan."""
    out_dir = BUILD_DIR / "asan"
    objs = _objects(SANITIZE_FLAGS, out_dir)
    exe = out_dir / "fuzz_driver"
    return _run([_compiler("g++"), "-std=c++17", *SANITIZE_FLAGS,
                 *(f"-I{d}" for d in include_dirs()), str(DRIVER_SOURCE), *map(str, objs),
                 "-pthread", "-o", str(exe)], exe, [DRIVER_SOURCE, CORE_HEADER, ENTRY_HEADER,
                                                    *objs])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sanitize", action="store_true",
                        help="also build the ASan + UBSan fuzz driver (_build/asan/fuzz_driver)")
    args = parser.parse_args(argv)

    def step() -> None:
        logger.info("built %s", build())
        if args.sanitize:
            logger.info("built %s", sanitizer_driver())

    return run_step(step)


def run_step(step: Callable[[], object], skip: tuple[type[BaseException], ...] = ()) -> int:
    """A build module's command line: logs to stderr, runs `step`, and returns the exit
    status: 0 when it built, or raised one of `skip` (said at info level: nothing to build
    here); 1 when it failed (said why)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        step()
    except skip as e:
        logger.info("%s", e)
    except (RuntimeError, ImportError, FileNotFoundError) as e:
        logger.error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
