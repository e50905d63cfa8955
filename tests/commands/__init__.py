"""Tests of write commands: the rule book's rules and tables, terminal runs, the reconciler, invariants, fencing, the stateful models."""
