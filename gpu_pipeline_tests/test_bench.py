"""The benchmark: its pandas baseline computes what the pipeline computes, and ``bench`` runs end to
end on a tiny cluster and writes its JSON. No timing is asserted anywhere here."""

import argparse
import contextlib
import datetime as dt
import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from gpu_pipeline.bench import (
    _bare_queries,
    _best_interleaved,
    _fits,
    _RssSampler,
    _targets,
    compare_with_pipeline,
    main_bench,
    write_as_sampler_files,
)
from gpu_pipeline.lib import baseline
from gpu_pipeline.lib.allocation import allocation_for_day, allocation_from_table
from gpu_pipeline.lib.condor_archive import read_window
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, conform
from gpu_pipeline.lib.simulate import SimConfig, simulate
from gpu_pipeline.lib.slots import clean_slot_rows
from gpu_pipeline.lib.states import compute_gpu_states
from gpu_pipeline.lib.store import Store, connect
from gpu_pipeline.lib.timeutil import day_window

TZ = "America/Chicago"
DAYS = ["2025-08-04", "2025-08-05"]
DAY, PREV = DAYS[1], DAYS[0]


# -- the baseline equals the pipeline --------------------------------------------------------------


def _knock_out(table: pa.Table) -> pa.Table:
    """Collector misses and a dropout the simulator may not produce on its own: one lost snapshot
    (its bucket carries the previous one), four in a row (buckets with no snapshot at all), one
    GPU absent from a few snapshots, and two hours written every 15 minutes (a collector's cadence
    changed in the day: each part read at its own)."""
    snaps = sorted(set(table.column("snapshot_utc").to_pylist()))
    lost = {snaps[10], *snaps[100:104], *(t for k, t in enumerate(snaps[30:54]) if k % 3)}
    keep = pc.invert(pc.is_in(table.column("snapshot_utc"), pa.array(sorted(lost), table.schema.field("snapshot_utc").type)))
    gpu = table.column("gpu_id")[0].as_py()
    gone = pa.array(snaps[200:203], table.schema.field("snapshot_utc").type)
    dropout = pc.and_(pc.equal(table.column("gpu_id"), gpu), pc.is_in(table.column("snapshot_utc"), gone))
    return table.filter(pc.and_(keep, pc.invert(dropout)))


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    base = tmp_path_factory.mktemp("bench-pool")
    simulate(base / "sources", SimConfig(start=dt.date.fromisoformat(DAYS[0]), end=dt.date.fromisoformat(DAYS[1]),
                                         gpus=24, seed=5, timezone=TZ, telemetry_interval_s=0))
    store = Store(base / "data")
    for day in DAYS:
        s, e = day_window(day, TZ)
        cleaned = clean_slot_rows(read_window(base / "sources" / "condor", s, e, TZ).table).table
        if day == DAY:
            cleaned = _knock_out(cleaned)
        store.write_partition(CLEAN_SLOT_SNAPSHOTS, day, cleaned)
    start, end = day_window(DAY, TZ)
    con = connect()
    try:
        sql, params = store.relation_sql(CLEAN_SLOT_SNAPSHOTS, [PREV, DAY])
        states = compute_gpu_states(con, sql, params, start, end).to_pandas()
    finally:
        con.close()
    buckets, daily = allocation_for_day(store, DAY, start, end)
    rows = baseline.load_clean_parquet(store.files(CLEAN_SLOT_SNAPSHOTS, [PREV, DAY]))
    b_states = baseline.states_baseline(rows, start, end)
    b_buckets, b_daily = baseline.allocation_baseline(rows, start, end)
    return dict(base=base, start=start, end=end, states=states, buckets=buckets.to_pandas(), daily=daily.to_pandas(),
                b_states=b_states, b_buckets=b_buckets, b_daily=b_daily)


def _nullable(s: pd.Series) -> list:
    return [None if pd.isna(v) else v for v in s.astype(object)]


def test_the_day_exercises_every_path(pool):
    st = pool["states"]
    assert {"busy_prioritized", "busy_shared", "busy_backfill", "idle_prioritized", "idle_shared", "na"} <= set(st["state"])
    assert {"no_snapshot", "dropout"} <= set(st["na_reason"].dropna())
    # carried buckets: covered with a snapshot taken before the bucket started
    assert (st["snapshot_utc"] < st["bucket_start_utc"]).any()
    assert {"priority", "shared", "backfill", "TOTAL"} <= set(pool["buckets"]["tier"])
    assert pool["buckets"]["device_name"].nunique() >= 3


def test_baseline_states_equal_the_pipeline(pool):
    p, b = pool["states"], pool["b_states"]
    assert len(p) == len(b) == p["gpu_id"].nunique() * 288
    # the same order too: host, GPU, bucket
    assert list(zip(p["gpu_id"], p["bucket_start_utc"], strict=True)) == list(zip(b["gpu_id"], b["bucket_start_utc"], strict=True))
    for col in ("host", "device_name", "state", "tier", "slot_name", "slot_state", "global_job_id", "remote_owner",
                "snapshot_utc", "na_reason"):
        assert _nullable(p[col]) == _nullable(b[col]), col
    assert p["n_slot_rows"].tolist() == b["n_slot_rows"].tolist()
    assert np.allclose(p["gpu_usage_pct"].astype(float), b["gpu_usage_pct"].astype(float), equal_nan=True)


