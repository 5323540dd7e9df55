// The live dashboard: product sales per minute and the top customers as live charts
// (Chart.js), each view's freshness as a sparkline, and a feed of the last orders whose
// position is kept in the browser's storage, so a reload resumes it without losing or
// repeating a change. Data comes from this gateway: subscriptions over graphql-ws (urql),
// freshness from the `views` query.
import { Client, fetchExchange, subscriptionExchange } from "@urql/core";
import {
  BarController, BarElement, CategoryScale, Chart, Filler, Legend, LinearScale,
  LineController, LineElement, PointElement, Tooltip,
} from "chart.js";
import { createClient as createWSClient } from "graphql-ws";

Chart.register(BarController, BarElement, CategoryScale, Filler, Legend, LinearScale,
  LineController, LineElement, PointElement, Tooltip);

const TOP_CUSTOMERS = `subscription TopCustomers {
  customerStatsList(orderBy: {field: TOTAL_SPENT, direction: DESC}, first: 10) {
    edges { node { customerId orderCount totalSpent lastOrderAt } }
  }
}`;

const SALES_PER_MINUTE = `subscription SalesPerMinute {
  productSalesList(orderBy: {field: WINDOW_START, direction: DESC}, first: 100) {
    edges { node { productId windowStart orderCount revenue } }
  }
}`;

const ORDER_FIELDS = "orderId customerId productId amount status ts";
const LAST_ORDERS = `query LastOrders {
  orders(orderBy: {field: TS, direction: DESC}, first: 12) { edges { node { ${ORDER_FIELDS} } } }
}`;
const ORDER_CHANGES = `subscription OrderFeed($after: String, $afterVersion: Int) {
  orderChanges(after: $after, afterVersion: $afterVersion) {
    op key version cursor row { ${ORDER_FIELDS} }
  }
}`;

const FRESHNESS = `query Freshness { views { name version sinceCommitMs } }`;

const FEED_KEY = "viewgate.dashboard.orderFeed"; // {position: {after}|{afterVersion}, items}
const FEED_ITEMS = 40;
const SPARK_POINTS = 60;
const MINUTES = 15;
const PRODUCTS = 6;
const PALETTE = ["#3867d6", "#20bf6b", "#f7b731", "#eb3b5a", "#8854d0", "#0fb9b1", "#a5b1c2"];

const wsUrl = new URL("/graphql", window.location.href);
wsUrl.protocol = wsUrl.protocol === "https:" ? "wss:" : "ws:";
const connection = document.querySelector("#connection");
function showConnection(state, text) {
  connection.className = state;
  connection.textContent = text;
}
const ws = createWSClient({
  url: wsUrl.href,
  retryAttempts: Infinity,
  on: {
    connected: () => showConnection("open", "live"),
    closed: () => showConnection("closed", "reconnecting…"),
  },
});

const client = new Client({
  url: "/graphql",
  // The GraphQL-over-HTTP spec's advice for clients.
  fetchOptions: { headers: { accept: "application/graphql-response+json, application/json;q=0.9" } },
  exchanges: [
    fetchExchange,
    subscriptionExchange({
      forwardSubscription(request) {
        const input = { ...request, query: request.query || "" };
        return { subscribe: (sink) => ({ unsubscribe: ws.subscribe(input, sink) }) };
      },
    }),
  ],
  requestPolicy: "network-only",
});

const money = new Intl.NumberFormat("en", { style: "currency", currency: "USD" });
const compactMoney = new Intl.NumberFormat("en", {
  style: "currency", currency: "USD", notation: "compact", maximumFractionDigits: 1,
});
const clock = new Intl.DateTimeFormat([], {
  hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23",
});
const errors = {};

