"""Listing at scale: by folder prefix, concurrently, and the listing manifest (issue 23).

The real google-cloud-storage client against the loopback fake server, no mocks.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from dali_loader.api import open_index
from dali_loader.storage.remote import open_remote
from support.fakegcs import FakeGCS, Faults

pytestmark = pytest.mark.timeout(180)

FAULTS = Faults(error_rate=0.15, reset_rate=0.05, seed=3)


def fill(server: FakeGCS, classes: int = 24, per_class: int = 13) -> dict[str, bytes]:
    """Many class prefixes, nested folders, top-level files, a placeholder and an unusable name."""
    objects = {}
    for c in range(classes):
        for i in range(per_class + c % 5):
            sub = "deep/" if i % 4 == 0 else ""
            objects[f"data/cls{c:02d}/{sub}{i:03d}.png"] = hashlib.sha256(f"{c}/{i}".encode()).digest()
    objects["data/top.png"] = b"top"
    objects["data/notes.txt"] = b"not an image"
    objects["data/cls03/"] = b""  # a console folder placeholder
    objects["data/cls04/a//b.png"] = b"unusable"  # dropped with a warning, either way
    for name, data in objects.items():
        server.put(name, data)
    return objects


def test_parallel_listing_is_exactly_the_sequential_one(serve, tmp_path):
    """Names, sizes, generations, checksums, order; then Keras's paths and labels:
    the same through faults (503s, resets) at 5 objects per page."""
    server = serve(FakeGCS("b", page_size=5, faults=FAULTS))
    objects = fill(server)
    with open_remote("gs://b/data", cache_dir=str(tmp_path)) as src:
        sequential = src.list_rows(parallel=1)
        server.reset_counts()
        parallel = src.list_rows(parallel=8)
        prefix_requests = server.counts["list"]
    assert parallel == sequential
    assert [r[0] for r in parallel] == sorted(objects)
    assert {r[0]: r[1] for r in parallel} == {n: len(d) for n, d in objects.items()}
    assert all(r[2] and r[3] for r in parallel)  # generation and CRC32C kept
    assert server.counts["fault_error"] + server.counts["fault_reset"] > 0  # retried through
    assert prefix_requests >= 24 + 1  # one listing per class prefix, after the delimiter listing
    # Through the index: the same files and labels as a sequential listing's.
    for labels in ("inferred", None):
        kw = dict(labels=labels, seed=5, cache_dir=str(tmp_path), manifest="off")
        src_p, par = open_index("gs://b/data", **kw)
        with src_p, open_remote("gs://b/data", cache_dir=str(tmp_path)) as r:
            from dali_loader.index import build_index

            infos = [i for i in r.list_objects() if not i.rel.endswith("/")]
            rels = [i.rel for i in infos]
            seq = build_index(r.url, rels, sorted({x.split("/", 1)[0] for x in rels if "/" in x}),
                              labels=labels, seed=5, join=lambda a, *p: "/".join((a, *p)))
        # Not the placeholder, notes.txt or a//b.png; top.png only without class folders.
        assert par.paths == seq.paths and len(par.paths) == len(objects) - (3 if labels is None else 4)
        assert par.class_names == seq.class_names
        if labels is None:
            assert par.labels is None
        else:
            np.testing.assert_array_equal(par.labels, seq.labels)


def test_flat_bucket_lists_without_prefixes(serve, tmp_path):
    server = serve(FakeGCS("b", page_size=4, faults=FAULTS))
    for i in range(23):
        server.put(f"img{i:02d}.png", bytes([i]) * (i + 1))
    with open_remote("gs://b", cache_dir=str(tmp_path)) as src:
        assert src.list_rows() == src.list_rows(parallel=1)
    src, index = open_index("gs://b", labels=None, shuffle=False, cache_dir=str(tmp_path))
    with src:
        assert index.paths == [f"gs://b/img{i:02d}.png" for i in range(23)]


def test_fsspec_parallel_listing_matches(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    bucket = f"bkt{os.getpid()}"
    for c in range(6):
        for i in range(c + 2):
            fs.pipe(f"/{bucket}/data/c{c}/{'x/' if i % 3 == 0 else ''}{i}.png", bytes(i + 1))
    fs.pipe(f"/{bucket}/data/top.png", b"t")
    try:
        with open_remote(f"memory://{bucket}/data", cache_dir=str(tmp_path)) as src:
            par, seq = src.list_rows(), src.list_rows(parallel=1)
        assert par == seq and len(par) == sum(c + 2 for c in range(6)) + 1
    finally:
        fs.rm(f"/{bucket}", recursive=True)


def test_manifest_run_equals_listing_run_and_lists_nothing(serve, tmp_path, capsys):
    server = serve(FakeGCS("b", page_size=7))
    fill(server)
    cache = str(tmp_path / "cache")
    kw = dict(seed=1, cache_dir=cache)
    src, listed = open_index("gs://b/data", manifest="refresh", **kw)
    src.close()
    manifests = os.listdir(os.path.join(cache, "v1", "manifests"))
    assert len(manifests) == 1
    server.put("data/cls00/added-later.png", b"new")  # what a manifest cannot see
    server.reset_counts()
    src, used = open_index("gs://b/data", **kw)  # manifest="use" is the default
    with src:
        assert src.remote.manifest_used is not None
    assert server.counts["list"] == 0 and server.counts["bucket"] == 0
    assert used.paths == listed.paths and used.class_names == listed.class_names
    np.testing.assert_array_equal(used.labels, listed.labels)
    from dali_loader.tools.cli import main as cli

    assert cli(["cache", "manifest", "gs://b/data", "--cache-dir", cache]) == 0  # lists again
    assert "gs://b/data: 361 objects listed" in capsys.readouterr().out  # + 1, less 2 unusable
    src, fresh = open_index("gs://b/data", **kw)
    src.close()
    assert len(fresh.paths) == len(listed.paths) + 1
    src, fresh = open_index("gs://b/data", manifest="refresh", **kw)
    src.close()
    assert len(fresh.paths) == len(listed.paths) + 1
    with pytest.raises(ValueError, match="manifest.*Received: manifest='sometimes'"):
        open_index("gs://b/data", manifest="sometimes", **kw)


def test_stale_manifest_objects_are_caught_when_read(photo_tree, gcs, tmp_path, capsys):
    """Deleted and rewritten since the manifest: named under "raise", skipped and
    recorded under "skip"; never served from the manifest's stale listing."""
    tf = pytest.importorskip("tensorflow")  # noqa: F841
    from tf_adapter import image_dataset_from_directory as ours

    server = gcs(photo_tree)
    cache = str(tmp_path / "cache")
    kw = dict(image_size=(16, 16), batch_size=4, shuffle=False, cache_dir=cache)
    first = ours("gs://b", manifest="refresh", verbose=False, **kw)
    names = sorted(server.objects)
    gone, rewritten = names[2], names[9]
    server.delete(gone)
    server.put(rewritten, bytes(server.objects[names[0]].data))  # new generation, other pixels
    assert "manifest" not in capsys.readouterr().out
    stale = ours("gs://b", **kw)  # from the manifest
    assert "Listed from the manifest" in capsys.readouterr().out
    assert stale.file_paths == first.file_paths
    with pytest.raises(Exception, match="|".join(n.replace(".", r"\.") for n in (gone, rewritten))):
        for _ in stale:
            pass
    skip = ours("gs://b", on_error="skip", verbose=False, **kw)
    n = sum(int(x.shape[0]) for x, _ in skip)
    assert n == len(names) - 2
    assert sorted(os.path.basename(p) for p in skip.loader.skipped) == \
        sorted(os.path.basename(p) for p in (gone, rewritten))
