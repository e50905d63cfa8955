"""`ledger --help`: the commands in groups, each with its whole summary (never cut
with "...")."""

from __future__ import annotations

from typing import Any

# `ledger --help` lists the commands in these groups, in this order.
COMMAND_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Runs",
        (
            "submit",
            "start",
            "complete",
            "amend",
            "request-review",
            "review",
            "pause",
            "resume",
            "cancel",
            "fail",
            "retry",
            "repair",
            "compensate",
        ),
    ),
    ("Items and workers", ("work", "skip", "release", "reject-item", "reconcile")),
    (
        "Reading the record",
        ("status", "runs", "items", "attempts", "history", "lineage", "audit", "events", "top"),
    ),
    (
        "Keeping the record",
        (
            "verify",
            "checkpoint",
            "export",
            "import",
            "copy",
            "archive",
            "restore",
            "projections",
            "keys",
        ),
    ),
    ("Serving and following", ("serve", "token", "followers", "webhooks", "demo")),
)


def format_grouped(group: Any, ctx: Any, formatter: Any) -> None:
    """Write `group`'s commands into the help, under the titles of `COMMAND_GROUPS`."""
    commands = {
        name: cmd
        for name in group.list_commands(ctx)
        if (cmd := group.get_command(ctx, name)) is not None and not cmd.hidden
    }
    placed: set[str] = set()
    for title, names in COMMAND_GROUPS:
        rows = []
        for name in names:
            cmd = commands.get(name)
            if cmd is not None:
                rows.append((name, cmd.get_short_help_str(limit=10_000)))
                placed.add(name)
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)
    rest = [(n, c.get_short_help_str(limit=10_000)) for n, c in commands.items() if n not in placed]
    if rest:
        with formatter.section("Other commands"):
            formatter.write_dl(rest)
