"""Who may claim a user (docs/auth.md): trusted peers, proxy API keys, signed scope tokens.

End to end through a real proxy; the untrusted-peer cases drive the whole app through its
ASGI interface with a non-loopback client address (this machine has no other address the
tests may use), the resolver's peer rule directly.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import sqlite3
import time
from contextlib import closing
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.errors import BadScope, Forbidden, Unauthenticated
from proxy.identity.scope import ScopeResolver
from proxy.identity.scope_token import verify_scope_token
from proxy.settings import ConfigError, load_settings
from tests.api_helpers import api_url, chat, sign

SECRET = "signing-secret-for-tests-32-bytes-or-more"
UPSTREAM_KEY = "sk-upstream-own-key-0001"
ALICE_KEY = "mp-alice-key-7f3e9a"
BOB_KEY = "mp-bob-key-c41d22"
API_KEYS = [{"key": ALICE_KEY, "user": "alice"},
            {"key": "sha256:" + hashlib.sha256(BOB_KEY.encode()).hexdigest(), "user": "bob"}]


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return response.json()["error"]


def users_with_conversations(client: httpx.Client, *users: str) -> dict[str, int]:
    return {user: len(client.get(api_url(user, "conversations")).json()["data"]) for user in users}


# --- trusted ------------------------------------------------------------------------------


async def _remote(overrides: dict[str, Any], requests: list[tuple[str, str, dict[str, str], Any]],
                  address: str = "203.0.113.7") -> list[httpx.Response]:
    """Requests to the whole app from `address`, through its ASGI interface."""
    app = create_app(load_settings(environ={}, overrides=overrides))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://memproxy") as client:
            return [await client.request(method, url, headers=headers, json=body)
                    for method, url, headers, body in requests]


def _chat_request(headers: dict[str, str], **body: Any) -> tuple[str, str, dict[str, str], Any]:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], **body}
    return ("POST", "/v1/chat/completions", headers, payload)


def test_scope_headers_from_an_untrusted_peer_get_401(fake: Any, tmp_path: Any) -> None:
    base = {"upstream.base_url": fake.url, "store.url": f"sqlite:///{tmp_path}/m.db"}
    (refused,) = asyncio.run(_remote(base, [_chat_request({"X-Memory-User": "alice"})]))
    assert error_of(refused, 401) == {"message": "scope headers are accepted only from trusted networks",
                                      "type": "authentication_error", "param": None,
                                      "code": "invalid_memory_identity"}
    assert refused.headers["x-memory-status"] == "off: not a turn"
    assert fake.chat_requests() == []
    plain, no_scope = asyncio.run(_remote(base, [_chat_request({}), ("GET", "/v1/models", {}, None)]))
    assert (plain.status_code, plain.headers["x-memory-status"], no_scope.status_code) == (200, "off: no user", 200)


def test_a_trusted_network_may_name_users(fake: Any, tmp_path: Any) -> None:
    overrides = {"upstream.base_url": fake.url, "store.url": f"sqlite:///{tmp_path}/m.db",
                 "auth.trusted_networks": ["203.0.113.0/24"], "memory.commit_timeout_ms": 5000}
    (accepted,) = asyncio.run(_remote(overrides, [_chat_request({"X-Memory-User": "alice"})]))
    assert (accepted.status_code, accepted.headers["x-memory-status"]) == (200, "ok")
    (outside,) = asyncio.run(_remote(overrides, [_chat_request({"X-Memory-User": "alice"})], "198.51.100.9"))
    assert error_of(outside, 401)["code"] == "invalid_memory_identity"


def test_the_body_user_names_no_one_from_an_untrusted_peer(fake: Any, tmp_path: Any, make_proxy: Any) -> None:
    overrides = {"upstream.base_url": fake.url, "store.url": f"sqlite:///{tmp_path}/m.db",
                 "scope.user_from_body": True, "memory.commit_timeout_ms": 5000}
    (remote,) = asyncio.run(_remote(overrides, [_chat_request({}, user="alice")]))
    assert (remote.status_code, remote.headers["x-memory-status"]) == (200, "off: no user")
    assert "x-memory-turn" not in remote.headers
    proxy = make_proxy(scope__user_from_body=True, memory__commit_timeout_ms=5000)
    with proxy.http() as client:
        local = chat(client, {}, "hello there", user="alice")
        assert (local.status_code, local.headers["x-memory-status"]) == (200, "ok")
        assert users_with_conversations(client, "alice") == {"alice": 1}


def test_the_body_user_keeps_the_conversation_and_agent_headers(make_proxy: Any, fake: Any) -> None:
    proxy = make_proxy(scope__user_from_body=True, scope__isolation="agent", memory__commit_timeout_ms=5000)
    headers = {"X-Memory-Conversation": "conv-1", "X-Memory-Agent": "billing-bot"}
    with proxy.http() as client:
        response = chat(client, headers, "the invoice run is on the 3rd", user="alice")
        assert (response.status_code, response.headers["x-memory-status"]) == (200, "ok")
        bad = chat(client, {**headers, "X-Memory-Agent": "*"}, "hello", user="alice")
        assert error_of(bad, 400)["param"] == "X-Memory-Agent"  # checked whoever names the user
    with closing(sqlite3.connect(proxy.settings.store.url.removeprefix("sqlite:///"))) as db:
        saved = db.execute("SELECT m.user_id, m.conversation_id, m.agent_id, m.content FROM messages m"
                           " WHERE m.role = 'user'").fetchall()
    assert saved == [("alice", "conv-1", "billing-bot", "the invoice run is on the 3rd")]


@pytest.mark.parametrize(("address", "trusted"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.1.2.3", True), ("::ffff:10.1.2.3", True), ("10.2.0.1", False), ("192.168.1.5", False),
    ("::ffff:192.168.1.5", False), ("2001:db8::1", False), ("not-an-address", False),
])
def test_the_trusted_peer_rule(address: str, trusted: bool) -> None:
    resolver = ScopeResolver(load_settings(environ={}, overrides={"auth.trusted_networks": ["10.1.0.0/16"]}))
    asgi = {"client": (address, 1234), "headers": [(b"x-memory-user", b"alice")]}
    if trusted:
        assert resolver.resolve(asgi).scope is not None
    else:
        with pytest.raises(Unauthenticated):
            resolver.resolve(asgi)


def test_no_client_address_is_untrusted() -> None:
    resolver = ScopeResolver(load_settings(environ={}))
    with pytest.raises(Unauthenticated):
        resolver.resolve({"client": None, "headers": [(b"x-memory-user", b"alice")]})


# --- api-keys -----------------------------------------------------------------------------


@pytest.fixture
def keyed(make_proxy: Any) -> Any:
    return make_proxy(auth__mode="api-keys", auth__api_keys=API_KEYS, upstream__api_key=UPSTREAM_KEY,
                      memory__commit_timeout_ms=5000)


def test_a_proxy_key_names_its_user_whatever_the_header_claims(keyed: Any, fake: Any) -> None:
    with keyed.http() as client:
        response = chat(client, {"Authorization": f"Bearer {ALICE_KEY}", "X-Memory-User": "bob"}, "I live in Porto.")
        assert (response.status_code, response.headers["x-memory-status"]) == (200, "ok")
        assert users_with_conversations(client, "alice", "bob") == {"alice": 1, "bob": 0}
        bob = chat(client, {"Authorization": f"Bearer {BOB_KEY}"}, "I live in Lyon.")  # stored as sha256:
        assert bob.headers["x-memory-status"] == "ok"
        assert users_with_conversations(client, "alice", "bob") == {"alice": 1, "bob": 1}


def test_the_client_proxy_key_never_reaches_the_upstream(keyed: Any, fake: Any) -> None:
    with keyed.http() as client:
        chat(client, {"Authorization": f"Bearer {ALICE_KEY}"}, "hello")
        client.get("/v1/models", headers={"Authorization": f"Bearer {ALICE_KEY}"})
        client.post("/v1/embeddings", headers={"Authorization": f"Bearer {ALICE_KEY}"}, json={"input": "x"})
    assert len(fake.received) == 3
    for request in fake.received:
        assert [v for k, v in request.headers if k.lower() == "authorization"] == [f"Bearer {UPSTREAM_KEY}"]
        assert ALICE_KEY.encode() not in request.body + repr(request.headers).encode()


BOB_DIGEST = hashlib.sha256(BOB_KEY.encode()).hexdigest()


@pytest.mark.parametrize("authorization", [None, "Bearer mp-unknown", "Bearer  x", f"Basic {ALICE_KEY}",
                                           f"Bearer {ALICE_KEY}x", f"Bearer {BOB_DIGEST}"])
def test_missing_or_unknown_keys_get_401_on_every_path(keyed: Any, fake: Any, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    with keyed.http() as client:
        for response in (chat(client, headers, "hello"), client.get("/v1/models", headers=headers),
                         client.post("/v1/files", headers=headers, content=b"data")):
            assert error_of(response, 401)["type"] == "authentication_error"
    assert fake.received == []


@pytest.mark.parametrize("keys", [(ALICE_KEY, BOB_KEY), (BOB_KEY, ALICE_KEY), (ALICE_KEY, "mp-unknown"),
                                  (ALICE_KEY, ALICE_KEY)])
def test_two_authorization_headers_are_400_on_every_path(keyed: Any, fake: Any, keys: tuple[str, str]) -> None:
    # Two Authorization headers: a proxy in front may read the other header than memproxy does.
    headers = [("Authorization", f"Bearer {key}") for key in keys]
    payload = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    with keyed.http() as client:
        for response in (client.post("/v1/chat/completions", json=payload, headers=headers),
                         client.get("/v1/models", headers=headers)):
            assert error_of(response, 400) == {"message": "Authorization appears more than once",
                                               "type": "invalid_request_error", "param": "Authorization",
                                               "code": "invalid_memory_header"}
        assert users_with_conversations(client, "alice", "bob") == {"alice": 0, "bob": 0}
    assert fake.received == []


def test_a_malformed_sha256_key_stops_start_up() -> None:
    settings = load_settings(environ={}, overrides={"auth.mode": "api-keys",
                                                    "auth.api_keys": [{"key": "sha256:xyz", "user": "u"}]})
    with pytest.raises(ConfigError, match=r"auth\.api_keys\[0\]\.key: sha256: must be followed by 64 hex digits"):
        ScopeResolver(settings)


@pytest.mark.parametrize("second", ["k1", "sha256:" + hashlib.sha256(b"k1").hexdigest().upper()])
def test_one_key_for_two_users_stops_start_up(second: str) -> None:
    settings = load_settings(environ={}, overrides={"auth.mode": "api-keys", "auth.api_keys": [
        {"key": "k1", "user": "alice"}, {"key": "k2", "user": "carol"}, {"key": second, "user": "bob"}]})
    with pytest.raises(ConfigError, match=r"auth\.api_keys\[2\]\.key: the same key as auth\.api_keys\[0\]\.key"):
        ScopeResolver(settings)


# --- signed -------------------------------------------------------------------------------


@pytest.fixture
def signed(make_proxy: Any) -> Any:
    return make_proxy(auth__mode="signed", auth__signing_secret=SECRET, memory__commit_timeout_ms=5000)


def token(sub: str = "alice", ttl: float = 300, **claims: Any) -> str:
    return sign({"sub": sub, "exp": int(time.time() + ttl), **claims}, SECRET)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _signed_raw(header: bytes, payload: bytes, secret: str = SECRET) -> str:
    head, body = _b64(header), _b64(payload)
    mac = hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(mac)}"


def test_a_signed_token_names_the_user_and_never_reaches_the_upstream(signed: Any, fake: Any) -> None:
    scope_token = token(conversation="chat-7")
    with signed.http() as client:
        response = chat(client, {"X-Memory-Scope-Token": scope_token}, "I work at Acme.")
        assert (response.status_code, response.headers["x-memory-status"]) == (200, "ok")
        conversations = client.get(api_url("alice", "conversations")).json()["data"]
        assert [c["id"] for c in conversations] == ["chat-7"]
    assert scope_token.encode() not in fake.received[0].body + repr(fake.received[0].headers).encode()


def _tampered() -> str:
    head, _, mac = token().split(".")
    return f"{head}.{_b64(json.dumps({'sub': 'bob', 'exp': int(time.time()) + 300}).encode())}.{mac}"


def _signed_with(algorithm: str, claims: dict[str, Any] | None = None) -> str:
    """A token whose header names `algorithm` but is signed as HS256 with the shared secret: what
    an attacker who swaps the alg would send (RS256 with the secret taken for a public key)."""
    payload = claims or {"sub": "alice", "exp": int(time.time()) + 300}
    return _signed_raw(json.dumps({"alg": algorithm, "typ": "JWT"}).encode(), json.dumps(payload).encode())


def _flip_signature(scope_token: str) -> str:
    head, body, mac = scope_token.split(".")
    return f"{head}.{body}.{'B' if mac[0] == 'A' else 'A'}{mac[1:]}"


def _hs512() -> str:
    head = _b64(json.dumps({"alg": "HS512", "typ": "JWT"}).encode())
    body = _b64(json.dumps({"sub": "alice", "exp": int(time.time()) + 300}).encode())
    mac = hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha512).digest()
    return f"{head}.{body}.{_b64(mac)}"


def _unsigned() -> str:
    head = _b64(b'{"alg":"none","typ":"JWT"}')
    return f"{head}.{_b64(json.dumps({'sub': 'alice', 'exp': int(time.time()) + 300}).encode())}."


NOW_PLUS = int(time.time()) + 3600
MALFORMED = "the scope token is malformed"
NOT_HS256 = "the scope token must be an HS256 JWT"
BAD_SIGNATURE = "the scope token's signature is invalid"


@pytest.mark.parametrize(("make_token", "message"), [
    (lambda: token(ttl=-5), "the scope token has expired"),
    (lambda: sign({"sub": "alice", "exp": int(time.time()) + 300}, "another-secret-also-32-bytes-long!!"),
     BAD_SIGNATURE),
    (_tampered, BAD_SIGNATURE),
    (lambda: _flip_signature(token()), BAD_SIGNATURE),
    (lambda: token()[:-2], MALFORMED),
    (lambda: token() + "!", MALFORMED),
    (lambda: token().replace(".", "..", 1), MALFORMED),
    (lambda: token() + ".", MALFORMED),
    (lambda: token().replace(".", " .", 1), MALFORMED),
    (lambda: "not-a-jwt", MALFORMED),
    (lambda: "a.b.c", MALFORMED),
    (lambda: "..", MALFORMED),
    (lambda: _signed_raw(b"not json", b'{"sub":"alice","exp":9999999999}'), MALFORMED),
    (lambda: _signed_raw(b'["HS256"]', b'{"sub":"alice","exp":9999999999}'), MALFORMED),
    (lambda: _signed_raw(b'{"alg":"HS256"}', b'["alice"]'), MALFORMED),
    (lambda: _signed_raw(b"[" * 50000, b'{"sub":"alice","exp":9999999999}'), MALFORMED),
    (lambda: _signed_raw(b'{"alg":"HS256"}', b"[" * 50000), MALFORMED),
    (_unsigned, MALFORMED),
    (lambda: _signed_with("none"), NOT_HS256),
    (lambda: _signed_with("None"), NOT_HS256),
    (lambda: _signed_with("RS256"), NOT_HS256),
    (lambda: _signed_with("HS512"), NOT_HS256),
    (_hs512, NOT_HS256),
    (lambda: sign({"sub": "alice"}, SECRET), "the scope token needs an exp claim (a time in unix seconds)"),
    (lambda: _signed_raw(b'{"alg":"HS256"}', b'{"sub":"alice","exp":NaN}'), MALFORMED),
    (lambda: _signed_raw(b'{"alg":"HS256"}', b'{"sub":"alice","exp":1e400}'), MALFORMED),
    (lambda: sign({"sub": "alice", "exp": "tomorrow"}, SECRET), MALFORMED),
    # PyJWT reads a time with int() and an object's last value for a key: neither passes.
    (lambda: sign({"sub": "alice", "exp": str(NOW_PLUS)}, SECRET),
     "the scope token's exp claim must be a number (unix seconds)"),
    (lambda: token(iat=str(int(time.time()))), "the scope token's iat claim must be a number (unix seconds)"),
    (lambda: token(nbf="0"), "the scope token's nbf claim must be a number (unix seconds)"),
    (lambda: token(nbf=False), "the scope token's nbf claim must be a number (unix seconds)"),
    (lambda: _signed_raw(b'{"alg":"HS256"}', b'{"sub":"alice","sub":"bob","exp":%d}' % NOW_PLUS),
     "the scope token names 'sub' twice"),
    (lambda: _signed_raw(b'{"alg":"HS256"}', b'{"sub":"alice","exp":%d,"exp":%d}' % (NOW_PLUS, NOW_PLUS)),
     "the scope token names 'exp' twice"),
    (lambda: _signed_raw(b'{"alg":"HS256","alg":"HS256"}', b'{"sub":"alice","exp":%d}' % NOW_PLUS),
     "the scope token names 'alg' twice"),
    (lambda: sign({"exp": int(time.time()) + 300}, SECRET), "the scope token has no subject"),
    (lambda: token(sub=7), "the scope token's sub claim must be a string"),
    (lambda: token(sub=["alice"]), "the scope token's sub claim must be a string"),
    (lambda: token(conversation=7), "the scope token's conversation claim must be a string"),
    (lambda: token(agent={"id": "a"}), "the scope token's agent claim must be a string"),
    (lambda: token(nbf=NOW_PLUS), "the scope token is not valid yet (nbf or iat is in the future)"),
    # With no auth.token_audience, a token meant for some audience is not for memproxy.
    (lambda: token(aud="some-other-service"), "the scope token is meant for another audience (aud)"),
    (lambda: token(aud=["billing-api"]), "the scope token is meant for another audience (aud)"),
    (lambda: token(aud=7), "the scope token is meant for another audience (aud)"),
])
def test_bad_scope_tokens_get_401(signed: Any, fake: Any, make_token: Any, message: str) -> None:
    with signed.http() as client:
        response = chat(client, {"X-Memory-Scope-Token": make_token()}, "hello")
        assert error_of(response, 401)["message"] == message
    assert fake.received == []


ELSEWHERE = "the scope token is meant for another audience (aud)"
NO_AUDIENCE = "the scope token needs an aud claim naming auth.token_audience"


@pytest.mark.parametrize(("aud", "refused"), [
    ("memproxy", None), (["billing-api", "memproxy"], None), (None, NO_AUDIENCE), ([], NO_AUDIENCE),
    ("billing-api", ELSEWHERE), (["memproxy-2"], ELSEWHERE), ("MEMPROXY", ELSEWHERE),
])
def test_a_configured_audience_must_be_named_by_the_token(make_proxy: Any, fake: Any, aud: Any,
                                                          refused: str | None) -> None:
    proxy = make_proxy(auth__mode="signed", auth__signing_secret=SECRET, auth__token_audience="memproxy")
    claims = {} if aud is None else {"aud": aud}
    with proxy.http() as client:
        response = chat(client, {"X-Memory-Scope-Token": token(**claims)}, "hello")
    if refused is None:
        assert (response.status_code, response.headers["x-memory-status"]) == (200, "ok")
    else:
        assert error_of(response, 401)["message"] == refused
        assert fake.received == []


def test_a_missing_token_gets_401_on_every_path(signed: Any, fake: Any) -> None:
    with signed.http() as client:
        for response in (chat(client, {}, "hello"), chat(client, {"X-Memory-User": "alice"}, "hello"),
                         client.get("/v1/models")):
            assert error_of(response, 401)["message"] == "X-Memory-Scope-Token is required"
        assert client.get("/v1/models", headers={"X-Memory-Scope-Token": token()}).status_code == 200
    assert [r.target for r in fake.received] == ["/v1/models"]


@pytest.mark.parametrize(("claims", "headers", "message"), [
    ({}, {"X-Memory-User": "bob"}, "X-Memory-User disagrees with the scope token"),
    ({"conversation": "c1"}, {"X-Memory-Conversation": "c2"}, "X-Memory-Conversation disagrees with the scope token"),
    ({"agent": "a1"}, {"X-Memory-Agent": "a2"}, "X-Memory-Agent disagrees with the scope token"),
])
def test_a_header_that_disagrees_with_the_token_gets_403(signed: Any, fake: Any, claims: dict[str, str],
                                                         headers: dict[str, str], message: str) -> None:
    with signed.http() as client:
        response = chat(client, {"X-Memory-Scope-Token": token(**claims), **headers}, "hello")
        assert error_of(response, 403) == {"message": message, "type": "permission_error",
                                           "param": next(iter(headers)), "code": "memory_scope_forbidden"}
    assert fake.received == []


def test_headers_may_name_what_the_token_leaves_open(signed: Any) -> None:
    with signed.http() as client:
        same = chat(client, {"X-Memory-Scope-Token": token(conversation="c1"), "X-Memory-User": "alice",
                             "X-Memory-Conversation": "c1"}, "hello")
        chosen = chat(client, {"X-Memory-Scope-Token": token(), "X-Memory-Conversation": "c9"}, "hello again")
        assert (same.status_code, chosen.status_code) == (200, 200)
        assert sorted(c["id"] for c in client.get(api_url("alice", "conversations")).json()["data"]) == ["c1", "c9"]


@pytest.mark.parametrize(("claims", "param"), [
    ({"sub": "*"}, "X-Memory-Scope-Token sub"), ({"sub": ".."}, "X-Memory-Scope-Token sub"),
    ({"sub": "a b/c"}, "X-Memory-Scope-Token sub"), ({"sub": "\u0430lice"}, "X-Memory-Scope-Token sub"),
    ({"sub": ""}, "X-Memory-Scope-Token sub"), ({"sub": "x" * 257}, "X-Memory-Scope-Token sub"),
    ({"conversation": "chat 7"}, "X-Memory-Scope-Token conversation"),
    ({"agent": "*"}, "X-Memory-Scope-Token agent"),
])
def test_a_token_naming_an_id_the_headers_could_not_is_400(signed: Any, fake: Any, claims: dict[str, str],
                                                            param: str) -> None:
    with signed.http() as client:
        response = chat(client, {"X-Memory-Scope-Token": token(**{"sub": "alice", **claims})}, "hello")
        assert error_of(response, 400) == {
            "message": f"{param} must be 1-256 characters of ASCII letters, digits and ._:@+-",
            "type": "invalid_request_error", "param": param, "code": "invalid_memory_header"}
    assert fake.received == []


def test_a_malformed_subject_is_400() -> None:
    resolver = ScopeResolver(load_settings(environ={}, overrides={"auth.mode": "signed",
                                                                  "auth.signing_secret": SECRET}))
    asgi = {"client": ("127.0.0.1", 1), "headers": [(b"x-memory-scope-token", token(sub="a b").encode())]}
    with pytest.raises(BadScope):
        resolver.resolve(asgi)
    with pytest.raises(Forbidden):
        resolver.resolve({**asgi, "headers": [(b"x-memory-scope-token", token().encode()), (b"x-memory-user", b"x")]})


def test_a_token_expires_at_its_exp_second() -> None:
    now = int(time.time())
    assert verify_scope_token(sign({"sub": "alice", "exp": now + 5}, SECRET), SECRET.encode())["sub"] == "alice"
    for exp in (now, now - 1):
        with pytest.raises(Unauthenticated, match="expired"):
            verify_scope_token(sign({"sub": "alice", "exp": exp}, SECRET), SECRET.encode())


@pytest.mark.parametrize("secret", ["short", "x" * 31, "\u00e9" * 15])
def test_a_signing_secret_under_32_bytes_stops_start_up(secret: str) -> None:
    with pytest.raises(ConfigError, match=r"auth\.signing_secret: must be at least 32 bytes"):
        load_settings(environ={}, overrides={"auth.mode": "signed", "auth.signing_secret": secret})


def test_identity_is_enforced_while_the_store_is_unavailable(make_proxy: Any, tmp_path: Any) -> None:
    # Memory fails open, identity does not.
    proxy = make_proxy(auth__mode="api-keys", auth__api_keys=API_KEYS, upstream__api_key=UPSTREAM_KEY,
                       store__url=f"sqlite:///{tmp_path}/missing-directory/memproxy.db", server__grace_period_s=1)
    with proxy.http() as client:
        for key in (None, "sk-not-a-proxy-key"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            assert chat(client, headers, "let me in").status_code == 401
        allowed = chat(client, {"Authorization": f"Bearer {ALICE_KEY}"}, "I am alice")
        assert allowed.status_code == 200
        assert allowed.headers["x-memory-status"].startswith("degraded: ")
