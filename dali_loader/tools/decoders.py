"""Which decoder runs for the files present: the names `diagnose` and `bench` print.

A folder of JPEGs is decoded by TF's JPEG decoder (libjpeg-turbo), not by a PNG decoder;
a mix names each format's decoder with its share of the sampled files. The PNG decoder's
name is passed in (`png_decoder`: "libpng", "wuffs", or another the loader resolves to),
so the one place that names decoders is `decoder_name`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from dali_loader.formats.sniff import sniff

# TF's decoders behind tf.io.decode_image, by format (what the CPU default runs).
TF_DECODERS = {"JPEG": "libjpeg-turbo", "GIF": "giflib", "BMP": "TF's BMP decoder"}
PNG_DECODERS = {"libpng": "libpng", "wuffs": "Wuffs"}
FORMATS = ("PNG", "JPEG", "GIF", "BMP")


def sniff_format(data: bytes) -> str:
    """The image format of `data` from its first bytes: "PNG", "JPEG", "GIF", "BMP" or "other"
    (`formats.sniff.sniff`, in the names reports print)."""
    kind = sniff(data)
    return "other" if kind is None else kind.upper()


def format_counts(blobs: Iterable[bytes]) -> dict[str, int]:
    """How many of `blobs` are of each format (formats absent are left out), in FORMATS order."""
    counts = Counter(sniff_format(b) for b in blobs)
    return {f: counts[f] for f in (*FORMATS, "other") if counts[f]}


def png_decoder_label(png_decoder: str) -> str:
    """A PNG decoder's printed name ("libpng" -> "libpng", "wuffs" -> "Wuffs")."""
    return PNG_DECODERS.get(png_decoder, png_decoder)


def decoder_name(formats: dict[str, int] | None, png_decoder: str) -> str:
    """The decoder(s) that run for files of `formats` (format -> sampled count) when PNGs
    are decoded by `png_decoder`: "libjpeg-turbo (JPEG)", "libpng (PNG)", or for a mix
    "libjpeg-turbo (JPEG, 40 of 64) + Wuffs (PNG, 24 of 64)". Without counts (None or
    empty: not sampled), the PNG decoder's name alone."""
    png = png_decoder_label(png_decoder)
    if not formats:
        return png
    total = sum(formats.values())
    parts = []
    for fmt, n in formats.items():
        name = png if fmt == "PNG" else TF_DECODERS.get(fmt, "TF's decode_image")
        share = "" if n == total else f", {n} of {total}"
        parts.append(f"{name} ({fmt}{share})")
    return " + ".join(parts)
