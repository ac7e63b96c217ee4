"""Local folders (a FUSE or NFS mount is one): walking, reading, and telling a network mount."""

from __future__ import annotations

import os


def read_local(path: str) -> bytes:
    """Reads a whole local file."""
    with open(path, "rb") as f:
        return f.read()


def version_of(st: os.stat_result) -> str:
    """A local file's version for cache keys: its size and mtime."""
    return f"{st.st_size}.{st.st_mtime_ns}"


def read_local_versioned(path: str) -> tuple[bytes, str | None]:
    """A local file's bytes and the version they are (None: it changed while read)."""
    with open(path, "rb") as f:
        before = version_of(os.fstat(f.fileno()))
        data = f.read()
        after = version_of(os.fstat(f.fileno()))
    return data, before if before == after else None


def walk_local(directory: str, follow_links: bool = False) -> list[str]:
    """Lists every file under `directory` as '/'-joined relative names.

    Hidden files are kept (Keras keeps them); directories are walked
    recursively, following symlinks only when `follow_links` is True.
    """
    out = []
    for root, _, files in os.walk(directory, followlinks=follow_links):
        rel_root = os.path.relpath(root, directory)
        rel_root = "" if rel_root == "." else rel_root.replace(os.sep, "/")
        for name in files:
            out.append(f"{rel_root}/{name}" if rel_root else name)
    return out


def local_subdirs(directory: str) -> list[str]:
    """Returns the first-level sub-directories of a local folder."""
    return [d for d in os.listdir(directory) if os.path.isdir(os.path.join(directory, d))]


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
