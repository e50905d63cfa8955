"""Property tests of import as a writer like any other.

1. For random valid command sequences, an export imported into an empty ledger gives
   the same heads.
2. For a random change of one event of that export (its state, actor, role, time or
   evidence) with every hash made again, the import either refuses with a typed error
   naming a rule of the rule checker, or the changed history also passes every rule a
   command obeys (checked here by an oracle written from the contract's tables, not by
   the ledger's own checker). There is no third outcome.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import Ledger, LedgerError
from ledger.core import states as S
from ledger.core.rule_check import RULE_NAMES
from ledger.transfer.history_file import Chains, ImportRefused, event_line, parse_event
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, REVIEWER, SUBMITTER, WORKER, manifest

OPS = (
    "submit",
    "submit_reviewed",
    "start",
    "claim",
    "accept",
    "fail_attempt",
    "heartbeat",
    "advance",
    "reconcile",
    "complete",
    "request_review",
    "approve",
    "pause",
    "resume",
    "cancel",
    "amend",
    "skip",
)


def _drive(lg: Ledger, clock: ManualClock, ops: list[tuple[str, int]]) -> None:
    """Each op on one of the runs made so far; a command the rule book refuses writes
    nothing and is skipped."""
    runs: list[str] = []
    leases: list[Any] = []
    for op, k in ops:
        run = runs[k % len(runs)] if runs else None
        try:
            if op in ("submit", "submit_reviewed") or run is None:
                policy: dict[str, Any] = {"lease_seconds": 30, "max_attempts": 2}
                if op == "submit_reviewed":
                    policy["review"] = {"decision": "ok", "survives_amendment": False}
                runs.append(lg.submit(manifest(1 + k % 3, **policy), SUBMITTER).run_id)
                if k % 2 == 0:  # most runs start at once: the histories reach their items
                    lg.start(runs[-1], CONTROLLER)
            elif op == "start":
                lg.start(run, CONTROLLER)
            elif op == "claim":
                leases.extend(lg.claim(run, WORKER, limit=2))
            elif op in ("accept", "fail_attempt", "heartbeat") and leases:
                lease = leases.pop(k % len(leases))
                if op == "accept":
                    lg.accept(lease)
                elif op == "fail_attempt":
                    lg.fail_attempt(lease, "flaky")
                else:
                    lg.heartbeat(lease)
                    leases.append(lease)
            elif op == "advance":
                clock.advance(10 + 10 * (k % 3))
            elif op == "reconcile":
                lg.reconcile()
            elif op == "complete":
                lg.complete(run, CONTROLLER)
            elif op == "request_review":
                lg.request_review(run, CONTROLLER, "ok")
            elif op == "approve":
                version = lg.status(run).input_version
                lg.decide(run, REVIEWER, version, True, "fine")
            elif op == "pause":
                lg.pause(run, OPERATOR, "hold")
            elif op == "resume":
                lg.resume(run, OPERATOR, "go on")
            elif op == "cancel":
                lg.cancel(run, SUBMITTER, "not needed")
            elif op == "amend":
                lg.amend(run, SUBMITTER, "more", items=[{"item_id": f"x{k}", "payload": {"k": k}}])
            elif op == "skip":
                pending = [i for i in lg.items(run) if i.state == S.PENDING]
                if pending:
                    lg.skip(run, pending[0].item_id, OPERATOR, "not needed")
        except LedgerError:
            pass


def _history(ops: list[tuple[str, int]]) -> str:
    clock = ManualClock()
    with Ledger.open("memory://", clock=clock) as lg:
        _drive(lg, clock, ops)
        out = io.StringIO()
        lg.export(out)
        return out.getvalue()


ops_strategy = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 5)), min_size=4, max_size=40)
SETTINGS = settings(
    max_examples=int(os.environ.get("LEDGER_PROPERTY_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(ops=ops_strategy)
def test_an_export_imported_into_an_empty_ledger_gives_the_same_heads(
    ops: list[tuple[str, int]],
) -> None:
    clock = ManualClock()
    with Ledger.open("memory://", clock=clock) as source:
        _drive(source, clock, ops)
        out = io.StringIO()
        source.export(out)
        heads = source.verify().heads
    with Ledger.open("memory://") as target:
        summary = target.import_file(io.StringIO(out.getvalue()))
        assert summary.verify_ok, summary.problems
        assert target.verify().heads == heads


# --------------------------------------------------------------------------
# one event changed, hashes made again
# --------------------------------------------------------------------------
ACTORS = ("sam", "ctl", "w1", "w2", "rita", "olga", "rec", S.LEDGER_ACTOR_ID, "mallory")
FIELDS = ("state", "actor", "role", "time", "evidence")


def _mutated(text: str, pick: int, field: str, choice: int) -> tuple[str, str] | None:
    """The file with one transition changed in `field` (None when there is nothing to
    change), and what was changed."""
    lines = text.splitlines()
    events = [parse_event(json.loads(x), k) for k, x in enumerate(lines[:-1], start=1)]
    movable = [k for k, e in enumerate(events) if e.topic.endswith(("Transitioned", "Extended"))]
    if not movable:
        return None
    k = movable[pick % len(movable)]
    doc = json.loads(events[k].state)
    what = _change(doc, events[k].topic, field, choice)
    if what is None:
        return None
    events[k] = events[k]._replace(state=json.dumps(doc, separators=(",", ":")).encode())
    chains = Chains()
    out = []
    for e in events:
        e = e._replace(hash=None)
        assert chains.add(e) is None
        out.append(event_line(e._replace(hash=chains.heads[e.stream][1])))
    out.append(json.dumps(chains.closing(True)))
    return "\n".join(out) + "\n", f"{events[k].topic} v{events[k].version}: {what}"


def _change(doc: dict[str, Any], topic: str, field: str, choice: int) -> str | None:
    if field == "time":
        stamp = doc["timestamp"]["_data_"]
        shift = timedelta(seconds=((choice % 14) - 7) * 600 or 1)
        doc["timestamp"]["_data_"] = (datetime.fromisoformat(stamp) + shift).isoformat()
        return f"time {shift}"
    if field == "actor":
        new = ACTORS[choice % len(ACTORS)]
        if doc.get("actor_id") == new:
            return None
        doc["actor_id"] = new
        return f"actor {new}"
    if topic.endswith("Extended"):  # a heartbeat: its token stands for state and evidence
        if field in ("state", "evidence"):
            doc["token"] = "forged-" + "x" * (choice % 3)
            return "token"
        return None
    if field == "role":
        new = S.ROLES[choice % len(S.ROLES)]
        if doc["role"] == new:
            return None
        doc["role"] = new
        return f"role {new}"
    if field == "state":
        key = ("from_state", "to_state")[choice % 2]
        states = S.ITEM_STATES if "Item." in topic else S.RUN_STATES
        new = states[(choice // 2) % len(states)]
        if doc[key] == new:
            return None
        doc[key] = new
        return f"{key} {new}"
    evidence = doc["evidence"]
    if not evidence:
        evidence["forged"] = True
        return "evidence added"
    key = sorted(evidence)[choice % len(evidence)]
    if choice % 2:
        del evidence[key]
        return f"evidence {key} dropped"
    evidence[key] = "forged"
    return f"evidence {key} changed"


@SETTINGS
@given(
    ops=ops_strategy,
    pick=st.integers(0, 200),
    field=st.sampled_from(FIELDS),
    choice=st.integers(0, 200),
)
def test_a_changed_event_is_refused_naming_a_rule_or_breaks_none(
    ops: list[tuple[str, int]], pick: int, field: str, choice: int
) -> None:
    changed = _mutated(_history(ops), pick, field, choice)
    if changed is None:
        return
    text, what = changed
    with Ledger.open("memory://") as target:
        try:
            summary = target.import_file(io.StringIO(text))
        except ImportRefused as e:
            assert e.rule in RULE_NAMES, f"refused without naming a rule ({what}): {e}"
            with target.store.read() as tx:
                assert tx.fetchone("SELECT COUNT(*) AS n FROM lg_runs")["n"] == 0  # type: ignore[index]
            return
        assert summary.verify_ok, (what, summary.problems)
    history = [json.loads(x) for x in text.splitlines()[:-1]]
    assert command_path_problems(history) == [], what


# --------------------------------------------------------------------------
# the oracle: the rules a command obeys, from the contract's tables
# --------------------------------------------------------------------------
RECONCILE_MADE = {"expire", "deadline", "reconcile_deadline"}
LEDGER_MADE = {"pause_finished", "cancel_finished", "cancel_skip", "abandon"}


def command_path_problems(lines: list[dict[str, Any]]) -> list[str]:
    """What in a history no sequence of commands could have written."""
    problems: list[str] = []
    runs: dict[str, dict[str, Any]] = {}
    items: dict[str, dict[str, Any]] = {}  # stream -> state, lease, holder, expires
    last: dict[str, datetime] = {}
    for line in lines:
        e = json.loads(line["state"])
        stream, topic = line["stream"], line["topic"]
        at = datetime.fromisoformat(e["timestamp"]["_data_"])
        if stream in last and at < last[stream]:
            problems.append(f"{stream}: time goes backwards")
        last[stream] = at
        say: Callable[[str], None] = problems.append
        if topic.endswith("Run.Submitted"):
            required = {i["item_id"]: i.get("required", True) for i in e["manifest"]["items"]}
            runs[stream] = {
                "state": S.QUEUED,
                "creator": e["actor_id"],
                "amenders": set(),
                "required": required,
                "items": dict.fromkeys(required, S.PENDING),
                "review": None,
            }
            continue
        if topic.endswith("Run.Amended"):
            run = runs[stream]
            run["amenders"].add(e["actor_id"])
            for added in e["added"]:
                run["required"][added["item_id"]] = added.get("required", True)
                run["items"][added["item_id"]] = S.PENDING
            if e["state"] != run["state"]:
                say(f"{stream}: amend from {e['state']}, run is {run['state']}")
            continue
        if topic.endswith("Run.Transitioned"):
            _run_move(stream, runs[stream], e, say)
            continue
        run = runs[e["run_id"]]
        item = items.setdefault(stream, {"state": S.PENDING, "lease": None, "holder": None})
        if topic.endswith("Item.LeaseExtended"):
            if item["state"] != S.IN_PROGRESS or e["token"] != item["lease"]:
                say(f"{stream}: heartbeat without the live lease")
            if e["actor_id"] != item["holder"]:
                say(f"{stream}: heartbeat by {e['actor_id']}, not the holder")
            item["expires"] = e["expires_at"]
            continue
        _item_move(stream, run, item, e, at, say)
    return problems


def _common(rule: S.Rule, e: dict[str, Any], frm: str, say: Callable[[str], None]) -> None:
    roles = set(rule.roles)
    if rule.command in RECONCILE_MADE:
        roles |= set(S.command_rule("reconcile").roles)
    if e["role"] not in roles:
        say(f"{rule.command} by role {e['role']}")
    if e["from_state"] != frm:
        say(f"{rule.command} from {e['from_state']}, but it is {frm}")
    if frm not in rule.sources or e["to_state"] not in (rule.targets or (frm,)):
        say(f"{rule.command} {frm} -> {e['to_state']} is not in the table")
    if any((e["evidence"] or {}).get(k) is None for k in rule.evidence):
        say(f"{rule.command} without its evidence")
    if e["actor_id"] == S.LEDGER_ACTOR_ID and rule.command not in LEDGER_MADE:
        say(f"{rule.command} by the reserved actor")
    if e["role"] == S.RECONCILER and e["to_state"] in (S.ACCEPTED, S.SUCCEEDED):
        say(f"{rule.command}: a reconciler's success")


def _run_move(
    stream: str, run: dict[str, Any], e: dict[str, Any], say: Callable[[str], None]
) -> None:
    try:
        rule = S.any_run_rule(e["command"])
    except KeyError:
        say(f"{stream}: unknown command {e['command']}")
        return
    if run["state"] in S.TERMINAL_RUN_STATES:
        say(f"{stream}: a terminal run changed")
    _common(rule, e, run["state"], say)
    ev = e["evidence"] or {}
    if e["command"] == "request_review":
        run["review"] = ev.get("input_version")
    if e["command"] == "decide":
        if e["actor_id"] == run["creator"] or e["actor_id"] in run["amenders"]:
            say(f"{stream}: review decided by its submitter or an amender")
        if ev.get("input_version") != run["review"]:
            say(f"{stream}: decision of another input version")
    if e["command"] == "weaken_acceptance":
        run["amenders"].add(e["actor_id"])
    if e["to_state"] in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS):
        states = run["items"].values()
        if any(s in (S.PENDING, S.IN_PROGRESS, S.RETRYABLE) for s in states):
            say(f"{stream}: {e['to_state']} with work open")
        if e["to_state"] == S.SUCCEEDED and any(
            run["required"][i] and s != S.ACCEPTED for i, s in run["items"].items()
        ):
            say(f"{stream}: succeeded with a required item not accepted")
    run["state"] = e["to_state"]


def _item_move(
    stream: str,
    run: dict[str, Any],
    item: dict[str, Any],
    e: dict[str, Any],
    at: datetime,
    say: Callable[[str], None],
) -> None:
    try:
        rule = S.item_rule(e["command"])
    except KeyError:
        say(f"{stream}: unknown command {e['command']}")
        return
    if run["state"] in S.TERMINAL_RUN_STATES or (
        rule.run_states and run["state"] not in rule.run_states
    ):
        say(f"{stream}: {rule.command} while the run is {run['state']}")
    _common(rule, e, item["state"], say)
    ev = e["evidence"] or {}
    if rule.command in ("accept", "reject", "fail_attempt", "expire", "abandon"):
        if item["state"] != S.IN_PROGRESS or ev.get("lease_token") != item["lease"]:
            say(f"{stream}: {rule.command} without the live lease")
        if rule.command not in ("expire", "abandon") and e["actor_id"] != item["holder"]:
            say(f"{stream}: {rule.command} by {e['actor_id']}, not the holder")
        stepped = ev.get("clock_stepped_back") is not None
        expires = item.get("expires") if rule.command == "expire" and not stepped else None
        if expires is not None and at < datetime.fromisoformat(expires):
            say(f"{stream}: a lease expired before its expiry")
    if rule.command == "claim":
        item.update(lease=ev.get("lease_token"), holder=e["actor_id"], expires=ev.get("expires_at"))
    elif item["state"] == S.IN_PROGRESS:
        item.update(lease=None, holder=None, expires=None)
    item["state"] = e["to_state"]
    run["items"][e["item_id"]] = e["to_state"]


@pytest.mark.parametrize("field", FIELDS)
def test_the_oracle_sees_each_kind_of_change(field: str) -> None:
    """The oracle is not blind: a history changed in each field, in a way no command
    writes, breaks one of its rules."""
    ops = [("submit", 0), ("start", 0), ("claim", 0), ("heartbeat", 0), ("accept", 0)]
    text = _history(ops)
    history = [json.loads(x) for x in text.splitlines()[:-1]]
    assert command_path_problems(history) == []
    found = []
    for pick in range(len(history)):
        for choice in range(12):
            changed = _mutated(text, pick, field, choice)
            if changed is not None:
                lines = [json.loads(x) for x in changed[0].splitlines()[:-1]]
                found += command_path_problems(lines)
    assert found
