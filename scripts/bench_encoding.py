#!/usr/bin/env python
"""Encode and decode the ledger's own events with each encoder, in one process.

    python scripts/bench_encoding.py              # about 20,000 events, in memory
    python scripts/bench_encoding.py --runs 6 --items 4000

The events are real: runs of a memory ledger processed by `make_ledger.one_run`
(claims, accepts, rejects, retries, heartbeats, a cancel). Each encoder turns every
event into its stored form (topic and state bytes) and reads it back; printed per
event class, in microseconds of CPU time per event, best of --repeat rounds taken in
turn:

  transcoder  eventsourcing's Mapper with the JSONTranscoder (the standard library's
              json, a Python callback for the timestamp): the stored format
  orjson      ledger.stores.encoding.EventMapper, what the ledger uses: the same bytes
  msgspec     msgspec.json over the same state (if installed; not a dependency): the
              same bytes but for the float forms orjson's check also covers
              (`1e16` where Python writes `1e+16`, which a check must find
              among the digits of every hex token: not done here, so a lower bound)

The script checks that orjson's bytes are the transcoder's for every event.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(HERE.parent), str(HERE)) if p not in sys.path]


def msgspec_codec() -> tuple[Callable[[Any], Any], Callable[[Any], Any]] | None:
    """msgspec's encoder and decoder over the state the transcoder writes, or None."""
    try:
        import msgspec
    except ImportError:
        return None
    from datetime import datetime

    from eventsourcing.persistence import StoredEvent

    from ledger.stores.encoding import own_event_classes

    classes = own_event_classes()
    topics = {cls: topic for topic, cls in classes.items()}
    encoder, decoder = msgspec.json.Encoder(), msgspec.json.Decoder()

    def encode(event: Any) -> StoredEvent:
        state = dict(vars(event))
        oid, version = state.pop("originator_id"), state.pop("originator_version")
        state["timestamp"] = {"_type_": "datetime_iso", "_data_": state["timestamp"].isoformat()}
        return StoredEvent(oid, version, topics[type(event)], encoder.encode(state))

    def decode(stored: StoredEvent) -> Any:
        state = decoder.decode(stored.state)
        state["timestamp"] = datetime.fromisoformat(state["timestamp"]["_data_"])
        state["originator_id"] = stored.originator_id
        state["originator_version"] = stored.originator_version
        event = object.__new__(classes[stored.topic])
        object.__setattr__(event, "__dict__", state)
        return event

    return encode, decode


def per_item(fn: Callable[[Any], Any], items: list[Any]) -> float:
    """One pass's CPU time per item (microseconds): the process's own, so the other
    processes of a busy machine weigh less on it than on wall time."""
    t0 = time.process_time()
    for x in items:
        fn(x)
    return (time.process_time() - t0) / max(1, len(items)) * 1e6


def best_of(
    fns: dict[str, Callable[[Any], Any]], items: list[Any], repeat: int
) -> dict[str, float]:
    """Each function's best pass over `repeat` rounds, the functions taking turns in
    every round (a busy machine slows them alike)."""
    out = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            out[name] = min(out[name], per_item(fn, items))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--items", type=int, default=1200, help="items per run")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    from make_ledger import one_run

    from ledger import Ledger
    from ledger.stores.base import make_generic_mapper, make_mapper

    with Ledger.open("memory://") as lg:
        rng = random.Random(5)
        for k in range(args.runs):
            one_run(lg, k, args.items, 100, rng)
        events = [e for _p, e in lg.store.read_events(0, 10**9)]
    transcoder, fast = make_generic_mapper(), make_mapper()
    stored = [transcoder.to_stored_event(e) for e in events]
    differ = sum(
        fast.to_stored_event(e).state != s.state for e, s in zip(events, stored, strict=True)
    )
    print(f"{len(events)} events; orjson's bytes differ from the transcoder's for {differ}")

    codecs: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
        "transcoder": (transcoder.to_stored_event, transcoder.to_domain_event),
        "orjson": (fast.to_stored_event, fast.to_domain_event),
    }
    ms = msgspec_codec()
    if ms is not None:
        codecs["msgspec"] = ms
    else:
        print("msgspec: not installed (pip install msgspec to measure it too)")

    by_class: dict[str, list[int]] = defaultdict(list)
    for k, e in enumerate(events):
        by_class[type(e).__qualname__].append(k)
    groups = {"all": list(range(len(events))), **by_class}
    header = f"{'events':<22}{'n':>7}{'bytes':>8}  " + "".join(
        f"{name + ' enc':>15}{name + ' dec':>15}" for name in codecs
    )
    print(header)
    for group, idx in groups.items():
        evs, sts = [events[k] for k in idx], [stored[k] for k in idx]
        size = sum(len(s.state) for s in sts) / len(sts)
        enc = best_of({n: c[0] for n, c in codecs.items()}, evs, args.repeat)
        dec = best_of({n: c[1] for n, c in codecs.items()}, sts, args.repeat)
        cells = [f"{enc[n]:>12.2f} us{dec[n]:>12.2f} us" for n in codecs]
        print(f"{group:<22}{len(idx):>7}{size:>8.0f}  " + "".join(cells))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
