"""Two proxy replicas on one store: one memory, shared.

Both replicas are real proxies (uvicorn, the official openai client) with the same
store.url, in front of one scripted upstream: a fresh schema on the session's PostgreSQL
server, or one SQLite file in WAL mode (as the worker processes of one `memproxy serve`
share it). Each replica has its own store object, connections and in-process caches, as a
process of its own has. A load balancer is played by the test: it picks the replica for
each request.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from typing import Any

import httpx
import openai
import pytest

from proxy.memory.breaker import CircuitBreaker
from tests.api_helpers import api_url
from tests.conftest import RunningProxy
from tests.test_crash import start_server
from tests.fake_responses import output, response
from tests.fake_upstream import (
    FakeUpstream,
    JsonReply,
    Received,
    Reply,
    SlowHeaders,
    SSEReply,
    completion,
    default_reply,
    stream_events,
)
from tests.test_hooks import HookServer, hook_server, with_hooks  # noqa: F401 (fixtures)
from tests.test_wire_openai_responses import FACT, HEADER, QUESTION
from tests.test_wire_openai_responses import client as responses_client
from tests.test_wire_openai_responses import sent as responses_sent
from tests.pg_server import PostgresServer
from tests.proxy_db import eventually
from tests.store_backends import Backend, PostgresBackend, SQLiteBackend

USER = {"X-Memory-User": "alice"}


# A generous commit wait makes "saved before the response ends" deterministic, so the
# next request may go to the other replica; a generous retrieval deadline keeps a loaded
# test machine from turning a lookup into a timeout (these tests are about correctness).
PATIENT = {"memory__commit_timeout_ms": 5000, "memory__retrieval_timeout_ms": 5000}


class Shared:
    """The store the replicas share: its store.url, and raw reads of its tables (`?` placeholders)."""

    def __init__(self, backend: Backend, url: str) -> None:
        self.backend = backend
        self.url = url

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Rows of one query on the shared database."""
        return asyncio.run(self.backend.sql(sql, *args))


@pytest.fixture(params=["sqlite", "postgres"])
def shared(request: pytest.FixtureRequest, tmp_path: Any) -> Shared:
    """One SQLite file, then one PostgreSQL schema."""
    if request.param == "sqlite":
        return Shared(SQLiteBackend(tmp_path / "shared.db"), f"sqlite:///{tmp_path}/shared.db")
    url = request.getfixturevalue("pg_url")
    return Shared(PostgresBackend(url), url)


@pytest.fixture
def replicas(shared: Shared, make_proxy: Any) -> tuple[RunningProxy, RunningProxy]:
    """Two replicas sharing one store."""
    return make_proxy(store__url=shared.url, **PATIENT), make_proxy(store__url=shared.url, **PATIENT)


