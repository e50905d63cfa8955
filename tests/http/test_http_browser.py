"""End to end in headless Chromium: the operator page against a live server.

A real uvicorn server (in a thread, on a free 127.0.0.1 port) serves a SQLite
ledger holding runs in several states. Chromium (Debian's `chromium`, driven by
Playwright) signs in with a token, reads the runs table, checks that the run in
`awaiting_review` shows the reviewer as the one it waits on, follows it to its
run page and watches the page refresh on its own after the review (the seeded
operator ledger and the README's screenshots: tests/http/test_operator_page.py).
Skipped only when chromium is not installed.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import Actor, Ledger
from ledger.http import add_token
from ledger.http.serve import make_server
from tests.support.runs import manifest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
)

SUBMITTER = Actor("sam", "submitter")
CONTROLLER = Actor("ctl", "controller")
WORKER = Actor("w1", "worker")
REVIEWER = Actor("rita", "reviewer")
OPERATOR = Actor("olga", "operator")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def populate(lg: Ledger) -> dict[str, str]:
    """Runs waiting on each party, one finished run and a repair linked to it."""

    def started(n: int, scope: str, **policy: Any) -> str:
        m = manifest(n, **policy)
        m["scope"] = scope
        run_id = lg.submit(m, SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        return run_id

    runs: dict[str, str] = {}
    m = manifest(2)
    m["scope"] = "supplier price list, nightly"
    runs["queued"] = lg.submit(m, SUBMITTER).run_id

    runs["workers"] = started(6, "customer invoices, November")
    for lease in lg.claim(runs["workers"], WORKER, limit=3)[:2]:
        lg.accept(lease, evidence={"rows": 10})

    runs["review"] = started(5, "payroll export, week 48", review={"decision": "finance-sign-off"})
    leases = lg.claim(runs["review"], WORKER, limit=5)
    for lease in leases[:4]:
        lg.accept(lease)
    lg.fail_attempt(leases[4], "upstream returned 503 (password=hunter2 redacted?)", retryable=True)
    (again,) = lg.claim(runs["review"], WORKER)
    lg.accept(again, stage="load")
    lg.request_review(runs["review"], CONTROLLER, "finance-sign-off")

    runs["paused"] = started(4, "warehouse stock sync")
    lg.pause(runs["paused"], OPERATOR, "supplier API maintenance window")

    runs["failed"] = started(3, "bank statement import")
    (lease,) = lg.claim(runs["failed"], WORKER)
    lg.accept(lease)
    lg.fail(
        runs["failed"],
        CONTROLLER,
        "statement file missing",
        transient=True,
        failure_reason="input_unavailable",
    )
    runs["retry"] = lg.retry(runs["failed"], OPERATOR).run_id
    return runs


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[tuple[str, str, Ledger, dict[str, str]]]:
    tokens_path = tmp_path / "tokens"
    token = add_token("olga", "operator", tokens_path)
    lg = Ledger.open(f"sqlite:///{tmp_path}/ledger.db")
    runs = populate(lg)
    port = free_port()
    server = make_server(lg, port=port, tokens_path=tokens_path, log_level="warning")
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                pytest.fail("uvicorn did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", token, lg, runs
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        lg.close()


def test_operator_page_shows_who_each_run_waits_on(
    live_server: tuple[str, str, Ledger, dict[str, str]],
) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, token, lg, runs = live_server
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # Reads are not public: the page asks for a token, then shows the runs.
            response = page.goto(base + "/")
            assert response is not None and response.status == 401
            page.fill("#token", "not-a-token")
            page.click("button[type=submit]")
            expect(page.locator(".signin .error")).to_contain_text("unknown token")
            page.fill("#token", token)
            page.click("button[type=submit]")

            review_row = page.locator(f"tr[data-run-id='{runs['review']}']")
            expect(review_row).to_be_visible(timeout=10_000)
            expect(review_row.locator(".waiting")).to_have_text("waiting on: reviewer")
            expect(review_row).to_have_attribute("data-state", "awaiting_review")
            expected = {
                "queued": "controller",
                "workers": "workers",
                "paused": "operator",
                "retry": "controller",
            }
            for name, who in expected.items():
                row = page.locator(f"tr[data-run-id='{runs[name]}']")
                expect(row).to_have_attribute("data-waiting-on", who)
            expect(page.locator(".tally")).to_contain_text("waiting on: reviewer")
            # open runs only, until the finished runs are asked for
            expect(page.locator("tr.run-row")).to_have_count(len(runs) - 1)
            page.check("#terminal-filter")
            expect(page.locator("tr.run-row")).to_have_count(1)
            failed_row = page.locator(f"tr[data-run-id='{runs['failed']}']")
            expect(failed_row.locator(".failure")).to_have_text("transient · input unavailable")
            page.uncheck("#terminal-filter")

            # The state filter keeps only matching runs.
            page.select_option("#state-filter", "awaiting_review")
            expect(page.locator("tr.run-row")).to_have_count(1)
            page.select_option("#state-filter", "")
            expect(page.locator("tr.run-row")).to_have_count(len(runs) - 1)

            # The run page: the reviewer badge, counts, items, attempts, timeline.
            review_row.locator("a").first.click()
            expect(page.locator(".run-head .waiting.big")).to_have_text("waiting on: reviewer")
            expect(page.locator(".run-head")).to_contain_text("awaiting review")
            expect(page.locator("ol.timeline li")).to_have_count(len(lg.history(runs["review"])))
            expect(page.locator("section", has_text="Attempts (6, newest first)")).to_be_visible()

            # The page refreshes on its own: approve, and the badge changes without a reload.
            status = lg.status(runs["review"])
            lg.decide(
                runs["review"], REVIEWER, status.input_version, True, "figures match the ledger"
            )
            expect(page.locator(".run-head .waiting.big")).to_have_text(
                "waiting on: controller", timeout=15_000
            )

            # Lineage: the retry links back to the failed original.
            page.goto(f"{base}/#/runs/{runs['retry']}")
            lineage = page.locator("ol.lineage")
            expect(lineage).to_contain_text("(this run)")
            expect(lineage.locator(f"a[title='{runs['failed']}']")).to_be_visible()
            assert errors == []
        finally:
            browser.close()


def test_operator_page_lists_runs_by_attention_and_says_what_each_owner_does(
    live_server: tuple[str, str, Ledger, dict[str, str]],
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from ledger.cli.top import overview_rows

    base, token, lg, runs = live_server
    # two runs with workers at work: one can still succeed, one cannot (a required item
    # rejected, no partial delivery) and would need a repair
    runs["healthy"] = lg.submit(manifest(6), SUBMITTER).run_id
    runs["lost"] = lg.submit(manifest(6), SUBMITTER).run_id
    for name in ("healthy", "lost"):
        lg.start(runs[name], CONTROLLER)
        leases = lg.claim(runs[name], WORKER, limit=3)
        lg.accept(leases[0])
        if name == "lost":
            lg.reject(leases[1], "bad-row")
        else:
            lg.accept(leases[1])
    board = lg.board(order="attention").runs
    by_attention = [r.run_id for r in board]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            overview_calls: list[str] = []
            page.on(
                "request",
                lambda req: overview_calls.append(req.url) if "/overview" in req.url else None,
            )
            page.goto(base + "/")
            page.fill("#token", token)
            page.click("button[type=submit]")
            rows = page.locator("tr.run-row")
            expect(rows).to_have_count(len(by_attention))
            # the ledger's attention order (ledger top's), not newest first
            shown = [rows.nth(k).get_attribute("data-run-id") for k in range(rows.count())]
            assert shown == by_attention
            assert shown != [r.run_id for r in lg.board().runs]
            top = [row[0] for row in overview_rows(lg.overview(), markup=False)]
            assert [r for r in shown if r in top] == top
            # what each owner has to do, as the ledger says it
            for run in board:
                row = page.locator(f"tr[data-run-id='{run.run_id}']")
                expect(row.locator(".next-step")).to_have_text(run.next_step)
            paused = page.locator(f"tr[data-run-id='{runs['paused']}'] .next-step")
            expect(paused).to_have_text("operator: resume or cancel the run")
            queued = page.locator(f"tr[data-run-id='{runs['queued']}'] .next-step")
            expect(queued).to_have_text("controller: start the run (or cancel it)")
            # an ETA only where the run can still succeed
            healthy = page.locator(f"tr[data-run-id='{runs['healthy']}'] .eta")
            expect(healthy).to_contain_text("done in ~")
            lost = page.locator(f"tr[data-run-id='{runs['lost']}']")
            expect(lost.locator(".eta")).to_have_text("cannot succeed without a repair")
            expect(lost).not_to_contain_text("done in")
            expect(page.locator(f"tr[data-run-id='{runs['paused']}']")).not_to_contain_text(
                "done in"
            )
            # filters re-render the list at once, but the tally's /overview is read at most
            # once per refresh interval however often the list is drawn
            before = len(overview_calls)
            assert before >= 1
            for who in ("operator", "workers", "controller", ""):
                page.select_option("#owner-filter", who)
                expect(page.locator("#owner-filter")).to_have_value(who)
            page.select_option("#state-filter", "paused")
            expect(rows).to_have_count(1)
            page.select_option("#state-filter", "")
            expect(rows).to_have_count(len(by_attention))
            assert len(overview_calls) - before <= 1, overview_calls
            assert errors == []
        finally:
            browser.close()
