"""The LoCoMo benchmark through the proxy's own parts: writer, store, extraction worker, retrieval.

Each conversation becomes one user's memory in its own SQLite file: each session a
conversation, every turn saved by the writer as the user message `Name: text` (a
StartTurn, as the proxy saves a turn) at its session's date, one second apart so their
order holds. The extraction worker then drains the queue. Every question is asked in a
fresh conversation with nothing saved, exactly as the pipeline asks `Retrieval`, and the
hits of the injection log are mapped to the turns they cover. The mapping from message
ids to dia_ids lives here, never in the product's schema.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from proxy.calls.embeddings import vector_parts
from proxy.evaluation.locomo import Sample, Session, turn_text
from proxy.evaluation.scoring import Answer, Summary
from proxy.memory.vectors.embedder import EmbeddingFailed
from proxy.memory.learning.worker import ExtractionWorker
from proxy.memory.vectors.query import Vectors
from proxy.memory.retrieval.fusion import HARD_CAP
from proxy.memory.retrieval.base import Query
from proxy.redaction.redact import redact
from proxy.memory.retrieval.retriever import Retrieval
from proxy.memory.writer import Writer
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.settings import Settings
from proxy.stores.base import SetTurnStatus, StartTurn, Store, text_hash
from proxy.stores.sqlite.store import SQLiteStore
from proxy.http.upstream import Upstream

MESSAGE_SOURCES = frozenset({"conversation", "cross-session"})
FACT_SOURCES = frozenset({"long-term", "graph"})
FLUSH_TIMEOUT_S = 600.0
PAGE = 1000  # messages read back per page when mapping ids to turns

Progress = Callable[[int, int], None]


class BenchmarkError(RuntimeError):
    """The benchmark could not run as asked (bad k, writes that did not commit, ...)."""


@dataclass
class Memory:
    """One conversation's memory: its scope, and what each stored item covers."""

    scope: Scope
    dia_ids: dict[str, str]  # message id -> dia_id
    provenance: dict[str, str]  # entity or relationship id -> the message it was last extracted from

    def covers(self, source: str, item_id: str) -> str | None:
        """The turn a hit covers: its own message's, or its item's latest provenance."""
        if source in MESSAGE_SOURCES:
            return self.dia_ids.get(item_id)
        if source in FACT_SOURCES and item_id in self.provenance:
            return self.dia_ids.get(self.provenance[item_id])
        return None


def conversation_id(sample: Sample, session: Session) -> str:
    """The conversation a session is saved as."""
    return f"{sample.sample_id}-session-{session.number}"


async def save_turns(store: Store, writer: Writer, scope: Scope, sample: Sample) -> None:
    """Every turn as a user message through the writer, as the proxy saves a turn."""
    pending = []
    for session in sample.sessions:
        conversation = conversation_id(sample, session)
        for n, turn in enumerate(session.turns):
            at = session.at + timedelta(seconds=n)
            key = f"{sample.sample_id}-{turn.dia_id}"
            text = redact(turn_text(turn))
            pending.append(writer.submit(StartTurn(scope, key, conversation, text_hash(key), at, text)))
            pending.append(writer.submit(SetTurnStatus(scope, key, "complete", at)))
    if not await writer.flush(FLUSH_TIMEOUT_S) or any(f.exception() for f in pending):
        raise BenchmarkError(f"{sample.sample_id}: the turns were not all saved")


async def map_messages(store: Store, scope: Scope, sample: Sample) -> dict[str, str]:
    """Message id -> dia_id, matching each session's saved messages to its turns in order."""
    dia_ids: dict[str, str] = {}
    for session in sample.sessions:
        messages: list[Any] = []
        after = None
        while len(messages) < len(session.turns):
            page = await store.message_page(scope, conversation_id(sample, session), limit=PAGE, after=after)
            if not page:
                break
            after = page[-1][0]
            messages += [message for _, message in page]
        if len(messages) != len(session.turns):
            raise BenchmarkError(f"{sample.sample_id} session {session.number}: {len(messages)} messages saved"
                                 f" for {len(session.turns)} turns")
        for message, turn in zip(messages, session.turns):
            dia_ids[message.id] = turn.dia_id
    return dia_ids


async def extract_all(store: Store, worker: ExtractionWorker) -> None:
    """Drive the extraction worker until the queue holds nothing due."""
    while await worker.drain_once():
        pass
    depth = await store.queue_depth()
    if depth["pending"] or depth["parked"]:
        raise BenchmarkError(f"extraction did not finish: {depth}")


