"""The HTTP entry point: JSON endpoints over `Ledger`, bearer tokens, and the operator page.

A thin layer: every request becomes one call of the application service
(`ledger.Ledger` (ledger/service/ledger.py)), and every typed ledger error becomes an HTTP status
with the error's `to_dict()` as its JSON body. FastAPI is imported lazily, so
`import ledger.http` costs nothing for programs that never serve.

- `create_app(lg, tokens_path=None, public_reads=False) -> FastAPI` (`app.py`)
- `add_token(actor_id, role, path=None) -> str` (`tokens.py`)
- `serve(dsn, host, port, tokens_path, public_reads)`: import it from
  `ledger.http.serve` (a package attribute of that name would shadow the module)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledger.http.app import create_app
    from ledger.http.tokens import add_token

_LAZY = {"create_app": "app", "add_token": "tokens"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ledger.http' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = ["add_token", "create_app"]
