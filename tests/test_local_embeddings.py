"""The embedded model as the default (docs/retrieval.md#embeddings): settings, vectors written
with each commit (a turn's messages in the commit itself), the worker's cursors over a store
whose vectors are all there, and a store of the former 256-wide model's vectors moving over
to the 128 kept now."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from proxy.memory.vectors.embedder import EmbeddingFailed
from proxy.memory.vectors.filler import EmbeddingWorker, Filler
from proxy.memory.vectors.index import RowFilter, VectorIndex, unit
from proxy.memory.vectors.local_model import MODEL_NAME, LocalModel
from proxy.memory.writer import Writer
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.settings import load_settings
from proxy.stores.base import FinishTurn, NewEmbedding, StartTurn, Store
from proxy.stores.sqlite.store import SQLiteStore
from tests.proxy_db import rows
from tests.store_backends import Backend, PostgresBackend, backend  # noqa: F401  (the fixture)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def test_the_embedded_model_is_the_default_and_the_environment_can_turn_it_off() -> None:
    assert load_settings(environ={}).embeddings.model == "local"
    assert load_settings(environ={"MEMPROXY_EMBEDDINGS_MODEL": "off"}).embeddings.model == "off"
    assert load_settings(environ={"MEMPROXY_EMBEDDINGS_MODEL": "text-embedding-3-small"}).embeddings.model == \
        "text-embedding-3-small"


def _vectors_of(proxy: Any, content: str) -> list[tuple[Any, ...]]:
    return rows(proxy, "SELECT e.model, e.dim FROM embeddings e JOIN messages m ON m.user_id = e.user_id"
                       " AND m.id = e.item_id WHERE e.kind = 'message' AND m.content = ?", (content,))


def test_a_message_has_its_vector_by_the_time_its_answer_is_back(make_proxy: Any) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    client = proxy.client(**{"X-Memory-User": "ann", "X-Memory-Conversation": "c1"})
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "My dog is called Rex."}])
    time.sleep(1.5)  # the background worker's first pass over the store is done: it has caught up
    said = "I keep bees on the roof of my house."
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": said}])
    # No waiting: the commit the answer waited for embedded its items before it counted as done.
    assert _vectors_of(proxy, said) == [(MODEL_NAME, 128)]
    assert _vectors_of(proxy, "Hello from upstream") == [(MODEL_NAME, 128)] * 2  # both answers


def test_a_turns_question_is_encoded_once_as_its_query_and_saved_with_that_vector(make_proxy: Any) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    client = proxy.client(**{"X-Memory-User": "ann", "X-Memory-Conversation": "c1"})
    worker = proxy.app.state.parts.embedding
    model = worker.filler.embed
    assert isinstance(model, LocalModel) and proxy.app.state.parts.vectors.embed is model
    encoded: list[str] = []
    tokenizer = model.tokenizer

    class Recording:
        def encode(self, text: str, **options: Any) -> Any:
            encoded.append(text)
            return tokenizer.encode(text, **options)

    model.tokenizer = Recording()
    said = "Which bees did I say live on the roof?"
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": said}])
    # Embedded for the recall's query; the commit saving it reused that vector.
    assert encoded.count(said) == 1 and encoded.count("Hello from upstream") == 1
    assert rows(proxy, "SELECT e.vector FROM embeddings e JOIN messages m ON m.user_id = e.user_id"
                       " AND m.id = e.item_id WHERE m.content = ?", (said,)) == [
        (LocalModel().vectors([said])[0].astype("<f4").tobytes(),)]


def test_a_caught_up_worker_moves_its_cursors_to_the_newest_items_and_reads_only_newer_ones(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(str(tmp_path / "m.db"))
        await store.open()
        try:
            alice = Scope("alice")
            for n in range(5):
                await store.apply([StartTurn(alice, f"t{n}", "c", f"h{n}", T0, f"words {n}"),
                                   FinishTurn(alice, f"t{n}", "c", f"answer {n}", T0 + timedelta(seconds=1))])
            model = LocalModel()
            filler = Filler(store, model, model.model, batch=64, timeout_s=1.0)
            assert (await filler.fill_all()).saved["message"] == 10
            # A worker starting over a store whose vectors are all there (a restart, or its
            # periodic pass from the start) finds nothing to embed and moves its cursors to the
            # newest items: what it reads after each commit is only what is newer.
            worker = EmbeddingWorker(filler, Metrics(), with_writes=True)
            assert worker._cursors == {"message": 0, "entity": 0, "reasoning": 0}
            assert await worker.fill_once() is False
            newest = await store.newest_seqs()
            assert newest["message"] == 10 and worker._cursors == newest
            await store.apply([StartTurn(alice, "t9", "c", "h9", T0, "a new one")])
            assert await worker.fill_once() is False
            assert worker._cursors["message"] == 11
        finally:
            await store.close()

    asyncio.run(body())


def _writer_with_vectors(store: Store) -> tuple[Writer, EmbeddingWorker]:
    model = LocalModel()
    # Never started: its background pass has not caught up, so nothing is filled after a commit.
    worker = EmbeddingWorker(Filler(store, model, model.model, batch=64, timeout_s=1.0), Metrics(), with_writes=True)
    return Writer(store, Metrics(), 100, commit_delay_s=0.001, hooks=worker), worker


async def _message_vectors(backend: Backend) -> dict[str, bytes]:
    """Each message's vector for the model, as float32 little-endian bytes (PostgreSQL's real[] too)."""
    found = await backend.sql("SELECT m.content, e.vector FROM messages m JOIN embeddings e ON e.user_id = m.user_id"
                              " AND e.kind = 'message' AND e.item_id = m.id AND e.model = ?", MODEL_NAME)
    return {content: vector if isinstance(vector, bytes) else struct.pack(f"<{len(vector)}f", *vector)
            for content, vector in found}


def test_a_turns_messages_are_saved_with_their_vectors_in_their_own_commit(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            writer, worker = _writer_with_vectors(store)
            writer.start()
            try:
                alice = Scope("alice")
                await asyncio.gather(writer.submit(StartTurn(alice, "t1", "c", "h1", T0, "I keep bees.")),
                                     writer.submit(FinishTurn(alice, "t1", "c", "Bees are great.", T0), urgent=True))
                # A lone surrogate is stored as U+FFFD, and embedded as it is stored: bob's message in the
                # same commit costs alice's none of its vector.
                await asyncio.gather(writer.submit(StartTurn(alice, "t2", "c", "h2", T0, "I keep wasps.")),
                                     writer.submit(StartTurn(Scope("bob"), "t1", "c", "h1", T0, "odd \ud800 text"),
                                                   urgent=True))
            finally:
                await writer.close()
        model = LocalModel()
        assert await _message_vectors(backend) == {
            text: model.vectors([text])[0].astype("<f4").tobytes()
            for text in ("I keep bees.", "Bees are great.", "I keep wasps.", "odd \ufffd text")}
        assert worker._cursors == {"message": 0, "entity": 0, "reasoning": 0}  # nothing was read back
        if backend.name == "postgres":  # each vector was written by the transaction that saved its message
            assert await backend.sql("SELECT m.content FROM messages m JOIN embeddings e ON e.user_id = m.user_id"
                                     " AND e.item_id = m.id WHERE m.xmin::text <> e.xmin::text") == []

    asyncio.run(body())


def test_a_message_postgresql_stores_otherwise_than_embedded_gets_its_vector_from_the_worker(pg_url: str) -> None:
    backend = PostgresBackend(pg_url)

    async def body() -> None:
        async with backend.opened() as store:
            writer, worker = _writer_with_vectors(store)
            writer.start()
            try:
                # PostgreSQL text cannot hold NUL: it is stored as U+FFFD, not the text embedded.
                await asyncio.gather(writer.submit(StartTurn(Scope("alice"), "t1", "c", "h1", T0, "I keep bees.")),
                                     writer.submit(StartTurn(Scope("bob"), "t1", "c", "h1", T0, "odd \x00 text"),
                                                   urgent=True))
            finally:
                await writer.close()
            assert list(await _message_vectors(backend)) == ["I keep bees."]
            assert await worker.fill_once() is False
        assert (await _message_vectors(backend))["odd \ufffd text"] == \
            LocalModel().vectors(["odd \ufffd text"])[0].astype("<f4").tobytes()

    asyncio.run(body())


def test_a_commit_whose_vectors_fail_is_saved_without_them_and_the_worker_fills_them(backend: Backend) -> None:
    async def failing(texts: Sequence[str], timeout_s: float) -> list[bytes]:
        raise EmbeddingFailed("the embedded model failed")

    async def body() -> None:
        async with backend.opened() as store:
            writer, worker = _writer_with_vectors(store)
            embed, worker.filler.embed = worker.filler.embed, failing
            writer.start()
            try:
                await writer.submit(StartTurn(Scope("alice"), "t1", "c", "h1", T0, "I keep bees."), urgent=True)
            finally:
                await writer.close()
            assert await backend.sql("SELECT content FROM messages") == [("I keep bees.",)]
            assert await _message_vectors(backend) == {}
            worker.filler.embed = embed  # the model answers again: the worker's next pass fills it in
            assert await worker.fill_once() is False
        assert list(await _message_vectors(backend)) == ["I keep bees."]

    asyncio.run(body())


def test_a_store_of_the_former_256_wide_vectors_is_filled_again_at_128_and_searched_at_128(backend: Backend) -> None:
    former = "local:wordllama-l2_supercat-256"

    async def body() -> None:
        async with backend.opened() as store:
            alice = Scope("alice")
            for key, said, answer in [("t1", "My dog is called Rex.", "Noted."),
                                      ("t2", "I configure nginx on the web servers.", "Noted.")]:
                await store.apply([StartTurn(alice, key, "c", f"h-{key}", T0, said),
                                   FinishTurn(alice, key, "c", answer, T0 + timedelta(seconds=1))])
            # What a store saved before the cut holds: each message's 256-wide vector, under the former name.
            items = await store.unembedded(former, "message")
            wide = struct.pack("<256f", *[1.0] * 256)
            assert await store.save_embeddings(former, [NewEmbedding("alice", "message", i.item_id, i.text, wide)
                                                        for i in items]) == 4
            # Under the model's name now, every one of them lacks a vector: the worker fills them in.
            assert len(await store.unembedded(MODEL_NAME, "message")) == 4
            model = LocalModel()
            assert (await Filler(store, model, model.model, batch=64, timeout_s=1.0).fill_all()).saved["message"] == 4
            assert await store.unembedded(MODEL_NAME, "message") == []
            assert {len(v.vector) for v in await store.vectors(alice, "message", MODEL_NAME)} == {128 * 4}
            # The former ones are left as they were.
            assert {len(v.vector) for v in await store.vectors(alice, "message", former)} == {256 * 4}
            # The search reads only the model's own vectors, 128 wide, and finds the paraphrased fact.
            index = VectorIndex(store, MODEL_NAME)
            query = unit(model.vectors(["what's the name of my pet"])[0])
            assert query is not None and query.shape == (128,)
            marks = await index.marks(alice)
            near, spread = await index.nearest(alice, "message", query, RowFilter(), mark=marks["message"],
                                               floor=-1.0, limit=1)
            (rex,) = [i.item_id for i in items if i.text == "My dog is called Rex."]
            assert [item_id for item_id, _ in near] == [rex] and spread.rows == 4

    asyncio.run(body())
