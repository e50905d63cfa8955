"""The development lock (requirements/dev.txt) is what is installed.

The lock pins every transitive development and test dependency, so a fresh
machine installs exactly what CI tested (README: "The dev lock"). A venv that
drifted from it (an upgrade by hand, an install without `-c`) fails here rather
than passing or failing for reasons nobody can reproduce.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "dev.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    """name -> version for every pin in the lock."""
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        m = PIN.match(line.strip())
        if m:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def installed() -> dict[str, str]:
    """name -> version of every distribution importable in this interpreter."""
    return {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}


def test_every_locked_package_is_installed_at_its_locked_version() -> None:
    pins, have = locked(), installed()
    wrong = {
        name: (want, have.get(name, "missing"))
        for name, want in pins.items()
        if have.get(name) != want
    }
    assert not wrong, (
        f"installed versions differ from {LOCK.name} (name: (locked, installed)): {wrong}; "
        "reinstall with: pip install -c requirements/dev.txt -e '.[dev]'"
    )


def test_the_lock_pins_the_dev_tools_and_every_dev_requirement() -> None:
    pins = locked()
    for tool in ("pytest", "schemathesis", "ruff", "mypy", "pip-tools", "hypothesis"):
        assert tool in pins, f"{tool} is not pinned in {LOCK}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("dev", "postgres", "http"):
        wanted += project["optional-dependencies"][extra]
    for requirement in wanted:
        name = canonical(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])
        if name == "run-ledger":  # the dev extra names our own extras
            continue
        assert name in pins, f"{requirement!r} (pyproject.toml) is not in {LOCK}: regenerate it"
