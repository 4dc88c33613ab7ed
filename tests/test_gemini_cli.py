"""Gemini CLI itself against memproxy: the pinned `gemini -p` with an API key, memproxy as its
Gemini base URL, and the scripted Gemini upstream, all on loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agent_clis import run_gemini
from tests.fake_gemini import answer, function_call, gemini_requests, pieces, sse
from tests.fake_upstream import JsonReply, Received, Reply, SSEReply
from tests.proxy_db import eventually, rows

FACT = "My dog's name is Biscuit-7731"
QUESTION = "what is my dog called? check the files here too"
ROUTER = "You are a specialized Task Routing AI"


@pytest.fixture
def mem(make_proxy, fake):
    return make_proxy(upstream__gemini_base_url=fake.url.removesuffix("/v1"), memory__commit_timeout_ms=5000,
                      extraction__from_roles=[])


def scripted(final: str, *, call: bool) -> Reply | Any:
    """Gemini CLI's requests answered by what they are: the router's JSON, a step asking to list the
    directory (with `call`, before any result came back), the final answer."""
    def reply(request: Received) -> Reply:
        body = request.json()
        if ROUTER in json.dumps(body.get("systemInstruction")):
            return JsonReply(answer(json.dumps({"complexity_reasoning": "simple", "complexity_score": 10})))
        answered = any("functionResponse" in part for content in body["contents"] for part in content["parts"])
        if call and not answered:
            return SSEReply(sse(pieces("Let me look.", calls=[function_call("list_directory", {"dir_path": "."})])))
        return SSEReply(sse(pieces(final)))
    return reply


def session(proxy, fake, tmp_path: Path, prompt: str, final: str, *, call: bool = False) -> list[Received]:
    """One headless run; the Gemini requests it made."""
    before = len(gemini_requests(fake.received))
    fake.queue(*[scripted(final, call=call)] * 6)
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    (workdir / "notes.txt").write_text("nothing here\n")
    done = run_gemini(prompt, base_url=proxy.url, home=tmp_path / "home", workdir=workdir,
                      headers={"X-Memory-User": "alice"})
    fake.clear_queue()
    assert done.returncode == 0, done.stderr[-2000:]
    assert final in done.stdout
    return gemini_requests(fake.received)[before:]


def turn_requests(requests: list[Received]) -> list[dict[str, Any]]:
    return [r.json() for r in requests if ROUTER not in json.dumps(r.json().get("systemInstruction"))]


def saved(proxy) -> list[tuple[str, str]]:
    return rows(proxy, "SELECT role, content FROM messages WHERE user_id = 'alice' ORDER BY seq")


def test_a_fact_told_in_one_session_reaches_the_provider_in_the_next(mem, fake, tmp_path):
    first = session(mem, fake, tmp_path, FACT, "Noted, Biscuit-7731.")
    assert any(ROUTER in json.dumps(r.json().get("systemInstruction")) for r in first)  # the router ran
    (turn,) = turn_requests(first)
    context, words = turn["contents"][-1]["parts"]
    assert context["text"].startswith("<session_context>") and words == {"text": FACT}
    # The router's request and the session context are never the user's words.
    assert eventually(lambda: saved(mem) == [("user", FACT), ("assistant", "Noted, Biscuit-7731.")])

    second = session(mem, fake, tmp_path, QUESTION, "Your dog is Biscuit-7731.", call=True)
    steps = turn_requests(second)
    assert len(steps) == 2  # the step asking for the listing, and the one with its result
    routers = [r.json() for r in first + second if ROUTER in json.dumps(r.json().get("systemInstruction"))]
    assert len(routers) == 2 and not any(FACT in json.dumps(r["contents"]) for r in routers[1:])  # no block
    with mem.http() as http:
        assert 'memproxy_side_requests_total{rule="gemini_cli_router",wire="gemini_generate_content"} 2.0' in \
            http.get("/metrics").text
    for step in steps:
        prompt = next(c for c in steps[0]["contents"] if c.get("role") == "user")
        assert step["contents"][0] == prompt  # the same bytes on every step
    context, block, words = steps[0]["contents"][0]["parts"]
    assert context["text"].startswith("<session_context>")
    assert FACT in block["text"] and block["text"].endswith("\n\n")
    assert words == {"text": QUESTION}
    # The tool loop is one turn, saved once, its step in the trace.
    assert eventually(lambda: saved(mem)[2:] == [("user", QUESTION), ("assistant", "Your dog is Biscuit-7731.")])
    assert len(saved(mem)) == 4
    ((trace,),) = rows(mem, "SELECT steps FROM reasoning")
    assert [step["name"] for step in json.loads(trace)] == ["list_directory"]
    assert "notes.txt" in json.loads(trace)[0]["result"]
