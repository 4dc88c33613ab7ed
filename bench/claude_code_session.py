"""A Claude-Code-shaped session on the Messages wire, and the answers its fake provider gives.

Each request has what Claude Code 2.1 sends: 22 tools, a system of two text blocks with
`cache_control` on the last, then the conversation, where a user turn is a
`<system-reminder>` text block and the prompt's text block. Only the newest message's
last block carries `cache_control` (the prompt, or a tool_result); earlier turns are
resent without their breakpoints. Some turns take a tool step: the provider answers the
prompt with a tool_use, the client sends the tool_result, the provider answers in text.

Self-contained (no sibling imports): tests/test_prompt_cache.py uses it too.
"""

from __future__ import annotations

import copy
from typing import Any

MARK = {"type": "ephemeral"}
TOOL_NAMES = ("Bash", "Read", "Write", "Edit", "MultiEdit", "Glob", "Grep", "LS", "NotebookRead",
              "NotebookEdit", "WebFetch", "WebSearch", "TodoWrite", "Task", "ExitPlanMode", "BashOutput",
              "KillShell", "SlashCommand", "ListMcpResources", "ReadMcpResource", "AskUser", "Skill")
SYSTEM = [
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
    {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks. "
                             + "Follow the repository's conventions; keep answers short; cite files by path. " * 140,
     "cache_control": MARK},
]
TOPICS = ("the billing service's retry policy", "the staging database migration", "the payment pipeline's "
          "idempotency keys", "the invoice export job", "the deploy script for cluster seven",
          "the rate limiter in the API gateway", "the nightly backup of the billing database")
# A prompt with this word is answered with a tool_use first (see answer); every prompt starts "turn N:".
TOOL_WORD = "grep"


def tools() -> list[dict[str, Any]]:
    """Claude Code's tool list, each with a description and a JSON schema of some length."""
    return [{"name": name, "description": f"The {name} tool. " + "Use it when the task calls for it. " * 70,
             "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"},
                                                               "path": {"type": "string"}},
                              "required": ["pattern"]}} for name in TOOL_NAMES]


def prompt(turn: int) -> str:
    """The user's words for a turn; every third turn asks for a search, which takes a tool step."""
    topic = TOPICS[turn % len(TOPICS)]
    if turn % 3 == 1:
        return f"turn {turn}: {TOOL_WORD} the repository for {topic} and tell me where it is configured"
    return f"turn {turn}: what did we decide about {topic}, and what should change next?"


def answer(body: dict[str, Any], number: int) -> dict[str, Any]:
    """The provider's `message` for a request: a tool_use for a prompt that asks for a search, else text."""
    last = body["messages"][-1]
    blocks = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
    # Only the prompt's own block counts: a memory block may quote an earlier prompt.
    wants_tool = (not any(b.get("type") == "tool_result" for b in blocks)
                  and any(str(b.get("text", "")).startswith("turn ") and TOOL_WORD in b["text"] for b in blocks))
    if wants_tool:
        content = [{"type": "text", "text": "I'll search the repository."},
                   {"type": "tool_use", "id": f"toolu_{number:04d}", "name": "Grep",
                    "input": {"pattern": "retry|backup|deploy", "path": "."}}]
    else:
        content = [{"type": "text", "text": f"Answer {number}: " + "Here is what the code does and what to change. "
                                            * 6}]
    return {"id": f"msg_{number:04d}", "type": "message", "role": "assistant", "model": body.get("model"),
            "content": content, "stop_reason": "tool_use" if wants_tool else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 40}}


class Session:
    """The conversation so far, without breakpoints; `request` marks the newest message's last block."""

    def __init__(self, model: str = "claude-sonnet-4-5") -> None:
        self.model = model
        self.tools = tools()
        self.messages: list[dict[str, Any]] = []

    def user_turn(self, turn: int) -> None:
        reminder = (f"<system-reminder>\nToday's date is 2026-12-03. Turn {turn}. The user opened "
                    f"src/billing/retry.py in the IDE.\n</system-reminder>")
        self.messages.append({"role": "user", "content": [{"type": "text", "text": reminder},
                                                          {"type": "text", "text": prompt(turn)}]})

    def assistant(self, message: dict[str, Any]) -> None:
        """Keep the provider's answer as the client resends it."""
        self.messages.append({"role": "assistant", "content": message["content"]})

    def tool_result(self, message: dict[str, Any]) -> bool:
        """Answer the message's tool_use with a result; False when it asked for none."""
        uses = [b for b in message["content"] if b.get("type") == "tool_use"]
        if not uses:
            return False
        lines = "\n".join(f"src/billing/module_{i}.py:{10 * i}: retry = Retry(total={i})" for i in range(12))
        self.messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u["id"],
                                                           "content": lines} for u in uses]})
        return True

    def request(self) -> dict[str, Any]:
        messages = copy.deepcopy(self.messages)
        messages[-1]["content"][-1]["cache_control"] = MARK
        return {"model": self.model, "max_tokens": 32000, "system": SYSTEM, "tools": self.tools,
                "messages": messages}


def replay(turns: int, send: Any) -> int:
    """Run `turns` user turns through `send(body) -> message`; the number of requests sent."""
    session, sent = Session(), 0
    for turn in range(turns):
        session.user_turn(turn)
        while True:
            message = send(session.request())
            sent += 1
            session.assistant(message)
            if not session.tool_result(message):
                break
    return sent
