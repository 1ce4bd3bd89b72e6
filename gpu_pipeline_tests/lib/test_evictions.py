"""Backfill evictions (DESIGN.md 5.4): both detectors and the merge, hand-computed, then the truth."""

from __future__ import annotations

import datetime as dt
import math

import duckdb
import pyarrow as pa
import pytest

from gpu_pipeline.lib.evictions import (
    EVICTION_RATES,
    EVICTIONS,
    SNAPSHOT_REASON,
    compute_eviction_rates,
    compute_evictions,
    eviction_rates_from_tables,
    evictions_from_tables,
)
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES, JOBS, conform
from gpu_pipeline.lib.store import connect
from gpu_pipeline_tests.simdata import build_sim_dataset

UTC = dt.UTC
DAY0 = dt.datetime(2025, 8, 6, tzinfo=UTC)
DAY1 = DAY0 + dt.timedelta(days=1)
PREV = DAY0 - dt.timedelta(days=1)
B = dt.timedelta(minutes=5)
H = dt.timedelta(hours=1)


def at(h: float, day: dt.datetime = DAY0) -> dt.datetime:
    return day + dt.timedelta(hours=h)


# --------------------------------------------------------------------------------------------
# Hand-built inputs


def job(gjid: str, run_index: int, start: dt.datetime, end: dt.datetime | None, *, kind: str = "epoch",
        slot: str = "backfill2_1", host: str = "h1", gpus: str | None = "GPU-aaaaaaaa", completed: bool = False,
        vacate: dt.datetime | None | str = "end", status: int | None = None, reason: str | None = None,
        code: int | None = None, rwc: float | None = None, ct: float | None = None,
        starts: int | None = None, vacates: int | None = None, request_gpus: float = 1.0) -> dict:
    row = dict.fromkeys(JOBS.schema.names)
    last_vacate = end if vacate == "end" and not completed else (None if vacate == "end" else vacate)
    row.update(
        global_job_id=gjid, run_index=run_index, doc_kind=kind, source="ndjson", host=host, slot=slot,
        is_backfill_slot="backfill" in slot, assigned_gpus=gpus, request_gpus=request_gpus,
        run_start_utc=start, run_end_utc=end, completion_utc=end if completed else None,
        record_utc=end, last_vacate_utc=last_vacate,
        job_status=status if status is not None else (4 if completed else 1),
        num_job_starts=starts if starts is not None else run_index + 1,
        num_vacates=vacates if vacates is not None else (0 if completed else 1),
        vacate_reason=reason, vacate_reason_code=code, remote_wall_clock_s=rwc, committed_time_s=ct,
    )
    return row


def jobs(*rows: dict) -> pa.Table:
    return conform(pa.Table.from_pylist(list(rows)), JOBS)


def snap(start: dt.datetime, k: int) -> dt.datetime:
    return start + k * B + dt.timedelta(seconds=7 + k % 5)


def gpu_rows(gpu: str, start: dt.datetime, codes: list[str], host: str = "h1", device: str = "NVIDIA A100",
             first_k: int = 0) -> list[dict]:
    """P[:job] busy_prioritized, H[:job] busy_shared, B:job busy_backfill, I idle_prioritized,
    D na dropout, N na no_snapshot, R na Drained."""
    rows = []
    for i, code in enumerate(codes):
        k = first_k + i
        kind, _, jid = code.partition(":")
        state, tier, na = {
            "P": ("busy_prioritized", "priority", None), "H": ("busy_shared", "shared", None),
            "B": ("busy_backfill", "backfill", None), "I": ("idle_prioritized", "priority", None),
            "S": ("idle_shared", "shared", None), "D": ("na", None, "dropout"),
            "N": ("na", None, "no_snapshot"), "R": ("na", None, "Drained"),
        }[kind]
        row = dict.fromkeys(GPU_STATES.schema.names)
        row.update(bucket_start_utc=start + k * B, gpu_id=gpu, host=host, device_name=device, state=state,
                   tier=tier, na_reason=na, global_job_id=(jid or f"{kind.lower()}#1.0#1") if kind in "PHB" else None,
                   snapshot_utc=None if na in ("dropout", "no_snapshot") else snap(start, k),
                   n_slot_rows=0 if na in ("dropout", "no_snapshot") else 1)
        rows.append(row)
    return rows


def states(*row_lists: list[dict]) -> pa.Table:
    rows = [r for rl in row_lists for r in rl]
    return conform(pa.Table.from_pylist(rows), GPU_STATES)


def day_of(codes_by_gpu: dict[str, list[str]], start: dt.datetime = DAY0, n: int = 288, **kw) -> list[dict]:
    """Full day of states; each GPU's codes are placed from bucket 0, the rest of the day is 'P'."""
    out = []
    for gpu, codes in codes_by_gpu.items():
        out += gpu_rows(gpu, start, codes + ["P:fill#1.0#1"] * (n - len(codes)), **kw)
    return out


def evictions(start=DAY0, end=DAY1, states_t=None, jobs_t=None) -> list[dict]:
    out = evictions_from_tables(start, end, states_t, jobs_t)
    assert out.schema == EVICTIONS.schema
    return out.to_pylist()


def by_job(rows: list[dict]) -> dict[tuple, dict]:
    out = {}
    for r in rows:
        key = (r["global_job_id"], r["run_index"])
        assert key not in out, key
        out[key] = r
    return out


# --------------------------------------------------------------------------------------------
# (a) job records


