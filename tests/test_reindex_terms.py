"""`memproxy reindex --terms`: items indexed by the tokeniser before a7a6971 (ASCII words only) are found again.

Each test saves items through the store's own writes, then rewrites their stored terms as
a memproxy before a7a6971 wrote them (its tokeniser is reproduced below), so the store's
triggers index them as it did; then the real command runs on the real store: a SQLite file
and a PostgreSQL schema. Carol holds a copy of the same items saved afterwards, as this
memproxy saves them: what the command leaves must search exactly as her copy does.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import sys
import threading
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import snowballstemmer

from proxy.cli import main
from proxy.models import ReasoningStep, Scope
from proxy.stores.sqlite import search as sqlite_search
from proxy.stores.base import FinishTurn, ReindexedPage, StartTurn, Store
from proxy.stores.indexed_text import INDEX_MAX_CHARS, context_terms, entity_terms
from proxy.terms import query_terms
from tests import store_backends
from tests.store_backends import Backend, PostgresBackend, SQLiteBackend

backend = store_backends.backend  # the fixture: each test taking it runs on SQLite, then on PostgreSQL

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)

# --- the tokeniser before a7a6971 (proxy/terms.py at a7a6971^): ASCII words only -------------

_OLD_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]*[A-Za-z0-9]|[A-Za-z0-9]")
_OLD_PART = re.compile(r"[A-Za-z0-9]+")
_OLD_CAMEL = re.compile(r"[a-z]+[A-Z]")
_OLD_SEPARATORS = re.compile(r"[_.:/@+-]")
_OLD_STEMMER = snowballstemmer.stemmer("english")
_OLD_MAX_TERM = 128


def _old_stem(word: str) -> str:
    return word if len(word) < 4 or not word.isalpha() else _OLD_STEMMER.stemWord(word)


def _old_is_identifier(token: str) -> bool:
    return bool(_OLD_SEPARATORS.search(token) or _OLD_CAMEL.search(token)) or (
        any(c.isdigit() for c in token) and any(c.isalpha() for c in token))


def old_index_terms(text: str) -> str:
    """indexed_text.index_terms as it was: the old index_text of the text's first INDEX_MAX_CHARS."""
    out: list[str] = []
    for token in _OLD_TOKEN.findall(text[:INDEX_MAX_CHARS]):
        parts = _OLD_PART.findall(token)
        if len(parts) > 1 or _old_is_identifier(token):
            out.append(_OLD_SEPARATORS.sub("_", token.lower())[:_OLD_MAX_TERM])
            if len(parts) == 1:
                continue
        out.extend(_old_stem(part.lower()[:_OLD_MAX_TERM]) for part in parts)
    return " ".join(out)


# --- the items ---------------------------------------------------------------------------

# (conversation, user's text, answer); the last turn of "trip" called a tool.
TURNS = [
    ("trip", "Мой сервер находится в Берлине", "Понятно: сервер стоит в Берлине."),
    ("trip", "What else should I know?", "The café on Rue Cler opens at seven."),
    ("trip", "Где ужинать?", "Кафе «Ромашка» открыто до полуночи."),
    ("home", "Ich wohne in München", "München ist schön im Herbst."),
    ("plain", "Deploy the build at noon", "Sure, noon it is."),
]
TRACE = ("найти кафе", (ReasoningStep("поиск_кафе", '{"город": "Париж"}', "Кафе «Ромашка»"),))
# (name, type, description, aliases)
ENTITIES = [("Санкт-Петербург", "город", "Город на Неве, где живёт сестра", ["Питер"]),
            ("Deploy window", "schedule", "Builds go out at noon", [])]
