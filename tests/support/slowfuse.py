"""A real FUSE mount with latency: a read-only passthrough that sleeps in every `open()`.

A gcsfuse mount is a local folder whose every file open waits on a GET (about
50 ms). This serves a folder the same way through the kernel's FUSE driver
(fusepy over libfuse2), in its own process, and counts what it serves: opens,
and how many were in flight at once (the read concurrency a loader keeps).

    with SlowMount(src_dir, mount_dir, delay=0.05) as m:
        ...                      # read files under mount_dir
        m.stats()                # {"opens": 512, "max_in_flight": 61, ...}

Needs `/dev/fuse`, libfuse2 (Debian: `apt-get install libfuse2`), `fusermount`
and fusepy (`pip install fusepy`, in the `test` extra). `fuse_problem()` says
what is missing, for a clean skip. Run as a script it serves until unmounted:
`PYTHONPATH=tests python -m support.slowfuse SRC MOUNT --delay 0.05 --stats FILE`.
"""

from __future__ import annotations

import argparse
import ctypes.util
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time

MOUNT_TIMEOUT = 20.0  # seconds for the mount to appear (a cold interpreter on busy cores)


def fuse_problem() -> str | None:
    """What this machine lacks to mount with FUSE here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if ctypes.util.find_library("fuse") is None:
        return "libfuse2 is not installed (Debian: apt-get install -y libfuse2)"
    if shutil.which("fusermount") is None and os.geteuid() != 0:
        return "fusermount is not installed (Debian: apt-get install -y fuse)"
    try:
        import fuse  # noqa: F401  (fusepy)
    except (ImportError, OSError) as e:
        return f"fusepy is not usable ({e}); install the test extra: pip install fusepy"
    return None


def _is_mounted(path: str) -> bool:
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f if len(line.split()) > 2)


class SlowMount:
    """`src` served read-only at `mount` by a FUSE process that sleeps `delay`
    seconds in every open (a context manager: mounted on entry, unmounted on exit).

    Raises:
        RuntimeError: when the mount does not come up, with the server's output.
    """

    def __init__(self, src: str, mount: str, delay: float = 0.05):
        self.src, self.mount, self.delay = os.fspath(src), os.fspath(mount), float(delay)
        self.stats_file = os.path.join(os.path.dirname(os.path.abspath(self.mount)),
                                       f".{os.path.basename(self.mount)}.stats.json")
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> SlowMount:
        problem = fuse_problem()
        if problem:
            raise RuntimeError(f"Cannot mount with FUSE: {problem}.")
        os.makedirs(self.mount, exist_ok=True)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "support.slowfuse", self.src, self.mount,
             "--delay", str(self.delay), "--stats", self.stats_file],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not _is_mounted(self.mount):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._stop()
                out = self._proc.stdout.read() if self._proc.stdout else ""
                raise RuntimeError(f"The FUSE mount at {self.mount} did not come up: {out}")
            time.sleep(0.02)
        return self

    def stats(self) -> dict:
        """What the server counted so far: `opens`, `max_in_flight`, `in_flight`."""
        try:
            with open(self.stats_file) as f:
                return json.load(f)
        except FileNotFoundError:
            return {"opens": 0, "max_in_flight": 0, "in_flight": 0}

    def reset(self) -> None:
        """Starts the counts again (the server rereads this file's absence)."""
        open(self.stats_file + ".reset", "w").close()
        deadline = time.monotonic() + 5
        while os.path.exists(self.stats_file + ".reset") and time.monotonic() < deadline:
            os.stat(self.mount)  # a FUSE call: the server picks the reset up
            time.sleep(0.01)

    def _stop(self) -> None:
        if _is_mounted(self.mount):
            cmd = ["fusermount", "-u", self.mount] if shutil.which("fusermount") else \
                ["umount", self.mount]
            subprocess.run(cmd, capture_output=True, check=False)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __exit__(self, *exc) -> None:
        self._stop()


def _serve(src: str, mount: str, delay: float, stats_file: str) -> None:
    """The FUSE server (blocks until unmounted): multi-threaded, so opens overlap."""
    from fuse import FUSE, FuseOSError, Operations

    lock = threading.Lock()
    counts = {"opens": 0, "in_flight": 0, "max_in_flight": 0}
    reset_file = stats_file + ".reset"

    def write_stats() -> None:
        tmp = f"{stats_file}.{threading.get_ident()}"
        with open(tmp, "w") as f:
            json.dump(counts, f)
        os.replace(tmp, stats_file)

    def maybe_reset() -> None:
        if os.path.exists(reset_file):
            with lock:
                counts.update(opens=0, max_in_flight=counts["in_flight"])
                write_stats()
            os.remove(reset_file)

    class Slow(Operations):
        def _path(self, path: str) -> str:
            return os.path.join(src, path.lstrip("/"))

        def getattr(self, path, fh=None):
            maybe_reset()
            try:
                st = os.lstat(self._path(path))
            except OSError as e:
                raise FuseOSError(e.errno) from None
            return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode",
                                                "st_mtime", "st_nlink", "st_size", "st_uid")}

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._path(path))]

        def readlink(self, path):
            return os.readlink(self._path(path))

        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR):
                raise FuseOSError(errno.EROFS)
            with lock:
                counts["in_flight"] += 1
                counts["max_in_flight"] = max(counts["max_in_flight"], counts["in_flight"])
            try:
                time.sleep(delay)  # a GET's latency
                return os.open(self._path(path), os.O_RDONLY)
            finally:
                with lock:
                    counts["in_flight"] -= 1
                    counts["opens"] += 1
                    write_stats()

        def read(self, path, size, offset, fh):
            return os.pread(fh, size, offset)

        def release(self, path, fh):
            os.close(fh)
            return 0

        def statfs(self, path):
            st = os.statvfs(src)
            return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize",
                                                "f_favail", "f_ffree", "f_files", "f_flag",
                                                "f_frsize", "f_namemax")}

    with lock:
        write_stats()
    FUSE(Slow(), mount, foreground=True, nothreads=False, ro=True, fsname="slowfuse")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("mount")
    p.add_argument("--delay", type=float, default=0.05, help="seconds slept in every open()")
    p.add_argument("--stats", required=True, help="a JSON file of the counts, kept current")
    a = p.parse_args(argv)
    _serve(os.path.abspath(a.src), a.mount, a.delay, a.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