def test_job_record_detector_and_badput():
    t = jobs(
        # evicted after 1 h, nothing committed -> the whole hour is lost
        job("J1", 0, at(9), at(10), rwc=3600, ct=0, reason="Preempted for a higher Ranked job", code=1018),
        # the same run also as a job document: the epoch document is preferred, one row
        job("J1", 0, at(9), at(10), kind="job", status=3, rwc=3600, ct=0, reason="from the job ad", code=1018),
        # checkpointing job: run 0 committed 1800 s of its 3600 s, run 1 committed 600 s of 1200 s
        job("J2", 0, at(1), at(2), rwc=3600, ct=1800),
        job("J2", 1, at(3), at(3 + 1 / 3), rwc=4800, ct=2400),
        # no CommittedTime: the whole run on both GPUs is lost
        job("J3", 0, at(5), at(6), gpus="GPU-cccccccc,GPU-dddddddd", request_gpus=2),
        # previous run not in the input: bounded by RemoteWallClockTime - CommittedTime
        job("J4", 2, at(7), at(7 + 5 / 6), rwc=5000, ct=1000),
        job("J5", 2, at(7), at(7 + 5 / 6), rwc=5000, ct=4000),
        # ended by a hold (no vacate at the run end); it ran again later, but a hold is not an eviction
        job("N1", 0, at(11), at(12), vacate=None, status=5, vacates=0),
        job("N1", 1, at(13), at(14), completed=True),
        # completed backfill run; vacated primary-slot run; run ended by removal (no vacate)
        job("N2", 0, at(11), at(12), completed=True),
        job("N3", 0, at(11), at(12), slot="slot1_4"),
        job("N4", 0, at(11), at(12), kind="job", vacate=None, status=3, vacates=0),
        # a vacate before this run belongs to an earlier run: not this run's end (run 0 ended in it:
        # that run is the eviction, from the job document alone; test_history_documents_only...)
        job("N5", 1, at(15), at(16), vacate=at(14), status=3, kind="job", vacates=1),
        # only the final job ad, removed after its eviction
        job("P1", 0, at(17), at(18), kind="job", status=3, reason="Claim preempted"),
        # no LastVacateTime recorded, but the job ran again: the run was evicted
        job("P2", 0, at(19), at(20), vacate=None, vacates=0),
        job("P2", 1, at(21), at(22), completed=True),
        # went back to Idle with a vacate counted: evicted
        job("P3", 0, at(19), at(19.5), vacate=None, vacates=1, status=1),
    )
    rows = by_job(evictions(jobs_t=t))
    assert set(rows) == {("J1", 0), ("J2", 0), ("J2", 1), ("J3", 0), ("J4", 2), ("J5", 2), ("P1", 0), ("P2", 0),
                         ("P3", 0), ("N5", 0)}
    assert (rows[("N5", 0)]["evicted_utc"], rows[("N5", 0)]["started_utc"]) == (at(14), None)
    j1 = rows[("J1", 0)]
    assert (j1["started_utc"], j1["evicted_utc"], j1["runtime_s"]) == (at(9), at(10), 3600.0)
    assert (j1["gpu_id"], j1["n_gpus"], j1["host"], j1["detected_by"]) == ("GPU-aaaaaaaa", 1, "h1", "job_records")
    assert (j1["reason"], j1["reason_code"], j1["lost_basis"]) == (
        "Preempted for a higher Ranked job", 1018, "committed_time")
    assert j1["lost_gpu_hours"] == pytest.approx(1.0)
    assert j1["evicted_by_job_id"] is None and j1["runtime_is_lower_bound"] is False
    assert rows[("J2", 0)]["lost_gpu_hours"] == pytest.approx(0.5)
    assert rows[("J2", 1)]["lost_gpu_hours"] == pytest.approx(600 / 3600)
    assert rows[("J2", 1)]["lost_basis"] == "committed_time"
    j3 = rows[("J3", 0)]
    assert (j3["gpu_id"], j3["n_gpus"], j3["lost_basis"]) == ("GPU-cccccccc", 2, "whole_run")
    assert j3["lost_gpu_hours"] == pytest.approx(2.0)
    assert (rows[("J4", 2)]["lost_basis"], rows[("J4", 2)]["lost_gpu_hours"]) == (
        "committed_time_bound", pytest.approx(3000 / 3600))
    assert rows[("J5", 2)]["lost_gpu_hours"] == pytest.approx(1000 / 3600)
    assert rows[("P1", 0)]["reason"] == "Claim preempted"
    assert rows[("P2", 0)]["reason"] == "ended without completion; the job ran again"
    assert (rows[("P3", 0)]["evicted_utc"], rows[("P3", 0)]["reason"]) == (
        at(19.5), "vacated; the job went back to the queue")


def test_history_documents_only_an_eviction_then_a_completed_run():
    """adstash's default writes one document per job, for its last run: a backfill job vacated at
    11:00 (NumJobStarts 2, LastVacateTime before the last run's start, VacateReasonCode 1018) that
    then ran again and completed is an eviction at 11:00 (DESIGN 5.4: NumJobStarts > 1 with
    LastVacateTime). Its loss is the job's RemoteWallClockTime - CommittedTime (the completed run
    lost nothing). With the snapshots, the run's GPU, host and start are theirs, and it is one row."""
    doc = job("H1", 1, at(12), at(14), kind="job", completed=True, vacate=at(11), vacates=1,
              code=1018, reason="Preempted for a higher Ranked job", rwc=4 * 3600, ct=2 * 3600)
    rows = by_job(evictions(jobs_t=jobs(doc)))
    assert set(rows) == {("H1", 0)}
    r = rows[("H1", 0)]
    assert (r["evicted_utc"], r["started_utc"], r["runtime_s"], r["detected_by"]) == (at(11), None, None, "job_records")
    assert (r["lost_basis"], r["lost_gpu_hours"], r["reason_code"]) == ("committed_time_bound", pytest.approx(2.0), 1018)
    # the snapshots saw the run on GPU-bbbbbbbb from 09:00, reclaimed by a primary job at 11:00
    st = states(day_of({"GPU-bbbbbbbb": ["P"] * 108 + ["B:H1"] * 24 + ["P:owner#1.0#1"] * 12}))
    rows = by_job(evictions(states_t=st, jobs_t=jobs(doc)))
    assert set(rows) == {("H1", 0)}
    r = rows[("H1", 0)]
    assert (r["gpu_id"], r["host"], r["detected_by"]) == ("GPU-bbbbbbbb", "h1", "job_records,snapshots")
    assert (r["started_utc"], r["evicted_utc"]) == (snap(DAY0, 108), at(11))
    assert r["runtime_s"] == (at(11) - snap(DAY0, 108)).total_seconds()
    # an epoch document of that run is preferred; a vacate after the run's start is not an earlier run's
    assert set(by_job(evictions(jobs_t=jobs(doc, job("H1", 0, at(9), at(11)))))) == {("H1", 0)}
    assert evictions(jobs_t=jobs(job("H2", 1, at(12), at(14), kind="job", completed=True, vacate=at(13)))) == []


@pytest.mark.parametrize("code", [36, 13, 1004, 1022, 1023])
def test_a_run_ended_by_the_job_itself_is_no_eviction(code):
    """A vacate whose VacateReasonCode is a hold code (below 1000: the job failed -- FailedToCheckpoint
    36, a transfer error 13 -- and was put on hold) or the user's vacate / removal is not a reclaim
    of the slot (the real ad: checkpoint upload failed, held, removed)."""
    ended = job("F1", 0, at(9), at(9.5), status=3, code=code, reason="Starter failed to upload checkpoint")
    assert evictions(jobs_t=jobs(ended)) == []
    later = job("F2", 1, at(12), at(14), kind="job", completed=True, vacate=at(11), code=code)
    assert evictions(jobs_t=jobs(later)) == []
    for reclaimed in (1014, 1018, None):  # draining, preemption, no code: evictions
        assert len(evictions(jobs_t=jobs(job("F3", 0, at(9), at(9.5), status=1, code=reclaimed)))) == 1


def test_an_epoch_whose_executable_never_started_is_no_eviction():
    """Epochs are numbered by NumShadowStarts: a shadow start whose input transfer failed (its
    NumJobStarts as the epoch before it's, or 0) is an epoch of its own, but no run a reclaim ended."""
    rows = by_job(evictions(jobs_t=jobs(
        job("E1", 0, at(9), at(11), starts=1, code=1018),
        job("E1", 1, at(12), at(12 + 1 / 12), starts=1, status=1),  # never ran; the job went back to Idle
        job("E1", 2, at(13), at(14), starts=2, completed=True),
        job("E2", 0, at(9), at(9.5), starts=0, status=1),  # the first shadow start never ran either
        job("E2", 1, at(10), at(11), starts=1, completed=True),
    )))
    assert set(rows) == {("E1", 0)}


