"""The operator page in headless Chromium: can an operator point at every stuck run and say on whom?

A live `ledger serve` process serves a SQLite ledger seeded as an operator finds it
(tests/support/operator_seed.py): 600 runs, the oldest open one awaiting review behind 594
newer finished runs, a run whose worker died (three expired, unreconciled leases), an
idle run, a healthy one and a 5,000-item run. Playwright's network events count what
each refresh of the big run's page fetches. Screenshots go to tmp_path, or to docs/
with LEDGER_UPDATE_SCREENSHOTS=1 (the README shows those).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ledger import Actor, Ledger
from ledger.http import add_token
from tests.http.test_http_browser import CHROMIUM, CHROMIUM_ARGS, ROOT, free_port
from tests.support.operator_seed import seed

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
)

BIG_ITEMS = 5000
ITEM_PAGE = 100  # the page's page size (ledger/http/static/app.js ITEM_PAGE)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("operator")
    dsn = f"sqlite:///{tmp}/ledger.db"
    runs = seed(dsn, finished=594, big_items=BIG_ITEMS)
    tokens = tmp / "tokens"
    token = add_token("olga", "operator", tokens)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ledger.cli.entry",
            "--dsn",
            dsn,
            "serve",
            "--port",
            str(port),
            "--tokens",
            str(tokens),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(base + "/healthz", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("ledger serve did not start")
                time.sleep(0.1)
        yield {"base": base, "token": token, "runs": runs, "tmp": tmp, "dsn": dsn}
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _browser(pw: Any) -> Any:
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def _signed_in(browser: Any, served: dict[str, Any], width: int, height: int) -> Any:
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(served["base"] + "/")
    page.fill("#token", served["token"])
    page.click("button[type=submit]")
    return page


def test_every_stuck_run_is_visible_and_says_on_whom(served: dict[str, Any]) -> None:
    from playwright.sync_api import expect, sync_playwright

    shots = ROOT / "docs" if os.environ.get("LEDGER_UPDATE_SCREENSHOTS") else served["tmp"]
    runs = served["runs"]
    with sync_playwright() as pw:
        browser = _browser(pw)
        try:
            page = _signed_in(browser, served, 1280, 900)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # The tally counts every open run: the review run is older than 594 finished ones.
            tally = page.locator(".tally")
            reviewer = tally.locator("[data-owner=reviewer]")
            expect(reviewer).to_contain_text("waiting on: reviewer 1")
            expect(tally.locator("[data-owner=reconciler]")).to_contain_text("reconciler 1")
            expect(tally.locator("[data-owner=stalled]")).to_contain_text("stalled 1")
            expect(tally.locator("[data-owner=expired]")).to_contain_text("expired leases 3")
            expect(tally).to_contain_text("6 open runs")
            review_row = page.locator(f"tr[data-run-id='{runs['review']}']")
            expect(review_row).to_be_visible()
            expect(review_row).to_have_attribute("data-waiting-on", "reviewer")
            expect(review_row.locator(".person")).to_have_text(" rita")  # routed to her
            dead_row = page.locator(f"tr[data-run-id='{runs['dead']}']")
            expect(dead_row).to_have_attribute("data-waiting-on", "reconciler")
            expect(dead_row.locator(".badge.expired")).to_have_text("3 expired leases")
            idle_row = page.locator(f"tr[data-run-id='{runs['idle']}']")
            expect(idle_row.locator(".badge.stalled")).to_be_visible()
            expect(idle_row.locator(".person")).to_have_text(" w-slow")
            healthy = page.locator(f"tr[data-run-id='{runs['healthy']}']")
            expect(healthy.locator(".badge.stalled")).to_have_count(0)
            expect(healthy.locator(".rate")).to_have_text("4.0/min")
            expect(page.locator("tr.run-row")).to_have_count(6)  # open runs first, one page
            # most urgent first, as `ledger top` ranks them: the stuck runs (the dead worker's
            # leases expired first, then the idle run), then the longest wait on a person
            order = page.locator("tr.run-row").evaluate_all(
                "rows => rows.map(r => r.dataset.runId)"
            )
            assert order[:3] == [runs["dead"], runs["idle"], runs["review"]], order
            expect(dead_row.locator(".next-step")).to_contain_text("reconciler: expire")
            expect(review_row.locator(".next-step")).to_have_text("reviewer: approve or reject")
            page.screenshot(path=str(shots / "operator-page.png"), full_page=True)

            # Filters: by owner from the tally, stalled only, then the finished runs, paged.
            reviewer.click()
            expect(page.locator("tr.run-row")).to_have_count(1)
            expect(page.locator("tr.run-row")).to_have_attribute("data-run-id", runs["review"])
            page.select_option("#owner-filter", "")
            expect(page.locator("tr.run-row")).to_have_count(6)
            page.check("#stalled-filter")
            expect(page.locator("tr.run-row")).to_have_count(1)
            expect(page.locator("tr.run-row")).to_have_attribute("data-run-id", runs["idle"])
            page.uncheck("#stalled-filter")
            expect(page.locator("tr.run-row")).to_have_count(6)
            page.check("#terminal-filter")
            expect(page.locator("tr.run-row")).to_have_count(50)
            first = page.locator("tr.run-row").first.get_attribute("data-run-id")
            page.click("#next-page")
            expect(page.locator("tr.run-row").first).not_to_have_attribute(
                "data-run-id", first or ""
            )
            expect(page.locator("tr.run-row")).to_have_count(50)
            transient = page.locator("tr.run-row .failure-transient")
            expect(transient.first).to_be_visible()
            page.uncheck("#terminal-filter")

            # Keyboard: Tab reaches the dead-worker run's link, Enter opens its page.
            expect(dead_row).to_be_visible()
            link = dead_row.locator("a.run-link")
            for _ in range(60):
                page.keyboard.press("Tab")
                if link.evaluate("a => a === document.activeElement"):
                    break
            else:
                pytest.fail("Tab never reached the run's link")
            page.keyboard.press("Enter")
            head = page.locator(".run-head")
            expect(head.locator(".waiting.big")).to_have_text("waiting on: reconciler")
            expired = page.locator("table.items tr[data-lease-expired=true]")
            expect(expired).to_have_count(3)
            expect(expired.first.locator(".lease")).to_contain_text("not reconciled")
            expect(page.locator("table.attempts .badge.expired")).to_have_count(3)
            expect(page.locator("table.attempts")).not_to_contain_text("in flight")
            page.screenshot(path=str(shots / "operator-run-page.png"), full_page=True)

            # The big run: each refresh fetches one page of items, never the whole run. Its
            # workers go on (live refresh from the change feed, or the 5 s polling).
            fetched: list[tuple[str, int]] = []
            page.on(
                "requestfinished",
                lambda req: fetched.append((req.url, req.sizes()["responseBodySize"])),
            )
            page.goto(f"{served['base']}/#/runs/{runs['big']}")
            expect(page.locator("table.items tbody tr")).to_have_count(ITEM_PAGE)
            items_url = f"/board/{runs['big']}/items"
            with Ledger.open(served["dsn"]) as lg:
                for _ in range(2):
                    with page.expect_response(lambda r: items_url in r.url, timeout=20_000):
                        for lease in lg.claim(runs["big"], Actor("w-index", "worker"), limit=5):
                            lg.accept(lease)
            expect(page.locator(".run-head")).to_contain_text("accepted 2510")
            renders = [u for u, _ in fetched if u.split("?")[0].endswith(f"/board/{runs['big']}")]
            item_calls = [(u, n) for u, n in fetched if items_url in u]
            # the first render and at least one refresh: refreshes that fall due while one is
            # in flight are folded into the next, so two rounds of commits may show as one
            assert len(renders) >= 2, fetched
            # one page of items per refresh (the last refresh may still be in flight: one of
            # its two answers can finish before the other)
            assert abs(len(item_calls) - len(renders)) <= 1, fetched
            for url, size in item_calls:
                assert f"limit={ITEM_PAGE}" in url
                assert size < 40_000, (url, size)
            assert not [u for u, _ in fetched if u.endswith(("/items", "/attempts", "/history"))]
            per_refresh = sum(n for _, n in fetched) / len(renders)
            print(
                f"big run: {len(renders)} renders, item pages of {[n for _, n in item_calls]} "
                f"bytes, {per_refresh:.0f} bytes per refresh in all"
            )
            assert per_refresh < 120_000, per_refresh  # was 6.8 MB for this run
            page.click("#next-items")
            expect(page.locator("table.items tbody tr").first).to_have_attribute(
                "data-item-id", f"i{ITEM_PAGE}"
            )
            expect(page.locator(".run-head")).to_contain_text("w-index")
            page.screenshot(path=str(shots / "operator-big-run.png"))

            # A phone's width: the same facts, as labelled cards.
            phone = _signed_in(browser, served, 390, 844)
            expect(phone.locator(".tally [data-owner=reviewer]")).to_be_visible()
            card = phone.locator(f"tr[data-run-id='{runs['dead']}']")
            expect(card.locator(".badge.expired")).to_be_visible()
            box = card.bounding_box()
            assert box is not None and box["width"] <= 390
            # nothing wider than the phone: no sideways scrolling
            assert phone.evaluate("document.documentElement.scrollWidth") <= 390
            phone.screenshot(path=str(shots / "operator-phone.png"))
            assert errors == []
        finally:
            browser.close()


def test_overview_counts_every_open_run(served: dict[str, Any]) -> None:
    body = httpx.get(
        served["base"] + "/overview",
        headers={"Authorization": f"Bearer {served['token']}"},
        timeout=10,
    ).json()
    assert body["open_runs"] == 6
    assert body["oldest_wait"]["reviewer"]["run_id"] == served["runs"]["review"]
    assert body["by_waiting_on"] == {
        "reconciler": 1,
        "reviewer": 1,
        "operator": 1,
        "controller": 0,
        "workers": 3,
    }
