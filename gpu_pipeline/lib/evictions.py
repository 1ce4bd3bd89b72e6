"""Backfill evictions (DESIGN.md 5.4), in DuckDB SQL: two detectors, merged, and daily rates.

A backfill job is *evicted* when its run on a backfill slot ends because the slot was reclaimed
(owner job, draining, preemption), not because it completed.

**(a) Job records** (``clean/jobs``; per run the ``epoch`` document is preferred, else the ``job``
document, and for one key the latest record). A run is an eviction when it ran on a backfill slot
(``is_backfill_slot``), ended (``run_end_utc``) without completing (no ``completion_utc`` at or
after its start) and there is vacate evidence for it:

* ``last_vacate_utc == run_end_utc`` -- the run ended in a vacate (``run_end_utc`` is
  LastVacateTime whenever that is not before the run's start), or
* a later run of the same job exists (a row with a higher ``run_index``, or ``num_job_starts`` >
  ``run_index + 1``) and the job was not put on hold (``job_status`` 5), or
* ``num_vacates > 0`` and the job went back to Idle (``job_status`` 1) when the run ended;

and, from a ``job`` document of a later run (adstash's default: no epoch documents) whose
``LastVacateTime`` lies at or before that run's start, the run before it, which has no record of its
own, ended in that vacate (``NumJobStarts > 1`` with ``LastVacateTime``): an eviction at
``LastVacateTime``, its slot kind taken from the later run's slot (a backfill job is matched to
backfill slots), its GPUs, host and start from the snapshots when they saw it (else null; the loss
bounded by ``RemoteWallClockTime - CommittedTime``). A run whose ``VacateReasonCode`` says the job
ended it itself -- a hold code (below 1000: it failed and was held) or a user's vacate or removal
(:data:`JOB_SIDE_VACATE_CODES`) -- is no eviction, whatever else its record says.

``evicted_utc`` = run end, ``runtime_s`` = run end - run start (exact to the second),
``reason`` / ``reason_code`` = ``VacateReason`` / ``VacateReasonCode``. One row per run; ``gpu_id``
is the first of ``assigned_gpus`` and ``n_gpus`` their number (else RequestGPUs, else 1).

*Lost GPU-hours (badput).* HTCondor's ``CommittedTime`` is cumulative over a job's runs: the wall
time "not lost", i.e. excluding run attempts that were evicted (older manuals: evicted *without a
checkpoint*; a checkpointed attempt commits the work saved by the checkpoint). So the work a run
kept is the *increase* of CommittedTime over that run, and

    badput_s = runtime_s - clamp(CommittedTime(after this run) - CommittedTime(after the previous
               run), 0, runtime_s)

with CommittedTime before the first run = 0 (``lost_basis = 'committed_time'``). When the
previous run's record is not in the input, the increase is unknown; then the job's total loss so
far, ``RemoteWallClockTime - CommittedTime``, capped at the runtime, is used (exact when earlier
runs lost nothing, else an upper bound; ``'committed_time_bound'``). Without CommittedTime the
whole run is lost (``'whole_run'``). ``lost_gpu_hours = badput_s x n_gpus / 3600``.

**(b) Snapshots alone** (``metrics/gpu_states``). Per GPU, over the buckets where the GPU was
observed (buckets with no snapshot, in which the GPU was absent, or in which a claim was being
handed over -- a slot Matched or Preempting -- are skipped, so a dropout or a hand-over seen by a
snapshot does not hide an eviction): an observation ``busy_backfill`` with job J followed by
``busy_prioritized`` /
``busy_shared`` (a primary slot claimed the GPU; the states show only the winning slot row, so J's
absence is inferred from the primary claim winning -- pass the clean slot snapshots to check that
no row of that snapshot still names J on the GPU).
``evicted_utc`` is the snapshot where the primary claim is first seen (the true time lies within
``resolution_s`` before it), ``evicted_by_job_id`` the primary job, ``started_utc`` the first
observation of the uninterrupted run of J on the GPU, looking back into the previous day's states
when they are in the input (``runtime_is_lower_bound`` when J was already running at the first
observation read, or at the first after buckets where the GPU was not seen: a dropout, a collector
outage). Snapshot times come from ``snapshot_utc`` of the states. Lost GPU-hours: the
whole observed run of each GPU (no checkpoint information in snapshots). The GPUs of J
reclaimed in the same snapshot are one eviction, as the job records give one row per run:
``gpu_id`` the least of them, ``n_gpus`` their number.

**Merge.** A snapshot detection and a job-record eviction of the same job are one eviction when the
snapshot GPU is one of the run's GPUs and the record's eviction time lies in
``[last snapshot J was seen - cadence, first snapshot of the primary claim + cadence]`` (about two
cadences around the snapshot evidence). The merged row keeps the job record's exact times, run
and badput and takes ``evicted_by_job_id`` from the snapshots; ``detected_by`` is
``'job_records,snapshots'``. Unmatched detections keep their detector's name, except that a
snapshot detection is dropped when the job records show that run of J *completed* in that window
(the backfill job finished by itself and a primary job took the free GPU before the next snapshot --
the one case snapshots cannot tell from an eviction).

**Days.** A day's partition holds the evictions whose (merged) ``evicted_utc`` lies in the day.
Pass the previous day's states, job records and clean snapshots too: then an eviction whose primary
claim is first seen after midnight is found, its run start is looked up before midnight, and it is
matched to its record and counted once -- on the day of the record's time. (An eviction a few
seconds before midnight whose primary claim is first seen after it is a ``job_records`` row of the
earlier day: that day cannot see the next day's snapshot.)
"""

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.db import exact_sum
from gpu_pipeline.lib.schemas import GPU_STATES, JOBS, TS, TableSpec, _f, conform
from gpu_pipeline.lib.states import part_gap_sql

BUCKET = dt.timedelta(minutes=5)
DETECTORS: tuple[str, ...] = ("job_records", "snapshots", "job_records,snapshots")
LOST_BASES: tuple[str, ...] = ("committed_time", "committed_time_bound", "whole_run")
SNAPSHOT_REASON = "primary slot claimed the GPU (snapshots)"
ALL = "ALL"

