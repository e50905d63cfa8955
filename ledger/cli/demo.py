"""`ledger demo`: five seeded scenarios that exercise the ledger end to end.

1. flaky items that succeed after retries;
2. a review gate that refuses an approval given for an earlier input version
   (StaleReview after an amend) and accepts a fresh one;
3. a run canceled while attempts are in flight, whose in-flight outcomes are kept;
4. a run under partial delivery ending completed_with_errors;
5. a repair run linked to it for the items not accepted, which succeeds.

Outcomes are decided per item id from `random.Random(seed)`, never by thread
timing, so a seed always gives the same final states and counts. Every call goes
through the public `Ledger` API and the `Worker` helper, as a user's code would.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.markup import escape

from ledger.core.errors import StaleReview
from ledger.core.views import Actor, Lease, RunStatus
from ledger.service.ledger import Ledger
from ledger.worker.worker import Accepted, Outcome, Quarantine, Rejected, Worker, WorkerSummary

SUBMITTER = Actor("demo-submitter", "submitter")
CONTROLLER = Actor("demo-controller", "controller")
REVIEWER = Actor("alice", "reviewer")
OPERATOR = Actor("ops-oncall", "operator")
REVIEW_DECISION = "finance-signoff"
_GATE_TIMEOUT = 30.0  # seconds; only reached if the core never hands out the leases


@dataclass
class Scenario:
    """What one scenario did, for the person watching and for tests."""

    name: str
    run_id: str
    state: str
    counts: dict[str, int]
    waiting_on: str
    links: list[dict[str, str]]
    attempts: int
    story: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, status: RunStatus, attempts: int, story: list[str]) -> Scenario:
        """The scenario's run as the store accepted it."""
        scenario = cls(name, status.run_id, "", {}, "", [], attempts, story)
        scenario.refresh(status)
        return scenario

    def refresh(self, status: RunStatus) -> None:
        """Take the run's latest accepted state, counts and links."""
        self.state = status.state
        self.counts = _nonzero(status.counts)
        self.waiting_on = status.waiting_on
        self.links = [{"relation": link.relation, "run_id": link.run_id} for link in status.links]


@dataclass
class DemoResult:
    """Every scenario of one demo, in the order they ran."""

    dsn: str
    seed: int
    items: int
    workers: int
    seconds: float
    scenarios: list[Scenario]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _work_time(item_id: str) -> float:
    """A few milliseconds of simulated work, fixed per item (timing never decides outcomes)."""
    return 0.001 + (hashlib.sha256(item_id.encode()).digest()[0] % 5) / 1000


