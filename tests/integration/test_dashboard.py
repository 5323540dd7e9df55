"""The live dashboard end to end: the real engine's output served by a gateway process,
the page driven by headless Chromium (Debian's chromium, playwright-core from npm). Events
produced while the page is open must show on it and in its charts' data, through its
subscriptions; an order produced while the page is closed must show once it is opened again
(the feed resumes from the cursor in the browser's storage), and no change twice; the page
must fit a phone's width. Screenshots: test-artifacts/dashboard.png and dashboard-phone.png."""

from __future__ import annotations

import datetime
import json
import os
import queue
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from shop_views import catalog_on, isolated, produce, run_once, shop_events

from viewgate.bench.servers import running
from viewgate.stack.dashboard import DASHBOARD_DIR, build_dashboard
from viewgate.stack.install import apt_install

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHECK = Path(__file__).with_name("dashboard_check.cjs")
ARTIFACTS = ROOT / "test-artifacts"
PREFIX = "dashboard-test"
CUSTOMER, PRODUCT = "C-DASHBOARD", "P-DASHBOARD"
FIRST, SECOND = "O-DASHBOARD", "O-DASHBOARD-2"


def _lines(process: subprocess.Popen) -> queue.Queue:
    """The script's stdout lines, read by a thread, so the test can wait with a deadline."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _report(lines: queue.Queue, timeout_s: float) -> dict:
    try:
        line = lines.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"the browser script said nothing within {timeout_s:.0f} s") \
            from None
    assert line is not None, "the browser script ended without a report"
    return json.loads(line)


def _order(order_id: str, amount: float) -> dict:
    return {"order_id": order_id, "customer_id": CUSTOMER, "product_id": PRODUCT,
            "amount": amount, "status": "placed",
            "ts": datetime.datetime.now(datetime.UTC).isoformat()}


def _big_order(topics: dict[str, str]) -> list[tuple[str, str, bytes]]:
    customer = {"customer_id": CUSTOMER, "name": "Dashboard Test", "tier": "gold",
                "country": "NL"}
    return [(topics["customers"], CUSTOMER, json.dumps(customer).encode()),
            (topics["orders"], FIRST, json.dumps(_order(FIRST, 987_654.0)).encode())]


def _tell(browser: subprocess.Popen, line: str) -> None:
    browser.stdin.write(line + "\n")
    browser.stdin.flush()


def _changes(report: dict) -> list[dict]:
    return [item for item in report["feed"] if item["op"] != "ROW"]


def test_dashboard_shows_produced_events_live(spark, settings, tmp_path):
    chromium = apt_install("chromium", "chromium")
    build_dashboard()
    settings = isolated(settings, tmp_path / "data", redis_db=15)
    catalog = catalog_on(PREFIX)
    topics = {s.name: s.topic for s in catalog.sources.values()}
    customers, orders = shop_events(PREFIX, seed=17, count=400)
    produce(settings.kafka_bootstrap, customers + orders)
    run_once(spark, settings, catalog)

    ARTIFACTS.mkdir(exist_ok=True)
    for name in ("dashboard.png", "dashboard-phone.png", "dashboard-failed.png"):
        (ARTIFACTS / name).unlink(missing_ok=True)
    reports: dict[str, dict] = {}
    with running(["gateway"], settings, tmp_path / "servers") as servers:
        url = f"http://127.0.0.1:{servers['gateway'].port}/dashboard"
        browser = subprocess.Popen(
            [shutil.which("node") or "node", str(CHECK), url, str(ARTIFACTS), chromium,
             CUSTOMER, PRODUCT, FIRST, SECOND],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "NODE_PATH": str(DASHBOARD_DIR / "node_modules")})
        try:
            lines = _lines(browser)

            def expect(phase: str, timeout_s: float = 150) -> dict:
                report = _report(lines, timeout_s)
                assert report["phase"] == phase, report
                reports[phase] = report
                return report

            before = expect("before", timeout_s=120)
            assert before["top"]["labels"] and CUSTOMER not in before["top"]["labels"]
            assert before["sales"]["datasets"] and not before["error"]
            assert all(s["label"] != PRODUCT for s in before["sales"]["datasets"])
            assert any("CustomerStats v" in text for text in before["freshness"])
            # A sparkline per view, of numbers (milliseconds since its last commit).
            assert set(before["sparklines"]) >= {"Customer", "Order", "CustomerStats",
                                                 "ProductSales"}
            assert all(len(points) >= 2 and all(isinstance(p, int | float) for p in points)
                       for points in before["sparklines"].values())
            # The feed starts from the last orders and the Order view's version.
            assert before["position"] == before["storedPosition"]
            assert "afterVersion" in before["position"] and before["feed"]
            assert not _changes(before)

            produce(settings.kafka_bootstrap, _big_order(topics))
            run_once(spark, settings, catalog)
            _tell(browser, "produced")
            after = expect("after")
            # In the charts' data: the customer tops the bar chart with the order's amount,
            # the product has a series with it in the latest minute.
            assert after["top"]["labels"][0] == CUSTOMER
            assert after["top"]["data"][0] == 987_654.0
            series = next(s for s in after["sales"]["datasets"] if s["label"] == PRODUCT)
            assert 987_654.0 in series["data"]
            # On the page: the order in the feed, with its amount, and its cursor stored.
            assert [c["key"] for c in _changes(after)] == [FIRST]
            assert any(FIRST in text and "$987,654.00" in text for text in after["feedText"])
            cursor = _changes(after)[0]["cursor"]
            assert after["position"] == after["storedPosition"] == {"after": cursor}
            assert after["shownCursor"] == cursor

            expect("away")
            # Produced while no page is open: the reloaded page must catch it up.
            produce(settings.kafka_bootstrap, [(topics["orders"], SECOND, json.dumps(
                _order(SECOND, 1_234.5)).encode())])
            run_once(spark, settings, catalog)
            _tell(browser, "produced")
            resumed = expect("resumed")
            phone = expect("phone")
        finally:
            if browser.poll() is None:
                # SIGTERM: Playwright closes the browser it launched (its own process group)
                # before node exits; SIGKILL would leave Chromium behind.
                browser.terminate()
                try:
                    browser.wait(20)
                except subprocess.TimeoutExpired:
                    browser.kill()
                    browser.wait(10)
    # Resumed after the reload: nothing lost, nothing repeated, the cursor moved on.
    changes = _changes(resumed)
    assert [c["key"] for c in changes] == [SECOND, FIRST], resumed["feed"]
    assert len({(c["key"], c["version"]) for c in changes}) == len(changes)
    assert len({c["cursor"] for c in changes}) == len(changes)
    assert resumed["position"] == {"after": changes[0]["cursor"]} != after["position"]
    assert any(SECOND in text and "$1,234.50" in text for text in resumed["feedText"])
    assert resumed["top"]["labels"][0] == CUSTOMER
    assert resumed["top"]["data"][0] == 987_654.0 + 1_234.5
    # At phone width nothing sticks out sideways, every chart included.
    assert phone["innerWidth"] == 390
    assert phone["scrollWidth"] <= phone["innerWidth"], phone["scrollWidth"]
    assert phone["canvases"] and max(phone["canvases"]) <= phone["innerWidth"]
    assert [c["key"] for c in _changes(phone)] == [SECOND, FIRST]
    for name in ("dashboard.png", "dashboard-phone.png"):
        assert (ARTIFACTS / name).stat().st_size > 10_000
