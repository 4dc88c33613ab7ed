"""Where a turn meets the hooks (docs/hooks.md): its start, its retrieval, its saves.

The pipeline calls these only when hooks are configured; with none, nothing here runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from proxy.errors import PolicyBlocked
from proxy.memory.hooks.runner import HookContext, Hooks
from proxy.memory.retrieval.block import ELLIPSIS, render
from proxy.memory.retrieval.base import Retrieved
from proxy.models import Scope, Transcript
from proxy.stores.base import FinishTurn, QueueHookContext, SetTurnStatus, StartTurn, WriteOp, text_hash

CHARS_PER_TOKEN = 4  # the budget's estimate: ceil(chars / 4), as block.estimate_tokens


@dataclass(frozen=True)
class TurnStart:
    """What the hooks made of a new turn: its prompt's words (None: unchanged) and context for the model."""

    prompt: str | None = None
    context: str = ""
    queued_upto: int | None = None  # the last `stop` context taken from the store for this turn


def hook_context(scope: Scope, conversation: str, turn: str, wire: str) -> HookContext:
    """The fields every hook input carries, all of this request's own scope."""
    return HookContext(scope.user, conversation, scope.agent, turn, wire)


async def start_turn(hooks: Hooks, context: HookContext, prompt: str, new_conversation: bool) -> TurnStart:
    """session_start (a new conversation) and user_prompt_submit; PolicyBlocked when a hook refuses."""
    found = []
    if new_conversation and hooks.has("session_start"):
        found.append(await hooks.session_start(context))
    decision = await hooks.user_prompt_submit(context, prompt)
    if decision.blocked is not None:
        raise PolicyBlocked(decision.blocked)
    found.append(decision.context)
    return TurnStart(decision.prompt, "\n\n".join(text for text in found if text))


def with_queued(start: TurnStart, queued: list[tuple[int, str]]) -> TurnStart:
    """The context the `stop` hooks left for this conversation's next turn (this one) goes first."""
    if not queued:
        return start
    context = "\n\n".join([*(text for _, text in queued), *([start.context] if start.context else [])])
    return dataclasses.replace(start, context=context, queued_upto=max(seq for seq, _ in queued))


def with_prompt(request: Transcript, prompt: str | None) -> Transcript:
    """The transcript as retrieval and the saved turn see it once a hook rewrote the prompt."""
    if prompt is None:
        return request
    return dataclasses.replace(request, prompt=prompt, query=prompt)


async def kept_hits(hooks: Hooks, context: HookContext, retrieved: Retrieved, header: str) -> Retrieved:
    """post_retrieval: the block again from the hits the hooks kept, in their order."""
    given = [{"source": hit.source, "id": hit.id, "content": hit.content, "reason": hit.reason}
             for hit in retrieved.hits]
    kept_ids = await hooks.post_retrieval(context, given)
    if kept_ids is None:
        return retrieved
    by_id = {hit.id: hit for hit in retrieved.hits}
    kept = [by_id[i] for i in kept_ids]
    block = render(kept, header)
    log: dict[str, Any] = {**retrieved.log, "hooks_kept": kept_ids}
    if "hits" in log:
        log["hits"] = [entry for i in kept_ids for entry in log["hits"] if entry.get("id") == i][:len(kept)]
    return dataclasses.replace(retrieved, block=block, injected=len(kept) if block else 0, log=log,
                               hits=tuple(kept))


def with_context(block: str, context: str, max_tokens: int) -> str:
    """The block with the hooks' context as a paragraph after it (or alone), within the budget."""
    if not context:
        return block
    room = max_tokens * CHARS_PER_TOKEN - (len(block) + 2 if block else 0)
    if room <= len(ELLIPSIS):
        return block
    if len(context) > room:
        context = context[: room - len(ELLIPSIS)] + ELLIPSIS
    return f"{block}\n\n{context}" if block else context


