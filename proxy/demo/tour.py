"""The tour `memproxy demo` runs: memproxy in front of the echo provider, a fact told in one
chat, a question asked in a new one, and the block the provider received printed."""

from __future__ import annotations

import asyncio
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from proxy.app import create_app
from proxy.demo.echo_provider import echo_provider
from proxy.settings import load_settings

USER = "alice"
FACT = "I work at Northwind Traders. Our staging host is internal-hbr-2291.example."
QUESTION = "Which staging host should I deploy to?"
START_TIMEOUT_S = 15.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server(app: Any, port: int) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False,
                                         server_header=False, date_header=False, lifespan="on",
                                         timeout_graceful_shutdown=2))


async def _started(server: uvicorn.Server, task: asyncio.Task[None], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
    while not server.started:
        if task.done() or asyncio.get_running_loop().time() > deadline:
            raise OSError(f"{what} did not start (is 127.0.0.1:{server.config.port} in use? pass --port)")
        await asyncio.sleep(0.02)


async def _chat(client: httpx.AsyncClient, text: str) -> httpx.Response:
    response = await client.post("/v1/chat/completions", headers={"X-Memory-User": USER},
                                 json={"model": "echo", "messages": [{"role": "user", "content": text}]})
    response.raise_for_status()
    return response


def _indented(text: str) -> str:
    return "\n".join(("   " + line).rstrip() for line in text.splitlines())


async def tour(base_url: str, received: list[str], say: Callable[[str], None]) -> None:
    """Tell memproxy a fact, then ask about it in a new chat; print what the provider got
    (`received`: the echo provider's record of the user messages it was sent)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        told = await _chat(client, FACT)
        say(f"1. {USER} says, in one chat:\n{_indented(FACT)}\n   X-Memory-Status: {told.headers['x-memory-status']}\n")
        asked = await _chat(client, QUESTION)
        say(f"2. {USER} asks, in a new chat:\n{_indented(QUESTION)}\n"
            f"   X-Memory-Status: {asked.headers['x-memory-status']}, "
            f"X-Memory-Injected: {asked.headers['x-memory-injected']}\n\n"
            "   The provider received this user message, the block in front of the question:\n\n"
            f"{_indented(received[-1])}\n\n"
            f"   The provider answered: {asked.json()['choices'][0]['message']['content']}\n")


async def run(port: int, keep_serving: bool, say: Callable[[str], None]) -> None:
    """memproxy on `port` in front of the echo provider, the tour, then (`keep_serving`) until Ctrl-C."""
    echo_port = _free_port()
    with tempfile.TemporaryDirectory(prefix="memproxy-demo-") as folder:
        settings = load_settings(environ={}, overrides={
            "upstream.base_url": f"http://127.0.0.1:{echo_port}/v1",
            "upstream.anthropic_base_url": f"http://127.0.0.1:{echo_port}/v1",
            "store.url": f"sqlite:///{Path(folder) / 'demo.db'}", "server.port": port})
        echo_app = echo_provider()
        echo, proxy = _server(echo_app, echo_port), _server(create_app(settings), port)
        echo_task = asyncio.create_task(echo.serve())
        proxy_task = asyncio.create_task(proxy.serve())
        try:
            await _started(echo, echo_task, "the echo provider")
            await _started(proxy, proxy_task, "memproxy")
            url = f"http://127.0.0.1:{port}"
            say(f"memproxy demo: memproxy on {url}, in front of a built-in echo provider that keeps\n"
                "what it received. Memory lives in a temporary file, gone at exit.\n")
            await tour(url, echo_app.state.received, say)
            if keep_serving:
                say(f"memproxy keeps serving on {url} (Ctrl-C stops it). Try:\n"
                    f"   curl -s {url}/memory/v1/users/{USER}/memories\n"
                    f"   the inspector: {url}/memory/ui/#view=users&user={USER}\n")
                await proxy_task
        finally:
            proxy.should_exit = echo.should_exit = True
            await asyncio.gather(proxy_task, echo_task, return_exceptions=True)
