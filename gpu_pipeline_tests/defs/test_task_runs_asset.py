"""The render farm's task runs through Dagster: each day's metadata is that day's own."""

import datetime as dt
import os

import dagster as dg
import pytest

from gpu_pipeline.defs.clean.gpu_samples import gpu_samples
from gpu_pipeline.defs.clean.task_runs import QUARANTINE_TASK_RUNS, task_gpu_means_asset, task_runs
from gpu_pipeline.defs.raw.gpu_telemetry import gpu_telemetry
from gpu_pipeline.defs.resources import DataStoreResource, TelemetryResource
from gpu_pipeline.lib.terapixel import GPU_CSV_COLUMNS, TASK_GPU_MEANS, write_terapixel_sample

DAYS = ["2025-08-05", "2025-08-06", "2025-08-07"]


def test_the_runs_counters_are_each_days_own(tmp_path):
    """Renders on the last day only, with re-executed tasks and three exact duplicate lines: the
    days without runs carry no re-executions (each day carried the whole file's counters), and the
    duplicates in the file are reported once, on the first day of runs."""
    sample = write_terapixel_sample(tmp_path / "terapixel", dt.datetime(2025, 8, 7, 10, tzinfo=dt.UTC),
                                    hosts=2, hours=1, duplicates=3)
    resources = {"data_store": DataStoreResource(data_root=str(tmp_path / "data")),
                 "telemetry": TelemetryResource(terapixel_dir=str(tmp_path / "terapixel"))}
    with dg.instance_for_test() as instance:
        result = dg.materialize([task_runs], resources=resources, instance=instance, selection=["clean/task_runs"],
                                tags={"dagster/asset_partition_range_start": DAYS[0],
                                      "dagster/asset_partition_range_end": DAYS[-1]})
        assert result.success
        meta = {r.partition_key: r.asset_materialization.metadata
                for r in instance.fetch_materializations(dg.AssetKey(["clean", "task_runs"]), limit=10).records}
    assert set(meta) == set(DAYS)
    for day in DAYS[:2]:
        assert meta[day]["rows"].value == 0 and meta[day]["reexecuted_runs"].value == 0
        assert "duplicate_events_in_file" not in meta[day]
    last = meta[DAYS[-1]]
    assert last["rows"].value > 0 and last["reexecuted_runs"].value > 0
    assert last["duplicate_events_in_file"].value == sample.duplicate_rows == 3


U = "GPU-5e3c2a17-8b4d-4f0e-9a61-2c7d8e9f0a1b"


def _materialize(tmp_path, assets, days):
    resources = {"data_store": DataStoreResource(data_root=str(tmp_path / "data")),
                 "telemetry": TelemetryResource(terapixel_dir=str(tmp_path / "terapixel"))}
    with dg.instance_for_test() as instance:
        tags = {"dagster/asset_partition_range_start": days[0], "dagster/asset_partition_range_end": days[-1]}
        # a step at a time: a few minutes of samples fail the raw step's coverage check, which would
        # skip the steps after it in one run
        for asset in assets:
            dg.materialize([asset], resources=resources, instance=instance, raise_on_error=False, tags=tags)
        meta = {r.partition_key: {k: v.value for k, v in r.asset_materialization.metadata.items()}
                for r in instance.fetch_materializations(dg.AssetKey(["clean", "task_runs"]), limit=10).records}
    return resources["data_store"].store(), meta


