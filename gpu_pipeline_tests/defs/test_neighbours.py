"""The neighbouring-day reads and the sensor that re-runs a day whose neighbour changed after it."""

import datetime as dt

import dagster as dg
import pytest

from gpu_pipeline.defs import neighbours
from gpu_pipeline.lib.store import Store
from gpu_pipeline_tests.defs.test_definitions import _hand_archive

DAYS = ["2025-08-05", "2025-08-06", "2025-08-07"]
EFFICIENCY = {"metrics/gpu_hourly_efficiency", "metrics/job_efficiency", "metrics/held_idle_intervals",
              "metrics/efficiency_daily"}


@pytest.fixture
def pipeline_env(tmp_path, monkeypatch):
    _hand_archive(tmp_path / "archive", DAYS)
    monkeypatch.setenv("GPU_PIPELINE_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("GPU_PIPELINE_CONDOR_ARCHIVE", str(tmp_path / "archive"))
    monkeypatch.setenv("GPU_PIPELINE_SOURCE_TZ", "UTC")
    monkeypatch.setenv("GPU_PIPELINE_EXCLUDED_HOSTS", "")
    return tmp_path


def _range_run(defs, instance):
    job = defs.resolve_job_def("daily_pipeline")
    tags = {"dagster/asset_partition_range_start": DAYS[0], "dagster/asset_partition_range_end": DAYS[-1]}
    assert job.execute_in_process(instance=instance, tags=tags).success


def _tick(defs, instance, cursor):
    sensor = defs.resolve_sensor_def("neighbour_days_rerun")
    return sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))


def _run(defs, instance, day, keys):
    job = defs.resolve_job_def("daily_pipeline")
    assert job.execute_in_process(instance=instance, partition_key=day, asset_selection=list(keys)).success


def _names(keys):
    return {k.to_user_string() for k in keys}


def test_a_day_rematerialized_out_of_order_reruns_the_days_that_read_it(loaded_defs, pipeline_env):
    defs = loaded_defs
    assert defs.resolve_sensor_def("neighbour_days_rerun").default_status == dg.DefaultSensorStatus.STOPPED
    with dg.instance_for_test() as instance:
        first = _tick(defs, instance, None)  # on before anything ran
        assert first.run_requests == [] and "started" in first.skip_message
        _range_run(defs, instance)
        quiet = _tick(defs, instance, first.cursor)  # a range run writes each day after the days it reads
        assert quiet.run_requests == [] and "no day" in quiet.skip_message

        # the operator re-materializes the first day's clean slots alone
        _run(defs, instance, DAYS[0], [dg.AssetKey(["clean", "slot_snapshots"])])
        data = _tick(defs, instance, quiet.cursor)
        (req,) = data.run_requests
        assert req.partition_key == DAYS[1]  # the next day's states carry the day's last snapshot
        assert req.tags["gpu_pipeline/stale"] == ("metrics/allocation_buckets,metrics/allocation_daily,"
                                                  "metrics/eviction_rates,metrics/evictions,metrics/gpu_states")
        assert req.tags["dagster/max_runtime"] == "14400"  # a hung re-run is stopped (run monitoring)
        chosen = _names(req.asset_selection)
        assert {"metrics/gpu_states", "metrics/evictions", "metrics/availability_periods",
                "plots/gpu_timeline_heatmap"} | EFFICIENCY <= chosen  # the stale assets and their downstream
        assert not chosen & {"clean/slot_snapshots", "raw/condor_slot_snapshots", "clean/jobs"}
        # the data checks of the re-run assets, and no freshness check (those are their sensor's: without
        # the list, Dagster's subset took every check of the assets)
        checks = {(k.asset_key.to_user_string(), k.name) for k in req.asset_check_keys}
        assert ("metrics/gpu_states", "gpu_hours_conserved") in checks
        assert {a for a, _ in checks} <= chosen and not [c for c in checks if c[1] == "freshness_check"]
        again = _tick(defs, instance, quiet.cursor)  # the same tick twice asks with the same run key
        assert [r.run_key for r in again.run_requests] == [req.run_key]

        _run(defs, instance, DAYS[1], req.asset_selection)  # as the daemon would
        data = _tick(defs, instance, data.cursor)
        reqs = {r.partition_key: r for r in data.run_requests}
        # the re-run states of the middle day were read by the days either side
        assert set(reqs) == {DAYS[0], DAYS[2]}
        assert set(reqs[DAYS[0]].tags["gpu_pipeline/stale"].split(",")) == EFFICIENCY  # the hour after
        assert set(reqs[DAYS[2]].tags["gpu_pipeline/stale"].split(",")) == EFFICIENCY | {
            "metrics/availability_periods", "metrics/availability_summary", "metrics/evictions",
            "metrics/eviction_rates", "plots/availability_durations", "plots/time_to_claim"}
        for day, r in reqs.items():
            _run(defs, instance, day, r.asset_selection)
        done = _tick(defs, instance, data.cursor)
        assert done.run_requests == [] and "no day" in done.skip_message  # it stops there


