"""A scripted JSON provider: every request answered by a function of its path and body.

For benchmarks whose provider must answer by what it is sent (a tool call first, a prompt
cache's usage) rather than with mock_upstream.py's fixed answers. HTTP/1.1 keep-alive,
httptools, one request at a time per connection. It runs as a process of its own
(`serve`, from a script started by `Targets.process`), or on a thread of the benchmark's
process (`serve_in_thread`) when the benchmark reads the provider's state as it goes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import httptools

from .targets import LOCALHOST, free_port

# (path without its query, request body) -> (status, JSON body)
Answer = Callable[[bytes, bytes], tuple[int, bytes]]
_REASONS = {200: b"OK", 404: b"Not Found"}


class _Connection(asyncio.Protocol):
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []
        self.url = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, path = b"".join(self.body), self.url.split(b"?", 1)[0]
        self.body, self.url = [], b""
        status, payload = self.answer(path, body)
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (status, _REASONS.get(status, b"Status"), len(payload), payload))


async def serve(answer: Answer, port: int) -> None:
    """Answer on `port` until cancelled."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(answer), LOCALHOST, port, backlog=1024)
    async with server:
        await server.serve_forever()


def serve_in_thread(answer: Answer) -> int:
    """Answer on a free port from a daemon thread with its own event loop; the port, once it listens."""
    port = free_port()
    loop = asyncio.new_event_loop()
    listening = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(loop.create_server(lambda: _Connection(answer), LOCALHOST, port))
        listening.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    if not listening.wait(10):
        raise RuntimeError(f"the scripted provider did not listen on port {port} within 10 s")
    return port
