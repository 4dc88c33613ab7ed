"""What a secret looks like, for `proxy.redaction.redact`: one rule per shape or credential context.

Known key formats are matched by shape; anything else only in a credential context
(`password=`, `"api_key": ...`, `my AWS secret key is ...`) and only when it looks like a
secret. Bare UUIDs and git SHAs stay.

Every pattern starts with a literal (its `needle`, lower-case), so the regex engine jumps
from one occurrence of it to the next instead of trying every position, and every repeat
in it is bounded (and possessive where backtracking could not help), so one match costs
bounded work whatever text surrounds it: redaction is linear in the text on any input.
Case-insensitive rules read a lower-cased copy of the text (same length, same offsets);
what they find is then judged on the original.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# The longest text any match (with what its lookarounds read) can cover: the redactor reads
# this far past a window so that a match begun in it is found whole.
REACH_CHARS = 16_384
LOOKBEHIND_CHARS = 64  # how far back any rule looks before its match
MAX_PEM_CHARS = 65_536  # a private key block longer than this is cut at its BEGIN line's body

MARK_PREFIX = "[REDACTED:"
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
_DIGIT = re.compile(r"[0-9]")
_KEY_PART = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_CREDENTIAL_WORDS = frozenset("password passwd passphrase pwd pass secret token credential credentials apikey".split())
_KEY_QUALIFIERS = ("api", "access", "secret", "private", "signing", "encryption", "master")


def mark(kind: str) -> str:
    """What a secret of this kind is replaced with."""
    return f"{MARK_PREFIX}{kind}]"


def _entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def is_placeholder(value: str) -> bool:
    """`${DB_PASSWORD}`, `<your key>`, `****`, `null`: a value that stands for a secret."""
    low = value.lower()
    return (
        value.startswith((MARK_PREFIX, "<", "{{", "%("))
        or _ENV_REFERENCE.fullmatch(value) is not None
        or low in _PLACEHOLDERS
        or (len(value) > 2 and len(set(low)) == 1)  # "****", "xxxxxxxx"
    )


def looks_secret(value: str, minimum: int) -> bool:
    """A value random enough to be a credential rather than a word or a number."""
    if len(value) < minimum or " " in value:
        return False
    classes = (value != value.upper()) + (value != value.lower()) + (_DIGIT.search(value) is not None)
    # 3.5 bits a char takes at least 12 distinct chars (log2 12 = 3.58): fewer need no counting.
    return classes >= 2 or (len(set(value)) >= 12 and _entropy(value) >= 3.5)


def kind_for_key(key: str) -> str:
    """The kind a secret named `key` is redacted as."""
    low = key.lower()
    return next((kind for word, kind in _KIND_BY_KEYWORD if word in low), "secret")


def is_credential_name(name: str) -> bool:
    """`DB_PASSWORD`, `x-api-key`, `clientSecret`: named for a secret by its last word(s)."""
    parts = [part.lower() for part in _KEY_PART.findall(name[-64:])]
    if not parts:
        return False
    return parts[-1] in _CREDENTIAL_WORDS or (parts[-1] == "key" and len(parts) > 1 and parts[-2] in _KEY_QUALIFIERS)


Found = tuple[int, int, str]  # a secret's (start, end, kind) in the text
Check = Callable[[str, re.Match[str], int], "Found | None"]


@dataclass(frozen=True)
class Rule:
    """One secret shape: a pattern that starts with `needle`, and how to judge what it finds."""

    kind: str
    needle: str  # lower-case; the pattern's literal start
    pattern: re.Pattern[str]
    lower: bool = False  # the pattern reads the lower-cased text
    # (text, match, offset of the match's string in text) -> the secret found, or None
    check: Check | None = None

    def find(self, text: str, low: str, base: int, start: int, end: int) -> Iterator[tuple[Found | None, int]]:
        """Matches beginning in text[start:end]; `low` is text[base:...] lower-cased."""
        source, offset = (low, base) if self.lower else (text, 0)
        for m in self.pattern.finditer(source, start - offset, base + len(low) - offset):
            if m.start() + offset >= end:
                return
            found = self.check(text, m, offset) if self.check else _secret(m, offset, self.kind)
            yield found, m.end() + offset


def _secret(m: re.Match[str], offset: int, kind: str) -> Found:
    """The match's `secret` group (the whole match without one) as a secret of this kind."""
    start, end = m.span("secret") if "secret" in m.re.groupindex else m.span()
    return start + offset, end + offset, kind


