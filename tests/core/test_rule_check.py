"""The rule checker's table: every rule has a name, what it checks and the contract
line it serves, and the rules page lists each one."""

from __future__ import annotations

from pathlib import Path

from ledger.core.rule_check import RULE_NAMES, RULES

PAGE = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "rule-book.md"


def test_every_rule_says_what_it_checks_and_what_it_serves() -> None:
    assert len(set(RULE_NAMES)) == len(RULES)
    for rule in RULES:
        assert rule.checks and rule.serves, rule.name
        assert "SPEC" in rule.serves, rule.name


def test_the_rules_page_lists_every_rule() -> None:
    text = PAGE.read_text(encoding="utf-8")
    missing = [name for name in RULE_NAMES if f"| `{name}` |" not in text]
    assert not missing, missing
