"""The storage contract: keys, paths, Redis names, index entries, rows, change events."""

from __future__ import annotations

import datetime
import decimal
import re
from pathlib import Path

import orjson
import pytest

from schema.demo import CATALOG
from schema.storage import (
    APPLY_BATCH_LUA,
    CHANGE_EVENT_FORMAT,
    BatchWrites,
    ChangeEvent,
    EncodedEvents,
    ViewMeta,
    apply_batch_args,
    change_op,
    changefeed_topic,
    current_generation_path,
    deadletter_topic,
    decode_row,
    delta_table_path,
    encode_row,
    index_entry,
    index_key,
    key_from_values,
    key_of,
    keyed_bytes,
    meta_key,
    meta_table_path,
    op_del,
    op_hdel,
    op_hset,
    op_set,
    op_zadd,
    op_zrem,
    outbox_events,
    outbox_key,
    outbox_value,
    parse_key,
    read_current_generation,
    row_key,
    split_index_member,
    state_key,
    states_complete_key,
    write_current_generation,
)

UTC = datetime.UTC
T0 = datetime.datetime(2024, 1, 1, 12, 0, 0, tzinfo=UTC)


def test_single_column_key_is_its_string_form() -> None:
    assert key_of({"order_id": "O1", "x": 1}, ["order_id"]) == "O1"
    assert key_of({"n": 42}, ["n"]) == "42"
    assert key_of({"t": T0}, ["t"]) == "2024-01-01T12:00:00Z"


def test_composite_key_round_trips_and_is_unambiguous() -> None:
    sales = CATALOG.view("ProductSales")
    row = {"product_id": "P1", "window_start": T0}
    text = key_of(row, sales.key)
    assert text == '["P1","2024-01-01T12:00:00Z"]'
    assert parse_key(sales, text) == ("P1", T0)
    assert key_from_values(sales, parse_key(sales, text)) == text
    # Values containing separators and quotes still give distinct keys.
    a = key_of({"a": "x,y", "b": "z"}, ["a", "b"])
    b = key_of({"a": "x", "b": "y,z"}, ["a", "b"])
    c = key_of({"a": 'x","y', "b": "z"}, ["a", "b"])
    assert len({a, b, c}) == 3