_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END_CHARS = 80
# A key pasted without its END line still loses its body, its lines also when they are
# joined by JSON's escaped newlines (a key inside a quoted config or tool argument).
_PEM_BODY = re.compile(r"(?:(?:\s|\\[nr]){0,64}[A-Za-z0-9+/=]{16,4096})*")


@dataclass(frozen=True)
class PemRule:
    """A PEM private key block, BEGIN to END line; without an END line, its body."""

    kind: str = "private_key"
    needle: str = "-----begin "

    def find(self, text: str, low: str, base: int, start: int, end: int) -> Iterator[tuple[Found | None, int]]:
        """Blocks beginning in text[start:end]."""
        ending: re.Match[str] | None = None
        clear_to = 0  # no END line starts before this (but `ending`)
        for begin in _PEM_BEGIN.finditer(text, start, min(end + REACH_CHARS, len(text))):
            if begin.start() >= end:
                return
            body = begin.end()
            if ending is None or ending.start() < body:
                # Each stretch of text is searched for an END line once, however many BEGINs.
                ending = _PEM_END.search(text, max(body, clear_to), body + MAX_PEM_CHARS)
                clear_to = ending.start() if ending else body + MAX_PEM_CHARS - _PEM_END_CHARS
            if ending is not None and ending.start() - body <= MAX_PEM_CHARS:
                stop = ending.end()
            else:
                stop = _PEM_BODY.match(text, body, body + MAX_PEM_CHARS).end()  # type: ignore[union-attr]
            yield (begin.start(), stop, self.kind), stop


def _token(kind: str, prefix: str, rest: str, *, word: str = "A-Za-z0-9_") -> Rule:
    """A provider key: a literal prefix not glued to a word before it, then its body."""
    lookbehind = f"(?<![{word}]{re.escape(prefix)})" if word else ""
    return Rule(kind, prefix.lower(), re.compile(re.escape(prefix) + lookbehind + rest))


def _unless_marked(kind: str) -> Check:
    """The secret, unless it is already a redaction mark (redacting twice changes nothing)."""
    return lambda text, m, offset: None if text.startswith(MARK_PREFIX, m.start("secret") + offset) else _secret(
        m, offset, kind)


def _bearer(text: str, m: re.Match[str], offset: int) -> Found | None:
    """`Bearer <token>` in prose only when the token is not an ordinary word."""
    token = m.group("secret")
    return _secret(m, offset, "bearer_token") if len(token) >= 24 or _DIGIT.search(token) else None


def _aws_secret(text: str, m: re.Match[str], offset: int) -> Found | None:
    found = _secret(m, offset, "aws_secret_key")
    return found if looks_secret(text[found[0]:found[1]], 20) else None


# A URL's password runs to the last `@` before a space: `p@ss`, `pa/ss#1` and an unescaped
# `p@ss/word` go whole (with them a path's `@`, rarely there: a secret cut short is worse).
# `host:8080/...` is a port, not a password, even with an `@` further on
# (`https://h:443/users/@ann`).
_URL = Rule("password", "://", re.compile(
    r"://(?<=[A-Za-z0-9+.-]://)[^\s:/?#@\[\]]{0,256}:(?!\d{1,5}(?![^/?#\s]))"
    r"(?P<secret>(?:[^\s@]|@(?=[^\s@]{0,256}@)){1,256})@(?=[A-Za-z0-9\[])"
), check=_unless_marked("password"))

