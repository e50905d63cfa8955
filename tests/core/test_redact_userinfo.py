"""URL userinfo is masked whatever it holds: a password with "@" or ":" in it (as people
write DSNs), a token given as the user name (`https://TOKEN@host`). A property test over
generated secrets: the secret never survives, and the rest of the URL does."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from ledger.core.redact import clean_error, redact

# anything a password may hold in a URL's authority but the characters that end it
# ("/", "?", "#") and whitespace; "@" and ":" included
SECRET = st.text(
    alphabet=st.sampled_from(
        [c for c in string.printable if c not in "/?#" and not c.isspace()] + ["é", "密"]
    ),
    min_size=6,
    max_size=40,
)
SCHEMES = st.sampled_from(["postgresql", "postgres", "https", "http", "redis", "amqp", "mysql"])


@given(SCHEMES, SECRET)
def test_a_password_with_any_characters_is_masked(scheme: str, secret: str) -> None:
    url = f"{scheme}://svc:{secret}@db.internal:5432/app"
    out = redact(f"could not connect to {url}: timeout")
    assert out == f"could not connect to {scheme}://svc:***@db.internal:5432/app: timeout"


@given(SCHEMES, SECRET.filter(lambda s: ":" not in s))
def test_a_token_as_the_user_name_is_masked(scheme: str, token: str) -> None:
    out = redact(f"GET {scheme}://{token}@git.example/org/repo.git failed")
    assert out == f"GET {scheme}://***@git.example/org/repo.git failed"


@given(SECRET)
def test_a_stored_error_never_keeps_the_password(secret: str) -> None:
    stored = clean_error(f"OperationalError('postgresql://app:{secret}@10.0.0.5/ledger')")
    assert f":{secret}@" not in stored
    assert "postgresql://app:***@10.0.0.5/ledger" in stored


def test_examples() -> None:
    assert redact("postgresql://user:p@ss@db:5432/app") == "postgresql://user:***@db:5432/app"
    assert redact("https://ghp_0123456789abcdef@github.com/x") == "https://***@github.com/x"
    assert redact("redis://:pw@cache:6379") == "redis://:***@cache:6379"
    # not userinfo: an "@" after the authority, an address without a scheme
    assert redact("see http://example.com/a@b") == "see http://example.com/a@b"
    assert redact("mail ops@example.com") == "mail ops@example.com"
