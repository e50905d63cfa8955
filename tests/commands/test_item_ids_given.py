"""Item ids named in a command's arguments are read as a manifest's ids are kept: checked
(InvalidInput otherwise, tests/bad_inputs/) and NFC-normalised, so a decomposed spelling of
a stored id names that item (rule 11 of the rule book; SPEC: ids are NFC text)."""

from __future__ import annotations

import unicodedata

from ledger import Ledger
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest

NFC = "caf\u00e9"
NFD = "cafe\u0301"


def _run_with_nfc_item(lg: Ledger, start: bool = True) -> str:
    m = manifest(1)
    m["items"].append({"item_id": NFC})
    run_id = lg.submit(m, SUBMITTER).run_id
    if start:
        lg.start(run_id, CONTROLLER)
    return run_id


def test_the_spellings_differ_but_normalise_alike() -> None:
    assert NFC != NFD and unicodedata.normalize("NFC", NFD) == NFC


def test_repair_finds_an_item_named_in_its_decomposed_spelling(lg: Ledger) -> None:
    run_id = _run_with_nfc_item(lg)
    lg.cancel(run_id, OPERATOR, "stopped before any work")
    new = lg.repair(run_id, OPERATOR, items=[NFD])
    assert [i.item_id for i in lg.items(new.run_id)] == [NFC]


def test_compensate_finds_an_accepted_item_named_in_its_decomposed_spelling(
    lg: Ledger,
) -> None:
    run_id = _run_with_nfc_item(lg)
    for lease in lg.claim(run_id, WORKER, limit=2):
        lg.accept(lease)
    lg.cancel(run_id, OPERATOR, "stop")
    comp = lg.compensate(run_id, OPERATOR, "undo the cafe", items=[NFD])
    assert [i.item_id for i in lg.items(comp.run_id)] == [NFC]


def test_amend_withdraws_an_item_named_in_its_decomposed_spelling(lg: Ledger) -> None:
    run_id = _run_with_nfc_item(lg, start=False)
    lg.amend(run_id, SUBMITTER, "drop the cafe", withdraw=[NFD])
    states = {i.item_id: i.state for i in lg.items(run_id)}
    assert states == {"i0": "pending", NFC: "skipped"}  # a withdrawn item is skipped
