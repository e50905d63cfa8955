"""amend: add or replace items, withdraw item ids, or change the policy of an open run;
each amendment is a new input version (its digest is the manifest as it now stands)."""

from __future__ import annotations

import json
from typing import Any

from .. import queries
from .. import states as S
from ..errors import AlreadyTerminal, IllegalTransition, InvalidInput, ItemNotFound, ManifestInvalid
from ..validation import input_version_of
from ..views import Actor, RunStatus
from . import args as A
from .lineage import manifest_of, parse_items
from .runs import _policy
from .uow import UnitOfWork, check_revision, require_role, stamp

EDITABLE = frozenset({S.PENDING, S.RETRYABLE, S.QUARANTINED})


def amend(
    uow: UnitOfWork,
    run_id: str,
    actor: Actor,
    reason: str | None,
    items: list[Any] | None = None,
    withdraw: list[str] | None = None,
    policy: dict[str, Any] | None = None,
    expected_revision: int | None = None,
) -> RunStatus:
    """Add or replace items, withdraw item ids, or change policy: a new input version."""
    run_id = A.run_id(run_id)
    actor = A.actor(actor)
    reason = A.reason(reason)
    expected = A.revision(expected_revision)
    new_items = parse_items(items) if items is not None else []
    if withdraw is not None and (
        not isinstance(withdraw, list) or not all(isinstance(w, str) for w in withdraw)
    ):
        raise InvalidInput("withdraw must be a list of item ids")
    withdraw = list(dict.fromkeys(withdraw or []))
    for w in withdraw:
        A.item_id(w)
    if policy is not None and not isinstance(policy, dict):
        raise ManifestInvalid("policy must be an object", field="policy")
    if not new_items and not withdraw and policy is None:
        raise InvalidInput("amend needs items, withdraw or policy")
    overlap = {i.item_id for i in new_items} & set(withdraw)
    if overlap:
        raise InvalidInput(f"items {sorted(overlap)} are both replaced and withdrawn")
    roles = S.RUN_COMMAND_ROLES["amend"]
    with uow.write() as tx:
        run = uow.load_run(tx, run_id)
        for w in withdraw:  # existence before role (SPEC order of checks)
            uow.item_row(tx, run_id, w)
        require_role(actor, roles, "amend")
        check_revision(expected, run.version, run.state, f"run {run_id}")
        if S.is_terminal(run.state):
            raise AlreadyTerminal(
                f"run {run_id} is {run.state}, which is terminal; amend is allowed "
                "while it is not terminal (a repair starts a new linked run)",
                state=run.state,
                allowed=set(S.RUN_STATES) - S.TERMINAL_RUN_STATES,
            )
        if run.state == S.CANCELING:
            raise IllegalTransition(
                f"run {run_id} is canceling; amend is not allowed",
                state=run.state,
                allowed=set(S.RUN_STATES) - S.TERMINAL_RUN_STATES - {S.CANCELING},
            )
        new_policy = (
            _policy(run.policy, policy).model_dump(mode="json") if policy is not None else None
        )
        rows = {
            r["item_id"]: r
            for r in tx.fetchall(
                "SELECT item_id, required, payload, state, in_manifest, revision, attempts, "
                "lease_token, lease_worker, lease_expires_at, eligible_at, last_error, reason, "
                "updated_at, run_id FROM lg_items WHERE run_id = ? ORDER BY seq",
                (run_id,),
            )
        }
        added, replaced = [], []
        for it in new_items:
            d = it.model_dump(mode="json")
            row = rows.get(it.item_id)
            if row is None:
                added.append(d)
            elif row["state"] in EDITABLE and row["in_manifest"]:
                replaced.append(d)
            else:
                raise IllegalTransition(
                    f"item {it.item_id!r} is {row['state']}"
                    f"{'' if row['in_manifest'] else ' (withdrawn)'}; only pending, "
                    "retryable or quarantined items may be replaced",
                    state=row["state"],
                    allowed=EDITABLE,
                )
        wd_rule = S.item_rule("withdraw")
        for w in withdraw:
            row = rows.get(w)
            if row is None:
                raise ItemNotFound(run_id, w)
            if row["state"] not in wd_rule.sources or not row["in_manifest"]:
                raise IllegalTransition(
                    f"item {w!r} is {row['state']}; withdraw is allowed from: "
                    f"{', '.join(sorted(wd_rule.sources))}",
                    state=row["state"],
                    allowed=wd_rule.sources,
                )
        # the new input version: digest of the manifest as it now stands
        manifest_items = []
        repl = {d["item_id"]: d for d in replaced}
        for item_id, row in rows.items():
            if not row["in_manifest"] or item_id in withdraw:
                continue
            manifest_items.append(
                repl.get(item_id)
                or {
                    "item_id": item_id,
                    "required": bool(row["required"]),
                    "payload": json.loads(row["payload"]),
                }
            )
        manifest_items.extend(added)
        manifest = manifest_of(run, manifest_items, new_policy or run.policy)
        now = tx.now()
        at = stamp(now, run)
        withdrawn_items = []
        for w in withdraw:
            item = uow.materialize(rows[w], now)
            item.transition(
                "withdraw",
                S.SKIPPED,
                actor.id,
                actor.role,
                reason or "withdrawn",
                {"withdrawn": True},
                stamp(now, item),
            )
            withdrawn_items.append(item)
        run.amend(
            actor.id,
            actor.role,
            reason,
            added,
            replaced,
            withdraw,
            new_policy,
            input_version_of(manifest),
            at,
        )
        uow.commit(tx, {run_id: run}, withdrawn_items, first="run")
        return queries.status_tx(tx, run_id)
