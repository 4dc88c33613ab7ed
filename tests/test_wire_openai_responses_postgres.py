"""The Responses wire's recorded response ids on PostgreSQL, across two replicas: a response
one replica relayed is continued by `previous_response_id` on the other."""

from __future__ import annotations

from tests.fake_responses import output, response
from tests.fake_upstream import JsonReply
from tests.test_wire_openai_responses import FACT, HEADER, QUESTION, client, sent


def test_a_response_relayed_by_one_replica_is_continued_on_another(make_proxy, fake, pg_url):
    first, second = (make_proxy(store__url=pg_url, memory__commit_timeout_ms=5000, extraction__from_roles=[])
                     for _ in range(2))
    fake.queue(JsonReply(response(output("Noted."), "resp_a")))
    client(first).responses.create(model="gpt-test", input=FACT)
    # The fact is in the chain the provider holds for resp_a: not injected again.
    client(second).responses.create(model="gpt-test", input=QUESTION, previous_response_id="resp_a")
    assert sent(fake)["input"] == QUESTION
    # An id neither replica relayed: the other conversation rules, and the fact is recalled.
    client(second).responses.create(model="gpt-test", input=QUESTION, previous_response_id="resp_unknown")
    recalled = sent(fake)["input"]
    assert recalled.startswith(HEADER) and FACT in recalled and recalled.endswith(f"\n\n{QUESTION}")