_ASSIGN = r"[\"']?[ \t]{0,32}[:=][ \t]{0,32}[\"']?"
# A base64 key, also URL-encoded (`%2B`, `%2F`, `%3D`) as in a connection string in a URL.
_BASE64_KEY = r"(?:[a-z0-9+/]|%[0-9a-f]{2}){20,256}+(?:=|%3d){0,2}"
_PASS_WORDS = frozenset({"pass", "password", "passwd", "passphrase"})
# Names that end in these words are credentials even glued to what names them (`PGPASSWORD`,
# `APITOKEN`, `clientsecret`); a bare `pass` is not (`bypass`, `compass`), nor `pwd` (`OLDPWD`).
_GLUED_WORDS = frozenset({"password", "passwd", "passphrase", "secret", "token"})
_CREDENTIAL_KIND = {"pwd": "password", "secret": "secret", "token": "token", "credential": "secret",
                    "credentials": "secret"}
# What follows `name:` / `name=`: the value, up to a quote, a space or a delimiter. Quotes
# may come escaped (`\"password\": \"X\"`: JSON inside a JSON string, a tool call's code).
_VALUE = re.compile(r"[ \t]{0,32}(?P<open>\\?[\"']?)(?P<secret>[^\s\"',;&<>()\[\]{}]{1,512})")
_QUALIFIER_BEFORE = re.compile(rf"(?:{'|'.join(_KEY_QUALIFIERS)})[_.-]?\Z")


def _credential_rules() -> tuple[Rule, ...]:
    """`<name>: value` / `<name>=value` where the name's last word names a secret, anywhere in a line."""
    # The pattern stops at the `:` or `=`, so a value it rejects (`setup: password: ...`,
    # `password: token=abc123`) never hides an assignment inside it. Only these cheap
    # literal-led patterns scan the text; the name and the value are judged in Python for
    # the few places that have one of these words right before a `:` or `=`.
    # `key` only after a qualifier (`api_key`, `secretkey`): the char before it, then the `:`
    # or `=`, are tested before the qualifiers, so the many `key`s of prose fail at once.
    qualified = "|".join(f"(?<={q}{sep}key)" for q in _KEY_QUALIFIERS for sep in ("", "_", "-", "."))
    before = re.escape("".join(sorted({q[-1] for q in _KEY_QUALIFIERS} | set("_.-"))))
    key = rf"key(?<=[{before}]key)(?=[\"' \t]{{0,32}}+[:=])(?:{qualified})"
    words = {"pass": r"pass[a-z]{0,6}+", "pwd": "pwd", "secret": "secret", "token": "token",
             "credential": "credentials?+", "key": key}
    return tuple(Rule("secret", needle, re.compile(rf"(?P<word>{word})(?P<quote>[\"'\\ \t]{{0,32}}+)[:=]"), lower=True,
                      check=_credential) for needle, word in words.items())


def _credential(text: str, m: re.Match[str], offset: int) -> Found | None:
    """A credential name's value when it looks like a secret; passwords set with `=` or quotes always."""
    word, low = m.group("word"), m.string
    start = m.start() + offset
    if word == "key":  # named by its qualifier: `api_key`, `clientSecretKey`, `x-api-key`
        qualifier = _QUALIFIER_BEFORE.search(low, max(0, m.start() - 16), m.start())
        if qualifier is None:
            return None
        start = qualifier.start() + offset
        kind = {"private": "private_key", "secret": "secret"}.get(qualifier.group().rstrip("_.-"), "api_key")
    elif word in _PASS_WORDS:
        kind = "password"
    elif word in _CREDENTIAL_KIND:
        kind = _CREDENTIAL_KIND[word]
    else:
        return None  # `passage:`, `passwords:`
    if not (_starts_word(text, start) or word in _GLUED_WORDS):
        return None
    value = _VALUE.match(text, m.end() + offset)
    if value is None or is_placeholder(secret := value.group("secret")):
        return None
    end = value.end("secret")
    if kind == "password":
        quoted = "'" in m.group("quote") or '"' in m.group("quote") or bool(value.group("open"))
        strong = quoted or low[m.end() - 1] == "="
        if not (len(secret) >= 4 if strong else looks_secret(secret, 6)):
            return None
    elif not looks_secret(secret, 8):
        return None
    return value.start("secret"), end, kind


