"""Tests of the domain: states, the rule book's tables, errors, redaction, the input checks."""
