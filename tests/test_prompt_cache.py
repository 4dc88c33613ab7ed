"""Memory keeps Claude Code's prompt cache: a Claude-Code-shaped session through the real proxy,
its requests as the upstream received them run through a model of Anthropic's prompt cache
(bench/anthropic_cache.py), with memory off and on. The cached share of input tokens with
memory on must be within 5 points of memory off (docs/performance.md, prompt caching)."""

from __future__ import annotations

from typing import Any

import httpx

from bench.anthropic_cache import CacheUsage, PromptCache, cached_share
from bench.claude_code_session import SYSTEM, answer, replay, tools
from tests.fake_anthropic import default_reply
from tests.fake_upstream import JsonReply, Received, Reply

TURNS = 6
FACT = "The billing service's retry policy is three attempts with jitter, decided in the March review"


def run_session(proxy, fake, headers: dict[str, str]) -> tuple[list[CacheUsage], list[str]]:
    """Replay the session; each request's cache usage at the upstream and its X-Memory-Injected."""
    fake.reset()
    cache, usages, injected = PromptCache(), [], []

    def provider(request: Received) -> Reply:
        if not request.target.split("?")[0].endswith("/messages"):
            return default_reply(request)
        usages.append(cache.request(request.json()))
        return JsonReply(answer(request.json(), len(usages)))

    with httpx.Client(base_url=proxy.url, timeout=30, headers={
            "x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01", **headers}) as http:

        def send(body: dict[str, Any]) -> dict[str, Any]:
            fake.queue(provider)
            response = http.post("/v1/messages", json=body)
            assert response.status_code == 200, response.text
            injected.append(response.headers.get("x-memory-injected", "-"))
            return dict(response.json())

        sent = replay(TURNS, send)
    assert len(usages) == sent
    return usages, injected


def test_memory_keeps_the_cached_share_of_a_claude_code_session(make_proxy, fake):
    proxy = make_proxy(upstream__anthropic_base_url=fake.url, extraction__from_roles=[])
    off, off_injected = run_session(proxy, fake, {})
    with httpx.Client(base_url=proxy.url, timeout=30) as http:  # something for recall to find
        taught = http.post("/v1/messages", headers={"x-api-key": "k", "anthropic-version": "2023-06-01",
                                                     "x-memory-user": "dev", "x-memory-conversation": "teach"},
                           json={"model": "claude-test", "max_tokens": 100,
                                 "messages": [{"role": "user", "content": FACT}]})
        assert taught.status_code == 200
    on, on_injected = run_session(proxy, fake, {"x-memory-user": "dev"})

    # The same session went upstream both times: 6 turns, 2 of them with a tool step.
    assert len(off) == len(on) == TURNS + 2
    assert set(off_injected) == {"-"}
    # Memory really ran: a block went into most requests.
    assert sum(int(n) > 0 for n in on_injected) >= TURNS
    # And its block was in what went upstream, after the breakpoint the client set.
    assert sum(u.input_tokens for u in on) > sum(u.input_tokens for u in off)
    off_share, on_share = cached_share(off), cached_share(on)
    assert off_share > 0.8
    assert abs(on_share - off_share) <= 0.05
    # Tools and system are most of every request and never change, so the share alone would hide
    # a block that broke the conversation's prefix (one before the prompt drops the reads below
    # half of memory off's): the reads past them must stay close too.
    fixed = PromptCache().request({"tools": tools(), "system": SYSTEM, "messages": []}).input_tokens
    off_reads, on_reads = (sum(max(0, u.cache_read_tokens - fixed) for u in run) for run in (off, on))
    assert on_reads >= 0.8 * off_reads > 0
