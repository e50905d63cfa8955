"""Read models rebuilt from the ledger's events: run status, items, attempts,
the transition log and lineage. Everything here only reads events and writes
projection tables."""
