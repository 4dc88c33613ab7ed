"""What one process keeps in memory never answers from data another process changed.

Two SQLiteStores on one file stand for two worker processes: each has its own connections,
its own in-memory postings (messages, entities), its own per-user BM25 counts and its own
note of a store without reasoning traces. `reader` searches first, so its caches hold the
user; `writer` then commits; `reader`'s very next search must answer from the commit. And
a user deleted on one process is gone from the other's answers at once. Nor does a process
opening the file take the turns another still serves for a crash's leftovers.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from proxy.models import ReasoningStep, Scope
from proxy.stores.indexed_text import entity_terms
from proxy.stores.sqlite.processes import new_process_id
from proxy.stores.sqlite.store import SQLiteStore
from tests.store_backends import SQLiteBackend
from tests.test_store_contract import finish, query_terms, start

ALICE = Scope("alice")


def killed_process_id() -> str:
    """The name a store gives its process (sqlite/processes.py), of a process that has ended."""
    return subprocess.run([sys.executable, "-c", "from proxy.stores.sqlite.processes import new_process_id;"
                           " print(new_process_id())"], capture_output=True, text=True, check=True).stdout.strip()


def with_pid(process_id: str, pid: int) -> str:
    """`process_id` as if its process had had `pid`."""
    where, _, rest = process_id.partition(":")
    return f"{where}:{pid}:{rest.partition(':')[2]}"


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


@asynccontextmanager
async def two_processes(path: Path, **options: Any) -> AsyncIterator[tuple[SQLiteStore, SQLiteStore]]:
    """Two stores on one SQLite file: the reader's caches, the writer's commits."""
    reader, writer = SQLiteStore(str(path), **options), SQLiteStore(str(path), **options)
    await reader.open()
    await writer.open()
    try:
        yield reader, writer
    finally:
        await asyncio.gather(reader.close(), writer.close())


async def held(store: SQLiteStore, user: str, *, entities: bool = False) -> None:
    """Wait until the store's postings of `user` are built (a search asked for them)."""
    indexes = store.entity_indexes if entities else store.message_indexes
    deadline = time.monotonic() + 10
    while not indexes.holds(user):
        assert time.monotonic() < deadline, "postings never built"
        await asyncio.sleep(0.01)


async def message_texts(store: SQLiteStore, question: str) -> list[str]:
    return [m.content for m, _ in await store.search_messages(ALICE, query_terms(question))]


def test_a_message_another_process_saved_is_found_by_the_next_search(tmp_path: Path) -> None:
    async def body() -> None:
        async with two_processes(tmp_path / "m.db") as (reader, writer):
            await writer.apply([start(ALICE, "t1", "the ferry to Lopud leaves at nine")])
            assert await message_texts(reader, "when does the ferry leave?") == ["the ferry to Lopud leaves at nine"]
            await held(reader, "alice")
            await writer.apply([start(ALICE, "t2", "the ferry back leaves at six", conv="c2")])
            searches = reader.message_indexes.searches
            assert await message_texts(reader, "when does the ferry leave?") == [
                "the ferry back leaves at six", "the ferry to Lopud leaves at nine"]
            assert reader.message_indexes.searches == searches + 1  # the postings answered, caught up

    run(body())


def test_a_user_deleted_on_another_process_is_gone_from_its_postings_and_counts(tmp_path: Path) -> None:
    async def body() -> None:
        for cache_mb in (256, 0):  # postings; none (the per-user counts answer)
            path = tmp_path / f"m{cache_mb}.db"
            async with two_processes(path, search_cache_mb=cache_mb) as (reader, writer):
                backend = SQLiteBackend(path)
                await writer.apply([start(ALICE, "t1", "my ferry pass number is 4471")])
                await backend.add_entity("alice", "Ferry pass", "document", "number 4471")
                assert await message_texts(reader, "ferry pass") == ["my ferry pass number is 4471"]
                assert [e.name for e, _ in await reader.search_entities(ALICE, query_terms("ferry"))] == ["Ferry pass"]
                if cache_mb:
                    await held(reader, "alice")
                    await held(reader, "alice", entities=True)
                await writer.delete_user(ALICE)
                assert await message_texts(reader, "ferry pass") == []
                assert await reader.search_entities(ALICE, query_terms("ferry")) == []
                # The user's new life starts from nothing, on either process.
                await writer.apply([start(ALICE, "t2", "a new ferry pass")])
                assert await message_texts(reader, "ferry pass") == ["a new ferry pass"]

    run(body())


def test_an_entity_another_process_changed_is_searched_as_it_now_reads(tmp_path: Path) -> None:
    async def body() -> None:
        path = tmp_path / "m.db"
        async with two_processes(path) as (reader, writer):
            backend = SQLiteBackend(path)
            await backend.add_entity("alice", "Lopud", "place", "an island")
            assert [e.name for e, _ in await reader.search_entities(ALICE, query_terms("island"))] == ["Lopud"]
            await held(reader, "alice", entities=True)
            await backend.sql("UPDATE entities SET description = ?, name_terms = ?, type_terms = ?,"
                              " description_terms = ? WHERE name = 'Lopud'", "a car-free village",
                              *entity_terms("Lopud", "place", "a car-free village"))
            await backend.add_entity("alice", "Sipan", "place", "the largest island")
            assert [e.name for e, _ in await reader.search_entities(ALICE, query_terms("island"))] == ["Sipan"]
            assert [e.name for e, _ in await reader.search_entities(ALICE, query_terms("village"))] == ["Lopud"]

    run(body())


