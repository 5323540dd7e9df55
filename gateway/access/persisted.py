"""Persisted queries, compatible with Apollo's automatic persisted queries (APQ).

A request names its document by hash in `extensions.persistedQuery`
(`{"version": 1, "sha256Hash": "<hex>"}`), with or without the document:

- hash only: the stored document runs, or the answer is the error `PersistedQueryNotFound`
  (code `PERSISTED_QUERY_NOT_FOUND`, HTTP 200 as Apollo answers), and Apollo Client sends
  the hash again with the document;
- hash and document: the document's sha256 must be the hash (else 400); it is stored and
  runs.

Documents live in Redis: `vg:apq:<hash>` for those clients registered (they expire after
`gateway_apq_ttl_s`, so clients cannot fill Redis for good) and `vg:pq:<hash>` for those
the operator registered (`viewgate persist <manifest>`), with an in-process LRU in front
and the manifest named by `gateway_persisted_manifest` held in memory. In persisted-only
mode (`gateway_persisted_only`) only the operator's documents run, by hash or by text, and
clients cannot register any. A resolved request is a plain document: it takes the compiled
path like any other.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from graphql import GraphQLError, GraphQLSyntaxError, parse
from redis.exceptions import RedisError

from schema.redis_client import connect, connect_async
from schema.storage import REDIS_PREFIX

log = logging.getLogger(__name__)

NOT_FOUND = "PERSISTED_QUERY_NOT_FOUND"
NOT_IN_LIST = "PERSISTED_QUERY_NOT_IN_LIST"
MANIFEST_FORMAT = "apollo-persisted-query-manifest"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def client_key(digest: str) -> str:
    """A document a client registered (expires). The digest is the key's hash tag, so both
    keys of one digest share a Redis Cluster slot and one MGET reads them."""
    return f"{REDIS_PREFIX}apq:{{{digest}}}"


def operator_key(digest: str) -> str:
    """A document the operator registered (kept)."""
    return f"{REDIS_PREFIX}pq:{{{digest}}}"


def sha256_hex(document: str) -> str:
    return hashlib.sha256(document.encode()).hexdigest()


class PersistedQueryError(Exception):
    """A persisted-query request refused: `code` for extensions.code, `status` for HTTP."""

    def __init__(self, message: str, code: str, status: int) -> None:
        super().__init__(message)
        self.code = code
        self.status = status

    def as_graphql_error(self) -> GraphQLError:
        return GraphQLError(str(self), extensions={"code": self.code})


class ManifestError(ValueError):
    """The persisted-query manifest cannot be used; the message says where and why."""


def load_manifest(path: Path) -> dict[str, str]:
    """Hash -> document of an Apollo persisted-query manifest, each checked: its id is its
    body's sha256 and the body parses."""
    try:
        manifest = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ManifestError(f"cannot read the manifest {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT \
            or manifest.get("version") != 1 or not isinstance(manifest.get("operations"), list):
        raise ManifestError(f"{path} is not an Apollo persisted-query manifest (format "
                            f"{MANIFEST_FORMAT!r}, version 1, a list of operations)")
    documents: dict[str, str] = {}
    for index, op in enumerate(manifest["operations"]):
        name = op.get("name") if isinstance(op, dict) else None
        where = f"{path}: operation {index} ({name or 'unnamed'})"
        if not isinstance(op, dict) or not isinstance(op.get("id"), str) \
                or not isinstance(op.get("body"), str):
            raise ManifestError(f"{where} needs a string id and body")
        if sha256_hex(op["body"]) != op["id"].lower():
            raise ManifestError(f"{where}: its id is not the sha256 of its body "
                                f"({sha256_hex(op['body'])})")
        try:
            parse(op["body"])
        except GraphQLSyntaxError as exc:
            raise ManifestError(f"{where}: the body does not parse: {exc.message}") from None
        documents[op["id"].lower()] = op["body"]
    return documents


def store_documents(redis_url: str, documents: dict[str, str]) -> None:
    """Register the operator's documents (`viewgate persist`): kept until deleted."""
    client = connect(redis_url)
    try:
        pipe = client.pipeline(transaction=False)  # one SET each: they span the slots
        for digest, body in documents.items():
            pipe.set(operator_key(digest), body)
        pipe.execute()
    finally:
        client.close()


def persisted_hash(extensions: Any) -> str | None:
    """The sha256 hash a request names, or None when it names none."""
    if isinstance(extensions, str):
        try:
            extensions = orjson.loads(extensions)
        except orjson.JSONDecodeError:
            return None  # the request's own parsing says what is wrong with it
    if not isinstance(extensions, dict) or extensions.get("persistedQuery") is None:
        return None
    persisted = extensions["persistedQuery"]
    if not isinstance(persisted, dict) or persisted.get("version") != 1:
        raise PersistedQueryError("unsupported persistedQuery: give {\"version\": 1, "
                                  "\"sha256Hash\": ...}", "BAD_REQUEST", 400)
    digest = persisted.get("sha256Hash")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest.lower()):
        raise PersistedQueryError("persistedQuery.sha256Hash must be 64 hexadecimal digits",
                                  "BAD_REQUEST", 400)
    return digest.lower()


