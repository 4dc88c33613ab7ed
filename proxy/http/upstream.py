"""The provider side: one connection pool (httpx requests on aiohttp), header filtering, named timeouts.

Timeouts are ours, not the transport's: `first_byte` bounds the wait for response headers,
`idle` the silence between two body chunks. A POST is never retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote_plus

import aiohttp
import httpx

from proxy.errors import ClientGone, ProxyError, UpstreamConnectTimeout, UpstreamProtocolError, UpstreamTimeout, UpstreamUnavailable
from proxy.settings import UpstreamSettings
from proxy.http.transport import AiohttpTransport
from proxy.wires.base import Provider

log = logging.getLogger("memproxy.upstream")

# RFC 9110 7.6.1 hop-by-hop fields, plus what the proxy recomputes (host, length).
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
     "te", "trailer", "trailers", "transfer-encoding", "upgrade"}
)
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length"}
# Provider URLs kept parsed: httpx parses a URL given as text on every request (~15 us, more
# than the rest of building the request); a proxy sends to a handful of URLs over and over.
# A client's query string makes the set open, so the table is bounded (emptied when full).
PARSED_URLS_KEPT = 256


class StreamCut(Exception):
    """The provider's body ended early (reset, cut, or idle past the timeout)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# Where each provider reads a key: OpenAI `Authorization`, Azure OpenAI `api-key`, Anthropic
# `x-api-key`, Google `x-goog-api-key`. memproxy's key for the provider replaces all of them.
_PROVIDER_CREDENTIALS = frozenset({b"authorization", b"x-api-key", b"api-key", b"x-goog-api-key"})
# In api-keys mode the client's credential is memproxy's own key, and the provider account is
# memproxy's: nothing the client sends may authenticate to it or pick a part of it (a session
# cookie, an organisation or project of memproxy's key).
_PROXY_MODE_DROPPED = _PROVIDER_CREDENTIALS | {b"cookie", b"proxy-authorization", b"openai-organization",
                                               b"openai-project"}
# The query parameters Google reads a credential from: an API key as `key` or `$key` (the
# system-parameter spelling, `%24key` escaped), an OAuth token as `access_token` (the query
# form of `Authorization`).
_KEY_PARAMETERS = frozenset({"key", "$key", "access_token"})
# Google's API key as its clients send it, in a header or a query parameter: alone, either names
# the Gemini upstream on a path no wire claims; the header never goes to another upstream.
_GOOGLE_KEY_HEADER = b"x-goog-api-key"
_GOOGLE_KEY_PARAMETERS = frozenset({"key", "$key"})
_GOOGLE_KEY_ONLY = frozenset({_GOOGLE_KEY_HEADER})
# A request carrying one of these beside Google's key is another provider's client (Google's SDKs
# send their key alone).
_OTHER_CREDENTIALS = _PROVIDER_CREDENTIALS - _GOOGLE_KEY_ONLY
# The header each provider takes memproxy's own key in, and how it is written.
_KEY_HEADERS: dict[str, tuple[bytes, bytes]] = {"openai": (b"authorization", b"Bearer "),
                                                 "anthropic": (b"x-api-key", b""),
                                                 "gemini": (b"x-goog-api-key", b"")}


def request_headers(
    raw: Iterable[tuple[bytes, bytes]], *, api_key: str | None, proxy_key: str | None = None,
    provider: Provider = "openai",
) -> list[tuple[bytes, bytes]]:
    """The client's headers as the provider should see them.

    Hop-by-hop headers (and any the client's Connection header names) and memproxy's own
    X-Memory-* headers are dropped. With our own key for the provider the client's
    credentials never leave (every header a provider reads a key from), our key going where
    that provider reads it. `proxy_key` (api-keys mode: the client authenticated with
    memproxy's own key) drops those, cookies and account selectors, and any header whose value
    holds that key, whatever its name. Google's `x-goog-api-key` goes to the Gemini upstream alone.
    """
    pairs = list(raw)
    named = _named_by_connection(pairs)
    dropped: frozenset[bytes] = frozenset()
    if proxy_key is not None:
        dropped = _PROXY_MODE_DROPPED
    elif api_key:
        dropped = _PROVIDER_CREDENTIALS
    elif provider != "gemini":
        dropped = _GOOGLE_KEY_ONLY
    secret = proxy_key.encode("latin-1", "replace") if proxy_key else None
    out = []
    for name, value in pairs:
        lower = name.lower()
        if lower.decode("latin-1") in _NOT_FORWARDED or lower in named or lower.startswith(b"x-memory-"):
            continue
        if lower in dropped or (secret is not None and secret in value):
            continue
        out.append((lower, value))
    if api_key:
        name, scheme = _KEY_HEADERS[provider]
        out.append((name, scheme + api_key.encode()))
    return out


def without_key_parameter(query: bytes, names: frozenset[str] = _KEY_PARAMETERS) -> bytes:
    """A query string without its credential parameters (Gemini's other place for the API key,
    replaced by memproxy's own; or just Google's key, `names`), every other parameter byte for
    byte, in order."""
    if not query:
        return query
    return b"&".join(pair for pair in query.split(b"&") if not _is_key_parameter(pair.partition(b"=")[0], names))


