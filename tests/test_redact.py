"""Secret redaction: each kind, what must stay, several at once, idempotency, cost."""

from __future__ import annotations

import json
import time

import pytest

from proxy.redaction.redact import WINDOW_CHARS, redact, redact_mapping, restored

PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw\n"
    "7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxKLxoS2tFc\n"
    "-----END RSA PRIVATE KEY-----"
)
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"

KINDS = [
    ("key sk-abcdefghijklmnopqrstuvwxyz012345 here", "key [REDACTED:openai_key] here"),
    ("sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv_x-Yz01", "[REDACTED:openai_key]"),
    ("use sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv-1234.", "use [REDACTED:anthropic_key]."),
    ("id AKIAIOSFODNN7EXAMPLE,", "id [REDACTED:aws_access_key],"),
    ("ASIAY34FZKBOKMUTVV7A", "[REDACTED:aws_access_key]"),
    ("test key sk_test_4eC39HqLyjWDarjtT1zdp7dc", "test key [REDACTED:stripe_key]"),
    ("my password is hunter2x, keep it", "my password is [REDACTED:password], keep it"),
    ("curl -u admin:admin https://api.internal/x", "curl -u admin:[REDACTED:password] https://api.internal/x"),
    ("curl --user 'deploy:s3cr3tPass' -X POST", "curl --user 'deploy:[REDACTED:password]' -X POST"),
    ("mysql -h db -u root -pHunter22 app", "mysql -h db -u root -p[REDACTED:password] app"),
    ("<config><password>Tr0ub4dor</password></config>", "<config><password>[REDACTED:password]</password></config>"),
    ('the wifi password was "sunnyday"', 'the wifi password was "[REDACTED:password]"'),
    ("webhook whsec_MfKQ9r8GKYqrTwjUPD8ILPZIK2LWGHQX", "webhook [REDACTED:stripe_key]"),
    ("xapp-1-A0123BCDEFG-1234567890123-abcdef0123456789", "[REDACTED:slack_token]"),
    ("post to https://hooks.slack.com/services/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 now",
     "post to https://hooks.slack.com/[REDACTED:slack_webhook] now"),
    (
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "aws_secret_access_key = [REDACTED:aws_secret_key]",
    ),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "[REDACTED:github_token]"),
    ("gho_16C7e42F292c6912E7710c838347Ae178B4a", "[REDACTED:github_token]"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv", "[REDACTED:github_token]"),
    ("slack xoxb-123456789012-1234567890123-AbCdEfGhIjKl", "slack [REDACTED:slack_token]"),
    ("xoxp-1234-5678-abcdefghij", "[REDACTED:slack_token]"),
    ("Authorization: Bearer abc.def-ghi_123", "Authorization: Bearer [REDACTED:bearer_token]"),
    ("authorization: basic dXNlcjpwYXNzd29yZA==", "authorization: basic [REDACTED:bearer_token]"),
    ("send it as Bearer 9f8e7d6c5b4a3210", "send it as Bearer [REDACTED:bearer_token]"),
    (f"token is {JWT} ok", "token is [REDACTED:jwt] ok"),
    ("postgres://user:s3cr3t@db.example.com:5432/app", "postgres://user:[REDACTED:password]@db.example.com:5432/app"),
    ("redis://:p@ss@cache:6379/0", "redis://:[REDACTED:password]@cache:6379/0"),
    ("https://alice:hunter2@example.com/x", "https://alice:[REDACTED:password]@example.com/x"),
    ("password=hunter2", "password=[REDACTED:password]"),
    ("DB_PASSWORD=changeme", "DB_PASSWORD=[REDACTED:password]"),
    ('{"password": "letmein"}', '{"password": "[REDACTED:password]"}'),
    ("my password: hunter22", "my password: [REDACTED:password]"),
    ('"api_key": "a8f5f167f44f4964e6c998dee827110c"', '"api_key": "[REDACTED:api_key]"'),
    ("x-api-key: 7f3a9b2c1d4e5f60", "x-api-key: [REDACTED:api_key]"),
    ("token: Zm9vYmFyYmF6cXV4", "token: [REDACTED:token]"),
    ("GITHUB_TOKEN=abc123def456ghi789", "GITHUB_TOKEN=[REDACTED:token]"),
    ("secret=Q2xpZW50U2VjcmV0", "secret=[REDACTED:secret]"),
    ('clientSecret: "Xy7pQ2mNz9Kw"', 'clientSecret: "[REDACTED:secret]"'),
    (
        "https://x.example/cb?code=1&access_token=ya29a0AfH6SMB&x=1",
        "https://x.example/cb?code=1&access_token=[REDACTED:token]&x=1",
    ),
    ("sk_live_4eC39HqLyjWDarjtT1zdp7dc", "[REDACTED:stripe_key]"),
    ("AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "[REDACTED:google_api_key]"),
    # an assignment wherever it sits on a line: a word and a colon before it hid it once
    ("setup: password: Hx7pQ2mNz9Kw", "setup: password: [REDACTED:password]"),
    ("Connection settings: password=Vb4n", "Connection settings: password=[REDACTED:password]"),
    ("env: DB_PASSWORD=Zr5tY7uI9oP1", "env: DB_PASSWORD=[REDACTED:password]"),
    ("note: DB_PASS=Qa3sD5fG7hJ9", "note: DB_PASS=[REDACTED:password]"),
    ("prod:\n  password: Wm2nB4vC6xZ8\n  user: app", "prod:\n  password: [REDACTED:password]\n  user: app"),
    ("Here: token=Tk9rE3wQ7yU5iO1p", "Here: token=[REDACTED:token]"),
    ("password: password: Wm2nB4vC6xZ8", "password: password: [REDACTED:password]"),
    ("a: b: c: apiKey: 7f3a9b2c1d4e5f60", "a: b: c: apiKey: [REDACTED:api_key]"),
    ("PRIVATE_KEY=Zm9vYmFyYmF6cXV4eHl6", "PRIVATE_KEY=[REDACTED:private_key]"),
    ("my AWS secret key is wJalrXUtnFEMI/K7MDENG/bPxRfiCYzQ8xK2mN4v.",
     "my AWS secret key is [REDACTED:aws_secret_key]."),
    ("AWS_SECRET_ACCESS_KEY: wJalrXUtnFEMI/K7MDENG/bPxRfiCYzQ8xK2mN4v",
     "AWS_SECRET_ACCESS_KEY: [REDACTED:aws_secret_key]"),
    ("DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=Q2xpZW50S2V5Rm9yQWN6dXJl+/U3RvcmFnZQ==;"
     "EndpointSuffix=core.windows.net",
     "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=[REDACTED:azure_key];EndpointSuffix=core.windows.net"),
    ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;"
     "SharedAccessKey=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MA=",
     "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey=[REDACTED:azure_key]"),
    ("use 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 now", "use [REDACTED:huggingface_token] now"),
    ("//registry.npmjs.org/:_authToken=npm_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
     "//registry.npmjs.org/:_authToken=[REDACTED:npm_token]"),
    ("postgres://app:pa/ss#w0rd9@db.internal:5432/app", "postgres://app:[REDACTED:password]@db.internal:5432/app"),
    ("mysql://root:p#ss/w@rd@10.0.0.5/db", "mysql://root:[REDACTED:password]@10.0.0.5/db"),
]


