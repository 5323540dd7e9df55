"""The results table (rich) and the plots (matplotlib, PNG)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from viewgate.bench.stats import percentile

META_KEYS = ("cpu_cores", "python_version", "spark_version", "strawberry_version", "mode")


@dataclass(frozen=True)
class Figure:
    """One figure a group reports, as the table shows it."""

    key: str
    label: str
    unit: str = ""
    at_least: float | None = None  # goal: value >= at_least
    below: float | None = None  # goal: value < below

    @property
    def goal(self) -> str:
        if self.at_least is not None:
            return f">= {format_value(self.at_least)}"
        if self.below is not None:
            return f"< {format_value(self.below)}"
        return ""

    def verdict(self, value: Any) -> str:
        if not isinstance(value, int | float) or not self.goal:
            return ""
        if self.at_least is not None:
            return "met" if value >= self.at_least else "missed"
        return "met" if value < self.below else "missed"


@dataclass
class Plot:
    """A plot to save as <out>/<filename>: latency distributions ('latency': histogram of
    the first series and the CDF of every series) or per-item series ('series')."""

    filename: str
    title: str
    series: dict[str, list[float]]
    kind: str = "latency"
    xlabel: str = "ms"
    ylabel: str = ""
    notes: list[str] = field(default_factory=list)


def format_value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


class Reported(Protocol):
    """What the table needs of a group (viewgate.bench.group.Group, which imports this
    module for Figure and Plot): the figures it reports."""

    @property
    def figures(self) -> tuple[Figure, ...]: ...


def table_rows(merged: Mapping[str, Any], groups: Sequence[Reported]) -> list[tuple[str, ...]]:
    """(figure, value, unit, goal, verdict) for each figure of the groups just run."""
    rows = []
    for group in groups:
        for fig in group.figures:
            if fig.key in merged:
                value = merged[fig.key]
                rows.append((fig.key, format_value(value), fig.unit, fig.goal, fig.verdict(value)))
    return rows


def print_table(console: Any, merged: Mapping[str, Any], groups: Sequence[Reported]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="viewgate bench")
    for column in ("figure", "value", "unit", "goal", ""):
        table.add_column(column, justify="right" if column == "value" else "left")
    for row in table_rows(merged, groups):
        style = {"met": "green", "missed": "red"}.get(row[-1])
        table.add_row(*row, style=style)
    console.print(table)
    console.print(", ".join(f"{k}={merged[k]}" for k in META_KEYS if k in merged))


def save_plot(plot: Plot, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / plot.filename
    series = {k: v for k, v in plot.series.items() if v}
    if plot.kind == "latency":
        fig, (hist, cdf) = plt.subplots(1, 2, figsize=(12, 4.5))
        name, first = next(iter(series.items()))
        hist.hist(first, bins=60, color="tab:blue", alpha=0.8)
        for q, style in ((50, "--"), (99, ":")):
            hist.axvline(percentile(first, q), color="black", linestyle=style, label=f"p{q}")
        hist.set_title(f"{name}: {len(first):,} samples")
        hist.set_xlabel(plot.xlabel)
        hist.set_ylabel("samples")
        hist.legend()
        for label, values in series.items():
            ordered = sorted(values)
            fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
            cdf.plot(ordered, fractions, label=f"{label} (n={len(ordered):,})")
        cdf.set_xlabel(plot.xlabel)
        cdf.set_ylabel("fraction of samples at or below")
        cdf.grid(True, alpha=0.3)
        cdf.legend(fontsize="small")
    else:
        fig, axis = plt.subplots(figsize=(10, 4.5))
        for label, values in series.items():
            axis.plot(range(1, len(values) + 1), values, marker="o", label=label)
        axis.set_xlabel(plot.xlabel)
        axis.set_ylabel(plot.ylabel)
        axis.grid(True, alpha=0.3)
        axis.legend()
    fig.suptitle(plot.title + ("\n" + "; ".join(plot.notes) if plot.notes else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
