"""`memproxy serve --workers 2` in its own process: uvicorn's supervisor and two worker
processes on one port and one store (a SQLite file, or PostgreSQL).

A request lands on whichever worker accepts its connection, so a test that must know which
worker served it keeps one connection per worker: a client limited to one connection, whose
/readyz names the worker's process.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.stores.sqlite.schema import MIGRATIONS
from proxy.workers import listen_alone, reuse_port_socket
from tests.conftest import free_port
from tests.fake_upstream import FakeUpstream, SSEReply, stream_events
from tests.test_crash import start_server
from tests.proxy_db import sqlite_file

pytestmark = pytest.mark.faults
USER = {"x-memory-user": "alice"}
# Generous bounds: these tests are about which worker answers, not about a loaded machine's timing.
PATIENT = {"memory_commit_timeout_ms": "5000", "memory_retrieval_timeout_ms": "5000"}
START_WITHIN_S = 60.0


def _stat(pid: int) -> tuple[str, int, bytes] | None:
    """(state, parent, command line) of a process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            fields = stat.read().rsplit(")", 1)[1].split()
            return fields[0], int(fields[1]), cmdline.read()
    except (OSError, IndexError, ValueError):
        return None


def running(pid: int) -> bool:
    """Alive: neither gone nor a zombie left for its new parent to reap."""
    found = _stat(pid)
    return found is not None and found[0] != "Z"


def workers_of(supervisor: int) -> set[int]:
    """The worker processes of a `memproxy serve`: its running children started by multiprocessing's spawn."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            state, parent, cmdline = stat
            if parent == supervisor and state != "Z" and b"spawn_main" in cmdline:
                found.add(int(entry))
    return found


def eventually(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def pin(url: str, pids: set[int], timeout: float = 20.0) -> dict[int, httpx.Client]:
    """A client per worker, each on one kept-alive connection that worker accepted."""
    clients: dict[int, httpx.Client] = {}
    deadline = time.monotonic() + timeout
    while set(clients) != pids and time.monotonic() < deadline:
        client = httpx.Client(base_url=url, timeout=30, limits=httpx.Limits(max_connections=1))
        pid = client.get("/readyz").json()["process"]
        if pid in pids and pid not in clients:
            clients[pid] = client
        else:
            client.close()
    assert set(clients) == pids, f"no connection reached every worker: {sorted(clients)} of {sorted(pids)}"
    return clients


async def pin_async(url: str, pids: set[int], each: int) -> list[tuple[int, httpx.AsyncClient]]:
    """`each` async clients per worker, each on one connection that worker accepted."""
    clients: dict[int, list[httpx.AsyncClient]] = {pid: [] for pid in pids}
    deadline = time.monotonic() + START_WITHIN_S
    while any(len(kept) < each for kept in clients.values()) and time.monotonic() < deadline:
        client = httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=1))
        pid = (await client.get("/readyz")).json()["process"]
        if pid in clients and len(clients[pid]) < each:
            clients[pid].append(client)
        else:
            await client.aclose()
    assert all(len(kept) == each for kept in clients.values()), "no connections reached every worker"
    return [(pid, client) for pid, kept in clients.items() for client in kept]


async def stream_on(client: httpx.AsyncClient, text: str) -> bytes:
    """One streamed chat on the pinned client, then the client closed ('' when the connection broke)."""
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=USER) as response:
            return b"".join([piece async for piece in response.aiter_raw()])
    except httpx.HTTPError:
        return b""
    finally:
        await client.aclose()


def listening_on(pid: int, port: int) -> set[int]:
    """The inodes of the sockets a process holds that listen on `port` (/proc: what the kernel says)."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                    listening.add(int(fields[9]))
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            held.add(int(target[8:-1]))
    return listening & held


def port_of(served: Serve) -> int:
    return int(served.url.rsplit(":", 1)[1])


async def opened_at_once(url: str, connections: int) -> Counter[int]:
    """How many of `connections` new connections, opened all at once, each worker accepted."""
    clients = [httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=1))
               for _ in range(connections)]
    try:
        answers = await asyncio.gather(*[client.get("/readyz") for client in clients])
    finally:
        await asyncio.gather(*[client.aclose() for client in clients])
    return Counter(answer.json()["process"] for answer in answers)


def served_by(client: httpx.Client) -> int:
    return int(client.get("/readyz").json()["process"])


def chat(client: httpx.Client, url: str) -> openai.OpenAI:
    """The official client on a pinned connection."""
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-client-key", default_headers=USER, max_retries=0,
                         http_client=client)


