"""A seeded corpus of damaged PNGs, for outcome parity with TF's decoder.

Each mutation is one way a file goes wrong in storage or in a bad encoder: a
flipped byte anywhere, a flipped byte inside IDAT with the chunk's CRC made valid
again (so only the zlib stream's Adler-32 or the inflated size can tell),
truncation, a dropped chunk, trailing bytes, and an IHDR field changed with its
CRC made valid (size, bit depth, colour type, interlace).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import numpy as np

from dali_loader.testing.pngs import chunk

MUTATIONS = ("byte_flip", "idat_flip_fixed_crc", "truncate", "drop_chunk", "trailing_bytes",
             "ihdr_edit_fixed_crc")


def chunks(png: bytes) -> list[tuple[int, bytes, bytes]]:
    """(offset, type, body) of each chunk that fits in `png`."""
    out, pos = [], 8
    while pos + 12 <= len(png):
        n, kind = struct.unpack_from(">I4s", png, pos)
        if pos + 12 + n > len(png):
            break
        out.append((pos, kind, png[pos + 8:pos + 8 + n]))
        pos += 12 + n
    return out


def _rebuild(png: bytes, parts: list[tuple[bytes, bytes]]) -> bytes:
    return png[:8] + b"".join(chunk(kind, body) for kind, body in parts)


def mutate(png: bytes, how: str, rng: np.random.Generator) -> bytes:
    """One damaged copy of `png` (`how` in `MUTATIONS`)."""
    parts = [(kind, body) for _, kind, body in chunks(png)]
    if how == "byte_flip":
        out = bytearray(png)
        i = int(rng.integers(8, len(out)))
        out[i] ^= 1 << int(rng.integers(0, 8))
        return bytes(out)
    if how == "idat_flip_fixed_crc":
        idats = [i for i, (k, b) in enumerate(parts) if k == b"IDAT" and b]
        i = idats[int(rng.integers(len(idats)))]
        body = bytearray(parts[i][1])
        j = int(rng.integers(len(body)))
        body[j] ^= 1 << int(rng.integers(0, 8))
        parts[i] = (b"IDAT", bytes(body))
        return _rebuild(png, parts)
    if how == "truncate":
        return png[:int(rng.integers(8, len(png)))]
    if how == "drop_chunk":
        del parts[int(rng.integers(len(parts)))]
        return _rebuild(png, parts)
    if how == "trailing_bytes":
        return png + rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    if how == "ihdr_edit_fixed_crc":
        w, h, depth, color, comp, filt, inter = struct.unpack(">IIBBBBB", parts[0][1])
        field = int(rng.integers(5))
        if field == 0:
            w = max(1, w + int(rng.integers(-3, 4)))
        elif field == 1:
            h = max(1, h + int(rng.integers(-3, 4)))
        elif field == 2:
            depth = int(rng.choice([1, 2, 4, 8, 16]))
        elif field == 3:
            color = int(rng.choice([0, 2, 3, 4, 6]))
        else:
            inter ^= 1
        parts[0] = (b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color, comp, filt, inter))
        return _rebuild(png, parts)
    raise ValueError(f"`how` must be one of {MUTATIONS}. Received: how={how!r}")


def corpus(bases: list[bytes], n: int, seed: int = 0) -> Iterator[tuple[str, bytes]]:
    """`n` (name, damaged PNG) pairs from `bases`, every mutation in turn."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        how = MUTATIONS[i % len(MUTATIONS)]
        base = bases[int(rng.integers(len(bases)))]
        yield f"{i:05d}_{how}.png", mutate(base, how, rng)


def valid_crc(png: bytes) -> bool:
    """Whether every complete chunk's CRC is right (a test's sanity check)."""
    return all(zlib.crc32(kind + body) == struct.unpack_from(">I", png, pos + 8 + len(body))[0]
               for pos, kind, body in chunks(png))
