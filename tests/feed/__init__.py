"""Tests of the change feed, followers, webhooks."""