async def latest_provenance(store: Store, scope: Scope) -> dict[str, str]:
    """Entity and relationship ids -> the message each was most recently extracted from."""
    found: dict[str, str] = {}
    async for record in store.export(scope):
        if record["kind"] in ("entity", "relationship") and record.get("provenance"):
            found[record["id"]] = record["provenance"][-1]
    return found


async def ingest(store: Store, settings: Settings, sample: Sample, summary: Summary) -> Memory:
    """Save the conversation, let extraction finish, and map stored items to turns."""
    scope = Scope(user=f"locomo-{sample.sample_id}")
    metrics = Metrics()
    writer = Writer(store, metrics, max(settings.memory.write_queue_size, 2 * sample.turns + 1))
    writer.start()
    try:
        started = time.perf_counter()
        await save_turns(store, writer, scope, sample)
        saved = time.perf_counter()
        worker = ExtractionWorker(store, writer, metrics, from_roles=settings.extraction.from_roles,
                                  isolate_agents=settings.scope.isolation == "agent")
        await extract_all(store, worker)
        done = time.perf_counter()
    finally:
        await writer.close()
    summary.ingest_s += done - started
    summary.extract_s += done - saved
    summary.turns += sample.turns
    summary.conversations += 1
    return Memory(scope, await map_messages(store, scope, sample), await latest_provenance(store, scope))


def covered(memory: Memory, log: Mapping[str, Any]) -> tuple[tuple[str | None, ...], tuple[str, ...]]:
    """The turns the block carries (each hit's own, and the turns a message hit's line carries
    around it), and each hit's source."""
    hits = log.get("hits", [])
    turns = [memory.covers(h["source"], h["id"]) for h in hits]
    turns += [memory.dia_ids.get(m) for h in hits for m in h.get("exchange", ())]
    return tuple(turns), tuple(h["source"] for h in hits)


async def ask(retrieval: Retrieval, memory: Memory, sample: Sample, k: int, summary: Summary,
              progress: Progress | None = None, done: int = 0, total: int = 0) -> int:
    """Ask every question of the sample in a fresh conversation; return the progress count."""
    for question in sample.questions:
        query = Query(question.text, uuid.uuid4().hex, (), k, new_conversation=True)
        started = time.perf_counter()
        retrieved = await retrieval.retrieve(memory.scope, query)
        ms = (time.perf_counter() - started) * 1000
        hits, sources = covered(memory, retrieved.log)
        summary.answers.append(Answer(question.category, question.evidence, hits, ms, sources))
        done += 1
        if progress is not None:
            progress(done, total)
    return done


async def run(samples: list[Sample], settings: Settings, k: int, progress: Progress | None = None,
              workdir: str | None = None) -> Summary:
    """The benchmark over every sample, each in its own temporary SQLite store."""
    if not 1 <= k <= HARD_CAP:
        raise BenchmarkError(f"k must be between 1 and {HARD_CAP} (the hard cap of max_memories), not {k}")
    summary = Summary(k)
    total = sum(len(s.questions) for s in samples)
    done = 0
    upstream = Upstream(settings.upstream)  # for a provider's embeddings model only
    try:
        with tempfile.TemporaryDirectory(prefix="memproxy-eval-", dir=workdir) as tmp:
            for sample in samples:
                store = SQLiteStore(str(Path(tmp) / f"{sample.sample_id}.db"))
                await store.open()
                try:
                    memory = await ingest(store, settings, sample, summary)
                    vectors = await embed_all(store, settings, upstream, summary)
                    retrieval = Retrieval(store, settings.memory, Metrics(), vectors)
                    done = await ask(retrieval, memory, sample, k, summary, progress, done, total)
                finally:
                    await store.close()
    finally:
        await upstream.aclose()
    return summary


async def embed_all(store: Store, settings: Settings, upstream: Upstream, summary: Summary) -> Vectors | None:
    """Every item's vector for the configured embeddings model (counted as ingest), and vector search;
    None when embeddings are off."""
    parts = vector_parts(settings, upstream, store, Metrics())
    if parts is None:
        return None
    started = time.perf_counter()
    try:
        await parts[1].filler.fill_all()
    except EmbeddingFailed as exc:
        raise BenchmarkError(f"the embeddings model failed: {exc}") from None
    summary.ingest_s += time.perf_counter() - started
    return parts[0]
