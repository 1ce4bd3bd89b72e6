"""Demand vs capacity (DESIGN.md 5.6): hand-computed cases, fixed-scale scores, Kueue rows, and the
simulated pool against its ground truth."""

import datetime as dt
import math

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gpu_pipeline.lib.demand import (
    DCR_MAX,
    DEMAND_CAPACITY,
    DEMAND_TOP_CONTRIBUTORS,
    compute_demand_capacity,
    demand_for_day,
    demand_from_tables,
    efficiency_by_class_sql,
    job_days,
    job_idle_intervals,
    kueue_gpu_resources,
)
from gpu_pipeline.lib.job_source import clean_job_documents, raw_docs_from_files
from gpu_pipeline.lib.kueue import KUEUE_DEMAND, parse_kueue_scrapes
from gpu_pipeline.lib.schemas import GPU_STATES, JOBS, conform
from gpu_pipeline.lib.store import connect
from gpu_pipeline_tests.simdata import build_sim_dataset

UTC = dt.UTC
DAY = dt.datetime(2025, 8, 6, tzinfo=UTC)
END = DAY + dt.timedelta(days=1)
H = dt.timedelta(hours=1)


def at(hh, mm=0):
    return DAY + dt.timedelta(hours=hh, minutes=mm)


def job(gjid, run_index, kind, *, queued=DAY, start=None, end=None, status=4, gpus=1.0, completion=None,
        record=None, lv=None, owner="alice@x.edu", project="P1", schedd="s1", entered=None, require_gpus=None,
        requirements=None):
    return dict(global_job_id=gjid, run_index=run_index, doc_kind=kind, owner=owner.split("@")[0], user=owner,
                project=project, schedd=schedd, job_status=status, queued_utc=queued, run_start_utc=start,
                run_end_utc=end, completion_utc=completion, record_utc=record or end or start or queued,
                last_vacate_utc=lv, request_gpus=gpus, source="ndjson", status_entered_utc=entered,
                require_gpus=require_gpus, requirements=requirements)


def jobs(rows):
    return conform(pa.Table.from_pylist(rows), JOBS) if rows else JOBS.empty()


def states(n_gpus, state_of=lambda gpu, t: "idle_shared", device="NVIDIA A100", start=DAY, end=END, prefix="GPU-"):
    """GPU state rows; ``state_of`` may return ``no_snapshot``: na, no snapshot covered the bucket."""
    rows = []
    t = start
    while t < end:
        for g in range(n_gpus):
            st = state_of(g, t)
            reason = {"na": "dropout", "no_snapshot": "no_snapshot"}.get(st)
            rows.append(dict(bucket_start_utc=t, gpu_id=f"{prefix}{g:08x}", host="h1", device_name=device,
                             state="na" if reason else st, na_reason=reason, n_slot_rows=0 if reason else 1))
        t += dt.timedelta(minutes=5)
    return conform(pa.Table.from_pylist(rows), GPU_STATES)


def hourly(result, device="ALL", source="htcondor"):
    return {int((r["hour_start_utc"] - DAY) / H): r for r in result.capacity.to_pylist()
            if r["device_class"] == device and r["source"] == source}


def kueue_hour(result, hour: int) -> dict:
    """The Kueue row of ``hour``; every other hour of the window has a row too, Unknown with
    coverage 0 (no scrape stands for it: an outage is not a missing row)."""
    rows = hourly(result, source="kueue")
    assert len(rows) == 24, sorted(rows)
    others = [x for h, x in rows.items() if h != hour]
    assert all(x["capacity_coverage"] == 0.0 and x["demand_gpus"] is None and x["severity"] == "Unknown"
               for x in others), others[:2]
    return rows[hour]


def reasons(result):
    return sorted((r["global_job_id"], r["reason"], r["start_utc"], r["end_utc"], r["open_end"])
                  for r in result.intervals.to_pylist())


def test_a_job_that_names_a_device_model_is_that_models_demand():
    """Two models in the pool. A job whose RequireGPUs leaves the T4 is T4 demand, against the T4s'
    capacity; one whose latest record names no device is ANY (ALL only) even though an earlier record
    named the A100; an unreadable requirement is ANY and counted; a job relation without the columns
    (days written before schema 3) is ANY throughout."""
    t4 = job("s1#1.0#1", 0, "epoch", queued=at(10), start=at(11), end=at(12), completion=at(12), gpus=2,
             require_gpus='DeviceName == "Tesla T4"')
    old_pool = job("s1#2.0#1", 0, "epoch", queued=at(10), start=at(11), end=at(12), completion=at(12),
                   requirements='(HAS_SINGULARITY is true) && (TARGET.GPUs_DeviceName == "Tesla T4")')
    renamed = [job("s1#3.0#1", 0, "epoch", queued=at(10), start=at(12), end=at(13), record=at(13), status=1,
                   require_gpus='DeviceName == "NVIDIA A100"'),
               # condor_qedit after the first run: any device of capability 7 or more
               job("s1#3.0#1", 1, "epoch", queued=at(10), start=at(14), end=at(15), completion=at(15),
                   require_gpus="Capability >= 7.0")]
    broken = job("s1#4.0#1", 0, "epoch", queued=at(10), start=at(10, 30), end=at(12), completion=at(12),
                 require_gpus='DeviceName == "Tesla T4')
    # the look-back's jobs whose waits are over count in no day's figures, nor in the unreadable count
    past = job("s1#6.0#1", 0, "epoch", queued=at(-30), start=at(-29), end=at(-28), completion=at(-28),
               require_gpus='DeviceName == "Tesla T4')
    # the final job ad with Requirements but without RequireGPUs (an index that did not keep it) does
    # not drop the epoch's RequireGPUs: each attribute's latest value is read
    kept = [job("s1#5.0#1", 0, "epoch", queued=at(10), start=at(11), end=at(12), completion=at(12),
                require_gpus='DeviceName == "Tesla T4"'),
            job("s1#5.0#1", 0, "job", queued=at(10), start=at(11), end=at(12), completion=at(12), record=at(12, 1),
                requirements='(TARGET.Arch == "X86_64") && (TARGET.GPUs >= RequestGPUs)')]
    pool = pa.concat_tables([states(2, device="NVIDIA A100"), states(2, device="Tesla T4", prefix="GPU-f")])
    r = demand_from_tables(jobs([t4, old_pool, *renamed, broken, *kept, past]), pool, DAY, END)
    cls = {iv["global_job_id"]: iv["device_class"] for iv in r.intervals.to_pylist()}
    assert cls == {"s1#1.0#1": "Tesla T4", "s1#2.0#1": "Tesla T4", "s1#3.0#1": "ANY", "s1#4.0#1": "ANY",
                   "s1#5.0#1": "Tesla T4"}
    assert r.unreadable_requirements == 1
    t4_hour = hourly(r, "Tesla T4")[10]
    assert t4_hour["demand_gpus"] == pytest.approx(4.0)  # 2 + 1 + 1 GPUs queued 10:00-11:00
    assert t4_hour["idle_gpus"] == pytest.approx(2.0)  # the T4s only
    assert t4_hour["dcr"] == pytest.approx(2.0)
    assert hourly(r, "NVIDIA A100")[10]["demand_gpus"] == 0
    assert hourly(r, "ALL")[10]["demand_gpus"] == pytest.approx(4.0 + 1 + 0.5)
    top = {(x["dimension"], x["key"]): x["demand_gpu_hours"] for x in r.top.to_pylist()}
    assert top[("device_class", "Tesla T4")] == pytest.approx(4.0)
    # the same rows without the expression columns: every job ANY
    plain = jobs([t4, old_pool, *renamed, broken, *kept]).drop_columns(["require_gpus", "requirements"])
    r0 = demand_from_tables(plain, pool, DAY, END)
    assert {iv["device_class"] for iv in r0.intervals.to_pylist()} == {"ANY"}
    assert hourly(r0, "Tesla T4")[10]["demand_gpus"] == 0


def test_queued_1030_to_1115_two_gpus():
    rows = [job("s1#1.0#1", 0, "epoch", queued=at(10, 30), start=at(11, 15), end=at(12), completion=at(12), gpus=2),
            job("s1#1.0#1", 0, "job", queued=at(10, 30), start=at(11, 15), end=at(12), completion=at(12), gpus=2)]
    r = demand_from_tables(jobs(rows), states(4), DAY, END)
    assert r.capacity.schema == DEMAND_CAPACITY.schema and r.top.schema == DEMAND_TOP_CONTRIBUTORS.schema
    h = hourly(r)
    assert len(h) == 24
    assert (h[10]["demand_gpus"], h[11]["demand_gpus"]) == (1.0, 0.5)
    assert (h[10]["pending_jobs"], h[11]["pending_jobs"]) == (0.5, 0.25)
    assert (h[10]["mean_wait_s"], h[11]["mean_wait_s"]) == (1800.0, 2700.0)  # wait so far at 11:00 / 11:15
    assert all(h[k]["demand_gpus"] == 0 and h[k]["mean_wait_s"] is None for k in h if k not in (10, 11))
    assert (h[10]["idle_gpus"], h[10]["total_gpus"], h[10]["dcr"]) == (4.0, 4.0, 0.25)
    # the device row carries the capacity; the job names no device, so its demand is in ALL only
    dev = hourly(r, "NVIDIA A100")
    assert (dev[10]["demand_gpus"], dev[10]["idle_gpus"]) == (0.0, 4.0)
    top = {(t["dimension"], t["key"]): t for t in r.top.to_pylist()}
    assert top[("device_class", "ANY")]["demand_gpu_hours"] == pytest.approx(1.5)
    assert top[("owner", "alice@x.edu")]["share"] == 1.0 and top[("owner", "alice@x.edu")]["jobs"] == 1


def test_evicted_backfill_job_is_idle_again_between_runs():
    run0 = dict(queued=at(9), start=at(9, 30), end=at(10), lv=at(10))
    run1 = dict(queued=at(9), start=at(10, 45), end=at(12), completion=at(12), lv=at(10))
    rows = [job("bf#7.0#1", 0, "epoch", status=1, **run0),  # evicted: the job goes back to Idle
            job("bf#7.0#1", 1, "epoch", **run1), job("bf#7.0#1", 1, "job", **run1)]
    r = demand_from_tables(jobs(rows), states(2), DAY, END)
    assert reasons(r) == [("bf#7.0#1", "first_run", at(9), at(9, 30), False),
                          ("bf#7.0#1", "requeued", at(10), at(10, 45), False)]
    h = hourly(r)
    assert (h[9]["demand_gpus"], h[10]["demand_gpus"], h[11]["demand_gpus"]) == (0.5, 0.75, 0.0)
    assert h[10]["mean_wait_s"] == 2700.0  # since the eviction, not since QDate

    # the same rows repeated (the job is in several daily partitions) count once
    again = demand_from_tables(jobs(rows + rows), states(2), DAY, END)
    assert again.capacity.equals(r.capacity)

    # job documents only: the last run's LastVacateTime still gives the re-queued gap; the first
    # wait (run 0 unknown) ends at the first start the row carries (JobStartDate), and without one
    # (a day written before clean/jobs version 4) it is not counted -- documented
    only_job = demand_from_tables(jobs([{**rows[2], "first_start_utc": at(9, 30)}]), states(2), DAY, END)
    assert reasons(only_job) == [("bf#7.0#1", "first_run", at(9), at(9, 30), False),
                                 ("bf#7.0#1", "requeued", at(10), at(10, 45), False)]
    only_job = demand_from_tables(jobs([rows[2]]), states(2), DAY, END)
    assert reasons(only_job) == [("bf#7.0#1", "requeued", at(10), at(10, 45), False)]


def test_idle_after_eviction_until_removal_or_window_end():
    evicted = job("bf#8.0#1", 0, "epoch", queued=at(9), start=at(9, 30), end=at(10), lv=at(10), status=1)
    removed = job("bf#8.0#1", 0, "job", queued=at(9), start=at(9, 30), end=at(10), lv=at(10), status=3,
                  record=at(10, 20))
    r = demand_from_tables(jobs([evicted, removed]), states(2), DAY, END)
    assert reasons(r) == [("bf#8.0#1", "after_last_run", at(10), at(10, 20), False),
                          ("bf#8.0#1", "first_run", at(9), at(9, 30), False)]
    still = demand_from_tables(jobs([evicted]), states(2), DAY, END)
    assert ("bf#8.0#1", "after_last_run", at(10), END, True) in reasons(still)
    h = hourly(still)
    assert all(h[k]["demand_gpus"] == 1.0 for k in range(10, 24))