def rows(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of one query on a PostgreSQL database."""
    return asyncio.run(PostgresBackend(url).sql(sql, *args))


def last_user_content(fake: FakeUpstream) -> str:
    """The last user message of the last chat request the upstream received."""
    messages = json.loads(fake.chat_requests()[-1].body)["messages"]
    return str([m for m in messages if m["role"] == "user"][-1]["content"])


def tool_step(step: int) -> tuple[JsonReply, list[dict[str, Any]]]:
    """An upstream reply calling a tool, and the messages the client adds for it."""
    call = {"id": f"call_{step}", "type": "function", "function": {"name": "lookup", "arguments": f'{{"n": {step}}}'}}
    reply = JsonReply(completion("checking", tool_calls=[{"id": call["id"], "name": "lookup",
                                                         "arguments": call["function"]["arguments"]}]))
    return reply, [{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": call["id"], "content": f"result {step}"}]


def test_tool_loop_alternating_replicas_saves_once_and_carries_one_block(
        replicas: tuple[RunningProxy, RunningProxy], fake: FakeUpstream, shared: Shared) -> None:
    a, b = replicas
    token = secrets.token_hex(5).upper()
    a.client(**USER, **{"X-Memory-Conversation": "teach"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": f"The weather station id is {token}."}])
    fake.reset()
    question = "What is the weather station id?"
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    turns, sent = [], []
    for step, proxy in enumerate([a, b, a, b]):
        final = step == 3
        reply, added = tool_step(step)
        fake.queue(JsonReply(completion("Station " + token)) if final else reply)
        raw = proxy.client(**USER).chat.completions.with_raw_response.create(model="m", messages=messages)
        assert raw.headers["x-memory-status"] == "ok"
        turns.append(raw.headers["x-memory-turn"])
        sent.append(last_user_content(fake))
        messages += [] if final else added
    assert len(set(turns)) == 1  # one turn, whichever replica served the step
    assert token in sent[0] and sent == [sent[0]] * 4  # one block, byte for byte on every step
    saved = shared.rows("SELECT role, content FROM messages WHERE conversation_id <> 'teach' ORDER BY seq")
    assert saved == [("user", question), ("assistant", "Station " + token)]
    assert shared.rows("SELECT count(*), min(status) FROM turns WHERE turn_key = ?", turns[0]) == [(1, "complete")]
    (steps,), = shared.rows("SELECT steps FROM reasoning")
    assert [s["result"] for s in json.loads(steps)] == ["result 0", "result 1", "result 2"]


def test_what_one_replica_learns_the_other_injects(replicas: tuple[RunningProxy, RunningProxy],
                                                   fake: FakeUpstream) -> None:
    facts = [("My locker code at the gym is {t}.", "What is my gym locker code?"),
             ("The staging database host is {t}.internal.example.", "Which host runs the staging database?"),
             ("My library card number is {t}.", "What's my library card number?"),
             ("The bakery promo code is {t}.", "Do you remember the bakery promo code?")]
    tokens = [secrets.token_hex(5).upper() for _ in facts]
    for i, ((fact, _), token) in enumerate(zip(facts, tokens)):
        teacher = replicas[i % 2]
        teacher.client(**USER, **{"X-Memory-Conversation": f"teach-{i}"}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": fact.format(t=token)}])
    for i, ((_, question), token) in enumerate(zip(facts, tokens)):
        asker = replicas[(i + 1) % 2]  # never the replica that was taught
        raw = asker.client(**USER, **{"X-Memory-Conversation": f"ask-{i}"}).chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": question}])
        assert raw.headers["x-memory-status"] == "ok"
        assert token in last_user_content(fake), question


def test_fifty_concurrent_turns_over_both_replicas_lose_nothing_and_save_nothing_twice(
        replicas: tuple[RunningProxy, RunningProxy], fake: FakeUpstream, shared: Shared) -> None:
    def text(i: int) -> str:
        return f"message {i} from user{i % 10}"

    async def one(i: int, proxy: RunningProxy) -> str:
        client = proxy.async_client(**{"X-Memory-User": f"user{i % 10}"})
        try:
            if i % 3 == 0:
                stream = await client.chat.completions.create(
                    model="m", stream=True, messages=[{"role": "user", "content": text(i)}])
                async for _ in stream:
                    pass
                return ""
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": text(i)}])
            return str(raw.headers["x-memory-turn"])
        finally:
            await client.close()

    async def load() -> list[str]:
        return list(await asyncio.gather(*(one(i, replicas[i % 2]) for i in range(50))))

    async def retry(indexes: list[int]) -> list[str]:
        return list(await asyncio.gather(*(one(i, replicas[(i + 1) % 2]) for i in indexes)))

    first = asyncio.run(load())
    # A client retry that a load balancer sends to the other replica is the same turn.
    retried = [i for i in range(50) if i % 3 and i < 20]
    again = asyncio.run(retry(retried))
    assert again == [first[i] for i in retried]
    user_rows = shared.rows("SELECT user_id, content FROM messages WHERE role = 'user'")
    assert sorted(content for _, content in user_rows) == sorted(text(i) for i in range(50))
    assert all(content.endswith(f"from {user}") for user, content in user_rows)
    assert shared.rows("SELECT count(*) FROM messages WHERE role = 'assistant'") == [(50,)]
    assert shared.rows("SELECT count(*) FROM turns WHERE status = 'complete'") == [(50,)]


def _fast_breaker(proxy: RunningProxy) -> None:
    """A circuit that retries the store after half a second, not 15, to keep the test short."""
    parts = proxy.app.state.parts
    parts.memory.breaker = CircuitBreaker(parts.metrics, open_for_s=0.5)


def _ask(proxy: RunningProxy, text: str) -> tuple[int, str]:
    raw = proxy.client(**USER).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}])
    return raw.status_code, raw.headers["x-memory-status"]


def test_database_outage_degrades_memory_and_recovers(pg_server: PostgresServer, pg_url: str, make_proxy: Any,
                                                      fake: FakeUpstream) -> None:
    # The default commit wait: an answer's commit is waited on for 100 ms, then the response goes.
    # While a user's facts cannot commit, each recall first waits a quarter of the retrieval budget
    # for them: 1.5 s keeps that short, and is still far past a loaded machine's recall.
    replicas = (make_proxy(store__url=pg_url, memory__retrieval_timeout_ms=1500),
                make_proxy(store__url=pg_url, memory__retrieval_timeout_ms=1500))
    for proxy in replicas:
        _fast_breaker(proxy)
    assert [_ask(proxy, f"before {i}") for i, proxy in enumerate(replicas)] == [(200, "ok")] * 2
    pg_server.stop()
    try:
        during = [_ask(replicas[i % 2], f"during {i}") for i in range(12)]
        with replicas[0].http() as http:
            ready = http.get("/readyz").json()
    finally:
        pg_server.start()
    assert [code for code, _ in during] == [200] * 12  # memory degraded, requests never failed
    assert all(status.startswith("degraded: ") for _, status in during), during
    # Still 200 (an orchestrator keeps the replica), saying what is degraded.
    assert ready["status"].startswith("degraded: memory_store_unavailable") and ready["store"] == "unavailable"
    for n, proxy in enumerate(replicas):
        assert eventually(lambda: _ask(proxy, f"after {n}") == (200, "ok"), timeout=20)
    expected = {f"{when} {i}" for when, count in (("before", 2), ("during", 12)) for i in range(count)}

    def all_saved() -> bool:
        saved = {content for (content,) in rows(pg_url, "SELECT content FROM messages WHERE role = 'user'")}
        return expected <= saved

    assert eventually(all_saved, timeout=20)  # writes queued during the outage landed afterwards
    assert rows(pg_url, "SELECT count(*) FROM messages WHERE role = 'user' AND content LIKE 'during%'") == [(12,)]


def test_a_replica_started_before_its_database_gets_memory_without_a_restart(
        pg_server: PostgresServer, pg_url: str, make_proxy: Any, fake: FakeUpstream) -> None:
    pg_server.stop()
    try:
        # The default commit wait: the answer of a store that was never open goes out after 100 ms.
        proxy = make_proxy(store__url=pg_url, memory__retrieval_timeout_ms=5000)
        assert _ask(proxy, "said before the database was up") == (200, "degraded: store unavailable")
    finally:
        pg_server.start()

    def ready() -> bool:
        with proxy.http() as http:
            return bool(http.get("/readyz").json()["store"] == "ok")

    assert eventually(ready, timeout=30)
    assert eventually(lambda: rows(pg_url, "SELECT content FROM messages WHERE role = 'user'")
                      == [("said before the database was up",)], timeout=20)
    assert _ask(proxy, "and after") == (200, "ok")


def test_both_replicas_drain_one_extraction_queue_into_one_graph(
        replicas: tuple[RunningProxy, RunningProxy], fake: FakeUpstream, shared: Shared) -> None:
    places = ["Lisbon", "Oslo", "Nairobi", "Quito", "Hanoi", "Tallinn", "Bergen", "Seville"]
    for i, place in enumerate(places):  # each user taught through one replica or the other
        replicas[i % 2].client(**{"X-Memory-User": f"user{i}"}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"I live in {place}."}])
    assert eventually(lambda: shared.rows("SELECT count(*) FROM extraction_queue") == [(0,)], timeout=30)
    assert sorted(shared.rows("SELECT user_id, name FROM entities WHERE type = 'place'")) == sorted(
        (f"user{i}", place) for i, place in enumerate(places))
    assert shared.rows("SELECT count(*), count(DISTINCT user_id) FROM relationships WHERE type = 'LIVES_IN'") == [
        (8, 8)]
    fake.reset()
    replicas[1].client(**{"X-Memory-User": "user0"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Where do I live these days?"}])
    assert "-[LIVES_IN]->(Lisbon)" in last_user_content(fake)  # learnt through the other replica



# The extraction model finds nothing more here: the user's stated name comes from the rules.
NOTHING_MORE = JsonReply(completion(json.dumps({"entities": [], "relationships": []})))


def _is_extraction_of(request: Received, text: str) -> bool:
    return b"response_format" in request.body and request.json()["messages"][-1]["content"] == text


def test_a_correction_never_lands_before_the_statement_another_replica_is_extracting(
        shared: Shared, make_proxy: Any, fake: FakeUpstream) -> None:
    """A rename applies in the order said: the last applied wins, whatever the messages' times."""
    statement, correction = "My name is Alice.", "Actually, my name is Alicia."
    llm = {"extraction__mode": "llm", "extraction__model": "extract-model", "extraction__api_key": "sk-own"}
    replicas = make_proxy(store__url=shared.url, **PATIENT, **llm), make_proxy(store__url=shared.url, **PATIENT, **llm)

    def answer(request: Received) -> Reply:
        # The statement's extraction is slow: the correction is queued while one replica holds it.
        if _is_extraction_of(request, statement):
            return SlowHeaders(2.0, NOTHING_MORE)
        return NOTHING_MORE if _is_extraction_of(request, correction) else default_reply(request)

    fake.queue(*[answer] * 6)
    replicas[0].client(**USER).chat.completions.create(model="m", messages=[{"role": "user", "content": statement}])
    assert eventually(lambda: any(_is_extraction_of(r, statement) for r in fake.chat_requests()), timeout=10)
    replicas[1].client(**USER).chat.completions.create(model="m", messages=[{"role": "user", "content": correction}])
    assert eventually(lambda: shared.rows("SELECT count(*) FROM extraction_queue") == [(0,)], timeout=30)
    assert [r.json()["messages"][-1]["content"] for r in fake.chat_requests() if b"response_format" in r.body] == [
        statement, correction]  # each extracted once
    assert shared.rows("SELECT name, aliases FROM entities WHERE user_id = 'alice'") == [("Alicia", '["Alice"]')]


def test_a_response_relayed_by_one_replica_is_continued_on_another(shared: Shared, make_proxy: Any,
                                                                   fake: FakeUpstream) -> None:
    first, second = (make_proxy(store__url=shared.url, memory__commit_timeout_ms=5000, extraction__from_roles=[])
                     for _ in range(2))
    fake.queue(JsonReply(response(output("Noted."), "resp_a")))
    responses_client(first).responses.create(model="gpt-test", input=FACT)
    # The fact is in the chain the provider holds for resp_a: not injected again.
    responses_client(second).responses.create(model="gpt-test", input=QUESTION, previous_response_id="resp_a")
    assert responses_sent(fake)["input"] == QUESTION
    # An id neither replica relayed: the other conversation rules, and the fact is recalled.
    responses_client(second).responses.create(model="gpt-test", input=QUESTION, previous_response_id="resp_unknown")
    recalled = responses_sent(fake)["input"]
    assert recalled.startswith(HEADER) and FACT in recalled and recalled.endswith(f"\n\n{QUESTION}")


def test_hooks_fire_once_per_turn_whichever_replica_serves_its_steps(
        shared: Shared, with_hooks: Any, fake: FakeUpstream, hook_server: HookServer) -> None:
    hooks = [{"event": "user_prompt_submit", "url": hook_server.url("/submit")},
             {"event": "stop", "url": hook_server.url("/stop")}]
    a, b = (with_hooks(hooks, **{"store.url": shared.url}) for _ in range(2))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "check the deploy"}]
    for step, proxy in enumerate([a, b, a]):
        reply, added = tool_step(step)
        fake.queue(JsonReply(completion("Deployed.")) if step == 2 else reply)
        proxy.client(**USER).chat.completions.create(model="m", messages=messages)
        messages += [] if step == 2 else added
    assert eventually(lambda: len(hook_server.inputs("/stop")) == 1)
    fake.queue(JsonReply(completion("Deployed, again.")))
    b.client(**USER).chat.completions.create(model="m", messages=messages)  # the client's retry of the last step
    assert eventually(lambda: shared.rows("SELECT count(*) FROM messages WHERE role = 'assistant'") == [(2,)])
    assert shared.rows("SELECT count(*), min(status) FROM turns") == [(1, "complete")]
    assert len(hook_server.inputs("/submit")) == 1
    assert [event["answer"] for event in hook_server.inputs("/stop")] == ["Deployed."]


