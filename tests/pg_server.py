"""A throwaway PostgreSQL server for tests, and the pytest fixtures that share it.

One server per test session: `initdb` into a temporary directory and `pg_ctl start` on a
free loopback port, with its unix socket in the same directory. PostgreSQL refuses to run
as root, so under root the server runs as an unprivileged user (`memproxy-pg`, created
when missing, else `nobody`) that owns the directory. Each test gets a fresh schema,
selected through the URL (`?search_path=...`), dropped afterwards.

Without the server binaries the PostgreSQL tests are skipped, except under CI
(`CI` or `MEMPROXY_REQUIRE_POSTGRES` set), where they fail: CI never skips them.
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import pytest

SERVER_USER = "memproxy-pg"
START_TIMEOUT_S = 30
# A test server only: no OS crash to survive, so skip the fsyncs that make initdb and
# every commit slow. Never use fsync=off for real data: a crash can corrupt it.
SERVER_SETTINGS = ("fsync=off", "full_page_writes=off", "max_connections=200", "log_min_messages=fatal")


def find_binaries() -> Path | None:
    """The directory holding initdb and pg_ctl: PATH first, then /usr/lib/postgresql/*/bin."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(os.path.realpath(initdb)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as; None when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        pass
    created = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                              SERVER_USER], capture_output=True)
    return pwd.getpwnam(SERVER_USER if created.returncode == 0 else "nobody")


class PostgresServer:
    """initdb + pg_ctl in a temporary directory, on a free loopback port."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="memproxy-pg-"))
        self.data = self.root / "data"
        self.user = _server_user()
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)

    def _run(self, *args: str) -> None:
        kwargs = {}
        if self.user is not None:
            kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        done = subprocess.run([str(self.bindir / args[0]), *args[1:]], capture_output=True, text=True,
                              cwd=self.root, **kwargs)  # type: ignore[call-overload]
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stderr.strip() or done.stdout.strip()}")

    def init(self) -> None:
        """Create the cluster (trust auth on loopback, superuser `postgres`)."""
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync",
                  "-E", "UTF8", "--locale=C")

    def start(self) -> None:
        """Start (or restart after stop) and wait until it accepts connections."""
        options = " ".join([f"-p {self.port}", f"-k {self.root}", "-c listen_addresses=127.0.0.1",
                            *(f"-c {s}" for s in SERVER_SETTINGS)])
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"),
                  "-w", "-t", str(START_TIMEOUT_S), "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; `immediate` is a crash, `fast` a clean shutdown."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def url(self, database: str = "postgres", **settings: str) -> str:
        """A connection URL; extra settings become server settings of the session."""
        query = "&".join(f"{k}={v}" for k, v in settings.items())
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}" + (f"?{query}" if query else "")

    def remove(self) -> None:
        """Stop if running and delete every file."""
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def started(bindir: Path) -> Iterator[PostgresServer]:
    """A server of its own, initialised and started, removed (with its files) at the end."""
    server = PostgresServer(bindir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.remove()


def _required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("MEMPROXY_REQUIRE_POSTGRES"))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session."""
    bindir = find_binaries()
    if bindir is None:
        message = "PostgreSQL server binaries (initdb, pg_ctl) not found"
        if _required():
            pytest.fail(message + "; CI must install them (.ci/run does)")
        pytest.skip(message)
    with started(bindir) as server:
        yield server


async def create_schema(server: PostgresServer, schema: str) -> None:
    """CREATE SCHEMA on the session server (the server may have been restarted by a test)."""
    conn = await asyncpg.connect(server.url())
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()


async def drop_schema(server: PostgresServer, schema: str) -> None:
    """DROP SCHEMA ... CASCADE, once the test's proxies have let go of it.

    A test's fixtures end in reverse order: when `pg_url` was set up after `make_proxy`, its
    schema is dropped while those replicas still run (their workers write), and the drop can
    deadlock with them: it is tried again.
    """
    conn = await asyncpg.connect(server.url())
    try:
        for attempt in range(5):
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                return
            except asyncpg.exceptions.DeadlockDetectedError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.2)
    finally:
        await conn.close()


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> Iterator[str]:
    """A store.url for a fresh, empty schema on the session server."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(create_schema(pg_server, schema))
    yield pg_server.url(search_path=schema)
    asyncio.run(drop_schema(pg_server, schema))
