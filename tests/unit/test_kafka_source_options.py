"""The options every Kafka read of the engine hands Spark's Kafka source (engine.sources)."""

from __future__ import annotations

from typing import Any

from engine.sources import FETCH_MAX_WAIT_MS, KAFKA_CALL_TIMEOUT_MS, read_kafka
from schema.settings import Settings


class RecordingReader:
    """Spark's DataStreamReader as far as read_kafka uses it: records what it is told."""

    def __init__(self) -> None:
        self.source: str | None = None
        self.options: dict[str, str] = {}

    def format(self, source: str) -> RecordingReader:
        self.source = source
        return self

    def option(self, key: str, value: str) -> RecordingReader:
        assert isinstance(value, str), (key, value)  # what the JVM side takes
        self.options[key] = value
        return self

    def load(self) -> dict[str, Any]:
        return {"source": self.source, **self.options}


class RecordingSpark:
    def __init__(self) -> None:
        self.readStream = RecordingReader()


def test_kafka_calls_wait_at_most_the_call_timeout_not_the_clients_60_s():
    options = read_kafka(RecordingSpark(), Settings(kafka_bootstrap="b1:9092,b2:9092"),
                         "orders")
    assert options["source"] == "kafka"
    assert options["kafka.bootstrap.servers"] == "b1:9092,b2:9092"
    assert options["subscribe"] == "orders"
    assert options["kafka.fetch.max.wait.ms"] == str(FETCH_MAX_WAIT_MS)
    # Kafka's admin client refuses (ConfigException) an api timeout below the request
    # timeout; both bound a call routed to a leader that died.
    api = int(options["kafka.default.api.timeout.ms"])
    request = int(options["kafka.request.timeout.ms"])
    assert api == request == KAFKA_CALL_TIMEOUT_MS
    assert KAFKA_CALL_TIMEOUT_MS < 60_000  # below the client's own default


def test_each_batch_reads_at_most_the_settings_records_unless_told_otherwise():
    settings = Settings(max_offsets_per_trigger=1234)
    assert read_kafka(RecordingSpark(), settings, "t")["maxOffsetsPerTrigger"] == "1234"
    assert read_kafka(RecordingSpark(), settings, "t", 50)["maxOffsetsPerTrigger"] == "50"
    unlimited = read_kafka(RecordingSpark(), Settings(max_offsets_per_trigger=0), "t")
    assert "maxOffsetsPerTrigger" not in unlimited