def _said_password(text: str, m: re.Match[str], offset: int) -> Found | None:
    """`my password is X`: X when quoted, or when it looks like a secret, not a word (`is long`)."""
    found = _secret(m, offset, "password")
    secret = text[found[0]:found[1]]  # judged as written: the rule reads a lower-cased copy
    if is_placeholder(secret) or not (len(secret) >= 4 if m.group("open") else looks_secret(secret, 6)):
        return None
    return found


def _given_password(text: str, m: re.Match[str], offset: int) -> Found | None:
    """A password a command line or markup gives outright: any value but a placeholder."""
    found = _secret(m, offset, "password")
    return None if is_placeholder(text[found[0]:found[1]]) else found  # judged as written, not lower-cased


# `curl -u user:X`, `curl --user user:X`, `mysql ... -pX`, `<password>X</password>`: a password
# by its place, whatever it looks like (`admin:admin` is one too). Only after the command that
# gives it: `docker run -u 1000:1000` is a user and group, `gcc -pthread` a flag.
_COMMAND_PASSWORDS = (
    Rule("password", "curl", re.compile(
        r"curl(?<![\w-]curl)[ \t][^\n|;&]{0,256}?(?<=[ \t])(?:-u|--user)[ \t=]{1,8}[\"']?[^\s:\"']{1,128}:"
        r"(?P<secret>[^\s\"'@]{3,256})"), lower=True, check=_given_password),
    Rule("password", "mysql", re.compile(
        r"mysql(?<![\w-]mysql)(?:dump|admin)?[ \t][^\n|;&]{0,256}?(?<=[ \t])-p(?P<secret>[^\s\"'-][^\s\"']{2,255})"),
        lower=True, check=_given_password),
    Rule("password", "<", re.compile(
        r"<(?P<tag>password|passwd|secret|token|api_?key)>(?P<secret>[^<>\n]{3,512})</(?P=tag)>"),
        lower=True, check=_given_password),
)


_SAID_PASSWORD = Rule("password", "password", re.compile(
    r"password(?<![a-z0-9_]password)[ \t]{1,8}(?:is|was)[ \t]{0,8}:?[ \t]{0,32}(?P<open>[\"']?)"
    r"(?P<secret>[^\s\"',;<>()\[\]{}]{4,512})"), lower=True, check=_said_password)


def _starts_word(text: str, i: int) -> bool:
    """True when text[i] begins a word of a name (`DB_PASSWORD`, `clientSecret`, `APIKey`), not `bypass`."""
    if i == 0 or not text[i - 1].isalnum():
        return True
    if not text[i].isupper():
        return False
    before = text[i - 1]
    return before.islower() or before.isdigit() or (i + 1 < len(text) and text[i + 1].islower())


