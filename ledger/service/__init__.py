"""The application service: `Ledger`, the facade that users, the CLI, the HTTP API, the
worker and the followers call (`ledger.py`), with its reads (`reads.py`) and its
maintenance jobs: rebuild, verify, export, import, archive (`maintenance.py`).

May import every room below it: `core`, `stores`, `projections`, `reads`, `commands`
and `transfer`.
"""
