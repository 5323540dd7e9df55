"""Who may ask what, and how much: bearer tokens, principals and roles, one schema per
role, row rules, limits on documents (size, depth, aliases, cost, fragment expansion,
operation choice), per-client rate limits and counts, persisted queries, and who a
request comes from.

May import: `reads` (conditions and query errors), `ops` and `schema`.
"""
