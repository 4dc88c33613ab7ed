"""The servers under test, each its own process: started, waited for, and stopped together.

A benchmark opens `Targets` in a `with` block and starts what it measures from it: the mock
upstream, the reference pass-through, memproxy (from this checkout or another), or a
process of its own. Everything a server writes (its config, its SQLite store, its log)
goes into the run's work directory, which is kept for reading the logs afterwards.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import proc
from .config import memproxy_config

if TYPE_CHECKING:
    from tests.pg_server import PostgresServer

HARNESS = Path(__file__).resolve().parent
# store.hash_key of every memproxy a run puts on PostgreSQL (its replicas share it). In the
# environment, which a checkout from before the setting ignores.
POSTGRES_HASH_KEY = "bench-hash-key-of-every-replica-0123456789"
BENCH = HARNESS.parent
REPO = BENCH.parent
LOCALHOST = "127.0.0.1"


@dataclass
class Server:
    """A started server process and the log file its output goes to."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, path: str = "") -> str:
        """`http://127.0.0.1:<port>` followed by `path`."""
        return f"http://{LOCALHOST}:{self.port}{path}"

    def cpu_seconds(self) -> float:
        """User + system CPU time so far of the process and its workers (/proc, clock-tick resolution)."""
        return proc.tree_cpu_seconds(self.pid)

    def rss_mb(self) -> float:
        """Resident memory (/proc/<pid>/status VmRSS) of the process and its workers, in MiB."""
        total = 0.0
        for pid in proc.tree(self.pid):
            try:
                total += proc.status_mb(pid, "VmRSS")
            except OSError:
                continue
        return total

    def open_fds(self) -> int:
        """Open file descriptors (/proc/<pid>/fd)."""
        return proc.open_fds(self.pid)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; nothing when it has ended already."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Targets:
    """The servers of one run, in one work directory; `with` stops every one of them at its end."""

    def __init__(self, prefix: str, parent: Path | None = None) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        self._started: list[Server] = []

    def __enter__(self) -> Targets:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every server started here, the last started first."""
        for server in reversed(self._started):
            server.stop()

    def process(self, name: str, argv: list[str], port: int, source: Path = REPO,
                env_settings: dict[str, str] | None = None) -> Server:
        """Start `argv` from `source` (its working directory), with `env_settings` in its environment,
        and wait until it listens on `port`."""
        log = self.workdir / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")])),
               **(env_settings or {})}
        with open(log, "wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=source, env=env)
        server = Server(name, port, process, log)
        self._started.append(server)
        _wait_listening(server)
        return server

    def mock(self, events: int = 50, delay_ms: float = 5.0, answer_ms: float = 0.0) -> Server:
        """The mock upstream (mock_upstream.py): streams of `events` chunks `delay_ms` apart."""
        port = free_port()
        argv = [sys.executable, str(HARNESS / "mock_upstream.py"), "--port", str(port),
                "--events", str(events), "--delay-ms", str(delay_ms), "--answer-ms", str(answer_ms)]
        return self.process("mock", argv, port)

    def reference(self, upstream: str, transport: str, name: str) -> Server:
        """The reference pass-through (reference_proxy.py) on the given httpx transport."""
        port = free_port()
        argv = [sys.executable, str(HARNESS / "reference_proxy.py"), "--port", str(port), "--upstream", upstream,
                "--transport", transport]
        return self.process(name, argv, port)

    def memproxy(self, upstream: str, log_level: str = "info", source: Path = REPO, name: str = "memproxy",
                 store_url: str | None = None, store_path: Path | None = None,
                 hooks: list[dict[str, Any]] | None = None, gemini: bool = False, workers: int = 1) -> Server:
        """memproxy as shipped (`python -m proxy serve`) from `source`, `workers` worker processes (a
        checkout from before `--workers` takes only 1), its config written by `memproxy_config`; its
        store is `store_url`, else the SQLite file `store_path`, else a new one in the work directory."""
        port = free_port()
        config = self.workdir / f"{name}.yaml"
        url = store_url or f"sqlite:///{(store_path or self.workdir / f'{name}.db').resolve()}"
        config.write_text(memproxy_config(upstream, log_level, url, hooks=hooks, gemini=gemini))
        argv = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port),
                "--upstream", upstream] + (["--workers", str(workers)] if workers != 1 else [])
        keyed = {} if url.startswith("sqlite:") else {"MEMPROXY_STORE_HASH_KEY": POSTGRES_HASH_KEY}
        return self.process(name, argv, port, source, keyed)


@contextmanager
def throwaway_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of its own for the run (tests/pg_server.py: initdb and pg_ctl in a temporary
    directory, fsync off as for tests), removed at the end; exits when its binaries are missing."""
    sys.path.insert(0, str(REPO))
    from tests.pg_server import find_binaries, started

    binaries = find_binaries()
    if binaries is None:
        raise SystemExit("PostgreSQL server binaries (initdb, pg_ctl) not found: install postgresql")
    with started(binaries) as server:
        yield server


def source_version(path: Path) -> str:
    """`git describe` of the memproxy checkout at `path`, or "unknown"."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=path, capture_output=True,
                              text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip()


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((LOCALHOST, 0))
        return int(sock.getsockname()[1])


def _wait_listening(server: Server, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited at start-up:\n{server.log.read_text()[-2000:]}")
        try:
            with socket.create_connection((LOCALHOST, server.port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"{server.name} did not listen on port {server.port} within {timeout} s")
