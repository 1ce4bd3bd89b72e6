"""Backfill availability periods (DESIGN.md 5.3): hand-computed cases, then the simulator's truth."""

from __future__ import annotations

import datetime as dt
import math
import statistics
from zoneinfo import ZoneInfo

import duckdb
import pyarrow as pa
import pytest

from gpu_pipeline.lib.availability import (
    AVAILABILITY_PERIODS,
    AVAILABILITY_SUMMARY,
    availability_periods_from_tables,
    availability_summary_from_table,
    compute_availability_periods,
    compute_availability_summary,
    stitch_periods,
)
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES, conform
from gpu_pipeline.lib.states import states_from_table
from gpu_pipeline.lib.store import connect
from gpu_pipeline.lib.timeutil import day_window
from gpu_pipeline_tests.simdata import build_sim_dataset

UTC = dt.UTC
DAY0 = dt.datetime(2025, 8, 6, tzinfo=UTC)
B = dt.timedelta(minutes=5)
HOUR = DAY0 + dt.timedelta(hours=1)

# --------------------------------------------------------------------------------------------
# Hand-built 5-minute state tables


def snap(start: dt.datetime, k: int) -> dt.datetime:
    """Snapshot time of bucket k: 7 s after the bucket start plus k seconds of collector jitter."""
    return start + k * B + dt.timedelta(seconds=7 + k % 5)


def cell(code: str) -> dict:
    """I idle_prioritized, S idle_shared, K idle_backfill, P busy_prioritized, H busy_shared,
    B:<job> busy_backfill, R na (Drained), D na (dropout), N na (no_snapshot)."""
    kind, _, job = code.partition(":")
    return {
        "I": dict(state="idle_prioritized", tier="priority"),
        "S": dict(state="idle_shared", tier="shared"),
        "K": dict(state="idle_backfill", tier="backfill"),
        "P": dict(state="busy_prioritized", tier="priority", global_job_id=job or "p#1.0#1"),
        "H": dict(state="busy_shared", tier="shared", global_job_id=job or "h#1.0#1"),
        "B": dict(state="busy_backfill", tier="backfill", global_job_id=job or "bf#1.0#1"),
        "R": dict(state="na", na_reason="Drained", slot_state="Drained"),
        "D": dict(state="na", na_reason="dropout"),
        "N": dict(state="na", na_reason="no_snapshot"),
    }[kind]


def gpu_rows(gpu: str, start: dt.datetime, codes: list[str], host: str = "h1",
             device: str = "NVIDIA A100", first_k: int = 0) -> list[dict]:
    rows = []
    for i, code in enumerate(codes):
        k = first_k + i
        c = cell(code)
        seen = c.get("na_reason") not in ("dropout", "no_snapshot")
        row = dict.fromkeys(GPU_STATES.schema.names)  # every key in every row (from_pylist infers from row 0)
        row.update(bucket_start_utc=start + k * B, gpu_id=gpu, host=host, device_name=device,
                   snapshot_utc=snap(start, k) if seen else None, n_slot_rows=1 if seen else 0, **c)
        rows.append(row)
    return rows


def states(*row_lists: list[dict]) -> pa.Table:
    rows = [r for rl in row_lists for r in rl]
    return conform(pa.Table.from_pylist(rows), GPU_STATES) if rows else GPU_STATES.empty()


def periods(table: pa.Table, start=DAY0, end=HOUR, prev: pa.Table | None = None, snapshots=None) -> list[dict]:
    out = availability_periods_from_tables(table, start, end, previous_states=prev, snapshots=snapshots)
    assert out.schema == AVAILABILITY_PERIODS.schema
    return out.to_pylist()


def only(rows: list[dict], gpu: str) -> list[dict]:
    return [r for r in rows if r["gpu_id"] == gpu]


# --------------------------------------------------------------------------------------------
# Hand-computed cases