# Every message but the two of "plain" (ASCII, and only ASCII before them) is indexed differently now:
# "What else should I know?" by its context.
CHANGED = {"messages": 8, "entities": 1, "reasoning": 1}
UNCHANGED = {"messages": 2, "entities": 1, "reasoning": 0}
QUERIES = ["Где мой сервер?", "what about the café?", "кафе Ромашка", "Питер", "сестра", "München", "noon",
           "what should I know about the server"]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def turn_ops(user: str) -> list[StartTurn | FinishTurn]:
    scope = Scope(user)
    ops: list[StartTurn | FinishTurn] = []
    for n, (conversation, question, answer) in enumerate(TURNS):
        at = T0 + timedelta(minutes=n)
        task, steps = TRACE if n == 2 else ("", ())
        ops += [StartTurn(scope, f"{user}-t{n}", conversation, f"h{n}", at, question),
                FinishTurn(scope, f"{user}-t{n}", conversation, answer, at + timedelta(seconds=1), task, steps)]
    return ops


async def save_items(backend: Backend, user: str) -> None:
    """The items, saved as this memproxy saves them."""
    async with backend.opened() as store:
        await store.apply(turn_ops(user))
    zero = backend.stamp(T0)
    for n, (name, type_, description, aliases) in enumerate(ENTITIES):
        await backend.sql(
            "INSERT INTO entities (id, user_id, name, canonical_name, type, description, aliases, name_terms,"
            " type_terms, description_terms, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            f"{user}-e{n}", user, name, name.lower(), type_, description, json.dumps(aliases),
            *entity_terms(name, type_, description, aliases), zero, zero)


async def write_old_terms(backend: Backend, user: str) -> None:
    """The user's stored terms as a memproxy before a7a6971 wrote them (the triggers index them so)."""
    before: dict[str, list[str]] = {}
    for seq, conversation, content in await backend.sql(
            "SELECT seq, conversation_id, content FROM messages WHERE user_id = ? ORDER BY created_at, seq", user):
        terms = old_index_terms(content)
        earlier = before.setdefault(conversation, [])
        await backend.sql("UPDATE messages SET terms = ?, context = ? WHERE seq = ?",
                          terms, context_terms(earlier[-2:]), seq)
        earlier.append(terms)
    for seq, name, type_, description, aliases in await backend.sql(
            "SELECT seq, name, type, description, aliases FROM entities WHERE user_id = ?", user):
        await backend.sql("UPDATE entities SET name_terms = ?, type_terms = ?, description_terms = ? WHERE seq = ?",
                          old_index_terms(" ".join([name, *json.loads(aliases)])), old_index_terms(type_),
                          old_index_terms(description), seq)
    for seq, task, steps, answer in await backend.sql(
            "SELECT seq, task, steps, answer FROM reasoning WHERE user_id = ?", user):
        calls = [f"{s['name']} {s['arguments']} {s['result']}" for s in json.loads(steps)]
        await backend.sql("UPDATE reasoning SET terms = ? WHERE seq = ?",
                          old_index_terms(" ".join([task, *calls, answer])), seq)


async def old_world(backend: Backend) -> None:
    """Alice and Bob saved before a7a6971; Carol, the same items, saved now."""
    for user in ("alice", "bob", "carol"):
        await save_items(backend, user)
    for user in ("alice", "bob"):
        await write_old_terms(backend, user)


async def searches(store: Store, user: str) -> dict[str, list[tuple[str, float]]]:
    """What each query finds of the user's messages, entities and traces, with the scores."""
    scope, found = Scope(user), {}
    for query in QUERIES:
        terms = query_terms(query)
        found[query] = ([(m.content, score) for m, score in await store.search_messages(scope, terms)]
                        + [(e.name, score) for e, score in await store.search_entities(scope, terms)]
                        + [(t.task, score) for t, score in await store.search_reasoning(scope, terms)])
    return found


async def stored_terms(backend: Backend, user: str) -> list[tuple[Any, ...]]:
    """The user's terms columns, item by item, in an order every user's copy shares."""
    return [*await backend.sql("SELECT conversation_id, created_at, role, terms, context FROM messages"
                               " WHERE user_id = ? ORDER BY created_at, role", user),
            *await backend.sql("SELECT name, name_terms, type_terms, description_terms FROM entities"
                               " WHERE user_id = ? ORDER BY name", user),
            *await backend.sql("SELECT task, terms FROM reasoning WHERE user_id = ?", user)]


