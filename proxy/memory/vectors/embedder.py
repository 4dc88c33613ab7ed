"""The embeddings call as the memory package sees it: texts in, float32 vectors out.

The HTTP side lives in proxy/calls/embeddings.py (the memory package never imports an HTTP
client); this module holds what both sides share: the callable's shape, its one error,
the request body and the parsing of an OpenAI-style `/embeddings` answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import numpy as np

# texts, timeout in seconds -> one float32 little-endian vector per text, in order
Embed = Callable[[Sequence[str], float], Awaitable[list[bytes]]]


class Embedder(Protocol):
    """An Embed with its model's name; `in_process` when a call costs no network round trip."""

    model: str
    in_process: bool

    async def __call__(self, texts: Sequence[str], timeout_s: float, /) -> list[bytes]: ...


class EmbeddingFailed(Exception):
    """An embeddings call failed. `retry` is False when the same texts would fail again (a 4xx)."""

    def __init__(self, message: str, *, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


# A lone surrogate: valid in JSON (`"\\ud800"`), not in UTF-8.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """`text` with each lone surrogate made U+FFFD: what a tokenizer can read, and how the stores
    keep such a text (so a vector of it is one of the text saved)."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def request_body(model: str, texts: Sequence[str]) -> bytes:
    """The JSON body of POST /embeddings for these texts."""
    return json.dumps({"model": model, "input": list(texts)}, ensure_ascii=False).encode()


def parse_vectors(raw: bytes, count: int) -> list[bytes]:
    """The `count` vectors of an /embeddings answer, by their `index`, as float32 little-endian bytes."""
    try:
        data = json.loads(raw)["data"]
        by_index = {int(item["index"]): item["embedding"] for item in data}
        ordered = [by_index[i] for i in range(count)]
        vectors = [np.asarray(v, dtype="<f4") for v in ordered]
    except (ValueError, KeyError, TypeError, IndexError):
        raise EmbeddingFailed("the answer is not an embeddings list for the texts sent") from None
    dims = {v.shape for v in vectors}
    if len(dims) > 1 or any(len(shape) != 1 or shape[0] == 0 for shape in dims):
        raise EmbeddingFailed("the answer's vectors are empty or differ in length")
    if any(not np.isfinite(v).all() for v in vectors):
        raise EmbeddingFailed("the answer holds a vector that is not finite")
    return [v.tobytes() for v in vectors]