class _Demo:
    def __init__(
        self, lg: Ledger, items: int, workers: int, seed: int, say: Callable[[str], None]
    ) -> None:
        self.lg = lg
        self.n = items
        self.workers = workers
        self.seed = seed
        self.say = say
        self.scenarios: list[Scenario] = []

    # -- helpers -------------------------------------------------------------------

    def rng(self, scenario: str) -> random.Random:
        return random.Random(f"{self.seed}/{scenario}")  # noqa: S311 (seeded, reproducible scenarios; no secret)

    def manifest(self, scenario: str, scope: str, policy: dict[str, Any]) -> dict[str, Any]:
        rng = self.rng(f"{scenario}/payload")
        customers = ["acme", "globex", "initech", "umbrella", "hooli", "stark"]
        return {
            "source_version": f"exports/demo-seed-{self.seed}",
            "config_version": "cfg-demo-1",
            "scope": scope,
            "items": [
                {
                    "item_id": f"{scenario}-{i:03d}",
                    "payload": {
                        "customer": rng.choice(customers),
                        "amount_cents": rng.randint(100, 250_000),
                    },
                }
                for i in range(1, self.n + 1)
            ],
            "policy": policy,
        }

    def submit_and_start(self, scenario: str, scope: str, policy: dict[str, Any]) -> str:
        run_id = self.lg.submit(self.manifest(scenario, scope, policy), SUBMITTER).run_id
        self.lg.start(run_id, CONTROLLER)
        return run_id

    def work(self, run_id: str, handle: Callable[[Lease], Outcome], name: str) -> WorkerSummary:
        worker = Worker(
            self.lg,
            run_id,
            handle,
            worker_id=f"worker-{name}",
            concurrency=self.workers,
            max_idle=5.0,
        )
        return worker.run()

    def record(self, name: str, run_id: str, story: list[str]) -> Scenario:
        status = self.lg.status(run_id)
        result = Scenario.of(name, status, len(self.lg.attempts(run_id)), story)
        self.scenarios.append(result)
        for line in story:
            self.say(f"  {escape(line)}")
        self.say(f"  => run {run_id} is [bold]{status.state}[/] ({_counts_text(status.counts)})")
        return result

    # -- 1. flaky items -------------------------------------------------------------

    def flaky(self) -> Scenario:
        self.say("[bold]1. Flaky items[/]: transient upstream errors, retried up to 3 attempts")
        run_id = self.submit_and_start(
            "flaky",
            "invoice delivery with a flaky upstream API",
            {"max_attempts": 3, "backoff_seconds": 0},
        )
        rng = self.rng("flaky")
        failures = {
            f"flaky-{i:03d}": rng.choices([0, 1, 2], weights=[5, 3, 2])[0]
            for i in range(1, self.n + 1)
        }
        tries: dict[str, int] = {}
        lock = threading.Lock()

        def handle(lease: Lease) -> Outcome:
            with lock:
                tries[lease.item_id] = tries.get(lease.item_id, 0) + 1
                attempt = tries[lease.item_id]
            time.sleep(_work_time(lease.item_id))
            if attempt <= failures[lease.item_id]:
                if attempt == 1:
                    raise TimeoutError("upstream API did not answer within 2.0s (simulated)")
                raise ConnectionError(
                    "could not connect to "
                    "postgresql://billing:hunter2@db.internal/billing "
                    "(simulated; the ledger redacts the password)"
                )
            return Accepted(
                evidence={"receipt": f"rcpt-{lease.item_id}-{attempt}"}, stage="delivered"
            )

        summary = self.work(run_id, handle, "flaky")
        status = self.lg.complete(run_id, CONTROLLER)
        retried = sum(failures.values())
        return self.record(
            "flaky",
            run_id,
            [
                (
                    f"{self.n} items; {sum(1 for f in failures.values() if f)} of them failed "
                    f"{retried} attempt(s) in total before succeeding"
                ),
                (
                    f"worker: {summary.claimed} claims, {summary.retryable} failed attempt(s) "
                    f"recorded as retryable, {summary.accepted} accepted"
                ),
                f"complete -> {status.state}",
            ],
        )

    # -- 2. review bound to an input version -------------------------------------

    def review(self) -> Scenario:
        self.say(
            f"[bold]2. Review gate[/]: a '{REVIEW_DECISION}' approval is bound to the "
            "input version it saw"
        )
        run_id = self.submit_and_start(
            "review",
            "month-end ledger export needing finance sign-off",
            {"review": {"decision": REVIEW_DECISION, "survives_amendment": False}},
        )
        self.work(run_id, _accept_all("exported"), "review")
        seen = self.lg.request_review(run_id, CONTROLLER, REVIEW_DECISION).input_version
        story = [f"all {self.n} items exported; review requested for input version {seen}"]
        late = {
            "item_id": "review-late-001",
            "payload": {"customer": "initech", "amount_cents": 12_345},
        }
        amended = self.lg.amend(run_id, SUBMITTER, "a late invoice arrived", items=[late])
        story.append(
            f"submitter amended the run (a late invoice): input version is now "
            f"{amended.input_version}, still {amended.state}"
        )
        try:
            self.lg.decide(run_id, REVIEWER, seen, True, "totals match the export I checked")
            story.append("UNEXPECTED: the ledger accepted an approval of the old version")
        except StaleReview as e:
            story.append(f"alice approved the version she had seen -> refused: StaleReview: {e}")
        current = self.lg.status(run_id).input_version
        self.lg.decide(run_id, REVIEWER, current, True, "re-checked including the late invoice")
        story.append(f"alice re-read the run and approved {current} -> running")
        self.work(run_id, _accept_all("exported"), "review")
        status = self.lg.complete(run_id, CONTROLLER)
        story.append(f"the late invoice was processed; complete -> {status.state}")
        return self.record("review", run_id, story)

    # -- 3. cancel with attempts in flight ---------------------------------------

    def cancel(self) -> Scenario:
        in_flight = min(self.workers, self.n)
        self.say(
            f"[bold]3. Cancel in flight[/]: the run is canceled while {in_flight} "
            "attempt(s) are running"
        )
        run_id = self.submit_and_start("cancel", "bulk statement mailing, withdrawn mid-run", {})
        started = threading.Semaphore(0)
        gate = threading.Event()

        def handle(lease: Lease) -> Outcome:
            started.release()
            gate.wait(_GATE_TIMEOUT)  # the mail is already on its way when the cancel lands
            return Accepted(evidence={"mail_id": f"mail-{lease.item_id}"}, stage="mailed")

        box: list[WorkerSummary] = []
        worker = Worker(
            self.lg,
            run_id,
            handle,
            worker_id="worker-cancel",
            concurrency=self.workers,
            max_idle=5.0,
        )
        thread = threading.Thread(target=lambda: box.append(worker.run()), daemon=True)
        thread.start()
        try:
            for _ in range(in_flight):
                if not started.acquire(timeout=_GATE_TIMEOUT):
                    raise RuntimeError("the worker never started its first attempts")
            outcome = self.lg.cancel(run_id, OPERATOR, "customer withdrew the mailing")
        finally:
            gate.set()
            thread.join()
        story = [
            (
                f"operator canceled with {outcome.in_flight} attempt(s) in flight -> "
                f"{outcome.state}; no new claims"
            )
        ]
        summary = box[0] if box else None
        if summary is not None:
            story.append(
                f"the in-flight attempts finished and were kept: {summary.accepted} "
                f"accepted; worker stopped: {summary.stopped}"
            )
        status = self.lg.status(run_id)
        if status.state == "canceling":
            report = self.lg.reconcile()
            story.append(f"the reconciler finished the cancel ({report.finished_cancels})")
        return self.record("cancel", run_id, story)

    # -- 4. partial delivery -----------------------------------------------------

    def partial(self) -> Scenario:
        self.say("[bold]4. Partial delivery[/]: up to 25% of required items may fail")
        run_id = self.submit_and_start(
            "partial",
            "supplier catalogue import; partial delivery allowed",
            {"partial_delivery": True, "tolerated_failures": "25%", "max_attempts": 2},
        )
        bad = self.rng("partial").sample(range(1, self.n + 1), max(1, self.n // 6))
        quarantined = {f"partial-{bad[0]:03d}"}
        rejected = {f"partial-{i:03d}" for i in bad[1:]}

        def handle(lease: Lease) -> Outcome:
            time.sleep(_work_time(lease.item_id))
            if lease.item_id in quarantined:
                return Quarantine("source record unreadable: checksum mismatch", stage="parse")
            if lease.item_id in rejected:
                return Rejected("price_must_be_positive", detail="price is -4.99", stage="validate")
            return Accepted(evidence={"rows": 1}, stage="imported")

        self.work(run_id, handle, "partial")
        status = self.lg.complete(run_id, CONTROLLER)
        story = [
            (
                f"{len(rejected)} item(s) rejected by a validation rule, "
                f"{len(quarantined)} quarantined; complete -> {status.state}"
            )
        ]
        story += [
            f"not accepted: {item.item_id} ({item.state}: {item.reason})"
            for item in status.not_accepted
        ]
        return self.record("partial", run_id, story)

    # -- 5. repair ---------------------------------------------------------------

    def repair(self, original: str) -> Scenario:
        self.say(
            "[bold]5. Repair[/]: a new run, linked to the partial one, for its items not accepted"
        )
        run_id = self.lg.repair(original, OPERATOR).run_id
        self.lg.start(run_id, CONTROLLER)
        self.work(run_id, _accept_all("imported after the supplier fixed the data"), "repair")
        status = self.lg.complete(run_id, CONTROLLER)
        story = [
            (
                f"repair run of {original}: {sum(status.counts.values())} item(s); "
                f"complete -> {status.state}"
            ),
            ("the original run stays completed_with_errors: terminal runs are never rewritten"),
        ]
        return self.record("repair", run_id, story)


def _accept_all(stage: str) -> Callable[[Lease], Outcome]:
    def handle(lease: Lease) -> Outcome:
        time.sleep(_work_time(lease.item_id))
        return Accepted(
            evidence={
                "checksum": hashlib.sha256(
                    json.dumps(lease.payload, sort_keys=True).encode()
                ).hexdigest()[:16]
            },
            stage=stage,
        )

    return handle


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in sorted(counts.items()) if v}


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in _nonzero(counts).items()) or "no items"


