"""CLI subcommands ``prefetch`` and ``cache info|clean``.

``dali_loader.tools.cli`` registers them with :func:`add_parsers`. Errors (unreachable
storage, refused credentials, a missing bucket or prefix, bad arguments) are one
line on stderr and exit status 2; ``-v`` adds the traceback.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import logging
import re
import sys
import time

from dali_loader.args import positive_int
from dali_loader.tools.cli_common import add_verbose_flag, cli_command

logger = logging.getLogger(__name__)

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"500M"``, ``"20GiB"``, ``"1.5g"``, ``"1000"`` -> bytes (powers of 1024 for suffixes)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size (e.g. 500M, 20G). Received: {text!r}")
    power = " kmgtp".index(m.group(2).lower() or " ")
    return int(float(m.group(1)) * 1024 ** power)


def add_parsers(subparsers) -> None:
    """Register ``prefetch`` and ``cache`` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "prefetch", help="fill the local cache from gs://bucket/prefix ahead of training",
        description="Download every object under URL into the cache, verified; resumable: "
                    "verified cached objects are not fetched again. With --gpu-ready, fill "
                    "the GPU-ready cache instead (URL may then be a local folder too).")
    p.add_argument("url", help="gs://bucket/prefix (or another fsspec URL; with --gpu-ready, "
                               "also a local folder or FUSE mount)")
    p.add_argument("--gpu-ready", action="store_true",
                   help="decode every image once, exactly as Keras does, and store the lossless "
                        "form the loader reads (image_dataset_from_directory(gpu_ready=True))")
    p.add_argument("--color-mode", choices=("rgb", "rgba", "grayscale"), default="rgb",
                   help="with --gpu-ready: the dataset's color_mode (default rgb)")
    p.add_argument("--form", choices=("compact", "raw"), default="compact",
                   help="with --gpu-ready: compact entries (default; what gpu_ready=True reads "
                        "on every path: delta-filtered zstd chunks, about the PNG's size) or raw "
                        "pixels (gpu_ready=\"raw\")")
    _add_cache_dir(p)
    p.add_argument("--png-decoder", choices=("wuffs", "libpng"), default=None,
                   help="with --gpu-ready: who decodes PNGs (default: Wuffs where installed, "
                        "else libpng; the same pixels)")
    p.add_argument("--cache-max-bytes", type=parse_size, default=None,
                   help="cache size bound, e.g. 200G (default: half the free disk space)")
    p.add_argument("--max-in-flight", type=int, default=64, help="concurrent downloads (default 64)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_verbose_flag(p)
    p.set_defaults(func=run_prefetch)

    c = subparsers.add_parser("cache", help="inspect or clean the local object cache")
    csub = c.add_subparsers(dest="cache_command", required=True)
    info = csub.add_parser("info", help="objects, bytes and leftover temp files in the cache")
    _add_cache_dir(info)
    add_verbose_flag(info)
    info.set_defaults(func=run_cache_info)
    clean = csub.add_parser("clean", help="remove cached objects (all, or down to --keep-bytes, LRU)")
    _add_cache_dir(clean)
    clean.add_argument("--keep-bytes", type=parse_size, default=None,
                       help="evict least-recently-used objects down to this size instead of everything")
    add_verbose_flag(clean)
    clean.set_defaults(func=run_cache_clean)
    man = csub.add_parser("manifest", help="list URL again and (re)write its listing manifest",
                          description="List gs://bucket/prefix (one prefix per folder, concurrently) and "
                                      "write the listing manifest that image_dataset_from_directory "
                                      "(manifest=\"use\", the default) starts from.")
    man.add_argument("url", help="gs://bucket/prefix (or another fsspec URL)")
    _add_cache_dir(man)
    add_verbose_flag(man)
    man.set_defaults(func=run_cache_manifest)


def _add_cache_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", default=None,
                   help="cache directory (default: $XDG_CACHE_HOME/dali-loader or ~/.cache/dali-loader)")


@cli_command("prefetch")
def run_prefetch(args: argparse.Namespace) -> int:
    """Fill the cache; exit code 0 when every object is cached and verified, 1 when some failed, 2 on an error."""
    from tqdm import tqdm

    from dali_loader.storage.objects import ObjectFetchError
    from dali_loader.storage.remote import open_remote

    positive_int("--max-in-flight", args.max_in_flight)
    if args.gpu_ready:
        return _prefetch_ready(args)
    start = time.monotonic()
    with open_remote(args.url, cache_dir=args.cache_dir, cache_max_bytes=args.cache_max_bytes,
                     max_in_flight=args.max_in_flight) as source:
        objects = [o for o in source.list_objects(manifest="refresh") if not o.rel.endswith("/")]
        total = sum(o.size for o in objects)
        if total > source.cache.max_bytes:
            logger.warning("The data (%d bytes) is larger than the cache bound (%d bytes): the first "
                           "objects will be evicted again; raise --cache-max-bytes.", total, source.cache.max_bytes)
        fetched = cached = 0
        failed: list[str] = []
        bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="prefetch",
                   disable=args.no_progress, dynamic_ncols=True)
        window = 2 * args.max_in_flight
        todo = iter(objects)
        with cf.ThreadPoolExecutor(args.max_in_flight, thread_name_prefix="prefetch") as pool, bar:
            running: dict[cf.Future, object] = {}
            while True:
                while len(running) < window:
                    obj = next(todo, None)
                    if obj is None:
                        break
                    running[pool.submit(source.ensure_cached, obj)] = obj
                if not running:
                    break
                done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    obj = running.pop(fut)
                    try:
                        if fut.result():
                            fetched += 1
                        else:
                            cached += 1
                    except ObjectFetchError as e:
                        failed.append(e.url)
                        logger.error("%s", e)
                    bar.update(obj.size)
                    bar.set_postfix_str(f"{fetched + cached + len(failed)}/{len(objects)} objects", refresh=False)
    sys.stdout.write(
        f"{source.url}: {len(objects)} objects, {total} bytes: {fetched} downloaded, {cached} already cached, "
        f"{len(failed)} failed, in {time.monotonic() - start:.1f} s; cache {source.cache.root}\n")
    return 1 if failed else 0


