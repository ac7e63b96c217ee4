"""The disk cache's entry header (`storage.cache.DiskCache`): the magic, the JSON
header's length (big-endian uint32), the JSON header (bucket, name, generation,
size, checksums), then the payload. Reading and writing only: what makes an
entry trusted is the cache's."""

from __future__ import annotations

import json
import struct

MAGIC = b"DLC1"
PREFIX = 8  # the magic and the header's length


def pack_header(fields: dict) -> bytes:
    """The bytes an entry starts with, for the header `fields` (JSON-serialisable)."""
    header = json.dumps(fields).encode()
    return MAGIC + struct.pack(">I", len(header)) + header


def header_end(head) -> int | None:
    """Where the payload starts (`PREFIX` + the JSON header's length), from an
    entry's first `PREFIX` bytes or more; None when they are not an entry's."""
    if len(head) < PREFIX or head[:4] != MAGIC:
        return None
    return PREFIX + struct.unpack_from(">I", head, 4)[0]


def read_header(head, end: int) -> dict:
    """The JSON header of an entry whose first `end` (`header_end`) bytes are in `head`.

    Raises:
        ValueError: the bytes are not a JSON object, or `head` is shorter than `end`.
    """
    if len(head) < end:
        raise ValueError(f"The entry's header is cut short. Received: {len(head)} of {end} bytes")
    header = json.loads(bytes(head[PREFIX:end]))
    if not isinstance(header, dict):
        raise ValueError(f"The entry's header is not a JSON object. Received: {type(header).__name__}")
    return header
