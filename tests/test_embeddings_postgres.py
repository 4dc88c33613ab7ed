"""Embeddings across two replicas on one PostgreSQL (docs/retrieval.md: "The vector cache").

Replica A saves the turns; replica B, whose cached matrix was loaded before their vectors
existed, then finds the fact by meaning: at once when B's own worker saved the vectors,
else once its matrix is older than `embeddings.cache_ttl_s` and has been reloaded.
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


def test_a_second_replica_finds_the_first_ones_vectors_after_its_cache_ttl(make_proxy: Any, fake: Any,
                                                                           pg_url: str) -> None:
    settings = {**ON, "store__url": pg_url, "embeddings__cache_ttl_s": 0.5}
    a = make_proxy(**settings)
    b = make_proxy(**settings)
    say(b, PARAPHRASE, conversation="early")  # b's matrix for alice: loaded now, still empty
    assert FACT not in sent_text(fake)
    say(a, FACT, conversation="teach-1")
    deadline = time.monotonic() + 15
    while vectors_in(pg_url) < 4:  # the two turns' messages (a's worker, or b's)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.6)
    say(b, "Which vessels does my sibling love?", conversation="later-1")  # serves the old matrix, reloads it
    time.sleep(0.3)
    raw = say(b, PARAPHRASE, conversation="later-2")
    assert FACT in sent_text(fake)
    assert raw.headers["x-memory-status"] == "ok"
    say(b, PARAPHRASE, user="bob", conversation="bob-1")
    assert FACT not in sent_text(fake)
