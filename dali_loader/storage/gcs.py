"""The gs:// backend behind :class:`~dali_loader.storage.remote.RemoteSource`, and the one
google-cloud-storage client factory.

A backend lists objects (``iter_objects``, ``iter_dirs``), downloads one object's
bytes (``download``), says whether a failure is worth retrying (``retryable``) and
closes its connections. :class:`GCSBackend` speaks the GCS JSON API through
``google-cloud-storage``; ``fsspec_backend.FsspecBackend`` wraps any fsspec
filesystem. Verification, retries and caching live in ``storage.remote``.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from typing import TYPE_CHECKING, Iterator

from dali_loader.lazy import import_gcs

if TYPE_CHECKING:
    from dali_loader.storage.objects import ObjectInfo

logger = logging.getLogger(__name__)

__all__ = ["GCSBackend", "make_client", "enlarge_pool", "list_retry"]


class GCSBackend:
    """google-cloud-storage listing; media GETs through urllib3 or the client.

    ``media_via="urllib3"`` (default) sends the JSON-API media GET itself on a
    urllib3 pool of ``pool_size`` connections, authorised by the client's own
    credentials: about half the CPU per object of ``Blob.download_as_bytes``
    (measured 0.6 vs 1.3-2.3 ms per 100 KB object), which matters because it is
    spent under the GIL. ``"client"`` uses ``download_as_bytes`` (also used when an
    HTTP(S) proxy is configured, which requests honours).
    """

    def __init__(self, bucket: str, pool_size: int, timeout: float, media_via: str = "urllib3"):
        if media_via not in ("urllib3", "client"):
            raise ValueError(f"media_via must be 'urllib3' or 'client'. Received: media_via={media_via!r}")
        import urllib.request

        import urllib3

        self.client = make_client()
        enlarge_pool(self.client, pool_size)
        self.bucket = self.client.bucket(bucket)
        self.timeout = (min(10.0, timeout), timeout)
        self.media_via = "client" if urllib.request.getproxies() else media_via
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=pool_size, retries=False)
        self._u3_timeout = urllib3.Timeout(connect=self.timeout[0], read=self.timeout[1])
        self._media_base = f"{self.client.api_endpoint}/download/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/"
        self._auth_request = None

    def iter_objects(self, prefix: str) -> Iterator[tuple[str, int, str, str | None, str | None]]:
        blobs = self.client.list_blobs(
            self.bucket, prefix=prefix or None, page_size=1000, timeout=self.timeout, retry=list_retry(),
            fields="items(name,size,generation,crc32c,md5Hash),nextPageToken")
        for b in blobs:
            yield b.name, int(b.size or 0), str(b.generation or ""), b.crc32c, b.md5_hash

    def iter_dirs(self, prefix: str) -> list[str]:
        it = self.client.list_blobs(self.bucket, prefix=prefix or None, delimiter="/", page_size=1000,
                                    timeout=self.timeout, retry=list_retry(), fields="items(name),prefixes,nextPageToken")
        for _ in it:  # consuming the pages fills it.prefixes
            pass
        return [p[len(prefix):].rstrip("/") for p in it.prefixes]

    def download(self, info: ObjectInfo) -> bytes:
        if self.media_via == "urllib3":
            return self._media_get(info)
        blob = self.bucket.blob(info.name, generation=int(info.generation) if info.generation else None)
        # Our own loop retries and verifies against the listing's checksum, so
        # the client's retry and header-checksum are off (no double work).
        return blob.download_as_bytes(raw_download=True, checksum=None, retry=None,
                                      timeout=self.timeout, single_shot_download=True)

    def _media_get(self, info: ObjectInfo) -> bytes:
        from google.api_core import exceptions as api_exceptions

        url = self._media_base + urllib.parse.quote(info.name, safe="") + "?alt=media"
        if info.generation:
            url += "&generation=" + info.generation
        # gzip accepted and not decoded: the stored bytes, which the checksums describe.
        headers = {"Accept-Encoding": "gzip", "User-Agent": "dali-loader"}
        if self._auth_request is None:
            import google.auth.transport.requests

            self._auth_request = google.auth.transport.requests.Request()
        # The client's credentials add the Authorization header, refreshing the token when due.
        self.client._credentials.before_request(self._auth_request, "GET", url, headers)
        r = self._pool.request("GET", url, headers=headers, timeout=self._u3_timeout,
                               preload_content=True, decode_content=False)
        if r.status != 200:
            raise api_exceptions.from_http_status(r.status, f"GET {url}: {r.data[:200]!r}")
        return r.data

    @staticmethod
    def retryable(exc: BaseException) -> bool:
        import urllib3
        from google.api_core import exceptions as api_exceptions
        from google.cloud.storage.retry import _should_retry

        if isinstance(exc, (api_exceptions.NotFound, api_exceptions.Forbidden,
                            api_exceptions.Unauthorized, api_exceptions.BadRequest)):
            return False
        return _should_retry(exc) or isinstance(exc, (OSError, urllib3.exceptions.HTTPError,
                                                      api_exceptions.GoogleAPICallError)) \
            or type(exc).__name__ in ("DataCorruption", "InvalidResponse")

    def close(self) -> None:
        self._pool.clear()
        self.client.close()


def list_retry():
    """The client's default retry policy for listings, starting at 0.1 s instead of 1 s."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_delay(initial=0.1, maximum=10.0, multiplier=2.0)


def make_client():
    """A storage client: emulator or ADC when available, anonymous otherwise."""
    storage = import_gcs()
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return storage.Client()  # anonymous credentials against the emulator
    try:
        credentials, project = google.auth.default(
            scopes=["https://www.googleapis.com/auth/devstorage.read_only"])
    except DefaultCredentialsError:
        logger.info("No Application Default Credentials; using anonymous access (public buckets only).")
        return storage.Client.create_anonymous_client()
    client = storage.Client(project=project or "<none>", credentials=credentials)
    if not project:
        client.project = None
    return client


def enlarge_pool(client, pool_size: int) -> None:
    """Give the client's requests session a connection pool of ``pool_size``.

    The default requests pool keeps 10 connections per host; with more threads,
    extra connections are opened and discarded on every request.
    """
    import requests

    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0)
    session = client._http  # a google.auth AuthorizedSession (a requests.Session)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
