"""Python hook handlers the hook tests configure (`python: tests.hook_handlers:...`).

They keep no state: what a hook was given shows in what it answers (the tests' HTTP hook
server records its inputs).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


def rewrite(event: dict[str, Any]) -> dict[str, Any]:
    return {"updated_prompt": event["prompt"] + " [python]"}


async def context(event: dict[str, Any]) -> dict[str, Any]:
    return {"additional_context": f"python {event['event']} context"}


def block(event: dict[str, Any]) -> dict[str, Any]:
    return {"decision": "block", "reason": "prompts about secrets are not allowed here"}


def last_hit_only(event: dict[str, Any]) -> dict[str, Any]:
    return {"hits": [event["hits"][-1]["id"]]}


def raising(event: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError(f"policy crashed on {event.get('prompt') or event.get('turns')}")


async def hanging(event: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(30)
    return {}


def blocking_sleep(event: dict[str, Any]) -> None:
    time.sleep(0.3)  # a sync hook that blocks: it must run off the event loop


def garbage(event: dict[str, Any]) -> Any:
    return ["not", "an", "object"]


def wrong_type(event: dict[str, Any]) -> dict[str, Any]:
    return {"updated_prompt": 42}


def deny_writes(event: dict[str, Any]) -> dict[str, Any]:
    return {"decision": "deny", "reason": f"{event['tool']} is read-only for {event['user']}"}


def tag_input(event: dict[str, Any]) -> dict[str, Any]:
    return {"updated_input": {**event["input"], "tags": ["python"]}}


def search_the_editor(event: dict[str, Any]) -> dict[str, Any]:
    return {"updated_input": {**event["input"], "query": "favourite editor"}}


def mark_output(event: dict[str, Any]) -> dict[str, Any]:
    return {"updated_output": event["output"] + "\n[checked by python]"}


def slow_last_hit(event: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.6)  # slower than the retrieval budget, well within the hook's own timeout
    return {"hits": [event["hits"][-1]["id"]]}


def stuck(event: dict[str, Any]) -> None:
    time.sleep(4)  # a sync policy stuck on I/O long past its timeout: its thread stays taken


def leaky_context(event: dict[str, Any]) -> dict[str, Any]:
    return {"additional_context": "deploy with sk-abcdefghijklmnopqrstuvwxyz012345"}


def leaky_rewrite(event: dict[str, Any]) -> dict[str, Any]:
    return {"updated_turns": [{**turn, "content": turn["content"] + " (key AKIAIOSFODNN7EXAMPLE)"}
                              for turn in event["turns"]]}


class AsyncPolicy:
    """A policy object whose __call__ is async: a callable that is async without being a function."""

    async def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        return {"additional_context": f"async object {event['event']}"}


async_object = AsyncPolicy()


def slow_write(event: dict[str, Any]) -> None:
    time.sleep(0.8)  # a policy slower than the commit's bound: the response goes out first
