"""Tests of write commands: SPEC's rules and tables, terminal runs, the reconciler, invariants, fencing, the stateful models."""
