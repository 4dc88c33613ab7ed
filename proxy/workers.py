"""`memproxy serve --workers N`: N worker processes on one port and one store.

uvicorn's own supervisor (uvicorn.supervisors.Multiprocess) runs them: it holds the port,
starts each worker as a child of the `memproxy serve` process, starts a new one in place of
one that dies, passes SIGTERM on to every worker (each drains as a lone process does) and
stops when a worker fails at start-up. Around it, here:

- the store's schema is created or migrated, and the turns a crash left pending are closed,
  once, before any worker starts: a worker opening the store then only reads the version,
  and never closes a turn another worker is serving;
- each worker builds its own app, in its own process, from the supervisor's settings
  (pickled to it: a worker started later runs the settings the others run, whatever the
  file says by then);
- each worker watches its parent and stops within 2 s once the supervisor is gone (kill -9):
  no orphan keeps the port;
- the metrics directory (prometheus_client's multiprocess mode, proxy/metrics.py) is new,
  empty and private to this `serve`, and removed at exit;
- on Linux each worker listens on a socket of its own, all bound to the port with
  SO_REUSEPORT (below, `listen_alone`).
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from prometheus_client.multiprocess import mark_process_dead
from starlette.types import ASGIApp
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from proxy.settings import Settings
from proxy.stores.base import StoreError

log = logging.getLogger("memproxy.workers")

# prometheus_client reads it when it is first imported: a worker has it from its start.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
METRICS_DIR_PREFIX = "memproxy-metrics-"
PARENT_POLL_S = 0.1  # how often a worker looks whether its supervisor is still there
# Once the supervisor is gone: running requests get this long to finish (then they end as at
# the end of a grace period), and the worker is gone this long after it noticed, whatever
# its shutdown still waits for. Both inside the 2 s an orchestrator may wait for the port.
ORPHAN_DRAIN_S = 1.0
ORPHAN_EXIT_S = 1.7
_LIVE_GAUGE_FILE = re.compile(r"gauge_live\w+?_(\d+)\.db$")


class WorkerApp:
    """The app factory uvicorn calls in each worker process; pickled to it with the settings."""

    def __init__(self, settings: Settings, metrics_dir: str, supervisor: int,
                 listener: socket.socket | None = None) -> None:
        """`listener`: the supervisor's socket, bound with SO_REUSEPORT for each worker to listen on a
        socket of its own (None: every worker listens on the one uvicorn hands them)."""
        self.settings = settings
        self.metrics_dir = metrics_dir
        self.supervisor = supervisor
        self.listener = (listener.fileno(), listener.getsockname()) if listener is not None else None
        # uvicorn's config, pickled along with this factory: in the worker it is the one its
        # server reads the graceful-shutdown timeout from.
        self.server_config: uvicorn.Config | None = None

    def __call__(self) -> ASGIApp:
        """This worker's app; a failure exits with uvicorn's start-up failure code, which stops the supervisor."""
        from proxy import logs
        from proxy.app import create_app

        logs.configure(self.settings.server.log_level, pid=True)
        forget_dead_workers(self.metrics_dir)
        try:
            if self.listener is not None:
                listen_alone(*self.listener)
            app = create_app(self.settings, own_process=True, metrics_dir=self.metrics_dir)
        except Exception:  # the worker's outermost boundary: any failure here would recur on every restart
            log.exception("worker process %d could not start", os.getpid())
            sys.exit(STARTUP_FAILURE)
        threading.Thread(target=self._watch_supervisor, name="memproxy-supervisor-watch", daemon=True).start()
        return app

    def _watch_supervisor(self) -> None:
        while os.getppid() == self.supervisor:
            time.sleep(PARENT_POLL_S)
        log.error("the supervisor (process %d) is gone: worker process %d stops", self.supervisor, os.getpid())
        if self.server_config is not None:
            self.server_config.timeout_graceful_shutdown = ORPHAN_DRAIN_S  # type: ignore[assignment]  # a float works
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown: the listening socket closes first
        time.sleep(ORPHAN_EXIT_S)
        os._exit(1)  # still here: what the shutdown waits for (a slow store) is lost as in a crash


def reuse_port_socket(host: str, port: int) -> socket.socket | None:
    """The supervisor's socket when each worker can listen on its own: TCP on Linux, bound and
    not listening (the workers' sockets take the connections); None otherwise.

    Why: on one socket shared by every worker, a burst of connections goes to whichever worker
    wakes first, and it accepts them all: 32 connections opened at once were measured splitting
    25/7 over two workers, and kept-alive clients stay where they landed. With a socket per
    worker the kernel spreads new connections over the workers by a hash of their addresses.

    It is bound as one process binds (SO_REUSEADDR alone), so it fails while anything serves the
    port, a second `serve` too; SO_REUSEPORT, set after the bind, lets this user's workers bind
    beside it; SO_REUSEADDR, cleared after, keeps any other process from binding beside it
    while no worker listens (all of them restarting, say). A process of the same user asking
    for SO_REUSEPORT can still join the workers: the kernel only checks the user.
    """
    if sys.platform != "linux":
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # over a TIME_WAIT of the last run
        sock.bind((host, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    except OSError as exc:
        sock.close()
        log.error("could not listen on %s:%d: %s", host, port, exc)
        sys.exit(STARTUP_FAILURE)
    log.info("listening on %s:%d, each worker on a socket of its own", host, port)
    sock.set_inheritable(True)
    return sock


def listen_alone(fd: int, address: tuple[Any, ...]) -> None:
    """In a worker: put a socket of its own, bound to `address` with SO_REUSEPORT, in place of the
    supervisor's socket that uvicorn passed at file descriptor `fd` (it listens on it next).

    OSError when it cannot: serving on the supervisor's socket instead would make it listen
    in the supervisor for as long as `serve` runs, where no worker started later accepts.
    """
    with socket.socket(fileno=os.dup(fd)) as inherited:
        if inherited.getsockname() != address:
            raise OSError(f"the supervisor's socket is not at file descriptor {fd}")
        with socket.socket(inherited.family, socket.SOCK_STREAM, socket.IPPROTO_TCP) as own:
            own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            own.bind(address)
            os.dup2(own.fileno(), fd)


def forget_dead_workers(metrics_dir: str) -> None:
    """Drop the live gauges of workers no longer running (one that died, replaced by this one)."""
    for path in glob.glob(os.path.join(metrics_dir, "gauge_live*.db")):
        found = _LIVE_GAUGE_FILE.search(os.path.basename(path))
        if found is not None and not _running(int(found[1])):
            mark_process_dead(int(found[1]), metrics_dir)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user took the number: not one of ours
        return False
    return True


@contextmanager
def metrics_directory() -> Iterator[str]:
    """A new, empty directory only this user can read, in the workers' environment; removed at exit.

    Named after this process: one a `serve` killed with -9 left behind is removed by the next.
    """
    remove_left_behind()
    path = tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-")
    before = os.environ.get(METRICS_DIR_ENV)
    os.environ[METRICS_DIR_ENV] = path  # the workers inherit it
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(METRICS_DIR_ENV, None)
        else:
            os.environ[METRICS_DIR_ENV] = before
        shutil.rmtree(path, ignore_errors=True)


def remove_left_behind() -> None:
    """Remove this user's metrics directories whose `serve` is no longer running."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{METRICS_DIR_PREFIX}*-*")):
        found = re.fullmatch(rf"{METRICS_DIR_PREFIX}(\d+)-\w+", os.path.basename(path))
        try:
            mine = os.stat(path).st_uid == os.getuid()
        except OSError:
            continue
        if found is not None and mine and not _running(int(found[1])):
            shutil.rmtree(path, ignore_errors=True)


def prepare_store(settings: Settings) -> None:
    """Create or migrate the schema and close the turns a crash left pending, before any worker starts.

    A store that does not answer is not fatal, as in one process: each worker serves without
    memory until it does, and the first to reach it migrates (under the store's own lock).
    """
    from proxy.app import open_store

    async def run() -> None:
        store = open_store(settings.store)
        try:
            await store.open()
        finally:
            await store.close()

    try:
        asyncio.run(run())
    except StoreError as exc:
        log.error("store unavailable at start-up (%s): the workers serve without memory until it answers", exc)


def serve_workers(settings: Settings, options: dict[str, Any]) -> int:
    """Run settings.server.workers workers under uvicorn's supervisor until it stops; the exit status."""
    prepare_store(settings)
    with metrics_directory() as metrics_dir:
        listener = reuse_port_socket(settings.server.host, settings.server.port)
        app = WorkerApp(settings, metrics_dir, os.getpid(), listener)
        config = uvicorn.Config(app, factory=True, workers=settings.server.workers, **options)
        app.server_config = config
        supervisor = Multiprocess(config, sockets=[listener or config.bind_socket()])
        supervisor.run()
    failed = [process.pid for process in supervisor.processes if process.exitcode == STARTUP_FAILURE]
    if failed:
        print(f"memproxy: worker process {failed[0]} failed to start (its error is logged above);"
              " every worker was stopped", file=sys.stderr)
        return 1
    return 0
