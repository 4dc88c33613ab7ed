"""The SQLite file deleted or replaced under a running `memproxy serve`.

SQLite keeps committing into a deleted file's inode, so without a check every write said
ok and vanished at the next start. The store notices (around each commit, and when /readyz
asks), says so (/readyz, the persistence-failure counter, X-Memory-Status while it lasts),
opens the path again on a new database, and the writes not yet committed land there.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.proxy_db import eventually
from tests.test_crash import start_server

pytestmark = pytest.mark.faults
USER = {"x-memory-user": "alice"}
# A recall deadline a loaded test machine does not turn into a timeout, and no longer: while a
# user's facts cannot commit, each recall first waits a quarter of it for them.
SETTINGS = {"memory_retrieval_timeout_ms": "1500", "memory_commit_timeout_ms": "200"}


@contextmanager
def serving(db: Path, upstream: str) -> Iterator[httpx.Client]:
    """`memproxy serve` on `db` in its own process; stopped (SIGTERM: it flushes its writes) on exit."""
    process, url = start_server(db, upstream, **SETTINGS)
    try:
        with httpx.Client(base_url=url, timeout=10) as http:
            yield http
    finally:
        process.terminate()
        assert process.wait(15) == 0


def chat(http: httpx.Client, text: str) -> httpx.Response:
    response = http.post("/v1/chat/completions", headers=USER,
                         json={"model": "m", "messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hello from upstream"
    return response


def metric(http: httpx.Client, name: str) -> float:
    return next(float(line.split()[1]) for line in http.get("/metrics").text.splitlines()
                if line.startswith(name + " ") or line.startswith(name + "{"))


def settled(http: httpx.Client) -> bool:
    """Every write committed, nothing left to extract (no write pending either), and all reported healthy."""
    ready = http.get("/readyz").json()
    return (ready["status"] == "ready" and ready["writes"] == "ok" and ready["extraction_queue"]["pending"] == 0
            and metric(http, 'memproxy_queue_depth{queue="writes"}') == 0)


def saved(db: Path) -> tuple[list[tuple[str, str]], list[tuple[str, int]]]:
    """(role, text) of every message, oldest first, and the turns per status, read from the file itself."""
    with closing(sqlite3.connect(db)) as check:
        messages = check.execute("SELECT role, content FROM messages ORDER BY seq").fetchall()
        statuses = check.execute("SELECT status, count(*) FROM turns GROUP BY status").fetchall()
    return messages, statuses


def conversation(texts: list[str]) -> list[tuple[str, str]]:
    return [message for text in texts for message in (("user", text), ("assistant", "Hello from upstream"))]


def remove_files(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        os.remove(f"{db}{suffix}")


# While the store reopens, recall says so; five failures in a row open the circuit breaker,
# which stays open for the rest of these few seconds. A status never goes back to failing.
STATUSES = re.compile(r"(ok )*((unavailable ){0,4}|(unavailable ){5}(circuit )*)(ok )*")
SHORT = {"ok": "ok", "degraded: store unavailable": "unavailable", "degraded: circuit open": "circuit"}


def test_files_deleted_while_running_are_made_again_and_keep_every_turn_sent_since(fake, tmp_path):
    db = tmp_path / "memproxy.db"
    after = [f"turn {n} after the files were deleted" for n in range(10)]
    with serving(db, fake.url) as http:
        assert chat(http, "before the files were deleted").headers["x-memory-status"] == "ok"
        assert eventually(lambda: settled(http))
        assert metric(http, "memproxy_persistence_failures_total") == 0
        remove_files(db)
        statuses = [chat(http, text).headers["x-memory-status"] for text in after]
        assert STATUSES.fullmatch("".join(SHORT[status] + " " for status in statuses)), statuses
        # The first commit after the deletion found it: counted, whatever else failed after.
        assert metric(http, "memproxy_persistence_failures_total") >= 1
        # Five recalls in a row that found the store unavailable open the breaker for 15 s.
        assert eventually(lambda: settled(http), timeout=30)
        assert db.exists()
    with serving(db, fake.url):  # a restart: the turns are in the file, not in a deleted inode
        messages, statuses_saved = saved(db)
    assert messages == conversation(after)
    assert statuses_saved == [("complete", 10)]


def test_turns_sent_at_once_while_the_files_go_all_land_in_the_new_file(fake, tmp_path):
    # Ten at once: their writes share batches, some queued behind the one that finds the loss.
    db = tmp_path / "memproxy.db"
    after = [f"turn {n} sent at once" for n in range(10)]
    with serving(db, fake.url) as http:
        chat(http, "before the files were deleted")
        assert eventually(lambda: settled(http))
        remove_files(db)
        with ThreadPoolExecutor(len(after)) as pool:
            statuses = list(pool.map(lambda text: chat(http, text).headers["x-memory-status"], after))
        assert set(statuses) <= set(SHORT), statuses
        assert metric(http, "memproxy_persistence_failures_total") >= 1
        # Five recalls in a row that found the store unavailable open the breaker for 15 s.
        assert eventually(lambda: settled(http), timeout=30)
    with serving(db, fake.url):
        messages, statuses_saved = saved(db)
    assert sorted(messages) == sorted(conversation(after))
    assert statuses_saved == [("complete", 10)]


def test_readyz_finds_the_files_deleted_while_idle_and_the_store_opens_again(fake, tmp_path):
    db = tmp_path / "memproxy.db"
    with serving(db, fake.url) as http:
        chat(http, "before the files were deleted")
        assert eventually(lambda: settled(http))
        remove_files(db)
        ready = http.get("/readyz")
        assert ready.status_code == 200  # requests still succeed without memory
        assert ready.json()["status"] == "degraded: memory_store_unavailable"
        assert ready.json()["store"] == "unavailable"
        assert metric(http, "memproxy_persistence_failures_total") == 1
        assert eventually(lambda: settled(http))
        assert chat(http, "after the store opened again").headers["x-memory-status"] == "ok"
        assert eventually(lambda: settled(http))
    with serving(db, fake.url):
        assert saved(db) == (conversation(["after the store opened again"]), [("complete", 1)])


def test_a_deleted_directory_leaves_memory_degraded_until_it_exists_again(fake, tmp_path):
    directory = tmp_path / "data"
    directory.mkdir()
    db = directory / "memproxy.db"
    during = [f"turn {n} while the directory is gone" for n in range(3)]
    with serving(db, fake.url) as http:
        chat(http, "before the directory was deleted")
        assert eventually(lambda: settled(http))
        shutil.rmtree(directory)
        assert http.get("/readyz").json()["store"] == "unavailable"
        # The store cannot make a file where there is no directory (nor makes the directory:
        # an unmounted volume's mount point is no place for the data), so it stays unavailable.
        statuses = [chat(http, text).headers["x-memory-status"] for text in during]
        assert statuses == ["degraded: store unavailable"] * 3
        ready = http.get("/readyz").json()
        assert (ready["status"], ready["store"], ready["writes"]) == (
            "degraded: memory_store_unavailable, memory_writes_failing", "unavailable", "failing")
        assert metric(http, 'memproxy_queue_depth{queue="writes"}') > 0
        assert metric(http, "memproxy_persistence_failures_total") >= 2  # the file lost, a batch failed
        directory.mkdir()
        assert eventually(lambda: settled(http), timeout=20)
    with serving(db, fake.url):
        assert saved(db) == (conversation(during), [("complete", 3)])


def test_a_backup_renamed_over_the_file_becomes_the_store(fake, tmp_path):
    db, backup = tmp_path / "memproxy.db", tmp_path / "backup.db"
    with serving(db, fake.url) as http:
        chat(http, "kept in the backup")
        assert eventually(lambda: settled(http))
        with closing(sqlite3.connect(db)) as live, closing(sqlite3.connect(backup)) as copy:
            live.backup(copy)
        chat(http, "only in the file the backup replaced")
        assert eventually(lambda: settled(http))
        os.replace(backup, db)
        statuses = [chat(http, f"turn {n} after the restore").headers["x-memory-status"] for n in range(3)]
        assert STATUSES.fullmatch("".join(SHORT[status] + " " for status in statuses)), statuses
        assert metric(http, "memproxy_persistence_failures_total") >= 1
        # Five recalls in a row that found the store unavailable open the breaker for 15 s.
        assert eventually(lambda: settled(http), timeout=30)
    with serving(db, fake.url):
        messages, statuses_saved = saved(db)
    assert messages == conversation(["kept in the backup", *[f"turn {n} after the restore" for n in range(3)]])
    assert statuses_saved == [("complete", 4)]


def test_a_deleted_wal_is_found_and_nothing_committed_is_lost(fake, tmp_path):
    # SQLite fails new connections and checkpoints with I/O errors once its WAL is deleted,
    # while the open write connection goes on committing into the deleted one. Closing every
    # connection copies that WAL into the database, which stayed, before the path is opened again.
    db = tmp_path / "memproxy.db"
    texts = ["before the WAL was deleted", *[f"turn {n} after the WAL was deleted" for n in range(3)]]
    with serving(db, fake.url) as http:
        chat(http, texts[0])
        assert eventually(lambda: settled(http))
        os.remove(f"{db}-wal")
        statuses = [chat(http, text).headers["x-memory-status"] for text in texts[1:]]
        assert STATUSES.fullmatch("".join(SHORT[status] + " " for status in statuses)), statuses
        assert metric(http, "memproxy_persistence_failures_total") >= 1
        # Five recalls in a row that found the store unavailable open the breaker for 15 s.
        assert eventually(lambda: settled(http), timeout=30)
    with serving(db, fake.url):
        messages, statuses_saved = saved(db)
    assert messages == conversation(texts)
    assert statuses_saved == [("complete", 4)]