def _is_key_parameter(name: bytes, names: frozenset[str] = _KEY_PARAMETERS) -> bool:
    return unquote_plus(name.decode("latin-1")) in names


def query_without_credentials(query: bytes, proxy_key: str) -> bytes:
    """The query string without a key parameter or any parameter holding the client's memproxy
    key, in its name or its value (api-keys mode); every other parameter byte for byte, in order."""
    kept = []
    for pair in query.split(b"&"):
        name, _, value = pair.partition(b"=")
        if _is_key_parameter(name):
            continue
        if proxy_key in unquote_plus(pair.decode("latin-1")) or proxy_key.encode("latin-1", "replace") in pair:
            continue
        kept.append(pair)
    return b"&".join(kept)


def provider_for(headers: Sequence[tuple[bytes, bytes]], wire_provider: Provider | None,
                 query: bytes = b"") -> Provider:
    """The upstream a request goes to: Anthropic for any request carrying `anthropic-version`
    (Claude Code's `GET /v1/models`, say), whatever its path; else its wire's; else, on a path
    no wire names (`/v1/models/{model}`, `/v1/files`), Gemini for a request whose only
    credential is Google's key (google-genai's `x-goog-api-key`, or a `key` parameter); else OpenAI."""
    if any(name.lower() == b"anthropic-version" for name, _ in headers):
        return "anthropic"
    if wire_provider is not None:
        return wire_provider
    names = {name.lower() for name, _ in headers}
    google_key = _GOOGLE_KEY_HEADER in names or _has_google_key_parameter(query)
    return "gemini" if google_key and not names & _OTHER_CREDENTIALS else "openai"


def _has_google_key_parameter(query: bytes) -> bool:
    return bool(query) and any(unquote_plus(pair.partition(b"=")[0].decode("latin-1")) in _GOOGLE_KEY_PARAMETERS
                               for pair in query.split(b"&"))


def response_headers(headers: httpx.Headers) -> list[tuple[bytes, bytes]]:
    """The provider's response headers minus hop-by-hop ones, those its Connection header names included."""
    named = _named_by_connection(headers.raw)
    return [(k.lower(), v) for k, v in headers.raw
            if k.lower().decode("latin-1") not in HOP_BY_HOP and k.lower() not in named]