def test_baseline_allocation_equals_the_pipeline(pool):
    p, b = pool["buckets"], pool["b_buckets"]
    assert len(p) == len(b) > 0
    for col in ("bucket_start_utc", "tier", "device_name", "claimed_gpus", "total_gpus"):
        assert p[col].tolist() == b[col].tolist(), col
    assert np.allclose(p["allocation_pct"].astype(float), b["allocation_pct"].astype(float), rtol=0, atol=1e-9,
                       equal_nan=True)
    pd_, bd = pool["daily"], pool["b_daily"]
    assert pd_["tier"].tolist() == bd["tier"].tolist() and pd_["device_name"].tolist() == bd["device_name"].tolist()
    for col in ("allocation_pct", "avg_claimed_gpus", "avg_total_gpus"):
        assert np.allclose(pd_[col].astype(float), bd[col].astype(float), rtol=0, atol=1e-9, equal_nan=True), col
    for col in ("buckets", "buckets_with_capacity", "buckets_expected"):
        assert pd_[col].tolist() == bd[col].tolist(), col
    assert compare_with_pipeline(pool["states"], p, pd_, pool["b_states"], b, bd)["equal"]


def test_baseline_states_equal_the_pipeline_at_fifteen_minute_cadence(pool):
    """The pool's snapshots thinned to every third (a 15-minute archive), then one of those lost and
    two in a row lost: the buckets carried (one missed snapshot bridged) and those left no_snapshot
    are the same in the baseline and in the pipeline."""
    store = Store(pool["base"] / "data")
    table = pa.concat_tables([store.read_table(CLEAN_SLOT_SNAPSHOTS, d) for d in (PREV, DAY)])
    snaps = sorted(set(table.column("snapshot_utc").to_pylist()))
    thinned = snaps[::3]
    start_i = next(i for i, t in enumerate(thinned) if t >= pool["start"])
    lost = {thinned[start_i + 20], thinned[start_i + 40], thinned[start_i + 41]}
    kept = [t for t in thinned if t not in lost]
    table = table.filter(pc.is_in(table.column("snapshot_utc"), pa.array(kept, table.schema.field("snapshot_utc").type)))
    con = connect()
    try:
        con.register("rows_15", table)
        p = compute_gpu_states(con, "rows_15", [], pool["start"], pool["end"]).to_pandas()
    finally:
        con.close()
    path = pool["base"] / "rows_15.parquet"
    pq.write_table(table, path)
    b = baseline.states_baseline(baseline.load_clean_parquet([path]), pool["start"], pool["end"])
    for col in ("gpu_id", "bucket_start_utc", "state", "snapshot_utc", "na_reason"):
        assert _nullable(p[col]) == _nullable(b[col]), col
    per_bucket = p.groupby("bucket_start_utc")["na_reason"].agg(lambda r: (r == "no_snapshot").all())
    blank = set(per_bucket.index[per_bucket])
    # 15-minute snapshots: the single loss is bridged (no blank bucket up to the next snapshot); the
    # two in a row are not (blank buckets before the next snapshot)
    assert not any(thinned[start_i + 19] < t < thinned[start_i + 21] for t in blank)
    assert sum(thinned[start_i + 39] < t < thinned[start_i + 42] for t in blank) >= 2