def run_demo(
    dsn: str | None, items: int = 20, workers: int = 4, seed: int = 7, as_json: bool = False
) -> DemoResult:
    """Run the five scenarios on `dsn` (None: LEDGER_DSN, else ./ledger.db) and print the
    story (or one JSON document)."""
    from ledger.cli.render import Cell, Grid, console, counts_cell, short_ids
    from ledger.cli.render import state as state_text
    from ledger.stores import resolve_dsn

    given, dsn = dsn, resolve_dsn(dsn)
    out = console()

    def say(text: str) -> None:
        if not as_json:
            out.print(text, soft_wrap=True)

    began = time.monotonic()
    with Ledger.open(dsn) as lg:
        demo = _Demo(lg, items, workers, seed, say)
        say(
            f"run-ledger demo on {dsn} (seed {seed}, {items} items per run, "
            f"{workers} worker threads)\n"
        )
        demo.flaky()
        demo.review()
        demo.cancel()
        partial = demo.partial()
        demo.repair(partial.run_id)
        runs: list[RunStatus] = [lg.status(s.run_id) for s in demo.scenarios]
        for scenario, status in zip(demo.scenarios, runs, strict=True):
            scenario.refresh(status)  # e.g. the partial run gained a repaired_by link
    result = DemoResult(
        dsn=dsn,
        seed=seed,
        items=items,
        workers=workers,
        seconds=round(time.monotonic() - began, 2),
        scenarios=demo.scenarios,
    )
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return result

    # on a terminal: short ids, one line per run (render.Grid); in a pipe, every id in full
    short = out.is_terminal
    ids = short_ids([s.run_id for s in runs] + [k.run_id for s in runs for k in s.links])

    def rid(run_id: str) -> str:
        return ids.get(run_id, run_id) if short else run_id

    waits = any(s.waiting_on != "nobody" for s in runs)  # a column only if someone is
    grid = Grid(
        f"\nruns made by this demo ({result.seconds}s)",
        [
            ("scenario", False),
            ("run", False),
            ("state", False),
            ("items", True),
            ("attempts", False),
            *([("waiting on", False)] if waits else []),
            ("links", True),
        ],
        short,
    )
    for scenario, status in zip(demo.scenarios, runs, strict=True):
        grid.add(
            scenario.name,
            rid(status.run_id),
            state_text(status.state),
            counts_cell(status.counts),
            str(scenario.attempts),
            *([status.waiting_on] if waits else []),
            Cell(", ".join(f"{k.relation} {rid(k.run_id)}" for k in status.links)),
        )
    grid.print(out)
    by_name = {s.name: s.run_id for s in demo.scenarios}
    prefix = "ledger" if given is None else f"ledger --dsn {given}"
    out.print("\nTry next:", soft_wrap=True)
    for command in (
        f"{prefix} history {by_name['flaky']}",
        f"{prefix} attempts {by_name['flaky']}",
        f"{prefix} audit --run {by_name['review']}",
        f"{prefix} items {by_name['cancel']} --state skipped",
        f"{prefix} status {by_name['partial']}",
        f"{prefix} lineage {by_name['repair']}",
    ):
        out.print(f"  {command}", markup=False, soft_wrap=True)
    return result
