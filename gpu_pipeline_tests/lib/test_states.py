"""The ranking rules of DESIGN.md 5.1, hand-computed."""

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES, conform
from gpu_pipeline.lib.states import states_from_table

UTC = dt.UTC
DAY0 = dt.datetime(2025, 8, 6, tzinfo=UTC)


def snap(minute: float, second: float = 7) -> dt.datetime:
    return DAY0 + dt.timedelta(minutes=minute, seconds=second)


def row(ts, slot, gpu, state, tier, host="h1", job=None):
    return dict(snapshot_utc=ts, host=host, slot_name=f"{slot}@{host}", gpu_id=gpu, tier=tier,
                is_backfill_slot="backfill" in slot, slot_state=state, device_name="NVIDIA A100",
                global_job_id=job, remote_owner="u" if job else None)


def states(rows, minutes=15):
    table = conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS)
    out = states_from_table(table, DAY0, DAY0 + dt.timedelta(minutes=minutes))
    assert out.schema == GPU_STATES.schema
    return {(r["gpu_id"], int((r["bucket_start_utc"] - DAY0).total_seconds() // 60)): r for r in out.to_pylist()}


@pytest.mark.parametrize(
    "rows_for_gpu, expected",
    [
        # claimed primary beats everything
        ([("slot1", "Unclaimed", "priority"), ("slot1_1", "Claimed", "priority"),
          ("backfill2_1", "Claimed", "backfill")], "busy_prioritized"),
        ([("slot1_1", "Claimed", "shared")], "busy_shared"),
        # the trap: primary unclaimed while backfill runs a job -> busy_backfill
        ([("slot1", "Unclaimed", "priority"), ("backfill2_1", "Claimed", "backfill")], "busy_backfill"),
        # unclaimed primary beats unclaimed backfill
        ([("slot1", "Unclaimed", "priority"), ("backfill2", "Unclaimed", "backfill")], "idle_prioritized"),
        ([("slot1", "Unclaimed", "shared")], "idle_shared"),
        # other primary state (Drained) beats unclaimed backfill -> na
        ([("slot1", "Drained", "priority"), ("backfill2", "Unclaimed", "backfill")], "na"),
        # ...but a claimed backfill beats a drained primary
        ([("slot1", "Drained", "priority"), ("backfill2_1", "Claimed", "backfill")], "busy_backfill"),
        # only a backfill slot sees the GPU, idle -> documented idle_backfill code
        ([("backfill2", "Unclaimed", "backfill")], "idle_backfill"),
        ([("slot1", "Owner", "shared")], "na"),
    ],
)
def test_rank_rules(rows_for_gpu, expected):
    rows = [row(snap(0), slot, "GPU-aaaaaaaa", st, tier, job="j#1.0#1" if st == "Claimed" else None)
            for slot, st, tier in rows_for_gpu]
    out = states(rows, minutes=5)
    r = out[("GPU-aaaaaaaa", 0)]
    assert r["state"] == expected
    assert r["n_slot_rows"] == len(rows_for_gpu)
    if expected == "na":
        assert r["na_reason"] in {"Drained", "Owner"}


def test_busy_backfill_reports_the_backfill_job_and_priority_gpu_is_not_lost():
    rows = [row(snap(0), "slot1", "GPU-aaaaaaaa", "Unclaimed", "priority"),
            row(snap(0), "backfill2_1", "GPU-aaaaaaaa", "Claimed", "backfill", job="bf#7.0#1")]
    r = states(rows, 5)[("GPU-aaaaaaaa", 0)]
    assert (r["state"], r["tier"], r["global_job_id"], r["slot_name"]) == (
        "busy_backfill", "backfill", "bf#7.0#1", "backfill2_1@h1")


def test_within_equal_rank_latest_snapshot_wins():
    # Two snapshots in one bucket, both unclaimed primary but different slots: the later one wins.
    rows = [row(snap(0, 5), "slot1", "GPU-aaaaaaaa", "Unclaimed", "priority"),
            row(snap(0, 200), "slot2", "GPU-aaaaaaaa", "Unclaimed", "shared")]
    r = states(rows, 5)[("GPU-aaaaaaaa", 0)]
    assert r["state"] == "idle_shared"
    assert r["snapshot_utc"] == snap(0, 200)


def test_higher_rank_wins_even_from_an_earlier_snapshot_in_the_bucket():
    rows = [row(snap(0, 5), "slot1_1", "GPU-aaaaaaaa", "Claimed", "shared", job="a#1.0#1"),
            row(snap(0, 200), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared")]
    assert states(rows, 5)[("GPU-aaaaaaaa", 0)]["state"] == "busy_shared"


def test_equal_rank_in_one_snapshot_the_greatest_slot_name_wins_whatever_the_row_order():
    # Two unclaimed primary slots name one GPU in the same snapshot: the greater slot name wins,
    # not the later row (the rows come greatest name first) nor the later host.
    t = snap(0)
    rows = [row(t, "slot2", "GPU-aaaaaaaa", "Unclaimed", "shared", host="h1"),
            row(t, "slot1", "GPU-aaaaaaaa", "Unclaimed", "priority", host="h1"),
            row(t, "slot1", "GPU-aaaaaaaa", "Unclaimed", "priority", host="h9")]
    r = states(rows, 5)[("GPU-aaaaaaaa", 0)]
    assert (r["slot_name"], r["state"], r["n_slot_rows"]) == ("slot2@h1", "idle_shared", 3)


def test_a_gpu_seen_only_in_the_hour_before_the_window_gets_no_rows():
    # The 23:57 snapshot carries into the first bucket, but only GPUs seen during the window count.
    rows = [row(snap(-3), "slot1", "GPU-aaaaaaaa", "Claimed", "shared", job="a#1.0#1"),
            row(snap(-3), "slot1", "GPU-bbbbbbbb", "Claimed", "shared", host="h2", job="b#1.0#1"),
            row(snap(5), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared")]
    out = states(rows, 10)
    assert sorted(out) == [("GPU-aaaaaaaa", 0), ("GPU-aaaaaaaa", 5)]
    assert (out[("GPU-aaaaaaaa", 0)]["state"], out[("GPU-aaaaaaaa", 0)]["snapshot_utc"]) == ("busy_shared", snap(-3))
    assert out[("GPU-aaaaaaaa", 5)]["state"] == "idle_shared"


def test_dropout_missing_snapshot_and_carry_forward():
    rows = []
    for m in (0, 5, 15, 20, 25):  # the 10-minute snapshot is missing from the whole pool
        rows.append(row(snap(m), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared"))
        if m != 20:  # GPU b drops out at 20
            rows.append(row(snap(m), "slot1", "GPU-bbbbbbbb", "Unclaimed", "shared"))
    out = states(rows, minutes=50)
    # 10-minute bucket carries the 05:07 snapshot (younger than 1.5 x 5 min cadence)
    assert out[("GPU-aaaaaaaa", 10)]["state"] == "idle_shared"
    assert out[("GPU-aaaaaaaa", 10)]["snapshot_utc"] == snap(5)
    assert out[("GPU-bbbbbbbb", 20)]["state"] == "na"
    assert out[("GPU-bbbbbbbb", 20)]["na_reason"] == "dropout"
    # 30: carried from 25:07 (4m53s old); 35 and later: stale -> no_snapshot
    assert out[("GPU-aaaaaaaa", 30)]["state"] == "idle_shared"
    assert out[("GPU-aaaaaaaa", 35)]["na_reason"] == "no_snapshot"
    assert out[("GPU-bbbbbbbb", 45)]["na_reason"] == "no_snapshot"


def test_fifteen_minute_cadence_fills_five_minute_buckets():
    rows = [row(snap(m), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared") for m in (0, 15, 30, 45)]
    out = states(rows, minutes=60)
    assert all(out[("GPU-aaaaaaaa", m)]["state"] == "idle_shared" for m in range(0, 60, 5))


def test_one_missed_snapshot_at_fifteen_minute_cadence_is_bridged_two_are_not():
    # the 15:07 snapshot is missing: 00:07 fills the buckets up to 30, the last of them (25) starting
    # 24m53s after it (1.5 x cadence, 22.5 min, left it no_snapshot, and availability ended every
    # idle period there as a dropout); with 15:07 and 30:07 both missing, 35 and 40 are no_snapshot
    one = [row(snap(m), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared") for m in (0, 30, 45, 60)]
    out = states(one, minutes=75)
    assert [out[("GPU-aaaaaaaa", m)]["state"] for m in range(0, 75, 5)] == ["idle_shared"] * 15
    assert out[("GPU-aaaaaaaa", 25)]["snapshot_utc"] == snap(0)
    two = [row(snap(m), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared") for m in (0, 45, 60, 75)]
    out = states(two, minutes=90)
    reasons = {m: out[("GPU-aaaaaaaa", m)]["na_reason"] for m in range(0, 90, 5)}
    assert [m for m, r in reasons.items() if r == "no_snapshot"] == [30, 35, 40]


def test_a_day_whose_cadence_changes_is_read_at_each_parts_own():
    """Snapshots every 15 minutes until noon, every 5 after: the carry was judged against the day's
    median gap (5 minutes, a 7.5-minute window), so every third bucket of the morning was
    no_snapshot. The cadence in force is now the median of the gaps around each snapshot: the
    morning is whole, and a missed 5-minute snapshot after noon is still a hole past 7.5 minutes."""
    times = [m for m in range(0, 720, 15)] + [m for m in range(720, 1440, 5) if not 900 <= m < 930]
    rows = [row(snap(m), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared") for m in times]
    out = states(rows, minutes=1440)
    missing = [m for m in range(0, 1440, 5) if out[("GPU-aaaaaaaa", m)]["na_reason"] == "no_snapshot"]
    assert missing == [905, 910, 915, 920, 925]  # 15:00 is carried from 14:55:07; then the outage
    assert out[("GPU-aaaaaaaa", 10)]["snapshot_utc"] == snap(0)


def test_an_outage_with_snapshots_taken_by_hand_in_it_stays_an_outage():
    """A 5-minute collector down from 10:00 to 14:00, with `collect --once` run at 11:00 and 12:00:
    the gaps around those snapshots (60, 60, 120 minutes) do not agree on a cadence, so the day's
    5 minutes rules there, and each hand-taken snapshot stands for its own bucket and the next only
    (the median of the five gaps, 60 minutes, let the 12:00 snapshot's claim stand for two hours)."""
    times = [m for m in range(0, 600, 5)] + [660, 720] + [m for m in range(840, 1440, 5)]
    rows = [row(snap(m), "slot1", "GPU-aaaaaaaa", "Claimed" if m == 720 else "Unclaimed", "shared",
                job="j#1.0#1" if m == 720 else None) for m in times]
    out = states(rows, minutes=1440)
    busy = [m for m in range(0, 1440, 5) if out[("GPU-aaaaaaaa", m)]["state"] == "busy_shared"]
    covered = [m for m in range(600, 840, 5) if out[("GPU-aaaaaaaa", m)]["na_reason"] != "no_snapshot"]
    assert busy == [720, 725]
    assert covered == [600, 660, 665, 720, 725]  # 10:00 carries 09:55; each by-hand snapshot 5 minutes on


def test_a_snapshot_written_in_two_parts_seconds_apart_is_one_snapshot():
    """A 15-minute archive whose every snapshot is written in two parts 2 s apart (two collectors,
    h1's rows at :07, h2's at :09): the cadence is 15 minutes, not the 2-s gap between the parts,
    and a bucket without a snapshot carries both parts (2 of 3 buckets were no_snapshot; carrying
    the later part only made h1's GPU a dropout). Allocation and the snapshots' coverage agree."""
    from gpu_pipeline.lib.allocation import allocation_from_table
    from gpu_pipeline.lib.coverage_table import coverage_rows
    from gpu_pipeline.lib.schemas import GPU_SAMPLES, JOBS

    rows = []
    for k in range(4 * 24 + 1):
        rows.append(row(snap(15 * k, 7), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared", host="h1"))
        if k < 4 * 24:
            rows.append(row(snap(15 * k, 9), "slot1", "GPU-bbbbbbbb", "Claimed", "shared", host="h2", job="j#1.0#1"))
    out = states(rows, minutes=24 * 60)
    assert len(out) == 2 * 288
    assert {r["state"] for (g, _), r in out.items() if g == "GPU-aaaaaaaa"} == {"idle_shared"}
    assert {r["state"] for (g, _), r in out.items() if g == "GPU-bbbbbbbb"} == {"busy_shared"}
    table = conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS)
    end = DAY0 + dt.timedelta(days=1)
    buckets, daily = allocation_from_table(table, DAY0, end)
    total = [r for r in daily.to_pylist() if r["tier"] == "TOTAL" and r["device_name"] == "ALL"][0]
    assert (total["buckets"], total["avg_total_gpus"], total["allocation_pct"]) == (288, 2.0, 50.0)
    states_t = states_from_table(table, DAY0, end)
    cov = coverage_rows(DAY0, end, table, states_t, GPU_SAMPLES.empty(), JOBS.empty(), None, {})
    snaps = [r for r in cov.to_pylist() if r["source"] == "slot_snapshots"][0]
    assert (snaps["cadence_s"], snaps["samples"], snaps["gaps"]) == (900.0, 96, 0)


def test_snapshot_parts_either_side_of_a_bucket_boundary_and_a_fast_collector():
    """Parts at hh:14:59 and hh:15:01 are one snapshot, bucketed by its first part (each GPU was a
    dropout in the bucket holding only the other's part). A collector every 30 s is no snapshot in
    parts: each time is its own (a fixed one-minute rule chained them all into one)."""
    from gpu_pipeline.lib.coverage_table import coverage_rows
    from gpu_pipeline.lib.schemas import GPU_SAMPLES, JOBS
    from gpu_pipeline.lib.states import snapshot_firsts

    rows = []
    for k in range(9):
        rows.append(row(snap(15 * k + 14, 59), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared", host="h1"))
        rows.append(row(snap(15 * k + 15, 1), "slot1", "GPU-bbbbbbbb", "Claimed", "shared", host="h2", job="j#1.0#1"))
    out = states(rows, minutes=120)
    # (the last bucket's snapshot has its second part after the window: GPU-bbbbbbbb is not in it)
    assert {(g, r["state"]) for (g, m), r in out.items() if 10 <= m < 115} == {
        ("GPU-aaaaaaaa", "idle_shared"), ("GPU-bbbbbbbb", "busy_shared")}
    fast = [row(DAY0 + dt.timedelta(seconds=30 * k + 1), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared")
            for k in range(2880)]
    t_us = np.array(sorted(int(r["snapshot_utc"].timestamp() * 1e6) for r in fast))
    assert (snapshot_firsts(t_us) == t_us).all()
    table = conform(pa.Table.from_pylist(fast), CLEAN_SLOT_SNAPSHOTS)
    end = DAY0 + dt.timedelta(days=1)
    cov = coverage_rows(DAY0, end, table, states_from_table(table, DAY0, end), GPU_SAMPLES.empty(), JOBS.empty(),
                        None, {})
    snaps = [r for r in cov.to_pylist() if r["source"] == "slot_snapshots"][0]
    assert (snaps["samples"], snaps["cadence_s"], snaps["gaps"]) == (2880, 30.0, 0)


def test_every_gpu_gets_every_bucket_gpu_hours_conserved():
    rows = [row(snap(0), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared"),
            row(snap(50), "slot1", "GPU-cccccccc", "Unclaimed", "shared", host="h2")]
    table = conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS)
    out = states_from_table(table, DAY0, DAY0 + dt.timedelta(hours=1))
    assert out.num_rows == 2 * 12
    # GPU c had no snapshot before 50 min: those buckets are not 'seen', only the 0/5 buckets of a
    assert sorted(set(out.column("gpu_id").to_pylist())) == ["GPU-aaaaaaaa", "GPU-cccccccc"]


def test_rows_come_gpu_by_gpu_in_bucket_order_with_each_gpus_own_columns():
    """The rows are put in order by their place in the GPU x bucket grid (not sorted), and a GPU's
    host and device, computed once per GPU, are on every one of its rows -- also with more buckets
    than a day of 5-minute ones, and a GPU whose latest rows have no device name."""
    rows = []
    for m in range(0, 120, 7):
        rows.append(row(snap(m), "slot1", "GPU-bbbbbbbb", "Claimed", "priority", host="h1", job="1.0"))
        rows.append(row(snap(m), "slot2", "GPU-cccccccc", "Unclaimed", "shared", host="h1"))
        unnamed = row(snap(m), "slot1", "GPU-aaaaaaaa", "Unclaimed", "shared", host="h2")
        if m > 60:
            unnamed["device_name"] = None
        rows.append(unnamed)
    table = conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS)
    buckets = [DAY0 + dt.timedelta(seconds=20 * i) for i in range(360)]  # 20-s buckets, 2 hours
    out = states_from_table(table, DAY0, DAY0 + dt.timedelta(hours=2), bucket=dt.timedelta(seconds=20))
    got = [(r["host"], r["gpu_id"], r["bucket_start_utc"]) for r in out.to_pylist()]
    expected = [(h, g, b) for h, g in (("h1", "GPU-bbbbbbbb"), ("h1", "GPU-cccccccc"), ("h2", "GPU-aaaaaaaa"))
                for b in buckets]
    assert got == expected
    assert set(out.column("device_name").to_pylist()) == {"NVIDIA A100"}
    by_gpu = {}
    for r in out.to_pylist():
        by_gpu.setdefault(r["gpu_id"], set()).add(r["state"])
    assert by_gpu["GPU-bbbbbbbb"] >= {"busy_prioritized"} and "busy_prioritized" not in by_gpu["GPU-cccccccc"]


@pytest.mark.parametrize("bucket_min, per_gpu", [(5, 300), (7, 215)])
def test_a_25_hour_day_gets_every_bucket_including_a_short_last_one(bucket_min, per_gpu):
    """The fall-back day in Chicago is 25 hours: 300 five-minute buckets, or 215 seven-minute ones
    (the last only 2 minutes long), each GPU in every one, in order."""
    from zoneinfo import ZoneInfo

    tz = ZoneInfo("America/Chicago")
    start = dt.datetime(2025, 11, 2, tzinfo=tz).astimezone(UTC)
    end = dt.datetime(2025, 11, 3, tzinfo=tz).astimezone(UTC)
    assert end - start == dt.timedelta(hours=25)
    rows = [row(start + dt.timedelta(minutes=m, seconds=7), "slot1", gpu, "Unclaimed", "shared", host=host)
            for m in range(0, 25 * 60, 5) for gpu, host in (("GPU-aaaaaaaa", "h1"), ("GPU-bbbbbbbb", "h2"))]
    table = conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS)
    step = dt.timedelta(minutes=bucket_min)
    out = states_from_table(table, start, end, bucket=step).to_pylist()
    assert len(out) == 2 * per_gpu
    for g, gpu in enumerate(("GPU-aaaaaaaa", "GPU-bbbbbbbb")):
        mine = out[g * per_gpu:(g + 1) * per_gpu]
        assert {r["gpu_id"] for r in mine} == {gpu}
        assert [r["bucket_start_utc"] for r in mine] == [start + i * step for i in range(per_gpu)]
        assert {r["state"] for r in mine} == {"idle_shared"}


def test_empty_input_gives_empty_output_with_schema():
    out = states_from_table(CLEAN_SLOT_SNAPSHOTS.empty(), DAY0, DAY0 + dt.timedelta(days=1))
    assert out.num_rows == 0 and out.schema == GPU_STATES.schema


# -- the asset's path: straight from the Parquet partitions --------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    from gpu_pipeline_tests.simdata import build_sim_dataset

    # telemetry is not used here: a coarse interval keeps the fixture fast
    return build_sim_dataset(tmp_path_factory.mktemp("states_sim"), telemetry_interval_s=900)


def test_parquet_path_equals_the_temp_table_path(sim, tmp_path):
    """states_for_day (the asset's: rows read from the Parquet files, winners read back by file and
    row number) gives exactly the table the temp-table path computes from the same rows -- with the
    files' own row groups, and with many small row groups, most of them outside the window."""
    import pyarrow.parquet as pq

    from gpu_pipeline.lib.states import states_for_day
    from gpu_pipeline.lib.store import Store

    small = Store(tmp_path / "small_row_groups")
    for day in sim.days:
        path = small.partition_file(CLEAN_SLOT_SNAPSHOTS, day)
        path.parent.mkdir(parents=True)
        pq.write_table(sim.store.read_table(CLEAN_SLOT_SNAPSHOTS, day), path, row_group_size=997)
    assert pq.ParquetFile(small.partition_file(CLEAN_SLOT_SNAPSHOTS, sim.days[-1])).num_row_groups > 10
    two_files = 0
    for day in sim.days:
        start, end = sim.window(day)
        prev = (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
        present = [d for d in (prev, day) if sim.store.has_partition(CLEAN_SLOT_SNAPSHOTS, d)]
        two_files += len(present) == 2
        rows = pa.concat_tables([sim.store.read_table(CLEAN_SLOT_SNAPSHOTS, d) for d in present])
        expected = states_from_table(rows, start, end)
        assert expected.num_rows > 10_000
        assert set(expected.column("state").to_pylist()) > {"busy_backfill", "idle_prioritized", "na"}
        for store in (sim.store, small):
            got = states_for_day(store, day, start, end)
            assert got.schema == GPU_STATES.schema
            assert got.equals(expected), (day, store.root)
    assert two_files >= 1  # a day whose first bucket can carry a snapshot from the day before's file
    start, end = sim.window(sim.days[0])
    empty = states_for_day(Store(tmp_path / "nothing"), sim.days[0], start, end)
    assert empty.num_rows == 0 and empty.schema == GPU_STATES.schema


def test_a_day_before_written_without_a_column_since_added_is_read_by_name(sim, tmp_path):
    """After an upgrade that added a column, the day before's clean file lacks it: the states and the
    allocation read both days by column name (that column null in the old day's rows). By position,
    DuckDB took the old file's columns and failed on the new one ("does not have a column named")."""
    import pyarrow.parquet as pq

    from gpu_pipeline.lib.allocation import allocation_for_day, allocation_from_table
    from gpu_pipeline.lib.states import states_for_day
    from gpu_pipeline.lib.store import Store

    day = next(d for d in sim.days[1:] if sim.store.has_partition(CLEAN_SLOT_SNAPSHOTS,
                                                                  (dt.date.fromisoformat(d) - dt.timedelta(days=1)).isoformat()))
    prev = (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
    store = Store(tmp_path / "upgraded")
    old = sim.store.read_table(CLEAN_SLOT_SNAPSHOTS, prev).drop_columns(["gpu_usage_pct"])
    path = store.partition_file(CLEAN_SLOT_SNAPSHOTS, prev)
    path.parent.mkdir(parents=True)
    pq.write_table(old, path)
    store.write_partition(CLEAN_SLOT_SNAPSHOTS, day, sim.store.read_table(CLEAN_SLOT_SNAPSHOTS, day))
    assert store.older_files(CLEAN_SLOT_SNAPSHOTS, store.files(CLEAN_SLOT_SNAPSHOTS, [prev, day]))
    rows = pa.concat_tables([store.read_table(CLEAN_SLOT_SNAPSHOTS, d) for d in (prev, day)])
    assert rows["gpu_usage_pct"].null_count >= old.num_rows
    start, end = sim.window(day)
    expected = states_from_table(rows, start, end)
    assert states_for_day(store, day, start, end).equals(expected)
    buckets, daily = allocation_for_day(store, day, start, end)
    e_buckets, e_daily = allocation_from_table(rows, start, end)
    assert buckets.num_rows > 1_000 and buckets.equals(e_buckets) and daily.equals(e_daily)
