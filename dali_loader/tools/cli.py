"""`dali-loader`: the command line (prefetch, cache, diagnose, bench, serve).

Each subcommand lives in its own `cmd_*` module with `add_parsers(subparsers)`;
this file only wires them together. Errors are reported by `cli_common.run_command`:
one line per error on stderr and exit status 2 (`-v`: the traceback too), with
TensorFlow's native logging quiet unless `-v`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from dali_loader.tools.cli_common import quiet_native_logs, run_command

_COMMAND_MODULES = ("cmd_cache", "cmd_diagnose", "cmd_bench", "cmd_serve")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="dali-loader",
        description="Keep the GPU fed from image folders on disk, FUSE or gs://.",
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, tracebacks and TensorFlow's native logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"dali_loader.tools.{name}").add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_native_logs(args.verbose)  # before any command can import TensorFlow
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command(args.command, args.func, args)


if __name__ == "__main__":
    sys.exit(main())
