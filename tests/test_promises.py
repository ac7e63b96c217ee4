"""Documented promises that had no test able to fail (issue 30, part 2): `follow_links=True`
on a tree that has symlinks, `manifest="off"`, the `cache_max_bytes` default and
`format="grain"`."""

from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

from support.helpers import _photo, save
from support.helpers import all_rows

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from tf_adapter import image_dataset_from_directory as ours  # noqa: E402
from dali_loader.api import open_index  # noqa: E402
from dali_loader.storage.cache import DiskCache  # noqa: E402
from support.fakegcs import FakeGCS  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def linked_tree(tmp_path_factory) -> pathlib.Path:
    """A tree with a file symlink, folder symlinks inside a class and a class folder that
    is itself a symlink (with a real folder inside it); every image distinct."""
    base = tmp_path_factory.mktemp("links")
    root, outside = base / "root", base / "outside"
    rng = np.random.default_rng(30)
    img = lambda p: save(p, _photo(rng, int(rng.integers(20, 40)), int(rng.integers(20, 40))))  # noqa: E731
    img(root / "a" / "1.png")
    img(root / "a" / "2.png")
    img(root / "b" / "3.png")
    img(outside / "f1.png")
    img(outside / "dirA" / "4.png")
    img(outside / "dirA" / "5.png")
    img(outside / "classc" / "6.png")
    img(outside / "classc" / "sub" / "7.png")
    img(outside / "deep" / "8.png")
    os.symlink(outside / "f1.png", root / "a" / "link_file.png")  # a file link
    os.symlink(outside / "dirA", root / "a" / "linked_dir")  # a folder link in a class
    os.symlink(outside / "classc", root / "c")  # a class folder that is a link
    os.symlink(outside / "deep", root / "c" / "sub" / "deeper")  # a link under a linked class
    return root


@pytest.mark.parametrize("follow_links", [True, False])
def test_follow_links_matches_keras_on_a_tree_with_symlinks(linked_tree, follow_links):
    """Same files, order, classes, labels and pixels (bit for bit, TF's kernels) as Keras,
    through file and folder links; with links followed, the linked folders' files are in."""
    kw = dict(follow_links=follow_links, shuffle=False, image_size=(16, 16), batch_size=4,
              verbose=False)
    ref = keras.utils.image_dataset_from_directory(str(linked_tree), **kw)
    got = ours(str(linked_tree), **kw)
    assert got.file_paths == ref.file_paths
    assert got.class_names == ref.class_names == ["a", "b", "c"]
    names = {os.path.relpath(p, linked_tree) for p in got.file_paths}
    assert "a/link_file.png" in names  # a file link is a file either way
    followed = {"a/linked_dir/4.png", "a/linked_dir/5.png", "c/sub/deeper/8.png"}
    if follow_links:
        assert followed <= names and len(names) == 9
    else:
        assert not followed & names and len(names) == 6
    (rx, ry), (gx, gy) = all_rows(ref), all_rows(got)
    np.testing.assert_array_equal(gy, ry)
    np.testing.assert_array_equal(gx, rx)


def _fill(server: FakeGCS) -> int:
    for c in range(3):
        for i in range(4):
            server.put(f"data/cls{c}/{i}.png", bytes([c, i]) * 10)
    return 12


def _files_under(folder: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(r, f), folder)
                  for r, _, fs in os.walk(folder) for f in fs)


def test_manifest_off_neither_reads_nor_writes_a_manifest(serve, tmp_path):
    server = serve(FakeGCS("b", page_size=5))
    n = _fill(server)
    cache = str(tmp_path / "cache")
    manifests = os.path.join(cache, "v1", "manifests")
    # Writes nothing: no manifest after two runs with "off".
    for _ in range(2):
        server.reset_counts()
        src, index = open_index("gs://b/data", seed=1, cache_dir=cache, manifest="off")
        src.close()
        assert len(index.paths) == n and server.counts["list"] > 0
        assert not os.path.exists(manifests) or not os.listdir(manifests)
    # Reads nothing: with a manifest present, "off" lists again and sees what it cannot.
    src, _ = open_index("gs://b/data", seed=1, cache_dir=cache, manifest="refresh")
    src.close()
    written = {f: pathlib.Path(manifests, f).read_bytes() for f in os.listdir(manifests)}
    assert len(written) == 1
    server.put("data/cls0/added-later.png", b"new")
    server.reset_counts()
    src, index = open_index("gs://b/data", seed=1, cache_dir=cache, manifest="off")
    with src:
        assert src.remote.manifest_used is None
    assert server.counts["list"] > 0 and len(index.paths) == n + 1
    assert {f: pathlib.Path(manifests, f).read_bytes() for f in os.listdir(manifests)} == written
    # The control: "use" does read it (so the check above can tell the two apart).
    src, index = open_index("gs://b/data", seed=1, cache_dir=cache, manifest="use")
    src.close()
    assert len(index.paths) == n


def _within_half_free(make, root: str, used: int) -> tuple[bool, str]:
    """Builds the cache with `make()` between two readings of the free disk; True when its
    bound is half of (free + the cache's own bytes) for a free figure between the two."""
    f1 = shutil.disk_usage(root).free
    got = make()
    f2 = shutil.disk_usage(root).free
    lo, hi = (min(f1, f2) + used) // 2, (max(f1, f2) + used) // 2
    return lo <= got <= hi, f"max_bytes={got}, expected in [{lo}, {hi}] (used={used})"


def test_cache_max_bytes_default_is_half_the_free_disk(tmp_path, serve):
    """The documented default: half the free disk space, counting the cache's own bytes as
    free (a full cache does not shrink its own bound). The free figure moves with what
    other processes write, so each check gets 3 tries; a wrong default fails all of them."""
    from dali_loader.storage.objects import ObjectInfo
    from support.fakegcs import b64_crc32c, b64_md5

    root = str(tmp_path / "c")

    def check(make, used):
        for _ in range(3):
            ok, why = _within_half_free(make, str(tmp_path), used)
            if ok:
                return
        raise AssertionError(why)

    check(lambda: DiskCache(root).max_bytes, 0)  # empty
    data = os.urandom(1 << 22)
    info = ObjectInfo("x.png", "x.png", len(data), "1", b64_crc32c(data), b64_md5(data), "bkt")
    filled = DiskCache(root)
    assert filled.put("bkt", info, data)
    filled.close()  # syncs the usage file
    used = DiskCache(root).stats().bytes
    assert used >= len(data)
    check(lambda: DiskCache(root).max_bytes, used)
    # Through the public API, with no cache_max_bytes.
    server = serve(FakeGCS("b"))
    _fill(server)

    def through_index():
        src, _ = open_index("gs://b/data", cache_dir=root, manifest="off")
        with src:
            return src.remote.cache.max_bytes

    check(through_index, used)
    src, _ = open_index("gs://b/data", cache_dir=root, cache_max_bytes=12345, manifest="off")
    with src:
        assert src.remote.cache.max_bytes == 12345


def test_format_grain_raises_as_documented(id_tree):
    """docs/parity.md: `format="grain"` is not supported, a ValueError says so."""
    with pytest.raises(ValueError) as err:
        ours(str(id_tree), format="grain")
    assert 'format="grain" is not supported' in str(err.value)
    assert "Received: format=grain" in str(err.value)
