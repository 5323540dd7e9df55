"""The storage contract: how the engine writes a view and the gateway reads it.

Key encoding, Delta paths, Redis key layout and values, index entries, the change-event
format and the fenced Redis apply script all live here, once, so both sides agree.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from strawberry import ID

from schema.catalog import View, graphql_fields
from schema.object_store import read_text, replace_text

# --- JSON values ------------------------------------------------------------------------

_UTC = datetime.UTC


def iso_utc(value: datetime.datetime) -> str:
    """ISO-8601 in UTC with a 'Z'. Naive datetimes are taken as UTC (Spark runs in UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(_UTC).replace(tzinfo=None)
    return value.isoformat() + "Z"


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return iso_utc(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


# orjson writes datetimes itself (in Rust, several times faster than a default hook):
# naive ones as UTC, UTC ones with a 'Z', the same text as iso_utc for the UTC times
# Spark and our decoders produce. Decimals go through _json_default.
_DUMPS_OPTIONS = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=_json_default, option=_DUMPS_OPTIONS)


def from_json_value(python_type: Any, value: Any) -> Any:
    """A JSON value (as encode_row wrote it) back to the field's Python type."""
    if value is None:
        return None
    if python_type is datetime.datetime:
        parsed = datetime.datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=_UTC)
    if python_type is datetime.date:
        return datetime.date.fromisoformat(value)
    if python_type is decimal.Decimal:
        return decimal.Decimal(str(value))
    if python_type is float:
        return float(value)
    if python_type is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"not an integer: {value!r}")
        return int(value)
    if python_type is bool:
        if isinstance(value, str):
            if value not in ("true", "false"):
                raise ValueError(f"not a boolean: {value!r}")
            return value == "true"
        return bool(value)
    return str(value)


def encode_row(row: Mapping[str, Any]) -> bytes:
    """A row as compact JSON: datetimes ISO-8601 UTC 'Z', dates ISO, Decimals as floats."""
    return _dumps(row if type(row) is dict else dict(row))  # orjson takes dicts only


def decode_row(data: bytes | str, view: View | None = None) -> dict[str, Any]:
    """The JSON row back; with a view, values are converted to the fields' Python types."""
    row = orjson.loads(data)
    if view is None:
        return row
    fields = graphql_fields(view)
    return {k: from_json_value(fields[k].python_type, v) if k in fields else v
            for k, v in row.items()}


# --- Keys -------------------------------------------------------------------------------


def _key_part(value: Any) -> Any:
    if value is None:
        raise ValueError("a key column is null")
    return _json_default(value) if isinstance(
        value, datetime.date | decimal.Decimal) else value


def key_of(row: Mapping[str, Any], key_cols: Sequence[str]) -> str:
    """A stable, unambiguous text key.

    One column: its string form ("42", "2024-01-01T00:00:00Z"). Several: a compact JSON
    array, so a value containing a separator can never be mistaken for two values.
    """
    if len(key_cols) == 1:
        value = row[key_cols[0]]
        if type(value) is str:  # most keys: the text itself (called for every row a batch writes)
            return value
    parts = [_key_part(row[c]) for c in key_cols]
    if len(parts) == 1:
        part = parts[0]
        return part if isinstance(part, str) else orjson.dumps(part).decode()
    return orjson.dumps(parts).decode()


def parse_key(view: View, text: str) -> tuple[Any, ...]:
    """The key columns' values (typed) from key_of's text. Raises ValueError if malformed."""
    fields = graphql_fields(view)
    types = [fields[c].python_type for c in view.key]
    try:
        if len(types) > 1:
            raw = orjson.loads(text)
            if not isinstance(raw, list) or len(raw) != len(types):
                raise ValueError(f"needs a JSON array of {len(types)} values "
                                 f"[{', '.join(view.key)}]")
        elif types[0] in (int, float, bool):
            raw = [orjson.loads(text)]  # single non-string keys are their JSON text
        else:
            raw = [text]
        return tuple(from_json_value(t, v) for t, v in zip(types, raw, strict=True))
    except (TypeError, ValueError, decimal.InvalidOperation) as exc:
        raise ValueError(f"key {text!r} does not fit view {view.name}: {exc}") from exc


