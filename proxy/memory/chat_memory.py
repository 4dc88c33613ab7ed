"""The contract between the proxy path and memory for one chat request."""

from __future__ import annotations

import asyncio
from typing import Protocol

from proxy.memory.tools import MemoryTools
from proxy.models import AssistantMessage, Transcript
from proxy.identity.scope import RequestScope


NOT_A_TURN = "off: not a turn"  # a chat path's request that is no turn: a GET, an unreadable body, an error


class Recall:
    """Memory's part in one request: the block to inject and what to do with the answer.

    This base is memory switched off (no scope, X-Memory-Mode: off, unparseable body, a
    side request); a turn's recall (`TurnRecall`, memory/pipeline.py) subclasses it.
    """

    block: str | None = None
    injected: int = 0
    turn_key: str | None = None
    prompt: str | None = None  # the prompt's words as a hook rewrote them, for the model too
    tools: MemoryTools | None = None  # tools mode: the memory calls the model may make

    def __init__(self, status: str = NOT_A_TURN) -> None:
        self.status = status
        # Tools mode: call id -> the memory exchange of the loop's step that made the call (stored),
        # and this step's own (JSON), kept with its app calls when its answer is recorded.
        self.echoes: dict[str, str] = {}
        self.exchange: str | None = None
        # Tools mode, Responses wire: the provider's id of the response the request continues, and
        # of this step's last round (the client may have seen its first round's id).
        self.provider_response: str | None = None
        self.provider_id: str | None = None

    @property
    def active(self) -> bool:
        """True when the answer should be read and handed to `answered`."""
        return False

    def headers(self) -> list[tuple[bytes, bytes]]:
        """X-Memory-* response headers."""
        headers = [(b"x-memory-status", self.status.encode())]
        if self.turn_key is not None:
            headers += [(b"x-memory-turn", self.turn_key.encode()), (b"x-memory-injected", str(self.injected).encode())]
        return headers

    def answered(self, message: AssistantMessage) -> asyncio.Future[None] | None:
        """The provider's final answer for this step; returns a commit to wait for."""
        return None

    def rounds_done(self, tokens: dict[str, int]) -> None:
        """Tools mode: the request's rounds ended, having used these tokens in all."""

    def memory_called(self, name: str, arguments: str, result: str) -> None:
        """Tools mode: a memory call ran; it is a step of the turn's reasoning trace."""

    def failed(self, status: str) -> None:
        """The step ended without an answer (upstream error, cut stream, unparseable)."""

    def bad_events(self, count: int) -> None:
        """This many data lines of the streamed answer were not JSON (skipped)."""

    def aborted(self) -> None:
        """The client went away before the response was complete."""

    def dropped_block(self) -> None:
        """The block was removed to retry a context-length error."""
        self.block = None
        self.injected = 0


class ChatMemory(Protocol):
    """Builds the Recall of a chat request, on any wire."""

    async def recall(self, resolved: RequestScope, transcript: Transcript | None, wire: str = "") -> Recall: ...


def off_status(resolved: RequestScope, transcript: Transcript | None) -> str:
    """X-Memory-Status of a request memory does not serve, with the reason a user can act on."""
    if resolved.memory_on and transcript is None:
        return NOT_A_TURN
    return f"off: {resolved.off_reason}"
