"""Option values checked against the rule tables (`--state`, `--role`): refused as bad
usage when unknown, listed in the help, completed by the shell."""

from __future__ import annotations

from typing import Any

import typer


def allowed_values(kind: str) -> tuple[str, ...]:
    """The values `_one_of(kind)` accepts, from the rule tables."""
    from ledger.core import states as S

    return {
        "run": S.RUN_STATES,
        "item": S.ITEM_STATES,
        "state": tuple(dict.fromkeys(S.RUN_STATES + S.ITEM_STATES)),
        "role": S.ROLES,
    }[kind]


def complete_one_of(kind: str) -> Any:
    """Shell completion of an option's values (`--state`, `--role`)."""

    def complete(incomplete: str) -> list[str]:
        return [v for v in allowed_values(kind) if v.startswith(incomplete)]

    return complete


def values_help(kind: str, text: str = "") -> str:
    """An option's help ending with the values it accepts."""
    listed = ", ".join(allowed_values(kind))
    return f"{text} (one of: {listed})".strip()


def _one_of(kind: str) -> Any:
    """An option callback refusing a value outside ledger.core.states as bad usage (exit 2):
    `kind` is "run" (a run state), "item" (an item state), "state" (either) or "role"."""

    def check(value: str | None) -> str | None:
        allowed = allowed_values(kind)
        if value is not None and value not in allowed:
            what = {"run": "run state", "item": "item state"}.get(kind, kind)
            raise typer.BadParameter(f"unknown {what} {value!r}; one of: {', '.join(allowed)}")
        return value

    return check
