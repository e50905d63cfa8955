"""Signed notes (C2SP signed-note) and transparency-log checkpoints (C2SP tlog-checkpoint),
pure: text in, text out; Ed25519 through `cryptography` (the `proofs` extra), imported when
a key is used.

Keys, as the Go reference (golang.org/x/mod/sumdb/note) writes them:

- a verifier key, `NAME+HEXKEYID+BASE64(0x01 || 32-byte Ed25519 public key)`, one line;
- a signer (private) key, `PRIVATE+KEY+NAME+HEXKEYID+BASE64(0x01 || 32-byte Ed25519
  seed)`, one line (`ledger checkpoint keygen` writes it to a file of mode 0600);

where KEYID is the first 4 bytes of `SHA-256(NAME || 0x0A || 0x01 || public key)` as 8
lowercase hex digits, and NAME is non-empty text without `+` or white space.

A note is text of whole lines (each ending in `\\n`), a blank line, and signature lines
`— NAME BASE64(KEYID || signature)` (U+2014, a space, the key's name, a space). The
Ed25519 signature is over the text alone.

A checkpoint's text (its *body*) is the log's origin, the tree size in decimal, the
root hash in base64, then optional extension lines, each line ending in `\\n`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ledger.core.errors import InvalidInput

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

ALG_ED25519 = 0x01
SIG_PREFIX = "\u2014 "  # an em dash and a space
PRIVATE_PREFIX = "PRIVATE+KEY+"
MAX_SIGNATURES = 100


class NoteError(InvalidInput):
    """A key, note or checkpoint that is malformed."""


class UnverifiedNote(NoteError):
    """A note none of whose signatures is by a given key (`unknown_key`), or whose
    signature by a given key does not verify (`forged`)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _b64decode(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise NoteError(f"{what} is not base64") from None
    if base64.b64encode(raw).decode() != text:
        raise NoteError(f"{what} is not canonical base64")
    return raw


def check_name(name: str) -> str:
    """A key name: non-empty, no `+`, no white space."""
    if not isinstance(name, str) or not name or "+" in name or any(c.isspace() for c in name):
        raise NoteError(f"a key name is text without '+' or white space, not {name!r}")
    return name


def key_id(name: str, public: bytes) -> bytes:
    """The first 4 bytes of SHA-256(name || 0x0A || 0x01 || public key)."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([ALG_ED25519]) + public).digest()[:4]


def _ed25519() -> tuple[type[Ed25519PrivateKey], type[Ed25519PublicKey]]:
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import (
            Ed25519PrivateKey,
            Ed25519PublicKey,
        )
    except ImportError:  # pragma: no cover - the proofs extra is not installed
        raise NoteError(
            "signed checkpoints need the cryptography package: pip install 'run-ledger[proofs]'"
        ) from None
    return Ed25519PrivateKey, Ed25519PublicKey


def _raw_public(key: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True)
class Verifier:
    """A verifier key: its name, key id and Ed25519 public key."""

    name: str
    key_id: bytes
    public: bytes

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        text = vkey.strip() if isinstance(vkey, str) else vkey
        if not isinstance(text, str):
            raise NoteError("a verifier key is text")
        parts = text.split("+", 2)
        if len(parts) != 3:
            raise NoteError("a verifier key is NAME+KEYID+BASE64KEY")
        name, hex_id, b64 = parts
        check_name(name)
        if len(hex_id) != 8 or hex_id.lower() != hex_id:
            raise NoteError("a verifier key's id is 8 lowercase hex digits")
        try:
            kid = bytes.fromhex(hex_id)
        except ValueError:
            raise NoteError("a verifier key's id is 8 lowercase hex digits") from None
        raw = _b64decode(b64, "the verifier key")
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise NoteError("the verifier key is not an Ed25519 key (0x01 and 32 bytes)")
        if key_id(name, raw[1:]) != kid:
            raise NoteError("the verifier key's id does not match its name and key")
        return cls(name, kid, raw[1:])

    def text(self) -> str:
        b64 = base64.b64encode(bytes([ALG_ED25519]) + self.public).decode()
        return f"{self.name}+{self.key_id.hex()}+{b64}"

    def verify(self, message: bytes, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        _priv, pub = _ed25519()
        try:
            pub.from_public_bytes(self.public).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True


@dataclass(frozen=True)
class Signer:
    """A signer key: its name, key id and Ed25519 seed (the private key)."""

    name: str
    key_id: bytes
    seed: bytes = field(repr=False)

    @classmethod
    def parse(cls, skey: str) -> Signer:
        text = skey.strip() if isinstance(skey, str) else skey
        if not isinstance(text, str) or not text.startswith(PRIVATE_PREFIX):
            raise NoteError("a signer key is PRIVATE+KEY+NAME+KEYID+BASE64SEED")
        parts = text[len(PRIVATE_PREFIX) :].split("+", 2)
        if len(parts) != 3:
            raise NoteError("a signer key is PRIVATE+KEY+NAME+KEYID+BASE64SEED")
        name, hex_id, b64 = parts
        check_name(name)
        raw = _b64decode(b64, "the signer key")
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise NoteError("the signer key is not an Ed25519 key (0x01 and a 32-byte seed)")
        signer = cls.from_seed(name, raw[1:])
        if signer.key_id.hex() != hex_id:
            raise NoteError("the signer key's id does not match its name and key")
        return signer

    @classmethod
    def from_seed(cls, name: str, seed: bytes) -> Signer:
        priv, _pub = _ed25519()
        public = _raw_public(priv.from_private_bytes(seed).public_key())
        return cls(check_name(name), key_id(name, public), seed)

    @classmethod
    def generate(cls, name: str) -> Signer:
        import os

        return cls.from_seed(name, os.urandom(32))

    def text(self) -> str:
        b64 = base64.b64encode(bytes([ALG_ED25519]) + self.seed).decode()
        return f"{PRIVATE_PREFIX}{self.name}+{self.key_id.hex()}+{b64}"

    def verifier(self) -> Verifier:
        priv, _pub = _ed25519()
        return Verifier(
            self.name, self.key_id, _raw_public(priv.from_private_bytes(self.seed).public_key())
        )

    def sign(self, message: bytes) -> bytes:
        priv, _pub = _ed25519()
        return priv.from_private_bytes(self.seed).sign(message)


@dataclass(frozen=True)
class Signature:
    name: str
    key_id: bytes
    signature: bytes


@dataclass(frozen=True)
class Note:
    """A note's text and its signature lines (verified or not: see `open_note`)."""

    text: str
    signatures: tuple[Signature, ...]


def _check_text(text: str) -> None:
    if not isinstance(text, str) or not text.endswith("\n"):
        raise NoteError("a note's text is whole lines, each ending in a newline")
    if "\r" in text:
        raise NoteError("a note's text has no carriage returns")


def sign_note(text: str, *signers: Signer) -> str:
    """The signed note: the text, a blank line, one signature line per signer."""
    _check_text(text)
    if not signers:
        raise NoteError("a signed note needs a signer")
    lines = [
        f"{SIG_PREFIX}{s.name} {base64.b64encode(s.key_id + s.sign(text.encode())).decode()}\n"
        for s in signers
    ]
    return text + "\n" + "".join(lines)


def parse_note(message: str) -> Note:
    """The text and signature lines of a signed note, unverified."""
    if not isinstance(message, str) or not message.endswith("\n"):
        raise NoteError("a signed note ends with a newline")
    cut = message.rfind("\n\n")
    if cut < 0:
        raise NoteError("a signed note has a blank line before its signatures")
    text, block = message[: cut + 1], message[cut + 2 :]
    _check_text(text)
    sigs: list[Signature] = []
    for line in block.splitlines():
        if not line.startswith(SIG_PREFIX):
            raise NoteError(f"not a signature line: {line[:60]!r}")
        name, _sp, b64 = line[len(SIG_PREFIX) :].partition(" ")
        check_name(name)
        raw = _b64decode(b64, "a signature")
        if len(raw) < 5:
            raise NoteError("a signature is a key id and a signature")
        sigs.append(Signature(name, raw[:4], raw[4:]))
    if not sigs:
        raise NoteError("a signed note has at least one signature line")
    if len(sigs) > MAX_SIGNATURES:
        raise NoteError(f"a signed note has at most {MAX_SIGNATURES} signatures")
    return Note(text, tuple(sigs))


def open_note(message: str, verifiers: list[Verifier]) -> tuple[Note, list[Verifier]]:
    """The note and the given keys whose signatures on it verify. `UnverifiedNote` when one
    by a given key does not verify (kind `forged`), or when none is by a given key (kind
    `unknown_key`)."""
    note = parse_note(message)
    body = note.text.encode()
    good: list[Verifier] = []
    for sig in note.signatures:
        for v in verifiers:
            if v.name != sig.name or v.key_id != sig.key_id:
                continue
            if not v.verify(body, sig.signature):
                raise UnverifiedNote(
                    f"the signature by {v.name} ({v.key_id.hex()}) does not verify: the note "
                    "was changed after it was signed, or was not signed by that key",
                    "forged",
                )
            if v not in good:
                good.append(v)
    if not good:
        names = ", ".join(f"{s.name} ({s.key_id.hex()})" for s in note.signatures)
        raise UnverifiedNote(
            f"no signature is by a given key; it is signed by {names}", "unknown_key"
        )
    return note, good


# ---- checkpoints (C2SP tlog-checkpoint) ------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """A log's state: its origin, the number of leaves and their Merkle root."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        if not self.origin or "\n" in self.origin or self.origin != self.origin.strip():
            raise NoteError("a checkpoint's origin is one non-empty line")
        for ext in self.extensions:
            if not ext or "\n" in ext:
                raise NoteError("a checkpoint's extension lines are non-empty lines")
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode()]
        return "".join(line + "\n" for line in (*lines, *self.extensions))

    @classmethod
    def parse(cls, body: str) -> Checkpoint:
        _check_text(body)
        lines = body[:-1].split("\n")
        if len(lines) < 3:
            raise NoteError("a checkpoint is an origin, a tree size and a root hash")
        origin, size_text, root_text, *extensions = lines
        if not origin:
            raise NoteError("a checkpoint's origin is one non-empty line")
        if (
            not size_text.isascii()
            or not size_text.isdigit()
            or (len(size_text) > 1 and size_text[0] == "0")
        ):
            raise NoteError(f"a checkpoint's tree size is a decimal number, not {size_text!r}")
        root = _b64decode(root_text, "a checkpoint's root hash")
        if len(root) != 32:
            raise NoteError("a checkpoint's root hash is 32 bytes")
        if any(not ext for ext in extensions):
            raise NoteError("a checkpoint has no empty lines")
        return cls(origin, int(size_text), root, tuple(extensions))


def sign_checkpoint(checkpoint: Checkpoint, signer: Signer) -> str:
    return sign_note(checkpoint.body(), signer)


def open_checkpoint(message: str, verifiers: list[Verifier]) -> tuple[Checkpoint, list[Verifier]]:
    """A signed checkpoint verified by at least one of `verifiers` (`open_note`)."""
    note, good = open_note(message, verifiers)
    return Checkpoint.parse(note.text), good