def test_end_reasons_exact_times_and_resolution():
    S0 = DAY0
    t = states(
        gpu_rows("g1", S0, ["P", "I", "I", "B:bf#7.0#1", "B:bf#7.0#1"] + ["P"] * 7),
        gpu_rows("g2", S0, ["S", "S", "S", "S", "H"] + ["H"] * 7),
        gpu_rows("g3", S0, ["P", "I", "R"] + ["R"] * 9),
        gpu_rows("g4", S0, ["P", "I", "I", "D"] + ["P"] * 8),
        gpu_rows("g5", S0, ["P"] * 6 + ["I"] * 6),
        gpu_rows("g6", S0, ["P", "K", "I", "K", "P"] + ["P"] * 7),
    )
    out = periods(t)
    (g1,) = only(out, "g1")
    assert (g1["start_utc"], g1["end_utc"]) == (snap(S0, 1), snap(S0, 3))
    assert (g1["end_reason"], g1["backfill_job_id"], g1["tier"]) == ("backfill_claimed", "bf#7.0#1", "priority")
    assert g1["duration_s"] == (snap(S0, 3) - snap(S0, 1)).total_seconds()
    # resolution: the longer of the snapshot intervals before the start (bucket 0 -> 1) and before the end
    assert g1["resolution_s"] == max((snap(S0, 1) - snap(S0, 0)).total_seconds(),
                                     (snap(S0, 3) - snap(S0, 2)).total_seconds())
    assert g1["starts_before_day"] is False and g1["continues_after_day"] is False

    (g2,) = only(out, "g2")  # available in the first bucket and no previous day given: unknown
    assert g2["starts_before_day"] is None and g2["start_utc"] == snap(S0, 0)
    assert (g2["end_reason"], g2["tier"], g2["end_utc"]) == ("primary_claimed", "shared", snap(S0, 4))
    assert g2["backfill_job_id"] is None

    (g3,) = only(out, "g3")
    assert (g3["end_reason"], g3["end_utc"]) == ("drained", snap(S0, 2))

    (g4,) = only(out, "g4")  # dropout: dated by the bucket's snapshot (from the other GPUs' rows)
    assert (g4["end_reason"], g4["end_utc"]) == ("dropout", snap(S0, 3))

    (g5,) = only(out, "g5")
    assert (g5["end_reason"], g5["end_utc"], g5["continues_after_day"]) == ("open", HOUR, True)
    assert g5["start_utc"] == snap(S0, 6)

    (g6,) = only(out, "g6")  # idle_backfill counts as available; the period takes the primary tier seen
    assert (g6["start_utc"], g6["end_utc"], g6["tier"]) == (snap(S0, 1), snap(S0, 4), "priority")
    assert {r["gpu_id"] for r in out} == {"g1", "g2", "g3", "g4", "g5", "g6"}


@pytest.mark.parametrize(("slot", "want"), [("slot1@h1", "primary_claimed"),
                                            ("backfill1_1@h1", "backfill_claimed")])
def test_a_slot_matched_after_the_period_is_a_claim(slot, want):
    """A slot seen Matched (a job being started on it, not named yet) after an idle stretch: the
    period ends with a claim of that slot's kind, not as drained (a Drained or Owner slot's end)."""
    rows = gpu_rows("g1", DAY0, ["P"] + ["I"] * 5 + ["R"] + ["P"] * 5)
    rows[6].update(na_reason="Matched", slot_state="Matched", slot_name=slot)
    (p,) = periods(states(rows))
    assert (p["end_reason"], p["end_utc"]) == (want, snap(DAY0, 6))
    # a Drained slot still ends it as drained
    (p,) = periods(states(gpu_rows("g1", DAY0, ["P"] + ["I"] * 5 + ["R"] + ["P"] * 5)))
    assert p["end_reason"] == "drained"


def test_idle_backfill_only_gets_backfill_tier():
    out = periods(states(gpu_rows("g", DAY0, ["P", "K", "K", "P"] + ["P"] * 8)))
    assert [(r["tier"], r["start_utc"], r["end_utc"]) for r in out] == [("backfill", snap(DAY0, 1), snap(DAY0, 3))]


def test_dropout_in_the_middle_of_a_period():
    t = states(
        gpu_rows("g0", DAY0, ["P"] * 12),  # a GPU that is always seen: gives the snapshot times
        gpu_rows("g", DAY0, ["P", "I", "I", "D", "D", "I", "I", "H:h#2.0#1"] + ["H"] * 4),
    )
    a, b = only(periods(t), "g")
    assert (a["start_utc"], a["end_utc"], a["end_reason"]) == (snap(DAY0, 1), snap(DAY0, 3), "dropout")
    assert (b["start_utc"], b["end_utc"], b["end_reason"]) == (snap(DAY0, 5), snap(DAY0, 7), "primary_claimed")
    assert b["starts_before_day"] is False
    # the second period's start is bounded by the snapshot before it (bucket 4, where g was absent)
    assert b["resolution_s"] == max((snap(DAY0, 5) - snap(DAY0, 4)).total_seconds(),
                                    (snap(DAY0, 7) - snap(DAY0, 6)).total_seconds())


def test_whole_pool_missing_is_dated_by_clean_snapshots_when_given():
    # Bucket 2: every GPU absent from the snapshot (the collector saw nobody), so the states carry no
    # snapshot time; the clean snapshots know when that snapshot was taken.
    t = states(gpu_rows("g", DAY0, ["P", "I", "D", "I"] + ["I"] * 8))
    without = only(periods(t), "g")
    assert without[0]["end_utc"] == DAY0 + 2 * B  # fallback: the bucket start
    snaps = pa.table({"snapshot_utc": pa.array([snap(DAY0, k) for k in range(12)], pa.timestamp("us", tz="UTC"))})
    with_clean = only(periods(t, snapshots=snaps), "g")
    assert with_clean[0]["end_utc"] == snap(DAY0, 2)
    assert with_clean[0]["end_reason"] == "dropout"
    assert with_clean[1]["start_utc"] == snap(DAY0, 3) and with_clean[1]["end_reason"] == "open"


