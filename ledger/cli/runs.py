"""The write commands on runs and items (`submit` ... `reconcile`), registered on the
app of `ledger/cli/app.py`: each parses its arguments, calls one `Ledger` command and
prints the result."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from ledger.cli.app import (
    ItemArg,
    JsonOpt,
    ReasonOpt,
    RuleBookCommand,
    RunArg,
    StatedReasonOpt,
    _actor,
    _emit_json,
    _ledger,
    _one_command_only,
    _read_json_file,
    _show_item,
    _show_run,
    _split_ids,
    app,
)

# What `ledger submit --example` prints (examples/manifest.json holds the same): every
# key a first run needs; the manifest reference in the docs lists the rest.
EXAMPLE_MANIFEST: dict[str, Any] = {
    "source_version": "invoices/2026-12-01",
    "config_version": "billing-v3",
    "scope": "December invoices, EU customers",
    "items": [
        {"item_id": "inv-1001", "payload": {"customer": "acme", "amount_cents": 12900}},
        {"item_id": "inv-1002", "payload": {"customer": "globex", "amount_cents": 4500}},
        {
            "item_id": "inv-1003",
            "payload": {"customer": "initech", "amount_cents": 880},
            "required": False,
        },
    ],
    "policy": {
        "max_attempts": 3,
        "backoff_seconds": 5,
        "lease_seconds": 60,
        "partial_delivery": False,
    },
}


@app.command(cls=RuleBookCommand)
def submit(
    ctx: typer.Context,
    manifest: Annotated[
        Path | None,
        typer.Argument(
            metavar="MANIFEST.json",
            exists=True,
            dir_okay=False,
            show_default=False,
            help="The run's manifest: `ledger submit --example` prints one to start from",
        ),
    ] = None,
    example: Annotated[
        bool, typer.Option("--example", help="Print an example manifest and exit")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit a manifest: a new run, queued."""
    from ledger.core.manifest import parse_manifest

    if example:
        typer.echo(json.dumps(EXAMPLE_MANIFEST, indent=2))
        return
    if manifest is None:
        raise typer.BadParameter(
            "a manifest file is needed (`ledger submit --example` prints one)",
            param_hint="MANIFEST.json",
        )
    parsed = parse_manifest(_read_json_file(manifest, "manifest"))
    with _ledger(ctx) as lg:
        status = lg.submit(parsed, _actor(ctx, "submit"))
    _show_run(status, as_json, "submitted")


@app.command(cls=RuleBookCommand)
def start(ctx: typer.Context, run_id: RunArg, as_json: JsonOpt = False) -> None:
    """Start a queued run."""
    with _ledger(ctx) as lg:
        status = lg.start(run_id, _actor(ctx, "start"))
    _show_run(status, as_json, "started")


@app.command(cls=RuleBookCommand)
def complete(ctx: typer.Context, run_id: RunArg, as_json: JsonOpt = False) -> None:
    """Complete a running run: succeeded or completed_with_errors."""
    with _ledger(ctx) as lg:
        status = lg.complete(run_id, _actor(ctx, "complete"))
    _show_run(status, as_json, "completed")


_AMEND_KEYS = ("items", "withdraw", "policy")


@app.command(cls=RuleBookCommand)
def amend(
    ctx: typer.Context,
    run_id: RunArg,
    part: Annotated[
        Path,
        typer.Argument(
            metavar="PART.json",
            exists=True,
            dir_okay=False,
            help='{"items": [...], "withdraw": [ids], "policy": {...}}',
        ),
    ],
    reason: ReasonOpt,
    as_json: JsonOpt = False,
) -> None:
    """Amend a run: add or replace items, withdraw item ids, change policy."""
    from ledger.core.errors import ManifestInvalid

    data = _read_json_file(part, "amendment")
    if isinstance(data, list):
        data = {"items": data}
    if not isinstance(data, dict):
        raise ManifestInvalid(
            "amendment must be a JSON object with items, withdraw or policy", field="amendment"
        )
    unknown = sorted(set(data) - set(_AMEND_KEYS))
    if unknown:
        raise ManifestInvalid(
            f"amendment field {unknown[0]}: unknown key; allowed keys are {', '.join(_AMEND_KEYS)}",
            field=unknown[0],
        )
    if not any(data.get(k) is not None for k in _AMEND_KEYS):
        raise ManifestInvalid(
            "amendment changes nothing; give items, withdraw or policy", field="amendment"
        )
    with _ledger(ctx) as lg:
        status = lg.amend(
            run_id,
            _actor(ctx, "amend"),
            reason,
            items=data.get("items"),
            withdraw=data.get("withdraw"),
            policy=data.get("policy"),
        )
    _show_run(status, as_json, "amended")


