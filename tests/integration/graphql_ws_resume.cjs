// A browser tab's change feed on the reference graphql-ws client (npm `graphql-ws`, as the
// dashboard bundles it), over Node's WebSocket (browser-compatible, undici):
// subscribes to `customerChanges`, keeps the cursor of the last change it showed, and when
// its connection drops, graphql-ws reconnects and subscribes again with the same payload
// object, whose `after` is by then that last cursor: the feed resumes right after it.
// Usage: node --experimental-websocket graphql_ws_resume.cjs <ws url> <first cursor>
// Prints one JSON line per event: {"connected": n}, {"closed": code}, per change
// {"change": {op, key, version, cursor}}, and {"failed": why} before exiting 1 (an error,
// or 120 s). Runs until terminated.
const { createClient } = require("graphql-ws");

const [url, first] = process.argv.slice(2);
const say = (value) => process.stdout.write(JSON.stringify(value) + "\n");

let connected = 0;
const payload = {
  query: `subscription Feed($after: String) {
    customerChanges(after: $after) { op key version cursor }
  }`,
  variables: { after: first },
};

const client = createClient({
  url,
  lazy: false,
  retryAttempts: 1000,
  retryWait: async () => new Promise((resolve) => setTimeout(resolve, 100)),
  shouldRetry: () => true,
  on: {
    connected: () => say({ connected: ++connected }),
    closed: (event) => say({ closed: event && event.code }),
  },
});

setTimeout(() => { say({ failed: "timeout" }); process.exit(1); }, 120_000);

client.subscribe(payload, {
  next: (message) => {
    if (message.errors) {
      say({ failed: message.errors });
      process.exit(1);
    }
    const change = message.data.customerChanges;
    payload.variables.after = change.cursor; // what a reconnect resumes from
    say({ change });
  },
  error: (error) => {
    say({ failed: String(error && (error.message || error.reason || error)) });
    process.exit(1);
  },
  complete: () => { say({ failed: "completed" }); process.exit(1); },
});
