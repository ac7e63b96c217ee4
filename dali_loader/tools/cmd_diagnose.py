"""``dali-loader diagnose SOURCE``: which input stage bounds training throughput, and why."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from dali_loader.tools.cli_common import add_source_command, cli_command, prepare_source


def add_parsers(subparsers) -> argparse.ArgumentParser:
    """Registers the ``diagnose`` subcommand on an argparse ``subparsers`` object."""
    p = add_source_command(
        subparsers, "diagnose", handler,
        help="measure listing, reads, decode (libpng and Wuffs), resize, the loader and the step",
        description="Measures each input stage on a sample of SOURCE (a local folder, a FUSE "
                    "mount or gs://bucket/prefix) and names the bottleneck: storage, decode or "
                    "consumer, with advice quoting the measured numbers.")
    p.add_argument("--batch-size", type=int, default=32, metavar="N")
    p.add_argument("--image-size", type=int, nargs=2, default=(256, 256), metavar=("H", "W"))
    p.add_argument("--sample", type=int, default=64, metavar="N",
                   help="objects to time reads, decode and resize on (default: 64)")
    p.add_argument("--max-in-flight", type=int, default=64, metavar="N",
                   help="the loader's concurrent reads (default: 64)")
    p.add_argument("--device", choices=("cpu", "gpu"), default=None,
                   help="loader device (default: auto)")
    p.add_argument("--png-decoder", choices=("wuffs", "libpng"), default=None,
                   help="the loader's PNG decoder (default: the plan's, the native core where built, else libpng); "
                        "both are timed, the loader's bound uses this one")
    p.add_argument("--no-loader", action="store_true", help="skip the end-to-end loader run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


@cli_command("diagnose")
def handler(args: argparse.Namespace) -> int:
    """Runs the diagnosis and prints the table (or JSON). Returns the exit status."""
    from dali_loader.tools.diagnose import format_report, run_diagnose, to_json

    if not args.json:
        logging.basicConfig(level=logging.INFO, format="  %(message)s", stream=sys.stderr)
    prepare_source(args.source, getattr(args, "verbose", False))
    m = run_diagnose(args.source, step_time=args.step_time, batch_size=args.batch_size,
                     image_size=tuple(args.image_size), sample=args.sample,
                     measure_loader=not args.no_loader, loader_in_flight=args.max_in_flight,
                     device=args.device, png_decoder=args.png_decoder)
    if args.json:
        print(json.dumps(to_json(m), indent=2))
    else:
        print(format_report(m))
    return 0
