"""The availability multi-asset through Dagster: a run of the summary alone."""

import datetime as dt

import dagster as dg
import pyarrow as pa

from gpu_pipeline.defs.metrics.availability import PERIODS_KEY, SUMMARY_KEY, availability
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.availability import AVAILABILITY_PERIODS, AVAILABILITY_SUMMARY
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES, conform
from gpu_pipeline.lib.store import Store

UTC = dt.UTC
DAY = dt.date(2025, 8, 6)
GPU = "GPU-bbbbbbbb"


def _write_day(store: Store, idle_until_hour: int) -> None:
    """One backfill GPU: idle (available) from midnight to ``idle_until_hour``, then claimed."""
    t, states = dt.datetime.combine(DAY, dt.time(), UTC), []
    while t.date() == DAY:
        idle = t.hour < idle_until_hour
        states.append({"bucket_start_utc": t, "gpu_id": GPU, "host": "h1", "device_name": "NVIDIA A100",
                       "slot_name": "backfill1@h1", "tier": "backfill",
                       "state": "idle_backfill" if idle else "busy_backfill", "n_slot_rows": 1})
        t += dt.timedelta(minutes=5)
    store.write_partition(GPU_STATES, DAY.isoformat(), conform(pa.Table.from_pylist(states), GPU_STATES))
    slots = [{"snapshot_utc": r["bucket_start_utc"], "host": "h1", "slot_name": "backfill1@h1", "gpu_id": GPU,
              "tier": "backfill", "is_backfill_slot": True,
              "slot_state": "Unclaimed" if r["state"] == "idle_backfill" else "Claimed"} for r in states]
    store.write_partition(CLEAN_SLOT_SNAPSHOTS, DAY.isoformat(),
                          conform(pa.Table.from_pylist(slots), CLEAN_SLOT_SNAPSHOTS))


def test_a_run_of_the_summary_alone_leaves_the_periods_file_as_dagster_recorded_it(tmp_path):
    """The summary needs the day's periods: it now takes them from memory. It wrote them to the
    periods' file, which Dagster had not materialized in that run: the file changed under the
    recorded materialization (bytes, digest) and the plots reading it were not marked stale."""
    store = Store(tmp_path / "data")
    resources = {"data_store": DataStoreResource(data_root=str(store.root))}
    _write_day(store, idle_until_hour=6)
    with dg.instance_for_test() as instance:
        assert dg.materialize([availability], resources=resources, partition_key=DAY.isoformat(),
                              instance=instance).success
        path = store.partition_file(AVAILABILITY_PERIODS, DAY.isoformat())
        before = (path.stat().st_ino, path.stat().st_mtime_ns, path.read_bytes())
        hours_before = store.read_table(AVAILABILITY_SUMMARY, DAY.isoformat()).to_pylist()
        _write_day(store, idle_until_hour=9)  # the states change: three more hours available
        assert dg.materialize([availability], resources=resources, partition_key=DAY.isoformat(),
                              instance=instance, selection=[SUMMARY_KEY]).success
        assert (path.stat().st_ino, path.stat().st_mtime_ns, path.read_bytes()) == before
        events = instance.fetch_materializations(PERIODS_KEY, limit=10).records
        assert len(events) == 1
    summary = {(r["device_name"], r["tier"]): r for r in store.read_table(AVAILABILITY_SUMMARY, DAY.isoformat()).to_pylist()}
    old = {(r["device_name"], r["tier"]): r for r in hours_before}
    assert old[("ALL", "ALL")]["available_gpu_hours"] == 6.0
    assert summary[("ALL", "ALL")]["available_gpu_hours"] == 9.0  # from the day's periods in memory


