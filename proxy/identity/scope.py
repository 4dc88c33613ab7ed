"""Who is asking: X-Memory-* headers, proxy API keys or signed tokens → a Scope.

Identity fails closed: a malformed id is 400, a missing identity where one is required
is 401, never a default user. Memory fails open elsewhere; identity never does.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.errors import BadScope, ForeignSite, Forbidden, Unauthenticated
from proxy.ids import SCOPE_ID_RULE, is_scope_id
from proxy.models import Scope
from proxy.identity.rebinding import RebindingGuard
from proxy.identity.scope_token import verify_scope_token
from proxy.settings import ConfigError, Settings

MAX_MEMORIES_CAP = 12
_SCOPE_HEADERS = (b"x-memory-user", b"x-memory-conversation", b"x-memory-agent")
_SCOPE_NAMES = tuple(name.decode() for name in _SCOPE_HEADERS)
_ALL_HEADERS = _SCOPE_HEADERS + (b"x-memory-mode", b"x-memory-persist", b"x-memory-max", b"x-memory-scope-token")


@dataclass(frozen=True)
class RequestScope:
    """The outcome of identity for one request."""

    scope: Scope | None  # None: no user, so a pure pass-through
    mode: str = "inject"
    persist: bool = True
    max_memories: int | None = None  # X-Memory-Max
    # The memproxy key the client authenticated with (api-keys mode): it never goes upstream.
    proxy_key: str | None = field(default=None, repr=False)
    # The user a proxy key or a signed token proved (pass-through paths included): whose
    # provider objects the request may reach.
    authenticated_user: str | None = None
    body_user: bool = False  # scope.user_from_body applies: trusted mode, a trusted peer
    # With `body_user` and no X-Memory-User: the conversation and agent headers (validated),
    # for the scope the body's user gets.
    body_named: tuple[str | None, str | None] = (None, None)
    side_request: bool = False  # a client's side call (a title, a sub-agent's probe): memory off

    @property
    def off_reason(self) -> str:
        """Why memory is off for this request, in X-Memory-Status's words."""
        if self.scope is None:
            return "no user"
        return "side request" if self.side_request else "mode off"

    @property
    def uses_proxy_key(self) -> bool:
        """True when the client's credential is memproxy's own key, not a provider key."""
        return self.proxy_key is not None

    @property
    def memory_on(self) -> bool:
        return self.scope is not None and self.mode in ("inject", "tools")

    @property
    def needs_body(self) -> bool:
        """Memory may be on: the body is parsed (it may still name the user, see `body_user`)."""
        return self.memory_on or (self.body_user and self.scope is None and self.mode in ("inject", "tools"))


def valid_id(value: str, header: str) -> str:
    """The id itself, or 400 naming the header it came in."""
    if not is_scope_id(value):
        raise BadScope(f"{header} must be {SCOPE_ID_RULE}", param=header)
    return value


