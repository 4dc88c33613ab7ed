"""Does memory cost Claude Code its prompt cache? A 20-turn Claude-Code-shaped session through
memproxy, memory off and then on, against a fake Anthropic provider that caches as the real one
does (anthropic_cache.py); the cached share of input tokens side by side. See bench/README.md.

    python bench/prompt_cache.py [--turns 20] [--memory-items 1000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httptools
import httpx

from anthropic_cache import CacheUsage, PromptCache, cached_share
from claude_code_session import answer, replay
from loadgen import Target, run_client
from processes import REPO, free_port, source_version, start_memproxy
from storm import seed_memories

MEMORY_USER = "bench-user"
# The contract: memory on keeps the cached share within this many points of memory off.
LIMIT_POINTS = 5.0


class Provider:
    """The fake Anthropic provider: POST /v1/messages answered as claude_code_session.answer says,
    with the usage its prompt cache gives; a thread with its own event loop, HTTP/1.1 keep-alive."""

    def __init__(self) -> None:
        self.cache = PromptCache()
        self.usages: list[CacheUsage] = []
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        started.wait(10)

    def reset(self) -> None:
        """A new, empty cache (one per session run)."""
        self.cache, self.usages = PromptCache(), []

    def reply(self, body: bytes) -> bytes:
        request = json.loads(body)
        usage = self.cache.request(request)
        self.usages.append(usage)
        message = answer(request, len(self.usages))
        message["usage"] = {"input_tokens": usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens,
                            "cache_read_input_tokens": usage.cache_read_tokens,
                            "cache_creation_input_tokens": usage.cache_write_tokens, "output_tokens": 40}
        return json.dumps(message).encode()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._loop.create_server(lambda: _Connection(self), "127.0.0.1", self.port))
        started.set()
        self._loop.run_forever()


class _Connection(asyncio.Protocol):
    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []
        self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, url = b"".join(self.body), self.url
        self.body, self.url = [], b""
        if url.split(b"?")[0].endswith(b"/messages"):
            status, payload = b"200 OK", self.provider.reply(body)
        else:
            status, payload = b"404 Not Found", b'{"type":"error","error":{"type":"not_found_error","message":"no"}}'
        self.transport.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (status, len(payload), payload))


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
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="memproxy-prompt-cache-"))
    provider = Provider()
    upstream = f"http://127.0.0.1:{provider.port}/v1"
    memproxy = start_memproxy(workdir, upstream, "info")
    try:
        if args.memory_items:
            run_client(seed_memories(Target("memproxy", memproxy.port), MEMORY_USER, args.memory_items))
        runs = {"off": run_session(provider, memproxy.port, args.turns, {}),
                "on": run_session(provider, memproxy.port, args.turns, {"x-memory-user": MEMORY_USER})}
    finally:
        memproxy.stop()
    print(f"memproxy {source_version(REPO)}: {args.turns} turns, {runs['off']['requests']} requests per run; "
          f"{args.memory_items} memories seeded; server log in {workdir}")
    print(f"{'memory':8}{'requests':>10}{'input tokens':>14}{'cache read':>12}{'cache write':>13}{'cached share':>14}"
          f"{'with block':>12}")
    for name, run in runs.items():
        print(f"{name:8}{run['requests']:>10}{run['input_tokens']:>14,}{run['cache_read_tokens']:>12,}"
              f"{run['cache_write_tokens']:>13,}{run['cached_share']:>14.1%}{run['requests_with_memory']:>12}")
    points = 100 * (runs["on"]["cached_share"] - runs["off"]["cached_share"])
    passed = abs(points) <= LIMIT_POINTS and runs["on"]["requests"] == runs["off"]["requests"]
    print(f"{'PASS' if passed else 'FAIL'}  cached share with memory on within {LIMIT_POINTS:g} points of memory off: "
          f"{points:+.1f} points")
    if args.json:
        print(json.dumps({"memproxy": source_version(REPO), "settings": vars(args), "runs": runs,
                          "points": points, "pass": passed}))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
