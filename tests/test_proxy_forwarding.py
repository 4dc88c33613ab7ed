"""The transparent proxy: what reaches the provider and what comes back (docs/how-it-works.md)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai

from tests.fake_upstream import JsonReply, SSEReply, completion, stream_events


def test_chat_json_reaches_client_unchanged(proxy, fake):
    body = completion("exact answer")
    fake.queue(JsonReply(body, headers=[("x-request-id", "req-123"), ("openai-processing-ms", "12")]))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200
    assert response.content == json.dumps(body).encode()
    assert response.headers["x-request-id"] == "req-123"
    assert response.headers["openai-processing-ms"] == "12"
    assert response.headers["x-memory-status"] == "off: no user"


def test_request_forwarded_byte_for_byte_without_memory_headers(proxy, fake):
    raw = b'{"model":"m","messages":[{"role":"user","content":"h\xc3\xa9"}],"extra_field":{"keep":[1,2]}}'
    headers = {"content-type": "application/json", "authorization": "Bearer sk-client",
               "x-memory-mode": "off", "x-custom": "kept", "connection": "keep-alive, x-hop", "x-hop": "dropped",
               "openai-organization": "org-1"}
    with proxy.http() as http:
        http.post("/v1/chat/completions?api-version=2024-01&x=%2F", content=raw, headers=headers)
    (received,) = fake.received
    assert received.body == raw
    assert received.target == "/v1/chat/completions?api-version=2024-01&x=%2F"
    names = [k.lower() for k, _ in received.headers]
    assert "x-memory-mode" not in names and "x-hop" not in names and "connection" not in names or \
        received.header("connection") != "keep-alive, x-hop"
    assert received.header("x-custom") == "kept"
    assert received.header("authorization") == "Bearer sk-client"
    assert received.header("openai-organization") == "org-1"
    assert received.header("host") == f"127.0.0.1:{fake.port}"


def test_own_upstream_key_replaces_client_key(make_proxy, fake):
    proxy = make_proxy(upstream__api_key="sk-proxy-own")
    proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    proxy.client().models.list()
    assert [r.header("authorization") for r in fake.received] == ["Bearer sk-proxy-own"] * 2


def test_every_v1_path_and_method_passes_through(proxy, fake):
    with proxy.http() as http:
        for method in ("GET", "POST", "DELETE", "PUT", "PATCH"):
            response = http.request(method, "/v1/files/file-1/content?limit=2", content=b"payload" if method in ("POST", "PUT", "PATCH") else None)
            assert response.status_code == 200
            assert response.json() == {"object": "echo", "method": method, "target": "/v1/files/file-1/content?limit=2"}
    assert [r.method for r in fake.received] == ["GET", "POST", "DELETE", "PUT", "PATCH"]
    assert fake.received[1].body == b"payload"


def test_embeddings_and_models_with_sdk(proxy, fake):
    fake.queue(JsonReply({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}],
                          "model": "e", "usage": {"prompt_tokens": 1, "total_tokens": 1}}))
    result = proxy.client().embeddings.create(model="e", input="hello", encoding_format="float")
    assert result.data[0].embedding == [0.5, 0.25]
    assert fake.received[0].target == "/v1/embeddings"
    assert json.loads(fake.received[0].body)["input"] == "hello"


def test_large_passthrough_body_streams_with_its_length(proxy, fake):
    payload = bytes(range(256)) * 8192  # 2 MiB of binary
    with proxy.http() as http:
        response = http.post("/v1/files", content=payload, headers={"content-type": "application/octet-stream"})
    assert response.status_code == 200
    assert fake.received[0].body == payload


def test_chunked_passthrough_body(proxy, fake):
    def parts():
        for i in range(5):
            yield f"part{i};".encode()

    with proxy.http() as http:
        assert http.post("/v1/uploads/x/parts", content=parts()).status_code == 200
    assert fake.received[0].body == b"part0;part1;part2;part3;part4;"


def test_gzip_response_passes_consistently(proxy, fake):
    fake.queue(JsonReply({"object": "list", "data": []}, compress=True))
    result = proxy.client().models.list()
    assert result.data == []
    fake.queue(JsonReply({"object": "list", "data": []}, compress=True))
    with proxy.http() as http:
        raw = http.get("/v1/models")
    assert raw.headers["content-encoding"] == "gzip"
    assert raw.json() == {"object": "list", "data": []}


def test_paths_outside_v1_and_traversal_are_404(proxy, fake):
    with proxy.http() as http:
        for path in ("/admin", "/v2/chat/completions", "/v1/../admin", "/v1/%2e%2e/admin", "/"):
            response = http.get(path)
            assert response.status_code == 404, path
            assert response.json()["error"]["code"] == "not_found"
    assert fake.received == []


def test_upstream_cannot_be_redirected(proxy, fake):
    with proxy.http() as http:
        http.post("/v1/chat/completions", json={"model": "http://evil.example/v1", "messages": []},
                  headers={"x-upstream-url": "http://evil.example", "host": "evil.example"})
    # The configured upstream got it (an unknown header is just forwarded, never obeyed).
    assert len(fake.received) == 1
    assert fake.received[0].header("host") == f"127.0.0.1:{fake.port}"


def test_sdk_streaming_sync_and_async(proxy, fake):
    stream = proxy.client().chat.completions.create(model="m", stream=True,
                                                    messages=[{"role": "user", "content": "hi"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Hello from upstream"

    async def run() -> str:
        client = proxy.async_client()
        text = ""
        async for chunk in await client.chat.completions.create(
                model="m", stream=True, messages=[{"role": "user", "content": "hi"}]):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        await client.close()
        return text

    assert asyncio.run(run()) == "Hello from upstream"


def test_sdk_tool_calls_json_and_stream(proxy, fake):
    calls = [{"id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"id": "call_b", "name": "get_time", "arguments": '{"tz": "CET"}'}]
    fake.queue(JsonReply(completion(None, tool_calls=calls)))
    message = proxy.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "weather?"}]).choices[0].message
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == \
        [(c["id"], c["name"], c["arguments"]) for c in calls]
    fake.queue(SSEReply(stream_events("", tool_calls=calls)))
    with proxy.client().chat.completions.stream(model="m", messages=[{"role": "user", "content": "w"}]) as stream:
        final = stream.get_final_completion()
    assert [(c.id, c.function.arguments) for c in final.choices[0].message.tool_calls] == \
        [("call_a", '{"city": "Paris"}'), ("call_b", '{"tz": "CET"}')]


def test_sse_response_headers(proxy, fake):
    with proxy.http() as http:
        with http.stream("POST", "/v1/chat/completions",
                         json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}) as r:
            body = r.read()
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["x-accel-buffering"] == "no"
    assert body == b"".join(stream_events())


def test_stream_request_answered_with_json_is_forwarded_as_json(proxy, fake):
    fake.queue(JsonReply(completion("not streamed")))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions",
                             json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    assert response.headers["content-type"] == "application/json"
    assert response.json() == completion("not streamed")


def test_healthz_readyz_metrics(proxy):
    with proxy.http() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").status_code == 200
        http.post("/v1/chat/completions", json={"model": "m", "messages": []})
        metrics = http.get("/metrics").text
    assert 'memproxy_requests_total{outcome="status_200",path="/chat/completions"} 1.0' in metrics


def test_client_errors_are_not_retried_by_proxy(proxy, fake):
    fake.queue(JsonReply({"error": {"message": "bad", "type": "invalid_request_error", "param": "x",
                                    "code": "invalid_value"}}, status=400))
    try:
        proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    except openai.BadRequestError as exc:
        assert exc.code == "invalid_value" and exc.param == "x"
    else:
        raise AssertionError("expected BadRequestError")
    assert len(fake.received) == 1


def test_http_client_can_use_the_proxy_with_keepalive(proxy, fake):
    with httpx.Client(base_url=proxy.url) as http:
        for _ in range(20):
            assert http.post("/v1/chat/completions", json={"model": "m", "messages": []}).status_code == 200
    assert len(fake.received) == 20


def test_provider_cookies_never_ride_on_other_requests(proxy, fake):
    fake.queue(JsonReply(completion(), headers=[("set-cookie", "session=alice-secret; Path=/")]))
    with proxy.http() as http:
        first = http.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert first.headers["set-cookie"] == "session=alice-secret; Path=/"  # the client still gets it
    with proxy.http() as other_client:
        other_client.post("/v1/chat/completions", json={"model": "m", "messages": []})
    assert fake.received[1].header("cookie") is None