def test_no_snapshot_bucket_ends_a_period_as_dropout():
    t = states(gpu_rows("g", DAY0, ["I", "I", "N", "N", "I"] + ["I"] * 7),
               gpu_rows("g0", DAY0, ["P", "P", "N", "N", "P"] + ["P"] * 7))
    a, b = only(periods(t), "g")
    assert (a["end_utc"], a["end_reason"]) == (DAY0 + 2 * B, "dropout")
    assert b["start_utc"] == snap(DAY0, 4)
    # the start is bounded by the last observation before it (the no_snapshot bucket 3 start)
    assert b["resolution_s"] == (snap(DAY0, 4) - (DAY0 + 3 * B)).total_seconds()


def test_gpu_seen_in_two_slots_in_one_bucket():
    """A prioritized GPU appears in its primary slot and in the backfill slot at once (DESIGN 5.1):
    the ranked state decides, and the period is reported once."""
    def row(minute, slot, state, tier, job=None, second=7):
        return dict(snapshot_utc=DAY0 + dt.timedelta(minutes=minute, seconds=second), host="h1",
                    slot_name=f"{slot}@h1", gpu_id="GPU-aaaaaaaa", tier=tier, is_backfill_slot="backfill" in slot,
                    slot_state=state, device_name="NVIDIA A100", global_job_id=job,
                    remote_owner="u" if job else None)

    rows = [
        row(0, "slot1", "Unclaimed", "priority"), row(0, "slot1_1", "Claimed", "priority", "p#1.0#1"),
        row(5, "slot1", "Unclaimed", "priority"), row(5, "backfill2", "Unclaimed", "backfill"),
        row(10, "slot1", "Unclaimed", "priority"), row(10, "backfill2", "Unclaimed", "backfill"),
        # two snapshots in bucket 15: still idle at 15:07, a backfill job at 17:07 -> busy_backfill wins
        row(15, "slot1", "Unclaimed", "priority"), row(15, "backfill2", "Unclaimed", "backfill"),
        row(17, "slot1", "Unclaimed", "priority"), row(17, "backfill2_1", "Claimed", "backfill", "bf#9.0#1"),
        row(20, "slot1", "Unclaimed", "priority"), row(20, "backfill2_1", "Claimed", "backfill", "bf#9.0#1"),
    ]
    st = states_from_table(conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS), DAY0, DAY0 + 5 * B)
    by_bucket = {r["bucket_start_utc"]: r for r in st.to_pylist()}
    assert by_bucket[DAY0 + B]["state"] == "idle_prioritized" and by_bucket[DAY0 + B]["n_slot_rows"] == 2
    assert by_bucket[DAY0 + 3 * B]["state"] == "busy_backfill" and by_bucket[DAY0 + 3 * B]["n_slot_rows"] == 4
    (p,) = periods(st, DAY0, DAY0 + 5 * B)
    assert (p["start_utc"], p["tier"]) == (DAY0 + dt.timedelta(minutes=5, seconds=7), "priority")
    # the period ends at the snapshot the winning busy_backfill row came from
    assert p["end_utc"] == DAY0 + dt.timedelta(minutes=17, seconds=7)
    assert (p["end_reason"], p["backfill_job_id"]) == ("backfill_claimed", "bf#9.0#1")


def _day(day: str, tz: str = "UTC"):
    s, e = day_window(day, tz)
    return s, e, int((e - s) / B)


def test_period_crossing_midnight_is_clipped_flagged_and_stitched():
    s1, e1, n1 = _day("2025-08-05")
    s2, e2, n2 = _day("2025-08-06")
    day1 = states(
        gpu_rows("g", s1, ["P"] * 280 + ["I"] * (n1 - 280)),
        gpu_rows("c", s1, ["P"] * 100 + ["I"] * (n1 - 100)),  # closes in the first snapshot of day 2
    )
    day2 = states(
        gpu_rows("g", s2, ["I"] * 10 + ["B:bf#3.0#1"] + ["P"] * (n2 - 11)),
        gpu_rows("c", s2, ["P"] * n2),
    )
    d1 = periods(day1, s1, e1)
    (g1,) = only(d1, "g")
    assert (g1["start_utc"], g1["end_utc"], g1["end_reason"]) == (snap(s1, 280), e1, "open")
    assert g1["continues_after_day"] is True and g1["starts_before_day"] is False

    d2 = periods(day2, s2, e2, prev=day1)
    (g2,) = only(d2, "g")
    assert (g2["start_utc"], g2["end_utc"], g2["end_reason"]) == (s2, snap(s2, 10), "backfill_claimed")
    assert g2["starts_before_day"] is True and g2["continues_after_day"] is False
    # c: available at the end of day 1, busy at the first snapshot of day 2 -> a closing piece that
    # carries the real end reason (the period ends at the first snapshot seen otherwise)
    (c2,) = only(d2, "c")
    assert (c2["start_utc"], c2["end_utc"], c2["end_reason"]) == (s2, snap(s2, 0), "primary_claimed")
    assert c2["starts_before_day"] is True and c2["duration_s"] == 7.0

    # without the previous day: unknown whether it started before the day
    (g2u,) = only(periods(day2, s2, e2), "g")
    assert g2u["starts_before_day"] is None and g2u["start_utc"] == snap(s2, 0)

    pieces = conform(pa.Table.from_pylist(d1 + d2), AVAILABILITY_PERIODS)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("pieces", pieces)
    whole = {r["gpu_id"]: r for r in stitch_periods(con, "pieces", []).to_pylist()}
    g = whole["g"]
    assert (g["start_utc"], g["end_utc"], g["end_reason"], g["n_pieces"]) == (snap(s1, 280), snap(s2, 10),
                                                                              "backfill_claimed", 2)
    assert g["duration_s"] == (snap(s2, 10) - snap(s1, 280)).total_seconds()
    assert g["backfill_job_id"] == "bf#3.0#1" and g["continues_after_day"] is False
    assert (whole["c"]["end_utc"], whole["c"]["end_reason"]) == (snap(s2, 0), "primary_claimed")

    # the summary counts each whole period once, on the day it ends, with its whole duration
    sm1 = {(r["device_name"], r["tier"]): r for r in availability_summary_from_table(pieces, s1, e1).to_pylist()}
    assert sm1[("ALL", "ALL")]["periods"] == 0 and sm1[("ALL", "ALL")]["periods_open_at_day_end"] == 2
    sm2 = {(r["device_name"], r["tier"]): r for r in availability_summary_from_table(pieces, s2, e2).to_pylist()}
    a = sm2[("ALL", "ALL")]
    assert (a["periods"], a["backfill_claims"], a["periods_open_at_day_end"]) == (2, 1, 0)
    assert a["time_to_claim_mean_s"] == pytest.approx(g["duration_s"])
    assert a["duration_max_s"] == pytest.approx(max(g["duration_s"], whole["c"]["duration_s"]))


