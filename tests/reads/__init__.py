"""Tests of reads: paging and its cost, overview, signals, status cost, status as of a time, audit."""
