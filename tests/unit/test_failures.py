"""The one line the engine reports for a failed query."""

from __future__ import annotations

from engine.failures import summarize

SPARK = """[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in \
foreach batch sink. Reason: An exception was raised by the Python Proxy. Return Message: \
Traceback (most recent call last):
  File "/work/engine/commit.py", line 65, in commit
    status = self.redis.apply(batch_id, self.generation, upserts, deletes, meta=meta)
redis.exceptions.ConnectionError: Error 111 connecting to 127.0.0.1:40123. Connection refused.
 SQLSTATE: 39000
=== Streaming Query ===
Identifier: view:CustomerStats:g0 [id = 1, runId = 2]
org.apache.spark.SparkException: not this one
"""


def test_the_python_exception_inside_sparks_message_is_the_summary():
    assert summarize(SPARK) == ("redis.exceptions.ConnectionError: Error 111 connecting to "
                                "127.0.0.1:40123. Connection refused.")


def test_other_messages_give_their_first_line_or_their_exception_line():
    assert summarize("org.apache.spark.SparkException: the sink failed\n\tat x.y(Z.java:1)") \
        == "org.apache.spark.SparkException: the sink failed"
    assert summarize("something odd happened\nmore") == "something odd happened"
    assert summarize("") == "unknown error"
    assert len(summarize("ValueError: " + "x" * 5000)) == 500
