"""The schema's versions, one frozen `.sql` file per version and store:
`postgres/NNNN_name.sql` and `sqlite/NNNN_name.sql`, version N in the file numbered N.

A released file is never edited (a test keeps their checksums): a schema change is a
new file with the next number, and `stores.base.SCHEMA_VERSION` moves to it. The
stores apply the files after the version a database records, in one transaction.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

STORES = ("postgres", "sqlite")


@cache
def files(store: str) -> tuple[tuple[str, str], ...]:
    """`(file name, text)` of every version of `store`'s schema, in version order."""
    if store not in STORES:
        raise ValueError(f"no migrations for store {store!r}")
    folder = resources.files(__name__).joinpath(store)
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    for version, name in enumerate(names, start=1):
        if not name.startswith(f"{version:04d}_"):
            raise RuntimeError(f"migration {name!r} is out of sequence (expected {version:04d}_*)")
    return tuple((name, folder.joinpath(name).read_text(encoding="utf-8")) for name in names)


def steps(store: str) -> list[list[str]]:
    """Each version's statements, in order: version N is the Nth entry."""
    return [split_statements(text) for _, text in files(store)]


def split_statements(text: str) -> list[str]:
    """The statements of a script, split at each `;` outside quotes, dollar quotes and
    comments; comments are dropped and empty statements skipped."""
    out: list[str] = []
    current: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "-" and text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if c == "'":
            end = text.find("'", i + 1)
            while end >= 0 and text.startswith("''", end):
                end = text.find("'", end + 2)
            stop = n if end < 0 else end + 1
            current.append(text[i:stop])
            i = stop
            continue
        if c == "$":
            close = text.find("$", i + 1)
            tag = text[i : close + 1] if close > 0 else ""
            if tag and (tag == "$$" or tag[1:-1].isidentifier()):
                end = text.find(tag, close + 1)
                stop = n if end < 0 else end + len(tag)
                current.append(text[i:stop])
                i = stop
                continue
        if c == ";":
            statement = "".join(current).strip()
            if statement:
                out.append(statement)
            current = []
            i += 1
            continue
        current.append(c)
        i += 1
    statement = "".join(current).strip()
    if statement:
        out.append(statement)
    return out


__all__ = ["STORES", "files", "split_statements", "steps"]
