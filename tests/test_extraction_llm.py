"""`extraction.mode: llm` against the scripted upstream: what is sent, good answers, broken ones.

The model call goes to the fake upstream on a real socket with memproxy's own key; every
answer that is not exactly the schema (broken JSON, extra keys, an error status, a slow
answer) leaves the rules extractor's result standing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest

from proxy.memory.extraction import extract
from proxy.memory.extraction.llm import INSTRUCTIONS, RESPONSE_FORMAT, InvalidOutput, parse, prompt
from proxy.extracted import ExtractedEntity, ExtractedRelation, Extraction
from proxy.memory.learning.extractors import LLMExtractor
from proxy.calls.extraction_model import ModelCaller
from proxy.settings import UpstreamSettings
from proxy.http.upstream import Upstream
from tests.conftest import RunningProxy
from tests.extraction_helpers import db_rows, extracted, say
from tests.fake_upstream import FakeUpstream, JsonReply, Received, SlowHeaders, completion

TEXT = "I work at Northwind Traders and my parrot is called Kestrel."
OWN_KEY = "sk-memproxy-own"
CLIENT_KEY = "sk-client-key"  # what RunningProxy's openai clients send
LLM = {"memory__commit_timeout_ms": 5000, "extraction__mode": "llm", "extraction__model": "extract-model"}

GOOD = {
    "entities": [
        {"name": "Northwind Traders", "type": "organization", "description": "The user's employer", "confidence": 0.9},
        {"name": "Kestrel", "type": "pet", "description": "The user's parrot", "confidence": 0.8},
    ],
    "relationships": [
        {"from": "User", "type": "WORKS_AT", "to": "Northwind Traders"},
        {"from": "User", "type": "HAS_PARROT", "to": "Kestrel"},
    ],
}


def model_calls(fake: FakeUpstream) -> list[Received]:
    return [r for r in fake.chat_requests() if b"response_format" in r.body]


def graph(proxy: RunningProxy) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(entities as name, type, description; current edges as from, type, to) in the proxy's store."""
    entities = db_rows(proxy, "SELECT name, type, description FROM entities ORDER BY seq")
    edges = db_rows(proxy, "SELECT f.name, r.type, t.name FROM relationships r JOIN entities f ON f.id = r.from_id"
                           " JOIN entities t ON t.id = r.to_id WHERE r.invalid_at IS NULL ORDER BY r.seq")
    return entities, edges


RULES = ([("Northwind Traders", "organization", TEXT), ("Kestrel", "pet", f"parrot; {TEXT}"), ("User", "user", "")],
         [("User", "WORKS_AT", "Northwind Traders"), ("User", "HAS_PET", "Kestrel")])


def test_good_answer_is_used_and_the_call_carries_memproxys_key_only(make_proxy, fake):
    fake.queue(JsonReply(completion("Noted.")), JsonReply(completion(json.dumps(GOOD))))
    proxy = make_proxy(**LLM, extraction__api_key=OWN_KEY)
    say(proxy, fake, TEXT, "c1")
    extracted(proxy)
    assert graph(proxy) == (
        [("User", "user", ""), ("Northwind Traders", "organization", "The user's employer"),
         ("Kestrel", "pet", "The user's parrot")],
        [("User", "WORKS_AT", "Northwind Traders"), ("User", "HAS_PARROT", "Kestrel")],
    )
    chat, = [r for r in fake.chat_requests() if r not in model_calls(fake)]
    assert chat.header("authorization") == f"Bearer {CLIENT_KEY}"  # no upstream key: the client's goes on
    call, = model_calls(fake)
    assert call.target == "/v1/chat/completions" and call.method == "POST"
    assert call.header("authorization") == f"Bearer {OWN_KEY}"
    assert CLIENT_KEY not in json.dumps(call.headers) + call.body.decode()
    assert call.json() == {
        "model": "extract-model",
        "messages": [{"role": "system", "content": f"{INSTRUCTIONS}\nThe message was written by the user."},
                     {"role": "user", "content": TEXT}],
        "response_format": RESPONSE_FORMAT,
        "temperature": 0,
    }
    assert call.json()["response_format"]["type"] == "json_schema"
    assert call.json()["response_format"]["json_schema"]["strict"] is True


