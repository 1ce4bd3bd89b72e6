"""Allocation by tier (DESIGN.md 5.2): the original tool's reference figures, the backfill trap by
hand, and exact identities with the 5-minute states on a simulated pool."""

import datetime as dt

import pyarrow as pa
import pytest

from gpu_pipeline.lib.allocation import (
    ALLOCATION_BUCKETS,
    ALLOCATION_DAILY,
    allocation_daily,
    allocation_for_day,
    allocation_from_table,
)
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES, conform
from gpu_pipeline.lib.states import states_from_table
from gpu_pipeline.lib.store import connect
from gpu_pipeline_tests.simdata import build_sim_dataset

UTC = dt.UTC
DAY0 = dt.datetime(2025, 8, 6, tzinfo=UTC)
MIN = dt.timedelta(minutes=1)


def row(minute, slot, gpu, state, tier, host, device="NVIDIA A100-SXM4-80GB"):
    return dict(snapshot_utc=DAY0 + dt.timedelta(minutes=minute, seconds=7), host=host,
                slot_name=f"{slot}@{host}", gpu_id=gpu, tier=tier, is_backfill_slot="backfill" in slot,
                slot_state=state, device_name=device,
                global_job_id="j#1.0#1" if state == "Claimed" else None)


def clean(rows):
    return conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS)


def by_key(table, *key):
    return {tuple(r[k] for k in key): r for r in table.to_pylist()}


def reference_fixture(step_minutes):
    """The original tool's test figures rebuilt as an 8-row fixture (its own file is not available).

    Two snapshots, ``step_minutes`` apart, so each falls in its own bucket:

    ====  ====================================================  =========================
    snap  rows                                                  per tier
    ====  ====================================================  =========================
    1     hp: slot1 GPU-p1 Unclaimed (priority)                 priority 0 of 1 = 0 %
          hp: backfill2 GPU-p1 Unclaimed (backfill)             shared 1 of 1 = 100 %
          hs: slot1_1 GPU-s1 Claimed (shared)                   backfill 0 of 1
    2     hp: slot1 GPU-p1 Unclaimed (priority)                 priority 1 of 2 = 50 %
          hp: backfill2_1 GPU-p1 Claimed (backfill)  <- trap    shared 1 of 2 = 50 %
          hp: slot1_1 GPU-p2 Claimed (priority)                 backfill 1 of 1
          hs: slot1_1 GPU-s1 Claimed (shared)
          hs: slot1 GPU-s2 Unclaimed (shared)
    ====  ====================================================  =========================

    Priority: mean pct (0 + 50) / 2 = 25.0 %, avg claimed 0.5, avg total 1.5 (avg_claimed/avg_total
    would be 33 %: the tool's figure is the mean of the per-bucket pct). Shared: (100 + 50) / 2 =
    75.0 %, 1.0 / 1.5. In snapshot 2 GPU-p1's primary slot is Unclaimed while its backfill slot runs a
    job: it must stay in the priority total (else priority would read 1 of 1 = 100 %, mean 50 %).
    """
    a, b = 0, step_minutes
    return [
        row(a, "slot1", "GPU-p1", "Unclaimed", "priority", "hp"),
        row(a, "backfill2", "GPU-p1", "Unclaimed", "backfill", "hp"),
        row(a, "slot1_1", "GPU-s1", "Claimed", "shared", "hs"),
        row(b, "slot1", "GPU-p1", "Unclaimed", "priority", "hp"),
        row(b, "backfill2_1", "GPU-p1", "Claimed", "backfill", "hp"),
        row(b, "slot1_1", "GPU-p2", "Claimed", "priority", "hp"),
        row(b, "slot1_1", "GPU-s1", "Claimed", "shared", "hs"),
        row(b, "slot1", "GPU-s2", "Unclaimed", "shared", "hs"),
    ]


