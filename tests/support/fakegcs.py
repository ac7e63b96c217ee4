"""A small Google Cloud Storage JSON-API server on loopback, with fault injection.

It serves enough of the API for the real ``google-cloud-storage`` client
(``STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT``): bucket metadata, paged object
listing with ``prefix``/``delimiter``, object metadata, and media downloads with
``Range`` support and ``x-goog-hash`` headers. Faults (latency, 503/429, connection
resets, truncated bodies, flipped bytes) are drawn from a seeded RNG; ``Faults.deny_status``
refuses every request (401/403) as GCS does for missing or insufficient credentials. Used by the
tests, the demo and the benchmarks; never meant to face a network. This module holds
the store and its lifecycle; the HTTP routes live in :mod:`support.fakegcs_handler`.

Run standalone (prints ``FAKEGCS_URL http://127.0.0.1:PORT``)::

    PYTHONPATH=tests python -m support.fakegcs --root DIR --bucket b --latency 0.05
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import hashlib
import os
import random
import struct
import sys
import threading
import time

import google_crc32c

from support.fakegcs_handler import FakeGCSHandler, FakeGCSServer, StoredObject

_GEN_BASE = 1_700_000_000_000_000


@dataclasses.dataclass
class Faults:
    """Fault-injection settings; rates are per request, in [0, 1].

    ``latency`` is slept before every API request. ``error_rate`` answers
    ``error_status`` (503 by default, 429 also common). ``reset_rate`` drops the
    connection with a TCP reset. ``truncate_rate`` and ``flip_rate`` only apply to
    media downloads: the body is cut short, or one byte is flipped while the
    headers still announce the true checksum. ``deny_status`` (401 or 403), when
    set, answers every API request with that status: missing or refused credentials.
    """

    latency: float = 0.0
    error_rate: float = 0.0
    error_status: int = 503
    reset_rate: float = 0.0
    truncate_rate: float = 0.0
    flip_rate: float = 0.0
    seed: int = 0
    deny_status: int = 0


def b64_crc32c(data: bytes) -> str:
    """Base64 of the big-endian CRC32C, as GCS reports it."""
    return base64.b64encode(struct.pack(">I", google_crc32c.value(data))).decode()


def b64_md5(data: bytes) -> str:
    """Base64 of the MD5 digest, as GCS reports it."""
    return base64.b64encode(hashlib.md5(data).digest()).decode()


class FakeGCS:
    """An in-memory one-bucket GCS server in a background thread.

    Args:
        bucket: the bucket name it serves.
        faults: fault injection settings (none by default).
        page_size: default page size of object listings.
    """

    def __init__(self, bucket: str = "b", *, faults: Faults | None = None, page_size: int = 1000):
        if not bucket or "/" in bucket:
            raise ValueError(f"bucket must be a non-empty name without '/'. Received: bucket={bucket!r}")
        self.bucket = bucket
        self.faults = faults or Faults()
        self.page_size = page_size
        self.objects: dict[str, StoredObject] = {}
        self.fail_names: dict[str, int] = {}  # name -> status answered forever (0 = reset)
        self.counts: collections.Counter[str] = collections.Counter()
        self.in_flight = 0  # requests being answered now
        self.media_counts: collections.Counter[str] = collections.Counter()
        self._names: list[str] = []
        self._names_dirty = False
        self._next_gen = _GEN_BASE
        self._lock = threading.Lock()
        self._rng = random.Random(self.faults.seed)
        self._server: FakeGCSServer | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- store
    @classmethod
    def from_directory(cls, root: str, bucket: str = "b", *, prefix: str = "",
                       dir_placeholders: bool = False, **kwargs) -> FakeGCS:
        """A server whose bucket holds every file under ``root`` (at ``prefix/rel``).

        With ``dir_placeholders`` each directory also gets a zero-byte ``"dir/"``
        object, as the Cloud console creates, so empty folders are listed.
        """
        if not os.path.isdir(root):
            raise FileNotFoundError(f"Not a directory: {root}")
        server = cls(bucket, **kwargs)
        base = prefix.strip("/") + "/" if prefix.strip("/") else ""
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            if dir_placeholders and rel_dir:
                server.put(base + rel_dir, b"")
            for fname in filenames:
                with open(os.path.join(dirpath, fname), "rb") as f:
                    server.put(base + rel_dir + fname, f.read())
        return server

    def put(self, name: str, data: bytes) -> int:
        """Store ``data`` as object ``name`` with a new generation; returns it."""
        with self._lock:
            self._next_gen += 1
            if name not in self.objects:
                self._names_dirty = True
            self.objects[name] = StoredObject(bytes(data), self._next_gen, b64_crc32c(data), b64_md5(data))
            return self._next_gen

    def delete(self, name: str) -> None:
        """Remove object ``name`` (no error when absent)."""
        with self._lock:
            if self.objects.pop(name, None) is not None:
                self._names_dirty = True

    def add_synthetic(self, n: int, prefix: str = "synthetic/", size: int = 32, classes: int = 10) -> None:
        """Add ``n`` small deterministic objects in ``classes`` folders (for large listings)."""
        for i in range(n):
            name = f"{prefix}class{i % classes:04d}/img{i:07d}.png" if classes != 10 else \
                f"{prefix}class{i % 10}/img{i:07d}.png"
            self.put(name, (hashlib.sha256(name.encode()).digest() * (size // 32 + 1))[:size])

    def sorted_names(self) -> list[str]:
        with self._lock:
            if self._names_dirty:
                self._names = sorted(self.objects)
                self._names_dirty = False
            return self._names

    def reset_counts(self, settle_s: float = 10.0) -> None:
        """Wait (up to ``settle_s``) for requests in flight to finish, then zero the counters."""
        deadline = time.monotonic() + settle_s
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        with self._lock:
            self.counts.clear()
            self.media_counts.clear()

    # ------------------------------------------------------------ lifecycle
    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``, the value for ``STORAGE_EMULATOR_HOST``."""
        if self._server is None:
            raise RuntimeError("FakeGCS is not started.")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    url = endpoint

    def start(self, port: int = 0) -> FakeGCS:
        """Start serving on ``127.0.0.1:port`` (0 = any free port)."""
        if self._server is not None:
            return self
        handler = type("_BoundHandler", (FakeGCSHandler,), {"fake": self})
        server = FakeGCSServer(("127.0.0.1", port), handler, bind_and_activate=False)
        server.daemon_threads = True
        server.request_queue_size = 256  # many clients connect at once
        server.allow_reuse_address = True
        server.server_bind()
        server.server_activate()
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fakegcs", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeGCS:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- faults
    def _draw(self, media: bool, name: str | None) -> str | None:
        f = self.faults
        with self._lock:
            if name is not None and name in self.fail_names:
                return "reset" if self.fail_names[name] == 0 else "error"
            r = self._rng.random()
        for kind, rate in (("error", f.error_rate), ("reset", f.reset_rate),
                           ("truncate", f.truncate_rate if media else 0.0),
                           ("flip", f.flip_rate if media else 0.0)):
            if r < rate:
                return kind
            r -= rate
        return None