def test_a_range_run_of_the_summary_alone_joins_periods_across_its_days(tmp_path):
    """A GPU available from 20:00 on the first day of the range to 02:00 on the second: one 6-hour
    period. A run of the summary alone does not write the first day's periods, so the second
    day's summary takes them from the run's memory (from the store it found none: one 2-hour
    period that began before the day)."""
    store = Store(tmp_path / "data")
    first, second = "2025-08-05", "2025-08-06"
    for day, idle in ((first, lambda h: h >= 20), (second, lambda h: h < 2)):
        t, rows = dt.datetime.fromisoformat(day).replace(tzinfo=UTC), []
        for _ in range(288):
            rows.append({"bucket_start_utc": t, "gpu_id": GPU, "host": "h1", "device_name": "NVIDIA A100",
                         "slot_name": "backfill1@h1", "tier": "backfill",
                         "state": "idle_backfill" if idle(t.hour) else "busy_backfill", "n_slot_rows": 1})
            t += dt.timedelta(minutes=5)
        store.write_partition(GPU_STATES, day, conform(pa.Table.from_pylist(rows), GPU_STATES))
        store.write_partition(CLEAN_SLOT_SNAPSHOTS, day, conform(pa.Table.from_pylist([
            {"snapshot_utc": r["bucket_start_utc"], "host": "h1", "slot_name": "backfill1@h1", "gpu_id": GPU,
             "tier": "backfill", "is_backfill_slot": True,
             "slot_state": "Unclaimed" if r["state"] == "idle_backfill" else "Claimed"} for r in rows]),
            CLEAN_SLOT_SNAPSHOTS))
    with dg.instance_for_test() as instance:
        assert dg.materialize([availability], resources={"data_store": DataStoreResource(data_root=str(store.root))},
                              instance=instance, selection=[SUMMARY_KEY],
                              tags={"dagster/asset_partition_range_start": first,
                                    "dagster/asset_partition_range_end": second}).success
    assert not store.has_partition(AVAILABILITY_PERIODS, first)
    (row,) = [r for r in store.read_table(AVAILABILITY_SUMMARY, second).to_pylist()
              if r["device_name"] == "ALL" and r["tier"] == "ALL"]
    assert (row["duration_median_s"], row["periods_start_truncated"]) == (6 * 3600.0, 0)


def test_the_summarys_periods_figure_counts_whole_periods_not_the_days_pieces(tmp_path):
    """One GPU available until 06:00, then claimed (a period that ended in the day), another available
    from 18:00 to the day's end (open: no ended period of the day). The summary's ``periods`` is 1;
    the day's figure in Dagster said 2, the rows of the periods table."""
    store = Store(tmp_path / "data")
    states, slots = [], []
    for gpu, idle in (("GPU-bbbbbbbb", lambda h: h < 6), ("GPU-cccccccc", lambda h: h >= 18)):
        t = dt.datetime.combine(DAY, dt.time(), UTC)
        while t.date() == DAY:
            free = idle(t.hour)
            states.append({"bucket_start_utc": t, "gpu_id": gpu, "host": "h1", "device_name": "NVIDIA A100",
                           "slot_name": f"backfill{gpu[-1]}@h1", "tier": "backfill",
                           "state": "idle_backfill" if free else "busy_backfill", "n_slot_rows": 1})
            slots.append({"snapshot_utc": t, "host": "h1", "slot_name": f"backfill{gpu[-1]}@h1", "gpu_id": gpu,
                          "tier": "backfill", "is_backfill_slot": True, "slot_state": "Unclaimed" if free else "Claimed"})
            t += dt.timedelta(minutes=5)
    store.write_partition(GPU_STATES, DAY.isoformat(), conform(pa.Table.from_pylist(states), GPU_STATES))
    store.write_partition(CLEAN_SLOT_SNAPSHOTS, DAY.isoformat(), conform(pa.Table.from_pylist(slots), CLEAN_SLOT_SNAPSHOTS))
    with dg.instance_for_test() as instance:
        result = dg.materialize([availability], resources={"data_store": DataStoreResource(data_root=str(store.root))},
                                partition_key=DAY.isoformat(), instance=instance)
        (mat,) = [e.materialization for e in result.get_asset_materialization_events()
                  if e.materialization.asset_key == SUMMARY_KEY]
    summary = {(r["device_name"], r["tier"]): r for r in store.read_table(AVAILABILITY_SUMMARY, DAY.isoformat()).to_pylist()}
    assert summary[("ALL", "ALL")]["periods"] == 1
    assert store.read_table(AVAILABILITY_PERIODS, DAY.isoformat()).num_rows == 2
    assert (mat.metadata["periods"].value, mat.metadata["period_pieces"].value) == (1, 2)