@pytest.mark.parametrize(("text", "expected"), KINDS)
def test_each_kind(text: str, expected: str) -> None:
    assert redact(text) == expected


UNCHANGED = [
    "my password is strong enough", "the password is required", "your password was changed",
    "sort -u names.txt", "ssh -u deploy host", "curl -u $USER:$TOKEN https://x", "git log -u", "mysql -h db -p",
    "mkdir -p build/out", "<token></token>", "docker run -u 1000:1000 myimage", "docker run --user 1000:1000 img",
    "docker exec -u www-data:www-data app ls", "gcc a.c $(mysql_config --cflags --libs) -pthread",
    "mysql_config --libs -pipe", "OLDPWD=/home/ann/projects",
    "the request id is 550e8400-e29b-41d4-a716-446655440000",
    "fixed in 3f9c2ab4d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6 and 3f9c2ab",
    "ssh to db-primary.prod.internal or https://example.com/path?q=1",
    "mail alice@example.com or git@github.com:org/repo.git",
    "ssh://git@github.com/org/repo and http://localhost:8080/x",
    "the bearer authentication scheme is described below",
    "max_tokens=1000 and prompt_tokens: 512",
    "password: forgotten, sort_key: created_at, token: next",
    "the task-management-system is risk-free",
    "password=${DB_PASSWORD} and api_key: <your key here> and secret=****",
    "I keep my private key safe and my passport in a drawer",
    "Alice works at Acme; the monkey key: yes",
    "",
    "the password policy is strict and token limits apply",
    "Token limits: 4096 per request; password reset: via email",
    "bypass: enabled, compass=north, passage: long, keyboard: qwerty",
    "tokens: 1200, passwords: rotated, secrets: none",
    "the AWS secret key is rotated monthly",
    "https://example.com:443/users/@alice and http://localhost:8080/a@b",
    "https://alice.example/page#section and ssh://git@github.com:22/org/repo",
    "a hf_ prefix and npm_ scripts and AccountKey= empty",
]


