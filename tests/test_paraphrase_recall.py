"""Recall of a fact asked in other words, with no provider: the embedded model on by default.

Fifty-two facts of one user, each taught in its own conversation, each asked in a fresh
conversation with a question sharing no content word with it (checked here through the
same term extraction the lexical search uses, so BM25 cannot find any of them). Through
the real proxy, the official client and the default configuration: the answer's line is
in the block for 43 of the 52 questions (83%; the line to hold is 80%) and among its
first three lines for 39 (75%; the line is 65%). With `embeddings.model: off` fewer than 10% find theirs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from proxy.terms import query_terms
from tests.proxy_db import eventually, rows

PAIRS: list[tuple[str, str]] = [tuple(p) for p in json.loads(  # type: ignore[misc]
    (Path(__file__).parent / "data" / "paraphrases.json").read_text())]
LINE = re.compile(r"^(\d+)\. \[", re.MULTILINE)


def _content_terms(text: str) -> set[str]:
    return set(query_terms(text))


def test_the_questions_share_no_content_word_with_their_facts() -> None:
    assert len(PAIRS) >= 50
    shared = {q: _content_terms(f) & _content_terms(q) for f, q in PAIRS if _content_terms(f) & _content_terms(q)}
    assert shared == {}


def _taught_and_asked(make_proxy: Any, fake: Any, **settings: Any) -> tuple[Any, list[int | None]]:
    """The proxy, and for each question the block line (1-based) holding its fact, or None."""
    proxy = make_proxy(memory__commit_timeout_ms=5000, **settings)
    user = {"X-Memory-User": "pat"}
    for n, (fact, _) in enumerate(PAIRS):
        proxy.client(**user, **{"X-Memory-Conversation": f"teach-{n}"}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": fact}])
    assert eventually(lambda: rows(proxy, "SELECT count(*) FROM messages")[0][0] == 2 * len(PAIRS))
    places: list[int | None] = []
    for n, (fact, question) in enumerate(PAIRS):
        proxy.client(**user, **{"X-Memory-Conversation": f"ask-{n}"}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": question}])
        block = str(json.loads(fake.chat_requests()[-1].body)["messages"][-1]["content"])
        lines = re.split(r"\n(?=\d+\. \[)", block)
        places.append(next((int(m.group(1)) for line in lines if fact in line and (m := LINE.match(line))), None))
    return proxy, places


def test_paraphrased_questions_find_their_facts_with_the_default_embedded_model(make_proxy: Any, fake: Any) -> None:
    proxy, places = _taught_and_asked(make_proxy, fake)
    in_block = sum(p is not None for p in places) / len(places)
    in_top3 = sum(p is not None and p <= 3 for p in places) / len(places)
    missed = [PAIRS[n][1] for n, p in enumerate(places) if p is None]
    # Measured: 42 of 52 in the block (81%), 37 in its first three lines (71%), with the model
    # cut to 128 dimensions (43 and 39 at 256); the lines to hold are 80% and 65%, and what
    # was measured is kept as the floor.
    assert in_block >= 42 / 52 > 0.80, (in_block, missed)
    assert in_top3 >= 37 / 52 > 0.65, (in_top3, places)

    # The inspector's injection log shows a hit found by meaning alone: its reason, its
    # cosine, and why it was chosen: how far it stood above the question's other cosines,
    # or, among a source's first 50 vectors (this user's facts), a cosine of 0.3 or more.
    with proxy.http() as client:
        answer = client.get("/memory/v1/users/pat/injections")  # the last 20 turns
    assert answer.status_code == 200, answer.text
    entries = answer.json()["data"]
    vector_hits = [h for e in entries for h in e["log"]["hits"] if h["reason"] == "vector"]
    assert vector_hits
    assert any("z" in h["score"] for h in vector_hits)
    assert all("bm25" not in h["score"] and 0.1 <= h["score"]["cosine"] < 1
               and (h["score"]["z"] >= 2.5 if "z" in h["score"] else h["score"]["cosine"] >= 0.3)
               for h in vector_hits), [h["score"] for h in vector_hits]


def test_with_embeddings_off_the_paraphrased_questions_miss_their_facts(make_proxy: Any, fake: Any) -> None:
    _, places = _taught_and_asked(make_proxy, fake, embeddings__model="off")
    # A word BM25 still matches (a stop word the query keeps) finds one now and then, no more.
    assert sum(p is not None for p in places) / len(places) < 0.1, places
