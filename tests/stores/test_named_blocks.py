"""Named statements (ledger/stores/named.py): a block written for one store only is
what that store reads, the other store reads the common block of the same name, and a
file whose blocks do not fit together is refused when it is read."""

from __future__ import annotations

import pytest

from ledger.stores import named

TEXT = """
-- name: plain
SELECT 1 FROM t WHERE k {in_list};

-- name: shaped
SELECT 2 FROM t WHERE k {in_list};

-- name: shaped postgres
-- this store's own shape
SELECT 3 FROM t WHERE k {in_list};
"""


class _Statements(named.Statements):
    def __init__(self, text: str) -> None:
        super().__init__("ledger.stores", "none.sql")
        self._blocks = named.parse(text)


def test_each_store_reads_its_own_block_or_the_common_one() -> None:
    st = _Statements(TEXT)
    assert st.names() == ["plain", "shaped"]
    assert st.sql("postgres", "shaped").startswith("-- this store's own shape\nSELECT 3")
    assert st.sql("postgres", "shaped").endswith("= ANY(?)")
    assert (
        st.sql("sqlite", "shaped") == "SELECT 2 FROM t WHERE k IN (SELECT value FROM json_each(?))"
    )
    assert st.sql("postgres", "plain") == "SELECT 1 FROM t WHERE k = ANY(?)"
    with pytest.raises(KeyError):
        st.sql("postgres", "shaped postgres")  # not a name of its own
    with pytest.raises(KeyError):
        st.sql("sqlite", "missing")


def test_a_statement_with_a_store_s_own_block_is_not_common() -> None:
    st = _Statements(TEXT.replace("{in_list}", "= ?"))
    assert st.common("plain") == "SELECT 1 FROM t WHERE k = ?"
    with pytest.raises(ValueError, match="differs between the stores"):
        st.common("shaped")


@pytest.mark.parametrize(
    "text, message",
    [
        ("-- name: alone postgres\nSELECT 1", "no common block"),
        (
            "-- name: a\nSELECT 1\n-- name: a postgres\nSELECT 2\n-- name: a postgres\nSELECT 3",
            "named twice",
        ),
        ("-- name: a\nSELECT 1\n-- name: a sqlite\n", "is empty"),
    ],
)
def test_blocks_that_do_not_fit_together_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        named.parse(text)


def test_an_unknown_store_in_a_block_name_is_not_a_block_head() -> None:
    # `-- name: a mysql` is no head: its text stays in the block before it
    blocks = named.parse("-- name: a\nSELECT 1\n-- name: a mysql\nSELECT 2")
    assert list(blocks) == ["a"]
