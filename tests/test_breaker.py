"""The circuit breaker opens for a store that answers nobody, never for a proxy that is merely busy.

A recall that runs out of time while other recalls succeed met load (the event loop, the
reader threads and the GIL were busy), not a broken store: it degrades its own request and
leaves the breaker alone. Timeouts while no recall succeeds for a while still open it.
"""

from __future__ import annotations

import asyncio
import json
import time

from proxy.app import Parts
from proxy.memory.chat_memory import Recall
from proxy.memory.tools import UNAVAILABLE
from proxy.models import Scope, Transcript
from proxy.identity.scope import RequestScope
from proxy.settings import load_settings
from proxy.wires.openai_chat import OpenAIChat
from tests.fake_upstream import Received, Reply, model_round
from tests.conftest import PG_HASH_KEY
from tests.pg_server import PostgresServer
from tests.proxy_db import eventually
from tests.test_memory_path import SOURCE_TABLES, tables_locked, teach

BUDGET_MS = 200
TIMEOUT = "degraded: retrieval timeout"
OPEN = "degraded: circuit open"


def chat(text: str) -> Transcript:
    parsed = OpenAIChat().parse(json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode())
    assert not isinstance(parsed, str)
    return parsed.transcript


def test_recalls_that_time_out_because_the_proxy_is_busy_leave_the_circuit_closed(tmp_path):
    # The real memory service on a real SQLite store, in one event loop as the server runs it.
    # Eight recalls start; then the event loop is kept busy past their budget, as a burst of
    # stream events or a garbage collection keeps it under load. The reader threads answer
    # meanwhile, but no recall gets back to its result in time: eight timeouts in a row. The
    # store answered the recall just before, so that is load, and the next recall is served.
    settings = load_settings(environ={}, overrides={
        "store.url": f"sqlite:///{tmp_path}/memory.db", "memory.retrieval_timeout_ms": BUDGET_MS,
        "extraction.from_roles": []})
    alice = RequestScope(Scope("alice"))

    async def scenario() -> tuple[str, list[str], bool, str]:
        parts = Parts(settings)
        await parts.start()
        try:
            memory = parts.memory
            before = (await memory.recall(alice, chat("which editor do I use?"))).status
            recalls = [asyncio.create_task(memory.recall(alice, chat(f"question {n} about my editor")))
                       for n in range(8)]
            for _ in range(3):
                await asyncio.sleep(0)  # each recall takes its turn or queues, and asks the store
            time.sleep(2 * BUDGET_MS / 1000)  # the event loop busy for twice the budget
            statuses = [recall.status for recall in await asyncio.gather(*recalls)]
            opened = memory.breaker.is_open
            after: Recall = await memory.recall(alice, chat("and which editor again?"))
            return before, statuses, opened, after.status
        finally:
            await parts.stop()

    before, statuses, opened, after = asyncio.run(scenario())
    assert before == "ok"
    assert statuses == [TIMEOUT] * 8
    assert not opened
    assert after == "ok"


def test_recalls_that_time_out_while_the_store_answers_nobody_open_the_circuit(make_proxy, fake, pg_url):
    # Another session locks every table a recall reads (the turn lookup's and the sources'):
    # the store takes every recall's question and answers none. Once no recall has succeeded for a while, the timeouts count
    # against the store, and after five the circuit opens: requests stop waiting on it.
    proxy = make_proxy(store__url=pg_url, memory__retrieval_timeout_ms=BUDGET_MS, extraction__from_roles=[])
    teach(proxy, "My editor is Helix.")
    with proxy.http() as http:
        assert eventually(lambda: len(http.get("/memory/v1/users/alice/conversations/teach-0/messages")
                                       .json()["data"]) == 2)  # the fact and its answer are saved
    client = proxy.client(**{"X-Memory-User": "alice", "X-Memory-Persist": "false"})

    def status(text: str) -> str:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": text}])
        assert raw.status_code == 200
        return raw.headers["x-memory-status"]

    assert status("which editor do I use?") == "ok"
    with tables_locked(pg_url, (*SOURCE_TABLES, "turns", "conversations")):
        statuses = [status(f"question {n} about my editor") for n in range(16)]
    assert OPEN in statuses
    first_open = statuses.index(OPEN)
    assert first_open >= 5  # five timeouts at least before it opened
    assert statuses[:first_open] == [TIMEOUT] * first_open
    assert statuses[first_open:] == [OPEN] * (16 - first_open)


