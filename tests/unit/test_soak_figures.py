"""The soak's figures: memory growth between windows, latency over time, the verdict."""

from __future__ import annotations

import pytest

from viewgate.bench.soak import growth_window, latency_over_time, memory_growth, verdict


def test_growth_compares_the_last_window_with_the_one_after_the_warm_up():
    # 10 minutes sampled every 5 s: 60 s windows. The warm-up (0-60 s) is left out.
    samples = [(t, 500.0 if t < 60 else 100.0 if t < 540 else 105.0) for t in range(0, 600, 5)]
    growth = memory_growth(samples, 600)
    assert growth == {"window_s": 60, "baseline_kb": 100.0, "final_kb": 105.0, "growth": 0.05}


def test_short_runs_use_a_quarter_of_the_run_and_need_samples_in_both_windows():
    assert growth_window(60) == 15
    assert growth_window(3600) == 60
    assert memory_growth([(t, 100.0) for t in range(0, 60, 5)], 60)["growth"] == 0
    assert memory_growth([(0, 100.0), (59, 120.0)], 60) is None


def test_latency_over_time_buckets_by_when_requests_were_due():
    # 10 requests/s for 3 s, 1 s buckets: the second second is slow.
    latency = [1.0] * 10 + [50.0] * 10 + [2.0] * 10
    buckets = latency_over_time(latency, rate=10, bucket_s=1)
    assert [b["t_s"] for b in buckets] == [0, 1, 2]
    assert [b["p50_ms"] for b in buckets] == [1.0, 50.0, 2.0]


@pytest.mark.parametrize(("errors", "growth", "problems"), [
    ({"http_wrong_answers": 0}, {"growth": 0.02}, []),
    ({"http_wrong_answers": 3, "websocket_closes": 0}, {"growth": 0.0}, ["3 http_wrong_answers"]),
    ({}, {"growth": 0.10}, ["gateway memory grew 10.0% (limit 10%)"]),
    ({}, None, ["too few memory samples to measure growth"]),
])
def test_the_verdict_names_every_problem(errors, growth, problems):
    assert verdict(errors, growth) == problems


def test_engine_flatness_compares_the_start_with_the_end():
    from viewgate.bench.engine_storage import flatness

    def held(bytes_per_row: float, checkpoint: float) -> dict[str, float]:
        return {"delta_bytes_per_row": bytes_per_row, "checkpoint_bytes": checkpoint,
                "redis_bytes_per_row": 100.0, "batch_ms": 0}

    samples = [(float(t), held(50.0 if t < 60 else 70.0, 1000.0 + t)) for t in range(0, 100)]
    out = flatness(samples, duration_s=100, window_s=20)
    assert out["delta_bytes_per_row"] == {"start": 50.0, "end": 70.0, "change": 0.4,
                                          "flat": False}
    assert out["checkpoint_bytes"]["flat"] is True
    assert out["redis_bytes_per_row"]["change"] == 0.0
    assert out["batch_ms"]["flat"] is None  # no batch time recorded: not judged
    assert out["delta_live_data_bytes_per_row"]["flat"] is None  # not sampled: not judged


def test_settled_figures_start_once_the_history_has_filled_and_span_a_vacuum():
    from viewgate.bench.soak import settled, settled_window

    # 10 minutes of history, maintenance every 10: settled from minute 20, 10-minute windows.
    assert settled_window("10 minutes", 600, 3600) == (1200, 600)
    assert settled_window("", 600, 3600) is None  # the views' own day never settles
    assert settled_window("1 day", 600, 3600) is None
    assert settled_window("10 minutes", 600, 2000) is None  # no room for two windows
    assert settled_window("10 minutes", 0, 3600) is None  # no maintenance: nothing vacuumed

    def sawtooth(t: float) -> float:  # fills for 20 minutes, then rises and falls each 10
        return t / 6 if t < 1200 else 100 + (t % 600) / 6

    held = [(float(t), {"delta_bytes_per_row": sawtooth(t)}) for t in range(0, 3600, 10)]
    driver = [(float(t), {"rss_kb": 100.0 + (t > 1800) * 30}) for t in range(0, 3600, 10)]
    rss = {"gateway": [(float(t), 200) for t in range(0, 3600, 10)]}
    out = settled((1200, 600), 3600, held, driver, ["rss_kb"], rss)
    assert out is not None and (out["from_s"], out["window_s"]) == (1200, 600)
    # Both windows hold one whole rise and fall: the same median, whatever their phase.
    assert out["engine"]["delta_bytes_per_row"]["change"] == 0.0
    assert out["engine_driver_memory"]["rss_kb"] == {"start": 100.0, "end": 130.0,
                                                    "change": 0.3, "flat": False}
    assert out["rss_kb"]["gateway"]["flat"] is True
    assert settled(None, 3600, held, driver, ["rss_kb"], rss) is None