@pytest.mark.parametrize("step_minutes", [15, 5])
def test_original_tool_reference_figures(step_minutes):
    # 15: the original tool's 15-minute buckets; 5: our 5-minute buckets with a 5-minute cadence.
    rows = reference_fixture(step_minutes)
    assert len(rows) == 8
    bucket = dt.timedelta(minutes=step_minutes)
    buckets, daily = allocation_from_table(clean(rows), DAY0, DAY0 + 2 * bucket, bucket)
    assert buckets.schema == ALLOCATION_BUCKETS.schema and daily.schema == ALLOCATION_DAILY.schema
    d = by_key(daily, "tier", "device_name")
    p, s = d[("priority", "ALL")], d[("shared", "ALL")]
    assert (p["allocation_pct"], p["avg_claimed_gpus"], p["avg_total_gpus"]) == (25.0, 0.5, 1.5)
    assert (s["allocation_pct"], s["avg_claimed_gpus"], s["avg_total_gpus"]) == (75.0, 1.0, 1.5)
    assert (p["buckets"], p["buckets_with_capacity"], p["buckets_expected"]) == (2, 2, 2)
    # the device row equals the ALL row (one device)
    assert d[("priority", "NVIDIA A100-SXM4-80GB")]["allocation_pct"] == 25.0
    bf, tot = d[("backfill", "ALL")], d[("TOTAL", "ALL")]
    assert (bf["allocation_pct"], bf["avg_claimed_gpus"], bf["avg_total_gpus"]) == (50.0, 0.5, 1.0)
    # TOTAL: snap 1 {p1 idle, s1 busy} = 1 of 2; snap 2 {p1 (backfill job), p2, s1 busy; s2 idle} = 3 of 4
    assert (tot["allocation_pct"], tot["avg_claimed_gpus"], tot["avg_total_gpus"]) == (62.5, 2.0, 3.0)
    b = by_key(buckets, "bucket_start_utc", "tier", "device_name")
    second = DAY0 + bucket
    assert (b[(second, "priority", "ALL")]["claimed_gpus"], b[(second, "priority", "ALL")]["total_gpus"]) == (1, 2)


def test_trap_prioritized_gpu_with_backfill_job():
    rows = [row(0, "slot1", "GPU-aaaaaaaa", "Unclaimed", "priority", "h1"),
            row(0, "backfill2_1", "GPU-aaaaaaaa", "Claimed", "backfill", "h1")]
    buckets, _ = allocation_from_table(clean(rows), DAY0, DAY0 + 5 * MIN)
    b = by_key(buckets, "tier", "device_name")
    assert (b[("priority", "ALL")]["claimed_gpus"], b[("priority", "ALL")]["total_gpus"]) == (0, 1)
    assert b[("priority", "ALL")]["allocation_pct"] == 0.0
    assert (b[("backfill", "ALL")]["claimed_gpus"], b[("backfill", "ALL")]["total_gpus"]) == (1, 1)
    assert (b[("TOTAL", "ALL")]["claimed_gpus"], b[("TOTAL", "ALL")]["total_gpus"]) == (1, 1)
    assert (b[("shared", "ALL")]["total_gpus"], b[("shared", "ALL")]["allocation_pct"]) == (0, None)
    # the state table calls the same GPU busy_backfill: tiers here are per slot row, not per state
    (state,) = states_from_table(clean(rows), DAY0, DAY0 + 5 * MIN).to_pylist()
    assert state["state"] == "busy_backfill"


