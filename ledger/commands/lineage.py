"""Commands that create a run: submit, and the linked runs retry, repair, compensate."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from ledger.commands.runs import _policy
from ledger.commands.sql import SQL
from ledger.commands.uow import UnitOfWork, require_role
from ledger.commands.weakening import govern, weakenings
from ledger.core import args as A
from ledger.core import states as S
from ledger.core.domain import Run, run_stream_id
from ledger.core.errors import (
    Conflict,
    IllegalTransition,
    InvalidInput,
    ItemNotFound,
    ManifestInvalid,
)
from ledger.core.tracing import current_traceparent
from ledger.core.validation import check_identifier, input_version_of, input_version_of_text
from ledger.core.views import Actor, RunStatus
from ledger.reads import queries
from ledger.stores.base import Tx
from ledger.stores.raw import refuse_if_archived

if TYPE_CHECKING:
    from ledger.core.manifest import Manifest, ManifestItem


def parse_items(data: Any, field: str = "items") -> list[ManifestItem]:
    """Manifest items (pydantic loads on first use)."""
    from ledger.core.manifest import parse_items as parse

    return parse(data, field)


def manifest_of(run: Run, items: list[dict[str, Any]], policy: dict[str, Any]) -> dict[str, Any]:
    """A manifest with the run's versions and scope, and the given items and policy."""
    return {
        "source_version": run.source_version,
        "config_version": run.config_version,
        "scope": run.scope,
        "items": items,
        "policy": policy,
    }


def current_manifest(tx: Tx, run: Run, which: str = "") -> dict[str, Any]:
    """The run's latest input (its items still in the manifest; `which`: all of them, or
    "_accepted" or "_not_accepted" ones: commands.sql, manifest*)."""
    refuse_if_archived(tx, run.run_id, run.state)  # its items left with its events
    rows = tx.fetchall(SQL.sql(tx, "manifest" + which), (run.run_id,))
    items = [
        {
            "item_id": r["item_id"],
            "required": bool(r["required"]),
            "payload": json.loads(r["payload"]),
        }
        for r in rows
    ]
    return manifest_of(run, items, run.policy)


# The relation each linked-run command starts (a repair decides its own: repair_of, or
# correction_of with corrections).
RELATIONS: dict[str, tuple[str, ...]] = {"retry": ("retry_of",), "compensate": ("compensates",)}


def one_open(tx: Tx, original: Run, command: str, relation: str | None = None) -> None:
    """rule 15 of the rule book: Conflict when the run already has an open linked run of the relation
    (the original's row is locked, so two concurrent ones cannot both pass)."""
    relations = (relation,) if relation else RELATIONS[command]
    for row in tx.fetchall(SQL.sql(tx, "open_runs_of_root"), (original.root_run_id,)):
        for link in json.loads(row["links"]):
            if link["run_id"] == original.run_id and link["relation"] in relations:
                raise Conflict(
                    f"run {original.run_id} already has an open {link['relation']} run "
                    f"{row['run_id']} ({row['state']}); let it end (or cancel it) before "
                    f"another {command}",
                    current_revision=original.version,
                    current_state=original.state,
                )


def submit(
    uow: UnitOfWork, manifest: Manifest | dict[str, Any] | str | bytes, actor: Actor
) -> RunStatus:
    """Record a new run, `queued`."""
    from ledger.core.manifest import parse_manifest_json

    _m, plain, text = parse_manifest_json(manifest)
    actor = A.actor(actor)
    require_role(actor, S.run_rule("submit").roles, "submit")
    with uow.write() as tx:
        return create_run(
            uow,
            tx,
            plain,
            actor,
            "submit",
            S.stated_reason("submit"),
            [],
            None,
            input_version_of_text(text),
        )