def test_bytes_on_disk_count_files_and_skip_one_renamed_while_listed(tmp_path, monkeypatch):
    from pathlib import Path

    from viewgate.bench import engine_storage

    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "1").write_bytes(b"x" * 10)
    (tmp_path / "offsets").write_bytes(b"y" * 5)
    # Listed and seen as a file, then renamed by Spark before its size was read.
    gone = tmp_path / "commits" / ".2.tmp"
    listed = [*tmp_path.rglob("*"), gone]
    monkeypatch.setattr(Path, "rglob", lambda self, pattern: iter(listed))
    monkeypatch.setattr(Path, "is_file", lambda self: self.name != "commits")
    assert engine_storage._bytes_under(str(tmp_path)) == 15


def test_delta_bytes_are_told_apart_by_kind(tmp_path):
    from viewgate.bench import engine_storage

    table = tmp_path / "Order" / "g0"
    (table / "_delta_log").mkdir(parents=True)
    (table / "_change_data").mkdir()
    (table / "_delta_log" / "00000000000000000000.json").write_bytes(b"l" * 3)
    (table / "_change_data" / "cdc-1.parquet").write_bytes(b"c" * 5)
    (table / "deletion_vector_1.bin").write_bytes(b"v" * 7)
    (table / "part-1.parquet").write_bytes(b"d" * 11)
    assert engine_storage._bytes_by_kind(str(tmp_path)) == {
        "log": 3, "change_data": 5, "vectors": 7, "data": 11}
    assert engine_storage._bytes_under(f"file://{tmp_path}") == 26


def test_graph_step_means_come_from_the_histograms_totals():
    from viewgate.bench.engine_storage import graph_steps

    # (t, {step: (seconds so far, batches so far)}): `batch` takes 100 ms a batch at first,
    # 300 ms at the end; `read` appears late.
    totals = [
        (0.0, {"batch": (0.0, 0)}),
        (10.0, {"batch": (1.0, 10)}),
        (20.0, {"batch": (2.0, 20)}),
        (80.0, {"batch": (9.0, 50)}),
        (90.0, {"batch": (12.0, 60), "read": (0.5, 10)}),
        (100.0, {"batch": (15.0, 70), "read": (1.0, 20)}),
    ]
    steps = graph_steps(totals, duration_s=100.0, window_s=10.0)
    assert steps["batch"] == {"start_ms": 100.0, "end_ms": 300.0, "change": 2.0}
    assert steps["read"] == {"start_ms": None, "end_ms": 50.0, "change": None}
    assert graph_steps([], 100.0, 10.0) == {}



def test_batch_time_per_changed_row_follows_the_rows_a_batch_changes():
    from viewgate.bench.engine_storage import per_changed_row

    # 10 batches a window. At first 100 ms and 200 rows a batch; at the end 300 ms and
    # 600 rows: three times the work, the same 500 ms per thousand rows.
    totals = [(0.0, {"batch": (0.0, 0)}), (10.0, {"batch": (1.0, 10)}),
              (20.0, {"batch": (2.0, 20)}), (90.0, {"batch": (9.0, 60)}),
              (100.0, {"batch": (12.0, 70)})]
    changed = [(0.0, 0), (10.0, 2_000), (20.0, 4_000), (90.0, 20_000), (100.0, 26_000)]
    out = per_changed_row(totals, changed, duration_s=100.0, window_s=10.0)
    assert out["rows_per_batch"] == {"start": 200.0, "end": 600.0, "change": 2.0,
                                     "flat": False}
    assert out["batch_ms_per_1000_rows"] == {"start": 500.0, "end": 500.0, "change": 0.0,
                                             "flat": True}
    assert per_changed_row([], [], 100.0, 10.0)["rows_per_batch"]["start"] is None


def test_maintenance_runs_and_the_slow_batches_they_explain():
    from viewgate.bench.engine_storage import maintenance_runs, slowest_batches

    # Order's maintenance ends between 10 and 20 s (2.5 s), Customer's two compactions
    # between 20 and 30 s (0.4 s together).
    maintained = [(0.0, {}), (10.0, {"Order": (0.0, 0)}), (20.0, {"Order": (2.5, 1)}),
                  (30.0, {"Order": (2.5, 1), "Customer": (0.4, 2)})]
    runs = maintenance_runs(maintained)
    assert runs == [{"t_s": 20.0, "view": "Order", "runs": 1, "seconds": 2.5},
                    {"t_s": 30.0, "view": "Customer", "runs": 2, "seconds": 0.4}]
    # Batches: 100 ms, then 1,000 ms while Order was maintained, then 200 ms.
    # The slow one spent 800 ms a batch in `delta`.
    steps = [(0.0, {"batch": (0.0, 0), "delta": (0.0, 0)}),
             (10.0, {"batch": (1.0, 10), "delta": (0.5, 10)}),
             (20.0, {"batch": (6.0, 15), "delta": (4.5, 15)}),
             (30.0, {"batch": (8.0, 25), "delta": (5.0, 25), "read": (1.0, 10)})]
    assert slowest_batches(steps, runs, count=2) == [
        {"t_s": 20.0, "batch_ms": 1000.0, "maintenance": ["Order"],
         "steps_ms": {"delta": 800.0}},
        {"t_s": 30.0, "batch_ms": 200.0, "maintenance": ["Customer"],
         "steps_ms": {"read": 100.0, "delta": 50.0}}]
    assert maintenance_runs([]) == [] and slowest_batches([], []) == []