def test_claimed_dynamic_slot_beats_partitionable_unclaimed_and_other_states_are_not_capacity():
    rows = [
        # partitionable slot lists both GPUs as Unclaimed; a dynamic slot holds GPU-1
        row(0, "slot1", "GPU-11111111", "Unclaimed", "shared", "h1"),
        row(0, "slot1", "GPU-22222222", "Unclaimed", "shared", "h1"),
        row(0, "slot1_1", "GPU-11111111", "Claimed", "shared", "h1"),
        # a drained host: neither claimed nor capacity in its tier...
        row(0, "slot1", "GPU-33333333", "Drained", "priority", "h2", device="NVIDIA H100 80GB HBM3"),
        # ...but its Unclaimed backfill slot is backfill capacity (TOTAL counts it; the state is na)
        row(0, "backfill2", "GPU-33333333", "Unclaimed", "backfill", "h2", device="NVIDIA H100 80GB HBM3"),
        row(0, "slot1", "GPU-44444444", "Owner", "priority", "h2", device="NVIDIA H100 80GB HBM3"),
    ]
    buckets, _ = allocation_from_table(clean(rows), DAY0, DAY0 + 5 * MIN)
    b = {(r["tier"], r["device_name"]): (r["claimed_gpus"], r["total_gpus"]) for r in buckets.to_pylist()}
    assert b[("shared", "NVIDIA A100-SXM4-80GB")] == (1, 2)
    assert b[("priority", "NVIDIA H100 80GB HBM3")] == (0, 0)
    assert b[("backfill", "NVIDIA H100 80GB HBM3")] == (0, 1)
    assert b[("TOTAL", "NVIDIA H100 80GB HBM3")] == (0, 1)
    assert b[("TOTAL", "ALL")] == (1, 3)
    states = {r["gpu_id"]: r["state"] for r in states_from_table(clean(rows), DAY0, DAY0 + 5 * MIN).to_pylist()}
    assert states["GPU-33333333"] == "na"  # the documented difference between TOTAL and non-na states


def test_buckets_use_the_state_snapshot_assignment():
    # 15-minute archive: each snapshot fills three 5-minute buckets by carrying forward (cadence 15
    # min, stale after 2 x 15 - 2.5 = 27.5 min: one missed snapshot is bridged); the gap from 45 to
    # 120 leaves buckets uncovered -- no rows, not zeros -- exactly where the states say no_snapshot.
    rows = [row(0, "slot1_1", "GPU-11111111", "Claimed", "shared", "h1")]
    rows += [row(m, "slot1", "GPU-11111111", "Unclaimed", "shared", "h1") for m in (15, 30, 45, 120)]
    end = DAY0 + 130 * MIN
    buckets, daily = allocation_from_table(clean(rows), DAY0, end)
    total = {r["bucket_start_utc"]: r["claimed_gpus"] for r in buckets.to_pylist()
             if (r["tier"], r["device_name"]) == ("TOTAL", "ALL")}
    states = {r["bucket_start_utc"]: r for r in states_from_table(clean(rows), DAY0, end).to_pylist()}
    covered = {t for t, r in states.items() if r["na_reason"] != "no_snapshot"}
    assert set(total) == covered
    assert [int((t - DAY0) / MIN) for t in sorted(total)] == [*range(0, 75, 5), 120, 125]
    for t, claimed in total.items():
        assert claimed == (1 if states[t]["state"].startswith("busy") else 0)
    d = by_key(daily, "tier", "device_name")[("TOTAL", "ALL")]
    assert (d["buckets"], d["buckets_with_capacity"], d["buckets_expected"]) == (17, 17, 26)
    assert d["allocation_pct"] == pytest.approx(100 * 3 / 17)  # claimed in the 3 buckets of snapshot 0


def test_empty_input_gives_empty_tables_with_schema():
    buckets, daily = allocation_from_table(CLEAN_SLOT_SNAPSHOTS.empty(), DAY0, DAY0 + dt.timedelta(days=1))
    assert buckets.num_rows == 0 and buckets.schema == ALLOCATION_BUCKETS.schema
    assert daily.num_rows == 0 and daily.schema == ALLOCATION_DAILY.schema


# -- simulated pool ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    # telemetry is not used here: a coarse interval keeps the fixture fast (slots and jobs are the same)
    ds = build_sim_dataset(tmp_path_factory.mktemp("alloc_sim"), telemetry_interval_s=900)
    out = {}
    for day in ds.days:
        start, end = ds.window(day)
        out[day] = allocation_for_day(ds.store, day, start, end)
    return ds, out