def key_from_values(view: View, values: Sequence[Any]) -> str:
    """key_of for key values given in key order (e.g. from parse_key or GraphQL args)."""
    return key_of(dict(zip(view.key, values, strict=True)), view.key)


# --- Delta layout -----------------------------------------------------------------------


def delta_table_path(delta_root: str, view: str, generation: int) -> str:
    return f"{delta_root.rstrip('/')}/{view}/g{generation}"


def current_generation_path(delta_root: str, view: str) -> str:
    return f"{delta_root.rstrip('/')}/{view}/_current"


def delta_app_id(view: str, generation: int) -> str:
    """The Delta transaction app id of a view's MERGEs; its txn version is the batch id."""
    return f"viewgate:{view}:g{generation}"


def commit_batch_id(commit: Mapping[str, Any]) -> int | None:
    """The batch id an engine commit records in its userMetadata (None: not an engine
    commit, e.g. the table's creation)."""
    try:
        meta = orjson.loads(commit.get("userMetadata") or "null")
    except orjson.JSONDecodeError:
        return None
    return int(meta["batch_id"]) if isinstance(meta, dict) and "batch_id" in meta else None


def meta_table_path(delta_root: str) -> str:
    return f"{delta_root.rstrip('/')}/_viewgate_meta"


def read_current_generation(delta_root: str, view: str) -> int:
    """The generation the view serves (0 if never written)."""
    text = read_text(current_generation_path(delta_root, view))
    return 0 if text is None else int(text.strip())


def write_current_generation(delta_root: str, view: str, generation: int) -> None:
    """Replaced whole (schema.object_store.replace_text): a reader sees the old or the new
    number, never half, on a local disk and on object storage alike."""
    replace_text(current_generation_path(delta_root, view), f"{int(generation)}\n")


# --- Redis layout -----------------------------------------------------------------------

REDIS_PREFIX = "vg:"


def view_tag(view: str) -> str:
    """The hash tag of every key of one view (its meta and every generation's rows, indexes,
    states and outbox): a Redis Cluster keeps them in one slot, so the view's fenced apply
    (APPLY_BATCH_LUA, which writes rows beside the meta) runs on one master, and different
    views spread over the masters (schema.redis_client)."""
    return "{" + view + "}"


def row_key(view: str, generation: int, key: str) -> str:
    return f"{REDIS_PREFIX}{view_tag(view)}:g{generation}:row:{key}"


def meta_key(view: str) -> str:
    return f"{REDIS_PREFIX}{view_tag(view)}:meta"


def index_key(view: str, generation: int, field_name: str) -> str:
    return f"{REDIS_PREFIX}{view_tag(view)}:g{generation}:idx:{field_name}"


def state_key(view: str, generation: int) -> str:
    """A hash of the generation's aggregate states by row key (engine.aggregates), written
    with the rows it describes."""
    return f"{REDIS_PREFIX}{view_tag(view)}:g{generation}:state"


def states_complete_key(view: str, generation: int) -> str:
    """Set by a generation's first batch: every group has a state (a group without one has
    no rows). Dropped with the states when Redis lost batches."""
    return f"{REDIS_PREFIX}{view_tag(view)}:g{generation}:state_complete"


def outbox_key(view: str, generation: int) -> str:
    """The change events of the generation's last applied batch (see APPLY_BATCH_LUA)."""
    return f"{REDIS_PREFIX}{view_tag(view)}:g{generation}:outbox"


def generation_pattern(view: str, generation: int) -> str:
    """SCAN pattern for every key of one generation (to drop an old one); Redis's glob
    takes the braces of the tag as plain characters."""
    return f"{REDIS_PREFIX}{view_tag(view)}:g{generation}:*"


def graph_key(generation: int) -> str:
    """The view graph's version (engine.graph), per generation of the graph's views: a
    hash whose `version` field is the last batch every graph view holds in Redis and
    whose `applying` field, while present, names the batch being applied. The graph
    applies all its views of a batch between the two; a reader of several graph views
    that finds the same `version` and no `applying` before and after its reads has read
    one version of all of them (gateway.reads.consistency)."""
    return f"{REDIS_PREFIX}graph:g{generation}"


GRAPH_VERSION, GRAPH_APPLYING = "version", "applying"


INDEX_SEPARATOR = "\x00"


