"""The embedded model as the default (docs/retrieval.md#embeddings): settings, vectors written
with each commit, and the worker's cursors over a store whose vectors are all there."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from proxy.memory.vectors.filler import EmbeddingWorker, Filler
from proxy.memory.vectors.local_model import MODEL_NAME, LocalModel
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.settings import load_settings
from proxy.stores.base import FinishTurn, StartTurn
from proxy.stores.sqlite.store import SQLiteStore
from tests.proxy_db import rows

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
    assert _vectors_of(proxy, said) == [(MODEL_NAME, 256)]
    assert _vectors_of(proxy, "Hello from upstream") == [(MODEL_NAME, 256)] * 2  # both answers


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