async def statistics(backend: Backend, user: str) -> list[tuple[Any, ...]]:
    """What BM25 counts for the user: on PostgreSQL the user's own statistics; on SQLite, whose counts
    span the file, the check that each index holds exactly what its table's terms columns say."""
    if isinstance(backend, SQLiteBackend):
        checks: list[tuple[Any, ...]] = []
        with closing(sqlite3.connect(backend.path)) as db:
            for index in (sqlite_search.MESSAGES, sqlite_search.ENTITIES, sqlite_search.REASONING):
                db.execute(f"INSERT INTO {index.fts}({index.fts}, rank) VALUES ('integrity-check', 1)")
                rows = db.execute(f"SELECT count(*) FROM {index.table}").fetchone()[0]
                checks.append((index.table, rows, sqlite_search.indexed_rows(db, index)))  # BM25's N
        assert all(rows == indexed for _, rows, indexed in checks)
        return checks
    return [*await backend.sql("SELECT kind, term, sum(docs), sum(finding) FROM term_stats WHERE user_id = ?"
                               " GROUP BY kind, term HAVING sum(docs) <> 0 ORDER BY kind, term", user),
            *await backend.sql("SELECT kind, sum(docs), sum(tokens) FROM lexicon_stats WHERE user_id = ?"
                               " GROUP BY kind ORDER BY kind", user)]


def store_url(backend: Backend) -> str:
    return f"sqlite:///{backend.path}" if isinstance(backend, SQLiteBackend) else backend.url  # type: ignore[attr-defined]


def reindex(backend: Backend, tmp_path: Path, capsys: Any, *args: str) -> dict[str, Any]:
    """`memproxy reindex --terms ARGS` on the backend's database: its summary."""
    config = tmp_path / "reindex.yaml"
    config.write_text(json.dumps({"store": {"url": store_url(backend)}}))
    assert main(["reindex", "--terms", "--config", str(config), *args]) == 0
    out = capsys.readouterr()
    return dict(json.loads(out.out))


def test_reindex_terms_finds_what_the_old_tokeniser_left_out(backend: Backend, tmp_path: Path, capsys: Any) -> None:
    async def before() -> tuple[Any, ...]:
        await old_world(backend)
        async with backend.opened() as store:
            old, fresh = await searches(store, "alice"), await searches(store, "carol")
        return old, fresh, await stored_terms(backend, "bob")

    old, fresh, bobs = run(before())
    assert {query: sorted(found for found, _ in hits) for query, hits in old.items() if hits} == {
        "noon": ["Deploy the build at noon", "Deploy window", "Sure, noon it is."],
        "what should I know about the server": ["What else should I know?"]}
    assert {query: sorted(found for found, _ in hits) for query, hits in fresh.items()} == {
        "Где мой сервер?": ["Где ужинать?", "Мой сервер находится в Берлине", "Понятно: сервер стоит в Берлине.",
                            "Санкт-Петербург"],
        "what about the café?": ["The café on Rue Cler opens at seven."],
        "кафе Ромашка": ["Кафе «Ромашка» открыто до полуночи.", "найти кафе"],
        "Питер": ["Санкт-Петербург"],
        "сестра": ["Санкт-Петербург"],
        "München": ["Ich wohne in München", "München ist schön im Herbst."],
        "noon": ["Deploy the build at noon", "Deploy window", "Sure, noon it is."],
        "what should I know about the server": ["What else should I know?"]}

    # Batches of 3: conversations and the messages said before a batch's first row span batches.
    summary = reindex(backend, tmp_path, capsys, "--user", "alice", "--batch", "3")
    assert summary == {"user": "alice", "reindexed": CHANGED, "unchanged": UNCHANGED}

    async def after() -> None:
        async with backend.opened() as store:
            alice, carol = await searches(store, "alice"), await searches(store, "carol")
            # Scored alike (on SQLite both scores moved: the file's counts now hold Alice's terms too).
            assert alice == carol and [sorted(hit for hit, _ in hits) for hits in alice.values()] == [
                sorted(hit for hit, _ in hits) for hits in fresh.values()]
            assert (await searches(store, "bob"))["Где мой сервер?"] == []
        assert await stored_terms(backend, "alice") == await stored_terms(backend, "carol")
        assert await statistics(backend, "alice") == await statistics(backend, "carol")
        assert await stored_terms(backend, "bob") == bobs  # another user's rows are left as they were

    run(after())


