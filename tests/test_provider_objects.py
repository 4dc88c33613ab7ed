"""Provider objects are kept per user where memproxy's key serves several users (docs/auth.md).

In api-keys mode every user shares memproxy's upstream key, so the provider would answer
bob about alice's responses, conversations and files. A real proxy (two of them on one
store for the cross-process case), the official clients and the recording fake upstream:
what each user gets, and what reaches the provider.
"""

from __future__ import annotations

import gzip
import json
import logging
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.endpoint import provider_objects
from tests.api_helpers import sign
from tests.fake_responses import call_item, message_item, model_round, output, reasoning_item, response, stream
from tests.fake_upstream import DONE, JsonReply, SSEReply, chunk, completion

UPSTREAM_KEY = "sk-upstream-own-key-0001"
ANTHROPIC_KEY = "sk-ant-upstream-own-0002"
ALICE_KEY = "mp-alice-key-7f3e9a"
BOB_KEY = "mp-bob-key-c41d22"
API_KEYS = [{"key": ALICE_KEY, "user": "alice"}, {"key": BOB_KEY, "user": "bob"}]


def settings(fake: Any, tmp_path: Any, **extra: Any) -> dict[str, Any]:
    return {"auth__mode": "api-keys", "auth__api_keys": API_KEYS, "upstream__api_key": UPSTREAM_KEY,
            "upstream__anthropic_api_key": ANTHROPIC_KEY, "upstream__anthropic_base_url": fake.url,
            "store__url": f"sqlite:///{tmp_path}/shared.db", "memory__commit_timeout_ms": 5000, **extra}


@pytest.fixture
def keyed(make_proxy: Any, fake: Any, tmp_path: Any) -> Any:
    return make_proxy(**settings(fake, tmp_path))


def sdk(proxy: Any, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)


def http(proxy: Any, key: str) -> httpx.Client:
    return httpx.Client(base_url=proxy.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def not_found(response: httpx.Response, message: str, param: str | None = None) -> None:
    assert response.status_code == 404, response.text
    assert response.json() == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                         "code": "provider_object_not_found"}}
    assert response.headers["x-memory-proxy-error"] == "provider_object_not_found"


def test_a_response_reaches_only_the_user_who_created_it(keyed: Any, fake: Any) -> None:
    fake.queue(JsonReply(response(output("first"), "resp_alice_json")),
               SSEReply(stream(output("second"), "resp_alice_stream")))
    alice, bob = sdk(keyed, ALICE_KEY), sdk(keyed, BOB_KEY)
    assert alice.responses.create(model="m", input="hello").id == "resp_alice_json"
    with alice.responses.create(model="m", input="again", stream=True) as events:
        assert [e.response.id for e in events if e.type == "response.completed"] == ["resp_alice_stream"]
    fake.received.clear()
    for taken in ("resp_alice_json", "resp_alice_stream", "resp_never_seen"):
        with pytest.raises(openai.NotFoundError) as refused:
            bob.responses.create(model="m", input="what did alice say?", previous_response_id=taken)
        assert refused.value.body == {"message": f"Response with id '{taken}' not found.",
                                      "type": "invalid_request_error", "param": "previous_response_id",
                                      "code": "provider_object_not_found"}
        with http(keyed, BOB_KEY) as client:
            not_found(client.get(f"/v1/responses/{taken}"), f"Response with id '{taken}' not found.")
            not_found(client.get(f"/v1/responses/{taken}/input_items"), f"Response with id '{taken}' not found.")
            not_found(client.delete(f"/v1/responses/{taken}"), f"Response with id '{taken}' not found.")
    assert fake.received == []
    # Its creator reaches it, through any path; a continuation is recorded as hers too.
    fake.queue(JsonReply(response(output("third"), "resp_alice_next")))
    assert alice.responses.create(model="m", input="go on", previous_response_id="resp_alice_json").id \
        == "resp_alice_next"
    with http(keyed, ALICE_KEY) as client:
        assert client.get("/v1/responses/resp_alice_stream/input_items").status_code == 200
        assert client.get("/v1/responses/resp_alice_next").status_code == 200
    assert [(r.method, r.target) for r in fake.received] == [
        ("POST", "/v1/responses"), ("GET", "/v1/responses/resp_alice_stream/input_items"),
        ("GET", "/v1/responses/resp_alice_next")]
    assert fake.received[0].json()["previous_response_id"] == "resp_alice_json"


