"""Embeddings across two replicas on one PostgreSQL (docs/retrieval.md: "The vector cache, across
processes").

Replica B's cached matrix for the user is loaded before the vectors exist; replica A then
saves a fact. B finds it by meaning on its very next request once the vector is committed:
every request checks the store's newest vector, so no cache answers older than a commit.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg

from tests.test_embeddings import FACT, ON, PARAPHRASE, say, sent_text


def vectors_in(url: str) -> int:
    async def count() -> int:
        conn = await asyncpg.connect(url)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM embeddings WHERE kind = 'message'"))
        finally:
            await conn.close()

    return asyncio.run(count())


def test_a_second_replica_finds_the_first_ones_provider_vectors_once_committed(make_proxy: Any, fake: Any,
                                                                               pg_url: str) -> None:
    settings = {**ON, "store__url": pg_url}
    a = make_proxy(**settings)
    b = make_proxy(**settings)
    say(b, PARAPHRASE, conversation="early")  # b's matrix for alice: loaded now, still empty
    assert FACT not in sent_text(fake)
    say(a, FACT, conversation="teach-1")
    deadline = time.monotonic() + 15
    while vectors_in(pg_url) < 4:  # the two turns' messages (a's worker, or b's)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    raw = say(b, PARAPHRASE, conversation="later")  # at once: no time to live
    assert FACT in sent_text(fake)
    assert raw.headers["x-memory-status"] == "ok"
    say(b, PARAPHRASE, user="bob", conversation="bob-1")
    assert FACT not in sent_text(fake)


def test_with_the_embedded_model_the_next_request_on_another_replica_finds_the_fact(make_proxy: Any, fake: Any,
                                                                                    pg_url: str) -> None:
    settings = {"store__url": pg_url, "memory__commit_timeout_ms": 5000, "extraction__from_roles": []}
    a = make_proxy(**settings)
    b = make_proxy(**settings)
    question = "What's the name of my pet?"
    say(b, question, conversation="early")  # b's matrix for alice: loaded now, still empty
    say(a, "My dog is called Rex.", conversation="teach-1")
    say(b, question, conversation="later")  # no waiting: the vector was saved in a's commit of the message
    assert "My dog is called Rex." in sent_text(fake)
