"""The projections' named statements (`queries.sql` beside this module;
ledger/stores/named.py)."""

from __future__ import annotations

from ledger.stores.named import Statements

STATEMENTS = Statements("ledger.projections", "queries.sql")

__all__ = ["STATEMENTS"]
