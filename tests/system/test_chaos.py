"""The chaos run (scripts/chaos.py) at a modest size: worker processes SIGKILLed at
random and started again, the server restarted once, a run canceled mid-flight, the
reconciler every second. No double lease, no lost acknowledged write, no verify problem.

Marked `slow` (CI runs it). The full-size run is `python scripts/chaos.py`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Not marked `postgres`: the script always starts (and restarts) a server of its own, so
# the CI pass against LEDGER_TEST_DSN's server would only repeat it.
pytestmark = pytest.mark.slow


def figures(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


def test_chaos_run_is_clean() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "chaos.py"),
            "--items",
            "1500",
            "--workers",
            "4",
            "--seconds",
            "10",
            "--min-kills",
            "10",
            "--handler-ms",
            "6",
            "--lease-seconds",
            "3",
            "--timeout",
            "240",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("chaos: items=")]
    assert lines, (
        f"no figures (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    f = figures(lines[-1])
    assert f["double_leases"] == "0", lines[-1]
    assert f["lost_acknowledged_writes"] == "0", (lines[-1], proc.stderr[-3000:])
    assert f["verify_problems"] == "0", (lines[-1], proc.stderr[-3000:])
    assert f["states"] in ("succeeded/canceled", "completed_with_errors/canceled"), lines[-1]
    # the chaos happened: workers were killed, the server restarted, leases expired and were reconciled
    assert int(f["killed_workers"]) >= 10 and f["server_restarts"] == "1"
    assert int(f["expired_leases"]) > 0 and int(f["attempts"]) > 1500
    assert proc.returncode == 0, proc.stderr[-3000:]
