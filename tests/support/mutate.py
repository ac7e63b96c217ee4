"""Seeded hostile PNGs: mutations of sound PNGs, for tests of bad-file handling.

Each mutation is what a damaged or hostile file looks like to a decoder: a
flipped byte anywhere, a flipped byte inside IDAT with the chunk's CRC made
valid again (only the decoder can see it), truncation, a dropped chunk,
trailing bytes, and IHDR edits (size, bit depth, colour type, interlace)
with a valid CRC: the header then claims what the data does not hold, up to
billions of pixels.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import numpy as np

from support.pngs import chunk

MUTATIONS = ("byte_flip", "idat_flip", "truncate", "drop_chunk", "trailing", "ihdr_edit")


def chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """(type, body) of every chunk of a sound PNG."""
    out, pos = [], 8
    while pos + 8 <= len(png):
        n, ctype = struct.unpack_from(">I4s", png, pos)
        out.append((ctype, png[pos + 8:pos + 8 + n]))
        pos += 12 + n
    return out


def assemble(parts: list[tuple[bytes, bytes]]) -> bytes:
    """A PNG of `parts` ((type, body) pairs), every CRC valid."""
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunk(t, b) for t, b in parts)


def mutate(png: bytes, kind: str, rng: np.random.Generator) -> bytes:
    """One `kind` mutation (see `MUTATIONS`) of the sound PNG `png`."""
    parts = chunks(png)
    if kind == "byte_flip":
        out = bytearray(png)
        at = int(rng.integers(8, len(out)))
        out[at] ^= int(rng.integers(1, 256))
        return bytes(out)
    if kind == "idat_flip":
        i = next(k for k, (t, _) in enumerate(parts) if t == b"IDAT")
        body = bytearray(parts[i][1])
        for _ in range(int(rng.integers(1, 4))):
            body[int(rng.integers(0, len(body)))] ^= int(rng.integers(1, 256))
        parts[i] = (b"IDAT", bytes(body))
        return assemble(parts)
    if kind == "truncate":
        return png[:int(rng.integers(8, len(png)))]
    if kind == "drop_chunk":
        del parts[int(rng.integers(0, len(parts)))]
        return assemble(parts)
    if kind == "trailing":
        return png + rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    if kind == "ihdr_edit":
        w, h, depth, color, comp, filt, inter = struct.unpack(">IIBBBBB", parts[0][1])
        field = int(rng.integers(0, 5))
        if field == 0:  # a huge or small width
            w = int(rng.choice([1, w + 1, w * 2, 1 << 16, 1 << 20, (1 << 31) - 1]))
        elif field == 1:
            h = int(rng.choice([1, h + 1, h * 2, 1 << 16, 1 << 20, (1 << 31) - 1]))
        elif field == 2:
            depth = int(rng.choice([1, 2, 4, 8, 16]))
        elif field == 3:
            color = int(rng.choice([0, 2, 3, 4, 6]))
        else:
            inter = 1 - inter
        parts[0] = (b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color, comp, filt, inter))
        return assemble(parts)
    raise ValueError(f"Unknown mutation. Received: kind={kind!r}")


def corpus(sources: list[bytes], n: int, seed: int = 0) -> Iterator[tuple[str, bytes]]:
    """`n` (name, bytes) mutants of `sources` (sound PNGs), seeded; every
    mutation kind in turn, so each is covered."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        kind = MUTATIONS[i % len(MUTATIONS)]
        src = sources[int(rng.integers(0, len(sources)))]
        yield f"{i:03d}_{kind}.png", mutate(src, kind, rng)


def huge_header_png(width: int = 1 << 20, height: int = 1 << 17) -> bytes:
    """A small PNG whose IHDR (valid CRC) claims `width` x `height` RGB pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return assemble([(b"IHDR", ihdr), (b"IDAT", zlib.compress(b"\x00" * 64)), (b"IEND", b"")])
