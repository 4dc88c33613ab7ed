"""The reference pass-through memproxy is measured against: starlette + httpx and nothing else.

Forwards any /v1 path to --upstream, streaming the request and the response bodies both
ways. The httpx-aiohttp transport is the default: on this machine it forwards ~3.5x the
requests per second of httpx's own transport at 32 connections (bench/README.md).

    python bench/harness/reference_proxy.py --port 8100 --upstream http://127.0.0.1:9000/v1 [--transport httpx]
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"transfer-encoding", b"upgrade", b"host"})
LIMITS = httpx.Limits(max_connections=200, max_keepalive_connections=64)


def make_app(upstream: str, transport: str) -> Starlette:
    """The pass-through app on the chosen httpx transport ("aiohttp" or "httpx")."""
    base = upstream.rstrip("/")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if transport == "aiohttp":
            from httpx_aiohttp import AiohttpTransport
            client = httpx.AsyncClient(transport=AiohttpTransport(limits=LIMITS), timeout=None)
        else:
            client = httpx.AsyncClient(limits=LIMITS, timeout=None)
        async with client:
            app.state.client = client
            yield

    async def forward(request: Request) -> Response:
        client: httpx.AsyncClient = request.app.state.client
        url = base + request.url.path[3:] + ("?" + request.url.query if request.url.query else "")
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in HOP_BY_HOP]
        sent = client.build_request(request.method, url, headers=headers, content=request.stream())
        response = await client.send(sent, stream=True)
        kept = {k.decode(): v.decode() for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(_body(response), status_code=response.status_code, headers=kept)

    return Starlette(routes=[Route("/v1/{path:path}", forward, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])],
                     lifespan=lifespan)


async def _body(response: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        await response.aclose()  # here, not in a background task a disconnect would skip


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--upstream", default="http://127.0.0.1:9000/v1")
    parser.add_argument("--transport", choices=("aiohttp", "httpx"), default="aiohttp")
    args = parser.parse_args()
    uvicorn.run(make_app(args.upstream, args.transport), host=args.host, port=args.port, loop="uvloop",
                http="httptools", log_level="warning", access_log=False, server_header=False, date_header=False)


if __name__ == "__main__":
    main()