def test_upstream_api_key_serves_when_extraction_has_none(make_proxy, fake):
    fake.queue(JsonReply(completion("Noted.")), JsonReply(completion(json.dumps(GOOD))))
    proxy = make_proxy(**LLM, upstream__api_key="sk-upstream-own")
    say(proxy, fake, TEXT, "c1")
    extracted(proxy)
    assert [r.header("authorization") for r in fake.chat_requests()] == ["Bearer sk-upstream-own"] * 2


BROKEN = {
    "not json": JsonReply(completion("Sure! Here are the entities: Northwind")),
    "extra key": JsonReply(completion(json.dumps({**GOOD, "notes": "x"}))),
    "unknown end": JsonReply(completion(json.dumps({**GOOD, "relationships": [
        {"from": "User", "type": "WORKS_AT", "to": "Contoso"}]}))),
    "error status": JsonReply({"error": {"message": "overloaded", "type": "server_error"}}, status=500),
    "not a completion": JsonReply({"id": "x", "choices": []}),
    "no content": JsonReply(completion(None)),
}


@pytest.mark.parametrize("answer", list(BROKEN), ids=list(BROKEN))
def test_a_broken_answer_leaves_the_rules_result(make_proxy, fake, caplog, answer):
    fake.queue(JsonReply(completion("Noted.")), BROKEN[answer])
    proxy = make_proxy(**LLM, extraction__api_key=OWN_KEY)
    with caplog.at_level(logging.WARNING, logger="memproxy.extraction"):
        say(proxy, fake, TEXT, "c1")
        extracted(proxy)
    entities, edges = graph(proxy)
    assert (sorted(entities), edges) == (sorted(RULES[0]), RULES[1])
    assert len(model_calls(fake)) == 1
    assert any("the rules' result stands" in r.getMessage() for r in caplog.records)
    assert not any("Northwind" in r.getMessage() for r in caplog.records)  # the user's words stay out of the log
    assert proxy.app.state.parts.metrics.registry.get_sample_value("memproxy_extraction_fallbacks_total") == 1


def test_without_a_key_of_its_own_llm_mode_is_off_and_says_so(make_proxy, fake, caplog):
    with caplog.at_level(logging.INFO, logger="memproxy.extraction"):
        proxy = make_proxy(**LLM)
    assert any("extraction.mode llm is off" in r.getMessage() and "extraction.api_key" in r.getMessage()
               for r in caplog.records)
    say(proxy, fake, TEXT, "c1")
    extracted(proxy)
    assert model_calls(fake) == []
    entities, edges = graph(proxy)
    assert (sorted(entities), edges) == (sorted(RULES[0]), RULES[1])


def run_extractor(fake: FakeUpstream, *, timeout_s: float, concurrency: int = 4, texts: tuple[str, ...] = (TEXT,)
                  ) -> tuple[list[Extraction], float]:
    """The LLM extractor on its own, calling the fake upstream through a real Upstream client."""
    async def body() -> tuple[list[Extraction], float]:
        upstream = Upstream(UpstreamSettings(base_url=fake.url))
        extractor = LLMExtractor(ModelCaller(upstream, OWN_KEY, "extract-model"), concurrency=concurrency,
                                 timeout_s=timeout_s)
        started = time.monotonic()
        try:
            found = await asyncio.gather(*(extractor(text, None) for text in texts))
        finally:
            await upstream.aclose()
        return list(found), time.monotonic() - started
    return asyncio.run(body())


def test_a_slow_answer_times_out_to_the_rules(fake):
    fake.queue(SlowHeaders(30))
    (found,), took = run_extractor(fake, timeout_s=0.3)
    assert found == extract(TEXT)
    assert took < 5