def test_conversations_and_files_reach_only_their_creator(keyed: Any, fake: Any) -> None:
    fake.queue(JsonReply({"id": "conv_alice", "object": "conversation"}),
               JsonReply({"id": "file-alice", "object": "file", "purpose": "user_data"}))
    with http(keyed, ALICE_KEY) as alice, http(keyed, BOB_KEY) as bob:
        assert alice.post("/v1/conversations", json={}).json()["id"] == "conv_alice"
        upload = alice.post("/v1/files", data={"purpose": "user_data"}, files={"file": ("a.txt", b"secret")})
        assert upload.json()["id"] == "file-alice"
        fake.received.clear()
        not_found(bob.get("/v1/conversations/conv_alice/items"), "Conversation with id 'conv_alice' not found.")
        not_found(bob.post("/v1/conversations/conv_alice/items", json={"items": []}),
                  "Conversation with id 'conv_alice' not found.")
        not_found(bob.get("/v1/files/file-alice/content"), "File with id 'file-alice' not found.")
        not_found(bob.get("/v1/files/file%2Dalice"), "File with id 'file-alice' not found.")
        not_found(bob.post("/v1/responses", json={"model": "m", "input": "hi", "conversation": "conv_alice"}),
                  "Conversation with id 'conv_alice' not found.")
        not_found(bob.post("/v1/responses", json={"model": "m", "input": "hi", "conversation": {"id": "conv_alice"}}),
                  "Conversation with id 'conv_alice' not found.")
        file_part = {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-alice"}}]}
        not_found(bob.post("/v1/chat/completions", json={"model": "m", "messages": [file_part]}),
                  "File with id 'file-alice' not found.")
        # A key written escaped, or twice, names the file all the same.
        escaped = b'{"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", ' \
                  b'"file\\u005fid": "file-mine", "file_id": "file-alice"}]}]}'
        not_found(bob.post("/v1/responses", content=escaped, headers={"content-type": "application/json"}),
                  "File with id 'file-mine' not found.")
        assert fake.received == []
        assert alice.get("/v1/conversations/conv_alice/items").status_code == 200
        assert alice.get("/v1/files/file-alice/content").status_code == 200
        assert alice.post("/v1/chat/completions", json={"model": "m", "messages": [file_part]}).status_code == 200
    assert [(r.method, r.target) for r in fake.received] == [
        ("GET", "/v1/conversations/conv_alice/items"), ("GET", "/v1/files/file-alice/content"),
        ("POST", "/v1/chat/completions")]


def test_the_messages_wire_refuses_in_its_own_shape(keyed: Any, fake: Any) -> None:
    fake.queue(JsonReply({"id": "file_ant_alice", "type": "file", "filename": "a.txt"}))
    with http(keyed, ALICE_KEY) as alice:
        created = alice.post("/v1/files", headers={"anthropic-version": "2023-06-01",
                                                   "anthropic-beta": "files-api-2025-04-14"},
                             files={"file": ("a.txt", b"secret")})
        assert created.json()["id"] == "file_ant_alice"
    bob = anthropic.Anthropic(base_url=keyed.url, api_key=BOB_KEY, max_retries=0)
    document = {"type": "document", "source": {"type": "file", "file_id": "file_ant_alice"}}
    with pytest.raises(anthropic.NotFoundError) as refused:
        bob.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": [document]}])
    assert refused.value.body == {"type": "error", "error": {"type": "not_found_error",
                                                             "message": "File with id 'file_ant_alice' not found."}}
    assert [r.target for r in fake.received] == ["/v1/files"]


UNATTRIBUTED = [("POST", "/v1/threads"), ("GET", "/v1/threads/thread_1/messages"), ("POST", "/v1/batches"),
                ("GET", "/v1/vector_stores"), ("GET", "/v1/files"), ("GET", "/v1/chat/completions"),
                ("GET", "/v1/chat/completions/chatcmpl-1"), ("POST", "/v1/uploads"),
                ("DELETE", "/v1/models/ft:gpt-4o:acme:1"), ("POST", "/v1/messages/batches"),
                ("POST", "/v1/realtime/client_secrets")]


def test_endpoints_whose_objects_cannot_be_attributed_are_refused(keyed: Any, fake: Any) -> None:
    with http(keyed, ALICE_KEY) as alice:
        for method, path in UNATTRIBUTED:
            refused = alice.request(method, path, json={} if method == "POST" else None)
            assert refused.status_code == 403, (path, refused.text)
            message = (f"{method} {path} reaches provider objects memproxy cannot attribute to a user; "
                       "auth.provider_objects: shared opens it where one tenant uses memproxy")
            if path.startswith("/v1/messages"):  # the Messages wire's own shape
                assert refused.json() == {"type": "error", "error": {"type": "permission_error", "message": message}}
            else:
                assert refused.json()["error"] == {"message": message, "type": "permission_error", "param": None,
                                                   "code": "provider_objects_per_user"}
        assert alice.get("/v1/models").status_code == 200
        assert alice.get("/v1/models/gpt-4o").status_code == 200
        assert alice.post("/v1/embeddings", json={"model": "e", "input": "x"}).status_code == 200
    assert [r.target for r in fake.received] == ["/v1/models", "/v1/models/gpt-4o", "/v1/embeddings"]


def test_a_single_tenant_deployment_opens_them(make_proxy: Any, fake: Any, tmp_path: Any) -> None:
    proxy = make_proxy(**settings(fake, tmp_path, auth__provider_objects="shared"))
    with http(proxy, BOB_KEY) as bob:
        for method, path in [*UNATTRIBUTED, ("GET", "/v1/responses/resp_someone"),
                             ("GET", "/v1/files/file-someone/content")]:
            assert bob.request(method, path, json={} if method == "POST" else None).status_code == 200, path
    assert len(fake.received) == len(UNATTRIBUTED) + 2


def test_ownership_holds_across_processes(make_proxy: Any, fake: Any, tmp_path: Any) -> None:
    one = make_proxy(**settings(fake, tmp_path))
    other = make_proxy(**settings(fake, tmp_path))
    fake.queue(JsonReply(response(output("first"), "resp_made_on_one")))
    assert sdk(one, ALICE_KEY).responses.create(model="m", input="hello").id == "resp_made_on_one"
    with http(other, BOB_KEY) as bob, http(other, ALICE_KEY) as alice:
        not_found(bob.get("/v1/responses/resp_made_on_one"), "Response with id 'resp_made_on_one' not found.")
        assert alice.get("/v1/responses/resp_made_on_one").status_code == 200


def test_trusted_mode_and_a_clients_own_key_keep_no_ownership(make_proxy: Any, fake: Any, tmp_path: Any) -> None:
    # Without memproxy's own key, each user's credentials reach their own provider account.
    proxy = make_proxy(store__url=f"sqlite:///{tmp_path}/m.db")
    with httpx.Client(base_url=proxy.url, headers={"X-Memory-User": "bob"}) as bob:
        assert bob.get("/v1/responses/resp_anyone").status_code == 200
        assert bob.post("/v1/threads", json={}).status_code == 200
    assert json.loads(fake.received[0].body or b"{}") == {}


@pytest.mark.parametrize(("method", "path", "verdict"), [
    ("POST", "/responses", ("creates", "response", "")), ("POST", "/files", ("creates", "file", "")),
    ("GET", "/files", ("unattributed", "", "")), ("GET", "/responses/resp%5F1", ("names", "response", "resp_1")),
    ("POST", "/responses/input_tokens", ("stateless", "", "")), ("GET", "/models/gpt-4o", ("stateless", "", "")),
    ("POST", "/models/gemini-2.5-pro:streamGenerateContent", ("stateless", "", "")),
    ("POST", "/models/gemini-2.5-pro:tuneModel", ("unattributed", "", "")),
    ("DELETE", "/models/ft:gpt-4o:acme:1", ("unattributed", "", "")),
    ("POST", "/responses/compact", ("creates", "response", "")), ("GET", "/containers", ("unattributed", "", "")),
    ("GET", "/containers/cntr_1/files/cfile_1/content", ("names", "container", "cntr_1")),
    ("POST", "//responses/resp_1", ("unattributed", "", "")), ("GET", "/Files/file-1", ("unattributed", "", "")),
])
def test_what_a_path_does_with_provider_objects(method: str, path: str, verdict: tuple[str, str, str]) -> None:
    found = provider_objects.access(method, path)
    assert (found.verdict, found.kind, found.object_id) == verdict


def test_references_in_a_body() -> None:
    body = {"previous_response_id": "resp_1", "conversation": {"id": "conv_1"},
            "metadata": {"conversation": "not-an-id", "previous_response_id": "nor-this"},
            "tools": [{"type": "file_search", "vector_store_ids": ["vs_1", "vs_2"]},
                      {"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["file-2"]}}],
            "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}
    assert sorted(provider_objects.references(json.dumps(body).encode()).named) == [
        ("conversation", "conv_1"), ("file", "file-1"), ("file", "file-2"), ("response", "resp_1"),
        ("vector_store", "vs_1"), ("vector_store", "vs_2")]
    assert provider_objects.references(b'{"input": "my conversation about file_id"}') == provider_objects.References([])
    items = {"input": [{"type": "item_reference", "id": "msg_1"}, {"id": "rs_2"}, {"role": "user", "content": "x"},
                       {"type": "message", "id": "msg_3", "role": "assistant", "content": []}],
             "metadata": {"input": [{"id": "not-an-item"}]}}
    assert provider_objects.references(json.dumps(items).encode()).named == [("item", "msg_1"), ("item", "rs_2"),
                                                                             ("item", "msg_3")]
    cited = {"input": [{"type": "code_interpreter_call", "id": "ci_1", "container_id": "cntr_1"},
                       {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x",
                        "annotations": [{"type": "container_file_citation", "container_id": "cntr_1",
                                         "file_id": "cfile_1"}]}]}]}
    assert sorted(provider_objects.references(json.dumps(cited).encode()).named) == [
        ("container", "cntr_1"), ("container", "cntr_1"), ("file", "cfile_1"), ("item", "ci_1")]
    with pytest.raises(provider_objects.Unreadable):
        provider_objects.references(b'{"file_id": ')


def test_signed_mode_keeps_them_per_user_where_memproxys_key_goes(make_proxy: Any, fake: Any, tmp_path: Any) -> None:
    secret = "signing-secret-for-tests-32-bytes-or-more"
    proxy = make_proxy(auth__mode="signed", auth__signing_secret=secret, upstream__api_key=UPSTREAM_KEY,
                       store__url=f"sqlite:///{tmp_path}/m.db")

    def client(user: str) -> httpx.Client:
        token = sign({"sub": user, "exp": int(time.time()) + 300}, secret)
        return httpx.Client(base_url=proxy.url, headers={"X-Memory-Scope-Token": token}, timeout=30)

    fake.queue(JsonReply({"id": "conv_signed", "object": "conversation"}))
    with client("alice") as alice, client("bob") as bob:
        assert alice.post("/v1/conversations", json={}).json()["id"] == "conv_signed"
        not_found(bob.get("/v1/conversations/conv_signed"), "Conversation with id 'conv_signed' not found.")
        assert alice.get("/v1/conversations/conv_signed").status_code == 200
    assert [r.header("authorization") for r in fake.received] == [f"Bearer {UPSTREAM_KEY}"] * 2


def test_tools_mode_records_the_id_the_client_sees(make_proxy: Any, fake: Any, tmp_path: Any) -> None:
    proxy = make_proxy(**settings(fake, tmp_path, extraction__from_roles=[]))
    fake.queue(model_round([call_item("call_q1", "query_memory", json.dumps({"query": "editor"}))], "resp_r1"),
               model_round([message_item("Nothing known.")], "resp_r2"))
    alice = openai.OpenAI(base_url=proxy.url + "/v1", api_key=ALICE_KEY, max_retries=0,
                          default_headers={"X-Memory-Mode": "tools"})
    with alice.responses.stream(model="m", input="which editor do I like?") as events:
        assert events.get_final_response().id == "resp_r1"
    with http(proxy, BOB_KEY) as bob:
        not_found(bob.get("/v1/responses/resp_r1"), "Response with id 'resp_r1' not found.")
    with http(proxy, ALICE_KEY) as client:
        assert client.get("/v1/responses/resp_r1").status_code == 200


def test_a_busy_store_does_not_hold_a_creations_first_event(make_proxy: Any, fake: Any, tmp_path: Any) -> None:
    # Another process holds the SQLite file's write lock: recording who created the response
    # waits for it, but the client's stream does not wait longer than memory.commit_timeout_ms.
    # Its creator's next request, on this process, waits for the record rather than be refused;
    # the id is its creator's once the lock is free.
    proxy = make_proxy(**settings(fake, tmp_path, memory__commit_timeout_ms=100))
    fake.queue(SSEReply(stream(output("hi"), "resp_while_busy")))
    alice = openai.OpenAI(base_url=proxy.url + "/v1", api_key=ALICE_KEY, max_retries=0,
                          default_headers={"X-Memory-Mode": "off"})
    holder = sqlite3.connect(tmp_path / "shared.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with ThreadPoolExecutor(1) as pool, http(proxy, ALICE_KEY) as client:
        try:
            started = time.monotonic()
            with alice.responses.create(model="m", input="hello", stream=True) as events:
                first = next(iter(events))
                waited = time.monotonic() - started
                assert first.type == "response.created" and first.response.id == "resp_while_busy"
                assert waited < 1.5, waited
                list(events)
            follow_up = pool.submit(client.get, "/v1/responses/resp_while_busy")
            time.sleep(0.5)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert follow_up.result(timeout=20).status_code == 200
    with http(proxy, BOB_KEY) as bob:
        not_found(bob.get("/v1/responses/resp_while_busy"), "Response with id 'resp_while_busy' not found.")


def test_listing_items_recorded_before_takes_no_write_lock(make_proxy: Any, fake: Any, tmp_path: Any) -> None:
    # A GET creates nothing: listing a conversation's items already recorded (added through
    # memproxy) only reads who created them. It answers at once while another process holds the
    # SQLite file's write lock, where recording them again waited for the lock up to
    # memory.commit_timeout_ms (10 s here). An item first seen in a listing is still recorded.
    proxy = make_proxy(**settings(fake, tmp_path, memory__commit_timeout_ms=10000))
    added = {**message_item("my locker code is 4417"), "id": "msg_added_before"}
    initial = {**message_item("the first thing I said"), "id": "msg_listed_after"}

    def listing(*items: dict[str, Any]) -> JsonReply:
        return JsonReply({"object": "list", "data": list(items), "first_id": items[0]["id"],
                          "last_id": items[-1]["id"], "has_more": False})

    fake.queue(JsonReply({"id": "conv_busy", "object": "conversation"}), listing(added), listing(added),
               listing(initial, added))
    with http(proxy, ALICE_KEY) as alice:
        assert alice.post("/v1/conversations", json={}).status_code == 200
        assert alice.post("/v1/conversations/conv_busy/items", json={"items": [
            {"role": "user", "content": "my locker code is 4417"}]}).status_code == 200
        holder = sqlite3.connect(tmp_path / "shared.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            started = time.monotonic()
            assert alice.get("/v1/conversations/conv_busy/items").json()["data"] == [added]
            waited = time.monotonic() - started
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert waited < 5, waited
        listed = alice.get("/v1/conversations/conv_busy/items").json()["data"]
        assert [item["id"] for item in listed] == ["msg_listed_after", "msg_added_before"]
    with http(proxy, BOB_KEY) as bob:
        for item in ("msg_added_before", "msg_listed_after"):
            not_found(bob.post("/v1/responses", json={"model": "m", "input": [{"type": "item_reference", "id": item}]}),
                      f"Item with id '{item}' not found.")
    fake.queue(JsonReply(response(output("4417"), "resp_after_listing")))
    references = [{"type": "item_reference", "id": "msg_added_before"}, {"type": "item_reference",
                                                                         "id": "msg_listed_after"}]
    assert sdk(proxy, ALICE_KEY).responses.create(model="m", input=references).id == "resp_after_listing"


def test_a_reference_to_a_stored_item_is_refused(keyed: Any, fake: Any) -> None:
    # An input item may name an item of any stored response by id: another user's is refused,
    # typed or not, wherever the input list sits.
    fake.queue(JsonReply(response(output("the codeword is swordfish"), "resp_alice_item")))
    assert sdk(keyed, ALICE_KEY).responses.create(model="m", input="hello").id == "resp_alice_item"
    item = message_item("the codeword is swordfish")["id"]
    fake.received.clear()
    with http(keyed, BOB_KEY) as bob:
        for reference in ({"type": "item_reference", "id": item}, {"id": item}):
            not_found(bob.post("/v1/responses", json={"model": "m", "input": [reference]}),
                      f"Item with id '{item}' not found.")
            not_found(bob.post("/v1/responses/input_tokens", json={"model": "m", "input": [reference]}),
                      f"Item with id '{item}' not found.")
            not_found(bob.post("/v1/conversations", json={"items": [reference]}), f"Item with id '{item}' not found.")
    assert fake.received == []
    # Items given whole without their ids (a client's own history) go as usual.
    with http(keyed, BOB_KEY) as bob:
        history = [{"role": "user", "content": "hi"}, without_id(message_item("hello bob"))]
        assert bob.post("/v1/responses", json={"model": "m", "input": history}).status_code == 200
    assert [r.target for r in fake.received] == ["/v1/responses"]


def alices_items(tag: str) -> list[dict[str, Any]]:
    """An answer's output items, with ids of their own: reasoning with its encrypted content,
    the message, a function call."""
    return [{**reasoning_item("weighing it"), "id": f"rs_alice_{tag}", "encrypted_content": f"gAAAA-{tag}"},
            {**message_item(f"the codeword is swordfish ({tag})"), "id": f"msg_alice_{tag}"},
            {**call_item(f"call_{tag}"), "id": f"fc_alice_{tag}"}]


def test_items_given_whole_reach_only_the_user_whose_response_made_them(keyed: Any, fake: Any) -> None:
    # The provider reads an input item given whole by its id (a reasoning item is the stored
    # one, decrypted): bob sending alice's items, or ids memproxy never saw created, is
    # refused as a reference to them is; alice sends back what her answers gave her, JSON or
    # streamed, and an item_reference to it.
    compaction = {"type": "compaction", "id": "cmp_alice", "encrypted_content": "gAAAA-compacted"}
    fake.queue(JsonReply(response(alices_items("json"), "resp_alice_json")),
               SSEReply(stream(alices_items("stream"), "resp_alice_stream")),
               JsonReply({"id": "resp_alice_compact", "object": "response.compaction", "created_at": 1700000000,
                          "output": [compaction], "usage": None}))
    alice = sdk(keyed, ALICE_KEY)
    answered = alice.responses.create(model="m", input="hello")
    with alice.responses.create(model="m", input="again", stream=True) as events:
        streamed = [e.response for e in events if e.type == "response.completed"][0]
    with http(keyed, ALICE_KEY) as client:
        assert client.post("/v1/responses/compact", json={"model": "m", "input": "hello"}).json()["output"] == \
            [compaction]
    given = [item.model_dump(exclude_none=True) for item in (*answered.output, *streamed.output)]
    assert [item["id"] for item in given] == [f"{kind}_alice_{tag}" for tag in ("json", "stream")
                                             for kind in ("rs", "msg", "fc")]
    fake.received.clear()
    never_seen = {"type": "reasoning", "id": "rs_never_seen", "summary": [], "encrypted_content": "gAAAA-x"}
    with http(keyed, BOB_KEY) as bob:
        for item in (*given, compaction, never_seen):
            for path in ("/v1/responses", "/v1/responses/input_tokens"):
                not_found(bob.post(path, json={"model": "m", "input": [{"role": "user", "content": "hi"}, item]}),
                          f"Item with id '{item['id']}' not found.")
            not_found(bob.post("/v1/conversations", json={"items": [item]}), f"Item with id '{item['id']}' not found.")
    with pytest.raises(openai.NotFoundError):
        sdk(keyed, BOB_KEY).responses.create(model="m", input=[*given[:2], {"role": "user", "content": "go on"}])
    assert fake.received == []
    outputs = [{"type": "function_call_output", "call_id": f"call_{tag}", "output": "42"} for tag in ("json", "stream")]
    with http(keyed, ALICE_KEY) as client:
        assert client.post("/v1/responses", json={"model": "m", "input": [
            {"role": "user", "content": "hello"}, *given, *outputs, compaction,
            {"type": "item_reference", "id": "msg_alice_json"}]}).status_code == 200
    assert [r.target for r in fake.received] == ["/v1/responses"]
    assert json.loads(fake.received[0].body or b"{}")["input"][1:7] == given


def without_id(item: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in item.items() if key != "id"}


def container_answer(response_id: str, container: str, file: str) -> list[dict[str, Any]]:
    """A code interpreter's answer: its call in `container`, and a message citing the file it wrote."""
    citation = {"type": "container_file_citation", "container_id": container, "file_id": file,
                "filename": "plot.png", "start_index": 0, "end_index": 8}
    message = message_item("plot.png is ready")
    message["content"][0]["annotations"] = [citation]
    return [{"type": "code_interpreter_call", "id": f"ci_{response_id}", "container_id": container,
             "code": "plot()", "outputs": None, "status": "completed"}, {**message, "id": f"msg_{response_id}"}]


@pytest.mark.parametrize("streamed", [False, True])
def test_a_container_and_the_files_an_answer_cites_are_its_creators(keyed: Any, fake: Any, streamed: bool) -> None:
    # A code interpreter's container and the files it wrote there come with the answer: its
    # creator downloads a cited file and sends the cited answer back; bob gets neither.
    items = container_answer("resp_ci", "cntr_alice", "cfile_alice")
    fake.queue(SSEReply(stream(items, "resp_ci")) if streamed else JsonReply(response(items, "resp_ci")))
    alice = sdk(keyed, ALICE_KEY)
    tools: Any = [{"type": "code_interpreter", "container": {"type": "auto"}}]
    if streamed:
        with alice.responses.create(model="m", input="plot it", tools=tools, stream=True) as events:
            answer = [e.response for e in events if e.type == "response.completed"][0]
    else:
        answer = alice.responses.create(model="m", input="plot it", tools=tools)
    cited = answer.output[1].model_dump(exclude_none=True)
    assert cited["content"][0]["annotations"][0]["file_id"] == "cfile_alice"
    fake.received.clear()
    with http(keyed, BOB_KEY) as bob:
        for path in ("/v1/containers/cntr_alice", "/v1/containers/cntr_alice/files",
                     "/v1/containers/cntr_alice/files/cfile_alice/content"):
            not_found(bob.get(path), "Container with id 'cntr_alice' not found.")
        not_found(bob.post("/v1/responses", json={"model": "m", "input": [{"role": "user", "content": "hi"},
                                                                         without_id(cited)]}),
                  "Container with id 'cntr_alice' not found.")
        not_found(bob.post("/v1/responses", json={"model": "m", "input": "hi",
                                                  "tools": [{"type": "code_interpreter", "container": "cntr_alice"}]}),
                  "Container with id 'cntr_alice' not found.")
    assert fake.received == []
    fake.queue(JsonReply(b"\x89PNG plot", content_type="image/png"))
    content = alice.containers.files.content.retrieve("cfile_alice", container_id="cntr_alice")
    assert content.read() == b"\x89PNG plot"
    assert alice.responses.create(model="m", input=[{"role": "user", "content": "plot it"}, cited,
                                                    {"role": "user", "content": "and again"}],
                                  tools=[{"type": "code_interpreter", "container": "cntr_alice"}]).status == "completed"
    assert [r.target for r in fake.received] == ["/v1/containers/cntr_alice/files/cfile_alice/content",
                                                 "/v1/responses"]


def test_gemini_files_and_cached_contents_named_in_a_body_are_refused(make_proxy: Any, fake: Any,
                                                                       tmp_path: Any) -> None:
    # Gemini names a stored file by its URI and a cache by its name; memproxy's Gemini key
    # holds every user's (and the operator's), and no upload or cache is made through memproxy.
    proxy = make_proxy(**settings(fake, tmp_path, upstream__gemini_base_url=fake.url.removesuffix("/v1"),
                                  upstream__gemini_api_key="gemini-upstream-own-0003"))
    uri = "https://generativelanguage.googleapis.com/v1beta/files/abc123"
    file_part = {"fileData": {"mimeType": "application/pdf", "fileUri": uri}}
    bodies = [({"contents": [{"role": "user", "parts": [file_part]}]}, "File with id 'abc123' not found."),
              ({"contents": [{"role": "user", "parts": [{"file_data": {"file_uri": uri}}]}]},
               "File with id 'abc123' not found."),
              ({"contents": [{"role": "user", "parts": [{"fileData": {"fileUri": "files/abc123"}}]}]},
               "File with id 'abc123' not found."),
              ({"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "cachedContent": "cachedContents/c1"},
               "Cached content with id 'cachedContents/c1' not found.")]
    with httpx.Client(base_url=proxy.url, headers={"x-goog-api-key": BOB_KEY}, timeout=30) as bob:
        for body, message in bodies:
            refused = bob.post("/v1beta/models/gemini-2.5-flash:generateContent", json=body)
            assert refused.status_code == 404, refused.text
            assert message in refused.text
        # A file named by a URI of no stored file (a video's address) goes as sent.
        video = {"fileData": {"mimeType": "video/mp4", "fileUri": "https://www.youtube.com/watch?v=abc"}}
        fake.queue(JsonReply({"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}}]}))
        assert bob.post("/v1beta/models/gemini-2.5-flash:generateContent",
                        json={"contents": [{"role": "user", "parts": [video]}]}).status_code == 200
    assert [r.target for r in fake.received] == ["/v1beta/models/gemini-2.5-flash:generateContent"]


@pytest.mark.parametrize("objects", ["per-user", "shared"])
def test_a_gemini_upload_is_refused_per_user_and_passes_where_one_tenant_shares_the_key(
        make_proxy: Any, fake: Any, tmp_path: Any, objects: str) -> None:
    # The upload ends at an address Google gives, straight to Google: memproxy never sees the file
    # it makes, so cannot say whose it is.
    proxy = make_proxy(**settings(fake, tmp_path, upstream__gemini_base_url=fake.url.removesuffix("/v1"),
                                  upstream__gemini_api_key="gemini-upstream-own-0003",
                                  auth__provider_objects=objects))
    fake.queue(JsonReply({}, headers=[("x-goog-upload-url", f"{fake.url}/upload-session"),
                                      ("x-goog-upload-status", "active")]))
    with httpx.Client(base_url=proxy.url, headers={"x-goog-api-key": BOB_KEY}, timeout=30) as bob:
        got = bob.post("/upload/v1beta/files", headers={"x-goog-upload-protocol": "resumable",
                                                        "x-goog-upload-command": "start"},
                       json={"file": {"mimeType": "text/plain"}})
    if objects == "shared":
        assert got.status_code == 200 and got.headers["x-goog-upload-url"] == f"{fake.url}/upload-session"
        assert [(r.target, r.header("x-goog-api-key")) for r in fake.received] == [
            ("/upload/v1beta/files", "gemini-upstream-own-0003")]
        return
    assert got.status_code == 403
    assert got.json()["error"] == {
        "code": 403, "status": "PERMISSION_DENIED",
        "message": "POST /upload/v1beta/files reaches provider objects memproxy cannot attribute to a user; "
                   "auth.provider_objects: shared opens it where one tenant uses memproxy"}
    assert fake.received == []


def test_ids_an_output_item_merely_holds_claim_nothing(keyed: Any, fake: Any) -> None:
    """Only a code interpreter's container and a container file citation's ids are recorded: an MCP
    server's tool schema (the requester's own words) holding the same keys claims no file or store."""
    schema = {"type": "object", "properties": {"x": {"container_id": "vs_operator",
                                                    "type": "container_file_citation", "file_id": "file-operator"}}}
    listed = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "bobs",
              "tools": [{"name": "t", "input_schema": schema}]}
    body = response(output("hi"), "resp_bob")
    body["output"] = [listed, *body["output"]]
    fake.queue(JsonReply(body))
    with http(keyed, BOB_KEY) as bob:
        created = bob.post("/v1/responses", json={"model": "m", "input": "hi", "tools": [
            {"type": "mcp", "server_label": "bobs", "server_url": "https://bob.example/mcp"}]})
        assert created.status_code == 200
        fake.received.clear()
        not_found(bob.get("/v1/files/file-operator/content"), "File with id 'file-operator' not found.")
        searched = bob.post("/v1/responses", json={"model": "m", "input": "hi", "tools": [
            {"type": "file_search", "vector_store_ids": ["vs_operator"]}]})
        assert searched.status_code == 404 and searched.json()["error"]["code"] == "provider_object_not_found"
    assert fake.received == []


@pytest.mark.parametrize("encode", [
    pytest.param(lambda raw: (gzip.compress(raw), {"content-encoding": "gzip"}), id="gzip"),
    pytest.param(lambda raw: (raw.decode().encode("utf-16"), {}), id="utf-16"),
])
def test_a_body_memproxy_cannot_read_as_utf8_is_refused_not_forwarded(keyed: Any, fake: Any, encode: Any) -> None:
    """A compressed or UTF-16 body shows memproxy no id, yet the provider may decode it: 400."""
    fake.queue(JsonReply(response(output("first"), "resp_alice")))
    with http(keyed, ALICE_KEY) as alice, http(keyed, BOB_KEY) as bob:
        assert alice.post("/v1/responses", json={"model": "m", "input": "hello"}).status_code == 200
        fake.received.clear()
        content, headers = encode(json.dumps({"model": "m", "input": "hi", "previous_response_id": "resp_alice"}).encode())
        refused = bob.post("/v1/responses", content=content, headers={"content-type": "application/json", **headers})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "unreadable_body"
    assert fake.received == []


def spoken(audio_id: str) -> dict[str, Any]:
    """A chat completion asked to speak: its message carries the audio the provider keeps."""
    answer = completion("It is sunny.")
    answer["choices"][0]["message"]["audio"] = {"id": audio_id, "data": "UklGRg==", "expires_at": 1893456000,
                                                "transcript": "It is sunny."}
    return answer


def spoken_stream(audio_id: str) -> list[bytes]:
    return [chunk({"role": "assistant", "content": None}),
            chunk({"audio": {"id": audio_id, "transcript": "It is ", "data": "UklG", "expires_at": 1893456000}}),
            chunk({"audio": {"transcript": "sunny.", "data": "Rg=="}}), chunk({}, finish="stop"), DONE]


@pytest.mark.parametrize("streamed", [False, True])
def test_an_audio_answer_is_its_creators_to_send_back(keyed: Any, fake: Any, streamed: bool) -> None:
    # A spoken answer's audio is kept by the provider under memproxy's key, and a later turn names
    # it by id: alice sends hers back; bob, naming it, gets the 404 and nothing reaches the provider.
    fake.queue(SSEReply(spoken_stream("audio_alice")) if streamed else JsonReply(spoken("audio_alice")))
    alice = sdk(keyed, ALICE_KEY)
    asked: Any = {"model": "gpt-4o-audio-preview", "modalities": ["text", "audio"],
                  "audio": {"voice": "alloy", "format": "wav"},
                  "messages": [{"role": "user", "content": "weather?"}]}
    if streamed:
        with alice.chat.completions.create(**asked, stream=True) as chunks:
            said = [c.choices[0].delta.model_dump().get("audio") for c in chunks if c.choices]
        assert said[1]["id"] == "audio_alice"
    else:
        assert alice.chat.completions.create(**asked).choices[0].message.audio.id == "audio_alice"
    again: Any = {**asked, "messages": [*asked["messages"], {"role": "assistant", "audio": {"id": "audio_alice"}},
                                        {"role": "user", "content": "and tomorrow?"}]}
    fake.received.clear()
    with http(keyed, BOB_KEY) as bob:
        for named in ("audio_alice", "audio_never_seen"):
            body = {**again, "messages": [*asked["messages"], {"role": "assistant", "audio": {"id": named}}]}
            not_found(bob.post("/v1/chat/completions", json=body), f"Audio with id '{named}' not found.")
    assert fake.received == []
    fake.queue(JsonReply(completion("Rain.")))
    assert alice.chat.completions.create(**again).choices[0].message.content == "Rain."
    assert json.loads(fake.received[0].body)["messages"][1] == {"role": "assistant", "audio": {"id": "audio_alice"}}


def created_by(path: str, body: bytes) -> str | None:
    """What a body makes a call create, read from the document the references' check read."""
    return provider_objects.created_by_body(path, provider_objects.references(body, path).document)


def test_a_chat_completion_not_asked_to_speak_creates_nothing() -> None:
    asked = {"model": "m", "audio": {"voice": "alloy"}, "messages": [{"role": "user", "content": "modalities"}]}
    spoken = {**asked, "modalities": ["text", "audio"]}
    assert created_by("/chat/completions", json.dumps(asked).encode()) is None
    assert created_by("/chat/completions", json.dumps(spoken).encode()) == "audio"
    assert created_by("/responses", json.dumps(spoken).encode()) is None
    assert created_by("/chat/completions", json.dumps({**asked, "modalities": ["text"]}).encode()) is None
    assert created_by("/chat/completions", b'{"model": "m", "modalities": ["text"], "messages": []}') is None
    # Every way of writing the modality is read: escaped, as the provider decodes it.
    assert created_by("/chat/completions", b'{"modalities": ["text", "\\u0061udio"], "messages": []}') == "audio"
    assert created_by("/chat/completions", b'{"modalit\\u0069es": ["audio"], "messages": []}') == "audio"
    assert provider_objects.references(json.dumps(asked).encode(), "/chat/completions").named == []
    assert provider_objects.references(json.dumps(asked).encode()) == provider_objects.References([])


def test_items_added_to_a_conversation_or_listed_from_it_are_its_creators(keyed: Any, fake: Any) -> None:
    # Items added to alice's conversation, and those it was created with (listed), come back
    # with ids a later input names them by: alice's to reference, refused to bob.
    added = {**message_item("my locker code is 4417"), "id": "msg_added"}
    listed = {**message_item("the first thing I said"), "id": "msg_initial"}
    fake.queue(JsonReply({"id": "conv_items", "object": "conversation"}),
               JsonReply({"object": "list", "data": [added], "first_id": "msg_added", "last_id": "msg_added",
                          "has_more": False}),
               JsonReply({"object": "list", "data": [listed, added], "first_id": "msg_initial",
                          "last_id": "msg_added", "has_more": False}))
    with http(keyed, ALICE_KEY) as alice:
        assert alice.post("/v1/conversations", json={"items": [{"role": "user", "content": "hi"}]}).status_code == 200
        assert alice.post("/v1/conversations/conv_items/items",
                          json={"items": [{"role": "user", "content": "my locker code is 4417"}]}).status_code == 200
        assert alice.get("/v1/conversations/conv_items/items").json()["data"][0]["id"] == "msg_initial"
    fake.received.clear()
    with http(keyed, BOB_KEY) as bob:
        for item in ("msg_added", "msg_initial"):
            not_found(bob.post("/v1/responses", json={"model": "m", "input": [{"type": "item_reference", "id": item}]}),
                      f"Item with id '{item}' not found.")
    assert fake.received == []
    fake.queue(JsonReply(response(output("4417"), "resp_locker")))
    references = [{"type": "item_reference", "id": "msg_added"}, {"type": "item_reference", "id": "msg_initial"}]
    assert sdk(keyed, ALICE_KEY).responses.create(model="m", input=references).id == "resp_locker"
    assert json.loads(fake.received[0].body)["input"] == references


def test_a_responses_input_items_are_its_creators_once_listed(keyed: Any, fake: Any) -> None:
    # An input item sent without an id gets one from the provider, seen only when the response's
    # input items are listed: alice may then reference it, bob may not (nor an id never listed).
    typed = {"type": "message", "id": "msg_typed", "status": "completed", "role": "user",
             "content": [{"type": "input_text", "text": "my locker code is 4417"}]}
    fake.queue(JsonReply(response(output("Noted."), "resp_inputs")),
               JsonReply({"object": "list", "data": [typed], "first_id": "msg_typed", "last_id": "msg_typed",
                          "has_more": False}))
    alice = sdk(keyed, ALICE_KEY)
    assert alice.responses.create(model="m", input="my locker code is 4417").id == "resp_inputs"
    assert [item.id for item in alice.responses.input_items.list("resp_inputs")] == ["msg_typed"]
    fake.received.clear()
    with http(keyed, BOB_KEY) as bob:
        not_found(bob.get("/v1/responses/resp_inputs/input_items"), "Response with id 'resp_inputs' not found.")
        for item in ("msg_typed", "msg_never_listed"):
            not_found(bob.post("/v1/responses", json={"model": "m", "input": [{"type": "item_reference", "id": item}]}),
                      f"Item with id '{item}' not found.")
        not_found(bob.post("/v1/responses", json={"model": "m", "input": [typed]}), "Item with id 'msg_typed' not found.")
    with http(keyed, ALICE_KEY) as client:
        not_found(client.post("/v1/responses", json={"model": "m", "input": [
            {"type": "item_reference", "id": "msg_never_listed"}]}), "Item with id 'msg_never_listed' not found.")
    assert fake.received == []
    fake.queue(JsonReply(response(output("4417"), "resp_recalled")), JsonReply(response(output("4417"), "resp_whole")))
    reference = [{"type": "item_reference", "id": "msg_typed"}]
    assert alice.responses.create(model="m", input=reference).id == "resp_recalled"
    assert alice.responses.create(model="m", input=[typed]).id == "resp_whole"
    assert [json.loads(each.body)["input"] for each in fake.received] == [reference, [typed]]


def test_a_response_holding_generated_images_is_recorded_whatever_its_size(keyed: Any, fake: Any) -> None:
    # An image generation's output holds the image in base64: a JSON answer of megabytes, whose
    # id must still be recorded (it once was relayed unrecorded, refused to its creator after).
    image = {"type": "image_generation_call", "id": "ig_big", "status": "completed", "result": "iVBOR" * 1_200_000}
    fake.queue(JsonReply(response([image, message_item("here it is")], "resp_image")))
    alice = sdk(keyed, ALICE_KEY)
    made = alice.responses.create(model="m", input="draw a cat", tools=[{"type": "image_generation"}])
    assert made.id == "resp_image" and len(made.output[0].model_dump()["result"]) == 6_000_000
    fake.received.clear()
    with http(keyed, BOB_KEY) as bob:
        not_found(bob.get("/v1/responses/resp_image"), "Response with id 'resp_image' not found.")
        not_found(bob.post("/v1/responses", json={"model": "m", "input": [{"type": "item_reference", "id": "ig_big"}]}),
                  "Item with id 'ig_big' not found.")
    assert fake.received == []
    fake.queue(JsonReply(response(output("a grey one"), "resp_next")))
    assert alice.responses.create(model="m", input="and a grey one", previous_response_id="resp_image").id == "resp_next"
    assert json.loads(fake.received[0].body)["previous_response_id"] == "resp_image"


@pytest.mark.parametrize("body", [
    {"model": "m", "input": "hi", "metadata": {"audio": "on"}},
    {"model": "m", "input": "hi", "prompt": {"id": "pmpt_1", "variables": {"audio": {"id": "not-a-stored-audio"}}}},
])
def test_a_key_named_audio_outside_a_chat_completion_names_nothing(keyed: Any, fake: Any, body: Any) -> None:
    fake.queue(JsonReply(response(output("ok"), "resp_meta")))
    with http(keyed, ALICE_KEY) as alice:
        assert alice.post("/v1/responses", json=body).status_code == 200
    assert json.loads(fake.received[0].body) == body


def test_a_tool_argument_named_audio_in_a_chat_history_names_nothing(keyed: Any, fake: Any) -> None:
    # Only `"audio": {"id": ...}` names a stored audio; a tool call's argument is the user's own text.
    history = [{"role": "user", "content": "transcribe my memo"},
               {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "transcribe", "arguments": json.dumps({"audio": "https://example.com/memo.mp3"})}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"audio": "memo.mp3"})},
               {"role": "user", "content": [{"type": "text", "text": "thanks"}], "audio": "https://example.com/x"}]
    fake.queue(JsonReply(completion("Buy milk.")))
    with http(keyed, ALICE_KEY) as alice:
        assert alice.post("/v1/chat/completions", json={"model": "m", "messages": history}).status_code == 200


def test_a_spoken_chat_completion_answered_by_a_tool_call_warns_of_nothing_lost(keyed: Any, fake: Any,
                                                                               caplog: Any) -> None:
    answer = completion(None, tool_calls=[{"id": "call_1", "name": "weather", "arguments": "{}"}])
    answer["choices"][0]["message"]["audio"] = None
    fake.queue(JsonReply(answer))
    with caplog.at_level(logging.WARNING, logger="memproxy.ownership"):
        made = sdk(keyed, ALICE_KEY).chat.completions.create(
            model="m", modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"},
            messages=[{"role": "user", "content": "weather?"}])
    assert made.choices[0].message.tool_calls[0].id == "call_1"
    assert [r.getMessage() for r in caplog.records if r.name == "memproxy.ownership"] == []