def test_a_record_naming_fewer_gpus_than_it_held_is_one_eviction_with_the_snapshots():
    """An 8-GPU run whose AssignedGPUs adstash cut names 6: the snapshots see all 8 reclaimed; one
    eviction of 8 GPUs (the two GPUs not named made a second, snapshots-only row)."""
    ids = [f"GPU-{i:08x}" for i in range(1, 9)]
    st = states(day_of({g: ["P"] * 108 + ["B:J8"] * 24 + ["P:owner#1.0#1"] * 12 for g in ids}))
    rows = evictions(states_t=st, jobs_t=jobs(job("J8", 0, at(9), at(11), gpus=",".join(ids[:6]), request_gpus=8,
                                                  code=1018)))
    assert [(r["detected_by"], r["n_gpus"], r["lost_gpu_hours"]) for r in rows] == [("job_records,snapshots", 8, 16.0)]


def test_job_record_eviction_at_midnight_belongs_to_the_day_it_ends():
    t = jobs(job("M0", 0, at(-1), DAY0), job("M1", 0, at(22, PREV), at(-10 / 3600)))
    assert [r["global_job_id"] for r in evictions(jobs_t=t)] == ["M0"]
    assert [r["global_job_id"] for r in evictions(PREV, DAY0, jobs_t=t)] == ["M1"]


# --------------------------------------------------------------------------------------------
# (b) snapshots


def test_snapshot_detector():
    t = states(day_of({
        # backfill J from bucket 2 to 5, primary Q claims the GPU at bucket 6
        "GPU-s1": ["P", "P", "B:J", "B:J", "B:J", "B:J", "P:Q"],
        # the backfill job completed (GPU idle) before the primary came: not an eviction
        "GPU-s2": ["P", "B:J2", "B:J2", "I", "P:Q2"],
        # a collector gap and a dropout between the backfill job and the primary claim are skipped
        "GPU-s3": ["P", "B:J3", "B:J3", "N", "D", "P:Q3"],
        # running since the first observation read: runtime is a lower bound
        "GPU-s4": ["B:J4", "B:J4", "H:Q4"],
        # a different backfill job follows: not an eviction of J5 (and J6 is not evicted either)
        "GPU-s5": ["B:J5", "B:J6", "I"],
        # drained after the backfill job: not a primary claim
        "GPU-s6": ["I", "B:J7", "R", "P:Q7"],
    }))
    rows = {r["global_job_id"]: r for r in evictions(states_t=t)}
    assert set(rows) == {"J", "J3", "J4"}
    j = rows["J"]
    assert (j["started_utc"], j["evicted_utc"]) == (snap(DAY0, 2), snap(DAY0, 6))
    assert j["runtime_s"] == (snap(DAY0, 6) - snap(DAY0, 2)).total_seconds()
    assert j["lost_gpu_hours"] == pytest.approx(j["runtime_s"] / 3600) and j["lost_basis"] == "whole_run"
    assert (j["evicted_by_job_id"], j["gpu_id"], j["n_gpus"], j["run_index"]) == ("Q", "GPU-s1", 1, None)
    assert (j["detected_by"], j["reason"], j["reason_code"]) == ("snapshots", SNAPSHOT_REASON, None)
    assert (j["host"], j["device_name"], j["tier_of_host"]) == ("h1", "NVIDIA A100", "priority")
    assert j["resolution_s"] == (snap(DAY0, 6) - snap(DAY0, 5)).total_seconds()
    assert j["runtime_is_lower_bound"] is False
    j3 = rows["J3"]
    assert j3["evicted_utc"] == snap(DAY0, 5) and j3["evicted_by_job_id"] == "Q3"
    assert j3["resolution_s"] == (snap(DAY0, 5) - snap(DAY0, 2)).total_seconds()
    assert rows["J4"]["runtime_is_lower_bound"] is True and rows["J4"]["evicted_by_job_id"] == "Q4"


@pytest.mark.parametrize("handover", ["Matched", "Preempting"])
def test_a_claims_hand_over_seen_between_the_backfill_run_and_the_primary_claim_is_skipped(handover):
    """A snapshot that catches the primary slot Matched (or a slot Preempting) between J's run and
    the primary claim hides nothing: J's eviction is the claim's snapshot. A Drained GPU in between
    stays a different story (the drain may have let J finish)."""
    codes = ["P", "B:J", "B:J", "R", "P:Q"]
    rows = day_of({"GPU-h": codes, "GPU-d": codes})
    for r in rows:
        if r["gpu_id"] == "GPU-h" and r["na_reason"] == "Drained":
            r["na_reason"] = handover
    got = evictions(states_t=states(rows))
    assert [(r["global_job_id"], r["gpu_id"], r["evicted_utc"], r["evicted_by_job_id"]) for r in got] == [
        ("J", "GPU-h", snap(DAY0, 4), "Q")]
    assert got[0]["resolution_s"] == (snap(DAY0, 4) - snap(DAY0, 2)).total_seconds()


def test_a_multi_gpu_run_reclaimed_in_one_snapshot_is_one_eviction():
    """J on two GPUs of a host, both claimed by primary jobs in the same snapshot: one row (the least
    GPU id named, n_gpus 2, each GPU's observed run lost), as its job record gives one row. A GPU
    of J that went idle instead is not a detection; K, seen on one GPU, stays one row of one GPU."""
    t = states(day_of({
        "GPU-m2": ["P", "B:J", "B:J", "B:J", "P:Q1"],
        "GPU-m1": ["P", "P", "B:J", "B:J", "H:Q2"],
        "GPU-m3": ["P", "B:J", "B:J", "B:J", "I"],
        "GPU-k1": ["P", "B:K", "P:Q3"],
    }))
    rows = {r["global_job_id"]: r for r in evictions(states_t=t)}
    assert set(rows) == {"J", "K"}
    j = rows["J"]
    assert (j["gpu_id"], j["n_gpus"], j["evicted_utc"], j["started_utc"]) == ("GPU-m1", 2, snap(DAY0, 4), snap(DAY0, 1))
    assert j["runtime_s"] == (snap(DAY0, 4) - snap(DAY0, 1)).total_seconds()
    lost = (snap(DAY0, 4) - snap(DAY0, 1)) + (snap(DAY0, 4) - snap(DAY0, 2))
    assert j["lost_gpu_hours"] == pytest.approx(lost.total_seconds() / 3600)
    assert j["evicted_by_job_id"] == "Q2"  # the named GPU's
    assert (rows["K"]["gpu_id"], rows["K"]["n_gpus"]) == ("GPU-k1", 1)
    rates = {(r["device_name"], r["tier"], r["hour_local"]): r
             for r in eviction_rates_from_tables(evictions_from_tables(DAY0, DAY1, t, None), t, DAY0, DAY1).to_pylist()}
    assert rates[("ALL", "ALL", None)]["evictions"] == 2


