"""Demand vs capacity per hour and device class (DESIGN.md 5.6), in DuckDB SQL.

Demand (HTCondor job records, ``clean/jobs``)
    A GPU job (``request_gpus >= 1`` in any of its records, DESIGN 4.4) is *idle* -- queued demand -- during:

    * ``[queued_utc, run_start_utc of run 0)``: waiting for its first run (``queued_utc`` null: the
      QDate inside the GlobalJobId ``schedd#cluster.proc#qdate``); where no row of run 0 is known
      but one of a later run is (adstash's job ads, its default, describe the last run only),
      ``[queued_utc, first_start_utc)``, the first start (JobStartDate) that row carries;
    * ``[end of run k, start of run k+1)``: an evicted / vacated run sends the job back to Idle;
    * after its last known run, when that run ended without completing: ``[end, left)``, where
      ``left`` is when the job's latest document says it left the queue or stopped being idle
      (Removed 3, Completed 4, Held 5): its ``status_entered_utc`` (EnteredCurrentStatus), else its
      ``record_utc``; else the window end (still idle as far as the records tell). A job whose
      latest document says Removed with ``last_job_status`` 5 (LastJobStatus: held before the
      removal) has no such wait: it was held, not idle, up to the removal (when the hold began
      the final ad does not say; held while running, the run's end is the hold's start) -- unless
      its last run sent it back to Idle (an epoch written with the job Idle, or an eviction's
      ``vacate_reason_code``, 1000 and above but 1023, the removal's): then it waits up to the
      removal, its held time included;
    * a job that never started: ``[queued_utc, left)`` with the same ``left`` rule (so a job
      removed from the queue ends at its record time, a job still idle at the window end). A job
      that never started, held, then removed counts its held time too: the final ad keeps no
      hold start.
    * An interval of the last two kinds with no ``left`` ends earlier where the slot snapshots
      saw the job running again: at the first snapshot after its start whose GPU state is busy
      with the job (``metrics/gpu_states.global_job_id``), its ``open_end`` false. The run it
      saw has no record yet (adstash writes one when a run ends).

    Runs are merged over the job's ``epoch`` and ``job`` documents (one row per job run; epoch
    values win). When the previous run is missing (job documents only describe the last run) or
    known only as open (a ``condor_q`` row of it running, no end), the gap before a run starts at
    the run's ``last_vacate_utc`` when that lies before the run's start and not before the
    previous known run's end, else it is not counted; the first-run wait is counted when run 0 is
    known, or up to the first start (``first_start_utc``) a later run's row carries. Read the
    clean partitions of the window's days and the :data:`JOBS_LOOKBACK_DAYS` (14) before: a job
    evicted, or queued with a ``condor_q`` row, is demand on the days after as long as no later
    record or snapshot ends its wait, up to two weeks after its last record (a day's partition
    holds only the rows overlapping it, and a job still idle has no record on the days after). Rows repeated across partitions are deduplicated
    on the table key (latest ``record_utc`` wins).

    ``demand_gpus`` of an hour = time-weighted mean of Σ ``request_gpus`` of the idle jobs
    (GPU-seconds idle in the hour / hour length); ``pending_jobs`` = the same for the job count;
    ``mean_wait_s`` = mean, over the idle intervals overlapping the hour, of the wait so far at the
    interval's last instant inside the hour (since ``queued_utc``, or since the eviction for a
    re-queued job -- Kueue's "created or requeued until admission"); null when nothing waited.

    What records cannot show: condor_adstash indexes a job's history when it leaves the queue and
    an epoch when a run ends, so a job still queued, or still on its first run, has no document
    yet; its wait appears when a later re-materialization of the day finds it (the second
    schedule), or at once from a queue-snapshot source (``condor_q -json`` ads: ``job`` rows with
    JobStatus 1, handled as "never started"). A job whose re-queued run is still going shows as
    idle after the eviction until a slot snapshot sees it running, or its next record. On the
    simulator this is measured: waits of
    jobs with a record match the truth to the second; the rest is exactly the jobs without one.

Device class of a job
    HTCondor job records say which device a job can use only where its requirements name one:
    ``RequireGPUs`` (``require_gpus = DeviceName == "NVIDIA A100-SXM4-80GB"``) or a test on the
    machine's ``GPUs_DeviceName`` / ``CUDADeviceName`` in ``Requirements``, kept as text in
    ``clean/jobs`` (``require_gpus``, ``requirements``). They are read with the ClassAd library against
    the device models of the window's states (:func:`gpu_requirements.device_class_of`): a job whose
    requirements leave one model is that model's class; the others (no device test, a capability
    test, several models left, a model the pool lacks that day) are class ``ANY``. The job's latest
    ``require_gpus`` and latest ``requirements`` are read, each from the latest record that holds it.
    A jobs relation with a column ``device_class`` is read as it is instead. Output rows are per device name (demand of the jobs of that class, capacity of that
    device) and ``ALL`` (the whole pool: all demand -- ``ANY`` jobs count only here -- against all
    capacity).

Capacity (``metrics/gpu_states``, 5-minute buckets)
    Time-weighted means over the hour's buckets seen in a slot snapshot (rows / seen buckets; a
    bucket whose GPUs are all ``na`` with reason ``no_snapshot`` is not seen): ``idle_gpus`` = GPUs
    in ``idle_prioritized``, ``idle_shared`` or ``idle_backfill``; ``idle_open_gpus`` =
    ``idle_shared`` + ``idle_backfill`` (capacity open to any job); ``busy_gpus`` = ``busy_*``;
    ``total_gpus`` = idle + busy (``na`` excluded); ``allocation_pct`` = 100 busy / total;
    ``capacity_coverage`` = seen buckets x 300 s / hour length. A collector outage thus leaves the
    means of the rest of the hour, and an hour with no snapshot at all has unknown (null)
    capacity -- not zero GPUs, which would read as demand against no capacity, Critical.
    **Choice:** DCR uses ``idle_gpus``, *including* idle prioritized GPUs: the seed's denominator
    ``allocatable - usage`` counts every unallocated GPU, and the job records include the
    prioritized projects' own jobs, which those GPUs serve (other jobs reach them only as
    backfill). ``idle_open_gpus`` is exposed beside it for the open-capacity view.

Scores with FIXED scales (so a partition's values never depend on which other days are computed
with it; the seed's min-max normalization over the frame made days incomparable)
    * ``DCR = demand_gpus / max(idle_gpus, 1e-6)`` capped at :data:`DCR_MAX` = 1e6 (finite);
      ``zero_idle`` = no idle GPU in the hour, ``dcr_capped`` = the uncapped ratio reached the cap
      (demand >= 1 GPU with zero idle); demand or capacity unknown: DCR, QPS and CIS null;
    * ``norm(DCR) = min(DCR / 4, 1)`` (:data:`DCR_SCALE`);
    * ``norm(pending) = min(demand_gpus / total_gpus, 1)`` -- queued GPUs as a share of the class
      (1 when there is demand and no capacity, 0 when neither);
    * ``norm(wait) = min(mean_wait_s / 4 h, 1)`` (:data:`WAIT_SCALE_S`; null wait -> 0);
    * ``norm(gap) = min(max(efficiency_gap_pp, 0) / 100, 1)``; the efficiency gap (DESIGN 5.5) is
      not an input of this module unless an efficiency relation is given
      (``hour_start_utc, device_class, efficiency_gap_pp``; :func:`efficiency_by_class_sql` builds
      it from per-GPU hourly rows); without it ``efficiency_gap_pp`` is null and the term is 0, so
      CIS is at most 0.7 from demand alone;
    * ``QPS = 0.6 norm(pending) + 0.4 norm(wait)``;
      ``CIS = 0.5 norm(DCR) + 0.3 norm(gap) + 0.2 QPS``;
    * severity: ``CIS > 0.7 or DCR > 2`` Critical; ``CIS > 0.5 or DCR > 1`` Warning; ``CIS > 0.3``
      Moderate; else Healthy; ``Unknown`` when DCR is null (no reading either way).

Kueue (optional, ``source = 'kueue'``, device class ``ALL``)
    From ``clean/kueue_demand`` rows of the window, per scrape summed over ClusterQueues, per hour
    the time-weighted mean over a cluster's scrapes, summed over clusters. A scrape stands for the
    time until its cluster's next scrape, split at the hours -- where the next is more than
    :data:`KUEUE_HOLD_GAP_FACTOR` median intervals away (an outage), and after the cluster's last
    scrape, for one median interval; a cluster's only scrape until the end of its hour; never for
    more than :data:`KUEUE_MAX_HOLD`; clipped to the window (the minutes before a day's first scrape
    are not covered). A cluster of the window that no scrape stands for in an hour makes that
    hour's demand and capacity unknown: a window with scrapes has a row for every hour, and so has a
    window of a configured source (``kueue_configured``) without a readable scrape, every hour
    unknown. A ClusterQueue that a scrape reports not active (``cluster_queue_status`` pending or
    terminated: it admits nothing) has, of its quota, only the GPUs it still holds (reserved, else
    used: workloads admitted before, running to their end) as capacity, busy, none idle or lent (its
    pending GPUs are still demand); without a status, as active. ``capacity_coverage`` = the share of the hour that scrapes
    with the GPU quota stand for, the least over the window's clusters (0 for one without any). The
    GPU resources are ``kueue_resources`` (default ``nvidia.com/gpu``; a list, ``*`` globs, each
    unit one GPU). The figures: demand =
    ``resource_pending`` of the GPU resources (else pending workloads x
    ``kueue_gpus_per_workload`` when the caller knows it; 0 with no pending workload, else unknown:
    null: DCR null, severity Unknown), pending_jobs = pending workloads (active + inadmissible), capacity per flavor:
    total = nominal quota, busy = usage, idle = max(quota - held, 0) per pool a quota can be lent
    in (the ClusterQueues of a cohort together, a queue without a cohort alone) and per resource,
    so that a queue borrowing another's unused quota uses it up -- held = the reservation (quota of
    workloads admitted or waiting on their admission checks), else the usage where a scrape has no
    reservation series; ``mean_wait_s`` = admission wait of the
    workloads admitted in the hour (count-weighted interval means).

Top contributors (``metrics/demand_top_contributors``): per window (day), the idle GPU-hours by
``device_class``, ``owner`` (``user`` = owner@uid_domain, else ``owner``), ``project``, ``schedd``
(the HTCondor queue) and, for Kueue, ``cluster_queue``; ``share`` of the source's total, ``rank``
1..10 (ties by key). Missing keys read ``(none)``. A Kueue queue's GPU-hours follow the hourly
demand's definition: per scrape its part of the cluster's demand, taken as that demand is (its
``resource_pending`` when the scrape has the series, 0 without a sample of its own; else its pending
workloads x ``kueue_gpus_per_workload``; 0 with no pending workload), averaged over the cluster's
scrapes of the hour whose demand is known, time-weighted as the hourly mean (a scrape with neither
series, or with pending workloads and no GPUs-per-workload, is left out, as the hourly mean leaves
it out), x the hour's length. So
over all queues an hour adds up to its Kueue ``demand_gpus``, and the day to the hours' GPU-hours;
a cluster-hour whose demand is unknown makes the hour's ``demand_gpus`` null and adds no GPU-hours.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from gpu_pipeline.lib.db import exact_sum, exact_weighted_avg
from gpu_pipeline.lib.gpu_requirements import ANY_DEVICE, DEVICE_WORD, UnreadableExpression, device_class_of
from gpu_pipeline.lib.kueue import KUEUE_DEMAND, OUTAGE_FACTOR
from gpu_pipeline.lib.schemas import GPU_STATES, JOBS, TS, TableSpec, _f, conform
from gpu_pipeline.lib.states import BUCKET
from gpu_pipeline.lib.store import Store, connect

HOUR = dt.timedelta(hours=1)
EPSILON = 1e-6
DCR_MAX = 1e6
DCR_SCALE = 4.0
WAIT_SCALE_S = 4 * 3600.0
GAP_SCALE_PP = 100.0
TOP_N = 10
JOBS_LOOKBACK_DAYS = 14
ALL_DEVICES = "ALL"
UNKNOWN_DEVICE = "unknown"
NO_KEY = "(none)"
SOURCES: tuple[str, ...] = ("htcondor", "kueue")
UNKNOWN_SEVERITY = "Unknown"
SEVERITIES: tuple[str, ...] = ("Healthy", "Moderate", "Warning", "Critical", UNKNOWN_SEVERITY)
DIMENSIONS: tuple[str, ...] = ("device_class", "owner", "project", "schedd", "cluster_queue")
KUEUE_GPU_RESOURCE = "nvidia.com/gpu"
_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9._/*-]+$")


def kueue_gpu_resources(text: str | None, what: str = "GPU resource names") -> tuple[str, ...]:
    """Kubernetes resource names counted as GPUs in Kueue's metrics, from a comma-separated list
    (``*`` matches any characters: ``nvidia.com/mig-*``); each unit of each counts as one GPU.
    Empty: :data:`KUEUE_GPU_RESOURCE`. A name with other characters raises ``ValueError`` naming
    ``what``."""
    return _checked_resources(tuple(dict.fromkeys(n.strip() for n in (text or "").split(",") if n.strip())),
                              what)


def _checked_resources(names: Sequence[str], what: str = "GPU resource names") -> tuple[str, ...]:
    """``names`` (:data:`KUEUE_GPU_RESOURCE` when none), each a valid extended resource name; else
    ``ValueError`` naming ``what``."""
    bad = [n for n in names if not _RESOURCE_NAME.match(n)]
    if bad:
        raise ValueError(f"{what}: {bad[0]!r} is not a resource name (letters, digits, . _ / - and * only)")
    # a GPU is an extended resource, <domain>/<name>: a bare * (or cpu) would count cpu and memory
    bare = [n for n in names if "/" not in n.strip("*/") or n.split("/", 1)[0].strip("*") == ""]
    if bare:
        raise ValueError(f"{what}: {bare[0]!r} is not an extended resource name (<domain>/<name>, "
                         "as nvidia.com/gpu)")
    return tuple(names) or (KUEUE_GPU_RESOURCE,)


def _gpu_resource_sql(names: Sequence[str], column: str = "resource") -> str:
    """SQL: ``column`` is one of the resource names (checked by :func:`_checked_resources`: no quote
    can be in them; ``_`` is escaped, ``*`` is LIKE's ``%``)."""
    parts = []
    for n in names:
        if "*" in n:
            pattern = n.replace("_", "\\_").replace("*", "%")
            parts.append(f"{column} LIKE '{pattern}' ESCAPE '\\'")
        else:
            parts.append(f"{column} = '{n}'")
    return "(" + " OR ".join(parts) + ")"
#: A Kueue scrape stands for the time until its cluster's next scrape, unless that is more than this many
#: times the cluster's median scrape interval away (a gap, as DESIGN 5.7 counts gaps; the median as the
#: coverage module takes it): it then stands for one median interval, so an outage is not filled with
#: the last value seen.
KUEUE_HOLD_GAP_FACTOR = OUTAGE_FACTOR  # 3, the factor of the Kueue table's outages (against the intervals beside)
#: ... and never for more than this (a scrape hours old is not the present; 10:00 and 16:00 alone
#: stand for 10-11 and 16-17).
KUEUE_MAX_HOLD = dt.timedelta(hours=1)

DEMAND_CAPACITY = TableSpec(
    layer="metrics",
    name="demand_capacity",
    description=(
        "Demand vs capacity per hour and device class (DESIGN.md 5.6): idle-job GPU demand from job "
        "records (or Kueue), idle / busy GPUs from the 5-minute states, demand-capacity ratio (DCR), "
        "queue pressure (QPS) and contention index (CIS) with fixed normalization scales, severity."
    ),
    key=("hour_start_utc", "source", "device_class"),
    version=2,
    schema=pa.schema(
        [
            _f("hour_start_utc", TS, "Start of the hour (UTC)", nullable=False),
            _f("source", pa.string(), "htcondor (job records + slot states) or kueue", nullable=False),
            _f("device_class", pa.string(), "GPU model name, or ALL = the whole pool (jobs that name "
               "no device, class ANY, count only here)", nullable=False),
            _f("demand_gpus", pa.float64(), "GPUs requested by idle jobs, time-weighted mean over the "
               "hour"),
            _f("pending_jobs", pa.float64(), "Idle jobs (Kueue: pending workloads), time-weighted mean"),
            _f("mean_wait_s", pa.float64(), "Mean wait so far of the jobs idle in the hour (Kueue: mean "
               "admission wait of workloads admitted in the hour); null when none"),
            _f("idle_gpus", pa.float64(), "Unclaimed GPUs (idle_prioritized + idle_shared + "
               "idle_backfill), time-weighted mean over the hour's buckets seen in a snapshot; null "
               "when none was (capacity unknown)"),
            _f("idle_open_gpus", pa.float64(), "Idle GPUs open to any job (idle_shared + idle_backfill), "
               "time-weighted mean (as idle_gpus)"),
            _f("busy_gpus", pa.float64(), "Claimed GPUs (busy_*), time-weighted mean (as idle_gpus)"),
            _f("total_gpus", pa.float64(), "idle + busy GPUs (na excluded), time-weighted mean (as "
               "idle_gpus)"),
            _f("capacity_coverage", pa.float64(), "Share of the hour whose 5-minute buckets had a slot "
               "snapshot (htcondor); for kueue the share of the hour that scrapes with the GPU quota "
               "stand for, the least over the clusters (0-1)"),
            _f("allocation_pct", pa.float64(), "100 * busy_gpus / total_gpus (null when total is 0 or "
               "unknown)"),
            _f("dcr", pa.float64(), "Demand-capacity ratio demand_gpus / max(idle_gpus, 1e-6), capped "
               "at 1e6; null when demand or capacity is unknown"),
            _f("dcr_capped", pa.bool_(), "The uncapped DCR reached 1e6 (demand with zero idle GPUs)",
               nullable=False),
            _f("zero_idle", pa.bool_(), "No idle GPU during the hour (null when capacity is unknown)"),
            _f("efficiency_gap_pp", pa.float64(), "Efficiency gap util - RFU (pp) when an efficiency "
               "input is given; null otherwise (its CIS term is then 0)"),
            _f("qps", pa.float64(), "Queue pressure 0.6 min(demand/total, 1) + 0.4 min(wait/4h, 1); null "
               "when DCR is"),
            _f("cis", pa.float64(), "Contention index 0.5 min(DCR/4, 1) + 0.3 min(max(gap,0)/100, 1) + "
               "0.2 QPS; null when DCR is"),
            _f("severity", pa.string(), "Critical (CIS > 0.7 or DCR > 2), Warning (CIS > 0.5 or DCR > 1), "
               "Moderate (CIS > 0.3), Healthy, or Unknown (demand or capacity unknown: DCR null)",
               nullable=False),
        ]
    ),
)

DEMAND_TOP_CONTRIBUTORS = TableSpec(
    layer="metrics",
    name="demand_top_contributors",
    description=(
        "Who and what queued GPU demand came from, per day: idle GPU-hours of the top 10 keys per "
        "dimension (device class, owner, project, schedd; Kueue cluster queue) and their share."
    ),
    key=("day_start_utc", "source", "dimension", "rank"),
    schema=pa.schema(
        [
            _f("day_start_utc", TS, "Start of the day (partition window) (UTC)", nullable=False),
            _f("source", pa.string(), "htcondor or kueue", nullable=False),
            _f("dimension", pa.string(), "One of " + ", ".join(DIMENSIONS), nullable=False),
            _f("key", pa.string(), "Value of the dimension ('(none)' when the records lack it)",
               nullable=False),
            _f("demand_gpu_hours", pa.float64(), "GPU-hours requested by idle jobs of the key in the day",
               nullable=False),
            _f("share", pa.float64(), "demand_gpu_hours / the source's total of the day (0-1)",
               nullable=False),
            _f("jobs", pa.int64(), "Distinct jobs idle during the day (null for Kueue)"),
            _f("rank", pa.int32(), "1 = largest demand; ties by key", nullable=False),
        ]
    ),
)

IDLE_INTERVALS = pa.schema(
    [
        _f("global_job_id", pa.string(), "Job", nullable=False),
        _f("reason", pa.string(), "first_run (queued -> run 0), requeued (between runs), "
           "after_last_run (idle after an unfinished run), never_started", nullable=False),
        _f("idle_start_utc", TS, "When the job became idle (unclipped)", nullable=False),
        _f("start_utc", TS, "Interval start clipped to the window", nullable=False),
        _f("end_utc", TS, "Interval end clipped to the window", nullable=False),
        _f("open_end", pa.bool_(), "The end is the window end because the job was still idle (no "
           "record or slot snapshot ended the wait)",
           nullable=False),
        _f("request_gpus", pa.float64(), "RequestGPUs", nullable=False),
        _f("device_class", pa.string(), "Device the job can use (ANY when it names none)", nullable=False),
        _f("owner", pa.string(), "user (owner@uid_domain), else owner"),
        _f("project", pa.string(), "ProjectName"),
        _f("schedd", pa.string(), "Schedd"),
    ]
)

# The columns of clean/jobs the interval SQL reads (its temp table copies only these, and the device class).
_INTERVAL_JOB_COLUMNS = ", ".join((
    "global_job_id", "run_index", "doc_kind", "record_utc", "job_status", "run_end_utc", "source", "request_gpus",
    "queued_utc", '"user"', "owner", "project", "schedd", "run_start_utc", "last_vacate_utc", "completion_utc",
    "status_entered_utc", "vacate_reason_code",
))
# Columns added since (clean/jobs version 4) that an in-memory jobs relation may lack: read as null there.
_INTERVAL_OPTIONAL_COLUMNS = (("last_job_status", "INTEGER"), ("first_start_utc", "TIMESTAMPTZ"))

_INTERVALS_SQL = """
WITH
params AS (
    SELECT epoch_us(CAST($start AS TIMESTAMPTZ)) AS s_us, epoch_us(CAST($end AS TIMESTAMPTZ)) AS e_us
),
j AS (
    -- every row of a job that asks for a GPU (DESIGN 4.4: RequestGPUs >= 1) in any of its records: a
    -- later record without the attribute (an unevaluated expression) still says it left the queue
    SELECT *
    FROM job_rows
    WHERE global_job_id IN (SELECT global_job_id FROM job_rows WHERE request_gpus >= 1)
    QUALIFY row_number() OVER (
        PARTITION BY global_job_id, run_index, doc_kind
        ORDER BY record_utc DESC NULLS LAST, job_status DESC NULLS LAST, run_end_utc DESC NULLS LAST,
                 source
    ) = 1
),
info AS (
    SELECT global_job_id,
        coalesce(epoch_us(min(queued_utc)),
                 TRY_CAST(split_part(any_value(global_job_id), '#', 3) AS BIGINT) * 1000000) AS q_us,
        arg_max(request_gpus, (coalesce(epoch_us(record_utc), 0), doc_kind = 'epoch', run_index))
            FILTER (WHERE request_gpus >= 1) AS request_gpus,
        coalesce(arg_max(device_class_in, coalesce(epoch_us(record_utc), 0))
                 FILTER (WHERE device_class_in IS NOT NULL), '{any}') AS device_class,
        arg_max(coalesce("user", owner), coalesce(epoch_us(record_utc), 0))
            FILTER (WHERE coalesce("user", owner) IS NOT NULL) AS who,
        arg_max(project, coalesce(epoch_us(record_utc), 0)) FILTER (WHERE project IS NOT NULL) AS project,
        arg_max(schedd, coalesce(epoch_us(record_utc), 0)) FILTER (WHERE schedd IS NOT NULL) AS schedd,
        arg_max(struct_pack(st := job_status, rec := epoch_us(record_utc), ent := epoch_us(status_entered_utc),
                            lst := last_job_status),
                (coalesce(epoch_us(record_utc), 0), run_index, doc_kind = 'job')) AS latest,
        epoch_us(min(first_start_utc)) AS fs_us
    FROM j
    GROUP BY global_job_id
),
info2 AS (
    -- it left the queue (or stopped being idle: held) when it entered that status, where the record
    -- says (EnteredCurrentStatus), else by the record's time
    SELECT *, latest.st IN (3, 4, 5) AS has_left,
           CASE WHEN latest.st IN (3, 4, 5) THEN latest.ent END AS left_ent,
           CASE WHEN latest.st IN (3, 4, 5) THEN latest.rec END AS left_rec,
           -- removed while held (LastJobStatus 5): held, not idle, up to the removal
           coalesce(latest.st = 3 AND latest.lst = 5, false) AS removed_held
    FROM info
),
runs AS (
    SELECT global_job_id, run_index,
        epoch_us(arg_max(run_start_utc, doc_kind = 'epoch')) AS rs_us,
        epoch_us(arg_max(run_end_utc, doc_kind = 'epoch') FILTER (WHERE run_end_utc IS NOT NULL)) AS re_us,
        epoch_us(max(last_vacate_utc)) AS lv_us,
        bool_or(completion_utc IS NOT NULL OR job_status = 4) AS completed,
        -- the run's end sent the job back to Idle: its epoch written with the job Idle, or its vacate
        -- an eviction's (a reason code from 1000 on, the job's removal, 1023, aside; a hold's is below)
        coalesce(bool_or((doc_kind = 'epoch' AND job_status = 1)
                         OR (vacate_reason_code >= 1000 AND vacate_reason_code <> 1023)), false) AS went_idle
    FROM j
    WHERE run_start_utc IS NOT NULL
    GROUP BY global_job_id, run_index
),
seq AS (
    SELECT *,
        lag(run_index) OVER w AS prev_index,
        lag(re_us) OVER w AS prev_re_us,
        row_number() OVER w = 1 AS is_first,
        lead(run_index) OVER w IS NULL AS is_last
    FROM runs
    WINDOW w AS (PARTITION BY global_job_id ORDER BY run_index)
),
raw_iv AS (
    -- waiting for run 0
    SELECT s.global_job_id, 'first_run' AS reason, i.q_us AS a_us, s.rs_us AS b_us, false AS open_end
    FROM seq s JOIN info2 i USING (global_job_id)
    WHERE s.is_first AND s.run_index = 0
    UNION ALL
    -- waiting for run 0 when no row of it is known (a job ad describes the last run): until the
    -- first start (JobStartDate) a later run's row carries
    SELECT s.global_job_id, 'first_run', i.q_us, i.fs_us, false
    FROM seq s JOIN info2 i USING (global_job_id)
    WHERE s.is_first AND s.run_index > 0 AND i.fs_us < s.rs_us
    UNION ALL
    -- re-queued between two known runs (or before the first known run, from its LastVacateTime)
    SELECT global_job_id, 'requeued',
        CASE
            WHEN prev_index = run_index - 1 AND prev_re_us IS NOT NULL THEN prev_re_us
            WHEN lv_us < rs_us AND (prev_re_us IS NULL OR lv_us >= prev_re_us) AND run_index > 0 THEN lv_us
        END,
        rs_us, false
    FROM seq
    WHERE NOT (is_first AND run_index = 0)
    UNION ALL
    -- idle again after the last known run, which ended without completing
    SELECT s.global_job_id, 'after_last_run', s.re_us,
        -- it entered the status it left in before the run ended (held or removed while running: the
        -- schedd sets the status before the shadow vacates), or a record that says it left before the
        -- run ended: it left at the run's end, no wait
        CASE WHEN NOT coalesce(i.has_left, false) THEN p.e_us
             WHEN i.left_ent IS NOT NULL THEN greatest(i.left_ent, s.re_us)
             WHEN i.left_rec >= s.re_us THEN i.left_rec
             ELSE s.re_us END,
        NOT coalesce(i.has_left, false)
    FROM seq s JOIN info2 i USING (global_job_id), params p
    WHERE s.is_last AND s.re_us IS NOT NULL AND NOT s.completed AND NOT (i.removed_held AND NOT s.went_idle)
    UNION ALL
    -- never started
    SELECT i.global_job_id, 'never_started', i.q_us,
        coalesce(CASE WHEN i.left_ent >= i.q_us THEN i.left_ent END, i.left_rec, p.e_us),
        i.left_ent IS NULL AND i.left_rec IS NULL
    FROM info2 i, params p
    WHERE i.global_job_id NOT IN (SELECT global_job_id FROM runs)
),
-- a wait with no end in the records ends where a slot snapshot sees the job running again
seen_running AS (
    SELECT r.global_job_id, r.reason, r.a_us, min(s.seen_us) AS seen_us
    FROM raw_iv r JOIN job_running s
      ON s.global_job_id = r.global_job_id AND s.seen_us > r.a_us AND s.seen_us < r.b_us
    WHERE r.open_end
    GROUP BY ALL
),
ended_iv AS (
    SELECT r.global_job_id, r.reason, r.a_us, coalesce(s.seen_us, r.b_us) AS b_us,
        r.open_end AND s.seen_us IS NULL AS open_end
    FROM raw_iv r LEFT JOIN seen_running s USING (global_job_id, reason, a_us)
)
SELECT
    r.global_job_id,
    r.reason,
    make_timestamptz(r.a_us) AS idle_start_utc,
    make_timestamptz(greatest(r.a_us, p.s_us)) AS start_utc,
    make_timestamptz(least(r.b_us, p.e_us)) AS end_utc,
    r.open_end AND r.b_us >= p.e_us AS open_end,
    i.request_gpus,
    i.device_class,
    i.who AS owner,
    i.project,
    i.schedd
FROM ended_iv r JOIN info2 i USING (global_job_id), params p
WHERE r.a_us IS NOT NULL AND r.b_us IS NOT NULL
  AND greatest(r.a_us, p.s_us) < least(r.b_us, p.e_us)
ORDER BY r.global_job_id, r.a_us
"""

_CAPACITY_SQL = """
WITH
params AS (
    SELECT epoch_us(CAST($start AS TIMESTAMPTZ)) AS s_us, epoch_us(CAST($end AS TIMESTAMPTZ)) AS e_us,
           CAST($hour_us AS BIGINT) AS h_us, CAST($bucket_us AS BIGINT) AS b_us
),
hours AS (
    SELECT generate_series AS h_start, least(generate_series + p.h_us, p.e_us) - generate_series AS h_len
    FROM params p, generate_series(p.s_us, p.e_us - 1, p.h_us)
),
st AS (
    SELECT p.s_us + ((epoch_us(bucket_start_utc) - p.s_us) // p.h_us) * p.h_us AS h_start,
           epoch_us(bucket_start_utc) AS b_start, coalesce(device_name, '{unknown}') AS device_name, state,
           na_reason IS DISTINCT FROM 'no_snapshot' AS seen
    FROM gpu_state_rows, params p
    WHERE epoch_us(bucket_start_utc) >= p.s_us AND epoch_us(bucket_start_utc) < p.e_us
),
-- the hour's buckets whose states come from a snapshot: capacity is a mean over these only, so a
-- collector outage reads as unknown capacity, not as zero GPUs
seen AS (
    SELECT h_start, count(DISTINCT b_start) FILTER (WHERE seen) AS n_seen FROM st GROUP BY h_start
),
cap AS (
    SELECT h_start,
        CASE WHEN grouping(device_name) = 1 THEN '{all}' ELSE device_name END AS device_class,
        count(*) FILTER (WHERE state IN ('idle_prioritized', 'idle_shared', 'idle_backfill')) AS idle_n,
        count(*) FILTER (WHERE state IN ('idle_shared', 'idle_backfill')) AS idle_open_n,
        count(*) FILTER (WHERE state LIKE 'busy%') AS busy_n
    FROM st
    GROUP BY GROUPING SETS ((h_start, device_name), (h_start))
),
iv AS (
    SELECT epoch_us(start_utc) AS a_us, epoch_us(end_utc) AS b_us, epoch_us(idle_start_utc) AS q_us,
           request_gpus, device_class
    FROM idle_iv
),
iv_h AS (
    SELECT h.h_start, h.h_len, iv.device_class, iv.request_gpus, iv.q_us,
           least(iv.b_us, h.h_start + h.h_len) AS until_us,
           least(iv.b_us, h.h_start + h.h_len) - greatest(iv.a_us, h.h_start) AS overlap_us
    FROM iv JOIN hours h ON iv.a_us < h.h_start + h.h_len AND iv.b_us > h.h_start
),
dem AS (
    SELECT h_start,
        CASE WHEN grouping(device_class) = 1 THEN '{all}' ELSE device_class END AS device_class,
        {gpu_us} AS gpu_us,
        sum(overlap_us) AS job_us,
        sum(until_us - q_us) AS wait_us,
        count(*) AS n_iv
    FROM iv_h
    GROUP BY GROUPING SETS ((h_start, device_class), (h_start))
),
present AS (
    -- per hour: the devices of that hour's states and the classes its demand names (+ ALL), so an
    -- hour's rows depend on that hour's data only (not on the other days computed with it)
    SELECT h_start, device_class FROM cap
    UNION SELECT h_start, device_class FROM dem WHERE device_class <> '{any}'
),
grid AS (SELECT h.h_start, h.h_len, c.device_class FROM hours h JOIN present c ON c.h_start = h.h_start)
SELECT
    make_timestamptz(g.h_start) AS hour_start_utc,
    'htcondor' AS source,
    g.device_class,
    coalesce(d.gpu_us, 0) / g.h_len AS demand_gpus,
    coalesce(d.job_us, 0) / g.h_len AS pending_jobs,
    d.wait_us / d.n_iv / 1e6 AS mean_wait_s,
    coalesce(c.idle_n, 0) / nullif(sn.n_seen, 0) AS idle_gpus,
    coalesce(c.idle_open_n, 0) / nullif(sn.n_seen, 0) AS idle_open_gpus,
    coalesce(c.busy_n, 0) / nullif(sn.n_seen, 0) AS busy_gpus,
    (coalesce(c.idle_n, 0) + coalesce(c.busy_n, 0)) / nullif(sn.n_seen, 0) AS total_gpus,
    least(coalesce(sn.n_seen, 0) * p.b_us / g.h_len, 1.0) AS capacity_coverage
FROM grid g
CROSS JOIN params p
LEFT JOIN seen sn ON sn.h_start = g.h_start
LEFT JOIN cap c ON c.h_start = g.h_start AND c.device_class = g.device_class
LEFT JOIN dem d ON d.h_start = g.h_start AND d.device_class = g.device_class
"""

# The Kueue sums and means, the same on every run (lib.db.exact_sum)
_GPU_ROWS = "kind = 'resource' AND {gpu_resource}"
# A cluster's pending GPUs in one scrape: pending GPUs (the pending-resources series), else pending
# workloads x GPUs a workload; no pending workload is no demand; else unknown (NULL: the scrape is
# left out of the hour's mean). The hourly demand and the top contributors both read it.
_SCRAPE_DEMAND = ("coalesce(pending_gpus, pending_wl * (SELECT gpw FROM params), "
                  "CASE WHEN pending_wl = 0 THEN 0.0 END)")


# A ClusterQueue row of a queue that is not active (its status at 1 in the scrape; NULL: unknown, active)
_INACTIVE_QUEUE = "coalesce(cluster_queue_status <> 'active', false)"


# Each Kueue scrape's weight in each hour of the window (``scrape_w``: cluster, t_us, h_start, w in
# seconds, own_hour), from ``{src}`` (rows with cluster and sample_utc) and ``params`` (s_us, e_us, h_us):
# a scrape stands for the time until its cluster's next scrape -- one median interval where the next
# is more than KUEUE_HOLD_GAP_FACTOR intervals away, or after the last; until the end of its hour when
# the cluster has one scrape; at most KUEUE_MAX_HOLD -- clipped to the window, and that span is split
# at the hours.
_SCRAPE_WEIGHTS_SQL = f"""
scrape_t AS (SELECT DISTINCT cluster, epoch_us(sample_utc) AS t_us FROM {{src}}),
scrape_next AS (
    SELECT cluster, t_us, lead(t_us) OVER (PARTITION BY cluster ORDER BY t_us) AS next_us FROM scrape_t
),
scrape_cad AS (
    SELECT cluster, median(next_us - t_us) AS c_us FROM scrape_next WHERE next_us IS NOT NULL GROUP BY cluster
),
scrape_span AS (
    SELECT n.cluster, n.t_us,
        least(CASE WHEN n.next_us - n.t_us <= {KUEUE_HOLD_GAP_FACTOR} * c.c_us THEN n.next_us
                   WHEN c.c_us IS NOT NULL THEN n.t_us + c.c_us
                   ELSE p.s_us + ((n.t_us - p.s_us) // p.h_us + 1) * p.h_us END,
              n.t_us + {int(KUEUE_MAX_HOLD / dt.timedelta(microseconds=1))}, p.e_us) AS end_us,
        p.s_us + ((n.t_us - p.s_us) // p.h_us) * p.h_us AS own_h
    FROM scrape_next n
    LEFT JOIN scrape_cad c ON c.cluster IS NOT DISTINCT FROM n.cluster  -- a cluster may be NULL
    CROSS JOIN params p
),
scrape_hours AS (
    SELECT generate_series AS h_start, least(generate_series + p.h_us, p.e_us) - generate_series AS h_len
    FROM params p, generate_series(p.s_us, p.e_us - 1, p.h_us)
),
scrape_w AS (
    SELECT s.cluster, s.t_us, h.h_start, h.h_start = s.own_h AS own_hour,
        (least(s.end_us, h.h_start + p.h_us) - greatest(s.t_us, h.h_start)) / 1e6 AS w
    FROM scrape_span s CROSS JOIN params p
    JOIN scrape_hours h ON h.h_start < s.end_us AND h.h_start + p.h_us > s.t_us
)"""

_KUEUE_SUMS = {
    "pending_gpus": exact_sum("resource_pending", _GPU_ROWS),
    "pending_wl": exact_sum("pending_workloads", "kind = 'queue'"),
    "usage": exact_sum("resource_usage", f"{_GPU_ROWS} AND flavor IS NOT NULL"),
    "quota": exact_sum("nominal_quota", f"{_GPU_ROWS} AND flavor IS NOT NULL"),
    # idle per pool a quota can be lent in (the root of the ClusterQueue's cohort tree, else its
    # cohort, else the queue alone) and
    # flavor: a queue borrowing another's unused quota uses it up (summing max(quota - usage, 0) per
    # queue counted it idle and busy at once)
    "pool_quota": exact_sum("coalesce(nominal_quota, 0)"),
    # the quota held: reserved (admitted, and admitted pending its admission checks: a
    # ProvisioningRequest, MultiKueue), else used where the scrape has no reservation series
    "pool_usage": exact_sum("coalesce(resource_reservation, resource_usage, 0)"),
    "idle": exact_sum("greatest(quota - usage, 0)"),
    "wait_sum": exact_sum("wait_mean_s * wait_count_interval", "kind = 'admission_wait'"),
    "wait_n": exact_sum("wait_count_interval", "kind = 'admission_wait' AND wait_mean_s IS NOT NULL"),
    # time-weighted means over the hour (w: the seconds of the hour a scrape stands for); a scrape
    # whose value is unknown is left out of both sums
    "avg_demand": exact_weighted_avg("demand", "w"),
    "avg_pending_wl": exact_weighted_avg("pending_wl", "w"),
    # admissions are counted in the hour of the scrape that saw them, once
    "sum_wait_sum": exact_sum("wait_sum", "own_hour"),
    "sum_wait_n": exact_sum("wait_n", "own_hour"),
    "avg_idle": exact_weighted_avg("idle", "w"),
    "avg_usage": exact_weighted_avg("usage", "w"),
    "avg_quota": exact_weighted_avg("quota", "w"),
    "cap_w": f"coalesce({exact_sum('w', 'idle IS NOT NULL')}, 0.0)",
    # the clusters' hourly figures added up (a cluster whose demand is unknown makes it unknown)
    "all_demand": f"CASE WHEN count(demand) = count(*) THEN {exact_sum('demand')} END",
    "all_pending": exact_sum("pending"),
    "all_wait_sum": exact_sum("wait_sum"),
    "all_wait_n": exact_sum("wait_n"),
    # capacity is known where every cluster's is: no GPU quota series in a cluster's scrapes (the
    # optional ClusterQueue resource metrics off, or GPUs under another resource name) is unknown
    # capacity, not 0 GPUs (which made every hour with pending GPUs DCR 1e6, Critical)
    "all_idle": f"CASE WHEN count(idle) = count(*) THEN {exact_sum('idle')} END",
    "all_usage": f"CASE WHEN count(usage) = count(*) THEN {exact_sum('usage')} END",
    "all_quota": f"CASE WHEN count(quota) = count(*) THEN {exact_sum('quota')} END",
}

_KUEUE_SQL = """
WITH
params AS (
    SELECT epoch_us(CAST($start AS TIMESTAMPTZ)) AS s_us, epoch_us(CAST($end AS TIMESTAMPTZ)) AS e_us,
           CAST($hour_us AS BIGINT) AS h_us, CAST($gpus_per_workload AS DOUBLE) AS gpw,
           CAST($configured AS BOOLEAN) AS configured
),
-- a ClusterQueue that is not active (kueue_cluster_queue_status: pending, its flavor or admission
-- check missing; terminated, being deleted) admits nothing: of its quota only what it still holds
-- (reserved, else used: workloads admitted before, running to their end) is capacity, busy, none of it
-- idle or lent (known: a cluster whose queues are all inactive and hold nothing has 0 GPUs); its
-- pending GPUs are still demand; a queue without a status (an older Kueue, a day written before it
-- was read) counts as before
k AS (
    SELECT * REPLACE (
        CASE WHEN {inactive}
             THEN least(nominal_quota, greatest(coalesce(resource_reservation, resource_usage, 0.0),
                                                coalesce(resource_usage, 0.0)))
             ELSE nominal_quota END AS nominal_quota)
    FROM kueue_rows, params p
    WHERE scope = 'cluster_queue'
      AND epoch_us(sample_utc) >= p.s_us AND epoch_us(sample_utc) < p.e_us
),
pools AS (
    SELECT cluster, sample_utc, {pool_quota} AS quota, {pool_usage} AS usage
    FROM k
    WHERE kind = 'resource' AND {gpu_resource} AND flavor IS NOT NULL
    GROUP BY cluster, sample_utc, coalesce('cohort:' || coalesce(root_cohort, cohort), 'queue:' || cluster_queue),
             flavor, resource  -- a resource's quota is not another's (nvidia.com/gpu, a MIG profile)
),
pool_idle AS (
    SELECT cluster, sample_utc, {idle} AS idle FROM pools GROUP BY cluster, sample_utc
),
per_scrape AS (
    SELECT k.cluster, epoch_us(k.sample_utc) AS t_us,
        {pending_gpus} AS pending_gpus,
        {pending_wl} AS pending_wl,
        {usage} AS usage,
        {quota} AS quota,
        any_value(pi.idle) AS idle,
        {wait_sum} AS wait_sum,
        {wait_n} AS wait_n
    FROM k
    LEFT JOIN pool_idle pi  -- a cluster may be NULL (none configured): IS NOT DISTINCT FROM, not USING
      ON pi.sample_utc = k.sample_utc AND pi.cluster IS NOT DISTINCT FROM k.cluster
    GROUP BY k.cluster, k.sample_utc
),
{weights},
-- each scrape in each hour it stands for, with its demand as the hourly mean reads it
scrape_hour AS (
    SELECT w.h_start, w.w, w.own_hour, s.*, {scrape_demand} AS demand
    FROM per_scrape s
    JOIN scrape_w w ON w.t_us = s.t_us AND w.cluster IS NOT DISTINCT FROM s.cluster
),
-- each cluster's hour: the time-weighted mean over its scrapes (clusters are scraped at their own
-- instants)
per_cluster AS (
    SELECT h_start, cluster,
        {avg_demand} AS demand,
        {avg_pending_wl} AS pending,
        {sum_wait_sum} AS wait_sum,
        {sum_wait_n} AS wait_n,
        {avg_idle} AS idle,
        {avg_usage} AS usage,
        {avg_quota} AS quota,
        {cap_w} / any_value(h_len) * 1e6 AS cap_cov
    FROM scrape_hour JOIN scrape_hours USING (h_start)
    GROUP BY h_start, cluster
),
-- every cluster of the window in every hour of the window: a cluster no scrape stands for in an hour
-- (its collector down, or every collector) has unknown figures and coverage 0 there, not a silent
-- share of nothing or no row; a configured source without a row in the window (every scrape file
-- empty or unreadable: every curl failed) is one such cluster in every hour
cluster_hours AS (
    SELECT h.h_start, c.cluster
    FROM scrape_hours h CROSS JOIN (
        SELECT DISTINCT cluster FROM per_scrape
        UNION ALL
        SELECT NULL FROM params WHERE configured AND NOT EXISTS (SELECT 1 FROM per_scrape)
    ) c
),
all_clusters AS (
    SELECT ch.h_start, ch.cluster, pc.* EXCLUDE (h_start, cluster)
    FROM cluster_hours ch
    LEFT JOIN per_cluster pc ON pc.h_start = ch.h_start AND pc.cluster IS NOT DISTINCT FROM ch.cluster
)
SELECT
    make_timestamptz(h_start) AS hour_start_utc,
    'kueue' AS source,
    '{all}' AS device_class,
    {all_demand} AS demand_gpus,
    {all_pending} AS pending_jobs,
    {all_wait_sum} / nullif({all_wait_n}, 0) AS mean_wait_s,
    {all_idle} AS idle_gpus,
    {all_idle} AS idle_open_gpus,
    {all_usage} AS busy_gpus,
    {all_quota} AS total_gpus,
    least(min(coalesce(cap_cov, 0.0)), 1.0) AS capacity_coverage
FROM all_clusters
GROUP BY h_start
"""

_SCORE_SQL = f"""
WITH
base AS (
    SELECT b.*, e.efficiency_gap_pp,
        -- greatest() skips a NULL: unknown capacity must not become epsilon
        CASE WHEN b.idle_gpus IS NOT NULL THEN b.demand_gpus / greatest(b.idle_gpus, {EPSILON}) END AS dcr_raw
    FROM base_rows b
    -- the efficiency is the HTCondor pool's GPUs': a Kueue cluster's row has no gap of its own
    LEFT JOIN eff_rows e ON e.hour_start_utc = b.hour_start_utc AND e.device_class = b.device_class
                        AND b.source = 'htcondor'
),
scored AS (
    SELECT *,
        -- unknown demand or capacity (dcr_raw NULL) stays unknown: least() would skip the NULL
        CASE WHEN dcr_raw IS NOT NULL THEN least(dcr_raw, {DCR_MAX}) END AS dcr,
        CASE WHEN dcr_raw IS NOT NULL THEN
            0.6 * CASE WHEN total_gpus > 0 THEN least(demand_gpus / total_gpus, 1.0)
                       WHEN demand_gpus > 0 THEN 1.0 ELSE 0.0 END
            + 0.4 * least(coalesce(mean_wait_s, 0) / {WAIT_SCALE_S}, 1.0)
        END AS qps
    FROM base
),
scored2 AS (
    SELECT *,
        0.5 * least(dcr / {DCR_SCALE}, 1.0)
          + 0.3 * least(greatest(coalesce(efficiency_gap_pp, 0), 0) / {GAP_SCALE_PP}, 1.0)
          + 0.2 * qps AS cis
    FROM scored
)
SELECT
    hour_start_utc, source, device_class, demand_gpus, pending_jobs, mean_wait_s,
    idle_gpus, idle_open_gpus, busy_gpus, total_gpus, capacity_coverage,
    CASE WHEN total_gpus > 0 THEN 100.0 * busy_gpus / total_gpus END AS allocation_pct,
    dcr,
    -- >=: one GPU of demand over zero idle is 1 / 1e-6, the cap itself
    coalesce(dcr_raw >= {DCR_MAX}, false) AS dcr_capped,
    idle_gpus <= 0 AS zero_idle,
    efficiency_gap_pp,
    qps,
    cis,
    -- the thresholds compared with CIS to 9 decimals: a sum of terms that is 0.3 exactly on paper
    -- comes out 0.30000000000000004 in floating point, and was Moderate
    CASE
        WHEN dcr IS NULL THEN '{UNKNOWN_SEVERITY}'
        WHEN round(cis, 9) > 0.7 OR dcr > 2 THEN 'Critical'
        WHEN round(cis, 9) > 0.5 OR dcr > 1 THEN 'Warning'
        WHEN round(cis, 9) > 0.3 THEN 'Moderate'
        ELSE 'Healthy'
    END AS severity
FROM scored2
ORDER BY hour_start_utc, source, device_class = '{ALL_DEVICES}', device_class
"""

_TOP_SQL = f"""
WITH
params AS (SELECT CAST($top_n AS INTEGER) AS n),
iv AS (
    SELECT global_job_id, request_gpus * (epoch_us(end_utc) - epoch_us(start_utc)) / 3.6e9 AS gh,
           device_class, owner, project, schedd
    FROM idle_iv
),
long AS (
    SELECT 'device_class' AS dimension, device_class AS key, gh, global_job_id FROM iv
    UNION ALL SELECT 'owner', owner, gh, global_job_id FROM iv
    UNION ALL SELECT 'project', project, gh, global_job_id FROM iv
    UNION ALL SELECT 'schedd', schedd, gh, global_job_id FROM iv
),
agg AS (
    SELECT dimension, coalesce(key, '{NO_KEY}') AS key,
           {exact_sum("gh")} AS demand_gpu_hours, count(DISTINCT global_job_id) AS jobs
    FROM long GROUP BY ALL
),
total AS (SELECT {exact_sum("gh")} AS t FROM iv),
ranked AS (
    SELECT a.*, a.demand_gpu_hours / nullif(t.t, 0) AS share,
           row_number() OVER (PARTITION BY dimension ORDER BY demand_gpu_hours DESC, key) AS rank
    FROM agg a, total t
)
SELECT CAST($day_start AS TIMESTAMPTZ) AS day_start_utc, 'htcondor' AS source, dimension, key,
       demand_gpu_hours, coalesce(share, 0.0) AS share, jobs, CAST(rank AS INTEGER) AS rank
FROM ranked, params
WHERE rank <= params.n AND demand_gpu_hours > 0
ORDER BY list_position(['device_class', 'owner', 'project', 'schedd'], dimension), rank
"""

_KUEUE_TOP_SQL = f"""
WITH
params AS (
    SELECT epoch_us(CAST($start AS TIMESTAMPTZ)) AS s_us, epoch_us(CAST($end AS TIMESTAMPTZ)) AS e_us,
           CAST($hour_us AS BIGINT) AS h_us, CAST($top_n AS INTEGER) AS n,
           CAST($gpus_per_workload AS DOUBLE) AS gpw
),
cq AS (
    SELECT * FROM kueue_rows, params p
    WHERE scope = 'cluster_queue' AND epoch_us(sample_utc) >= p.s_us AND epoch_us(sample_utc) < p.e_us
),
-- each queue in each scrape: its pending GPUs and pending workloads (as the hourly demand sums them)
per_queue AS (
    SELECT cluster, epoch_us(sample_utc) AS t_us, coalesce(cluster_queue, '{NO_KEY}') AS key,
        {_KUEUE_SUMS['pending_gpus']} AS pending_gpus,
        {_KUEUE_SUMS['pending_wl']} AS pending_wl
    FROM cq
    GROUP BY cluster, sample_utc, coalesce(cluster_queue, '{NO_KEY}')
),
-- each cluster's scrape as the hourly demand reads it (_SCRAPE_DEMAND); NULL = nothing known about
-- its demand (neither series, or pending workloads without GPUs a workload): left out of the mean
scrape_sums AS (
    SELECT cluster, t_us,
        {exact_sum("pending_gpus")} AS pending_gpus,
        {exact_sum("pending_wl")} AS pending_wl
    FROM per_queue
    GROUP BY cluster, t_us
),
scrape_demand AS (SELECT *, {_SCRAPE_DEMAND} AS demand FROM scrape_sums),
{_SCRAPE_WEIGHTS_SQL.format(src="cq")},
-- each cluster's hour: the seconds its scrapes that carry demand stand for (the hourly mean's
-- denominator; clusters are scraped at their own instants)
scrapes AS (
    SELECT w.h_start, w.cluster, {exact_sum("w.w")} AS w_known
    FROM scrape_w w
    JOIN scrape_demand s ON s.t_us = w.t_us AND s.cluster IS NOT DISTINCT FROM w.cluster
    WHERE s.demand IS NOT NULL
    GROUP BY w.h_start, w.cluster
),
-- a queue's share of its scrape's demand, taken the way the scrape's demand is: its pending GPUs
-- when the scrape has the series (0 without a sample of its own), else its pending workloads x GPUs
-- a workload, else 0 (no pending workload); the shares add up to the scrape's demand
k AS (
    SELECT q.key, q.cluster, w.h_start, w.w,
        CASE WHEN s.pending_gpus IS NOT NULL THEN coalesce(q.pending_gpus, 0.0)
             WHEN s.pending_wl * p.gpw IS NOT NULL THEN coalesce(q.pending_wl, 0.0) * p.gpw
             ELSE 0.0 END AS pending
    FROM per_queue q
    JOIN scrape_demand s  -- a cluster may be NULL (none configured): IS NOT DISTINCT FROM
      ON s.t_us = q.t_us AND s.cluster IS NOT DISTINCT FROM q.cluster
    JOIN scrape_w w ON w.t_us = q.t_us AND w.cluster IS NOT DISTINCT FROM q.cluster
    CROSS JOIN params p
    WHERE s.demand IS NOT NULL
),
per_hour AS (
    -- the queue's time-weighted mean pending GPUs over its cluster's scrapes of the hour that carry
    -- demand x the hour's length = its GPU-hours (as the hourly demand: a cluster's mean, clusters
    -- added up)
    SELECT k.key, k.cluster, k.h_start, {exact_sum("k.pending * k.w")} / any_value(sc.w_known) AS pending
    FROM k JOIN scrapes sc ON sc.h_start = k.h_start AND sc.cluster IS NOT DISTINCT FROM k.cluster
    GROUP BY k.key, k.cluster, k.h_start
),
agg AS (
    SELECT ph.key, {exact_sum("ph.pending * h.h_len / 3.6e9")} AS demand_gpu_hours
    FROM per_hour ph JOIN scrape_hours h ON h.h_start = ph.h_start
    GROUP BY ph.key
),
total AS (SELECT {exact_sum("demand_gpu_hours")} AS t FROM agg),
ranked AS (
    SELECT a.*, a.demand_gpu_hours / nullif(t.t, 0) AS share,
           row_number() OVER (ORDER BY demand_gpu_hours DESC, key) AS rank
    FROM agg a, total t
)
SELECT CAST($day_start AS TIMESTAMPTZ) AS day_start_utc, 'kueue' AS source, 'cluster_queue' AS dimension,
       key, demand_gpu_hours, coalesce(share, 0.0) AS share, CAST(NULL AS BIGINT) AS jobs,
       CAST(rank AS INTEGER) AS rank
FROM ranked, params
WHERE rank <= params.n AND demand_gpu_hours > 0
ORDER BY rank
"""


@dataclass
class DemandResult:
    capacity: pa.Table  #: ``metrics/demand_capacity`` rows
    top: pa.Table  #: ``metrics/demand_top_contributors`` rows
    intervals: pa.Table  #: the job idle intervals (:data:`IDLE_INTERVALS`) behind the demand
    #: jobs of the window's demand whose requirements name a device attribute but cannot be read (ANY)
    unreadable_requirements: int = 0


def _us(delta: dt.timedelta) -> int:
    return int(delta / dt.timedelta(microseconds=1))


def _columns(con: duckdb.DuckDBPyConnection, from_sql: str, params: list) -> set[str]:
    return {c.lower() for c in con.sql(f"SELECT * FROM {from_sql} LIMIT 0", params=params).columns}


def job_idle_intervals(
    con: duckdb.DuckDBPyConnection,
    jobs_from_sql: str,
    jobs_params: list,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    states_from_sql: str | None = None,
    states_params: list | None = None,
    counts: dict[str, int] | None = None,
) -> pa.Table:
    """The idle (queued) intervals of GPU jobs inside ``[start_utc, end_utc)``, from clean job rows.

    ``jobs_from_sql`` should cover the window's days and :data:`JOBS_LOOKBACK_DAYS` before them;
    ``states_from_sql`` (``metrics/gpu_states`` of the window), where given, ends a wait that no
    record ends at the first snapshot that saw the job running, and names the device models a job's
    requirements are read against (the device class, :mod:`gpu_requirements`). ``counts``, where
    given, gets ``unreadable_requirements``: the jobs with an idle interval in the window whose
    requirements name a device attribute but cannot be read (class ``ANY``).
    """
    cols = _columns(con, jobs_from_sql, jobs_params)
    device_expr = "CAST(device_class AS VARCHAR)" if "device_class" in cols else "CAST(NULL AS VARCHAR)"
    # a requirement that names no device attribute cannot name a class: '' stands for it (Requirements
    # of a few hundred characters on every row of the look-back need not be copied)
    expr_cols = ", ".join(
        f"CASE WHEN contains(lower({c}), '{DEVICE_WORD}') THEN CAST({c} AS VARCHAR) WHEN {c} IS NOT NULL THEN '' END "
        f"AS {c}_in" if c in cols else f"CAST(NULL AS VARCHAR) AS {c}_in" for c in _REQUIREMENT_COLUMNS)
    optional = ", ".join(c if c in cols else f"CAST(NULL AS {t}) AS {c}" for c, t in _INTERVAL_OPTIONAL_COLUMNS)
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE job_rows AS SELECT {_INTERVAL_JOB_COLUMNS}, {optional}, "
        f"{device_expr} AS device_class_in, {expr_cols} FROM {jobs_from_sql}",
        jobs_params,
    )
    unreadable: set[str] = set()
    if "device_class" not in cols and any(c in cols for c in _REQUIREMENT_COLUMNS):
        unreadable = _requirement_classes(con, states_from_sql, states_params or [])
    running = ("SELECT DISTINCT global_job_id, epoch_us(snapshot_utc) AS seen_us "
               f"FROM {states_from_sql} WHERE state LIKE 'busy%' AND global_job_id IS NOT NULL "
               "AND snapshot_utc IS NOT NULL") if states_from_sql else \
        "SELECT CAST(NULL AS VARCHAR) AS global_job_id, CAST(NULL AS BIGINT) AS seen_us LIMIT 0"
    con.execute(f"CREATE OR REPLACE TEMP TABLE job_running AS {running}", states_params or [])
    try:
        table = con.sql(
            _INTERVALS_SQL.format(any=ANY_DEVICE),
            params={"start": start_utc, "end": end_utc},
        ).to_arrow_table()
    finally:
        con.execute("DROP TABLE IF EXISTS job_rows")
        con.execute("DROP TABLE IF EXISTS job_running")
    if counts is not None:  # the jobs of the window's demand only, each once
        counts["unreadable_requirements"] = len(unreadable & set(table.column("global_job_id").to_pylist()))
    return _cast(table, IDLE_INTERVALS)