def epoch_ms(value: datetime.datetime | datetime.date) -> int:
    if not isinstance(value, datetime.datetime):
        value = datetime.datetime(value.year, value.month, value.day)
    if value.tzinfo is None:
        value = value.replace(tzinfo=_UTC)
    return round(value.timestamp() * 1000)


_NUMBER_TYPES: tuple[Any, ...] = (int, float, bool, decimal.Decimal)
_TIME_TYPES: tuple[Any, ...] = (datetime.datetime, datetime.date)
# Spark simpleString type -> the Python type that indexes the same way.
_SPARK_INDEX_TYPES: dict[str, Any] = {
    "string": str, "bigint": int, "int": int, "smallint": int, "tinyint": int,
    "double": float, "float": float, "boolean": bool, "decimal": decimal.Decimal,
    "timestamp": datetime.datetime, "date": datetime.date,
}


@functools.cache  # asked for every indexed value of every row a batch writes
def _python_type(field_type: Any) -> Any:
    if isinstance(field_type, str):
        base = field_type.strip().lower().split("(", 1)[0]
        if base not in _SPARK_INDEX_TYPES:
            raise ValueError(f"fields of Spark type {field_type} cannot be indexed")
        return _SPARK_INDEX_TYPES[base]
    if field_type in _NUMBER_TYPES or field_type in _TIME_TYPES:
        return field_type
    if field_type is ID or (isinstance(field_type, type) and issubclass(field_type, str)):
        return str
    raise ValueError(f"fields of type {field_type!r} cannot be indexed")


def index_score(field_type: Any, value: Any) -> float:
    """Sorted-set score of a numeric, boolean, date or timestamp value."""
    ptype = _python_type(field_type)
    if ptype in _TIME_TYPES:
        if isinstance(value, str):
            value = from_json_value(ptype, value)
        return float(epoch_ms(value))
    return float(value)


def index_entry(field_type: Any, value: Any, key: str) -> tuple[float, str] | None:
    """(score, member) for one row in the index of one field; None: not indexed.

    field_type is the field's Python type (FieldInfo.python_type) or a Spark type name.
    Strings: score 0, member "value\\0key" so ZRANGEBYLEX serves eq / prefix / range.
    Everything else: score = the number (timestamps as epoch ms), member = key.
    Nulls and non-finite numbers are left out of the index (Redis cannot score them).
    """
    if value is None:
        return None
    if _python_type(field_type) is str:
        text = str(value)
        if INDEX_SEPARATOR in text:
            raise ValueError("an indexed string contains NUL, which separates value and key")
        return 0.0, f"{text}{INDEX_SEPARATOR}{key}"
    score = index_score(field_type, value)
    if not math.isfinite(score):
        return None
    return score, key


def split_index_member(member: str) -> tuple[str, str]:
    """(value, key) of a string-index member."""
    value, _, key = member.partition(INDEX_SEPARATOR)
    return value, key


# Meta hash fields.
META_GENERATION = "generation"
META_VERSION = "version"
META_OFFSETS = "offsets"
META_WATERMARK = "watermark"
META_COMMITTED_AT_MS = "committed_at_ms"
META_LATE_EVENTS = "late_events"
META_DEAD_LETTERS = "dead_letters"
# Recorded from Spark's query progress (engine.progress), per generation like the rest.
META_INPUT_RATE = "input_rows_per_s"
META_PROCESSING_RATE = "processed_rows_per_s"
META_BATCH_MS = "batch_ms"
META_PROGRESS_AT_MS = "progress_at_ms"
META_LAST_ERROR = "last_error"


def generation_field(name: str, generation: int) -> str:
    """A meta field of one generation ("name:g<gen>"): each generation keeps its own copy of
    the meta fields, which a switch promotes (see the Lua scripts below, which spell it too)."""
    return f"{name}:g{generation}"


def fence_field(generation: int) -> str:
    """The meta field holding the last batch id applied to Redis for one generation."""
    return generation_field(META_VERSION, generation)


def complete_field(generation: int) -> str:
    """Meta field set by the gateway once Redis holds every row of a generation (it
    re-warmed the whole Delta snapshot). Absent after a flush: indexes may be partial."""
    return generation_field("complete", generation)


