"""Precision: what a user notices first is a block that answers beside lines that do not.

Facts are taught through the proxy (and one through the memory API) in several earlier
conversations, then asked about in fresh ones with six slots. For each question, the line
that answers it comes before every line that shares nothing with the question, and such
unrelated lines are fewer than half of the block.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from proxy.memory.retrieval.block import DEFAULT_HEADER, GRAPH_NOTE
from proxy.terms import query_terms, terms
from tests.api_helpers import api_url
from tests.extraction_helpers import extracted, hits
from tests.fake_upstream import JsonReply, completion

USER = "pat"
TAUGHT = [
    "I love Python and I use it every day.",
    "I live in Lisbon these days.",
    "I work at Northwind Traders.",
    "My dog is called Biscuit.",
    "My favourite editor is Helix.",
    "I prefer green tea over coffee.",
    "My daughter is called Lena.",
]
# (question, the word of the line that answers it)
ASKED = [
    ("what's my dog's name?", "Biscuit"),
    ("which seat do I like on trains?", "aisle"),
    ("what's my daughter's name?", "Lena"),
    ("Where do I live?", "Lisbon"),
    ("Which editor do I use?", "Helix"),
]


def ask(proxy: Any, fake: Any, question: str, conversation: str) -> list[str]:
    proxy.client(**{"X-Memory-User": USER, "X-Memory-Conversation": conversation}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": question}])
    return hits(json.loads(fake.chat_requests()[-1].body)["messages"][-1]["content"])


def unrelated(line: str, question: str, answer: str) -> bool:
    """A line that neither answers the question nor shares a word with it."""
    return answer not in line and not set(query_terms(question)) & set(terms(line.split("] ", 1)[1]))


def assert_precise(lines: list[str], question: str, answer: str) -> None:
    answering = [n for n, line in enumerate(lines) if answer in line]
    noise = [n for n, line in enumerate(lines) if unrelated(line, question, answer)]
    assert answering, f"{question!r}: no line answers it in {lines}"
    assert all(answering[0] < n for n in noise), f"{question!r}: unrelated lines before the answer in {lines}"
    assert len(noise) < len(lines) / 2, f"{question!r}: mostly unrelated lines in {lines}"


def test_the_answer_comes_before_unrelated_lines_and_they_are_few(make_proxy: Any, fake: Any) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000, memory__max_memories=6)
    # Asked before it was told: the assistant's non-answer is saved like any reply.
    fake.queue(JsonReply(completion("I'm sorry, I don't know your daughter's name. You haven't told me.")))
    ask(proxy, fake, "what's my daughter's name?", "too-early")
    for n, fact in enumerate(TAUGHT):
        ask(proxy, fake, fact, f"teach-{n}")
    with proxy.http() as api:
        assert api.post(api_url(USER, "memories"), json={"content": "Prefers aisle seats on trains",
                                                          "type": "user_preference"}).status_code == 201
    extracted(proxy)
    for n, (question, answer) in enumerate(ASKED):
        lines = ask(proxy, fake, question, f"ask-{n}")
        assert_precise(lines, question, answer)
        assert not any("don't know your daughter" in line for line in lines)


def test_a_fact_is_found_by_the_very_next_request(make_proxy: Any, fake: Any) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000, memory__max_memories=6)
    ask(proxy, fake, "I live in Porto and my manager is Dana.", "c1")
    lines = ask(proxy, fake, "Who is my manager?", "c2")
    assert "[graph] (User)-[HAS_MANAGER]->(Dana)" in lines
    assert_precise(lines, "Who is my manager?", "Dana")


def test_a_question_asked_again_is_no_memory_and_its_answer_is(make_proxy: Any, fake: Any) -> None:
    """Taught in one chat, asked (typed in haste) and answered in a second, asked again in a third:
    the earlier question takes no line, its answer does, and the question is not carried with it."""
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    fake.queue(JsonReply(completion("What a lovely name!")))
    ask(proxy, fake, "My cat is called Biscuit.", "taught")
    extracted(proxy)
    fake.queue(JsonReply(completion("Biscuit, the tabby.")))
    ask(proxy, fake, "what's my cat called", "asked")
    extracted(proxy)
    ask(proxy, fake, "What is my cat called?", "asked-again")
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    assert json.loads(fake.chat_requests()[-1].body)["messages"][-1]["content"] == "\n".join([
        DEFAULT_HEADER,
        "1. [long-term] Biscuit — cat; My cat is called Biscuit.",
        "2. [graph] (User)-[HAS_PET]->(Biscuit, cat)",
        f"3. [cross-session] assistant ({day}): Biscuit, the tabby.",
        f"4. [cross-session] user ({day}): My cat is called Biscuit. | assistant: What a lovely name!",
        GRAPH_NOTE,
        "",
        "What is my cat called?",
    ])
