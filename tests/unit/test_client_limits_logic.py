"""Per-client limits and persisted queries, the logic that needs no services: who a client
is, the in-process counts, Retry-After rounding, the persistedQuery extension, the
manifest, and what the lean entry can answer from memory."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from gateway.access.client_identity import client_key
from gateway.access.client_limits import ClientCounts
from gateway.access.persisted import (
    LRU,
    ManifestError,
    PersistedQueries,
    PersistedQueryError,
    load_manifest,
    persisted_hash,
    sha256_hex,
)
from gateway.access.rate_limit import retry_after_s
from schema.settings import Settings

DOC = "{ views { name } }"
DOC_HASH = hashlib.sha256(DOC.encode()).hexdigest()


def _scope(*headers: tuple[str, str], client=("10.0.0.1", 5000)) -> dict:
    return {"headers": [(n.encode(), v.encode()) for n, v in headers], "client": client}


def test_a_bearer_token_is_the_client_whatever_its_address_and_is_not_kept_in_clear():
    one = client_key(_scope(("authorization", "Bearer abc.def")))
    other_address = client_key(_scope(("authorization", "bearer abc.def"),
                                      client=("10.9.9.9", 1)))
    assert one == other_address and one.startswith("token:") and "abc" not in one
    assert client_key(_scope(("authorization", "Bearer other"))) != one


def test_without_a_token_the_address_counts_and_a_proxy_header_only_when_configured():
    assert client_key(_scope()) == "addr:10.0.0.1"
    assert client_key(_scope(("authorization", "Basic dXNlcg=="))) == "addr:10.0.0.1"
    forwarded = _scope(("x-forwarded-for", "6.6.6.6, 203.0.113.7"))
    assert client_key(forwarded) == "addr:10.0.0.1"  # not trusted unless configured
    # The last address is the one the trusted proxy saw; earlier ones the client could forge.
    assert client_key(forwarded, "X-Forwarded-For") == "addr:203.0.113.7"
    assert client_key(_scope(client=None)) == "addr:unknown"


def test_client_counts_hold_up_to_the_limit_and_forget_clients_that_left():
    counts = ClientCounts(2)
    assert counts.acquire("a") and counts.acquire("a")
    assert not counts.acquire("a")
    assert counts.acquire("b")  # another client has its own count
    counts.release("a")
    assert counts.acquire("a")
    counts.release("a"), counts.release("a"), counts.release("b")
    assert counts.held == {}
    unlimited = ClientCounts(0)
    assert all(unlimited.acquire("a") for _ in range(10_000))


@pytest.mark.parametrize(("wait_ms", "seconds"), [(0, 1), (1, 1), (999, 1), (1000, 1),
                                                  (1001, 2), (4500, 5)])
def test_retry_after_is_whole_seconds_rounded_up_and_never_zero(wait_ms, seconds):
    assert retry_after_s(wait_ms) == seconds


def test_the_persisted_query_extension_is_read_from_json_or_a_get_parameter():
    extension = {"persistedQuery": {"version": 1, "sha256Hash": DOC_HASH.upper()}}
    assert persisted_hash(extension) == DOC_HASH
    assert persisted_hash(json.dumps(extension)) == DOC_HASH
    assert persisted_hash(None) is None and persisted_hash({"minVersion": {}}) is None
    assert persisted_hash("{not json") is None  # the request's own parsing refuses it
    for bad in ({"version": 2, "sha256Hash": DOC_HASH}, {"version": 1, "sha256Hash": "abc"},
                "x"):
        with pytest.raises(PersistedQueryError) as error:
            persisted_hash({"persistedQuery": bad})
        assert error.value.status == 400 and error.value.code == "BAD_REQUEST"


def _manifest(tmp_path, operations, **top) -> object:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"format": "apollo-persisted-query-manifest", "version": 1,
                                "operations": operations, **top}))
    return path


def test_a_manifest_maps_each_hash_to_its_checked_document(tmp_path):
    ops = [{"id": DOC_HASH, "name": "Views", "type": "query", "body": DOC}]
    assert load_manifest(_manifest(tmp_path, ops)) == {DOC_HASH: DOC}
    wrong = [{"id": "0" * 64, "name": "Views", "type": "query", "body": DOC}]
    with pytest.raises(ManifestError, match="operation 0 \\(Views\\).*sha256"):
        load_manifest(_manifest(tmp_path, wrong))
    broken = "{ views { name }"
    with pytest.raises(ManifestError, match="does not parse"):
        load_manifest(_manifest(tmp_path, [{"id": sha256_hex(broken), "body": broken}]))
    with pytest.raises(ManifestError, match="not an Apollo persisted-query manifest"):
        load_manifest(_manifest(tmp_path, ops, format="something-else"))
    with pytest.raises(ManifestError, match="cannot read"):
        load_manifest(tmp_path / "missing.json")


def test_the_lru_keeps_the_most_recently_used():
    lru = LRU(2)
    lru.put("a", "1"), lru.put("b", "2")
    assert lru.get("a") == "1"
    lru.put("c", "3")
    assert lru.get("b") is None and lru.get("a") == "1" and lru.get("c") == "3"


def _persisted(only: bool, manifest: dict[str, str] | None = None) -> PersistedQueries:
    # The Redis client connects lazily: nothing here reaches it.
    settings = Settings(redis_url="redis://127.0.0.1:1/0", gateway_persisted_only=only)
    return PersistedQueries(settings, manifest or {})


def test_the_lean_entry_answers_from_memory_or_leaves_it_to_the_general_path():
    ext = {"persistedQuery": {"version": 1, "sha256Hash": DOC_HASH}}
    open_mode = _persisted(False)
    plain = {"query": DOC}
    assert open_mode.cached(plain) is plain  # nothing persisted: as it is
    assert open_mode.cached({"extensions": ext}) is None  # unknown hash: Redis decides
    assert open_mode.cached({"query": DOC, "extensions": ext}) is None  # a registration
    open_mode.cache.put(DOC_HASH, DOC)
    assert open_mode.cached({"extensions": json.dumps(ext)})["query"] == DOC  # GET form
    only = _persisted(True, {DOC_HASH: DOC})
    assert only.cached(plain) is plain  # the text of a registered document
    assert only.cached({"query": "{ system { redis } }"}) is None  # refused by the general path
    assert only.cached({"extensions": ext})["query"] == DOC


def _refused_handshake(extensions: dict) -> list[dict]:
    """What a second websocket of one client is sent while its first is open (limit 1)."""
    from gateway.http.limit_entry import LimitEntry

    async def scenario() -> list[dict]:
        opened, release = asyncio.Event(), asyncio.Event()

        async def app(scope, receive, send) -> None:
            opened.set()
            await release.wait()

        entry = LimitEntry(app, limiter=None, websockets=1, address_header=None)
        scope = {"type": "websocket", "path": "/graphql", "client": ("10.0.0.1", 1),
                 "headers": [], "extensions": extensions}
        first = asyncio.create_task(entry(dict(scope), None, None))
        await opened.wait()
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "websocket.connect"}

        async def send(message: dict) -> None:
            sent.append(message)
        await entry(dict(scope), receive, send)
        release.set()
        await first
        assert entry.websockets.held == {}  # the first gave its slot back when it ended
        return sent
    return asyncio.run(scenario())


def test_a_websocket_past_the_limit_is_refused_with_429_or_else_closed_with_4029():
    start, body = _refused_handshake({"websocket.http.response": {}})
    assert start["type"] == "websocket.http.response.start" and start["status"] == 429
    error = json.loads(body["body"])["errors"][0]
    assert error["extensions"]["code"] == "LIMIT_WEBSOCKETS"
    assert "gateway_max_websockets_per_client" in error["message"]
    # A server without the denial-response extension: closed before it is accepted.
    (close,) = _refused_handshake({})
    assert close["type"] == "websocket.close" and close["code"] == 4029
    assert "gateway_max_websockets_per_client" in close["reason"]
