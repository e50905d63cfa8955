"""Chaos run: many workers, killed at random, a server restart, a cancel mid-flight.

    python scripts/chaos.py [--items 20000] [--workers 8] [--seconds 30]

On a PostgreSQL server of its own (durable settings; it restarts it once with
`pg_ctl restart -m fast`), WORKERS processes run the ledger's `Worker` helper on a run
of ITEMS items with a handler that fails 10% of attempts, and on a second run (a tenth
of the size) that another process cancels mid-flight. `ledger reconcile --watch 1` runs
the reconciler every second. For SECONDS seconds a random worker is SIGKILLed every
0.5 s and started again; the server restarts once, about a third of the way in. A
worker that dies of an error on its own (a lost connection) is started again too.

Every worker logs each command that returned successfully (claims, outcomes,
heartbeats) to its own file, one line per command, written before it does anything
else. At the end the script reads the event log and checks:

- double leases seen: a claim of an item that was still in progress, two open
  attempts of one item seen by a monitor polling during the run, or two
  acknowledged outcomes for one item (must be 0);
- lost acknowledged writes: a logged command without its event (must be 0);
- verify problems: `Ledger.verify()` on the final store (must be 0);

and prints one line of figures. The exit status is 0 only when all three are 0 and
both runs ended as they should (the big run completed, the other canceled).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(HERE.parent),) if p not in sys.path]

from ledger import Accepted, Actor, Lease, Ledger, LedgerError, Worker
from ledger.core.domain import Item
from ledger.core.rows import iso
from tests.support.pgserver import DURABLE_SETTINGS, PgServer, create_database, with_dbname

SUBMITTER = Actor("chaos-submitter", "submitter")
CONTROLLER = Actor("chaos-controller", "controller")
OPERATOR = Actor("chaos-operator", "operator")
FAIL_RATE = 0.10


# --------------------------------------------------------------------------
# worker processes
# --------------------------------------------------------------------------
class LoggedLedger:
    """The ledger as a worker sees it, logging every command that returned successfully."""

    def __init__(self, lg: Ledger, log_fd: int, worker_id: str) -> None:
        self._lg = lg
        self._fd = log_fd
        self._worker = worker_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lg, name)

    def _log(self, **entry: Any) -> None:
        # one write(2) per line on an O_APPEND descriptor: whole lines, kept across SIGKILL
        os.write(self._fd, (json.dumps({"w": self._worker, **entry}) + "\n").encode())

    def claim(self, run_id: str, worker: Actor, limit: int = 1, **kw: Any) -> list[Lease]:
        leases = self._lg.claim(run_id, worker, limit=limit, **kw)
        for le in leases:
            self._log(
                cmd="claim", run=le.run_id, item=le.item_id, token=le.token, attempt=le.attempt
            )
        return leases

    def heartbeat(self, lease: Lease) -> Lease:
        new = self._lg.heartbeat(lease)
        self._log(
            cmd="heartbeat",
            run=new.run_id,
            item=new.item_id,
            token=new.token,
            expires=new.expires_at.isoformat(),
        )
        return new

    def record(self, outcomes: list[Any]) -> list[Any]:
        results = self._lg.record(outcomes)
        for o, r in zip(outcomes, results, strict=True):
            if not isinstance(r, LedgerError):
                self._log(
                    cmd=o.kind,
                    run=o.lease.run_id,
                    item=o.lease.item_id,
                    token=o.lease.token,
                    state=r.state,
                )
        return results

    def _outcome(self, kind: str, lease: Lease, call: Any) -> Any:
        status = call()
        self._log(
            cmd=kind, run=lease.run_id, item=lease.item_id, token=lease.token, state=status.state
        )
        return status

    def accept(self, lease: Lease, *a: Any, **kw: Any) -> Any:
        return self._outcome("accept", lease, lambda: self._lg.accept(lease, *a, **kw))

    def reject(self, lease: Lease, *a: Any, **kw: Any) -> Any:
        return self._outcome("reject", lease, lambda: self._lg.reject(lease, *a, **kw))

    def fail_attempt(self, lease: Lease, *a: Any, **kw: Any) -> Any:
        return self._outcome("fail", lease, lambda: self._lg.fail_attempt(lease, *a, **kw))


def worker_main(
    dsn: str, run_ids: list[str], worker_id: str, log_path: str, handler_ms: float
) -> None:
    """One worker process: work both runs until neither has anything left to claim."""
    rng = random.Random()

    def handle(lease: Lease) -> Accepted:
        if handler_ms:
            time.sleep(rng.uniform(0, handler_ms) / 1000)
        if rng.random() < FAIL_RATE:
            raise RuntimeError(f"simulated failure of {lease.item_id} (attempt {lease.attempt})")
        return Accepted(evidence={"by": worker_id})

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    with Ledger.open(dsn) as raw:
        lg = LoggedLedger(raw, fd, worker_id)
        while True:
            busy = False
            for run_id in run_ids:
                status = raw.status(run_id)
                open_items = sum(
                    status.counts.get(s, 0) for s in ("pending", "retryable", "in_progress")
                )
                if status.state != "running" or not open_items:
                    continue
                busy = True
                Worker(
                    lg,
                    run_id,
                    handle,
                    worker_id=worker_id,
                    concurrency=4,
                    poll_interval=0.2,  # type: ignore[arg-type]
                    max_idle=5,
                ).run()
            if not busy:
                return
            time.sleep(0.2)  # the rest is leased by others (maybe dead): the reconciler frees it


def _worker_entry(
    dsn: str, run_ids: list[str], worker_id: str, log_path: str, handler_ms: float
) -> None:
    try:
        worker_main(dsn, run_ids, worker_id, log_path, handler_ms)
    except Exception as e:
        print(
            f"chaos: worker {worker_id} stopped: {type(e).__name__}: {e}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(3)


# --------------------------------------------------------------------------
# the cancel and the monitor
# --------------------------------------------------------------------------
def monitor_main(dsn: str, cancel_run: str, out_path: str, stop: Any) -> None:
    """Cancels `cancel_run` once a tenth of it is accepted; meanwhile polls for items with
    two open attempts (two live leases)."""
    seen: set[tuple[str, str]] = set()
    polls = 0
    canceled: dict[str, Any] | None = None
    errors = 0
    with Ledger.open(dsn) as lg:
        while not stop.is_set():
            try:
                if canceled is None:
                    st = lg.status(cancel_run)
                    if (
                        st.counts.get("accepted", 0) * 10 >= sum(st.counts.values())
                        or st.state != "running"
                    ):
                        out = lg.cancel(cancel_run, OPERATOR, "chaos: cancel mid-flight")
                        canceled = {
                            "state": out.state,
                            "in_flight": out.in_flight,
                            "already": out.already,
                            "accepted_before": st.counts.get("accepted", 0),
                        }
                with lg.store.read() as tx:
                    # an item's open attempt is its lease: double when that attempt
                    # also has the row written when an attempt ends
                    rows = tx.fetchall(
                        "SELECT i.run_id, i.item_id FROM lg_items i JOIN lg_attempts a "
                        "ON a.run_id = i.run_id AND a.item_id = i.item_id "
                        "AND a.attempt = i.attempts WHERE i.state = 'in_progress'"
                    )
                seen.update((r["run_id"], r["item_id"]) for r in rows)
                polls += 1
            except LedgerError:
                errors += 1  # the server is restarting: look again
            stop.wait(0.25)
    Path(out_path).write_text(
        json.dumps(
            {
                "double_open_attempts": sorted(map(list, seen)),
                "polls": polls,
                "cancel": canceled,
                "errors": errors,
            }
        )
    )


# --------------------------------------------------------------------------
# the checks
# --------------------------------------------------------------------------
def read_acks(log_dir: Path) -> list[dict[str, Any]]:
    acks = []
    for path in sorted(log_dir.glob("w*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                acks.append(json.loads(line))
            except json.JSONDecodeError:  # never expected: whole-line writes
                acks.append({"cmd": "corrupt-line", "line": line})
    return acks


def check(lg: Ledger, run_ids: list[str], acks: list[dict[str, Any]]) -> dict[str, Any]:
    """Compare the workers' acknowledged commands with the event log."""
    claims: set[tuple[str, str, str]] = set()
    ends: dict[tuple[str, str, str], str] = {}
    extends: set[tuple[str, str, str, str]] = set()
    claimed_while_leased = 0
    expired = 0
    position = 0
    wanted = set(run_ids)
    while True:
        page = lg.store.read_events(position, 5000)
        if not page:
            break
        position = page[-1][0]  # the next page starts after this one
        for _position, e in page:
            if isinstance(e, Item.Transitioned) and e.run_id in wanted:
                token = e.evidence.get("lease_token")
                if e.command == "claim":
                    claims.add((e.run_id, e.item_id, token))
                    if e.from_state not in ("pending", "retryable"):
                        claimed_while_leased += 1
                elif e.from_state == "in_progress":
                    ends[(e.run_id, e.item_id, token)] = e.command
                    expired += e.command == "expire"
            elif isinstance(e, Item.LeaseExtended) and e.run_id in wanted:
                extends.add((e.run_id, e.item_id, e.token, e.expires_at))
    command_of = {"accept": "accept", "reject": "reject", "fail": "fail_attempt"}
    lost: list[dict[str, Any]] = []
    accepted_by: dict[tuple[str, str], set[str]] = defaultdict(set)
    for a in acks:
        key = (a.get("run"), a.get("item"), a.get("token"))
        if a["cmd"] == "claim":
            ok = key in claims
        elif a["cmd"] == "heartbeat":
            ok = (*key, iso(datetime.fromisoformat(a["expires"]))) in extends
        elif a["cmd"] in command_of:
            ok = ends.get(key) == command_of[a["cmd"]]  # type: ignore[arg-type]
            if a["cmd"] == "accept":
                accepted_by[key[:2]].add(str(key[2]))  # type: ignore[index]
        else:
            ok = False
        if not ok:
            lost.append(a)
    twice_accepted = sum(1 for tokens in accepted_by.values() if len(tokens) > 1)
    return {
        "lost": lost,
        "claimed_while_leased": claimed_while_leased,
        "twice_accepted": twice_accepted,
        "expired": expired,
        "acks": Counter(a["cmd"] for a in acks),
    }


