"""What every source is asked: identifier terms, first person, what the request shows, relevance."""

from __future__ import annotations

import pytest

from proxy.memory.retrieval.keywords import question_terms
from proxy.memory.retrieval.sources import SourceQuery, identifier_terms
from proxy.memory.retrieval.sources.long_term import first_person
from proxy.models import Scope
from proxy.terms import terms


@pytest.mark.parametrize(
    ("identifier", "term"),
    [
        ("internal-hbr-2291.example", "internal_hbr_2291_example"),
        ("ENABLE_FAST_PATH", "enable_fast_path"),
        ("getUserName", "getusername"),
        ("INV-4471", "inv_4471"),
        ("deadbeef1234", "deadbeef1234"),
        ("/etc/hosts", "etc_hosts"),
    ],
)
def test_identifier_terms_are_the_whole_index_term(identifier: str, term: str) -> None:
    assert identifier_terms([identifier]) == (term,)
    # The same term a stored document holding the identifier is indexed under.
    assert term in terms(f"we used {identifier} there")


def test_identifier_terms_once_each() -> None:
    assert identifier_terms(["a-b-c1", "A_B_C1", "x.example"]) == ("a_b_c1", "x_example")
    assert identifier_terms([]) == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("where do I work?", True),
        ("I'm moving next week", True),
        ("what's my dentist's name", True),
        ("remind me later", True),
        ("is it mine?", True),
        ("ask myself", True),
        ("where does Alice work?", False),
        ("Mine craft? minecraft and myselfish", True),
        ("minecraft and myselfish, imagine", False),
    ],
)
def test_first_person(text: str, expected: bool) -> None:
    assert first_person(text) is expected


def test_shows_compares_whitespace_normalised_text_and_the_query() -> None:
    q = SourceQuery(Scope("u"), "what is the  plan?", ("plan",), "c1", ("first line\n  second line ",))
    assert q.shows("first line second line")
    assert q.shows("what is the plan?")
    assert not q.shows("first line")
    assert not q.shows("First line second line")  # case is part of what was said


def test_shows_sees_through_redaction() -> None:
    secret = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"
    q = SourceQuery(Scope("u"), "hi", ("hi",), "c1", (f"my key is {secret} ok",))
    assert q.shows("my key is [REDACTED:openai_key] ok")
    assert not q.shows("your key is [REDACTED:openai_key] ok")


@pytest.mark.parametrize(("floor", "score", "relevant"), [(0.0, 0.5, True), (0.0, 0.0, False), (1.0, 0.9, False),
                                                          (1.0, 1.0, True)])
def test_relevance_floor(floor: float, score: float, relevant: bool) -> None:
    assert SourceQuery(Scope("u"), "q", ("q",), "c", relevance_floor=floor).relevant(score) is relevant


def test_a_bare_question_the_query_holds_every_word_of_is_the_question_asked_again() -> None:
    asked = "Remind me: what are my cats called?"
    q = SourceQuery(Scope("u"), asked, tuple(question_terms(asked)), "c1")
    assert q.asks_again("What are my cats called?")
    assert q.asks_again("what are my cats called")  # typed without its "?"
    assert q.says("what are my cats called") and not q.shows("what are my cats called")
    assert not q.asks_again("What are my cats' names and ages?")  # a word of its own
    assert not q.asks_again("My cats are called Biscuit and Mochi")  # says, not asks
    assert not q.asks_again("What are my cats called? Biscuit, I think.")  # its answer with it
    assert not q.asks_again("what my cats are called is Biscuit and Mochi.")