def test_never_started_jobs_and_non_gpu_jobs():
    rows = [
        # condor_q-style ad of a job still idle at its record time: idle until the window end
        job("s1#2.0#1", 0, "job", queued=at(7, 30), status=1, record=at(8), gpus=4),
        # removed before it ever ran: idle until its record time
        job("s1#3.0#1", 0, "job", queued=at(7, 30), status=3, record=at(8)),
        # no QDate: taken from the GlobalJobId (schedd#cluster.proc#qdate)
        job("s1#4.0#" + str(int(at(6).timestamp())), 0, "job", queued=None, start=at(7), end=at(9),
            completion=at(9)),
        # not a GPU job
        job("s1#5.0#1", 0, "job", queued=at(1), status=1, gpus=0),
    ]
    r = demand_from_tables(jobs(rows), states(2), DAY, END)
    got = {(g, reason): (s, e, o) for g, reason, s, e, o in reasons(r)}
    assert got == {
        ("s1#2.0#1", "never_started"): (at(7, 30), END, True),
        ("s1#3.0#1", "never_started"): (at(7, 30), at(8), False),
        (rows[2]["global_job_id"], "first_run"): (at(6), at(7), False),
    }
    assert hourly(r)[7]["demand_gpus"] == pytest.approx(4 * 0.5 + 0.5)


def test_zero_idle_capacity_gives_a_finite_flagged_dcr():
    rows = [job("s1#1.0#1", 0, "job", queued=at(1), start=at(3), end=at(4), completion=at(4), gpus=3)]
    r = demand_from_tables(jobs(rows), states(4, lambda g, t: "busy_shared"), DAY, END)
    h = hourly(r)
    for k in (1, 2):
        assert h[k]["dcr"] == DCR_MAX and h[k]["dcr_capped"] and h[k]["zero_idle"]
        assert h[k]["severity"] == "Critical"
    assert (h[5]["dcr"], h[5]["dcr_capped"], h[5]["zero_idle"], h[5]["severity"]) == (0.0, False, True, "Healthy")
    assert all(math.isfinite(x["dcr"]) and math.isfinite(x["cis"]) for x in r.capacity.to_pylist())


def test_one_gpu_of_demand_over_zero_idle_reaches_the_cap():
    # 1 / 1e-6 is the cap itself: flagged (`>` missed the commonest case, one waiting 1-GPU job)
    rows = [job("s1#1.0#1", 0, "job", queued=at(1), start=at(3), end=at(4), completion=at(4), gpus=1)]
    h = hourly(demand_from_tables(jobs(rows), states(4, lambda g, t: "busy_shared"), DAY, END))
    assert (h[1]["dcr"], h[1]["dcr_capped"], h[1]["zero_idle"], h[1]["severity"]) == (DCR_MAX, True, True, "Critical")


def test_hours_without_a_slot_snapshot_have_unknown_capacity():
    """Collector down 05:00-06:00 and 07:00-07:30 (the states say na / no_snapshot): hour 5's
    capacity is unknown -- not zero GPUs, which made a waiting job DCR 1e6, Critical -- and hour
    7's means are over its seen half, not diluted by the outage."""
    def st(g, t):
        if t.hour == 5 or (t.hour == 7 and t.minute < 30):
            return "no_snapshot"
        if t.hour == 8 and g == 3:
            return "na"  # a host down (dropout) is seen: that GPU is not capacity
        return "idle_shared" if g < 2 else "busy_shared"

    rows = [job("s1#1.0#1", 0, "job", queued=at(4), start=at(9), end=at(10), completion=at(10), gpus=1)]
    r = demand_from_tables(jobs(rows), states(4, st), DAY, END)
    h = hourly(r)
    cols = ("demand_gpus", "idle_gpus", "idle_open_gpus", "busy_gpus", "total_gpus", "capacity_coverage",
            "allocation_pct", "dcr", "qps", "cis", "zero_idle", "dcr_capped", "severity")

    def of(k):
        return tuple(h[k][c] for c in cols)

    assert of(5) == (1.0, None, None, None, None, 0.0, None, None, None, None, None, False, "Unknown")
    assert of(4)[:7] == (1.0, 2.0, 2.0, 2.0, 4.0, 1.0, 50.0) and h[4]["severity"] == "Healthy"
    assert of(7)[:7] == (1.0, 2.0, 2.0, 2.0, 4.0, 0.5, 50.0) and h[7]["dcr"] == 0.5
    assert of(8)[:7] == (1.0, 2.0, 2.0, 1.0, 3.0, 1.0, pytest.approx(100 / 3))
    # the device-class row of the outage hour is unknown too
    assert hourly(r, "NVIDIA A100")[5]["severity"] == "Unknown"
    # a whole day without snapshots: every hour with demand is Unknown, none Critical
    dark = demand_from_tables(jobs(rows), states(4, lambda g, t: "no_snapshot"), DAY, END)
    assert {x["severity"] for x in dark.capacity.to_pylist()} == {"Unknown"}
    assert all(x["capacity_coverage"] == 0.0 for x in dark.capacity.to_pylist())
    # no state rows at all (no GPU seen all day): the demand hours are there, Unknown
    none = demand_from_tables(jobs(rows), GPU_STATES.empty(), DAY, END).capacity.to_pylist()
    assert len(none) == 5 and {(x["severity"], x["total_gpus"], x["capacity_coverage"]) for x in none} == {
        ("Unknown", None, 0.0)}


def test_scores_with_fixed_scales_by_hand():
    # two 1-GPU jobs wait 08:00 -> 12:00; 1 of 8 GPUs idle
    rows = [job(f"s1#{i}.0#1", 0, "job", queued=at(8), start=at(12), end=at(13), completion=at(13))
            for i in (1, 2)]
    st = states(8, lambda g, t: "idle_shared" if g == 0 else "busy_shared")
    r = demand_from_tables(jobs(rows), st, DAY, END)
    h10 = hourly(r)[10]
    # DCR 2 / 1 = 2 -> norm 0.5; pending 2 / 8 = 0.25; wait at 11:00 = 3 h -> 0.75
    assert (h10["dcr"], h10["demand_gpus"], h10["mean_wait_s"]) == (2.0, 2.0, 3 * 3600.0)
    assert h10["qps"] == pytest.approx(0.6 * 0.25 + 0.4 * 0.75)
    assert h10["cis"] == pytest.approx(0.5 * 0.5 + 0.2 * 0.45)
    assert h10["severity"] == "Warning"  # DCR 2 is not > 2; CIS 0.34 < 0.5; DCR > 1
    assert h10["efficiency_gap_pp"] is None and h10["allocation_pct"] == 87.5
    # an efficiency input adds 0.3 * min(max(gap, 0) / 100, 1)
    eff = pa.table({"hour_start_utc": pa.array([at(10)], pa.timestamp("us", tz="UTC")),
                    "device_class": ["ALL"], "efficiency_gap_pp": [80.0]})
    con = connect()
    con.register("jobs_in", jobs(rows))
    con.register("states_in", st)
    con.register("eff_in", eff)
    r2 = compute_demand_capacity(con, "jobs_in", [], "states_in", [], DAY, END, efficiency_from_sql="eff_in")
    h10b = hourly(r2)[10]
    assert h10b["cis"] == pytest.approx(0.34 + 0.24) and h10b["severity"] == "Warning"
    assert hourly(r2)[9]["efficiency_gap_pp"] is None
    # built from per-GPU hourly rows: mean gap per device class and ALL
    per_gpu = pa.table({"hour_start_utc": pa.array([at(10)] * 3, pa.timestamp("us", tz="UTC")),
                        "device_name": ["NVIDIA A100", "NVIDIA A100", "NVIDIA H100"],
                        "efficiency_gap_pp": [60.0, 100.0, None]})
    con.register("per_gpu", per_gpu)
    r3 = compute_demand_capacity(con, "jobs_in", [], "states_in", [], DAY, END,
                                 efficiency_from_sql=efficiency_by_class_sql("per_gpu"))
    assert hourly(r3)[10]["efficiency_gap_pp"] == 80.0
    assert hourly(r3, "NVIDIA A100")[10]["efficiency_gap_pp"] == 80.0
    con.close()
    # waits beyond 4 h saturate: hour 11 (wait 4 h at 12:00) -> norm(wait) = 1
    assert hourly(r)[11]["qps"] == pytest.approx(0.6 * 0.25 + 0.4 * 1.0)


def test_a_kueue_row_takes_no_efficiency_gap_from_the_htcondor_pool():
    """The efficiency input is the HTCondor pool's GPUs' (device class ALL): a Kueue cluster's row
    (also ALL) took that gap into its CIS (0.143 + 0.3 * 0.9 = 0.413, Moderate, for a Healthy
    hour)."""
    eff = pa.table({"hour_start_utc": pa.array([at(10)], pa.timestamp("us", tz="UTC")),
                    "device_class": ["ALL"], "efficiency_gap_pp": [90.0]})
    kueue = pa.Table.from_pylist(_scrape_rows(at(10), 4.0) + _scrape_rows(at(10, 30), 4.0),
                                 schema=KUEUE_DEMAND.schema)
    con = connect()
    for name, table in (("jobs_in", JOBS.empty()), ("states_in", states(4)), ("kq", kueue), ("eff_in", eff)):
        con.register(name, table)
    r = compute_demand_capacity(con, "jobs_in", [], "states_in", [], DAY, END, kueue_from_sql="kq",
                                efficiency_from_sql="eff_in")
    con.close()
    row = kueue_hour(r, 10)
    # demand 4 over idle 8 - 2 = 6; pending 4 of 8 quota; no wait: CIS 0.5 * (4/6) / 4 + 0.2 * 0.6 * 0.5
    assert row["efficiency_gap_pp"] is None
    assert row["cis"] == pytest.approx(0.5 * (4 / 6) / 4 + 0.2 * 0.6 * 0.5) and row["severity"] == "Healthy"
    assert hourly(r)[10]["efficiency_gap_pp"] == 90.0  # the pool's own row keeps it


def test_severity_at_a_cis_threshold_is_the_lower_class():
    """CIS > 0.3 is Moderate: an hour whose CIS is 3/10 on paper is Healthy, though the floating
    point sum of its terms is 0.30000000000000004. One 1-GPU job queued 08:15 starts 11:00 on a
    1-GPU pool idle all day: hour 10 has DCR 1 (0.5 * 1/4), pending 1 of 1 and a wait of 2 h 45 min
    at 11:00 (0.2 * (0.6 + 0.4 * 9900/14400)): 1/8 + 7/40 = 3/10."""
    rows = [job("s1#1.0#1", 0, "job", queued=at(8, 15), start=at(11), end=at(12), completion=at(12))]
    h10 = hourly(demand_from_tables(jobs(rows), states(1), DAY, END))[10]
    assert (h10["dcr"], h10["mean_wait_s"]) == (1.0, 9900.0)
    assert h10["cis"] == pytest.approx(0.3) and h10["cis"] > 0.3  # the float sum, as stored
    assert h10["severity"] == "Healthy"


