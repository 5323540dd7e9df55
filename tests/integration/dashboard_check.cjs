// Drives the live dashboard in headless Chromium (playwright-core, Debian's chromium).
// Usage: node dashboard_check.cjs <page url> <screenshot path> <chromium path> <customer> <product>
// Prints one JSON line once both live tables have rows, waits for a line on stdin (the
// test has produced events by then), then prints one JSON line once the customer tops the
// first table and the product shows in the second, or fails after 90 s.
const readline = require("node:readline");
const { chromium } = require("playwright-core");

const [url, screenshot, executablePath, customer, product] = process.argv.slice(2);

async function tables(page) {
  return page.evaluate(() => {
    const rows = (id) => [...document.querySelectorAll(`#${id} tbody tr`)].map(
      (tr) => [...tr.children].map((td) => td.textContent));
    return {
      top: rows("top-customers"),
      sales: rows("sales-per-minute"),
      freshness: [...document.querySelectorAll("#freshness li")].map((li) => li.textContent),
      error: document.querySelector("#error").hidden ? "" : document.querySelector("#error").textContent,
    };
  });
}

(async () => {
  const browser = await chromium.launch({
    executablePath,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  let page;
  try {
    page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    await page.goto(url);
    await page.waitForFunction(() =>
      document.querySelectorAll("#top-customers tbody tr").length > 0
      && document.querySelectorAll("#sales-per-minute tbody tr").length > 0
      && document.querySelector("#freshness").textContent.includes("since last commit"),
      null, { timeout: 60_000 });
    console.log(JSON.stringify({ phase: "before", ...(await tables(page)) }));
    const lines = readline.createInterface({ input: process.stdin });
    await new Promise((resolve) => lines.once("line", resolve));
    await page.waitForFunction(([c, p]) => {
      const first = document.querySelector("#top-customers tbody tr td.key");
      const sales = document.querySelector("#sales-per-minute tbody").textContent;
      return first && first.textContent === c && sales.includes(p);
    }, [customer, product], { timeout: 90_000 });
    await page.screenshot({ path: screenshot, fullPage: true });
    console.log(JSON.stringify({ phase: "after", ...(await tables(page)) }));
  } catch (error) {
    if (page) await page.screenshot({ path: screenshot, fullPage: true }).catch(() => {});
    console.log(JSON.stringify({ phase: "failed", error: String(error),
                                 ...(page ? await tables(page).catch(() => ({})) : {}) }));
    process.exitCode = 1;
  } finally {
    await browser.close();
    process.exit();
  }
})();
