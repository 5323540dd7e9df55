"""Which rows a view cannot store: a key column is null (engine.sinks.rejects)."""

from __future__ import annotations

from engine.sinks.rejects import split_keyless


def test_rows_missing_a_key_column_are_split_off_in_order():
    rows = [{"id": "a", "g": 1}, {"id": None, "g": 2}, {"g": 3}, {"id": "b", "g": None}]
    keyed, keyless = split_keyless(rows, ("id",))
    assert keyed == [rows[0], rows[3]]  # a null in another column is no matter
    assert keyless == [rows[1], rows[2]]  # absent counts as null
    keyed, keyless = split_keyless(rows, ("id", "g"))
    assert (keyed, keyless) == ([rows[0]], rows[1:])


def test_rows_all_keyed_come_back_whole():
    rows = [{"id": str(i)} for i in range(3)]
    assert split_keyless(rows, ("id",)) == (rows, [])
    assert split_keyless([], ("id",)) == ([], [])