def _stale_over_ticks(defs, instance, cursor):
    """{day: stale assets} asked for by ticks from ``cursor`` until the cursor stops moving."""
    asked: dict[str, set[str]] = {}
    for _ in range(500):
        tick = _tick(defs, instance, cursor)
        for r in tick.run_requests:
            asked.setdefault(r.partition_key, set()).update(r.tags["gpu_pipeline/stale"].split(","))
        if tick.cursor == cursor:
            return asked
        cursor = tick.cursor
    raise AssertionError("the cursor never stopped")


def test_a_tick_that_reads_part_of_the_records_leaves_the_rest_for_the_next(loaded_defs, pipeline_env, monkeypatch):
    defs = loaded_defs
    with dg.instance_for_test() as instance:
        _range_run(defs, instance)
        start = _tick(defs, instance, None).cursor
        job = defs.resolve_job_def("daily_pipeline")  # the slots and states of the three days again, one run
        assert job.execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey(["clean", "slot_snapshots"]), dg.AssetKey(["metrics", "gpu_states"])],
            tags={"dagster/asset_partition_range_start": DAYS[0], "dagster/asset_partition_range_end": DAYS[-1]}).success
        whole = _stale_over_ticks(defs, instance, start)
        assert "metrics/allocation_buckets" in whole[DAYS[2]]  # read the middle day's slots
        assert "metrics/gpu_states" not in whole.get(DAYS[1], set())  # written after the slots it read
        monkeypatch.setattr(neighbours, "RECORDS_PER_TICK", 1)  # one record of each asset a tick
        assert _stale_over_ticks(defs, instance, start) == whole


def test_records_of_a_run_still_going_wait_for_the_next_tick(loaded_defs, pipeline_env):
    defs = loaded_defs
    with dg.instance_for_test() as instance:
        _range_run(defs, instance)
        start = _tick(defs, instance, None).cursor  # turned on after the history: none of it re-runs
        assert _tick(defs, instance, start).run_requests == []
        _run(defs, instance, DAYS[0], [dg.AssetKey(["clean", "slot_snapshots"])])
        (record,) = instance.fetch_materializations(dg.AssetKey(["clean", "slot_snapshots"]), limit=1).records
        run = instance.get_run_by_id(record.run_id)
        instance.handle_run_event(run.run_id, dg.DagsterEvent(
            event_type_value="PIPELINE_START", job_name=run.job_name))  # as if the run were going on
        assert not instance.get_run_by_id(run.run_id).is_finished
        waiting = _tick(defs, instance, start)
        assert waiting.run_requests == [] and waiting.cursor == start  # the cursor stays before it
        instance.handle_run_event(run.run_id, dg.DagsterEvent(
            event_type_value="PIPELINE_SUCCESS", job_name=run.job_name))
        (req,) = _tick(defs, instance, start).run_requests
        assert req.partition_key == DAYS[1]


