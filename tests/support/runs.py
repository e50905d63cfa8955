"""Test actors, the small manifest, and runs made through the public commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ledger import Actor, Ledger

SUBMITTER = Actor("sam", "submitter")
CONTROLLER = Actor("ctl", "controller")
WORKER = Actor("w1", "worker")
REVIEWER = Actor("rita", "reviewer")
OPERATOR = Actor("olga", "operator")
RECONCILER = Actor("rec", "reconciler")


def manifest(n: int = 3, **policy: Any) -> dict[str, Any]:
    """A small valid manifest with items i0..i{n-1}."""
    return {
        "source_version": "exports/2026-11-28",
        "config_version": "cfg-1",
        "scope": "test",
        "items": [{"item_id": f"i{k}", "payload": {"n": k}} for k in range(n)],
        "policy": policy,
    }


def running(
    lg: Ledger,
    n: int = 2,
    *,
    manifest_of: Callable[..., dict[str, Any]] = manifest,
    **policy: Any,
) -> str:
    """A started run of `n` items (`manifest_of(n, **policy)`, by default `manifest`)."""
    run_id = lg.submit(manifest_of(n, **policy), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    return run_id


def finished_run(lg: Ledger, n: int = 3) -> str:
    """A run of `n` items, each claimed and accepted, then completed (succeeded)."""
    run_id = running(lg, n)
    for lease in lg.claim(run_id, WORKER, limit=n):
        lg.accept(lease)
    lg.complete(run_id, CONTROLLER)
    return run_id


def items_from_one(n: int, **policy: Any) -> dict[str, Any]:
    """A manifest with items i1..i{n} (payload `{"k": k}`), no scope: the Worker's tests."""
    return {
        "source_version": "src-1",
        "config_version": "cfg-1",
        "items": [{"item_id": f"i{k}", "payload": {"k": k}} for k in range(1, n + 1)],
        "policy": policy,
    }
