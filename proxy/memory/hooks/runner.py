"""Hooks (docs/hooks.md): a deployment's own policies, called at the points of a turn.

A handler is a Python callable (sync or async) or an HTTP endpoint; both take one JSON
object and answer one (or nothing). Rewrites chain in the order configured, and the first
`block` or `deny` skips the hooks after it. A hook never breaks a request: a handler that
raises, answers garbage, cannot be reached or outruns its timeout is logged (never with
message text), counted in memproxy_hook_failures_total and skipped. `pre_memory_write`
alone fails closed: the save it guards is dropped, so a policy that keeps data out of
memory does not leak it by failing.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import importlib
import inspect
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol, TypeGuard

from proxy.redaction.redact import redact
from proxy.metrics import Metrics
from proxy.settings import ConfigError, HookSpec

log = logging.getLogger("memproxy.hooks")

Answer = dict[str, Any]
Handler = Callable[[Answer], Awaitable[Answer | None]]

# Synchronous handlers run on threads of their own, never the event loop's default pool: a
# handler stuck past its timeout keeps its thread, and the proxy's own work off the loop
# (hashing a long history, redacting a large prompt, extraction) must not queue behind it.
# When these are all stuck, further sync hooks wait here until their timeouts skip them.
HOOK_THREADS = 8


class HookFailure(Exception):
    """A handler gave no usable answer; `reason` is the metric's label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HookPoster(Protocol):
    """POSTs a hook's JSON to its URL (the HTTP edge lives outside memory/)."""

    async def post(self, url: str, payload: Answer) -> Answer | None:
        """The endpoint's JSON object, or None for 204; HookFailure when there is no answer."""


@dataclass(frozen=True)
class HookContext:
    """Whose turn a hook is called about: every input carries these fields."""

    user: str
    conversation: str | None  # None outside a conversation (a memory written through the memory API)
    agent: str | None
    turn: str | None
    wire: str

    def payload(self, event: str, fields: Answer) -> Answer:
        stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        # A copy for each hook: a handler that keeps or mutates its input changes nothing here.
        return {"event": event, "user": self.user, "conversation": self.conversation, "agent": self.agent,
                "turn": self.turn, "wire": self.wire, "timestamp": stamp,
                **{key: value if isinstance(value, str) else copy.deepcopy(value) for key, value in fields.items()}}


class Hook:
    """One configured hook with its handler resolved."""

    def __init__(self, spec: HookSpec, handler: Handler) -> None:
        self.spec = spec
        self.handler = handler
        self._names: frozenset[str] | None = None
        self._pattern: re.Pattern[str] | None = None
        matcher = spec.matcher
        if matcher is not None and re.fullmatch(r"[\w-]+(\|[\w-]+)*", matcher):
            self._names = frozenset(matcher.split("|"))
        elif matcher is not None:
            self._pattern = re.compile(matcher)

    def matches(self, tool: str | None) -> bool:
        """Whether the hook applies to this memory tool (events without a tool: always)."""
        if tool is None or (self._names is None and self._pattern is None):
            return True
        if self._names is not None:
            return tool in self._names
        return self._pattern is not None and self._pattern.fullmatch(tool) is not None


def load_hooks(specs: Sequence[HookSpec], poster: HookPoster | None, metrics: Metrics) -> Hooks | None:
    """The configured hooks, handlers imported now (a start-up error names the key); None when none."""
    if not specs:
        return None  # the request path then checks one None and does nothing else
    threads = ThreadPoolExecutor(HOOK_THREADS, thread_name_prefix="memproxy-hook")
    return Hooks([Hook(spec, _handler(spec, poster, threads)) for spec in specs], metrics, threads)


def _handler(spec: HookSpec, poster: HookPoster | None, threads: ThreadPoolExecutor) -> Handler:
    if spec.kind == "url":
        if poster is None:
            raise ValueError(f"{spec.key}: a URL hook needs a poster")
        url = spec.handler

        async def post(payload: Answer) -> Answer | None:
            return await poster.post(url, payload)
        return post
    function = _import(spec)
    # An object whose __call__ is async is an async handler too (a policy kept as an instance).
    if inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(getattr(function, "__call__", None)):
        return function

    async def in_thread(payload: Answer) -> Answer | None:
        # A blocking policy (a file, a database, a regex over a long text) never holds the loop.
        return await asyncio.get_running_loop().run_in_executor(threads, functools.partial(function, payload))
    return in_thread


