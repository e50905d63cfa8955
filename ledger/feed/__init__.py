"""Consumers of the change feed: `Follower` (exactly-once handlers over committed
transitions), its checkpoints (`checkpoints`) and its lease (`locks`), and signed
webhooks delivered by a follower (`webhooks`).

May import `service` and everything below it; never `worker`, `http` or `cli`.
"""