def test_reindex_terms_of_everyone_then_again_changes_nothing(backend: Backend, tmp_path: Path,
                                                              capsys: Any) -> None:
    run(old_world(backend))
    summary = reindex(backend, tmp_path, capsys)
    # Alice's and Bob's items as the first test counts them, and all of Carol's unchanged.
    twice = {table: 2 * count for table, count in CHANGED.items()}
    unchanged = {table: 2 * UNCHANGED[table] + CHANGED[table] + UNCHANGED[table] for table in CHANGED}
    assert summary == {"user": None, "reindexed": twice, "unchanged": unchanged}

    async def state() -> list[Any]:
        async with backend.opened() as store:
            found = [await searches(store, user) for user in ("alice", "bob", "carol")]
        return [found, *[await stored_terms(backend, user) for user in ("alice", "bob", "carol")],
                *[await statistics(backend, user) for user in ("alice", "bob", "carol")]]

    first = run(state())
    assert first[0][0] == first[0][1] == first[0][2]
    assert first[1] == first[2] == first[3] and first[4] == first[5] == first[6]

    total = {table: 3 * (CHANGED[table] + UNCHANGED[table]) for table in CHANGED}
    assert reindex(backend, tmp_path, capsys) == {"user": None, "reindexed": dict.fromkeys(CHANGED, 0),
                                                  "unchanged": total}
    assert run(state()) == first


