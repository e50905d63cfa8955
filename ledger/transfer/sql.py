"""The transfer room's named SQL statements (transfer.sql), filled per store dialect."""

from ledger.stores.named import Statements

SQL = Statements("ledger.transfer", "transfer.sql")
