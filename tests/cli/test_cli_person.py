"""The `ledger` command as a person meets it, through the real console script.

Every test runs the installed `ledger` script in a subprocess (a pseudo-terminal
where the behaviour depends on one) and checks its exit code: 0 ok, 1 a ledger
error (one line, no traceback), 2 bad usage.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

import ledger
from ledger import Ledger
from ledger.cli.render import short_ids
from ledger.core.errors import StoreUnavailable
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest

LEDGER = Path(sys.executable).parent / "ledger"  # the console script pip installed
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("LEDGER_DSN", "LEDGER_ACTOR")}
    out.pop("COLUMNS", None)
    out.update(extra)
    return out


def ledger_cmd(
    *args: str, cwd: Path | None = None, timeout: float = 120, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LEDGER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env(**extra),
        check=False,
    )


def one_error_line(done: subprocess.CompletedProcess[str], error_type: str) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {error_type}: "), done.stderr
    return lines[0]


def usage_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def on_terminal(*args: str, cols: int = 100, cwd: Path | None = None, **extra: str) -> str:
    """Run the script on a pseudo-terminal `cols` wide; return what it showed (no ANSI)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    proc = subprocess.Popen(
        [str(LEDGER), *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=cwd,
        env=env(TERM="xterm-256color", **extra),
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return ANSI.sub("", b"".join(chunks).decode("utf-8", errors="replace")).replace("\r", "")


def write_json(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value))
    return str(path)


# -- version, completion ----------------------------------------------------------------


def test_version_is_the_installed_distributions() -> None:
    done = ledger_cmd("--version")
    assert done.returncode == 0, done.stderr
    assert ledger.__version__ == importlib.metadata.version("run-ledger")
    assert done.stdout == f"ledger (run-ledger) {ledger.__version__}\n"


def test_shell_completion_is_offered() -> None:
    done = ledger_cmd("--help")
    assert done.returncode == 0
    assert "--install-completion" in done.stdout and "--show-completion" in done.stdout


# -- a missing optional extra names the pip command ---------------------------------------


def test_a_missing_extra_names_the_pip_command(tmp_path: Path) -> None:
    # Shadow the extras' modules the way an install without them looks: not importable.
    blocked = tmp_path / "blocked"
    for module in ("psycopg", "psycopg_pool", "fastapi", "uvicorn"):
        (blocked / module).mkdir(parents=True)
        (blocked / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError({f'No module named {module!r}'!r}, name={module!r})\n"
        )
    shadow = {"PYTHONPATH": str(blocked)}
    pg = ledger_cmd("--dsn", "postgresql://nobody@127.0.0.1:1/none", "runs", **shadow)
    assert "pip install 'run-ledger[postgres]'" in one_error_line(pg, "MissingExtra")
    Ledger.open(f"sqlite:///{tmp_path}/s.db").close()  # serve opens only a ledger that exists
    serve = ledger_cmd(
        "--dsn", f"sqlite:///{tmp_path}/s.db", "serve", "--port", "0", timeout=60, **shadow
    )
    assert "pip install 'run-ledger[http]'" in one_error_line(serve, "MissingExtra")


# -- read commands never create a database ---------------------------------------------


def test_read_commands_on_a_missing_sqlite_file_say_so_and_create_nothing(
    tmp_path: Path,
) -> None:
    typo = tmp_path / "typo.db"
    dsn = f"sqlite:///{typo}"
    some_run = "6f1c1a52-0000-4000-8000-000000000000"
    for args in (
        ["runs"],
        ["status", some_run],
        ["history", some_run],
        ["audit", "--jsonl"],
        ["verify"],
        ["reconcile"],
        ["start", some_run],
    ):
        line = one_error_line(ledger_cmd("--dsn", dsn, *args), "StoreUnavailable")
        assert "does not exist" in line and str(typo) in line, args
        assert not typo.exists(), args
    with pytest.raises(StoreUnavailable, match="does not exist"):
        Ledger.open(dsn, create=False)
    assert not typo.exists()
    # the commands that write a new ledger create it
    m = write_json(tmp_path / "m.json", manifest(2))
    assert ledger_cmd("--dsn", dsn, "submit", m).returncode == 0
    assert typo.exists()
    assert ledger_cmd("--dsn", dsn, "runs").returncode == 0
    # (`demo` creating its file is checked by the demo_dsn fixture below)


# -- piping ---------------------------------------------------------------------------


def test_piping_into_head_exits_0_without_a_broken_pipe_message(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/big.db"
    with Ledger.open(dsn) as lg:  # far more than a pipe buffers (64 KiB)
        run_id = lg.submit(manifest(1500), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        while leases := lg.claim(run_id, WORKER, limit=500):
            for lease in leases:
                lg.accept(lease)
    for pipeline in (
        f"{LEDGER} --dsn {dsn} audit --jsonl | head -1",
        f"{LEDGER} --dsn {dsn} history {run_id} | head",
        f"{LEDGER} --dsn {dsn} audit | head -3",
    ):
        done = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {pipeline}"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env(),
            check=False,
        )
        assert done.returncode == 0, (pipeline, done.stderr)
        assert done.stderr == "", (pipeline, done.stderr)
        assert done.stdout.strip(), pipeline


# -- tables on a terminal -----------------------------------------------------------------


def test_short_unique_prefixes() -> None:
    ids = ["aaaaaaaa-1111", "aaaaaaaa-2222", "bbbbbbbb-3333"]
    assert short_ids(ids) == {
        "aaaaaaaa-1111": "aaaaaaaa-1",
        "aaaaaaaa-2222": "aaaaaaaa-2",
        "bbbbbbbb-3333": "bbbbbbbb-3",
    }
    assert short_ids(["12345678-abcd", "87654321-abcd"]) == {
        "12345678-abcd": "12345678",
        "87654321-abcd": "87654321",
    }


@pytest.fixture(scope="module")
def demo_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("demo") / "demo.db"
    done = ledger_cmd("--dsn", f"sqlite:///{path}", "demo", "--items", "12", timeout=300)
    assert done.returncode == 0, done.stderr
    assert path.exists()  # demo writes, so it creates its ledger
    return f"sqlite:///{path}"


def test_tables_on_a_100_column_terminal_show_short_ids_and_wrap_nothing(demo_dsn: str) -> None:
    with Ledger.open(demo_dsn) as lg:
        runs = lg.runs()
        partial = next(r for r in runs if r.state == "completed_with_errors")
    full_ids = [r.run_id for r in runs]
    for args in (["runs"], ["audit", "--limit", "40"], ["history", partial.run_id]):
        shown = on_terminal("--dsn", demo_dsn, *args)
        lines = shown.splitlines()
        assert all(len(line) <= 100 for line in lines), (args, max(lines, key=len))
        body = "\n".join(lines[1:])  # the title of `history` names the run in full
        assert not any(i in body for i in full_ids), (args, shown)
    table = on_terminal("--dsn", demo_dsn, "runs").splitlines()
    for run in runs:
        rows = [line for line in table if line.startswith(run.run_id[:8])]
        assert len(rows) == 1, (run.run_id, table)  # one line per run: nothing wrapped
        assert run.state in rows[0]
    wide = on_terminal("--dsn", demo_dsn, "runs", "--wide")
    assert all(i in wide for i in full_ids)
    as_json = json.loads(ledger_cmd("--dsn", demo_dsn, "runs", "--json").stdout)
    assert {r["run_id"] for r in as_json} == set(full_ids)
    piped = ledger_cmd("--dsn", demo_dsn, "runs").stdout  # a pipe gets full ids
    assert all(i in piped for i in full_ids)


# -- review, and usage mistakes --------------------------------------------------------


def test_review_takes_exactly_one_decision_and_names_it(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/r.db"
    with Ledger.open(dsn) as lg:
        run_id = lg.submit(manifest(1), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        version = lg.request_review(run_id, CONTROLLER, "finance-signoff").input_version
    common = ["--dsn", dsn, "--as", "alice:reviewer", "review", run_id]
    tail = ["--input-version", version, "--reason", "checked"]
    usage_error(ledger_cmd(*common, "--approve", "--reject", *tail), "--approve", "--reject")
    usage_error(ledger_cmd(*common, *tail), "--approve", "--reject")
    with Ledger.open(dsn) as lg:
        assert lg.status(run_id).state == "awaiting_review"  # nothing was decided
    done = ledger_cmd(*common, "--approve", *tail)
    assert done.returncode == 0, done.stderr
    assert "approved review 'finance-signoff'" in done.stdout and version in done.stdout


def test_every_usage_mistake_exits_2_and_ledger_errors_exit_1(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/u.db"
    m = write_json(tmp_path / "m.json", manifest(1))
    run_id = json.loads(ledger_cmd("--dsn", dsn, "submit", m, "--json").stdout)["run_id"]
    usage_error(ledger_cmd("--dsn", dsn, "runs", "--state", "sleeping"), "sleeping")
    usage_error(ledger_cmd("--dsn", dsn, "items", run_id, "--state", "queued"), "queued")
    usage_error(ledger_cmd("--dsn", dsn, "audit", "--role", "boss"), "boss")
    usage_error(ledger_cmd("--dsn", dsn, "submit", str(tmp_path / "nope.json")), "nope.json")
    usage_error(ledger_cmd("--dsn", dsn, "--idempotency-key", "k1", "demo"), "idempotency")
    usage_error(ledger_cmd("--dsn", dsn, "runs", "--no-such-flag"), "--no-such-flag")
    usage_error(ledger_cmd("--dsn", dsn, "nonsense"))
    one_error_line(ledger_cmd("--dsn", dsn, "status", "not-a-run"), "RunNotFound")
    one_error_line(ledger_cmd("--dsn", dsn, "complete", run_id), "IllegalTransition")


# -- who a command is recorded as ------------------------------------------------------


def test_the_actor_defaults_to_ledger_actor_else_the_os_user(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/a.db"
    m = write_json(tmp_path / "m.json", manifest(1))
    user = {"LOGNAME": "carol", "USER": "carol"}

    def first_actor(*args: str, **extra: str) -> tuple[str, str]:
        done = ledger_cmd("--dsn", dsn, *args, "--json", **extra)
        assert done.returncode == 0, done.stderr
        run_id = json.loads(done.stdout)["run_id"]
        history = json.loads(ledger_cmd("--dsn", dsn, "history", run_id, "--json").stdout)
        last = history[-1]
        return last["actor_id"], last["role"]

    assert first_actor("submit", m, **user) == ("carol", "submitter")
    assert first_actor("submit", m, LEDGER_ACTOR="dave", **user) == ("dave", "submitter")
    assert first_actor("--as", "erin", "submit", m, LEDGER_ACTOR="dave") == ("erin", "submitter")
    run_id = json.loads(ledger_cmd("--dsn", dsn, "runs", "--json").stdout)[0]["run_id"]
    assert first_actor("start", run_id, **user) == ("carol", "controller")


# -- ledger work ------------------------------------------------------------------------

HANDLER = """
from ledger import Accepted

def handle(lease):
    return Accepted(evidence={"n": lease.payload["n"]})
"""


def test_work_says_to_start_a_queued_run_then_works_it_with_its_options(
    tmp_path: Path,
) -> None:
    (tmp_path / "handlers.py").write_text(HANDLER)
    dsn = f"sqlite:///{tmp_path}/w.db"
    m = write_json(tmp_path / "m.json", manifest(20))
    run_id = json.loads(ledger_cmd("--dsn", dsn, "submit", m, "--json").stdout)["run_id"]
    work = ["--dsn", dsn, "work", run_id, "--handler", "handlers:handle"]
    queued = one_error_line(ledger_cmd(*work, cwd=tmp_path), "IllegalTransition")
    assert "queued" in queued and f"ledger start {run_id}" in queued
    usage_error(ledger_cmd(*work, "--workers", "4", "--prefetch", "2", cwd=tmp_path), "prefetch")
    assert ledger_cmd("--dsn", dsn, "start", run_id).returncode == 0
    done = ledger_cmd(
        *work, "--worker-id", "w-7", "--prefetch", "8", "--workers", "2", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "worker w-7: claimed 20, accepted 20" in done.stdout
    assert "work: 20/20 items (100%)" in done.stderr  # the pipe form: lines, not a bar
    attempts = json.loads(ledger_cmd("--dsn", dsn, "attempts", run_id, "--json").stdout)
    assert {a["worker_id"] for a in attempts} == {"w-7"}


def test_work_defaults_its_id_and_shows_a_bar_on_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "handlers.py").write_text(HANDLER)
    dsn = f"sqlite:///{tmp_path}/w.db"
    with Ledger.open(dsn) as lg:
        run_id = lg.submit(manifest(30), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
    started = time.time()
    shown = on_terminal(
        "--dsn", dsn, "work", run_id, "--handler", "handlers:handle", cwd=tmp_path, LOGNAME="carol"
    )
    assert time.time() - started < 120
    assert "working" in shown and "30/30" in shown, shown
    match = re.search(r"worker (carol@[^:\s]+:\d+): claimed 30", shown)
    assert match, shown


# -- tokens -----------------------------------------------------------------------------


def test_token_list_shows_no_token_and_revoke_takes_an_actor_or_a_fingerprint(
    tmp_path: Path,
) -> None:
    tokens = str(tmp_path / "ledger.tokens")
    alice = ledger_cmd("token", "add", "alice", "reviewer", "--tokens", tokens).stdout.strip()
    bob = ledger_cmd("token", "add", "bob", "operator", "--tokens", tokens).stdout.strip()
    ledger_cmd("token", "add", "bob", "worker", "--tokens", tokens)
    listed = ledger_cmd("token", "list", "--tokens", tokens)
    assert listed.returncode == 0
    assert alice not in listed.stdout and bob not in listed.stdout
    assert alice not in Path(tokens).read_text()
    entries = json.loads(ledger_cmd("token", "list", "--tokens", tokens, "--json").stdout)
    assert [(e["actor_id"], e["role"]) for e in entries] == [
        ("alice", "reviewer"),
        ("bob", "operator"),
        ("bob", "worker"),
    ]
    assert all(re.fullmatch(r"[0-9a-f]{12}", e["fingerprint"]) for e in entries)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", e["added_at"]) for e in entries)
    for e in entries:
        assert e["fingerprint"] in listed.stdout and e["added_at"] in listed.stdout
    revoked = ledger_cmd("token", "revoke", entries[0]["fingerprint"], "--tokens", tokens)
    assert revoked.returncode == 0 and "alice" in revoked.stdout
    assert ledger_cmd("token", "revoke", "bob", "--tokens", tokens).returncode == 0
    assert json.loads(ledger_cmd("token", "list", "--tokens", tokens, "--json").stdout) == []
    one_error_line(ledger_cmd("token", "revoke", "carol", "--tokens", tokens), "InvalidInput")
