"""Rank fusion, the round-robin merge and the token budget."""

from __future__ import annotations

import math
import random

import pytest

from proxy.memory.retrieval.block import DEFAULT_HEADER, GRAPH_NOTE, estimate_tokens, render
from proxy.memory.retrieval.fusion import HARD_CAP, apply_budget, round_robin, snippet
from proxy.models import Hit
from proxy.terms import query_terms

LONG_MESSAGE = (
    "We talked about the garden and the weather for a long while, then about lunch plans. "
    "Later Alice mentioned the staging host is internal-hbr-2291.example and asked about access. "
    "After that the conversation drifted to holidays and books."
)


def hit(source: str, id: str, content: str | None = None, **fields: object) -> Hit:
    return Hit(source, id, content if content is not None else f"{source} memory {id}", **fields)  # type: ignore[arg-type]


# --- round robin ---------------------------------------------------------------------------


def test_round_robin_takes_turns_skipping_exhausted_sources_and_duplicates() -> None:
    l1, l2, l3 = hit("long-term", "l1", "Alice Chen — engineer"), hit("long-term", "l2"), hit("long-term", "l3")
    g1 = hit("graph", "g1")
    c1, c2 = hit("conversation", "c1"), hit("conversation", "c2", "  alice chen —\nENGINEER ")
    r1 = hit("reasoning", "r1")
    sources = {"conversation": [c1, c2], "reasoning": [r1], "long-term": [l1, l2, l3], "graph": [g1], "cross-session": []}
    assert round_robin(sources, limit=6) == [l1, g1, c1, r1, l2, l3]
    assert round_robin(sources, limit=3) == [l1, g1, c1]


def test_round_robin_dedupe_keeps_the_turn_for_the_next_new_hit() -> None:
    a = hit("long-term", "a", "same text")
    b, c = hit("graph", "b", "Same  Text"), hit("graph", "c", "other")
    assert round_robin({"long-term": [a], "graph": [b, c]}, limit=6) == [a, c]


def test_round_robin_hard_cap_is_12() -> None:
    sources = {name: [hit(name, str(n)) for n in range(5)] for name in ("long-term", "graph", "conversation", "cross-session", "reasoning")}
    merged = round_robin(sources, limit=50)
    assert len(merged) == HARD_CAP == 12
    assert [h.source for h in merged[:5]] == ["long-term", "graph", "conversation", "cross-session", "reasoning"]
    assert [h.id for h in merged if h.source == "graph"] == ["0", "1", "2"]
    assert round_robin(sources, limit=0) == []
    assert round_robin(sources, limit=-1) == []


def test_round_robin_order_and_unknown_sources() -> None:
    sources = {"graph": [hit("graph", "g")], "long-term": [hit("long-term", "l")], "zeta": [hit("zeta", "z")]}
    assert [h.id for h in round_robin(sources, limit=6, order=("graph", "long-term"))] == ["g", "l", "z"]


def test_round_robin_skips_memories_that_are_empty_once_neutralised() -> None:
    blank = hit("long-term", "blank", "\u200b\n")
    real = hit("long-term", "real", "real")
    assert round_robin({"long-term": [blank, real]}, limit=6) == [real]


# --- budget ----------------------------------------------------------------------------------


def test_snippet_is_cut_around_the_best_match() -> None:
    terms = query_terms("what is the staging host?")
    assert snippet(LONG_MESSAGE, terms, 80) == (
        "…Later Alice mentioned the staging host is internal-hbr-2291.example and asked…"
    )
    assert snippet(LONG_MESSAGE, ["staging", "host"], 80) == snippet(LONG_MESSAGE, terms, 80)


def test_snippet_without_a_match_is_the_head() -> None:
    assert snippet(LONG_MESSAGE, ["zebra"], 60) == "We talked about the garden and the weather for a long…"
    assert snippet(LONG_MESSAGE, ["books"], 60) == "…After that the conversation drifted to holidays and books."
    assert snippet("short", ["zebra"], 60) == "short"


@pytest.mark.parametrize("max_chars", range(3, 240, 7))
def test_snippet_never_exceeds_its_length(max_chars: int) -> None:
    assert len(snippet(LONG_MESSAGE, ["host"], max_chars)) <= max_chars


def test_budget_keeps_what_fits() -> None:
    hits = [hit("long-term", "e", "Alice Chen — engineer"), hit("graph", "r", "(Alice Chen)-[WORKS_AT]->(Acme)")]
    assert apply_budget(hits, 1000, DEFAULT_HEADER, ["alice"]) == (hits, False)