EVICTIONS = TableSpec(
    layer="metrics",
    name="evictions",
    description=(
        "Backfill evictions (DESIGN.md 5.4): backfill job runs that ended because the slot was reclaimed, "
        "detected from job records (vacates, restarts) and/or slot snapshots (a primary claim replacing "
        "the backfill job on a GPU), one row per eviction, in the day of evicted_utc."
    ),
    key=("global_job_id", "run_index", "gpu_id", "evicted_utc"),
    schema=pa.schema(
        [
            _f("global_job_id", pa.string(), "GlobalJobId of the evicted backfill job", nullable=False),
            _f("run_index", pa.int32(), "0-based run (epoch) index; null when seen only in snapshots"),
            _f("gpu_id", pa.string(), "GPU of the run (the first of several; null when the record has none)"),
            _f("n_gpus", pa.int32(), "GPUs the run held (AssignedGPUs, else RequestGPUs; from snapshots alone: "
               "its GPUs reclaimed in the same snapshot)",
               nullable=False),
            _f("host", pa.string(), "Execute host"),
            _f("device_name", pa.string(), "GPU model name (from the GPU states)"),
            _f("tier_of_host", pa.string(), "priority when any primary slot of the host was prioritized in the "
               "day, else shared (the rule of eviction_rates' tier)"),
            _f("started_utc", TS, "Start of the evicted run (first snapshot seen running when from snapshots)"),
            _f("evicted_utc", TS, "End of the run (job record), else the first snapshot showing the primary "
               "claim with the backfill job gone from the GPU", nullable=False),
            _f("runtime_s", pa.float64(), "evicted_utc - started_utc (s)"),
            _f("runtime_is_lower_bound", pa.bool_(), "The run was already running at the first snapshot read, "
               "or at the first after the GPU went unseen (a dropout, a collector outage; snapshots only): "
               "runtime_s is a lower bound", nullable=False),
            _f("lost_gpu_hours", pa.float64(), "Badput: GPU-hours of the run not kept (see lost_basis)"),
            _f("lost_basis", pa.string(), "committed_time (runtime minus the CommittedTime gained in the run), "
               "committed_time_bound (min(runtime, RemoteWallClockTime - CommittedTime)), or whole_run"),
            _f("reason", pa.string(), "VacateReason, or how the eviction was inferred"),
            _f("reason_code", pa.int32(), "VacateReasonCode"),
            _f("evicted_by_job_id", pa.string(), "Primary job that claimed the GPU (from snapshots)"),
            _f("resolution_s", pa.float64(), "Uncertainty of evicted_utc: 1 s for job records, for snapshots "
               "the time from the last snapshot showing the run to evicted_utc", nullable=False),
            _f("detected_by", pa.string(), "job_records, snapshots, or job_records,snapshots", nullable=False),
        ]
    ),
)

EVICTION_RATES = TableSpec(
    layer="metrics",
    name="eviction_rates",
    description=(
        "Backfill evictions per backfill GPU-hour per device_name x tier x local hour of day, with ALL rows "
        "(device_name / tier 'ALL', hour_local null), lost GPU-hours, and the runtime-to-eviction "
        "distribution on the all-hours rows."
    ),
    key=("device_name", "tier", "hour_local"),
    version=2,
    schema=pa.schema(
        [
            _f("device_name", pa.string(), "GPU model name, unknown (no GPU state names it), or ALL"),
            _f("tier", pa.string(), "Tier of the host (priority / shared; unknown without a primary slot row), "
               "or ALL"),
            _f("hour_local", pa.int32(), "Hour of day 0-23 in the partition time zone; null = all hours"),
            _f("evictions", pa.int64(), "Evictions (rows of metrics/evictions)", nullable=False),
            _f("backfill_gpu_hours", pa.float64(), "GPU-hours in state busy_backfill (5-minute buckets)",
               nullable=False),
            _f("evictions_per_backfill_gpu_hour", pa.float64(), "evictions / backfill_gpu_hours; null when "
               "there were no backfill hours"),
            _f("lost_gpu_hours", pa.float64(), "Sum of lost_gpu_hours of the evictions", nullable=False),
            _f("runtime_p10_s", pa.float64(), "10th percentile of runtime before eviction (all-hours rows)"),
            _f("runtime_p50_s", pa.float64(), "Median runtime before eviction (all-hours rows)"),
            _f("runtime_p90_s", pa.float64(), "90th percentile of runtime before eviction (all-hours rows)"),
        ]
    ),
)


#: VacateReasonCodes of a run that ended by the job's own doing or its submit side, not by a reclaim
#: of its slot: every code below 1000 (a hold code: the job failed -- FailedToCheckpoint 36, a
#: transfer error, ... -- and was put on hold), UserVacateJob 1004, ScheddVacate 1022 (the AP vacated
#: the job: ``condor_vacate_job``, as the real CHTC ad shows) and JobRemoved 1023 (HTCondor's
#: condor_holdcodes.h; the manual's table of vacate reasons). A run ended so is no eviction,
#: whatever else its record says.
JOB_SIDE_VACATE_CODES: tuple[int, ...] = (1004, 1022, 1023)  # UserVacateJob, ScheddVacate, JobRemoved
# A run ``r`` whose VacateReasonCode is none of those (or unknown): one a reclaim may have ended.
_RECLAIM_OR_UNKNOWN = (f"coalesce(r.vacate_reason_code NOT IN ({', '.join(map(str, JOB_SIDE_VACATE_CODES))}) "
                       "AND r.vacate_reason_code >= 1000, true)")

