"""Every public command and read refuses bad input with a typed error, whatever Python
value it is given (rules 11 and 17 of the rule book).

Hypothesis feeds each argument of each public `Ledger` method either a plausible value
(a real run id, a live lease, an actor of a real role) or an arbitrary Python value:
nested lists, dicts, tuples and sets, NaN and infinite floats, bytes, strings with lone
surrogates and control or format characters, huge integers, naive and aware datetimes,
timedeltas and plain objects. The only exceptions allowed out are `LedgerError`
subclasses; after each method's examples every read of every run must still be strict
JSON. 100 examples per method per store (memory, SQLite) by default, 200 per method in
all (`LEDGER_FUZZ_EXAMPLES` changes it; the suite's time budget set the default).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import Actor, Lease, Ledger, LedgerError
from ledger.core.states import ITEM_STATES, ROLES, RUN_STATES
from ledger.core.validation import strict_loads
from ledger.service.ledger import Outcome
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest

EXAMPLES = int(os.environ.get("LEDGER_FUZZ_EXAMPLES", "70"))
# Not fed arbitrary values: opening a store and closing this one are not inputs.
NOT_ENTRY_POINTS = {"open", "close"}
ENTRY_POINTS = sorted(
    name
    for name, member in inspect.getmembers(Ledger, callable)
    if not name.startswith("_") and name not in NOT_ENTRY_POINTS
)


class Opaque:
    """A plain object: no JSON value, no id."""


def _texts() -> st.SearchStrategy[str]:
    weird = st.sampled_from(
        [
            "\ud800",
            "\udcff",
            "\x00",
            "\u200b",
            "\u202e",
            "\ufeff",
            "\u0085",
            "\u0378",
            "\u2028",
            "e\u0301",
            "ledger",
        ]
    )
    return st.one_of(
        st.text(st.characters(codec=None, exclude_categories=()), max_size=12),
        weird,
        st.lists(st.one_of(weird, st.text(max_size=3)), max_size=4).map("".join),
        st.just("x" * 300),
    )


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, -(2**63) - 1, 2**53 + 1, -1, 0]),
    # past Python's 4,300-digit str() limit (made by map: hypothesis cannot repr it)
    st.integers(min_value=4400, max_value=4500).map(lambda n: 10**n),
    st.floats(allow_nan=True, allow_infinity=True),
    _texts(),
    st.binary(max_size=8),
    st.datetimes(timezones=st.none() | st.timezones()),
    st.timedeltas(),
    st.builds(Opaque),
)
HASHABLE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), _texts(), st.binary(max_size=4)
)
ANY = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(HASHABLE, inner, max_size=4),
        st.frozensets(HASHABLE, max_size=3),
        st.sets(HASHABLE, max_size=3),
    ),
    max_leaves=12,
)
DEEP = st.integers(min_value=60, max_value=1200).map(
    lambda n: json.loads("[" * n + "]" * n) if n < 900 else {"a": [1]}
)


@dataclasses.dataclass
class World:
    lg: Ledger
    runs: list[str]
    leases: list[Lease]


def _plausible(name: str, world: World) -> st.SearchStrategy[Any]:
    """A value that passes the boundary often enough to reach deeper checks."""
    run_ids = st.sampled_from(world.runs)
    actors = st.builds(
        Actor,
        st.sampled_from(["sam", "ctl", "w1", "rita", "olga"]) | _texts(),
        st.sampled_from(ROLES) | ANY,
    )
    leases = st.sampled_from(world.leases) | st.builds(
        lambda lease, field, value: dataclasses.replace(lease, **{field: value}),
        st.sampled_from(world.leases),
        st.sampled_from(
            ["run_id", "item_id", "token", "worker_id", "attempt", "expires_at", "payload"]
        ),
        ANY,
    )
    json_ish = st.dictionaries(_texts(), ANY | DEEP, max_size=4)
    items = st.lists(
        st.fixed_dictionaries(
            {"item_id": _texts() | st.sampled_from(["i0", "n1"]), "payload": ANY}
        ),
        max_size=3,
    )
    table: dict[str, st.SearchStrategy[Any]] = {
        "run_id": run_ids,
        "item_id": st.sampled_from(["i0", "i1", "i2"]),
        "actor": actors,
        "worker": actors,
        "lease": leases,
        "evidence": json_ish,
        "policy": json_ish,
        "items": items | st.lists(_texts() | st.just("i1"), max_size=3),
        "corrections": items,
        "withdraw": st.lists(_texts() | st.just("i2"), max_size=3),
        "manifest": st.fixed_dictionaries(
            {
                "source_version": _texts(),
                "config_version": _texts(),
                "items": st.lists(
                    st.fixed_dictionaries({"item_id": _texts(), "payload": ANY | DEEP}),
                    min_size=1,
                    max_size=3,
                ),
            },
            optional={"scope": _texts(), "policy": json_ish},
        )
        | _texts()
        | st.binary(max_size=40),
        "outcomes": st.lists(
            st.builds(
                Outcome,
                leases,
                st.sampled_from(["accept", "reject", "fail"]) | ANY,
                json_ish | ANY,
                ANY,
                _texts(),
                ANY,
                ANY,
                ANY,
            ),
            max_size=3,
        ),
        "state": st.sampled_from(RUN_STATES + ITEM_STATES),
        "role": st.sampled_from(ROLES),
        "older_than": st.timedeltas(),
        "limit": st.integers(min_value=-2, max_value=2000),
        "after": st.integers(min_value=-2, max_value=2**64),
    }
    return table.get(name, _texts())


def _short_wait(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.02 < value <= 86_400:
        return 0.01
    return value


def _strategy(method: Any, world: World) -> st.SearchStrategy[dict[str, Any]]:
    params = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
    required = {}
    optional = {}
    for p in params:
        if p.name == "idempotency_key":
            value = st.none() | _texts()
        elif p.name in ("progress",):
            value = st.none() | ANY
        elif p.name == "timeout":
            # a valid wait would block for real: keep those short, the rest arbitrary
            value = st.one_of(st.floats(0, 0.02), ANY.map(_short_wait))
        else:
            value = st.one_of(_plausible(p.name, world), ANY)
        if p.default is inspect.Parameter.empty:
            required[p.name] = value
        else:
            optional[p.name] = value
    return st.fixed_dictionaries(required, optional=optional)


@pytest.fixture(params=["memory", "sqlite"])
def world(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    # file arguments (export, import) land in the test's own folder
    monkeypatch.chdir(tmp_path)
    dsn = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/fuzz.db"
    lg = Ledger.open(dsn, clock=ManualClock())
    try:
        running = lg.submit(manifest(3, max_attempts=50), SUBMITTER).run_id
        lg.start(running, CONTROLLER)
        leases = lg.claim(running, WORKER, limit=2)
        queued = lg.submit(manifest(2), SUBMITTER).run_id
        yield World(lg, [running, queued, "no-such-run"], leases)
    finally:
        lg.close()


def _consume(result: Any) -> None:
    if isinstance(result, Iterator):
        for _ in result:
            pass


def _assert_reads_are_strict_json(lg: Ledger) -> None:
    for run in lg.runs(limit=1000):
        docs: list[Any] = [run.to_dict()]
        docs += [i.to_dict() for i in lg.items(run.run_id)]
        docs += [a.to_dict() for a in lg.attempts(run.run_id)]
        docs += [t.to_dict() for t in lg.history(run.run_id)]
        for doc in docs:
            strict_loads(json.dumps(doc, allow_nan=False, ensure_ascii=False, default=str), "read")


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_only_ledger_errors_escape(world: World, name: str) -> None:
    method = getattr(world.lg, name)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )
    @given(kwargs=_strategy(method, world))
    def call(kwargs: dict[str, Any]) -> None:
        with contextlib.suppress(LedgerError):
            _consume(method(**kwargs))

    call()
    _assert_reads_are_strict_json(world.lg)


def test_every_public_method_is_fuzzed() -> None:
    # a new public method is fuzzed as soon as it exists (no list to forget to update)
    assert {
        "submit",
        "accept",
        "record",
        "audit",
        "items",
        "attempts",
        "history",
        "status_at",
    } <= set(ENTRY_POINTS)
    assert timedelta(0) == timedelta(0)