function showError(source, error) {
  errors[source] = error ? String(error.message || error) : "";
  const text = Object.values(errors).filter(Boolean).join(" · ");
  const box = document.querySelector("#error");
  box.textContent = text;
  box.hidden = !text;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

Chart.defaults.font.family = "system-ui, -apple-system, 'Segoe UI', sans-serif";
Chart.defaults.color = "#6b7585";
Chart.defaults.animation = false; // live data: draw each update at once
Chart.defaults.maintainAspectRatio = false;

// --- Product sales per minute: stacked bars, one series per product ------------------

const salesChart = new Chart(document.querySelector("#sales-chart"), {
  type: "bar",
  data: { labels: [], datasets: [] },
  options: {
    interaction: { mode: "index", intersect: false },
    scales: {
      x: { stacked: true, grid: { display: false } },
      y: { stacked: true, ticks: { callback: (v) => compactMoney.format(v) } },
    },
    plugins: {
      legend: { position: "bottom", labels: { boxWidth: 12 } },
      tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${money.format(c.parsed.y)}` } },
    },
  },
});

function minuteLabel(iso) {
  return new Date(iso).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function drawSales(nodes) {
  const minutes = [...new Set(nodes.map((n) => n.windowStart))].sort().slice(-MINUTES);
  const shown = nodes.filter((n) => minutes.includes(n.windowStart));
  const totals = new Map();
  for (const n of shown) totals.set(n.productId, (totals.get(n.productId) || 0) + n.revenue);
  const top = [...totals].sort((a, b) => b[1] - a[1]).slice(0, PRODUCTS).map(([p]) => p);
  const series = [...top, ...(totals.size > top.length ? ["other"] : [])];
  const cells = new Map(series.map((p) => [p, minutes.map(() => 0)]));
  for (const n of shown) {
    const row = cells.get(top.includes(n.productId) ? n.productId : "other");
    row[minutes.indexOf(n.windowStart)] += n.revenue;
  }
  salesChart.data.labels = minutes.map(minuteLabel);
  salesChart.data.datasets = series.map((p, i) => ({
    label: p, data: cells.get(p), backgroundColor: PALETTE[i % PALETTE.length],
    borderRadius: 3, maxBarThickness: 42,
  }));
  salesChart.update();
}

client.subscription(SALES_PER_MINUTE, {}).subscribe((result) => {
  showError("sales", result.error);
  if (result.data) drawSales(result.data.productSalesList.edges.map((e) => e.node));
});

// --- Top customers: horizontal bars ---------------------------------------------------

const topChart = new Chart(document.querySelector("#top-chart"), {
  type: "bar",
  data: { labels: [], datasets: [{ label: "total spent", data: [], backgroundColor: "#3867d6",
                                    borderRadius: 3 }] },
  options: {
    indexAxis: "y",
    scales: {
      x: { ticks: { callback: (v) => compactMoney.format(v) } },
      y: { grid: { display: false } },
    },
    plugins: {
      legend: { display: false },
      tooltip: { callbacks: { label: (c) => `${money.format(c.parsed.x)} in ${
        topChart.$orders[c.dataIndex]} orders` } },
    },
  },
});
topChart.$orders = [];

client.subscription(TOP_CUSTOMERS, {}).subscribe((result) => {
  showError("top", result.error);
  if (!result.data) return;
  const nodes = result.data.customerStatsList.edges.map((e) => e.node);
  topChart.data.labels = nodes.map((n) => n.customerId);
  topChart.data.datasets[0].data = nodes.map((n) => n.totalSpent);
  topChart.$orders = nodes.map((n) => n.orderCount);
  topChart.update();
});

// --- The order feed, resumed from the browser's storage -------------------------------

function loadFeed() {
  try {
    const saved = JSON.parse(window.localStorage.getItem(FEED_KEY));
    if (saved && saved.position && Array.isArray(saved.items)) return saved;
  } catch { /* unreadable: start over */ }
  return null;
}

// The position and the items shown are saved together, after every change: a reload
// shows what was shown and resumes right after the last change it saw.
const feed = loadFeed() || { position: null, items: [] };
function saveFeed() {
  window.localStorage.setItem(FEED_KEY, JSON.stringify(feed));
}

function drawFeed() {
  const list = document.querySelector("#feed");
  const cursorText = document.querySelector("#feed-cursor");
  const position = feed.position;
  list.dataset.cursor = position?.after ?? "";
  cursorText.textContent = !position ? "position: none yet"
    : position.after ? `cursor: ${position.after}` : `from version ${position.afterVersion}`;
  if (feed.items.length === 0) {
    list.replaceChildren(element("li", "empty", "waiting for the first order…"));
    return;
  }
  list.replaceChildren(...feed.items.map((item) => {
    const li = element("li");
    li.dataset.key = item.key;
    li.dataset.version = item.version ?? "";
    li.dataset.op = item.op;
    const row = item.row || {};
    li.append(
      element("span", "time", row.ts ? clock.format(new Date(row.ts)) : ""),
      element("span", `op ${item.op}`, item.op === "ROW" ? "order" : item.op.toLowerCase()),
      element("span", "what", `${item.key} · ${row.customerId ?? ""} · ${row.productId ?? ""}`
        + (row.status ? ` · ${row.status}` : "")),
      element("span", "amount", row.amount == null ? "" : money.format(row.amount)),
    );
    return li;
  }));
}

let feedSubscription = null;

async function startFeed() {
  if (!feed.position) {
    // First visit: the last orders now, then every change after the version they are of.
    const result = await client.query(LAST_ORDERS, {}).toPromise();
    if (result.error) {
      showError("feed", result.error);
      setTimeout(startFeed, 2000);
      return;
    }
    feed.items = result.data.orders.edges.map(({ node }) => (
      { op: "ROW", key: node.orderId, version: null, row: node }));
    feed.position = { afterVersion: result.extensions.freshness.Order.version };
    saveFeed();
  }
  drawFeed();
  feedSubscription = client.subscription(ORDER_CHANGES, { ...feed.position }).subscribe((result) => {
    if (result.error) {
      const codes = (result.error.graphQLErrors || []).map((e) => e.extensions?.code);
      if (codes.includes("CURSOR_EXPIRED") || codes.includes("GENERATION_CHANGED")) {
        // The feed no longer holds what follows: start over from a fresh query.
        feedSubscription.unsubscribe();
        feed.position = null;
        startFeed();
        return;
      }
      showError("feed", result.error);
      return;
    }
    const change = result.data?.orderChanges;
    if (!change) return;
    showError("feed", null);
    feed.items = [change, ...feed.items].slice(0, FEED_ITEMS);
    feed.position = { after: change.cursor };
    saveFeed();
    drawFeed();
  });
}

startFeed();

// --- Freshness: a sparkline of sinceCommitMs per view ---------------------------------

const sparks = new Map(); // view name -> {li, chart}

function spark(name) {
  if (sparks.has(name)) return sparks.get(name);
  const li = element("li");
  li.dataset.view = name;
  const label = element("div", "label");
  label.append(element("b", "", name), element("span", "age", ""));
  const box = element("div", "spark");
  const canvas = element("canvas");
  box.append(canvas);
  li.append(label, box);
  const list = document.querySelector("#freshness");
  list.querySelector(":scope > li:not([data-view])")?.remove();
  list.append(li);
  const chart = new Chart(canvas, {
    type: "line",
    data: { labels: [], datasets: [{ data: [], borderColor: "#3867d6", borderWidth: 1.5,
                                     backgroundColor: "rgba(56,103,214,.12)", fill: true,
                                     pointRadius: 0, tension: 0.3 }] },
    options: {
      events: [],
      scales: { x: { display: false }, y: { display: false, beginAtZero: true } },
      plugins: { legend: { display: false }, tooltip: { enabled: false } },
    },
  });
  const entry = { li, chart };
  sparks.set(name, entry);
  return entry;
}

async function refreshFreshness() {
  const result = await client.query(FRESHNESS, {}).toPromise();
  showError("freshness", result.error);
  if (!result.data) return;
  for (const view of result.data.views) {
    const { li, chart } = spark(view.name);
    const ms = view.sinceCommitMs;
    const seconds = ms == null ? null : ms / 1000;
    li.className = seconds == null ? "never" : seconds < 5 ? "fresh" : seconds < 30 ? "lagging" : "stale";
    li.querySelector("b").textContent = view.version == null ? view.name : `${view.name} v${view.version}`;
    li.querySelector(".age").textContent = seconds == null ? "never committed"
      : `${seconds.toFixed(1)} s since last commit`;
    const data = chart.data.datasets[0].data;
    data.push(ms);
    chart.data.labels.push("");
    if (data.length > SPARK_POINTS) {
      data.shift();
      chart.data.labels.shift();
    }
    chart.update();
  }
}

refreshFreshness();
setInterval(refreshFreshness, 1000);

// For the end-to-end test and the browser console: the charts and the feed as data.
window.viewgateDashboard = {
  charts: { sales: salesChart, top: topChart },
  sparklines: () => Object.fromEntries([...sparks].map(([name, s]) => [name, s.chart.data.datasets[0].data])),
  feed: () => feed,
};
