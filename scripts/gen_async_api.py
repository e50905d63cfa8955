"""Generate ledger/service/async_api.py: `AsyncLedger`'s coroutine twin of every public
command and read of `Ledger`, with the same name, parameters and result.

Each generated method awaits `self._call(sync method, arguments...)`, which runs the one
synchronous implementation through the greenlet bridge (ledger/stores/green.py). Nothing
of a command is written twice: only its signature is copied, from the source.

    python scripts/gen_async_api.py          # write the file
    python scripts/gen_async_api.py --check  # exit 1 when the file is not what it would write
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "ledger" / "service" / "async_api.py"
# Ledger's class and the classes it inherits its public methods from, in MRO order
SOURCES = [
    ("ledger.service.ledger", "Ledger"),
    ("ledger.service.reads", "LedgerReads"),
    ("ledger.service.maintenance", "LedgerMaintenance"),
]
# written by hand in ledger/service/async_ledger.py (they are not one call of the sync API)
BY_HAND = {"open", "close", "keyed", "iter_audit", "wait_for_events", "using"}


def _module_path(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """name -> import line, for every name the module imports or defines at top level."""
    out: dict[str, str] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    name = alias.asname or alias.name
                    as_ = f" as {alias.asname}" if alias.asname else ""
                    out[name] = f"from {node.module} import {alias.name}{as_}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    out[alias.asname or alias.name.split(".")[0]] = f"import {alias.name}"
            elif isinstance(node, ast.If):  # if TYPE_CHECKING:
                visit(node.body)
            elif isinstance(node, ast.ClassDef | ast.FunctionDef):
                out.setdefault(node.name, f"from {module} import {node.name}")
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        out.setdefault(t.id, f"from {module} import {t.id}")

    visit(tree.body)
    return out


def _call_args(args: ast.arguments) -> str:
    parts = [a.arg for a in args.posonlyargs[1:] + args.args[1:]] if args.posonlyargs else []
    if not args.posonlyargs:
        parts = [a.arg for a in args.args[1:]]
    if args.vararg:
        parts.append(f"*{args.vararg.arg}")
    parts += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    if args.kwarg:
        parts.append(f"**{args.kwarg.arg}")
    return ", ".join(parts)


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def generate() -> str:
    methods: dict[str, ast.FunctionDef] = {}
    where: dict[str, str] = {}
    known: dict[str, str] = {}
    for module, cls in SOURCES:
        tree = ast.parse(_module_path(module).read_text())
        for name, line in _imports(tree, module).items():
            known.setdefault(name, line)
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        for item in node.body:
            if not isinstance(item, ast.FunctionDef) or item.name.startswith("_"):
                continue
            if item.name in BY_HAND or item.name in methods:
                continue
            if any(
                isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod", "property")
                for d in item.decorator_list
            ):
                continue
            methods[item.name] = item
            where[item.name] = cls

    used: set[str] = set()
    bodies: list[str] = []
    for name in sorted(methods):
        fn = methods[name]
        for node in ast.walk(fn.args):
            if isinstance(node, ast.Name):
                used.add(node.id)
        if fn.returns is not None:
            for node in ast.walk(fn.returns):
                if isinstance(node, ast.Name):
                    used.add(node.id)
        # default values are the sync method's own: rendered as they are written there
        signature = ast.unparse(fn.args)
        returns = ast.unparse(fn.returns) if fn.returns is not None else "None"
        doc = _first_paragraph(ast.get_docstring(fn))
        doc = (
            f"The coroutine of `Ledger.{name}`: {doc}"
            if doc
            else f"The coroutine of `Ledger.{name}`."
        )
        doc = doc.replace('"""', "'''")
        body = (
            f"    async def {name}({signature}) -> {returns}:\n"
            f'        """{doc}"""\n'
            f"        return await self._call(self._ledger.{name}, {_call_args(fn.args)})\n"
        ).replace(", )", ")")
        bodies.append(body)

    builtins = set(dir(__builtins__)) | {"None", "Any", "Callable", "TypeVar", "TYPE_CHECKING"}
    lines = sorted({known[n] for n in used if n in known and n not in builtins})
    missing = sorted(n for n in used if n not in known and n not in builtins)
    if missing:
        raise SystemExit(f"gen_async_api: cannot find an import for {missing}")
    header = (
        '"""GENERATED by scripts/gen_async_api.py from `Ledger`\'s source: do not edit.\n\n'
        "`AsyncLedger`'s coroutine of each public command and read of `Ledger` (same name,\n"
        "parameters, result and errors), each one call of the sync method through the greenlet\n"
        'bridge (ledger/stores/green.py)."""\n\n'
        "from __future__ import annotations\n\n"
        "from collections.abc import Callable\n"
        "from typing import TYPE_CHECKING, Any, TypeVar\n\n"
        "if TYPE_CHECKING:\n"
        + "".join(f"    {line}\n" for line in lines)
        + '\nT = TypeVar("T")\n\n\n'
        "class AsyncLedgerAPI:\n"
        '    """The generated coroutines; `AsyncLedger` (ledger/service/async_ledger.py) adds\n'
        '    opening, closing, keyed views, `using`, waiting and following."""\n\n'
        "    _ledger: Ledger\n\n"
        "    async def _call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:\n"
        "        raise NotImplementedError\n\n"
    )
    if "Ledger" not in used:
        header = header.replace(
            "if TYPE_CHECKING:\n",
            "if TYPE_CHECKING:\n    from ledger.service.ledger import Ledger\n",
            1,
        )
    return header + "\n".join(bodies)


def _formatted(text: str) -> str:
    """The text as `ruff check --fix` (imports sorted) and `ruff format` leave it: the
    gates run on the generated file too."""
    for args in (["check", "--fix", "--quiet"], ["format"]):
        text = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET), "-"],
            input=text,
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        ).stdout
    return text


def main() -> int:
    text = _formatted(generate())
    if "--check" in sys.argv[1:]:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run python scripts/gen_async_api.py")
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