def test_the_declared_neighbour_reads_are_the_other_days_each_asset_reads(loaded_defs, pipeline_env, monkeypatch):
    """Each asset materialized alone for the middle day, with every partition file it looks up recorded:
    the other days it reads are exactly NEIGHBOUR_READS (so the sensor watches what the code reads)."""
    defs = loaded_defs
    looked_up: list[tuple[str, str]] = []
    real = Store.partition_file

    def recording(self, spec, day):
        looked_up.append((spec.path, str(day)))
        return real(self, spec, day)

    graph = defs.resolve_asset_graph()
    with dg.instance_for_test() as instance:
        _range_run(defs, instance)
        monkeypatch.setattr(Store, "partition_file", recording)
        seen_steps = set()
        for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
            assets_def = graph.get(key).assets_def
            if id(assets_def) in seen_steps:
                continue
            seen_steps.add(id(assets_def))
            looked_up.clear()
            _run(defs, instance, DAYS[1], sorted(assets_def.keys, key=lambda k: k.to_user_string()))
            read = {}
            for path, day in looked_up:
                offset = (dt.date.fromisoformat(day) - dt.date.fromisoformat(DAYS[1])).days
                if offset:
                    read.setdefault(dg.AssetKey(path.split("/")), set()).add(offset)
            declared = {}
            for k in assets_def.keys:
                for up, offsets in neighbours.NEIGHBOUR_READS.get(k, {}).items():
                    # a read made only when the day needs it (a task run past midnight; none here)
                    when_needed = neighbours.READ_WHEN_NEEDED.get(k, {}).get(up, ())
                    declared.setdefault(up, set()).update(o for o in offsets if o not in when_needed)
            declared = {up: offsets for up, offsets in declared.items() if offsets}
            assert read == declared, _names(assets_def.keys)


def test_a_neighbour_replaced_while_the_reading_step_was_going_reruns_it(loaded_defs, pipeline_env, monkeypatch):
    """Runs of different days run side by side: the allocation of the middle day reads the first
    day's slots, and while its step is going another run replaces those slots and finishes first.
    The allocation's record then comes after the slots' record, yet it read the old file: the sensor
    compares with the start of the reading step, and asks for the re-run (it did not)."""
    defs = loaded_defs
    slots = dg.AssetKey(["clean", "slot_snapshots"])
    allocation = [dg.AssetKey(["metrics", "allocation_buckets"]), dg.AssetKey(["metrics", "allocation_daily"])]
    real = Store.partition_file
    with dg.instance_for_test() as instance:
        _range_run(defs, instance)
        start = _tick(defs, instance, None).cursor
        replaced = []

        def read_then_replaced(self, spec, day):
            path = real(self, spec, day)
            if spec.path == "clean/slot_snapshots" and str(day) == DAYS[0] and not replaced:
                replaced.append(True)  # the allocation has read the old file: now the other run
                _run(defs, instance, DAYS[0], [slots])
            return path

        monkeypatch.setattr(Store, "partition_file", read_then_replaced)
        _run(defs, instance, DAYS[1], allocation)
        monkeypatch.setattr(Store, "partition_file", real)
        assert replaced
        (slot_record,) = instance.fetch_materializations(slots, limit=1).records
        (alloc_record,) = instance.fetch_materializations(allocation[0], limit=1).records
        assert alloc_record.storage_id > slot_record.storage_id  # recorded after, but read before
        asked = _stale_over_ticks(defs, instance, start)
        assert {"metrics/allocation_buckets", "metrics/allocation_daily"} <= asked[DAYS[1]]


@pytest.mark.parametrize("storage", ["test instance", "the project's dagster.yaml"])
def test_days_run_one_at_a_time_in_order_are_not_stale(loaded_defs, pipeline_env, monkeypatch, storage):
    """The middle day, then the last, each run whole: the last day read the middle day's new
    tables (its run started after the middle day's ended), so only the days that read a day before
    it changed are asked for: the first and the middle day's efficiency and task runs' GPU means
    (each reads the day after's samples).
    With the project's SQLite event log (a database per run) a run's own events are numbered from 1,
    and comparing the last day's step starts with the index's ids asked for the last day too."""
    from gpu_pipeline.cli import prepare_dagster_home

    defs = loaded_defs
    if storage == "test instance":
        opened = dg.instance_for_test()
    else:
        home = prepare_dagster_home(pipeline_env / "dagster_home")
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        opened = dg.DagsterInstance.from_config(str(home))
    with opened as instance:
        _range_run(defs, instance)
        start = _tick(defs, instance, None).cursor
        job = defs.resolve_job_def("daily_pipeline")
        for day in DAYS[1:]:
            assert job.execute_in_process(instance=instance, partition_key=day).success
        asked = _stale_over_ticks(defs, instance, start)
        assert asked == {DAYS[0]: EFFICIENCY | {"metrics/task_gpu_means"}, DAYS[1]: EFFICIENCY | {"metrics/task_gpu_means"}}