_JOB_EVICTIONS_SQL = """
dedup AS (
    SELECT * FROM _ev_jobs
    QUALIFY row_number() OVER (PARTITION BY global_job_id, run_index, doc_kind
                               ORDER BY record_utc DESC NULLS LAST, source) = 1
),
runs AS (
    SELECT * FROM dedup
    QUALIFY row_number() OVER (PARTITION BY global_job_id, run_index
                               ORDER BY doc_kind = 'epoch' DESC, record_utc DESC NULLS LAST) = 1
),
job_last AS (
    SELECT global_job_id, max(greatest(run_index, coalesce(num_job_starts, 0) - 1)) AS last_run
    FROM dedup GROUP BY global_job_id
),
jr_base AS (
    SELECT r.*,
           string_split(r.assigned_gpus, ',') AS gpus,
           epoch(r.run_end_utc) - epoch(r.run_start_utc) AS runtime_s,
           p.committed_time_s AS prev_committed_s,
           jl.last_run,
           false AS before_record
    FROM runs r
    JOIN job_last jl USING (global_job_id)
    LEFT JOIN runs p ON p.global_job_id = r.global_job_id AND p.run_index = r.run_index - 1
    WHERE r.is_backfill_slot
      AND r.run_start_utc IS NOT NULL AND r.run_end_utc IS NOT NULL
      AND (r.completion_utc IS NULL OR r.completion_utc < r.run_start_utc)
      -- an epoch whose executable never started (an input transfer failed: NumJobStarts 0, or as
      -- the epoch before it) is no run that a reclaim could end
      AND NOT coalesce(r.doc_kind = 'epoch' AND (r.num_job_starts = 0 OR r.num_job_starts = p.num_job_starts), false)
      AND {reclaim_or_unknown}
      AND (
          r.last_vacate_utc = r.run_end_utc
          OR (jl.last_run > r.run_index AND coalesce(r.job_status, 0) <> 5)
          OR (coalesce(r.num_vacates, 0) > 0 AND r.job_status = 1)
      )
),
-- a job document (adstash's default: no epoch documents) of a later run, whose LastVacateTime lies
-- before that run's start: the run before it ended in that vacate (NumJobStarts > 1 with
-- LastVacateTime, DESIGN 5.4), a run with no record of its own. Its slot, GPUs and start are not in
-- the document: the later run's slot kind stands for its slot (a backfill job is matched to backfill
-- slots), and the GPUs, host and start come from the snapshots when they saw it (the merge).
vacated_before AS (
    SELECT r.* REPLACE (r.run_index - 1 AS run_index, CAST(NULL AS TIMESTAMPTZ) AS run_start_utc,
                        r.last_vacate_utc AS run_end_utc, CAST(NULL AS VARCHAR) AS host,
                        CAST(NULL AS VARCHAR) AS assigned_gpus),
           CAST(NULL AS VARCHAR[]) AS gpus,
           CAST(NULL AS DOUBLE) AS runtime_s,
           CAST(NULL AS DOUBLE) AS prev_committed_s,
           jl.last_run,
           true AS before_record
    FROM runs r
    JOIN job_last jl USING (global_job_id)
    WHERE r.doc_kind = 'job' AND r.is_backfill_slot AND r.run_index >= 1
      AND r.run_start_utc IS NOT NULL AND r.last_vacate_utc IS NOT NULL
      AND r.last_vacate_utc <= r.run_start_utc
      AND {reclaim_or_unknown}
      AND NOT EXISTS (SELECT 1 FROM runs p WHERE p.global_job_id = r.global_job_id AND p.run_index = r.run_index - 1)
),
jr_gain AS (
    SELECT *,
           CASE
               WHEN committed_time_s IS NULL OR before_record THEN NULL
               WHEN run_index = 0 THEN committed_time_s
               WHEN prev_committed_s IS NOT NULL THEN committed_time_s - prev_committed_s
           END AS gained_s
    FROM (SELECT * FROM jr_base UNION ALL BY NAME SELECT * FROM vacated_before)
),
jr AS (
    SELECT global_job_id, run_index,
           gpus,
           gpus[1] AS gpu_id,
           -- the more of the GPUs named and those asked for (an AssignedGPUs adstash cut names fewer)
           CAST(coalesce(greatest(len(gpus), ceil(request_gpus)), 1) AS INTEGER) AS n_gpus,
           host,
           run_start_utc AS started_utc,
           run_end_utc AS evicted_utc,
           runtime_s,
           CASE
               WHEN gained_s IS NOT NULL THEN runtime_s - least(greatest(gained_s, 0), runtime_s)
               WHEN committed_time_s IS NOT NULL AND remote_wall_clock_s IS NOT NULL
                   -- (least skips a null: a run of unknown length loses the whole bound)
                   THEN least(runtime_s, greatest(remote_wall_clock_s - committed_time_s, 0))
               ELSE runtime_s
           END AS badput_s,
           CASE
               WHEN gained_s IS NOT NULL THEN 'committed_time'
               WHEN committed_time_s IS NOT NULL AND remote_wall_clock_s IS NOT NULL
                   THEN 'committed_time_bound'
               ELSE 'whole_run'
           END AS lost_basis,
           coalesce(vacate_reason,
                    CASE WHEN last_vacate_utc = run_end_utc THEN 'vacated'
                         WHEN last_run > run_index THEN 'ended without completion; the job ran again'
                         ELSE 'vacated; the job went back to the queue' END) AS reason,
           vacate_reason_code AS reason_code,
           before_record
    FROM jr_gain
)
"""

# The columns of metrics/gpu_states the SQL below reads (the temp tables copy only these).
_EV_STATE_COLUMNS = ", ".join(("bucket_start_utc", "gpu_id", "host", "device_name", "state", "tier", "global_job_id",
                               "snapshot_utc", "na_reason"))
_RATE_STATE_COLUMNS = ", ".join(("bucket_start_utc", "host", "device_name", "state", "tier"))

