"""What the wheel installs: one top-level package, `ledger`, typed (PEP 561), whose
imports never resolve to a user's own modules of the same short names."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import resources
from pathlib import Path

import pytest

import ledger

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_is_typed() -> None:
    assert resources.files(ledger).joinpath("py.typed").is_file()


def test_one_top_level_package_in_the_source_tree() -> None:
    # setuptools ships `ledger*`; nothing else importable may sit beside it
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    assert packages == ["ledger", "tests"]
    assert 'include = ["ledger*"]' in (ROOT / "pyproject.toml").read_text()


USER_SCRIPT = """
from ledger import Actor, Ledger

with Ledger.open("memory://") as lg:
    manifest = {
        "source_version": "exports/2026-12-01",
        "config_version": "cfg-1",
        "scope": "nightly",
        "items": [{"item_id": "a", "payload": {"n": 1}}],
    }
    run = lg.submit(manifest, Actor("svc", "submitter"))
    lg.start(run.run_id, Actor("ctl", "controller"))
    print(lg.status(run.run_id).state)
"""


@pytest.mark.parametrize(
    "shadow", ["projections", "core", "stores", "commands", "reads", "service", "feed", "domain"]
)
def test_a_users_module_named_like_a_room_breaks_nothing(tmp_path: Path, shadow: str) -> None:
    (tmp_path / f"{shadow}.py").write_text("raise ImportError('the user module was imported')\n")
    (tmp_path / "main.py").write_text(textwrap.dedent(USER_SCRIPT))
    done = subprocess.run(
        [sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "running"