def test_a_long_requeue_wait_is_demand_on_the_days_between_the_runs():
    """A 1-GPU job evicted on the 1st at 10:00 and run again on the 6th at 12:00 was idle on the
    4th, which reads clean/jobs of the 2nd to the 4th: the partitions (rows overlapping each day,
    as the clean step keeps them) now hold the second run's row there, by its wait since the
    eviction (they held neither run, and the day showed no demand). Likewise a job removed on the
    6th after that eviction."""
    from gpu_pipeline.lib.jobs import jobs_overlapping
    from gpu_pipeline.lib.timeutil import day_window

    def t(d: int, h: int) -> dt.datetime:
        return dt.datetime(2025, 8, d, h, tzinfo=UTC)

    run0 = job("s1#7.0#1", 0, "epoch", queued=t(1, 0), start=t(1, 2), end=t(1, 10), status=1, lv=t(1, 10),
               record=t(1, 10))
    cases = {
        "run again": [run0, job("s1#7.0#1", 1, "epoch", queued=t(1, 0), start=t(6, 12), end=t(6, 18), status=4,
                                completion=t(6, 18), lv=t(1, 10), record=t(6, 18))],
        "removed": [run0, job("s1#7.0#1", 0, "job", queued=t(1, 0), start=t(1, 2), end=t(1, 10), status=3,
                              lv=t(1, 10), record=t(6, 12))],
    }
    for name, rows in cases.items():
        everything = jobs(rows)
        parts = {d: jobs_overlapping(everything, *day_window(d)) for d in job_days("2025-08-04")}
        assert all(p.num_rows == 1 for d, p in parts.items() if d > "2025-08-01"), name
        assert all(p.num_rows == 0 for d, p in parts.items() if d < "2025-08-01"), name
        s, e = day_window("2025-08-04")
        r = demand_from_tables(pa.concat_tables(parts.values()), states(2, start=s, end=e), s, e)
        assert {x["demand_gpus"] for x in r.capacity.to_pylist() if x["device_class"] == "ALL"} == {1.0}, name
        assert sum(x["demand_gpu_hours"] for x in r.top.to_pylist() if x["dimension"] == "device_class") == 24.0


def test_an_evicted_job_still_idle_is_demand_on_the_days_after_its_last_record():
    """A 2-GPU job evicted on the 1st at 10:00 with no later record is still queued on the 10th:
    its only row is in the 1st's partition (the rows overlapping each day), which the 10th reads.
    Before, the 10th read two days back and showed no demand."""
    from gpu_pipeline.lib.jobs import jobs_overlapping
    from gpu_pipeline.lib.timeutil import day_window

    run0 = job("s1#9.0#1", 0, "epoch", queued=dt.datetime(2025, 8, 1, 0, tzinfo=UTC),
               start=dt.datetime(2025, 8, 1, 2, tzinfo=UTC), end=dt.datetime(2025, 8, 1, 10, tzinfo=UTC),
               status=1, lv=dt.datetime(2025, 8, 1, 10, tzinfo=UTC), gpus=2.0)
    everything = jobs([run0])
    read = job_days("2025-08-10")
    assert "2025-08-01" in read
    parts = [jobs_overlapping(everything, *day_window(d)) for d in read]
    assert [p.num_rows for p in parts].count(1) == 1  # the 1st's partition only
    s, e = day_window("2025-08-10")
    r = demand_from_tables(pa.concat_tables(parts), states(4, start=s, end=e), s, e)
    assert [(x["reason"], x["start_utc"], x["end_utc"], x["open_end"]) for x in r.intervals.to_pylist()] == [
        ("after_last_run", s, e, True)]
    assert {x["demand_gpus"] for x in r.capacity.to_pylist() if x["device_class"] == "ALL"} == {2.0}


def _busy_with(table: pa.Table, gpu_id: str, job_id: str, since: dt.datetime) -> pa.Table:
    """``table``'s GPU states with ``gpu_id`` busy running ``job_id`` from bucket ``since`` on (the
    snapshot of each bucket taken 2 minutes into it)."""
    rows = table.to_pylist()
    for r in rows:
        if r["gpu_id"] == gpu_id and r["bucket_start_utc"] >= since:
            r.update(state="busy_shared", global_job_id=job_id,
                     snapshot_utc=r["bucket_start_utc"] + dt.timedelta(minutes=2))
    return conform(pa.Table.from_pylist(rows), GPU_STATES)


def test_a_wait_without_an_end_in_the_records_ends_when_a_snapshot_sees_the_job_running():
    """Evicted at 10:00 and running again (a run with no record yet: adstash writes one when it
    ends) from 14:00: the slot snapshots show it busy on GPU 1 from the 14:00 bucket, snapshot
    14:02. Its wait is 10:00-14:02, not 10:00 to midnight. A job that never started (a
    ``condor_q`` row) likewise; another job on the GPU, or the job seen before its wait, ends
    nothing."""
    evicted = job("bf#8.0#1", 0, "epoch", queued=at(9), start=at(9, 30), end=at(10), lv=at(10), status=1)
    queued = job("q#3.0#1", 0, "job", queued=at(11), status=1, record=at(11))
    other = job("bf#9.0#1", 0, "epoch", queued=at(9), start=at(9, 30), end=at(10), lv=at(10), status=1)
    st = _busy_with(_busy_with(states(3), "GPU-00000001", "bf#8.0#1", at(14)), "GPU-00000002", "q#3.0#1", at(16))
    # bf#9 is seen only before its wait (its evicted run, 09:30-10:00, on GPU 0)
    st = _busy_with(st, "GPU-00000000", "bf#9.0#1", at(9, 30))
    st = conform(pa.Table.from_pylist([r if r["bucket_start_utc"] < at(10) or r["gpu_id"] != "GPU-00000000"
                                       else {**r, "state": "idle_shared", "global_job_id": None}
                                       for r in st.to_pylist()]), GPU_STATES)
    r = demand_from_tables(jobs([evicted, queued, other]), st, DAY, END)
    assert reasons(r) == [
        ("bf#8.0#1", "after_last_run", at(10), at(14, 2), False),
        ("bf#8.0#1", "first_run", at(9), at(9, 30), False),
        ("bf#9.0#1", "after_last_run", at(10), END, True),
        ("bf#9.0#1", "first_run", at(9), at(9, 30), False),
        ("q#3.0#1", "never_started", at(11), at(16, 2), False),
    ]
    # without the states' job ids (the library call without a states relation) the waits stay open
    alone = job_idle_intervals_of(jobs([evicted, queued, other]))
    assert sorted((x["global_job_id"], x["reason"], x["open_end"]) for x in alone if x["reason"] != "first_run") == [
        ("bf#8.0#1", "after_last_run", True), ("bf#9.0#1", "after_last_run", True), ("q#3.0#1", "never_started", True)]


def job_idle_intervals_of(rows: pa.Table) -> list[dict]:
    con = connect()
    try:
        con.register("j", rows)
        return job_idle_intervals(con, "j", [], DAY, END).to_pylist()
    finally:
        con.close()


def test_a_day_does_not_depend_on_other_days_computed_with_it():
    day2 = END
    rows = [job("s1#1.0#1", 0, "job", queued=at(10, 30), start=at(11, 15), end=at(12), completion=at(12), gpus=2)]
    # day 2: a flood of demand and waits (a min-max normalization over both days would rescale day 1)
    rows += [job(f"s1#{i}.0#9", 0, "job", queued=day2 + 2 * H, start=day2 + 20 * H, end=day2 + 21 * H,
                 completion=day2 + 21 * H, gpus=8) for i in range(10, 40)]
    both_states = pa.concat_tables([states(4), states(4, start=END, end=END + dt.timedelta(days=1))])
    alone = demand_from_tables(jobs(rows), states(4), DAY, END).capacity
    both = demand_from_tables(jobs(rows), both_states, DAY, END + dt.timedelta(days=1)).capacity
    first = both.filter(pa.compute.less(both["hour_start_utc"], pa.scalar(END, pa.timestamp("us", tz="UTC"))))
    assert first.equals(alone)
    assert both.num_rows == 2 * alone.num_rows


def test_device_class_from_the_jobs_relation():
    rows = [job("s1#1.0#1", 0, "job", queued=at(10), start=at(11), end=at(12), completion=at(12)),
            job("s1#2.0#1", 0, "job", queued=at(10), start=at(11), end=at(12), completion=at(12), gpus=2)]
    t = jobs(rows).append_column("device_class", pa.array(["NVIDIA H100", None]))
    st = pa.concat_tables([states(2, device="NVIDIA A100"),
                           states(1, device="NVIDIA H100", prefix="GPU-h")])
    r = demand_from_tables(t, st, DAY, END)
    assert (hourly(r, "NVIDIA H100")[10]["demand_gpus"], hourly(r, "NVIDIA H100")[10]["idle_gpus"]) == (1.0, 1.0)
    assert hourly(r, "NVIDIA A100")[10]["demand_gpus"] == 0.0
    assert (hourly(r)[10]["demand_gpus"], hourly(r)[10]["idle_gpus"]) == (3.0, 3.0)
    keys = {t["key"]: t["demand_gpu_hours"] for t in r.top.to_pylist() if t["dimension"] == "device_class"}
    assert keys == {"ANY": 2.0, "NVIDIA H100": 1.0}


def test_empty_day():
    r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END)
    assert r.capacity.num_rows == 0 and r.capacity.schema == DEMAND_CAPACITY.schema
    assert r.top.num_rows == 0 and r.top.schema == DEMAND_TOP_CONTRIBUTORS.schema
    # capacity but no demand: Healthy, DCR 0
    r = demand_from_tables(JOBS.empty(), states(2), DAY, END)
    assert {x["severity"] for x in r.capacity.to_pylist()} == {"Healthy"}
    assert {x["dcr"] for x in r.capacity.to_pylist()} == {0.0} and r.top.num_rows == 0


def test_kueue_rows():
    ts = [at(10), at(10, 30)]
    rows = []
    for t, pending, usage, active, inadmissible, wait in zip(ts, (4.0, 2.0), (6.0, 8.0), (2, 1), (1, 0),
                                                            (100.0, 300.0), strict=True):
        base = dict(sample_utc=t, cluster="k8s", scope="cluster_queue", cluster_queue="cq1")
        rows += [
            dict(base, kind="resource", resource="nvidia.com/gpu", resource_pending=pending),
            dict(base, kind="resource", resource="nvidia.com/gpu", flavor="a100", resource_usage=usage,
                 nominal_quota=8.0),
            dict(base, kind="resource", resource="cpu", flavor="default", resource_usage=50.0, nominal_quota=64.0),
            dict(base, kind="queue", status="active", pending_workloads=active),
            dict(base, kind="queue", status="inadmissible", pending_workloads=inadmissible),
            dict(base, kind="admission_wait", wait_mean_s=wait, wait_count_interval=2),
        ]
    kueue = pa.Table.from_pylist(rows, schema=KUEUE_DEMAND.schema)
    r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END, kueue=kueue)
    row = kueue_hour(r, 10)
    assert (row["source"], row["device_class"], row["hour_start_utc"]) == ("kueue", "ALL", at(10))
    assert (row["demand_gpus"], row["pending_jobs"], row["mean_wait_s"]) == (3.0, 2.0, 200.0)
    assert (row["idle_gpus"], row["busy_gpus"], row["total_gpus"], row["dcr"]) == (1.0, 7.0, 8.0, 3.0)
    assert row["severity"] == "Critical"
    (top,) = r.top.to_pylist()
    assert (top["source"], top["dimension"], top["key"], top["demand_gpu_hours"], top["rank"]) == (
        "kueue", "cluster_queue", "cq1", 3.0, 1)


def _kueue_hour(rows: list[dict]) -> dict:
    r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END,
                           kueue=pa.Table.from_pylist(rows, schema=KUEUE_DEMAND.schema))
    return kueue_hour(r, rows[0]["sample_utc"].hour)


@pytest.mark.parametrize("cluster", ["k8s", None])  # None: no cluster configured, the default
def test_kueue_borrowing_within_a_cohort_uses_the_lent_quota_up(cluster):
    """cq-a owns 8 GPUs and uses none; cq-b, in its cohort, owns none and borrows all 8: no GPU is
    idle (summing max(quota - usage, 0) per queue counted 8 idle and 8 busy of 8). A queue outside
    the cohort keeps its own idle quota."""
    t = at(10)
    rows = []
    for cq, cohort, quota, usage, pending in (("cq-a", "team", 8.0, 0.0, 0.0), ("cq-b", "team", 0.0, 8.0, 4.0),
                                              ("cq-c", None, 2.0, 0.0, 0.0)):
        base = dict(sample_utc=t, cluster=cluster, scope="cluster_queue", cluster_queue=cq, cohort=cohort)
        rows += [dict(base, kind="resource", resource="nvidia.com/gpu", resource_pending=pending),
                 dict(base, kind="resource", resource="nvidia.com/gpu", flavor="a100", resource_usage=usage,
                      nominal_quota=quota)]
    row = _kueue_hour(rows)
    assert (row["idle_gpus"], row["busy_gpus"], row["total_gpus"], row["demand_gpus"]) == (2.0, 8.0, 10.0, 4.0)
    assert row["dcr"] == 2.0 and row["severity"] == "Warning"