def test_a_hosts_evictions_and_backfill_hours_are_in_one_tier():
    """A host whose GPUs are prioritized until 06:00 and shared after: the evictions' tier_of_host
    and the rates' backfill hours use one rule (priority: any of its primary slots prioritized in
    the day), so its eviction and its 5 backfill hours share a row (rate 0.2 an hour)."""
    codes = ["P"] * 72 + ["H"] * 60 + ["B:J"] * 60 + ["H:Q"] + ["H"] * 95
    t = states(gpu_rows("g", DAY0, codes, host="hx"))
    ev = evictions_from_tables(DAY0, DAY1, t, None)
    assert ev.column("tier_of_host").to_pylist() == ["priority"]
    rates = {(r["device_name"], r["tier"], r["hour_local"]): r
             for r in eviction_rates_from_tables(ev, t, DAY0, DAY1).to_pylist()}
    row = rates[("ALL", "priority", None)]
    assert (row["evictions"], row["backfill_gpu_hours"]) == (1, 5.0)
    assert row["evictions_per_backfill_gpu_hour"] == pytest.approx(0.2)
    assert ("ALL", "shared", None) not in rates


def _with_snapshots(states_t: pa.Table, jobs_t: pa.Table, clean: pa.Table) -> tuple[pa.Table, dict]:
    """Evictions of the day from the states, job rows and clean slot snapshots, and the day's rates
    rows (hour_local null) by (device, tier)."""
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        for name, table in (("st", states_t), ("jb", jobs_t), ("cl", clean)):
            con.register(name, table)
        ev = compute_evictions(con, DAY0, DAY1, "st", [], "jb", [], snapshots_from_sql="cl", snapshots_params=[])
        con.register("ev", ev)
        rates = compute_eviction_rates(con, "ev", [], "st", [], DAY0, DAY1, snapshots_from_sql="cl",
                                       snapshots_params=[])
        return ev, {(r["device_name"], r["tier"]): r for r in rates.to_pylist() if r["hour_local"] is None}
    finally:
        con.close()


def test_a_prioritized_host_backfilled_all_day_is_priority_by_its_primary_slots():
    """Host h1's primary slot is prioritized and Unclaimed all day while its backfill slot runs J
    (evicted at 12:00, run again at once): every state's winning row is the backfill slot, so the
    states alone give the host no tier. The clean snapshots' primary rows do: the eviction and the
    24 backfill hours are in the priority tier (they were in none: a null tier)."""
    t = states(gpu_rows("GPU-aaaaaaaa", DAY0, ["B:J"] * 288))
    j = jobs(job("J", 0, at(0), at(12)), job("J", 1, at(12), None, vacate=None))
    clean = conform(pa.Table.from_pylist([
        dict(snapshot_utc=snap(DAY0, k), host="h1", slot_name=f"{name}@h1", gpu_id="GPU-aaaaaaaa", tier=tier,
             is_backfill_slot=name.startswith("backfill"), slot_state=state, global_job_id=jid)
        for k in range(288)
        for name, tier, state, jid in (("slot1", "priority", "Unclaimed", None), ("backfill2_1", "backfill", "Claimed", "J"))
    ]), CLEAN_SLOT_SNAPSHOTS)
    ev, rates = _with_snapshots(t, j, clean)
    assert [(r["global_job_id"], r["tier_of_host"]) for r in ev.to_pylist()] == [("J", "priority")]
    row = rates[("ALL", "priority")]
    assert (row["evictions"], row["backfill_gpu_hours"]) == (1, 24.0)
    # without the snapshots, the states' winning rows: no tier (the rule cannot see the primary slot)
    without = evictions_from_tables(DAY0, DAY1, t, j)
    assert without.column("tier_of_host").to_pylist() == [None]


def test_an_eviction_on_a_host_renamed_later_in_the_day_keeps_the_hosts_tier():
    """Prioritized host gpu01.old is renamed gpu01.new at 12:00 (the same GPU). Backfill job J ran
    on it 08:00-10:00 and was reclaimed by a primary job; its record names gpu01.old. The hosts'
    tiers were looked up only for each GPU's latest host, so the eviction had no tier and its rates
    row (tier None) stood apart from the host's 2 backfill hours (priority, rate 0)."""
    from gpu_pipeline.lib.states import states_from_table

    def row(m: int, slot: str, state: str, jid: str | None = None) -> dict:
        host = "gpu01.old" if m < 720 else "gpu01.new"
        backfill = slot.startswith("backfill")
        return dict(snapshot_utc=DAY0 + dt.timedelta(minutes=m, seconds=7), host=host, slot_name=f"{slot}@{host}",
                    gpu_id="GPU-aaaaaaaa", tier="backfill" if backfill else "priority", is_backfill_slot=backfill,
                    slot_state=state, device_name="NVIDIA A100", global_job_id=jid, remote_owner="u" if jid else None,
                    prioritized_projects="" if backfill else "grp-a")

    rows = []
    for m in range(0, 1440, 5):
        if 480 <= m < 600:
            rows += [row(m, "slot1", "Unclaimed"), row(m, "backfill1_1", "Claimed", "sub#1.0#1")]
        elif 600 <= m < 660:
            rows += [row(m, "slot1_1", "Claimed", "prim#2.0#1")]
        else:
            rows += [row(m, "slot1", "Unclaimed"), row(m, "backfill1", "Unclaimed")]
    clean = conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS)
    st = states_from_table(clean, DAY0, DAY1)
    j = jobs(job("sub#1.0#1", 0, DAY0 + dt.timedelta(hours=8), DAY0 + dt.timedelta(minutes=601), host="gpu01.old",
                 slot="backfill1_1"))
    ev, rates = _with_snapshots(st, j, clean)
    assert [(r["host"], r["tier_of_host"], r["detected_by"]) for r in ev.to_pylist()] == [
        ("gpu01.old", "priority", "job_records,snapshots")]
    assert sorted(rates) == [("ALL", "ALL"), ("ALL", "priority"), ("NVIDIA A100", "ALL"), ("NVIDIA A100", "priority")]
    row = rates[("ALL", "priority")]
    assert (row["evictions"], row["backfill_gpu_hours"], row["evictions_per_backfill_gpu_hour"]) == (1, 2.0, 0.5)


def test_a_run_seen_first_after_a_hole_in_the_gpus_rows_has_a_lower_bound_runtime():
    """A GPU with no rows for some buckets (absent from the grid, not 'na'): the row after the hole
    has no bucket before it, so a backfill run first seen there may have started in the hole (its
    runtime is a lower bound), unlike the same run right after an observed idle bucket."""
    t = states(
        gpu_rows("GPU-g1", DAY0, ["I", "I"]) + gpu_rows("GPU-g1", DAY0, ["B:J", "B:J", "P:Q"], first_k=4),
        gpu_rows("GPU-g2", DAY0, ["I", "I", "I", "I", "B:K", "B:K", "P:R"]),
    )
    rows = {r["global_job_id"]: r for r in evictions(states_t=t)}
    assert set(rows) == {"J", "K"}
    for job, by in (("J", "Q"), ("K", "R")):
        r = rows[job]
        assert (r["started_utc"], r["evicted_utc"], r["evicted_by_job_id"]) == (snap(DAY0, 4), snap(DAY0, 6), by)
        assert r["resolution_s"] == (snap(DAY0, 6) - snap(DAY0, 5)).total_seconds()
    assert rows["J"]["runtime_is_lower_bound"] is True
    assert rows["K"]["runtime_is_lower_bound"] is False


