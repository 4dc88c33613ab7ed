"""Real parts: the proxy under uvicorn on a free port, a scripted upstream on a real socket."""

from __future__ import annotations

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RunningProxy:
    """memproxy served by uvicorn in a thread, as `memproxy serve` runs it."""

    def __init__(self, settings: Settings, *, own_process: bool = False) -> None:
        self.settings = settings
        self.port = free_port()
        self.app = create_app(settings, own_process=own_process)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_config=None, access_log=False,
                                server_header=False, date_header=False, lifespan="on",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
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

    def stop(self) -> None:
        self.server.should_exit = True
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
        proxy = RunningProxy(load_settings(environ={}, overrides=values))
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


@pytest.fixture
def proxy(make_proxy: Any) -> RunningProxy:
    return make_proxy()