def test_a_user_deleted_on_one_replica_is_never_recalled_by_the_other(
        replicas: tuple[RunningProxy, RunningProxy], fake: FakeUpstream, shared: Shared) -> None:
    a, b = replicas
    token = secrets.token_hex(5).upper()
    a.client(**USER, **{"X-Memory-Conversation": "teach"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": f"My locker code at the gym is {token}."}])
    for n in range(3):  # b recalls it, and its postings of the user are built meanwhile
        b.client(**USER, **{"X-Memory-Conversation": f"ask-{n}"}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "What is my gym locker code?"}])
        assert token in last_user_content(fake)
    if shared.backend.name == "sqlite":  # its in-memory postings hold the user
        assert eventually(lambda: b.app.state.parts.store.message_indexes.holds("alice"))
    with a.http() as http:
        http.delete(api_url("alice")).raise_for_status()
    b.client(**USER, **{"X-Memory-Conversation": "after"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What is my gym locker code?"}])
    assert last_user_content(fake) == "What is my gym locker code?"
    assert shared.rows("SELECT content FROM messages") == [("What is my gym locker code?",), ("Hello from upstream",)]


def test_a_replica_starting_leaves_the_turns_in_flight_on_another_pending(
        shared: Shared, make_proxy: Any, fake: FakeUpstream) -> None:
    """Recovery at start-up marks as interrupted only turns no live process may still serve."""
    serving = make_proxy(store__url=shared.url, **PATIENT)
    fake.queue(SSEReply(stream_events("a slow answer"), delay=0.4))

    def ask() -> None:
        for _ in serving.client(**USER).chat.completions.create(
                model="m", stream=True, messages=[{"role": "user", "content": "a slow question"}]):
            pass

    stream = threading.Thread(target=ask, daemon=True)
    stream.start()
    assert eventually(lambda: shared.rows("SELECT status FROM turns") == [("pending",)])
    make_proxy(store__url=shared.url, **PATIENT)  # another worker starts meanwhile
    assert shared.rows("SELECT status FROM turns") == [("pending",)]
    stream.join(10)
    assert eventually(lambda: shared.rows("SELECT status FROM turns") == [("complete",)])


def test_a_fact_told_on_one_replica_is_in_the_graph_the_next_request_on_the_other_recalls(
        replicas: tuple[RunningProxy, RunningProxy], fake: FakeUpstream) -> None:
    a, b = replicas
    a.client(**USER, **{"X-Memory-Conversation": "teach"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "My manager is Dana Whitfield."}])
    b.client(**USER, **{"X-Memory-Conversation": "ask"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Who is my manager?"}])
    assert "[graph] (User)-[HAS_MANAGER]->(Dana Whitfield)" in last_user_content(fake)


def test_two_serve_processes_on_one_sqlite_file_share_one_memory(tmp_path: Any, fake: FakeUpstream) -> None:
    """The same promises with `memproxy serve` twice, each a process of its own, on one file:
    what one learns the other recalls, a retry on the other is the same turn, and a user
    deleted through one is never recalled by the other (whose postings held the user)."""
    db = tmp_path / "shared.db"
    servers = [start_server(db, fake.url, memory_commit_timeout_ms="5000", memory_retrieval_timeout_ms="5000")
               for _ in range(2)]
    try:
        a, b = (openai.OpenAI(base_url=url + "/v1", api_key="sk-client-key", default_headers=USER, max_retries=0)
                for _, url in servers)
        token = secrets.token_hex(5).upper()
        taught = a.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": f"My locker code at the gym is {token}."}])
        retried = b.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": f"My locker code at the gym is {token}."}])
        assert retried.headers["x-memory-turn"] == taught.headers["x-memory-turn"]
        for _ in range(3):
            b.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is my gym locker code?"}])
            assert token in last_user_content(fake)
        httpx.delete(servers[0][1] + api_url("alice"), timeout=30).raise_for_status()
        b.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is my gym locker code?"}])
        assert last_user_content(fake) == "What is my gym locker code?"
    finally:
        for process, _ in servers:
            process.terminate()
            process.wait(10)
    # Each left the file as it stopped.
    assert asyncio.run(SQLiteBackend(db).sql("SELECT count(*) FROM processes")) == [(0,)]
