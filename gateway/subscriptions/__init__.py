"""Live answers: the process's reader of the change feed and its history, fan-out to
subscribers, the subscriber index, the Subscription root (live values, change streams
with resumable cursors, live lists), shared executions and compiled payloads, and both
websocket protocols with their admission and message budget.

May import: `types`, `access`, `reads`, `ops` and `schema`. Not `http` or `compiled`.
"""