def test_a_run_past_midnight_and_the_events_set_aside_on_their_own_days(tmp_path):
    """A render from 23:59:50 to 00:00:50 (idle at 50 W before midnight, busy at 250 W after): its
    means took the start day's samples only (util 0, 50 W); they now take the next day's too, and
    name the GPU. An unmatched START on the 7th was reported on the 6th (the file's first day of
    runs: no set-aside line carried its time)."""
    tp = tmp_path / "terapixel"
    tp.mkdir()
    t0 = dt.datetime(2025, 8, 6, 23, 58, tzinfo=dt.UTC)
    rows = []
    for i in range(0, 240, 2):
        t = t0 + dt.timedelta(seconds=i)
        busy = t.day == 7
        rows.append(f"{t:%Y-%m-%dT%H:%M:%S}.000Z,h1,321,{U},{250 if busy else 50},40,{100 if busy else 0},10")
    (tp / "gpu.csv").write_text(",".join(GPU_CSV_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    (tp / "application-checkpoints.csv").write_text(
        "timestamp,hostname,eventName,eventType,jobId,taskId\n"
        "2025-08-06T23:59:50.000Z,h1,Render,START,j,a\n"
        "2025-08-07T00:00:50.000Z,h1,Render,STOP,j,a\n"
        "2025-08-07T10:00:00.000Z,h1,Render,START,j,b\n")
    days = ["2025-08-06", "2025-08-07"]
    store, meta = _materialize(tmp_path, [gpu_telemetry, gpu_samples, task_runs, task_gpu_means_asset], days)
    (run,) = store.read_table(TASK_GPU_MEANS, days[0]).to_pylist()
    # 10 s at 0 % / 50 W before midnight, 50 s at 100 % / 250 W after (2-s samples, each until the next)
    assert (run["samples"], run["covered_s"]) == (30, 60.0)
    assert run["util_pct_mean"] == pytest.approx(100 * 50 / 60)
    assert run["power_w_mean"] == pytest.approx((50 * 10 + 250 * 50) / 60)
    assert (run["gpu_id"], run["gpu_uuid"]) == ("GPU-5e3c2a17", U)
    assert [r["source_row"] for r in store.read_table(QUARANTINE_TASK_RUNS, days[0]).to_pylist()] == []
    assert [(r["source_row"], r["reason"]) for r in store.read_table(QUARANTINE_TASK_RUNS, days[1]).to_pylist()] == [
        (4, "unmatched START: no STOP follows")]
    assert (meta[days[0]]["unmatched_start"], meta[days[1]]["unmatched_start"]) == (0.0, 1.0)


def test_a_file_that_forms_no_run_still_reports_its_lines(tmp_path):
    """Events that pair into no run (every line set aside): nothing was written or counted on any day
    (the lines waited for the file's first day of runs, which it has none of). Lines with a time are
    reported on their day, a line without one on the file's first day: of its first run or first
    line with a time, else of the file's last change."""
    tp = tmp_path / "terapixel"
    tp.mkdir()
    (tp / "application-checkpoints.csv").write_text(
        "timestamp,hostname,eventName,eventType,jobId,taskId\n"
        "2025-08-06T10:00:00.000Z,h1,Render,START,j,a\n"
        "2025-08-07T11:00:00.000Z,h1,Render,STOP,j,b\n"
        "garbage,h1,Render,STOP,j,c\n")
    stamp = dt.datetime(2025, 8, 7, 12, tzinfo=dt.UTC).timestamp()
    os.utime(tp / "application-checkpoints.csv", (stamp, stamp))
    days = ["2025-08-06", "2025-08-07"]
    store, meta = _materialize(tmp_path, [task_runs], days)
    got = {d: [r["source_row"] for r in store.read_table(QUARANTINE_TASK_RUNS, d).to_pylist()] for d in days}
    assert got == {days[0]: [2, 4], days[1]: [3]}
    assert (meta[days[0]]["unmatched_start"], meta[days[1]]["unmatched_stop"]) == (1.0, 1.0)
    # only the line without a time: the day of the file's last change
    (tp / "application-checkpoints.csv").write_text("timestamp,hostname,eventName,eventType,jobId,taskId\n"
                                                    "garbage,h1,Render,STOP,j,c\n")
    os.utime(tp / "application-checkpoints.csv", (stamp, stamp))
    store, _ = _materialize(tmp_path, [task_runs], days)
    assert {d: store.read_table(QUARANTINE_TASK_RUNS, d).num_rows for d in days} == {days[0]: 0, days[1]: 1}
