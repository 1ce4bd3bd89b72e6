"""The efficiency asset through Dagster: what it reads around the day."""

import datetime as dt

import dagster as dg
import pyarrow as pa
import pytest

from gpu_pipeline.defs.metrics.efficiency import efficiency
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.efficiency import GPU_HOURLY_EFFICIENCY, HELD_IDLE_INTERVALS
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_SAMPLES, GPU_STATES, JOBS, conform
from gpu_pipeline.lib.store import Store

UTC = dt.UTC
GPU = "GPU-aaaaaaaa"


def _day_rows(day: dt.date, every: dt.timedelta, make) -> list[dict]:
    t = dt.datetime.combine(day, dt.time(), UTC)
    out = []
    while t.date() == day:
        out.append(make(t))
        t += every
    return out


def _write_inputs(store: Store, days: list[dt.date], gpus: dict[str, tuple[str, dt.datetime, dt.datetime]],
                  runs: dict[str, list[tuple[dt.datetime, dt.datetime]]] | None = None) -> None:
    """Each day's samples (every minute), GPU states (every 5 minutes, busy with the GPU's job all
    along), slot snapshots and job records, for ``gpus``: GPU -> (its job, the first and the last
    sample at idle power; busy power otherwise). ``runs``: GPU -> its job's runs, each in the job
    partition of every day it overlaps, as the clean job records are."""
    for day in days:
        key = day.isoformat()
        lo = dt.datetime.combine(day, dt.time(), UTC)
        hi = lo + dt.timedelta(days=1)
        samples, states, slots, jobs = [], [], [], []
        for n, (gpu, (job, idle_from, idle_to)) in enumerate(gpus.items(), 1):
            samples += _day_rows(day, dt.timedelta(minutes=1), lambda t, a=idle_from, b=idle_to, g=gpu: {
                "sample_utc": t, "source": "nvidia-smi", "host": "h1", "gpu_id": g,
                "device_name": "NVIDIA A100-SXM4-40GB", "util_pct": 0.0 if a <= t <= b else 90.0,
                "power_w": 55.0 if a <= t <= b else 350.0, "power_limit_w": 400.0})
            gpu_states = _day_rows(day, dt.timedelta(minutes=5), lambda t, g=gpu, j=job: {
                "bucket_start_utc": t, "gpu_id": g, "host": "h1", "state": "busy_shared",
                "global_job_id": j, "n_slot_rows": 1})
            states += gpu_states
            slots += [{"snapshot_utc": r["bucket_start_utc"], "host": "h1", "slot_name": f"slot{n}@h1", "gpu_id": gpu,
                       "tier": "shared", "is_backfill_slot": False, "slot_state": "Claimed"} for r in gpu_states]
            jobs += [{"global_job_id": job, "run_index": i, "run_start_utc": rs, "run_end_utc": re,
                      "assigned_gpus": gpu, "doc_kind": "epoch", "source": "ndjson", "host": "h1",
                      "is_backfill_slot": False}
                     for i, (rs, re) in enumerate((runs or {}).get(gpu, [])) if rs < hi and re > lo]
        store.write_partition(GPU_SAMPLES, key, conform(pa.Table.from_pylist(samples), GPU_SAMPLES))
        store.write_partition(GPU_STATES, key, conform(pa.Table.from_pylist(states), GPU_STATES))
        store.write_partition(CLEAN_SLOT_SNAPSHOTS, key, conform(pa.Table.from_pylist(slots), CLEAN_SLOT_SNAPSHOTS))
        store.write_partition(JOBS, key, conform(pa.Table.from_pylist(jobs), JOBS) if jobs else JOBS.empty())