def test_a_period_open_at_midnight_ends_in_the_next_day_even_without_a_row_there():
    """Two periods open at the end of day 1 whose ends day 2's rows did not show: ``v``'s host is
    down all day 2 (no row at all), and ``z``'s first bucket of day 2 carries a Drained snapshot
    taken 10 s before midnight. Each gets its closing piece -- ``v`` a dropout at day 2's first
    snapshot, ``z`` an empty one at midnight -- and the summary counts both once, on day 2."""
    s1, e1, n1 = _day("2025-08-05")
    s2, e2, n2 = _day("2025-08-06")
    day1 = states(gpu_rows("v", s1, ["P"] * 280 + ["I"] * (n1 - 280), host="h2"),
                  gpu_rows("z", s1, ["P"] * 200 + ["S"] * (n1 - 200)),
                  gpu_rows("k", s1, ["H"] * n1))
    z2 = gpu_rows("z", s2, ["R"] * n2)
    z2[0]["snapshot_utc"] = s2 - dt.timedelta(seconds=10)  # the last snapshot of day 1, carried
    day2 = states(z2, gpu_rows("k", s2, ["H"] * n2))
    snaps = pa.table({"snapshot_utc": pa.array([snap(s2, k) for k in range(n2)], pa.timestamp("us", tz="UTC"))})
    d1, d2 = periods(day1, s1, e1), periods(day2, s2, e2, prev=day1, snapshots=snaps)
    assert {r["gpu_id"]: r["end_reason"] for r in d1} == {"v": "open", "z": "open"}
    # without the clean snapshots, the day's first snapshot in the states' rows: k's (z's first
    # bucket carries one from before midnight, which is not the day's)
    (v_no_clean,) = only(periods(day2, s2, e2, prev=day1), "v")
    assert (v_no_clean["end_utc"], v_no_clean["end_reason"]) == (snap(s2, 0), "dropout")
    # the collector missed the day's first bucket: v's piece runs to the first snapshot of the day,
    # in the second bucket (not to the first bucket's carried snapshot, clipped to an empty piece)
    late = snaps.filter(pa.compute.greater_equal(snaps["snapshot_utc"], pa.scalar(snap(s2, 1))))
    day2_late = states(z2, gpu_rows("k", s2, ["H"] * n2))
    day2_late = day2_late.set_column(
        day2_late.schema.get_field_index("snapshot_utc"), "snapshot_utc",
        pa.compute.if_else(pa.compute.equal(day2_late["bucket_start_utc"], pa.scalar(s2)),
                           pa.scalar(s2 - dt.timedelta(seconds=10), day2_late.schema.field("snapshot_utc").type),
                           day2_late["snapshot_utc"]))
    for snapshots in (late, None):
        (v_late,) = only(periods(day2_late, s2, e2, prev=day1, snapshots=snapshots), "v")
        assert (v_late["end_utc"], v_late["end_reason"]) == (snap(s2, 1), "dropout")
        assert v_late["duration_s"] == (snap(s2, 1) - s2).total_seconds()
    (v,) = only(d2, "v")
    assert (v["start_utc"], v["end_utc"], v["end_reason"], v["host"]) == (s2, snap(s2, 0), "dropout", "h2")
    assert v["starts_before_day"] is True and v["continues_after_day"] is False and v["duration_s"] == 7.0
    (z,) = only(d2, "z")
    assert (z["start_utc"], z["end_utc"], z["end_reason"], z["duration_s"]) == (s2, s2, "drained", 0.0)
    pieces = conform(pa.Table.from_pylist(d1 + d2), AVAILABILITY_PERIODS)
    sm1 = {(r["device_name"], r["tier"]): r for r in availability_summary_from_table(pieces, s1, e1).to_pylist()}
    assert (sm1[("ALL", "ALL")]["periods"], sm1[("ALL", "ALL")]["periods_open_at_day_end"]) == (0, 2)
    sm2 = {(r["device_name"], r["tier"]): r for r in availability_summary_from_table(pieces, s2, e2).to_pylist()}
    assert (sm2[("ALL", "ALL")]["periods"], sm2[("ALL", "ALL")]["periods_open_at_day_end"]) == (2, 0)
    assert sm2[("ALL", "ALL")]["duration_max_s"] == pytest.approx((s2 - snap(s1, 200)).total_seconds())  # z
    # a GPU seen in day 2 gets no such piece, nor one that was busy at day 1's end
    assert {r["gpu_id"] for r in d2} == {"v", "z"}