def _prefetch_ready(args: argparse.Namespace) -> int:
    """Fills the GPU-ready cache for every image of a folder or URL."""
    from tqdm import tqdm

    from dali_loader.api import open_index
    from dali_loader.decode.dali_graph import default_num_threads
    from dali_loader import probes
    from dali_loader.decode.png_stage import KerasPixels
    from dali_loader.plan import Options, PngDecoder, check, resolve
    from dali_loader.decode.spec import channels_for
    from dali_loader.errors import BadFileError
    from dali_loader.tfdata.dataset import ready_cache
    from dali_loader.tools.cli_common import import_tensorflow_quietly

    import_tensorflow_quietly()  # TF decodes each image once, as Keras does
    form = args.form
    channels = channels_for(args.color_mode)
    # The fills' decoder is the plan's (`png_fill`, the same on every path; the DALI
    # engine reads both forms).
    options = Options(device="cpu", decoder="dali", gpu_ready=form,
                      png_decoder=args.png_decoder, max_in_flight=args.max_in_flight)
    env = probes.environment()
    check(options, env)
    start = time.monotonic()
    src, index = open_index(args.url, labels=None, shuffle=False, cache_dir=args.cache_dir, manifest="refresh",
                            cache_max_bytes=args.cache_max_bytes, max_in_flight=args.max_in_flight)
    plan = resolve(options, env.with_source(src.kind, index.paths))
    probes.say_notes(plan)
    png = plan.png_fill
    # Decodes run on the pool's threads, at most one per core at once (Wuffs frees the GIL).
    pixels = KerasPixels(channels, default_num_threads()) if png is PngDecoder.WUFFS else None
    with src:
        ready = ready_cache(src, plan.cache_form, channels, pixels)
        failed: list[str] = []
        source_bytes = entry_bytes = 0
        with cf.ThreadPoolExecutor(args.max_in_flight, thread_name_prefix="prefetch") as pool, \
                tqdm(total=len(index.paths), unit="img", desc="prefetch --gpu-ready",
                     disable=args.no_progress, dynamic_ncols=True) as bar:
            futures = {pool.submit(ready.bytes, p): p for p in index.paths}
            for fut in cf.as_completed(futures):
                path = futures[fut]
                try:
                    entry_bytes += len(fut.result())
                    source_bytes += src.size(path)
                except BadFileError as e:
                    failed.append(path)
                    logger.error("%s", e)
                bar.update(1)
        ratio = entry_bytes / source_bytes if source_bytes else float("nan")
        sys.stdout.write(
            f"{args.url}: {len(index.paths)} images ({args.color_mode}, {form} form): "
            f"{ready.fills} decoded and cached, {ready.hits} already cached, {len(failed)} failed, "
            f"in {time.monotonic() - start:.1f} s; {entry_bytes} bytes cached for {source_bytes} "
            f"source bytes ({ratio:.2f}x); cache {src.cache.root}\n")
        if pixels is not None:
            binding = "native core" if pixels.decoder == "native" else "pywuffs"
            sys.stdout.write(f"PNG decoder: Wuffs, {binding} ({pixels.counts['png_fast']} PNGs; "
                             f"{pixels.counts['png_fallbacks']} left to libpng)\n")
        else:
            sys.stdout.write("PNG decoder: libpng (TF's)\n")
    return 1 if failed else 0


@cli_command("cache info")
def run_cache_info(args: argparse.Namespace) -> int:
    """Print what the cache holds."""
    from dali_loader.storage.cache import DiskCache

    s = DiskCache(args.cache_dir).stats()
    sys.stdout.write(f"cache: {s.root}\nobjects: {s.objects}\nbytes: {s.bytes}\n"
                     f"temp files: {s.temp_files}\ndefault bound: {s.max_bytes} bytes\n")
    return 0


@cli_command("cache manifest")
def run_cache_manifest(args: argparse.Namespace) -> int:
    """List a URL and rewrite its listing manifest."""
    from dali_loader.storage.manifest import manifest_path
    from dali_loader.storage.remote import open_remote

    start = time.monotonic()
    with open_remote(args.url, cache_dir=args.cache_dir) as source:
        objects = [o for o in source.list_objects(manifest="refresh") if not o.rel.endswith("/")]
        where = manifest_path(source.cache.root, source.url)
    sys.stdout.write(f"{source.url}: {len(objects)} objects listed in {time.monotonic() - start:.1f} s; "
                     f"manifest {where}\n")
    return 0


@cli_command("cache clean")
def run_cache_clean(args: argparse.Namespace) -> int:
    """Empty the cache, or trim it to ``--keep-bytes``."""
    from dali_loader.storage.cache import DiskCache

    cache = DiskCache(args.cache_dir)
    before = cache.stats()
    if args.keep_bytes is None:
        cache.clear()
    else:
        cache.evict(args.keep_bytes)
    after = cache.stats()
    sys.stdout.write(f"cache: {cache.root}: removed {before.objects - after.objects} objects "
                     f"({before.bytes - after.bytes} bytes); {after.objects} objects ({after.bytes} bytes) left\n")
    return 0
