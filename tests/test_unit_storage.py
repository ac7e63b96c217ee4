"""Storage helpers without a network: URLs, local folders, fsspec memory://, retry rules."""

from __future__ import annotations

import io
import os
import uuid

import pytest

from dali_loader.storage import local
from dali_loader.storage.local import local_subdirs, on_network_fs, read_local, walk_local
from dali_loader.storage.urls import is_remote, parse_url, unsafe_reason

# --- urls --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, remote",
    [
        ("gs://bucket/prefix", True),
        ("gcs://bucket", True),
        ("GS://Bucket/x", True),
        ("s3://b/k", True),
        ("az://c/p", True),
        ("memory://b/p", True),
        ("hdfs+x.y-z://b", True),
        ("file:///tmp/x", False),
        ("FILE:///tmp/x", False),
        ("/data/images", False),
        ("relative/dir", False),
        ("C:\\data", False),
        ("gs:/bucket", False),
        ("://bucket", False),
        ("1gs://bucket", False),
        ("", False),
        (None, False),
        (b"gs://bucket", False),
    ],
)
def test_is_remote(path, remote):
    assert is_remote(path) is remote


@pytest.mark.parametrize(
    "url, parsed",
    [
        ("gs://bucket/a/b", ("gs", "bucket", "a/b")),
        ("gs://bucket/a/b/", ("gs", "bucket", "a/b")),
        ("gs://bucket", ("gs", "bucket", "")),
        ("gs://bucket/", ("gs", "bucket", "")),
        ("gcs://bucket/p", ("gs", "bucket", "p")),
        ("GCS://Bucket/P", ("gs", "Bucket", "P")),
        ("s3://my-bucket/x/y.png", ("s3", "my-bucket", "x/y.png")),
        ("memory://b//p//", ("memory", "b", "p")),
    ],
)
def test_parse_url(url, parsed):
    assert parse_url(url) == parsed


@pytest.mark.parametrize("url", ["file:///tmp/x", "/local/dir", "gs:/x", "", None, 3])
def test_parse_url_not_remote(url):
    with pytest.raises(ValueError) as ei:
        parse_url(url)
    assert str(ei.value) == ("Expected a remote URL such as gs://bucket/prefix. "
                             f"Received: url={url!r}")


@pytest.mark.parametrize("url", ["gs://", "gs:///prefix", "s3:///"])
def test_parse_url_no_bucket(url):
    with pytest.raises(ValueError) as ei:
        parse_url(url)
    assert str(ei.value) == f"The URL has no bucket name. Received: url={url!r}"


@pytest.mark.parametrize(
    "rel, reason",
    [
        ("cats/a.png", None),
        ("a.png", None),
        ("cats/", None),  # a directory placeholder
        ("c a t s/ünï cödé.png", None),
        ("..a/b..png", None),
        ("/cats/a.png", "absolute or empty leading segment"),
        ("/", "absolute or empty leading segment"),
        ("cats//a.png", "empty path segment ('//')"),
        ("cats/a.png//", "empty path segment ('//')"),
        ("", "empty path segment ('//')"),
        ("cats/../a.png", "'.' or '..' segment"),
        ("./a.png", "'.' or '..' segment"),
        ("cats/.", "'.' or '..' segment"),
        ("..", "'.' or '..' segment"),
        ("cats/a\nb.png", "control character"),
        ("cats/a\x00.png", "control character"),
        ("cats/a\x7f.png", "control character"),
        ("cats\\a.png", "backslash (ambiguous path separator)"),
    ],
)
def test_unsafe_reason(rel, reason):
    assert unsafe_reason(rel) == reason


# --- local ----------------------------------------------------------------------------------


def test_walk_local_and_subdirs(tmp_path):
    for rel in ["a/1.png", "a/deep/er/2.png", "b/.hidden.png", ".h/3.png", "top.txt"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rel.encode())
    (tmp_path / "empty").mkdir()
    assert sorted(walk_local(str(tmp_path))) == sorted(
        ["a/1.png", "a/deep/er/2.png", "b/.hidden.png", ".h/3.png", "top.txt"])
    assert sorted(local_subdirs(str(tmp_path))) == [".h", "a", "b", "empty"]
    assert read_local(str(tmp_path / "a" / "1.png")) == b"a/1.png"


def test_walk_local_follow_links(tmp_path):
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "x.png").write_bytes(b"x")
    root = tmp_path / "root"
    (root / "cls").mkdir(parents=True)
    (root / "cls" / "y.png").write_bytes(b"y")
    os.symlink(outside, root / "cls" / "link")
    os.symlink(outside, root / "linked_cls")
    assert sorted(walk_local(str(root))) == ["cls/y.png"]
    assert sorted(walk_local(str(root), follow_links=True)) == [
        "cls/link/sub/x.png", "cls/y.png", "linked_cls/sub/x.png"]
    assert sorted(local_subdirs(str(root))) == ["cls", "linked_cls"]  # isdir follows links