def test_kueue_quota_reserved_for_workloads_awaiting_admission_checks_is_not_idle():
    """8 GPUs of quota all reserved by workloads waiting on their admission checks (a
    ProvisioningRequest), none admitted yet, 4 GPUs pending: no GPU is idle (quota - usage read 8
    idle, DCR 0.5, Healthy). Busy stays the admitted usage; a scrape without the reservation series
    reads the usage as before."""
    t = at(10)
    base = dict(sample_utc=t, cluster="k8s", scope="cluster_queue", cluster_queue="cq1", cohort=None)
    rows = [dict(base, kind="resource", resource="nvidia.com/gpu", resource_pending=4.0),
            dict(base, kind="resource", resource="nvidia.com/gpu", flavor="h100", resource_usage=0.0,
                 resource_reservation=8.0, nominal_quota=8.0)]
    row = _kueue_hour(rows)
    assert (row["idle_gpus"], row["busy_gpus"], row["total_gpus"], row["demand_gpus"]) == (0.0, 0.0, 8.0, 4.0)
    assert row["severity"] == "Critical"
    rows[1]["resource_reservation"] = None
    assert _kueue_hour(rows)["idle_gpus"] == 8.0


def test_kueue_quota_of_one_resource_does_not_net_against_another():
    """A queue over its nvidia.com/gpu quota (4, using 6 borrowed) and with 7 MIG slices of quota
    unused: the 7 slices are idle (one pool per flavor summed both resources: 11 - 6 = 5)."""
    t = at(10)
    base = dict(sample_utc=t, cluster="k8s", scope="cluster_queue", cluster_queue="cq1", cohort=None, kind="resource",
                flavor="h100")
    rows = [dict(base, resource="nvidia.com/gpu", resource_usage=6.0, nominal_quota=4.0),
            dict(base, resource="nvidia.com/mig-1g.10gb", resource_usage=0.0, nominal_quota=7.0)]
    r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END,
                           kueue=pa.Table.from_pylist(rows, schema=KUEUE_DEMAND.schema),
                           kueue_resources=("nvidia.com/gpu", "nvidia.com/mig-*"))
    assert kueue_hour(r, 10)["idle_gpus"] == 7.0


def test_kueue_quota_is_lent_within_the_root_of_a_cohort_tree():
    """Cohorts in a tree: cq-a (cohort team-a) owns 8 GPUs and uses none, cq-b (cohort team-b) owns
    none and borrows all 8; both cohorts are under the root org. No GPU is idle (by the direct
    cohort, 8 counted idle and 8 busy of 8), the root taken from kueue_cluster_queue_info."""
    def scrape(cq: str, cohort: str, quota: int, usage: int, pending: int) -> str:
        flavor = f'cluster_queue="{cq}",cohort="{cohort}",flavor="a100",replica_role="leader",resource="nvidia.com/gpu"'
        return (f'kueue_cluster_queue_info{{cluster_queue="{cq}",parent_cohort="{cohort}",replica_role="leader",'
                f'root_cohort="org"}} 1\n'
                f"kueue_cluster_queue_nominal_quota{{{flavor}}} {quota}\n"
                f"kueue_cluster_queue_resource_usage{{{flavor}}} {usage}\n"
                f'kueue_cluster_queue_resource_pending{{cluster_queue="{cq}",replica_role="leader",'
                f'resource="nvidia.com/gpu"}} {pending}\n')
    text = scrape("cq-a", "team-a", 8, 0, 0) + scrape("cq-b", "team-b", 0, 8, 4)
    kueue = parse_kueue_scrapes([(at(10, 5), text)], cluster="k8s").table
    assert set(kueue.filter(pc.is_valid(kueue["flavor"]))["root_cohort"].to_pylist()) == {"org"}
    r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END, kueue=kueue)
    row = kueue_hour(r, 10)
    assert (row["idle_gpus"], row["busy_gpus"], row["total_gpus"], row["demand_gpus"]) == (0.0, 8.0, 8.0, 4.0)
    assert row["severity"] == "Critical"


@pytest.mark.parametrize("pending", [0, 3])
def test_kueue_demand_without_the_pending_resources_metric(pending):
    """An older Kueue has no pending-resources series: with no pending workload the demand is 0;
    with pending workloads and no GPUs-per-workload it is unknown (null), and an unknown demand
    has no DCR and severity Unknown -- never the cap (least() skipped the null: 1e6 and
    Critical), nor a DCR 0 that reads Healthy."""
    rows = []
    for m in range(0, 60, 5):
        base = dict(sample_utc=at(10, m), cluster=None, scope="cluster_queue", cluster_queue="cq")
        rows += [dict(base, kind="queue", status="active", pending_workloads=pending),
                 dict(base, kind="queue", status="inadmissible", pending_workloads=0),
                 dict(base, kind="resource", resource="nvidia.com/gpu", flavor="a100", resource_usage=0.0,
                      nominal_quota=8.0)]
    row = _kueue_hour(rows)
    assert row["demand_gpus"] == (0.0 if pending == 0 else None) and row["pending_jobs"] == pending
    if pending == 0:
        assert (row["dcr"], row["dcr_capped"], row["idle_gpus"], row["severity"]) == (0.0, False, 8.0, "Healthy")
    else:
        assert (row["dcr"], row["qps"], row["cis"], row["dcr_capped"]) == (None, None, None, False)
        assert (row["idle_gpus"], row["severity"]) == (8.0, "Unknown")
    assert row["capacity_coverage"] == 1.0  # 10:00-10:55 every 5 min, the last standing for 5 min


@pytest.mark.parametrize("with_quota", [False, True])
def test_kueue_capacity_without_its_series_is_unknown_not_zero(with_quota):
    """The ClusterQueue resource metrics are optional in Kueue: without the quota and usage series
    the capacity is unknown (it read 0 GPUs: with pending workloads x GPUs a workload every hour
    was DCR 1e6, Critical; with nothing pending DCR 0, Healthy). One cluster of two without them
    makes the hour's capacity unknown as well."""
    rows = []
    for cluster in ("east", "west"):
        base = dict(sample_utc=at(10, 5), cluster=cluster, scope="cluster_queue", cluster_queue="cq")
        rows += [dict(base, kind="queue", status="active", pending_workloads=3),
                 dict(base, kind="queue", status="inadmissible", pending_workloads=0)]
        if with_quota and cluster == "east":
            rows.append(dict(base, kind="resource", resource="nvidia.com/gpu", flavor="a100", resource_usage=2.0,
                             nominal_quota=8.0))
    r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END,
                           kueue=pa.Table.from_pylist(rows, schema=KUEUE_DEMAND.schema), kueue_gpus_per_workload=1.0)
    row = kueue_hour(r, 10)
    assert row["demand_gpus"] == 6.0
    assert (row["idle_gpus"], row["busy_gpus"], row["total_gpus"]) == (None, None, None)
    assert (row["dcr"], row["dcr_capped"], row["severity"]) == (None, False, "Unknown")


def test_kueue_clusters_scraped_at_their_own_instants_are_added_up():
    """Two clusters, each scraped once in the hour at its own instant: the hour is their sum (the
    mean over the hour's scrapes averaged the clusters: half the demand and capacity), and so are
    the top contributors' GPU-hours (they were halved: each queue's pending GPUs were divided by
    both clusters' scrapes)."""
    for names in (("cq", "cq"), ("cq-east", "cq-west")):
        rows = []
        for cluster, name, minute, pending, usage, quota in (("east", names[0], 10, 6.0, 4.0, 8.0),
                                                             ("west", names[1], 40, 4.0, 6.0, 8.0)):
            base = dict(sample_utc=at(10, minute), cluster=cluster, scope="cluster_queue", cluster_queue=name)
            rows += [dict(base, kind="resource", resource="nvidia.com/gpu", resource_pending=pending),
                     dict(base, kind="resource", resource="nvidia.com/gpu", flavor="a100", resource_usage=usage,
                          nominal_quota=quota)]
        r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END,
                               kueue=pa.Table.from_pylist(rows, schema=KUEUE_DEMAND.schema))
        row = kueue_hour(r, 10)
        assert (row["demand_gpus"], row["idle_gpus"], row["busy_gpus"], row["total_gpus"]) == (10.0, 6.0, 10.0, 16.0)
        assert row["dcr"] == pytest.approx(10 / 6)
        top = {t["key"]: (t["demand_gpu_hours"], t["share"]) for t in r.top.to_pylist()}
        assert top == ({"cq": (10.0, 1.0)} if names[0] == "cq" else {"cq-east": (6.0, 0.6), "cq-west": (4.0, 0.4)})


def _scrape_rows(t: dt.datetime, pending: float, *, cluster: str | None = "k8s", quota: bool = True) -> list[dict]:
    base = dict(sample_utc=t, cluster=cluster, scope="cluster_queue", cluster_queue="cq")
    rows = [dict(base, kind="resource", resource="nvidia.com/gpu", resource_pending=pending)]
    if quota:
        rows.append(dict(base, kind="resource", resource="nvidia.com/gpu", flavor="a100", resource_usage=2.0,
                         nominal_quota=8.0))
    return rows


def test_kueue_hourly_demand_is_time_weighted_when_the_scrape_interval_changes():
    """DESIGN 5.6: demand is the time-weighted mean over the hour. Scraped every 15 s from 10:00 to
    10:10 with 10 GPUs pending, then every minute to 11:00 with 2: the hour is 10 GPUs for 10 min
    and 2 for 50 (3.33 GPUs), not the mean over 40 + 50 scrapes (5.56), and so are the queue's
    GPU-hours."""
    rows = []
    for k in range(40):
        rows += _scrape_rows(at(10) + dt.timedelta(seconds=15 * k), 10.0)
    for k in range(50):
        rows += _scrape_rows(at(10, 10) + dt.timedelta(minutes=k), 2.0)
    r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END,
                           kueue=pa.Table.from_pylist(rows, schema=KUEUE_DEMAND.schema))
    # the median interval is 60 s: the last scrape (10:59) stands for 10:59-11:00
    row = kueue_hour(r, 10)
    assert row["demand_gpus"] == pytest.approx((10 * 10 + 2 * 50) / 60, rel=1e-12)
    assert (row["idle_gpus"], row["total_gpus"], row["capacity_coverage"]) == (6.0, 8.0, 1.0)
    assert _kueue_top(r) == pytest.approx({"cq": (10 * 10 + 2 * 50) / 60}, rel=1e-12)


def test_kueue_scrape_outage_is_not_filled_with_the_last_value():
    """Scraped every minute; nothing from 10:20 to 10:50 (a controller restart): the 10:19 scrape
    stands for one minute, not for the outage, so its 9 GPUs weigh 1 minute; the hour's coverage
    says 30 of 60 minutes were seen. A scrape 2 minutes after the one before (under 3 intervals)
    holds over the gap. A cluster without the quota series covers no capacity."""
    rows = []
    for m in [*range(0, 19), *range(50, 58), 59]:
        rows += _scrape_rows(at(10, m), 1.0)
    rows += _scrape_rows(at(10, 19), 9.0)
    r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END,
                           kueue=pa.Table.from_pylist(rows, schema=KUEUE_DEMAND.schema))
    row = hourly(r, source="kueue")[10]
    # covered: 10:00-10:20 and 10:50-11:00 (10:57 holds to 10:59, 10:59 stands for a minute)
    assert row["demand_gpus"] == pytest.approx((19 * 1 + 1 * 9 + 10 * 1) / 30, rel=1e-12)
    assert row["capacity_coverage"] == pytest.approx(0.5, rel=1e-12)
    rows += _scrape_rows(at(10, 30), 1.0, cluster="other", quota=False)
    row = hourly(demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END,
                                    kueue=pa.Table.from_pylist(rows, schema=KUEUE_DEMAND.schema)),
                 source="kueue")[10]
    assert row["capacity_coverage"] == 0.0 and row["idle_gpus"] is None and row["severity"] == "Unknown"


