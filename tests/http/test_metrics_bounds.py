"""`/metrics` stays the same size whatever clients send: every request label comes from
a fixed set (method, route template, status), so junk methods and paths, sent without a
token, add no series."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from ledger import Ledger
from ledger.http import add_token, create_app
from ledger.http.operator import method_label, status_label


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    lg = Ledger.open(f"sqlite:///{tmp_path}/ledger.db")
    token = add_token("prom", "operator", tmp_path / "tokens")
    with TestClient(create_app(lg, tokens_path=tmp_path / "tokens")) as client:
        yield client, token
    lg.close()


def request_series(client: TestClient, token: str) -> set[tuple[str, ...]]:
    text = client.get("/metrics", headers={"Authorization": f"Bearer {token}"}).text
    out = set()
    for family in text_string_to_metric_families(text):
        if family.name.startswith("ledger_http_"):
            for s in family.samples:
                out.add((s.name, *sorted(f"{k}={v}" for k, v in s.labels.items())))
    return out


def test_junk_methods_and_paths_add_no_series(served: tuple[TestClient, str]) -> None:
    client, token = served
    for n in range(3):  # every kind of request, so their series exist
        client.request(f"M{n:05d}", f"/runs/{n}")
        client.get(f"/junk/{n}")
    request_series(client, token)  # a scrape is a request too
    before = request_series(client, token)
    size_before = len(client.get("/metrics", headers={"Authorization": f"Bearer {token}"}).text)
    for n in range(3, 1503):
        client.request(f"M{n:05d}{'Z' * 40}", f"/runs/{n}")
        client.request("GET", f"/junk/{n}/{'x' * 50}")
    after = request_series(client, token)
    # the counts grow, the set of series does not
    assert after == before
    methods = {part for s in after for part in s if part.startswith("method=")}
    assert methods <= {"method=GET", "method=POST", "method=other"}
    # the text grows only by the digits of the counters
    size_after = len(client.get("/metrics", headers={"Authorization": f"Bearer {token}"}).text)
    assert size_after - size_before < 2_000


@pytest.mark.parametrize(
    ("method", "label"),
    [
        ("GET", "GET"),
        ("POST", "POST"),
        ("get", "other"),
        ("M0001", "other"),
        ("", "other"),
        (None, "other"),
    ],
)
def test_method_labels_come_from_a_fixed_set(method: object, label: str) -> None:
    assert method_label(method) == label


@pytest.mark.parametrize(
    ("status", "label"), [(200, "200"), (429, "429"), (299, "other"), (999, "other")]
)
def test_status_labels_come_from_a_fixed_set(status: int, label: str) -> None:
    assert status_label(status) == label