def test_baseline_states_equal_the_pipeline_with_snapshots_written_in_two_parts(pool):
    """Every 15-minute snapshot of the pool split in two parts written 2 s apart, host by host: the
    pipeline's states are those of the snapshots written whole, and the baseline takes the parts as
    one snapshot as the pipeline does (states.SNAPSHOT_PARTS_*)."""
    store = Store(pool["base"] / "data")
    table = pa.concat_tables([store.read_table(CLEAN_SLOT_SNAPSHOTS, d) for d in (PREV, DAY)])
    snaps = sorted(set(table.column("snapshot_utc").to_pylist()))
    whole = table.filter(pc.is_in(table.column("snapshot_utc"),
                                  pa.array(snaps[::3], table.schema.field("snapshot_utc").type)))
    hosts = sorted(set(whole.column("host").to_pylist()))
    later = pc.is_in(whole.column("host"), pa.array(hosts[len(hosts) // 2:]))
    shifted = pc.if_else(later, pc.add(whole.column("snapshot_utc"), pa.scalar(dt.timedelta(seconds=2))),
                         whole.column("snapshot_utc"))
    table = whole.set_column(whole.schema.get_field_index("snapshot_utc"), "snapshot_utc", shifted)
    con = connect()
    try:
        con.register("rows_whole", whole)
        con.register("rows_parts", table)
        p_whole = compute_gpu_states(con, "rows_whole", [], pool["start"], pool["end"]).to_pandas()
        p = compute_gpu_states(con, "rows_parts", [], pool["start"], pool["end"]).to_pandas()
    finally:
        con.close()
    # the states of the snapshots written whole: the same, but the parts' own times
    for col in ("gpu_id", "bucket_start_utc", "state", "na_reason"):
        assert _nullable(p[col]) == _nullable(p_whole[col]), col
    path = pool["base"] / "rows_parts.parquet"
    pq.write_table(table, path)
    b = baseline.states_baseline(baseline.load_clean_parquet([path]), pool["start"], pool["end"])
    for col in ("gpu_id", "bucket_start_utc", "state", "snapshot_utc", "na_reason"):
        assert _nullable(p[col]) == _nullable(b[col]), col


def test_the_tools_loop_nesting_gives_the_same_allocation(pool):
    store = Store(pool["base"] / "data")
    rows = baseline.load_clean_parquet(store.files(CLEAN_SLOT_SNAPSHOTS, [PREV, DAY]))
    buckets, daily = baseline.allocation_baseline(rows, pool["start"], pool["end"], loop_order="tool")
    pd.testing.assert_frame_equal(buckets, pool["b_buckets"])
    pd.testing.assert_frame_equal(daily, pool["b_daily"])


def test_baseline_from_the_sqlite_archive_gives_the_same_states(pool):
    """The tool read the monthly SQLite file with pandas; on the untouched first day that path
    gives the same table as the pipeline's raw -> clean -> states."""
    store = Store(pool["base"] / "data")
    start, end = day_window(PREV, TZ)
    con = connect()
    try:
        sql, params = store.relation_sql(CLEAN_SLOT_SNAPSHOTS, [PREV])
        p = compute_gpu_states(con, sql, params, start, end).to_pandas()
    finally:
        con.close()
    rows = baseline.load_sqlite_window(pool["base"] / "sources" / "condor", start - baseline.LOOKBACK, end, TZ)
    b = baseline.states_baseline(rows, start, end)
    assert len(p) == len(b) > 0
    for col in ("gpu_id", "bucket_start_utc", "state", "tier", "slot_name", "na_reason"):
        assert _nullable(p[col]) == _nullable(b[col]), col


def test_baseline_reproduces_the_original_tools_reference_figures():
    """DESIGN.md 5.2: on the tool's 8-row fixture, Priority 25.0 % (0.5 / 1.5), Shared 75.0 % (1.0 / 1.5);
    GPU-p1 (primary Unclaimed, backfill Claimed) stays in the priority total."""
    day0 = dt.datetime(2025, 8, 6, tzinfo=dt.UTC)

    def row(minute, slot, gpu, state, host, projects=""):
        return dict(snapshot_utc=day0 + dt.timedelta(minutes=minute, seconds=7), host=host, slot_name=f"{slot}@{host}",
                    gpu_id=gpu, tier="backfill" if "backfill" in slot else ("priority" if projects else "shared"),
                    is_backfill_slot="backfill" in slot, slot_state=state, device_name="NVIDIA A100-SXM4-80GB",
                    prioritized_projects=projects, global_job_id="j#1.0#1" if state == "Claimed" else None)

    rows = [
        row(0, "slot1", "GPU-p1", "Unclaimed", "hp", "ProjA"),
        row(0, "backfill2", "GPU-p1", "Unclaimed", "hp", "ProjA"),
        row(0, "slot1_1", "GPU-s1", "Claimed", "hs"),
        row(5, "slot1", "GPU-p1", "Unclaimed", "hp", "ProjA"),
        row(5, "backfill2_1", "GPU-p1", "Claimed", "hp", "ProjA"),
        row(5, "slot1_1", "GPU-p2", "Claimed", "hp", "ProjA"),
        row(5, "slot1_1", "GPU-s1", "Claimed", "hs"),
        row(5, "slot1", "GPU-s2", "Unclaimed", "hs"),
    ]
    end = day0 + dt.timedelta(minutes=10)
    table = conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS)
    _, b_daily = baseline.allocation_baseline(baseline.from_clean(table.to_pandas()), day0, end)
    d = {(r["tier"], r["device_name"]): r for r in b_daily.to_dict("records")}
    assert (d[("priority", "ALL")]["allocation_pct"], d[("priority", "ALL")]["avg_claimed_gpus"],
            d[("priority", "ALL")]["avg_total_gpus"]) == (25.0, 0.5, 1.5)
    assert (d[("shared", "ALL")]["allocation_pct"], d[("shared", "ALL")]["avg_claimed_gpus"],
            d[("shared", "ALL")]["avg_total_gpus"]) == (75.0, 1.0, 1.5)
    assert d[("TOTAL", "ALL")]["allocation_pct"] == 62.5
    p_buckets, p_daily = allocation_from_table(table, day0, end)
    assert p_daily.to_pandas()["allocation_pct"].tolist() == b_daily["allocation_pct"].tolist()
    states = baseline.states_baseline(baseline.from_clean(table.to_pandas()), day0, end)
    second = states[states["bucket_start_utc"] == pd.Timestamp(day0 + dt.timedelta(minutes=5))]
    assert dict(zip(second["gpu_id"], second["state"], strict=True)) == {
        "GPU-p1": "busy_backfill", "GPU-p2": "busy_prioritized", "GPU-s1": "busy_shared", "GPU-s2": "idle_shared"}


# -- the command runs and writes its JSON ------------------------------------------------------------


@pytest.mark.slow
def test_bench_smoke_writes_json(tmp_path, capsys, monkeypatch):
    out = tmp_path / "bench.json"
    monkeypatch.setenv("GPU_PIPELINE_DUCKDB_THREADS", "1")  # the operator's thread count holds for the run
    # 20 GPUs x 144 samples a day at 600 s exceed a budget of 2,000: the run is coarsened to 900 s and
    # the cost at 600 s is measured on a slice of 13 GPUs (13 x 144 <= 2,000)
    args = argparse.Namespace(gpus="20", days=1, out=str(out), work_dir=None, telemetry_interval=600,
                              max_telemetry_samples=2_000, sqlite_rows=20_000, es_docs=300, es_page_size=100,
                              baseline_max_gpus=0, repeats=1, profile=False, compare_zstd=True)
    assert main_bench(args) == 0
    printed = capsys.readouterr().out
    assert "== targets" in printed and str(out) in printed
    result = json.loads(out.read_text())
    assert {"machine", "config", "sizes", "sqlite_archive", "elasticsearch", "linear_fit", "targets", "notes"} <= set(result)
    (size,) = result["sizes"]
    assert (size["gpus"], size["days"], size["telemetry_interval_s"]) == (20, 1, 900)
    p = size["pipeline"]
    est = p["at_requested_telemetry_estimate"]
    sl = est["slice"]
    assert (est["telemetry_interval_s"], sl["gpus"], sl["telemetry_interval_s"]) == (600, 13, 600)
    assert sl["samples"] > 13 * 100 and sl["seconds"] > 0 and sl["per_day_scaled_s"] == pytest.approx(sl["seconds"] * 20 / 13)
    assert sl["one_time_s"] == pytest.approx(max(0.0, sl["first_seconds"] - sl["seconds"]))
    run_tele = p["telemetry_steps_per_day_s"] * size["days"]
    assert est["per_day_s"] == pytest.approx(
        (p["run_wall_s"] + sl["per_day_scaled_s"] * size["days"] + sl["one_time_s"] - run_tele) / size["days"])
    assert p["peak_rss_mib"]["process_tree"] >= p["peak_rss_mib"]["self"] * 0.5 > 0
    assert est["per_day_s"] > est["per_day_excl_plots_s"] > 0
    assert p["success"] is True and p["runs_in_instance"] == 1 and p["step_starts_total"] == p["steps_count"]
    assert p["peak_rss_mib"]["self"] > 0 and p["run_wall_s"] > 0 and p["per_day_s"] > 0
    steps = {s["step"]: s for s in p["steps"]}
    assets = {k: v for s in p["steps"] for k, v in s["assets"].items()}
    for key in ("raw/condor_slot_snapshots", "clean/slot_snapshots", "metrics/gpu_states", "metrics/allocation_buckets",
                "metrics/allocation_daily", "raw/gpu_telemetry", "plots/gpu_timeline_heatmap"):
        assert key in assets, key
    assert assets["metrics/gpu_states"] == 20 * 288
    assert assets["clean/slot_snapshots"] == size["simulation"]["slot_rows"]
    for s in steps.values():
        assert s["status"] == "success" and s["wall_s"] >= 0 and s["step_starts"] == 1
        assert {"wall_per_day_s", "rows_in", "rows_out", "rows_per_s"} <= set(s)
    assert steps["metrics__gpu_states"]["rows_in"] == size["simulation"]["slot_rows"]
    r = size["ratios"]
    assert r["pipeline"]["seconds"] > 0 and r["bare_scan"]["seconds"] > 0 and r["pipeline_vs_bare_scan"]["states"] > 0
    # timed under the run's DuckDB settings, not this process's defaults; the rows they read: the
    # day and the hour before it, of the two days' files
    assert (r["duckdb_threads"], r["duckdb_memory_limit"]) == (1, "953.6 MiB")
    assert 0 < r["input_rows"] <= r["file_rows"]  # (one day: no file of the day before)
    assert "skipped" in r["baseline"]  # --baseline-max-gpus 0: the equality tests above cover the baseline
    assert all(s.get("peak_rss_mib") for s in steps.values())
    # CPU seconds: per step (sampled with the RSS), and the run's, which hold the steps'
    assert all(s["cpu_s"] is not None and s["cpu_s"] >= 0 and s["cores"] >= 0 for s in steps.values())
    assert steps["raw__gpu_telemetry"]["cpu_s"] > 0
    assert p["call_cpu_s"] >= sum(s["cpu_s"] for s in steps.values()) * 0.9 > 0
    assert p["cpu_per_day_s"] == pytest.approx(p["call_cpu_s"] / size["days"])
    assert (p["duckdb_threads"], p["duckdb_memory_limit"]) == (1, "953.6 MiB")  # the run's own DuckDB: 1 GB
    assert "DuckDB 1 thread(s), memory limit 953.6 MiB" in printed
    assert "CPU s/day" in printed and "CPU (user + system, with helpers)" in printed
    sq = result["sqlite_archive"]
    assert sq["archive_rows"] > 0 and sq["day_rows"] > 0 and sq["read_window_s"] > 0 and sq["archive_bytes"] > 0
    assert sq["read_window_indexed_rows"] > 0 and sq["read_window_indexed_s"] > 0
    es = result["elasticsearch"]
    assert es["documents_fetched"] == es["documents_indexed"] == es["total_reported"] == 300 and es["pages"] >= 3
    assert es["docs_per_s"] > 0
    tf = size["telemetry_formats"]
    assert tf["day"] == size["end"] and tf["same_rows"] is True and tf["sampler_files"] > 0
    assert tf["text"]["rows"] == tf["sampler_parquet"]["rows"] == assets["raw/gpu_telemetry"] > 0
    assert tf["text"]["source_bytes"] > tf["sampler_parquet"]["source_bytes"] > 0
    assert tf["text_vs_parquet"] == pytest.approx(tf["text"]["seconds"] / tf["sampler_parquet"]["seconds"])
    # the same files compressed: the same rows, a fraction of the bytes
    assert tf["zstd_text"]["rows"] == tf["text"]["rows"] and 0 < tf["zstd_text"]["source_bytes"] < tf["text"]["source_bytes"] / 5
    assert tf["text_vs_zstd_text"] == pytest.approx(tf["text"]["seconds"] / tf["zstd_text"]["seconds"])
    assert "compressed with zstd" in printed
    assert "raw telemetry step on" in printed
    assert any(t["target"].startswith("one day out of") for t in result["targets"])
    assert result["scratch_dir"] is None  # the scratch data is removed without --work-dir


def test_ratio_timings_run_in_interleaved_rounds_and_keep_each_ones_best():
    calls: list[str] = []
    durations = {"a": iter([0.15, 0.0, 0.08]), "b": iter([0.0, 0.15, 0.08])}

    def fn(name):
        def go():
            calls.append(name)
            import time
            time.sleep(next(durations[name]))
            return name.upper()
        return go

    out = _best_interleaved(3, {"a": fn("a"), "b": fn("b")})
    assert calls == ["a", "b", "a", "b", "a", "b"]  # round by round, not all of a then all of b
    assert [len(out[k][1]) for k in "ab"] == [3, 3] and out["a"][2] == "A"
    assert out["a"][0] == min(out["a"][1]) and out["a"][1].index(out["a"][0]) == 1
    assert out["b"][1].index(out["b"][0]) == 0


def test_profile_without_pyinstrument_is_refused_before_any_work(monkeypatch):
    import importlib.util

    from gpu_pipeline import bench

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyinstrument" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install -e '\.\[profile\]'"):
        bench.BenchConfig(profile=True).validate()
    bench.BenchConfig(profile=False).validate()


@contextlib.contextmanager
def _helper_process(code: str):
    """A child process running ``code``, which prints 1 when it is ready and then waits: once it
    has, the sampler is given time to find it (it walks the process tree every few samples of
    20 ms); the child is killed on leaving."""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"1"
        time.sleep(0.02 * (_RssSampler.CHILDREN_EVERY + 5))
        yield child
    finally:
        child.kill()
        child.wait()


def test_rss_sampler_counts_a_helper_process_started_after_it():
    """The peak RSS is the run process plus its helpers: a child started while sampling, holding
    ~300 MB, is found (the tree is walked every few samples, not every one) and counted."""
    mib = 1 << 20
    with _RssSampler(interval=0.02) as sampler:
        time.sleep(0.1)
        alone = sampler.peak()
        with _helper_process("import sys, time; b = bytearray(300 << 20); print(1, flush=True); time.sleep(30)"):
            with_child = sampler.peak()
    assert alone is not None and with_child is not None
    assert with_child - alone > 250 * mib


def test_rss_sampler_counts_the_cpu_time_of_a_helper_process():
    """A child that keeps a core busy for a while is counted in the CPU seconds of the span it ran
    in (live, before it is waited for), a quiet span next to it hardly at all."""
    with _RssSampler(interval=0.02) as sampler:
        time.sleep(0.1)
        quiet0 = time.time()
        time.sleep(0.4)
        quiet1 = busy0 = time.time()
        with _helper_process("import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"
                             "print(1, flush=True)\ntime.sleep(30)"):
            busy1 = time.time()
    assert sampler.cpu_between(quiet0, quiet1) < 0.2
    assert sampler.cpu_between(busy0, busy1) > 0.7
    assert all(b[1] >= a[1] for a, b in zip(sampler.cpu_samples, sampler.cpu_samples[1:], strict=False))


def test_rss_sampler_keeps_the_cpu_time_of_a_helper_s_own_children():
    """A helper that runs a child of its own and waits for it holds that child's CPU time in its
    own (cutime): the tree's CPU does not drop when the grandchild ends, so what this process
    uses next is still counted."""
    grandchild = "import time\\ne = time.process_time() + 0.8\\nwhile time.process_time() < e: pass"
    code = (f"import subprocess, sys, time\nsubprocess.run([sys.executable, '-c', '{grandchild}'], check=True)\n"
            "print(1, flush=True)\ntime.sleep(30)")
    with _RssSampler(interval=0.02) as sampler, _helper_process(code):
        t0 = time.time()
        end = time.process_time() + 0.6
        while time.process_time() < end:
            pass
        time.sleep(0.1)
        t1 = time.time()
    assert sampler.cpu_between(t0, t1) > 0.4


def test_cpu_seconds_between_two_times_are_interpolated_from_the_samples():
    sampler = _RssSampler(interval=0.05)
    sampler.cpu_samples = [(10.0, 1.0), (10.1, 1.2), (10.2, 1.2), (10.3, 1.5)]
    assert sampler.cpu_at(10.05) == pytest.approx(1.1)
    assert sampler.cpu_between(10.05, 10.25) == pytest.approx(0.25)
    assert sampler.cpu_between(9.0, 11.0) == pytest.approx(0.5)  # outside the samples: the first and last
    assert sampler.cpu_between(10.1, 10.2) == 0.0
    assert _RssSampler().cpu_between(0.0, 1.0) is None


def test_a_step_shorter_than_the_sampling_interval_gets_the_samples_either_side():
    sampler = _RssSampler(interval=0.05)
    sampler.samples = [(10.00, 100), (10.05, 300), (10.10, 200), (10.15, 150)]
    assert sampler.peak_between(10.04, 10.11) == 300  # samples inside: their largest
    assert sampler.peak_between(10.06, 10.09) == 300  # none inside: 300 before, 200 after
    assert sampler.peak_between(10.11, 10.12) == 200
    assert sampler.peak_between(9.0, 9.5) == 100  # only a sample after
    assert sampler.peak_between(11.0, 12.0) == 150  # only a sample before
    assert _RssSampler(interval=0.05).peak_between(0.0, 1.0) is None


def test_a_raw_day_written_as_sampler_files_reads_back_as_the_same_samples(tmp_path):
    """The bench's second source format: the day's raw samples in the NVML sampler's layout (a file
    per host and UTC day, in time order), read back through the raw stream, are the same rows."""
    from gpu_pipeline.lib.samples import RawStream, write_raw_samples
    from gpu_pipeline.lib.schemas import RAW_GPU_TELEMETRY

    day = dt.date.fromisoformat(DAY)
    simulate(tmp_path / "sources", SimConfig(start=day, end=day, gpus=10, seed=3, timezone=TZ,
                                             telemetry_interval_s=300))
    start, end = day_window(day, TZ)
    text_store, files_store = Store(tmp_path / "text"), Store(tmp_path / "files")
    write_raw_samples(text_store, DAY, RawStream(tmp_path / "sources" / "telemetry", start, end, TZ))
    from_text = text_store.read_table(RAW_GPU_TELEMETRY, DAY)
    assert len(set(from_text["host"].to_pylist())) > 1 and from_text.num_rows > 1000

    files = write_as_sampler_files(text_store.partition_file(RAW_GPU_TELEMETRY, DAY), tmp_path / "sampler")
    paths = sorted((tmp_path / "sampler" / "nvml").glob("*/nvml-*.parquet"))
    assert files == len(paths) > 1
    for path in paths:
        t = pq.read_table(path)
        assert set(t["host"].to_pylist()) == {path.parent.name}
        assert set(pc.strftime(t["sample_utc"], format="%Y-%m-%d").to_pylist()) == {path.stem.removeprefix("nvml-")}
        assert t["sample_utc"].to_pylist() == sorted(t["sample_utc"].to_pylist())
        assert t["source_file"].null_count == t.num_rows
    write_raw_samples(files_store, DAY, RawStream(tmp_path / "sampler", start, end, TZ))
    from_files = files_store.read_table(RAW_GPU_TELEMETRY, DAY)
    # the same rows in the same order (the simulator writes no repeated key), but for the source file
    assert from_files.drop_columns(["source_file"]).equals(from_text.drop_columns(["source_file"]))


def test_a_sizes_own_earlier_simulation_counts_as_room_for_it(tmp_path):
    """The room a size's simulation has: the free space and what its folder already holds (an
    earlier run's files, reused or replaced), so a second run does not coarsen the telemetry its
    own first run fitted (free space alone did, once the first run had used the disk)."""
    import shutil

    from gpu_pipeline.bench import choose_telemetry_interval, space_for

    base = tmp_path / "gpus-10-days-1"
    (base / "sources" / "telemetry").mkdir(parents=True)
    (base / "sources" / "telemetry" / "a.prom").write_bytes(b"x" * 300_000)
    (base / "b.txt").write_bytes(b"y" * 5_000)
    held = space_for(base) - shutil.disk_usage(base).free
    assert abs(held - 305_000) < 64_000  # the two files (free space moves a little between the calls)
    # a 1,000-GPU day at 30 s needs about 4.4 GB: 2 GiB free coarsens it, 2 GiB more held does not
    samples_30s = 1000 * 86400 // 30
    assert choose_telemetry_interval(1000, 1, 30, 10 * samples_30s, 2 * 1024**3)[0] > 30
    assert choose_telemetry_interval(1000, 1, 30, 10 * samples_30s, 6 * 1024**3)[0] == 30


def test_the_default_budget_keeps_one_10000_gpu_day_at_30_seconds():
    """The issue's 10,000-GPU target is at 30-second telemetry: one day of it (28.8 million samples)
    is within the default budget where the disk has room; two days are coarsened, and say why."""
    from gpu_pipeline.bench import MAX_TELEMETRY_SAMPLES, choose_telemetry_interval

    assert choose_telemetry_interval(10_000, 1, 30, MAX_TELEMETRY_SAMPLES) == (30, None)
    step, why = choose_telemetry_interval(10_000, 2, 30, MAX_TELEMETRY_SAMPLES)
    assert step == 60 and "57,600,000 samples" in why and "30,000,000" in why
    assert choose_telemetry_interval(10_000, 1, 30, MAX_TELEMETRY_SAMPLES, 20 * 1024**3)[0] == 60  # disk short


# -- what the bench compares and judges --------------------------------------------------------------


def test_the_equality_check_compares_each_states_snapshot_time_and_usage(pool):
    args = (pool["states"], pool["buckets"], pool["daily"])
    assert compare_with_pipeline(*args, pool["b_states"], pool["b_buckets"], pool["b_daily"])["equal"]
    b_states = pool["b_states"].copy()
    b_states.loc[b_states.index[5], "snapshot_utc"] = b_states["snapshot_utc"].iloc[5] - pd.Timedelta(minutes=5)
    b_states.loc[b_states.index[7], "gpu_usage_pct"] = 12.5 if pd.isna(b_states["gpu_usage_pct"].iloc[7]) else np.nan
    res = compare_with_pipeline(*args, b_states, pool["b_buckets"], pool["b_daily"])
    assert (res["state_snapshot_utc_mismatches"], res["state_gpu_usage_pct_mismatches"], res["equal"]) == (1, 1, False)


def test_the_bare_scan_reads_the_states_columns_and_rows_and_ranks_as_design(tmp_path):
    """DESIGN 5.1: another primary state (Drained) outranks an unclaimed backfill slot; the scan reads
    the hour before the window, as the states do for the first bucket's carried snapshot, and every
    column the state SQL reads."""
    from gpu_pipeline.lib.states import STATE_COLUMNS

    start = dt.datetime(2025, 8, 5, 5, tzinfo=dt.UTC)
    end = start + dt.timedelta(days=1)

    def row(minutes, slot, state, backfill):
        return {"snapshot_utc": start + dt.timedelta(minutes=minutes), "gpu_id": "GPU-aaaa0001",
                "slot_name": slot, "host": "h1", "device_name": "NVIDIA A100", "tier": "priority",
                "is_backfill_slot": backfill, "slot_state": state, "global_job_id": None, "remote_owner": None,
                "gpu_usage_pct": None}

    rows = [row(1, "slot1@h1", "Drained", False), row(1, "backfill1@h1", "Unclaimed", True),
            row(-30, "slot1@h1", "Claimed", False), row(-90, "slot1@h1", "Claimed", False)]
    table = conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS)
    pq.write_table(table, tmp_path / "p.parquet")
    con = connect()
    try:
        out = con.sql(_bare_queries([str(tmp_path / "p.parquet")], start, end)["states"],
                      params={"files": [str(tmp_path / "p.parquet")], "start": start, "end": end}).to_arrow_table()
    finally:
        con.close()
    got = {r["b"]: r for r in out.to_pylist()}
    assert sorted(got) == [-6, 0]  # 30 minutes before the window read, 90 minutes before not
    rank, at = divmod(got[0]["winner_key"], 1 << 51)
    assert (rank, at) == (2, int((start + dt.timedelta(minutes=1)).timestamp() * 1e6))  # Drained primary
    assert got[0]["n_slot_state"] == 2 and got[0]["n_global_job_id"] == 0  # every column read, nulls not counted
    assert {f"n_{c}" for c in STATE_COLUMNS} - {"n_gpu_id", "n_snapshot_utc"} <= set(got[0])


