"""What every `dali-loader` subcommand shares: one-line errors, `-v`, and quiet native logs.

An error the user can act on (:class:`~dali_loader.errors.StorageError`,
``ValueError``, ``FileNotFoundError``, ``ImportError``, ``OSError``) is printed as
exactly one line, ``dali-loader <cmd>: error: <message>``, and the command exits 2;
with ``-v`` the traceback comes first. Unless ``-v``, TensorFlow's C++ logging is
quiet: ``TF_CPP_MIN_LOG_LEVEL=3`` (when the user has not set it) and absl's Python
logging at ERROR, and the lines TensorFlow's libraries print while they load are
dropped. This module imports nothing heavy, and no ``cmd_*`` module, so both
``cli`` and the ``cmd_*`` modules can use it.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Callable

from dali_loader.errors import StorageError

__all__ = ["CLI_ERRORS", "add_source_command", "add_verbose_flag", "cli_command", "error_message",
           "import_tensorflow_quietly", "prepare_source", "quiet_native_logs", "run_command"]

#: The errors reported as one line (anything else is a bug: full traceback).
CLI_ERRORS: tuple[type[BaseException], ...] = (StorageError, ValueError, FileNotFoundError, ImportError, OSError)

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

# Lines TensorFlow's C++ libraries write to fd 2 (absl / glog / old TF formats).
NATIVE_LOG_LINE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IWEF]\d{4} [\d:.]+\s+\d+ [^\s:]+:\d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+:\d+\]"
    r"|To enable the following instructions:)")


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    """Adds ``-v/--verbose`` to a subcommand's parser (it leaves the top-level value alone when absent)."""
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging, tracebacks and TensorFlow's native logs")


def error_message(exc: BaseException) -> str:
    """``exc`` as one line (its type name when it has no message)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def quiet_native_logs(verbose: bool) -> None:
    """Unless ``verbose``: TF's C++ logging off (if the user has not set a level), absl's Python logging at ERROR.

    Call it before TensorFlow is imported: TF reads ``TF_CPP_MIN_LOG_LEVEL`` once.
    """
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import absl.logging
    except ImportError:
        return
    absl.logging.set_verbosity(absl.logging.ERROR)


def import_tensorflow_quietly(verbose: bool = False) -> None:
    """Imports TensorFlow (if installed) with the lines its native libraries print while loading dropped.

    Those lines (oneDNN, cudart_stub, "All log messages before absl::InitializeLog()")
    are written before ``TF_CPP_MIN_LOG_LEVEL`` takes effect, so fd 2 is captured
    for the import; any other line (a Python warning) is written back. A failed
    import is left for the command to report where it needs TensorFlow. No-op when
    ``verbose`` or TensorFlow is already imported.
    """
    if verbose or "tensorflow" in sys.modules:
        return
    quiet_native_logs(verbose)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        error: BaseException | None = None
        try:
            import tensorflow  # noqa: F401
        except BaseException as exc:  # replayed below with everything it printed
            error = exc
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        lines = captured.read().decode("utf-8", "replace").splitlines(keepends=True)
    keep = lines if error is not None else [ln for ln in lines if not NATIVE_LOG_LINE.match(ln)]
    if keep:
        sys.stderr.write("".join(keep))
        sys.stderr.flush()
    if error is not None and not isinstance(error, ImportError):
        raise error


def run_command(command: str, func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Runs ``func(args)``; an expected error becomes one stderr line and exit status 2.

    With ``args.verbose`` the traceback is printed before that line.
    """
    verbose = bool(getattr(args, "verbose", False))
    quiet_native_logs(verbose)
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print(f"dali-loader {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CLI_ERRORS as exc:
        if verbose:
            traceback.print_exc()
        print(f"dali-loader {command}: error: {error_message(exc)}", file=sys.stderr)
        return EXIT_ERROR


def cli_command(command: str) -> Callable:
    """Decorates a subcommand handler ``f(args) -> int`` with :func:`run_command`."""
    def wrap(func: Callable[[argparse.Namespace], int | None]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(func)
        def handler(args: argparse.Namespace) -> int:
            return run_command(command, func, args)
        return handler
    return wrap


def prepare_source(source: str, verbose: bool = False) -> None:
    """Before a command reads `source`: a quick check of remote storage (an
    unreachable endpoint is a clear error in seconds, not minutes of retries),
    then TensorFlow imported quietly."""
    from dali_loader.storage.urls import is_remote

    if is_remote(source):
        from dali_loader.storage.remote import check_remote

        check_remote(source)
    import_tensorflow_quietly(verbose)


def add_source_command(subparsers, name: str, handler: Callable, *, help: str,
                       description: str) -> argparse.ArgumentParser:
    """Registers a subcommand that reads SOURCE with a synthetic training step
    (`bench`, `diagnose`): its parser, with SOURCE, --step-time and -v."""
    parser = subparsers.add_parser(name, help=help, description=description)
    parser.add_argument("source", help="local folder, FUSE path or gs://bucket/prefix")
    parser.add_argument("--step-time", type=float, default=0.0, metavar="S",
                        help="seconds per batch of the synthetic training step (default: 0, none)")
    add_verbose_flag(parser)
    parser.set_defaults(func=handler)
    return parser