@pytest.mark.parametrize("text", UNCHANGED)
def test_false_positives_left_alone(text: str) -> None:
    assert redact(text) == text


def test_pem_block_spanning_lines() -> None:
    text = f"here is my key:\n{PEM}\nthanks"
    assert redact(text) == "here is my key:\n[REDACTED:private_key]\nthanks"


def test_pem_openssh_and_pkcs8() -> None:
    for label in ("OPENSSH PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY", "ENCRYPTED PRIVATE KEY"):
        block = PEM.replace("RSA PRIVATE KEY", label)
        assert redact(f"a {block} b") == "a [REDACTED:private_key] b"


def test_pem_without_end_line_loses_its_body() -> None:
    text = "-----BEGIN PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0t\nRgeLezV6ffAt0gunVTLw7onLR"
    assert redact(text) == "[REDACTED:private_key]"


def test_a_pem_body_joined_by_escaped_newlines_is_redacted_without_its_end_line() -> None:
    # A key inside a JSON string (a tool's arguments, a quoted config): its line breaks are `\\n`.
    body = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0t"
    text = '{"key": "-----BEGIN PRIVATE KEY-----\\n' + body + "\\n" + body + '\\n", "user": "deploy"}'
    assert redact(text) == '{"key": "[REDACTED:private_key]\\n", "user": "deploy"}'


def test_several_secrets_in_one_text() -> None:
    text = (
        "keys: sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv AKIAIOSFODNN7EXAMPLE\n"
        f"db postgres://u:p4ss@h/db and {PEM}\nheader Authorization: Bearer {JWT}"
    )
    assert redact(text) == (
        "keys: [REDACTED:openai_key] [REDACTED:aws_access_key]\n"
        "db postgres://u:[REDACTED:password]@h/db and [REDACTED:private_key]\n"
        "header Authorization: Bearer [REDACTED:jwt]"
    )


@pytest.mark.parametrize("text", [text for text, _ in KINDS] + [PEM, f"Bearer {JWT} sk-abcdefghijklmnop1234"])
def test_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


def test_redact_mapping_recurses_and_blanks_credential_fields() -> None:
    record = {
        "event": "upstream",
        "headers": {"Authorization": "Bearer abc", "X-Api-Key": "k", "cookie": "s=1", "accept": "text/plain"},
        "messages": ["hi sk-abcdefghijklmnop1234", ("AKIAIOSFODNN7EXAMPLE",)],
        "max_tokens": 5,
        "password": "${DB_PASSWORD}",
        "status": None,
    }
    assert redact_mapping(record) == {
        "event": "upstream",
        "headers": {
            "Authorization": "[REDACTED:authorization]",
            "X-Api-Key": "[REDACTED:api_key]",
            "cookie": "[REDACTED:cookie]",
            "accept": "text/plain",
        },
        "messages": ["hi [REDACTED:openai_key]", ("[REDACTED:aws_access_key]",)],
        "max_tokens": 5,
        "password": "${DB_PASSWORD}",
        "status": None,
    }
    assert record["headers"]["Authorization"] == "Bearer abc"  # a copy, not the caller's dict


def test_plain_text_is_cheap() -> None:
    text = "We talked about the deployment plan and the staging host for a while. " * 15000  # ~1 MB
    start = time.perf_counter()
    assert redact(text) == text
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize(
    "text",
    [
        "a." * 50000 + "://",
        "key_" * 50000 + "x",
        "aB_" * 30000 + " password",
        "postgres://" + "u:" * 30000,
        "-----BEGIN PRIVATE KEY-----" + "A" * 100000,
        "Bearer " + "a" * 100000,
    ],
)
def test_pathological_input_is_linear(text: str) -> None:
    start = time.perf_counter()
    redact(text)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("shift", [-40, -13, -1, 0, 1, 7, 40])