class ScopeResolver:
    """Applies auth.mode and scope settings to a request's headers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._session_headers = [name.lower().encode("latin-1") for name in settings.scope.session_headers]
        self._networks = [ipaddress.ip_network(n, strict=False) for n in settings.auth.trusted_networks]
        self._keys = _distinct_keys(settings.auth.api_keys)
        self._rebinding = RebindingGuard(settings.server)

    def resolve(self, asgi_scope: dict[str, Any], *, own_key: bool = False) -> RequestScope:
        """The scope of a chat request, from its headers (the body's user comes later).

        `own_key`: memproxy sends the provider its own upstream key for this request.
        """
        headers = _memory_headers(asgi_scope["headers"])
        options = _options(headers, self.settings.memory.mode)
        mode = self.settings.auth.mode
        if mode == "api-keys":
            user, key = self._user_for_key(asgi_scope["headers"], asgi_scope.get("query_string", b""))
            keyed = self._scope(user, headers.get("x-memory-conversation"), headers.get("x-memory-agent"))
            return self._in_session(RequestScope(keyed, proxy_key=key, authenticated_user=user, **options),
                                    asgi_scope)
        if mode == "signed":
            signed = self._from_token(headers)
            return self._in_session(RequestScope(signed, authenticated_user=signed.user, **options), asgi_scope)
        client = asgi_scope.get("client")
        trusted = self._is_trusted_peer(client)
        body_user = trusted and self.settings.scope.user_from_body
        if trusted and (own_key or body_user or any(h in headers for h in _SCOPE_NAMES)):
            self._same_site(asgi_scope["headers"], client)
        scope = self._trusted(trusted, headers)
        if scope is None and body_user:
            named = (_valid_header(headers, "X-Memory-Conversation"), _valid_header(headers, "X-Memory-Agent"))
            return self._in_session(RequestScope(None, body_user=True, body_named=named, **options), asgi_scope)
        return self._in_session(RequestScope(scope, body_user=body_user, **options), asgi_scope)

    def with_body_user(self, resolved: RequestScope, user: str | None) -> RequestScope:
        """scope.user_from_body: name the user by the body's `user` field (trusted mode, trusted peers)."""
        if resolved.scope is not None or not resolved.body_user:
            # Any client may set `user` (providers use it for abuse tracking): from an untrusted
            # peer, or in another auth mode, it names no one.
            return resolved
        if user is None:
            return resolved
        return replace(resolved, scope=self._scope(valid_id(user, "user"), *resolved.body_named))

    def _in_session(self, resolved: RequestScope, asgi_scope: dict[str, Any]) -> RequestScope:
        """Without X-Memory-Conversation, the session id a client sends names the conversation."""
        scope = resolved.scope
        named = scope.conversation if scope is not None else resolved.body_named[0]
        if named is not None or not self._session_headers:
            return resolved
        session = self._session(asgi_scope["headers"])
        if session is None:
            return resolved
        if scope is None:
            return replace(resolved, body_named=(session, resolved.body_named[1]))
        return replace(resolved, scope=replace(scope, conversation=session))

    def _session(self, raw: list[tuple[bytes, bytes]]) -> str | None:
        found = {name.lower(): value for name, value in raw if name.lower() in self._session_headers}
        for name in self._session_headers:
            value = found.get(name)
            if value is None:
                continue
            text = value.decode("latin-1")
            # Not memproxy's header: a value that is no valid id is passed over, never a 400.
            if is_scope_id(text):
                return text
        return None

    def authenticate_passthrough(self, asgi_scope: dict[str, Any], *, own_key: bool = False) -> RequestScope:
        """Pass-through paths need an identity too in api-keys and signed modes (no open relay); in
        trusted mode, on memproxy's own upstream key (`own_key`), a trusted peer's request must not
        come from a web page of another site."""
        mode = self.settings.auth.mode
        if mode == "api-keys":
            user, key = self._user_for_key(asgi_scope["headers"], asgi_scope.get("query_string", b""))
            return RequestScope(None, mode="off", proxy_key=key, authenticated_user=user)
        if mode == "signed":
            return RequestScope(None, mode="off",
                                authenticated_user=self._from_token(_memory_headers(asgi_scope["headers"])).user)
        client = asgi_scope.get("client")
        if own_key and self._is_trusted_peer(client):
            self._same_site(asgi_scope["headers"], client)
        return RequestScope(None, mode="off")

    def _scope(self, user: str, conversation: str | None, agent: str | None) -> Scope:
        return Scope(
            user=user,
            conversation=valid_id(conversation, "X-Memory-Conversation") if conversation is not None else None,
            agent=valid_id(agent, "X-Memory-Agent") if agent is not None else None,
            agent_isolated=self.settings.scope.isolation == "agent" and agent is not None,
        )

    def _same_site(self, raw: list[tuple[bytes, bytes]], client: tuple[str, int] | None) -> None:
        """403 when a peer trusted for its address names its user, or spends memproxy's provider
        key, from a web page of another site.

        A browser on the user's machine (or on a trusted network) is such a peer: a page's
        form-like POST needs no CORS preflight, and a page whose name is rebound to memproxy's
        address is same-origin. Its Origin names the page's site; from loopback, so does its
        Host. A trusted network's clients may reach memproxy by names it cannot list (a compose
        service's, a load balancer's), so there the Origin alone is checked: browsers send it
        with every POST and every request to another origin.
        """
        refused = self._rebinding.refusal(raw, check_host=is_loopback(client))
        if refused is not None:
            raise ForeignSite(refused)

    def _trusted(self, trusted_peer: bool, headers: dict[str, str]) -> Scope | None:
        if not any(h in headers for h in _SCOPE_NAMES):
            return None
        if not trusted_peer:
            raise Unauthenticated("scope headers are accepted only from trusted networks")
        user = headers.get("x-memory-user")
        if user is None:
            return None
        return self._scope(valid_id(user, "X-Memory-User"), headers.get("x-memory-conversation"),
                           headers.get("x-memory-agent"))

    def _is_trusted_peer(self, client: tuple[str, int] | None) -> bool:
        address = _peer_address(client)
        return address is not None and (address.is_loopback or any(address in network for network in self._networks))

    def _user_for_key(self, raw_headers: list[tuple[bytes, bytes]], query: bytes = b"") -> tuple[str, str]:
        """The user of the request's proxy key, and the key as the client sent it."""
        try:
            token = (bearer(raw_headers) or _api_key_header(raw_headers, b"x-api-key")
                     or _api_key_header(raw_headers, b"x-goog-api-key") or _key_parameter(query))
        except DuplicateAuthorization as exc:
            raise BadScope(str(exc), param=str(exc).split(" ", 1)[0]) from None
        if token is None:
            raise Unauthenticated("a memproxy API key is required (Authorization: Bearer <key>, or x-api-key)")
        digest = hashlib.sha256(token.encode()).digest()
        for expected, user in self._keys:
            if hmac.compare_digest(digest, expected):
                return user, token
        raise Unauthenticated("unknown API key")

    def _from_token(self, headers: dict[str, str]) -> Scope:
        token = headers.get("x-memory-scope-token")
        if token is None:
            raise Unauthenticated("X-Memory-Scope-Token is required")
        auth = self.settings.auth
        claims = verify_scope_token(token, (auth.signing_secret or "").encode(), audience=auth.token_audience)
        named: dict[str, str | None] = {}
        for claim, header in (("sub", "X-Memory-User"), ("conversation", "X-Memory-Conversation"),
                              ("agent", "X-Memory-Agent")):
            value, sent = claims.get(claim), headers.get(header.lower())
            if value is not None and not isinstance(value, str):
                raise Unauthenticated(f"the scope token's {claim} claim must be a string")
            if value is not None:
                # A claim breaking the id rule is the token's fault, and named as its.
                valid_id(value, f"X-Memory-Scope-Token {claim}")
            if value is not None and sent is not None and sent != value:
                raise Forbidden(f"{header} disagrees with the scope token", param=header)
            # A claim the token leaves out may be named by its header: the token's user owns them all.
            named[claim] = value if value is not None else sent
        return self._scope(claims["sub"], named["conversation"], named["agent"])


def _peer_address(client: Sequence[Any] | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not client:
        return None
    try:
        address = ipaddress.ip_address(str(client[0]))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack socket's view of an IPv4 client
    return address


def is_loopback(client: Sequence[Any] | None) -> bool:
    """True for a client address on the loopback interface (127.0.0.0/8, ::1)."""
    address = _peer_address(client)
    return address is not None and address.is_loopback


def _valid_header(headers: dict[str, str], name: str) -> str | None:
    value = headers.get(name.lower())
    return None if value is None else valid_id(value, name)


def _memory_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in raw:
        lower = name.lower()
        if lower.startswith(b"x-memory-"):
            key = lower.decode("latin-1")
            title = "-".join(part.capitalize() for part in key.split("-"))
            if key in found:
                raise BadScope(f"{title} appears more than once", param=title)
            if lower not in _ALL_HEADERS:
                continue
            try:
                found[key] = value.decode("ascii")
            except UnicodeDecodeError:
                raise BadScope(f"{title} must be {SCOPE_ID_RULE}", param=title) from None
    return found


def _options(headers: dict[str, str], default_mode: str) -> dict[str, Any]:
    mode = headers.get("x-memory-mode", default_mode).lower()
    if mode not in ("inject", "tools", "off"):
        raise BadScope("X-Memory-Mode must be inject, tools or off", param="X-Memory-Mode")
    persist_text = headers.get("x-memory-persist", "true").lower()
    if persist_text not in ("true", "false"):
        raise BadScope("X-Memory-Persist must be true or false", param="X-Memory-Persist")
    max_text = headers.get("x-memory-max")
    max_memories = None
    if max_text is not None:
        if not max_text.isdigit() or not max_text.isascii():
            raise BadScope("X-Memory-Max must be a whole number from 0", param="X-Memory-Max")
        # Any number of digits: past the hard cap the value does not matter (and Python
        # refuses to read a number of over 4,300 digits).
        digits = max_text.lstrip("0") or "0"
        max_memories = MAX_MEMORIES_CAP if len(digits) > len(str(MAX_MEMORIES_CAP)) else min(int(digits),
                                                                                             MAX_MEMORIES_CAP)
    return {"mode": mode, "persist": persist_text == "true", "max_memories": max_memories}


class DuplicateAuthorization(ValueError):
    """Two Authorization headers: a proxy in front and memproxy may each read another one."""


def bearer(raw: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of the request's one `Authorization: Bearer` header, if any; two headers
    raise DuplicateAuthorization (a proxy in front may read the other one)."""
    values = [value for name, value in raw if name.lower() == b"authorization"]
    if len(values) > 1:
        raise DuplicateAuthorization("Authorization appears more than once")
    text = values[0].decode("latin-1") if values else ""
    return (text[7:].strip() or None) if text[:7].lower() == "bearer " else None


def _api_key_header(raw: Iterable[tuple[bytes, bytes]], header: bytes) -> str | None:
    """A key header where a client sends its proxy key its provider's way: the Messages wire's
    `x-api-key`, the Gemini wire's `x-goog-api-key`."""
    values = [value for name, value in raw if name.lower() == header]
    if len(values) > 1:
        raise DuplicateAuthorization(f"{header.decode()} appears more than once")
    return values[0].decode("latin-1").strip() or None if values else None


def _key_parameter(query: bytes) -> str | None:
    """The Gemini wire's `key` query parameter, its other place for the key."""
    values = urllib.parse.parse_qs(query.decode("latin-1")).get("key", [])
    if len(values) > 1:
        raise DuplicateAuthorization("key appears more than once")
    return values[0].strip() or None if values else None


def _distinct_keys(entries: list[dict[str, str]]) -> list[tuple[bytes, str]]:
    """Each configured key's digest with its user; the same key twice (also once in the clear and
    once as its sha256) stops start-up: which user it names would depend on the order."""
    keys: list[tuple[bytes, str]] = []
    first: dict[bytes, int] = {}
    for index, entry in enumerate(entries):
        digest = _key_digest(entry["key"], index)
        if digest in first:
            raise ConfigError(f"auth.api_keys[{index}].key: the same key as auth.api_keys[{first[digest]}].key; "
                              "each key names one user")
        first[digest] = index
        keys.append((digest, entry["user"]))
    return keys


def _key_digest(configured: str, index: int) -> bytes:
    """The sha256 digest a configured key is compared by (a `sha256:<hex>` entry is one already)."""
    if not configured.startswith("sha256:"):
        return hashlib.sha256(configured.encode()).digest()
    hex_digest = configured[7:]
    if not re.fullmatch(r"[0-9a-fA-F]{64}", hex_digest):
        raise ConfigError(f"auth.api_keys[{index}].key: sha256: must be followed by 64 hex digits")
    return bytes.fromhex(hex_digest)
