"""`Worker`: claims items, runs the caller's handler, records each outcome, heartbeats
its leases (`worker.py`); the outcome types a handler returns (`results.py`).

May import `service` and everything below it; never `feed`, `http` or `cli`.
"""
