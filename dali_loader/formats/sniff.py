"""What a file is, by its magic bytes (like `tf.io.decode_image`: the extension does
not matter), and the image size its header claims, from a file's first bytes."""

from __future__ import annotations

import os
import struct

from dali_loader.formats import png

HEAD_BYTES = 4096  # enough for the size of a PNG, GIF or BMP, and most JPEGs


def sniff(data) -> str | None:
    """Returns "png", "jpeg", "gif", "bmp", or None for unknown content."""
    if data[:8] == png.SIGNATURE:
        return "png"
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:2] == b"BM":
        return "bmp"
    return None


def jpeg_size(data) -> tuple[int, int] | None:
    """(width, height) from a JPEG's first SOF segment, or None if not in `data`."""
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", data, pos + 2)
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if pos + 9 > n:
                return None
            h, w = struct.unpack_from(">HH", data, pos + 5)
            return w, h
        if marker == 0xDA:  # scan data before any frame header
            return None
        pos += 2 + length
    return None


def image_size(data, kind: str | None = None) -> tuple[int, int] | None:
    """(width, height) claimed by the header of a PNG, JPEG, GIF or BMP, or None
    when `data` (the file, or its first bytes) does not say. `kind`: `sniff(data)`,
    when the caller has it."""
    kind = kind or sniff(data)
    if kind == "png":
        return png.size(data)
    if kind == "gif" and len(data) >= 10:
        return struct.unpack_from("<HH", data, 6)
    if kind == "bmp" and len(data) >= 26:
        (header,) = struct.unpack_from("<I", data, 14)
        if header == 12:  # OS/2 BITMAPCOREHEADER
            return struct.unpack_from("<HH", data, 18)
        w, h = struct.unpack_from("<ii", data, 18)
        return abs(w), abs(h)
    if kind == "jpeg":
        return jpeg_size(data)
    return None


def read_head(path: str, offset: int = 0) -> bytes:
    """The first bytes of a local file's image (from `offset` on) that say its size:
    `HEAD_BYTES`, or the whole file for a JPEG whose frame header lies further in.
    Plain `os` calls, no file object (it runs once per file on the CPU default)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, HEAD_BYTES, offset)
        if sniff(head) == "jpeg" and jpeg_size(head) is None and len(head) == HEAD_BYTES:
            head += _read_from(fd, offset + HEAD_BYTES)
    finally:
        os.close(fd)
    return head


def _read_from(fd: int, offset: int) -> bytes:
    """The rest of an open file from `offset` on."""
    parts = []
    while part := os.pread(fd, 1 << 20, offset):
        parts.append(part)
        offset += len(part)
    return b"".join(parts)
