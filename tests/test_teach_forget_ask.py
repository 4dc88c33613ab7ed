"""Teach, forget, ask: facts taught through the proxy come back in later conversations.

Each fact holds an unguessable token. The questions are asked in fresh conversations,
with nothing of the teaching chat in the request, and never contain the token, so the
only way the upstream can receive it is through the memory block.
"""

from __future__ import annotations

import json
import secrets

FACTS = [
    ("My locker combination at the gym is {t}.", "What is the combination for my gym locker?"),
    ("The wifi password at the beach house is {t}.", "Remind me of the beach house wifi password."),
    ("Our staging database host is {t}.internal.example.", "Which host runs our staging database?"),
    ("My passport number is {t}.", "What was my passport number again?"),
    ("The promo code for the bakery is {t}.", "Do you remember the bakery promo code?"),
    ("My library card id is {t}.", "What's my library card id?"),
    ("The garage door code is {t}.", "How do I open the garage door, what's the code?"),
    ("Our team's Jira project key is {t}.", "Which Jira project key does our team use?"),
    ("My bike lock serial is {t}.", "What's the serial number on my bike lock?"),
    ("The conference booking reference is {t}.", "Find my conference booking reference."),
    ("My frequent flyer number with Lufthansa is {t}.", "What is my Lufthansa frequent flyer number?"),
    ("The storage unit I rent is number {t}.", "Which storage unit number do I rent?"),
    ("My dentist appointment confirmation is {t}.", "What's the confirmation for the dentist appointment?"),
    ("The feature flag for the new checkout is {t}.", "What is the new checkout feature flag called?"),
    ("Grandma's recipe card is filed under {t}.", "Where is grandma's recipe card filed?"),
    ("The parking permit for my car is {t}.", "What's my car parking permit?"),
    ("My insurance policy number is {t}.", "Tell me my insurance policy number."),
    ("The VPN profile we use for the office is {t}.", "Which VPN profile do we use at the office?"),
    ("The tracking number for my new laptop is {t}.", "Where's my laptop package, what's its tracking number?"),
    ("My gym membership id is {t}.", "What's my membership id at the gym?"),
    ("The kubernetes namespace for billing is {t}.", "Which kubernetes namespace does billing run in?"),
    ("My brother's new phone extension is {t}.", "What extension does my brother have now?"),
    ("The invoice for the roof repair is {t}.", "Which invoice was it for the roof repair?"),
    ("Our band's rehearsal room code is {t}.", "What's the code for our band rehearsal room?"),
    ("The seed for the simulation run was {t}.", "Which seed did the simulation run use?"),
    ("My tax reference number is {t}.", "Remind me of my tax reference number."),
    ("The ticket for the flaky login bug is {t}.", "Which ticket tracks the flaky login bug?"),
    ("My locker at the office is {t}.", "What's my office locker?"),
    ("The hotel reservation in Lisbon is {t}.", "What is the Lisbon hotel reservation?"),
    ("The vet registered our dog Biscuit under {t}.", "What id did the vet register Biscuit under?"),
    ("The alarm disarm code at the studio is {t}.", "How do I disarm the studio alarm?"),
    ("My student number at the university was {t}.", "What was my university student number?"),
]


def test_taught_facts_come_back_and_stay_with_their_user(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    tokens = [secrets.token_hex(5).upper() for _ in FACTS]
    for i, ((fact, _), token) in enumerate(zip(FACTS, tokens)):
        conversation = f"teach-{i % 6}"  # spread over several conversations
        proxy.client(**{"X-Memory-User": "teacher", "X-Memory-Conversation": conversation}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": fact.format(t=token)}])
    fake.reset()

    found = 0
    for i, ((_, question), token) in enumerate(zip(FACTS, tokens)):
        proxy.client(**{"X-Memory-User": "teacher", "X-Memory-Conversation": f"ask-{i}"}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": question}])
        sent = json.loads(fake.chat_requests()[-1].body)["messages"][-1]["content"]
        assert token not in question
        found += token in sent
    assert found / len(FACTS) >= 0.9, f"only {found}/{len(FACTS)} facts came back"

    fake.reset()
    for _, question in FACTS:
        proxy.client(**{"X-Memory-User": "stranger"}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": question}])
    leaked = [t for r in fake.chat_requests() for t in tokens if t in r.body.decode()]
    assert leaked == []
