"""The HTTP side of :class:`~support.fakegcs.FakeGCS`: routes, listing pages, media, faults.

Bucket metadata (``/storage/v1/b/B``), paged listings with ``prefix``/``delimiter``
(``/storage/v1/b/B/o``), object metadata and media downloads
(``/download/storage/v1/b/B/o/NAME?alt=media``, ``Range`` and ``x-goog-hash``), plus
``/_fake/stats``. Faults are drawn per request by the bound :class:`FakeGCS`;
``Faults.deny_status`` refuses every request with 401/403.
"""

from __future__ import annotations

import base64
import dataclasses
import bisect
import http.server
import json
import logging
import socket
import struct
import sys
import time
import urllib.parse
from typing import Any

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class StoredObject:
    """One object version the fake store holds."""

    data: bytes
    generation: int
    crc32c: str
    md5: str


class FakeGCSServer(http.server.ThreadingHTTPServer):
    """A threading HTTP server that treats a client hanging up as routine (debug log)."""

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):  # the client went away (or was killed): not our bug
            logger.debug("fakegcs: client %s disconnected: %s", client_address, exc)
        else:
            super().handle_error(request, client_address)


def object_resource(bucket: str, name: str, obj: StoredObject) -> dict:
    """The JSON-API ``storage#object`` resource of ``obj``."""
    gen = str(obj.generation)
    return {
        "kind": "storage#object", "id": f"{bucket}/{name}/{gen}", "name": name, "bucket": bucket,
        "generation": gen, "metageneration": "1", "size": str(len(obj.data)),
        "crc32c": obj.crc32c, "md5Hash": obj.md5, "contentType": "application/octet-stream",
        "storageClass": "STANDARD", "timeCreated": "2026-01-01T00:00:00.000Z",
        "updated": "2026-01-01T00:00:00.000Z",
    }


