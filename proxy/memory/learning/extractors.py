"""The extractors the worker runs: the rules in a thread, or the model with the rules behind it.

`extraction.mode: llm` makes one model call per message, bounded in concurrency and time;
on any failure — no answer, an error status, a timeout, text that is not the schema — the
rules extractor's result stands. The user's stated name always comes from the
rules ("my name is ..."), which the schema does not ask for. The call itself is passed in
(proxy/calls/extraction_model.py), so memory never imports httpx.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from proxy.memory.extraction.llm import RESPONSE_FORMAT, InvalidOutput, parse, prompt
from proxy.extracted import Extraction
from proxy.memory.extraction.rules import extract

log = logging.getLogger("memproxy.extraction")

# (text, speaker) -> what it states; the speaker is None for the user's own words.
Extractor = Callable[[str, str | None], Awaitable[Extraction]]
# (messages, response_format) -> the answer's message content; raises ModelCallFailed.
ModelCall = Callable[[Sequence[dict[str, str]], dict[str, Any]], Awaitable[str]]

# A text this short may be mined on the event loop (RulesExtractor.now): its rules take about
# 0.15 ms (6 ms at worst, crafted), and in a thread they would hold the GIL as they do on the
# loop, while the hop there and back costs about 0.1 ms of CPU, as much as their rules.
ON_LOOP_CHARS = 256
LLM_CONCURRENCY = 4  # model calls in flight at once, whatever the queue holds
LLM_TIMEOUT_S = 30.0  # per call, from sending to the whole answer


class ModelCallFailed(Exception):
    """The model call got no usable answer (unreachable, error status, cut, not a completion)."""


class RulesExtractor:
    """`extraction.mode: rules`, off the event loop (a very short message may be mined on it: `now`),
    one message at a time.

    The rules are pure Python and hold the GIL: run side by side in several threads they
    go no faster, and each extra thread takes a share of the GIL from the event loop, which
    is serving requests. One at a time, a burst of extraction costs requests little.
    """

    def __init__(self) -> None:
        self._one = asyncio.Lock()
        # Calls asked and not yet answered, waiting ones included: a released lock reads unlocked
        # before the call it wakes has run, so the lock alone would let a later message jump it.
        self._asked = 0

    async def __call__(self, text: str, speaker: str | None) -> Extraction:
        """What the rules find in one message."""
        self._asked += 1
        try:
            async with self._one:
                return await asyncio.to_thread(extract, text, speaker=speaker)
        finally:
            self._asked -= 1

    def now(self, text: str, speaker: str | None) -> Extraction | None:
        """What the rules find in a short message, computed here on the event loop when no extraction
        is asked and unanswered (so results still come in the order asked); None: await the call instead."""
        if len(text) > ON_LOOP_CHARS or self._asked:
            return None
        return extract(text, speaker=speaker)


class LLMExtractor:
    """An Extractor that asks the model and falls back to the rules' result."""

    def __init__(self, call: ModelCall, *, concurrency: int = LLM_CONCURRENCY,
                 timeout_s: float = LLM_TIMEOUT_S, rules: Extractor | None = None,
                 on_fallback: Callable[[], None] = lambda: None) -> None:
        self._call = call
        self._rules = rules or RulesExtractor()
        self._on_fallback = on_fallback  # counts each time the rules' result stands in
        self._slots = asyncio.Semaphore(concurrency)
        self.timeout_s = timeout_s

    async def __call__(self, text: str, speaker: str | None) -> Extraction:
        """The model's entities and relationships, or the rules' whole result if it failed."""
        rules = await self._rules(text, speaker)
        try:
            async with self._slots:
                async with asyncio.timeout(self.timeout_s):
                    answer = await self._call(prompt(text, speaker), RESPONSE_FORMAT)
            found = parse(answer)
        except TimeoutError:
            log.warning("extraction: model call timed out after %.1fs; the rules' result stands", self.timeout_s)
            self._on_fallback()
            return rules
        except (ModelCallFailed, InvalidOutput) as exc:
            log.warning("extraction: model answer not used (%s: %s); the rules' result stands",
                        type(exc).__name__, str(exc)[:200])
            self._on_fallback()
            return rules
        return Extraction(found.entities, found.relationships, rules.user_name, rules.user_alias)
