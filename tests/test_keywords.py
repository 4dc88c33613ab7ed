"""The keyword retry, and the terms a question is searched by."""

from __future__ import annotations

import pytest

from proxy.memory.retrieval.keywords import question_terms, rank_by_shared_words, retry_terms, variants


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


def test_question_terms_leave_out_the_words_that_only_shape_the_question() -> None:
    assert question_terms("Would Caroline likely pursue writing as a career option?") == [
        "carolin", "pursu", "write", "career", "option"]
    assert question_terms("Remind me of my tax reference number.") == ["tax", "refer", "number"]
    # Whole words only: "like" names what is asked; an identifier keeps every part.
    assert question_terms("which seat do I like on trains?") == ["seat", "like", "train"]
    assert question_terms("What is the MAX_TYPE flag?") == ["max_type", "max", "type", "flag"]
    # "how many" and "how much" ask for a count, which no memory states by those words;
    # "many" elsewhere is what is said ("so many dogs").
    assert question_terms("How many hikes has Joanna been on?") == ["hike", "joanna"]
    assert question_terms("How much did the trip cost?") == ["trip", "cost"]
    assert question_terms("What did Audrey get with so many dogs?") == ["audrey", "get", "mani", "dog"]
    # A question of nothing else keeps its words.
    assert question_terms("What do you remember?") == ["rememb"]