_SNAPSHOT_EVICTIONS_SQL = """
bucket_first AS (
    SELECT bucket_start_utc, min(snapshot_utc) AS first_snap FROM _ev_states GROUP BY 1
),
obs AS (
    SELECT st.gpu_id, st.bucket_start_utc, st.state, st.global_job_id,
           coalesce(st.snapshot_utc, bf.first_snap, st.bucket_start_utc) AS obs_utc,
           -- not seen, or seen in a claim's hand-over (a primary slot Matched, a slot Preempting):
           -- no information on the backfill run either way
           st.state = 'na' AND coalesce(st.na_reason, 'dropout') IN ('dropout', 'no_snapshot', 'Matched', 'Preempting')
               AS unseen,
           -- not seen at all (a hand-over is seen: a run starting after it starts there)
           st.state = 'na' AND coalesce(st.na_reason, 'dropout') IN ('dropout', 'no_snapshot') AS missing,
           CASE WHEN st.state = 'busy_backfill' THEN st.global_job_id END AS bf_job
    FROM _ev_states st
    LEFT JOIN bucket_first bf USING (bucket_start_utc)
),
-- run-length encoding on the 5-minute grid: each row against the GPU's row before it, which counts
-- only if it is the bucket before (a window, not a self-join on (GPU, bucket): 10-20 % less on a
-- 1,000-GPU day); the rest runs on the few rows where the GPU's state, or its backfill job, changes
seg_starts AS (
    SELECT * EXCLUDE (p_bucket, p_state, p_unseen, p_missing, p_bf_job, p_obs),
           CASE WHEN p_bucket = bucket_start_utc - params.bucket THEN p_obs END AS prev_obs,
           -- the GPU's first row read, or a row after a bucket it was not seen in (a dropout, an outage):
           -- a run first seen there may have started before
           p_bucket IS DISTINCT FROM bucket_start_utc - params.bucket OR p_missing AS first_row
    FROM (
        SELECT o.*, lag(bucket_start_utc) OVER w AS p_bucket, lag(state) OVER w AS p_state,
               lag(unseen) OVER w AS p_unseen, lag(missing) OVER w AS p_missing, lag(bf_job) OVER w AS p_bf_job,
               lag(obs_utc) OVER w AS p_obs
        FROM obs o
        WINDOW w AS (PARTITION BY gpu_id ORDER BY bucket_start_utc)
    ), params
    WHERE p_bucket IS DISTINCT FROM bucket_start_utc - params.bucket OR state <> p_state OR unseen <> p_unseen
       OR bf_job IS DISTINCT FROM p_bf_job
),
segs AS (
    SELECT *, lead(prev_obs) OVER (PARTITION BY gpu_id ORDER BY bucket_start_utc) AS seg_last_obs
    FROM seg_starts
),
-- the GPU's observations only: a bucket where it was not seen neither ends nor interrupts a run
seen AS (
    SELECT *,
           lag(state) OVER w AS prev_state,
           lag(bf_job) OVER w AS prev_bf_job,
           lead(state) OVER w AS next_state,
           lead(global_job_id) OVER w AS next_job,
           lead(obs_utc) OVER w AS next_obs,
           lead(bucket_start_utc) OVER w AS next_bucket,
           -- where the primary claim that follows a row (its next row's, and those after it) ends:
           -- the next row after that one in another state
           min(CASE WHEN state NOT IN ('busy_prioritized', 'busy_shared') THEN bucket_start_utc END)
               OVER (w ROWS BETWEEN 2 FOLLOWING AND UNBOUNDED FOLLOWING) AS claim_end
    FROM segs
    WHERE NOT unseen
    WINDOW w AS (PARTITION BY gpu_id ORDER BY bucket_start_utc)
),
runs_on_gpu AS (
    SELECT *,
           sum(CASE WHEN state = 'busy_backfill' AND prev_state IS NOT DISTINCT FROM 'busy_backfill'
                         AND prev_bf_job IS NOT DISTINCT FROM bf_job
                    THEN 0 ELSE 1 END)
               OVER (PARTITION BY gpu_id ORDER BY bucket_start_utc ROWS UNBOUNDED PRECEDING) AS run_no
    FROM seen
),
run_start AS (
    SELECT gpu_id, run_no, min(obs_utc) AS started_utc, arg_min(first_row, bucket_start_utc) AS from_first_obs
    FROM runs_on_gpu WHERE state = 'busy_backfill' GROUP BY gpu_id, run_no
),
-- a backfill run followed by a primary claim of its GPU, and the claim's first observation where
-- J is absent: with the clean slot snapshots, J may still be named on the GPU there (its slot
-- Preempting, being vacated, out-ranked by the primary claim in the states); the eviction is then
-- seen in a later snapshot of the same claim, where J is gone. J never gone while the claim lasts
-- (it ran on beside it, or came back): no eviction. Without the snapshots, the claim's first.
claimed AS (
    SELECT * FROM runs_on_gpu
    WHERE state = 'busy_backfill' AND bf_job IS NOT NULL AND next_state IN ('busy_prioritized', 'busy_shared')
),
gone AS (
    -- (a claim's bucket has its snapshot: the states' row, not the obs CTE, which is every row's)
    SELECT c.gpu_id, c.bucket_start_utc, min(x.snapshot_utc) AS gone_utc
    FROM claimed c
    JOIN _ev_states x ON x.gpu_id = c.gpu_id AND x.bucket_start_utc >= c.next_bucket
                         AND (c.claim_end IS NULL OR x.bucket_start_utc < c.claim_end)
                         AND x.state IN ('busy_prioritized', 'busy_shared')
    WHERE NOT EXISTS (
        SELECT 1 FROM _ev_slots sl
        WHERE sl.snapshot_utc = x.snapshot_utc AND sl.gpu_id = c.gpu_id AND sl.global_job_id = c.bf_job
    )
    GROUP BY c.gpu_id, c.bucket_start_utc
),
-- J's last snapshot on the GPU before it was gone (with the clean snapshots; a bucket's state is one
-- snapshot of several when the collector is faster than the buckets)
j_last AS (
    SELECT c.gpu_id, c.bucket_start_utc, max(sl.snapshot_utc) AS j_last_utc
    FROM claimed c
    JOIN gone g USING (gpu_id, bucket_start_utc)
    JOIN _ev_slots sl ON sl.gpu_id = c.gpu_id AND sl.global_job_id = c.bf_job AND sl.snapshot_utc < g.gone_utc
    GROUP BY ALL
),
sn AS (
    SELECT r.bf_job AS global_job_id, r.gpu_id,
           rs.started_utc, r.seg_last_obs AS last_seen_utc, g.gone_utc AS evicted_utc,
           rs.from_first_obs AS runtime_is_lower_bound,
           r.next_job AS evicted_by_job_id,
           epoch(g.gone_utc) - epoch(r.seg_last_obs) AS resolution_s
    FROM claimed r
    JOIN gone g USING (gpu_id, bucket_start_utc)
    JOIN run_start rs USING (gpu_id, run_no)
    LEFT JOIN j_last jl USING (gpu_id, bucket_start_utc)
    -- a snapshot that saw the GPU free between J's last one and the claim: J ended, then the GPU was
    -- claimed -- no eviction
    WHERE NOT EXISTS (
        SELECT 1 FROM _ev_free f
        WHERE f.gpu_id = r.gpu_id AND f.snapshot_utc > greatest(r.seg_last_obs, jl.j_last_utc)
          AND f.snapshot_utc < g.gone_utc
    )
)
"""

