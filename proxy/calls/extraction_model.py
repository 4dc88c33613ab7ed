"""Calls memproxy makes to the provider on its own account: background work, its own key.

A client's key is never kept to make them (it is the client's, for its own request): `extraction.api_key`, else
`upstream.api_key`; with neither, `extraction.mode: llm` is off and start-up says so.
The memory package gets these calls as plain callables, so it never imports httpx.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from proxy.errors import ProxyError
from proxy.memory.learning.extractors import Extractor, LLMExtractor, ModelCallFailed, RulesExtractor
from proxy.settings import Settings
from proxy.http.upstream import StreamCut, Upstream

log = logging.getLogger("memproxy.extraction")

MAX_ANSWER_BYTES = 1024 * 1024  # a JSON extraction is a few KiB; more is not an answer


class ModelCaller:
    """POST /chat/completions with memproxy's key and one model; returns the answer's text."""

    def __init__(self, upstream: Upstream, api_key: str, model: str) -> None:
        self._upstream = upstream
        self._api_key = api_key
        self.model = model

    async def __call__(self, messages: Sequence[dict[str, str]], response_format: dict[str, Any]) -> str:
        """The content of the first choice's message; ModelCallFailed on any other outcome."""
        body = json.dumps({"model": self.model, "messages": list(messages), "response_format": response_format,
                           "temperature": 0}).encode()
        headers = [(b"content-type", b"application/json"), (b"accept", b"application/json"),
                   (b"authorization", b"Bearer " + self._api_key.encode())]
        try:
            response = await self._upstream.open("POST", self._upstream.url("/chat/completions", b""), headers, body)
            try:
                raw = await _read(response.chunks())
            finally:
                await response.aclose()
        except (ProxyError, StreamCut) as exc:
            raise ModelCallFailed(f"{type(exc).__name__}: {exc}") from None
        if response.status != 200:
            raise ModelCallFailed(f"the upstream answered {response.status}")
        return _content(raw)


async def _read(chunks: AsyncIterator[bytes]) -> bytes:
    data = bytearray()
    async for chunk in chunks:
        data += chunk
        if len(data) > MAX_ANSWER_BYTES:
            raise ModelCallFailed(f"answer larger than {MAX_ANSWER_BYTES} bytes")
    return bytes(data)


def _content(raw: bytes) -> str:
    """choices[0].message.content of a chat.completion body."""
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ModelCallFailed("the answer is not a chat completion") from None
    if not isinstance(content, str):
        raise ModelCallFailed("the answer has no text content")
    return content


def extractor_for(settings: Settings, upstream: Upstream,
                  on_fallback: Callable[[], None] = lambda: None) -> Extractor:
    """The extractor `extraction.mode` asks for, or the rules when llm mode cannot run (logged)."""
    extraction = settings.extraction
    if extraction.mode == "rules":
        log.info("extraction: rules")
        return RulesExtractor()
    key = extraction.api_key or settings.upstream.api_key
    if not key:
        log.warning("extraction.mode llm is off: it needs a key of memproxy's own (extraction.api_key or "
                    "upstream.api_key; a client's key is never kept for background calls); using the rules")
        return RulesExtractor()
    if not extraction.model:
        log.warning("extraction.mode llm is off: extraction.model is not set; using the rules")
        return RulesExtractor()
    log.info("extraction: llm with model %s", extraction.model)
    return LLMExtractor(ModelCaller(upstream, key, extraction.model), on_fallback=on_fallback)
