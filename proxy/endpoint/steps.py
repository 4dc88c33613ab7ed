"""Steps: the provider calls one chat request makes. Inject mode is one step.

A step sends the body with the block, and when the provider refuses it as too long for the
context, sends the client's own body once more: memory never turns an accepted request
into an error.
"""

from __future__ import annotations

import time
from typing import Any

from proxy.errors import ProxyError, UpstreamProtocolError, UpstreamTimeout
from proxy.exchange import Recall
from proxy.metrics import Metrics
from proxy.responses import readable_body
from proxy.upstream import StreamCut, Upstream, UpstreamResponse
from proxy.wires.base import Wire


async def open_upstream(upstream: Upstream, metrics: Metrics, method: str, url: str,
                        headers: list[tuple[bytes, bytes]], content: Any) -> UpstreamResponse:
    """The provider's response (headers read), its latency counted whether it came or failed."""
    started = time.perf_counter()
    try:
        return await upstream.open(method, url, headers, content)
    finally:
        metrics.upstream_seconds.observe(time.perf_counter() - started)


class InjectStep:
    """One provider call with the block in the prompt."""

    def __init__(self, upstream: Upstream, metrics: Metrics, wire: Wire, url: str,
                 headers: list[tuple[bytes, bytes]]) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.wire = wire
        self.url = url
        self.headers = headers

    async def run(self, body: bytes, original: bytes, recall: Recall) -> Any:
        """The provider's response to `body` (or to `original`, when the block made it too long)."""
        try:
            response = await open_upstream(self.upstream, self.metrics, "POST", self.url, self.headers, body)
            if recall.block and response.status == 400:
                response = await self._without_block(response, original, recall)
        except ProxyError as error:
            recall.failed("upstream_failed")
            error.headers = {k.decode(): v.decode() for k, v in recall.headers()}
            raise
        return response

    async def _without_block(self, response: UpstreamResponse, original: bytes, recall: Recall) -> Any:
        try:
            body = b"".join([chunk async for chunk in response.chunks()])
        except StreamCut as cut:  # nothing has gone to the client yet: answer as for no answer
            if cut.code == "upstream_idle_timeout":
                raise UpstreamTimeout(cut.message) from cut
            raise UpstreamProtocolError(cut.message) from cut
        finally:
            await response.aclose()
        # Read as memproxy reads an answer: a provider may gzip its errors (and the client's
        # accept-encoding goes along when the answer is not saved).
        if not self.wire.is_context_length_error(400, readable_body(response, body)):
            return Replayed(response, body)
        recall.dropped_block()
        return await open_upstream(self.upstream, self.metrics, "POST", self.url, self.headers, original)


class Replayed:
    """A response whose body was already read, replayed to the client as it came."""

    def __init__(self, response: Any, body: bytes) -> None:
        self.response = response.response
        self.status = response.status
        self.content_type = response.content_type
        self._body = body

    async def chunks(self) -> Any:
        yield self._body

    async def aclose(self) -> None:
        return None