@app.command("request-review", cls=RuleBookCommand)
def request_review(
    ctx: typer.Context,
    run_id: RunArg,
    decision: Annotated[str, typer.Option("--decision", help="The decision required")],
    reviewer: Annotated[
        str | None, typer.Option("--reviewer", metavar="ACTOR_ID", help="Route it to this person")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask for a review decision bound to the run's current input version."""
    with _ledger(ctx) as lg:
        status = lg.request_review(
            run_id, _actor(ctx, "request-review"), decision, reviewer=reviewer
        )
    _show_run(status, as_json, f"review requested ({status.input_version}) for")


@app.command(cls=RuleBookCommand)
def review(
    ctx: typer.Context,
    run_id: RunArg,
    input_version: Annotated[
        str, typer.Option("--input-version", help="The input version you reviewed")
    ],
    reason: ReasonOpt,
    approve: Annotated[
        bool, typer.Option("--approve", help="Approve: the run goes back to running")
    ] = False,
    reject: Annotated[bool, typer.Option("--reject", help="Reject: the run fails")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Decide a review: exactly one of --approve (back to running) or --reject (failed)."""
    if approve == reject:
        raise typer.BadParameter("give exactly one of them", param_hint="--approve / --reject")
    with _ledger(ctx) as lg:
        asked = (lg.status(run_id).review or {}).get("decision")
        status = lg.decide(run_id, _actor(ctx, "review"), input_version, approve, reason)
    if as_json:
        _emit_json(status)
        return
    decision = "approved" if approve else "rejected"
    what = f"review {asked!r}" if asked else "the review"
    typer.echo(
        f"{decision} {what} of input {input_version} on run {status.run_id}: "
        f"{status.state} (revision {status.revision})"
    )


@app.command(cls=RuleBookCommand)
def pause(
    ctx: typer.Context,
    run_id: RunArg,
    reason: StatedReasonOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pause a running run: pausing until its leases end, then paused."""
    with _ledger(ctx) as lg:
        status = lg.pause(run_id, _actor(ctx, "pause"), reason)
    _show_run(status, as_json, "paused")


@app.command(cls=RuleBookCommand)
def resume(
    ctx: typer.Context,
    run_id: RunArg,
    reason: StatedReasonOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Resume a pausing or paused run."""
    with _ledger(ctx) as lg:
        status = lg.resume(run_id, _actor(ctx, "resume"), reason=reason)
    _show_run(status, as_json, "resumed")


@app.command(cls=RuleBookCommand)
def cancel(
    ctx: typer.Context,
    run_id: RunArg,
    reason: StatedReasonOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Record the intent to cancel: canceling while leases are live, then canceled."""
    with _ledger(ctx) as lg:
        outcome = lg.cancel(run_id, _actor(ctx, "cancel"), reason)
    if as_json:
        _emit_json(outcome)
        return
    already = " (the cancel was already recorded)" if outcome.already else ""
    typer.echo(
        f"run {outcome.run_id}: {outcome.state}, {outcome.in_flight} attempt(s) in flight{already}"
    )


@app.command(cls=RuleBookCommand)
def fail(
    ctx: typer.Context,
    run_id: RunArg,
    reason: StatedReasonOpt = None,
    permanent: Annotated[
        bool, typer.Option("--permanent", help="A retry would fail identically")
    ] = False,
    failure_reason: Annotated[
        str | None,
        typer.Option(
            "--failure-reason",
            help="input_unavailable, input_invalid, record_corrupt, "
            "invariant_violated, deadline_exceeded, review_rejected, "
            "required_items_not_accepted or operator_decision",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fail a run, transient unless --permanent.

    An operator may fail a run transient only (a controller also permanently)."""
    with _ledger(ctx) as lg:
        status = lg.fail(
            run_id,
            _actor(ctx, "fail"),
            reason,
            transient=not permanent,
            failure_reason=failure_reason,
        )
    _show_run(status, as_json, "failed")


@app.command(cls=RuleBookCommand)
def skip(
    ctx: typer.Context,
    run_id: RunArg,
    item_id: ItemArg,
    reason: StatedReasonOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Skip a pending, retryable or quarantined item."""
    with _ledger(ctx) as lg:
        item = lg.skip(run_id, item_id, _actor(ctx, "skip"), reason)
    _show_item(item, as_json)


@app.command(cls=RuleBookCommand)
def release(
    ctx: typer.Context,
    run_id: RunArg,
    item_id: ItemArg,
    reason: StatedReasonOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Release a quarantined item for another attempt."""
    with _ledger(ctx) as lg:
        item = lg.release(run_id, item_id, _actor(ctx, "release"), reason)
    _show_item(item, as_json)


@app.command("reject-item", cls=RuleBookCommand)
def reject_item(
    ctx: typer.Context,
    run_id: RunArg,
    item_id: ItemArg,
    reason: ReasonOpt,
    rule: Annotated[
        str | None, typer.Option("--rule", help="The rule the item fails (default: the reason)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Reject a quarantined item for good."""
    with _ledger(ctx) as lg:
        item = lg.reject_item(
            run_id,
            item_id,
            _actor(ctx, "reject-item"),
            rule or reason,
            detail=reason if rule else None,
        )
    _show_item(item, as_json)


OptionalReason = Annotated[str | None, typer.Option("--reason", help="Why (recorded)")]


@app.command(cls=RuleBookCommand)
def retry(
    ctx: typer.Context, run_id: RunArg, reason: OptionalReason = None, as_json: JsonOpt = False
) -> None:
    """New run replaying a failed(transient) run's latest input, linked retry_of."""
    with _ledger(ctx) as lg:
        status = lg.retry(run_id, _actor(ctx, "retry"), reason=reason)
    _show_run(status, as_json, f"retry of {run_id}:")


def _policy_option(text: str) -> dict[str, Any]:
    """`--policy JSON`: a JSON object of policy fields (ManifestInvalid otherwise)."""
    from ledger.core.errors import ManifestInvalid
    from ledger.core.validation import strict_loads

    value = strict_loads(
        text.encode(),
        "--policy",
        64 * 1024,
        error=lambda message: ManifestInvalid(message, field="policy"),
    )
    if not isinstance(value, dict):
        raise ManifestInvalid("--policy must be a JSON object of policy fields", field="policy")
    return value


@app.command(cls=RuleBookCommand)
def repair(
    ctx: typer.Context,
    run_id: RunArg,
    items: Annotated[
        str | None,
        typer.Option(
            "--items", metavar="ID,...", help="Items to repair (default: those not accepted)"
        ),
    ] = None,
    corrections: Annotated[
        Path | None,
        typer.Option(
            "--corrections",
            metavar="ITEMS.json",
            exists=True,
            dir_okay=False,
            help="Corrected items (a JSON list); links correction_of",
        ),
    ] = None,
    reason: OptionalReason = None,
    config_version: Annotated[
        str | None,
        typer.Option(
            "--config-version",
            metavar="VERSION",
            help="Run the repair under a corrected configuration version (correction_of)",
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            metavar="JSON",
            help="Policy fields to correct, e.g. '{\"max_attempts\": 5}' (correction_of)",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """New run for a run's items not accepted, linked repair_of / correction_of."""
    fixed = _read_json_file(corrections, "corrections") if corrections else None
    corrected_policy = _policy_option(policy) if policy is not None else None
    with _ledger(ctx) as lg:
        status = lg.repair(
            run_id,
            _actor(ctx, "repair"),
            items=_split_ids(items),
            corrections=fixed,
            reason=reason,
            config_version=config_version,
            policy=corrected_policy,
        )
    _show_run(status, as_json, f"repair of {run_id}:")


@app.command(cls=RuleBookCommand)
def compensate(
    ctx: typer.Context,
    run_id: RunArg,
    reason: StatedReasonOpt = None,
    items: Annotated[str | None, typer.Option("--items", metavar="ID,...")] = None,
    as_json: JsonOpt = False,
) -> None:
    """New run that undoes a run's effects, linked compensates."""
    with _ledger(ctx) as lg:
        status = lg.compensate(run_id, _actor(ctx, "compensate"), reason, items=_split_ids(items))
    _show_run(status, as_json, f"compensation of {run_id}:")


@app.command(cls=RuleBookCommand)
def reconcile(
    ctx: typer.Context,
    watch: Annotated[
        float | None,
        typer.Option(
            "--watch", metavar="SECONDS", min=0.05, help="Repeat every SECONDS until interrupted"
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Expire stale leases, finish cancels and pauses, fail runs past their deadline."""
    import time

    if watch is not None:
        _one_command_only(ctx, "reconcile --watch")
    with _ledger(ctx) as lg:
        while True:
            report = lg.reconcile()
            if as_json:
                typer.echo(json.dumps(report.to_dict()))
            else:
                typer.echo(
                    f"{datetime.now(UTC).isoformat(timespec='seconds')} reconciled: "
                    f"{report.expired_leases} lease(s) expired, {report.finished_cancels} "
                    f"cancel(s) and {report.finished_pauses} pause(s) finished, "
                    f"{report.failed_runs} run(s) failed"
                )
            if watch is None:
                return
            try:
                time.sleep(watch)
            except KeyboardInterrupt:
                return
