"""Deleting one memory through the memory API (docs/memory-api.md): its text leaves every
table, the cached memory block of a turn it was given to included, and a retry of that turn
gets a block computed again without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.api_helpers import api_url
from tests.fake_upstream import FakeUpstream
from tests.proxy_db import eventually, rows, sqlite_file, store_path

SECRET = "Qx7Lm3Zp"
QUESTION = {"model": "m", "messages": [{"role": "user", "content": "What is the vault combination?"}]}


def _texts_holding(db: Path, needle: str) -> list[str]:
    """The tables whose rows hold `needle` in a text column, case folded; the full-text indexes'
    own tables left out (FTS5 keeps a deleted row's tokens until its segments merge)."""
    found = []
    with sqlite_file(db) as conn:
        tables = [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%'"
            " AND name NOT LIKE '%_fts_%' AND name NOT LIKE 'sqlite_%'")]
        for table in tables:
            columns = [c[1] for c in conn.execute(f'PRAGMA table_info("{table}")')]
            text = " || ' ' || ".join(f'ifnull(CAST("{c}" AS TEXT), \'\')' for c in columns)
            if conn.execute(f'SELECT count(*) FROM "{table}" WHERE lower({text}) LIKE ?',
                            (f"%{needle.lower()}%",)).fetchone()[0]:
                found.append(table)
    return found


def test_a_deleted_memory_leaves_the_cached_block_of_a_turn_it_was_given_to(make_proxy: Any,
                                                                              fake: FakeUpstream) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000, memory__retry_window_s=60, extraction__from_roles=[])
    alice = {"X-Memory-User": "alice"}
    with proxy.http() as http:
        stored = http.post(api_url("alice", "memories"), json={"content": f"The vault combination is {SECRET}",
                                                                "type": "fact"})
        assert stored.status_code == 201, stored.text
        first = http.post("/v1/chat/completions", headers=alice, json=QUESTION)
        assert first.status_code == 200 and first.headers["x-memory-injected"] == "1"
        assert SECRET in json.loads(fake.chat_requests()[-1].body)["messages"][0]["content"]
        turn = first.headers["x-memory-turn"]
        assert eventually(lambda: [SECRET in (block or "") for (block,) in rows(proxy, "SELECT block FROM turns")]
                          == [True])
        deleted = http.delete(api_url("alice", "memories", stored.json()["id"]))
        assert deleted.status_code == 200, deleted.text
        # Gone in the deletion's own transaction: the row holds no block until the turn computes one again.
        assert rows(proxy, "SELECT turn_key, block FROM turns") == [(turn, None)]
        # A retry of the turn (its history exactly) is the same turn; its block is computed again,
        # without the deleted memory, and cached: the turn's later retries get it byte for byte.
        sent = []
        for _ in range(2):
            retried = http.post("/v1/chat/completions", headers=alice, json=QUESTION)
            assert (retried.status_code, retried.headers["x-memory-turn"]) == (200, turn)
            sent.append(json.loads(fake.chat_requests()[-1].body)["messages"][0]["content"])
            ((block,),) = rows(proxy, "SELECT block FROM turns")
            assert block is not None and sent[-1].startswith(block)
        assert SECRET not in sent[0] and sent[1] == sent[0]
    assert rows(proxy, "SELECT count(*) FROM turns") == [(1,)]
    assert _texts_holding(Path(store_path(proxy)), SECRET) == []


def test_a_deleted_memorys_index_words_are_left_in_no_table(make_proxy: Any) -> None:
    """A log of every entity's index words added and removed (all users', schema v7) kept a
    deleted memory's words until 4,096 later changes pushed them out; nothing read it."""
    proxy = make_proxy(extraction__from_roles=[])
    with proxy.http() as http:
        stored = http.post(api_url("alice", "memories"), json={"content": f"Vault combination {SECRET}",
                                                                "type": "fact"})
        assert stored.status_code == 201, stored.text
        assert _texts_holding(Path(store_path(proxy)), SECRET) == ["entities"]  # the search sees what is there
        assert http.delete(api_url("alice", "memories", stored.json()["id"])).status_code == 200
    assert rows(proxy, "SELECT count(*) FROM entities") == [(0,)]
    assert _texts_holding(Path(store_path(proxy)), SECRET) == []
    assert rows(proxy, "SELECT name FROM sqlite_master WHERE name LIKE '%entit%text%'") == []  # the log, its triggers