@pytest.mark.parametrize("unseen", ["N", "D"])
def test_a_run_seen_first_after_buckets_the_gpu_was_not_seen_in_has_a_lower_bound_runtime(unseen):
    """The GPU's rows are all there, but the buckets before the run's first observation are 'na'
    without a reading of it (N: no snapshot, a collector outage; D: a dropout): the run may have
    started in them. It was flagged exact (its runtime 1,500 s after a 1-hour outage)."""
    ev = evictions(states_t=states(day_of({"g1": ["P:own#0.0#1"] * 6 + [unseen] * 12 + ["B:bf#9.0#1"] * 5
                                                 + ["P:own#1.0#1"]})))
    (r,) = ev
    assert r["runtime_is_lower_bound"] is True
    # the same run after an observed primary claim: its start is seen
    ev = evictions(states_t=states(day_of({"g1": ["P:own#0.0#1"] * 18 + ["B:bf#9.0#1"] * 5 + ["P:own#1.0#1"]})))
    assert [r["runtime_is_lower_bound"] for r in ev] == [False]
    # or after a hand-over seen (a slot Matched or Preempting): the GPU was seen there
    for reason in ("Matched", "Preempting"):
        rows = day_of({"g1": ["P:own#0.0#1"] * 17 + ["R"] + ["B:bf#9.0#1"] * 5 + ["P:own#1.0#1"]})
        rows[17].update(na_reason=reason, slot_state=reason)
        assert [r["runtime_is_lower_bound"] for r in evictions(states_t=states(rows))] == [False], reason


def test_snapshot_detector_checks_the_clean_snapshots_when_given():
    """The states show only the winning row; the clean snapshots can show J still on the GPU under
    the primary claim. J is evicted where it is first gone while the claim lasts (DESIGN 5.4: the
    GPU claimed by a primary slot while J is absent), not where the claim is first seen; J named in
    every snapshot of the claim (it ran on beside it, or came back after it) is not evicted."""
    t = states(day_of({
        "GPU-a": ["I", "B:J", "B:J", "P:Q", "P:Q", "B:J", "I"],  # J named under Q's claim, then runs on
        "GPU-b": ["I", "B:K", "P:R"],  # K gone at R's claim
        "GPU-c": ["I", "B:L", "B:L", "P:S", "P:S", "P:S"],  # L vacating at 00:15, gone at 00:20
        "GPU-d": ["I", "B:M", "P:T", "P:T", "I"],  # M named while T's claim lasts, which then ends
    }))

    def slot(k, gpu, name, state, jid):
        return dict(snapshot_utc=snap(DAY0, k), host="h1", slot_name=f"{name}@h1", gpu_id=gpu,
                    tier="backfill" if "backfill" in name else "priority", is_backfill_slot="backfill" in name,
                    slot_state=state, global_job_id=jid)

    clean = conform(pa.Table.from_pylist([
        *(row for k in (3, 4) for row in (slot(k, "GPU-a", "slot1_1", "Claimed", "Q"),
                                          slot(k, "GPU-a", "backfill2_1", "Claimed", "J"))),
        slot(2, "GPU-b", "slot1_1", "Claimed", "R"),
        slot(3, "GPU-c", "slot1_1", "Claimed", "S"), slot(3, "GPU-c", "backfill2_1", "Preempting", "L"),
        slot(4, "GPU-c", "slot1_1", "Claimed", "S"),
        *(row for k in (2, 3) for row in (slot(k, "GPU-d", "slot1_1", "Claimed", "T"),
                                          slot(k, "GPU-d", "backfill2_1", "Claimed", "M"))),
    ]), CLEAN_SLOT_SNAPSHOTS)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("st", t)
    con.register("cl", clean)
    with_clean = compute_evictions(con, DAY0, DAY1, "st", [], snapshots_from_sql="cl", snapshots_params=[])
    got = {r["global_job_id"]: r for r in with_clean.to_pylist()}
    assert sorted(got) == ["K", "L"]
    assert (got["K"]["evicted_utc"], got["K"]["evicted_by_job_id"]) == (snap(DAY0, 2), "R")
    r = got["L"]
    assert (r["started_utc"], r["evicted_utc"], r["evicted_by_job_id"]) == (snap(DAY0, 1), snap(DAY0, 4), "S")
    assert r["resolution_s"] == (snap(DAY0, 4) - snap(DAY0, 2)).total_seconds()
    assert r["runtime_s"] == (snap(DAY0, 4) - snap(DAY0, 1)).total_seconds()
    # from the states alone, each claim's first snapshot
    without = {r["global_job_id"]: r["evicted_utc"] for r in compute_evictions(con, DAY0, DAY1, "st", []).to_pylist()}
    assert without == {"J": snap(DAY0, 3), "K": snap(DAY0, 2), "L": snap(DAY0, 3), "M": snap(DAY0, 2)}


def _minute_snapshots(backfill: dict[int, tuple[str, str | None]], primary: dict[int, tuple[str, str | None]],
                      minutes: int = 30) -> pa.Table:
    """A 1-minute collector's clean rows of one GPU's two slots: per minute the (state, job) of the
    backfill and the primary slot (Unclaimed without a job where a minute is not given)."""
    rows = []
    for m in range(minutes):
        t = DAY0 + dt.timedelta(minutes=m, seconds=5)
        for name, slots in (("backfill2_1", backfill), ("slot1_1", primary)):
            state, job = slots.get(m, ("Unclaimed", None))
            bf = "backfill" in name
            rows.append(dict(snapshot_utc=t, host="h1", slot_name=f"{name}@h1", gpu_id="GPU-aaaaaaaa",
                             tier="backfill" if bf else "priority", is_backfill_slot=bf, slot_state=state,
                             device_name="NVIDIA A100", prioritized_projects="" if bf else "ProjX",
                             global_job_id=job))
    return conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS)


def _evictions_of_snapshots(clean: pa.Table) -> list[dict]:
    from gpu_pipeline.lib.states import states_from_table

    end = DAY0 + dt.timedelta(minutes=30)
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("st", states_from_table(clean, DAY0, end))
        con.register("cl", clean)
        return compute_evictions(con, DAY0, end, "st", [], snapshots_from_sql="cl", snapshots_params=[]).to_pylist()
    finally:
        con.close()


