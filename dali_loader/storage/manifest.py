"""The listing manifest: a remote source's listing, kept in the cache directory.

Listing a bucket of a million objects takes a minute of requests; a manifest
is that listing written once (every object's name, size, generation and
checksums) so that later runs start from it in about a second. It is a
snapshot: reads stay pinned to the generations it names, so an object deleted
or rewritten since is caught when it is read (a download of that generation
fails; the feed's ``on_error`` names or skips it); a cached copy of the named
generation is that generation's content. What it cannot see is objects added
after it was written: ``manifest="refresh"`` (or ``dali-loader cache manifest
URL``) lists again.

Layout: ``<cache>/v1/manifests/<sha256(url, endpoint)>.json.gz``, a gzipped
JSON document ``{"version", "url", "endpoint", "created", "objects": {"name": [...],
"size": [...], "generation": [...], "crc32c": [...], "md5": [...]}}`` (columns: about
twice as fast to read as a list per object), written atomically.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import time
import uuid

logger = logging.getLogger(__name__)

__all__ = ["MANIFEST_MODES", "check_manifest_mode", "manifest_path", "load_manifest", "save_manifest",
           "describe_age"]

#: ``"use"``: read the manifest when there is one, else list and write it;
#: ``"refresh"``: list and (re)write it; ``"off"``: list, neither read nor write it.
MANIFEST_MODES = ("use", "refresh", "off")
_VERSION = 2

Row = tuple[str, int, str, "str | None", "str | None"]


def check_manifest_mode(manifest: str) -> str:
    """Validates a ``manifest`` option."""
    if manifest not in MANIFEST_MODES:
        raise ValueError(f"`manifest` must be one of {', '.join(map(repr, MANIFEST_MODES))}. "
                         f"Received: manifest={manifest!r}")
    return manifest


def _endpoint(scheme: str) -> str:
    """What else decides a URL's content: the emulator a gs:// URL is served by."""
    return os.environ.get("STORAGE_EMULATOR_HOST", "") if scheme == "gs" else ""


def manifest_path(cache_root: str, url: str) -> str:
    """Where the manifest of ``url`` lives under the cache directory ``cache_root``."""
    scheme = url.split("://", 1)[0]
    h = hashlib.sha256(f"{url}\0{_endpoint(scheme)}".encode("utf-8", "surrogatepass")).hexdigest()
    return os.path.join(cache_root, "v1", "manifests", h[:32] + ".json.gz")


def load_manifest(path: str, url: str) -> tuple[list[Row], float] | None:
    """The rows and creation time (epoch seconds) of the manifest at ``path``; None
    when there is none, or it is unreadable or for another URL (logged)."""
    try:
        with gzip.open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError) as e:
        logger.warning("Ignoring the unreadable listing manifest %s (%s); listing %s again.", path, e, url)
        return None
    scheme = url.split("://", 1)[0]
    if doc.get("version") != _VERSION or doc.get("url") != url or doc.get("endpoint") != _endpoint(scheme):
        return None
    cols = doc["objects"]
    return list(zip(cols["name"], cols["size"], cols["generation"], cols["crc32c"], cols["md5"])), \
        float(doc["created"])


def save_manifest(path: str, url: str, rows: list[Row]) -> None:
    """Writes the manifest of ``url`` atomically (temp file, then rename)."""
    scheme = url.split("://", 1)[0]
    names, sizes, gens, crcs, md5s = zip(*rows) if rows else ((),) * 5
    doc = {"version": _VERSION, "url": url, "endpoint": _endpoint(scheme), "created": time.time(),
           "objects": {"name": names, "size": sizes, "generation": gens, "crc32c": crcs, "md5": md5s}}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with gzip.open(tmp, "wb", compresslevel=1) as f:
            f.write(json.dumps(doc, separators=(",", ":")).encode("utf-8", "surrogatepass"))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def describe_age(created: float) -> str:
    """``"3 h 5 min ago"``-style age of a manifest."""
    s = max(0, int(time.time() - created))
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60} min ago"
    return f"{s // 86400} days ago"
