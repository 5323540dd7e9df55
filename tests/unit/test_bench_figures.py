"""The pure parts of `viewgate bench`: statistics, the results file, the engine group's
arithmetic over Spark progress and over what the freshness watcher saw, the gateway
group's load generator (schedule, HTTP framing) and arithmetic, and the report."""

from __future__ import annotations

import json
import os
import time

import pytest

from viewgate.bench import results
from viewgate.bench.engine import FIGURES, profile, tail_profile, throughput, visibility_ms
from viewgate.bench.gateway import FIGURES as GATEWAY_FIGURES
from viewgate.bench.gateway import list_rate, median_ratio, warnings
from viewgate.bench.group import BenchError
from viewgate.bench.load import (
    answer_ok,
    cpu_seconds,
    cpu_seconds_fine,
    parse_response,
    post_request,
    schedule,
)
from viewgate.bench.report import Figure, Plot, save_plot, table_rows
from viewgate.bench.runner import MODES, select_groups, sizes_for
from viewgate.bench.stats import distribution, percentile


def test_percentile_interpolates_like_numpy_linear():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 0) == 1
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert percentile([3, 1, 2], 50) == 2  # order of the samples does not matter


def test_percentile_rejects_nonsense():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_summarises_samples():
    summary = distribution([10.0, 20.0, 30.0, 40.0])
    assert summary["count"] == 4
    assert summary["mean"] == 25.0
    assert summary["p50"] == 25.0
    assert summary["max"] == 40.0


def test_merge_keeps_groups_not_run_and_drops_stale_keys_of_groups_run():
    previous = {
        "cpu_cores": 8,
        "mode": "full",
        "gateway_rps": 900,
        "engine_events_per_s": 10,
        "engine_old_figure": 1,
        "groups": {
            "gateway": {"mode": "full", "keys": ["gateway_rps"]},
            "engine": {"mode": "full", "keys": ["engine_events_per_s", "engine_old_figure"]},
        },
    }
    meta = {"cpu_cores": 2, "mode": "quick"}
    merged = results.merge(
        previous, meta, {"engine": ({"engine_events_per_s": 25_000}, {"mode": "quick"})}
    )
    assert merged["gateway_rps"] == 900  # another group's figure survives
    assert merged["engine_events_per_s"] == 25_000
    assert "engine_old_figure" not in merged  # the engine group no longer reports it
    assert merged["cpu_cores"] == 2 and merged["mode"] == "quick"
    assert merged["groups"]["gateway"] == previous["groups"]["gateway"]
    assert merged["groups"]["engine"] == {"mode": "quick", "keys": ["engine_events_per_s"]}


def test_results_file_round_trip_and_broken_file(tmp_path):
    path = tmp_path / "bench" / "results.json"
    assert results.load(path) == {}
    results.write(path, {"a": 1})
    assert results.load(path) == {"a": 1}
    path.write_text("{half")
    with pytest.raises(ValueError, match="not valid JSON"):
        results.load(path)


def test_run_meta_names_the_machine_and_versions():
    meta = results.run_meta("quick")
    assert meta["cpu_cores"] >= 1
    assert meta["mode"] == "quick"
    for key in ("python_version", "spark_version", "strawberry_version", "timestamp"):
        assert meta[key]


def _progress(batch_id: int, rows: int, trigger_ms: int, **phases: int) -> dict:
    return {
        "batchId": batch_id,
        "numInputRows": rows,
        "durationMs": {"triggerExecution": trigger_ms, **phases},
    }


def test_throughput_leaves_out_the_warm_up_batch_and_empty_batches():
    progress = [
        _progress(0, 1000, 10_000, addBatch=9_000),  # warm-up
        _progress(1, 2000, 1_000, addBatch=800),
        _progress(2, 0, 5),  # no input: not a batch of work
        _progress(3, 1000, 1_000, addBatch=600),
    ]
    result = throughput(progress)
    assert result["events_per_s"] == pytest.approx(3000 / 2.0)
    assert result["input_events"] == 4000
    assert result["batches"] == 2
    assert result["phase_ms"]["addBatch"] == pytest.approx(700)
    assert result["batch_events_per_s"] == pytest.approx([100, 2000, 1000])


def test_throughput_leaves_out_a_last_batch_of_leftovers():
    progress = [
        _progress(0, 1000, 10_000),
        _progress(1, 1000, 1_000),
        _progress(2, 1000, 1_000),
        _progress(3, 10, 900),  # the remainder: nearly all fixed cost
    ]
    result = throughput(progress)
    assert result["events_per_s"] == pytest.approx(1000)
    assert result["batches"] == 2
    assert result["input_events"] == 3010