@dataclass
class ViewMeta:
    """What `vg:{view}:meta` says about the view the gateway serves."""

    generation: int = 0
    version: int = -1  # last committed batch id; -1: nothing committed yet
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)  # topic->partition->next
    watermark: str = ""  # ISO-8601 or ""
    committed_at_ms: int = 0
    late_events: int = 0
    dead_letters: int = 0
    input_rate: float = 0.0  # rows/s arriving, over the last batch
    processing_rate: float = 0.0  # rows/s processed, over the last batch
    batch_ms: int = 0  # the last batch's trigger execution
    progress_at_ms: int = 0  # when Spark last reported on the query
    last_error: str = ""  # why the view's query last stopped with an error, if it did

    def behind(self, topic: str, ends: Mapping[str, int]) -> int:
        """Events of `topic` past what the last batch covered, given the topic's end
        offsets (partition -> next offset to be written)."""
        done = self.offsets.get(topic, {})
        return sum(max(0, end - int(done.get(partition, 0)))
                   for partition, end in ends.items())

    def to_fields(self) -> dict[str, str]:
        """Every value a string: the Lua script stores them as given."""
        return {
            META_GENERATION: str(self.generation),
            META_VERSION: str(self.version),
            META_OFFSETS: orjson.dumps(self.offsets).decode(),
            META_WATERMARK: self.watermark,
            META_COMMITTED_AT_MS: str(self.committed_at_ms),
            META_LATE_EVENTS: str(self.late_events),
            META_DEAD_LETTERS: str(self.dead_letters),
            META_INPUT_RATE: str(self.input_rate),
            META_PROCESSING_RATE: str(self.processing_rate),
            META_BATCH_MS: str(self.batch_ms),
            META_PROGRESS_AT_MS: str(self.progress_at_ms),
            META_LAST_ERROR: self.last_error,
        }

    @classmethod
    def from_fields(cls, fields: Mapping[Any, Any]) -> ViewMeta:
        """From HGETALL's answer (bytes or str); absent fields keep their defaults."""
        f = {_text(k): _text(v) for k, v in fields.items()}
        return cls(
            generation=int(f.get(META_GENERATION) or 0),
            version=int(f.get(META_VERSION) or -1),
            offsets=orjson.loads(f[META_OFFSETS]) if f.get(META_OFFSETS) else {},
            watermark=f.get(META_WATERMARK, ""),
            committed_at_ms=int(f.get(META_COMMITTED_AT_MS) or 0),
            late_events=int(f.get(META_LATE_EVENTS) or 0),
            dead_letters=int(f.get(META_DEAD_LETTERS) or 0),
            input_rate=float(f.get(META_INPUT_RATE) or 0),
            processing_rate=float(f.get(META_PROCESSING_RATE) or 0),
            batch_ms=int(f.get(META_BATCH_MS) or 0),
            progress_at_ms=int(f.get(META_PROGRESS_AT_MS) or 0),
            last_error=f.get(META_LAST_ERROR, ""),
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# The engine's atomic, fenced apply of one batch. Redis runs a script atomically, but does
# not roll back on an error, so every write is checked before the first one. The writes
# come grouped into commands of many arguments (BatchWrites): a call per write cost a
# batch of 15,000 orders (75,000 writes) 347-596 ms in Redis, most of it the calls and the
# decoding of one JSON object per write.
APPLY_BATCH_LUA = r"""
-- KEYS[1] meta hash; KEYS[2] (optional) the generation's change-event outbox;
-- ARGV[1] batch id; ARGV[2] generation;
-- ARGV[3] JSON object of meta fields (string values); ARGV[4] JSON list of writes, each
-- [command, key, [arguments]] (see BatchWrites); ARGV[5] the batch's serialized change
-- events (see outbox_value).
local meta = KEYS[1]
local batch = tonumber(ARGV[1])
local gen = ARGV[2]
local live = redis.call('HGET', meta, 'generation')
if live and tonumber(gen) < tonumber(live) then
  return -1  -- a retired generation (a rebuild replaced it): write nothing
end
-- The fence is per generation, so a rebuild into a new generation has its own batch ids.
local fence = 'version:g' .. gen
local seen = redis.call('HGET', meta, fence)
if seen and tonumber(seen) >= batch then
  return 0  -- a replayed or stale batch: change nothing
end
-- Each command's Redis name, and how many arguments one write of it takes. SET and DEL
-- name their keys in their arguments (MSET k v k v ..., DEL k k ...); the others write
-- one key.
local commands = {set = {'MSET', 2}, del = {'DEL', 1}, zadd = {'ZADD', 2},
                  zrem = {'ZREM', 1}, hset = {'HSET', 2}, hdel = {'HDEL', 1}}
local writes = cjson.decode(ARGV[4])
-- Numeric loops, one per kind of arguments: a throughput batch checks about 150,000.
for i = 1, #writes do
  local write = writes[i]
  local kind, args = write[1], write[3]
  local command = commands[kind]
  if not command or type(write[2]) ~= 'string' or type(args) ~= 'table'
      or #args % command[2] ~= 0 then
    return redis.error_reply('viewgate: bad write #' .. i)
  end
  if kind == 'zadd' then  -- score, member, score, member, ...
    for j = 1, #args, 2 do
      if type(args[j]) ~= 'number' or type(args[j + 1]) ~= 'string' then
        return redis.error_reply('viewgate: bad write #' .. i)
      end
    end
  else
    for j = 1, #args do
      if type(args[j]) ~= 'string' then
        return redis.error_reply('viewgate: bad write #' .. i)
      end
    end
  end
end
-- A call takes at most 1,000 arguments (Lua's unpack stops near 8,000).
for _, write in ipairs(writes) do
  local command, key, args = commands[write[1]], write[2], write[3]
  local step = 1000 - 1000 % command[2]
  for first = 1, #args, step do
    local last = math.min(first + step - 1, #args)
    if command[1] == 'MSET' or command[1] == 'DEL' then
      redis.call(command[1], unpack(args, first, last))
    else
      redis.call(command[1], key, unpack(args, first, last))
    end
  end
end
if (not seen) and batch == 0 then
  -- The generation's first batch into a Redis without any of it: from here on Redis holds
  -- every row of the generation (a flush loses this mark with the rest of the meta).
  redis.call('HSET', meta, 'complete:g' .. gen, ARGV[1])
end
redis.call('HSET', meta, fence, ARGV[1])
-- The transactional outbox: a crash before the change feed is published leaves the
-- batch's events (with their previous rows, gone from Redis now) for the replay to send.
if KEYS[2] then
  redis.call('SET', KEYS[2], ARGV[5] or '')
end
-- Every generation keeps its own copy of the meta fields ("name:g<gen>"), which a switch
-- promotes; the plain fields describe the generation being served, so a rebuild still
-- catching up never shows through.
local fields = cjson.decode(ARGV[3])
for name, value in pairs(fields) do
  redis.call('HSET', meta, name .. ':g' .. gen, tostring(value))
end
if (not live) or live == gen then
  for name, value in pairs(fields) do
    redis.call('HSET', meta, name, tostring(value))
  end
  redis.call('HSET', meta, 'generation', gen, 'version', ARGV[1])
end
return 1
"""

APPLIED, REPLAYED, RETIRED = 1, 0, -1  # what APPLY_BATCH_LUA returns

# Switch readers to a rebuilt generation: promote its "name:g<gen>" meta fields to the
# plain ones and drop the fields of older generations, atomically. Writes to an older
# generation are refused from then on (see APPLY_BATCH_LUA), so none can leak in after.
SWITCH_GENERATION_LUA = r"""
-- KEYS[1] meta hash; ARGV[1] the new generation. Returns 1 if switched, 0 if not newer.
local meta = KEYS[1]
local gen = tonumber(ARGV[1])
local live = tonumber(redis.call('HGET', meta, 'generation') or '-1')
if live >= gen then
  return 0
end
local all = redis.call('HGETALL', meta)
-- The old generation's figures must not show through where the new one has none yet.
redis.call('HDEL', meta, 'offsets', 'watermark', 'committed_at_ms', 'late_events')
redis.call('HSET', meta, 'version', '-1')
for i = 1, #all, 2 do
  local name, value = all[i], all[i + 1]
  local base, g = string.match(name, '^(.*):g(%d+)$')
  if base then
    if tonumber(g) == gen then
      redis.call('HSET', meta, base, value)
    elseif tonumber(g) < gen then
      redis.call('HDEL', meta, name)
    end
  end
end
redis.call('HSET', meta, 'generation', ARGV[1])
return 1
"""

Op = dict[str, Any]


def op_set(key: str, value: bytes | str) -> Op:
    return {"op": "set", "k": key, "v": value.decode() if isinstance(value, bytes) else value}


def op_del(key: str) -> Op:
    return {"op": "del", "k": key}


def op_hset(key: str, field: str, value: str) -> Op:
    return {"op": "hset", "k": key, "f": field, "v": value}


def op_hdel(key: str, field: str) -> Op:
    return {"op": "hdel", "k": key, "f": field}


def op_zadd(key: str, score: float, member: str) -> Op:
    return {"op": "zadd", "k": key, "s": score, "m": member}


def op_zrem(key: str, member: str) -> Op:
    return {"op": "zrem", "k": key, "m": member}


def apply_batch_args(batch_id: int, generation: int, meta: Mapping[str, Any],
                     ops: Iterable[Op] | BatchWrites | bytes, outbox: bytes = b""
                     ) -> list[str | bytes]:
    """ARGV for APPLY_BATCH_LUA (KEYS is [meta_key(view), outbox_key(view, generation)]).
    Meta values become strings; `outbox` is outbox_value(batch_id, events). `ops` as bytes:
    the writes encoded already (BatchWrites.encoded, or several joined: join_writes)."""
    meta_text = {k: v if isinstance(v, str) else orjson.dumps(v).decode()
                 for k, v in meta.items()}
    if isinstance(ops, bytes):
        encoded = ops
    else:
        encoded = (ops if isinstance(ops, BatchWrites) else BatchWrites(ops)).encoded()
    return [str(int(batch_id)), str(int(generation)), orjson.dumps(meta_text).decode(),
            encoded, outbox]


def join_writes(parts: Iterable[bytes]) -> bytes:
    """Several BatchWrites.encoded() of one view's batch as one: the tasks' shares of a
    batch write disjoint keys (each row key in one share), so their commands run in any
    order, each share's removals still before its additions."""
    inner = [part[1:-1] for part in parts if part != b"[]"]
    return b"[" + b",".join(inner) + b"]"


# The order a batch's writes run in: every removal before every addition. A batch never
# adds what it removes but to replace it: an index entry moved to a new score (ZREM, then
# ZADD of the same member), an aggregate's states dropped and written anew (DEL of the
# hash, then HSET); a row key is written or deleted, never both.
_WRITE_RANK = {kind: rank for rank, kind in enumerate(("del", "zrem", "hdel", "set", "zadd",
                                                        "hset"))}
# Each Op's key field (None: SET and DEL, whose keys are among the arguments) and the fields
# that become its command's arguments.
_OP_FIELDS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "set": (None, ("k", "v")), "del": (None, ("k",)), "zadd": ("k", ("s", "m")),
    "zrem": ("k", ("m",)), "hset": ("k", ("f", "v")), "hdel": ("k", ("f",))}


