"""CLI subcommands ``serve dispatcher`` and ``serve worker``: TF's own tf.data service servers.

``dali-loader serve dispatcher --port P [--work-dir DIR]`` starts a
``tf.data.experimental.service.DispatchServer``; ``dali-loader serve worker
--dispatcher HOST:P [--port Q]`` a ``WorkerServer`` that registers with it. Both
log what they serve (timestamped), run until SIGTERM or SIGINT, then stop their
server and exit: 0, or 1 when TF's stop has not returned within ``--stop-timeout``
seconds (a worker's stop waits for trainers' open reads). A worker first waits at most
``--connect-timeout`` seconds for the dispatcher's port, then exits 2 with one line saying so
(never hangs). The
workers run the graphs trainers register (``image_dataset_from_directory(...,
service="grpc://HOST:P")``): no dali-loader code runs in them. docs/service.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time

from dali_loader.tools.cli_common import add_verbose_flag, cli_command

logger = logging.getLogger(__name__)


def add_parsers(subparsers) -> None:
    """Register ``serve dispatcher`` and ``serve worker``."""
    p = subparsers.add_parser(
        "serve", help="run a tf.data service dispatcher or worker (decode on CPU machines)",
        description="TensorFlow's tf.data service servers, for image_dataset_from_directory("
                    "..., service='grpc://HOST:PORT'): one dispatcher, any number of workers.")
    sub = p.add_subparsers(dest="serve_command", required=True)
    d = sub.add_parser("dispatcher", help="start the dispatcher (one per cluster)")
    d.add_argument("--port", type=int, required=True, help="port to listen on")
    d.add_argument("--work-dir", default=None,
                   help="journal folder: with it the dispatcher is fault tolerant (restarts "
                        "recover registered datasets and jobs)")
    _add_stop_timeout(d)
    add_verbose_flag(d)
    d.set_defaults(func=run_dispatcher)
    w = sub.add_parser("worker", help="start a worker that registers with the dispatcher")
    w.add_argument("--dispatcher", required=True, metavar="HOST:PORT",
                   help="the dispatcher's address")
    w.add_argument("--port", type=int, default=0, help="port to listen on (default: any free)")
    w.add_argument("--host", default=None,
                   help="the name or IP trainers reach this worker at (default: this "
                        "machine's hostname)")
    w.add_argument("--connect-timeout", type=float, default=30.0, metavar="S",
                   help="seconds to wait for the dispatcher before giving up (default 30)")
    _add_stop_timeout(w)
    add_verbose_flag(w)
    w.set_defaults(func=run_worker)


def _add_stop_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stop-timeout", type=float, default=5.0, metavar="S",
                   help="seconds the server may take to stop on SIGTERM before the process "
                        "exits anyway, with status 1 (default 5)")


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dispatcher must be HOST:PORT. Received: --dispatcher={text!r}")
    return host.strip("[]"), int(port)


def _check_port(port: int, name: str = "--port") -> None:
    if not 0 <= port < 65536:
        raise ValueError(f"{name} must be a port number (0-65535). Received: {name}={port}")


class _Signals:
    """Catches SIGTERM and SIGINT from its creation on (a signal during start-up
    stops the server as soon as it is up)."""

    def __init__(self):
        self.name: str | None = None
        self._done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame) -> None:
        self.name = signal.Signals(signum).name
        self._done.set()

    def wait(self) -> str:
        """Blocks until a signal came; its name."""
        while not self._done.wait(0.5):
            pass
        return self.name or "signal"


def _timestamped_logs() -> None:
    """A server's log lines carry the time (it runs for days)."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))


def _import_tf(verbose: bool):
    """TensorFlow with its warnings on (a worker's log names what its graph skipped)."""
    if not verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"
    from dali_loader.lazy import import_tf
    from dali_loader.tools.cli_common import import_tensorflow_quietly

    import_tensorflow_quietly(verbose)
    return import_tf()


def _stop(server, what: str, timeout: float) -> None:
    """Stops a TF server, then ends the process at once (logs flushed): status 0;
    or, when the stop has not returned within `timeout` seconds, status 1 with
    every thread's traceback in the log (never hangs).

    TF's stop waits for in-flight RPCs, which a trainer that is still reading
    can hold open, and holds the GIL while it waits: the watchdog is
    `faulthandler`'s, which needs no GIL. The process skips interpreter
    teardown (`os._exit`): with TF's servers in it, teardown took about 13 s
    on a 2-core VM after a 0.0 s stop.
    """
    import faulthandler

    start = time.monotonic()
    sys.stderr.flush()
    faulthandler.dump_traceback_later(timeout, exit=True)  # exit status 1
    server._stop()  # TF's own servers have no public stop; TF's tests call _stop()
    faulthandler.cancel_dump_traceback_later()
    logger.info("%s stopped in %.1f s", what, time.monotonic() - start)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@cli_command("serve dispatcher")
def run_dispatcher(args: argparse.Namespace) -> int:
    """Run a DispatchServer until SIGTERM/SIGINT."""
    _check_port(args.port)
    signals = _Signals()
    _timestamped_logs()
    tf = _import_tf(getattr(args, "verbose", False))
    svc = tf.data.experimental.service
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
    server = svc.DispatchServer(svc.DispatcherConfig(
        port=args.port, work_dir=args.work_dir, fault_tolerant_mode=bool(args.work_dir)))
    bound = int(server.target.rpartition(":")[2])  # the port it listens on (--port 0: chosen)
    logger.info("dispatcher serving at grpc://%s:%d (work dir: %s); trainers pass "
                "service=\"grpc://<this host>:%d\"; stop with SIGTERM",
                socket.gethostname(), bound, args.work_dir or "none, not fault tolerant",
                bound)
    name = signals.wait()
    logger.info("%s: stopping the dispatcher (at most %g s)", name, args.stop_timeout)
    _stop(server, "dispatcher", args.stop_timeout)


def wait_for_dispatcher(host: str, port: int, timeout: float) -> None:
    """Retries a TCP connection to the dispatcher until `timeout` seconds have passed.

    Raises:
        ConnectionError: the dispatcher did not answer in time.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(
                (host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))).close()
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"No tf.data service dispatcher answered at {host}:{port} within {timeout:g} s "
                    f"({e}). Start it first (`dali-loader serve dispatcher --port {port}` on "
                    f"{host}), check the address and the firewall, or raise --connect-timeout."
                ) from None
            time.sleep(0.5)


@cli_command("serve worker")
def run_worker(args: argparse.Namespace) -> int:
    """Run a WorkerServer until SIGTERM/SIGINT."""
    host, port = _host_port(args.dispatcher)
    _check_port(args.port)
    if args.connect_timeout <= 0:
        raise ValueError(f"--connect-timeout must be positive. Received: --connect-timeout={args.connect_timeout}")
    signals = _Signals()
    _timestamped_logs()
    wait_for_dispatcher(host, port, args.connect_timeout)
    tf = _import_tf(getattr(args, "verbose", False))
    svc = tf.data.experimental.service
    me = args.host or socket.gethostname()
    server = svc.WorkerServer(svc.WorkerConfig(
        dispatcher_address=f"{host}:{port}", worker_address=f"{me}:%port%", port=args.port))
    bound = int(server._address.rpartition(":")[2])  # TF's own server: no public accessor
    logger.info("worker serving at %s:%d for the dispatcher at %s:%d; stop with SIGTERM",
                me, bound, host, port)
    name = signals.wait()
    logger.info("%s: stopping the worker (at most %g s)", name, args.stop_timeout)
    _stop(server, "worker", args.stop_timeout)
