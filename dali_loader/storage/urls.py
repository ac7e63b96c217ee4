"""Storage URLs: which paths are remote, and `scheme://bucket/prefix` parsing (the one copy)."""

from __future__ import annotations

import re

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_BAD_CHAR = re.compile("[\x00-\x1f\x7f\\\\]")


def is_remote(path: object) -> bool:
    """True for ``scheme://...`` strings other than ``file://``."""
    if not isinstance(path, str):
        return False
    m = _SCHEME_RE.match(path)
    return m is not None and m.group(1).lower() != "file"


def parse_url(url: str) -> tuple[str, str, str]:
    """Split ``scheme://bucket/prefix`` into (scheme, bucket, prefix); ``gcs`` becomes ``gs``."""
    m = _SCHEME_RE.match(url) if isinstance(url, str) else None
    if not m or m.group(1).lower() == "file":
        raise ValueError(f"Expected a remote URL such as gs://bucket/prefix. Received: url={url!r}")
    scheme = m.group(1).lower()
    scheme = "gs" if scheme == "gcs" else scheme
    bucket, _, prefix = url[m.end():].partition("/")
    if not bucket:
        raise ValueError(f"The URL has no bucket name. Received: url={url!r}")
    return scheme, bucket, prefix.strip("/")


def suspect(rel: str) -> bool:
    """Cheap: False for most names, and for none that `unsafe_reason` rejects."""
    return (rel[:1] in "/." or rel.endswith("/") or "//" in rel or "/." in rel
            or _BAD_CHAR.search(rel) is not None)


def unsafe_reason(rel: str) -> str | None:
    """Why ``rel`` (a '/'-separated name under the prefix) is unusable as a dataset path."""
    body = rel[:-1] if rel.endswith("/") else rel
    if not suspect(rel):
        return None
    if rel.startswith("/"):
        return "absolute or empty leading segment"
    wrapped = f"/{body}/"
    if "//" in wrapped:
        return "empty path segment ('//')"
    if "/./" in wrapped or "/../" in wrapped:
        return "'.' or '..' segment"
    if _CONTROL.search(body):
        return "control character"
    if "\\" in body:
        return "backslash (ambiguous path separator)"
    return None
