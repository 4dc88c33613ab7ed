"""Does memory cost Claude Code its prompt cache? A 20-turn Claude-Code-shaped session through
memproxy, memory off and then on, against a fake Anthropic provider that caches as the real one
does (anthropic_cache.py); the cached share of input tokens side by side. See bench/README.md.

    python bench/prompt_cache.py [--turns 20] [--memory-items 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

import httpx

from anthropic_cache import CacheUsage, PromptCache, cached_share
from claude_code_session import answer, replay
from harness.json_mock import serve_in_thread
from harness.loadgen import Target, run_client
from harness.memory import MEMORY_USER, seed_memories
from harness.report import Column, Criterion, json_option, print_json, table
from harness.targets import REPO, Targets, source_version
# The contract: memory on keeps the cached share within this many points of memory off.
LIMIT_POINTS = 5.0
COLUMNS = (Column("memory", 7, align="<"), Column("requests", 9), Column("input tokens", 13, ","),
           Column("cache read", 11, ","), Column("cache write", 12, ","), Column("cached share", 13, ".1%"),
           Column("with block", 11))


class Provider:
    """The fake Anthropic provider: POST /v1/messages answered as claude_code_session.answer says,
    with the usage its prompt cache gives; on a thread of this process (json_mock.py)."""

    def __init__(self) -> None:
        self.cache = PromptCache()
        self.usages: list[CacheUsage] = []
        self.port = serve_in_thread(self.reply)

    def reset(self) -> None:
        """A new, empty cache (one per session run)."""
        self.cache, self.usages = PromptCache(), []

    def reply(self, path: bytes, body: bytes) -> tuple[int, bytes]:
        if not path.endswith(b"/messages"):
            return 404, b'{"type":"error","error":{"type":"not_found_error","message":"no"}}'
        request = json.loads(body)
        usage = self.cache.request(request)
        self.usages.append(usage)
        message = answer(request, len(self.usages))
        message["usage"] = {"input_tokens": usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens,
                            "cache_read_input_tokens": usage.cache_read_tokens,
                            "cache_creation_input_tokens": usage.cache_write_tokens, "output_tokens": 40}
        return 200, json.dumps(message).encode()


def run_session(provider: Provider, port: int, turns: int, headers: dict[str, str]) -> dict[str, Any]:
    """Replay the session through memproxy; the provider's totals and how many blocks memproxy injected."""
    provider.reset()
    injected = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, headers={
            "x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01", **headers}) as http:

        def send(body: dict[str, Any]) -> dict[str, Any]:
            response = http.post("/v1/messages", json=body)
            response.raise_for_status()
            injected.append(int(response.headers.get("x-memory-injected", "0")))
            return dict(response.json())

        requests = replay(turns, send)
    usages = provider.usages
    return {"requests": requests, "input_tokens": sum(u.input_tokens for u in usages),
            "cache_read_tokens": sum(u.cache_read_tokens for u in usages),
            "cache_write_tokens": sum(u.cache_write_tokens for u in usages),
            "cached_share": cached_share(usages), "requests_with_memory": sum(n > 0 for n in injected),
            "per_request": [asdict(u) for u in usages]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20, help="user turns in the session (every third has a tool step)")
    parser.add_argument("--memory-items", type=int, default=1000, help="memories seeded for the memory-on user")
    json_option(parser)
    args = parser.parse_args(argv)
    provider = Provider()
    with Targets("memproxy-prompt-cache-") as targets:
        memproxy = targets.memproxy(f"http://127.0.0.1:{provider.port}/v1")
        if args.memory_items:
            run_client(seed_memories(Target("memproxy", memproxy.port), MEMORY_USER, args.memory_items))
        runs = {"off": run_session(provider, memproxy.port, args.turns, {}),
                "on": run_session(provider, memproxy.port, args.turns, {"x-memory-user": MEMORY_USER})}
    print(f"memproxy {source_version(REPO)}: {args.turns} turns, {runs['off']['requests']} requests per run; "
          f"{args.memory_items} memories seeded; server log in {targets.workdir}")
    print(table(COLUMNS, [(name, *(run[key] for key in ("requests", "input_tokens", "cache_read_tokens",
                                                       "cache_write_tokens", "cached_share", "requests_with_memory")))
                          for name, run in runs.items()]))
    points = 100 * (runs["on"]["cached_share"] - runs["off"]["cached_share"])
    line = Criterion(f"cached share with memory on within {LIMIT_POINTS:g} points of memory off",
                     abs(points) <= LIMIT_POINTS and runs["on"]["requests"] == runs["off"]["requests"],
                     f"{points:+.1f} points")
    print(line.line())
    if args.json:
        print_json({"memproxy": source_version(REPO), "settings": vars(args), "runs": runs,
                    "points": points, "pass": line.passed})
    return 0 if line.passed else 1


if __name__ == "__main__":
    sys.exit(main())
