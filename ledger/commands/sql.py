"""The command handlers' named SQL statements (commands.sql), filled per store dialect."""

from ledger.stores.named import Statements

SQL = Statements("ledger.commands", "commands.sql")
