"""Reads over the projections and the event log: status and lists (`queries`), keyset
pages (`paging`), what a run waits on (`signals`), the board, the overview and the run
page, status as of a time (`timetravel`) and the change feed's reads (`feed`).

Reads never write. May import `core`, `stores` and `projections`.
"""