def test_empty_day_has_full_schema():
    out = availability_periods_from_tables(GPU_STATES.empty(), DAY0, DAY0 + dt.timedelta(days=1))
    assert out.num_rows == 0 and out.schema == AVAILABILITY_PERIODS.schema
    sm = availability_summary_from_table(out, DAY0, DAY0 + dt.timedelta(days=1))
    assert sm.schema == AVAILABILITY_SUMMARY.schema
    assert sm.to_pylist() == [dict(device_name="ALL", tier="ALL", periods=0, periods_open_at_day_end=0,
                                   periods_start_truncated=0, available_gpu_hours=0.0, duration_mean_s=None,
                                   duration_median_s=None, duration_p90_s=None, duration_min_s=None,
                                   duration_max_s=None, duration_std_s=None, backfill_claims=0,
                                   time_to_claim_mean_s=None, time_to_claim_median_s=None,
                                   time_to_claim_p90_s=None, resolution_median_s=None)]


@pytest.mark.parametrize("day, hours", [("2025-03-09", 23), ("2025-11-02", 25)])
def test_dst_day_in_a_local_partition_zone(day, hours):
    tz = ZoneInfo("America/Chicago")
    s, e, n = _day(day, "America/Chicago")
    assert n == hours * 12

    def k_at(local_h: int, local_m: int = 0) -> int:
        t = dt.datetime.combine(dt.date.fromisoformat(day), dt.time(local_h, local_m), tz).astimezone(UTC)
        return int((t - s) / B)

    k0, k1 = (k_at(3), k_at(21)) if hours == 23 else (k_at(0, 30), k_at(3))
    prev_day = states(gpu_rows("all_day", s - B, ["I"]), gpu_rows("g", s - B, ["P"]))
    t = states(
        gpu_rows("all_day", s, ["I"] * n),
        gpu_rows("g", s, ["P"] * k0 + ["I"] * (k1 - k0) + ["H"] * (n - k1)),
    )
    out = periods(t, s, e, prev=prev_day)
    (a,) = only(out, "all_day")
    assert (a["start_utc"], a["end_utc"], a["duration_s"]) == (s, e, hours * 3600.0)
    assert a["starts_before_day"] is True and a["continues_after_day"] is True
    (g,) = only(out, "g")
    assert (g["start_utc"], g["end_utc"]) == (snap(s, k0), snap(s, k1))
    # 03:00 -> 21:00 on the spring-forward day is 18 real hours; 00:30 -> 03:00 on the fall-back day
    # crosses the repeated 01:00-02:00 hour: 3.5 real hours
    expected_h = 18.0 if hours == 23 else 3.5
    assert g["duration_s"] == pytest.approx(expected_h * 3600 + (k1 % 5) - (k0 % 5))
    sm = {(r["device_name"], r["tier"]): r for r in availability_summary_from_table(
        conform(pa.Table.from_pylist(out), AVAILABILITY_PERIODS), s, e).to_pylist()}
    assert sm[("ALL", "ALL")]["available_gpu_hours"] == pytest.approx(hours + g["duration_s"] / 3600)


