"""The servers under test, each its own process, and what /proc says about them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
_TICK = os.sysconf("SC_CLK_TCK")


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

    def cpu_seconds(self) -> float:
        """User + system CPU time so far (/proc/<pid>/stat, clock-tick resolution)."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime

    def rss_mb(self) -> float:
        """Resident memory (/proc/<pid>/status VmRSS) in MiB."""
        with open(f"/proc/{self.pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def open_fds(self) -> int:
        """Open file descriptors (/proc/<pid>/fd)."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


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
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(name: str, argv: list[str], port: int, workdir: Path, source: Path = REPO) -> Server:
    """Start a server from `source` (its working directory) and wait until it accepts connections."""
    log = workdir / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))}
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=source, env=env)
    server = Server(name, port, process, log)
    _wait_listening(server)
    return server


def _wait_listening(server: Server, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited at start-up:\n{server.log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"{server.name} did not listen on port {server.port} within {timeout} s")


def start_mock(workdir: Path, events: int, delay_ms: float, answer_ms: float = 0.0) -> Server:
    """The mock upstream."""
    port = free_port()
    argv = [sys.executable, str(BENCH / "mock_upstream.py"), "--port", str(port),
            "--events", str(events), "--delay-ms", str(delay_ms), "--answer-ms", str(answer_ms)]
    return start("mock", argv, port, workdir)


def start_reference(workdir: Path, upstream: str, transport: str, name: str) -> Server:
    """The reference pass-through on the given httpx transport."""
    port = free_port()
    argv = [sys.executable, str(BENCH / "reference_proxy.py"), "--port", str(port), "--upstream", upstream,
            "--transport", transport]
    return start(name, argv, port, workdir)


def start_memproxy(workdir: Path, upstream: str, log_level: str, source: Path = REPO, name: str = "memproxy",
                   store_path: Path | None = None, hooks: str = "", gemini: bool = False) -> Server:
    """memproxy as shipped (`python -m proxy serve`) from `source`, one worker; its SQLite store is
    `store_path`, else a new one in the work dir; `hooks`: a `hooks:` list in YAML, appended to its config;
    `gemini`: the Gemini wire's upstream is the mock too (a memproxy from before that wire has no such key)."""
    port = free_port()
    config = workdir / f"{name}.yaml"
    store = (store_path or workdir / f"{name}.db").resolve()
    # The mock serves both wires, so the Messages wire's upstream is the same server.
    gemini_upstream = f"  gemini_base_url: {upstream.removesuffix('/v1')}\n" if gemini else ""
    config.write_text(f"server:\n  log_level: {log_level}\nstore:\n  url: sqlite:///{store}\n"
                      f"upstream:\n  anthropic_base_url: {upstream}\n{gemini_upstream}{hooks}")
    argv = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port),
            "--upstream", upstream]
    return start(name, argv, port, workdir, source)
