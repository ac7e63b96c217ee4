"""The loopback GCS server speaks enough of the JSON API for the real google-cloud-storage client."""

from __future__ import annotations

import json
import urllib.request

import pytest

from support.fakegcs import FakeGCS, Faults, b64_crc32c, write_random_tree

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def client(monkeypatch):
    def make(server: FakeGCS):
        from google.cloud import storage

        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint)
        return storage.Client.create_anonymous_client()

    return make


def test_listing_pages_prefix_and_delimiter(tmp_path, client):
    tree = write_random_tree(str(tmp_path), per_class=9, size=(10, 50))
    with FakeGCS.from_directory(str(tmp_path), prefix="data", dir_placeholders=True, page_size=4) as server:
        c = client(server)
        blobs = list(c.list_blobs("b", prefix="data/"))
        names = [b.name for b in blobs]
        assert names == sorted(names)
        files = {n[len("data/"):] for n in names if not n.endswith("/")}
        assert files == set(tree)
        assert {"data/cats/", "data/dogs/", "data/birds/"} <= set(names)  # placeholders
        # 30 objects at 4 per page -> 8 pages.
        assert server.counts["list"] == 8
        it = c.list_blobs("b", prefix="data/", delimiter="/")
        assert list(it) == []
        assert set(it.prefixes) == {"data/cats/", "data/dogs/", "data/birds/"}
        blob = next(b for b in blobs if b.name == "data/cats/00003.png")
        assert blob.size == len(tree["cats/00003.png"])
        assert blob.crc32c == b64_crc32c(tree["cats/00003.png"])
        assert blob.generation > 0 and blob.md5_hash


def test_media_metadata_range_and_generation(tmp_path, client):
    with FakeGCS("b") as server:
        gen1 = server.put("x/y.bin", b"0123456789")
        c = client(server)
        bucket = c.bucket("b")
        assert bucket.blob("x/y.bin").download_as_bytes() == b"0123456789"
        assert bucket.blob("x/y.bin").download_as_bytes(start=3, end=5) == b"345"
        meta = bucket.get_blob("x/y.bin")
        assert meta.generation == gen1 and meta.size == 10
        gen2 = server.put("x/y.bin", b"new")
        assert gen2 > gen1
        assert bucket.blob("x/y.bin", generation=gen2).download_as_bytes() == b"new"
        from google.api_core.exceptions import NotFound

        with pytest.raises(NotFound):
            bucket.blob("x/y.bin", generation=gen1).download_as_bytes()
        assert server.media_counts["x/y.bin"] == 3  # bodies served; the 404 is not one
        assert server.counts["media"] == 4
        stats = json.load(urllib.request.urlopen(server.endpoint + "/_fake/stats", timeout=5))
        assert stats["media"]["x/y.bin"] == 3


def test_faults_are_injected_and_client_checksums_catch_flips(client):
    faults = Faults(error_rate=0.25, reset_rate=0.25, truncate_rate=0.25, flip_rate=0.25, seed=1)
    with FakeGCS("b", faults=faults) as server:
        server.put("o", bytes(range(256)) * 8)
        c = client(server)
        outcomes = set()
        for _ in range(40):
            try:
                data = c.bucket("b").blob("o").download_as_bytes(retry=None)
                outcomes.add("ok" if data == bytes(range(256)) * 8 else "corrupt-undetected")
            except Exception as e:  # each fault surfaces as some client exception
                outcomes.add(type(e).__name__)
        assert "corrupt-undetected" not in outcomes
        for kind in ("error", "reset", "truncate", "flip"):
            assert server.counts["fault_" + kind] > 0, kind
        assert "DataCorruption" in outcomes  # flipped bytes, caught by the client's own crc32c check


def test_permanent_failures_and_stop_releases_port():
    server = FakeGCS("b").start()
    server.put("bad", b"x")
    server.fail_names["bad"] = 503
    url = server.endpoint
    req = urllib.request.Request(url + "/download/storage/v1/b/b/o/bad?alt=media")
    for _ in range(3):
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(req, timeout=5)
        assert ei.value.code == 503
    server.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/_fake/stats", timeout=2)
    with pytest.raises(ValueError, match="bucket"):
        FakeGCS("a/b")