def test_sim_identities_with_gpu_states(sim):
    """Per bucket and device, exactly (not approximately):

    * TOTAL claimed = GPUs in busy_*; TOTAL total = GPUs not na + na GPUs that still have a Claimed /
      Unclaimed row in the bucket's snapshot (a drained primary with an Unclaimed backfill slot);
    * priority claimed = busy_prioritized; priority total = busy_prioritized + idle_prioritized +
      busy_backfill -- the trap at scale: a GPU lent to a backfill job stays in the priority total;
    * shared = busy_shared of busy_shared + idle_shared;
    * backfill claimed = busy_backfill; backfill total = busy_backfill + idle_prioritized (the
      simulator's backfill partitionable slot lists exactly the GPUs idle in primary and backfill).
    """
    ds, out = sim
    con = connect()
    for day in ds.days:
        buckets, _ = out[day]
        con.register("alloc", buckets)
        states_sql, sp = ds.store.relation_sql(GPU_STATES, [day])
        slots_sql, slp = ds.store.relation_sql(CLEAN_SLOT_SNAPSHOTS, [day])
        rows = con.sql(
            f"""
            WITH st AS (SELECT * FROM {states_sql}),
            slot AS (SELECT * FROM {slots_sql}),
            na_cap AS (  -- na GPUs with a Claimed/Unclaimed row in the snapshot the bucket used
                SELECT DISTINCT st.bucket_start_utc, st.gpu_id
                FROM st JOIN slot ON slot.gpu_id = st.gpu_id AND slot.snapshot_utc = st.snapshot_utc
                WHERE st.state = 'na' AND slot.slot_state IN ('Claimed', 'Unclaimed')
            ),
            exp AS (
                SELECT st.bucket_start_utc, st.device_name,
                    count(*) FILTER (WHERE state LIKE 'busy%') AS total_claimed,
                    count(*) FILTER (WHERE state <> 'na') + count(na_cap.gpu_id) AS total_total,
                    count(*) FILTER (WHERE state = 'busy_prioritized') AS prio_claimed,
                    count(*) FILTER (WHERE state IN ('busy_prioritized', 'idle_prioritized', 'busy_backfill'))
                        AS prio_total,
                    count(*) FILTER (WHERE state = 'busy_shared') AS shared_claimed,
                    count(*) FILTER (WHERE state IN ('busy_shared', 'idle_shared')) AS shared_total,
                    count(*) FILTER (WHERE state = 'busy_backfill') AS bf_claimed,
                    count(*) FILTER (WHERE state IN ('busy_backfill', 'idle_prioritized')) AS bf_total,
                    count(*) FILTER (WHERE na_reason = 'no_snapshot') AS uncovered
                FROM st LEFT JOIN na_cap USING (bucket_start_utc, gpu_id)
                GROUP BY ALL
            ),
            got AS (
                SELECT bucket_start_utc, device_name,
                    max(claimed_gpus) FILTER (WHERE tier = 'TOTAL') AS total_claimed,
                    max(total_gpus) FILTER (WHERE tier = 'TOTAL') AS total_total,
                    coalesce(max(claimed_gpus) FILTER (WHERE tier = 'priority'), 0) AS prio_claimed,
                    coalesce(max(total_gpus) FILTER (WHERE tier = 'priority'), 0) AS prio_total,
                    coalesce(max(claimed_gpus) FILTER (WHERE tier = 'shared'), 0) AS shared_claimed,
                    coalesce(max(total_gpus) FILTER (WHERE tier = 'shared'), 0) AS shared_total,
                    coalesce(max(claimed_gpus) FILTER (WHERE tier = 'backfill'), 0) AS bf_claimed,
                    coalesce(max(total_gpus) FILTER (WHERE tier = 'backfill'), 0) AS bf_total
                FROM alloc WHERE device_name <> 'ALL' GROUP BY ALL
            )
            SELECT count(*) AS n,
                count(*) FILTER (WHERE e.uncovered = 0 AND g.bucket_start_utc IS NULL) AS missing,
                count(*) FILTER (WHERE g.total_claimed = e.total_claimed AND g.total_total = e.total_total) AS total_ok,
                count(*) FILTER (WHERE g.prio_claimed = e.prio_claimed AND g.prio_total = e.prio_total) AS prio_ok,
                count(*) FILTER (WHERE g.shared_claimed = e.shared_claimed AND g.shared_total = e.shared_total)
                    AS shared_ok,
                count(*) FILTER (WHERE g.bf_claimed = e.bf_claimed AND g.bf_total = e.bf_total) AS bf_ok,
                sum(e.prio_total - e.prio_claimed) FILTER (WHERE true) AS prio_unclaimed,
                (SELECT count(*) FROM st WHERE state = 'busy_backfill') AS busy_backfill
            FROM exp e LEFT JOIN got g USING (bucket_start_utc, device_name)
            """,
            params=[*sp, *slp],
        ).fetchall()[0]
        con.unregister("alloc")
        n, missing, total_ok, prio_ok, shared_ok, bf_ok, _, busy_backfill = rows
        assert n == 288 * 5 and missing == 0, (day, rows)
        assert (total_ok, prio_ok, shared_ok, bf_ok) == (n, n, n, n), (day, rows)
        if day == ds.days[0]:
            assert busy_backfill > 100  # the trap case is exercised, not vacuous
    con.close()


