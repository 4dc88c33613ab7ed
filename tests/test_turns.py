"""Turn identity: the history hash, the same for a long transcript whether written whole or in pieces."""

from __future__ import annotations

import hashlib
import json

from proxy.models import Scope
from proxy.turns import history_hash
from proxy.wire.openai_chat import ChatRequest, parse_chat_request

# Every char JSON escapes or UTF-8 writes in more than one byte, spread so that the 64 KiB
# pieces of a long text are cut next to each of them.
AWKWARD = 'q"\\\n\t\x01é€😀 ' * 15_000


def test_a_long_history_hashes_as_its_json_written_whole() -> None:
    messages = [{"role": "system", "content": "left out"}, {"role": "user", "content": AWKWARD},
                {"role": "assistant", "content": [{"type": "text", "text": AWKWARD[:70_001]}]},
                {"role": "user", "content": [{"type": "text", "text": "and?"}, {"type": "image_url"}]}]
    request = parse_chat_request(json.dumps({"model": "m", "messages": messages}).encode())
    assert isinstance(request, ChatRequest)
    scope = Scope("ann\u00e9", agent="a\"1", conversation=None)
    material = [scope.user, "a\"1", "", [["user", AWKWARD], ["assistant", AWKWARD[:70_001]], ["user", "and?\n[image]"]]]
    whole = json.dumps(material, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert history_hash(scope, request) == hashlib.sha256(whole).hexdigest()
