"""The `viewgate` command."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import typer
from rich.console import Console

from schema.settings import Settings, get_settings
from viewgate.bench.command import bench
from viewgate.stack.errors import StackError

app = typer.Typer(help="viewgate: GraphQL over streaming materialized views.", no_args_is_help=True)
kafka_app = typer.Typer(help="A local single-node Kafka broker (KRaft).", no_args_is_help=True)
redis_app = typer.Typer(help="A local Redis server.", no_args_is_help=True)
app.add_typer(kafka_app, name="kafka")
app.add_typer(redis_app, name="redis")
app.command()(bench)
console = Console()


def _fail(error: Exception) -> None:
    console.print(f"[red]error:[/red] {error}")
    raise typer.Exit(1)


@app.command()
def setup() -> None:
    """Install what is missing: redis-server, and the Kafka/Spark/Delta jars from Maven."""
    from viewgate.stack.install import setup as run_setup

    try:
        run_setup(get_settings(), say=console.print)
    except StackError as error:
        _fail(error)


@app.command()
def up(
    cluster: bool = typer.Option(
        False, "--cluster",
        help="The cluster profile: three Kafka brokers (topics replicated three times), a "
             "Redis Cluster of three masters with a replica each, a Spark standalone master "
             "with two workers, and two gateways."),
) -> None:
    """Run the whole stack in the foreground; Ctrl-C or SIGTERM stops it all."""
    from viewgate.stack.install import setup as run_setup
    from viewgate.stack.local import run_local_stack

    settings = get_settings()
    try:
        run_setup(settings, say=console.print)
        raise typer.Exit(run_local_stack(settings, say=console.print, cluster=cluster))
    except StackError as error:
        _fail(error)


@app.command()
def gateway(
    workers: int = typer.Option(1, "--workers", min=1, help="Gateway processes behind the "
                                "one port (uvicorn workers): each reads the change feed and "
                                "serves its own subscribers."),
) -> None:
    """Serve GraphQL (uvicorn) with the current settings."""
    import uvicorn

    from gateway.access.persisted import ManifestError
    from gateway.app import create_app
    from viewgate.serving import WORKER_HEALTHCHECK_S, uvicorn_options

    settings = get_settings()
    if workers > 1:  # each worker builds its own app from the same settings
        uvicorn.run("gateway.app:create_app", factory=True, workers=workers,
                    host=settings.gateway_host, port=settings.gateway_port,
                    timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
                    **uvicorn_options(settings))
        return
    try:
        app = create_app(settings)
    except ManifestError as error:  # VIEWGATE_GATEWAY_PERSISTED_MANIFEST cannot be used
        _fail(error)
    uvicorn.run(app, host=settings.gateway_host, port=settings.gateway_port,
                **uvicorn_options(settings))


CatalogOption = typer.Option(
    None, "--catalog", help="The catalog as module:attribute (default: schema.demo:CATALOG)."
)


@app.command()
def validate(
    catalog: str = CatalogOption,
    spark: bool = typer.Option(
        True, help="Also analyse each view's SQL with Spark against its GraphQL type."
    ),
) -> None:
    """Check every view declaration; exit 1 naming each view, field and fix."""
    from schema.errors import CatalogError
    from schema.loader import load_catalog

    try:
        loaded = load_catalog(catalog or get_settings().catalog)
        if spark:
            from engine.analysis import analyse
            from engine.spark import build_spark

            session = build_spark(get_settings(), app_name="viewgate-validate")
            warnings: list[str] = []
            try:
                analyse(session, loaded, warnings)
            finally:
                session.stop()
            for warning in warnings:
                console.print(f"[yellow]warning:[/yellow] {warning}")
    except CatalogError as error:
        console.print(f"[red]invalid catalog[/red]\n{error}")
        raise typer.Exit(1) from None
    console.print(f"ok: {len(loaded.views)} views ({', '.join(loaded.views)})")


@app.command()
def engine(catalog: str = CatalogOption) -> None:
    """Run the Spark engine (the graph query of the views over topics' latest rows and of
    views over views, a query per streaming aggregate) until SIGTERM or Ctrl-C."""
    from engine.errors import GraphChanged
    from engine.main import run_engine
    from schema.errors import CatalogError
    from schema.loader import load_catalog

    try:
        settings = get_settings()
        run_engine(settings, load_catalog(catalog or settings.catalog), say=console.print)
    except CatalogError as error:
        console.print(f"[red]invalid catalog[/red]\n{error}")
        raise typer.Exit(1) from None
    except GraphChanged as error:
        console.print(f"[red]cannot start the graph query[/red]: {error}")
        raise typer.Exit(1) from None


@app.command()
def status(
    catalog: str = CatalogOption,
    watch: bool = typer.Option(False, "--watch", help="Refresh until Ctrl-C."),
    interval: float = typer.Option(1.0, help="Seconds between refreshes with --watch."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every view's generation, version, last commit, watermark, lag behind its source
    topic, input and processing rates, batch time, late and dead-lettered events, and the
    last error of its query."""
    import json
    import time

    import redis
    from rich.live import Live

    from schema.loader import load_catalog
    from viewgate.status import collect, render

    settings = get_settings()
    loaded = load_catalog(catalog or settings.catalog)
    try:
        if as_json:
            print(json.dumps([r.as_dict() for r in collect(settings, loaded)], indent=2))
        elif not watch:
            console.print(render(collect(settings, loaded)))
        else:
            with Live(render(collect(settings, loaded)), console=console) as live:
                while True:
                    time.sleep(interval)  # a refresh period, not a wait for a condition
                    live.update(render(collect(settings, loaded)))
    except redis.RedisError as error:
        _fail(RuntimeError(f"Redis at {settings.redis_url} did not answer: {error}"))
    except KeyboardInterrupt:
        pass