_REQUIREMENT_COLUMNS = ("require_gpus", "requirements")


def _requirement_classes(con: duckdb.DuckDBPyConnection, states_from_sql: str | None, states_params: list) -> set[str]:
    """Fill ``job_rows.device_class_in`` of each GPU job from its requirements -- the latest
    ``require_gpus`` and the latest ``requirements`` its records hold, each on its own (a record
    without one, as an index may keep it, does not drop it) -- read against the device models of
    the window's states (none without them: every job ``ANY``). Returns the jobs whose requirements
    could not be read."""
    latest = ("arg_max({c}_in, (coalesce(epoch_us(record_utc), 0), run_index, doc_kind = 'job', {c}_in)) "
              "FILTER (WHERE {c}_in IS NOT NULL) AS {c}_last")
    con.execute(
        "CREATE OR REPLACE TEMP TABLE job_requirements AS SELECT global_job_id, "
        + ", ".join(latest.format(c=c) for c in _REQUIREMENT_COLUMNS)
        + " FROM job_rows WHERE global_job_id IN (SELECT global_job_id FROM job_rows WHERE request_gpus >= 1) "
        "GROUP BY global_job_id HAVING require_gpus_last IS NOT NULL OR requirements_last IS NOT NULL"
    )
    try:
        pairs = con.sql("SELECT DISTINCT require_gpus_last, requirements_last FROM job_requirements").fetchall()
        if not pairs:
            return set()
        devices = [] if states_from_sql is None else [r[0] for r in con.sql(
            f"SELECT DISTINCT device_name FROM {states_from_sql} WHERE device_name IS NOT NULL ORDER BY 1",
            params=states_params).fetchall()]
        classes, bad = [], []
        for require_gpus, requirements in pairs:
            try:
                classes.append(device_class_of(require_gpus, requirements, devices))
                bad.append(False)
            except UnreadableExpression:
                classes.append(ANY_DEVICE)
                bad.append(True)
        con.register("requirement_classes", pa.table({
            "rg": pa.array([p[0] for p in pairs], pa.string()), "rq": pa.array([p[1] for p in pairs], pa.string()),
            "cls": pa.array(classes, pa.string()), "bad": pa.array(bad, pa.bool_())}))
        join = ("job_requirements j JOIN requirement_classes c ON j.require_gpus_last IS NOT DISTINCT FROM c.rg "
                "AND j.requirements_last IS NOT DISTINCT FROM c.rq")
        try:
            con.execute(f"UPDATE job_rows SET device_class_in = c.cls FROM {join} "
                        "WHERE job_rows.global_job_id = j.global_job_id")
            unreadable = {r[0] for r in con.sql(f"SELECT j.global_job_id FROM {join} WHERE c.bad").fetchall()}
        finally:
            con.unregister("requirement_classes")
    finally:
        con.execute("DROP TABLE IF EXISTS job_requirements")
    return unreadable


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays(
        [table.column(f.name).cast(f.type) for f in schema], schema=schema
    )