def write_random_tree(root: str, *, classes: tuple[str, ...] = ("cats", "dogs", "birds"), per_class: int = 20,
                      size: tuple[int, int] = (1000, 8000), seed: int = 0) -> dict[str, bytes]:
    """Write ``classes x per_class`` random ``.png``-named files (bytes only) under ``root``.

    Returns {rel path: bytes}; used by tests and benchmarks as the "local folder" truth.
    """
    rng = random.Random(seed)
    tree: dict[str, bytes] = {}
    for c in classes:
        os.makedirs(os.path.join(root, c), exist_ok=True)
        for i in range(per_class):
            rel = f"{c}/{i:05d}.png"
            data = rng.randbytes(rng.randint(*size))
            with open(os.path.join(root, c, f"{i:05d}.png"), "wb") as f:
                f.write(data)
            tree[rel] = data
    return tree


def main(argv: list[str] | None = None) -> int:
    """Serve a directory (and/or a synthetic listing) until stdin closes or SIGTERM."""
    p = argparse.ArgumentParser(prog="python -m support.fakegcs", description=__doc__.splitlines()[0])
    p.add_argument("--root", help="directory served as the bucket")
    p.add_argument("--bucket", default="b")
    p.add_argument("--prefix", default="", help="object-name prefix for the files of --root")
    p.add_argument("--synthetic", type=int, default=0, help="add N small synthetic objects")
    p.add_argument("--classes", type=int, default=10, help="class folders of the synthetic objects")
    p.add_argument("--port", type=int, default=0)
    for field in dataclasses.fields(Faults):
        p.add_argument("--" + field.name.replace("_", "-"), type=type(field.default), default=field.default)
    args = p.parse_args(argv)
    faults = Faults(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Faults)})
    if args.root:
        server = FakeGCS.from_directory(args.root, args.bucket, prefix=args.prefix, faults=faults)
    else:
        server = FakeGCS(args.bucket, faults=faults)
    if args.synthetic:
        server.add_synthetic(args.synthetic, classes=args.classes)
    with server.start(args.port):
        sys.stdout.write(f"FAKEGCS_URL {server.endpoint}\n")
        sys.stdout.flush()
        try:
            sys.stdin.read()  # the parent closes our stdin to stop us
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