def test_tmp_dir_is_not_a_network_fs(tmp_path):
    assert on_network_fs(str(tmp_path)) is False


MOUNTS = """\
/dev/vda / ext4 rw 0 0
proc /proc proc rw 0 0
gcsfuse /mnt/gcs fuse.gcsfuse rw 0 0
server:/export /mnt/nfs nfs4 rw 0 0
/dev/vdb /mnt/gcs/local ext4 rw 0 0
//srv/share /mnt/with\\040space cifs rw 0 0
/dev/vdc /mnt/data xfs rw 0 0
short line
"""


@pytest.mark.parametrize(
    "path, network",
    [
        ("/mnt/gcs", True),
        ("/mnt/gcs/bucket/x.png", True),
        ("/mnt/gcs/local/x.png", False),  # the longest mount prefix wins
        ("/mnt/gcsx/y", False),  # not under /mnt/gcs
        ("/mnt/nfs/a", True),
        ("/mnt/with space/a", True),
        ("/mnt/data/a", False),
        ("/home/u", False),
    ],
)
def test_on_network_fs_reads_proc_mounts(monkeypatch, path, network):
    real_open = open

    def fake_open(name, *args, **kwargs):
        if name == "/proc/mounts":
            return io.StringIO(MOUNTS)
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(local, "open", fake_open, raising=False)
    monkeypatch.setattr(local.os.path, "realpath", lambda p: p)
    assert on_network_fs(path) is network


def test_on_network_fs_without_proc_mounts(monkeypatch):
    def no_mounts(name, *args, **kwargs):
        raise OSError("no /proc")

    monkeypatch.setattr(local, "open", no_mounts, raising=False)
    assert on_network_fs("/mnt/gcs/x") is False


# --- fsspec memory:// -------------------------------------------------------------------------


@pytest.fixture
def memfs():
    fsspec = pytest.importorskip("fsspec")
    from dali_loader.storage.fsspec_backend import FsspecBackend

    bucket = f"bkt-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    files = {
        "data/cats/a.png": b"aaa",
        "data/cats/deep/b.png": b"bbbb",
        "data/dogs/c.jpg": b"c",
        "data/top.png": b"tt",
        "database/other.png": b"zzzzz",  # shares a name prefix, not the folder
        "other/x.png": b"x",
    }
    for name, data in files.items():
        fs.pipe_file(f"/{bucket}/{name}", data)
    backend = FsspecBackend("memory", bucket)
    yield backend, bucket, files
    fs.rm(f"/{bucket}", recursive=True)


def test_fsspec_iter_objects(memfs):
    backend, _, files = memfs
    got = list(backend.iter_objects("data"))
    assert [(n, s) for n, s, *_ in got] == [
        ("data/cats/a.png", 3), ("data/cats/deep/b.png", 4), ("data/dogs/c.jpg", 1),
        ("data/top.png", 2)]
    for _, _, gen, crc, md5 in got:
        assert isinstance(gen, str) and gen  # some version stamp
        assert crc is None and md5 is None
    everything = list(backend.iter_objects(""))
    assert sorted(n for n, *_ in everything) == sorted(files)
    assert {n: s for n, s, *_ in everything} == {n: len(d) for n, d in files.items()}


def test_fsspec_iter_dirs(memfs):
    backend, _, _ = memfs
    assert sorted(backend.iter_dirs("data")) == ["cats", "dogs"]
    assert sorted(backend.iter_dirs("data/cats")) == ["deep"]
    assert sorted(backend.iter_dirs("")) == ["data", "database", "other"]


def test_fsspec_download(memfs):
    from dali_loader.storage.objects import ObjectInfo

    backend, bucket, files = memfs
    for name, data in files.items():
        info = ObjectInfo(rel=name.split("/", 1)[-1], name=name, size=len(data), generation="",
                          crc32c=None, md5=None, bucket=bucket, scheme="memory")
        assert backend.download(info) == data
    missing = ObjectInfo("nope.png", "data/nope.png", 0, "", None, None, bucket, "memory")
    with pytest.raises(FileNotFoundError) as ei:
        backend.download(missing)
    assert backend.retryable(ei.value) is False
    backend.close()


def test_fsspec_unknown_scheme():
    from dali_loader.storage.fsspec_backend import FsspecBackend

    with pytest.raises(ValueError, match="Unknown URL scheme 'nosuchscheme'"):
        FsspecBackend("nosuchscheme", "b")


@pytest.mark.parametrize(
    "exc, retry",
    [
        (FileNotFoundError("x"), False),
        (PermissionError("x"), False),
        (IsADirectoryError("x"), False),
        (NotADirectoryError("x"), False),
        (ValueError("x"), False),
        (TypeError("x"), False),
        (ImportError("x"), False),
        (ConnectionError("x"), True),
        (TimeoutError("x"), True),
        (OSError("x"), True),
        (RuntimeError("x"), True),
    ],
)
def test_fsspec_retryable(exc, retry):
    from dali_loader.storage.fsspec_backend import FsspecBackend

    assert FsspecBackend.retryable(exc) is retry