RULES: tuple[Rule | PemRule, ...] = (
    PemRule(),
    _URL,
    _token("anthropic_key", "sk-ant-", r"[A-Za-z0-9_-]{16,512}", word="A-Za-z0-9_-"),
    _token("openai_key", "sk-", r"(?!ant-)[A-Za-z0-9_-]{16,512}", word="A-Za-z0-9_-"),
    _token("stripe_key", "sk_live_", r"[A-Za-z0-9]{16,256}"),
    _token("stripe_key", "rk_live_", r"[A-Za-z0-9]{16,256}"),
    _token("stripe_key", "sk_test_", r"[A-Za-z0-9]{16,256}"),
    _token("stripe_key", "rk_test_", r"[A-Za-z0-9]{16,256}"),
    _token("stripe_key", "whsec_", r"[A-Za-z0-9+/=]{24,256}"),
    _token("google_api_key", "AIza", r"[A-Za-z0-9_-]{35}"),
    _token("aws_access_key", "AKIA", r"[A-Z0-9]{16}(?![A-Z0-9])", word="A-Z0-9"),
    _token("aws_access_key", "ASIA", r"[A-Z0-9]{16}(?![A-Z0-9])", word="A-Z0-9"),
    Rule("aws_secret_key", "aws", re.compile(
        r"aws(?<![a-z0-9]aws)[ _-]?secret(?:[ _-]?access)?[ _-]?key[\"']?(?:[ \t]{0,32}[:=]|[ \t]{1,32}(?:is|was):?)?"
        r"[ \t]{0,32}[\"']?(?P<secret>[a-z0-9/+=]{20,128})(?![a-z0-9/+=])"), lower=True, check=_aws_secret),
    Rule("azure_key", "accountkey", re.compile(
        rf"accountkey(?<![a-z0-9]accountkey){_ASSIGN}(?P<secret>{_BASE64_KEY})"), lower=True),
    Rule("azure_key", "sharedaccesskey", re.compile(
        rf"sharedaccesskey(?<![a-z0-9]sharedaccesskey){_ASSIGN}(?P<secret>{_BASE64_KEY})"), lower=True),
    Rule("github_token", "gh", re.compile(r"gh[pousr]_(?<![A-Za-z0-9_]gh[pousr]_)[A-Za-z0-9]{20,255}")),
    _token("github_token", "github_pat_", r"[A-Za-z0-9_]{20,255}"),
    Rule("slack_token", "xox", re.compile(r"xox[abprs]-(?<![A-Za-z0-9_]xox[abprs]-)[A-Za-z0-9-]{10,255}")),
    _token("slack_token", "xapp-", r"[0-9]-[A-Za-z0-9-]{10,255}"),
    # A Slack incoming webhook's URL is its credential: anyone holding it posts to the channel.
    Rule("slack_webhook", "hooks.slack.com", re.compile(
        r"hooks\.slack\.com/(?P<secret>(?:services|workflows|triggers)/[A-Za-z0-9_/-]{16,256})")),
    _token("huggingface_token", "hf_", r"[A-Za-z0-9]{30,64}(?![A-Za-z0-9])"),
    _token("npm_token", "npm_", r"[A-Za-z0-9]{36}(?![A-Za-z0-9])"),
    _token("jwt", "eyJ", r"[A-Za-z0-9_-]{8,4096}\.[A-Za-z0-9_-]{8,4096}\.[A-Za-z0-9_-]{0,4096}"),
    Rule("bearer_token", "authorization", re.compile(
        rf"authorization(?<![a-z0-9_]authorization){_ASSIGN}(?:bearer|basic|token)[ \t]{{1,32}}"
        r"(?P<secret>[^\s\"',;]{1,1024})"), lower=True, check=_unless_marked("bearer_token")),
    Rule("bearer_token", "bearer", re.compile(
        r"bearer(?<![a-z0-9_]bearer)\s{1,32}(?P<secret>[a-z0-9._~+/=-]{8,1024})"), lower=True, check=_bearer),
    *_credential_rules(),
    _SAID_PASSWORD,
    *_COMMAND_PASSWORDS,
)


def lowered(text: str) -> str:
    """The text in lower case, char for char (offsets stay those of `text`)."""
    low = text.lower()
    if len(low) == len(text):
        return low
    # A few letters lower to two chars (`İ`): only ASCII matters to the rules.
    return text.encode("ascii", "replace").decode("ascii").lower()