def test_model_calls_are_bounded_in_number(fake):
    fake.queue(*[SlowHeaders(0.3, JsonReply(completion(json.dumps(GOOD)))) for _ in range(4)])
    found, took = run_extractor(fake, timeout_s=10, concurrency=2, texts=(TEXT,) * 4)
    assert all(f.relationships[1].type == "HAS_PARROT" for f in found)
    assert took >= 0.6  # four answers of 0.3 s each, two calls at a time


def test_speaker_other_than_the_user_is_named_in_the_prompt():
    system, user = prompt("You work at Globex.", "Assistant")
    assert system["content"].endswith(
        'The message was written by "Assistant" to the user; use "Assistant" for its writer.')
    assert user == {"role": "user", "content": "You work at Globex."}


def test_parse_reads_exactly_the_schema():
    assert parse(json.dumps(GOOD)) == Extraction(
        [ExtractedEntity("Northwind Traders", "organization", "The user's employer", 0.9),
         ExtractedEntity("Kestrel", "pet", "The user's parrot", 0.8)],
        [ExtractedRelation("User", "WORKS_AT", "Northwind Traders"),
         ExtractedRelation("User", "HAS_PARROT", "Kestrel")],
    )
    spaced = {"entities": [{"name": " Acme  Corp ", "type": "Organization", "description": "", "confidence": 1}],
              "relationships": [{"from": "user", "type": "works at", "to": "acme corp"}]}
    assert parse(json.dumps(spaced)) == Extraction([ExtractedEntity("Acme Corp", "organization", "", 1.0)],
                                                   [ExtractedRelation("user", "WORKS_AT", "acme corp")])


def test_parse_never_lets_the_model_name_the_users_own_node_and_drops_control_characters():
    # The user's node is found by its type; a model's "user" (say "Bob is our newest user", or
    # an injected answer) is a person. A NUL in a name lost the message's facts on PostgreSQL.
    answer = {"entities": [{"name": "Bob\u0000", "type": "User", "description": "our\tnewest\nuser",
                            "confidence": 0.8}], "relationships": []}
    assert parse(json.dumps(answer)) == Extraction([ExtractedEntity("Bob", "person", "our newest user", 0.8)], [])


def _entity(**change: Any) -> dict[str, Any]:
    return {"entities": [{"name": "Acme", "type": "organization", "description": "", "confidence": 0.5, **change}],
            "relationships": []}


@pytest.mark.parametrize("answer", [
    "", "[]", "null", '{"entities": []}', json.dumps({**GOOD, "extra": 1}),
    json.dumps({"entities": {}, "relationships": []}),
    json.dumps({"entities": [{"name": "Acme"}], "relationships": []}),
    json.dumps(_entity(name="")), json.dumps(_entity(name="   ")), json.dumps(_entity(name=7)),
    json.dumps(_entity(name="A" * 201)), json.dumps(_entity(type="two words?")), json.dumps(_entity(type="")),
    json.dumps(_entity(confidence=1.5)), json.dumps(_entity(confidence=-0.1)), json.dumps(_entity(confidence=True)),
    json.dumps(_entity(confidence="0.5")), json.dumps(_entity(description=None)), json.dumps(_entity(extra=1)),
    json.dumps({**_entity(), "relationships": [{"from": "User", "type": "WORKS-AT!", "to": "Acme"}]}),
    json.dumps({**_entity(), "relationships": [{"from": "User", "type": "WORKS_AT", "to": "Globex"}]}),
    json.dumps({**_entity(), "relationships": [{"from": "User", "type": "WORKS_AT"}]}),
    json.dumps({"entities": [_entity()["entities"][0]] * 51, "relationships": []}),
    "[" * 100_000,
], ids=lambda answer: answer[:40])
def test_parse_refuses_anything_else(answer):
    with pytest.raises(InvalidOutput):
        parse(answer)
