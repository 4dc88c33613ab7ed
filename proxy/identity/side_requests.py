"""Side requests: calls a client makes in the user's session that are not the user's turn.

Claude Code's sub-agent, compaction, title and quota calls, Codex's compaction and review
calls carry the session but not the user's words: they get no block and save nothing.
Rules are `scope.side_requests`, each a flat mapping of conditions that must all hold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from proxy.settings import ConfigError

_PLAIN_KEYS = frozenset({"name", "method", "path", "prompt"})


@dataclass(frozen=True)
class _Rule:
    name: str
    method: str | None
    path: str | None
    prompt: re.Pattern[str] | None
    headers: tuple[tuple[bytes, re.Pattern[str]], ...]
    fields: tuple[tuple[tuple[str, ...], re.Pattern[str]], ...]
    needs_body: bool  # it looks at the prompt or a body field


@dataclass(frozen=True)
class RequestFacts:
    """What the rules look at: method, path after /v1, headers, and (on a chat path) body and prompt."""

    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: dict[str, Any] | None = None
    prompt: str | None = None


class SideRequests:
    """The configured rules, compiled once at start-up (a bad rule stops start-up)."""

    def __init__(self, rules: Iterable[dict[str, str]]) -> None:
        self._rules = tuple(_compile(i, rule) for i, rule in enumerate(rules))

    def match(self, facts: RequestFacts) -> str | None:
        """The name of the first rule the request matches, or None."""
        headers: dict[bytes, list[str]] | None = None  # lower-cased once, for the first rule that asks
        for rule in self._rules:
            if rule.needs_body and facts.body is None:
                continue
            if rule.method is not None and facts.method != rule.method:
                continue
            if rule.path is not None and facts.path.rstrip("/") != rule.path:
                continue
            if rule.headers and headers is None:
                headers = {}
                for name, value in facts.headers:
                    headers.setdefault(name.lower(), []).append(value.decode("latin-1"))
            if _matches(rule, facts, headers or {}):
                return rule.name
        return None


def _compile(index: int, rule: dict[str, str]) -> _Rule:
    where = f"scope.side_requests[{index}]"
    name = rule.get("name")
    if not name:
        raise ConfigError(f"{where}: every rule needs a name (it labels the rule's count in /metrics)")
    headers, fields = [], []
    for key, value in rule.items():
        kind, _, target = key.partition(":")
        if key in _PLAIN_KEYS:
            continue
        if kind not in ("header", "body") or not target:
            raise ConfigError(f"{where}.{key}: unknown condition (known: method, path, prompt, header:NAME, "
                              "body:FIELD)")
        pattern = _pattern(f"{where}.{key}", value)
        if kind == "header":
            headers.append((target.lower().encode("latin-1"), pattern))
        else:
            fields.append((tuple(target.split(".")), pattern))
    prompt = rule.get("prompt")
    return _Rule(name, rule.get("method", "").upper() or None, rule.get("path"),
                 _pattern(f"{where}.prompt", prompt) if prompt is not None else None, tuple(headers), tuple(fields),
                 needs_body=prompt is not None or bool(fields))


def _pattern(where: str, text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise ConfigError(f"{where}: invalid regular expression: {exc}") from exc


def _matches(rule: _Rule, facts: RequestFacts, headers: dict[bytes, list[str]]) -> bool:
    """The rule's prompt, header and body conditions (method and path are checked first)."""
    if rule.prompt is not None and not rule.prompt.search(facts.prompt or ""):
        return False
    for name, pattern in rule.headers:
        if not any(pattern.search(value) for value in headers.get(name, ())):
            return False
    return all(_field_matches(facts.body or {}, path, pattern) for path, pattern in rule.fields)


def _field_matches(body: dict[str, Any], path: tuple[str, ...], pattern: re.Pattern[str]) -> bool:
    """The pattern searched in the body's field at `path` (a number picks a list's item), an
    object or list as its JSON."""
    value: Any = body
    for key in path:
        if isinstance(value, list) and key.isascii() and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            return False
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return pattern.search(text) is not None