def test_a_first_batch_the_driver_fetched_is_counted_from_the_checkpoint(tmp_path):
    """Spark's progress names no start for a query's first batch, and counts no rows of a
    batch the graph's driver fetched itself: its start comes from the checkpoint."""
    from viewgate.bench.engine import with_first_start

    def ends(first: int) -> str:
        return json.dumps({"orders": {"0": first, "1": first - 200}})

    def fetched(batch_id: int, start: str | None, end: str) -> dict:
        return {**_progress(batch_id, 0, 1_000),
                "sources": [{"startOffset": start, "endOffset": end}]}

    progress = [fetched(0, None, ends(1100)), fetched(1, ends(1100), ends(2100)),
                fetched(2, ends(2100), ends(3100))]
    assert throughput(progress)["input_events"] == 4000  # the first batch's 2,000 missed
    (tmp_path / "sources" / "0").mkdir(parents=True)
    # The topic's head was gone: the query started at offsets 100.
    (tmp_path / "sources" / "0" / "0").write_text('\0v1\n{"orders": {"0": 100, "1": 100}}')
    result = throughput(with_first_start(progress, str(tmp_path)))
    assert result["input_events"] == (1000 + 800) + 4000
    assert result["batches"] == 2  # the first is the warm-up, as when Spark read it
    assert with_first_start(progress, str(tmp_path / "none")) == progress


def test_throughput_needs_batches_after_the_warm_up():
    with pytest.raises(BenchError, match="batch"):
        throughput([_progress(0, 1000, 1000)])


def test_profile_splits_the_batch_into_compute_and_commit_steps():
    progress = [_progress(0, 10, 5000, addBatch=4000), _progress(1, 10, 1000, addBatch=900)]
    commits = {1: {"redis_ms": 10.0, "feed_ms": 20.0, "delta_ms": 500.0}}
    out = profile(progress, commits)
    assert out["batches"] == 1
    assert out["triggerExecution_ms"] == 1000
    assert out["compute_ms"] == pytest.approx(370)


def test_tail_profile_names_what_the_slowest_batches_spend_and_the_gaps_between():
    progress = []
    start = 0
    for batch_id in range(21):  # batch 0 is warm-up; batch 7 carries a slow Delta step
        trigger = 2_000 if batch_id == 7 else 500
        progress.append({**_progress(batch_id, 100, trigger, addBatch=trigger - 50),
                         "timestamp": f"2026-11-27T10:00:{start // 1000:02d}.{start % 1000:03d}Z"})
        start += trigger + (300 if batch_id == 12 else 100)  # batch 13 started late
    commits = {i: {"read_ms": 200.0, "delta_ms": 1_500.0 if i == 7 else 100.0}
               for i in range(21)}
    out = tail_profile(progress, commits, share=0.05)
    assert [b["batch_id"] for b in out["slowest_batches"]] == [7]
    assert out["slowest_batches"][0]["delta_ms"] == 1_500
    assert out["slowest"]["delta_ms"] == 1_500
    assert out["slowest"]["read_ms"] == 200
    assert out["trigger_ms"]["max"] == 2_000
    assert out["trigger_ms"]["p50"] == 500
    assert out["gap_ms"]["max"] == 300
    assert out["gap_ms"]["p50"] == 100


def test_visibility_maps_each_event_to_the_first_batch_past_its_offset():
    offsets = {
        0: {"t": {"0": 5, "1": 3}},
        1: {"t": {"0": 9, "1": 3}},
        2: {"t": {"0": 12, "1": 8}},
    }
    seen = [(0, 1000.0), (2, 3000.0)]  # the watcher missed version 1
    deliveries = [
        ("t", 0, 4, 900, True),  # batch 0, seen at 1000
        ("t", 0, 5, 1500, True),  # batch 1, not seen itself: version 2 at 3000
        ("t", 1, 7, 2000, True),  # batch 2
        ("t", 0, 12, 2500, True),  # past every batch: unresolved
    ]
    latencies, unresolved = visibility_ms(deliveries, seen, offsets)
    assert latencies == [100.0, 1500.0, 1000.0]
    assert unresolved == 1


def test_figures_and_verdicts():
    assert Figure("x", "x", at_least=10).verdict(10) == "met"
    assert Figure("x", "x", below=500).verdict(500) == "missed"
    assert Figure("x", "x").verdict(3) == ""
    group = select_groups(["engine"])[0]
    rows = table_rows({"engine_events_per_s": 25_000.0}, [group])
    assert rows == [("engine_events_per_s", "25,000", "events/s", ">= 20,000", "met")]
    assert {f.key for f in FIGURES} >= {
        "engine_events_per_s",
        "engine_noop_events_per_s",
        "engine_freshness_p50_ms",
        "engine_freshness_p99_ms",
    }