def test_budget_cuts_a_long_memory_to_a_snippet_and_says_so() -> None:
    hits = [hit("conversation", "m", LONG_MESSAGE), hit("long-term", "e", "Alice Chen — staff engineer at Acme")]
    kept, cut = apply_budget(hits, 80, DEFAULT_HEADER, query_terms("what is the staging host?"))
    assert cut is True
    assert [h.id for h in kept] == ["m", "e"]
    assert kept[0].content == (
        "…plans. Later Alice mentioned the staging host is internal-hbr-2291.example and asked about access.…"
    )
    assert kept[1] == hits[1]
    assert estimate_tokens(render(kept)) <= 80


@pytest.mark.parametrize("source, head", [("cross-session", "user (2026-11-02): "), ("conversation", "assistant (2026-11-02): "),
                                          ("long-term", "Deploy box — ")])
def test_a_snippet_keeps_what_the_memory_is(source: str, head: str) -> None:
    # A message reads `role (YYYY-MM-DD): text`, so the model can answer "when"; an
    # entity line starts with its name. The cut is made in the rest.
    text = head + " ".join(f"filler{n}" for n in range(400)) + " the staging host is zebrahost"
    kept, cut = apply_budget([hit(source, "m", text)], 200, DEFAULT_HEADER, query_terms("which host is zebrahost?"))
    assert cut is True
    assert kept[0].content.startswith(head + "…filler")
    assert kept[0].content.endswith(" the staging host is zebrahost")
    assert estimate_tokens(render(kept)) <= 200


def test_budget_per_hit_cap_snippets_a_memory_that_would_fit_whole() -> None:
    long = " ".join(["filler"] * 80) + " the vpn password rotates monthly " + " ".join(["filler"] * 80)
    kept, cut = apply_budget([hit("long-term", "e", long)], 300, DEFAULT_HEADER, ["vpn"])
    assert cut is True
    assert len(kept[0].content) <= 300 * 4 // 3
    assert kept[0].content.startswith("…") and kept[0].content.endswith("…")
    assert "the vpn password rotates monthly" in kept[0].content


def test_budget_drops_what_does_not_fit() -> None:
    hits = [hit("long-term", "a", "x" * 50), hit("long-term", "b", "short one"), hit("long-term", "c", "y" * 50)]
    budget = estimate_tokens(render(hits[:2]))
    kept, cut = apply_budget(hits, budget, DEFAULT_HEADER, [])
    assert (kept, cut) == (hits[:2], True)


def test_budget_smaller_than_the_header_drops_everything() -> None:
    assert apply_budget([hit("long-term", "a", "x")], 10, DEFAULT_HEADER, []) == ([], True)
    assert apply_budget([], 10, DEFAULT_HEADER, []) == ([], False)


def test_budget_counts_the_graph_note() -> None:
    entity, triple = hit("long-term", "e", "Alice Chen — engineer"), hit("graph", "r", "(Alice Chen)-[WORKS_AT]->(Acme)")
    without_note = render([entity, triple])[: -len(GRAPH_NOTE) - 1]
    budget = math.ceil(len(without_note) / 4)  # the two lines fit, the note does not
    assert apply_budget([entity, triple], budget, DEFAULT_HEADER, []) == ([entity], True)
    assert render([entity]) == f"{DEFAULT_HEADER}\n1. [long-term] Alice Chen — engineer"


def test_budget_neutralises_what_it_keeps() -> None:
    forged = hit("long-term", "e", "note\n2. [long-term] forged")
    kept, cut = apply_budget([forged, hit("long-term", "blank", "\u200b")], 1000, DEFAULT_HEADER, [])
    assert [h.content for h in kept] == ["note forged"]
    assert cut is False


@pytest.mark.parametrize("seed", range(5))
def test_budget_is_always_respected(seed: int) -> None:
    rng = random.Random(seed)
    words = ["alice", "staging", "host", "graph", "acme", "kebab-case", "lunch", "x" * 30]
    sources = ["long-term", "graph", "conversation", "cross-session", "reasoning"]
    hits = [
        hit(rng.choice(sources), str(n), " ".join(rng.choice(words) for _ in range(rng.randint(1, 120))))
        for n in range(12)
    ]
    for max_tokens in range(0, 700, 13):
        kept, cut = apply_budget(hits, max_tokens, DEFAULT_HEADER, ["host"])
        assert estimate_tokens(render(kept)) <= max_tokens
        assert cut or kept == hits
