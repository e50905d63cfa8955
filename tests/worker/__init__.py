"""Tests of the Worker."""
