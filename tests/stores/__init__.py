"""Tests of the stores: recorders, migrations, PostgreSQL, positions, the hash chain, SQLite concurrency, statements."""
