"""Builds dali-loader's native PNG core into the wheel, against the installed TF and DALI.

The metadata is in pyproject.toml; this file only adds the build step, the way NVIDIA's
DALI TF plugin builds (its setup.py: a `build_ext` that compiles the plugin against the
TensorFlow already installed, and a distribution that says it has extension modules, so
the wheel is tagged for this platform and Python). Install into an environment that
already has TF and DALI:

    pip install --no-build-isolation <sdist, repository or dali-loader>

`build_ext` runs `dali_loader/native/build.py` (the core, `libdlpng.so`), `build_tf.py`
(the TF op, `dl_tf_png.so`, where TensorFlow is installed) and `build_dali.py` (the DALI
operator, `dl_dali_png.so`, where DALI is installed), each in a subprocess of this
Python, in the source tree's `dali_loader/native/_build/` (as `make install` does), and
copies the libraries into the wheel's `dali_loader/native/_build/`, where the loader
looks for them (`dali_loader.native.BUILD_DIR`). A piece whose framework is missing is
skipped with a log line (`pip install -v` shows it; `dali-loader diagnose` says which
decoder runs). Why at install and not on first use: docs/development.md, "pip install".

`DL_NATIVE_BUILD`: `auto` (default: a failed build is logged and skipped; the loader
then decodes PNGs with libpng), `require` (a failed or skipped piece fails the install;
CI and tests/test_pip_install.py), `skip` (build nothing).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
SOURCE_BUILD_DIR = ROOT / "dali_loader" / "native" / "_build"
WHEEL_BUILD_DIR = ("dali_loader", "native", "_build")
# (build module, library it writes, the module that must be importable, its pip name)
PIECES = (
    ("dali_loader.native.build", "libdlpng.so", None, None),
    ("dali_loader.native.build_tf", "dl_tf_png.so", "tensorflow", "tensorflow"),
    ("dali_loader.native.build_dali", "dl_dali_png.so", "nvidia.dali", "nvidia-dali-cuda120"),
)
# Built where nvcc and nvCOMP are, else skipped without failing (entry_decoder="gpu" only):
# the compact entries' GPU decode and its DALI GPU operator (build_gpu --if-possible).
OPTIONAL = ("dali_loader.native.build_gpu", ("libdlentry_gpu.so", "dl_dali_entry_gpu.so"))
MODES = ("auto", "require", "skip")


def _log(message: str) -> None:
    print(f"dali-loader native build: {message}", file=sys.stderr, flush=True)


def _mode() -> str:
    mode = os.environ.get("DL_NATIVE_BUILD", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"DL_NATIVE_BUILD must be one of {', '.join(MODES)}. "
                         f"Received: DL_NATIVE_BUILD={mode!r}")
    return mode


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package (nvidia) is missing
        return False


class NativeDistribution(Distribution):
    """A distribution with native libraries: its wheel is tagged for this platform and
    Python (the libraries are built against this Python's TF and DALI)."""

    def has_ext_modules(self) -> bool:
        return True


class BuildNative(build_ext):
    """Builds the native core, the TF op and the DALI operator into the wheel."""

    def run(self) -> None:
        self._outputs: list[str] = []
        if getattr(self, "editable_mode", False) or self.inplace:
            _log("editable install: not built here; `make install` (or `python -m "
                 "dali_loader.native.build`, `build_tf`, `build_dali`) builds them in place")
            return
        mode = _mode()
        dest = Path(self.build_lib, *WHEEL_BUILD_DIR)
        shutil.rmtree(dest, ignore_errors=True)  # no library from an earlier build
        if mode == "skip":
            _log("DL_NATIVE_BUILD=skip: nothing built; PNGs are decoded with libpng")
            return
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        failed: list[str] = []
        for module, library, needs, package in PIECES:
            if needs is not None and not _installed(needs):
                failed.append(library)
                _log(f"{library} skipped: {package} is not installed in this environment "
                     f"({sys.executable}). Install it first, then this package with "
                     "`pip install --no-build-isolation` (build isolation hides it)")
                continue
            if "libdlpng.so" in failed:  # the ops link the core
                failed.append(library)
                _log(f"{library} skipped: the native core did not build")
                continue
            _log(f"building {library}: {sys.executable} -m {module}")
            run = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env)
            built = SOURCE_BUILD_DIR / library
            if run.returncode or not built.is_file():
                failed.append(library)
                _log(f"{library} failed to build (exit status {run.returncode}; the lines "
                     "above say why); the loader decodes these PNGs with libpng instead")
                continue
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, dest / library)
            self._outputs.append(str(dest / library))
            _log(f"{library} built into the wheel")
        if "libdlpng.so" not in failed and _installed("nvidia.dali"):
            module, libraries = OPTIONAL
            _log(f"building {', '.join(libraries)} where nvcc and nvCOMP are: "
                 f"{sys.executable} -m {module} --if-possible")
            subprocess.run([sys.executable, "-m", module, "--if-possible"], cwd=ROOT, env=env)
            for library in libraries:
                built = SOURCE_BUILD_DIR / library
                if built.is_file():
                    dest.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(built, dest / library)
                    self._outputs.append(str(dest / library))
        if failed and mode == "require":
            raise SystemExit(f"DL_NATIVE_BUILD=require and {', '.join(failed)} did not build "
                             "(the lines above say why). Received: "
                             f"DL_NATIVE_BUILD={os.environ.get('DL_NATIVE_BUILD')!r}")

    def get_outputs(self) -> list[str]:
        return list(getattr(self, "_outputs", []))

    def get_output_mapping(self) -> dict[str, str]:
        return {}


setup(cmdclass={"build_ext": BuildNative}, distclass=NativeDistribution)