class BatchWrites:
    """A batch's Redis writes as APPLY_BATCH_LUA takes them: [command, key, [arguments]],
    one per command and key (SET and DEL of every key together, as MSET and DEL, with key
    ""), removals first. Built write by write, or from Op dicts."""

    def __init__(self, ops: Iterable[Op] = ()) -> None:
        self._grouped: dict[tuple[str, str], list[Any]] = {}
        for op in ops:
            self.add(op)

    def arguments(self, command: str, key: str = "") -> list[Any]:
        """The arguments of `command` on `key` so far, to append to (a row's SET: the row
        key and its value; a ZADD: a score and a member)."""
        found = self._grouped.get((command, key))
        if found is None:
            found = self._grouped[command, key] = []
        return found

    def add(self, op: Op) -> None:
        kind = op["op"]
        if kind not in _OP_FIELDS:
            raise ValueError(f"unknown Redis write {kind!r}")
        key_field, fields = _OP_FIELDS[kind]
        self.arguments(kind, "" if key_field is None else op[key_field]).extend(
            op[f] for f in fields)

    def commands(self) -> list[list[Any]]:
        """ARGV[4]'s writes, removals first (see _WRITE_RANK)."""
        return [[kind, key, args] for (kind, key), args
                in sorted(self._grouped.items(), key=lambda item: _WRITE_RANK[item[0][0]])
                if args]

    def encoded(self) -> bytes:
        """ARGV[4] itself: the commands as JSON."""
        return orjson.dumps(self.commands())


