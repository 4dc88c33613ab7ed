"""One user's memory made through the real proxy, for the inspector's tests: two conversations,
a tool loop, a job change and a memory whose text is an HTML/script injection attempt."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.api_helpers import api_url
from tests.conftest import RunningProxy
from tests.extraction_helpers import extracted, hits
from tests.fake_upstream import FakeUpstream, JsonReply, completion

USER = "dana"
TOKEN = "inspector-token-7c1e"
# Each part would act if the page ever parsed memory text as HTML: a script, an event
# handler, and an image from another origin (the network log would show it).
HOSTILE = ('<img src="http://203.0.113.9/pixel.png" onerror="document.title=\'pwned\'">'
           '<script>window.pwned = 1; alert("pwned")</script> Dana\'s <b>bold</b> note')
LOCKER = "Dana's gym locker code is 4471"
WEATHER_CALL = {"id": "call_weather_1", "name": "get_weather", "arguments": '{"city": "Lisbon"}'}


@dataclass
class Seeded:
    """What the seed made: ids the tests look for."""

    conversations: list[str] = field(default_factory=lambda: ["conv-work", "conv-move"])
    memories: dict[str, str] = field(default_factory=dict)  # content -> memory id
    sent: dict[str, list[str]] = field(default_factory=dict)  # user text -> `[source] text` lines the model got


def chat(proxy: RunningProxy, conversation: str, messages: list[dict[str, Any]], **body: Any) -> Any:
    client = proxy.client(**{"X-Memory-User": USER, "X-Memory-Conversation": conversation})
    return client.chat.completions.create(model="m", messages=messages, **body)  # type: ignore[call-overload]


def sent_lines(fake: FakeUpstream, request: int = -1) -> list[str]:
    """The block's lines in a request the upstream received, as `[source] text`."""
    return hits(str(json.loads(fake.chat_requests()[request].body)["messages"][-1]["content"]))


def say(proxy: RunningProxy, fake: FakeUpstream, conversation: str, text: str, answer: str, seeded: Seeded) -> None:
    fake.queue(JsonReply(completion(answer)))
    chat(proxy, conversation, [{"role": "user", "content": text}])
    seeded.sent[text] = sent_lines(fake)
    extracted(proxy)


def seed(proxy: RunningProxy, fake: FakeUpstream) -> Seeded:
    """Talk to the proxy as an application would, then store two memories through the API."""
    seeded = Seeded()
    say(proxy, fake, "conv-work", "I work at Acme.", "Noted: you work at Acme.", seeded)
    # A tool loop: the model asks for the weather, the application answers the call.
    question = {"role": "user", "content": "What is the weather in Lisbon today?"}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    fake.queue(JsonReply(completion(None, tool_calls=[WEATHER_CALL])),
               JsonReply(completion("It is sunny in Lisbon, 24 degrees.")))
    chat(proxy, "conv-work", [question], tools=tools)
    seeded.sent[question["content"]] = sent_lines(fake)
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": WEATHER_CALL["id"], "type": "function",
         "function": {"name": WEATHER_CALL["name"], "arguments": WEATHER_CALL["arguments"]}}]}
    chat(proxy, "conv-work", [question, call, {"role": "tool", "tool_call_id": WEATHER_CALL["id"],
                                               "content": "sunny, 24 C"}], tools=tools)
    extracted(proxy)
    say(proxy, fake, "conv-move", "I now work at Globex.", "Congratulations on Globex!", seeded)
    with proxy.http(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        for content in (HOSTILE, LOCKER):
            made = http.post(api_url(USER, "memories"), json={"content": content, "type": "fact"})
            assert made.status_code == 201, made.text
            seeded.memories[content] = made.json()["id"]
    say(proxy, fake, "conv-move", "Where do I work now, and what is my locker code?", "At Globex; 4471.", seeded)
    return seeded
