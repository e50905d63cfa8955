"""The feed room's named SQL statements (feed.sql), filled per store dialect."""

from ledger.stores.named import Statements

SQL = Statements("ledger.feed", "feed.sql")