_MERGE_SQL = """
WITH
params AS (
    SELECT CAST($start AS TIMESTAMPTZ) AS s, CAST($end AS TIMESTAMPTZ) AS e,
           to_microseconds(CAST($bucket_s * 1000000 AS BIGINT)) AS bucket
),
snap_times AS (
    SELECT DISTINCT snapshot_utc AS t FROM _ev_states, params
    WHERE snapshot_utc >= params.s AND snapshot_utc < params.e
),
snap_gaps AS (SELECT epoch(t) - epoch(lag(t) OVER (ORDER BY t)) AS d FROM snap_times),
cadence AS (
    -- the gaps between snapshots, not between the parts of one (states.SNAPSHOT_PARTS_MAX_US)
    SELECT coalesce(median(d), $bucket_s) AS cadence_s FROM snap_gaps, ({part_gap}) pg WHERE d > pg.p
),
{jr_sql},
{sn_sql},
-- device: one cheap aggregate over the states (host and device are constant per GPU and day); the
-- host's tier (_ev_hosttier: its primary slots' tiers) by the rule the rates use (_host_tier) over
-- the day's rows, else over the previous day's (a host seen only before midnight)
gpu_info AS (
    SELECT gpu_id, arg_max(host, bucket_start_utc) AS host, max(device_name) AS device_name
    FROM _ev_states GROUP BY gpu_id
),
host_info AS (  -- the GPUs' latest hosts and every host the slot rows name (a host renamed in the
                -- day keeps its old name in the job records of the runs before)
    SELECT h.host,
           any_value(coalesce({day_tier}, {any_tier})) AS tier_of_host,
           max(g.device_name) AS device_name
    FROM (SELECT host FROM gpu_info UNION SELECT host FROM _ev_hosttier) h
    LEFT JOIN gpu_info g USING (host) LEFT JOIN _ev_hosttier ht USING (host)
    GROUP BY h.host
),
pairs AS (
    SELECT jr.global_job_id, jr.run_index, jr.evicted_utc AS jr_evicted, sn.gpu_id AS sn_gpu,
           sn.evicted_utc AS sn_evicted, sn.evicted_by_job_id, sn.started_utc AS sn_started,
           sn.runtime_is_lower_bound AS sn_lower_bound,
           row_number() OVER (PARTITION BY sn.global_job_id, sn.gpu_id, sn.evicted_utc
                              ORDER BY abs(epoch(sn.evicted_utc) - epoch(jr.evicted_utc)), jr.run_index)
               AS pick
    FROM jr
    JOIN sn ON sn.global_job_id = jr.global_job_id
           -- a record naming none of its GPUs, or fewer than it held (a list adstash cut), takes
           -- any of the job's GPUs seen reclaimed in the window
           AND (list_contains(jr.gpus, sn.gpu_id) OR jr.gpus IS NULL OR len(jr.gpus) < jr.n_gpus)
    CROSS JOIN cadence c
    WHERE epoch(jr.evicted_utc) >= epoch(sn.last_seen_utc) - c.cadence_s
      AND epoch(jr.evicted_utc) <= epoch(sn.evicted_utc) + c.cadence_s
),
matched AS (SELECT * FROM pairs WHERE pick = 1),
-- a run known only by the vacate in its job's later record takes the later run's slot kind: where
-- the states last saw J, before that vacate, busy on a primary slot, the run was not a backfill run
before_record_primary AS (
    SELECT jr.global_job_id, jr.run_index
    FROM jr JOIN _ev_states x ON x.global_job_id = jr.global_job_id AND x.snapshot_utc <= jr.evicted_utc
    WHERE jr.before_record AND x.state LIKE 'busy%'
    GROUP BY ALL
    HAVING arg_max(x.state, x.snapshot_utc) IN ('busy_prioritized', 'busy_shared')
),
completed_runs AS (
    SELECT global_job_id, string_split(assigned_gpus, ',') AS gpus, completion_utc
    FROM runs WHERE completion_utc IS NOT NULL AND completion_utc >= run_start_utc
),
jr_rows AS (
    SELECT jr.global_job_id, jr.run_index,
           coalesce(jr.gpu_id, m.sn_gpu) AS gpu_id, jr.n_gpus,
           coalesce(jr.host, gi.host) AS host,
           -- a run known only by the vacate in its job's later record: its start as the snapshots saw it
           coalesce(jr.started_utc, m.sn_started) AS started_utc, jr.evicted_utc,
           coalesce(jr.runtime_s, epoch(jr.evicted_utc) - epoch(m.sn_started)) AS runtime_s,
           jr.started_utc IS NULL AND coalesce(m.sn_lower_bound, false) AS runtime_is_lower_bound,
           coalesce(jr.badput_s, CASE WHEN jr.lost_basis = 'whole_run'
                                      THEN epoch(jr.evicted_utc) - epoch(m.sn_started) END)
               * jr.n_gpus / 3600.0 AS lost_gpu_hours, jr.lost_basis,
           jr.reason, jr.reason_code,
           m.evicted_by_job_id,
           1.0 AS resolution_s,
           CASE WHEN m.global_job_id IS NULL THEN 'job_records' ELSE 'job_records,snapshots' END
               AS detected_by
    FROM jr
    LEFT JOIN (
        SELECT global_job_id, run_index, arg_min(sn_gpu, sn_evicted) AS sn_gpu,
               arg_min(evicted_by_job_id, sn_evicted) AS evicted_by_job_id,
               arg_min(sn_started, sn_evicted) AS sn_started, arg_min(sn_lower_bound, sn_evicted) AS sn_lower_bound
        FROM matched GROUP BY global_job_id, run_index
    ) m USING (global_job_id, run_index)
    LEFT JOIN gpu_info gi ON gi.gpu_id = coalesce(jr.gpu_id, m.sn_gpu)
    WHERE NOT (m.global_job_id IS NULL AND (jr.global_job_id, jr.run_index) IN (SELECT * FROM before_record_primary))
),
sn_unmatched AS (
    SELECT sn.*, gi.host
    FROM sn
    CROSS JOIN cadence c
    LEFT JOIN gpu_info gi ON gi.gpu_id = sn.gpu_id
    ANTI JOIN matched m
      ON m.global_job_id = sn.global_job_id AND m.sn_gpu = sn.gpu_id AND m.sn_evicted = sn.evicted_utc
    -- the job records show that run completed: the backfill job ended by itself, then the primary came
    ANTI JOIN completed_runs cr
      ON cr.global_job_id = sn.global_job_id
     AND (list_contains(cr.gpus, sn.gpu_id) OR cr.gpus IS NULL)
     AND epoch(cr.completion_utc) >= epoch(sn.last_seen_utc) - c.cadence_s
     AND epoch(cr.completion_utc) <= epoch(sn.evicted_utc) + c.cadence_s
),
-- one row per evicted run, as the job records give it: the GPUs of J reclaimed in the same snapshot
-- are one eviction (n_gpus of them, the first GPU named), the whole observed run of each lost
sn_rows AS (
    SELECT global_job_id, CAST(NULL AS INTEGER) AS run_index, min(gpu_id) AS gpu_id,
           CAST(count(*) AS INTEGER) AS n_gpus, arg_min(host, gpu_id) AS host,
           min(started_utc) AS started_utc, evicted_utc,
           epoch(evicted_utc) - epoch(min(started_utc)) AS runtime_s,
           bool_or(runtime_is_lower_bound) AS runtime_is_lower_bound,
           {lost_sum} / 3600.0 AS lost_gpu_hours,
           'whole_run' AS lost_basis,
           $snapshot_reason AS reason, CAST(NULL AS INTEGER) AS reason_code,
           arg_min(evicted_by_job_id, gpu_id) AS evicted_by_job_id, max(resolution_s) AS resolution_s,
           'snapshots' AS detected_by
    FROM sn_unmatched
    GROUP BY global_job_id, evicted_utc
),
all_rows AS (SELECT * FROM jr_rows UNION ALL SELECT * FROM sn_rows)
SELECT a.global_job_id, a.run_index, a.gpu_id, a.n_gpus, a.host,
       coalesce(gi.device_name, hi.device_name) AS device_name,
       hi.tier_of_host,
       a.started_utc, a.evicted_utc, a.runtime_s, a.runtime_is_lower_bound,
       a.lost_gpu_hours, a.lost_basis, a.reason, a.reason_code, a.evicted_by_job_id,
       a.resolution_s, a.detected_by
FROM all_rows a
CROSS JOIN params
LEFT JOIN gpu_info gi ON gi.gpu_id = a.gpu_id
LEFT JOIN host_info hi ON hi.host = a.host
WHERE a.evicted_utc >= params.s AND a.evicted_utc < params.e
ORDER BY a.evicted_utc, a.global_job_id, a.run_index, a.gpu_id
"""

