"""`ledger COMMAND --help` reads the rule book (CLI help, HTTP summaries and
docs read the same table), so what the help says about states and roles cannot drift
from what the ledger enforces.

For every registered write command with a CLI name, its help shows the command's move
and roles, and the roles are those of the rule book's transition tables (transcribed by hand
in tests/core/test_rulebook_table.py); the listing of `ledger --help` names them too.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ledger.cli.entry import DEFAULT_ROLES, app
from ledger.commands.registry import COMMANDS, CommandSpec
from tests.core.test_rulebook_table import SPEC_ITEM, SPEC_RUN

WITH_CLI = [spec for spec in COMMANDS.values() if spec.cli]
# wide enough that no line of the help is wrapped or cut
WIDE = {"terminal_width": 400, "max_content_width": 400}


def help_text(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], **WIDE)
    assert result.exit_code == 0, result.output
    return result.output


def rule_book(output: str) -> str:
    """The help's rule-book section, whitespace collapsed."""
    section = output.partition("Rule book:")[2].partition("Arguments:")[0]
    section = section.partition("Options:")[0]
    return " ".join(section.split())


def spec_roles(spec: CommandSpec) -> set[str] | None:
    row = SPEC_RUN.get(spec.rule.command) or SPEC_ITEM.get(spec.rule.command)
    return None if row is None else row[2]


def test_every_cli_command_of_the_registry_exists() -> None:
    names = {
        info.name or info.callback.__name__.replace("_", "-")
        for info in app.registered_commands
        if info.callback is not None
    }
    assert {spec.cli for spec in WITH_CLI} <= names
    assert len(WITH_CLI) >= 20  # every write command has one


@pytest.mark.parametrize("spec", WITH_CLI, ids=lambda spec: spec.name)
def test_the_help_shows_the_commands_rule_book_row(spec: CommandSpec) -> None:
    assert spec.cli is not None
    section = rule_book(help_text(spec.cli))
    assert section, f"`ledger {spec.cli} --help` has no rule book"
    move_and_roles = " ".join(spec.summary.partition(" ")[2].split())
    assert move_and_roles in section  # the states it moves from and to, and who may
    roles = ", ".join(sorted(spec.roles))
    assert f"; by {roles}" in section
    expected = spec_roles(spec)
    if expected is not None:  # The rule book's table names the command: the help says the same
        assert f"; by {', '.join(sorted(expected))}" in section


def listing() -> dict[str, str]:
    """`ledger --help`'s commands, from every group: name -> whole summary (its wrapped
    lines joined)."""
    text = help_text().partition("\nRuns:\n")[2]
    assert text, "the listing starts with the Runs group"
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if not line.strip() or not line.startswith(" "):  # a group's title
            name = None
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 2:
            name, _, summary = line.strip().partition(" ")
            out[name] = summary.strip()
        elif name is not None:
            out[name] += " " + line.strip()
    return out


def test_the_listing_names_each_write_commands_roles() -> None:
    lines = listing()
    for spec in WITH_CLI:
        assert spec.cli is not None
        roles = {role for cmd in WITH_CLI if cmd.cli == spec.cli for role in cmd.roles}
        assert lines[spec.cli].endswith(f"({', '.join(sorted(roles))})."), lines[spec.cli]


def test_the_listing_groups_every_command_with_its_whole_summary() -> None:
    from ledger.cli.listing import COMMAND_GROUPS

    lines = listing()
    grouped = [name for _title, names in COMMAND_GROUPS for name in names]
    assert sorted(lines) == sorted(grouped)  # every command in a group, none twice
    assert not any(summary.endswith("...") for summary in lines.values()), lines
    text = help_text()
    for title, _names in COMMAND_GROUPS:
        assert f"\n{title}:\n" in text


def test_state_and_role_options_list_their_values() -> None:
    from ledger.core.states import ITEM_STATES, ROLES, RUN_STATES

    audit = " ".join(help_text("audit").split())
    assert all(role in audit for role in ROLES)
    assert all(state in audit for state in (*RUN_STATES, *ITEM_STATES))
    runs = " ".join(help_text("runs").split())
    assert all(state in runs for state in RUN_STATES)


def test_each_write_commands_default_role_is_one_the_rule_book_allows() -> None:
    # `--as ID` (no role) acts in the command's default role: one it may be made in
    for cli in {spec.cli for spec in WITH_CLI}:
        allowed = {role for spec in WITH_CLI if spec.cli == cli for role in spec.roles}
        assert DEFAULT_ROLES.get(cli, "operator") in allowed, (cli, sorted(allowed))


def test_a_read_command_has_no_rule_book() -> None:
    assert "Rule book:" not in help_text("status")


def test_the_default_roles_are_read_from_the_registry() -> None:
    # not a hand-written table: each CLI command's default is its registry entries'
    # `default_role`, the rule's only role or the command's documented `cli_role`
    for spec in WITH_CLI:
        assert spec.cli is not None
        assert DEFAULT_ROLES[spec.cli] == spec.default_role, spec.name
        assert spec.default_role in spec.roles, spec.name
        if len(spec.roles) == 1:
            assert spec.cli_role in (None, *spec.roles), spec.name
        else:
            assert spec.cli_role is not None, spec.name
    assert set(DEFAULT_ROLES) == {spec.cli for spec in WITH_CLI}


def test_a_cli_default_the_rule_book_does_not_allow_is_refused() -> None:
    from ledger.core import states as S

    decide = COMMANDS["decide"]
    with pytest.raises(ValueError, match="cli_role 'operator' is not one of the rule's roles"):
        CommandSpec(
            "decide", decide.handler, decide.rule, "review", cli_role="operator", http=decide.http
        )
    cancel = COMMANDS["cancel"]
    with pytest.raises(ValueError, match="name the CLI's default with cli_role="):
        CommandSpec("cancel", cancel.handler, S.run_rule("cancel"), "cancel", http=cancel.http)