def test_kueue_a_cluster_without_scrapes_in_an_hour_makes_it_unknown_and_no_scrape_stands_for_hours():
    """Two clusters every 10 minutes; ``west`` has none from 10:00 to 11:00 (its 09:50 scrape stands
    for 10 minutes, to 10:00): hour 10 is unknown with coverage 0, not east's half of the pool at
    coverage 1. Scrapes at 13:00 and 17:00 only (a collector that mostly failed): each stands for an
    hour at most, not the 4 hours between them."""
    rows = []
    for cluster in ("east", "west"):
        for m in range(9 * 60, 12 * 60, 10):
            if cluster == "west" and 10 * 60 <= m < 11 * 60:
                continue
            rows += _scrape_rows(at(m // 60, m % 60), 2.0, cluster=cluster)
    by_hour = hourly(demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END,
                                        kueue=pa.Table.from_pylist(rows, schema=KUEUE_DEMAND.schema)), source="kueue")
    assert [(h, x["demand_gpus"], x["capacity_coverage"]) for h, x in sorted(by_hour.items()) if 9 <= h <= 11] == [
        (9, 4.0, 1.0), (10, None, 0.0), (11, 4.0, 1.0)]
    assert by_hour[10]["idle_gpus"] is None and by_hour[10]["severity"] == "Unknown"
    sparse = _scrape_rows(at(13), 5.0) + _scrape_rows(at(17), 1.0)
    by_hour = hourly(demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END,
                                        kueue=pa.Table.from_pylist(sparse, schema=KUEUE_DEMAND.schema)), source="kueue")
    assert {h: x["demand_gpus"] for h, x in by_hour.items() if x["demand_gpus"] is not None} == {13: 5.0, 17: 1.0}
    assert len(by_hour) == 24 and by_hour[14]["capacity_coverage"] == 0.0


def test_kueue_gpu_resource_names_are_configurable():
    """A cluster whose GPUs are ``amd.com/gpu`` and MIG slices ``nvidia.com/mig-1g.10gb`` /
    ``nvidia.com/mig-3g.40gb``: by default (``nvidia.com/gpu``) its capacity is unknown; named, or as
    a ``*`` glob, they count (each unit one GPU) and the top contributors follow; ``_`` in a name is
    no wildcard."""
    rows = []
    for cq, resource, quota, usage, pending in (("cq-amd", "amd.com/gpu", 8.0, 6.0, 3.0),
                                                ("cq-mig1", "nvidia.com/mig-1g.10gb", 7.0, 7.0, 2.0),
                                                ("cq-mig3", "nvidia.com/mig-3g.40gb", 2.0, 0.0, 0.0),
                                                ("cq-xmig", "nvidia.comXmig-1g", 5.0, 0.0, 9.0)):
        base = dict(sample_utc=at(10, 5), cluster="k8s", scope="cluster_queue", cluster_queue=cq)
        rows += [dict(base, kind="resource", resource=resource, resource_pending=pending),
                 dict(base, kind="resource", resource=resource, flavor="f-" + cq, resource_usage=usage,
                      nominal_quota=quota)]
    kueue = pa.Table.from_pylist(rows, schema=KUEUE_DEMAND.schema)

    def hour(resources=None):
        kw = {} if resources is None else {"kueue_resources": kueue_gpu_resources(resources)}
        r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END, kueue=kueue, **kw)
        row = hourly(r, source="kueue")[10]
        return (row["demand_gpus"], row["idle_gpus"], row["total_gpus"], row["severity"]), _kueue_top(r)

    assert hour() == ((None, None, None, "Unknown"), {})
    assert hour("amd.com/gpu") == ((3.0, 2.0, 8.0, "Warning"), {"cq-amd": 3.0})
    both = ((5.0, 4.0, 17.0, "Warning"), {"cq-amd": 3.0, "cq-mig1": 2.0})
    assert hour("amd.com/gpu, nvidia.com/mig-*") == both
    assert hour("amd.com/gpu,nvidia.com/mig-1g.10gb,nvidia.com/mig-3g.40gb") == both
    assert hour("amd.com/gpu,nvidia.com/mig_1g*") == ((3.0, 2.0, 8.0, "Warning"), {"cq-amd": 3.0})  # _ is no wildcard
    assert kueue_gpu_resources("") == ("nvidia.com/gpu",) and kueue_gpu_resources(" a/b , a/b ") == ("a/b",)
    with pytest.raises(ValueError, match="MY_VAR: \"x' OR 1=1\" is not a resource name"):
        kueue_gpu_resources("x' OR 1=1", "MY_VAR")
    for bare in ("*", "cpu", "*/gpu", "nvidia.com/gpu,memory"):  # would count cpu / memory rows as GPUs
        with pytest.raises(ValueError, match="is not an extended resource name"):
            kueue_gpu_resources(bare, "MY_VAR")


# -- Kueue top contributors against the hourly demand --------------------------------------------


def _kueue_scrape_text(queues: dict[str, tuple[float | None, int | None, int | None]]) -> str:
    """One Kueue ``/metrics`` scrape in the Go client's text format, modeled on
    ``fixtures/kueue/kueue-metrics-0.prom`` (leader replica, cohort ``gpus``, flavor
    ``<queue>-80gb``, 8 GPUs of quota, 4 used): per ClusterQueue ``(pending GPUs, active,
    inadmissible pending workloads)``. A None leaves that series out of the scrape (an older Kueue, or
    the optional ClusterQueue resource metrics turned off, has no ``kueue_cluster_queue_resource_pending``)."""
    lines: list[str] = []

    def family(name: str, help_: str, samples: list[str]) -> None:
        if samples:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} gauge", *samples])

    def flavored(cq: str) -> str:
        return (f'cluster_queue="{cq}",cohort="gpus",flavor="{cq.removeprefix("gpu-")}-80gb",'
                f'replica_role="leader",resource="nvidia.com/gpu"')

    family("kueue_cluster_queue_nominal_quota", "Reports the cluster_queue's resource nominal quota within all "
           "the flavors", [f"kueue_cluster_queue_nominal_quota{{{flavored(cq)}}} 8" for cq in queues])
    family("kueue_cluster_queue_resource_pending", "Reports the cluster_queue's total pending resource requests.",
           [f'kueue_cluster_queue_resource_pending{{cluster_queue="{cq}",replica_role="leader",'
            f'resource="nvidia.com/gpu"}} {gpus:g}' for cq, (gpus, _, _) in queues.items() if gpus is not None])
    family("kueue_cluster_queue_resource_usage", "Reports the cluster_queue's total resource usage within all "
           "the flavors", [f"kueue_cluster_queue_resource_usage{{{flavored(cq)}}} 4" for cq in queues])
    family("kueue_pending_workloads", "The number of pending workloads, per 'cluster_queue' and 'status'.",
           [f'kueue_pending_workloads{{cluster_queue="{cq}",replica_role="leader",status="{status}"}} {n}'
            for cq, (_, active, inadmissible) in queues.items()
            for status, n in (("active", active), ("inadmissible", inadmissible)) if n is not None])
    return "\n".join(lines) + "\n"


def _kueue_table(scrapes: list[tuple[str, dt.datetime, dict]]) -> pa.Table:
    """``clean/kueue_demand`` rows of ``(cluster, taken at, queues)`` scrapes, by the real parser."""
    clusters = sorted({c for c, _, _ in scrapes})
    return pa.concat_tables([
        parse_kueue_scrapes([(t, _kueue_scrape_text(q)) for c, t, q in scrapes if c == cluster],
                            cluster=cluster).table
        for cluster in clusters
    ])


def _kueue_result(kueue: pa.Table, start: dt.datetime, end: dt.datetime, **kwargs):
    return demand_from_tables(JOBS.empty(), GPU_STATES.empty(), start, end, kueue=kueue, **kwargs)


def _kueue_top(result) -> dict[str, float]:
    return {t["key"]: t["demand_gpu_hours"] for t in result.top.to_pylist() if t["source"] == "kueue"}


def _assert_kueue_top_adds_up_to_the_hourly_demand(kueue: pa.Table, hours: list[int], unknown_gpu_hours: float = 0.0,
                                                   **kwargs) -> None:
    """For every hour (a window of that hour alone), the queues' GPU-hours -- all queues, not only
    the top N -- add up to the hour's Kueue ``demand_gpus``; and over the day, to the hours' sum
    plus ``unknown_gpu_hours``, those of clusters in hours whose demand is unknown (another cluster
    of the day has no scrape for them). An hour that only a scrape of the hour before stands into
    has no row in a window of its own."""
    taken = kueue["sample_utc"].to_pylist()
    for h in hours:
        r = _kueue_result(kueue, at(h), at(h + 1), top_n=10_000, **kwargs)
        if not any(at(h) <= t < at(h + 1) for t in taken):
            assert hourly(r, source="kueue") == {} and _kueue_top(r) == {}, h
            continue
        (row,) = hourly(r, source="kueue").values()
        assert row["demand_gpus"] is not None, h
        assert sum(_kueue_top(r).values()) == pytest.approx(row["demand_gpus"], rel=1e-12), h
    r = _kueue_result(kueue, DAY, END, top_n=10_000, **kwargs)
    day_hours = sum(x["demand_gpus"] or 0.0 for x in hourly(r, source="kueue").values())
    outside = [x for h, x in hourly(r, source="kueue").items() if h not in hours]
    assert len(outside) == 24 - len(hours) and all(x["demand_gpus"] is None and x["capacity_coverage"] == 0.0
                                                    for x in outside)
    assert sum(_kueue_top(r).values()) == pytest.approx(day_hours + unknown_gpu_hours, rel=1e-12)
    assert sum(t["share"] for t in r.top.to_pylist()) == pytest.approx(1.0)


@pytest.mark.parametrize("gpus_per_workload", [None, 2.0])
def test_kueue_top_contributors_take_a_scrape_without_pending_resources_as_the_hourly_demand(gpus_per_workload):
    """The 10:20 scrape has pending workloads but no pending-resources series: the hourly demand
    reads it as pending workloads x GPUs a workload, or skips it when that is unknown (the mean of
    the other two scrapes). The top contributors counted it as 0 pending GPUs and divided by all
    three scrapes: a100 22/3 and h100 12/3 GPU-hours against an hour of 17 (or 50/3) GPUs."""
    kueue = _kueue_table([
        ("k8s", at(10, 0), {"gpu-a100": (10, 3, 1), "gpu-h100": (6, 0, 2)}),
        ("k8s", at(10, 20), {"gpu-a100": (None, 5, 0), "gpu-h100": (None, 1, 2)}),
        ("k8s", at(10, 40), {"gpu-a100": (12, 5, 0), "gpu-h100": (6, 1, 2)}),
    ])
    r = _kueue_result(kueue, DAY, END, kueue_gpus_per_workload=gpus_per_workload)
    row = kueue_hour(r, 10)
    if gpus_per_workload is None:  # 10:20 unknown: skipped
        assert row["demand_gpus"] == 17.0
        assert _kueue_top(r) == {"gpu-a100": 11.0, "gpu-h100": 6.0}
    else:  # 10:20: a100 5 x 2, h100 3 x 2 pending GPUs
        assert row["demand_gpus"] == pytest.approx(50 / 3)
        assert _kueue_top(r) == pytest.approx({"gpu-a100": 32 / 3, "gpu-h100": 6.0})
    _assert_kueue_top_adds_up_to_the_hourly_demand(kueue, [10], kueue_gpus_per_workload=gpus_per_workload)


def test_kueue_top_contributors_of_an_hour_with_pending_workloads_only():
    """No scrape of the hour has the pending-resources series: the hourly demand is pending
    workloads x GPUs a workload, and the top contributors were empty. Without GPUs a workload the
    hour's demand is unknown (and no queue is a contributor); with no pending workload it is 0."""
    scrapes = [("k8s", at(11, 0), {"gpu-a100": (None, 3, 1), "gpu-h100": (None, 0, 2)}),
               ("k8s", at(11, 30), {"gpu-a100": (None, 5, 0), "gpu-h100": (None, 1, 2)})]
    kueue = _kueue_table(scrapes)
    r = _kueue_result(kueue, DAY, END, kueue_gpus_per_workload=2.0)
    row = kueue_hour(r, 11)
    assert (row["demand_gpus"], row["pending_jobs"]) == (14.0, 7.0)
    assert _kueue_top(r) == {"gpu-a100": 9.0, "gpu-h100": 5.0}
    assert [(t["key"], t["share"], t["rank"]) for t in r.top.to_pylist()] == [
        ("gpu-a100", 9 / 14, 1), ("gpu-h100", 5 / 14, 2)]
    _assert_kueue_top_adds_up_to_the_hourly_demand(kueue, [11], kueue_gpus_per_workload=2.0)
    # GPUs a workload unknown: the demand is unknown, no contributor
    r = _kueue_result(kueue, DAY, END)
    assert hourly(r, source="kueue")[11]["demand_gpus"] is None and _kueue_top(r) == {}
    # no pending workload: no demand, no contributor
    idle = _kueue_table([(c, t, {cq: (None, 0, 0) for cq in q}) for c, t, q in scrapes])
    r = _kueue_result(idle, DAY, END)
    assert hourly(r, source="kueue")[11]["demand_gpus"] == 0.0 and _kueue_top(r) == {}