# The gateway's re-warm of rows it read from Delta. It applies only if the fence is still
# the one the gateway saw before reading Delta (no engine batch landed in between) and
# that Delta snapshot is not older than it, so it can never regress or resurrect a row.
WARM_ROWS_LUA = r"""
-- KEYS[1] meta hash; ARGV[1] generation; ARGV[2] fence seen ('' = none);
-- ARGV[3] Delta batch id of the rows; ARGV[4] Delta commit ms; ARGV[5] '1' = last chunk of
-- a complete warm; ARGV[6] JSON list of ops (as APPLY_BATCH_LUA's).
local meta = KEYS[1]
local gen = ARGV[1]
local live = redis.call('HGET', meta, 'generation')
if live and tonumber(gen) < tonumber(live) then
  return 0  -- a rebuild retired this generation meanwhile
end
local seen = redis.call('HGET', meta, 'version:g' .. gen) or ''
if seen ~= ARGV[2] then
  return 0
end
if seen ~= '' and tonumber(seen) > tonumber(ARGV[3]) then
  return 0
end
for _, op in ipairs(cjson.decode(ARGV[6])) do
  if op.op == 'set' then
    redis.call('SET', op.k, op.v)
  elseif op.op == 'zadd' then
    redis.call('ZADD', op.k, op.s, op.m)
  elseif op.op == 'hset' then
    redis.call('HSET', op.k, op.f, op.v)
  elseif op.op == 'hdel' then
    redis.call('HDEL', op.k, op.f)
  elseif op.op == 'zrem' then
    redis.call('ZREM', op.k, op.m)
  end
end
if seen == '' and tonumber(ARGV[3]) >= 0 and ((not live) or live == gen) then
  -- Meta was lost with the rows: describe the snapshot the rows came from.
  redis.call('HSET', meta, 'version:g' .. gen, ARGV[3], 'generation', gen,
             'version', ARGV[3], 'committed_at_ms', ARGV[4])
end
if ARGV[5] == '1' then
  redis.call('HSET', meta, 'complete:g' .. gen, ARGV[3])
end
return 1
"""


