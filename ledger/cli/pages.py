"""The paged reads of the CLI (`items`, `attempts`, `history`): printed as they are read.

Without `--limit` every page is read and printed in turn (a long run is never held in
memory); with `--limit` one page after `--after`, and when it is full the cursor of the
next page goes to stderr (`next page: --after CURSOR`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import typer


def emit_pages(
    pages: Iterator[list[Any]],
    *,
    as_json: bool,
    as_jsonl: bool,
    show: Callable[[list[Any]], None],
    limit: int | None,
    cursor: Callable[[Any], str],
) -> list[Any]:
    """Print each page as it comes (JSON array, JSON lines or a table per page); return
    the first page (callers look at it, e.g. to say a run is archived)."""
    first: list[Any] | None = None
    last: Any = None
    count = 0
    if as_json:
        typer.echo("[", nl=False)
    for page in pages:
        if first is None:
            first = page
        if not page:
            continue
        if as_jsonl:
            for value in page:
                typer.echo(json.dumps(value.to_dict(), ensure_ascii=False))
        elif as_json:
            _json_items(page, count)
        else:
            show(page)
        count += len(page)
        last = page[-1]
    if as_json:
        # the same text as json.dumps(list, indent=2): "[]" or "[\n  ...\n]"
        typer.echo("\n]" if count else "]")
    elif not as_jsonl and count == 0:
        show([])
    if limit is not None and count == limit and last is not None:
        typer.echo(f"next page: --after {cursor(last)}", err=True)
    return first or []


def _json_items(page: Iterable[Any], count: int) -> None:
    parts = []
    for value in page:
        text = json.dumps(value.to_dict(), indent=2, ensure_ascii=False)
        parts.append("\n" + "\n".join("  " + line for line in text.splitlines()))
    typer.echo(("," if count else "") + ",".join(parts), nl=False)
