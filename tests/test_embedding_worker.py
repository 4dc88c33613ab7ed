"""The background fill (memory/vectors/worker.py) over a real SQLite store, with a scripted endpoint."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.memory.vectors.filler import EmbeddingWorker, FillCounts, Filler
from proxy.memory.vectors.embedder import EmbeddingFailed
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.stores.base import FinishTurn, StartTurn
from proxy.stores.sqlite.store import SQLiteStore

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


class Endpoint:
    """Answers each call with the next scripted outcome: 'ok', or an EmbeddingFailed."""

    def __init__(self, *script: str) -> None:
        self.script = list(script)
        self.calls: list[list[str]] = []

    async def __call__(self, texts: Sequence[str], timeout_s: float) -> list[bytes]:
        self.calls.append(list(texts))
        outcome = self.script.pop(0) if self.script else "ok"
        if outcome == "500":
            raise EmbeddingFailed("the embeddings endpoint answered 500")
        if outcome == "400":
            raise EmbeddingFailed("the embeddings endpoint answered 400", retry=False)
        return [struct.pack("<2f", 1.0, float(len(text))) for text in texts]


async def opened(tmp_path: Path, turns: int) -> SQLiteStore:
    store = SQLiteStore(str(tmp_path / "m.db"))
    await store.open()
    for n in range(turns):
        scope = Scope("alice" if n % 2 == 0 else "bob")
        await store.apply([StartTurn(scope, f"t{n}", f"c{n}", f"h{n}", T0, f"question {n}"),
                           FinishTurn(scope, f"t{n}", f"c{n}", f"answer {n}", T0 + timedelta(seconds=1))])
    return store


def test_fill_all_pages_through_every_kind(tmp_path: Path) -> None:
    async def body() -> None:
        store = await opened(tmp_path, 3)
        try:
            endpoint = Endpoint()
            filler = Filler(store, endpoint, "m", batch=4, timeout_s=1.0)
            counts = await filler.fill_all(user="alice")
            assert counts.saved == {"message": 4, "entity": 0, "reasoning": 0}
            assert [len(c) for c in endpoint.calls] == [4]
            assert (await filler.fill_all()).saved["message"] == 2  # bob's
            assert (await filler.fill_all()).saved["message"] == 0
        finally:
            await store.close()

    asyncio.run(body())


def test_a_rejected_batch_is_skipped_and_a_failing_endpoint_is_retried(tmp_path: Path) -> None:
    async def body() -> None:
        store = await opened(tmp_path, 2)  # four messages
        try:
            endpoint = Endpoint("400", "500")
            filler = Filler(store, endpoint, "m", batch=2, timeout_s=1.0)
            counts = FillCounts()
            after, done = await filler.page("message", 0, counts)
            assert counts.skipped["message"] == 2 and not done  # the rejected page is passed over
            with pytest.raises(EmbeddingFailed):
                await filler.page("message", after, counts)  # a 500: the page stays to be tried again
            after, done = await filler.page("message", after, counts)
            assert counts.saved["message"] == 2
            assert len(await store.unembedded("m", "message")) == 2  # the skipped ones, for the next full pass
        finally:
            await store.close()

    asyncio.run(body())


def test_a_batch_the_endpoint_refuses_is_counted_as_skipped_not_ok(tmp_path: Path) -> None:
    async def body() -> str:
        store = await opened(tmp_path, 1)  # two messages
        try:
            metrics = Metrics()
            worker = EmbeddingWorker(Filler(store, Endpoint("400"), "m", batch=64, timeout_s=1.0), metrics)
            await worker.fill_once()
            return metrics.render().decode()
        finally:
            await store.close()

    rendered = asyncio.run(body())
    assert 'memproxy_embedding_calls_total{outcome="skipped",purpose="background"} 1.0' in rendered
    assert 'outcome="ok",purpose="background"' not in rendered


def test_the_worker_keeps_going_after_failures(tmp_path: Path) -> None:
    async def body() -> None:
        store = await opened(tmp_path, 2)
        try:
            endpoint = Endpoint("500", "500")
            metrics = Metrics()
            worker = EmbeddingWorker(Filler(store, endpoint, "m", batch=64, timeout_s=1.0), metrics)
            worker.limits = type(worker.limits)(idle_poll_s=0.01, retry_first_s=0.01, retry_max_s=0.02)
            worker.start()
            try:
                for _ in range(300):
                    if not await store.unembedded("m", "message"):
                        break
                    await asyncio.sleep(0.01)
            finally:
                await worker.stop()
            assert await store.unembedded("m", "message") == []
            assert len(endpoint.calls) >= 3
            rendered = metrics.render().decode()
            assert 'memproxy_embedding_calls_total{outcome="failed",purpose="background"} 2.0' in rendered
            assert "memproxy_embedded_items_total 4.0" in rendered
        finally:
            await store.close()

    asyncio.run(body())