def warm_rows_args(generation: int, fence_seen: int | None, delta_batch: int,
                   committed_at_ms: int, complete: bool, ops: Iterable[Op]) -> list[str]:
    """ARGV for WARM_ROWS_LUA (KEYS is [meta_key(view)])."""
    return [str(int(generation)), "" if fence_seen is None else str(int(fence_seen)),
            str(int(delta_batch)), str(int(committed_at_ms)), "1" if complete else "0",
            orjson.dumps(list(ops)).decode()]


# --- Change feed ------------------------------------------------------------------------

# Format 2: ops insert / update / delete, and `before`, the row's previous value, so a
# subscriber can tell a row entering its filter from one leaving it.
CHANGE_EVENT_FORMAT = 2
CHANGE_OPS = ("insert", "update", "delete")
CHANGEFEED_PREFIX = "viewgate.changes."


def changefeed_topic(view: str, prefix: str = CHANGEFEED_PREFIX) -> str:
    """One topic per view with one partition, so a position in the feed is an offset."""
    return f"{prefix}{view}"


def deadletter_topic(source_name: str) -> str:
    return f"viewgate.deadletter.{source_name}"


ChangeOp = Literal["insert", "update", "delete"]


# Not frozen: a frozen dataclass sets each field through object.__setattr__, which made a
# throughput batch's 14,000 events cost 15 ms to build against 5. Nothing assigns to an
# event's fields, and its dict fields never let it be hashed anyway.
@dataclass
class ChangeEvent:
    """One committed change of one row; (view, key, version) lets consumers drop repeats."""

    view: str
    key: str
    op: ChangeOp
    row: dict[str, Any] | None  # the new row; None on delete
    before: dict[str, Any] | None  # the previous row; None on insert
    version: int  # batch id
    generation: int
    committed_at_ms: int
    # The previous row as Redis stored it (its JSON text), when the engine read it there:
    # put into the event's bytes as it is (orjson.Fragment) instead of encoding `before`
    # again. Only the bytes use it; two events with the same fields are equal with it or
    # without.
    before_text: bytes | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": CHANGE_EVENT_FORMAT,
            "view": self.view,
            "key": self.key,
            "op": self.op,
            "row": self.row,
            "before": self.before,
            "version": self.version,
            "generation": self.generation,
            "committed_at_ms": self.committed_at_ms,
        }

    def to_bytes(self) -> bytes:
        # Kept: the outbox and the change feed send the same bytes. By hand, not with
        # functools.cached_property, whose lock cost a third as much as encoding (Python
        # 3.11: 20,000 events 170 ms against 111 ms).
        encoded = self.__dict__.get("_bytes")
        if encoded is None:
            fields = self.to_dict()
            if self.before_text is not None:
                # 13,500 update events encoded in 19 ms of CPU against 48 (probe, median of 7)
                fields["before"] = orjson.Fragment(self.before_text)
            encoded = self.__dict__["_bytes"] = _dumps(fields)
        return encoded

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChangeEvent:
        if d.get("format") != CHANGE_EVENT_FORMAT:
            raise ValueError(f"change event format {d.get('format')!r} is not "
                             f"{CHANGE_EVENT_FORMAT}; upgrade the reader")
        if d["op"] not in CHANGE_OPS:
            raise ValueError(f"unknown change op {d['op']!r}")
        return cls(view=d["view"], key=d["key"], op=d["op"], row=d["row"],
                   before=d.get("before"), version=int(d["version"]),
                   generation=int(d["generation"]), committed_at_ms=int(d["committed_at_ms"]))

    @classmethod
    def from_bytes(cls, data: bytes | str) -> ChangeEvent:
        return cls.from_dict(orjson.loads(data))


