"""Builds the TF op (`tf_png_op.cc`) against the installed TensorFlow.

`python -m dali_loader.native.build_tf` (run by `make install` after
`python -m dali_loader.native.build`, which builds the core) compiles
`tf_png_op.cc` with `tf.sysconfig`'s compile and link flags, as the DALI TF
plugin is built, into `_build/dl_tf_png.so`, linked to the core
(`_build/libdlpng.so`, found next to it through `$ORIGIN`). About 10-20 s of g++.

`--per-version` builds it into `_build/tf-<TF version>/dl_tf_png.so` instead, which the
loader takes first where that TF runs (`decode/tf_png.py`): a second TF (`make
test-tf-floor`: the oldest TF pyproject.toml names) beside the main build, each op
loading only in the TF it was built against.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "tf_png_op.cc"
BUILD_DIR = HERE / "_build"
OUTPUT = BUILD_DIR / "dl_tf_png.so"


def versioned_output(tf_version: str) -> Path:
    """Where `--per-version` puts the op built against TF `tf_version`."""
    return BUILD_DIR / f"tf-{tf_version}" / OUTPUT.name


def _tf_version() -> str:
    code = "import tensorflow as tf; print(tf.__version__)"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=env).stdout
    return out.strip().splitlines()[-1]


def _tf_flags() -> tuple[list[str], list[str]]:
    """TF's compile and link flags (`tf.sysconfig`), from a subprocess: TF's import
    is slow and prints, and this build may run in a process that must not load it."""
    code = ("import json, tensorflow as tf; print(json.dumps("
            "[tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()]))")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                             text=True, env=env).stdout
    except subprocess.CalledProcessError as e:
        raise ImportError("Building the TF PNG op needs TensorFlow: pip install "
                          f"tensorflow==2.21.0 (or run `make install`). {e.stderr[-500:]}") from e
    import json

    compile_flags, link_flags = json.loads(out.strip().splitlines()[-1])
    return compile_flags, link_flags


def command(cxx: str = "g++", output: Path = OUTPUT) -> list[str]:
    """The g++ command line that builds the op (building the core first if needed)."""
    from dali_loader.native import build as core

    compile_flags, link_flags = _tf_flags()
    return [cxx, "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-Wall",
            # TF's own headers warn under g++ 12 (deprecations, sign compares).
            "-Wno-deprecated-declarations", "-Wno-sign-compare", "-Wno-interference-size",
            *compile_flags, f"-I{HERE}", str(SOURCE), "-o", str(output),
            # The core next to the op, or a folder up from a per-version build.
            *core.link_flags(), "-Wl,-rpath,$ORIGIN/..", *link_flags]


def build(cxx: str | None = None, output: Path = OUTPUT) -> Path:
    """Compiles the op against the shared core (`build.link_flags`: `_build/libdlpng.so`
    through $ORIGIN, built first if needed); returns its path. Raises
    CalledProcessError when g++ fails."""
    output.parent.mkdir(parents=True, exist_ok=True)
    cmd = command(cxx or os.environ.get("CXX", "g++"), output)
    logger.info("%s", shlex.join(cmd))
    tmp = output.with_suffix(".so.tmp")
    cmd[cmd.index("-o") + 1] = str(tmp)
    subprocess.run(cmd, check=True)
    os.replace(tmp, output)  # a process that loaded the old one keeps its mapping
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cxx", default=None, help="the C++ compiler (default: $CXX or g++)")
    parser.add_argument("--per-version", action="store_true",
                        help="build into _build/tf-<TF version>/ (`versioned_output`)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = build(args.cxx, versioned_output(_tf_version()) if args.per_version else OUTPUT)
    logger.info("built %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
