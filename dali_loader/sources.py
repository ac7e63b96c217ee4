"""Where the bytes come from: a local folder (a FUSE mount is one) or a URL.

A source answers three questions for the index and the loader: which files
exist (relative names), which first-level folders exist (class discovery), and
how to read one file's bytes (thread-safe). Remote URLs go through
`dali_loader.remote` and its verified disk cache.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import posixpath
from collections.abc import Callable

from dali_loader.index import local_subdirs, walk_local


def read_local(path: str) -> bytes:
    """Reads a whole local file."""
    with open(path, "rb") as f:
        return f.read()


@dataclasses.dataclass
class Listing:
    """A source's files, folders and reader.

    Attributes:
        root: The folder or normalized URL the names are relative to.
        rel_files: Every file, '/'-separated, relative to `root`.
        subdirs: First-level folder names.
        read: Reads one full path or URL (as built by `join`) to bytes.
        join: Joins `root` and name parts into a full path or URL.
        remote: The remote source object, for URLs (else None).
        locate: For URLs: a path's `(cache file, payload offset)` when this
            process already verified it, else None.
    """

    root: str
    rel_files: list[str]
    subdirs: list[str]
    read: Callable[[str], bytes]
    join: Callable[..., str]
    remote: object | None = None
    locate: Callable[[str], tuple[str, int] | None] | None = None


NETWORK_FS = ("fuse", "nfs", "cifs", "smb", "9p", "ceph", "lustre", "gpfs", "beegfs")


def on_network_fs(path: str) -> bool:
    """True when `path` lives on a FUSE or network file system (per /proc/mounts).

    Reads there have latency (gcsfuse: one GET per file), so the loader keeps
    many in flight; on a local disk, TF's own reads are cheaper.
    """
    real = os.path.realpath(path)
    best, fstype = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, fstype = mnt, parts[2]
    except OSError:
        return False
    return fstype.startswith(NETWORK_FS)


def list_source(
    directory: str,
    follow_links: bool = False,
    cache_dir: str | None = None,
    cache_max_bytes: int | None = None,
    max_in_flight: int = 64,
    labels_inferred: bool = True,
) -> Listing:
    """Lists a local folder or a remote prefix.

    Raises:
        FileNotFoundError: the local folder does not exist.
    """
    from dali_loader.remote import is_remote

    if is_remote(directory):
        from dali_loader.remote import open_remote

        remote = open_remote(
            directory,
            cache_dir=cache_dir,
            cache_max_bytes=cache_max_bytes,
            max_in_flight=max_in_flight,
        )
        atexit.register(remote.close)  # finish queued cache writes at exit
        infos = remote.list_objects()
        by_url = {}
        rel_files = []
        for info in infos:
            if info.rel.endswith("/"):
                continue  # a folder placeholder object
            rel_files.append(info.rel)
            by_url[posixpath.join(remote.url, info.rel)] = info
        subdirs = sorted(
            {i.rel.split("/", 1)[0] for i in infos if "/" in i.rel}
        )

        def read(url: str) -> bytes:
            return remote.fetch(by_url[url])

        def locate(url: str) -> tuple[str, int] | None:
            return remote.locate(by_url[url])

        return Listing(remote.url, rel_files, subdirs, read, posixpath.join, remote, locate)

    if directory.startswith("file://"):
        directory = directory[len("file://") :]
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"Directory not found: {directory}. Pass an existing folder, a FUSE "
            "mount point, or a gs://bucket/prefix URL."
        )
    rel_files = walk_local(directory, follow_links)
    if labels_inferred and not follow_links:
        # Keras walks each class folder on its own, so a class folder that is
        # itself a symlink is listed even without follow_links.
        for d in local_subdirs(directory):
            if os.path.islink(os.path.join(directory, d)):
                sub = walk_local(os.path.join(directory, d), follow_links)
                rel_files += [f"{d}/{r}" for r in sub]
    return Listing(
        directory,
        rel_files,
        local_subdirs(directory),
        read_local,
        os.path.join,
    )