def compute_evictions(
    con: duckdb.DuckDBPyConnection,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    states_from_sql: str | None = None,
    states_params: list | None = None,
    jobs_from_sql: str | None = None,
    jobs_params: list | None = None,
    snapshots_from_sql: str | None = None,
    snapshots_params: list | None = None,
    bucket: dt.timedelta = BUCKET,
) -> pa.Table:
    """Evictions of the day ``[start_utc, end_utc)`` from job records and/or GPU states.

    ``states_from_sql`` / ``states_params``: FROM-clause over ``metrics/gpu_states`` (the day and
    the previous day, e.g. ``Store.relation_sql(GPU_STATES, [prev, day])``); ``None`` disables the
    snapshot detector. ``jobs_from_sql`` / ``jobs_params``: FROM-clause over ``clean/jobs`` (the day
    and the previous day, so earlier runs' CommittedTime is known); ``None`` disables the job-record
    detector. The GPU states also give device and host tier to job-record rows.
    ``snapshots_from_sql`` / ``snapshots_params`` (optional): FROM-clause over
    ``clean/slot_snapshots`` of the day; when given, a snapshot detection also requires that no slot
    row of the primary-claim snapshot still names job J on the GPU (the states show only the
    winning row, so without them J's absence is inferred from the primary claim winning).
    """
    lookback = dt.timedelta(days=1, hours=1)
    if states_from_sql is not None:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _ev_states AS SELECT {_EV_STATE_COLUMNS} FROM {states_from_sql} "
            "WHERE bucket_start_utc >= CAST(? AS TIMESTAMPTZ) AND bucket_start_utc < CAST(? AS TIMESTAMPTZ)",
            [*(states_params or []), start_utc - lookback, end_utc],
        )
    else:
        con.register("_ev_no_states", GPU_STATES.empty())
        con.execute(f"CREATE OR REPLACE TEMP TABLE _ev_states AS SELECT {_EV_STATE_COLUMNS} FROM _ev_no_states")
        con.unregister("_ev_no_states")
    if jobs_from_sql is not None:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _ev_jobs AS SELECT * FROM {jobs_from_sql}", [*(jobs_params or [])]
        )
    else:
        con.register("_ev_no_jobs", JOBS.empty())
        con.execute("CREATE OR REPLACE TEMP TABLE _ev_jobs AS SELECT * FROM _ev_no_jobs")
        con.unregister("_ev_no_jobs")
    if snapshots_from_sql is not None:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _ev_slots AS SELECT DISTINCT snapshot_utc, gpu_id, global_job_id "
            f"FROM {snapshots_from_sql} WHERE global_job_id IS NOT NULL "
            "AND snapshot_utc >= CAST(? AS TIMESTAMPTZ) AND snapshot_utc < CAST(? AS TIMESTAMPTZ)",
            [*(snapshots_params or []), start_utc - lookback, end_utc],
        )
        # the snapshots that saw a GPU free: rows of it, none with a job, none in a claim's hand-over
        # (Matched, Preempting) nor a primary claim whose job has not started yet (Claimed without a
        # job) -- a collector faster than the buckets sees a backfill run end there before the
        # primary claim that the states show next. Only the GPUs whose states hold a backfill run
        # and a primary claim can have a snapshot eviction.
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _ev_free AS SELECT snapshot_utc, gpu_id "
            f"FROM {snapshots_from_sql} WHERE snapshot_utc >= CAST(? AS TIMESTAMPTZ) "
            "AND snapshot_utc < CAST(? AS TIMESTAMPTZ) AND gpu_id IN (SELECT gpu_id FROM _ev_states GROUP BY gpu_id "
            "HAVING bool_or(state = 'busy_backfill') AND bool_or(state IN ('busy_prioritized', 'busy_shared'))) "
            "GROUP BY ALL HAVING count(global_job_id) = 0 AND NOT bool_or(coalesce(slot_state IN ('Matched', "
            "'Preempting') OR (slot_state = 'Claimed' AND NOT is_backfill_slot), false))",
            [*(snapshots_params or []), start_utc - lookback, end_utc],
        )
    else:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _ev_slots (snapshot_utc TIMESTAMPTZ, gpu_id VARCHAR, global_job_id VARCHAR)"
        )
        con.execute("CREATE OR REPLACE TEMP TABLE _ev_free (snapshot_utc TIMESTAMPTZ, gpu_id VARCHAR)")
    try:
        _stage_host_tiers(con, "_ev_hosttier", snapshots_from_sql, list(snapshots_params or []),
                          start_utc - lookback, start_utc, end_utc, states="_ev_states")
        jr_sql = _JOB_EVICTIONS_SQL.strip().format(reclaim_or_unknown=_RECLAIM_OR_UNKNOWN)
        sql = _MERGE_SQL.format(jr_sql=jr_sql, sn_sql=_SNAPSHOT_EVICTIONS_SQL.strip(),
                                part_gap=part_gap_sql("snap_gaps", "d", 1e-6),
                                lost_sum=exact_sum("epoch(evicted_utc) - epoch(started_utc)"),
                                day_tier=_host_tier("ht.day_priority", "ht.day_shared"),
                                any_tier=_host_tier("ht.any_priority", "ht.any_shared"))
        table = con.sql(
            sql,
            params={
                "start": start_utc,
                "end": end_utc,
                "bucket_s": bucket.total_seconds(),
                "snapshot_reason": SNAPSHOT_REASON,
            },
        ).to_arrow_table()
    finally:
        con.execute("DROP TABLE IF EXISTS _ev_states")
        con.execute("DROP TABLE IF EXISTS _ev_jobs")
        con.execute("DROP TABLE IF EXISTS _ev_slots")
        con.execute("DROP TABLE IF EXISTS _ev_free")
        con.execute("DROP TABLE IF EXISTS _ev_hosttier")
    return conform(table, EVICTIONS)


