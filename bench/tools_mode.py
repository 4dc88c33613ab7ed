"""Tools mode's own cost beside inject mode's, with a 0 ms provider (docs/tools-mode.md).

A scripted mock (this file with --serve-mock, its own process) answers a request that
offers `query_memory` and ends with the user's message with one `query_memory` call, and
anything else with text. memproxy runs as shipped (`python -m proxy serve`), one worker.
Each round measures, interleaved and sequentially:

- direct-1: one call straight to the mock (what an inject-mode request costs the provider);
- inject: the same request through memproxy with memory on (recall, block, save);
- direct-2: the two calls a tools-mode request makes, straight to the mock;
- tools: the request through memproxy in tools mode (one memory round: query, then answer).

memproxy's added latency is inject - direct-1 and tools - direct-2 (medians); the line the
issue draws is tools' added latency at most twice inject's.

    python bench/tools_mode.py [--requests 300] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import httpx

from harness import json_mock
from harness.report import json_option, print_json
from harness.targets import BENCH, Targets, free_port

USER = "bench-tools"
QUESTION = "which editor do I like to use for Rust?"
ANSWER = {"id": "chatcmpl-b", "object": "chat.completion", "created": 1, "model": "bench-model",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "You like Helix."},
                       "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}
CALL = {**ANSWER, "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
    "role": "assistant", "content": None, "tool_calls": [{"id": "call_b1", "type": "function", "function": {
        "name": "query_memory", "arguments": json.dumps({"query": "favourite editor"})}}]}}]}


def mock_answer(body: dict[str, Any]) -> dict[str, Any]:
    """The model's choice: ask memory once, then answer."""
    offered = any((t.get("function") or {}).get("name") == "query_memory" for t in body.get("tools") or [])
    last = (body.get("messages") or [{}])[-1]
    return CALL if offered and last.get("role") == "user" else ANSWER


def mock_reply(path: bytes, body: bytes) -> tuple[int, bytes]:
    """The scripted mock's answer on the wire (json_mock.py)."""
    return 200, json.dumps(mock_answer(json.loads(body) if body else {})).encode()


def timed(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> float:
    started = time.perf_counter()
    response = client.post(url, json=body, headers=headers)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed


def measure(mock: str, proxy: str, requests: int, label: str) -> dict[str, list[float]]:
    """Per-request seconds of each target, interleaved request by request."""
    prompt = {"model": "bench-model", "messages": [{"role": "user", "content": QUESTION}]}
    call_message = CALL["choices"][0]["message"]
    second = {**prompt, "messages": [*prompt["messages"], call_message,
                                     {"role": "tool", "tool_call_id": "call_b1", "content": "No relevant memories."}]}
    times: dict[str, list[float]] = {"direct-1": [], "inject": [], "direct-2": [], "tools": []}
    with httpx.Client(timeout=30) as client:
        for n in range(requests):
            # Each request its own conversation, so every turn is a new one (the same history in one
            # conversation within memory.retry_window_s would be a retry of the turn before).
            scope = {"x-memory-user": USER, "x-memory-conversation": f"inject-{label}-{n}"}
            times["direct-1"].append(timed(client, f"{mock}/chat/completions", prompt, {}))
            times["inject"].append(timed(client, f"{proxy}/chat/completions", prompt, scope))
            times["direct-2"].append(timed(client, f"{mock}/chat/completions", {**prompt, "tools": []}, {})
                                     + timed(client, f"{mock}/chat/completions", second, {}))
            times["tools"].append(timed(client, f"{proxy}/chat/completions", prompt, {
                "x-memory-user": USER, "x-memory-conversation": f"tools-{label}-{n}", "x-memory-mode": "tools"}))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    json_option(parser)
    parser.add_argument("--serve-mock", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_mock:
        asyncio.run(json_mock.serve(mock_reply, args.serve_mock))
        return 0
    with Targets("memproxy-tools-mode-") as targets:
        port = free_port()
        mock_url = targets.process("tools-mock", [sys.executable, str(BENCH / "tools_mode.py"), "--serve-mock",
                                                  str(port)], port).url("/v1")
        proxy_url = targets.memproxy(mock_url, "warning").url("/v1")
        measure(mock_url, proxy_url, 20, "warm-up")
        times: dict[str, list[float]] = {}
        for round_ in range(args.rounds):
            for target, seconds in measure(mock_url, proxy_url, args.requests, str(round_)).items():
                times.setdefault(target, []).extend(seconds)
    print(f"server logs in {targets.workdir}", file=sys.stderr)
    medians = {target: statistics.median(seconds) * 1000 for target, seconds in times.items()}
    inject_added = medians["inject"] - medians["direct-1"]
    tools_added = medians["tools"] - medians["direct-2"]
    ratio = tools_added / inject_added if inject_added > 0 else float("inf")
    print("| target | median ms | memproxy's added ms |")
    print("| --- | --- | --- |")
    print(f"| direct, 1 call | {medians['direct-1']:.2f} | |")
    print(f"| inject mode | {medians['inject']:.2f} | {inject_added:.2f} |")
    print(f"| direct, 2 calls | {medians['direct-2']:.2f} | |")
    print(f"| tools mode, 1 memory round | {medians['tools']:.2f} | {tools_added:.2f} |")
    verdict = "holds" if ratio <= 2 else "FAILS"
    print(f"tools mode's added latency is {ratio:.2f}x inject mode's (line: at most 2x): {verdict}")
    if args.json:
        print_json({"medians_ms": medians, "inject_added_ms": inject_added, "tools_added_ms": tools_added,
                    "ratio": ratio})
    return 0 if ratio <= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
