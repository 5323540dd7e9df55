"""The live dashboard end to end: the real engine's output served by a gateway process,
the page driven by headless Chromium (Debian's chromium, playwright-core from npm). Events
produced while the page is open must show on it, through its subscriptions."""

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


def _big_order(topics: dict[str, str]) -> list[tuple[str, str, bytes]]:
    now = datetime.datetime.now(datetime.UTC)
    customer = {"customer_id": CUSTOMER, "name": "Dashboard Test", "tier": "gold",
                "country": "NL"}
    order = {"order_id": "O-DASHBOARD", "customer_id": CUSTOMER, "product_id": PRODUCT,
             "amount": 987_654.0, "status": "placed", "ts": now.isoformat()}
    return [(topics["customers"], CUSTOMER, json.dumps(customer).encode()),
            (topics["orders"], "O-DASHBOARD", json.dumps(order).encode())]


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
    screenshot = ARTIFACTS / "dashboard.png"
    screenshot.unlink(missing_ok=True)
    with running(["gateway"], settings, tmp_path / "servers") as servers:
        url = f"http://127.0.0.1:{servers['gateway'].port}/dashboard"
        browser = subprocess.Popen(
            [shutil.which("node") or "node", str(CHECK), url, str(screenshot), chromium,
             CUSTOMER, PRODUCT],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "NODE_PATH": str(DASHBOARD_DIR / "node_modules")})
        try:
            lines = _lines(browser)
            before = _report(lines, timeout_s=120)
            assert before["phase"] == "before", before
            assert all(row[1] != CUSTOMER for row in before["top"])
            assert before["top"] and before["sales"] and not before["error"]
            assert any("CustomerStats v" in text for text in before["freshness"])

            produce(settings.kafka_bootstrap, _big_order(topics))
            run_once(spark, settings, catalog)
            browser.stdin.write("produced\n")
            browser.stdin.flush()
            after = _report(lines, timeout_s=150)
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
    assert after["phase"] == "after", after
    assert after["top"][0][1] == CUSTOMER and "987,654.00" in after["top"][0][3]
    assert any(row[1] == PRODUCT for row in after["sales"])
    assert screenshot.stat().st_size > 10_000
