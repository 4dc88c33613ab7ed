"""create_app(settings) -> Starlette: the only place that picks concrete parts."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.errors import NotFound
from proxy.exchange import ChatMemory, NoMemory
from proxy.metrics import Metrics
from proxy.routes import ProxyEndpoint
from proxy.scope import ScopeResolver
from proxy.settings import Settings
from proxy.upstream import Upstream

def create_app(settings: Settings, memory: ChatMemory | None = None) -> Starlette:
    """The proxy app: /v1/* to the provider, health, readiness and metrics."""
    upstream = Upstream(settings.upstream)
    metrics = Metrics()
    proxy = ProxyEndpoint(settings, upstream, ScopeResolver(settings), memory or NoMemory(), metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await upstream.aclose()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        return JSONResponse({"status": "ready", "upstream": settings.upstream.base_url, "store": "off"})

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc: Exception) -> Response:
        return Response(NotFound("no such path").body(), status_code=404, media_type="application/json")

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/v1/{path:path}", proxy),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app.router.redirect_slashes = False  # a redirect would be a response the provider never gave
    app.state.metrics = metrics
    return app