class FakeGCSHandler(http.server.BaseHTTPRequestHandler):
    """Answers one connection's JSON-API requests from the bound ``fake`` store.

    :meth:`FakeGCS.start` binds it with ``type(..., (FakeGCSHandler,), {"fake": server})``.
    """

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # no 40 ms delayed-ACK stalls between headers and body
    fake: Any  # the FakeGCS store, set on the bound subclass

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - base-class signature
        logger.debug("fakegcs: " + format, *args)

    # -------------------------------------------------------------- helpers
    def _send_json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send_json(status, {"error": {"code": status, "message": message,
                                           "errors": [{"message": message, "reason": "fake"}]}})

    def _reset(self) -> None:
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def _apply_fault(self, kind: str, media: bool, name: str | None) -> bool:
        """Sleep, then maybe answer with a fault. True when the request is done."""
        fake = self.fake
        if fake.faults.latency > 0:
            time.sleep(fake.faults.latency)
        deny = fake.faults.deny_status
        if deny:
            with fake._lock:
                fake.counts[kind] += 1
                fake.counts["denied"] += 1
            caller = "Anonymous caller" if deny == 401 else "fake@example.iam.gserviceaccount.com"
            perm = "list" if kind in ("list", "bucket") else "get"
            self._error(deny, f"{caller} does not have storage.objects.{perm} access to the Google Cloud "
                              f"Storage bucket. Permission 'storage.objects.{perm}' denied on resource "
                              "(or it may not exist).")
            return True
        fault = fake._draw(media, name)
        with fake._lock:
            fake.counts[kind] += 1
            if fault:
                fake.counts["fault_" + fault] += 1
        if fault == "error":
            status = fake.fail_names.get(name, 0) if name is not None else 0
            status = status or fake.faults.error_status
            self._error(status, "injected fault")
            return True
        if fault == "reset":
            self._reset()
            return True
        self._pending_fault = fault
        return False

    # --------------------------------------------------------------- routes
    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        with self.fake._lock:
            self.fake.in_flight += 1
        try:
            self._get()
        finally:
            with self.fake._lock:
                self.fake.in_flight -= 1

    def _get(self) -> None:
        self._pending_fault = None
        parsed = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
        parts = parsed.path.split("/")
        if parsed.path == "/_fake/stats":
            with self.fake._lock:
                self._send_json(200, {"counts": dict(self.fake.counts),
                                      "media": dict(self.fake.media_counts)})
            return
        # /storage/v1/b/B[/o[/NAME]]  or  /download/storage/v1/b/B/o/NAME
        if parts[1:2] == ["download"]:
            parts = parts[1:]
            query["alt"] = "media"
        if parts[1:4] != ["storage", "v1", "b"] or len(parts) < 5:
            self._error(404, f"unknown path {parsed.path}")
            return
        bucket = urllib.parse.unquote(parts[4])
        if len(parts) == 5:
            if self._apply_fault("bucket", False, None):
                return
            if bucket != self.fake.bucket:
                self._error(404, f"bucket {bucket} not found")
                return
            self._send_json(200, {"kind": "storage#bucket", "id": bucket, "name": bucket})
            return
        if parts[5] != "o":
            self._error(404, f"unknown path {parsed.path}")
            return
        if len(parts) == 6 or (len(parts) == 7 and parts[6] == ""):
            if self._apply_fault("list", False, None):
                return
            if bucket != self.fake.bucket:
                self._error(404, f"bucket {bucket} not found")
                return
            self._list(query)
            return
        name = urllib.parse.unquote("/".join(parts[6:]))
        media = query.get("alt") == "media"
        if self._apply_fault("media" if media else "meta", media, name):
            return
        with self.fake._lock:
            obj = self.fake.objects.get(name) if bucket == self.fake.bucket else None
        if obj is None or ("generation" in query and query["generation"] != str(obj.generation)):
            self._error(404, f"No such object: {bucket}/{name}")
            return
        if not media:
            self._send_json(200, object_resource(bucket, name, obj))
            return
        with self.fake._lock:
            self.fake.media_counts[name] += 1
        self._media(obj)

    def _list(self, query: dict) -> None:
        names = self.fake.sorted_names()
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter", "")
        max_results = min(int(query.get("maxResults") or self.fake.page_size), self.fake.page_size)
        token = query.get("pageToken")
        start_after = base64.urlsafe_b64decode(token.encode()).decode() if token else None
        i = bisect.bisect_right(names, start_after) if start_after is not None else bisect.bisect_left(names, prefix)
        items: list[dict] = []
        prefixes: list[str] = []
        last = None
        while i < len(names) and len(items) + len(prefixes) < max_results:
            name = names[i]
            if not name.startswith(prefix):
                break
            rest = name[len(prefix):]
            cut = rest.find(delimiter) if delimiter else -1
            if cut >= 0:
                p = prefix + rest[: cut + len(delimiter)]
                prefixes.append(p)
                last = p + "\U0010ffff"  # skip everything under this prefix
                i = bisect.bisect_left(names, last)
                continue
            with self.fake._lock:
                obj = self.fake.objects.get(name)
            if obj is not None:
                items.append(object_resource(self.fake.bucket, name, obj))
            last = name
            i += 1
        payload: dict = {"kind": "storage#objects", "items": items}
        if prefixes:
            payload["prefixes"] = prefixes
        if i < len(names) and names[i].startswith(prefix) and last is not None:
            payload["nextPageToken"] = base64.urlsafe_b64encode(last.encode()).decode()
        self._send_json(200, payload)

    def _media(self, obj: StoredObject) -> None:
        data = obj.data
        total = len(data)
        start, end = 0, total - 1
        rng = self.headers.get("Range")
        status = 200
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a) if a else max(0, total - int(b))
            end = min(int(b), total - 1) if (a and b) else total - 1
            if start >= total and total > 0:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{total}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        body = data[start: end + 1]
        fault = self._pending_fault
        if fault == "flip" and body:
            pos = self.fake._rng.randrange(len(body))
            body = body[:pos] + bytes([body[pos] ^ 0xFF]) + body[pos + 1:]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-goog-generation", str(obj.generation))
        self.send_header("x-goog-metageneration", "1")
        self.send_header("x-goog-stored-content-length", str(total))
        self.send_header("x-goog-stored-content-encoding", "identity")
        self.send_header("x-goog-hash", f"crc32c={obj.crc32c},md5={obj.md5}")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{total}")
        self.end_headers()
        if fault == "truncate" and len(body) > 1:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self._reset()
            return
        self.wfile.write(body)
