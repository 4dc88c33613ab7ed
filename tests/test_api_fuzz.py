"""The OpenAPI document drives a fuzzer (schemathesis) against a real proxy: no input gets a 500.

Every operation is called with requests generated from the document, valid and invalid
ones, against a store that holds data; each answer must be documented (status, content
type, body schema) and none may be a server error.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode

from tests.api_helpers import NDJSON, RECORDS, api_url, jsonl

TOKEN = "fuzz-api-token"
USER = "alice"
KNOWN_IDS = [r["id"] for r in RECORDS]
EXAMPLES = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

_ids = st.sampled_from(["conv-a", "m1", "e-alice", "r1", "x1", "a", "x" * 256])
_records = st.one_of(
    st.sampled_from(RECORDS),
    st.fixed_dictionaries({"kind": st.sampled_from(["conversation", "message", "entity", "relationship",
                                                    "reasoning", "other"]), "id": _ids},
                          optional={"name": st.text(max_size=20), "content": st.text(max_size=20),
                                    "conversation_id": _ids, "role": st.sampled_from(["user", "bot"]),
                                    "from_id": _ids, "to_id": _ids, "type": st.text(max_size=10),
                                    "created_at": st.sampled_from(["2026-01-01T00:00:00Z", "soon", 5]),
                                    "steps": st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=5)))}),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)),
)
JSON_LINES = st.one_of(
    st.lists(_records, max_size=6).map(lambda rs: b"".join(json.dumps(r).encode() + b"\n" for r in rs)),
    st.binary(max_size=300),
)
schemathesis.openapi.media_type("application/x-ndjson", JSON_LINES)


def test_no_generated_request_gets_a_server_error(make_proxy: Any) -> None:
    proxy = make_proxy(memory_api__token=TOKEN, memory__commit_timeout_ms=5000)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with proxy.http(headers=auth) as client:
        schema = schemathesis.openapi.from_url(f"{proxy.url}/memory/v1/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) == 20
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                # Data to find: ids the generator would never guess are swapped in for some cases.
                assert client.post(api_url(USER, "import"), headers=NDJSON, content=jsonl(RECORDS)).status_code == 200
                _fuzz(operation, mode, f"{proxy.url}/memory/v1", auth)


def _fuzz(operation: Any, mode: GenerationMode, base_url: str, auth: dict[str, str]) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode), known=st.sampled_from([None, *KNOWN_IDS]))
    def call(case: Any, known: str | None) -> None:
        if known is not None and mode is GenerationMode.POSITIVE:
            case.path_parameters["user"] = USER
            if "id" in case.path_parameters:
                case.path_parameters["id"] = known
        response = case.call(base_url=base_url, headers=auth, timeout=30)
        checks = CHECKS if mode is GenerationMode.POSITIVE else [not_a_server_error, content_type_conformance]
        case.validate_response(response, checks=checks)

    call()