@app.command()
def rebuild(
    view: str = typer.Argument(..., help="The view to recompute, e.g. CustomerStats."),
    catalog: str = CatalogOption,
) -> None:
    """Recompute VIEW from the earliest retained offset into a new generation beside the
    live one, then switch readers over atomically. A running engine follows the switch."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from engine.rebuild import RebuildError, rebuild_view
    from engine.spark import build_spark
    from schema.errors import CatalogError
    from schema.loader import load_catalog

    settings = get_settings()
    try:
        loaded = load_catalog(catalog or settings.catalog)
    except CatalogError as error:
        console.print(f"[red]invalid catalog[/red]\n{error}")
        raise typer.Exit(1) from None
    if view not in loaded.views:
        _fail(RebuildError(f"no view {view}; the catalog has {', '.join(loaded.views)}"))
    spark = build_spark(settings, app_name=f"viewgate-rebuild-{view}")
    columns = (
        "{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        "offsets",
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console) as bar:
            task = bar.add_task(f"rebuilding {view}", total=None)

            def show(progress) -> None:
                bar.update(
                    task,
                    completed=progress.done,
                    total=progress.total,
                    description=f"rebuilding {view} into g{progress.generation}",
                )

            result = rebuild_view(spark, settings, loaded, view, on_progress=show)
    except (RebuildError, CatalogError) as error:
        _fail(error)
    finally:
        spark.stop()
    console.print(
        f"{result.view}: generation {result.new_generation} now serves "
        f"(was {result.old_generation}); {result.offsets} offsets in {result.seconds:.1f} s"
    )


@app.command()
def produce(
    rate: float = typer.Option(50.0, help="Events per second."),
    seed: int = typer.Option(0, help="Seed of the deterministic event sequence."),
    count: int = typer.Option(None, help="Stop after this many events."),
    duration: float = typer.Option(None, help="Stop after this many seconds."),
) -> None:
    """Write realistic demo shop events (orders, customers, updates, deletes, late events)."""
    from viewgate.demo_events import produce as produce_events

    # Ctrl-C or SIGTERM stops producing; what was sent is delivered and counted first.
    stop, stopped_by = threading.Event(), []

    def on_signal(number: int, _frame: object) -> None:
        stopped_by.append(signal.Signals(number))
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    sent = produce_events(get_settings().kafka_bootstrap, rate=rate, seed=seed, count=count,
                          duration=duration, stop=stop)
    if stopped_by:
        console.print(f"produced {sent} events (stopped by {stopped_by[0].name})")
        raise typer.Exit(128 + stopped_by[0].value)
    console.print(f"produced {sent} events")


@app.command()
def persist(
    manifest: str = typer.Argument(..., help="An Apollo persisted-query manifest (JSON)."),
) -> None:
    """Register a manifest's documents in Redis, for persisted queries (and the only ones
    run in persisted-only mode); every gateway on that Redis serves them by hash."""
    from redis.exceptions import RedisError

    from gateway.access.persisted import ManifestError, load_manifest, store_documents

    try:
        documents = load_manifest(Path(manifest))
        store_documents(get_settings().redis_url, documents)
    except (ManifestError, RedisError) as error:
        _fail(error)
    console.print(f"registered {len(documents)} persisted documents from {manifest}")


@app.command("spark")
def spark_daemon(
    role: str = typer.Argument(..., help="master or worker"),
    master: str = typer.Option("spark://spark-master:7077",
                               help="The master a worker registers with."),
    port: int = typer.Option(7077, help="The master's port."),
    cores: int = typer.Option(None, help="Cores a worker offers (default: all)."),
    memory: str = typer.Option(None, help="Memory a worker offers, e.g. 2g."),
) -> None:
    """Run a Spark standalone master or worker in the foreground, from the Spark that the
    pyspark package ships (the engine's own Spark): the cluster profile's daemons."""
    from viewgate.stack.spark_standalone import spark_home

    main = {"master": "org.apache.spark.deploy.master.Master",
            "worker": "org.apache.spark.deploy.worker.Worker"}.get(role)
    if main is None:
        _fail(ValueError(f"role must be master or worker, not {role!r}"))
    args = ["--port", str(port)] if role == "master" else [master]
    args += ["--cores", str(cores)] if cores and role == "worker" else []
    args += ["--memory", memory] if memory and role == "worker" else []
    spark_class = str(spark_home() / "bin" / "spark-class")
    os.environ.setdefault("SPARK_HOME", str(spark_home()))
    os.execv(spark_class, [spark_class, main, *args])  # signals reach the JVM itself


def _service_dir(settings: Settings, name: str, data_dir: Path | None) -> Path:
    return (data_dir or settings.data_dir / name).resolve()


DataDir = typer.Option(None, help="Data folder (default: <VIEWGATE_DATA_DIR>/<service>).")


@kafka_app.command("start")
def kafka_start(port: int = typer.Option(None), data_dir: Path = DataDir) -> None:
    """Start the broker in the background; its storage is formatted on first start."""
    from viewgate.stack.kafka import KafkaBroker

    settings = get_settings()
    broker = KafkaBroker(
        _service_dir(settings, "kafka", data_dir),
        port or settings.local_kafka_port,
        settings.jar_dir / "kafka",
    )
    try:
        broker.start(timeout_s=settings.startup_timeout_s, die_with_parent=False)
    except StackError as error:
        _fail(error)
    console.print(
        f"kafka running at {broker.bootstrap}, pid {broker.process.pid}, log {broker.log_path}"
    )


@redis_app.command("start")
def redis_start(port: int = typer.Option(None), data_dir: Path = DataDir) -> None:
    """Start Redis in the background."""
    from viewgate.stack.redis_server import RedisServer

    settings = get_settings()
    server = RedisServer(
        _service_dir(settings, "redis", data_dir), port or settings.local_redis_port
    )
    try:
        server.start(timeout_s=settings.startup_timeout_s, die_with_parent=False)
    except StackError as error:
        _fail(error)
    console.print(f"redis running at {server.url}, pid {server.process.pid}, log {server.log_path}")


def _stop_from_pid_file(name: str, pid_path: Path) -> None:
    from viewgate.stack.local import pid_file_process
    from viewgate.stack.process import pid_alive, stop_pid

    pid = pid_file_process(pid_path)
    if pid is None or not pid_alive(pid):
        console.print(f"{name} is not running (no live pid in {pid_path})")
        pid_path.unlink(missing_ok=True)
        return
    stop_pid(pid, timeout_s=30)
    pid_path.unlink(missing_ok=True)
    console.print(f"{name} (pid {pid}) stopped")


@kafka_app.command("stop")
def kafka_stop(data_dir: Path = DataDir) -> None:
    """Stop the broker started by `viewgate kafka start` (by its pid file)."""
    _stop_from_pid_file("kafka", _service_dir(get_settings(), "kafka", data_dir) / "kafka.pid")


@redis_app.command("stop")
def redis_stop(data_dir: Path = DataDir) -> None:
    """Stop the Redis started by `viewgate redis start` (by its pid file)."""
    _stop_from_pid_file("redis", _service_dir(get_settings(), "redis", data_dir) / "redis.pid")


@kafka_app.command("status")
def kafka_status(port: int = typer.Option(None)) -> None:
    """Health check: does a broker answer a metadata request? Exit code 1 if not."""
    from viewgate.stack.kafka import broker_healthy

    bootstrap = f"127.0.0.1:{port}" if port else get_settings().kafka_bootstrap
    healthy = broker_healthy(bootstrap)
    console.print(f"kafka {bootstrap}: {'healthy' if healthy else 'not reachable'}")
    raise typer.Exit(0 if healthy else 1)


@redis_app.command("status")
def redis_status(port: int = typer.Option(None)) -> None:
    """Health check: does Redis answer PING? Exit code 1 if not."""
    from viewgate.stack.redis_server import redis_healthy

    url = f"redis://127.0.0.1:{port}/0" if port else get_settings().redis_url
    healthy = redis_healthy(url)
    console.print(f"redis {url}: {'healthy' if healthy else 'not reachable'}")
    raise typer.Exit(0 if healthy else 1)