def test_a_secret_across_a_window_boundary_is_found_whole(shift: int) -> None:
    pad = "x " * ((WINDOW_CHARS + shift) // 2)
    for secret, expected in (("env: DB_PASSWORD=Zr5tY7uI9oP1", "env: DB_PASSWORD=[REDACTED:password]"),
                             ("sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv", "[REDACTED:openai_key]"),
                             (PEM, "[REDACTED:private_key]")):
        assert redact(pad + secret + " end") == pad + expected + " end"


def test_many_windows_keep_every_secret_and_every_other_char() -> None:
    line = "note: DB_PASS=Qa3sD5fG7hJ9 and AKIAIOSFODNN7EXAMPLE in the plan\n"
    text = line * (3 * WINDOW_CHARS // len(line))
    assert redact(text) == "note: DB_PASS=[REDACTED:password] and [REDACTED:aws_access_key] in the plan\n" * (
        3 * WINDOW_CHARS // len(line))


ADVERSARIAL = {
    "a": "a", "=": "=", ":": ":", "/": "/", "base64": "QWxhZGRpbjpvcGVuIHNlc2FtZQ+/", "key=": "key=",
    "password: ": "password: ", "setup: ": "setup: ", "://u:": "://u:", "eyJ.": "eyJa.", "sk-": "sk-a",
    "BEGIN": "-----BEGIN PRIVATE KEY-----", "bearer": "Bearer ", "@": "a:b@",
    # Read a second time as they read: every char of the first folded, of the second dropped.
    "fullwidth": "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44=", "zero-width": "pass\u200bword=",
    "cyrillic": "\u043f\u0430\u0440\u043e\u043b\u044c ", "curl": " -u a:", "mysql": "mysql -", "tag": "<token>a",
    # Read again as their JSON escapes spell them, three levels deep.
    "escape": "\\u200b", "escaped backslashes": '\\\\\\"', "escaped name": "pass\\u0077ord=\\\"a",
}


@pytest.mark.parametrize("unit", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_adversarial_runs_cost_linear_time(unit: str) -> None:
    # Four times the text takes about four times as long, not sixteen (a quadratic rule).
    # This thread's CPU time, not the clock: other processes on a busy machine do not count.
    small, large = unit * (100_000 // len(unit)), unit * (400_000 // len(unit))
    timings = []
    for text in (small, large):
        start = time.thread_time()
        redact(text)
        timings.append(time.thread_time() - start)
    assert timings[1] < 4.0
    assert timings[1] < 12 * timings[0] + 0.05


KEY = "sk-abcdefghijklmnopqrstuvwxyz012345"


@pytest.mark.parametrize("stored, source, expected", [
    # A rewrite kept redacted gets the secrets of the words it was made from back, in order.
    (f"note: {redact('deploy ' + KEY + ' with AKIAIOSFODNN7EXAMPLE')}", f"deploy {KEY} with AKIAIOSFODNN7EXAMPLE",
     f"note: deploy {KEY} with AKIAIOSFODNN7EXAMPLE"),
    # Marks that do not line up with the source's secrets stay marks.
    ("[REDACTED:aws_access_key] then [REDACTED:openai_key]", f"{KEY} then AKIAIOSFODNN7EXAMPLE",
     "[REDACTED:aws_access_key] then [REDACTED:openai_key]"),
    ("[REDACTED:openai_key] twice [REDACTED:openai_key]", f"once {KEY}", "[REDACTED:openai_key] twice [REDACTED:openai_key]"),
    ("the hook dropped it", f"once {KEY}", "the hook dropped it"),
    ("[REDACTED:openai_key]", "no secret here", "[REDACTED:openai_key]"),
])
def test_restored_gives_back_only_secrets_that_line_up(stored: str, source: str, expected: str) -> None:
    assert restored(stored, source) == expected


@pytest.mark.parametrize(("text", "expected"), [
    # Invisible or look-alike characters inside the name, or around the `:`.
    ("pass\u200bword=Qa01xyz12", "pass\u200bword=[REDACTED:password]"),
    ("pass\u00adword=Qa02xyz12", "pass\u00adword=[REDACTED:password]"),
    ("\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44=Qa03xyz12",
     "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44=[REDACTED:password]"),
    ("p\u0430ssword=Qa04xyz12", "p\u0430ssword=[REDACTED:password]"),
    ("password\uff1aQa05xyzAB12", "password\uff1a[REDACTED:password]"),
    ("password:\u00a0Qa06xyzAB12", "password:\u00a0[REDACTED:password]"),
    ("sk-proj-AbCdEf01\u200b23456789ghIJklmnop", "[REDACTED:openai_key]"),
    ("\u041f\u0440\u0438\u0432\u0435\u0442: password=Qa99xyz \u043c\u0438\u0440",
     "\u041f\u0440\u0438\u0432\u0435\u0442: password=[REDACTED:password] \u043c\u0438\u0440"),
    # Escaped quotes: JSON inside a JSON string, code in a tool call's arguments.
    ('cfg: "{\\"password\\": \\"Qa07xyzAB\\"}"', 'cfg: "{\\"password\\": \\"[REDACTED:password]\\"}"'),
    ('{"content": "DB_PASSWORD = \\"Qa20xyzAB\\""}', '{"content": "DB_PASSWORD = \\"[REDACTED:password]\\""}'),
    # A name glued to the word that makes it a credential.
    ("PGPASSWORD=Qa08xyzAB psql -h db", "PGPASSWORD=[REDACTED:password] psql -h db"),
    ("export APITOKEN=Qa09xyzAB12", "export APITOKEN=[REDACTED:token]"),
    ("authtoken: Qa10xyzAB12cd", "authtoken: [REDACTED:token]"),
    ("my AWS secret key is: wJalrXUtnFEMI/K7MDENG/bPxRfiCYzQ8xK2mN4v", "my AWS secret key is: [REDACTED:aws_secret_key]"),
    ("postgres://app:p@ss/Qa11xyz@db.internal:5432/app", "postgres://app:[REDACTED:password]@db.internal:5432/app"),
    ("AccountKey=Q2xpZW50U2VjcmV0%2BU3RvcmFnZUtleQ%3D%3D;x", "AccountKey=[REDACTED:azure_key];x"),
])
def test_secrets_hidden_by_how_they_are_written(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize("text", [
    "bypass=1234", "compass: north", "max_tokens=512", "https://h:443/users/@ann",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440", "caf\u00e9 \u2014 r\u00e9sum\u00e9 \uff08note\uff09",
])
def test_text_that_only_reads_like_a_credential_name_stays(text: str) -> None:
    assert redact(text) == text


def test_a_long_text_not_all_ascii_is_read_as_it_reads_in_windows() -> None:
    """A secret spelled with a zero-width space, deep in a long Cyrillic text, past the first window."""
    pad = "\u043c\u0438\u0440 " * (WINDOW_CHARS // 2)
    text = pad + "pass\u200bword=Qa3sD5fG7h " + pad
    assert redact(text) == pad + "pass\u200bword=[REDACTED:password] " + pad


@pytest.mark.parametrize("arguments", [
    {"cmd": 'sh -c "mysql -u root -pS3cretPw"'},
    {"cmd": 'sh -c "curl -u admin:pw12345 https://x"'},
    {"note": 'she said "my password is hunter22X"'},
    {"cmd": "set password=C:\\dir\\"},
    {"content": 'DB_PASSWORD = "Qa20xyzAB"', "more": "password='Zx9cvB7nm'"},
])
def test_a_tool_calls_json_arguments_stay_json(arguments: dict[str, str]) -> None:
    """Arguments are stored as the model sent them, JSON text: a secret inside one of its strings
    ends before the backslash that escapes a quote, never with it."""
    raw = json.dumps(arguments)
    redacted = redact(raw)
    assert redacted != raw
    assert "[REDACTED:password]" in json.loads(redacted)[next(iter(arguments))]


def test_a_disguised_secret_at_a_window_edge_is_judged_with_what_comes_before_it() -> None:
    """The second reading looks back past its window's start as the first does: `bypass=` is no
    password there either, and a key glued to a word is no key."""
    for pad in (WINDOW_CHARS - 2, WINDOW_CHARS - 12):
        text = "x" * pad + "bypass=hunter2XYz caf\u00e9"  # not all ASCII: read a second time
        assert redact(text) == text


def test_a_disguised_private_key_across_a_window_edge_goes_whole() -> None:
    body = "\n".join("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC" for _ in range(400))
    block = f"-----BEGIN PRIVATE\u200b KEY-----\n{body}\n-----END PRIVATE KEY-----"
    text = "a" * (WINDOW_CHARS - 100) + block + " after"
    assert redact(text) == "a" * (WINDOW_CHARS - 100) + "[REDACTED:private_key] after"


# What a tool call's arguments say through JSON escapes (the text is JSON text, as sent).
SPELLED = [
    ('{"cmd": "pass\\u200bword=Qa21xyzAB"}', '{"cmd": "pass\\u200bword=[REDACTED:password]"}'),
    ('{"cmd": "\\uff50\\uff41\\uff53\\uff53\\uff57\\uff4f\\uff52\\uff44=Qa22xyzAB"}',
     '{"cmd": "\\uff50\\uff41\\uff53\\uff53\\uff57\\uff4f\\uff52\\uff44=[REDACTED:password]"}'),
    ('{"pass\\u0077ord": "Qa23xyzAB"}', '{"pass\\u0077ord": "[REDACTED:password]"}'),
    ('{"cmd": "password=\\u0051a24xyzAB"}', '{"cmd": "password=[REDACTED:password]"}'),
    ('{"k": "sk-\\u0070roj-Ab3dEf6hIj9kLm2nOp5qRs8tUv"}', '{"k": "[REDACTED:openai_key]"}'),
    ('{"k": "\\ud83d\\ude00 password=Qa25xyzAB \\ud800"}', '{"k": "\\ud83d\\ude00 password=[REDACTED:password] \\ud800"}'),
    # A string holding JSON whose own strings escape again (Anthropic's `input` written out whole).
    ('{"code": "{\\"cmd\\": \\"pass\\\\u200bword=Qa26xyzAB\\"}"}',
     '{"code": "{\\"cmd\\": \\"pass\\\\u200bword=[REDACTED:password]\\"}"}'),
    ('{"code": "{\\"code\\": \\"cfg = {\\\\\\"password\\\\\\": \\\\\\"Qa27xyzAB\\\\\\"}\\"}"}',
     '{"code": "{\\"code\\": \\"cfg = {\\\\\\"password\\\\\\": \\\\\\"[REDACTED:password]\\\\\\"}\\"}"}'),
    # A secret right after an escape, or ending where a string two levels down closes: the cut
    # takes neither the escape's backslash nor the closing quote's.
    ('{"t": "password:\\tQa31xyzAB"}', '{"t": "password:\\t[REDACTED:password]"}'),
    ('{"t": "password=\\\\Qa32xyzAB"}', '{"t": "password=\\\\[REDACTED:password]"}'),
    (json.dumps({"c": json.dumps([json.dumps(["password=Qa34xyzAB"])])}),
     json.dumps({"c": json.dumps([json.dumps(["password=[REDACTED:password]"])])})),
    (json.dumps({"c": json.dumps({"k": json.dumps({"s": "api_key=Qa35xyzABcd"})})}),
     json.dumps({"c": json.dumps({"k": json.dumps({"s": "api_key=[REDACTED:api_key]"})})})),
]


@pytest.mark.parametrize(("text", "expected"), SPELLED)
def test_what_json_escapes_spell_is_redacted_and_the_rest_stays_as_written(text: str, expected: str) -> None:
    assert redact(text) == expected
    json.loads(expected)  # still the JSON it was
    assert redact(expected) == expected


@pytest.mark.parametrize("text", [
    "C:\\new\\table\\passwords.txt", '{"path": "C:\\\\tmp\\\\token"}', '{"re": "\\\\d+\\\\.\\\\w"}',
    '{"note": "the password policy\\u2014strict"}', "a lone \\ud800 and a \\u12 cut short\\",
])
def test_escapes_that_spell_no_secret_leave_the_text_as_it_is(text: str) -> None:
    assert redact(text) == text


def test_a_spelled_secret_past_the_first_window_is_found() -> None:
    pad = "x\\n" * (WINDOW_CHARS // 3)
    text = pad + "pass\\u200bword=Qa28xyzAB " + pad
    assert redact(text) == pad + "pass\\u200bword=[REDACTED:password] " + pad


def test_arguments_full_of_escapes_cost_little() -> None:
    code = 'def f(x):\n    return "a\\tb" + x  # cfg\n' * 25000  # ~1 MB of code written as JSON
    text = json.dumps({"path": "main.py", "content": code + "password = 'Qa29xyzAB'\n"})
    start = time.perf_counter()
    assert json.loads(redact(text))["content"] == code + "password = '[REDACTED:password]'\n"
    assert time.perf_counter() - start < 1.5
