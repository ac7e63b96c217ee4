"""Failures outside the data: one-line StorageErrors within seconds, and the CLI's one-line errors.

Everything runs against loopback: the fake GCS server, a loopback port with nothing
listening, or a loopback listener that never answers. Nothing reaches another address.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from dali_loader.errors import StorageError
from dali_loader.storage.remote import check_remote, open_remote
from dali_loader.storage.source import open_source
from support import pythonpath
from support.fakegcs import FakeGCS, Faults

pytestmark = pytest.mark.timeout(120)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE_LOG = re.compile(r"cuda|oneDNN|I0000|E0000|W0000|cpu_feature_guard|absl::InitializeLog", re.IGNORECASE)


@pytest.fixture
def dead_port():
    """A loopback port with nothing listening on it (connections are refused), held
    (bound, not listening) for the whole test so that no other process can take it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def refused(monkeypatch, dead_port) -> str:
    endpoint = f"http://127.0.0.1:{dead_port}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    return endpoint


def list_error(url: str, tmp_path, max_s: float = 10.0) -> str:
    """The StorageError message of listing ``url``, asserted to be one line and to come within ``max_s``."""
    start = time.monotonic()
    with pytest.raises(StorageError) as ei:
        with open_remote(url, cache_dir=str(tmp_path / "c")) as src:
            src.list_objects()
    took = time.monotonic() - start
    msg = str(ei.value)
    assert took < max_s, (took, msg)
    assert "\n" not in msg and len(msg) < 600, msg
    return msg


# ---------------------------------------------------------------- the storage layer
def test_refused_endpoint_fails_fast_naming_it(refused, tmp_path):
    msg = list_error("gs://some-bucket/train", tmp_path)
    assert refused in msg and "connection refused" in msg and "gs://some-bucket/train" in msg
    assert "STORAGE_EMULATOR_HOST" in msg  # the fix: it is set, so it is the suspect
    start = time.monotonic()
    with pytest.raises(StorageError, match="connection refused"):
        open_source("gs://some-bucket/train", cache_dir=str(tmp_path / "c"))  # the loader's path
    with pytest.raises(StorageError, match="connection refused"):
        check_remote("gs://some-bucket/train")  # what diagnose and bench call first
    assert time.monotonic() - start < 20


def test_unresponsive_endpoint_times_out_within_seconds(monkeypatch, tmp_path):
    with socket.socket() as listener:  # accepts TCP connections (the kernel does), never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        msg = list_error("gs://b/x", tmp_path, max_s=13.0)
    assert endpoint in msg and "timed out" in msg


def test_network_causes_are_named_without_traffic(monkeypatch):
    import requests
    import urllib3
    from google.api_core.exceptions import RetryError

    from dali_loader.storage.gcs import listing_error

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)

    def wrapped(reason: Exception) -> RetryError:
        err = requests.exceptions.ConnectionError(urllib3.exceptions.MaxRetryError(None, "/b/o", reason))
        return RetryError("Timeout of 5.0s exceeded", err)

    dns = urllib3.exceptions.NameResolutionError("storage.googleapis.com", None,
                                                 socket.gaierror(-2, "Name or service not known"))
    cases = {"could not be resolved (DNS)": dns,
             "timed out connecting": urllib3.exceptions.ConnectTimeoutError(None, "connect timeout=3.0")}
    for words, reason in cases.items():
        err = listing_error(wrapped(reason), url="gs://b/x", bucket="b",
                            endpoint="https://storage.googleapis.com", elapsed=5.2)
        msg = str(err)
        assert isinstance(err, StorageError) and words in msg, msg
        assert "https://storage.googleapis.com" in msg and "5.2 s" in msg and "network" in msg, msg


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_say_how_to_provide_them(serve, tmp_path, status):
    server = serve(FakeGCS("b", faults=Faults(deny_status=status)))
    server.put("x/a.png", b"a")
    msg = list_error("gs://b/x", tmp_path, max_s=5.0)
    assert f"HTTP {status}" in msg and "gs://b/x" in msg
    assert "gcloud auth application-default login" in msg and "GOOGLE_APPLICATION_CREDENTIALS" in msg
    if status == 403:
        assert "'b'" in msg and "storage.objects.list" in msg
    else:
        assert "anonymous" in msg
    assert server.counts["denied"] <= 2  # not retried (google-auth re-sends once after a 401)


def test_unusable_credentials_file_is_named(monkeypatch, tmp_path):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    key = str(tmp_path / "missing-key.json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", key)  # fails while loading: no request is sent
    with pytest.raises(StorageError, match="GOOGLE_APPLICATION_CREDENTIALS") as ei:
        open_remote("gs://b/x", cache_dir=str(tmp_path / "c"))
    assert key in str(ei.value) and "\n" not in str(ei.value)


def test_missing_bucket_is_not_found(serve, tmp_path):
    server = serve(FakeGCS("b"))
    server.put("x/a.png", b"a")
    msg = list_error("gs://no-such-bucket/x", tmp_path, max_s=5.0)
    assert "not found" in msg and "'no-such-bucket'" in msg


def test_empty_prefix_names_it_but_non_images_are_listed(serve, tmp_path):
    server = serve(FakeGCS("b"))
    server.put("data/cats/a.png", b"a")
    server.put("docs/readme.txt", b"not an image")
    msg = list_error("gs://b/dta", tmp_path, max_s=5.0)
    assert "'dta/'" in msg and "gs://b/dta" in msg
    with pytest.raises(StorageError, match="'dta/'"):
        open_source("gs://b/dta", cache_dir=str(tmp_path / "c"))
    # Objects that are not images are still a listing: Keras's "No images found" comes later.
    with open_source("gs://b/docs", cache_dir=str(tmp_path / "c")) as src:
        assert src.rel_files == ["readme.txt"]
    server.delete("data/cats/a.png")
    server.delete("docs/readme.txt")
    assert "is empty" in list_error("gs://b", tmp_path, max_s=5.0)