def test_recalls_that_time_out_while_postgres_answers_reads_leave_the_circuit_closed(pg_url):
    # Load on PostgreSQL: for longer than the breaker's quiet period no recall gets back to its
    # result in time (the event loop is kept busy past their budget, round after round), while the
    # database answers the reads the requests beside them make. That is a busy proxy, not a broken
    # store: the circuit stays closed and the next recall is served. PostgreSQL told the breaker of
    # no read it answered, so such timeouts counted: 64 busy clients got memory on 0.3% of requests.
    settings = load_settings(environ={}, overrides={
        "store.url": pg_url, "store.hash_key": PG_HASH_KEY, "memory.retrieval_timeout_ms": BUDGET_MS,
        "extraction.from_roles": []})
    alice = RequestScope(Scope("alice"))

    async def scenario() -> tuple[str, list[str], bool, str]:
        parts = Parts(settings)
        await parts.start()
        try:
            memory = parts.memory
            before = (await memory.recall(alice, chat("which editor do I use?"))).status
            statuses: list[str] = []
            for round_no in range(4):  # 4 x 2 budgets: twice the quiet period of 4 budgets
                recalls = [asyncio.create_task(memory.recall(alice, chat(f"question {round_no}.{n} about my editor")))
                           for n in range(4)]
                await asyncio.sleep(0.02)  # each recall takes its turn or queues, and asks the store
                time.sleep(2 * BUDGET_MS / 1000)  # the event loop busy for twice the budget
                statuses += [recall.status for recall in await asyncio.gather(*recalls)]
                await parts.store.recent_conversations(Scope("bob"), 1)  # another request's read, answered
            opened = memory.breaker.is_open
            after: Recall = await memory.recall(alice, chat("and which editor again?"))
            return before, statuses, opened, after.status
        finally:
            await parts.stop()

    before, statuses, opened, after = asyncio.run(scenario())
    assert before == "ok"
    assert statuses == [TIMEOUT] * 16
    assert not opened
    assert after == "ok"


def test_memory_calls_against_a_failing_store_open_the_circuit_and_stop_waiting_on_it(
        make_proxy, fake, pg_server: PostgresServer, pg_url: str):
    # Tools mode: the request began with its store up (the model is offered the memory tools);
    # then the database goes down while the model answers. Each query_memory that finds it
    # failing counts as a failing recall does; five open the circuit, and the next calls get
    # their error at once instead of waiting on the store (a store_memory is not queued), as
    # does the next request's recall.
    proxy = make_proxy(store__url=pg_url, memory__retrieval_timeout_ms=2000, extraction__from_roles=[])
    tools = {"X-Memory-User": "alice", "X-Memory-Mode": "tools"}
    calls = [{"id": f"call_q{n}", "name": "query_memory", "arguments": json.dumps({"query": f"editor {n}"})}
             for n in range(6)]
    calls.append({"id": "call_s1", "name": "store_memory", "arguments": json.dumps({"content": "Likes Helix",
                                                                                    "type": "fact"})})

    def stopped_first(request: Received) -> Reply:
        pg_server.stop()
        return model_round(None, calls)(request)

    def ask(text: str) -> tuple[str, str]:
        raw = proxy.client(**tools).chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": text}])
        return raw.headers["x-memory-status"], raw.parse().choices[0].message.content

    assert ask("hello") == ("ok", "Hello from upstream")  # the store is up, and its pool warm
    fake.queue(stopped_first, model_round("I could not look it up."))
    try:
        during = ask("which editor do I like?")
        after = ask("and now?")
    finally:
        pg_server.start()
    assert during == ("ok", "I could not look it up.")
    results = [m["content"] for m in fake.chat_requests()[2].json()["messages"] if m["role"] == "tool"]
    assert results == ["Error: query_memory failed; go on without it."] * 5 + [UNAVAILABLE] * 2
    assert after == (OPEN, "Hello from upstream")
    assert "tools" not in fake.chat_requests()[-1].json()  # memory is off for the request: no tools offered


def test_memory_calls_that_time_out_while_the_store_answers_nobody_open_the_circuit(make_proxy, fake, pg_url):
    # Another session locks every table a search reads, not those the turn lookup reads: the
    # request gets its tools, then each query_memory runs out of its budget. As with recalls,
    # the first timeouts are a store that may be busy; once it has answered nothing for a
    # while they count, and after five the circuit opens: the calls left get their error at once.
    proxy = make_proxy(store__url=pg_url, memory__retrieval_timeout_ms=BUDGET_MS, extraction__from_roles=[])
    tools = {"X-Memory-User": "alice", "X-Memory-Mode": "tools", "X-Memory-Persist": "false"}
    calls = [{"id": f"call_q{n}", "name": "query_memory", "arguments": json.dumps({"query": f"editor {n}"})}
             for n in range(14)]
    client = proxy.client(**tools)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])  # a warm pool
    fake.queue(model_round(None, calls), model_round("I could not look it up."))
    with tables_locked(pg_url, SOURCE_TABLES):
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "which editor do I like?"}])
    assert raw.headers["x-memory-status"] == "ok"
    results = [m["content"] for m in fake.chat_requests()[-1].json()["messages"] if m["role"] == "tool"]
    timed_out = results.count("Error: query_memory timed out; go on without it.")
    # At least four budgets of silence before a timeout counts, then five counted ones.
    assert 9 <= timed_out < len(calls), results
    assert results == ["Error: query_memory timed out; go on without it."] * timed_out + \
        [UNAVAILABLE] * (len(calls) - timed_out)