def compute_demand_capacity(
    con: duckdb.DuckDBPyConnection,
    jobs_from_sql: str,
    jobs_params: list,
    states_from_sql: str,
    states_params: list,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    *,
    kueue_from_sql: str | None = None,
    kueue_params: list | None = None,
    kueue_gpus_per_workload: float | None = None,
    kueue_resources: Sequence[str] = (KUEUE_GPU_RESOURCE,),
    kueue_configured: bool = False,
    efficiency_from_sql: str | None = None,
    efficiency_params: list | None = None,
    top_n: int = TOP_N,
) -> DemandResult:
    """Demand-capacity rows per hour of ``[start_utc, end_utc)`` and the window's top contributors.

    FROM-clauses (with their parameter lists) as ``Store.relation_sql`` returns them:
    ``jobs_from_sql`` -- clean jobs of the window's days and the :data:`JOBS_LOOKBACK_DAYS` before;
    ``states_from_sql`` -- ``metrics/gpu_states`` of the window's days; optional ``kueue_from_sql``
    -- ``clean/kueue_demand`` rows (adds ``source = 'kueue'`` rows; ``kueue_resources``: the
    Kubernetes resource names counted as GPUs, :func:`kueue_gpu_resources`; ``kueue_configured``: a
    Kueue source is configured for the window, so a window without a Kueue row -- every scrape file
    empty or unreadable -- has its hours Unknown, coverage 0, rather than no Kueue row); optional
    ``efficiency_from_sql`` with ``hour_start_utc, device_class, efficiency_gap_pp``.
    Hours are ``start_utc + k h``; the top contributors cover the whole window (call per day).
    """
    counts: dict[str, int] = {}
    intervals = job_idle_intervals(con, jobs_from_sql, jobs_params, start_utc, end_utc, states_from_sql, states_params,
                                   counts)
    hour_us = _us(HOUR)
    con.register("idle_iv", intervals)
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE gpu_state_rows AS SELECT bucket_start_utc, device_name, state, na_reason "
        f"FROM {states_from_sql}",
        states_params,
    )
    try:
        base = con.sql(
            _CAPACITY_SQL.format(unknown=UNKNOWN_DEVICE, all=ALL_DEVICES, any=ANY_DEVICE,
                                 gpu_us=exact_sum("request_gpus * overlap_us")),
            params={"start": start_utc, "end": end_utc, "hour_us": hour_us, "bucket_us": _us(BUCKET)},
        ).to_arrow_table()
        top = con.sql(_TOP_SQL, params={"top_n": top_n, "day_start": start_utc}).to_arrow_table()
        parts, tops = [base], [top]
        if kueue_from_sql is not None:
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE kueue_rows AS SELECT * FROM {kueue_from_sql}",
                kueue_params or [],
            )
            if "cluster_queue_status" not in _columns(con, "kueue_rows", []):  # rows of an earlier version
                con.execute("ALTER TABLE kueue_rows ADD COLUMN cluster_queue_status VARCHAR")
            kp = {"start": start_utc, "end": end_utc, "hour_us": hour_us}
            gres = _gpu_resource_sql(_checked_resources(kueue_resources))
            parts.append(
                con.sql(
                    _KUEUE_SQL.format(all=ALL_DEVICES, gpu_resource=gres, scrape_demand=_SCRAPE_DEMAND,
                                      inactive=_INACTIVE_QUEUE, weights=_SCRAPE_WEIGHTS_SQL.format(src="k"),
                                      **_KUEUE_SUMS)
                    .replace("{gpu_resource}", gres),
                    params={**kp, "gpus_per_workload": kueue_gpus_per_workload,
                            "configured": bool(kueue_configured)},
                ).to_arrow_table()
            )
            tops.append(
                con.sql(_KUEUE_TOP_SQL.replace("{gpu_resource}", gres), params={**kp, "top_n": top_n, "day_start": start_utc,
                                                "gpus_per_workload": kueue_gpus_per_workload}).to_arrow_table()
            )
        base_rows = pa.concat_tables([_cast(p, _BASE_SCHEMA) for p in parts])
        con.register("base_rows", base_rows)
        if efficiency_from_sql is not None:
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE eff_rows AS SELECT CAST(hour_start_utc AS TIMESTAMPTZ) "
                f"AS hour_start_utc, CAST(device_class AS VARCHAR) AS device_class, "
                f"CAST(efficiency_gap_pp AS DOUBLE) AS efficiency_gap_pp FROM {efficiency_from_sql}",
                efficiency_params or [],
            )
        else:
            con.execute(
                "CREATE OR REPLACE TEMP TABLE eff_rows (hour_start_utc TIMESTAMPTZ, device_class VARCHAR, "
                "efficiency_gap_pp DOUBLE)"
            )
        capacity = con.sql(_SCORE_SQL).to_arrow_table()
    finally:
        for name in ("idle_iv", "base_rows"):
            con.unregister(name)
        for name in ("gpu_state_rows", "kueue_rows", "eff_rows"):
            con.execute(f"DROP TABLE IF EXISTS {name}")
    top_table = pa.concat_tables([conform(t, DEMAND_TOP_CONTRIBUTORS) for t in tops])
    return DemandResult(
        capacity=conform(capacity, DEMAND_CAPACITY),
        top=top_table,
        intervals=intervals,
        unreadable_requirements=counts.get("unreadable_requirements", 0),
    )