def test_a_collector_faster_than_the_buckets_sees_a_backfill_run_end_before_the_claim():
    """1-minute snapshots: J runs to 00:06, the GPU is seen free at 00:07 and 00:08, a primary job
    claims it at 00:09. The states' bucket 00:05 is the primary claim (it out-ranks J's minutes), so
    J was read as evicted at 00:09. The snapshots that saw the GPU free say J ended first."""
    done = _minute_snapshots({m: ("Claimed", "bf#7.0#1") for m in range(7)},
                             {m: ("Claimed", "own#1.0#1") for m in range(9, 30)})
    assert _evictions_of_snapshots(done) == []
    # a real eviction at that cadence, with the hand-over seen: the primary slot Matched while J is
    # vacated (Preempting), then a minute with neither claimed nor J -- the primary slot still Matched
    evicted = _minute_snapshots({**{m: ("Claimed", "bf#7.0#1") for m in range(8)}, 8: ("Preempting", "bf#7.0#1")},
                                {8: ("Matched", None), 9: ("Matched", None),
                                 **{m: ("Claimed", "own#1.0#1") for m in range(10, 30)}})
    (r,) = _evictions_of_snapshots(evicted)
    assert (r["global_job_id"], r["evicted_by_job_id"]) == ("bf#7.0#1", "own#1.0#1")
    # nor is a primary slot Claimed before its job starts (no job named yet) a free GPU
    starting = _minute_snapshots({m: ("Claimed", "bf#7.0#1") for m in range(8)},
                                 {8: ("Claimed", None), **{m: ("Claimed", "own#1.0#1") for m in range(9, 30)}})
    (r,) = _evictions_of_snapshots(starting)
    assert r["global_job_id"] == "bf#7.0#1"


def test_a_run_known_only_by_a_later_records_vacate_is_no_eviction_where_it_ran_on_a_primary_slot():
    """adstash's job document of run 1 (a backfill slot) says a run before it was vacated at 11:00.
    That run takes the later run's slot kind; the states last saw the job before 11:00 busy on a
    shared primary slot: it was no backfill run, and was reported as an eviction without GPU or tier.
    Seen last on a backfill slot, it is one."""
    doc = job("H1", 1, at(12), at(14), kind="job", completed=True, vacate=at(11), vacates=1, code=1018,
              rwc=4 * 3600, ct=2 * 3600)
    primary = states(day_of({"GPU-bbbbbbbb": ["H"] * 108 + ["H:H1"] * 24 + ["R"] * 12}))
    assert evictions(states_t=primary, jobs_t=jobs(doc)) == []
    backfill = states(day_of({"GPU-bbbbbbbb": ["H"] * 108 + ["B:H1"] * 24 + ["H:Q"] * 12}))
    (r,) = evictions(states_t=backfill, jobs_t=jobs(doc))
    assert (r["global_job_id"], r["run_index"], r["gpu_id"]) == ("H1", 0, "GPU-bbbbbbbb")


def test_snapshot_eviction_at_midnight_looks_back_into_the_previous_day():
    prev = day_of({"GPU-m": ["P"] * 240 + ["B:Jm"] * 48}, start=PREV)
    day = day_of({"GPU-m": ["P:Qm"]})
    t = states(prev, day)
    (r,) = evictions(states_t=t)
    assert (r["global_job_id"], r["started_utc"], r["evicted_utc"]) == ("Jm", snap(PREV, 240), snap(DAY0, 0))
    assert r["runtime_is_lower_bound"] is False
    assert r["runtime_s"] == (snap(DAY0, 0) - snap(PREV, 240)).total_seconds()
    # the previous day's own partition does not have it (the primary claim is seen after midnight)
    assert evictions(PREV, DAY0, states_t=t) == []
    # without the previous day's states the backfill job is never seen: nothing to detect
    assert evictions(states_t=states(day)) == []


# --------------------------------------------------------------------------------------------
# merge


def test_merge_one_row_when_both_detectors_see_it():
    st = states(day_of({
        "GPU-aaaaaaaa": ["P"] * 108 + ["B:J1"] * 12 + ["P:Q1"],  # J1 seen 09:00-09:55, Q1 at 10:00:07
        "GPU-bbbbbbbb": ["P"] * 108 + ["B:J2"] * 60 + ["P:Q2"],  # snapshots: evicted at 14:00
        "GPU-cccccccc": ["P"] * 24 + ["B:J3"] * 12 + ["P:Q3"],  # snapshots see an eviction at 03:00 ...
    }))
    jb = jobs(
        job("J1", 0, at(8.5), at(10), gpus="GPU-aaaaaaaa", rwc=5400, ct=0, code=1018, reason="preempted"),
        job("J2", 0, at(8.5), at(10), gpus="GPU-bbbbbbbb"),  # ... the record says 10:00: two different events
        job("J3", 0, at(2), at(2 + 59.9 / 60), gpus="GPU-cccccccc", completed=True),  # ... but J3 completed
    )
    rows = evictions(states_t=st, jobs_t=jb)
    merged = [r for r in rows if r["global_job_id"] == "J1"]
    assert len(merged) == 1
    (m,) = merged
    assert m["detected_by"] == "job_records,snapshots"
    assert (m["started_utc"], m["evicted_utc"], m["run_index"], m["resolution_s"]) == (at(8.5), at(10), 0, 1.0)
    assert (m["evicted_by_job_id"], m["reason_code"], m["lost_basis"]) == ("Q1", 1018, "committed_time")
    assert m["lost_gpu_hours"] == pytest.approx(1.5)
    assert (m["device_name"], m["tier_of_host"]) == ("NVIDIA A100", "priority")
    two = sorted((r["detected_by"], r["evicted_utc"]) for r in rows if r["global_job_id"] == "J2")
    assert two == [("job_records", at(10)), ("snapshots", snap(DAY0, 168))]
    # the job records show J3 completed just before the primary claim: the snapshot detection is dropped
    assert [r for r in rows if r["global_job_id"] == "J3"] == []
    # snapshots alone cannot tell
    assert [r["global_job_id"] for r in evictions(states_t=st) if r["global_job_id"] == "J3"] == ["J3"]


def test_merge_at_midnight_counts_the_eviction_once():
    prev = day_of({"GPU-aaaaaaaa": ["P"] * 276 + ["B:Jn"] * 12,  # primary seen at 00:00:07 of DAY0
                   "GPU-bbbbbbbb": ["P"] * 276 + ["B:Jm"] * 12}, start=PREV)
    day = day_of({"GPU-aaaaaaaa": ["P:Qn"], "GPU-bbbbbbbb": ["B:Jm", "P:Qm"]})
    st = states(prev, day)
    jb = jobs(job("Jn", 0, at(23, PREV), at(-10 / 3600), gpus="GPU-aaaaaaaa"),  # 23:59:50
              job("Jm", 0, at(23, PREV), at(5 / 60), gpus="GPU-bbbbbbbb"))  # 00:05:00
    d_prev = evictions(PREV, DAY0, states_t=st, jobs_t=jb)
    d_day = evictions(DAY0, DAY1, states_t=st, jobs_t=jb)
    assert [(r["global_job_id"], r["detected_by"]) for r in d_prev] == [("Jn", "job_records")]
    assert [(r["global_job_id"], r["detected_by"], r["evicted_utc"]) for r in d_day] == [
        ("Jm", "job_records,snapshots", at(5 / 60))]


def test_empty_inputs_give_full_schema():
    assert evictions() == []
    assert evictions(states_t=GPU_STATES.empty(), jobs_t=JOBS.empty()) == []
    rates = eviction_rates_from_tables(EVICTIONS.empty(), GPU_STATES.empty(), DAY0, DAY1)
    assert rates.schema == EVICTION_RATES.schema
    assert rates.to_pylist() == [dict(device_name="ALL", tier="ALL", hour_local=None, evictions=0,
                                      backfill_gpu_hours=0.0, evictions_per_backfill_gpu_hour=None,
                                      lost_gpu_hours=0.0, runtime_p10_s=None, runtime_p50_s=None,
                                      runtime_p90_s=None)]


