"""Hostile compact cache entries (issue 38 item 6): seeded mutants of sound entries.

Each mutant is a sound entry (`formats.compact`) with one to three mutations stacked:
a flipped bit, a set byte, a cut (torn write), bytes appended or removed, a header or
chunk-table field set to a boundary value, another entry's header on this one's chunks
(foreign), or a chunk swapped with another entry's. `tests/test_compact.py` decodes
them with the optimised core (refused, or exactly the source pixels) and with the
ASan + UBSan driver (`fuzz_driver entry`).

    PYTHONPATH=tests python -m support.fuzz_entry --mutants 100000
"""

from __future__ import annotations

import argparse
import logging
import struct
import sys
from collections.abc import Iterator

import numpy as np

from dali_loader.formats import compact
from support.pngs import photo

logger = logging.getLogger(__name__)

_EDGES = (0, 1, 2, 63, 64, 65, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 20, (1 << 20) - 1)


def entry_bases() -> list[tuple[bytes, np.ndarray]]:
    """Sound entries and their pixels: every filter, 1/3/4 channels, one to many chunks
    (small chunks, so that the chunk table is long), a one-pixel image."""
    rng = np.random.default_rng(38)
    out = []
    shapes = [(23, 17, 3), (1, 1, 1), (5, 70, 4), (40, 33, 1), (64, 64, 3)]
    for k, shape in enumerate(shapes):
        px = photo(rng, shape[0], shape[1])
        px = px[:, :, :1] if shape[2] == 1 else (np.concatenate(
            [px, px[:, :, :1]], 2) if shape[2] == 4 else px)
        for filt in (compact.FILTER_NONE, compact.FILTER_UP, compact.FILTER_SUB):
            chunk = (64, 256, compact.CHUNK_BYTES)[(k + filt) % 3]
            out.append((bytes(compact.encode(px, filt, 1, chunk)), px))
    return out


def raw_bases() -> list[tuple[bytes, np.ndarray]]:
    """Raw entries (`formats.ready`: a 16-byte header, then the pixels) of
    `entry_bases()`' images: what the TF op copies for a file the feed decoded."""
    from dali_loader.formats.ready import encode_raw

    seen, out = set(), []
    for _, px in entry_bases():
        if px.shape not in seen:
            seen.add(px.shape)
            out.append((encode_raw(px), px))
    return out


def _u32_fields(data: bytes) -> list[int]:
    if data[:4] == b"DLRW":
        return [4, 8, 12]
    chunks = struct.unpack_from("<I", data, 24)[0] if len(data) >= 28 else 0
    return list(range(8, 32, 4)) + [32 + 4 * k for k in range(min(chunks, 64))]


def mutate(data: bytes, rng: np.random.Generator, others: list[bytes]) -> bytes:
    """One random mutation of `data` (`others`: entries to take foreign parts from)."""
    buf = bytearray(data)
    kind = int(rng.integers(0, 8))
    if not buf:
        return bytes(rng.integers(0, 256, 40, dtype=np.uint8))
    if kind == 0:  # a flipped bit
        i = int(rng.integers(0, len(buf)))
        buf[i] ^= 1 << int(rng.integers(0, 8))
    elif kind == 1:  # a set byte
        buf[int(rng.integers(0, len(buf)))] = int(rng.integers(0, 256))
    elif kind == 2:  # torn: cut anywhere
        del buf[int(rng.integers(0, len(buf))):]
    elif kind == 3:  # bytes appended
        buf += bytes(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8))
    elif kind == 4:  # a range removed
        i = int(rng.integers(0, len(buf)))
        del buf[i:i + int(rng.integers(1, 32))]
    elif kind == 5:  # a header or chunk-table field at a boundary
        fields = [f for f in _u32_fields(data) if f + 4 <= len(buf)]
        if fields:
            at = fields[int(rng.integers(0, len(fields)))]
            old = struct.unpack_from("<I", buf, at)[0]
            choice = [*_EDGES, old + 1, old - 1, int(rng.integers(0, 1 << 32))]
            struct.pack_into("<I", buf, at, choice[int(rng.integers(0, len(choice)))] & 0xFFFFFFFF)
    elif kind == 6:  # foreign: another entry's header (and table) on these chunks
        other = others[int(rng.integers(0, len(others)))]
        cut = min(len(other), compact.FIXED_HEADER + 4 * int(rng.integers(0, 4)))
        buf[:cut] = other[:cut]
    else:  # foreign: a stretch of another entry's bytes over this one's
        other = others[int(rng.integers(0, len(others)))]
        i = int(rng.integers(0, len(buf)))
        j = int(rng.integers(0, len(other)))
        n = int(rng.integers(1, 256))
        buf[i:i + n] = other[j:j + n]
    return bytes(buf)


def mutants(n: int, seed: int,
            bases: list[tuple[bytes, np.ndarray]] | None = None) -> Iterator[tuple[bytes, np.ndarray]]:
    """`n` seeded mutants of `bases` (default `entry_bases()`), each with its source's
    pixels."""
    bases = entry_bases() if bases is None else bases
    others = [e for e, _ in bases]
    rng = np.random.default_rng(seed)
    for _ in range(n):
        data, px = bases[int(rng.integers(0, len(bases)))]
        for _ in range(int(rng.integers(1, 4))):
            data = mutate(data, rng, others)
        yield data, px


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from dali_loader.native import build
    from support.fuzz_png import run_driver

    driver = build.sanitizer_driver()
    gen, done, ok = mutants(args.mutants, args.seed), 0, 0
    while batch := [d for d, _ in (next(gen, (None, None)) for _ in range(25_000)) if d is not None]:
        result, _ = run_driver(driver, batch, entries=True)
        done, ok = done + result.files, ok + result.ok
    logger.info("%d entries through the sanitizer driver, %d decoded, no finding", done, ok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
