"""A view's changes: its new rows compared with its stored rows, or with the text Redis
returned for them (engine.incremental.changed_rows)."""

from __future__ import annotations

import datetime

from engine.incremental import StoredRows, changed_rows
from schema.storage import decode_row, encode_row

T0 = datetime.datetime(2026, 11, 30, 8, 0, tzinfo=datetime.UTC)


def _stored(row: dict) -> tuple[dict, bytes]:
    text = encode_row(row)
    return decode_row(text), text  # as Redis hands a row back: JSON form, and its text


def test_rows_compared_with_redis_text_change_as_with_the_stored_rows() -> None:
    same, same_text = _stored({"order_id": "O1", "amount": 2.5, "ts": T0})
    moved, moved_text = _stored({"order_id": "O2", "amount": 1.0, "ts": T0})
    gone, gone_text = _stored({"order_id": "O3", "amount": 7.0, "ts": T0})
    keys = {("O1",), ("O2",), ("O3",), ("O4",)}
    new = {("O1",): {"order_id": "O1", "amount": 2.5, "ts": T0},  # typed, unchanged
           ("O2",): {"order_id": "O2", "amount": 1.5, "ts": T0},
           ("O4",): {"order_id": "O4", "amount": 3.0, "ts": T0}}
    rows = {("O1",): same, ("O2",): moved, ("O3",): gone}
    texts = {("O1",): same_text, ("O2",): moved_text, ("O3",): gone_text}
    expected = {("O2",): (moved, new[("O2",)]), ("O3",): (gone, None),
                ("O4",): (None, new[("O4",)])}
    assert changed_rows(keys, StoredRows(rows, texts), new) == expected
    assert changed_rows(keys, rows, new) == expected  # plain rows: each encoded
    # A stored row with no text (Delta filled it in) is encoded.
    assert changed_rows(keys, StoredRows(rows, {("O2",): moved_text}), new) == expected


def test_the_text_is_what_is_compared() -> None:
    row, _ = _stored({"order_id": "O1", "amount": 2.5})
    new = {("O1",): {"order_id": "O1", "amount": 2.5}}
    assert changed_rows({("O1",)}, StoredRows({("O1",): row}, {}), new) == {}
    other = StoredRows({("O1",): row}, {("O1",): encode_row({"order_id": "O1", "amount": 9})})
    assert changed_rows({("O1",)}, other, new) == {("O1",): (row, new[("O1",)])}
