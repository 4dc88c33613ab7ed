"""pre_tool_use / post_tool_use at the API tools mode calls (proxy.memory.hooks.runner.Hooks), with real handlers."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.calls.http_hooks import HookPoster
from proxy.memory.hooks.runner import HookContext, ToolDecision, load_hooks
from proxy.metrics import Metrics
from proxy.settings import parse_hooks
from tests.test_hooks import H, HookServer, hook_server  # noqa: F401 (the fixture)

ALICE = HookContext("alice", "c1", None, "turn-1", "openai_chat")
STORE = {"content": "prefers Go", "type": "user_preference"}


def run(hooks: list[dict[str, Any]], work: Any) -> tuple[Any, Metrics]:
    async def main() -> Any:
        poster = HookPoster()
        metrics = Metrics()
        try:
            built = load_hooks(parse_hooks(hooks), poster, metrics)
            assert built is not None
            return await work(built), metrics
        finally:
            await poster.aclose()
    return asyncio.run(main())


def failures(metrics: Metrics, event: str, reason: str) -> float:
    return metrics.registry.get_sample_value("memproxy_hook_failures_total", {"event": event, "reason": reason}) or 0


def test_deny_gives_the_model_the_reason_and_skips_the_hooks_after_it(hook_server):
    hooks = [{"event": "pre_tool_use", "matcher": "store_memory", "python": H + "deny_writes"},
             {"event": "pre_tool_use", "url": hook_server.url("/after")}]
    decision, _ = run(hooks, lambda h: h.pre_tool_use(ALICE, "store_memory", STORE))
    assert decision == ToolDecision(STORE, denied="store_memory is read-only for alice")
    assert hook_server.received == []


def test_matchers_pick_the_tools_a_hook_sees(hook_server):
    hooks = [{"event": "pre_tool_use", "matcher": "store_memory", "python": H + "deny_writes"},
             {"event": "pre_tool_use", "matcher": "*", "url": hook_server.url("/all")},
             {"event": "pre_tool_use", "matcher": "query_memory|other", "url": hook_server.url("/list")},
             {"event": "pre_tool_use", "matcher": "query_.*", "url": hook_server.url("/regex")},
             {"event": "pre_tool_use", "matcher": "store_.*", "url": hook_server.url("/not-this")}]
    decision, _ = run(hooks, lambda h: h.pre_tool_use(ALICE, "query_memory", {"query": "editor"}))
    assert decision == ToolDecision({"query": "editor"})
    assert [path for path, _ in hook_server.received] == ["/all", "/list", "/regex"]


def test_updated_input_chains_in_order(hook_server):
    hook_server.answers["/limit"] = lambda event: {"updated_input": {**event["input"], "limit": 3}}
    hooks = [{"event": "pre_tool_use", "python": H + "tag_input"},
             {"event": "pre_tool_use", "url": hook_server.url("/limit")}]
    decision, _ = run(hooks, lambda h: h.pre_tool_use(ALICE, "store_memory", STORE))
    assert hook_server.inputs("/limit")[0]["input"] == {**STORE, "tags": ["python"]}
    assert hook_server.inputs("/limit")[0]["tool"] == "store_memory"
    assert decision == ToolDecision({**STORE, "tags": ["python"], "limit": 3})


def test_updated_output_reaches_the_model(hook_server):
    hook_server.answers["/out"] = lambda event: {"updated_output": event["output"].replace("7741", "[code]")}
    hooks = [{"event": "post_tool_use", "url": hook_server.url("/out")}]
    output, _ = run(hooks, lambda h: h.post_tool_use(ALICE, "query_memory", {"query": "vault"}, "1. the code is 7741"))
    assert output == "1. the code is [code]"
    assert hook_server.inputs("/out")[0]["input"] == {"query": "vault"}


def test_a_failing_tool_hook_is_skipped_and_counted(hook_server):
    hooks = [{"event": "pre_tool_use", "python": H + "raising"},
             {"event": "pre_tool_use", "python": H + "hanging", "timeout_ms": 100},
             {"event": "post_tool_use", "python": H + "garbage"}]

    async def both(h: Any) -> Any:
        return await h.pre_tool_use(ALICE, "store_memory", STORE), await h.post_tool_use(ALICE, "q", {}, "out")
    (decision, output), metrics = run(hooks, both)
    assert decision == ToolDecision(STORE) and output == "out"
    assert failures(metrics, "pre_tool_use", "error") == 1 and failures(metrics, "pre_tool_use", "timeout") == 1
    assert failures(metrics, "post_tool_use", "bad_answer") == 1


def test_a_store_memory_write_goes_through_pre_memory_write_as_role_memory(hook_server):
    hook_server.answers["/mask"] = lambda event: {"updated_turns": [{"role": "memory", "content": "masked"}]}
    hooks = [{"event": "pre_memory_write", "url": hook_server.url("/mask")}]
    texts, _ = run(hooks, lambda h: h.pre_memory_write(ALICE, [("memory", "MRN-123456 prefers Go")]))
    assert texts == ["masked"]
    assert hook_server.inputs("/mask")[0]["turns"] == [{"role": "memory", "content": "MRN-123456 prefers Go"}]


def test_a_sync_hook_runs_off_the_event_loop():
    hooks = [{"event": "stop", "python": H + "blocking_sleep"}]

    async def concurrently(h: Any) -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        ticker = asyncio.create_task(tick())
        await h.stop(ALICE, "answer")
        ticker.cancel()
        return ticks
    ticks, _ = run(hooks, concurrently)
    assert ticks >= 10  # the loop kept running through the hook's 300 ms sleep