def _import(spec: HookSpec) -> Callable[..., Any]:
    module_name, _, attribute = spec.handler.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except Exception as exc:  # a deployment's module may fail any way on import: start-up names the hook
        raise ConfigError(f"{spec.key}.python: cannot import {spec.handler}: {type(exc).__name__}: {exc}") from exc
    if not callable(target):
        raise ConfigError(f"{spec.key}.python: {spec.handler} is not callable")
    return target


class Hooks:
    """Runs the hooks of each event in order; the input and output of each event: docs/hooks.md."""

    def __init__(self, hooks: Sequence[Hook], metrics: Metrics, threads: ThreadPoolExecutor | None = None) -> None:
        self._metrics = metrics
        self._threads = threads
        self._by_event: dict[str, list[Hook]] = {}
        for hook in hooks:
            self._by_event.setdefault(hook.spec.event, []).append(hook)

    def has(self, event: str) -> bool:
        return event in self._by_event

    def close(self) -> None:
        """Stop the sync handlers' threads (one still stuck in a handler ends with it)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    async def session_start(self, context: HookContext) -> str:
        """The first turn of a new conversation: the hooks' additional context for it."""
        found = []
        async for spec, answer in self._answers("session_start", context, {"reason": "created"}):
            if self._valid(answer, spec, {"additional_context": str}):
                found.append(answer.get("additional_context", ""))
        return _paragraphs(found)

    async def user_prompt_submit(self, context: HookContext, prompt: str) -> PromptDecision:
        """Before retrieval: block the turn, rewrite its prompt, add context for the model."""
        fields: Answer = {"prompt": prompt}
        updated: str | None = None
        found = []
        async for spec, answer in self._answers("user_prompt_submit", context, fields):
            if not self._valid(answer, spec, {"updated_prompt": str, "additional_context": str, "reason": str},
                               decision="block"):
                continue
            if answer.get("decision") == "block":
                return PromptDecision(blocked=answer.get("reason") or "blocked by a memory policy")
            if "updated_prompt" in answer:
                updated = fields["prompt"] = answer["updated_prompt"]
            found.append(answer.get("additional_context", ""))
        return PromptDecision(prompt=updated, context=_paragraphs(found))

    async def post_retrieval(self, context: HookContext, hits: list[Answer]) -> list[str] | None:
        """After the merge: the ids to keep, in order (None: keep them all as they are)."""
        fields: Answer = {"hits": hits}
        kept: list[str] | None = None
        async for spec, answer in self._answers("post_retrieval", context, fields):
            if not self._valid(answer, spec, {"hits": list}) or "hits" not in answer:
                continue
            given = {hit["id"]: hit for hit in fields["hits"]}
            ids = answer["hits"]
            if not all(isinstance(i, str) and i in given for i in ids) or len(set(ids)) != len(ids):
                self.failed(spec, "bad_answer", "hits must be a subset of the ids given")
                continue
            kept = list(ids)
            fields["hits"] = [given[i] for i in kept]
        return kept

    async def pre_tool_use(self, context: HookContext, tool: str, tool_input: Answer) -> ToolDecision:
        """Before a memory tool call: deny it (the model gets `reason` as the result) or rewrite its input."""
        fields: Answer = {"tool": tool, "input": tool_input}
        async for spec, answer in self._answers("pre_tool_use", context, fields, tool):
            if not self._valid(answer, spec, {"updated_input": dict, "reason": str}, decision="deny"):
                continue
            if answer.get("decision") == "deny":
                return ToolDecision(tool_input, denied=answer.get("reason") or "denied by a memory policy")
            if "updated_input" in answer:
                fields["input"] = answer["updated_input"]
        return ToolDecision(fields["input"])

    async def post_tool_use(self, context: HookContext, tool: str, tool_input: Answer, output: str) -> str:
        """After a memory tool call: the output the model gets, rewritten by the hooks in turn."""
        fields: Answer = {"tool": tool, "input": tool_input, "output": output}
        async for spec, answer in self._answers("post_tool_use", context, fields, tool):
            if self._valid(answer, spec, {"updated_output": str}) and "updated_output" in answer:
                fields["output"] = answer["updated_output"]
        return str(fields["output"])

    async def pre_memory_write(self, context: HookContext, turns: list[tuple[str, str]]) -> list[str] | None:
        """Before a save: the texts to save (same roles, same order), or None when it must not happen.

        Fails closed: a hook that fails or answers garbage drops the save, as a block does.
        """
        fields: Answer = {"turns": [{"role": role, "content": text} for role, text in turns]}
        async for spec, answer in self._answers("pre_memory_write", context, fields):
            if answer is None or not self._valid(answer, spec, {"updated_turns": list}, decision="block"):
                log.warning("save dropped: hook %s failed and pre_memory_write fails closed", spec.key)
                return None
            if answer.get("decision") == "block":
                return None
            if "updated_turns" in answer:
                updated = _same_turns(fields["turns"], answer["updated_turns"])
                if updated is None:
                    self.failed(spec, "bad_answer", "updated_turns must keep the length and the roles")
                    return None
                fields["turns"] = updated
        # A rewrite is saved like any text: secrets out first.
        return [redact(turn["content"]) for turn in fields["turns"]]

    async def stop(self, context: HookContext, answer_text: str) -> str:
        """After the answer is saved: context for the conversation's next turn."""
        found = []
        async for spec, answer in self._answers("stop", context, {"answer": answer_text}):
            if self._valid(answer, spec, {"additional_context": str}):
                found.append(answer.get("additional_context", ""))
        return _paragraphs(found)

    async def _answers(self, event: str, context: HookContext, fields: Answer,
                       tool: str | None = None) -> AsyncIterator[tuple[HookSpec, Answer | None]]:
        """Each matching hook's answer in order ({} for none, None for a failure already counted).

        Each hook's input is built from `fields` when it is called, so a caller that applies
        an answer's rewrite to `fields` before taking the next answer chains the rewrites.
        """
        for hook in self._by_event.get(event, ()):
            if hook.matches(tool):
                yield hook.spec, await self._call(hook, context.payload(event, fields))

    async def _call(self, hook: Hook, payload: Answer) -> Answer | None:
        try:
            async with asyncio.timeout(hook.spec.timeout_ms / 1000):
                answer = await hook.handler(payload)
        except TimeoutError:
            reason, detail = "timeout", ""
        except HookFailure as failure:
            reason, detail = failure.reason, ""
        except Exception as exc:  # a deployment's code: whatever it raises must not fail the request
            reason, detail = "error", type(exc).__name__
        else:
            if answer is None:
                return {}
            if isinstance(answer, dict):
                return answer
            reason, detail = "bad_answer", f"answered {type(answer).__name__}, not an object"
        self.failed(hook.spec, reason, detail)
        return None

    def _valid(self, answer: Answer | None, spec: HookSpec, types: dict[str, type],
               decision: str | None = None) -> TypeGuard[Answer]:
        """True for an answer the event accepts; anything else is counted and skipped."""
        if answer is None:
            return False
        wrong = [key for key, kind in types.items() if key in answer and not isinstance(answer[key], kind)]
        if "decision" in answer and answer["decision"] != decision:
            wrong.append("decision")
        if wrong:
            self.failed(spec, "bad_answer", f"{wrong[0]} is not what {spec.event} accepts")
            return False
        return True

    def failed(self, spec: HookSpec, reason: str, detail: str = "") -> None:
        """Log (the hook and the reason, never message text) and count a failure."""
        self._metrics.hook_failures.labels(spec.event, reason).inc()
        log.warning("hook %s (%s, %s) failed: %s%s", spec.key, spec.event, spec.kind, reason,
                    f": {detail}" if detail else "")


@dataclass(frozen=True)
class PromptDecision:
    """What the user_prompt_submit hooks made of a turn's prompt."""

    blocked: str | None = None  # the reason, when a hook blocked the turn
    prompt: str | None = None  # the prompt's words as rewritten, when a hook rewrote them
    context: str = ""  # additional context for the model on this turn


@dataclass(frozen=True)
class ToolDecision:
    """What the pre_tool_use hooks made of a memory tool call."""

    input: Answer
    denied: str | None = None  # the refusal the model gets as the tool's result


def _paragraphs(texts: Sequence[str]) -> str:
    # Context is saved (with the turn's block, or queued for the next turn): secrets out first.
    return redact("\n\n".join(text.strip() for text in texts if text.strip()))


def _same_turns(given: list[Answer], updated: list[Any]) -> list[Answer] | None:
    if len(updated) != len(given):
        return None
    turns = []
    for before, after in zip(given, updated):
        if not (isinstance(after, dict) and after.get("role") == before["role"]
                and isinstance(after.get("content"), str)):
            return None
        turns.append({"role": before["role"], "content": after["content"]})
    return turns
