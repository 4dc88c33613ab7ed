"""create_app(settings) -> Starlette: the only place that picks concrete parts."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy import logs
from proxy.api.auth import ApiGuard
from proxy.api.inspector import Inspector
from proxy.api.routes import ApiApp, MemoryApi
from proxy.calls.embeddings import vector_parts
from proxy.errors import NotFound
from proxy.calls.http_hooks import HookPoster
from proxy.memory.vectors.filler import EmbeddingWorker
from proxy.memory.learning.worker import ExtractionWorker
from proxy.memory.vectors.query import Vectors
from proxy.memory.learning.pending_facts import PendingFacts
from proxy.memory.hooks.runner import load_hooks
from proxy.memory.pipeline import MemoryService
from proxy.memory.retrieval.retriever import Retrieval
from proxy.memory.vectors.index import one_blas_thread
from proxy.memory.writer import Writer
from proxy.metrics import Metrics
from proxy.calls.extraction_model import extractor_for
from proxy.endpoint.ownership import Ownership
from proxy.endpoint.v1 import ProxyEndpoint
from proxy.mcp.endpoint import McpEndpoint
from proxy.identity.rebinding import RebindingGuard
from proxy.identity.scope import ScopeResolver
from proxy.settings import Settings, StoreSettings
from proxy.identity.side_requests import SideRequests
from proxy.stores.base import Store, StoreError
from proxy.http.upstream import Upstream

log = logging.getLogger("memproxy.app")

# A store that did not open at start-up is tried again after 0.5 s, then ever less often.
REOPEN_FIRST_S = 0.5
REOPEN_MAX_S = 30.0
# With several workers, each refreshes its own gauges in the shared metrics this often (the
# worker answering /metrics refreshes its own at once).
SHARED_GAUGES_EVERY_S = 5.0
_PROVIDER_PREFIXES = ("/v1/", "/v1beta/", "/upload/v1/", "/upload/v1beta/")


def open_store(settings: StoreSettings, *, on_file_lost: Callable[[], None] | None = None) -> Store:
    """The Store named by store.url; `on_file_lost`: called when a SQLite file is deleted under it."""
    if settings.url.startswith("sqlite:///"):
        from proxy.stores.sqlite.store import SQLiteStore

        return SQLiteStore(settings.url[len("sqlite:///"):], synchronous=settings.synchronous.upper(),
                           search_cache_mb=settings.search_cache_mb, on_file_lost=on_file_lost)
    from proxy.stores.postgres.store import PostgresStore

    return PostgresStore(settings.url)


class Parts:
    """Everything one app instance owns, built here and passed down (no globals)."""

    def __init__(self, settings: Settings, metrics_dir: str | None = None) -> None:
        """`metrics_dir`: this is one worker of several, sharing metrics in that directory."""
        self.settings = settings
        self.metrics = Metrics(metrics_dir)
        self.one_of_workers = metrics_dir is not None
        self.upstream = Upstream(settings.upstream)
        self.scopes = ScopeResolver(settings)
        # A database file deleted under the store lost what it held: a persistence failure.
        self.store = open_store(settings.store, on_file_lost=self.metrics.write_failures.inc)
        parts = vector_parts(settings, self.upstream, self.store, self.metrics)
        self.vectors: Vectors | None = parts[0] if parts is not None else None
        self.embedding: EmbeddingWorker | None = parts[1] if parts is not None else None
        commit_hooks = self.embedding if self.embedding is not None and self.embedding.with_writes else None
        self.writer = Writer(self.store, self.metrics, settings.memory.write_queue_size, hooks=commit_hooks)
        self.retriever = Retrieval(self.store, settings.memory, self.metrics, self.vectors)
        self.pending_facts = PendingFacts()
        self.hook_poster = HookPoster() if any(spec.kind == "url" for spec in settings.hooks) else None
        hooks = load_hooks(settings.hooks, self.hook_poster, self.metrics)
        extractor = extractor_for(settings, self.upstream, self.metrics.extraction_fallbacks.inc)
        self.memory = MemoryService(settings, self.store, self.writer, self.retriever, self.metrics,
                                    self.pending_facts, hooks, extractor)
        self.extraction = ExtractionWorker(self.store, self.writer, self.metrics,
                                           from_roles=settings.extraction.from_roles,
                                           isolate_agents=settings.scope.isolation == "agent",
                                           extractor=extractor, pending=self.pending_facts)
        self.store_open = False
        self._opening: asyncio.Task[None] | None = None  # retrying a store that did not open at start-up
        self._gauges: asyncio.Task[None] | None = None  # with several workers: this one's, refreshed

    async def start(self) -> None:
        self.writer.start()
        if self.one_of_workers:
            self._gauges = asyncio.get_running_loop().create_task(self._refresh_gauges(),
                                                                  name="memproxy-shared-gauges")
        if not await self._open_store():
            # Memory fails open: the proxy serves without it, says so in /readyz, and keeps
            # trying, so a replica started before its database (a compose file's usual
            # race) gets memory without a restart; writes queue meanwhile.
            log.error("store unavailable at start-up, serving without memory until it answers")
            self._opening = asyncio.get_running_loop().create_task(self._open_when_reachable(),
                                                                   name="memproxy-store-open")

    async def _open_store(self) -> bool:
        """Open the store and start what needs it; False (logged) when it does not answer."""
        try:
            await self.store.open()
        except StoreError as exc:
            log.warning("store did not open: %s", exc)
            return False
        self.store_open = True
        self.extraction.start()
        if self.embedding is not None:
            self.embedding.start()
        return True

    async def _open_when_reachable(self) -> None:
        delay = REOPEN_FIRST_S
        while True:
            await asyncio.sleep(delay)
            if await self._open_store():
                log.info("store open: memory on")
                return
            delay = min(delay * 2, REOPEN_MAX_S)

    def refresh_gauges(self) -> None:
        """Set the gauges only read when asked for (the users whose searches are answered from memory)."""
        for index, users in self.store.searched_in_memory().items():
            self.metrics.searched_in_memory.labels(index).set(users)

    async def _refresh_gauges(self) -> None:
        while True:
            self.refresh_gauges()
            await asyncio.sleep(SHARED_GAUGES_EVERY_S)

    async def stop(self) -> None:
        for task in (self._opening, self._gauges):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.embedding is not None:
            await self.embedding.stop()
        await self.extraction.stop()
        await self.memory.settle_hook_saves(self.settings.server.grace_period_s)
        await self.writer.close(self.settings.server.grace_period_s)
        await self.store.close()
        await self.upstream.aclose()
        if self.hook_poster is not None:
            await self.hook_poster.aclose()
        if self.memory.hooks is not None:
            self.memory.hooks.close()

    async def readiness(self) -> dict[str, Any]:
        """Still 200 when memory is degraded (proxying goes on); `status` says how (kept in service)."""
        store_ok = self.store_open and await self.store.ping()
        problems = [name for name, bad in (("memory_store_unavailable", not store_ok),
                                           ("memory_writes_failing", self.writer.failing),
                                           ("memory_circuit_open", self.memory.breaker.is_open)) if bad]
        return {
            "status": f"degraded: {', '.join(problems)}" if problems else "ready",
            "workers": self.settings.server.workers,  # processes serving this port, this one among them
            "process": os.getpid(),
            "store": "ok" if store_ok else "unavailable",
            "writes": "failing" if self.writer.failing else "ok",
            "write_queue": self.writer.depth,
            "circuit": "open" if self.memory.breaker.is_open else "closed",
            "extraction_queue": await self._extraction_queue() if store_ok else "unavailable",
        }

    async def _extraction_queue(self) -> dict[str, int] | str:
        try:
            return await self.store.queue_depth()
        except StoreError:
            return "unavailable"


class ProviderPaths:
    """Every request under /v1/ and /v1beta/ (Gemini's) goes straight to the proxy endpoint.

    The router's matching, its exception middleware and their wrappers around every `send`
    cost each request ~9 us and gave a provider's path nothing: the endpoint answers its own
    errors in the wire's shape. The server-error middleware outside this one stays (a 500
    for an exception nothing caught).
    """

    def __init__(self, app: ASGIApp, proxy: Callable[..., Awaitable[None]]) -> None:
        self.app = app
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_PROVIDER_PREFIXES):
            await self.proxy(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def create_app(settings: Settings, *, own_process: bool = False, metrics_dir: str | None = None) -> Starlette:
    """The proxy app: /v1/* to the provider, health, readiness and metrics.

    `own_process`: the app is the process's only one (`memproxy serve`), so what exists once
    it has started lives as long as the process, and is frozen out of garbage collection.
    `metrics_dir`: the app is one worker of `memproxy serve --workers N` (proxy/workers.py),
    and /metrics sums the workers' values kept in that directory.
    """
    parts = Parts(settings, metrics_dir)
    logs.mark_expected_aborts()
    proxy = ProxyEndpoint(settings, parts.upstream, parts.scopes, parts.memory, parts.metrics,
                          SideRequests(settings.scope.side_requests),
                          Ownership(settings, parts.upstream, parts.store))
    rebinding = RebindingGuard(settings.server)
    memory_api = ApiApp(MemoryApi(settings, parts.store, parts.retriever, parts.writer, parts.memory.hooks),
                        ApiGuard(settings.memory_api.token, rebinding), parts.metrics)
    mcp = McpEndpoint(settings, parts.scopes, parts.memory, parts.metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if own_process:
            one_blas_thread()
        await parts.start()
        if own_process:
            # Modules, the stemmer's tables, the app: about 46,000 objects that live as long as
            # the process, and that every full collection walked again (9 ms each time).
            gc.collect()
            gc.freeze()
        try:
            async with mcp.running():
                yield
        finally:
            await parts.stop()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        # A store outage does not make the proxy unready: requests still succeed without memory.
        return JSONResponse(await parts.readiness())

    async def metrics_endpoint(request: Request) -> Response:
        parts.refresh_gauges()
        return Response(parts.metrics.render(), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc: Exception) -> Response:
        return Response(NotFound("no such path").body(), status_code=404, media_type="application/json")

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/mcp", mcp),
        Mount("/memory/v1", app=memory_api),
        Mount("/memory/ui", app=Inspector(None if settings.memory_api.token else rebinding)),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found},
                    middleware=[Middleware(ProviderPaths, proxy=proxy)])
    app.router.redirect_slashes = False  # a redirect would be a response the provider never gave
    app.state.parts = parts
    return app
