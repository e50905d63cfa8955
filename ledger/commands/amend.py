"""amend: add or replace items, withdraw item ids, or change the policy of an open run;
each amendment is a new input version (its digest is the manifest as it now stands)."""

from __future__ import annotations

import json
from typing import Any

from ledger.commands.lineage import manifest_of, parse_items
from ledger.commands.runs import _policy
from ledger.commands.sql import SQL
from ledger.commands.uow import UnitOfWork, check_revision, require_role, require_run_state, stamp
from ledger.commands.weakening import govern, weakenings
from ledger.core import args as A
from ledger.core import states as S
from ledger.core.errors import (
    IllegalTransition,
    InvalidInput,
    ItemNotFound,
    ManifestInvalid,
)
from ledger.core.validation import check_identifier, input_version_of
from ledger.core.views import Actor, RunStatus
from ledger.reads import queries

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
    # each id as a manifest's ids are kept (NFC)
    withdraw = list(dict.fromkeys(check_identifier(w, "withdraw") for w in withdraw or []))
    if policy is not None and not isinstance(policy, dict):
        raise ManifestInvalid("policy must be an object", field="policy")
    if not new_items and not withdraw and policy is None:
        raise InvalidInput("amend needs items, withdraw or policy")
    overlap = {i.item_id for i in new_items} & set(withdraw)
    if overlap:
        raise InvalidInput(f"items {sorted(overlap)} are both replaced and withdrawn")
    rule = S.command_rule("amend")
    with uow.write() as tx:
        run = uow.load_run(tx, run_id)
        for w in withdraw:  # existence before role (the rule book's order of checks)
            uow.item_row(tx, run_id, w)
        require_role(actor, rule.roles, "amend")
        check_revision(expected, run.version, run.state, f"run {run_id}")
        require_run_state(run, rule)
        new_policy = (
            _policy(run.policy, policy).model_dump(mode="json") if policy is not None else None
        )
        rows = {r["item_id"]: r for r in tx.fetchall(SQL.sql(tx, "items_to_amend"), (run_id,))}
        made_optional = [
            it.item_id
            for it in new_items
            if it.item_id in rows and rows[it.item_id]["required"] and not it.required
        ]
        weakened = weakenings(
            tx,
            run,
            _policy(run.policy),
            _policy(new_policy) if new_policy is not None else _policy(run.policy),
            tx.now(),
            made_optional,
        )
        if weakened:
            govern(run, actor, reason, weakened)
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
        input_version = input_version_of(manifest)
        why = reason or S.stated_reason("amend", input_version=input_version)
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
                reason or S.stated_reason("withdraw"),
                {"withdrawn": True},
                stamp(now, item),
                run.state,
            )
            withdrawn_items.append(item)
        if weakened:
            # the weakening is its own recorded transition, before the amendment itself
            run.transition(
                "weaken_acceptance",
                run.state,
                actor.id,
                actor.role,
                reason,
                {"weakened": weakened},
                at,
            )
        run.amend(
            actor.id, actor.role, why, added, replaced, withdraw, new_policy, input_version, at
        )
        uow.commit(tx, {run_id: run}, withdrawn_items, first="run")
        return queries.status_tx(tx, run_id)
