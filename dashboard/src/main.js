// The live dashboard: top customers by total spent and product sales per minute, kept
// live by GraphQL subscriptions (urql over graphql-ws), with each view's freshness.
import { Client, fetchExchange, subscriptionExchange } from "@urql/core";
import { createClient as createWSClient } from "graphql-ws";

const TOP_CUSTOMERS = `subscription TopCustomers {
  customerStatsList(orderBy: {field: TOTAL_SPENT, direction: DESC}, first: 10) {
    edges { node { customerId orderCount totalSpent lastOrderAt } }
  }
}`;

const SALES_PER_MINUTE = `subscription SalesPerMinute {
  productSalesList(orderBy: {field: WINDOW_START, direction: DESC}, first: 15) {
    edges { node { productId windowStart orderCount revenue } }
  }
}`;

const FRESHNESS = `query Freshness { views { name version sinceCommitMs } }`;

const wsUrl = new URL("/graphql", window.location.href);
wsUrl.protocol = wsUrl.protocol === "https:" ? "wss:" : "ws:";
const ws = createWSClient({ url: wsUrl.href, retryAttempts: Infinity });

const client = new Client({
  url: "/graphql",
  exchanges: [
    fetchExchange,
    subscriptionExchange({
      forwardSubscription(request) {
        const input = { ...request, query: request.query || "" };
        return {
          subscribe(sink) {
            return { unsubscribe: ws.subscribe(input, sink) };
          },
        };
      },
    }),
  ],
  requestPolicy: "network-only",
});

const money = new Intl.NumberFormat("en", { style: "currency", currency: "USD" });
const lastUpdate = {}; // table id -> Date.now() of its last live message

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(
    ...rows.map((cells) => {
      const tr = document.createElement("tr");
      tr.append(...cells);
      return tr;
    }),
  );
  lastUpdate[tableId] = Date.now();
  document.querySelector(`#${tableId}`).dataset.updates =
    String(Number(document.querySelector(`#${tableId}`).dataset.updates || 0) + 1);
}

function showError(error) {
  const box = document.querySelector("#error");
  box.textContent = error ? String(error.message || error) : "";
  box.hidden = !error;
}

client.subscription(TOP_CUSTOMERS, {}).subscribe((result) => {
  showError(result.error);
  const edges = result.data?.customerStatsList?.edges ?? [];
  fill("top-customers", edges.map(({ node }, i) => [
    cell(String(i + 1)),
    cell(node.customerId, "key"),
    cell(String(node.orderCount), "num"),
    cell(money.format(node.totalSpent), "num total"),
    cell(new Date(node.lastOrderAt).toLocaleTimeString()),
  ]));
});

client.subscription(SALES_PER_MINUTE, {}).subscribe((result) => {
  showError(result.error);
  const edges = result.data?.productSalesList?.edges ?? [];
  fill("sales-per-minute", edges.map(({ node }) => [
    cell(new Date(node.windowStart).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })),
    cell(node.productId, "key"),
    cell(String(node.orderCount), "num"),
    cell(money.format(node.revenue), "num revenue"),
  ]));
});

async function refreshFreshness() {
  const result = await client.query(FRESHNESS, {}).toPromise();
  const list = document.querySelector("#freshness");
  if (result.error) {
    list.textContent = `freshness unavailable: ${result.error.message}`;
    return;
  }
  list.replaceChildren(
    ...result.data.views.map((view) => {
      const li = document.createElement("li");
      const seconds = view.sinceCommitMs == null ? null : view.sinceCommitMs / 1000;
      li.className = seconds == null ? "never" : seconds < 5 ? "fresh" : seconds < 30 ? "lagging" : "stale";
      li.textContent = seconds == null
        ? `${view.name}: never committed`
        : `${view.name} v${view.version} · ${seconds.toFixed(1)} s since last commit`;
      return li;
    }),
  );
}

refreshFreshness();
setInterval(refreshFreshness, 1000);
