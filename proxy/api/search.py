"""POST /search: the hits the proxy would inject for a query, each with why it ranked.

The retriever is the proxy's own (proxy.memory.retrieval.retriever), so the answer is exactly what a
chat request with this last user message would get: the block's lines give each hit's
text as it would read, after neutralising and the token budget; the injection log gives
its id, reason, score parts and token cost.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.api.records import SearchInput
from proxy.memory.retrieval.fusion import HARD_CAP
from proxy.memory.retrieval.base import QUERY_EDGE_CHARS, Query, Retrieved, Retriever
from proxy.memory.retrieval.sources import edges
from proxy.models import Scope

_LINE = re.compile(r"(\d+)\. \[([a-z-]+)\] (.*)")


async def search(retriever: Retriever, scope: Scope, request: SearchInput, default_limit: int,
                 header: str) -> dict[str, Any]:
    """The search answer: hits in merge order, the block, and the retrieval's own notes."""
    limit = min(default_limit if request.limit is None else request.limit, HARD_CAP)
    # With `sources`, the merge is asked for every slot and the other sources' hits dropped.
    asked = HARD_CAP if request.sources else limit
    # Read as a chat's last user message is: by its first and last QUERY_EDGE_CHARS.
    query = Query(text=edges(request.query, QUERY_EDGE_CHARS), conversation_id=request.conversation or "",
                  visible=(), max_memories=asked)
    retrieved = await retriever.retrieve(scope, query)
    hits = hits_of(retrieved, header)
    if request.sources:
        hits = [hit for hit in hits if hit["source"] in request.sources][:limit]
        for rank, hit in enumerate(hits, start=1):
            hit["rank"] = rank
    log = retrieved.log
    return {"object": "search", "query": request.query, "hits": hits, "block": retrieved.block,
            "budget_cut": bool(log.get("budget_cut", False)), "sources_ms": log.get("sources_ms", {}),
            "errors": log.get("errors", {})}


def hits_of(retrieved: Retrieved, header: str) -> list[dict[str, Any]]:
    """Each injected hit: its line's source and text joined with its injection-log entry."""
    skip = header.count("\n") + 1
    lines = [(m.group(2), m.group(3)) for line in retrieved.block.split("\n")[skip:]
             if (m := _LINE.fullmatch(line))]
    logged: list[dict[str, Any]] = list(retrieved.log.get("hits", [])) if retrieved.block else []
    return [{"rank": rank, "source": source, "id": entry["id"], "content": content, "reason": entry["reason"],
             "score": entry.get("score", {}), "tokens": entry.get("tokens")}
            for rank, (entry, (source, content)) in enumerate(_paired(logged, lines), start=1)]


def _paired(logged: list[dict[str, Any]], lines: list[tuple[str, str]]) -> list[tuple[dict[str, Any], tuple[str, str]]]:
    """Log entries with their lines; a hit whose text neutralised to nothing has no line."""
    if len(logged) == len(lines):
        return list(zip(logged, lines))
    pairs, at = [], 0
    for entry in logged:
        if at < len(lines) and lines[at][0] == entry["source"]:
            pairs.append((entry, lines[at]))
            at += 1
    return pairs
