"""Reading views: rows by key from Redis with Delta as the fallback (and the fenced
re-warm), Delta reads and time travel, Redis index ranges, `where`/order/page filters,
pages of lists, to-many relationships, and how fresh each answer is.

May import: `ops` (metrics) and `schema`.
"""
