"""What reaches the provider of a client's credentials (docs/auth.md): in api-keys mode the
client's memproxy key never leaves, in any header or query parameter, and the provider gets
memproxy's own key where it reads one.

A real proxy and the recording fake upstream: the exact headers and query each request
arrived with.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.fake_upstream import Received

UPSTREAM_KEY = "sk-upstream-own-key-0001"
ANTHROPIC_KEY = "sk-ant-upstream-own-0002"
ALICE_KEY = "mp-alice-key-7f3e9a"

# What a client may put next to its proxy key: each provider's key header, a cookie, an account
# selector, and headers of any name that carry the key.
CLIENT_HEADERS = [
    ("api-key", ALICE_KEY), ("x-goog-api-key", ALICE_KEY), ("cookie", f"session={ALICE_KEY}"),
    ("proxy-authorization", f"Bearer {ALICE_KEY}"), ("openai-organization", "org-someone"),
    ("openai-project", "proj-someone"), ("x-forwarded-key", f"prefix {ALICE_KEY} suffix"),
    ("x-app-trace", "trace-1"), ("anthropic-beta", "files-api-2025-04-14"),
]
# What the transport itself writes (or leaves to the client library).
_FRAMING = {"host", "content-length", "content-type", "accept", "accept-encoding", "user-agent", "connection"}


@pytest.fixture
def keyed(make_proxy: Any, fake: Any) -> Any:
    return make_proxy(auth__mode="api-keys", auth__api_keys=[{"key": ALICE_KEY, "user": "alice"}],
                      upstream__api_key=UPSTREAM_KEY, upstream__anthropic_api_key=ANTHROPIC_KEY,
                      upstream__anthropic_base_url=fake.url, memory__commit_timeout_ms=5000)


def _forwarded(request: Received) -> list[tuple[str, str]]:
    return [(k.lower(), v) for k, v in request.headers if k.lower() not in _FRAMING]


@pytest.mark.parametrize("auth", [("authorization", f"Bearer {ALICE_KEY}"), ("x-api-key", ALICE_KEY)])
def test_the_client_key_never_leaves_in_any_header_or_query(keyed: Any, fake: Any, auth: tuple[str, str]) -> None:
    headers = [auth, *CLIENT_HEADERS]
    query = f"?beta=true&key={ALICE_KEY}&other=x{ALICE_KEY}&KEY=upper"
    with keyed.http() as client:
        chat = client.post(f"/v1/chat/completions{query}", headers=headers,
                           json={"model": "m", "messages": [{"role": "user", "content": "hello"}]})
        models = client.get(f"/v1/models{query}", headers=headers)
        messages = client.post(f"/v1/messages{query}", headers=[*headers, ("anthropic-version", "2023-06-01")],
                               json={"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    assert [r.status_code for r in (chat, models, messages)] == [200, 200, 200]
    kept = [("x-app-trace", "trace-1"), ("anthropic-beta", "files-api-2025-04-14")]
    on_openai = [*kept, ("authorization", f"Bearer {UPSTREAM_KEY}")]
    on_anthropic = [*kept, ("anthropic-version", "2023-06-01"), ("x-api-key", ANTHROPIC_KEY)]
    assert [(r.method, r.target.split("v1", 1)[1], sorted(_forwarded(r))) for r in fake.received] == [
        ("POST", "/chat/completions?beta=true&KEY=upper", sorted(on_openai)),
        ("GET", "/models?beta=true&KEY=upper", sorted(on_openai)),
        ("POST", "/messages?beta=true&KEY=upper", sorted(on_anthropic)),
    ]
    for request in fake.received:
        assert ALICE_KEY.encode() not in request.target.encode() + repr(request.headers).encode() + request.body


def test_a_key_in_the_query_percent_encoded_never_leaves(keyed: Any, fake: Any) -> None:
    encoded = ALICE_KEY.replace("-", "%2D")
    with keyed.http() as client:
        response = client.get(f"/v1/models?k%65y=1&token={encoded}&limit=2",
                              headers={"Authorization": f"Bearer {ALICE_KEY}"})
    assert response.status_code == 200
    assert [r.target for r in fake.received] == ["/v1/models?limit=2"]


def test_a_configured_key_replaces_every_provider_key_header_outside_api_keys_mode(make_proxy: Any,
                                                                                  fake: Any) -> None:
    proxy = make_proxy(upstream__api_key=UPSTREAM_KEY)
    with proxy.http() as client:
        client.get("/v1/models?key=client-own", headers=[("Authorization", "Bearer sk-client-own"),
                                                         ("api-key", "sk-client-own"),
                                                         ("x-goog-api-key", "g-client-own"),
                                                         ("x-api-key", "sk-client-own"), ("cookie", "c=1")])
    (request,) = fake.received
    # The client's own credentials are its own business towards its own account: only the
    # headers memproxy's key replaces go, and Google's key (`?key=`), which goes to Google alone.
    assert sorted(_forwarded(request)) == [("authorization", f"Bearer {UPSTREAM_KEY}"), ("cookie", "c=1")]
    assert request.target == "/v1/models"


def test_a_key_as_a_query_parameters_name_never_leaves(keyed: Any, fake: Any) -> None:
    # A parameter with no value (`?<key>`) or the key as its name: the key leaves all the same.
    with keyed.http() as client:
        for query in (f"?{ALICE_KEY}&limit=2", f"?{ALICE_KEY.replace('-', '%2D')}=1&limit=2"):
            response = client.get(f"/v1/models{query}", headers={"Authorization": f"Bearer {ALICE_KEY}"})
            assert response.status_code == 200
    assert [r.target for r in fake.received] == ["/v1/models?limit=2"] * 2