def _named_by_connection(pairs: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """The headers a Connection header declares hop-by-hop (RFC 9110 7.6.1), lower case."""
    return {token.strip().lower().encode() for name, value in pairs if name.lower() == b"connection"
            for token in value.decode("latin-1").split(",")}


@dataclass
class UpstreamResponse:
    """An open provider response whose body is read chunk by chunk, then closed."""

    response: httpx.Response
    idle_timeout_s: float
    max_stream_s: float = float("inf")

    @property
    def status(self) -> int:
        return self.response.status_code

    @property
    def content_type(self) -> str:
        return self.response.headers.get("content-type", "")

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """Raw body bytes as they arrive; raises StreamCut when the body ends badly.

        The idle timeout counts only time spent waiting on the provider: while a chunk is
        with the caller (a slow client, backpressure) the watchdog is paused. A body still
        coming after `max_stream_s` is cut too (a hard cap against a stream that never ends).
        """
        # The transport's own stream, not `aiter_raw()`: httpx's layer over it, a generator and a
        # chunker passing each chunk on unchanged, cost every chunk of a stream ~1 us. The
        # response is closed by `aclose()`, as every caller does once done.
        iterator = cast(httpx.AsyncByteStream, self.response.stream).__aiter__()
        watchdog = _IdleWatchdog(self.idle_timeout_s, self.max_stream_s)
        try:
            while True:
                if watchdog.past_deadline():
                    raise StreamCut("upstream_max_stream", "upstream stream went on past upstream.max_stream_s")
                try:
                    chunk = await iterator.__anext__()
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if not watchdog.fired:
                        raise
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
                    if watchdog.past_deadline():
                        raise StreamCut("upstream_max_stream",
                                        "upstream stream went on past upstream.max_stream_s") from None
                    raise StreamCut("upstream_idle_timeout", "upstream stopped sending before completion") from None
                except (httpx.HTTPError, aiohttp.ClientError) as exc:
                    raise StreamCut("stream_truncated", "upstream stream ended before completion") from exc
                if chunk:
                    watchdog.paused = True
                    yield chunk
                    watchdog.touch()
        finally:
            watchdog.stop()

    async def aclose(self) -> None:
        """Release the connection (a partly read body closes it instead of pooling it)."""
        await self.response.aclose()


class _IdleWatchdog:
    """Cancels the reading task after `idle_s` without a chunk, or once `max_s` have passed.

    One timer per idle period rather than one per chunk: a stream of thousands of small
    events pays a clock read per chunk, not a timer.
    """

    def __init__(self, idle_s: float, max_s: float = float("inf")) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._idle_s = idle_s
        self._last = self._loop.time()
        self._deadline = self._last + max_s
        self.paused = False
        self.fired = False
        self._handle = self._loop.call_at(min(self._last + idle_s, self._deadline), self._check)

    def past_deadline(self) -> bool:
        return self._loop.time() >= self._deadline

    def touch(self) -> None:
        """A chunk was handed on: the provider is being waited on again from now."""
        self._last = self._loop.time()
        self.paused = False

    def _check(self) -> None:
        now = self._loop.time()
        if self.paused or (now < self._last + self._idle_s and now < self._deadline):
            # Paused, the chunk is with the caller: the deadline is checked before the next read.
            due = now + self._idle_s if self.paused else min(self._last + self._idle_s, self._deadline)
            self._handle = self._loop.call_at(due, self._check)
            return
        self.fired = True
        if self._task is not None:
            self._task.cancel()

    def stop(self) -> None:
        self._handle.cancel()


class Upstream:
    """The configured providers; no header or body field can point a request elsewhere."""

    def __init__(self, settings: UpstreamSettings) -> None:
        self.settings = settings
        self.base_url = settings.base_url.rstrip("/")
        self._base_urls: dict[str, str] = {"openai": self.base_url,
                                           "anthropic": settings.anthropic_base_url.rstrip("/"),
                                           "gemini": settings.gemini_base_url.rstrip("/")}
        self._keys: dict[str, str | None] = {"openai": settings.api_key, "anthropic": settings.anthropic_api_key,
                                             "gemini": settings.gemini_api_key}
        # The pooled transport is used without httpx.AsyncClient's layers: a proxy wants none
        # of them (redirects, auth flows, default headers) and must not keep a cookie jar,
        # since one pool serves every user. Skipping them is ~10% of a request's CPU.
        self.transport = AiohttpTransport(max_connections=settings.max_connections,
                                          connect_timeout_s=settings.connect_timeout_s)
        self._parsed: dict[str, httpx.URL] = {}

    def _parsed_url(self, url: str) -> httpx.URL:
        """`url` parsed, from the table when it was sent to before."""
        parsed = self._parsed.get(url)
        if parsed is None:
            if len(self._parsed) >= PARSED_URLS_KEPT:
                self._parsed.clear()
            parsed = self._parsed[url] = httpx.URL(url)
        return parsed

    def url(self, path: str, query: bytes, provider: Provider = "openai", version: str = "/v1") -> str:
        """The provider URL for a path after memproxy's /v1 (or the client's `version` prefix), query kept
        byte for byte. Gemini's base has no version: the client's goes in front of the path; with
        memproxy's own Gemini key the client's `key` parameter never leaves. Google's key (`key`,
        `$key`) goes to Google alone, like its header."""
        if provider == "gemini":
            path = version + path
            if self._keys["gemini"]:
                query = without_key_parameter(query)
        elif query:
            query = without_key_parameter(query, _GOOGLE_KEY_PARAMETERS)
        return self._base_urls[provider] + path + ("?" + query.decode("latin-1") if query else "")

    def api_key(self, provider: Provider) -> str | None:
        """memproxy's own key for that provider, if configured."""
        return self._keys[provider]

    async def open(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]],
        content: bytes | AsyncIterator[bytes] | None,
    ) -> UpstreamResponse:
        """Send the request and wait for the response headers (first-byte timeout)."""
        request = httpx.Request(method, self._parsed_url(url), headers=headers, content=content)
        try:
            async with asyncio.timeout(self.settings.first_byte_timeout_s):
                response = await self.transport.handle_async_request(request)
        except httpx.ConnectTimeout:
            raise UpstreamConnectTimeout("no connection to the upstream in time") from None
        except (TimeoutError, httpx.TimeoutException):
            raise UpstreamTimeout("the upstream did not answer in time") from None
        except httpx.HTTPError as exc:
            if (own := _own_error(exc)) is not None:
                raise own from None  # the client's body failed as it was sent (408, 413, gone), not the upstream
            cause = type(exc.__cause__ or exc).__name__
            if isinstance(exc, httpx.RemoteProtocolError):
                log.warning("upstream broke the connection before its headers: %s", cause)
                raise UpstreamProtocolError("the upstream closed or broke the connection before answering") from exc
            # The client's 502 names no host; the operator's log line does, to tell a typo from an outage.
            log.warning("upstream unreachable: %s (%s)", _host(request.url), cause)
            raise UpstreamUnavailable("the upstream could not be reached") from exc
        return UpstreamResponse(response, self.settings.idle_timeout_s, self.settings.max_stream_s)

    async def aclose(self) -> None:
        """Close the pool."""
        await self.transport.aclose()


def _host(url: httpx.URL) -> str:
    """host:port of a URL, without any user or password it may carry."""
    return f"{url.host}:{url.port}" if url.port else url.host


def _own_error(exc: BaseException) -> ProxyError | ClientGone | None:
    """What the request body raised while the transport was sending it (a ProxyError, or the
    client leaving mid-upload), if anything."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ProxyError, ClientGone)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