class Serve:
    """`memproxy serve --workers N` and its workers, stopped at the end of the test."""

    def __init__(self, store: str, upstream: str, tmp_path: Path, workers: int = 2, **env: str) -> None:
        self.log = tmp_path / "serve.log"
        self.db = tmp_path / "memory.db"
        settings = {"store_url": store, "server_workers": str(workers), "server_log_level": "info", **PATIENT, **env}
        # Each worker is a new interpreter importing everything: slow on a loaded machine.
        self.process, self.url = start_server(tmp_path / "unused.db", upstream, self.log, start_within=START_WITHIN_S,
                                              **settings)
        self.pids = eventually(lambda: len(found := workers_of(self.process.pid)) == workers and found, START_WITHIN_S)
        assert self.pids, f"{workers} workers did not start"
        self.clients = pin(self.url, self.pids, START_WITHIN_S)

    def stop(self) -> None:
        for client in self.clients.values():
            client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for pid in self.pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def serve(fake: FakeUpstream, tmp_path: Path) -> Iterator[Any]:
    started: list[Serve] = []

    def start(store: str | None = None, **env: str) -> Serve:
        served = Serve(store or f"sqlite:///{tmp_path}/memory.db", fake.url, tmp_path, **env)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


@pytest.fixture(scope="module")
def shared(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """One `serve` for the tests that leave it serving (a worker's start takes seconds), in file
    order: the last of them stops it with SIGTERM."""
    tmp_path = tmp_path_factory.mktemp("shared")
    served = Serve(f"sqlite:///{tmp_path}/memory.db", upstream.url, tmp_path)
    yield served
    served.stop()


def counted(client: httpx.Client, sample: str) -> float:
    """A sample's value in /metrics (0 before it exists)."""
    found = re.search(rf"^{re.escape(sample)} (\S+)$", client.get("/metrics").text, re.MULTILINE)
    return float(found[1]) if found else 0.0


def settled(client: httpx.Client, samples: tuple[str, ...]) -> list[float]:
    """The samples' values once they stop moving: a request's metrics are recorded as its response
    ends, a moment after the client has read it."""
    values = [counted(client, sample) for sample in samples]
    while True:
        time.sleep(0.2)
        again = [counted(client, sample) for sample in samples]
        if again == values:
            return values
        values = again


def sent_to_upstream(fake: FakeUpstream) -> str:
    """The last user message of the last chat request the upstream received, the memory block in it."""
    messages = fake.chat_requests()[-1].json()["messages"]
    return str([m for m in messages if m["role"] == "user"][-1]["content"])


def remember_across_workers(served: Serve, fake: FakeUpstream) -> None:
    (first, one), (second, other) = served.clients.items()
    told = chat(one, served.url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "My manager is Dana Whitfield."}])
    assert told.choices[0].message.content == "Hello from upstream"
    asked = chat(other, served.url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Who is my manager?"}])
    assert asked.choices[0].message.content == "Hello from upstream"
    assert "Dana Whitfield" in sent_to_upstream(fake)
    assert (served_by(one), served_by(other)) == (first, second)  # each on its own worker throughout


def test_two_workers_serve_one_port_and_a_fact_told_to_one_is_found_by_the_other(shared, fake):
    served = shared
    first, second = served.pids
    assert first != second and all(running(pid) for pid in served.pids)
    readiness = [client.get("/readyz").json() for client in served.clients.values()]
    assert [(r["workers"], r["store"], r["status"]) for r in readiness] == [(2, "ok", "ready")] * 2
    remember_across_workers(served, fake)
    log = served.log.read_text()
    assert re.search(r'"workers":2,"msg":"memproxy starting"', log)
    assert {f'"pid":{pid}' for pid in served.pids} <= set(re.findall(r'"pid":\d+', log))


def test_each_worker_listens_on_its_own_socket_and_a_burst_of_connections_spreads_over_both(shared):
    # One socket shared by the workers hands a burst of connections to whichever wakes first
    # (measured: 25 of 32 on one); with one each, the kernel spreads them by address.
    listeners = {pid: listening_on(pid, port_of(shared)) for pid in shared.pids}
    assert [len(held) for held in listeners.values()] == [1, 1]
    assert len(set.union(*listeners.values())) == 2
    assert not listening_on(shared.process.pid, port_of(shared))  # the supervisor's socket only holds the port
    spread = asyncio.run(opened_at_once(shared.url, 64))
    assert set(spread) == shared.pids and min(spread.values()) >= 16, spread  # even odds: below 16 is 1 in 10,000


def test_a_second_serve_on_the_port_of_one_with_workers_fails_as_on_a_port_in_use(shared, tmp_path):
    # Every worker's socket allows SO_REUSEPORT: a second `serve` must not join them silently.
    env = {**os.environ, "MEMPROXY_STORE_URL": f"sqlite:///{tmp_path}/other.db", "MEMPROXY_SERVER_WORKERS": "2",
           "MEMPROXY_SERVER_PORT": str(port_of(shared)), "MEMPROXY_UPSTREAM_BASE_URL": "http://127.0.0.1:9"}
    second = subprocess.run([sys.executable, "-m", "proxy", "serve"], env=env, capture_output=True, text=True,
                            timeout=START_WITHIN_S)
    assert second.returncode == 3
    assert f"could not listen on 127.0.0.1:{port_of(shared)}: [Errno 98] Address already in use" in second.stderr
    assert all(len(listening_on(pid, port_of(shared))) == 1 for pid in shared.pids)  # the first serves on
    for client in shared.clients.values():  # idle for seconds: their connections may have timed out
        client.close()
    shared.clients = pin(shared.url, shared.pids)


def test_while_no_worker_listens_no_other_socket_binds_the_port_but_a_workers_own():
    held = reuse_port_socket("127.0.0.1", free_port())
    assert held is not None
    address = held.getsockname()
    with held, socket.socket() as intruder, socket.socket() as own:
        intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # what a server of any user asks for
        with pytest.raises(OSError) as refused:
            intruder.bind(address)
        assert refused.value.errno == errno.EADDRINUSE
        own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        own.bind(address)


def test_a_worker_not_finding_the_supervisors_socket_fails_to_start_rather_than_share_another():
    with socket.socket() as elsewhere:
        elsewhere.bind(("127.0.0.1", 0))
        with pytest.raises(OSError, match="not at file descriptor"):
            listen_alone(elsewhere.fileno(), ("127.0.0.1", free_port()))


def test_migrations_ran_once_before_the_workers_on_a_fresh_file(shared):
    with sqlite_file(shared.db) as db:
        versions = db.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
    assert versions == [(v,) for v in range(1, len(MIGRATIONS) + 1)]


def test_a_retried_turn_is_saved_once_whichever_worker_the_retry_lands_on(shared, fake):
    served = shared
    question = [{"role": "user", "content": "What is the capital of Portugal?"}]
    for client in served.clients.values():  # the client's retry lands on the other worker
        answer = chat(client, served.url).chat.completions.create(model="m", messages=question)
        assert answer.choices[0].message.content == "Hello from upstream"
    with sqlite_file(served.db) as db:
        turns = db.execute("SELECT t.status FROM turns t JOIN messages m ON m.user_id = t.user_id"
                           " AND m.turn_key = t.turn_key WHERE m.content = ?", [question[0]["content"]]).fetchall()
        messages = db.execute("SELECT role, content FROM messages WHERE turn_key IN (SELECT turn_key FROM messages"
                              " WHERE content = ?) ORDER BY role", [question[0]["content"]]).fetchall()
    assert turns == [("complete",)]
    assert messages == [("assistant", "Hello from upstream"), ("user", "What is the capital of Portugal?")]


def test_metrics_sum_the_requests_of_every_worker(shared, fake):
    served = shared
    (_, one), (_, other) = served.clients.items()
    samples = ('memproxy_requests_total{outcome="status_200",path="/chat/completions"}',
               'memproxy_request_seconds_count{path="/chat/completions"}')
    before = settled(one, samples)
    for client, n in ((one, 3), (other, 2)):
        for i in range(n):
            chat(client, served.url).chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"question {i} to {id(client)}"}])
    for client in (one, other):  # whichever worker answers /metrics says the same
        assert [now - was for now, was in zip(settled(client, samples), before)] == [5.0, 5.0]