def test_groups_and_sizes():
    with pytest.raises(BenchError, match="unknown benchmark group"):
        select_groups(["engine", "nope"])
    assert [g.name for g in select_groups(None)] == ["engine", "gateway", "subscriptions",
                                                     "storage"]
    assert sizes_for("quick", {"engine_events": 10, "engine_batch": None}).engine_events == 10
    assert sizes_for("full").engine_events == MODES["full"].engine_events
    with pytest.raises(BenchError):
        sizes_for("slow")


def test_plots_are_png_files(tmp_path):
    latency = save_plot(Plot("l.png", "latency", {"a": [1.0, 2.0, 3.0], "b": [2.0]}), tmp_path)
    series = save_plot(
        Plot("s.png", "series", {"a": [1.0, 2.0]}, kind="series", ylabel="events/s"), tmp_path
    )
    for path in (latency, series):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(MODES["quick"].__dict__)  # sizes are recorded in results.json


# --- The gateway group: load generator framing, schedule and arithmetic -------------------


def test_open_loop_schedule_is_evenly_spaced_at_the_rate():
    due = schedule(1_000, 2.5)
    assert len(due) == 2_500
    assert due[0] == 0 and due[1] == pytest.approx(0.001)
    assert due[-1] == pytest.approx(2.499)
    assert schedule(3, 1) == pytest.approx([0, 1 / 3, 2 / 3])
    with pytest.raises(ValueError):
        schedule(0, 1)


def test_post_request_and_response_framing():
    body = b'{"query": "{ a }"}'
    request = post_request("127.0.0.1", 8000, "/graphql", body)
    head, _, sent = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /graphql HTTP/1.1\r\n")
    assert f"Content-Length: {len(body)}".encode() in head and sent == body

    first = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\nhello"
    second = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno"
    assert parse_response(first[:20]) is None  # head not complete
    assert parse_response(first[:-1]) is None  # body not complete
    assert parse_response(first + second) == (200, b"hello", len(first))
    assert parse_response(bytearray(second)) == (400, b"no", len(second))
    with pytest.raises(ValueError, match="Content-Length"):
        parse_response(b"HTTP/1.1 200 OK\r\n\r\n")
    with pytest.raises(ValueError, match="chunked"):
        parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")


def test_answers_are_checked_by_status_and_marker_bytes():
    bad = (b'"errors"', b'"customer":null')
    assert answer_ok(200, b'{"data":{"customer":{"name":"Ada"}}}', b'"name"', bad)
    assert not answer_ok(500, b'{"name"}', b'"name"', bad)
    assert not answer_ok(200, b'{"data":{"customer":null}}', b'"name"', bad)
    assert not answer_ok(200, b'{"errors":[],"data":{"name":1}}', b'"name"', bad)


def test_cpu_seconds_of_a_process_from_proc():
    assert cpu_seconds(os.getpid()) > 0


def test_fine_cpu_seconds_see_a_millisecond_of_work():
    # Less than one of utime's 10 ms ticks: the fine figure must still move.
    before = cpu_seconds_fine(os.getpid())
    started = time.thread_time()
    while time.thread_time() - started < 0.002:
        pass
    assert cpu_seconds_fine(os.getpid()) - before >= 0.0015


def test_median_ratio_pairs_rounds_in_order():
    assert median_ratio([80, 90, 300], [100, 100, 100]) == pytest.approx(0.9)
    assert median_ratio([4, 9], [5, 10]) == pytest.approx(0.85)
    with pytest.raises(ValueError):
        median_ratio([1], [])


def test_list_rate_is_a_share_of_saturation_rounded_down_and_capped():
    assert list_rate(76) == 30  # half of 76 is 38: steps of 10
    assert list_rate(30) == 15  # below 20/s: steps of 1
    assert list_rate(1) == 1
    assert list_rate(50_000) == 1_000


def test_gateway_warnings_name_busy_servers_and_busy_generators():
    def run(server: float, generator: float) -> dict:
        return {"watched_cpu": [server, 0.1], "generator_cpu": generator}

    assert warnings({"baseline": [run(0.99, 0.3)], "gateway": [run(1.0, 0.2)]}) == []
    doubts = warnings({"baseline": [run(0.99, 0.3), run(0.7, 0.9)]})
    assert len(doubts) == 2 and all(d.startswith("baseline round 2") for d in doubts)


def test_goals_below_one_keep_their_decimals():
    assert Figure("query_point_ratio", "x", at_least=0.8).goal == ">= 0.80"
    assert Figure("query_point_p99_ms", "x", below=5).goal == "< 5"
    assert {f.key for f in GATEWAY_FIGURES} >= {
        "query_point_rps",
        "query_point_raw_rps",
        "query_point_ratio",
        "query_point_p50_ms",
        "query_point_p99_ms",
        "query_list100_p50_ms",
        "query_list100_p99_ms",
        "query_list100_rate",
        "query_point_stock_rps",
    }