def test_a_held_idle_run_across_midnight_is_in_both_days(tmp_path):
    """The GPU is claimed all along and sits at idle power from 23:40 to 00:25 (45 minutes, a
    held-idle run): the day before midnight gets its 20 minutes, 23:40 to midnight, because the
    asset reads the hour after the day where it exists (it read only the day and the one before:
    those 20 minutes were in no partition); the next day gets the rest."""
    store = Store(tmp_path / "data")
    days = [dt.date(2025, 8, 5), dt.date(2025, 8, 6)]
    idle_from, idle_to = dt.datetime(2025, 8, 5, 23, 40, tzinfo=UTC), dt.datetime(2025, 8, 6, 0, 25, tzinfo=UTC)
    _write_inputs(store, days, {GPU: ("s#1.0#1", idle_from, idle_to)})
    with dg.instance_for_test() as instance:
        for day in days:  # one day at a time, the next day's samples already there
            result = dg.materialize([efficiency], resources={"data_store": DataStoreResource(data_root=str(store.root))},
                                    partition_key=day.isoformat(), instance=instance)
            assert result.success
    held = {d.isoformat(): [(r["start_utc"], r["end_utc"], r["clipped_start"], r["clipped_end"])
                            for r in store.read_table(HELD_IDLE_INTERVALS, d.isoformat()).to_pylist()] for d in days}
    midnight = dt.datetime(2025, 8, 6, tzinfo=UTC)
    assert held["2025-08-05"] == [(idle_from, midnight, False, True)]
    assert held["2025-08-06"] == [(midnight, idle_to + dt.timedelta(minutes=1), True, False)]


def test_the_job_records_of_the_days_around_bound_held_idle_runs_across_midnight(tmp_path):
    """Two GPUs, each claimed by one job and at idle power for an hour across a midnight, the job's
    record split into two runs that touch (a restart in place): the runs merge into one held-idle
    run of 59.5 minutes, of which day 6 gets its part. The run before midnight on GPU A (ending
    23:59:30 on day 5) and the one after midnight on GPU B (from 00:00:30 on day 7) are in the
    neighbour days' job partitions only: reading the day's records alone, day 6 saw a 19.5- and a
    20.5-minute run, each too short to be held."""
    store = Store(tmp_path / "data")
    days = [dt.date(2025, 8, 5), dt.date(2025, 8, 6), dt.date(2025, 8, 7)]

    def t(day: int, h: int, m: int, s: int = 0) -> dt.datetime:
        return dt.datetime(2025, 8, day, h, m, s, tzinfo=UTC)

    gpus = {"GPU-aaaaaaaa": ("s#1.0#1", t(5, 23, 20), t(6, 0, 19)), "GPU-bbbbbbbb": ("s#2.0#1", t(6, 23, 40), t(7, 0, 39))}
    runs = {"GPU-aaaaaaaa": [(t(5, 23, 20), t(5, 23, 59, 30)), (t(5, 23, 59, 30), t(6, 0, 19, 30))],
            "GPU-bbbbbbbb": [(t(6, 23, 40), t(7, 0, 0, 30)), (t(7, 0, 0, 30), t(7, 0, 39, 30))]}
    _write_inputs(store, days, gpus, runs)
    assert [r["run_index"] for r in store.read_table(JOBS, "2025-08-06").to_pylist()] == [1, 0]
    with dg.instance_for_test() as instance:
        result = dg.materialize([efficiency], resources={"data_store": DataStoreResource(data_root=str(store.root))},
                                partition_key="2025-08-06", instance=instance)
        assert result.success
    held = [(r["gpu_id"], r["global_job_id"], r["start_utc"], r["end_utc"], r["run_duration_s"], r["clipped_start"],
             r["clipped_end"]) for r in store.read_table(HELD_IDLE_INTERVALS, "2025-08-06").to_pylist()]
    assert held == [
        ("GPU-aaaaaaaa", "s#1.0#1", t(6, 0, 0), t(6, 0, 19, 30), 3570.0, True, False),
        ("GPU-bbbbbbbb", "s#2.0#1", t(6, 23, 40), t(7, 0, 0), 3570.0, False, True),
    ]