def test_equal_instants_give_equal_keys() -> None:
    naive = datetime.datetime(2024, 1, 1, 12, 0, 0)
    plus_one = datetime.datetime(2024, 1, 1, 13, 0, 0,
                                 tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
    assert key_of({"t": naive}, ["t"]) == key_of({"t": T0}, ["t"]) == key_of(
        {"t": plus_one}, ["t"])


def test_parse_key_rejects_malformed() -> None:
    sales = CATALOG.view("ProductSales")
    with pytest.raises(ValueError):
        parse_key(sales, "P1")
    with pytest.raises(ValueError):
        parse_key(sales, '["P1"]')
    with pytest.raises(ValueError):
        parse_key(sales, '["P1","not a time"]')
    assert parse_key(CATALOG.view("Order"), "O1") == ("O1",)


def test_null_key_column_is_an_error() -> None:
    with pytest.raises(ValueError, match="null"):
        key_of({"order_id": None}, ["order_id"])


def test_delta_paths_and_current_generation(tmp_path: Path) -> None:
    root = str(tmp_path) + "/"
    assert delta_table_path(root, "Order", 3) == f"{tmp_path}/Order/g3"
    assert current_generation_path(root, "Order") == f"{tmp_path}/Order/_current"
    assert meta_table_path(root) == f"{tmp_path}/_viewgate_meta"
    assert read_current_generation(root, "Order") == 0
    write_current_generation(root, "Order", 2)
    write_current_generation(root, "Order", 5)
    assert read_current_generation(root, "Order") == 5
    assert read_current_generation(f"file://{tmp_path}", "Order") == 5
    assert [p.name for p in (tmp_path / "Order").iterdir()] == ["_current"]  # no temp left


def test_redis_names() -> None:
    assert row_key("Order", 1, "O1") == "vg:{Order}:g1:row:O1"
    assert meta_key("Order") == "vg:{Order}:meta"
    assert index_key("Order", 1, "status") == "vg:{Order}:g1:idx:status"
    assert changefeed_topic("Order") == "viewgate.changes.Order"
    assert changefeed_topic("Order", "t1.") == "t1.Order"
    assert outbox_key("Order", 1) == "vg:{Order}:g1:outbox"
    assert deadletter_topic("orders") == "viewgate.deadletter.orders"


def test_every_key_of_a_view_is_in_the_slot_of_its_meta() -> None:
    """A Redis Cluster runs a view's fenced apply only if the rows, indexes, states and
    outbox it writes hash to the slot of the meta it is called with."""
    from redis.crc import key_slot

    slot = key_slot(meta_key("Order").encode())
    keys = [row_key("Order", 3, "O1"), row_key("Order", 3, "{odd}key"), index_key("Order", 3, "s"),
            state_key("Order", 3), states_complete_key("Order", 3), outbox_key("Order", 3)]
    assert {key_slot(k.encode()) for k in keys} == {slot}
    assert key_slot(meta_key("Customer").encode()) != slot  # views spread over the slots


def test_index_entry_numbers_timestamps_strings() -> None:
    assert index_entry(float, 12.5, "O1") == (12.5, "O1")
    assert index_entry(int, 7, "C1") == (7.0, "C1")
    assert index_entry("bigint", 7, "C1") == (7.0, "C1")
    assert index_entry(datetime.datetime, T0, "O1") == (1704110400000.0, "O1")
    assert index_entry("timestamp", "2024-01-01T12:00:00.250Z", "O1") == (1704110400250.0, "O1")
    assert index_entry(datetime.date, datetime.date(1970, 1, 2), "d") == (86_400_000.0, "d")
    score, member = index_entry(str, "paid", "O1")  # type: ignore[misc]
    assert (score, member) == (0.0, "paid\x00O1")
    assert split_index_member(member) == ("paid", "O1")
    assert index_entry(str, None, "O1") is None
    assert index_entry(float, float("nan"), "O1") is None
    with pytest.raises(ValueError):
        index_entry(str, "a\x00b", "O1")
    with pytest.raises(ValueError):
        index_entry(list, [1], "O1")


def test_string_index_members_sort_by_value_then_key() -> None:
    members = [index_entry(str, v, k)[1] for v, k in  # type: ignore[index]
               [("paid", "O2"), ("placed", "O1"), ("paid", "O1"), ("pai", "O9")]]
    assert sorted(members) == ["pai\x00O9", "paid\x00O1", "paid\x00O2", "placed\x00O1"]


def test_encode_decode_row() -> None:
    row = {"order_id": "O1", "amount": decimal.Decimal("12.50"), "ts": T0,
           "day": datetime.date(2024, 1, 1), "customer_tier": None}
    data = encode_row(row)
    assert orjson.loads(data) == {"order_id": "O1", "amount": 12.5,
                                  "ts": "2024-01-01T12:00:00Z", "day": "2024-01-01",
                                  "customer_tier": None}
    typed = decode_row(encode_row({"order_id": "O1", "ts": T0, "amount": 3.0}),
                       CATALOG.view("Order"))
    assert typed == {"order_id": "O1", "ts": T0, "amount": 3.0}


def test_change_event_round_trip() -> None:
    event = ChangeEvent("Order", "O1", "update", {"order_id": "O1", "ts": T0},
                        {"order_id": "O1", "ts": "2024-01-01T11:00:00Z"}, 7, 1, 1234)
    data = event.to_bytes()
    assert orjson.loads(data)["format"] == CHANGE_EVENT_FORMAT == 2
    back = ChangeEvent.from_bytes(data)
    assert back == ChangeEvent("Order", "O1", "update",
                               {"order_id": "O1", "ts": "2024-01-01T12:00:00Z"},
                               {"order_id": "O1", "ts": "2024-01-01T11:00:00Z"}, 7, 1, 1234)
    delete = ChangeEvent("Order", "O1", "delete", None, {"order_id": "O1"}, 8, 1, 1235)
    assert ChangeEvent.from_bytes(delete.to_bytes()) == delete
    with pytest.raises(ValueError, match="format"):
        ChangeEvent.from_bytes(orjson.dumps({**orjson.loads(data), "format": 1}))
    with pytest.raises(ValueError, match="op"):
        ChangeEvent.from_bytes(orjson.dumps({**orjson.loads(data), "op": "upsert"}))



def test_an_events_previous_row_as_redis_stored_it_gives_the_same_bytes() -> None:
    """The engine hands an event the previous row's text from Redis; its bytes are those of
    the event that encodes the decoded row, and the two events are equal."""
    stored = encode_row({"order_id": "O1", "amount": 2.5, "ts": T0, "status": None})
    row = {"order_id": "O1", "amount": 3.0, "ts": T0, "status": "shipped"}
    plain = ChangeEvent("Order", "O1", "update", row, decode_row(stored), 7, 1, 1234)
    texted = ChangeEvent("Order", "O1", "update", row, decode_row(stored), 7, 1, 1234, stored)
    assert texted.to_bytes() == plain.to_bytes()
    assert texted == plain
    # The text is what goes out, as it is (so it must be the row's: the engine's contract)
    other = ChangeEvent("Order", "O1", "update", row, decode_row(stored), 7, 1, 1234,
                        b'{"order_id":"O0"}')
    assert orjson.loads(other.to_bytes())["before"] == {"order_id": "O0"}

def test_change_op_follows_from_before_and_after() -> None:
    assert change_op(None, {"a": 1}) == "insert"
    assert change_op({"a": 0}, {"a": 1}) == "update"
    assert change_op({"a": 0}, None) == "delete"
    assert change_op(None, None) == "delete"


def test_outbox_holds_one_batch() -> None:
    events = [ChangeEvent("Order", "O1", "insert", {"order_id": "O1"}, None, 4, 0, 1)]
    stored = outbox_value(4, events)
    assert outbox_events(stored, 4) == events
    assert outbox_events(stored, 3) is None
    assert outbox_events(None, 4) is None
    assert outbox_events(outbox_value(5, []), 5) == []


def test_encoded_events_are_forwarded_as_their_bytes_and_decoded_when_read() -> None:
    events = [ChangeEvent("Order", "O1", "insert", {"order_id": "O1"}, None, 4, 0, 1),
              ChangeEvent("Order", "O2", "delete", None, {"order_id": "O2"}, 4, 0, 1)]
    # As the tasks return them: the bytes, and the keys apart.
    encoded = EncodedEvents([e.to_bytes() for e in events], ["O1", "O2"])
    assert list(keyed_bytes(encoded)) == list(keyed_bytes(events)) == [
        ("O1", events[0].to_bytes()), ("O2", events[1].to_bytes())]
    assert outbox_value(4, encoded) == outbox_value(4, events)
    assert encoded._decoded is None and len(encoded) == 2  # nothing decoded so far
    assert list(encoded) == events and encoded[1].before == {"order_id": "O2"}


def test_view_meta_round_trip_through_redis_strings() -> None:
    meta = ViewMeta(generation=2, version=41, offsets={"orders": {"0": 17}},
                    watermark="2024-01-01T12:00:00Z", committed_at_ms=99, late_events=3)
    fields = meta.to_fields()
    assert all(isinstance(v, str) for v in fields.values())
    as_redis = {k.encode(): v.encode() for k, v in fields.items()}
    assert ViewMeta.from_fields(as_redis) == meta
    assert ViewMeta.from_fields({}) == ViewMeta()


def test_apply_batch_args_shape() -> None:
    ops = [op_set("vg:Order:g1:row:O1", b'{"a":1}'), op_zadd("vg:Order:g1:idx:amount", 1.5, "O1")]
    argv = apply_batch_args(7, 1, {"committed_at_ms": 5, "offsets": {"orders": {"0": 3}}}, ops)
    assert argv[:2] == ["7", "1"]
    assert orjson.loads(argv[2]) == {"committed_at_ms": "5", "offsets": '{"orders":{"0":3}}'}
    assert orjson.loads(argv[3]) == [["set", "", ["vg:Order:g1:row:O1", '{"a":1}']],
                                     ["zadd", "vg:Order:g1:idx:amount", [1.5, "O1"]]]


def test_batch_writes_group_by_command_and_key_removals_first() -> None:
    ops = [op_set("r:1", "a"), op_zrem("i:amount", "1"), op_zadd("i:amount", 2.0, "1"),
           op_set("r:2", "b"), op_zadd("i:amount", 3.0, "2"), op_zadd("i:status", 0, "x\x001"),
           op_del("r:3"), op_zrem("i:amount", "3"), op_del("state"), op_hset("state", "1", "s"),
           op_hdel("state", "2")]
    assert BatchWrites(ops).commands() == [
        ["del", "", ["r:3", "state"]],
        ["zrem", "i:amount", ["1", "3"]],
        ["hdel", "state", ["2"]],
        ["set", "", ["r:1", "a", "r:2", "b"]],
        ["zadd", "i:amount", [2.0, "1", 3.0, "2"]],
        ["zadd", "i:status", [0, "x\x001"]],
        ["hset", "state", ["1", "s"]],
    ]
    with pytest.raises(ValueError, match="unknown Redis write"):
        BatchWrites([{"op": "expire", "k": "r:1"}])


def test_lua_script_is_balanced() -> None:
    # Not a Lua parser (the integration suite runs it on Redis): a cheap guard for typos.
    code = re.sub(r"--[^\n]*", "", APPLY_BATCH_LUA)
    opens = len(re.findall(r"\b(?:if|for|function)\b", code))
    assert opens == len(re.findall(r"\bend\b", code))
    assert "cjson.decode(ARGV[4])" in code and "return 0" in code and "return 1" in code
    assert "unpack(args, first, last)" in code
