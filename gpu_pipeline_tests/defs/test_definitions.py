"""The Dagster definitions: loading, shared partitions, schedule, and a range run on a hand archive."""

import datetime as dt

import dagster as dg
import pyarrow.parquet as pq
import pytest

from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES, RAW_CONDOR_SLOT_SNAPSHOTS
from gpu_pipeline.lib.store import Store
from gpu_pipeline_tests.conftest import slot_row, write_gpu_state_db

DAILY_ASSETS = {
    "raw/condor_slot_snapshots",
    "clean/slot_snapshots",
    "metrics/gpu_states",
    "plots/gpu_timeline_heatmap",
}


@pytest.fixture(scope="module")
def defs(loaded_defs) -> dg.Definitions:
    return loaded_defs


def test_definitions_load_with_every_layer(defs):
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert DAILY_ASSETS <= keys
    groups = {graph.get(k).group_name for k in graph.get_all_asset_keys()}
    assert {"raw", "clean", "metrics", "plots"} <= groups


def test_every_daily_asset_shares_one_partitions_definition_and_backfill_policy(defs):
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.partitions_def is daily_partitions, key
        assert node.backfill_policy == dg.BackfillPolicy.single_run(), key


def test_nightly_schedule_targets_the_previous_day_and_is_stopped_by_default(defs):
    schedule = defs.resolve_schedule_def("nightly_pipeline")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert schedule.job_name == "daily_pipeline"
    with dg.instance_for_test() as instance:
        ctx = dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=dt.datetime(2025, 8, 7, 2, 15, tzinfo=dt.UTC),
        )
        data = schedule.evaluate_tick(ctx)
    assert [r.partition_key for r in data.run_requests] == ["2025-08-06"]
    # the daemon's run monitoring stops it after 4 hours (GPU_PIPELINE_RUN_MAX_RUNTIME_S)
    assert data.run_requests[0].tags["dagster/max_runtime"] == "14400"


def _hand_archive(path, days):
    rows = []
    for day in days:
        t0 = dt.datetime.fromisoformat(day)
        for k in range(288):
            ts = (t0 + dt.timedelta(minutes=5 * k, seconds=4)).strftime("%Y-%m-%d %H:%M:%S.%f")
            busy = 96 <= k < 192  # 08:00-16:00 a primary job holds GPU a
            rows.append(slot_row(ts, "slot1", "GPU-aaaaaaaa", "Unclaimed", projects="Lab"))
            rows.append(slot_row(ts, "slot1", "GPU-bbbbbbbb", "Unclaimed", projects="Lab"))
            if busy:
                rows.append(slot_row(ts, "slot1_1", "GPU-aaaaaaaa", "Claimed", projects="Lab", job="s#1.0#1"))
            else:
                rows.append(slot_row(ts, "backfill2_1", "GPU-aaaaaaaa", "Claimed", projects="Lab", job="b#2.0#1"))
    write_gpu_state_db(path / "gpu_state_2025-08.db", rows)