def test_kueue_top_contributors_add_up_to_the_hourly_demand_every_hour():
    """Two clusters scraped at their own instants, one queue name in both: hours with the
    pending-resources series in every scrape, in some, in none; a scrape that says nothing about
    demand (quota and usage only: skipped by the hourly demand, counted as 0 by the top
    contributors); a scrape where one queue has the series and the other only pending workloads (the
    hourly demand takes the series' sum: that queue's workloads are not counted)."""
    nothing = {"gpu-a100": (None, None, None), "gpu-h100": (None, None, None)}
    kueue = _kueue_table([
        # east, hour 9: the series in every scrape
        ("east", at(9, 5), {"gpu-a100": (4, 2, 0), "gpu-h100": (2, 1, 0)}),
        ("east", at(9, 35), {"gpu-a100": (6, 3, 0), "gpu-h100": (0, 0, 0)}),
        # east, hour 10: one scrape without the series, one saying nothing about demand
        ("east", at(10, 5), {"gpu-a100": (8, 4, 0), "gpu-h100": (2, 1, 0)}),
        ("east", at(10, 25), {"gpu-a100": (None, 3, 1), "gpu-h100": (None, 0, 1)}),
        ("east", at(10, 45), nothing),
        # east, hour 11: pending workloads only
        ("east", at(11, 5), {"gpu-a100": (None, 1, 0), "gpu-h100": (None, 2, 3)}),
        ("east", at(11, 35), {"gpu-a100": (None, 0, 0), "gpu-h100": (None, 4, 0)}),
        # west, hour 10: the series for a100 only in one scrape, a scrape saying nothing
        ("west", at(10, 15), {"gpu-a100": (3, 1, 0), "gpu-h100": (None, 2, 0)}),
        ("west", at(10, 30), nothing),
        ("west", at(10, 50), {"gpu-a100": (1, 1, 0), "gpu-h100": (5, 2, 1)}),
        # west, hour 11: nothing about demand, then the series
        ("west", at(11, 15), nothing),
        ("west", at(11, 45), {"gpu-a100": (7, 3, 1), "gpu-h100": (1, 1, 0)}),
    ])
    r = _kueue_result(kueue, DAY, END, kueue_gpus_per_workload=2.0)
    demand = {h: x["demand_gpus"] for h, x in hourly(r, source="kueue").items()}
    # Time-weighted: a scrape stands for the minutes until its cluster's next scrape (the last for the
    # cluster's median interval: east 25, west 22.5 min), split at the hours; a scrape saying nothing
    # about demand is left out with its minutes.
    # east (a100 + h100 pending GPUs x minutes): 9:05 (4 + 2) x 30, 9:35 (6 + 0) x 25 | x 5 in hour
    # 10, 10:05 (8 + 2) x 20, 10:25 (4 + 1 workloads x 2) x 20, [10:45 nothing x 15 | 5],
    # 11:05 (1 + 5 workloads x 2) x 30, 11:35 (0 + 4 workloads x 2) x 25;
    # west: 10:15 (3 + 0: h100's workloads are not counted, the scrape has the series) x 15,
    # [10:30 nothing x 20], 10:50 (1 + 5) x 10 | x 15, [11:15 nothing x 30], 11:45 (7 + 1) x 15 | x 7.5.
    # Hour 9 has no west scrape, hour 12 no east one: unknown (their queues still count GPU-hours).
    east = {9: (6 * 30 + 6 * 25) / 55, 10: (6 * 5 + 10 * 20 + 10 * 20) / 45, 11: (12 * 30 + 8 * 25) / 55}
    west = {10: (3 * 15 + 6 * 10) / 25, 11: (6 * 15 + 8 * 15) / 30, 12: 8.0}
    assert (demand[9], demand[12]) == (None, None) and sorted(h for h, d in demand.items() if d is not None) == [10, 11]
    assert [demand[10], demand[11]] == pytest.approx([east[10] + west[10], east[11] + west[11]], rel=1e-12)
    assert (demand[10], demand[11]) != (14.5, 18.0)  # the plain means over the hours' scrapes
    rows = hourly(r, source="kueue")
    assert [rows[h]["capacity_coverage"] for h in (9, 12)] == [0.0, 0.0] and rows[9]["severity"] == "Unknown"
    a100 = (4 * 30 + 6 * 25) / 55 + (6 * 5 + 8 * 20 + 8 * 20) / 45 + 2 * 30 / 55 + (3 * 15 + 1 * 10) / 25 + 4.0 + 7.0
    h100 = (2 * 30) / 55 + (2 * 20 + 2 * 20) / 45 + (10 * 30 + 8 * 25) / 55 + (5 * 10) / 25 + 3.0 + 1.0
    assert _kueue_top(r) == pytest.approx({"gpu-a100": a100, "gpu-h100": h100}, rel=1e-12)
    assert a100 + h100 == pytest.approx(sum(east.values()) + sum(west.values()), rel=1e-12)
    _assert_kueue_top_adds_up_to_the_hourly_demand(kueue, [9, 10, 11, 12], unknown_gpu_hours=east[9] + west[12],
                                                   kueue_gpus_per_workload=2.0)


# -- simulated pool ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    # telemetry is not used here: a coarse interval keeps the fixture fast (slots and jobs are the same)
    ds = build_sim_dataset(tmp_path_factory.mktemp("demand_sim"), telemetry_interval_s=900)
    # The dataset writes clean jobs for its two full UTC days; production also has the days before
    # (the lookback that holds runs evicted the day before): clean the first local day's docs too.
    first = (dt.date.fromisoformat(ds.days[0]) - dt.timedelta(days=1)).isoformat()
    s, e = ds.window(first)
    ds.store.write_partition(JOBS, first, clean_job_documents(raw_docs_from_files(ds.sources / "jobs", s, e).table,
                                                              s, e).table)
    out = {day: demand_for_day(ds.store, day, *ds.window(day)) for day in ds.days}
    return ds, out


def _truth_per_job(con, truth_dir, day_start, day_end):
    """Σ request_gpus x queued seconds inside the day per truth job: QDate -> start of run 0, and the
    gaps between runs of restarted jobs (the brief's definition), with what the records can see."""
    return {g: (gh, visible, finished) for g, gh, visible, finished in con.sql(
        """
        WITH r AS (
            SELECT *, lag(end_utc) OVER w AS prev_end,
                   bool_or(end_utc IS NOT NULL) OVER (PARTITION BY global_job_id) AS visible,
                   last_value(end_reason) OVER (PARTITION BY global_job_id ORDER BY run_index
                       ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) = 'completed' AS finished
            FROM read_parquet($truth) WINDOW w AS (PARTITION BY global_job_id ORDER BY run_index)
        ),
        iv AS (
            SELECT global_job_id, request_gpus, visible, finished, qdate_utc AS s,
                   coalesce(start_utc, $wend) AS e
            FROM r WHERE run_index = 0
            UNION ALL
            SELECT global_job_id, request_gpus, visible, finished, prev_end, start_utc
            FROM r WHERE run_index > 0 AND prev_end IS NOT NULL
        )
        SELECT global_job_id,
               sum(request_gpus * greatest(0, epoch(least(e, $d1)) - epoch(greatest(s, $d0)))) / 3600,
               bool_or(visible), bool_or(finished)
        FROM iv GROUP BY global_job_id
        """,
        params={"truth": str(truth_dir / "jobs.parquet"), "d0": day_start, "d1": day_end,
                "wend": day_end + dt.timedelta(days=30)},
    ).fetchall()}


def test_sim_demand_against_truth(sim):
    ds, out = sim
    con = connect()
    for day in ds.days:
        start, end = ds.window(day)
        res = out[day]
        truth = _truth_per_job(con, ds.truth, start, end)
        got: dict[str, float] = {}
        for iv in res.intervals.to_pylist():
            got[iv["global_job_id"]] = got.get(iv["global_job_id"], 0.0) + iv["request_gpus"] * (
                iv["end_utc"] - iv["start_utc"]).total_seconds() / 3600
        # the table is the intervals, hour by hour
        all_rows = [r for r in res.capacity.to_pylist() if r["device_class"] == "ALL"]
        assert len(all_rows) == 24
        assert sum(r["demand_gpus"] for r in all_rows) == pytest.approx(sum(got.values()), rel=1e-12)

        # 1. jobs that finished inside the simulated window have every run in the records:
        #    their queued GPU-hours equal the truth (within 1 %; in fact to the second, job by job)
        fin_truth = sum(gh for gh, _, finished in truth.values() if finished)
        fin_got = sum(got.get(g, 0.0) for g, (_, _, finished) in truth.items() if finished)
        assert fin_truth > 500
        assert fin_got == pytest.approx(fin_truth, rel=0.01)
        exact = sum(1 for g, (gh, _, f) in truth.items() if f and abs(got.get(g, 0.0) - gh) < 1e-6)
        assert exact == sum(1 for _, _, f in truth.values() if f)

        # 1b. every job that has a record (some run ended): waits before run 0 and between runs
        #     match the truth within 1 % (the rest: gaps whose next run was still running at the
        #     simulation end, which the records show as idle after the eviction)
        seen = sum(iv["request_gpus"] * (iv["end_utc"] - iv["start_utc"]).total_seconds() / 3600
                   for iv in res.intervals.to_pylist() if iv["reason"] in ("first_run", "requeued"))
        seen_truth = sum(gh for gh, visible, _ in truth.values() if visible)
        assert seen == pytest.approx(seen_truth, rel=0.01)

        # 2. every job with demand is a real job, never with less queued time than the truth: the
        #    extra is the idle tail after an eviction (until removal or the window end), which the
        #    truth's run table does not bound
        assert set(got) <= set(truth)
        assert all(got[g] >= truth[g][0] - 1e-6 for g in got)

        # 3. what is missing has no record at all: jobs still queued or on their first run at the
        #    simulation end (the simulator writes history documents only when a run ends)
        missing = {g for g, (gh, _, _) in truth.items() if gh > 0 and g not in got}
        assert all(not truth[g][1] for g in missing)
    con.close()


def test_sim_demand_per_device_class_against_truth(sim):
    """The simulator's jobs that name a device model (``RequireGPUs_EXPR`` in their documents) are
    that model's demand, read through clean/jobs and the ClassAd library: job by job their class is
    the truth's ``require_device``, every other job is ANY, and each model's hourly rows add up to
    its jobs' queued GPU-hours -- for the finished jobs, the truth's own."""
    ds, out = sim
    con = connect()
    named = dict(con.sql("SELECT DISTINCT global_job_id, require_device FROM read_parquet($p) "
                         "WHERE require_device IS NOT NULL", params={"p": str(ds.truth / "jobs.parquet")}).fetchall())
    classes_with_demand = set()
    for day in ds.days:
        start, end = ds.window(day)
        res = out[day]
        truth = _truth_per_job(con, ds.truth, start, end)
        intervals = res.intervals.to_pylist()
        assert intervals
        for iv in intervals:
            assert iv["device_class"] == named.get(iv["global_job_id"], "ANY"), iv["global_job_id"]
        per_class: dict[str, float] = {}
        for iv in intervals:
            per_class[iv["device_class"]] = per_class.get(iv["device_class"], 0.0) + iv["request_gpus"] * (
                iv["end_utc"] - iv["start_utc"]).total_seconds() / 3600
        rows = res.capacity.to_pylist()
        for cls, gpu_hours in per_class.items():
            if cls == "ANY":
                continue
            got = sum(r["demand_gpus"] for r in rows if r["device_class"] == cls)
            assert got == pytest.approx(gpu_hours, rel=1e-12), cls
            # the class's capacity rows are that model's GPUs (it ran there, so the pool has it)
            assert any(r["total_gpus"] for r in rows if r["device_class"] == cls)
            fin_truth = sum(gh for g, (gh, _, finished) in truth.items() if finished and named.get(g) == cls)
            fin_got = sum(iv["request_gpus"] * (iv["end_utc"] - iv["start_utc"]).total_seconds() / 3600
                          for iv in intervals if iv["device_class"] == cls and truth[iv["global_job_id"]][2])
            assert fin_got == pytest.approx(fin_truth, rel=0.01), cls
            if gpu_hours > 0:
                classes_with_demand.add(cls)
        # ALL is every class's demand together
        all_demand = sum(r["demand_gpus"] for r in rows if r["device_class"] == "ALL")
        assert all_demand == pytest.approx(sum(per_class.values()), rel=1e-12)
    assert len(classes_with_demand) >= 2
    con.close()


