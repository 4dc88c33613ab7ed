"""Turn identity: the history hash, the same for a long transcript whether written whole or in pieces."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from proxy.models import Scope
from proxy.memory.turns import history_hash
from proxy.stores.hash_key import HashKey
from proxy.wires.anthropic_messages import AnthropicMessages
from proxy.wires.base import Wire, WireRequest
from proxy.wires.openai_chat import OpenAIChat

# Every char JSON escapes or UTF-8 writes in more than one byte, spread so that the 64 KiB
# pieces of a long text are cut next to each of them.
AWKWARD = 'q"\\\n\t\x01é€😀 ' * 15_000

CHAT = {"model": "m", "messages": [
    {"role": "system", "content": "left out"}, {"role": "user", "content": AWKWARD},
    {"role": "assistant", "content": [{"type": "text", "text": AWKWARD[:70_001]}]},
    {"role": "user", "content": [{"type": "text", "text": "and?"}, {"type": "image_url"}]}]}
MESSAGES = {"model": "m", "max_tokens": 10, "system": "left out", "messages": [
    {"role": "user", "content": AWKWARD},
    {"role": "assistant", "content": [{"type": "text", "text": AWKWARD[:70_001]}]},
    {"role": "user", "content": [{"type": "text", "text": "and?"}]}]}


@pytest.mark.parametrize(("wire", "body", "prompt"), [(OpenAIChat(), CHAT, "and?\n[image]"),
                                                     (AnthropicMessages(), MESSAGES, "and?")])
def test_a_long_history_hashes_as_its_json_written_whole(wire: Wire, body: dict[str, Any], prompt: str) -> None:
    request = wire.parse(json.dumps(body).encode())
    assert isinstance(request, WireRequest)
    scope = Scope("ann\u00e9", agent="a\"1", conversation=None)
    material = [scope.user, "a\"1", "", [["user", AWKWARD], ["assistant", AWKWARD[:70_001]], ["user", prompt]]]
    whole = json.dumps(material, ensure_ascii=False).encode("utf-8", "surrogatepass")
    key = HashKey(b"k" * 32)
    assert history_hash(scope, request.transcript, key) == key.seal(hashlib.sha256(whole).hexdigest())