def test_a_three_day_range_is_one_run_writing_three_files_per_table(defs, tmp_path, monkeypatch):
    days = ["2025-08-05", "2025-08-06", "2025-08-07"]
    _hand_archive(tmp_path / "archive", days)
    monkeypatch.setenv("GPU_PIPELINE_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("GPU_PIPELINE_CONDOR_ARCHIVE", str(tmp_path / "archive"))
    monkeypatch.setenv("GPU_PIPELINE_SOURCE_TZ", "UTC")
    monkeypatch.setenv("GPU_PIPELINE_EXCLUDED_HOSTS", "")
    job = defs.resolve_job_def("daily_pipeline")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(
            instance=instance,
            tags={"dagster/asset_partition_range_start": days[0], "dagster/asset_partition_range_end": days[-1]},
        )
        assert result.success
        assert len(instance.get_run_records()) == 1
        mats = instance.fetch_materializations(dg.AssetKey(["metrics", "gpu_states"]), limit=10).records
        assert sorted(m.partition_key for m in mats) == days
        # Each day's materialization carries that day's own figures, nothing of the other days (no
        # per-day observation events either).
        for m in mats:
            md = m.asset_materialization.metadata
            assert md["days"].value == 3
            assert md["dagster/row_count"].value == 2 * 288 and md["bytes"].value > 0
            assert md["dagster/uri"].value.endswith(f"/date={m.partition_key}/part-0.parquet")
            assert "by_day" not in md
        assert not [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
        plots = instance.fetch_materializations(dg.AssetKey(["plots", "gpu_timeline_heatmap"]), limit=10).records
        for m in plots:  # each day's preview and path are its own day's image
            md = m.asset_materialization.metadata
            assert md["path"].value.endswith(f"/date={m.partition_key}/gpu_timeline_heatmap.png")
            assert m.partition_key in md["preview"].value
        checks = [e for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
        assert checks and all(e.event_specific_data.passed for e in checks)

    store = Store(tmp_path / "data")
    for spec in (RAW_CONDOR_SLOT_SNAPSHOTS, CLEAN_SLOT_SNAPSHOTS, GPU_STATES):
        assert store.partition_days(spec) == days, spec.path
    for day in days:
        assert store.plot_file("gpu_timeline_heatmap", day).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        states = pq.read_table(store.partition_file(GPU_STATES, day)).to_pylist()
        assert len(states) == 2 * 288
        a = {r["bucket_start_utc"].hour: r["state"] for r in states if r["gpu_id"] == "GPU-aaaaaaaa"}
        assert a[3] == "busy_backfill" and a[9] == "busy_prioritized" and a[20] == "busy_backfill"
        assert {r["state"] for r in states if r["gpu_id"] == "GPU-bbbbbbbb"} == {"idle_prioritized"}


def test_a_failing_day_fails_the_run_naming_it_and_the_other_days_are_written(defs, tmp_path, monkeypatch):
    _hand_archive(tmp_path / "archive", ["2025-08-05"])
    # September's archive is corrupt: 2025-09-01 fails, 2025-08-05 is still written.
    (tmp_path / "archive" / "gpu_state_2025-09.db").write_bytes(b"not a database at all" * 100)
    monkeypatch.setenv("GPU_PIPELINE_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("GPU_PIPELINE_CONDOR_ARCHIVE", str(tmp_path / "archive"))
    monkeypatch.setenv("GPU_PIPELINE_SOURCE_TZ", "UTC")
    monkeypatch.setenv("GPU_PIPELINE_EXCLUDED_HOSTS", "")
    asset_job = dg.define_asset_job("raw_only", selection=["raw/condor_slot_snapshots"]).resolve(
        asset_graph=defs.resolve_asset_graph()
    )
    with dg.instance_for_test() as instance:
        result = asset_job.execute_in_process(
            instance=instance, raise_on_error=False, resources=defs.resources,
            tags={"dagster/asset_partition_range_start": "2025-08-05",
                  "dagster/asset_partition_range_end": "2025-09-01"},
        )
        # The days that were written are recorded as materialized, each with its own figures, so
        # the UI's "failed and missing" re-run takes only the failed day.
        mats = instance.fetch_materializations(dg.AssetKey(["raw", "condor_slot_snapshots"]), limit=100).records
        recorded = {m.partition_key: m.asset_materialization.metadata for m in mats}
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = str(failure.event_specific_data.error)
    assert "2025-09-01" in message and "gpu_state_2025-09.db" in message
    assert Store(tmp_path / "data").has_partition(RAW_CONDOR_SLOT_SNAPSHOTS, "2025-08-05")
    assert len(recorded) == 26 and not {"2025-08-31", "2025-09-01"} & set(recorded)  # the margin reads September
    assert recorded["2025-08-05"]["dagster/row_count"].value == 3 * 288
    assert recorded["2025-08-06"]["dagster/row_count"].value == 0


def test_an_empty_day_in_a_range_warns_and_the_good_days_go_downstream(defs, tmp_path, monkeypatch):
    """A collector outage on one day of a three-day backfill: has_snapshots fails as a warning naming
    that day and the run goes on downstream for every day (one result stands for the range: as an
    error it stopped the two good days too); the empty day has empty states. A run whose every day
    is empty still stops downstream (test_source_checks)."""
    days = ["2025-08-05", "2025-08-06", "2025-08-07"]
    _hand_archive(tmp_path / "archive", [days[0], days[2]])
    monkeypatch.setenv("GPU_PIPELINE_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("GPU_PIPELINE_CONDOR_ARCHIVE", str(tmp_path / "archive"))
    monkeypatch.setenv("GPU_PIPELINE_SOURCE_TZ", "UTC")
    monkeypatch.setenv("GPU_PIPELINE_EXCLUDED_HOSTS", "")
    asset_job = dg.define_asset_job("slots", selection=["raw/condor_slot_snapshots", "clean/slot_snapshots",
                                                        "metrics/gpu_states"]).resolve(
        asset_graph=defs.resolve_asset_graph())
    with dg.instance_for_test() as instance:
        result = asset_job.execute_in_process(
            instance=instance, raise_on_error=False, resources=defs.resources,
            tags={"dagster/asset_partition_range_start": days[0], "dagster/asset_partition_range_end": days[-1]})
        states = sorted(m.partition_key for m in
                        instance.fetch_materializations(dg.AssetKey(["metrics", "gpu_states"]), limit=10).records)
    assert result.success
    (check,) = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"
                and e.event_specific_data.check_name == "has_snapshots"]
    assert check.passed is False and check.severity == dg.AssetCheckSeverity.WARN
    assert check.metadata["days_without_snapshots"].value == [days[1]]
    assert states == days
    store = Store(tmp_path / "data")
    assert [store.row_count(GPU_STATES, d) for d in days] == [2 * 288, 0, 2 * 288]


def test_rematerializing_on_unchanged_inputs_gives_identical_files(defs, tmp_path, monkeypatch):
    days = ["2025-08-05", "2025-08-06"]
    _hand_archive(tmp_path / "archive", days)
    monkeypatch.setenv("GPU_PIPELINE_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("GPU_PIPELINE_CONDOR_ARCHIVE", str(tmp_path / "archive"))
    job = defs.resolve_job_def("daily_pipeline")
    tags = {"dagster/asset_partition_range_start": days[0], "dagster/asset_partition_range_end": days[-1]}

    def snapshot() -> dict[str, bytes]:
        root = tmp_path / "data"
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and p.name != ".lock"}

    with dg.instance_for_test() as instance:
        assert job.execute_in_process(instance=instance, tags=tags).success
        first = snapshot()
        assert job.execute_in_process(instance=instance, tags=tags).success
        second = snapshot()
    assert first.keys() == second.keys() and len(first) >= 10
    changed = [k for k in first if first[k] != second[k]]
    assert changed == []


def test_multi_assets_are_subsettable_for_ui_backfills(defs, tmp_path, monkeypatch):
    # A UI backfill plans each asset on its own: a non-subsettable multi-asset whose tables have
    # different upstreams refuses the plan. Materialize single tables out of multi-assets.
    days = ["2025-08-05"]
    _hand_archive(tmp_path / "archive", days)
    monkeypatch.setenv("GPU_PIPELINE_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("GPU_PIPELINE_CONDOR_ARCHIVE", str(tmp_path / "archive"))
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        if len(node.assets_def.keys) > 1:
            assert node.assets_def.can_subset, key
    upstream = ["raw/condor_slot_snapshots", "clean/slot_snapshots", "metrics/gpu_states"]
    job = dg.define_asset_job("subset", selection=[*upstream, "metrics/allocation_daily", "plots/allocation_heatmap"]
                              ).resolve(asset_graph=graph)
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, resources=defs.resources, partition_key=days[0])
    assert result.success
    mats = {e.event_specific_data.materialization.asset_key.to_user_string()
            for e in result.get_asset_materialization_events()}
    assert {"metrics/allocation_daily", "plots/allocation_heatmap"} <= mats
    assert "metrics/allocation_buckets" not in mats
    store = Store(tmp_path / "data")
    from gpu_pipeline.lib.allocation import ALLOCATION_BUCKETS, ALLOCATION_DAILY

    assert store.has_partition(ALLOCATION_DAILY, days[0]) and not store.has_partition(ALLOCATION_BUCKETS, days[0])
    assert store.plot_file("allocation_heatmap", days[0]).is_file()
    assert not store.plot_file("allocation_over_day", days[0]).exists()


def test_late_records_schedule_reruns_the_job_records_chain_over_the_look_ahead_as_one_range(defs, monkeypatch):
    """The re-run covers the days a record may still arrive for (the job records' look-ahead, 7 days by
    default) and only what a job record changes: the job records and their downstream, not the slot
    snapshots, the telemetry or the states."""
    schedule = defs.resolve_schedule_def("late_records_rerun")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    job = defs.resolve_job_def(schedule.job_name)
    selected = {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
    assert {"raw/job_documents", "clean/jobs", "metrics/evictions", "metrics/job_efficiency",
            "metrics/demand_capacity", "metrics/coverage"} <= selected
    assert not selected & {"raw/condor_slot_snapshots", "raw/gpu_telemetry", "clean/slot_snapshots",
                           "metrics/gpu_states", "metrics/allocation_daily"}

    def tick(when: dt.datetime):
        with dg.instance_for_test() as instance:
            return schedule.evaluate_tick(dg.build_schedule_context(instance=instance, scheduled_execution_time=when))

    def days(data):
        (request,) = data.run_requests
        return request.tags["dagster/asset_partition_range_start"], request.tags["dagster/asset_partition_range_end"]

    data = tick(dt.datetime(2025, 8, 20, 5, 45, tzinfo=dt.UTC))
    assert days(data) == ("2025-08-13", "2025-08-19")
    assert data.run_requests[0].tags["dagster/max_runtime"] == "14400"
    monkeypatch.setenv("GPU_PIPELINE_JOBS_LOOKAHEAD_DAYS", "2")
    assert days(tick(dt.datetime(2025, 8, 20, 5, 45, tzinfo=dt.UTC))) == ("2025-08-18", "2025-08-19")
    monkeypatch.setenv("GPU_PIPELINE_JOBS_LOOKAHEAD_DAYS", "0")  # the day's own files: the last day
    assert days(tick(dt.datetime(2025, 8, 20, 5, 45, tzinfo=dt.UTC))) == ("2025-08-19", "2025-08-19")
    # on the partitions' first day no day is complete: a skip, not an error (last[0] of no days)
    first = dt.datetime.combine(dt.date.fromisoformat(defs.resolve_job_def("daily_pipeline").partitions_def
                                                      .get_first_partition_key()), dt.time(5, 45), dt.UTC)
    with dg.instance_for_test() as instance:
        data = schedule.evaluate_tick(dg.build_schedule_context(instance=instance, scheduled_execution_time=first))
    assert data.run_requests == [] and "no complete day" in data.skip_message


def test_the_max_runtime_of_scheduled_runs_is_read_from_its_variable():
    from gpu_pipeline.defs.jobs import ENV_MAX_RUNTIME, max_runtime_tags

    assert max_runtime_tags({}) == {"dagster/max_runtime": "14400"}
    assert max_runtime_tags({ENV_MAX_RUNTIME: " 900 "}) == {"dagster/max_runtime": "900"}
    assert max_runtime_tags({ENV_MAX_RUNTIME: "0"}) == {}  # no limit
    for bad in ("1.5h", "-60"):
        with pytest.raises(ValueError, match=ENV_MAX_RUNTIME):
            max_runtime_tags({ENV_MAX_RUNTIME: bad})


_LOAD = ("import dagster as dg\n"
         "from gpu_pipeline.definitions import defs\n"
         "from gpu_pipeline.defs.common import window\n"
         "from gpu_pipeline.defs.partitions import TIMEZONE\n"
         "d = defs()\n"
         "print('loaded', TIMEZONE, window('2025-08-05')[0].isoformat(),\n"
         "      d.resolve_job_def('daily_pipeline').executor_def.name)\n")


@pytest.mark.parametrize(("variables", "expected"), [
    # a blank line in .env is the default, not an empty zone that every run failed on
    ({"GPU_PIPELINE_TIMEZONE": "", "GPU_PIPELINE_START_DATE": " "}, "loaded UTC 2025-08-05T00:00:00+00:00"),
    ({"GPU_PIPELINE_TIMEZONE": "America/Chicgo"}, "GPU_PIPELINE_TIMEZONE='America/Chicgo': not an IANA time zone"),
    ({"GPU_PIPELINE_START_DATE": "2025-8-1x"}, "GPU_PIPELINE_START_DATE='2025-8-1x': expected a date"),
    ({"GPU_PIPELINE_SOURCE_TZ": "Europe/Londn"}, "GPU_PIPELINE_SOURCE_TZ='Europe/Londn': not an IANA time zone"),
    # forms Python's fromisoformat reads and Dagster does not: the load failed naming no variable
    ({"GPU_PIPELINE_START_DATE": "20250801"}, "GPU_PIPELINE_START_DATE='20250801': expected a date"),
    ({"GPU_PIPELINE_START_DATE": "2025-W31-5"}, "GPU_PIPELINE_START_DATE='2025-W31-5': expected a date"),
    # checked without its spaces, and every run's day failed on the zone with them
    ({"GPU_PIPELINE_SOURCE_TZ": "America/Chicago "},
     "GPU_PIPELINE_SOURCE_TZ='America/Chicago ': remove the spaces around the time zone's name"),
    # a negative limit loaded, and the run then never started a step
    ({"GPU_PIPELINE_EXECUTOR": "multiprocess", "GPU_PIPELINE_MAX_CONCURRENT": "-1"},
     "GPU_PIPELINE_MAX_CONCURRENT='-1': negative"),
    ({"GPU_PIPELINE_EXECUTOR": "multiprocess", "GPU_PIPELINE_MAX_CONCURRENT": "0"}, "multiprocess"),
    ({"GPU_PIPELINE_NEIGHBOUR_SENSOR_INTERVAL_S": "5m"},
     "GPU_PIPELINE_NEIGHBOUR_SENSOR_INTERVAL_S='5m': expected a whole number of seconds"),
    ({"GPU_PIPELINE_KUEUE_GPU_RESOURCES": "nvidia.com/gpu, amd.com/gpu'"},
     "GPU_PIPELINE_KUEUE_GPU_RESOURCES: \"amd.com/gpu'\" is not a resource name"),
    ({"GPU_PIPELINE_NVIDIA_SMI_FIELDS": "uuid,power.draw"},
     "GPU_PIPELINE_NVIDIA_SMI_FIELDS='uuid,power.draw': the list must name timestamp and uuid"),
    ({"GPU_PIPELINE_NVIDIA_SMI_FIELDS": "timestamp, uuid, power.draw"}, "loaded"),
    # Dagster's own error named no variable ("Invariant failed. Description: Invalid cron string.")
    ({"GPU_PIPELINE_FRESHNESS_DEADLINE": "8:00"},
     "GPU_PIPELINE_FRESHNESS_DEADLINE='8:00': expected a cron string such as '0 8 * * *', or off"),
    ({"GPU_PIPELINE_FRESHNESS_DEADLINE": "off"}, "loaded"),
])
def test_the_structural_variables_are_checked_when_the_definitions_load(variables, expected, tmp_path):
    """As an operator's ``.env`` gives them, in a fresh interpreter (they are read at import)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_PIPELINE_")}
    env.update({"GPU_PIPELINE_DATA_ROOT": str(tmp_path), **variables})
    done = subprocess.run([sys.executable, "-c", _LOAD], env=env, capture_output=True, text=True, timeout=300)
    assert expected in done.stdout + done.stderr, done.stderr[-2000:]
    assert (done.returncode == 0) == expected.startswith(("loaded", "multiprocess"))


def test_resource_numbers_and_blank_variables(monkeypatch):
    from gpu_pipeline.defs.resources import optional_env
    from gpu_pipeline.lib.envutil import setting_number

    monkeypatch.setenv("GPU_PIPELINE_ES_TIMEOUT_S", "  ")
    assert optional_env("GPU_PIPELINE_ES_TIMEOUT_S", "30") == "30"  # blank is unset
    monkeypatch.setenv("GPU_PIPELINE_ES_TIMEOUT_S", "45")
    assert isinstance(optional_env("GPU_PIPELINE_ES_TIMEOUT_S", "30"), dg.EnvVar)
    assert setting_number("X", " 7 ", whole=True) == 7 and setting_number("X", "2.5", positive=True) == 2.5
    for text, kw in (("7d", {"whole": True}), ("-1", {"whole": True}), ("0", {"positive": True}),
                     ("nan", {"positive": True}), ("inf", {"positive": True}), ("1.5", {"whole": True}),
                     ("-inf", {})):
        with pytest.raises(ValueError, match=f"GPU_PIPELINE_JOBS_LOOKAHEAD_DAYS='{text}'"):
            setting_number("GPU_PIPELINE_JOBS_LOOKAHEAD_DAYS", text, **kw)


def test_the_data_root_default_and_blank_required_paths(tmp_path, monkeypatch):
    """DESIGN 3: the data root defaults to ``$DAGSTER_HOME/data``, else ``./data``; a blank archive
    folder fails naming its variable instead of reading the working folder."""
    from gpu_pipeline.defs.resources import CondorArchiveResource, DataStoreResource
    from gpu_pipeline.lib.envutil import data_root

    assert data_root({"GPU_PIPELINE_DATA_ROOT": " /srv/gpu "}) == "/srv/gpu"
    assert data_root({"GPU_PIPELINE_DATA_ROOT": " ", "DAGSTER_HOME": "/var/dagster"}) == "/var/dagster/data"
    monkeypatch.chdir(tmp_path)
    assert data_root({}) == str(tmp_path / "data")
    with pytest.raises(ValueError, match="GPU_PIPELINE_CONDOR_ARCHIVE is blank"):
        _ = CondorArchiveResource(archive_dir=" ").path
    monkeypatch.delenv("GPU_PIPELINE_DATA_ROOT", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    assert DataStoreResource(data_root=" ").store().root == tmp_path / "home" / "data"