def test_sim_idle_capacity_against_truth(sim):
    ds, out = sim
    con = connect()
    for day in ds.days:
        start, end = ds.window(day)
        rows = [r for r in out[day].capacity.to_pylist() if r["device_class"] == "ALL"]
        (idle_truth, busy_truth), = con.sql(
            """SELECT sum(secs) FILTER (WHERE state LIKE 'idle%') / 3600, sum(secs) FILTER (WHERE state LIKE 'busy%') / 3600
               FROM (SELECT state, greatest(0, epoch(least(end_utc, $d1)) - epoch(greatest(start_utc, $d0))) AS secs
                     FROM read_parquet($p))""",
            params={"p": str(ds.truth / "gpu_state_intervals.parquet"), "d0": start, "d1": end},
        ).fetchall()
        idle = sum(r["idle_gpus"] for r in rows)
        busy = sum(r["busy_gpus"] for r in rows)
        assert idle_truth > 10
        assert idle == pytest.approx(idle_truth, rel=0.01)
        assert busy == pytest.approx(busy_truth, rel=0.01)
        # per device too, and the open share is the shared (open-capacity) hosts' idle time
        for r in rows:
            assert r["idle_open_gpus"] <= r["idle_gpus"] <= r["total_gpus"]
    con.close()


def test_sim_day_is_identical_alone_or_with_other_days(sim):
    ds, out = sim
    first, last = ds.days
    start, _ = ds.window(first)
    _, end = ds.window(last)
    con = connect()
    js, jp = ds.store.relation_sql(JOBS, sorted(set(job_days(first)) | set(job_days(last))))
    ss, sp = ds.store.relation_sql(GPU_STATES, ds.days)
    both = compute_demand_capacity(con, js, jp, ss, sp, start, end).capacity
    con.close()
    split = ds.window(last)[0]
    mask = pa.compute.greater_equal(both["hour_start_utc"], pa.scalar(split, pa.timestamp("us", tz="UTC")))
    assert both.filter(mask).equals(out[last].capacity)
    assert both.filter(pa.compute.invert(mask)).equals(out[first].capacity)
    # and a re-run gives the same bytes
    assert demand_for_day(ds.store, last, *ds.window(last)).capacity.equals(out[last].capacity)


def test_a_removal_record_without_request_gpus_still_ends_the_wait():
    """Evicted at 10:00 (the epoch record asks for a GPU), removed at 10:20 by a record whose
    RequestGPUs is null (an expression the index left unevaluated): the job waited 20 minutes. The
    removal was filtered out with the GPU-less rows, so the job stayed idle to the end of the day
    and, through the look-back, all of the next."""
    ev = job("bf#8.0#1", 0, "epoch", queued=at(9), start=at(9, 30), end=at(10), lv=at(10), status=1)
    removed = job("bf#8.0#1", 0, "job", queued=at(9), start=at(9, 30), end=at(10), lv=at(10), status=3,
                  record=at(10, 20), gpus=None)
    r = demand_from_tables(jobs([ev, removed]), states(2), DAY, END)
    assert [(x[1], x[2], x[3]) for x in reasons(r)] == [("after_last_run", at(10), at(10, 20)),
                                                       ("first_run", at(9), at(9, 30))]
    assert sum(h["demand_gpus"] for h in hourly(r).values()) == pytest.approx(0.5 + 20 / 60)
    nxt = DAY + dt.timedelta(days=1)
    r = demand_from_tables(jobs([ev, removed]), states(2, start=nxt, end=nxt + dt.timedelta(days=1)), nxt,
                           nxt + dt.timedelta(days=1))
    assert sum(x["demand_gpus"] for x in r.capacity.to_pylist() if x["device_class"] == "ALL") == 0


def test_a_job_asking_for_less_than_one_gpu_is_no_gpu_demand():
    """DESIGN 4.4: RequestGPUs >= 1. A job with RequestGPUs 0.5 counted as half a GPU of demand."""
    r = demand_from_tables(jobs([job("s#1.0#1", 0, "job", queued=at(9), status=1, record=at(11), gpus=0.5),
                                 job("s#2.0#1", 0, "job", queued=at(9), status=1, record=at(11), gpus=2.0)]),
                           states(4), DAY, END)
    assert hourly(r)[9]["demand_gpus"] == pytest.approx(2.0)


def test_a_held_job_is_no_demand_from_when_it_was_held():
    """DESIGN 4.4: demand is JobStatus 1. A job held at the end of its run (10:00) and seen held at
    14:00 by a condor_q snapshot waited 10:00-14:00 as far as the demand told; one held at 09:00
    before it ever ran, seen at 12:00, waited 08:00-12:00. EnteredCurrentStatus says when the hold
    began (without it, the record's time is all there is)."""
    ran = job("s#1.0#1", 0, "job", queued=at(8), start=at(8, 30), end=at(10), status=5, record=at(14),
              entered=at(10), gpus=2.0)
    never = job("s#2.0#1", 0, "job", queued=at(8), status=5, record=at(12), entered=at(9))
    r = demand_from_tables(jobs([ran, never]), states(4), DAY, END)
    h = hourly(r)
    assert h[8]["demand_gpus"] == pytest.approx(2 * 0.5 + 1.0)  # the first waited to 08:30, the other all hour
    assert all(h[k]["demand_gpus"] == 0 for k in range(9, 15)), [h[k]["demand_gpus"] for k in range(9, 15)]
    # without EnteredCurrentStatus (days written before the column): the record's time
    r = demand_from_tables(jobs([{**never, "status_entered_utc": None}]), states(4), DAY, END)
    assert [hourly(r)[k]["demand_gpus"] for k in range(8, 13)] == [1.0, 1.0, 1.0, 1.0, 0.0]


def test_a_job_held_or_removed_while_running_has_no_wait_after_its_run():
    """condor_hold / condor_rm on a running job: the schedd sets the status (EnteredCurrentStatus
    10:00) before the shadow vacates the run (10:00:30). The wait after the run began before the
    status was entered: the job left at the run's end, no wait; it ran to the window's end (and
    through the look-back, every next day) for the first fix of held jobs."""
    held = job("s#1.0#1", 0, "job", queued=at(8), start=at(8, 30), end=at(10) + dt.timedelta(seconds=30), status=5,
               record=at(14),
               entered=at(10), gpus=2.0)
    r = demand_from_tables(jobs([held]), states(4), DAY, END)
    assert [x[1] for x in reasons(r)] == ["first_run"]
    assert sum(h["demand_gpus"] for h in hourly(r).values()) == pytest.approx(2 * 0.5)


# -- Kueue: a ClusterQueue that is not active (kueue_cluster_queue_status) ----------------------


def _status_scrape(queues: dict[str, tuple[int, int, int, str | None]], cohort: str = "team") -> str:
    """A scrape of ClusterQueues ``name: (quota, usage, pending GPUs, status)`` in one cohort; a status
    None leaves the queue's ``kueue_cluster_queue_status`` samples out."""
    lines = []
    for cq, (quota, usage, pending, status) in queues.items():
        flavored = f'cluster_queue="{cq}",cohort="{cohort}",flavor="a100",replica_role="leader",resource="nvidia.com/gpu"'
        lines += [f"kueue_cluster_queue_nominal_quota{{{flavored}}} {quota}",
                  f"kueue_cluster_queue_resource_usage{{{flavored}}} {usage}",
                  f'kueue_cluster_queue_resource_pending{{cluster_queue="{cq}",replica_role="leader",'
                  f'resource="nvidia.com/gpu"}} {pending}']
        if status is not None:
            lines += [f'kueue_cluster_queue_status{{cluster_queue="{cq}",replica_role="leader",status="{s}"}} '
                      f'{int(s == status)}' for s in ("pending", "active", "terminated")]
    return "\n".join(lines) + "\n"


def test_kueue_an_inactive_cluster_queues_quota_is_no_capacity():
    """cq-a is active (8 GPUs of quota, 2 used, 4 pending); cq-b, in its cohort, is pending (its
    flavor or admission check missing: it admits nothing) with 8 GPUs of quota and 3 pending: its
    quota is neither idle nor total capacity (it read 14 idle of 16, DCR 0.5, Healthy), while its
    pending GPUs are still demand. A cluster whose only queue is inactive has 0 GPUs of capacity
    (known, not Unknown); a scrape without the status metric (or a day written before it was read)
    counts every queue's quota as before."""
    def hour(queues, drop_status_column=False):
        kueue = parse_kueue_scrapes([(at(10), _status_scrape(queues))], cluster="k8s").table
        if drop_status_column:
            kueue = kueue.drop_columns(["cluster_queue_status"])
        return kueue_hour(demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END, kueue=kueue), 10)

    row = hour({"cq-a": (8, 2, 4, "active"), "cq-b": (8, 0, 3, "pending")})
    assert (row["idle_gpus"], row["busy_gpus"], row["total_gpus"], row["demand_gpus"]) == (6.0, 2.0, 8.0, 7.0)
    assert row["dcr"] == pytest.approx(7 / 6) and row["severity"] == "Warning"
    assert row["capacity_coverage"] == 1.0
    # a terminating (terminated) queue cannot admit either
    assert hour({"cq-a": (8, 2, 4, "active"), "cq-b": (8, 0, 3, "terminated")})["total_gpus"] == 8.0
    # the GPUs an inactive queue still holds (workloads admitted before, running to their end) stay
    # busy capacity, none of its quota idle: 8 + 5 total, 2 + 5 busy, 6 idle
    held = hour({"cq-a": (8, 2, 4, "active"), "cq-b": (8, 5, 3, "terminated")})
    assert (held["idle_gpus"], held["busy_gpus"], held["total_gpus"]) == (6.0, 7.0, 13.0)
    only = hour({"cq-b": (8, 0, 3, "pending")})
    assert (only["idle_gpus"], only["busy_gpus"], only["total_gpus"], only["demand_gpus"]) == (0.0, 0.0, 0.0, 3.0)
    assert (only["dcr_capped"], only["severity"], only["capacity_coverage"]) == (True, "Critical", 1.0)
    for old in (hour({"cq-a": (8, 2, 4, None), "cq-b": (8, 0, 3, None)}),
                hour({"cq-a": (8, 2, 4, "active"), "cq-b": (8, 0, 3, "pending")}, drop_status_column=True)):
        assert (old["idle_gpus"], old["busy_gpus"], old["total_gpus"], old["demand_gpus"]) == (14.0, 2.0, 16.0, 7.0)


# -- Kueue: a configured source whose day has no readable scrape ---------------------------------


