"""Webhook signing secrets at rest: encrypted with a key the database does not hold.

The keys are Fernet keys (AES-128-CBC with HMAC-SHA256, from `cryptography`), read at
each use from `LEDGER_WEBHOOK_KEYS` (keys separated by commas or spaces) or, when that
is unset, from the file `LEDGER_WEBHOOK_KEY_FILE` names (one key per line; `#` starts a
comment). The first key encrypts; every key decrypts, so a new key is put first, the
secrets re-encrypted (`ledger webhooks rekey`), and then the old key dropped.

A stored secret is `fernet:<token>`. A secret stored before encryption existed (the
`whsec_...` text itself) still signs, and `rekey` encrypts it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
from pathlib import Path
from typing import Any

from ledger.core.errors import InvalidInput

KEYS_ENV = "LEDGER_WEBHOOK_KEYS"
KEY_FILE_ENV = "LEDGER_WEBHOOK_KEY_FILE"
SEALED = "fernet:"
MIN_SECRET_BYTES = 16
SECRET_BYTES = 32  # of a secret the ledger makes


def _key_texts() -> tuple[list[str], str]:
    """The configured keys and where they came from (empty when none is configured)."""
    text = os.environ.get(KEYS_ENV, "")
    if text.strip():
        return text.replace(",", " ").split(), KEYS_ENV
    path = os.environ.get(KEY_FILE_ENV, "")
    if not path:
        return [], ""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInput(f"cannot read the webhook key file {KEY_FILE_ENV}={path!r}: {e}") from e
    keys = [ln.split("#", 1)[0].strip() for ln in lines]
    return [k for k in keys if k], f"{KEY_FILE_ENV}={path!r}"


def _keyring() -> Any:
    """A MultiFernet of the configured keys; InvalidInput when none is configured."""
    from cryptography.fernet import Fernet, MultiFernet

    texts, where = _key_texts()
    if not texts:
        raise InvalidInput(
            "webhook secrets are stored encrypted and no key is configured: set "
            f"{KEYS_ENV} (or {KEY_FILE_ENV}, a file) to a key from `ledger webhooks keygen`"
        )
    fernets = []
    for n, text in enumerate(texts, start=1):
        try:
            fernets.append(Fernet(text.encode("ascii")))
        except (ValueError, UnicodeEncodeError, binascii.Error):
            raise InvalidInput(
                f"webhook key {n} of {where} is not a key (32 url-safe base64 bytes, as "
                "`ledger webhooks keygen` prints)"
            ) from None
    return MultiFernet(fernets)


def new_key() -> str:
    """A new encryption key for LEDGER_WEBHOOK_KEYS."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode("ascii")


def new_secret() -> str:
    """A new signing secret, `whsec_` and 32 random bytes in base64 (Standard Webhooks)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def secret_key(secret: Any) -> bytes:
    """The HMAC key of a secret: `whsec_<base64>` (or bare base64), at least 16 bytes."""
    if not isinstance(secret, str) or not secret:
        raise InvalidInput("the webhook secret must be text: whsec_<base64>")
    text = secret.strip().removeprefix("whsec_")
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(
            "the webhook secret must be whsec_ followed by base64 (Standard Webhooks); "
            "leave it out and the ledger makes one"
        ) from None
    if len(key) < MIN_SECRET_BYTES:
        raise InvalidInput(f"the webhook secret must hold at least {MIN_SECRET_BYTES} bytes")
    return key


def fingerprint(secret: str) -> str:
    """What records and reads show of a secret: enough to tell two apart, nothing more."""
    return "sha256:" + hashlib.sha256(secret_key(secret)).hexdigest()[:16]


def seal(secret: str) -> str:
    """The stored form of a secret: encrypted with the first configured key."""
    token: bytes = _keyring().encrypt(secret.encode("utf-8"))
    return SEALED + token.decode("ascii")


def is_sealed(stored: str) -> bool:
    return stored.startswith(SEALED)


def unseal(stored: str) -> str:
    """The secret of a stored form (a plaintext one, from before encryption, as it is)."""
    if not is_sealed(stored):
        return stored
    from cryptography.fernet import InvalidToken

    try:
        return str(_keyring().decrypt(stored[len(SEALED) :].encode("ascii")).decode("utf-8"))
    except InvalidToken:
        raise InvalidInput(
            f"a webhook secret cannot be decrypted with the configured keys ({KEYS_ENV} or "
            f"{KEY_FILE_ENV}): keep the key it was encrypted with until `ledger webhooks "
            "rekey` has run"
        ) from None


def reseal(stored: str) -> str:
    """`stored` encrypted with the first key now configured (after a key rotation)."""
    return seal(unseal(stored))