def evictions_from_tables(
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    states: pa.Table | None = None,
    jobs: pa.Table | None = None,
) -> pa.Table:
    """Convenience for tests and small inputs: evictions from in-memory tables."""
    con = db_connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        if states is not None:
            con.register("_states_in", states)
        if jobs is not None:
            con.register("_jobs_in", jobs)
        return compute_evictions(
            con,
            start_utc,
            end_utc,
            "_states_in" if states is not None else None,
            None,
            "_jobs_in" if jobs is not None else None,
            None,
        )
    finally:
        con.close()


def _stage_host_tiers(con: duckdb.DuckDBPyConnection, table: str, slots_sql: str | None, slots_params: list,
                      lo: dt.datetime, day_start: dt.datetime, end: dt.datetime, states: str) -> None:
    """``table`` (host, day_priority, day_shared, any_priority, any_shared): whether a primary slot of
    the host was prioritized / open capacity in [day_start, end) and in [lo, end). From the slot
    snapshots (``slots_sql``) where given: every primary slot row, whichever row won its GPU's
    bucket, so that a prioritized host whose primary slots sat Unclaimed while its backfill slots
    ran jobs all day is still priority (its states' winning rows are all backfill). Else from the
    tiers of the states' winning rows (``states``, a table with ``bucket_start_utc, host, tier``)."""
    if slots_sql is not None:
        source, t, params = slots_sql, "snapshot_utc", [*slots_params, lo, end]
        where = ("NOT coalesce(is_backfill_slot, false) AND host IS NOT NULL "
                 "AND snapshot_utc >= CAST(? AS TIMESTAMPTZ) AND snapshot_utc < CAST(? AS TIMESTAMPTZ)")
    else:
        source, t, params, where = states, "bucket_start_utc", [], "true"
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {table} AS
            SELECT host,
                   bool_or(tier = 'priority') FILTER (WHERE {t} >= CAST(? AS TIMESTAMPTZ)) AS day_priority,
                   bool_or(tier = 'shared') FILTER (WHERE {t} >= CAST(? AS TIMESTAMPTZ)) AS day_shared,
                   bool_or(tier = 'priority') AS any_priority, bool_or(tier = 'shared') AS any_shared
            FROM {source} WHERE {where} GROUP BY host""",
        [day_start, day_start, *params],
    )


def _host_tier(any_priority: str, any_shared: str) -> str:
    """SQL of a host's tier, one rule for the evictions and their rates: priority when any primary
    slot of the host was prioritized (PrioritizedProjects), else shared."""
    return f"CASE WHEN {any_priority} THEN 'priority' WHEN {any_shared} THEN 'shared' END"


_RATES_SQL = """
WITH
params AS (SELECT CAST($start AS TIMESTAMPTZ) AS s, CAST($end AS TIMESTAMPTZ) AS e),
host_tier AS (  -- the rule of the evictions' tier_of_host (_host_tier), over the day
    SELECT host, {host_tier} AS tier FROM _rate_hosttier
),
-- a device or tier no row names (a run known only by its job's later record, which the snapshots did not
-- see; a host without a primary slot row) is 'unknown': a group of its own, never confused with a
-- CUBE's aggregate
bf AS (
    SELECT coalesce(st.device_name, 'unknown') AS device_name, coalesce(ht.tier, 'unknown') AS tier,
           CAST(hour(timezone($tz, st.bucket_start_utc)) AS INTEGER) AS hour_local,
           count(*) AS n
    FROM _rate_states st
    LEFT JOIN host_tier ht ON ht.host = st.host
    CROSS JOIN params
    WHERE st.state = 'busy_backfill' AND st.bucket_start_utc >= params.s AND st.bucket_start_utc < params.e
    GROUP BY ALL
),
ev AS (
    SELECT coalesce(device_name, 'unknown') AS device_name, coalesce(tier_of_host, 'unknown') AS tier,
           CAST(hour(timezone($tz, evicted_utc)) AS INTEGER) AS hour_local,
           runtime_s, lost_gpu_hours
    FROM _rate_evictions, params
    WHERE evicted_utc >= params.s AND evicted_utc < params.e
),
ev_agg AS (
    SELECT CASE WHEN grouping(device_name) = 1 THEN 'ALL' ELSE device_name END AS device_name,
           CASE WHEN grouping(tier) = 1 THEN 'ALL' ELSE tier END AS tier,
           hour_local, grouping(hour_local) = 1 AS all_hours,
           count(*) AS evictions,
           coalesce({lost_sum}, 0.0) AS lost_gpu_hours,
           quantile_cont(runtime_s, 0.1) AS p10, quantile_cont(runtime_s, 0.5) AS p50,
           quantile_cont(runtime_s, 0.9) AS p90
    FROM ev
    GROUP BY CUBE (device_name, tier, hour_local)
),
bf_agg AS (
    SELECT CASE WHEN grouping(device_name) = 1 THEN 'ALL' ELSE device_name END AS device_name,
           CASE WHEN grouping(tier) = 1 THEN 'ALL' ELSE tier END AS tier,
           hour_local, grouping(hour_local) = 1 AS all_hours,
           -- buckets counted, then turned into hours: the same bits on every run
           sum(n) * $bucket_s / 3600.0 AS backfill_gpu_hours
    FROM bf
    GROUP BY CUBE (device_name, tier, hour_local)
),
joined AS (
    SELECT coalesce(e.device_name, b.device_name) AS device_name,
           coalesce(e.tier, b.tier) AS tier,
           CASE WHEN coalesce(e.all_hours, b.all_hours) THEN NULL
                ELSE coalesce(e.hour_local, b.hour_local) END AS hour_local,
           coalesce(e.all_hours, b.all_hours) AS all_hours,
           coalesce(e.evictions, 0) AS evictions,
           coalesce(b.backfill_gpu_hours, 0.0) AS backfill_gpu_hours,
           coalesce(e.lost_gpu_hours, 0.0) AS lost_gpu_hours,
           e.p10, e.p50, e.p90
    FROM ev_agg e
    FULL OUTER JOIN bf_agg b
      ON b.device_name IS NOT DISTINCT FROM e.device_name AND b.tier IS NOT DISTINCT FROM e.tier
     AND b.hour_local IS NOT DISTINCT FROM e.hour_local AND b.all_hours = e.all_hours
)
SELECT device_name, tier, hour_local, evictions, backfill_gpu_hours,
       CASE WHEN backfill_gpu_hours > 0 THEN evictions / backfill_gpu_hours END
           AS evictions_per_backfill_gpu_hour,
       lost_gpu_hours,
       CASE WHEN all_hours THEN p10 END AS runtime_p10_s,
       CASE WHEN all_hours THEN p50 END AS runtime_p50_s,
       CASE WHEN all_hours THEN p90 END AS runtime_p90_s