def test_a_worker_killed_with_9_is_replaced_and_the_other_keeps_serving(shared, fake):
    served = shared
    (victim, doomed), (survivor, alive) = served.clients.items()
    for i in range(3):  # committed on the worker about to die
        chat(doomed, served.url).chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"told before the kill {i}"}])
    for _ in range(4):
        fake.queue(SSEReply(stream_events("a full answer", pieces=20), delay=0.05))

    async def streams_while_one_dies() -> list[bytes]:
        pinned = await pin_async(served.url, served.pids, 2)  # two streams on each worker
        running_streams = [asyncio.create_task(stream_on(client, f"streamed {n}"))
                           for n, (_, client) in enumerate(pinned)]
        await asyncio.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
        return list(await asyncio.gather(*running_streams))

    bodies = asyncio.run(streams_while_one_dies())
    doomed.close()
    fake.reset()  # a stream the kill cut before it reached the upstream left its scripted reply unused
    assert eventually(lambda: not running(victim), 5)
    replaced = eventually(lambda: len(found := workers_of(served.process.pid)) == 2 and victim not in found and found)
    assert replaced and survivor in replaced, "no new worker took the dead one's place"
    answer = chat(alive, served.url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "after the kill"}])
    assert answer.choices[0].message.content == "Hello from upstream"
    assert served_by(alive) == survivor
    newcomer = (replaced - {survivor}).pop()
    served.pids = replaced
    served.clients = {survivor: alive, **pin(served.url, {newcomer})}
    assert len(listening_on(newcomer, port_of(served)) | listening_on(survivor, port_of(served))) == 2
    chat(served.clients[newcomer], served.url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "to the new worker"}])
    completed = {f"streamed {n}" for n, body in enumerate(bodies) if body.endswith(b"data: [DONE]\n\n")}
    assert len(completed) >= 2, "the survivor's streams did not finish"
    with sqlite_file(served.db) as db:
        answered = {row[0] for row in db.execute(
            "SELECT u.content FROM messages u JOIN turns t ON t.user_id = u.user_id AND t.turn_key = u.turn_key"
            " WHERE u.role = 'user' AND t.status = 'complete'")}
    assert {f"told before the kill {i}" for i in range(3)} | completed | {"after the kill", "to the new worker"} \
        <= answered  # no committed turn lost


