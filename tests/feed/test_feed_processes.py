"""Followers under load, in several processes, on a SQLite file and on PostgreSQL.

4 writer processes record runs while an in-database follower (another process)
projects every transition into a table of its own: at the end the table holds each
transition exactly once, in position order, and equals a fresh replay. Then the
follower is SIGKILLed 10 times at random moments during a second load: still exactly
once, no gap. Also: a follower name held by one process is refused to another until
that process dies, and `wait_for_events` wakes on another process's commit.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from multiprocessing.context import SpawnProcess
from typing import Any

import pytest

from ledger import Actor, FollowerBusy, Ledger, Transition
from ledger.feed.follower import Follower, followers

SPAWN = multiprocessing.get_context("spawn")
WAIT = 120.0  # a bound on waiting for a process, never a timing assertion
WRITERS = 4
RUNS_PER_WRITER = 4
ITEMS = 4

SUBMITTER = Actor("sam", "submitter")
CONTROLLER = Actor("ctl", "controller")


def _write_runs(dsn: str, writer: int, runs: int) -> None:
    """Whole runs: submit, start, claim and accept every item, complete."""
    worker = Actor(f"w{writer}", "worker")
    with Ledger.open(dsn) as lg:
        for n in range(runs):
            manifest = {
                "source_version": "s",
                "config_version": "c",
                "scope": f"writer {writer} run {n}",
                "items": [{"item_id": f"i{k}"} for k in range(ITEMS)],
            }
            run_id = lg.submit(manifest, SUBMITTER).run_id
            lg.start(run_id, CONTROLLER)
            for lease in lg.claim(run_id, worker, limit=2):
                lg.accept(lease)
            for lease in lg.claim(run_id, worker, limit=ITEMS):
                lg.accept(lease)
            lg.complete(run_id, CONTROLLER)


def _create_table(lg: Ledger) -> None:
    serial = (
        "BIGSERIAL PRIMARY KEY"
        if lg.store.dialect == "postgres"
        else "INTEGER PRIMARY KEY AUTOINCREMENT"
    )
    with lg.store.write() as tx:
        # the user's own read model: no unique key, so a repeat would show as a duplicate
        tx.execute(
            f"CREATE TABLE IF NOT EXISTS projected (seq {serial}, position BIGINT NOT NULL, "
            "run_id TEXT NOT NULL, command TEXT NOT NULL)"
        )


def _project(batch: list[Transition], tx: Any) -> None:
    tx.executemany(
        "INSERT INTO projected (position, run_id, command) VALUES (?, ?, ?)",
        [(t.position, t.run_id, t.command) for t in batch],
    )
    time.sleep(0.005)  # widen the window a SIGKILL can land in the transaction


def _follow(dsn: str) -> None:
    with Ledger.open(dsn) as lg:
        _create_table(lg)
        Follower(lg, "projection", _project, batch=7, wait=True).run()


def _hold(dsn: str, name: str) -> None:
    with Ledger.open(dsn) as lg:
        Follower(lg, name, lambda batch: None).run()


def _commit_one(dsn: str, delay: float) -> None:
    time.sleep(delay)
    with Ledger.open(dsn) as lg:
        lg.submit(
            {"source_version": "s", "config_version": "c", "items": [{"item_id": "x"}]}, SUBMITTER
        )


# -- helpers ---------------------------------------------------------------------------


def _start(target: Any, *args: Any) -> SpawnProcess:
    p = SPAWN.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def _join_all(procs: list[SpawnProcess]) -> None:
    for p in procs:
        p.join(WAIT)
        assert p.exitcode == 0, f"a writer failed (exit {p.exitcode})"


def _caught_up(lg: Ledger) -> None:
    deadline = time.monotonic() + WAIT
    while True:
        status = {f.name: f for f in followers(lg)}.get("projection")
        if status is not None and status.lag == 0:
            head = lg.events()[-1].position if lg.events() else 0
            if status.position >= head:
                return
        assert time.monotonic() < deadline, f"the follower did not catch up: {status}"
        time.sleep(0.05)


def _all(lg: Ledger) -> list[Transition]:
    out: list[Transition] = []
    while page := lg.events(after=out[-1].position if out else 0):
        out += page
    return out


def _check_exactly_once(lg: Ledger) -> None:
    with lg.store.read() as tx:
        rows = tx.fetchall("SELECT position, run_id, command FROM projected ORDER BY seq")
    seen = [(r["position"], r["run_id"], r["command"]) for r in rows]
    positions = [s[0] for s in seen]
    assert len(positions) == len(set(positions)), "a transition was projected twice"
    assert positions == sorted(positions), "the projection is out of position order"
    every = [(t.position, t.run_id, t.command) for t in _all(lg)]
    assert seen == every, "the projection is not the feed (a gap, or extras)"
    # a fresh replay of the feed by another follower gives the same rows
    replay: list[tuple[int, str, str]] = []
    with Follower(
        lg,
        f"replay-{len(every)}",
        lambda b: replay.extend((t.position, t.run_id, t.command) for t in b),
    ) as fresh:
        fresh.catch_up()
    assert replay == seen


# -- tests -----------------------------------------------------------------------------


def test_an_in_database_follower_is_exactly_once_under_load_and_sigkill(dsn: str) -> None:
    with Ledger.open(dsn) as lg:
        _create_table(lg)
        follower = _start(_follow, dsn)
        _join_all([_start(_write_runs, dsn, w, RUNS_PER_WRITER) for w in range(WRITERS)])
        _caught_up(lg)
        follower.kill()
        follower.join(WAIT)
        expected = WRITERS * RUNS_PER_WRITER * (3 + 2 * ITEMS)
        assert len(_all(lg)) == expected
        _check_exactly_once(lg)

        # second load: kill the follower 10 times at random moments while it works
        rng = random.Random(16)
        writers = [_start(_write_runs, dsn, w, RUNS_PER_WRITER) for w in range(WRITERS)]
        kills = 0
        while kills < 10:
            follower = _start(_follow, dsn)
            before = {f.name: f.position for f in followers(lg)}["projection"]
            deadline = time.monotonic() + WAIT
            # let it get going (its checkpoint moves, or there is nothing left: the writers
            # may be done before the tenth kill), then strike
            while time.monotonic() < deadline:
                status = {f.name: f for f in followers(lg)}["projection"]
                if status.position != before or status.lag == 0:
                    break
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.15))
            follower.kill()  # SIGKILL
            follower.join(WAIT)
            kills += 1
        _join_all(writers)
        follower = _start(_follow, dsn)
        _caught_up(lg)
        follower.kill()
        follower.join(WAIT)
        assert len(_all(lg)) == 2 * expected
        _check_exactly_once(lg)


def test_a_follower_name_is_refused_while_another_process_holds_it(dsn: str) -> None:
    with Ledger.open(dsn) as lg:
        _commit_one(dsn, 0)
        holder = _start(_hold, dsn, "single")
        deadline = time.monotonic() + WAIT
        while not any(f.name == "single" for f in followers(lg)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        mine = Follower(lg, "single", lambda batch: None)
        with pytest.raises(FollowerBusy):
            mine.run_once()
        holder.kill()  # SIGKILL: the lock dies with the process
        holder.join(WAIT)
        waiting = Follower(lg, "single", lambda batch: None, wait=True)
        waiting.run_once()
        waiting.close()


def test_wait_for_events_wakes_on_another_process_commit(dsn: str) -> None:
    with Ledger.open(dsn) as lg:
        _commit_one(dsn, 0)
        head = lg.events()[-1].position
        writer = _start(_commit_one, dsn, 0.5)
        try:
            started = time.monotonic()
            assert lg.wait_for_events(head, WAIT) is True
            assert time.monotonic() - started < WAIT
        finally:
            writer.join(WAIT)
        assert len(lg.events(after=head)) == 1