def test_kueue_a_configured_day_of_empty_scrape_files_is_24_unknown_hours(tmp_path):
    """Every ``curl`` of the day failed: its scrape files are empty (and one cut mid-line is set
    aside), so ``clean/kueue_demand`` has no row. With the Kueue source configured the day's Kueue
    hours are Unknown with coverage 0 (they had no row at all, while a day with one readable scrape
    had 23 Unknown hours); without a configured source the day has no Kueue row."""
    from gpu_pipeline.lib.kueue_source import clean_scrapes, raw_scrapes

    for m in range(0, 60, 10):
        (tmp_path / f"kueue-20250806T10{m:02d}00Z.prom").write_text("")
    (tmp_path / "kueue-20250806T110000Z.prom").write_text('kueue_pending_workloads{cluster_queue="cq",status')
    table, counters, quarantine = clean_scrapes(raw_scrapes(tmp_path, DAY, END), "k8s")
    assert (table.num_rows, counters["scrapes"], quarantine.num_rows) == (0, 6, 1)
    r = demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END, kueue=table, kueue_configured=True)
    rows = hourly(r, source="kueue")
    assert sorted(rows) == list(range(24))
    assert all((x["demand_gpus"], x["idle_gpus"], x["total_gpus"], x["pending_jobs"], x["dcr"], x["severity"],
                x["capacity_coverage"]) == (None, None, None, None, None, "Unknown", 0.0) for x in rows.values())
    assert _kueue_top(r) == {}
    assert hourly(demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END, kueue=table), source="kueue") == {}
    # configured, with readable scrapes: as before (the flag adds no phantom cluster of unknown hours)
    rows = hourly(demand_from_tables(JOBS.empty(), GPU_STATES.empty(), DAY, END, kueue_configured=True,
                                     kueue=pa.Table.from_pylist(_scrape_rows(at(10), 3.0), schema=KUEUE_DEMAND.schema)),
                  source="kueue")
    assert len(rows) == 24 and rows[10]["demand_gpus"] == 3.0 and rows[10]["capacity_coverage"] == 1.0


# -- job records: held then removed, job ads only, an open condor_q run ------------------------


def _clean_from_documents(docs: list[dict], start: dt.datetime = DAY, end: dt.datetime = END) -> pa.Table:
    """clean/jobs rows of adstash documents for ``[start, end)``, as the clean step writes them."""
    from gpu_pipeline.lib.jobs import canonical_json
    from gpu_pipeline.lib.schemas import RAW_JOB_DOCUMENTS

    texts = [canonical_json(d) for d in docs]
    raw = pa.table({"source": ["ndjson"] * len(texts), "origin": ["jobs.ndjson"] * len(texts),
                    "position": list(range(len(texts))), "doc_json": texts, "parse_error": [None] * len(texts)},
                   schema=RAW_JOB_DOCUMENTS.schema)
    return clean_job_documents(raw, start, end).table


def _s(hh: int, mm: int = 0) -> int:
    return int(at(hh, mm).timestamp())


def _gpu_hours(result) -> float:
    return sum(x["request_gpus"] * (x["end_utc"] - x["start_utc"]).total_seconds() / 3600
               for x in result.intervals.to_pylist())


def test_a_job_held_while_running_then_removed_has_no_wait_after_its_run():
    """A 4-GPU job queued 08:00, run 09:00, held while running at 10:00 (one hour of wall time),
    removed at 20:00: the final ad says JobStatus 3, LastJobStatus 5, EnteredCurrentStatus 20:00. It
    was held, not idle, from 10:00 to the removal: its demand is the first wait only, 08-09 x 4 GPUs
    = 4 GPU-h (the wait after the run, 10:00-20:00, read 40 GPU-h more). Evicted and idle until the
    removal (LastJobStatus 1), it waited 10:00-20:00: 4 + 40 = 44 GPU-h. Never started, held, then
    removed at 12:00 (queued 08:00, 1 GPU), the final ad keeps no hold start: 08:00-12:00 counts,
    4 GPU-h (documented)."""
    held = {"GlobalJobId": f"ap#88.0#{_s(8)}", "QDate": _s(8), "JobStartDate": _s(9), "JobCurrentStartDate": _s(9),
            "NumJobStarts": 1, "JobStatus": 3, "LastJobStatus": 5, "EnteredCurrentStatus": _s(20),
            "RecordTime": _s(20), "RequestGpus": 4, "Owner": "bob", "RemoteWallClockTime": 3600.0,
            "LastRemoteWallClockTime": 3600.0, "LastRemoteHost": "slot1_1@gpu01"}
    clean = _clean_from_documents([held])
    assert clean.select(["last_job_status", "run_end_utc"]).to_pylist() == [
        {"last_job_status": 5, "run_end_utc": at(10)}]
    r = demand_from_tables(clean, states(8), DAY, END)
    assert reasons(r) == [(held["GlobalJobId"], "first_run", at(8), at(9), False)]
    assert _gpu_hours(r) == 4.0
    assert [hourly(r)[k]["demand_gpus"] for k in range(8, 21)] == [4.0] + [0.0] * 12
    # with LastVacateTime at the hold (the shadow vacated the run): the same
    r = demand_from_tables(_clean_from_documents([{**held, "LastVacateTime": _s(10)}]), states(8), DAY, END)
    assert _gpu_hours(r) == 4.0

    idle = {**held, "LastJobStatus": 1, "LastVacateTime": _s(10)}
    r = demand_from_tables(_clean_from_documents([idle]), states(8), DAY, END)
    assert reasons(r) == [(held["GlobalJobId"], "after_last_run", at(10), at(20), False),
                          (held["GlobalJobId"], "first_run", at(8), at(9), False)]
    assert _gpu_hours(r) == 44.0

    never = {"GlobalJobId": f"ap#89.0#{_s(8)}", "QDate": _s(8), "JobStatus": 3, "LastJobStatus": 5,
             "EnteredCurrentStatus": _s(12), "RecordTime": _s(12), "RequestGpus": 1}
    r = demand_from_tables(_clean_from_documents([never]), states(8), DAY, END)
    assert reasons(r) == [(never["GlobalJobId"], "never_started", at(8), at(12), False)]
    assert _gpu_hours(r) == 4.0

    # days written before clean/jobs version 4 (no last_job_status column): the wait counts, as before
    old = _clean_from_documents([held]).drop_columns(["last_job_status", "first_start_utc"])
    assert _gpu_hours(demand_from_tables(old, states(8), DAY, END)) == 44.0

    # evicted at 10:00 (an eviction's vacate reason code), idle, held at 16:00, removed at 20:00: the
    # run sent it back to Idle, so it waited from 10:00 to the removal (its held time included: the
    # final ad gives no hold start), 44 GPU-h -- not the first wait alone (4 GPU-h undercounts 24 of
    # idle); so does an epoch of the run written with the job Idle
    evicted = {**held, "LastVacateTime": _s(10), "VacateReasonCode": 1018, "EnteredCurrentStatus": _s(20)}
    r = demand_from_tables(_clean_from_documents([evicted]), states(8), DAY, END)
    assert _gpu_hours(r) == 44.0
    epoch = {"GlobalJobId": held["GlobalJobId"], "QDate": _s(8), "JobCurrentStartDate": _s(9), "NumJobStarts": 1,
             "NumShadowStarts": 1, "EpochAdType": "EPOCH", "EpochWriteDate": _s(10), "JobStatus": 1,
             "LastVacateTime": _s(10), "RequestGpus": 4}
    r = demand_from_tables(_clean_from_documents([held, epoch]), states(8), DAY, END)
    assert _gpu_hours(r) == 44.0
    # a hold's vacate code (below 1000), or the removal's (1023): held or removed while running, no wait
    for code in (21, 1023):
        r = demand_from_tables(_clean_from_documents([{**held, "LastVacateTime": _s(10), "VacateReasonCode": code}]),
                               states(8), DAY, END)
        assert _gpu_hours(r) == 4.0, code


def test_job_ads_only_count_the_first_wait_up_to_the_first_start():
    """adstash's default (job history ads, no epochs): one ad of a 2-GPU job queued 08:00, first run
    09:00 (JobStartDate), evicted 10:00 (LastVacateTime), run again 12:00 (JobCurrentStartDate),
    completed 13:00. It waited 08-09 and 10-12: 3 h x 2 GPUs = 6 GPU-h (the first wait was dropped:
    4 GPU-h). The mean wait of hour 8 is the hour's wait since QDate at 09:00: 3600 s."""
    ad = {"GlobalJobId": f"ap#77.0#{_s(8)}", "QDate": _s(8), "JobStartDate": _s(9), "JobCurrentStartDate": _s(12),
          "LastVacateTime": _s(10), "NumJobStarts": 2, "CompletionDate": _s(13), "JobStatus": 4,
          "EnteredCurrentStatus": _s(13), "RecordTime": _s(13), "RequestGpus": 2, "Owner": "alice",
          "RemoteWallClockTime": 7200.0, "LastRemoteHost": "slot1_1@gpu01"}
    clean = _clean_from_documents([ad])
    assert clean.select(["run_index", "first_start_utc", "run_start_utc"]).to_pylist() == [
        {"run_index": 1, "first_start_utc": at(9), "run_start_utc": at(12)}]
    r = demand_from_tables(clean, states(4), DAY, END)
    assert reasons(r) == [(ad["GlobalJobId"], "first_run", at(8), at(9), False),
                          (ad["GlobalJobId"], "requeued", at(10), at(12), False)]
    assert _gpu_hours(r) == 6.0
    h = hourly(r)
    assert [h[k]["demand_gpus"] for k in range(7, 14)] == [0.0, 2.0, 0.0, 2.0, 2.0, 0.0, 0.0]
    assert (h[8]["mean_wait_s"], h[10]["mean_wait_s"], h[11]["mean_wait_s"]) == (3600.0, 3600.0, 7200.0)


def test_a_first_wait_read_from_a_later_runs_row_is_in_the_partitions_of_its_days():
    """A 1-GPU job queued on the 1st at 08:00, first run on the 2nd at 09:00 (JobStartDate), evicted
    on the 3rd at 10:00, run again on the 5th at 12:00, completed 13:00; one job row (run 1). The
    partitions of the 1st and the 2nd hold it for the first wait (neither run, nor the wait since
    the eviction, overlaps them), and the demand of the 1st is 08:00-24:00, 16 GPU-h; of the 2nd,
    00:00-09:00, 9 GPU-h; of the 4th, the wait since the eviction, 24 GPU-h."""
    from gpu_pipeline.lib.jobs import jobs_overlapping
    from gpu_pipeline.lib.timeutil import day_window

    def t(d: int, h: int) -> dt.datetime:
        return dt.datetime(2025, 8, d, h, tzinfo=UTC)

    row = {**job("s1#9.0#1", 1, "job", queued=t(1, 8), start=t(5, 12), end=t(5, 13), completion=t(5, 13), lv=t(3, 10),
                 record=t(5, 13)), "first_start_utc": t(2, 9)}
    everything = jobs([row])
    days = {f"2025-08-0{d}": jobs_overlapping(everything, *day_window(f"2025-08-0{d}")).num_rows for d in range(1, 7)}
    assert days == {"2025-08-01": 1, "2025-08-02": 1, "2025-08-03": 1, "2025-08-04": 1, "2025-08-05": 1,
                    "2025-08-06": 0}
    # the first start past the day: not in it
    assert jobs_overlapping(everything, t(2, 9), t(2, 10)).num_rows == 0
    for day, gpu_hours in (("2025-08-01", 16.0), ("2025-08-02", 9.0), ("2025-08-04", 24.0)):
        s, e = day_window(day)
        part = jobs_overlapping(everything, s, e)
        r = demand_from_tables(part, states(2, start=s, end=e), s, e)
        assert _gpu_hours(r) == gpu_hours, day


def test_the_wait_after_a_run_known_only_from_an_open_condor_q_row_counts():
    """A condor_q row (10:30) shows run 0 running since 10:00, no end; the final ad describes run 1:
    LastVacateTime 11:00, run again 12:00, completed 13:00. The job waited 09-10 and 11-12 (2 GPUs):
    4 GPU-h (the open previous run hid the wait since the eviction: 2 GPU-h)."""
    rows = [job("s1#1.0#1", 0, "job", queued=at(9), start=at(10), end=None, status=2, record=at(10, 30), gpus=2),
            job("s1#1.0#1", 1, "job", queued=at(9), start=at(12), end=at(13), completion=at(13), status=4, lv=at(11),
                gpus=2)]
    r = demand_from_tables(jobs(rows), states(4), DAY, END)
    assert reasons(r) == [("s1#1.0#1", "first_run", at(9), at(10), False),
                          ("s1#1.0#1", "requeued", at(11), at(12), False)]
    assert _gpu_hours(r) == 4.0
    assert [hourly(r)[k]["demand_gpus"] for k in range(9, 13)] == [2.0, 0.0, 2.0, 0.0]
