"""Saved event histories (JSON) and helpers to export and import stored events."""
