"""Conditions on one indexed field as Redis sorted-set ranges (see schema.storage's index
layout): ZRANGEBYLEX bounds over `value\\0key` members for strings, score bounds for the
rest. Pure logic: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.reads.filters import Condition, is_string, sortable
from schema.catalog import FieldInfo
from schema.storage import INDEX_SEPARATOR

_SEP = INDEX_SEPARATOR.encode()
_AFTER_SEP = b"\x01"  # the byte after the separator: ends a value's members
_TOP = b"\xff"  # above every UTF-8 byte: ends a prefix's members


@dataclass(frozen=True)
class Bound:
    value: Any  # bytes (lex) or float (score)
    inclusive: bool


@dataclass(frozen=True)
class Range:
    low: Bound | None = None
    high: Bound | None = None

    def tighten(self, low: Bound | None = None, high: Bound | None = None) -> Range:
        return Range(_tighter(self.low, low, True), _tighter(self.high, high, False))

    def empty(self) -> bool:
        if self.low is None or self.high is None:
            return False
        if self.low.value != self.high.value:
            return self.low.value > self.high.value
        return not (self.low.inclusive and self.high.inclusive)

    def lex(self) -> tuple[bytes, bytes]:
        """(min, max) arguments of ZRANGEBYLEX / ZLEXCOUNT."""
        low = b"-" if self.low is None else (b"[" if self.low.inclusive else b"(") + self.low.value
        high = (b"+" if self.high is None
                else (b"[" if self.high.inclusive else b"(") + self.high.value)
        return low, high

    def score(self) -> tuple[str, str]:
        """(min, max) arguments of ZRANGEBYSCORE / ZCOUNT."""
        def text(bound: Bound | None, infinite: str) -> str:
            if bound is None:
                return infinite
            return ("" if bound.inclusive else "(") + repr(float(bound.value))
        return text(self.low, "-inf"), text(self.high, "+inf")


def _tighter(a: Bound | None, b: Bound | None, is_low: bool) -> Bound | None:
    if a is None or b is None:
        return a or b
    if a.value == b.value:
        return a if not a.inclusive else b  # exclusive is the tighter one
    return (a if a.value > b.value else b) if is_low else (a if a.value < b.value else b)


def member_prefix(value: str) -> bytes:
    return value.encode() + _SEP


def _lex_range(op: str, value: str) -> Range:
    v = value.encode()
    return {
        "eq": Range(Bound(v + _SEP, True), Bound(v + _AFTER_SEP, False)),
        "lt": Range(None, Bound(v + _SEP, False)),
        "lte": Range(None, Bound(v + _AFTER_SEP, False)),
        "gt": Range(Bound(v + _AFTER_SEP, True), None),
        "gte": Range(Bound(v + _SEP, True), None),
        "prefix": Range(Bound(v, True), Bound(v + _TOP, False)),
    }[op]


def _score_range(op: str, score: float) -> Range:
    return {
        "eq": Range(Bound(score, True), Bound(score, True)),
        "lt": Range(None, Bound(score, False)),
        "lte": Range(None, Bound(score, True)),
        "gt": Range(Bound(score, False), None),
        "gte": Range(Bound(score, True), None),
    }[op]


def ranges(info: FieldInfo, conditions: Sequence[Condition]) -> list[Range]:
    """The index ranges holding exactly the rows that meet every condition on this field
    (one range, or one per value of an `in`); empty ranges are left out."""
    text = is_string(info)

    def one(op: str, value: Any) -> Range:
        value = sortable(info, value)
        return _lex_range(op, value) if text else _score_range(op, value)

    combined = Range()
    alternatives: list[Range] | None = None
    for c in conditions:
        if c.op == "in":
            options = [one("eq", v) for v in c.value]
            alternatives = options if alternatives is None else [
                a for a in alternatives if any(a == o for o in options)]
        else:
            r = one(c.op, c.value)
            combined = combined.tighten(r.low, r.high)
    chosen = [combined] if alternatives is None else [
        a.tighten(combined.low, combined.high) for a in sorted(alternatives, key=_start)]
    return [r for r in chosen if not r.empty()]


def _start(r: Range) -> Any:
    return r.low.value if r.low is not None else b""


def after_cursor(r: Range, info: FieldInfo, cursor: tuple[Any, str], reverse: bool) -> Range:
    """The range narrowed to what lies past `cursor` in the reading direction. For scores
    the cursor's own score stays in (ties are skipped by key, see PAGE_BY_SCORE_LUA)."""
    value, key = cursor
    if is_string(info):
        bound = Bound(member_prefix(value) + key.encode(), False)
    else:
        bound = Bound(float(value), True)
    return r.tighten(high=bound) if reverse else r.tighten(low=bound)


# A page of a score index after a (score, member) cursor: entries with the cursor's score
# are kept only past the cursor's member, compared byte by byte as Redis orders them
# (Lua's own string comparison follows the server's locale).
PAGE_BY_SCORE_LUA = r"""
-- KEYS[1] index; ARGV: min, max, reverse ('1'), cursor score ('' = none), cursor member, limit
local key, lo, hi, rev = KEYS[1], ARGV[1], ARGV[2], ARGV[3] == '1'
local cscore = nil
if ARGV[4] ~= '' then cscore = tonumber(ARGV[4]) end
local cmember, limit = ARGV[5], tonumber(ARGV[6])
local function greater(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end
local out, offset, chunk = {}, 0, limit + 32
while #out < 2 * limit do
  local r
  if rev then
    r = redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'WITHSCORES', 'LIMIT', offset, chunk)
  else
    r = redis.call('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES', 'LIMIT', offset, chunk)
  end
  for i = 1, #r, 2 do
    local keep = true
    if cscore ~= nil and tonumber(r[i + 1]) == cscore then
      if rev then keep = greater(cmember, r[i]) else keep = greater(r[i], cmember) end
    end
    if keep then
      out[#out + 1] = r[i]
      out[#out + 1] = r[i + 1]
      if #out >= 2 * limit then break end
    end
  end
  if #r < 2 * chunk then break end
  offset = offset + chunk
end
return out
"""
