"""The Responses wire's request body, in memory: a large body is written again in pieces."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

from proxy.wires.base import WireRequest
from proxy.wires.openai_responses import OpenAIResponses

# Every char JSON escapes or UTF-8 writes in more than one byte, spread so that the 64 KiB
# pieces of a long text are cut next to each of them; repeated past LARGE_BODY_BYTES.
AWKWARD = 'q"\\\n\t\x01é€😀 ' * 100_000
WIRE = OpenAIResponses()


def test_a_large_body_is_written_in_pieces_as_one_call_writes_it() -> None:
    body = {"model": "m", "instructions": AWKWARD[:70_000], "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": AWKWARD}]},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": AWKWARD[:5000]},
        {"type": "function_call_output", "call_id": "c1", "output": AWKWARD},
        {"type": "message", "role": "user", "content": "and the plan?"}]}
    raw = json.dumps(body).encode()
    request = WIRE.parse(raw)
    assert isinstance(request, WireRequest) and request.size == len(raw) and request.large
    written = WIRE.insert_block(request, "BLOCK")
    assert written == WIRE.insert_block(replace(request, size=0), "BLOCK")  # as one json.dumps call writes it
    expected = copy.deepcopy(body)
    expected["input"][-1]["content"] = "BLOCK\n\nand the plan?"
    assert written == json.dumps(expected, ensure_ascii=False, separators=(",", ":")).encode()


def test_a_small_body_is_not_large() -> None:
    raw = b'{"model": "m", "input": "hello"}'
    request = WIRE.parse(raw)
    assert isinstance(request, WireRequest) and request.size == len(raw) and not request.large
