"""A full disk: SQLite answers SQLITE_FULL to every write that needs a
new page. Chats go on, /readyz says writes are failing, and once there is room again the
turns written meanwhile land without a restart."""

from __future__ import annotations

import re

import gc
from typing import Any

from tests.proxy_db import eventually, rows

UNLIMITED_PAGES = 1_073_741_823
USER = {"x-memory-user": "alice"}
# Enough text that every turn needs new pages, as a full disk would refuse them: words, not one
# 8000-letter token, which costs the tokenizer a second or more a request on a busy machine.
FILLER = " x" * 4000
# While a user's facts cannot commit, each recall first waits a quarter of the retrieval budget for
# them: conftest's generous 5 s made that 1.25 s a chat. No test here asserts the memory status.
RECALL = {"memory__retrieval_timeout_ms": 1000}


def limit_pages(proxy: Any, pages: int | None) -> int:
    """Cap the database at its current size (None) or at `pages`, on the store's own write connection.

    max_page_count holds per connection, so it is set where the writes happen: the writer thread.
    A cap at the current size first gives the free pages back (a migration that rebuilt a table
    leaves some), or writes would fill them before any needed a new page.
    """
    store = proxy.app.state.parts.store

    def cap() -> int:
        if pages is None:
            store._writer.execute("VACUUM")
        size = store._writer.execute("PRAGMA page_count").fetchone()[0]
        return int(store._writer.execute(f"PRAGMA max_page_count = {pages or size}").fetchone()[0])

    return store._write_thread.submit(cap).result(timeout=5)


def chat(proxy: Any, text: str) -> Any:
    with proxy.http(timeout=10) as http:
        return http.post("/v1/chat/completions", headers=USER,
                         json={"model": "m", "messages": [{"role": "user", "content": text}]})


def readiness(proxy: Any) -> dict[str, Any]:
    with proxy.http() as http:
        return http.get("/readyz").json()


def writes_queued(proxy: Any) -> float:
    """The write queue's depth as /metrics shows it: set after each commit, so 0 once all landed."""
    with proxy.http() as http:
        return next(float(line.split()[1]) for line in http.get("/metrics").text.splitlines()
                    if line.startswith('memproxy_queue_depth{queue="writes"}'))


def test_a_full_disk_fails_no_chat_and_loses_no_turn_once_there_is_room(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=200, **RECALL)
    assert chat(proxy, "before the disk filled up").status_code == 200
    assert eventually(lambda: len(rows(proxy, "SELECT 1 FROM messages")) == 2)
    limit_pages(proxy, None)
    during = [f"turn {n} while the disk is full" + FILLER for n in range(5)]
    responses = [chat(proxy, text) for text in during]
    assert [r.status_code for r in responses] == [200] * 5
    assert all(r.json()["choices"][0]["message"]["content"] == "Hello from upstream" for r in responses)
    assert eventually(lambda: readiness(proxy)["writes"] == "failing")
    assert readiness(proxy)["status"] == "degraded: memory_writes_failing"
    assert rows(proxy, "SELECT count(*) FROM messages WHERE content LIKE 'turn %'") == [(0,)]
    limit_pages(proxy, UNLIMITED_PAGES)
    assert eventually(lambda: rows(proxy, "SELECT count(*) FROM messages WHERE role = 'user'") == [(6,)], timeout=20)
    assert eventually(lambda: readiness(proxy)["writes"] == "ok")
    assert readiness(proxy)["status"] == "ready"
    saved = {content for (content,) in rows(proxy, "SELECT content FROM messages WHERE role = 'user'")}
    assert saved == {"before the disk filled up", *during}
    assert rows(proxy, "SELECT count(*) FROM turns WHERE status = 'complete'") == [(6,)]


