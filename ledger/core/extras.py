"""Optional extras: a missing one is named with the pip command that installs it.

`run-ledger` installs without its server and PostgreSQL dependencies; a command
that needs them (`ledger serve`, a `postgresql://` DSN) raises `MissingExtra`
instead of a bare `ModuleNotFoundError`.
"""

from __future__ import annotations

# The top-level module each extra brings, and the extra that brings it.
EXTRA_OF_MODULE = {
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
    "psycopg_binary": "postgres",
    "fastapi": "http",
    "starlette": "http",
    "uvicorn": "http",
    "prometheus_client": "http",
    "greenlet": "async",
}


class MissingExtra(ImportError):
    """An optional extra is not installed; the message names the pip command."""

    def __init__(self, extra: str, module: str) -> None:
        self.extra = extra
        self.module = module
        super().__init__(
            f"this needs the {extra!r} extra ({module} is not installed): "
            f"pip install 'run-ledger[{extra}]'",
            name=module,
        )


def missing_extra(error: ImportError) -> MissingExtra | None:
    """The `MissingExtra` an import error stands for, or None when it is not an extra's."""
    if isinstance(error, MissingExtra):
        return error
    module = (error.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    return MissingExtra(extra, module) if extra else None
