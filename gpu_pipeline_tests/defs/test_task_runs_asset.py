"""The render farm's task runs through Dagster: each day's metadata is that day's own."""

import datetime as dt

import dagster as dg

from gpu_pipeline.defs.clean.task_runs import task_runs
from gpu_pipeline.defs.resources import DataStoreResource, TelemetryResource
from gpu_pipeline.lib.terapixel import write_terapixel_sample

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