_BASE_SCHEMA = pa.schema(
    [
        ("hour_start_utc", TS),
        ("source", pa.string()),
        ("device_class", pa.string()),
        ("demand_gpus", pa.float64()),
        ("pending_jobs", pa.float64()),
        ("mean_wait_s", pa.float64()),
        ("idle_gpus", pa.float64()),
        ("idle_open_gpus", pa.float64()),
        ("busy_gpus", pa.float64()),
        ("total_gpus", pa.float64()),
        ("capacity_coverage", pa.float64()),
    ]
)


def efficiency_by_class_sql(from_sql: str) -> str:
    """A FROM-clause for ``efficiency_from_sql`` built from a per-GPU hourly efficiency relation
    (columns ``hour_start_utc``, ``device_name``, ``efficiency_gap_pp``; e.g. the per-GPU-hour
    efficiency metric of DESIGN.md 5.5): the mean gap of the GPUs with a value, per hour and device
    class, and over all devices as ``ALL`` (summed in sorted order: identical on every re-run)."""
    return (
        "(SELECT hour_start_utc, "
        f"CASE WHEN grouping(dc) = 1 THEN '{ALL_DEVICES}' ELSE dc END AS device_class, "
        "list_avg(list(efficiency_gap_pp ORDER BY efficiency_gap_pp) "
        "FILTER (WHERE efficiency_gap_pp IS NOT NULL)) AS efficiency_gap_pp "
        f"FROM (SELECT hour_start_utc, coalesce(device_name, '{UNKNOWN_DEVICE}') AS dc, "
        f"CAST(efficiency_gap_pp AS DOUBLE) AS efficiency_gap_pp FROM {from_sql}) "
        "GROUP BY GROUPING SETS ((hour_start_utc, dc), (hour_start_utc)))"
    )


