"""The Merkle tree over HTTP on SQLite and PostgreSQL: `GET /checkpoint` answers the tree
head, signed when the server was given a key (never from the database); the proofs of
`GET /proofs/inclusion` and `GET /proofs/consistency` are the CLI's documents and check
offline against the signed checkpoints. Any reader's token may read them (an auditor
needs no workflow role); no token is a 401, bad sizes a 422."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ledger import Ledger
from ledger.core.note import Signer
from ledger.http import add_token, create_app
from ledger.service import checkpoints as C
from tests.support.runs import finished_run


def test_checkpoint_and_proofs_over_http(dsn: str, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    token = add_token("audrey", "reviewer", tokens)  # an auditor: any role that may read
    key = Signer.generate("audit.test")
    vkey = key.verifier().text()
    auth = {"Authorization": f"Bearer {token}"}
    with Ledger.open(dsn) as lg:
        finished_run(lg, 2)
        client = TestClient(create_app(lg, tokens_path=tokens, checkpoint_key=key.text()))
        assert client.get("/checkpoint").status_code == 401
        first = client.get("/checkpoint", headers=auth).json()
        head = C.tree_head(lg)
        assert (first["size"], first["root"]) == (head.size, C.b64(head.root))
        assert lg.verify(checkpoints=[first["checkpoint"]], vkeys=[vkey]).ok
        finished_run(lg, 1)
        second = client.get("/checkpoint", headers=auth).json()
        assert second["size"] > first["size"]
        signed = [first["checkpoint"], second["checkpoint"]]

        r = client.get(
            "/proofs/inclusion", params={"index": 1, "size": second["size"]}, headers=auth
        )
        assert r.status_code == 200
        assert r.json() == C.inclusion(lg, 1, second["size"])
        assert (r.json()["leaf_index"], r.json()["tree_size"]) == (1, second["size"])
        assert r.json()["hashes"] and "proof" not in r.json()
        assert C.check_proof(r.json(), signed, [vkey])["ok"]

        r = client.get(
            "/proofs/consistency",
            params={"from": first["size"], "to": second["size"]},
            headers=auth,
        )
        assert r.status_code == 200
        assert r.json() == C.consistency(lg, first["size"], second["size"])
        assert (r.json()["size1"], r.json()["size2"]) == (first["size"], second["size"])
        assert r.json()["hashes"] and not {"from", "to", "proof"} & r.json().keys()
        assert C.check_proof(r.json(), signed, [vkey])["ok"]

        for path, params in (
            ("/proofs/inclusion", {"index": 5, "size": 5}),
            ("/proofs/inclusion", {"index": 0, "size": second["size"] + 1}),
            ("/proofs/inclusion", {"index": -1, "size": 2}),
            ("/proofs/consistency", {"from": 3, "to": 2}),
        ):
            r = client.get(path, params=params, headers=auth)
            assert r.status_code == 422, (path, params)
            assert r.json()["error"] == "InvalidInput"


def test_without_a_key_the_checkpoint_is_the_unsigned_tree_head(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEDGER_CHECKPOINT_KEY", raising=False)
    with Ledger.open(dsn) as lg:
        finished_run(lg, 1)
        client = TestClient(create_app(lg, tokens_path=tmp_path / "none", public_reads=True))
        doc = client.get("/checkpoint").json()
        assert doc["checkpoint"] is None and doc["size"] == C.tree_head(lg).size
        # the key from the environment, as `ledger checkpoint sign` reads it
        key = Signer.generate("env.test")
        monkeypatch.setenv("LEDGER_CHECKPOINT_KEY", key.text())
        client = TestClient(create_app(lg, tokens_path=tmp_path / "none", public_reads=True))
        note = client.get("/checkpoint").json()["checkpoint"]
        assert lg.verify(checkpoints=[note], vkeys=[key.verifier().text()]).ok
