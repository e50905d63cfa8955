"""Redaction: the shapes secrets take in error text, reasons and
evidence, one row each. Each row is the text, the secret that must not survive, and a
part that must (so redaction does not eat the whole message)."""

from __future__ import annotations

import time

import pytest

from ledger import Ledger
from ledger.core.redact import MASK, clean_error, is_secret_key, redact, redact_evidence
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest

LEDGER_TOKEN = "ledger_" + "Q3x9" * 10 + "abc"

SHAPES = [
    # (name, text, secret, kept)
    ("dsn userinfo", "connect postgresql://bob:hunter2@db:5432/x failed", "hunter2", "bob"),
    ("dsn empty user", "redis://:s3cretpw@cache:6379/0 refused", "s3cretpw", "cache:6379"),
    ("env DB_PASSWORD", "DB_PASSWORD=hunter2 DB_USER=app", "hunter2", "DB_USER=app"),
    ("env PGPASSWORD", "PGPASSWORD=pg-pw-1 psql -h db", "pg-pw-1", "psql -h db"),
    ("env MYSQL_PWD", "MYSQL_PWD=my-pw-2 mysql", "my-pw-2", "mysql"),
    ("password key", "login failed: password=pw-123; user=bob", "pw-123", "user=bob"),
    ("json password", '{"user": "bob", "password": "hunter2"}', "hunter2", '"user": "bob"'),
    ("python repr", "bad config {'user': 'bob', 'passwd': 'hunter2'}", "hunter2", "'user': 'bob'"),
    (
        "basic auth header",
        "Authorization: Basic Ym9iOmh1bnRlcjI=",
        "Ym9iOmh1bnRlcjI=",
        "Authorization",
    ),
    (
        "bearer header",
        "Authorization: Bearer abc.def.ghijklmnop",
        "abc.def.ghijklmnop",
        "Authorization",
    ),
    (
        "bare bearer",
        "sent Bearer tok_1234567890abcdef upstream",
        "tok_1234567890abcdef",
        "upstream",
    ),
    (
        "proxy auth",
        "Proxy-Authorization: Basic dXNlcjpwYXNzd29yZA==",
        "dXNlcjpwYXNzd29yZA==",
        "Proxy",
    ),
    ("query access_token", "GET /api?access_token=at-9876&page=2 -> 500", "at-9876", "page=2"),
    ("query token", "GET https://h/x?token=tk-5555 timed out", "tk-5555", "timed out"),
    ("client_secret", "oauth: client_id=app1 client_secret=cs-4242", "cs-4242", "client_id=app1"),
    ("api key header", "x-api-key: key-7777 rejected", "key-7777", "rejected"),
    ("api_key pair", "api_key=sk_live_ABCDEFGHIJKLMNOP", "ABCDEFGHIJKLMNOP", "api_key"),
    (
        "aws access key id",
        "using AKIAIOSFODNN7EXAMPLE in us-east-1",
        "AKIAIOSFODNN7EXAMPLE",
        "us-east-1",
    ),
    (
        "aws secret",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI",
        "aws_secret_access_key",
    ),
    ("ledger token", f"retry with {LEDGER_TOKEN} please", LEDGER_TOKEN[7:], "please"),
    ("openai key", "sk-proj-abcdefghijklmnop1234 invalid", "abcdefghijklmnop1234", "invalid"),
    (
        "github token",
        "clone with ghp_abcdefghijklmnopqrstuvwxyz0123 failed",
        "abcdefghijklmnopqrstuvwxyz0123",
        "failed",
    ),
    ("slack token", "post xoxb-1234567890-abcdefghij failed", "1234567890-abcdefghij", "failed"),
    (
        "google api key",
        "maps AIzaSyA-abcdefghijklmnopqrstuvwxyz12345 quota",
        "abcdefghijklmnopqrstuvwxyz12345",
        "quota",
    ),
    (
        "jwt",
        "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig-abc expired",
        "eyJzdWIiOiIxIn0",
        "expired",
    ),
    ("cli flag", "ran: pg_dump --password s3cr3t-flag db", "s3cr3t-flag", "pg_dump"),
    ("quoted value with spaces", 'secret: "two words"', "two words", "secret"),
    (
        "pem private key",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow-KEYDATA\n-----END RSA PRIVATE KEY----- end",
        "MIIEow-KEYDATA",
        "end",
    ),
    ("dotted key", "app.db.password=dotted-pw", "dotted-pw", "app.db.password"),
    ("credentials", "credentials: cred-31337", "cred-31337", "credentials"),
]


def test_the_table_is_big_enough() -> None:
    assert len(SHAPES) >= 20
    assert len({name for name, *_ in SHAPES}) == len(SHAPES)


@pytest.mark.parametrize(("name", "text", "secret", "kept"), SHAPES, ids=[s[0] for s in SHAPES])
def test_each_shape_is_redacted(name: str, text: str, secret: str, kept: str) -> None:
    out = redact(text)
    assert secret not in out, out
    assert kept in out, out
    assert MASK in out


NOT_SECRETS = [
    "tokenizer=bpe-v2",
    "lease token 1a2b3c4d on item 'i0' expired",
    "passed 3 of 4 checks",
    "author: rita",
    "the basic idea",
    "run 6f1c state running",
]


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) == text


def test_redaction_time_is_linear_in_the_text() -> None:
    # pathological inputs for backtracking patterns (the old URL pattern took minutes)
    for text in ["a-b." * 10_000, "sk-" * 10_000, "x://a:" * 10_000, "password=" * 5_000]:
        start = time.perf_counter()
        redact(text)
        assert time.perf_counter() - start < 2.0, text[:20]


def test_evidence_values_under_secret_keys_are_masked() -> None:
    for key in [
        "password",
        "api_key",
        "apiKey",
        "DB_TOKEN",
        "client_secret",
        "private-key",
        "credentials",
    ]:
        assert is_secret_key(key), key
    for key in ["receipt", "checksum", "tokens_used", "author", "bytes"]:
        assert not is_secret_key(key), key
    out = redact_evidence(
        {
            "receipt": "r-1",
            "password": "hunter2",
            "nested": [{"api_key": 42}],
            "note": "x password=pw",
        }
    )
    assert out == {
        "receipt": "r-1",
        "password": MASK,
        "nested": [{"api_key": MASK}],
        "note": "x password=***",
    }


def test_errors_reasons_and_evidence_are_stored_redacted(lg: Ledger) -> None:
    run_id = lg.submit(manifest(2, max_attempts=3), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    lease0, lease1 = lg.claim(run_id, WORKER, limit=2)
    lg.fail_attempt(lease0, "upload failed: Authorization: Basic Ym9iOmh1bnRlcjI=")
    lg.accept(lease1, evidence={"receipt": "r-1", "token": LEDGER_TOKEN})
    lg.pause(run_id, OPERATOR, f"leaked DB_PASSWORD=hunter2 and {LEDGER_TOKEN}")
    texts = [str(t.to_dict()) for t in lg.history(run_id)]
    texts += [str(a.to_dict()) for a in lg.attempts(run_id)]
    texts += [str(i.to_dict()) for i in lg.items(run_id)]
    joined = "\n".join(texts)
    for secret in ["Ym9iOmh1bnRlcjI=", "hunter2", LEDGER_TOKEN[7:]]:
        assert secret not in joined
    assert "r-1" in joined


def test_clean_error_escapes_and_bounds() -> None:
    assert clean_error("f\udcff.txt password=x") == "f\\udcff.txt password=***"
    assert len(clean_error("é" * 10_000).encode()) <= 2048