def test_reindex_terms_tells_its_progress_per_table(tmp_path: Path, capsys: Any) -> None:
    backend = SQLiteBackend(tmp_path / "m.db")
    run(old_world(backend))
    config = tmp_path / "reindex.yaml"
    config.write_text(json.dumps({"store": {"url": store_url(backend)}}))
    assert main(["reindex", "--terms", "--user", "bob", "--config", str(config)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "memproxy: messages: 10 read, 8 re-indexed (done)",
        "memproxy: entities: 2 read, 1 re-indexed (done)",
        "memproxy: reasoning: 1 read, 1 re-indexed (done)",
    ]


# Another process (a proxy serving the file) in the middle of a write transaction, for a while.
_HOLDER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("UPDATE users SET created_at = created_at + 1 WHERE id = 'carol'")
print("held", flush=True)
time.sleep(0.5)
db.execute("COMMIT")
"""


def test_a_batch_waits_for_another_process_writing_the_sqlite_file(tmp_path: Path) -> None:
    """The batch waits its busy_timeout for the other writer and then runs: a transaction that read
    first and wrote after would fail as soon as the other one committed (SQLITE_BUSY)."""
    backend = SQLiteBackend(tmp_path / "m.db")
    run(old_world(backend))

    async def body() -> ReindexedPage:
        async with backend.opened() as store:
            holder = await asyncio.create_subprocess_exec(sys.executable, "-c", _HOLDER, str(backend.path),
                                                          stdout=asyncio.subprocess.PIPE)
            try:
                assert holder.stdout is not None and await holder.stdout.readline() == b"held\n"
                return await store.reindex_terms("messages", limit=100, user="alice")
            finally:
                assert await holder.wait() == 0

    assert run(body()) == ReindexedPage(read=10, rewritten=8, after=None)
    assert [content for content, in run(backend.sql(
        "SELECT m.content FROM messages_fts f JOIN messages m ON m.seq = f.rowid"
        " WHERE messages_fts MATCH 'terms : сервер' AND m.user_id = 'alice' ORDER BY m.seq"))] == [
        "Мой сервер находится в Берлине", "Понятно: сервер стоит в Берлине."]


@pytest.mark.parametrize("batch, said", [("0", "must be at least 1, not 0"), ("-5", "must be at least 1, not -5"),
                                         ("x", "must be a whole number, not 'x'")])
def test_reindex_terms_batch_must_be_a_positive_number(batch: str, said: str, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["reindex", "--terms", "--batch", batch])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"memproxy reindex: error: argument --batch: {said}"


def test_reindex_terms_beside_a_replica_writing_the_same_user(pg_url: str, tmp_path: Path, capsys: Any) -> None:
    """A replica saves Alice's turns all along: each batch holds her lock, and her statistics stay those
    her items make."""
    backend = PostgresBackend(pg_url)
    run(old_world(backend))
    stop, saved = threading.Event(), []

    async def replica() -> None:
        async with backend.opened() as store:
            while not stop.is_set():
                n, at = len(saved), T0 + timedelta(hours=1, minutes=len(saved))
                await store.apply([StartTurn(Scope("alice"), f"live-{n}", f"live-{n}", f"live-{n}", at,
                                             f"Сервер номер {n} снова в Берлине")])
                saved.append(n)

    thread = threading.Thread(target=lambda: run(replica()))
    thread.start()
    try:
        summary = reindex(backend, tmp_path, capsys, "--batch", "1")
    finally:
        stop.set()
        thread.join()
    assert saved and summary["reindexed"] == {table: 2 * count for table, count in CHANGED.items()}
    assert reindex(backend, tmp_path, capsys)["reindexed"] == dict.fromkeys(CHANGED, 0)

    async def counts() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        held = await statistics(backend, "alice")
        made = [*await backend.sql(
            "SELECT kind, term, count(*), count(*) FILTER (WHERE finds) FROM (SELECT 'entity' AS kind, *"
            " FROM entity_postings UNION ALL SELECT 'message', * FROM message_postings UNION ALL"
            " SELECT 'reasoning', * FROM reasoning_postings) p WHERE user_id = ? GROUP BY kind, term"
            " ORDER BY kind, term", "alice"),
            *await backend.sql(
            "SELECT kind, count(*), sum(length) FROM (SELECT 'entity' AS kind, user_id,"
            f" {_length('name_terms', 'type_terms', 'description_terms')} AS length FROM entities UNION ALL"
            f" SELECT 'message', user_id, {_length('terms', 'context')} FROM messages UNION ALL"
            f" SELECT 'reasoning', user_id, {_length('terms')} FROM reasoning) i WHERE user_id = ?"
            " GROUP BY kind ORDER BY kind", "alice")]
        return held, made

    held, made = run(counts())
    assert held == made


def _length(*columns: str) -> str:
    """SQL: an item's length as BM25 counts it (postgres.schema._Index), in terms."""
    return " + ".join(f"coalesce(cardinality(string_to_array({column}, ' ')), 0)" for column in columns)


def test_a_row_deleted_between_a_batchs_two_reads_neither_ends_the_run_nor_skips_a_user(pg_url: str) -> None:
    # PostgreSQL reads a batch's users, locks them, then reads the batch again: a delete in
    # between made that read short, taken for the table's end, and later users were skipped.
    from proxy.stores.postgres.store import PostgresStore
    from proxy.stores.reindex_terms import TermsCounts, reindex_all

    backend = PostgresBackend(pg_url)

    async def body() -> tuple[int, int]:
        store = PostgresStore(pg_url)
        await store.open()
        try:
            await store.apply([StartTurn(Scope(user), f"{user}-{n}", f"c-{user}", f"h{user}{n}",
                                         T0 + timedelta(minutes=n), f"hello server {n}")
                               for user in ("alice", "bob", "carol") for n in range(2)])
            await backend.sql("UPDATE messages SET terms = 'stale' WHERE user_id = 'carol'")
            window = store._batch_window

            async def then_a_delete(spec: Any, after: Any, limit: int) -> Any:
                found = await window(spec, after, limit)
                if spec.table == "messages" and after is None:  # an API delete lands in between
                    await backend.sql("DELETE FROM messages WHERE user_id = 'alice' AND turn_key = 'alice-1'")
                return found

            store._batch_window = then_a_delete  # type: ignore[method-assign]
            counts = await reindex_all(store, TermsCounts(), batch=4)
            (left,) = await backend.sql("SELECT count(*) FROM messages WHERE user_id = 'carol' AND terms = 'stale'")
            return counts.reindexed["messages"], left[0]
        finally:
            await store.close()

    assert asyncio.run(body()) == (2, 0)  # carol's two stale messages were reindexed