def events_from_bytes(encoded: Sequence[bytes]) -> list[ChangeEvent]:
    """Change events back from their bytes (rows in JSON form), decoded in one call, each
    keeping the bytes it came as: the feed and the outbox send them unchanged."""
    if not encoded:
        return []
    events = []
    for data, d in zip(encoded, orjson.loads(b"[" + b",".join(encoded) + b"]"), strict=True):
        event = ChangeEvent.from_dict(d)
        event.__dict__["_bytes"] = data
        events.append(event)
    return events


def change_op(before: Mapping[str, Any] | None, row: Mapping[str, Any] | None) -> ChangeOp:
    """The op of a change from the row's previous and new value (None: absent)."""
    if row is None:
        return "delete"
    return "insert" if before is None else "update"


class EncodedEvents(Sequence[ChangeEvent]):
    """Change events as their bytes and keys (as Spark's tasks computed them), decoded only
    when a field other than those is read: the change feed and the outbox send the bytes
    as they are, so a batch whose views the tasks computed and wrote is forwarded by the
    driver without decoding its events (a quarter of the driver's Python in a profile)."""

    def __init__(self, encoded: Sequence[bytes], keys: Sequence[str]) -> None:
        self.encoded = list(encoded)
        self.keys = list(keys)
        self._decoded: list[ChangeEvent] | None = None

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, index: Any) -> Any:
        if self._decoded is None:
            self._decoded = events_from_bytes(self.encoded)
        return self._decoded[index]


def keyed_bytes(events: Sequence[ChangeEvent]) -> Iterable[tuple[str, bytes]]:
    """Each event's key and bytes, without decoding EncodedEvents."""
    if isinstance(events, EncodedEvents):
        return zip(events.keys, events.encoded, strict=True)
    return ((e.key, e.to_bytes()) for e in events)


def outbox_value(batch_id: int, events: Sequence[ChangeEvent]) -> bytes:
    """The batch's events as stored with its rows; made of the same bytes the change feed
    sends (ChangeEvent.to_bytes is computed once per event)."""
    encoded = (events.encoded if isinstance(events, EncodedEvents)
               else [e.to_bytes() for e in events])
    return b'{"batch":%d,"events":[%s]}' % (int(batch_id), b",".join(encoded))


def outbox_events(data: bytes | str | None, batch_id: int) -> list[ChangeEvent] | None:
    """The stored events of `batch_id`; None when the outbox holds another batch (or none)."""
    if not data:
        return None
    stored = orjson.loads(data)
    if stored.get("batch") != batch_id:
        return None
    return [ChangeEvent.from_dict(e) for e in stored["events"]]