@pytest.mark.parametrize("power", [None, 0.0], ids=["null", "zero_watts"])
def test_a_day_without_power_readings_has_no_made_up_zero_in_the_metadata(tmp_path, power):
    """No power read all day: the fleet RFU and energy are unknown, so the daily table's metadata
    leaves them out (it charted them as 0); the sample counters are there. A 0 W reading (a broken
    exporter's) is no power reading either, and is counted."""
    store = Store(tmp_path / "data")
    day = dt.date(2025, 8, 5)
    noon = dt.datetime(2025, 8, 5, 12, tzinfo=UTC)
    _write_inputs(store, [day], {GPU: ("s#1.0#1", noon, noon)})
    samples = store.read_table(GPU_SAMPLES, day.isoformat())
    samples = samples.set_column(samples.schema.get_field_index("power_w"), "power_w",
                                 pa.array([power] * samples.num_rows, pa.float64()))
    store.write_partition(GPU_SAMPLES, day.isoformat(), samples)
    with dg.instance_for_test() as instance:
        result = dg.materialize([efficiency], resources={"data_store": DataStoreResource(data_root=str(store.root))},
                                partition_key=day.isoformat(), instance=instance)
    assert result.success
    (daily,) = [m for m in result.get_asset_materialization_events()
                if m.asset_key == dg.AssetKey(["metrics", "efficiency_daily"])]
    meta = daily.materialization.metadata
    assert "rfu_pct_fleet" not in meta and "energy_kwh" not in meta
    assert meta["util_pct"].value > 80
    assert meta["samples_in_window"].value == 1440 and meta["samples_dropped_other_source"].value == 0
    assert meta["zero_power_readings"].value == (1440 if power == 0.0 else 0)


def test_a_mig_board_is_not_a_gpu_missing_from_the_snapshots(tmp_path):
    """Host h1 in the slot snapshots with GPU-aaaaaaaa, plus an H100 board in MIG mode whose
    instances (dcgm-exporter: parent UUID + GPU_I_ID) HTCondor lists by their MIG ids, and an
    unknown whole GPU GPU-cccccccc. The board gets efficiency rows under its short id and is not
    reported by the subset check (HTCondor may list only its instances); GPU-cccccccc is."""
    store = Store(tmp_path / "data")
    day = dt.date(2025, 8, 5)
    _write_inputs(store, [day], {GPU: ("s#1.0#1", dt.datetime(2025, 8, 5, 12, tzinfo=UTC),
                                       dt.datetime(2025, 8, 5, 12, tzinfo=UTC))})
    parent = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
    extra = []
    for gi, profile, active in ((1, "4g.40gb", 70.0), (5, "3g.40gb", 35.0)):
        extra += _day_rows(day, dt.timedelta(minutes=1), lambda t, gi=gi, p=profile, a=active: {
            "sample_utc": t, "source": "dcgm", "host": "h1", "gpu_uuid": parent, "gpu_id": f"{parent}/{gi}",
            "mig_profile": p, "mig_instance_id": gi, "device_name": "NVIDIA H100 80GB HBM3",
            "power_w": 420.0, "gr_engine_active_pct": a})
    extra += _day_rows(day, dt.timedelta(minutes=1), lambda t: {
        "sample_utc": t, "source": "nvidia-smi", "host": "h1", "gpu_id": "GPU-cccccccc",
        "device_name": "NVIDIA A100-SXM4-40GB", "util_pct": 10.0, "power_w": 90.0})
    samples = pa.concat_tables([store.read_table(GPU_SAMPLES, day.isoformat()),
                                conform(pa.Table.from_pylist(extra), GPU_SAMPLES)])
    store.write_partition(GPU_SAMPLES, day.isoformat(), samples)
    with dg.instance_for_test() as instance:
        result = dg.materialize([efficiency], resources={"data_store": DataStoreResource(data_root=str(store.root))},
                                partition_key=day.isoformat(), instance=instance)
    assert result.success
    hourly = store.read_table(GPU_HOURLY_EFFICIENCY, day.isoformat()).to_pylist()
    assert {r["gpu_id"] for r in hourly} == {GPU, "GPU-58e8f5ea", "GPU-cccccccc"}
    board = [r for r in hourly if r["gpu_id"] == "GPU-58e8f5ea"]
    # (4 x 70 + 3 x 35) / 7 slices = 55 % (the plain mean of the instances: 52.5)
    assert len(board) == 24 and all(r["util_pct"] == pytest.approx(55.0) and r["power_w"] == 420.0 for r in board)
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "gpus_subset_of_snapshots" and not check.passed
    assert check.metadata["gpus_not_in_snapshots"].value == {day.isoformat(): ["GPU-cccccccc"]}
    (daily,) = [m for m in result.get_asset_materialization_events()
                if m.asset_key == dg.AssetKey(["metrics", "efficiency_daily"])]
    meta = daily.materialization.metadata
    assert meta["mig_samples_on_boards"].value == 2 * 1440 and meta["mig_samples_skipped"].value == 0
