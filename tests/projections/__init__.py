"""Tests of projections: rebuild, verify, the comparison of tables, the rows' JSON."""
