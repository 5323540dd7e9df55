"""`viewgate bench`: the typer command (registered by viewgate.cli); imports stay light."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

OutOption = typer.Option(Path("bench"), help="Folder of results.json and the plots.")


def bench(
    quick: bool = typer.Option(False, "--quick", help="Quick mode, the default: under 3 min."),
    full: bool = typer.Option(False, "--full", help="Full mode: longer runs, under 15 min."),
    only: str = typer.Option(
        None, "--only", help="Comma-separated groups to run (default: all): engine, gateway, "
        "subscriptions, storage, browsers."
    ),
    out: Path = OutOption,
    engine_events: int = typer.Option(None, help="Order events per throughput run."),
    engine_batch: int = typer.Option(None, help="Events per batch (maxOffsetsPerTrigger)."),
    freshness_rate: float = typer.Option(None, help="Events/s while measuring freshness."),
    freshness_seconds: float = typer.Option(None, help="How long to produce for freshness."),
    freshness_warmup: float = typer.Option(None, help="Seconds of events not counted first."),
    gateway_events: int = typer.Option(None, help="Demo events the engine writes for the gateway."),
    gateway_seconds: float = typer.Option(None, help="Seconds of each saturation run."),
    gateway_rounds: int = typer.Option(None, help="Interleaved saturation rounds."),
    gateway_latency_seconds: float = typer.Option(None, help="Seconds of each fixed-rate run."),
    fanout: int = typer.Option(None, help="Live subscriptions one change is fanned out to."),
    fanout_connections: int = typer.Option(None, help="Websockets holding them."),
    browser_tabs: int = typer.Option(None, help="Browsers group: tabs (websockets with 3 "
                                     "subscriptions each) one gateway holds."),
    browser_churn_seconds: float = typer.Option(None, help="Browsers group: seconds of churn."),
    browser_workers: int = typer.Option(None, help="Browsers group: uvicorn workers of the "
                                        "gateway (figures of more than one get a _wN suffix)."),
    soak: bool = typer.Option(False, "--soak", help="Instead of the groups: the soak, at "
                              "a share of the measured capacity with subscriptions open, "
                              "into <out>/soak.json and soak.png."),
    minutes: float = typer.Option(10.0, "--minutes", help="How long the soak runs."),
    soak_subscriptions: int = typer.Option(2_000, help="Live subscriptions during the soak."),
    soak_connections: int = typer.Option(200, help="Websockets holding them."),
    soak_rate: float = typer.Option(50.0, help="Demo events per second into the engine "
                                    "during the soak (1000 for the engine's long run)."),
    soak_load: float = typer.Option(0.5, help="Share of the gateway's probed capacity the "
                                    "soak offers (0.1 for the engine's long run, so the "
                                    "gateway leaves the engine its cores)."),
    soak_history: str = typer.Option("", help="Every demo view's `history` during the soak, "
                                      "e.g. '10 minutes' (default: the views' own, a day): "
                                      "a history the soak outlasts shows Delta's storage "
                                      "held at live rows plus the history."),
) -> None:
    """Measure viewgate on this machine: start Kafka and Redis of its own, run each group,
    merge the figures into <out>/results.json, print a table and save PNG plots."""
    from rich.console import Console

    from viewgate.bench.group import BenchError
    from viewgate.bench.runner import run_bench
    from viewgate.bench.workers import WorkerError
    from viewgate.stack.errors import StackError

    console = Console()
    if soak:
        _soak(console, out, minutes, soak_subscriptions, soak_connections, soak_rate,
              soak_load, soak_history)
        return
    if quick and full:
        console.print("[red]error:[/red] choose --quick or --full, not both")
        raise typer.Exit(2)
    overrides = {
        "engine_events": engine_events,
        "engine_batch": engine_batch,
        "freshness_rate": freshness_rate,
        "freshness_s": freshness_seconds,
        "freshness_warmup_s": freshness_warmup,
        "gateway_events": gateway_events,
        "gateway_seconds": gateway_seconds,
        "gateway_rounds": gateway_rounds,
        "gateway_latency_s": gateway_latency_seconds,
        "fanout": fanout,
        "fanout_connections": fanout_connections,
        "browser_tabs": browser_tabs,
        "browser_churn_s": browser_churn_seconds,
        "browser_workers": browser_workers,
    }
    groups = [g.strip() for g in only.split(",") if g.strip()] if only else None
    try:
        run_bench(
            bench_settings(),
            only=groups,
            mode="full" if full else "quick",
            overrides=overrides,
            out_dir=out,
            console=console,
        )
    except (BenchError, StackError, WorkerError) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None


def bench_settings() -> Any:
    """The settings, with anonymous requests given the admin role: the bench's and the
    soak's clients send no tokens."""
    from schema.settings import get_settings

    settings = get_settings()
    return settings.model_copy(update={"auth_anonymous_role": settings.auth_admin_role})


def _soak(console: Any, out: Path, minutes: float, subscriptions: int,
          connections: int, demo_rate: float, load_share: float, history: str) -> None:
    from schema import demo
    from schema.errors import CatalogError
    from viewgate.bench.group import BenchError
    from viewgate.bench.soak import SoakSizes, run_soak, with_history
    from viewgate.bench.workers import WorkerError
    from viewgate.stack.errors import StackError

    if minutes <= 0 or subscriptions < 1 or connections < 1 or demo_rate <= 0:
        console.print("[red]error:[/red] --minutes, --soak-subscriptions, "
                      "--soak-connections and --soak-rate must be positive")
        raise typer.Exit(2)
    if not 0 < load_share <= 1:
        console.print("[red]error:[/red] --soak-load is a share of the capacity: "
                      "more than 0, at most 1")
        raise typer.Exit(2)
    try:
        with_history(demo.CATALOG, history)
    except CatalogError as error:
        console.print(f"[red]error:[/red] --soak-history: {error}")
        raise typer.Exit(2) from None
    sizes = SoakSizes(minutes=minutes, subscriptions=subscriptions, connections=connections,
                      demo_rate=demo_rate, load_share=load_share, history=history)
    try:
        report = run_soak(bench_settings(), sizes, out, console)
    except (BenchError, StackError, WorkerError) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    if not report["passed"]:
        raise typer.Exit(1)
