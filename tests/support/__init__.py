"""Helpers shared by the tests: clock, drive, findings, the PostgreSQL server and its fixtures, runs and stores, seeds and models."""