# --- GCS retry classification ---------------------------------------------------------------------


def _api_exceptions():
    pytest.importorskip("google.cloud.storage")
    from google.api_core import exceptions

    return exceptions


@pytest.mark.parametrize(
    "make, retry",
    [(lambda E, n=name: getattr(E, n)("x"), False)
     for name in ("NotFound", "Forbidden", "Unauthorized", "BadRequest", "Conflict",
                  "PreconditionFailed")]
    + [(lambda E, n=name: getattr(E, n)("x"), True)
       for name in ("ServiceUnavailable", "TooManyRequests", "InternalServerError",
                    "BadGateway", "GatewayTimeout")]
    + [(lambda E, c=code: E.from_http_status(c, "x"), code in (408, 429) or code >= 500)
       for code in (403, 404, 408, 409, 412, 429, 503)]
    + [(lambda E: ConnectionError("reset"), True), (lambda E: TimeoutError("slow"), True),
       (lambda E: PermissionError("x"), False), (lambda E: FileNotFoundError("x"), False),
       (lambda E: ValueError("x"), False), (lambda E: TypeError("x"), False),
       (lambda E: KeyError("x"), False)],
)
def test_gcs_retryable(make, retry):
    E = _api_exceptions()
    from dali_loader.storage.gcs import GCSBackend

    assert GCSBackend.retryable(make(E)) is retry


def test_gcs_retryable_transport_errors():
    pytest.importorskip("google.cloud.storage")
    import google.auth.exceptions as auth_exceptions
    import requests
    import urllib3

    from dali_loader.storage.gcs import GCSBackend

    assert GCSBackend.retryable(requests.exceptions.ConnectionError("x")) is True
    assert GCSBackend.retryable(requests.exceptions.ReadTimeout("x")) is True
    assert GCSBackend.retryable(urllib3.exceptions.ProtocolError("x")) is True
    assert GCSBackend.retryable(urllib3.exceptions.ReadTimeoutError(None, "u", "x")) is True
    # google-auth wraps a network failure in TransportError: retried for what it wraps.
    assert GCSBackend.retryable(auth_exceptions.TransportError(ConnectionError("x"))) is True
    assert GCSBackend.retryable(auth_exceptions.RefreshError("invalid_grant")) is False

    class DataCorruption(Exception):
        pass

    class InvalidResponse(Exception):
        pass

    assert GCSBackend.retryable(DataCorruption("checksum")) is True
    assert GCSBackend.retryable(InvalidResponse("short read")) is True


# --- make_client (no connection is opened by building a client) ---------------------------


def test_make_client_emulator(monkeypatch):
    pytest.importorskip("google.cloud.storage")
    from google.auth.credentials import AnonymousCredentials

    from dali_loader.storage.gcs import make_client

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    client = make_client()
    assert isinstance(client._credentials, AnonymousCredentials)
    assert client.api_endpoint == "http://127.0.0.1:9"


def test_make_client_without_credentials_is_anonymous(monkeypatch):
    pytest.importorskip("google.cloud.storage")
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError

    from dali_loader.storage.gcs import make_client

    def no_adc(**kwargs):
        raise DefaultCredentialsError("none here")

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setattr(google.auth, "default", no_adc)
    client = make_client()
    assert isinstance(client._credentials, AnonymousCredentials)
    assert client.project is None


@pytest.mark.parametrize("project", ["my-project", None])
def test_make_client_with_adc(monkeypatch, project):
    pytest.importorskip("google.cloud.storage")
    import google.auth
    from google.auth.credentials import AnonymousCredentials

    from dali_loader.storage.gcs import make_client

    creds = AnonymousCredentials()
    asked = {}

    def adc(**kwargs):
        asked.update(kwargs)
        return creds, project

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setattr(google.auth, "default", adc)
    client = make_client()
    assert asked["scopes"] == ["https://www.googleapis.com/auth/devstorage.read_only"]
    assert client._credentials is creds
    assert client.project == project


def _unsafe_reference(rel: str) -> str | None:
    """The rules of `unsafe_reason`, written plainly (its fast path must agree)."""
    body = rel[:-1] if rel.endswith("/") else rel
    if rel.startswith("/"):
        return "absolute or empty leading segment"
    segments = body.split("/")
    if any(s == "" for s in segments):
        return "empty path segment ('//')"
    if any(s in (".", "..") for s in segments):
        return "'.' or '..' segment"
    if any(ord(c) < 32 or c == "\x7f" for c in body):
        return "control character"
    if "\\" in body:
        return "backslash (ambiguous path separator)"
    return None


def test_unsafe_reason_fast_path_agrees_with_the_rules():
    import itertools

    from dali_loader.storage.urls import suspect, unsafe_reason

    for k in range(6):
        for chars in itertools.product("a./\\\x01", repeat=k):
            rel = "".join(chars)
            assert unsafe_reason(rel) == _unsafe_reference(rel), repr(rel)
            assert suspect(rel) or _unsafe_reference(rel) is None, repr(rel)
