"""One typed settings object, read from `VIEWGATE_*` environment variables.

Every process (engine, gateway, CLI, tests) reads its configuration from here, so
the names in README.md's configuration table and in compose.yaml are exactly the
field names below, upper-cased, with the `VIEWGATE_` prefix.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VIEWGATE_", extra="ignore")

    catalog: str | None = Field(
        None, description="The view catalog as module:attribute. Default: schema.demo:CATALOG."
    )

    # Where the engine and gateway find the shared services.
    kafka_bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers (comma-separated host:port)."
    )
    kafka_replication_factor: int | None = Field(
        None,
        description="Replicas of each topic the engine creates (sources it finds missing, "
        "dead-letter topics, change feeds). Default: the brokers' default.replication.factor. "
        "The cluster profile sets 3.",
    )
    kafka_min_insync_replicas: int | None = Field(
        None,
        description="min.insync.replicas of the topics the engine creates: how many replicas "
        "must hold a write before an acks=all producer (the engine's, the demo's) hears it "
        "succeed. Default: the brokers' own. The cluster profile sets 2.",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis connection URL: redis:// or rediss:// for one server, "
        "redis+cluster:// or rediss+cluster:// (any node) for a Redis Cluster.",
    )

    # Durable state.
    data_dir: Path = Field(
        Path(".viewgate"), description="Root for local data: Delta tables, checkpoints, logs."
    )
    delta_root: str | None = Field(
        None,
        description="Where Delta tables live (a path or an object-store URI). "
        "Default: <data_dir>/delta.",
    )
    checkpoint_root: str | None = Field(
        None,
        description="Where Spark checkpoints live (a path or URI). "
        "Default: <data_dir>/checkpoints.",
    )

    # Object storage for Delta and checkpoints (s3a:// roots): an S3-API endpoint and keys.
    s3_endpoint: str | None = Field(
        None,
        description="S3-API endpoint for s3a:// Delta and checkpoint roots, e.g. "
        "http://minio:9000 (unset: AWS's own, with keys from the usual AWS variables).",
    )
    s3_access_key_id: str | None = Field(None, description="Access key of the S3 endpoint.")
    s3_secret_access_key: SecretStr | None = Field(
        None, description="Secret key of the S3 endpoint (from the environment, never a file)."
    )
    s3_region: str = Field("us-east-1", description="Region of the S3 endpoint.")

    # Spark.
    spark_master: str = Field("local[2]", description="Spark master URL.")
    spark_jars: str | None = Field(
        None,
        description="Comma-separated jar paths for Spark (Kafka connector, Delta). "
        "Default: the jars `viewgate setup` resolved into <cache_dir>/jars/spark.",
    )
    max_offsets_per_trigger: int | None = Field(
        50_000,
        description="Most Kafka records one micro-batch of a query reads (Spark's "
        "maxOffsetsPerTrigger), so catching up on a backlog runs in bounded batches: an "
        "engine that fell behind does not read ever larger batches, each holding more "
        "memory and taking longer than the last (a 30-minute run behind its input grew "
        "batches to a minute and the driver to 4 GiB). 0: no limit.",
    )
    engine_task_read: bool = Field(
        False,
        description="The graph query's tasks fold each batch's records before they reach "
        "the driver (the last record per key; what each stream aggregate's events add) and "
        "compute the upsert views that pick columns of their source (their Redis writes "
        "and change events, engine.task_upsert), when every stream aggregate is evaluated "
        "without Spark. Off by default: on two "
        "local cores the Python tasks' round trip costs more than the driver saves "
        "(docs/engine-plan.md).",
    )
    engine_task_tables: bool = Field(
        False,
        description="With engine_task_read, the same Spark job also computes the views "
        "over views, in a second stage over the upsert views' changes repartitioned by "
        "the value those views join or group by (engine.task_tables), when each is a "
        "join or a one-column aggregate evaluated without Spark, all partitioned by one "
        "value. Off by default: on two shared cores it doubled the executors' CPU and "
        "cost a third of the events/s for little of the driver's (docs/engine-plan.md, "
        "\"Stage B\").",
    )
    engine_task_delta: bool = Field(
        False,
        description="With engine_task_read, the tasks that compute a view's share of a "
        "batch also write its Delta files (the rows they upsert, the change data), and the "
        "driver commits them with the deletion vectors of the rows they replace "
        "(engine.task_delta): the driver no longer encodes or uploads the rows. For tables "
        "with deletion vectors whose columns JSON carries exactly; others are written by "
        "the driver. Off by default, as engine_task_read.",
    )
    engine_task_read_min_records: int = Field(
        10_000,
        ge=0,
        description="With engine_task_read, the fewest Kafka records a batch must cover "
        "(counted from its offsets) for its tasks to fold it; smaller batches, the live "
        "ones, are collected into the driver, since a Python task's round trip costs "
        "about 110 ms a job whatever its size.",
    )
    engine_driver_fetch_max_records: int = Field(
        50_000,
        ge=0,
        description="A graph batch of at most this many Kafka records (counted from its "
        "offsets) is fetched straight from Kafka with no Spark job (a job costs about "
        "110 ms on two cores whatever its size), read ahead by a process of its own "
        "(engine_read_ahead) or by the driver; larger batches, and any batch with a record "
        "Spark must classify (malformed JSON, a wrong type), are read by Spark. The read "
        "ahead holds at most this many records. 0: every batch by Spark.",
    )
    engine_read_ahead: bool = Field(
        True,
        description="With the driver's fetch (engine_driver_fetch_max_records), a process of "
        "the engine's own reads and classifies the next batch's records from Kafka while "
        "the driver computes and commits the current one, so that a batch finds its records "
        "read; off: the driver fetches each batch's records once Spark calls the batch.",
    )
    engine_early_merge_changes: int = Field(
        5_000,
        ge=0,
        description="A graph batch of at least this many change events (over all its "
        "views) starts its Delta MERGEs while Redis applies it, so their Python runs while "
        "the driver would wait on Redis; smaller batches (live ones) start them once Redis "
        "answered, so that the MERGEs do not delay the change feeds. Each MERGE commits "
        "only once Redis holds the batch either way.",
    )
    engine_metrics_port: int = Field(
        9464, description="Port of the engine's Prometheus /metrics; 0 turns it off."
    )
    engine_metrics_host: str = Field(
        "127.0.0.1", description="Address the engine's /metrics listens on."
    )
    dimension_local_max_rows: int = Field(
        200_000,
        description="A dimension view (the static side of a stream-static join) with at "
        "most this many rows is read once per Delta version into the driver instead of "
        "being scanned by Spark every batch.",
    )
    deadletter_trigger: str = Field(
        "10 seconds",
        description="Trigger interval of the dead-letter queries (one per source). They scan "
        "every event for bad ones and are not on the freshness path, so they run less often "
        "than the views and leave them the CPU.",
    )
    spark_min_batches_to_retain: int = Field(
        100,
        description="Micro-batches whose offsets, commits and state each Spark checkpoint "
        "keeps (spark.sql.streaming.minBatchesToRetain): what a restart can replay from; "
        "older ones are deleted, so checkpoints stay bounded.",
    )
    delta_target_file_bytes: int = Field(
        8 * 1024 * 1024,
        description="Target size of the Parquet files of a view's Delta table "
        "(delta.targetFileSize), which compaction and maintenance write. A batch's MERGE "
        "rewrites no file (it marks replaced rows with deletion vectors), so larger files "
        "only mean fewer files for a batch to mark.",
    )
    delta_compact_interval_s: float = Field(
        60.0,
        description="How often the engine merges each view's small Delta files (a batch "
        "writes one) into files of delta_target_file_bytes, beside its batches (the view's "
        "next MERGE waits for it). "
        "Costs the recent rows only. 0 turns it off.",
    )
    delta_maintenance_interval_s: float = Field(
        600.0,
        description="How often the engine maintains each view's Delta table, beside its "
        "batches as compaction is: files compacted, versions older than the view's "
        "`history` vacuumed, the log checkpointed and its old entries removed. 0 turns it off.",
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict,
        description='Extra Spark configuration as JSON, e.g. {"spark.executor.memory": "4g"}.',
    )

    log_level: str = Field(
        "INFO", description="Level of viewgate's own logs: DEBUG, INFO, WARNING or ERROR."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="`json` writes one JSON object per line (time, level, logger, message, "
        "and view, batch_id, request_id where a record has them).",
    )

    # The change feed (one Kafka topic per view, written by the engine, read by gateways).
    changefeed_prefix: str = Field(
        "viewgate.changes.",
        description="Prefix of the change-feed topics (<prefix><View>), so several "
        "deployments can share a Kafka cluster.",
    )
    changefeed_retention_ms: int = Field(
        7 * 24 * 3600 * 1000,
        description="Retention (retention.ms) of change-feed topics the engine creates: how "
        "far back a subscription can resume. Existing topics keep theirs.",
    )

    # Artifacts.
    cache_dir: Path = Field(
        Path.home() / ".cache" / "viewgate",
        description="Cache for jars resolved from Maven; reused across runs, outside git.",
    )
    maven_repository: str | None = Field(
        None, description="A Maven repository URL to resolve jars from instead of Maven Central."
    )

    # Gateway.
    gateway_host: str = Field("127.0.0.1", description="Address the gateway binds to.")
    gateway_port: int = Field(8000, description="Port the gateway listens on.")
    gateway_max_depth: int = Field(12, description="Deepest selection a query may nest.")
    gateway_max_aliases: int = Field(30, description="Most aliases a query may use.")
    gateway_max_tokens: int = Field(3000, description="Most tokens a query document may have.")
    gateway_max_document_bytes: int = Field(
        50_000, description="Largest query document (bytes) the gateway parses."
    )
    gateway_max_body_bytes: int = Field(
        200_000,
        description="Largest HTTP request body and websocket message (bytes) the gateway "
        "takes: a longer body is refused with 413 before it is read (by its Content-Length, "
        "or as soon as a chunked body passes it), a longer websocket message closes the "
        "connection (1009).",
    )
    gateway_max_fields: int = Field(
        5_000,
        description="Most fields a document may select once its fragments are expanded "
        "(a fragment spread counts its fragment's fields each time): bounds fragment-spread "
        "bombs before any other check walks them.",
    )
    gateway_max_connections: int = Field(
        10_000,
        description="Most connections and requests in flight one gateway process takes "
        "(uvicorn's limit_concurrency); past it, new HTTP requests get 503.",
    )
    gateway_max_page_size: int = Field(
        500, description="Largest `first`/`last` of a list or a to-many relationship."
    )
    gateway_default_page_size: int = Field(
        20, description="Rows a list or to-many relationship returns without `first`/`last`."
    )
    gateway_max_cost: int = Field(
        10_000,
        description="Most rows a query may ask for: page sizes multiplied along nested lists, "
        "summed over the query.",
    )
    gateway_max_candidates: int = Field(
        10_000,
        description="Most index entries a list combining filters on several fields may scan "
        "before filtering; more is refused with an error (narrow the filter).",
    )
    gateway_min_version_wait_ms: int = Field(
        2_000, description="How long a query waits for a requested minimum view version."
    )
    gateway_redis_timeout_s: float = Field(
        1.0, description="Redis connect and read timeout of the gateway; then Delta answers."
    )
    gateway_redis_retry_ms: int = Field(
        1_000, description="After a Redis failure, how long the gateway reads Delta only."
    )
    gateway_meta_cache_ms: int = Field(
        25,
        description="How long a point read reuses the view meta (version, watermark) read "
        "with the last rows; 0 reads it with every request.",
    )
    gateway_dashboard_dir: Path | None = Field(
        None,
        description="Folder of the live dashboard (index.html and dist/dashboard.js) the "
        "gateway serves at /dashboard. Default: the repository's dashboard/, built by "
        "`viewgate setup`.",
    )
    gateway_document_cache_size: int = Field(
        1_000, description="Parsed and validated documents the gateway keeps."
    )

    gateway_ready_max_lag_s: float = Field(
        60.0,
        description="/readyz reports a view not ready when source events have waited for it "
        "longer than this since its last commit.",
    )
    gateway_subscription_buffer: int = Field(
        1_000,
        description="Messages a subscription may have waiting for a slow client; past it the "
        "gateway closes that client's websocket (code 4008, reason says too slow).",
    )
    gateway_subscription_coalesce_ms: int = Field(
        20,
        description="How long a live list waits after a change before evaluating its page "
        "again, so a burst of changes costs one evaluation.",
    )
    gateway_max_subscriptions_per_connection: int = Field(
        1_000, description="Most subscriptions one websocket connection may hold open."
    )
    gateway_keep_alive_s: float = Field(
        15.0,
        description="Interval of the graphql-ws keep-alive ('ka') messages.",
    )

    # Rate limits (gateway.rate_limit, gateway.client_limits); 0 turns each off.
    gateway_rate_limit_per_s: float = Field(
        0.0,
        description="Requests per second each client may send to /graphql over HTTP (a token "
        "bucket in Redis, per bearer token or else per client address); 0 turns it off.",
    )
    gateway_rate_limit_burst: int = Field(
        100, description="Requests a client may send at once before the rate applies."
    )
    gateway_client_address_header: str | None = Field(
        None,
        description="A header set by a trusted proxy naming the client's address (e.g. "
        "X-Forwarded-For; its last address counts); default: the connection's address.",
    )
    # On by default: each keeps one client from taking the gateway from the others (a
    # browser tab holds one websocket with a few subscriptions; the bench turns them off).
    gateway_max_websockets_per_client: int = Field(
        16, description="Most open websocket connections per client in one gateway process; "
        "0 is no limit."
    )
    gateway_max_subscriptions_per_client: int = Field(
        200, description="Most subscriptions per client across its websocket connections, in "
        "one gateway process; 0 is no limit."
    )
    gateway_ws_messages_per_s: float = Field(
        20.0, description="Messages per second one websocket connection may send after its "
        "burst (subscribes, completes, pings); past it the gateway closes the connection "
        "(code 4029). 0 turns it off."
    )
    gateway_ws_opening_lag_ms: float = Field(
        100.0, description="While the gateway's event loop runs later than this (the work "
        "queued ahead of it), new websocket connections wait their turn, in order, instead of "
        "slowing every tab opening with them (viewgate.opening_gate); 0 opens them all at "
        "once."
    )
    gateway_ws_messages_burst: int = Field(
        100, description="Messages a websocket connection may send at once before the rate "
        "applies."
    )

    # Persisted queries (gateway.persisted): Apollo's automatic persisted queries.
    gateway_persisted_only: bool = Field(
        False,
        description="Accept only documents registered by the operator (the manifest or "
        "`viewgate persist`); clients may not register new ones.",
    )
    gateway_persisted_manifest: Path | None = Field(
        None, description="An Apollo persisted-query manifest whose operations the gateway "
        "serves (loaded at start-up)."
    )
    gateway_persisted_cache_size: int = Field(
        10_000, description="Persisted documents the gateway keeps in memory (LRU) in front "
        "of Redis."
    )
    gateway_apq_ttl_s: int = Field(
        7 * 24 * 3600, description="How long Redis keeps a document a client registered "
        "(automatic persisted queries); operator-registered documents do not expire."
    )

    # Authentication and authorization (gateway.tokens, gateway.auth, schema.permissions).
    auth_jwt_secret: SecretStr | None = Field(
        None,
        description="Shared secret of HS256 bearer tokens. Set it in the environment only, "
        "never in a file of the repository.",
    )
    auth_jwks: str | None = Field(
        None,
        description="RS256 public keys: a JWKS file path or an http(s) URL (fetched and "
        "cached, auth_jwks_cache_s); a token's `kid` picks the key.",
    )
    auth_jwks_cache_s: int = Field(
        300, description="How long keys fetched from an auth_jwks URL are reused."
    )
    auth_issuer: str | None = Field(
        None, description="If set, tokens must carry this `iss`."
    )
    auth_audience: str | None = Field(
        None, description="If set, tokens must name this audience in `aud`."
    )
    auth_role_claim: str = Field(
        "role",
        description="Claim (dotted path) holding the token's role, or a list of roles among "
        "which the `x-viewgate-role` header chooses (default: the first).",
    )
    auth_admin_role: str = Field(
        "admin", description="The role that sees every view, row and field."
    )
    auth_anonymous_role: str | None = Field(
        None,
        description="Role of requests without a token. Unset (the default): such requests "
        "get 401 (authentication required). `viewgate up` sets it to the admin role.",
    )
    gateway_introspection: bool = Field(
        True,
        description="Whether introspection queries (__schema, __type) and /schema.graphql "
        "are answered.",
    )

    # The local development stack (`viewgate up`, `viewgate kafka|redis start`).
    local_kafka_port: int = Field(9092, description="Port of the local Kafka broker.")
    local_redis_port: int = Field(6379, description="Port of the local Redis server.")
    demo_rate: float = Field(
        20.0, description="Demo events per second that `viewgate up` produces."
    )
    startup_timeout_s: float = Field(
        90.0, description="Deadline for a local service to become healthy."
    )

    @property
    def delta_location(self) -> str:
        return self.delta_root or str((self.data_dir / "delta").resolve())

    @property
    def checkpoint_location(self) -> str:
        return self.checkpoint_root or str((self.data_dir / "checkpoints").resolve())

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def jar_dir(self) -> Path:
        return self.cache_dir / "jars"

    def spark_jar_paths(self) -> list[str]:
        """The jars handed to Spark through `spark.jars` (local files, no network)."""
        if self.spark_jars:
            return [p.strip() for p in self.spark_jars.split(",") if p.strip()]
        return sorted(str(p) for p in (self.jar_dir / "spark").glob("*.jar"))


@lru_cache
def get_settings() -> Settings:
    return Settings()