FROM joined
WHERE NOT (evictions = 0 AND backfill_gpu_hours = 0 AND NOT (device_name = 'ALL' AND tier = 'ALL' AND all_hours))
ORDER BY device_name = 'ALL', device_name, tier = 'ALL', tier, hour_local NULLS LAST
""".format(lost_sum=exact_sum("lost_gpu_hours"),
           host_tier=_host_tier("day_priority", "day_shared"))


def compute_eviction_rates(
    con: duckdb.DuckDBPyConnection,
    evictions_from_sql: str,
    evictions_params: list,
    states_from_sql: str,
    states_params: list,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    tz: str = "UTC",
    bucket: dt.timedelta = BUCKET,
    snapshots_from_sql: str | None = None,
    snapshots_params: list | None = None,
) -> pa.Table:
    """Eviction rates of the day ``[start_utc, end_utc)`` per device x host tier x local hour.

    ``evictions_from_sql``: FROM-clause over ``metrics/evictions`` (rows outside the day are
    ignored); ``states_from_sql``: over ``metrics/gpu_states`` of the day (backfill GPU-hours =
    buckets in ``busy_backfill`` x bucket length). ``hour_local`` is the hour of the eviction / the
    bucket start in ``tz`` (on a 25-hour DST day the repeated hour is one group). Rows: every
    combination of device_name / tier / hour with 'ALL' (hour null) for aggregates; combinations
    without evictions and without backfill hours are left out, except the overall row, which is
    always present (an empty day gives one all-zero row). ``snapshots_from_sql`` /
    ``snapshots_params`` (optional, as for :func:`compute_evictions`): ``clean/slot_snapshots`` of the
    day, which give the host tier (its primary slots'); without them, the states' winning rows do.
    """
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE _rate_states AS SELECT {_RATE_STATE_COLUMNS} FROM {states_from_sql} "
        "WHERE bucket_start_utc >= CAST(? AS TIMESTAMPTZ) AND bucket_start_utc < CAST(? AS TIMESTAMPTZ)",
        [*states_params, start_utc, end_utc],
    )
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE _rate_evictions AS SELECT * FROM {evictions_from_sql} "
        "WHERE evicted_utc >= CAST(? AS TIMESTAMPTZ) AND evicted_utc < CAST(? AS TIMESTAMPTZ)",
        [*evictions_params, start_utc, end_utc],
    )
    try:
        _stage_host_tiers(con, "_rate_hosttier", snapshots_from_sql, list(snapshots_params or []),
                          start_utc, start_utc, end_utc, states="_rate_states")
        table = con.sql(
            _RATES_SQL,
            params={"start": start_utc, "end": end_utc, "tz": tz, "bucket_s": bucket.total_seconds()},
        ).to_arrow_table()
    finally:
        con.execute("DROP TABLE IF EXISTS _rate_states")
        con.execute("DROP TABLE IF EXISTS _rate_evictions")
        con.execute("DROP TABLE IF EXISTS _rate_hosttier")
    return conform(table, EVICTION_RATES)


def eviction_rates_from_tables(
    evictions: pa.Table, states: pa.Table, start_utc: dt.datetime, end_utc: dt.datetime, tz: str = "UTC"
) -> pa.Table:
    """Convenience for tests and small inputs: rates from in-memory tables."""
    con = db_connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("_ev_in", evictions)
        con.register("_st_in", states)
        return compute_eviction_rates(con, "_ev_in", [], "_st_in", [], start_utc, end_utc, tz)
    finally:
        con.close()
