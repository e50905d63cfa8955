"""The `ledger` command: a thin entry point over `Ledger`. `entry.main` is the console
script; `app` holds the Typer app and the global options; one module per group of
commands (`runs`, `work`, `reads`, `admin`, `feed`, `tokens`, `top`, `transfer`);
`render` draws tables; `demo` is the scenario `ledger demo` runs.

The top room: may import every other one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `ledger` command (the console script `ledger = ledger.cli:main`)."""
    from ledger.cli.entry import main as entry_main

    return entry_main(argv)


__all__ = ["main"]
