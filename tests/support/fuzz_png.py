"""Fuzzing the native PNG core under AddressSanitizer and UBSan (issue 27 item 6).

`PYTHONPATH=tests python -m support.fuzz_png --mutants 100000` builds the sanitizer
driver (`python -m dali_loader.native.build --sanitize`: `fuzz_driver.cc`, the core
and Wuffs with `-fsanitize=address,undefined -fno-sanitize-recover=all`), then
feeds it the 3,000-file mutation corpus and N more seeded mutants (one to three
stacked mutations each, `tests/support/mutate.py`) of sound PNGs, each decoded in 1, 3
and 4 channels into a buffer of exactly the planned size. Any sanitizer report
aborts the driver: the run fails and names the batch. Exit status 0: no finding.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import logging
import struct
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from support import png_corpus
from support.mutate import MUTATIONS, corpus, mutate
from support.pngs import chunk, encode_png, photo

logger = logging.getLogger(__name__)


def mutation_bases() -> list[bytes]:
    """The mutation corpus's sound PNGs (as tests/test_png_cpu.py builds them): every
    8-bit colour type with all five filter types, a palette with and without tRNS, a
    gAMA file, and Pillow's PNGs (its own filter choice). The 3,000-file mutation
    corpus is `mutate.corpus(mutation_bases(), 3000, seed=21)`."""
    from PIL import Image

    rng = np.random.default_rng(7)
    rgb = photo(rng, 23, 31)
    out = []
    for c in (1, 2, 3, 4):
        px = rgb[:, :, :c] if c != 2 else np.stack([rgb[:, :, 0], rgb[:, :, 1]], -1)
        out.append(encode_png(px, (0, 1, 2, 3, 4)))
    pal = rng.integers(0, 256, (16, 3), dtype=np.uint8)
    idx = rng.integers(0, 16, (19, 27), dtype=np.uint8)
    out.append(encode_png(idx, (0, 4), palette=pal))
    out.append(encode_png(idx, (1, 2), palette=pal, trns=bytes(range(0, 160, 10))))
    out.append(encode_png(rgb, (4,), extra_chunks=chunk(b"gAMA", (45455).to_bytes(4, "big"))))
    for mode in ("RGB", "RGBA", "L", "LA", "P"):
        buf = io.BytesIO()
        Image.fromarray(photo(rng, 29, 21)).convert(mode).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def sources(pngsuite: Path | None = None) -> list[bytes]:
    """Sound PNGs to fuzz from: `mutation_bases()`, Pillow's 1-bit and 16-bit grey,
    the generated corpus (`tests/support/png_corpus`: every colour type x depth x interlace x
    ancillary variant, and its corrupt files) and PngSuite's valid files (when given)."""
    from PIL import Image

    out = mutation_bases()
    rng = np.random.default_rng(8)
    grey = photo(rng, 27, 33)[:, :, 0]
    for img in (Image.fromarray(grey).convert("1"),
                Image.fromarray(grey.astype(np.uint16) * 257)):
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        out.append(buf.getvalue())
    out.extend(png_corpus.corpus().values())
    if pngsuite is not None and pngsuite.is_dir():
        out.extend(p.read_bytes() for p in sorted(pngsuite.glob("*.png"))
                   if not p.name.startswith("x"))
    return out


def stacked_mutants(srcs: list[bytes], n: int, seed: int) -> Iterator[bytes]:
    """`n` seeded mutants of `srcs`, each with one to three mutations stacked."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        data = srcs[int(rng.integers(0, len(srcs)))]
        for k in range(int(rng.integers(1, 4))):
            kind = MUTATIONS[(i + k) % len(MUTATIONS)]
            try:
                data = mutate(data, kind, rng)
            except (StopIteration, struct.error, ValueError, IndexError):
                break  # a mutant too damaged for this mutation: keep it as it is
        yield data


def records(files: Iterable[bytes]) -> bytes:
    """The driver's input: each file as a little-endian uint32 length and its bytes."""
    return b"".join(struct.pack("<I", len(d)) + d for d in files)


@dataclasses.dataclass
class FuzzResult:
    files: int = 0
    ok: int = 0
    fallback: int = 0
    seconds: float = 0.0


def run_driver(driver: Path, files: list[bytes], max_pixels: int = 1 << 22,
               verbose: bool = False, timeout: float = 600,
               entries: bool = False) -> tuple[FuzzResult, list[str]]:
    """Runs the sanitizer driver on `files` (PNGs, or compact cache entries when
    `entries`); raises RuntimeError (with the sanitizer's report) on any finding.
    Returns the counts and, when `verbose`, the per-mode (per-entry) lines."""
    t0 = time.monotonic()
    args = [str(driver), str(max_pixels), "-v" if verbose else "-q"] + (
        ["entry"] if entries else [])
    r = subprocess.run(args, input=records(files), capture_output=True, timeout=timeout)
    err = r.stderr.decode(errors="replace")
    if r.returncode or "runtime error" in err or "Sanitizer" in err:
        raise RuntimeError(f"the sanitizer driver failed (exit {r.returncode}):\n{err[-4000:]}")
    lines = r.stdout.decode().splitlines()
    _, nfiles, _, ok, _, fallback = lines[-1].split()
    return FuzzResult(int(nfiles), int(ok), int(fallback), time.monotonic() - t0), lines[:-1]


def fuzz(mutants: int, seed: int = 1, pngsuite: Path | None = None,
         batch: int = 20000) -> FuzzResult:
    """The mutation corpus (3,000 files) and `mutants` stacked mutants through the driver."""
    from dali_loader.native import build

    driver = build.sanitizer_driver()
    srcs = sources(pngsuite)
    total = FuzzResult()
    t0 = time.monotonic()
    first = [d for _, d in corpus(mutation_bases(), 3000, seed=21)]
    gen = stacked_mutants(srcs, mutants, seed)
    chunk_files = first
    while chunk_files:
        got, _ = run_driver(driver, chunk_files)
        total.files += got.files
        total.ok += got.ok
        total.fallback += got.fallback
        logger.info("%d files (%d decodes, %d fallbacks), %.0f s", total.files, total.ok,
                    total.fallback, time.monotonic() - t0)
        chunk_files = [d for _, d in zip(range(batch), gen)]
    total.seconds = time.monotonic() - t0
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pngsuite", type=Path, default=None,
                        help="PngSuite's folder: its valid files join the sources")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        r = fuzz(args.mutants, args.seed, args.pngsuite)
    except RuntimeError as e:
        logger.error("%s", e)
        return 1
    logger.info("no finding: %d files x 3 modes (%d decoded, %d fell back) in %.0f s",
                r.files, r.ok, r.fallback, r.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