def without_context(text: str, context: str) -> str:
    """Saved text never carries this turn's hook context back in (a client that echoed the prompt)."""
    if context and text.startswith(context):
        return text[len(context):].lstrip("\n")
    return text


Submit = Callable[[WriteOp, bool], "asyncio.Future[None] | None"]


class HookedSaves:
    """A turn's saves behind its pre_memory_write hooks, and the stop hooks after its answer.

    A save waits for its hooks off the response's path: the answer's commit, which the
    response waits for up to `memory.commit_timeout_ms`, completes once the hooks have
    answered and the write committed, so a slow hook delays the save, never the response.
    """

    def __init__(self, hooks: Hooks, context: HookContext, submit: Submit, tasks: set[asyncio.Task[None]],
                 seal: Callable[[str], str]) -> None:
        self._hooks = hooks
        self._context = context
        self._submit = submit
        self._tasks = tasks  # held by the service: a save outlives its request
        self._seal = seal  # the store's hash key: how a digest of text the saved copy no longer holds is kept

    def start(self, op: StartTurn) -> asyncio.Future[None] | None:
        """The turn's row always; its user message only as the hooks let it through. The future
        completes when the save committed (None: nothing is saved)."""
        if op.user_text is None or not self._hooks.has("pre_memory_write"):
            return self._submit(op, False)
        committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def guarded() -> None:
            try:
                texts = await self._hooks.pre_memory_write(self._context, [("user", op.user_text or "")])
                done = self._submit(dataclasses.replace(op, user_text=texts[0] if texts is not None else None), False)
                if done is not None:
                    await asyncio.gather(done, return_exceptions=True)  # the writer logs its own failures
            finally:
                if not committed.done():
                    committed.set_result(None)
        self._spawn(guarded())
        return committed

    def finish(self, op: FinishTurn, stop: bool = True) -> asyncio.Future[None]:
        """The answer (and the trace, whose task is the prompt: both go through the hooks); then `stop`,
        unless the turn has had its `stop` (`stop=False`: a retry of an answered turn)."""
        committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def guarded() -> None:
            try:
                answer = await self._finish(op)
            finally:
                if not committed.done():
                    committed.set_result(None)
            # `stop` comes after a saved answer and is given it as saved: a policy that masked
            # or blocked it must not see it leave for a webhook all the same.
            if stop and answer is not None and self._hooks.has("stop"):
                await asyncio.sleep(0)  # the response, waiting on the commit, goes out first
                context = await self._hooks.stop(self._context, answer)
                if context:
                    self._submit(QueueHookContext(op.scope, op.conversation_id, context, op.at, op.generation), False)
        self._spawn(guarded())
        return committed

    async def _finish(self, op: FinishTurn) -> str | None:
        """The answer as saved (None: a hook blocked its save)."""
        save: WriteOp = op
        if self._hooks.has("pre_memory_write"):
            texts = await self._hooks.pre_memory_write(self._context, [("user", op.task), ("assistant", op.answer)])
            # Blocked: the turn is still complete (its later steps and retries know it), with nothing saved.
            save = (SetTurnStatus(op.scope, op.turn_key, "complete", op.at, op.generation) if texts is None
                    else dataclasses.replace(op, task=texts[0], answer=texts[1],
                                             answer_hash=self._answer_hash(op, texts[1])))
        done = self._submit(save, True)
        if done is not None:
            await asyncio.gather(done, return_exceptions=True)  # the writer logs its own failures
        return save.answer if isinstance(save, FinishTurn) else None

    def _answer_hash(self, op: FinishTurn, saved: str) -> str | None:
        """The answer's digest beside what the hooks let be saved: a plain digest of an answer they
        masked would give the masked text away to a dictionary pass, so it is sealed, as one redaction
        changed already is (the conversation is still found by it)."""
        plain = text_hash(op.answer)
        if saved == op.answer or op.answer_hash not in (None, plain):
            return op.answer_hash  # saved as received, or sealed already
        return self._seal(plain)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