def create_run(
    uow: UnitOfWork,
    tx: Tx,
    manifest: dict[str, Any],
    actor: Actor,
    command: str,
    reason: str,
    links: list[dict[str, str]],
    original: Run | None,
    input_version: str | None = None,
    weakened: list[str] | None = None,
) -> RunStatus:
    """A new run, queued, linked to `original` when given. `weakened`: how its acceptance
    is weaker than the original's (an operator's decision, with `reason`), recorded as
    its own transition right after the submit."""
    run_id = str(uuid.uuid4())
    now = tx.now()
    run = Run._create(
        Run.Submitted,
        id=run_stream_id(run_id),
        run_id=run_id,
        command=command,
        manifest=manifest,
        input_version=input_version or input_version_of(manifest),
        actor_id=actor.id,
        role=actor.role,
        reason=reason,
        links=links,
        root_run_id=original.root_run_id if original else run_id,
        timestamp=now,
    )
    traceparent = current_traceparent()
    if traceparent is not None:
        # the run remembers the trace that made it, so the workers' spans can link to it
        object.__setattr__(run.pending_events[0], "traceparent", traceparent)
    if weakened:
        assert original is not None
        run.transition(
            "weaken_acceptance",
            run.state,
            actor.id,
            actor.role,
            reason,
            {"weakened": weakened, "relative_to": original.run_id},
            now,
        )
    runs = {run_id: run}
    if original is not None:
        runs[original.run_id] = original
    uow.commit(tx, runs)
    return queries.status_tx(tx, run_id)


def retry(uow: UnitOfWork, run_id: str, actor: Actor, reason: str | None = None) -> RunStatus:
    """A new run replaying a failed(transient) run's latest input exactly."""
    run_id = A.run_id(run_id)
    actor = A.actor(actor)
    reason = A.reason(reason)
    rule = S.run_rule("retry")
    with uow.write() as tx:
        original = uow.load_run(tx, run_id)
        require_role(actor, rule.roles, "retry")
        if original.state not in rule.run_states or original.failure_kind != S.TRANSIENT:
            raise IllegalTransition(
                f"run {run_id} is {original.state}"
                + (f" ({original.failure_kind})" if original.failure_kind else "")
                + "; retry needs a failed(transient) run (use repair for other cases)",
                state=original.state,
                allowed=rule.run_states,
            )
        one_open(tx, original, "retry")
        manifest = current_manifest(tx, original)
        # the original's latest input exactly: weaker only if that ever changes
        weakened = linked_weakenings(tx, original, manifest)
        if weakened:
            govern(original, actor, reason, weakened)
        return create_run(
            uow,
            tx,
            manifest,
            actor,
            "retry",
            reason or S.stated_reason("retry", original=run_id),
            [{"relation": "retry_of", "run_id": run_id}],
            original,
            weakened=weakened,
        )


def repair(
    uow: UnitOfWork,
    run_id: str,
    actor: Actor,
    items: list[str] | None = None,
    corrections: list[Any] | None = None,
    reason: str | None = None,
    config_version: str | None = None,
    policy: dict[str, Any] | None = None,
) -> RunStatus:
    """A new linked run for the items not accepted (or given ids), or for corrected items;
    with `config_version` or `policy`, under a corrected configuration (correction_of)."""
    run_id = A.run_id(run_id)
    actor = A.actor(actor)
    reason = A.reason(reason)
    if config_version is not None:
        check_identifier(config_version, "config_version")
    if policy is not None and not isinstance(policy, dict):
        raise ManifestInvalid("policy must be an object", field="policy")
    if items is not None:
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise InvalidInput("items must be a list of item ids")
        items = [check_identifier(i, "items") for i in items]  # kept as manifests keep ids (NFC)
    fixed = parse_items(corrections, "corrections") if corrections is not None else None
    rule = S.run_rule("repair")
    with uow.write() as tx:
        original = uow.load_run(tx, run_id)
        for named in [*(items or []), *(f.item_id for f in fixed or [])]:
            uow.item_row(
                tx, run_id, named
            )  # existence before role (the rule book's order of checks)
        require_role(actor, rule.roles, "repair")
        if original.state not in rule.run_states:
            raise IllegalTransition(
                f"run {run_id} is {original.state}; repair needs a terminal run "
                "(amend a run that is still open)",
                state=original.state,
                allowed=rule.run_states,
            )
        corrected = config_version is not None or policy is not None
        if fixed:
            known = {r["item_id"] for r in tx.fetchall(SQL.sql(tx, "item_ids"), (run_id,))}
            manifest = manifest_of(
                original, [f.model_dump(mode="json") for f in fixed], original.policy
            )
            relation = "correction_of"
            unknown = [f.item_id for f in fixed if f.item_id not in known]
            if unknown:
                raise ItemNotFound(run_id, unknown[0])
        elif items:
            manifest = current_manifest(tx, original)
            by_id = {i["item_id"]: i for i in manifest["items"]}
            missing = [i for i in items if i not in by_id]
            if missing:
                raise ItemNotFound(run_id, missing[0])
            manifest["items"] = [by_id[i] for i in dict.fromkeys(items)]
            relation = "repair_of"
        else:
            manifest = current_manifest(tx, original, "_not_accepted")
            relation = "repair_of"
        if corrected:
            # seed 000: the linked run carries the corrected configuration
            relation = "correction_of"
            if config_version is not None:
                manifest["config_version"] = config_version
            if policy is not None:
                manifest["policy"] = _policy(original.policy, policy).model_dump(mode="json")
        if not manifest["items"]:
            raise InvalidInput(f"run {run_id} has no items to repair: every item was accepted")
        # a repair may not shed what an amendment may not (the same notion, the same roles)
        weakened = linked_weakenings(tx, original, manifest)
        if weakened:
            govern(original, actor, reason, weakened)
        one_open(tx, original, "repair", relation)
        return create_run(
            uow,
            tx,
            manifest,
            actor,
            "repair",
            reason
            or S.stated_reason("repair", relation=relation.replace("_", " "), original=run_id),
            [{"relation": relation, "run_id": run_id}],
            original,
            weakened=weakened,
        )