# --------------------------------------------------------------------------------------------
# rates


def _q(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def test_rates_per_device_tier_and_local_hour():
    tz = "America/Chicago"  # UTC-5 in August
    s, e = dt.datetime(2025, 8, 6, 5, tzinfo=UTC), dt.datetime(2025, 8, 7, 5, tzinfo=UTC)
    # GPU x (device X, priority host): backfill during local 01:00-03:00 (8 + 12 buckets... 24 buckets = 2 h)
    # GPU y (device Y, priority host): backfill during local 01:00-02:00 (12 buckets)
    st = states(
        gpu_rows("x", s, ["I"] * 12 + ["B:j"] * 24 + ["P"] * 252, device="X", host="hx"),
        gpu_rows("y", s, ["I"] * 12 + ["B:k"] * 12 + ["P"] * 264, device="Y", host="hy"),
    )

    def ev(gpu, dev, local_h, runtime, lost):
        row = dict.fromkeys(EVICTIONS.schema.names)
        t = s + dt.timedelta(hours=local_h)
        row.update(global_job_id=f"{gpu}{local_h}", gpu_id=gpu, n_gpus=1, device_name=dev, tier_of_host="priority",
                   evicted_utc=t, started_utc=t - dt.timedelta(seconds=runtime), runtime_s=runtime,
                   lost_gpu_hours=lost, runtime_is_lower_bound=False, resolution_s=1.0, detected_by="job_records")
        return row

    evs = conform(pa.Table.from_pylist([
        ev("x", "X", 1.5, 600.0, 0.2), ev("x", "X", 2.5, 1200.0, 0.3), ev("y", "Y", 1.25, 3000.0, 0.5),
        ev("x", "X", 7.5, 100.0, 0.1),  # an hour without backfill buckets -> rate null
        ev("x", "X", 24.5, 100.0, 0.1),  # next day: ignored
    ]), EVICTIONS)
    rates = eviction_rates_from_tables(evs, st, s, e, tz)
    assert rates.schema == EVICTION_RATES.schema
    r = {(x["device_name"], x["tier"], x["hour_local"]): x for x in rates.to_pylist()}
    assert (r[("X", "priority", 1)]["evictions"], r[("X", "priority", 1)]["backfill_gpu_hours"]) == (1, 1.0)
    assert r[("X", "priority", 1)]["evictions_per_backfill_gpu_hour"] == pytest.approx(1.0)
    assert r[("X", "priority", 2)]["evictions"] == 1
    assert r[("X", "priority", 7)]["backfill_gpu_hours"] == 0.0
    assert r[("X", "priority", 7)]["evictions_per_backfill_gpu_hour"] is None
    assert r[("X", "priority", 1)]["runtime_p50_s"] is None  # distribution only on the all-hours rows
    x_all = r[("X", "priority", None)]
    assert (x_all["evictions"], x_all["backfill_gpu_hours"], x_all["lost_gpu_hours"]) == (3, 2.0, pytest.approx(0.6))
    assert x_all["evictions_per_backfill_gpu_hour"] == pytest.approx(1.5)
    assert x_all["runtime_p10_s"] == pytest.approx(_q([600, 1200, 100], 0.1))
    assert x_all["runtime_p50_s"] == pytest.approx(600.0)
    assert x_all["runtime_p90_s"] == pytest.approx(_q([600, 1200, 100], 0.9))
    all_1 = r[("ALL", "ALL", 1)]
    assert (all_1["evictions"], all_1["backfill_gpu_hours"]) == (2, 2.0)
    total = r[("ALL", "ALL", None)]
    assert (total["evictions"], total["backfill_gpu_hours"]) == (4, 3.0)
    assert total["runtime_p50_s"] == pytest.approx(_q([600, 1200, 3000, 100], 0.5))
    assert r[("ALL", "priority", None)]["evictions"] == 4 and r[("Y", "ALL", None)]["evictions"] == 1
    assert sum(x["evictions"] for (d, t, h), x in r.items() if d == "ALL" and t == "ALL" and h is not None) == 4


def test_rates_file_an_eviction_without_device_or_tier_as_unknown():
    """A run known only by its job's later record, which no snapshot saw, has no GPU, host, device or
    tier: its rates rows say ``unknown``, a group of their own (a null there read like a CUBE's
    aggregate), and the overall row counts it with the others."""
    doc = job("H1", 1, at(12), at(14), kind="job", completed=True, vacate=at(11), vacates=1, code=1018,
              rwc=4 * 3600, ct=2 * 3600)
    st = states(day_of({"GPU-bbbbbbbb": ["H"] * 108 + ["B:Q"] * 24 + ["S"] * 156}))
    evs = evictions_from_tables(DAY0, DAY1, st, jobs(doc))
    (ev,) = evs.to_pylist()
    assert (ev["global_job_id"], ev["gpu_id"], ev["device_name"], ev["tier_of_host"]) == ("H1", None, None, None)
    rates = eviction_rates_from_tables(evs, st, DAY0, DAY1)
    r = {(x["device_name"], x["tier"], x["hour_local"]): x for x in rates.to_pylist()}
    assert not [k for k in r if None in k[:2]]
    assert r[("unknown", "unknown", None)]["evictions"] == 1
    assert r[("unknown", "unknown", None)]["evictions_per_backfill_gpu_hour"] is None  # no backfill hours of its own
    assert r[("unknown", "ALL", 11)]["evictions"] == 1
    assert r[("ALL", "ALL", None)]["evictions"] == 1
    assert r[("ALL", "ALL", None)]["backfill_gpu_hours"] == pytest.approx(2.0)


# --------------------------------------------------------------------------------------------
# The simulator's ground truth


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    # 120 GPUs: about 135 true evictions over the 2 days; telemetry unused, sampled sparsely.
    ds = build_sim_dataset(tmp_path_factory.mktemp("evictions_sim"), gpus=120, telemetry_interval_s=900)
    con = connect()
    out: dict[str, list[pa.Table]] = {"merged": [], "job_records": [], "snapshots": []}
    for i, day in enumerate(ds.days):
        s, e = ds.window(day)
        prev = ds.days[i - 1] if i else (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
        st = ds.store.relation_sql(GPU_STATES, [prev, day])
        jb = ds.store.relation_sql(JOBS, [prev, day])
        cl = ds.store.relation_sql(CLEAN_SLOT_SNAPSHOTS, [prev, day])
        out["merged"].append(compute_evictions(con, s, e, *st, *jb, *cl))
        out["job_records"].append(compute_evictions(con, s, e, None, None, *jb))
        out["snapshots"].append(compute_evictions(con, s, e, *st, None, None, *cl))
        ds.store.write_partition(EVICTIONS, day, out["merged"][-1])
    con.close()
    return ds, {k: pa.concat_tables(v) for k, v in out.items()}


def _score(con, name: str, tol_sql: str) -> tuple[int, int, int, int]:
    """(true evictions, detections, true ones found, detections that are true): match on job id and
    GPU with the eviction time within the tolerance."""
    cond = f"i.global_job_id = t.global_job_id AND i.gpu_id = t.gpu_id AND abs(epoch(i.evicted_utc) - epoch(t.evicted_utc)) <= {tol_sql}"
    return con.execute(
        f"""SELECT (SELECT count(*) FROM tr), (SELECT count(*) FROM {name}),
                   (SELECT count(*) FROM tr t WHERE EXISTS (SELECT 1 FROM {name} i WHERE {cond})),
                   (SELECT count(*) FROM {name} i WHERE EXISTS (SELECT 1 FROM tr t WHERE {cond}))"""
    ).fetchone()


def test_evictions_match_the_simulators_truth(sim):
    ds, out = sim
    con = connect()
    lo, hi = ds.window(ds.days[0])[0], ds.window(ds.days[-1])[1]
    con.execute("CREATE TEMP TABLE tr AS SELECT * FROM read_parquet(?) WHERE evicted_utc >= ? AND evicted_utc < ?",
                [str(ds.truth / "evictions.parquet"), lo, hi])
    for name, table in out.items():
        con.register(name, table)
    cadence = con.execute(
        "SELECT median(d) FROM (SELECT epoch(t) - epoch(lag(t) OVER (ORDER BY t)) AS d FROM "
        "(SELECT DISTINCT snapshot_utc AS t FROM read_parquet(?)))", [ds.store.files(CLEAN_SLOT_SNAPSHOTS, ds.days)]
    ).fetchone()[0]

    n, n_jr, tp_jr, ok_jr = _score(con, "job_records", str(cadence))
    exact = _score(con, "job_records", "1")[2]
    # snapshots date the eviction at the first snapshot showing the primary claim: within the
    # snapshot interval before it (resolution_s, about one cadence plus collector jitter)
    _, n_sn, tp_sn, ok_sn = _score(con, "snapshots", "i.resolution_s + 1")
    _, n_mg, tp_mg, ok_mg = _score(con, "merged", f"greatest(i.resolution_s, {cadence}) + 1")
    by = dict(con.execute("SELECT detected_by, count(*) FROM merged GROUP BY 1").fetchall())
    print(f"\nevictions vs truth ({', '.join(ds.days)}): {n} true evictions; cadence {cadence:.0f} s")
    print(f"  job records: {n_jr} detected, recall {tp_jr / n:.1%}, precision {ok_jr / n_jr:.1%} "
          f"(exact to 1 s: {exact})")
    print(f"  snapshots alone: {n_sn} detected, recall {tp_sn / n:.1%}, precision {ok_sn / n_sn:.1%}")
    print(f"  merged: {n_mg} rows, recall {tp_mg / n:.1%}, precision {ok_mg / n_mg:.1%}, detected_by {by}")
    assert n > 60
    assert tp_jr / n >= 0.99 and ok_jr / n_jr >= 0.99 and exact == tp_jr
    # Snapshots alone miss a backfill run that starts and is evicted between two snapshots (never
    # seen), and an eviction whose primary job ends before the next snapshot; they mistake a backfill
    # job that completes and a primary claim that follows before the next snapshot for an eviction.
    # Measured on this seed: recall 99.3 %, precision 98.5 % (other seeds: 94-99 %).
    assert tp_sn / n >= 0.9 and ok_sn / n_sn >= 0.9
    assert tp_mg / n >= 0.99 and ok_mg / n_mg >= 0.99
    assert by.get("job_records,snapshots", 0) >= 0.9 * n

    # every true eviction appears exactly once over the two daily partitions
    dup = con.execute("SELECT count(*) FROM (SELECT global_job_id, run_index FROM merged WHERE run_index IS NOT NULL "
                      "GROUP BY ALL HAVING count(*) > 1)").fetchone()[0]
    assert dup == 0
    # runtimes and badput from the records: the simulator's evicted runs commit nothing (no checkpoints)
    rows = con.execute(
        """SELECT i.runtime_s, t.runtime_s, i.lost_gpu_hours, i.n_gpus, i.evicted_by_job_id, t.evicted_by_job_id,
                  i.detected_by, i.device_name, t.device_name, i.host, t.host
           FROM merged i JOIN tr t ON i.global_job_id = t.global_job_id AND i.run_index = t.run_index"""
    ).fetchall()
    assert len(rows) == tp_mg
    for rt, t_rt, lost, n_gpus, by_job, t_by_job, det, dev, t_dev, host, t_host in rows:
        assert rt == t_rt and lost == pytest.approx(rt * n_gpus / 3600)
        assert (dev, host) == (t_dev, t_host)
        if "snapshots" in det:
            assert by_job == t_by_job
    print(f"  evicted_by_job_id from snapshots agrees with the truth on all {sum('snapshots' in r[6] for r in rows)} "
          "merged rows")


def test_rates_on_the_simulated_days(sim):
    ds, out = sim
    con = connect()
    for day in ds.days:
        s, e = ds.window(day)
        ev_sql, ev_params = ds.store.relation_sql(EVICTIONS, [day])
        st_sql, st_params = ds.store.relation_sql(GPU_STATES, [day])
        rates = compute_eviction_rates(con, ev_sql, ev_params, st_sql, st_params, s, e, "America/Chicago")
        assert rates.schema == EVICTION_RATES.schema
        r = {(x["device_name"], x["tier"], x["hour_local"]): x for x in rates.to_pylist()}
        n_ev = ds.store.read_table(EVICTIONS, day).num_rows
        bf_buckets = con.execute(f"SELECT count(*) FILTER (state = 'busy_backfill') FROM {st_sql}",
                                 st_params).fetchone()[0]
        total = r[("ALL", "ALL", None)]
        assert total["evictions"] == n_ev
        assert total["backfill_gpu_hours"] == pytest.approx(bf_buckets / 12)
        assert total["evictions_per_backfill_gpu_hour"] == pytest.approx(n_ev / (bf_buckets / 12))
        hourly = [x for (d, t, h), x in r.items() if d == "ALL" and t == "ALL" and h is not None]
        assert sum(x["evictions"] for x in hourly) == n_ev
        assert sum(x["backfill_gpu_hours"] for x in hourly) == pytest.approx(total["backfill_gpu_hours"])
        assert all(x["runtime_p50_s"] is None for x in hourly)
        per_device = [x for (d, t, h), x in r.items() if d != "ALL" and t == "ALL" and h is None]
        assert sum(x["evictions"] for x in per_device) == n_ev
        assert all(x["runtime_p10_s"] <= x["runtime_p50_s"] <= x["runtime_p90_s"] for x in per_device if x["evictions"])
        print(f"\n{day}: {n_ev} evictions, {total['backfill_gpu_hours']:.1f} backfill GPU-hours, "
              f"{total['evictions_per_backfill_gpu_hour']:.3f} evictions per backfill GPU-hour, "
              f"{total['lost_gpu_hours']:.1f} GPU-hours lost; runtime p10/p50/p90 = "
              f"{total['runtime_p10_s']:.0f}/{total['runtime_p50_s']:.0f}/{total['runtime_p90_s']:.0f} s")
