"""Secrets out before anything is saved or logged: each becomes `[REDACTED:<kind>]`.

Best-effort defence in depth, not a security boundary (docs/security.md): known key
formats are matched by shape, anything else only in a credential context (`password=`,
`"api_key": ...`) and only when it looks like a secret. Bare UUIDs and git SHAs stay.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_TOKEN_CHARS = r"A-Za-z0-9_-"
_PLACEHOLDERS = frozenset("null none nil true false undefined required optional string redacted".split())
_ENV_REFERENCE = re.compile(r"\$\{.*|\$[A-Z_][A-Z0-9_]*")
_KIND_BY_KEYWORD = (
    ("pass", "password"),
    ("pwd", "password"),
    ("private", "private_key"),
    ("token", "token"),
    ("secret", "secret"),
    ("key", "api_key"),
)

Replacer = Callable[[re.Match[str]], str]


@dataclass(frozen=True)
class _Rule:
    """One secret shape, run only when one of its lower-case markers is in the text."""

    markers: tuple[str, ...]
    pattern: re.Pattern[str]
    replace: Replacer


def _mark(kind: str) -> str:
    return f"[REDACTED:{kind}]"


def _whole(kind: str) -> Replacer:
    return lambda m: _mark(kind)


def _group(kind: str, name: str = "secret") -> Replacer:
    """Replace only the named group, keeping the context around it."""

    def replace(m: re.Match[str]) -> str:
        start, end = m.span(name)
        base = m.start()
        text = m.group(0)
        return text[: start - base] + _mark(kind) + text[end - base :]

    return replace


def _entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def _is_placeholder(value: str) -> bool:
    low = value.lower()
    return (
        value.startswith(("[REDACTED:", "<", "{{", "%("))
        or _ENV_REFERENCE.fullmatch(value) is not None
        or low in _PLACEHOLDERS
        or (len(value) > 2 and len(set(low)) == 1)  # "****", "xxxxxxxx"
    )


def _looks_secret(value: str, minimum: int) -> bool:
    """A value random enough to be a credential rather than a word or a number."""
    if len(value) < minimum or " " in value:
        return False
    classes = sum((any(c.islower() for c in value), any(c.isupper() for c in value), any(c.isdigit() for c in value)))
    return classes >= 2 or _entropy(value) >= 3.5


def _kind_for_key(key: str) -> str:
    low = key.lower()
    return next((kind for word, kind in _KIND_BY_KEYWORD if word in low), "secret")


def _credential(m: re.Match[str]) -> str:
    """`key = value` in a credential context; passwords given with `=` or quotes always go."""
    value, key = m.group("secret"), m.group("key")
    if not _is_credential_name(key):
        return m.group(0)
    kind = _kind_for_key(key)
    password = kind == "password"
    strong = password and (m.group("sep") == "=" or bool(m.group("quote")))
    if _is_placeholder(value) or not (len(value) >= 4 if strong else _looks_secret(value, 6 if password else 8)):
        return m.group(0)
    return _group(kind)(m)


def _bearer(m: re.Match[str]) -> str:
    """`Bearer <token>` in prose only when the token is not an ordinary word."""
    token = m.group("secret")
    if token.startswith("[REDACTED:") or not (any(c.isdigit() for c in token) or len(token) >= 24):
        return m.group(0)
    return _group("bearer_token")(m)


def _header(m: re.Match[str]) -> str:
    return m.group(0) if m.group("secret").startswith("[REDACTED:") else _group("bearer_token")(m)


def _url_password(m: re.Match[str]) -> str:
    return m.group(0) if m.group("secret").startswith("[REDACTED:") else _group("password")(m)


_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----"
    # a key pasted without its END line still loses its body, its lines also when they are
    # joined by JSON's escaped newlines (a key inside a quoted config or tool argument)
    r"(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|(?:(?:\s|\\[nr])*[A-Za-z0-9+/=]{16,})*)",
    re.DOTALL,
)
_KEY_PART = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_CREDENTIAL_WORDS = frozenset("password passwd passphrase pwd pass secret token credential credentials apikey".split())
_KEY_QUALIFIERS = frozenset("api access secret private signing encryption master".split())


def _is_credential_name(name: str) -> bool:
    """`DB_PASSWORD`, `x-api-key`, `clientSecret`: named for a secret by its last word(s)."""
    parts = [part.lower() for part in _KEY_PART.findall(name[-64:])]
    if not parts:
        return False
    return parts[-1] in _CREDENTIAL_WORDS or (parts[-1] == "key" and len(parts) > 1 and parts[-2] in _KEY_QUALIFIERS)


_RULES: tuple[_Rule, ...] = (
    _Rule(("private key",), _PEM, _whole("private_key")),
    _Rule(
        ("://",),
        # the last `@` before the host ends the password, so `p@ss` goes whole
        re.compile(
            r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^\s:/?#@\[\]]*:"
            r"(?P<secret>[^\s/?#]+)@(?=[A-Za-z0-9\[])"
        ),
        _url_password,
    ),
    _Rule(("sk-ant-",), re.compile(rf"(?<![{_TOKEN_CHARS}])sk-ant-[{_TOKEN_CHARS}]{{16,}}"), _whole("anthropic_key")),
    _Rule(("sk-",), re.compile(rf"(?<![{_TOKEN_CHARS}])sk-(?!ant-)[{_TOKEN_CHARS}]{{16,}}"), _whole("openai_key")),
    _Rule(("sk_live_", "rk_live_"), re.compile(r"\b[sr]k_live_[A-Za-z0-9]{16,}"), _whole("stripe_key")),
    _Rule(("aiza",), re.compile(r"\bAIza[A-Za-z0-9_-]{35}"), _whole("google_api_key")),
    _Rule(
        ("akia", "asia"),
        re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"),
        _whole("aws_access_key"),
    ),
    _Rule(
        ("aws_secret",),
        re.compile(r"(?i)aws_secret_access_key[\"']?\s*[:=]\s*[\"']?(?P<secret>[A-Za-z0-9/+=]{20,})"),
        _group("aws_secret_key"),
    ),
    _Rule(
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
        _whole("github_token"),
    ),
    _Rule(("xox",), re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), _whole("slack_token")),
    _Rule(
        ("eyj",),
        re.compile(rf"\beyJ[{_TOKEN_CHARS}]{{8,}}\.[{_TOKEN_CHARS}]{{8,}}\.[{_TOKEN_CHARS}]*"),
        _whole("jwt"),
    ),
    _Rule(
        ("authorization",),
        re.compile(r"(?i)\bauthorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+(?P<secret>[^\s\"',;]+)"),
        _header,
    ),
    _Rule(("bearer",), re.compile(r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/=-]{8,})"), _bearer),
    _Rule(
        ("pass", "pwd", "secret", "token", "key", "credential"),
        re.compile(
            # keys start only where a name starts, so a long run is scanned once
            r"(?<![A-Za-z0-9_.-])(?P<key>[A-Za-z][A-Za-z0-9_.-]*)(?P<quote>[\"']?)\s*(?P<sep>[:=])\s*"
            r"[\"']?(?P<secret>[^\s\"',;&<>()\[\]{}]+)"
        ),
        _credential,
    ),
)


def redact(text: str) -> str:
    """The text with every secret found replaced by `[REDACTED:<kind>]`."""
    low = text.lower()
    if _ANY_MARKER.search(low) is None:
        return text  # the common case (most log fields, most messages): one regex scan
    for rule in _RULES:
        if any(marker in low for marker in rule.markers):
            text = rule.pattern.sub(rule.replace, text)
    return text


_ANY_MARKER = re.compile("|".join(sorted({re.escape(m) for rule in _RULES for m in rule.markers}, key=len,
                                           reverse=True)))

_AUTH_FIELD = re.compile(r"(?i)(?:proxy-)?authorization")


def redact_mapping(obj: Any) -> Any:
    """A copy of a log record with every string redacted and credential-named fields blanked."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {key: _redact_field(key, value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_mapping(item) for item in obj)
    return obj


def _redact_field(key: Any, value: Any) -> Any:
    """A field named like a credential loses its whole string value, whatever it looks like."""
    if not (isinstance(key, str) and isinstance(value, str) and value) or _is_placeholder(value):
        return redact_mapping(value)
    if _AUTH_FIELD.fullmatch(key):
        return _mark("authorization")
    if key.lower() in ("cookie", "set-cookie"):
        return _mark("cookie")
    if _is_credential_name(key):
        return _mark(_kind_for_key(key))
    return redact(value)
