// Drives the live dashboard in headless Chromium (playwright-core, Debian's chromium).
// Usage: node dashboard_check.cjs <page url> <artifacts dir> <chromium path> <customer>
//        <product> <first order> <second order>
// Prints one JSON line per phase and waits for a line on stdin between them (the test
// produces events meanwhile):
//   before   the charts, the feed and the sparklines have data;
//   after    (the first order produced) the customer tops the bar chart, the product has a
//            series in the sales chart, the order is in the feed;
//   away     the page is left (about:blank); the test then produces the second order;
//   resumed  the page is opened again in the same browser (its storage kept): the feed shows
//            the second order, resumed from the stored cursor; desktop screenshot saved;
//   phone    the page at 390 px wide; phone screenshot saved.
// Fails (phase "failed") after 90 s in any phase.
const readline = require("node:readline");
const path = require("node:path");
const { chromium } = require("playwright-core");

const [url, artifacts, executablePath, customer, product, firstOrder, secondOrder] =
  process.argv.slice(2);
const TIMEOUT = { timeout: 90_000 };

// Everything the test checks, read from the page: text as shown, and the charts' own data.
async function state(page) {
  return page.evaluate(() => {
    const d = window.viewgateDashboard;
    const feed = d ? d.feed() : { items: [], position: null };
    return {
      top: d ? { labels: d.charts.top.data.labels, data: d.charts.top.data.datasets[0].data } : {},
      sales: d ? { labels: d.charts.sales.data.labels, datasets: d.charts.sales.data.datasets.map(
        (s) => ({ label: s.label, data: s.data })) } : {},
      sparklines: d ? d.sparklines() : {},
      feed: feed.items.map((i) => ({ op: i.op, key: i.key, version: i.version, cursor: i.cursor ?? null })),
      position: feed.position,
      storedPosition: JSON.parse(window.localStorage.getItem("viewgate.dashboard.orderFeed") || "null")?.position ?? null,
      shownCursor: document.querySelector("#feed").dataset.cursor || "",
      feedText: [...document.querySelectorAll("#feed li")].map((li) => li.textContent),
      freshness: [...document.querySelectorAll("#freshness li")].map((li) => li.textContent),
      error: document.querySelector("#error").hidden ? "" : document.querySelector("#error").textContent,
      scrollWidth: document.documentElement.scrollWidth,
      innerWidth: window.innerWidth,
      canvases: [...document.querySelectorAll("canvas")].map((c) => c.getBoundingClientRect().right),
    };
  });
}

async function loaded(page) {
  await page.waitForFunction(() => {
    const d = window.viewgateDashboard;
    if (!d) return false;
    const sparks = Object.values(d.sparklines());
    return d.charts.top.data.labels.length > 0
      && d.charts.sales.data.datasets.length > 0
      && d.feed().position !== null
      && sparks.length > 0 && sparks.every((s) => s.length >= 2)
      && document.querySelector("#freshness").textContent.includes("since last commit");
  }, null, TIMEOUT);
}

function say(phase, report) {
  console.log(JSON.stringify({ phase, ...report }));
}

(async () => {
  const lines = readline.createInterface({ input: process.stdin });
  const next = () => new Promise((resolve) => lines.once("line", resolve));
  const browser = await chromium.launch({
    executablePath,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  let page;
  try {
    page = await context.newPage();
    await page.goto(url);
    await loaded(page);
    say("before", await state(page));

    await next();
    await page.waitForFunction(([c, p, o]) => {
      const d = window.viewgateDashboard;
      return d.charts.top.data.labels[0] === c
        && d.charts.sales.data.datasets.some((s) => s.label === p)
        && d.feed().items.some((i) => i.key === o && i.op !== "ROW");
    }, [customer, product, firstOrder], TIMEOUT);
    say("after", await state(page));

    await page.goto("about:blank");
    say("away", {});
    await next();
    await page.goto(url);
    await page.waitForFunction((o) => window.viewgateDashboard
      && window.viewgateDashboard.feed().items.some((i) => i.key === o), secondOrder, TIMEOUT);
    await loaded(page);
    await page.screenshot({ path: path.join(artifacts, "dashboard.png"), fullPage: true });
    say("resumed", await state(page));

    await page.close();
    page = await context.newPage();
    await page.setViewportSize({ width: 390, height: 844 });
    await page.goto(url);
    await loaded(page);
    await page.screenshot({ path: path.join(artifacts, "dashboard-phone.png"), fullPage: true });
    say("phone", await state(page));
  } catch (error) {
    if (page) {
      await page.screenshot({ path: path.join(artifacts, "dashboard-failed.png"), fullPage: true })
        .catch(() => {});
    }
    say("failed", { error: String(error), ...(page ? await state(page).catch(() => ({})) : {}) });
    process.exitCode = 1;
  } finally {
    await browser.close();
    process.exit();
  }
})();
