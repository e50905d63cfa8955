"""Tests of the HTTP API and the operator page."""