class LRU:
    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        value = self.items.get(key)
        if value is not None:
            self.items.move_to_end(key)
        return value

    def put(self, key: str, value: str) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        if len(self.items) > self.size:
            self.items.popitem(last=False)


class PersistedQueries:
    def __init__(self, settings: Any, manifest: dict[str, str] | None = None) -> None:
        self.only = settings.gateway_persisted_only
        self.ttl_s = settings.gateway_apq_ttl_s
        self.max_bytes = settings.gateway_max_document_bytes
        self.manifest = manifest if manifest is not None else (
            load_manifest(settings.gateway_persisted_manifest)
            if settings.gateway_persisted_manifest else {})
        self.cache = LRU(settings.gateway_persisted_cache_size)
        self.client = connect_async(
            settings.redis_url, socket_timeout=settings.gateway_redis_timeout_s,
            socket_connect_timeout=settings.gateway_redis_timeout_s)

    async def close(self) -> None:
        await self.client.aclose()

    def _not_in_list(self, what: str) -> PersistedQueryError:
        return PersistedQueryError(
            f"{what} is not a persisted document: this gateway runs only documents the "
            "operator registered (VIEWGATE_GATEWAY_PERSISTED_ONLY); add it to the manifest "
            "(VIEWGATE_GATEWAY_PERSISTED_MANIFEST or `viewgate persist`)", NOT_IN_LIST, 400)

    def cached(self, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """For the lean entry, without I/O: the request as a plain document when memory
        knows it (or it names none and may run); None when `resolve` must decide."""
        query = params.get("query")
        extensions = params.get("extensions")
        if not extensions:
            if not self.only:
                return params
            return params if isinstance(query, str) and self._known(sha256_hex(query)) \
                else None
        if query:
            return None  # a registration (or a check of one): the general path
        try:
            digest = persisted_hash(extensions)
        except PersistedQueryError:
            return None
        if digest is None:
            return None if self.only else params
        document = self._known(digest)
        return {**params, "query": document} if document is not None else None

    def _known(self, digest: str) -> str | None:
        return self.manifest.get(digest) or self.cache.get(digest)

    async def resolve(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """The request with its document filled in (a plain request is returned as it is);
        raises PersistedQueryError when it cannot run."""
        query = params.get("query") or None
        digest = persisted_hash(params.get("extensions"))
        if digest is None:
            if self.only and isinstance(query, str) \
                    and await self._lookup(sha256_hex(query)) is None:
                raise self._not_in_list("the query")
            return params  # parse_params says what is wrong with a missing or bad query
        if query is not None:
            if not isinstance(query, str) or len(query.encode()) > self.max_bytes:
                return params  # parse_params refuses it, and nothing is stored
            actual = sha256_hex(query)
            if actual != digest:
                raise PersistedQueryError(
                    f"persistedQuery.sha256Hash is {digest}, but the query's sha256 is "
                    f"{actual}", "BAD_REQUEST", 400)
            if await self._lookup(digest) is None:
                if self.only:
                    raise self._not_in_list(f"the document {digest}")
                await self._register(digest, query)
            return params
        document = await self._lookup(digest)
        if document is None:
            if self.only:
                raise self._not_in_list(f"the document {digest}")
            # Apollo's exact message and code: its clients answer it by sending the query.
            raise PersistedQueryError("PersistedQueryNotFound", NOT_FOUND, 200)
        return {**params, "query": document}

    async def _lookup(self, digest: str) -> str | None:
        document = self._known(digest)
        if document is not None:
            return document
        keys = [operator_key(digest)] if self.only else [operator_key(digest),
                                                          client_key(digest)]
        try:
            stored = await self.client.mget(keys)
        except (RedisError, OSError) as exc:
            log.warning("persisted documents cannot be read from Redis: %s", exc)
            return None
        found = next((value for value in stored if value is not None), None)
        if found is None:
            return None
        document = found.decode()
        self.cache.put(digest, document)
        return document

    async def _register(self, digest: str, query: str) -> None:
        self.cache.put(digest, query)
        try:
            await self.client.set(client_key(digest), query, ex=self.ttl_s)
        except (RedisError, OSError) as exc:
            # The request still runs; the document is in this process's memory only.
            log.warning("a persisted document could not be stored in Redis: %s", exc)
