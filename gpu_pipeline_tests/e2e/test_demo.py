"""The README's first command, end to end: `gpu-pipeline demo` on a fresh directory."""

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from gpu_pipeline.cli import demo_days
from gpu_pipeline_tests.truth import state_agreement

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_PIPELINE_", "DAGSTER_"))}
    exe = Path(sys.executable).with_name("gpu-pipeline")
    proc = subprocess.run([str(exe), "demo", "--dir", str(base)], env=env, cwd=base,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu-pipeline ui --dir" in proc.stdout
    return base


def test_demo_writes_seven_days_of_every_table_and_heatmap(demo):
    start, end = demo_days()
    days = [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]
    assert len(days) == 7
    for table in ("raw/condor_slot_snapshots", "clean/slot_snapshots", "quarantine/slot_snapshots",
                  "metrics/gpu_states"):
        found = sorted(p.name for p in (demo / "data" / table).glob("date=*") if (p / "part-0.parquet").is_file())
        assert found == [f"date={d}" for d in days], table
    for d in days:
        png = demo / "data" / "plots" / "gpu_timeline_heatmap" / f"date={d}" / "gpu_timeline_heatmap.png"
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_states_agree_with_ground_truth(demo):
    total, agree, confusion = state_agreement(demo / "data", demo / "sources" / "truth")
    share = agree / total
    print(f"state agreement {agree}/{total} = {share:.4%}; confusion {confusion}")
    assert total == 80 * 288 * 7  # every GPU, every 5-minute bucket, every day
    assert share >= 0.99
    # At the instant each state was observed, the inference is exact: the residual disagreement
    # above is state changes between a bucket's start and its snapshot (0.5-25 s later).
    total_at, agree_at, confusion_at = state_agreement(demo / "data", demo / "sources" / "truth", at_snapshot=True)
    assert agree_at == total_at, confusion_at


def test_gpu_hours_are_conserved_per_day(demo):
    con = duckdb.connect()
    rows = con.sql(
        "SELECT date, count(DISTINCT gpu_id) g, count(*) n FROM read_parquet(?, hive_partitioning=true) GROUP BY 1",
        params=[str(demo / "data" / "metrics" / "gpu_states" / "*" / "*.parquet")],
    ).fetchall()
    assert len(rows) == 7 and all(n == g * 288 for _, g, n in rows)


def test_the_run_is_recorded_in_the_persistent_instance(demo):
    import dagster as dg

    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(demo / "dagster_home")
    try:
        with dg.DagsterInstance.get() as instance:
            records = instance.get_run_records()
            assert len(records) == 1 and records[0].dagster_run.status == dg.DagsterRunStatus.SUCCESS
            mats = instance.fetch_materializations(dg.AssetKey(["plots", "gpu_timeline_heatmap"]), limit=20)
            assert len(mats.records) == 7

            def by_day(*key: str) -> dict[str, dict]:
                recs = instance.fetch_materializations(dg.AssetKey(list(key)), limit=20).records
                return {r.partition_key: r.asset_materialization.metadata for r in recs}

            # a day with nothing to clean is copied on the raw step's word, and the coverage metric
            # finds the raw step's measure of the same bytes: the figures are the same either way
            clean, raw, cov = by_day("clean", "gpu_samples"), by_day("raw", "gpu_telemetry"), by_day("metrics", "coverage")
            assert len(clean) == len(raw) == len(cov) == 7
            for day, md in clean.items():
                nothing_to_clean = md["duplicate_rows_dropped"].value == md["rows_quarantined"].value == 0
                assert md["checked_when_raw_was_written"].value is nothing_to_clean
                assert cov[day]["gpu_telemetry_coverage_pct"].value == raw[day]["telemetry_coverage_pct"].value
            assert any(md["checked_when_raw_was_written"].value for md in clean.values())
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = old


def test_sql_command_queries_the_catalog(demo):
    exe = Path(sys.executable).with_name("gpu-pipeline")
    proc = subprocess.run([str(exe), "sql", "--dir", str(demo),
                           "SELECT count(DISTINCT gpu_id) AS gpus FROM metrics.gpu_states"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == "80"


def test_cleaned_row_counts_match_the_simulator(demo):
    summary = json.loads((demo / "sources" / "truth" / "summary.json").read_text())
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")

    def count(table: str, where: str = "true") -> int:
        files = list((demo / "data").glob(f"{table}/date=*/part-0.parquet"))
        return con.sql(f"SELECT count(*) FROM read_parquet(?) WHERE {where}",
                       params=[[str(f) for f in files]]).fetchall()[0][0]

    # every archive row of the week is one clean slot row: nothing excluded, quarantined or duplicated
    assert count("clean/slot_snapshots") == summary["slot_rows"]
    assert count("quarantine/slot_snapshots") == 0
    # every telemetry sample the simulator wrote (nvidia-smi + DCGM) is one clean sample; the demo's
    # Terapixel render farm (2 s samples of 4 GPUs for the last day) comes on top
    assert count("clean/gpu_samples", "source IN ('nvidia-smi', 'dcgm')") == summary["telemetry_samples"]
    assert count("clean/gpu_samples", "source = 'terapixel'") == 4 * 24 * 3600 // 2
    assert count("quarantine/gpu_samples") == 0 and count("quarantine/gpu_telemetry") == 0
    # per day, the epochs in clean/jobs are exactly the true runs that ended and whose run -- or, for a
    # first run, its queue wait; for a later run that completed, its wait since the eviction before it
    # (its record's LastVacateTime; an evicted run's record holds its own) -- overlaps the day
    jobs = str(demo / "data" / "clean" / "jobs" / "*" / "*.parquet")
    truth = str(demo / "sources" / "truth" / "jobs.parquet")
    diff = con.sql(
        """
        WITH days AS (SELECT DISTINCT date FROM read_parquet(?, hive_partitioning=true)),
        got AS (SELECT date, global_job_id, run_index FROM read_parquet(?, hive_partitioning=true)
                WHERE doc_kind = 'epoch'),
        truth AS (
            SELECT *, lag(end_utc) OVER (PARTITION BY global_job_id ORDER BY run_index) AS prev_end_utc
            FROM read_parquet(?)
        ),
        want AS (
            SELECT d.date, t.global_job_id, t.run_index
            FROM truth t, days d
            WHERE t.end_reason IN ('completed', 'evicted')
              AND (CASE WHEN t.run_index = 0 THEN t.qdate_utc
                        WHEN t.end_reason = 'completed' THEN coalesce(t.prev_end_utc, t.start_utc)
                        ELSE t.start_utc END)
                  < timezone('America/Chicago', CAST(d.date + 1 AS TIMESTAMP))
              AND t.end_utc > timezone('America/Chicago', CAST(d.date AS TIMESTAMP))
        )
        SELECT 'missing' AS what, count(*) FROM (SELECT * FROM want EXCEPT SELECT * FROM got)
        UNION ALL SELECT 'extra', count(*) FROM (SELECT * FROM got EXCEPT SELECT * FROM want)
        UNION ALL SELECT 'matched', count(*) FROM (SELECT * FROM got INTERSECT SELECT * FROM want)
        """,
        params=[jobs, jobs, truth],
    ).fetchall()
    result = dict(diff)
    assert result["missing"] == 0 and result["extra"] == 0 and result["matched"] > 1000, result


def test_evictions_match_the_simulator_exactly(demo):
    con = duckdb.connect()
    got = set(con.sql("SELECT global_job_id, gpu_id FROM read_parquet(?)",
                      params=[str(demo / "data" / "metrics" / "evictions" / "*" / "*.parquet")]).fetchall())
    want = set(con.sql("SELECT global_job_id, gpu_id FROM read_parquet(?)",
                       params=[str(demo / "sources" / "truth" / "evictions.parquet")]).fetchall())
    assert len(want) > 100 and got == want


def test_every_daily_table_has_seven_partitions(demo):
    from gpu_pipeline.lib.schemas import all_tables

    start, end = demo_days()
    expected = [f"date={(start + dt.timedelta(days=i)).isoformat()}" for i in range(7)]
    for path in all_tables():
        if path.startswith("reference/"):
            continue
        found = sorted(p.name for p in (demo / "data" / path).glob("date=*") if (p / "part-0.parquet").is_file())
        assert found == expected, path


def test_the_coverage_tables_rows_in_are_the_raw_partitions_rows_for_every_source(demo):
    """`rows_in`: "Rows read from the source for the day" -- the Kueue row's was null."""
    data = demo / "data"
    raw = {"slot_snapshots": "condor_slot_snapshots", "gpu_telemetry": "gpu_telemetry",
           "job_records": "job_documents", "kueue": "kueue_scrapes"}
    con = duckdb.connect()
    cov = con.execute("SELECT source, strftime(day_start_utc AT TIME ZONE 'America/Chicago', '%Y-%m-%d'), rows_in "
                      "FROM read_parquet(?)", [str(data / "metrics" / "coverage" / "*" / "*.parquet")]).fetchall()
    by = {(s, d): n for s, d, n in cov}
    assert {s for s, _ in by} >= set(raw)
    for (source, day), n in by.items():
        if source in raw:
            [(rows,)] = con.execute("SELECT count(*) FROM read_parquet(?)",
                                    [str(data / "raw" / raw[source] / f"date={day}" / "part-0.parquet")]).fetchall()
            assert n == rows > 0, (source, day)
