"""Caches of functions of a text that stay small whatever users paste.

An `lru_cache` keeps every key it holds alive: cached over any text, a pasted document or
blob stays in memory for as long as the cache remembers it, thousands of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")


def cached_when_short(maxsize: int, max_chars: int) -> Callable[[Callable[[str], R]], Callable[[str], R]]:
    """`lru_cache(maxsize)` for texts of at most `max_chars`; a longer text is computed each time."""

    def decorate(compute: Callable[[str], R]) -> Callable[[str], R]:
        cached = functools.lru_cache(maxsize=maxsize)(compute)

        @functools.wraps(compute)
        def call(text: str) -> R:
            return cached(text) if len(text) <= max_chars else compute(text)

        return call

    return decorate
