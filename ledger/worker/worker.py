"""The worker helper: claim items in batches, run a handler on a thread pool, keep the
leases alive, and record what the handler reports.

A handler receives the item's `Lease` (`item_id`, `payload`, `attempt`, ...) and
returns `Accepted`, `Rejected` or `Quarantine`; raising records a retryable failed
attempt with the exception's text. The worker never invents an outcome: a lost lease
means it stops writing for that item (the next owner reconciles), and a handler that
returns anything else is recorded as a failed attempt, never as accepted. The outcome
types and the summary are in ledger/worker/results.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, TypeVar

from ledger.core.errors import (
    CommitUncertain,
    Conflict,
    IllegalTransition,
    InvalidInput,
    LeaseLost,
    LedgerError,
    StoreUnavailable,
)
from ledger.core.redact import safe_text
from ledger.core.states import IN_PROGRESS, PENDING, RETRYABLE, RUNNING, WORKER, is_terminal
from ledger.core.views import Actor, ItemStatus, Lease
from ledger.worker.results import (
    Accepted,
    Handler,
    Outcome,
    Quarantine,
    Rejected,
    WorkerSummary,
)

# Adaptive prefetch (Worker without prefetch=): the most leases held at once, and how
# long the queued ones should take to drain. 250 is the batch case 1 measured best.
MAX_ADAPTIVE_PREFETCH = 250
ADAPTIVE_QUEUE_SECONDS = 1.0

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger


_T = TypeVar("_T")


class _InFlight:
    """One claimed item whose handler runs; the lock orders heartbeats against the outcome."""

    __slots__ = ("finished", "lease", "lock", "lost", "next_beat")

    def __init__(self, lease: Lease, next_beat: float, lock: Any) -> None:
        self.lease = lease
        self.lock = lock
        self.finished = False  # the handler returned; no more heartbeats
        self.lost = False  # the ledger refused this lease: never write for it again
        self.next_beat = next_beat


def default_worker_id() -> str:
    """`user@host:pid`: which process made each claim and outcome, as the audit needs."""
    import getpass
    import os
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name (a container without a passwd entry)
        user = "worker"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


class Worker:
    """Processes one run's items until there is nothing left for it to do.

    `run()` claims up to `prefetch` items at a time (one transaction per claim; while
    every thread is busy, it tops the queue up only once half of it is gone). Without
    `prefetch`, it adapts: it starts at `concurrency` and, while handlers are fast,
    grows (doubling at most per recorded batch, up to `MAX_ADAPTIVE_PREFETCH`) so that
    the queued leases take about `ADAPTIVE_QUEUE_SECONDS` (at most a tenth of the run's
    `lease_seconds`) to drain; slow handlers bring it back down. It records every outcome that is ready in one transaction,
    runs `handle(lease)` on a thread pool, heartbeats every live lease about every
    third of the run's `lease_seconds`, and records each outcome. It stops claiming
    as soon as the run is no longer running (canceling, pausing, terminal...), lets
    the attempts in flight finish and keeps their outcomes, then returns a
    `WorkerSummary`. It also returns when nothing is left to claim and nothing is in
    flight. Retryable items still waiting for their backoff are waited for, at most
    `max_idle` seconds.
    """

    def __init__(
        self,
        lg: Ledger,
        run_id: str,
        handle: Handler,
        worker_id: str | None = None,
        concurrency: int = 4,
        *,
        heartbeat_every: float | None = None,
        poll_interval: float = 0.5,
        max_idle: float = 30.0,
        prefetch: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch is not None and prefetch < concurrency:
            raise ValueError("prefetch must be at least concurrency")
        # leases held at once (claimed in one transaction); more than `concurrency` queues
        # items behind the busy threads (still heartbeated) for fewer, larger transactions
        self.prefetch = prefetch if prefetch is not None else concurrency
        self._adaptive = prefetch is None
        self._handled = 0  # handler calls finished and their total seconds (adaptive)
        self._handled_seconds = 0.0
        self._queue_seconds = ADAPTIVE_QUEUE_SECONDS
        self.lg = lg
        self.run_id = run_id
        self.handle = handle
        self.worker_id = worker_id if worker_id is not None else default_worker_id()
        self.concurrency = concurrency
        self.actor = Actor(self.worker_id, WORKER)
        self.heartbeat_every = heartbeat_every
        self.poll_interval = poll_interval
        self.max_idle = max_idle
        self._stop = threading.Event()
        self._closing = threading.Event()
        self._in_flight: dict[Future[Outcome], _InFlight] = {}
        self._registry_lock = threading.Lock()
        self._summary = WorkerSummary(run_id, self.worker_id)

    def stop(self) -> None:
        """Ask `run()` to stop claiming; attempts in flight still finish and are recorded."""
        self._stop.set()

    # -- the loop ----------------------------------------------------------------

    def run(self) -> WorkerSummary:
        """Work the run until it stops running or nothing is left; see the class docstring."""
        status = self.lg.status(self.run_id)
        if is_terminal(status.state):
            return self._finish(f"run is {status.state}", status.state)
        lease_seconds = float(status.policy.get("lease_seconds", 60.0) or 60.0)
        self._queue_seconds = min(ADAPTIVE_QUEUE_SECONDS, lease_seconds / 10)
        interval = self.heartbeat_every if self.heartbeat_every is not None else lease_seconds / 3
        beats = self._start_heartbeats(interval)
        pool = self._handlers()
        try:
            try:
                reason = self._loop(pool, interval)
            except self._interruptions:
                # Ctrl-C (a cancelled task: AsyncWorker): claim nothing more, record what is
                # in flight, then let it propagate (a second Ctrl-C abandons the rest;
                # their leases expire and are reconciled)
                self._stop.set()
                self._interrupt_handlers()
                self._drain()
                raise
        finally:
            # on an unexpected error, still wait for the handlers (their leases expire if
            # we cannot record) and stop heartbeating
            self._finish_handlers(pool)
            self._closing.set()
            self._join_heartbeats(beats)
        final = self.lg.status(self.run_id).state
        return self._finish(reason, final)

    # -- where the work runs (AsyncWorker: tasks on the event loop) ---------------

    _interruptions: tuple[type[BaseException], ...] = (KeyboardInterrupt,)

    def _handlers(self) -> Any:
        return ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"{self.worker_id}-handler")

    def _start_handler(self, pool: Any, lease: Lease) -> Any:
        """The handler's run on `lease`, as a future of its outcome."""
        return pool.submit(self._timed if self._adaptive else self.handle, lease)

    def _wait_any(self, futures: list[Any], timeout: float | None) -> set[Any]:
        done, _ = wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
        return done

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _interrupt_handlers(self) -> None:
        """Threads cannot be interrupted: the handlers in flight finish."""

    def _finish_handlers(self, pool: Any) -> None:
        pool.shutdown(wait=True)

    def _start_heartbeats(self, interval: float) -> Any:
        beat = threading.Thread(
            target=self._heartbeat_loop,
            args=(interval,),
            name=f"{self.worker_id}-heartbeat",
            daemon=True,
        )
        beat.start()
        return beat

    def _join_heartbeats(self, beats: Any) -> None:
        beats.join()

    def _entry_lock(self) -> Any:
        return threading.Lock()

    def _finish(self, reason: str, state: str) -> WorkerSummary:
        self._summary.stopped = reason
        self._summary.run_state = state
        return self._summary

    def _loop(self, pool: Any, interval: float) -> str:
        stopping = ""
        idle_since: float | None = None
        while True:
            if not stopping and self._stop.is_set():
                stopping = "stop requested"
            claimed: list[Lease] = []
            held = len(self._in_flight)
            free = self.prefetch - held
            # A thread would idle: claim now. Every thread busy with leases queued behind
            # them: top up only once half the queue is gone, so claims stay large.
            if (
                not stopping
                and free > 0
                and (held < self.concurrency or free >= (self.prefetch - self.concurrency + 1) // 2)
            ):
                try:
                    claimed = self.lg.claim(self.run_id, self.actor, limit=free)
                except IllegalTransition as e:  # canceling, pausing, terminal...: stop at once
                    stopping = f"run is {e.state}"
                except Conflict:
                    pass  # another writer got there first; nothing was written, look again
                except CommitUncertain as e:
                    # the claim may have committed: leases we cannot know (no token came
                    # back). Nobody else can take those items until the leases expire, then
                    # reconcile frees them; say so and go on with the rest.
                    if len(self._summary.errors) < 20:
                        self._summary.errors.append(
                            f"claim in doubt, its leases (if any) expire unused: {e}"
                        )
                for lease in claimed:
                    self._submit(pool, lease, interval)
            if claimed:
                idle_since = None
            if not self._in_flight:
                if stopping:
                    return stopping
                if claimed:
                    continue
                why = self._why_idle()
                if why:
                    return why
                now = time.monotonic()
                idle_since = idle_since if idle_since is not None else now
                if now - idle_since >= self.max_idle:
                    return f"waited {self.max_idle:g}s for retryable items to become claimable"
                self._pause(self.poll_interval)
                continue
            # Something is in flight. With free slots and a claim that found nothing,
            # look again after poll_interval (items may be added or come off backoff).
            full = len(self._in_flight) >= self.prefetch
            timeout = None if (full or stopping) else self.poll_interval
            done = self._wait_any(list(self._in_flight), timeout)
            if done:  # record every outcome that is ready in one transaction
                with self._registry_lock:
                    done = set(done) | {f for f in self._in_flight if f.done()}
            self._record(done)

    def _drain(self) -> None:
        while self._in_flight:
            self._record(self._wait_any(list(self._in_flight), None))

    def _why_idle(self) -> str:
        """Empty when items may still become claimable (retryable items on backoff)."""
        status = self.lg.status(self.run_id)
        if status.state != RUNNING:
            return f"run is {status.state}"
        waiting = status.counts.get(RETRYABLE, 0) + status.counts.get(PENDING, 0)
        if waiting:
            return ""
        if status.counts.get(IN_PROGRESS, 0):
            return "nothing left to claim; the remaining items are leased"
        return "nothing left to claim"

    def _submit(self, pool: Any, lease: Lease, interval: float) -> None:
        self._summary.claimed += 1
        entry = _InFlight(lease, time.monotonic() + interval, self._entry_lock())
        future = self._start_handler(pool, lease)
        with self._registry_lock:
            self._in_flight[future] = entry

    def _timed(self, lease: Lease) -> Outcome:
        start = time.perf_counter()
        try:
            return self.handle(lease)
        finally:
            spent = time.perf_counter() - start
            with self._registry_lock:
                self._handled += 1
                self._handled_seconds += spent

    def _adapt(self) -> None:
        """The adaptive prefetch after a batch: enough queued leases for the threads to
        spend about `_queue_seconds` on them at the handlers' mean speed so far."""
        with self._registry_lock:
            n, seconds = self._handled, self._handled_seconds
        if not self._adaptive or n == 0:
            return
        mean = max(seconds / n, 1e-6)
        want = self.concurrency + int(self.concurrency * self._queue_seconds / mean)
        self.prefetch = max(self.concurrency, min(MAX_ADAPTIVE_PREFETCH, want, 2 * self.prefetch))

    # -- outcomes ----------------------------------------------------------------

    def _record(self, done: Iterable[Future[Outcome]]) -> None:
        self._adapt()
        live: list[tuple[_InFlight, Outcome | BaseException]] = []
        for future in done:
            with self._registry_lock:
                entry = self._in_flight.pop(future)
            with entry.lock:  # waits for a heartbeat of this lease to finish
                entry.finished = True
            if entry.lost:  # a heartbeat found the lease gone: write nothing for it
                self._summary.lease_lost += 1
                continue
            exc = future.exception()
            live.append((entry, exc if exc is not None else future.result()))
        if not live:
            return
        batch = getattr(self.lg, "record", None)
        if batch is not None:
            outcomes = [_as_outcome(entry.lease, result) for entry, result in live]
            try:
                results = _retry_conflicts(lambda: batch(outcomes))
            except (CommitUncertain, StoreUnavailable):
                # the connection failed during (or around) COMMIT: read what the store holds
                # and record again only the outcomes that did not commit
                # (if the store is still away, each outcome is tried, and reported, alone)
                with contextlib.suppress(LedgerError):
                    live = self._uncommitted(live, [o.kind for o in outcomes])
            except Exception:  # noqa: S110
                # one outcome the ledger refuses (bad evidence, a rule), or a bug: the batch
                # wrote nothing, so record them one by one below and report each failure per
                # item; the worker never dies with finished outcomes unrecorded
                pass
            else:
                for (entry, _), item in zip(live, results, strict=True):
                    self._settle(entry, item)
                return
        for entry, result in live:
            self._record_one(entry, result)

    def _uncommitted(
        self, live: list[tuple[_InFlight, Outcome | BaseException]], kinds: list[str]
    ) -> list[tuple[_InFlight, Outcome | BaseException]]:
        """After an outcome batch whose commit is in doubt: settle the outcomes the store
        shows as recorded under their lease, lose those whose lease another command ended,
        and return the ones still to record (their item is still in progress under the
        same lease)."""
        outcome_of = {"accept": "accepted", "reject": "rejected", "fail": "failed"}
        again = []
        for (entry, result), kind in zip(live, kinds, strict=True):
            lease = entry.lease
            item = self.lg.item(lease.run_id, lease.item_id)
            if (
                item.state == IN_PROGRESS
                and item.lease is not None
                and item.lease.token == lease.token
            ):
                again.append((entry, result))
                continue
            mine = [
                a
                for a in self.lg.attempts(lease.run_id, lease.item_id)
                if a.lease_token == lease.token and a.outcome == outcome_of[kind]
            ]
            self._settle(
                entry,
                item
                if mine
                else LeaseLost(
                    f"lease {lease.token[:8]} on item {lease.item_id!r} ended before its outcome "
                    f"was recorded: the item is {item.state}"
                ),
            )
        return again

    def _record_one(self, entry: _InFlight, result: Outcome | BaseException) -> None:
        try:
            try:
                item: ItemStatus | LedgerError = _retry_conflicts(
                    lambda: self._write(entry.lease, result)
                )
            except CommitUncertain:
                if not self._uncommitted(
                    [(entry, result)], [_as_outcome(entry.lease, result).kind]
                ):
                    return  # it had committed (or the lease had ended): settled from the store
                item = _retry_conflicts(lambda: self._write(entry.lease, result))
        except InvalidInput as e:
            # e.g. evidence that is not JSON: the attempt produced nothing recordable
            item = self._refused(entry, f"the ledger refused the handler's outcome: {e}")
        except LedgerError as e:
            item = e
        except Exception as e:
            item = self._refused(entry, f"recording the handler's outcome failed: {_error_text(e)}")
        self._settle(entry, item)

    def _refused(self, entry: _InFlight, why: str) -> ItemStatus | LedgerError:
        """Record a retryable failed attempt saying why the outcome could not be recorded;
        if even that fails, the error is what the summary reports for this item."""
        try:
            return self.lg.fail_attempt(entry.lease, safe_text(why), retryable=True)
        except LedgerError as again:
            return again
        except Exception as again:
            return LedgerError(f"recording a failed attempt failed: {_error_text(again)}")

    def _settle(self, entry: _InFlight, item: ItemStatus | LedgerError) -> None:
        if isinstance(item, LeaseLost):
            entry.lost = True  # stop writing for this item; the next owner reconciles
            self._summary.lease_lost += 1
        elif isinstance(item, LedgerError):
            if len(self._summary.errors) < 20:
                self._summary.errors.append(f"{entry.lease.item_id}: {type(item).__name__}: {item}")
        elif item.state in ("accepted", "rejected", "retryable", "quarantined"):
            setattr(self._summary, item.state, getattr(self._summary, item.state) + 1)

    def _write(self, lease: Lease, result: Outcome | BaseException) -> ItemStatus:
        if isinstance(result, Accepted):
            return self.lg.accept(lease, evidence=result.evidence, stage=result.stage)
        if isinstance(result, Rejected):
            return self.lg.reject(lease, result.rule, detail=result.detail, stage=result.stage)
        if isinstance(result, Quarantine):
            return self.lg.fail_attempt(lease, result.error, stage=result.stage, retryable=False)
        return self.lg.fail_attempt(lease, _error_text(result), retryable=True)

    # -- heartbeats --------------------------------------------------------------

    def _heartbeat_loop(self, interval: float) -> None:
        tick = max(0.005, min(interval / 4, 1.0))
        while not self._closing.wait(tick):
            with self._registry_lock:
                entries = list(self._in_flight.values())
            now = time.monotonic()
            for entry in entries:
                if entry.next_beat <= now:
                    self._beat(entry, interval)

    def _beat(self, entry: _InFlight, interval: float) -> None:
        with entry.lock:
            if entry.finished or entry.lost:
                return
            try:
                entry.lease = self.lg.heartbeat(entry.lease)
            except LeaseLost:
                entry.lost = True  # stop writing for this item; the next owner reconciles
                return
            except Exception:
                entry.next_beat = time.monotonic() + min(interval, 1.0)
                return
            self._summary.heartbeats += 1
            entry.next_beat = time.monotonic() + interval


def _retry_conflicts(write: Callable[[], _T], attempts: int = 3) -> _T:
    """A Conflict means another writer committed first and nothing of ours was written."""
    for _ in range(attempts - 1):
        try:
            return write()
        except Conflict:
            continue
    return write()


def _error_text(result: Outcome | BaseException) -> str:
    """What a failed attempt records: the exception's type and text, made storable
    (lone surrogates, as in non-UTF-8 file names, are escaped, never dropped)."""
    if isinstance(result, BaseException):
        try:
            text = str(result)
        except Exception:
            text = "<the exception's text could not be read>"
        name = type(result).__name__
        return safe_text(f"{name}: {text}" if text else name)
    return f"handler returned {type(result).__name__}; expected Accepted, Rejected or Quarantine"


def _as_outcome(lease: Lease, result: Outcome | BaseException) -> Any:
    """One outcome for `Ledger.record`."""
    from ledger.service.ledger import Outcome as Recorded

    if isinstance(result, Accepted):
        return Recorded(lease, "accept", evidence=result.evidence, stage=result.stage)
    if isinstance(result, Rejected):
        return Recorded(lease, "reject", rule=result.rule, detail=result.detail, stage=result.stage)
    if isinstance(result, Quarantine):
        return Recorded(lease, "fail", error=result.error, stage=result.stage, retryable=False)
    return Recorded(lease, "fail", error=_error_text(result), retryable=True)


__all__ = ["Accepted", "Handler", "Outcome", "Quarantine", "Rejected", "Worker", "WorkerSummary"]
