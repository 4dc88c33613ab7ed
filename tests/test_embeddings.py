"""Embeddings end to end (docs/retrieval.md): the real proxy under uvicorn, the openai client, the
fake upstream's deterministic /v1/embeddings (a hashed bag of stemmed words where
synonyms share a dimension, so a paraphrase with no word in common is near).
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from proxy.settings import ConfigError, load_settings
from tests.fake_upstream import JsonReply, SlowHeaders

FACT = "Priya adores sailing catamarans around Lisbon."
NOISE = "The dentist appointment moved to Friday afternoon."
PARAPHRASE = "Which boats does my sister enjoy?"  # no word of FACT, stop words aside
EMBED_KEY = "sk-memproxy-embeddings"
ON = {"embeddings__model": "fake-embed", "embeddings__api_key": EMBED_KEY, "memory__commit_timeout_ms": 5000,
      "memory__retrieval_timeout_ms": 2000, "embeddings__query_timeout_ms": 1000, "extraction__from_roles": []}


def db_path(proxy: Any) -> str:
    return proxy.settings.store.url[len("sqlite:///"):]


def vector_count(path: str, kind: str = "message") -> int:
    with closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT count(*) FROM embeddings WHERE kind = ?", (kind,)).fetchone()[0])


def wait_for_vectors(path: str, count: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while vector_count(path) < count:
        assert time.monotonic() < deadline, f"only {vector_count(path)} of {count} vectors after {timeout}s"
        time.sleep(0.05)


def say(proxy: Any, text: str, *, user: str = "alice", conversation: str) -> Any:
    client = proxy.client(**{"X-Memory-User": user, "X-Memory-Conversation": conversation})
    return client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": text}])


def sent_text(fake: Any) -> str:
    return str(json.loads(fake.chat_requests()[-1].body)["messages"][-1]["content"])


def test_a_paraphrase_in_a_fresh_conversation_finds_the_fact_by_its_vector(make_proxy: Any, fake: Any) -> None:
    proxy = make_proxy(**ON)
    say(proxy, FACT, conversation="teach-1")
    say(proxy, NOISE, conversation="teach-2")
    say(proxy, "I keep my notes in plain text files.", user="bob", conversation="bob-1")
    wait_for_vectors(db_path(proxy), 6)  # each turn's two messages

    raw = say(proxy, PARAPHRASE, conversation="fresh")
    assert raw.headers["x-memory-status"] == "ok"
    block = sent_text(fake)
    assert "[cross-session] user (" in block and FACT in block
    assert NOISE not in block
    assert block.endswith("\n\n" + PARAPHRASE)
    (hit,) = [h for h in _injections(proxy, "alice")[0]["log"]["hits"] if FACT in _message(proxy, "alice", h)]
    assert hit["reason"] == "vector" and "bm25" not in hit["score"] and hit["score"]["cosine"] >= 0.3

    # Another user asking the same never gets it.
    raw = say(proxy, PARAPHRASE, user="bob", conversation="bob-2")
    assert FACT not in sent_text(fake)
    assert raw.headers["x-memory-injected"] == "0"

    # Every embeddings call carried memproxy's own key and model, never the client's key.
    calls = fake.embedding_requests()
    assert calls and all(r.header("authorization") == f"Bearer {EMBED_KEY}" for r in calls)
    assert all(r.json()["model"] == "fake-embed" for r in calls)
    assert all(b"sk-client-key" not in r.body + repr(r.headers).encode() for r in calls)
    assert all(r.header("authorization") == "Bearer sk-client-key" for r in fake.chat_requests())


def test_with_embeddings_off_the_paraphrase_finds_nothing_and_nothing_calls_embeddings(make_proxy: Any,
                                                                                      fake: Any) -> None:
    proxy = make_proxy(embeddings__model="off", memory__commit_timeout_ms=5000, extraction__from_roles=[])
    say(proxy, FACT, conversation="teach-1")
    raw = say(proxy, PARAPHRASE, conversation="fresh")
    assert raw.headers["x-memory-injected"] == "0"
    assert sent_text(fake) == PARAPHRASE
    raw = say(proxy, "Where do catamarans sail around Lisbon?", conversation="fresh-2")  # the lexical stream still works
    assert FACT in sent_text(fake)
    time.sleep(1.5)  # a background worker would have polled by now
    assert fake.embedding_requests() == []
    assert vector_count(db_path(proxy)) == 0


def test_no_key_of_its_own_means_no_embeddings(make_proxy: Any, fake: Any, caplog: Any) -> None:
    with caplog.at_level("WARNING", logger="memproxy.embeddings"):
        proxy = make_proxy(embeddings__model="fake-embed", memory__commit_timeout_ms=5000,
                           extraction__from_roles=[])
    assert any("embeddings: off" in r.getMessage() for r in caplog.records)
    say(proxy, FACT, conversation="teach-1")
    say(proxy, PARAPHRASE, conversation="fresh")
    time.sleep(1.5)
    assert fake.embedding_requests() == []  # the client's key is never used for background calls


@pytest.mark.parametrize("failure", ["500", "hang"])
def test_a_failing_embeddings_endpoint_leaves_chat_working_and_the_block_lexical(make_proxy: Any, fake: Any,
                                                                                failure: str) -> None:
    fake.embeddings = (JsonReply({"error": {"message": "boom", "type": "server_error"}}, status=500)
                       if failure == "500" else SlowHeaders(3600))
    proxy = make_proxy(**{**ON, "embeddings__query_timeout_ms": 300})
    say(proxy, FACT, conversation="teach-1")
    started = time.monotonic()
    raw = say(proxy, "Which catamarans does Priya sail?", conversation="fresh")
    assert time.monotonic() - started < 1.5
    assert raw.headers["x-memory-status"] == "ok"
    assert raw.parse().choices[0].message.content == "Hello from upstream"
    assert FACT in sent_text(fake)
    hits = _injections(proxy, "alice")[0]["log"]["hits"]
    assert hits and all("cosine" not in h["score"] and h["reason"] != "vector" for h in hits)
    assert vector_count(db_path(proxy)) == 0
    raw = say(proxy, PARAPHRASE, conversation="fresh-2")
    assert raw.headers["x-memory-status"] == "ok" and raw.headers["x-memory-injected"] == "0"


def test_reindex_fills_every_missing_vector(make_proxy: Any, fake: Any, tmp_path: Path, capsys: Any) -> None:
    # A store saved with embeddings off: no vector of any model yet.
    proxy = make_proxy(embeddings__model="off", memory__commit_timeout_ms=5000, extraction__from_roles=[])
    say(proxy, FACT, conversation="teach-1")
    say(proxy, NOISE, conversation="teach-2")
    say(proxy, "Bob's words", user="bob", conversation="bob-1")
    proxy.stop()
    config = tmp_path / "reindex.yaml"
    config.write_text(json.dumps({"upstream": {"base_url": fake.url}, "store": {"url": proxy.settings.store.url},
                                  "embeddings": {"model": "fake-embed", "api_key": EMBED_KEY, "batch_size": 3}}))

    assert main(["reindex", "--config", str(config), "--user", "alice"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["embedded"] == {"message": 4, "entity": 0, "reasoning": 0} and out["user"] == "alice"
    assert main(["reindex", "--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out)["embedded"] == {"message": 2, "entity": 0, "reasoning": 0}
    assert main(["reindex", "--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out)["embedded"] == {"message": 0, "entity": 0, "reasoning": 0}
    assert vector_count(db_path(proxy)) == 6
    assert len(fake.embedding_requests()) == 2 + 1  # batches of 3: alice's 4, then bob's 2
    assert all(len(r.json()["input"]) <= 3 for r in fake.embedding_requests())


def test_reindex_with_a_failing_endpoint_says_so_and_what_it_saved(make_proxy: Any, fake: Any, tmp_path: Path,
                                                                  capsys: Any) -> None:
    proxy = make_proxy(embeddings__model="off", memory__commit_timeout_ms=5000, extraction__from_roles=[])
    say(proxy, FACT, conversation="teach-1")
    proxy.stop()
    config = tmp_path / "reindex.yaml"
    config.write_text(json.dumps({"upstream": {"base_url": fake.url}, "store": {"url": proxy.settings.store.url},
                                  "embeddings": {"model": "fake-embed", "api_key": EMBED_KEY}}))
    fake.embeddings = JsonReply({"error": {"message": "down", "type": "server_error"}}, status=503)
    assert main(["reindex", "--config", str(config)]) == 1
    out = capsys.readouterr()
    assert json.loads(out.out)["embedded"] == {"message": 0, "entity": 0, "reasoning": 0}
    assert "answered 503" in out.err and EMBED_KEY not in out.err + out.out
    assert vector_count(db_path(proxy)) == 0


def test_reindex_with_embeddings_off_says_so(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "plain.yaml"
    config.write_text(json.dumps({"store": {"url": f"sqlite:///{tmp_path}/m.db"}, "embeddings": {"model": "off"}}))
    assert main(["reindex", "--config", str(config)]) == 2
    assert "embeddings.model is off" in capsys.readouterr().err


def test_reindex_with_the_default_fills_an_existing_stores_vectors_with_the_embedded_model(
        make_proxy: Any, tmp_path: Path, capsys: Any) -> None:
    proxy = make_proxy(embeddings__model="off", memory__commit_timeout_ms=5000, extraction__from_roles=[])
    say(proxy, FACT, conversation="teach-1")
    proxy.stop()
    config = tmp_path / "plain.yaml"
    config.write_text(json.dumps({"store": {"url": proxy.settings.store.url}}))
    assert main(["reindex", "--config", str(config)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "local:wordllama-l2_supercat-128"
    assert out["embedded"] == {"message": 2, "entity": 0, "reasoning": 0}
    with closing(sqlite3.connect(db_path(proxy))) as db:
        assert db.execute("SELECT DISTINCT model, dim FROM embeddings").fetchall() == [
            ("local:wordllama-l2_supercat-128", 128)]


def _injections(proxy: Any, user: str) -> list[dict[str, Any]]:
    with proxy.http() as client:
        response = client.get(f"/memory/v1/users/{user}/injections")
        assert response.status_code == 200
        return list(response.json()["data"])


def _message(proxy: Any, user: str, hit: dict[str, Any]) -> str:
    with closing(sqlite3.connect(db_path(proxy))) as db:
        row = db.execute("SELECT content FROM messages WHERE user_id = ? AND id = ?", (user, hit["id"])).fetchone()
    return row[0] if row else ""


def test_vector_hits_keep_the_sources_filters(make_proxy: Any, fake: Any) -> None:
    proxy = make_proxy(**ON, scope__isolation="agent")
    boats = ["Priya adores catamarans.", "Priya loves yachts.", "Priya is fond of sailboats.",
             "Priya adores sailing.", "Priya loves vessels."]
    for text in boats:  # five near matches in one conversation
        client = proxy.client(**{"X-Memory-User": "alice", "X-Memory-Conversation": "teach",
                                 "X-Memory-Agent": "a1"})
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    wait_for_vectors(db_path(proxy), 10)
    ask = {"X-Memory-User": "alice", "X-Memory-Conversation": "fresh", "X-Memory-Agent": "a1"}
    proxy.client(**ask).chat.completions.create(model="m", messages=[{"role": "user", "content": PARAPHRASE}])
    lines = sent_text(fake).splitlines()
    # All five: no cap on hits from one conversation.
    assert len([line for line in lines if line.startswith(tuple(f"{n}. [cross-session]" for n in range(1, 13)))]) == 5

    # Another agent, under agent isolation, sees none of them.
    other = {**ask, "X-Memory-Agent": "a2", "X-Memory-Conversation": "fresh-2"}
    raw = proxy.client(**other).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": PARAPHRASE}])
    assert raw.headers["x-memory-injected"] == "0"

    # In their own conversation, what the request shows is not injected again.
    own = {**ask, "X-Memory-Conversation": "teach"}
    shown = [{"role": "user", "content": boats[0]}, {"role": "assistant", "content": "Hello from upstream"},
             {"role": "user", "content": PARAPHRASE}]
    proxy.client(**own).chat.completions.create(model="m", messages=shown)
    block = sent_text(fake)
    assert boats[0] not in block and "[conversation]" in block


@pytest.mark.parametrize(("key", "value"), [("embeddings.min_cosine", 1.5), ("embeddings.batch_size", 0),
                                            ("embeddings.vector_weight", -1), ("embeddings.query_timeout_ms", 0),
                                            ("embeddings.base_url", "ftp://x"), ("embeddings.model", " ")])
def test_a_bad_embeddings_setting_is_named(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(environ={}, overrides={key: value})
