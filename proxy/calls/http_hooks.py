"""HTTP hook handlers: the hook's JSON POSTed to its URL, its JSON answer (or 204) read back."""

from __future__ import annotations

import json
from typing import Any

import httpx

from proxy.memory.hooks.runner import HookFailure

# The runner's per-hook timeout bounds each call; this only keeps a stuck socket from living on.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
MAX_ANSWER_BYTES = 1024 * 1024


class HookPoster:
    """POSTs hook inputs over one pooled client (built in the app's lifespan, closed with it)."""

    def __init__(self) -> None:
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                                         follow_redirects=False, trust_env=False)

    async def post(self, url: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        """The endpoint's JSON object, None for 204; HookFailure for anything else."""
        try:
            async with self._client.stream("POST", url, json=payload) as response:
                if response.status_code == 204:
                    return None
                if not 200 <= response.status_code < 300:
                    raise HookFailure("http_status")
                body = await _capped(response)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise HookFailure("unreachable") from exc
        except httpx.HTTPError as exc:
            raise HookFailure("error") from exc
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise HookFailure("bad_answer") from exc
        if answer is not None and not isinstance(answer, dict):
            raise HookFailure("bad_answer")
        return answer

    async def aclose(self) -> None:
        await self._client.aclose()


async def _capped(response: httpx.Response) -> bytes:
    """The answer's body, read no further than MAX_ANSWER_BYTES: an endpoint streaming without end
    costs no more memory than that."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise HookFailure("bad_answer")
    return bytes(body)
