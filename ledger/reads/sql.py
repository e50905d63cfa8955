"""The reads' named SQL statements (queries.sql), filled per store dialect."""

from ledger.stores.named import Statements

SQL = Statements("ledger.reads", "queries.sql")