def compensate(
    uow: UnitOfWork, run_id: str, actor: Actor, reason: str | None, items: list[Any] | None = None
) -> RunStatus:
    """A separately authorized new run that undoes effects of a run (default: its accepted items)."""
    run_id = A.run_id(run_id)
    actor = A.actor(actor)
    reason = A.stated_reason(reason, "compensate")
    rule = S.run_rule("compensate")
    ids: list[str] | None = None
    given: list[ManifestItem] | None = None
    if items is not None:
        if not isinstance(items, list):
            raise InvalidInput("items must be a list of item ids or item objects")
        if all(isinstance(i, str) for i in items):
            ids = [check_identifier(i, "items") for i in items]  # kept as manifests keep ids
        else:
            given = parse_items(items)
    with uow.write() as tx:
        original = uow.load_run(tx, run_id)
        if ids:
            refuse_if_archived(tx, run_id, original.state)  # its items are in the archive
        for named in ids or []:
            uow.item_row(
                tx, run_id, named
            )  # existence before role (the rule book's order of checks)
        require_role(actor, rule.roles, "compensate")
        if original.state not in rule.run_states:
            raise IllegalTransition(
                f"run {run_id} is {original.state}; compensate needs a terminal run "
                "(cancel it first)",
                state=original.state,
                allowed=rule.run_states,
            )
        one_open(tx, original, "compensate")
        if given is not None:
            manifest = manifest_of(
                original, [g.model_dump(mode="json") for g in given], original.policy
            )
        else:
            manifest = current_manifest(tx, original, "_accepted")
            if ids is not None:
                by_id = {i["item_id"]: i for i in current_manifest(tx, original)["items"]}
                missing = [i for i in ids if i not in by_id]
                if missing:
                    raise ItemNotFound(run_id, missing[0])
                manifest["items"] = [by_id[i] for i in dict.fromkeys(ids)]
        if not manifest["items"]:
            raise InvalidInput(
                f"run {run_id} has no accepted items to compensate; name items explicitly"
            )
        policy = dict(original.policy)
        policy["review"] = None
        policy["partial_delivery"] = False
        policy["tolerated_failures"] = None
        manifest["policy"] = policy
        # undoing effects is not the original's work under review: the compensation run
        # carries no review, a weakening the operator's reason covers and the history shows
        weakened = linked_weakenings(tx, original, manifest)
        if weakened:
            govern(original, actor, reason, weakened)
        return create_run(
            uow,
            tx,
            manifest,
            actor,
            "compensate",
            reason,
            [{"relation": "compensates", "run_id": run_id}],
            original,
            weakened=weakened,
        )


def linked_weakenings(tx: Tx, original: Run, manifest: dict[str, Any]) -> list[str]:
    """How a linked run's manifest weakens acceptance against its original's (rule 13 of
    the rule book, the notion amend uses): its policy, and the original's required items
    it carries as optional."""
    was_required = {
        r["item_id"] for r in tx.fetchall(SQL.sql(tx, "required_item_ids"), (original.run_id,))
    }
    return weakenings(
        tx,
        original,
        _policy(original.policy),
        _policy(manifest.get("policy", original.policy)),
        required_to_optional=[
            i["item_id"]
            for i in manifest["items"]
            if i["item_id"] in was_required and not i.get("required", True)
        ],
    )
