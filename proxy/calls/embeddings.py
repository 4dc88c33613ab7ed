"""Which embedder memproxy uses, and the calls to a provider's embeddings endpoint.

`embeddings.model: local` (the default) is the embedded model (proxy.memory.vectors.local_model),
in-process, no key and no network; `off` is lexical retrieval only; any other name is
that model at `embeddings.base_url` (else `upstream.base_url`) + `/embeddings`, with
`embeddings.api_key`, else `upstream.api_key`: a client's key is never kept to make these
background calls, so with no key of memproxy's own they are off and start-up says so.
Calls go through the upstream's connection pool with a timeout of the caller's choosing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

from proxy.errors import ProxyError
from proxy.memory.vectors.filler import EmbeddingWorker, Filler
from proxy.memory.vectors.embedder import Embedder, EmbeddingFailed, parse_vectors, request_body
from proxy.memory.vectors.query import Vectors
from proxy.memory.vectors.local_model import LocalModel, ModelMissing
from proxy.memory.vectors.index import VectorIndex
from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.stores.base import Store
from proxy.http.upstream import StreamCut, Upstream

log = logging.getLogger("memproxy.embeddings")

# 64 vectors of 3,072 floats as JSON text are ~4 MB; far more is not an answer.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
_PASSING = frozenset({401, 403, 404, 408, 409, 429})
LOCAL, OFF = "local", "off"  # embeddings.model's two names that are not a provider's model


class EmbeddingsCaller:
    """POST {base}/embeddings with memproxy's key and one model; returns float32 vectors."""

    def __init__(self, upstream: Upstream, base_url: str, api_key: str, model: str) -> None:
        self._upstream = upstream
        self._url = base_url.rstrip("/") + "/embeddings"
        self._headers = [(b"content-type", b"application/json"), (b"accept", b"application/json"),
                         (b"authorization", b"Bearer " + api_key.encode())]
        self.model = model
        self.in_process = False

    async def __call__(self, texts: Sequence[str], timeout_s: float) -> list[bytes]:
        """One vector per text, in order; EmbeddingFailed on any other outcome (never naming the key)."""
        if not texts:
            return []
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._upstream.open("POST", self._url, self._headers,
                                                     request_body(self.model, texts))
                try:
                    raw = await _read(response.chunks())
                finally:
                    await response.aclose()
        except TimeoutError:
            raise EmbeddingFailed(f"no answer within {timeout_s:g}s") from None
        except (ProxyError, StreamCut) as exc:
            raise EmbeddingFailed(f"{type(exc).__name__}: {exc}") from None
        if response.status != 200:
            # A rejected text (400, 413, 422) is rejected again; a key, a path or a rate limit is
            # the endpoint's state, not the texts', and may pass.
            retry = response.status in _PASSING or response.status >= 500
            raise EmbeddingFailed(f"the embeddings endpoint answered {response.status}", retry=retry)
        return parse_vectors(raw, len(texts))


async def _read(chunks: AsyncIterator[bytes]) -> bytes:
    data = bytearray()
    async for chunk in chunks:
        data += chunk
        if len(data) > MAX_ANSWER_BYTES:
            raise EmbeddingFailed(f"answer larger than {MAX_ANSWER_BYTES} bytes")
    return bytes(data)


def embeddings_caller(settings: Settings, upstream: Upstream) -> Embedder | None:
    """The embedder `embeddings.model` names, or None (logged) when embeddings are off."""
    e = settings.embeddings
    if e.model == OFF:
        log.info("embeddings: off (embeddings.model: off); retrieval is lexical")
        return None
    if e.model == LOCAL:
        try:
            model = LocalModel()
        except ModelMissing as exc:
            log.warning("embeddings: off: %s; retrieval is lexical", exc)
            return None
        log.info("embeddings: the embedded model %s, in-process", model.model)
        return model
    key = e.api_key or settings.upstream.api_key
    if not key:
        log.warning("embeddings: off: embeddings.model is a provider's model but memproxy has no key of its own "
                    "(embeddings.api_key or upstream.api_key; a client's key is never kept for background "
                    "calls); retrieval is lexical")
        return None
    base = e.base_url or settings.upstream.base_url
    log.info("embeddings: model %s at %s", e.model, base)
    return EmbeddingsCaller(upstream, base, key, e.model)


def vector_parts(settings: Settings, upstream: Upstream, store: Store, metrics: Metrics
                 ) -> tuple[Vectors, EmbeddingWorker] | None:
    """Vector search and the worker that fills vectors in, as `embeddings` configures them (None when off)."""
    embed = embeddings_caller(settings, upstream)
    if embed is None:
        return None
    e = settings.embeddings
    index = VectorIndex(store, embed.model, max_bytes=e.cache_max_mb * 1024 * 1024)
    filler = Filler(store, embed, embed.model, batch=e.batch_size, timeout_s=e.timeout_s)
    return Vectors(embed, index, e, metrics), EmbeddingWorker(filler, metrics, with_writes=embed.in_process)
