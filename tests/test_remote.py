"""gs:// listing and fetching through the real google-cloud-storage client against the loopback server."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os

import pytest

from support.fakegcs import FakeGCS, Faults, write_random_tree
from dali_loader.storage.objects import ObjectFetchError
from dali_loader.storage.remote import open_remote
from dali_loader.storage.urls import is_remote, parse_url

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "local"
    return str(root), write_random_tree(str(root), per_class=25, size=(500, 4000), seed=3)


def fetch_all(source, objects, threads=64):
    with cf.ThreadPoolExecutor(threads) as pool:
        return dict(zip((o.rel for o in objects), pool.map(source.fetch, objects)))


def test_is_remote_and_parse_url():
    assert is_remote("gs://b/p") and is_remote("s3://b") and is_remote("gcs://b/x") and is_remote("memory://x")
    assert not is_remote("file:///tmp/x") and not is_remote("/tmp/x") and not is_remote("rel/dir")
    assert not is_remote(os.path.sep)
    assert parse_url("gcs://bucket/a/b/") == ("gs", "bucket", "a/b")
    assert parse_url("gs://bucket") == ("gs", "bucket", "")
    with pytest.raises(ValueError, match="Received: url="):
        parse_url("gs:///nobucket")
    with pytest.raises(ValueError, match="max_in_flight"):
        open_remote("gs://b", max_in_flight=0)


def test_listing_and_class_dirs(tree, tmp_path, serve):
    root, files = tree
    os.makedirs(os.path.join(root, "empty"))
    server = serve(FakeGCS.from_directory(root, prefix="ds/v1", dir_placeholders=True, page_size=16))
    server.put("ds/v1.txt", b"sibling, not under the prefix")
    with open_remote("gs://b/ds/v1/", cache_dir=str(tmp_path / "c")) as src:
        assert src.url == "gs://b/ds/v1"
        objs = src.list_objects()
        assert {o.rel for o in objs if not o.rel.endswith("/")} == set(files)
        assert {o.rel for o in objs if o.rel.endswith("/")} == {"birds/", "cats/", "dogs/", "empty/"}
        assert [o.name for o in objs] == sorted(o.name for o in objs)
        o = next(o for o in objs if o.rel == "cats/00001.png")
        assert o.url == "gs://b/ds/v1/cats/00001.png" and o.size == len(files[o.rel]) and o.crc32c and o.generation
        assert src.list_class_dirs() == ["birds", "cats", "dogs", "empty"]
        assert server.counts["list"] >= 5  # 79 objects at 16 per page


def test_cold_then_warm_bit_identical_zero_downloads(tree, tmp_path, serve):
    root, files = tree
    server = serve(FakeGCS.from_directory(root, faults=Faults(latency=0.002)))
    with open_remote("gs://b", cache_dir=str(tmp_path / "c"), max_in_flight=64) as src:
        objs = src.list_objects()
        assert fetch_all(src, objs) == files
        assert server.counts["media"] == len(files)
        server.reset_counts()
        assert fetch_all(src, objs) == files
        assert server.counts["media"] == 0
    server.reset_counts()
    with open_remote("gs://b", cache_dir=str(tmp_path / "c")) as src:  # a new run reuses the cache
        assert fetch_all(src, src.list_objects()) == files
    assert server.counts["media"] == 0


@pytest.mark.parametrize("media_via", ["urllib3", "client"])
def test_faults_every_object_still_bit_identical(tmp_path, serve, media_via):
    root = str(tmp_path / "local")
    files = write_random_tree(root, per_class=60, size=(2000, 6000), seed=5)
    faults = Faults(error_rate=0.10, reset_rate=0.05, truncate_rate=0.05, flip_rate=0.03, seed=7)
    server = serve(FakeGCS.from_directory(root, faults=faults))
    with open_remote("gs://b", cache_dir=str(tmp_path / "c"), max_in_flight=16, media_via=media_via) as src:
        objs = src.list_objects()
        assert fetch_all(src, objs, threads=16) == files
        for kind in ("error", "reset", "truncate", "flip"):
            assert server.counts["fault_" + kind] > 0, kind
        server.reset_counts()
        assert fetch_all(src, objs, threads=16) == files  # warm: from the verified cache
        assert server.counts["media"] == 0


def test_429_is_retried(tmp_path, serve):
    server = serve(FakeGCS("b", faults=Faults(error_rate=0.5, error_status=429, seed=2)))
    for i in range(20):
        server.put(f"p/c/{i}.png", os.urandom(100))
    with open_remote("gs://b/p", cache_dir=str(tmp_path / "c"), max_attempts=20) as src:
        objs = src.list_objects()
        assert len(fetch_all(src, objs, threads=8)) == 20
    assert server.counts["fault_error"] > 0


def test_permanent_failure_names_the_object(tmp_path, serve):
    server = serve(FakeGCS("b"))
    server.put("p/c/good.png", b"good")
    server.put("p/c/bad.png", b"bad")
    server.fail_names["p/c/bad.png"] = 503
    with open_remote("gs://b/p", cache_dir=str(tmp_path / "c"), max_attempts=3) as src:
        objs = {o.rel: o for o in src.list_objects()}
        assert src.fetch(objs["c/good.png"]) == b"good"
        with pytest.raises(ObjectFetchError) as ei:
            src.fetch(objs["c/bad.png"])
        assert ei.value.url == "gs://b/p/c/bad.png"
        assert "gs://b/p/c/bad.png" in str(ei.value) and "503" in str(ei.value) and "3 attempts" in str(ei.value)
        assert server.media_counts["p/c/bad.png"] == 0 and server.counts["fault_error"] == 3
        server.fail_names.clear()
        server.delete("p/c/good.png")
        src.cache.clear()
        with pytest.raises(ObjectFetchError, match="not found at generation"):
            src.fetch(objs["c/good.png"])  # 404 is not retried


def test_generation_change_is_refetched(tree, tmp_path, serve):
    root, files = tree
    server = serve(FakeGCS.from_directory(root))
    with open_remote("gs://b", cache_dir=str(tmp_path / "c")) as src:
        fetch_all(src, src.list_objects())
        server.put("dogs/00002.png", b"a new version")
        server.reset_counts()
        objs = src.list_objects()
        got = fetch_all(src, objs)
        assert got["dogs/00002.png"] == b"a new version"
        assert dict(server.media_counts) == {"dogs/00002.png": 1}
        src.flush()
        assert src.cache.stats().objects == len(files) + 1  # the old version ages out by LRU


def test_hostile_names_never_escape_the_cache(tmp_path, serve, caplog):
    dropped = ["p/../../../escape.png", "p/c/../../up.png", "p//abs.png", "p/c/./dot.png",
               "p/c/new\nline.png", "p/c/back\\slash.png"]
    kept = ["p/c/" + "x" * 900 + ".png", "p/c/con:aux?*<>|\".png", "p/c/ünïcødé 名前.png", "p/c/-rf .png"]
    server = serve(FakeGCS("b"))
    for i, name in enumerate(dropped + kept):
        server.put(name, f"payload {i}".encode())
    cache_dir = tmp_path / "deep" / "cache"
    before = {p for p in tmp_path.rglob("*")}
    with caplog.at_level(logging.WARNING, logger="dali_loader.storage.remote"):
        with open_remote("gs://b/p", cache_dir=str(cache_dir)) as src:
            objs = src.list_objects()
            assert sorted(o.name for o in objs) == sorted(kept)
            for o in objs:
                assert src.fetch(o) == f"payload {(dropped + kept).index(o.name)}".encode()
            src.flush()
            for name in dropped:  # even if a caller builds one by hand, the key is a hash
                assert src.cache.path_for("b", type(objs[0])(name, name, 1, "1", None, None)).startswith(str(cache_dir))
    for name in dropped:
        assert repr(name) in caplog.text
    after = {p for p in tmp_path.rglob("*")}
    assert all(p.is_relative_to(cache_dir) or p in cache_dir.parents for p in after - before)
    assert src.cache.stats().objects == len(kept)


def test_fsspec_memory_scheme_through_the_cache(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe({"/mbkt/ds/a/1.png": b"one", "/mbkt/ds/b/2.png": b"two", "/mbkt/other.png": b"x"})
    try:
        with open_remote("memory://mbkt/ds", cache_dir=str(tmp_path / "c")) as src:
            objs = src.list_objects()
            assert [o.rel for o in objs] == ["a/1.png", "b/2.png"]
            assert src.list_class_dirs() == ["a", "b"]
            assert [src.fetch(o) for o in objs] == [b"one", b"two"]
            fs.rm("/mbkt/ds/a/1.png")
            assert src.fetch(objs[0]) == b"one"  # served from the cache
            src.flush()  # cache writes are write-behind
            assert src.cache.stats().objects == 2
    finally:
        fs.rm("/mbkt", recursive=True)


def test_missing_fsspec_package_is_named(tmp_path):
    pytest.importorskip("fsspec")
    try:
        import s3fs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("s3fs is installed")
    with pytest.raises(ImportError, match="s3fs"):
        open_remote("s3://bucket/prefix", cache_dir=str(tmp_path / "c"))