def test_a_reasoning_trace_another_process_saved_is_found_by_the_next_search(tmp_path: Path) -> None:
    async def body() -> None:
        async with two_processes(tmp_path / "m.db") as (reader, writer):
            assert await reader.search_reasoning(ALICE, query_terms("invoices")) == []  # no trace in the store
            steps = (ReasoningStep("run_sql", "SELECT * FROM invoices", "42 rows"),)
            await writer.apply([start(ALICE, "t1"), finish(ALICE, "t1", "There are 42.", task="count invoices",
                                                           steps=steps)])
            assert [t.task for t, _ in await reader.search_reasoning(ALICE, query_terms("invoices"))] == [
                "count invoices"]

    run(body())


def test_a_process_opening_the_file_ends_the_turns_of_a_process_gone_not_of_one_running(tmp_path: Path) -> None:
    """Recovery at open: a turn pending on a process still running stays pending; once every
    other process with the file open is gone, the turns they left pending are interrupted."""
    path = tmp_path / "m.db"
    backend = SQLiteBackend(path)

    async def body() -> None:
        now = datetime.now(UTC)
        async with two_processes(path) as (running, _):
            await running.apply([start(ALICE, "in-flight", at=now)])
            async with backend.opened() as starting:  # a third process starts meanwhile
                assert (await starting.turn(ALICE, "in-flight")).status == "pending"  # type: ignore[union-attr]
        # Both closed; a process killed with its turn in flight left its row behind.
        await backend.sql("INSERT INTO processes (id, opened_at) VALUES (?, 0)", killed_process_id())
        await backend.sql("UPDATE turns SET status = 'pending'")
        async with backend.opened() as starting:
            assert (await starting.turn(ALICE, "in-flight")).status == "interrupted"  # type: ignore[union-attr]
        assert await backend.sql("SELECT count(*) FROM processes") == [(0,)]

    run(body())


def ends_its_turn_and_lease_at_open(path: Path, killed: str) -> None:
    """A lone process opening the file takes `killed` for gone: it ends the turn left pending,
    drops the row, and claims at once the item leased for 5 minutes more."""
    backend = SQLiteBackend(path)

    async def body() -> None:
        now = datetime.now(UTC)
        async with backend.opened() as store:
            await store.apply([start(ALICE, "in-flight", "my ferry leaves at nine", at=now)])
        await backend.sql("INSERT INTO processes (id, opened_at) VALUES (?, 0)", killed)
        await backend.sql("UPDATE turns SET status = 'pending'")
        await backend.sql("UPDATE extraction_queue SET claimed_until = ?, claimed_by = ?", now.timestamp() + 300,
                          killed)
        async with backend.opened() as store:
            assert (await store.turn(ALICE, "in-flight")).status == "interrupted"  # type: ignore[union-attr]
            assert await backend.sql("SELECT id FROM processes WHERE id = ?", killed) == []
            assert [q.message.content for q in await store.claim_extraction(10, now)] == ["my ferry leaves at nine"]

    run(body())


def test_a_killed_process_whose_pid_another_process_now_has_is_known_gone(tmp_path: Path) -> None:
    """Process ids are reused (32,768 of them by default on Linux; a restarted container hands
    out the same ones again): a process killed with a turn in flight and items leased, whose
    pid an unrelated process took since, is gone all the same."""
    killed = killed_process_id()
    time.sleep(0.05)  # the kernel counts start times in hundredths of a second
    with subprocess.Popen(["sleep", "60"]) as unrelated:
        try:
            ends_its_turn_and_lease_at_open(tmp_path / "m.db", with_pid(killed, unrelated.pid))
        finally:
            unrelated.kill()


@pytest.mark.skipif(not Path("/proc/sys/kernel/random/boot_id").exists(), reason="Linux names the host's boot")
def test_a_process_of_an_earlier_boot_is_known_gone(tmp_path: Path) -> None:
    """After a power cut, a host booting the same way may give the new memproxy the pid, and
    even the start time, of the one killed: a process of an earlier boot is gone all the same."""
    host, pid, started, store = new_process_id().split(":")
    name, _, namespace = host.split("/")
    ends_its_turn_and_lease_at_open(tmp_path / "m.db", f"{name}/{uuid.uuid4()}/{namespace}:{pid}:{started}:{store}")


_IN_ANOTHER_NAMESPACE = """
import asyncio, os, sys
from datetime import UTC, datetime
from proxy.models import Scope
from proxy.stores.base import StartTurn
from proxy.stores.sqlite.store import SQLiteStore

async def main() -> None:
    store = SQLiteStore(sys.argv[1])
    await store.open()
    now = datetime.now(UTC)
    await store.apply([StartTurn(Scope("alice"), "in-flight", "c1", "h", now, "my ferry leaves at nine")])
    print(os.getpid(), len(await store.claim_extraction(10, now)), flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await store.close()

asyncio.run(main())
"""


