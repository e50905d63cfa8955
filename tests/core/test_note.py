"""ledger/core/note.py: C2SP signed notes and checkpoints.

The example key and note are the ones of the Go reference, golang.org/x/mod/sumdb/note
(its documentation and note_test.go), repeated by the C2SP signed-note spec's ports.
"""

from __future__ import annotations

import base64

import pytest

from ledger.core import note as N

VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
SIGNED = (
    TEXT + "\n"
    "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def test_the_reference_keys_parse_and_agree() -> None:
    v = N.Verifier.parse(VKEY)
    assert v.name == "PeterNeumann" and v.key_id.hex() == "c74f20a3"
    s = N.Signer.parse(SKEY)
    assert s.verifier() == v
    assert v.text() == VKEY and s.text() == SKEY


def test_signing_reproduces_the_reference_note_byte_for_byte() -> None:
    assert N.sign_note(TEXT, N.Signer.parse(SKEY)) == SIGNED


def test_the_reference_note_opens() -> None:
    note, good = N.open_note(SIGNED, [N.Verifier.parse(VKEY)])
    assert note.text == TEXT and [g.name for g in good] == ["PeterNeumann"]


@pytest.mark.parametrize(
    "bad",
    [
        VKEY[:-1],
        VKEY + "A",
        VKEY.replace("c74f20a3", "c74f20a4"),
        VKEY.replace("PeterNeumann", "PeterNeuman"),
        "PeterNeumann+c74f20a3",
        "Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ],
)
def test_mangled_verifier_keys_are_refused(bad: str) -> None:
    with pytest.raises(N.NoteError):
        N.Verifier.parse(bad)


def test_a_generated_key_round_trips() -> None:
    s = N.Signer.generate("ledger.example")
    assert N.Signer.parse(s.text()) == s
    v = N.Verifier.parse(s.verifier().text())
    msg = N.sign_note("hello\n", s)
    assert N.open_note(msg, [v])[1] == [v]


def test_tampering_is_caught() -> None:
    v = N.Verifier.parse(VKEY)
    with pytest.raises(N.UnverifiedNote) as e:
        N.open_note(SIGNED.replace("cryptography", "cryptographY"), [v])
    assert e.value.kind == "forged"
    other = N.Signer.generate("PeterNeumann")  # the same name, another key
    with pytest.raises(N.UnverifiedNote) as e:
        N.open_note(SIGNED, [other.verifier()])
    assert e.value.kind == "unknown_key"
    # a signature cut short (still base64 of more than a key id)
    line = SIGNED.rsplit("\n", 2)[1]
    raw = base64.b64decode(line.split(" ")[2])
    short = SIGNED.replace(line.split(" ")[2], base64.b64encode(raw[:-3]).decode())
    with pytest.raises(N.UnverifiedNote) as e:
        N.open_note(short, [v])
    assert e.value.kind == "forged"
    with pytest.raises(N.NoteError):
        N.open_note(TEXT, [v])  # no signature block


def test_checkpoints_round_trip_and_refuse_bad_bodies() -> None:
    s = N.Signer.generate("log")
    cp = N.Checkpoint("example.com/log", 42, bytes(range(32)), ("ext one",))
    body = cp.body()
    assert (
        body
        == "example.com/log\n42\n" + base64.b64encode(bytes(range(32))).decode() + "\next one\n"
    )
    assert N.Checkpoint.parse(body) == cp
    got, _good = N.open_checkpoint(N.sign_checkpoint(cp, s), [s.verifier()])
    assert got == cp
    for bad in ("o\n042\nAAAA\n", "o\n1\n", "o\n-1\n" + body.split("\n")[2] + "\n", "o\n1\nAAAA\n"):
        with pytest.raises(N.NoteError):
            N.Checkpoint.parse(bad)
