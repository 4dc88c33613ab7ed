"""A model of Anthropic's prompt cache, for measuring what a proxy does to a client's cache hits.

As the provider documents it: the prompt is one sequence of blocks (the tools, the system
blocks, then each message's content blocks in order), and a block carrying
`cache_control` is a breakpoint. A request first reads: from each breakpoint it looks
back over at most LOOKBACK_BLOCKS blocks for the longest prefix a request has already
written, and the longest such prefix over all its breakpoints is read from the cache.
Then it writes an entry for the prefix ending at each of its breakpoints. A prefix is
identified by the hash of its blocks without their `cache_control` markers (a message's
blocks also carry its role), so moving a breakpoint does not change what is cached.
Tokens are estimated as ceil(characters / 4) of the blocks' compact JSON.

Self-contained (no sibling imports): tests/test_prompt_cache.py uses it too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

LOOKBACK_BLOCKS = 20


@dataclass(frozen=True)
class CacheUsage:
    """One request's input tokens: all of them, those read from the cache, those written to it."""

    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int


def prompt_blocks(body: dict[str, Any]) -> list[tuple[Any, bool]]:
    """The request's blocks in cache order, each without its marker, and whether it was a breakpoint."""
    out: list[tuple[Any, bool]] = []
    for tool in body.get("tools") or []:
        out.append(_unmarked(("tool", tool)))
    system = body.get("system")
    for block in [{"type": "text", "text": system}] if isinstance(system, str) else system or []:
        out.append(_unmarked(("system", block)))
    for message in body.get("messages") or []:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for block in blocks:
            out.append(_unmarked((message.get("role"), block)))
    return out


def _unmarked(item: tuple[str, Any]) -> tuple[Any, bool]:
    kind, block = item
    if not isinstance(block, dict):
        return (kind, block), False
    return (kind, {k: v for k, v in block.items() if k != "cache_control"}), "cache_control" in block


@dataclass
class PromptCache:
    """The provider's cache: the prefixes written so far, by hash."""

    written: set[str] = field(default_factory=set)

    def request(self, body: dict[str, Any]) -> CacheUsage:
        """Read the longest cached prefix, write one entry per breakpoint, and say what that cost."""
        blocks = prompt_blocks(body)
        digest = hashlib.sha256()
        hashes, tokens, chars = [], [], 0
        for block, _ in blocks:
            text = json.dumps(block, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            digest.update(text.encode() + b"\x00")
            hashes.append(digest.copy().hexdigest())
            chars += len(text)
            tokens.append(-(-chars // 4))
        breakpoints = [i for i, (_, marked) in enumerate(blocks) if marked]
        read = -1
        for point in breakpoints:
            for i in range(point, max(-1, point - LOOKBACK_BLOCKS), -1):
                if hashes[i] in self.written:
                    read = max(read, i)
                    break
        read_tokens = tokens[read] if read >= 0 else 0
        last = max(breakpoints, default=-1)
        write_tokens = tokens[last] - read_tokens if last > read else 0
        self.written.update(hashes[i] for i in breakpoints)
        return CacheUsage(tokens[-1] if tokens else 0, read_tokens, write_tokens)


def cached_share(usages: list[CacheUsage]) -> float:
    """Input tokens read from the cache, as a share of all input tokens."""
    total = sum(u.input_tokens for u in usages)
    return sum(u.cache_read_tokens for u in usages) / total if total else 0.0