def _free_pid() -> int:
    """A process id no process of this namespace has."""
    for pid in range(30000, 1000, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
    raise AssertionError("no free pid")


UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def test_a_process_in_another_pid_namespace_is_never_taken_for_gone(tmp_path: Path) -> None:
    """Two containers with one host name (host networking, or a name set alike) may share the
    file, each with its own process ids. The other's pid says nothing here: its turn in flight
    stays pending and its leased item stays with it, even when no process here has that pid."""
    if shutil.which("unshare") is None or subprocess.run([*UNSHARE, "true"], capture_output=True).returncode:
        pytest.skip("a pid namespace of its own needs unshare, and the right to make one (root)")
    path = tmp_path / "m.db"
    pid = _free_pid()
    spawn = f"open('/proc/sys/kernel/ns_last_pid', 'w').write('{pid - 1}'); import subprocess, sys;" \
            f" sys.exit(subprocess.call([sys.executable, '-c', {_IN_ANOTHER_NAMESPACE!r}, {str(path)!r}]))"

    async def body() -> None:
        async with SQLiteBackend(path).opened() as store:
            assert (await store.turn(ALICE, "in-flight")).status == "pending"  # type: ignore[union-attr]
            assert await store.claim_extraction(10, datetime.now(UTC)) == []

    with subprocess.Popen([*UNSHARE, sys.executable, "-c", spawn],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as other:
        assert other.stdout is not None and other.stdin is not None
        try:
            assert other.stdout.readline().split() == [str(pid), "1"]  # its pid there; one item leased
            run(body())
            other.stdin.close()
            assert other.wait(30) == 0
        finally:
            if other.poll() is None:
                other.kill()


async def answers(store: SQLiteStore) -> list[list[tuple[str, float]]]:
    """What each search of the user answers, with its score."""
    messages = await store.search_messages(ALICE, query_terms("ferry leaves"))
    entities = await store.search_entities(ALICE, query_terms("island ferry"))
    traces = await store.search_reasoning(ALICE, query_terms("invoices ferry"))
    return [[(m.content, round(s, 6)) for m, s in messages], [(e.name, round(s, 6)) for e, s in entities],
            [(t.task, round(s, 6)) for t, s in traces]]


def test_after_each_write_or_delete_of_another_process_a_process_answers_as_one_just_started(tmp_path: Path) -> None:
    """Interleaved: `reader` searches (its postings and counts hold the user), `writer` adds,
    corrects or deletes, and `reader`'s next answers, hits and scores, are those of a process
    opening the file afresh; with postings and without (the per-user counts answer)."""
    steps = (ReasoningStep("run_sql", "SELECT * FROM invoices", "42 rows"),)

    async def body(path: Path, cache_mb: int) -> None:
        backend = SQLiteBackend(path)
        async with two_processes(path, search_cache_mb=cache_mb) as (reader, writer):
            ids: dict[str, str] = {}

            async def save(key: str, text: str) -> None:
                await writer.apply([start(ALICE, key, text, conv=key)])
                ids[key] = (await writer.search_messages(ALICE, query_terms(text)))[0][0].id

            async def entity(name: str, description: str) -> None:
                ids[name] = await backend.add_entity("alice", name, "place", description)

            async def trace(key: str, task: str) -> None:
                await writer.apply([start(ALICE, key, conv=key), finish(ALICE, key, "done", conv=key, task=task,
                                                                       steps=steps)])

            writes = [
                lambda: save("t1", "the ferry to Lopud leaves at nine"),
                lambda: save("t2", "the ferry back leaves at six"),
                lambda: entity("Lopud", "a car-free island"),
                lambda: trace("r1", "count the ferry invoices"),
                lambda: save("t3", "the last ferry leaves at ten, the island sleeps"),
                lambda: writer.delete_item(ALICE, "message", ids["t2"]),
                lambda: writer.update_memory(ALICE, ids["t1"], "the bus to Lopud leaves at nine"),
                lambda: entity("Sipan", "the largest island, a ferry away"),
                lambda: writer.update_memory(ALICE, ids["Lopud"], "a quiet village"),
                lambda: trace("r2", "sum the invoices"),
                lambda: writer.delete_item(ALICE, "conversation", "r1"),
                lambda: writer.delete_item(ALICE, "entity", ids["Sipan"]),
                lambda: writer.delete_item(ALICE, "conversation", "t3"),
                lambda: save("t4", "a new ferry leaves at noon"),
            ]
            await answers(reader)
            for write in writes:
                await write()
                if cache_mb:
                    await held(reader, "alice")
                    await held(reader, "alice", entities=True)
                async with backend.opened() as fresh:
                    assert await answers(reader) == await answers(fresh)

    for cache_mb in (256, 0):
        run(body(tmp_path / f"m{cache_mb}.db", cache_mb))