def _size(gpus, interval, run_wall, no_tele_wall, days=7, estimate=None):
    tele = run_wall - no_tele_wall
    p = {"success": True, "run_wall_s": run_wall, "per_day_s": run_wall / days,
         "per_day_excl_plots_s": run_wall / days, "peak_rss_mib": {"self": 900.0},
         "steps": [{"wall_s": no_tele_wall, "assets": {"metrics/gpu_states": 1}},
                   {"wall_s": tele, "assets": {"raw/gpu_telemetry": 1}}],
         "runs_in_instance": 1, "step_starts_total": 2, "steps_count": 2, "orchestration_overhead_s": 0.0,
         "launch_overhead_s": 0.0}
    if estimate is not None:
        p["at_requested_telemetry_estimate"] = {"per_day_s": estimate, "per_day_excl_plots_s": estimate - 1,
                                                "telemetry_interval_s": 30, "method": "measured on a slice"}
    return {"gpus": gpus, "days": days, "gpu_days": gpus * days, "telemetry_interval_s": interval, "pipeline": p}


def _judged(sizes, requested=30):
    result = {"config": {"telemetry_interval_s": requested}, "sizes": sizes}
    result["linear_fit"] = _fits(sizes)
    return {t["target"]: t for t in _targets(result)}


def test_a_size_run_at_coarser_telemetry_is_judged_on_its_estimate_and_its_memory_not_at_all():
    # 1,000 GPUs at 60 s: 28 s over 7 days (4 s a day, under the 5 s) but 8 s a day at 30 s (estimate)
    t = _judged([_size(100, 30, 14.0, 10.0), _size(1000, 60, 28.0, 20.0, estimate=9.0)])
    excl = t["1,000 GPUs: every daily asset except plots, wall per day at 30 s telemetry (estimate)"]
    assert (excl["measured"], excl["passed"]) == (8.0, False)
    assert t["1,000 GPUs: with plots, wall per day at 30 s telemetry (estimate)"]["passed"] is False
    rss = t["1,000 GPUs: peak RSS (NOT JUDGED: fewer samples than the target's)"]
    assert (rss["measured"], rss["passed"]) == (900.0, None)
    assert not any(name.startswith("1,000 GPUs: every daily asset except plots, wall per day") and "estimate" not in name
                   for name in t)
    # at the targets' 30 s the run itself is judged
    t = _judged([_size(1000, 30, 28.0, 20.0)])
    assert t["1,000 GPUs: every daily asset except plots, wall per day"]["passed"] is True
    assert t["1,000 GPUs: peak RSS"]["passed"] is True
    # a bench asked for 60-second telemetry, or none, says nothing of the targets at 30 s
    for interval in (60, 0):
        t = _judged([_size(1000, interval, 28.0, 20.0)], requested=interval)
        judged = {name: v["passed"] for name, v in t.items() if name.startswith("1,000 GPUs") and "wall" in name}
        assert len(judged) == 2 and set(judged.values()) == {None}, judged
        assert t["1,000 GPUs: peak RSS (NOT JUDGED: fewer samples than the target's)"]["passed"] is None