def test_an_overflowing_write_queue_counts_and_logs_the_turns_it_dropped(make_proxy, fake, caplog):
    # No loss is silent: the drop counter and the log say exactly how many turns were dropped.
    proxy = make_proxy(memory__commit_timeout_ms=50, memory__write_queue_size=4, **RECALL)
    assert chat(proxy, "before the disk filled up").status_code == 200
    assert eventually(lambda: len(rows(proxy, "SELECT 1 FROM messages")) == 2)
    limit_pages(proxy, None)
    during = [f"turn {n} while the disk is full" + FILLER for n in range(10)]
    turns = [chat(proxy, text).headers["x-memory-turn"] for text in during]
    limit_pages(proxy, UNLIMITED_PAGES)
    assert eventually(lambda: readiness(proxy)["writes"] == "ok", timeout=20)
    # Writes are ok once the batch that kept failing lands; what queued behind it lands after, and then the
    # extraction worker's results for the messages that landed, a batch at a time: one may fill the queue
    # again (those it drops are handed back and retried). Read once the last of them committed: until then
    # a write still arriving may be dropped, and an overflow begun after a read of the depth not yet logged.
    assert eventually(lambda: rows(proxy, "SELECT count(*) FROM extraction_queue WHERE parked = 0") == [(0,)],
                      timeout=20)
    assert eventually(lambda: writes_queued(proxy) == 0, timeout=20)
    with proxy.http() as http:
        metrics = {line.split()[0]: float(line.split()[1]) for line in http.get("/metrics").text.splitlines()
                   if line.startswith("memproxy_") and "dropped" in line}
    whole = {key for (key,) in rows(proxy, "SELECT t.turn_key FROM turns t WHERE t.status = 'complete' AND"
                                          " (SELECT count(*) FROM messages m WHERE m.turn_key = t.turn_key) = 2")}
    lost = [turn for turn in turns if turn not in whole]  # a turn missing its status, question or answer
    assert lost and metrics["memproxy_turns_dropped_total"] == len(lost)
    dropped = int(metrics["memproxy_writes_dropped_total"])
    assert dropped >= len(lost)
    # Logged when it began and when it ended, with the counts: not once per write (under load, hundreds a second).
    messages = [r.getMessage() for r in caplog.records if r.name == "memproxy.writer"]
    # Once a time it filled (the chats' turns while the disk was full, the extraction results after), each
    # time with its counts.
    began = [m for m in messages if m.startswith("write queue full")]
    drained = [re.fullmatch(r"write queue drained: (\d+) writes dropped while it was full, \d+ turns lost a write"
                            r" \(turns that lost a write so far: (\d+)\)", m)
               for m in messages if m.startswith("write queue drained")]
    assert began and all(m.startswith("write queue full (4 writes): dropping new writes until it drains")
                         for m in began)
    assert len(drained) == len(began) and all(drained)
    assert sum(int(m[1]) for m in drained if m) == dropped
    assert drained[-1] and int(drained[-1][2]) == len(lost)


def test_a_full_write_queue_leaves_no_task_exception_unretrieved(make_proxy, fake, caplog):
    # Short messages have their facts written beside the turn, and the answer's end waits for both.
    # With the queue full both writes are refused; the step ends anyway, and what was waiting on them
    # must take the refusal: asyncio logs each task whose exception nobody retrieved, once per request.
    # What earlier tests left for the collector (asyncpg leaves a future unretrieved when a connect
    # is cut during its SSL exchange) is reported now, not in this test's records.
    gc.collect()
    caplog.clear()
    proxy = make_proxy(memory__commit_timeout_ms=50, memory__write_queue_size=4, **RECALL)
    assert chat(proxy, "before the disk filled up").status_code == 200
    assert eventually(lambda: len(rows(proxy, "SELECT 1 FROM messages")) == 2)
    limit_pages(proxy, None)
    statuses = [chat(proxy, f"My editor is Helix {n} and I live in Porto." + FILLER[:1500]).status_code
                for n in range(10)]
    limit_pages(proxy, UNLIMITED_PAGES)
    assert eventually(lambda: writes_queued(proxy) == 0, timeout=20)
    proxy.stop()
    gc.collect()  # a task's exception is reported when the task is collected
    assert statuses == [200] * 10
    unretrieved = [r.getMessage() for r in caplog.records if "exception was never retrieved" in r.getMessage()]
    assert unretrieved == []
    assert len([r for r in caplog.records if r.getMessage().startswith("write queue full")]) == 1