def _q(values: list[float], q: float) -> float:
    """Linear-interpolated quantile (DuckDB quantile_cont, numpy 'linear')."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def test_summary_statistics_hand_computed():
    d0 = dt.datetime(2025, 8, 5, tzinfo=UTC)
    d1, d2 = d0 + dt.timedelta(days=1), d0 + dt.timedelta(days=2)

    def piece(gpu, dev, tier, s, e, reason, before=False, job=None):
        return dict(gpu_id=gpu, host="h-" + gpu, device_name=dev, tier=tier, start_utc=s, end_utc=e,
                    duration_s=(e - s).total_seconds(), end_reason=reason, backfill_job_id=job, resolution_s=300.0,
                    starts_before_day=before, continues_after_day=reason == "open")

    h = dt.timedelta(hours=1)
    pieces = conform(pa.Table.from_pylist([
        piece("a", "X", "priority", d0 + 22 * h, d1, "open"),  # day 0 part of a 3-hour period
        piece("a", "X", "priority", d1, d1 + h, "backfill_claimed", before=True, job="j1"),
        piece("b", "X", "priority", d1 + 2 * h, d1 + 2.5 * h, "primary_claimed"),
        piece("c", "Y", "shared", d1 + 5 * h, d1 + 5 * h + dt.timedelta(seconds=6000), "backfill_claimed", job="j2"),
        piece("e", "X", "priority", d1 + 20 * h, d2, "open"),  # still open at the day end
        piece("f", "X", "priority", d1, d1 + dt.timedelta(minutes=20), "dropout", before=None),  # start unknown
        piece("z", "X", "priority", d2, d2 + h, "dropout", before=True),  # the next day: ignored
    ]), AVAILABILITY_PERIODS)
    rows = {(r["device_name"], r["tier"]): r for r in availability_summary_from_table(pieces, d1, d2).to_pylist()}
    assert set(rows) == {("X", "priority"), ("Y", "shared"), ("X", "ALL"), ("Y", "ALL"),
                         ("ALL", "priority"), ("ALL", "shared"), ("ALL", "ALL")}

    def check(key, durations, claims, open_, truncated, hours):
        r = rows[key]
        assert (r["periods"], r["periods_open_at_day_end"], r["periods_start_truncated"]) == (
            len(durations), open_, truncated), key
        assert r["duration_mean_s"] == pytest.approx(statistics.mean(durations))
        assert r["duration_median_s"] == pytest.approx(statistics.median(durations))
        assert r["duration_p90_s"] == pytest.approx(_q(durations, 0.9))
        assert (r["duration_min_s"], r["duration_max_s"]) == (min(durations), max(durations))
        if len(durations) > 1:
            assert r["duration_std_s"] == pytest.approx(statistics.stdev(durations))
        else:
            assert r["duration_std_s"] is None
        assert r["backfill_claims"] == len(claims)
        if claims:
            assert r["time_to_claim_mean_s"] == pytest.approx(statistics.mean(claims))
            assert r["time_to_claim_median_s"] == pytest.approx(statistics.median(claims))
            assert r["time_to_claim_p90_s"] == pytest.approx(_q(claims, 0.9))
        else:
            assert r["time_to_claim_mean_s"] is None
        assert r["available_gpu_hours"] == pytest.approx(hours)

    # whole period a = 3 h (stitched over midnight), b 0.5 h, c 6000 s, f 20 min (truncated)
    check(("ALL", "ALL"), [10800, 1800, 6000, 1200], [10800, 6000], 1, 1, 1 + 0.5 + 6000 / 3600 + 4 + 1 / 3)
    check(("X", "priority"), [10800, 1800, 1200], [10800], 1, 1, 1 + 0.5 + 4 + 1 / 3)
    check(("X", "ALL"), [10800, 1800, 1200], [10800], 1, 1, 1 + 0.5 + 4 + 1 / 3)
    check(("Y", "shared"), [6000], [6000], 0, 0, 6000 / 3600)
    check(("ALL", "shared"), [6000], [6000], 0, 0, 6000 / 3600)


# --------------------------------------------------------------------------------------------
# The simulator's ground truth


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    # 120 GPUs (about 700 true periods over the 2 days) so that the 99 % bars mean something;
    # telemetry is not used here, so it is sampled sparsely to keep the build fast.
    ds = build_sim_dataset(tmp_path_factory.mktemp("availability_sim"), gpus=120, telemetry_interval_s=900)
    con = connect()
    for i, day in enumerate(ds.days):
        s, e = ds.window(day)
        prev = ds.days[i - 1] if i else (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
        sql, params = ds.store.relation_sql(GPU_STATES, [prev, day])
        ssql, sparams = ds.store.relation_sql(CLEAN_SLOT_SNAPSHOTS, [day])
        table = compute_availability_periods(con, sql, params, s, e, ssql, sparams)
        ds.store.write_partition(AVAILABILITY_PERIODS, day, table)
    con.close()
    return ds


def _truth_db(ds) -> duckdb.DuckDBPyConnection:
    """Tables: inf (inferred pieces), snaps (snapshot times), ti (true state intervals), days,
    tp (true periods clipped to each day, with whether their boundaries and end reason are
    resolvable by the snapshots)."""
    con = connect()
    files = ds.store.files(AVAILABILITY_PERIODS, ds.days)
    con.execute("CREATE TEMP TABLE inf AS SELECT *, CAST(date AS VARCHAR) AS day FROM read_parquet(?, hive_partitioning=true)",
                [files])
    con.execute("CREATE TEMP TABLE snaps AS SELECT DISTINCT snapshot_utc AS t FROM read_parquet(?)",
                [ds.store.files(CLEAN_SLOT_SNAPSHOTS, ds.days)])
    con.execute("CREATE TEMP TABLE ti AS SELECT * FROM read_parquet(?)", [str(ds.truth / "gpu_state_intervals.parquet")])
    con.execute("CREATE TEMP TABLE days (day VARCHAR, ds TIMESTAMPTZ, de TIMESTAMPTZ)")
    for day in ds.days:
        con.execute("INSERT INTO days VALUES (?, ?, ?)", [day, *ds.window(day)])
    con.execute(
        """
        CREATE TEMP TABLE tp AS
        WITH clipped AS (
            SELECT t.gpu_id, d.day, d.ds, d.de,
                   greatest(t.start_utc, d.ds) AS s, least(t.end_utc, d.de) AS e,
                   CASE WHEN t.end_utc > d.de THEN 'open' ELSE t.end_reason END AS reason,
                   t.backfill_job_id
            FROM read_parquet(?) t JOIN days d ON t.start_utc < d.de AND t.end_utc > d.ds
        ),
        -- the true state at a snapshot instant
        at_snap AS (SELECT s.t, ti.gpu_id, ti.state, ti.start_utc FROM snaps s JOIN ti
                    ON s.t >= ti.start_utc AND s.t < ti.end_utc)
        SELECT c.*,
            EXISTS (SELECT 1 FROM snaps WHERE t >= c.s AND t < c.e) AS seen,
            -- the snapshot before the start saw the GPU otherwise (or there was none in the day)
            coalesce((SELECT arg_max(a.state, a.t) FROM at_snap a
                      WHERE a.gpu_id = c.gpu_id AND a.t < c.s AND a.t >= c.ds) NOT LIKE 'idle%', true)
                AS start_ok,
            coalesce((SELECT arg_min(a.state, a.t) FROM at_snap a
                      WHERE a.gpu_id = c.gpu_id AND a.t >= c.e AND a.t < c.de) NOT LIKE 'idle%', true)
                AS end_ok,
            -- the first snapshot after the end falls in the interval that ended the period
            c.e < c.de AND coalesce((SELECT arg_min(a.start_utc, a.t) FROM at_snap a
                      WHERE a.gpu_id = c.gpu_id AND a.t >= c.e AND a.t < c.de) = c.e, false) AS reason_ok
        FROM clipped c
        """,
        [str(ds.truth / "availability_periods.parquet")],
    )
    return con


def test_periods_match_the_simulators_truth(sim):
    con = _truth_db(sim)
    # every true period (clipped to the day) against the inferred pieces of the same GPU and day:
    # start and end within the row's resolution (one snapshot interval; snapshots lag the events)
    con.execute(
        """
        CREATE TEMP TABLE m AS
        SELECT tp.*, i.start_utc AS i_start, i.end_utc AS i_end, i.end_reason AS i_reason,
               i.backfill_job_id AS i_job, i.resolution_s,
               epoch(i.start_utc) - epoch(tp.s) AS start_err_s, epoch(i.end_utc) - epoch(tp.e) AS end_err_s
        FROM tp LEFT JOIN inf i
          ON i.gpu_id = tp.gpu_id AND i.day = tp.day
         AND abs(epoch(i.start_utc) - epoch(tp.s)) <= i.resolution_s
         AND abs(epoch(i.end_utc) - epoch(tp.e)) <= i.resolution_s
        """
    )
    n, matched, resolvable, res_matched = con.execute(
        "SELECT count(*), count(i_start), count(*) FILTER (seen AND start_ok AND end_ok), "
        "count(i_start) FILTER (seen AND start_ok AND end_ok) FROM m").fetchone()
    assert con.execute("SELECT count(*) FROM (SELECT gpu_id, s FROM m GROUP BY ALL HAVING count(*) > 1)"
                       ).fetchone()[0] == 0
    errs = con.execute(
        "SELECT quantile_cont(start_err_s, [0.5, 0.9, 0.99, 1.0]), quantile_cont(end_err_s, [0.5, 0.9, 0.99, 1.0]), "
        "min(start_err_s), min(end_err_s), max(resolution_s), "
        "count(*) FILTER (i_start IS NOT NULL AND (start_err_s > resolution_s OR end_err_s > resolution_s)) "
        "FROM m WHERE i_start IS NOT NULL").fetchone()
    agree, agree_ok, n_ok, job_agree, n_claimed = con.execute(
        "SELECT count(*) FILTER (reason = i_reason), count(*) FILTER (reason_ok AND reason = i_reason), "
        "count(*) FILTER (reason_ok), count(*) FILTER (reason = 'backfill_claimed' AND i_job = backfill_job_id), "
        "count(*) FILTER (reason = 'backfill_claimed' AND i_reason = 'backfill_claimed') "
        "FROM m WHERE i_start IS NOT NULL").fetchone()
    n_inf, inf_matched = con.execute(
        "SELECT (SELECT count(*) FROM inf), count(DISTINCT (i_start, gpu_id)) FROM m WHERE i_start IS NOT NULL"
    ).fetchone()
    unmatched = con.execute(
        "SELECT count(*) FILTER (NOT seen), count(*) FILTER (seen AND NOT (start_ok AND end_ok)), "
        "count(*) FILTER (seen AND start_ok AND end_ok) FROM m WHERE i_start IS NULL").fetchone()
    print(f"\navailability vs truth ({', '.join(sim.days)}): {n} true periods (clipped per day), "
          f"{matched} matched = {matched / n:.1%}; resolvable by the snapshots: {resolvable}, "
          f"matched {res_matched} = {res_matched / resolvable:.1%}")
    print(f"  unmatched: {unmatched[0]} shorter than a snapshot interval (no snapshot inside), "
          f"{unmatched[1]} next to an interruption no snapshot saw (merged with a neighbour), "
          f"{unmatched[2]} other")
    print(f"  start error s (inferred - true) p50/p90/p99/max = {[round(x, 1) for x in errs[0]]}; "
          f"end error = {[round(x, 1) for x in errs[1]]}; max resolution_s = {errs[4]:.1f}")
    print(f"  end reason agrees: {agree}/{matched} = {agree / matched:.2%} of matched; "
          f"{agree_ok}/{n_ok} = {agree_ok / n_ok:.2%} where the interval that ended the period was seen; "
          f"backfill job id agrees {job_agree}/{n_claimed}")
    print(f"  inferred pieces matching a true period: {inf_matched}/{n_inf} = {inf_matched / n_inf:.1%}")

    assert n > 300 and resolvable > 0.8 * n
    assert res_matched / resolvable >= 0.99
    assert unmatched[2] == 0  # every miss is explained by the snapshot sampling
    assert errs[2] >= -1e-6 and errs[3] >= -1e-6  # snapshots never see a change before it happens
    assert errs[5] == 0
    assert agree_ok / n_ok >= 0.99
    # a backfill job that claims and is evicted between two snapshots hides its claim: the few
    # remaining disagreements are those (truth backfill_claimed, inferred primary_claimed)
    assert agree / matched >= 0.97
    assert job_agree == n_claimed
    assert inf_matched / n_inf >= 0.95


def test_stitched_periods_match_whole_true_periods_across_midnight(sim):
    con = _truth_db(sim)
    files = sim.store.files(AVAILABILITY_PERIODS, sim.days)
    whole = stitch_periods(con, "read_parquet(?)", [files])
    con.register("whole", whole)
    lo, hi = sim.window(sim.days[0])[0], sim.window(sim.days[-1])[1]
    midnight = sim.window(sim.days[1])[0]
    # true periods that cross the midnight between the two days (clipped to the two-day range)
    rows = con.execute(
        """
        SELECT t.gpu_id, greatest(t.start_utc, CAST(? AS TIMESTAMPTZ)) AS s, least(t.end_utc, CAST(? AS TIMESTAMPTZ)) AS e,
               w.start_utc AS ws, w.end_utc AS we, w.n_pieces, w.resolution_s
        FROM read_parquet(?) t
        LEFT JOIN whole w ON w.gpu_id = t.gpu_id AND w.start_utc < CAST(? AS TIMESTAMPTZ)
                         AND w.end_utc >= CAST(? AS TIMESTAMPTZ)
        WHERE t.start_utc < CAST(? AS TIMESTAMPTZ) - INTERVAL 10 MINUTE AND t.end_utc > CAST(? AS TIMESTAMPTZ) + INTERVAL 10 MINUTE
        """,
        [lo, hi, str(sim.truth / "availability_periods.parquet"), midnight, midnight, midnight, midnight],
    ).fetchall()
    print(f"\n{len(rows)} true periods cross midnight {midnight:%Y-%m-%d}; stitched: "
          f"{sum(1 for r in rows if r[3] is not None)}")
    assert rows
    for gpu, s, e, ws, we, n_pieces, res in rows:
        assert ws is not None, gpu
        assert n_pieces == 2
        assert 0 <= (ws - s).total_seconds() <= res + 1e-6 or ws == lo
        assert 0 <= (we - e).total_seconds() <= res + 1e-6


def test_summary_of_the_simulated_day_is_consistent(sim):
    con = connect()
    day = sim.days[-1]
    s, e = sim.window(day)
    sql, params = sim.store.relation_sql(AVAILABILITY_PERIODS, sim.days)
    summary = compute_availability_summary(con, sql, params, s, e)
    assert summary.schema == AVAILABILITY_SUMMARY.schema
    rows = {(r["device_name"], r["tier"]): r for r in summary.to_pylist()}
    whole = stitch_periods(con, sql, params).to_pylist()
    ended = [w for w in whole if s < w["end_utc"] <= e and not w["continues_after_day"]]
    total = rows[("ALL", "ALL")]
    assert total["periods"] == len(ended)
    assert total["duration_mean_s"] == pytest.approx(statistics.mean(w["duration_s"] for w in ended))
    claims = [w["duration_s"] for w in ended if w["end_reason"] == "backfill_claimed"]
    assert total["backfill_claims"] == len(claims)
    assert total["time_to_claim_median_s"] == pytest.approx(statistics.median(claims))
    assert total["periods_open_at_day_end"] == sum(1 for w in whole if w["end_utc"] == e and w["continues_after_day"])
    per_device = [r for (d, t), r in rows.items() if d != "ALL" and t == "ALL"]
    assert sum(r["periods"] for r in per_device) == total["periods"]
    assert sum(r["available_gpu_hours"] for r in per_device) == pytest.approx(total["available_gpu_hours"])
    # periods of the second day that began in the first day were stitched to their first piece; only
    # those already available at the first snapshot of the first day (no earlier partition) are cut
    assert total["periods_start_truncated"] == sum(1 for w in ended if w["starts_before_day"] is not False)
    assert all(w["start_utc"] >= sim.window(sim.days[0])[0] for w in ended)