def test_the_10000_gpu_extrapolation_is_per_day_of_the_range_and_not_judged_on_a_falling_line():
    sizes = [_size(100, 30, 20.0, 14.0), _size(1000, 30, 60.0, 35.0)]
    fit = _fits(sizes)
    line = fit["steps_excluding_telemetry_s"]
    expected = line["intercept_s"] / 7 + line["slope_s_per_gpu_day"] * 10_000
    assert fit["extrapolated_10000_gpus_per_day_excl_telemetry_s"] == pytest.approx(expected)
    name = "10,000 GPUs: wall per day without the telemetry steps (EXTRAPOLATED, not measured; NOT JUDGED)"
    t = _judged(sizes)[name]  # 3.0 s / 7 + 0.003 s x 10,000 = 30.4 s, without the telemetry: not the target's day
    assert t["measured"] == pytest.approx(expected, abs=1e-3) and t["passed"] is None
    # the larger size faster than the smaller (noise): a falling line says nothing
    t = _judged([_size(100, 30, 20.0, 14.0), _size(1000, 30, 19.0, 13.0)])[name]
    assert t["passed"] is None and "slope" in t["detail"]


def test_linearity_is_judged_on_the_steps_other_than_telemetry_when_cadences_differ():
    # the run walls bend (telemetry at 300 s for the largest), the other steps lie on a line
    sizes = [_size(100, 30, 30.0, 10.0), _size(1000, 30, 210.0, 100.0), _size(10_000, 300, 1100.0, 1000.0)]
    t = _judged(sizes)
    (name,) = [n for n in t if n.startswith("cost linear")]
    assert "steps other than telemetry" in name and t[name]["measured"] == pytest.approx(1.0)
    assert _fits(sizes)["same_telemetry_cadence"] is False
    # the 10,000-GPU size ran coarser without an estimate at 30 s: shown, not judged
    assert t["10,000 GPUs: wall per day (NOT JUDGED: telemetry every 300 s)"]["passed"] is None


