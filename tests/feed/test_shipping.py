"""Checkpoints leave the database on a schedule (`ledger checkpoint sign --every --to`):
to a directory, one file per checkpoint and a `latest`, or POSTed to a URL; a tick whose
tree did not grow ships nothing; a refused POST is tried again at the next tick; the
command stops cleanly on SIGTERM. Loops are bounded by a tick count or a stop event,
never by sleeping."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import InvalidInput, Ledger
from ledger.core.note import Signer
from ledger.feed.shipping import Shipper, ship_every
from tests.support.cli import cli
from tests.support.runs import finished_run
from tests.support.waiting import wait_until

CLI = [sys.executable, "-c", "from ledger.cli import main; raise SystemExit(main())"]
WAIT = 60.0  # a bound on waiting for the child, never a timing assertion


@pytest.fixture
def key() -> Signer:
    return Signer.generate("ship.test")


def _verifies(lg: Ledger, note: str, key: Signer) -> bool:
    return lg.verify(checkpoints=[note], vkeys=[key.verifier().text()]).ok


def test_a_directory_gets_one_file_per_grown_tree_and_a_latest(
    lg: Ledger, key: Signer, tmp_path: Path
) -> None:
    folder = tmp_path / "out"
    finished_run(lg, 1)
    shipper = Shipper(lg, key, str(folder))
    stop = threading.Event()
    assert ship_every(shipper, 0, stop, count=3) == 1  # the tree did not grow after the first
    finished_run(lg, 1)
    assert ship_every(shipper, 0, stop, count=2) == 1
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 3 and files[-1] == "latest"
    first, second = ((folder / f).read_text() for f in files[:2])
    assert int(first.split("\n")[1]) < int(second.split("\n")[1])
    assert (folder / "latest").read_text() == second
    assert _verifies(lg, first, key) and _verifies(lg, second, key)
    # a new shipper (a restart) reads `latest` and does not ship the same size again
    assert ship_every(Shipper(lg, key, str(folder)), 0, stop, count=1) == 0


class _Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list[str]
    answers: list[int]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"])).decode()
        status = self.answers.pop(0) if self.answers else 200
        if status == 200:
            self.bodies.append(body)
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, type[_Receiver]]]:
    handler = type("Receiver", (_Receiver,), {"bodies": [], "answers": [503]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/checkpoints", handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_url_gets_each_checkpoint_posted_and_a_refusal_is_retried(
    lg: Ledger, key: Signer, receiver: tuple[str, type[_Receiver]]
) -> None:
    url, handler = receiver
    finished_run(lg, 1)
    ticks: list[Any] = []
    shipped = ship_every(Shipper(lg, key, url), 0, threading.Event(), count=3, on_tick=ticks.append)
    assert shipped == 1
    assert ticks[0].error is not None and not ticks[0].shipped  # the 503
    assert ticks[1].shipped and not ticks[2].shipped  # shipped, then not grown
    assert len(handler.bodies) == 1 and _verifies(lg, handler.bodies[0], key)


def test_a_url_of_another_scheme_is_refused_and_nothing_is_made(
    lg: Ledger, key: Signer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)  # where a URL taken for a directory name would be made
    for to in ("ftp://host/dir", "file:///tmp/x", "gopher://x"):
        with pytest.raises(InvalidInput, match="http"):
            Shipper(lg, key, to)
    assert list(here.iterdir()) == []


def test_the_cli_ships_until_sigterm(dsn: str, tmp_path: Path) -> None:
    Ledger.open(dsn).close()
    with Ledger.open(dsn) as lg:
        finished_run(lg, 1)
    keys, folder = tmp_path / "keys", tmp_path / "shipped"
    assert cli(dsn, "checkpoint", "keygen", "host", "--out", str(keys)).exit_code == 0
    r = cli(
        dsn,
        "checkpoint",
        "sign",
        "--key",
        str(keys / "host.key"),
        "--every",
        "0s",
        "--to",
        str(folder),
        "--count",
        "2",
    )
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in folder.iterdir())[-1] == "latest"
    (folder / "latest").unlink()
    env = {**os.environ, "LEDGER_DSN": dsn}
    child = subprocess.Popen(
        [
            *CLI,
            "checkpoint",
            "sign",
            "--key",
            str(keys / "host.key"),
            "--every",
            "1h",
            "--to",
            str(folder),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: (folder / "latest").exists(), "the first checkpoint", WAIT)
        child.send_signal(signal.SIGTERM)
        assert child.wait(WAIT) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with Ledger.open(dsn) as lg:
        assert lg.verify(
            checkpoints=[(folder / "latest").read_text()],
            vkeys=[(keys / "host.vkey").read_text().strip()],
        ).ok
