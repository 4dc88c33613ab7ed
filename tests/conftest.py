"""Real parts: the proxy under uvicorn on a free port, a scripted upstream on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from proxy.app import create_app
from proxy.settings import Settings, load_settings
from tests.fake_upstream import FakeUpstream

pytest_plugins = ["tests.pg_server"]  # a throwaway PostgreSQL server: pg_server, pg_url
# store.hash_key of every proxy the tests run on PostgreSQL (a deployment gives its replicas one).
PG_HASH_KEY = "tests-hash-key-of-every-replica-0123456789"
_uvicorn_log = logging.getLogger("uvicorn.error")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Server(uvicorn.Server):
    """uvicorn's server, which `wake` stops at once: uvicorn looks at should_exit only every
    0.1 s, and the suite starts and stops a proxy for each of hundreds of tests."""

    _loop: asyncio.AbstractEventLoop | None = None
    _woken: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._woken = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000  # uvicorn refreshes its default headers at each 10th tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), 1.0)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, but its fixed 0.1 s pause for the connections it asked to close
        ends as soon as they have (idle keep-alive ones close at once); the rest is uvicorn's own."""
        _uvicorn_log.info("Shutting down")
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        closing_by = time.monotonic() + 0.1
        while self.server_state.connections and time.monotonic() < closing_by:
            await asyncio.sleep(0.005)
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                await self._wait_tasks_to_complete()
        except TimeoutError:
            _uvicorn_log.error("Cancel %s running task(s), timeout graceful shutdown exceeded",
                               len(self.server_state.tasks))
            for task in self.server_state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()

    def wake(self) -> None:
        """Have the serving loop see should_exit now (from another thread)."""
        loop, woken = self._loop, self._woken
        if loop is not None and woken is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(woken.set)


class RunningProxy:
    """memproxy served by uvicorn in a thread, as `memproxy serve` runs it."""

    def __init__(self, settings: Settings, *, own_process: bool = False) -> None:
        self.settings = settings
        self.port = free_port()
        self.app = create_app(settings, own_process=own_process)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_config=None, access_log=False,
                                server_header=False, date_header=False, lifespan="on",
                                timeout_graceful_shutdown=2)
        self.server = _Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("proxy did not start")
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="sk-client-key", default_headers=headers,
                             max_retries=0)

    def async_client(self, **headers: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="sk-client-key", default_headers=headers,
                                  max_retries=0)

    def http(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("timeout", 30)
        return httpx.Client(base_url=self.url, **kwargs)

    def begin_stop(self) -> None:
        """Ask the server to stop, without waiting for it."""
        self.server.should_exit = True
        self.server.wake()

    def stop(self) -> None:
        self.begin_stop()
        self.thread.join(10)


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    yield fake
    fake.close()


@pytest.fixture
def fake(upstream: FakeUpstream) -> Iterator[FakeUpstream]:
    upstream.reset()
    yield upstream
    upstream.reset()


@pytest.fixture
def make_proxy(fake: FakeUpstream, tmp_path: Any) -> Iterator[Any]:
    started: list[RunningProxy] = []

    def start(**overrides: Any) -> RunningProxy:
        # A generous recall deadline unless a test sets one: tests assert what memory does, and
        # on a loaded machine a fresh store's first recall can pass the default 250 ms. The
        # tests of the deadline itself set theirs.
        values = {"upstream.base_url": fake.url, "store.url": f"sqlite:///{tmp_path}/memproxy.db",
                  "memory.retrieval_timeout_ms": 5000}
        values.update({k.replace("__", "."): v for k, v in overrides.items()})
        if str(values["store.url"]).startswith("postgresql") and "store.hash_key" not in values:
            values["store.hash_key"] = PG_HASH_KEY  # what every replica of a deployment is given
        proxy = RunningProxy(load_settings(environ={}, overrides=values))
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:  # all at once: each takes uvicorn's 0.1 s to shut down
        proxy.begin_stop()
    for proxy in started:
        proxy.stop()


@pytest.fixture
def proxy(make_proxy: Any) -> RunningProxy:
    return make_proxy()
