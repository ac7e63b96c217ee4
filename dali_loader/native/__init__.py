"""The native PNG core: its C++ sources, build scripts, and where the built libraries are.

`pip install --no-build-isolation` builds the libraries into the installed package's
`_build/` (setup.py's `build_ext`, against the installed TF and DALI); in a checkout,
`make install` builds them into this folder's `_build/`. Either way the loader finds
them in `BUILD_DIR`, next to this file.
"""

from pathlib import Path

BUILD_DIR = Path(__file__).resolve().parent / "_build"
# What a user who installed with pip runs to (re)build the libraries against this
# environment's TF and DALI (after upgrading either, too).
PIP_REBUILD = ("pip install --no-build-isolation --no-cache-dir --force-reinstall --no-deps "
               "dali-loader")


def build_hint(step: str) -> str:
    """How to build one piece (`build`, `build_tf`, `build_dali`, `build_gpu`): in a checkout, and
    for a loader installed with pip."""
    return (f"python -m dali_loader.native.{step} (part of `make install` in a checkout; "
            f"a loader installed with pip: {PIP_REBUILD})")