def job_days(day: dt.date | str, lookback_days: int = JOBS_LOOKBACK_DAYS) -> list[str]:
    """Partition days of ``clean/jobs`` to read for ``day``: the lookback days, then the day."""
    d = dt.date.fromisoformat(day) if isinstance(day, str) else day
    return [(d - dt.timedelta(days=k)).isoformat() for k in range(lookback_days, -1, -1)]


def demand_for_day(store: Store, day: dt.date | str, start_utc: dt.datetime, end_utc: dt.datetime,
                   **kwargs) -> DemandResult:
    """One partition: clean jobs of ``day`` and its lookback days, the day's GPU states and, where the
    store has them, the day's Kueue rows. ``kwargs`` go to :func:`compute_demand_capacity`."""
    con = connect()
    try:
        jobs_sql, jobs_params = store.relation_sql(JOBS, job_days(day))
        states_sql, states_params = store.relation_sql(GPU_STATES, [day])
        kueue_sql, kueue_params = store.relation_sql(KUEUE_DEMAND, [day])
        return compute_demand_capacity(
            con, jobs_sql, jobs_params, states_sql, states_params, start_utc, end_utc,
            kueue_from_sql=kueue_sql, kueue_params=kueue_params, **kwargs,
        )
    finally:
        con.close()


def demand_from_tables(
    jobs: pa.Table,
    states: pa.Table,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    kueue: pa.Table | None = None,
    **kwargs,
) -> DemandResult:
    """Convenience for tests and small inputs: in-memory clean jobs, gpu_states (and Kueue) rows."""
    con = connect()
    try:
        con.register("jobs_in", jobs)
        con.register("states_in", states)
        if kueue is not None:
            con.register("kueue_in", kueue)
            kwargs.setdefault("kueue_from_sql", "kueue_in")
        return compute_demand_capacity(con, "jobs_in", [], "states_in", [], start_utc, end_utc, **kwargs)
    finally:
        con.close()
