"""The HTTP room's named SQL statements (http.sql), filled per store dialect."""

from ledger.stores.named import Statements

SQL = Statements("ledger.http", "http.sql")