# --------------------------------------------------------------------------
# the supervisor
# --------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--items", type=int, default=20_000, help="items in the big run (default 20000)"
    )
    ap.add_argument("--workers", type=int, default=8, help="worker processes (default 8)")
    ap.add_argument(
        "--seconds", type=float, default=30.0, help="how long to kill workers (default 30)"
    )
    ap.add_argument(
        "--kill-every", type=float, default=0.5, help="seconds between kills (default 0.5)"
    )
    ap.add_argument(
        "--min-kills",
        type=int,
        default=0,
        help="go on killing past --seconds until this many workers were killed (default 0)",
    )
    ap.add_argument("--lease-seconds", type=float, default=5.0, help="the runs' lease (default 5)")
    ap.add_argument(
        "--handler-ms", type=float, default=2.0, help="a handler call sleeps up to this (default 2)"
    )
    ap.add_argument(
        "--timeout", type=float, default=900.0, help="give up after this many seconds (default 900)"
    )
    ap.add_argument("--seed", type=int, default=None, help="seed for which worker is killed when")
    ap.add_argument("--keep", action="store_true", help="keep the server directory and logs")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    ctx = mp.get_context("fork")  # children start at once: every module is already imported

    base = Path(tempfile.mkdtemp(prefix="ledger-chaos-"))
    logs = base / "logs"
    logs.mkdir()
    server = PgServer(settings=DURABLE_SETTINGS, base_dir=base / "pg")
    procs: dict[int, Any] = {}
    reconciler: subprocess.Popen[bytes] | None = None
    monitor = None
    stop = ctx.Event()
    try:
        server.start()
        create_database(server.admin_dsn, "chaos")
        dsn = with_dbname(server.admin_dsn, "chaos")
        policy = {"max_attempts": 5, "lease_seconds": args.lease_seconds, "partial_delivery": True}
        cancel_items = max(args.items // 10, 10)
        with Ledger.open(dsn) as lg:
            big = lg.submit(
                {
                    "source_version": "chaos",
                    "config_version": "chaos-1",
                    "scope": "chaos: big run",
                    "items": [
                        {"item_id": f"item-{k:06d}", "payload": {"k": k}} for k in range(args.items)
                    ],
                    "policy": policy,
                },
                SUBMITTER,
            ).run_id
            doomed = lg.submit(
                {
                    "source_version": "chaos",
                    "config_version": "chaos-1",
                    "scope": "chaos: canceled",
                    "items": [{"item_id": f"c-{k:05d}"} for k in range(cancel_items)],
                    "policy": policy,
                },
                SUBMITTER,
            ).run_id
            lg.start(doomed, CONTROLLER)
            lg.start(big, CONTROLLER)
        run_ids = [doomed, big]
        incarnation = Counter[int]()

        def spawn(slot: int) -> None:
            incarnation[slot] += 1
            wid = f"w{slot}-{incarnation[slot]}"
            p = ctx.Process(
                target=_worker_entry,
                args=(dsn, run_ids, wid, str(logs / f"{wid}.jsonl"), args.handler_ms),
                name=wid,
            )
            p.start()
            procs[slot] = p

        env = {**os.environ, "LEDGER_DSN": dsn, "PYTHONPATH": str(HERE.parent)}
        rec_log = open(base / "reconciler.jsonl", "ab")  # noqa: SIM115

        def start_reconciler() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from ledger.cli import main; main()",
                    "reconcile",
                    "--watch",
                    "1",
                    "--json",
                ],
                env=env,
                stdout=rec_log,
                stderr=sys.stderr,
            )

        started = time.monotonic()
        reconciler = start_reconciler()
        monitor = ctx.Process(
            target=monitor_main, args=(dsn, doomed, str(base / "monitor.json"), stop)
        )
        monitor.start()
        for slot in range(args.workers):
            spawn(slot)

        kills = restarts_after_error = reconciler_restarts = 0
        restarted_server = False
        chaos_end = started + args.seconds
        restart_at = started + args.seconds / 3
        next_kill = started + args.kill_every
        deadline = started + args.timeout
        while True:
            now = time.monotonic()
            if now > deadline:
                raise SystemExit(f"chaos: gave up after {args.timeout:g}s")
            if not restarted_server and now >= restart_at:
                server.restart()  # pg_ctl restart -m fast: every connection is cut
                restarted_server = True
            # the kills go on past SECONDS until MIN_KILLS workers were killed, while any
            # worker still has work (a worker just started again may not be killable yet)
            killing = now < chaos_end or (
                kills < args.min_kills and any(p.is_alive() for p in procs.values())
            )
            if killing and now >= next_kill:
                # a worker that found nothing to claim (the rest leased by killed ones)
                # has ended: it starts again, so every tick kills a live worker
                for slot, p in list(procs.items()):
                    if not p.is_alive() and p.exitcode == 0:
                        p.join()
                        spawn(slot)
                slot = rng.randrange(args.workers)
                p = procs[slot]
                if p.is_alive():
                    os.kill(p.pid, signal.SIGKILL)
                    kills += 1
                p.join()
                spawn(slot)
                next_kill += args.kill_every
            for slot, p in list(procs.items()):
                if not p.is_alive() and p.exitcode not in (0, None):
                    p.join()
                    restarts_after_error += 1
                    spawn(slot)
            if reconciler.poll() is not None:
                reconciler_restarts += 1
                reconciler = start_reconciler()
            if (
                not killing
                and restarted_server
                and all(not p.is_alive() and p.exitcode == 0 for p in procs.values())
            ):
                break
            time.sleep(0.05)
        # the workers are done: wait for the reconciler to finish the cancel (expired leases)
        with Ledger.open(dsn) as lg:
            while lg.status(doomed).state != "canceled" and time.monotonic() < deadline:
                time.sleep(0.2)
            wall = time.monotonic() - started
            stop.set()
            monitor.join(60)
            reconciler.send_signal(signal.SIGINT)
            try:
                reconciler.wait(30)
            except subprocess.TimeoutExpired:
                reconciler.kill()
                reconciler.wait()
            rec_log.close()
            done = lg.complete(big, CONTROLLER)
            states = {"big": done.state, "canceled_run": lg.status(doomed).state}
            acks = read_acks(logs)
            result = check(lg, run_ids, acks)
            attempts = len(lg.attempts(big)) + len(lg.attempts(doomed))
            try:
                report = lg.verify()
                verify_problems: Any = len(report.problems)
                problems = list(report.problems)[:10]
            except (ImportError, NotImplementedError):
                verify_problems, problems = "n/a(verify-is-not-there-yet)", []
            except Exception as e:
                verify_problems, problems = "error", [f"verify raised {type(e).__name__}: {e}"]
        mon = json.loads((base / "monitor.json").read_text())
        reports = [
            json.loads(line)
            for line in (base / "reconciler.jsonl").read_text().splitlines()
            if line.startswith("{")
        ]
        double = (
            result["claimed_while_leased"]
            + result["twice_accepted"]
            + len(mon["double_open_attempts"])
        )
        lost = len(result["lost"])
        print(
            f"chaos: items={args.items} attempts={attempts} killed_workers={kills} "
            f"expired_leases={result['expired']} double_leases={double} lost_acknowledged_writes={lost} "
            f"verify_problems={verify_problems} wall={wall:.1f}s | workers={args.workers} "
            f"worker_restarts_after_errors={restarts_after_error} server_restarts={int(restarted_server)} "
            f"reconciler_restarts={reconciler_restarts} "
            f"reconciler_reported_expired={sum(r.get('expired_leases', 0) for r in reports)} "
            f"acknowledged={sum(result['acks'].values())} canceled_run_items={cancel_items} "
            f"cancel={mon['cancel'] and mon['cancel']['state']} states={states['big']}/{states['canceled_run']} "
            f"monitor_polls={mon['polls']}",
            flush=True,
        )
        for a in result["lost"][:10]:
            print(f"chaos: lost acknowledged write: {a}", file=sys.stderr)
        for p in problems:
            print(f"chaos: verify: {p}", file=sys.stderr)
        clean = (
            double == 0
            and lost == 0
            and verify_problems == 0
            and states["big"] in ("succeeded", "completed_with_errors")
            and states["canceled_run"] == "canceled"
        )
        return 0 if clean else 1
    finally:
        stop.set()
        for p in procs.values():  # only the processes this script started
            if p.is_alive():
                p.kill()
                p.join(10)
        if monitor is not None and monitor.is_alive():
            monitor.kill()
        if reconciler is not None and reconciler.poll() is None:
            reconciler.kill()
            reconciler.wait()
        try:
            server.stop()
        finally:
            if args.keep:
                print(f"chaos: kept {base}", file=sys.stderr)
            else:
                shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