def test_transient_listing_errors_are_still_retried(serve, tmp_path):
    server = serve(FakeGCS("b", faults=Faults(error_rate=0.3, error_status=503, seed=4), page_size=5))
    for i in range(40):
        server.put(f"p/c/{i:02d}.png", b"x")
    with open_remote("gs://b/p", cache_dir=str(tmp_path / "c")) as src:
        assert len(src.list_objects()) == 40
    assert server.counts["fault_error"] > 0


def test_persistent_503_at_the_first_listing_gives_up_within_seconds(serve, tmp_path):
    serve(FakeGCS("b", faults=Faults(error_rate=1.0, error_status=503)))
    msg = list_error("gs://b/x", tmp_path, max_s=12.0)
    assert "503" in msg and "retries" in msg


def test_fsspec_listing_errors_are_storage_errors(tmp_path):
    from dali_loader.storage.fsspec_backend import FsspecBackend

    with pytest.raises(StorageError, match="No objects under memory://nothing-here/x"):
        with open_remote("memory://nothing-here/x", cache_dir=str(tmp_path / "c")) as src:
            src.list_objects()
    backend = FsspecBackend("memory", "b")
    assert "access denied" in str(backend.listing_error(PermissionError("403 Forbidden"), "memory://b/x"))
    assert "not found" in str(backend.listing_error(FileNotFoundError("b/x"), "memory://b/x"))
    assert backend.listing_error(RuntimeError("a bug"), "memory://b/x") is None


# ---------------------------------------------------------------------------- the CLI
# The CLI as `python -m dali_loader.tools.cli` runs it, timed from after the interpreter's
# start and the CLI's import: the seconds a limit bounds are the command's own, not a
# loaded machine's start-up. The time goes to stdout as its last line.
_TIMED_CLI = """
import sys, time
from dali_loader.tools.cli import main
start = time.monotonic()
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
finally:
    print(f"\\nCLI-SECONDS {time.monotonic() - start:.3f}", flush=True)
sys.exit(code)
"""


def run_cli(args: list[str], env: dict, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    """The CLI's result (its timing line taken out of stdout) and the command's seconds."""
    out = subprocess.run([sys.executable, "-c", _TIMED_CLI, *args], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=timeout)
    head, sep, took = out.stdout.rpartition("\nCLI-SECONDS ")
    assert sep, out.stdout + out.stderr
    out.stdout = head
    return out, float(took)


def cli_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=pythonpath(), **extra)
    return env


def test_cli_prefetch_unreachable_is_one_line_and_v_shows_the_traceback(tmp_path, dead_port):
    endpoint = f"http://127.0.0.1:{dead_port}"
    env = cli_env(STORAGE_EMULATOR_HOST=endpoint)
    out, took = run_cli(["prefetch", "gs://b/x", "--cache-dir", str(tmp_path / "c")], env)
    assert out.returncode != 0 and took < 15, (took, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("dali-loader prefetch: error: ") and endpoint in lines[0]
    assert "Traceback" not in out.stderr

    out, _ = run_cli(["-v", "prefetch", "gs://b/x", "--cache-dir", str(tmp_path / "c")], env)
    assert out.returncode != 0
    assert "Traceback (most recent call last)" in out.stderr and "StorageError" in out.stderr
    assert out.stderr.splitlines()[-1].startswith("dali-loader prefetch: error: ")
    out, _ = run_cli(["prefetch", "gs://b/x", "-v", "--cache-dir", str(tmp_path / "c")], env)
    assert "Traceback (most recent call last)" in out.stderr  # -v after the command works too


def test_cli_refused_credentials_and_bad_arguments_are_one_line(tmp_path):
    with FakeGCS("b", faults=Faults(deny_status=403)) as server:
        out, _ = run_cli(["prefetch", "gs://b/x", "--cache-dir", str(tmp_path / "c")],
                         cli_env(STORAGE_EMULATOR_HOST=server.endpoint))
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "HTTP 403" in out.stderr and "gcloud auth application-default login" in out.stderr
    out, _ = run_cli(["prefetch", "gs://b/x", "--max-in-flight", "0"], cli_env())
    assert out.returncode == 2
    assert out.stderr.strip() == ("dali-loader prefetch: error: `--max-in-flight` must be a positive "
                                  "integer. Received: --max-in-flight=0")


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")
def test_cli_diagnose_prints_no_native_log_lines(tmp_path):
    from PIL import Image

    for c in ("a", "b"):
        os.makedirs(tmp_path / "imgs" / c)
        for i in range(3):
            Image.new("RGB", (12, 10), (40 * i, 80, 120)).save(tmp_path / "imgs" / c / f"{i}.png")
    args = ["diagnose", str(tmp_path / "imgs"), "--no-loader", "--sample", "4", "--batch-size", "2",
            "--image-size", "8", "8"]
    out, _ = run_cli(args, cli_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    assert "bottleneck" in out.stdout
    leaked = [ln for ln in out.stderr.splitlines() if NATIVE_LOG.search(ln)]
    assert not leaked, out.stderr
    # The control: with -v TensorFlow's own lines are shown, so the check above can fail.
    loud, _ = run_cli(["-v", *args], cli_env(), timeout=300)
    assert loud.returncode == 0, loud.stderr
    if not any(NATIVE_LOG.search(ln) for ln in loud.stderr.splitlines()):
        pytest.skip("TensorFlow printed no native log lines here, so there was nothing to quiet")
