"""Tests of the `ledger` command."""