def test_killing_the_supervisor_with_9_takes_every_worker_down_within_2_s_and_frees_the_port(serve):
    served = serve()
    os.kill(served.process.pid, signal.SIGKILL)
    killed = time.monotonic()
    served.process.wait(5)
    assert eventually(lambda: not any(running(pid) for pid in served.pids), 2.0)
    assert time.monotonic() - killed < 2.5
    port = int(served.url.rsplit(":", 1)[1])
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()  # nobody else listens on it any more


def test_sigterm_drains_every_worker_saves_their_turns_and_exits_0(shared, fake):
    served = shared
    for _ in range(6):
        fake.queue(SSEReply(stream_events("a full answer", pieces=20), delay=0.05))  # about 1 s each

    async def run() -> tuple[list[int], list[bytes]]:
        pinned = await pin_async(served.url, served.pids, 3)  # three streams on each worker
        streams = [asyncio.create_task(stream_on(client, f"drained {n}")) for n, (_, client) in enumerate(pinned)]
        await asyncio.sleep(0.4)
        os.kill(served.process.pid, signal.SIGTERM)
        return [pid for pid, _ in pinned], list(await asyncio.gather(*streams))

    pids, bodies = asyncio.run(run())
    assert served.process.wait(15) == 0
    assert not any(running(pid) for pid in served.pids)
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
    with sqlite_file(served.db) as db:
        statuses = db.execute("SELECT t.status, count(*) FROM turns t JOIN messages m ON m.user_id = t.user_id"
                              " AND m.turn_key = t.turn_key WHERE m.content LIKE 'drained %' GROUP BY t.status"
                              ).fetchall()
    assert statuses == [("complete", 6)]
    assert set(pids) == served.pids  # both workers were draining streams


def test_a_worker_failing_at_start_up_stops_the_supervisor_with_a_clear_message(fake, tmp_path):
    env = {**os.environ, "MEMPROXY_STORE_URL": f"sqlite:///{tmp_path}/memory.db",
           "MEMPROXY_UPSTREAM_BASE_URL": fake.url,
           "MEMPROXY_SERVER_PORT": str(free_port()), "MEMPROXY_SERVER_WORKERS": "2",
           "MEMPROXY_HOOKS": '[{"event": "stop", "python": "no_such_module_here:handler"}]'}
    process = subprocess.run([sys.executable, "-m", "proxy", "serve"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert process.returncode == 1
    assert "failed to start (its error is logged above); every worker was stopped" in process.stderr
    assert "no_such_module_here" in process.stderr


def test_two_workers_on_postgresql_serve_and_remember(serve, fake, pg_url):
    served = serve(pg_url)
    remember_across_workers(served, fake)