def test_sim_all_rows_and_daily_means(sim):
    ds, out = sim
    for day in ds.days:
        buckets, daily = out[day]
        per = {}
        for r in buckets.to_pylist():
            per.setdefault((r["bucket_start_utc"], r["tier"]), {})[r["device_name"]] = r
        for devices in per.values():  # ALL = sum over devices, every bucket and tier
            assert devices["ALL"]["claimed_gpus"] == sum(r["claimed_gpus"] for d, r in devices.items() if d != "ALL")
            assert devices["ALL"]["total_gpus"] == sum(r["total_gpus"] for d, r in devices.items() if d != "ALL")
        d = by_key(daily, "tier", "device_name")
        rows = [r for r in buckets.to_pylist() if (r["tier"], r["device_name"]) == ("TOTAL", "ALL")]
        assert len(rows) == 288 == d[("TOTAL", "ALL")]["buckets"]
        pcts = [r["allocation_pct"] for r in rows if r["total_gpus"] > 0]
        assert d[("TOTAL", "ALL")]["allocation_pct"] == pytest.approx(sum(pcts) / len(pcts), rel=1e-12)
        assert d[("TOTAL", "ALL")]["avg_total_gpus"] == pytest.approx(sum(r["total_gpus"] for r in rows) / 288)
        # re-computing from the same buckets gives identical bytes (fixed summation order)
        start, end = ds.window(day)
        assert allocation_daily(buckets, start, end).equals(daily)


def test_sim_rerun_is_identical(sim):
    ds, out = sim
    day = ds.days[-1]
    start, end = ds.window(day)
    buckets, daily = allocation_for_day(ds.store, day, start, end)
    assert buckets.equals(out[day][0]) and daily.equals(out[day][1])


def test_parquet_path_equals_the_temp_table_path(sim):
    """The asset's allocation reads the clean Parquet partitions directly (allocation_for_day):
    exactly the tables the generic temp-table path computes from the same rows."""
    import pyarrow as pa

    from gpu_pipeline.lib.allocation import allocation_from_table

    ds, out = sim
    for day in ds.days:
        start, end = ds.window(day)
        prev = (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
        files = ds.store.files(CLEAN_SLOT_SNAPSHOTS, [prev, day])
        rows = pa.concat_tables([ds.store.read_table(CLEAN_SLOT_SNAPSHOTS, d) for d in (prev, day)
                                 if ds.store.has_partition(CLEAN_SLOT_SNAPSHOTS, d)])
        assert files and rows.num_rows > 10_000
        buckets, daily = allocation_from_table(rows, start, end)
        assert out[day][0].num_rows > 1_000
        assert out[day][0].equals(buckets) and out[day][1].equals(daily)
    start, end = ds.window(ds.days[0])
    empty_store = type(ds.store)(ds.store.root / "nothing")
    assert allocation_for_day(empty_store, ds.days[0], start, end)[0].num_rows == 0
