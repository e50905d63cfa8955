"""The ledger's write commands, one module per job, over one unit of work (`uow.py`).

`ledger.Ledger` (ledger/service/ledger.py) is the public facade: each of its command methods hands its
arguments to `pipeline.execute` (transient-fault retry, then the idempotency key),
which runs the command's handler here with a `UnitOfWork`:

- `runs.py`      start, pause, resume, cancel, complete, fail, and the drain of a
                 pausing or canceling run
- `review.py`    request_review, decide, approve
- `amend.py`     amend: a new input version of an open run
- `lineage.py`   submit, retry, repair, compensate: new runs
- `leases.py`    claim, heartbeat, accept, reject, fail_attempt, record
- `items.py`     skip, release, reject_item
- `reconcile.py` the reconciler pass
- `args.py`      argument checks (the first check of the rule book's order; nothing is read yet)
- `registry.py`  every command declared once: handler, rule-book row, CLI command and
                 default role, HTTP route (ledger/http/commands.py generates the routes)
"""
