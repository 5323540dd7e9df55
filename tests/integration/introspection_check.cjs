// Rebuilds the gateway's schema from its introspection result with graphql-js, as
// JavaScript clients and codegen tools do, and reports what the Python test compares.
// stdin: {"introspection": {...}, "sdl": "...", "queries": {"name": "query text"}}
// stdout: {"rebuilt": printed SDL, "served": printed SDL, "errors": {"name": [messages]}}
const {
  buildClientSchema, buildSchema, lexicographicSortSchema, parse, printSchema, validate,
} = require("graphql");

let input = "";
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const { introspection, sdl, queries } = JSON.parse(input);
  const rebuilt = buildClientSchema(introspection);
  const errors = {};
  for (const [name, text] of Object.entries(queries)) {
    errors[name] = validate(rebuilt, parse(text)).map((e) => e.message);
  }
  process.stdout.write(JSON.stringify({
    rebuilt: printSchema(lexicographicSortSchema(rebuilt)),
    served: printSchema(lexicographicSortSchema(buildSchema(sdl))),
    errors,
  }));
});
