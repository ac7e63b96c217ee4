"""``dali-loader bench SOURCE``: the seed pipeline, tuned tf.data and this loader, side by side."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from dali_loader.tools.cli_common import add_source_command, cli_command, prepare_source


def add_parsers(subparsers) -> argparse.ArgumentParser:
    """Registers the ``bench`` subcommand on an argparse ``subparsers`` object."""
    p = add_source_command(
        subparsers, "bench", handler, help="benchmark the seed pipeline, tuned tf.data and this loader",
        description="Runs, alternating in one process, the question's tf.data pipeline verbatim, "
                    "a tuned tf.data pipeline and this loader (CPU, and GPU when present; each also "
                    "through the GPU-ready cache, filled by an untimed epoch first; with each "
                    "--png-decoder given), each feeding a synthetic step; every row names its PNG "
                    "decoder; writes results.json, results.md and throughput.png.")
    p.add_argument("--out", default=os.path.join("out", "bench"), metavar="DIR",
                   help="output folder (default: out/bench)")
    p.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="also write the scalars for TensorBoard here")
    p.add_argument("--batches", type=int, default=None, metavar="N",
                   help="batches per pipeline per round (default: one epoch)")
    p.add_argument("--rounds", type=int, default=2, metavar="N",
                   help="alternating rounds (default: 2)")
    p.add_argument("--batch-size", type=int, default=128, metavar="N")
    p.add_argument("--image-size", type=int, nargs=2, default=(244, 244), metavar=("H", "W"))
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="loader cache for gs://, and the -cached rows' GPU-ready caches in "
                        "DIR/cpu-cached and DIR/gpu-cached (default: fresh temporary folders)")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run only these pipelines: seed tuned loader (all loader rows) "
                        "loader-cpu loader-gpu loader-cpu-cached loader-gpu-cached (each "
                        "also selects its per-decoder rows, loader-cpu-wuffs ...); and two "
                        "rows run only when named: loader-dali (decoder='dali' on the CPU; "
                        "loader-dali-cached) and decode-bound (TF's decode alone, in memory, "
                        "all cores, no resize)")
    p.add_argument("--sample", type=int, default=None, metavar="N",
                   help="first write N photo-like 500x375 sample PNGs (4 classes) into SOURCE, "
                        "a local folder, unless it holds files already")
    p.add_argument("--png-decoder", nargs="+", choices=("wuffs", "libpng"), default=None,
                   metavar="{wuffs,libpng}",
                   help="the loader rows' PNG decoder (default: the loader's own, the native core "
                        "where built, else libpng); "
                        "give both to run each loader row once per decoder "
                        "(loader-cpu-wuffs, loader-cpu-libpng)")
    return p


@cli_command("bench")
def handler(args: argparse.Namespace) -> int:
    """Runs the benchmark, writes the files and prints the table. Returns the exit status."""
    from dali_loader.tools.bench import results_markdown, run_bench, write_results

    logging.basicConfig(level=logging.INFO, format="  %(message)s", stream=sys.stderr)
    if args.sample and not (os.path.isdir(args.source) and os.listdir(args.source)):
        from dali_loader.tools.sample import make_sample_dataset

        make_sample_dataset(args.source, num_images=args.sample)
    prepare_source(args.source, getattr(args, "verbose", False))
    res = run_bench(args.source, step_time=args.step_time, batch_size=args.batch_size,
                    image_size=tuple(args.image_size), rounds=args.rounds,
                    max_batches=args.batches, cache_dir=args.cache_dir, include=args.only,
                    png_decoder=args.png_decoder)
    argv = sys.argv[1:]
    res["command"] = "dali-loader " + " ".join(argv if argv[:1] == ["bench"] else ["bench", *argv])
    paths = write_results(res, args.out, tensorboard=args.tensorboard)
    print(results_markdown(res))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0
