"""The keyword retry."""

from __future__ import annotations

import pytest

from proxy.memory.keywords import rank_by_shared_words, retry_terms, variants


@pytest.mark.parametrize(
    ("query", "words"),
    [
        # possessive stripped, case kept as typed, longest first, ties by first appearance
        ("Where does Alice's sister work these days?", ["sister", "Alice", "work", "days"]),
        ("where do I work?", ["work"]),
        ("What's my dog's name, and where's the vet’s office?", ["office", "name", "dog", "vet"]),
        # contractions fold to their stop word; punctuation goes, inner punctuation stays
        ("Isn't it (really) O'Brien's kebab-case thing?!", ["kebab-case", "O'Brien", "thing"]),
        ("the parents' house", ["parents", "house"]),
        # each word once, whatever its case; at least 3 characters
        ("Go go GO to Acme acme at 9 or 10", ["Acme"]),
        ("is internal-hbr-2291.example up?", ["internal-hbr-2291.example"]),
        ("", []),
        ("what is it?", []),
    ],
)
def test_retry_terms(query: str, words: list[str]) -> None:
    assert retry_terms(query) == words


def test_retry_terms_keeps_at_most_four() -> None:
    assert retry_terms("alpha beta gamma delta epsilon zeta") == ["epsilon", "alpha", "gamma", "delta"]


@pytest.mark.parametrize(
    ("word", "forms"),
    [("alice", ["alice", "Alice"]), ("Alice", ["Alice"]), ("SISTER", ["SISTER", "Sister"]), ("kebab-case", ["kebab-case", "Kebab-case"])],
)
def test_variants(word: str, forms: list[str]) -> None:
    assert variants(word) == forms


def test_rank_by_shared_words_is_stable_and_dedupes() -> None:
    candidates = [
        ("m1", "Lunch was fine."),
        ("m2", "Alice's sister works at Acme."),
        ("m3", "My sister visited."),
        ("m2", "Alice's sister works at Acme."),
        ("m4", "Her sister Alice worked there for years"),
    ]
    assert rank_by_shared_words(candidates, "Where does Alice's sister work these days?") == ["m2", "m4", "m3", "m1"]
    assert rank_by_shared_words([], "anything") == []