def test_timings_beside_the_run_take_the_runs_duckdb_settings_not_the_operators(tmp_path, monkeypatch):
    import os

    from gpu_pipeline.bench import _child_env, _duckdb_settings, run_settings

    monkeypatch.setenv("GPU_PIPELINE_DUCKDB_BLOCK_MEMORY", "0")  # the operator's, which the run does not take
    monkeypatch.setenv("GPU_PIPELINE_DUCKDB_MEMORY_LIMIT", "3GB")
    monkeypatch.delenv("GPU_PIPELINE_DUCKDB_THREADS", raising=False)
    env = _child_env(tmp_path, dt.date(2025, 8, 4), "1GB")
    assert "GPU_PIPELINE_DUCKDB_BLOCK_MEMORY" not in env and env["GPU_PIPELINE_DUCKDB_MEMORY_LIMIT"] == "1GB"
    with run_settings(env):
        assert "GPU_PIPELINE_DUCKDB_BLOCK_MEMORY" not in os.environ
        assert _duckdb_settings()["duckdb_memory_limit"] == "953.6 MiB"
    assert (os.environ["GPU_PIPELINE_DUCKDB_BLOCK_MEMORY"], os.environ["GPU_PIPELINE_DUCKDB_MEMORY_LIMIT"]) == ("0", "3GB")
