"""The schema's migrations are frozen `.sql` files, one per version and store.

A released migration is never edited: `tests/stores/released_migrations.sha256` keeps the
SHA-256 of each (as `sha256sum` prints it). A schema change is a new file; it is
released by adding its line (`cd ledger/stores/migrations && sha256sum */NNNN_*.sql`).
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import pytest

from ledger.stores import migrations
from ledger.stores.base import SCHEMA_VERSION

RELEASED = Path(__file__).parent / "released_migrations.sha256"


def _released() -> dict[str, str]:
    out = {}
    for line in RELEASED.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        out[name] = digest
    return out


def _shipped() -> dict[str, bytes]:
    root = resources.files(migrations)
    return {
        f"{store}/{p.name}": p.read_bytes()
        for store in migrations.STORES
        for p in root.joinpath(store).iterdir()
        if p.name.endswith(".sql")
    }


def _changed(released: dict[str, str], shipped: dict[str, bytes]) -> list[str]:
    """The released migrations missing or edited in `shipped`."""
    return [
        name
        for name, digest in released.items()
        if name not in shipped or hashlib.sha256(shipped[name]).hexdigest() != digest
    ]


def test_no_released_migration_changed() -> None:
    assert _changed(_released(), _shipped()) == [], "add a new migration instead"


def test_every_migration_is_released_and_counted() -> None:
    # a new file must be listed (released) before it counts as a schema version
    assert sorted(_shipped()) == sorted(_released())
    for store in migrations.STORES:
        assert len(migrations.steps(store)) == SCHEMA_VERSION


def test_an_edited_or_removed_migration_is_caught() -> None:
    released, shipped = _released(), _shipped()
    first, last = sorted(released)[0], sorted(released)[-1]
    edited = dict(shipped)
    edited[first] = shipped[first].replace(b"CREATE", b"create", 1)  # same meaning, other bytes
    del edited[last]
    assert _changed(released, edited) == sorted([first, last], key=list(released).index)


@pytest.mark.parametrize("store", migrations.STORES)
def test_versions_are_numbered_without_gaps(store: str) -> None:
    names = [name for name, _ in migrations.files(store)]
    assert [n[:4] for n in names] == [f"{v:04d}" for v in range(1, len(names) + 1)]
    assert {n[5:] for n in names} == {n[5:] for n, _ in migrations.files("sqlite")}


def test_statements_split_outside_quotes_and_comments() -> None:
    script = """-- a comment; with a semicolon
CREATE TABLE a (x TEXT DEFAULT 'a;b');
CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$
BEGIN
  PERFORM 1;  -- inside the body; kept
  RETURN 2;
END
$body$;
INSERT INTO a VALUES ('it''s; fine');
;
SELECT $$x;y$$
"""
    assert migrations.split_statements(script) == [
        "CREATE TABLE a (x TEXT DEFAULT 'a;b')",
        "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$\nBEGIN\n"
        "  PERFORM 1;  -- inside the body; kept\n  RETURN 2;\nEND\n$body$",
        "INSERT INTO a VALUES ('it''s; fine')",
        "SELECT $$x;y$$",
    ]


def test_the_stores_apply_the_files() -> None:
    from ledger.stores import pg_migrations, sqlite

    assert sqlite.migrations() == migrations.steps("sqlite")
    assert pg_migrations.migrations() == migrations.steps("postgres")
