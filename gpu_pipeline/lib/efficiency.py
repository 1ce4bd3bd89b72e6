"""Efficiency metrics (DESIGN.md 5.5): PIF, RFU and the efficiency gap per GPU-hour and per job run,
fleet RFU, energy, and "held but idle" GPUs.

Seed definitions (exact; users compare with them)
    ``PIF = clip(power_w / max_power_w, 0, 1)``; ``realized_tflops = achievable_tflops(model) * PIF``;
    ``rfu_pct = clip(100 * realized / achievable, 0, 100)``; ``efficiency_gap_pp = util_pct - rfu_pct``;
    ``efficiency_class``: util < 10 Idle; util >= 70 and PIF >= 0.75 Efficient; util >= 70 and
    PIF < 0.60 Bottlenecked; util >= 40 and PIF >= 0.50 Moderate; else Inefficient.
    A null utilization gives a null class; a known utilization >= 10 with no power (absent or NaN) gives
    a null PIF, RFU and class -- never a made-up 0. A power reading at or below 0 W is no power
    reading (no powered board reads 0 W: it is a broken exporter's 0, DESIGN 5.7), for PIF, RFU,
    energy and held-idle alike, the utilization staying as read; such readings of the sources read
    are counted (``zero_power_readings``). ``achievable_tflops`` comes from the spec table
    (:mod:`gpu_pipeline.lib.gpu_specs`; unknown model: 400 W / 100 TFLOPS, ``spec_known = false``).

``max_power_w``
    The sampled power limit (``power_limit_w``: nvidia-smi ``power.limit``, NVML) when the samples
    carry it (time-weighted mean over the hour / run), else the spec table's TDP, else the 400 W
    default; ``max_power_source`` says which (``sampled_limit`` / ``spec`` / ``default``). PIF of a
    GPU-hour (of a GPU in a job run) is the seed formula applied to its time-weighted mean power.

Samples and time weighting
    MIG instances are measured as their board (:func:`_mig_boards_sql`): one GPU under the board's
    short id, whose utilization is the share of its compute slices busy by the instances'
    GR_ENGINE_ACTIVE (they export no GPU_UTIL) and whose power is the board's, which each instance
    repeats (``mig_samples_on_boards``); an instance whose parent UUID the source does not give is
    skipped (``mig_samples_skipped``). Held-idle needs the board's id in the slot states, which list
    MIG devices instead, so a board has none. When one GPU is reported by several sources, each UTC
    hour uses one source: one with utilization readings in that hour before one without, then the
    one whose samples span most of the hour (whole minutes), then the one with most samples (no
    double counting; a GPU whose collector stopped at 06:00 while another went on is measured by the
    other from then on). Utilization and power come from that one source: a util-only source beats
    a power-only one, whose power the hour then lacks. Two samples of one GPU at one time (the same sample
    under two host names) are read once (``duplicate_samples_dropped``). A sample that repeats the
    GPU's previous reading of its source exactly -- the energy counter unmoved while the power read
    above 0, the same power and utilization -- is the exporter's cached reading read again (an
    exporter collecting every 30 s scraped every 15 s): it is dropped (``repeated_readings_dropped``),
    and the interval is measured between the readings. Kept, its segment took the trapezoid power
    while the next one took the counter's two steps at once: 1.5 times the energy. The cadence in force at a
    sample is the median interval between the GPU's consecutive samples in its UTC hour, where the
    hour has at least 5 of them, else over all its samples -- or, where larger, the cadence of the
    run its interval belongs to: consecutive intervals each within 1.5x of the one before, at
    least 5 of them, read as their shortest (a logger switched from 60 s to 10 s at 10:20 leaves no
    gaps in either part, though the hour's median is 10 s; a hole among short intervals, or up to
    four in a row, is still a hole). Two consecutive samples ``(t0, v0)``, ``(t1, v1)`` with
    ``t1 - t0 <= 3 x cadence`` form a
    *segment* covering ``[t0, t1)`` with value ``(v0 + v1) / 2`` (trapezoid; if one end is null, the
    other); a longer gap is a hole: nothing is extrapolated across it. Means (utilization, power,
    power limit) are over the segments' time, split exactly at hour / run / window boundaries;
    ``coverage_s`` is the segment time. An hour whose samples are all isolated (coverage 0) takes
    the plain mean of its samples.

Energy
    Per segment: the energy counter delta (DCGM ``TOTAL_ENERGY_CONSUMPTION``, mJ) when both ends have
    it, it moved (not backwards, a reset; and not unmoved: a counter stuck while the board drew
    power, or, with no power read, no energy read -- unknown, not 0 kWh), both ends are of one
    source, and the implied power is at most 2x the max power; else the
    trapezoid ``mean power x duration`` (null without a power reading). The counter is preferred
    because it integrates the board's own power between samples; ``energy_source`` says which was
    used (``counter`` / ``power`` / ``mixed``). A counter that lags the power readings -- unmoved
    from one sample to the next while the power read above 0 (or read none), then moving on at a
    later sample of the same source by at least :data:`STALL_CATCH_UP` of the trapezoid power's
    energy over the whole span the step covers, from the sample it stalled at to the one it moved
    at (the intervals with a power reading; with none read over the span there is nothing to
    compare, and the counter is all there is) (a counter updated less often than the samples are
    taken) -- is read as moving evenly between the reading it stayed at and the one it moved to
    (``counter_readings_interpolated``): the segments of the stall took the trapezoid power while the
    segment where it moved took the counter's whole step, so the stall's energy was counted twice
    (up to 1.5 times the energy when it moved every other sample). Not across a hole (an interval
    over 3x the shortest of the stall's), and not from the GPU's first sample read (the stall may
    have begun before it). A stall the counter steps on from that is not so read (a step under
    that share: the counter resumed without counting the stall; a hole; the first sample read)
    leaves the step's segment the trapezoid power too, where that segment has a power reading: the
    step may hold the stall's energy, which its segments took from the power (compared with the
    power at the stall's two ends only, a step over a falling power was refused and counted twice,
    +17 % on a board swinging 350 W / 60 W).

Held but idle
    A GPU whose 5-minute state (``metrics/gpu_states``; a sample takes the state of the bucket it falls
    in, buckets being 5-minute aligned) is Claimed (``busy_*``) while its power stays
    near idle -- every sample ``power_w <= 1.3 x idle_power_w(model)`` or ``PIF <= 0.2`` (against the
    sampled limit, else TDP) -- for at least 30 continuous minutes (same job, no gap over 3x cadence
    between samples; samples with no power reading -- after the GPU's first one -- neither extend
    nor break a run, however many in a row: the gaps are measured between all samples, a power
    reading above idle breaks it). Each sample stands for one cadence
    (up to the next sample), so the run ``[first, last + cadence)`` must last >= 1800 s. Utilization is
    deliberately not used: a held GPU may show a little utilization from a process that only holds
    memory. Samples up to one hour before and after the window are read (when the caller passes them:
    the asset passes the day before and the day after where they exist) so a run crossing midnight
    is judged on its full length and then clipped to the day (``clipped_*`` flags).
    The state is the bucket's, so a job that ended at 10:02 still names its GPU until 10:05. Where
    the job records (``jobs_sql``: the runs, as chosen for the job table, overlapping the window or
    its hour of look-around) give the named job's runs on the GPU -- runs listing the GPU in
    ``assigned_gpus``, or with no GPU list -- a sample counts only inside one of them
    (``run_start <= t < run_end``, runs of the job on the GPU merged where they overlap or touch), a
    held-idle run does not go on from one job run into another, and its last sample stands for its
    cadence only up to the job run's end: the run ends at ``min(last sample + cadence, job run
    end)``, so at the job's end exactly when the GPU stayed idle up to it. A job the records do not
    give on that GPU (no record read, none of its runs in the read range, or runs listing other GPUs
    only), and every job without ``jobs_sql``, keeps the state's extent: up to the end of the last
    bucket naming it. The other way round, a job that started at 10:02 is named from 10:05 on (the
    10:00 snapshot saw no claim, or the claim of a job that ended at 10:01): a sample that is no
    job's by the state (as just bounded), inside a run the records give on the GPU (listing it; a
    run with no GPU list, for a job the state names on that GPU) and in the bucket just before one
    naming the job, is that job's, so a held-idle run starts with the job's first sample. The
    records never make a GPU held where the state saw it unclaimed later on.

Jobs
    One row per GPU job run overlapping the window (a run with ``request_gpus = 0`` and no GPU
    list is a CPU job, and has none), from ``clean/jobs``: the ``epoch`` row of
    ``(global_job_id, run_index)`` when there is one, else its ``job`` row (latest ``record_utc``).
    The run is clipped to the window (``clipped_start`` / ``clipped_end``). A run whose record has no
    end (a queue snapshot's, which a later record of the job superseded, or one still running) ends
    at the earliest of: the job's next run's start, the job's ``last_vacate_utc`` after the
    run's start (any of its records), the start of another job's run listing one of its GPUs --
    else it is clipped at the window end. That end bounds its held-idle runs too (a run record
    without an end does not hold the GPU). Its GPUs are ``assigned_gpus`` (MIG ids counted in ``mig_devices``,
    not measured). ``sample_coverage`` = covered GPU-time / (GPUs x clipped run time); a run without
    telemetry has coverage 0 and null metrics. Means are time-weighted over its GPUs; ``rfu_pct`` is
    capability-weighted (sum realized / sum achievable over its GPUs' covered time); ``held_idle_s``
    is the GPU-time of held-idle runs whose state names this job. In the hourly table, ``held_idle_s``
    and ``held_but_idle`` are null (as ``state_busy_share``) for a GPU-hour without any
    ``gpu_states`` row and without held-idle time (a telemetry-only host): unknown, not "not held".

Fleet RFU
    ``100 x sum(realized_tflops x power_coverage_s) / sum(achievable_tflops x power_coverage_s)``
    over GPU-hours with a PIF, per day and per device class (:func:`fleet_rfu`,
    ``metrics/efficiency_daily``): an hour weighs the time its power was known, so an hour with two
    minutes of power readings does not weigh as a full one; the daily utilization likewise weighs
    ``util_coverage_s``. (Days written before these columns existed are weighed by ``coverage_s``.)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from gpu_pipeline.lib.coverage import series_time_order as _gpu_time_order
from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.db import exact_avg, exact_sum, exact_weighted_avg, spill_dir
from gpu_pipeline.lib.gpu_specs import UNKNOWN, name_map
from gpu_pipeline.lib.schemas import TS, TableSpec, _f, conform
from gpu_pipeline.lib.timeutil import epoch_us

# --------------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------------

IDLE_UTIL_PCT = 10.0
HIGH_UTIL_PCT = 70.0
MID_UTIL_PCT = 40.0
EFFICIENT_PIF = 0.75
BOTTLENECK_PIF = 0.60
MODERATE_PIF = 0.50
CLASSES: tuple[str, ...] = ("Idle", "Efficient", "Bottlenecked", "Moderate", "Inefficient")

GAP_FACTOR = 3.0  #: a gap longer than this many cadences is a hole
#: An hour with at least this many intervals between a GPU's samples has a cadence of its own.
LOCAL_CADENCE_MIN_INTERVALS = 5
COUNTER_MAX_POWER_FACTOR = 2.0  #: counter deltas implying more than this x max power are rejected
HELD_IDLE_MIN_S = 1800.0
HELD_IDLE_POWER_FACTOR = 1.3
HELD_IDLE_PIF_MAX = 0.2
HELD_IDLE_HOUR_S = 1800.0  #: a GPU-hour is ``held_but_idle`` when this much of it is in held-idle runs
LOOKAROUND = dt.timedelta(hours=1)  #: samples read beyond the window (for edge segments and runs)
STATE_BUCKET = dt.timedelta(minutes=5)
#: GPUs are taken in groups of about this many samples (of the window and its look-around), one group
#: held at a time (~100 bytes a sample staged, as much again while it is sorted). Each group reads
#: the files again: at 1,000 GPUs (3.1 M samples) 1.5 M made three groups, whose peak RSS over a
#: week was 625 MiB against 746 MiB with two (2 M), for 0.15-0.3 s a day more; 1 M makes four: the
#: step alone on a bench day peaked at 666-667 MiB against 747-756 MiB with three, its process's CPU
#: 12.6-13.1 s against 12.3-12.7 s (two runs each: within the noise). With three, a 7-day range run
#: had reached 1,039 MiB in this step (its run process 1,017), above the 1 GB bound.
GROUP_SAMPLES = 1_000_000
#: From this many GPU groups on, the groups' samples are read from the files once, into a temporary
#: Parquet file per group (in DuckDB's spill folder, removed after), instead of once a group, each
#: read a scan of all the window's samples for a share of them. At 10,000 GPUs (21 groups, DuckDB
#: under 1 GB) the reads took 20.8 s of a 47-49 s day; the one pass takes 7-8 s and the day 38-40 s.
#: It costs as much as 4-7 scans (at 1,000 GPUs, 3 groups: 0.59 s against 0.16 s a scan, and
#: 150 MiB more), so fewer groups keep their scans.
STAGE_ONCE_MIN_GROUPS = 8
_STAGE_CODEC = "lz4_raw"

_HOUR_US = 3_600_000_000
_US = 1_000_000

# --------------------------------------------------------------------------------------------------
# Table specs
# --------------------------------------------------------------------------------------------------

_CLASS_DOC = (
    "Idle (util < 10), Efficient (util >= 70, PIF >= 0.75), Bottlenecked (util >= 70, PIF < 0.60), "
    "Moderate (util >= 40, PIF >= 0.50), else Inefficient; null without utilization, or without power "
    "when util >= 10"
)

GPU_HOURLY_EFFICIENCY = TableSpec(
    layer="metrics",
    name="gpu_hourly_efficiency",
    description=(
        "Per GPU x UTC hour (clipped to the day): time-weighted utilization and power, PIF, RFU, efficiency "
        "gap and class (DESIGN.md 5.5), energy, and the share of the hour the GPU was claimed. A board in "
        "MIG mode is one GPU, its utilization the share of its compute slices busy (GR_ENGINE_ACTIVE)."
    ),
    key=("gpu_id", "hour_start_utc"),
    version=2,
    schema=pa.schema(
        [
            _f("gpu_id", pa.string(), "HTCondor short GPU id", nullable=False),
            _f("host", pa.string(), "Host of the GPU (most frequent in its samples)"),
            _f("device_name", pa.string(), "GPU model name as reported"),
            _f("hour_start_utc", TS, "Start of the hour: hours counted from the day's start, UTC hours "
               "unless the partition zone's offset is not whole hours", nullable=False),
            _f("samples", pa.int64(), "Samples of the GPU in the hour (one source)", nullable=False),
            _f("coverage_s", pa.float64(), "Time covered by sample segments (gaps <= 3x cadence) (s)",
               nullable=False),
            _f("util_coverage_s", pa.float64(), "Of coverage_s, the time with a utilization reading (s): "
               "util_pct's weight in daily and fleet means"),
            _f("power_coverage_s", pa.float64(), "Of coverage_s, the time with a power reading (s; a reading "
               "at or below 0 W is none): the weight of the hour's RFU in the fleet RFU"),
            _f("util_pct", pa.float64(), "Time-weighted mean GPU utilization (%)"),
            _f("power_w", pa.float64(), "Time-weighted mean power draw (W); a reading at or below 0 W is none "
               "(a broken exporter's 0), not an idle GPU"),
            _f("max_power_w", pa.float64(), "Denominator of PIF: sampled power limit, else spec TDP (W)",
               nullable=False),
            _f("max_power_source", pa.string(), "sampled_limit, spec or default", nullable=False),
            _f("pif", pa.float64(), "Power intensity factor clip(power_w / max_power_w, 0, 1)"),
            _f("achievable_tflops", pa.float64(), "Achievable TFLOPS of the model (spec table)",
               nullable=False),
            _f("realized_tflops", pa.float64(), "achievable_tflops x PIF"),
            _f("rfu_pct", pa.float64(), "Realized FLOPs utilization clip(100 x realized / achievable, 0, 100)"),
            _f("efficiency_gap_pp", pa.float64(), "util_pct - rfu_pct (percentage points)"),
            _f("efficiency_class", pa.string(), _CLASS_DOC),
            _f("energy_kwh", pa.float64(), "Energy in the hour: counter deltas, else trapezoid power (kWh); "
               "null where neither was read (a counter that did not move, without a power reading)"),
            _f("energy_source", pa.string(), "counter, power or mixed"),
            _f("spec_known", pa.bool_(), "The model is in the spec table", nullable=False),
            _f("state_busy_share", pa.float64(), "Share of the hour's 5-minute states that are busy_* "
               "(null without gpu_states)"),
            _f("held_idle_s", pa.float64(), "Time of the hour inside held-but-idle runs (s; null without "
               "gpu_states, or for an hour without any gpu_states row of the GPU and without held time)"),
            _f("held_but_idle", pa.bool_(), "held_idle_s >= 1800 (null where held_idle_s is)"),
        ]
    ),
)

JOB_EFFICIENCY = TableSpec(
    layer="metrics",
    name="job_efficiency",
    description=(
        "Per job run (epoch row, else job row) overlapping the day, clipped to the day: sample coverage, "
        "time-weighted utilization and power over its GPUs, PIF, capability-weighted RFU, energy and "
        "efficiency class (DESIGN.md 5.5). A run without telemetry has sample_coverage 0 and null metrics."
    ),
    key=("global_job_id", "run_index"),
    schema=pa.schema(
        [
            _f("global_job_id", pa.string(), "HTCondor GlobalJobId", nullable=False),
            _f("run_index", pa.int32(), "0-based run (epoch) index", nullable=False),
            _f("host", pa.string(), "Execute host"),
            _f("device_name", pa.string(), "GPU model of the run's GPUs (from telemetry); the models joined "
               "with ' + ' (in name order) when its GPUs are of several"),
            _f("gpus", pa.int32(), "Whole GPUs in assigned_gpus", nullable=False),
            _f("mig_devices", pa.int32(), "MIG devices in assigned_gpus (not measured)", nullable=False),
            _f("run_start_utc", TS, "Run start, clipped to the day", nullable=False),
            _f("run_end_utc", TS, "Run end, clipped to the day. A run whose record has no end ends at the "
               "job's next run's start, its LastVacateTime after the run's start, or the start of another "
               "job's run on its GPUs, whichever is first; else at the day end", nullable=False),
            _f("clipped_start", pa.bool_(), "The run started before the day", nullable=False),
            _f("clipped_end", pa.bool_(), "The run ended after the day or has not ended", nullable=False),
            _f("duration_s", pa.float64(), "Clipped run duration (s)", nullable=False),
            _f("samples", pa.int64(), "Samples of its GPUs inside the clipped run", nullable=False),
            _f("sample_coverage", pa.float64(), "Covered GPU-time / (gpus x duration), 0-1", nullable=False),
            _f("util_pct", pa.float64(), "Time-weighted mean utilization over its GPUs (%)"),
            _f("power_w", pa.float64(), "Time-weighted mean power per GPU (W)"),
            _f("max_power_w", pa.float64(), "Time-weighted mean PIF denominator per GPU (W)"),
            _f("pif", pa.float64(), "Time-weighted mean PIF over its GPUs"),
            _f("rfu_pct", pa.float64(), "100 x sum realized / sum achievable over its GPUs' covered time"),
            _f("efficiency_gap_pp", pa.float64(), "util_pct - rfu_pct"),
            _f("efficiency_class", pa.string(), _CLASS_DOC),
            _f("energy_kwh", pa.float64(), "Energy of its GPUs during the clipped run (kWh)"),
            _f("held_idle_s", pa.float64(), "GPU-time of its GPUs inside held-but-idle runs attributed to "
               "this job (s; null without gpu_states)"),
            _f("is_backfill", pa.bool_(), "Ran in a backfill slot"),
        ]
    ),
)

HELD_IDLE_INTERVALS = TableSpec(
    layer="metrics",
    name="held_idle_intervals",
    description=(
        "Held-but-idle runs: a claimed GPU (gpu_states busy_*) whose power stayed at idle level "
        "(<= 1.3 x idle power or PIF <= 0.2) for >= 30 continuous minutes; clipped to the day. Where "
        "clean/jobs has the named job's runs on the GPU (listing it, or with no GPU list), only samples "
        "inside a run count and a held-idle run ends at the latest at that run's end, and a sample inside "
        "such a run that the state gives no job, in the bucket just before one naming the job (its snapshot "
        "before the job started), is the job's; "
        "otherwise the 5-minute state decides alone (a job's run then extends to the end of the last "
        "bucket naming it)."
    ),
    key=("gpu_id", "start_utc"),
    schema=pa.schema(
        [
            _f("gpu_id", pa.string(), "HTCondor short GPU id", nullable=False),
            _f("host", pa.string(), "Host of the GPU"),
            _f("device_name", pa.string(), "GPU model name"),
            _f("global_job_id", pa.string(), "Job holding the GPU (from gpu_states)"),
            _f("start_utc", TS, "Start (clipped to the day)", nullable=False),
            _f("end_utc", TS, "End (clipped to the day)", nullable=False),
            _f("duration_s", pa.float64(), "end - start (s)", nullable=False),
            _f("run_duration_s", pa.float64(), "Length of the run before clipping to the day (s), as far as the "
               "samples read go: from one hour before the day (a run held longer before midnight reads shorter); "
               "ends at the latest at the job run's end where clean/jobs gives it", nullable=False),
            _f("mean_power_w", pa.float64(), "Mean power of its samples in the day (W)"),
            _f("samples", pa.int64(), "Samples in the run, from one hour before the day on (inside the job run "
               "where clean/jobs gives it)", nullable=False),
            _f("clipped_start", pa.bool_(), "The run started before the day", nullable=False),
            _f("clipped_end", pa.bool_(), "The run continued after the day (or the data ended); false when the "
               "job run ended within the day", nullable=False),
        ]
    ),
)

EFFICIENCY_DAILY = TableSpec(
    layer="metrics",
    name="efficiency_daily",
    description=(
        "Per device class and ALL: sampled GPU-hours, utilization, capability-weighted fleet RFU, energy "
        "and held-but-idle GPU-hours for the day."
    ),
    key=("device_name",),
    schema=pa.schema(
        [
            _f("day_start_utc", TS, "Start of the day window", nullable=False),
            _f("device_name", pa.string(), "GPU model name, or ALL", nullable=False),
            _f("gpus", pa.int64(), "GPUs with samples", nullable=False),
            _f("gpu_hours_sampled", pa.float64(), "Sum of coverage_s / 3600", nullable=False),
            _f("util_pct", pa.float64(), "Mean utilization, each GPU-hour weighted by util_coverage_s (%)"),
            _f("rfu_pct_fleet", pa.float64(), "100 x sum(realized x power_coverage_s) / sum(achievable x "
               "power_coverage_s)"),
            _f("energy_kwh", pa.float64(), "Energy (kWh)"),
            _f("held_idle_gpu_hours", pa.float64(), "Held-but-idle GPU-hours (null without gpu_states)"),
        ]
    ),
)

EFFICIENCY_TABLES: tuple[TableSpec, ...] = (GPU_HOURLY_EFFICIENCY, JOB_EFFICIENCY, HELD_IDLE_INTERVALS, EFFICIENCY_DAILY)

# --------------------------------------------------------------------------------------------------
# The seed formulas, scalar (the SQL below implements the same expressions)
# --------------------------------------------------------------------------------------------------


def _num(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def pif(power_w: float | None, max_power_w: float | None) -> float | None:
    """``clip(power_w / max_power_w, 0, 1)``; None when either is missing/NaN or the limit is <= 0."""
    p, m = _num(power_w), _num(max_power_w)
    if p is None or m is None or m <= 0:
        return None
    return min(max(p / m, 0.0), 1.0)


def realized_tflops(achievable: float, pif_value: float | None) -> float | None:
    p = _num(pif_value)
    return None if p is None else achievable * p


def rfu_pct(realized: float | None, achievable: float) -> float | None:
    r = _num(realized)
    if r is None or not achievable:
        return None
    return min(max(100.0 * r / achievable, 0.0), 100.0)


def efficiency_gap_pp(util_pct: float | None, rfu: float | None) -> float | None:
    u, r = _num(util_pct), _num(rfu)
    return None if u is None or r is None else u - r


def efficiency_class(util_pct: float | None, pif_value: float | None) -> str | None:
    """The seed classification (see the module docstring for the null cases)."""
    u, p = _num(util_pct), _num(pif_value)
    if u is None:
        return None
    if u < IDLE_UTIL_PCT:
        return "Idle"
    if p is None:
        return None
    if u >= HIGH_UTIL_PCT and p >= EFFICIENT_PIF:
        return "Efficient"
    if u >= HIGH_UTIL_PCT and p < BOTTLENECK_PIF:
        return "Bottlenecked"
    if u >= MID_UTIL_PCT and p >= MODERATE_PIF:
        return "Moderate"
    return "Inefficient"


def pif_sql(power: str, max_power: str) -> str:
    return f"CASE WHEN {max_power} <= 0 THEN NULL ELSE {clip_sql(f'{power} / {max_power}', 0.0, 1.0)} END"


def clip_sql(expr: str, lo: float, hi: float) -> str:
    """``clip(expr, lo, hi)`` keeping NULL (DuckDB's least/greatest skip NULL arguments)."""
    return f"CASE WHEN ({expr}) IS NULL THEN NULL ELSE least(greatest({expr}, {lo}), {hi}) END"


def class_sql(util: str, pif_expr: str) -> str:
    return (
        f"CASE WHEN {util} IS NULL THEN NULL WHEN {util} < {IDLE_UTIL_PCT} THEN 'Idle' "
        f"WHEN {pif_expr} IS NULL THEN NULL "
        f"WHEN {util} >= {HIGH_UTIL_PCT} AND {pif_expr} >= {EFFICIENT_PIF} THEN 'Efficient' "
        f"WHEN {util} >= {HIGH_UTIL_PCT} AND {pif_expr} < {BOTTLENECK_PIF} THEN 'Bottlenecked' "
        f"WHEN {util} >= {MID_UTIL_PCT} AND {pif_expr} >= {MODERATE_PIF} THEN 'Moderate' "
        "ELSE 'Inefficient' END"
    )


# --------------------------------------------------------------------------------------------------
# Computation
# --------------------------------------------------------------------------------------------------


@dataclass
class EfficiencyResult:
    hourly: pa.Table
    jobs: pa.Table
    held_idle: pa.Table
    daily: pa.Table
    counters: dict[str, float] = field(default_factory=dict)
    #: GPU ids of boards measured from their MIG instances (the slot states may name only the instances)
    mig_boards: list[str] = field(default_factory=list)


def _ts(us_expr: str) -> str:
    """SQL: microseconds since the epoch -> TIMESTAMPTZ (independent of the session time zone)."""
    return f"(TIMESTAMPTZ '1970-01-01 00:00:00+00' + to_microseconds(CAST({us_expr} AS BIGINT)))"


def _mean_us(value: str, weight_us: str) -> str:
    """:func:`~gpu_pipeline.lib.db.exact_weighted_avg` for an integer weight (microseconds), whose
    sum is exact as it is: half the
    exact sums, each of which costs DuckDB's planner as much as a few plain aggregates."""
    known = f"{value} IS NOT NULL"
    return f"{exact_sum(f'{value} * {weight_us}', known)} / nullif(sum({weight_us}) FILTER (WHERE {known}), 0)"


# Capability-weighted fleet RFU: sum(realized x power time) / sum(achievable x power time) over GPU-hours
# with a PIF, an hour weighed by the time its power was known (coverage_s in days written before it was
# stored); the utilization by the time it was known
_POWER_W = "coalesce(power_coverage_s, coverage_s)"
_UTIL_W = "coalesce(util_coverage_s, coverage_s)"
_RFU_NUM = exact_sum(f"realized_tflops * {_POWER_W}", "pif IS NOT NULL")
_RFU_DEN = exact_sum(f"achievable_tflops * {_POWER_W}", "pif IS NOT NULL")


def _trap(col: str) -> str:
    return f"CASE WHEN {col}0 IS NULL THEN {col}1 WHEN {col}1 IS NULL THEN {col}0 ELSE ({col}0 + {col}1) / 2 END"


_NUM = "CASE WHEN isnan(CAST({c} AS DOUBLE)) OR {c} < 0 THEN NULL ELSE CAST({c} AS DOUBLE) END"
#: A power reading at or below 0 W is none: no powered board reads it (a broken exporter's 0).
_POWER = "CASE WHEN isnan(CAST({c} AS DOUBLE)) OR {c} <= 0 THEN NULL ELSE CAST({c} AS DOUBLE) END"
_MIG = ("(mig_profile IS NOT NULL OR mig_instance_id IS NOT NULL OR gpu_id LIKE 'MIG-%' "
        "OR gpu_id LIKE 'GPU-MIG-%' OR contains(gpu_id, '/'))")
_MIG_R = _MIG.replace("mig_", "r.mig_").replace("gpu_id", "r.gpu_id")
_PLIMIT = "CASE WHEN r.power_limit_w > 0 AND NOT isnan(r.power_limit_w) THEN r.power_limit_w END"


#: Compute slices of a MIG-capable board, by a word of its model name (DESIGN 4.3; NVIDIA's MIG user
#: guide: A30 4 slices; A100, H100, H200, B200 7); any other model 7.
MIG_BOARD_SLICES = (("A30", 4),)
MIG_DEFAULT_SLICES = 7


def _board_slices_sql(device: str) -> str:
    cases = " ".join(f"WHEN contains(upper({device}), '{word}') THEN {n}" for word, n in MIG_BOARD_SLICES)
    return f"CASE {cases} ELSE {MIG_DEFAULT_SLICES} END"


def _mig_boards_sql(samples_sql: str) -> str:
    """A FROM-clause over ``samples_sql`` (same parameters) in which the MIG instances of a board are
    one row of the board (``gpu_id`` its short id) per host, source and time: MIG instances export
    no GPU_UTIL (DESIGN 4.3), so its ``util_pct`` is the board's share of busy compute slices,
    ``sum(slices x gr_engine_active_pct) / board slices`` over its instances (a ``3g.40gb`` instance
    has 3 of an H100's 7; slices without an instance are idle), null when an instance lacks the
    ratio or a ``<n>g.`` profile; its power, power limit and energy counter are the board's, which
    every instance (and a board-level series, where exported) repeats: their greatest. Only the
    times at which the board has instances are merged: a board switched into MIG mode at 11:00 keeps
    its own rows (and GPU_UTIL) before. Instances of one scrape are merged by their timestamp (one
    per scrape from dcgm-exporter). Instances whose parent UUID the source does not give stay MIG
    rows (skipped)."""
    mig = _MIG.replace("gpu_id", "b.gpu_id").replace("mig_", "b.mig_")
    slices = r"TRY_CAST(regexp_extract(b.mig_profile, '^(\d+)g\.', 1) AS INTEGER)"
    on = ("p.host IS NOT DISTINCT FROM b.host AND p.source = b.source AND p.gpu_uuid = b.gpu_uuid "
          "AND p.sample_utc = b.sample_utc")
    return f"""(
        WITH base AS (SELECT * FROM {samples_sql}),
        parents AS (
            SELECT DISTINCT b.host, b.source, b.gpu_uuid, b.sample_utc FROM base b
            WHERE {mig} AND b.gpu_uuid LIKE 'GPU-%-%-%-%-%'
        )
        SELECT b.* FROM base b ANTI JOIN parents p ON {on}
        UNION ALL BY NAME
        SELECT b.sample_utc, b.source, b.host, b.gpu_uuid, 'GPU-' || lower(substr(b.gpu_uuid, 5, 8)) AS gpu_id,
               max(b.device_name) AS device_name,
               CASE WHEN count(*) FILTER (WHERE {mig}) = count({slices} * b.gr_engine_active_pct) FILTER (WHERE {mig})
                    THEN sum({slices} * b.gr_engine_active_pct) FILTER (WHERE {mig})
                         / greatest({_board_slices_sql("max(b.device_name)")}, sum({slices}) FILTER (WHERE {mig}))
               END AS util_pct,
               max(b.power_w) AS power_w, max(b.power_limit_w) AS power_limit_w, max(b.energy_mj) AS energy_mj
        FROM base b SEMI JOIN parents p ON {on}
        GROUP BY b.sample_utc, b.source, b.host, b.gpu_uuid
    )"""


def compute_efficiency(
    con: duckdb.DuckDBPyConnection,
    samples_sql: str,
    samples_params: Sequence,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    *,
    states_sql: str | None = None,
    states_params: Sequence = (),
    jobs_sql: str | None = None,
    jobs_params: Sequence = (),
    group_samples: int | None = None,
) -> EfficiencyResult:
    """All efficiency tables for the window ``[start_utc, end_utc)``.

    ``samples_sql`` / ``states_sql`` / ``jobs_sql`` are DuckDB FROM-clauses with their parameters
    (``Store.relation_sql``) over ``clean/gpu_samples``, ``metrics/gpu_states`` and ``clean/jobs``.
    Pass the previous and the next day's partitions too, where they exist, so that segments and
    held-idle runs crossing midnight are judged on their full length; only data within one hour of
    the window is read. Without ``states_sql`` there is no held-idle detection (null columns);
    without ``jobs_sql`` the job table is empty. Uses temporary tables ``_eff_*`` on ``con``.

    Memory: every metric is per GPU (a job's are summed over its GPUs at the end), so the GPUs are
    taken in groups of about ``group_samples`` samples (default :data:`GROUP_SAMPLES`), one group's
    samples held at a time; each group reads the files again, or, from :data:`STAGE_ONCE_MIN_GROUPS`
    groups on, its own temporary file, which one pass over the files wrote for all of them. The
    tables do not depend on the groups.
    """
    s_us, e_us = epoch_us(start_utc), epoch_us(end_utc)
    lo = start_utc - LOOKAROUND
    hi = end_utc + LOOKAROUND
    counters: dict[str, float] = {}
    mig_boards: list[str] = []
    staged: Path | None = None
    have_states = states_sql is not None
    try:
        groups, mig_rows = _stage_sources(con, samples_sql, list(samples_params), lo, hi, s_us, e_us, counters,
                                          group_samples)
        counters["mig_samples_on_boards"] = 0.0
        if counters["mig_samples_skipped"]:  # MIG instances: measured as their boards (read again)
            instances = counters["mig_samples_skipped"]
            mig_boards = [b for (b,) in con.execute(
                f"SELECT DISTINCT 'GPU-' || lower(substr(gpu_uuid, 5, 8)) FROM {samples_sql} "
                f"WHERE sample_utc >= ? AND sample_utc < ? AND {_MIG} AND gpu_uuid LIKE 'GPU-%-%-%-%-%' ORDER BY 1",
                [*samples_params, lo, hi]).fetchall()]
        if mig_boards:  # (instances without a parent UUID cannot be merged: no second pass for them)
            samples_sql = _mig_boards_sql(samples_sql)
            groups, mig_rows = _stage_sources(con, samples_sql, list(samples_params), lo, hi, s_us, e_us,
                                              counters, group_samples)
            counters["mig_samples_on_boards"] = instances - counters["mig_samples_skipped"]
        have_jobs = jobs_sql is not None
        if have_jobs:
            _stage_jobruns(con, jobs_sql, list(jobs_params), s_us, e_us)
        hourly_parts, held_parts = [], []
        if len(groups) >= STAGE_ONCE_MIN_GROUPS:
            _remove_stale_stages(spill_dir())
            staged = Path(tempfile.mkdtemp(prefix=_STAGE_PREFIX, dir=spill_dir()))
            _stage_groups_once(con, samples_sql, list(samples_params), lo, hi, groups, mig_rows, staged)
        for k, gids in enumerate(groups):  # GPU groups in gpu_id order: the parts, each sorted, make sorted tables
            _stage_samples(con, samples_sql, list(samples_params), lo, hi, s_us, e_us, states_sql,
                           list(states_params), counters, gids, None if staged is None else staged / f"grp={k}",
                           mig_rows)
            if have_states:
                _stage_held(con, states_sql, list(states_params), s_us, e_us, have_jobs)
                held_parts.append(_held_table(con))
            hourly_parts.append(_hourly(con, s_us, e_us, states_sql, list(states_params)))
            if jobs_sql is not None:
                _stage_job_gpus(con, have_states)
        hourly = pa.concat_tables(hourly_parts) if hourly_parts else GPU_HOURLY_EFFICIENCY.empty()
        held = pa.concat_tables(held_parts) if held_parts else HELD_IDLE_INTERVALS.empty()
        jobs = _jobs(con, have_states) if jobs_sql is not None else JOB_EFFICIENCY.empty()
        daily = efficiency_daily(hourly, held if have_states else None, start_utc)
    finally:
        _drop_samples(con)
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
        for t in ("_eff_count", "_eff_srch", "_eff_src", "_eff_srch2", "_eff_cad", "_eff_gpu0", "_eff_gpu", "_eff_held", "_eff_jobruns",
                  "_eff_jobgpu", "_eff_jobpart", "_eff_jg", "_eff_heldjob", "_eff_jobruns_all"):
            con.execute(f"DROP TABLE IF EXISTS {t}")
        for v in ("_eff_specmap",):
            try:
                con.unregister(v)
            except (duckdb.Error, KeyError):
                pass
    counters["gpu_hours"] = float(sum(v or 0.0 for v in hourly["coverage_s"].to_pylist()) / 3600.0)
    counters["held_idle_intervals"] = float(held.num_rows)
    counters["job_runs"] = float(jobs.num_rows)
    counters["job_runs_without_telemetry"] = float(
        sum(1 for c in jobs["sample_coverage"].to_pylist() if not c)
    )
    return EfficiencyResult(hourly=hourly, jobs=jobs, held_idle=held, daily=daily, counters=counters,
                            mig_boards=mig_boards)


def _stage_sources(con, samples_sql, params, lo, hi, s_us, e_us, counters,
                   group_samples) -> tuple[list[tuple[int, int]], bool]:
    """``_eff_src``: per GPU its host, device and integer code ``gid`` (in gpu_id order), and
    ``_eff_srch2``: per GPU and UTC hour the source read, from one grouped scan of the files; the
    sample counters of the window. Returns the GPU groups, as ``gid`` ranges of about
    ``group_samples`` samples each (a GPU is never split), and whether the read range has MIG rows
    (:data:`_MIG`; without any, the groups' reads need not tell them apart)."""
    # Per (GPU, source, MIG or not, UTC hour): samples in the read range and in the window, modal
    # host and device. The mode is the least and the greatest value where they agree (one host and one
    # device name: nearly always), and is read again, with ``mode``, only for the groups where they do
    # not: two modes in the one scan made DuckDB hold all its rows (a grouped count per mode joined
    # back): 1.1 -> 0.7 s of CPU at 1,000 GPUs (30 s samples).
    read = f"""
        FROM {samples_sql}
        WHERE sample_utc >= ? AND sample_utc < ? AND gpu_id IS NOT NULL"""
    keys = f"gpu_id, source, {_MIG} AS is_mig, epoch_us(sample_utc) // {_HOUR_US} AS h"
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _eff_count AS
        SELECT {keys}, count(*) AS n,
               count(*) FILTER (WHERE isfinite(util_pct) AND util_pct >= 0) > 0 AS has_util,
               (max(epoch_us(sample_utc)) - min(epoch_us(sample_utc))) // 60000000 AS span_min,
               count(*) FILTER (WHERE epoch_us(sample_utc) >= {s_us} AND epoch_us(sample_utc) < {e_us}) AS n_window,
               count(*) FILTER (WHERE epoch_us(sample_utc) >= {s_us} AND epoch_us(sample_utc) < {e_us}
                                AND power_w <= 0) AS n_zero_power,
               min(host) AS host, max(host) AS host_max,
               min(device_name) AS device_name, max(device_name) AS device_name_max
        {read}
        GROUP BY ALL
        """,
        [*params, lo, hi],
    )
    several = "(c.host <> c.host_max OR c.device_name <> c.device_name_max)"
    if con.execute(f"SELECT count(*) FROM _eff_count c WHERE {several}").fetchall()[0][0]:
        con.execute(
            f"""
            UPDATE _eff_count c SET host = m.host, device_name = m.device_name
            FROM (SELECT {keys}, mode(host) AS host, mode(device_name) AS device_name {read} GROUP BY ALL) m
            WHERE {several} AND m.gpu_id = c.gpu_id AND m.source IS NOT DISTINCT FROM c.source
              AND m.is_mig IS NOT DISTINCT FROM c.is_mig AND m.h = c.h
            """,
            [*params, lo, hi],
        )
    row = con.execute(
        """
        SELECT coalesce(sum(n_window), 0), coalesce(sum(n_window) FILTER (WHERE is_mig), 0),
               coalesce(sum(n_window) FILTER (WHERE NOT is_mig), 0)
        FROM _eff_count
        """
    ).fetchall()[0]
    counters["samples_in_window"] = float(row[0])
    counters["mig_samples_skipped"] = float(row[1])
    counters["samples_dropped_other_source"] = float(row[2])  # less each group's kept samples
    counters["duplicate_samples_dropped"] = 0.0
    counters["repeated_readings_dropped"] = 0.0
    counters["counter_readings_interpolated"] = 0.0
    # One source per GPU and UTC hour: one with utilization readings in that hour before one without
    # (nvidia-smi on a board in MIG mode, beside DCGM's instances), then the one whose samples span
    # most of the hour (in whole minutes: a 10-second exporter started at 10:45 does not win over a
    # 60-second logger that ran all hour), then most samples (ties: the greatest name); so a GPU
    # whose sources change in the day (a collector that stops, another that starts) is measured by
    # whichever reported it in each hour; ``sc`` numbers the sources.
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _eff_srch AS
        SELECT gpu_id, h, arg_max(source, struct_pack(u := has_util, m := span_min, n := n, s := source)) AS source,
               arg_max(host, struct_pack(u := has_util, m := span_min, n := n, s := source)) AS host,
               arg_max(device_name, struct_pack(u := has_util, m := span_min, n := n, s := source)) AS device_name,
               arg_max(n, struct_pack(u := has_util, m := span_min, n := n, s := source)) AS n
        FROM _eff_count WHERE NOT is_mig GROUP BY gpu_id, h
        """
    )
    # Per GPU: its code ``gid`` (in gpu_id order), the most frequent host and device name of its
    # picked samples, and their number.
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _eff_src AS
        WITH host AS (
            SELECT gpu_id, arg_max(host, struct_pack(n := n, s := host)) AS host
            FROM (SELECT gpu_id, host, sum(n) AS n FROM _eff_srch GROUP BY ALL) GROUP BY gpu_id
        ), dev AS (
            SELECT gpu_id, arg_max(device_name, struct_pack(n := n, s := device_name)) AS device_name
            FROM (SELECT gpu_id, device_name, sum(n) AS n FROM _eff_srch GROUP BY ALL) GROUP BY gpu_id
        )
        SELECT row_number() OVER (ORDER BY gpu_id) AS gid, gpu_id, host.host, dev.device_name, n.n
        FROM (SELECT gpu_id, sum(n) AS n FROM _eff_srch GROUP BY gpu_id) n JOIN host USING (gpu_id) JOIN dev USING (gpu_id)
        """
    )
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _eff_srch2 AS
        SELECT src.gid, h.gpu_id, h.h, h.source, CAST(dense_rank() OVER (ORDER BY h.source) AS SMALLINT) AS sc
        FROM _eff_srch h JOIN _eff_src src USING (gpu_id)
        """
    )
    # power readings at or below 0 W of the sources read (read as none)
    counters["zero_power_readings"] = float(con.execute(
        "SELECT coalesce(sum(c.n_zero_power), 0) FROM _eff_count c "
        "JOIN _eff_srch h ON h.gpu_id = c.gpu_id AND h.h = c.h AND h.source = c.source WHERE NOT c.is_mig"
    ).fetchall()[0][0])
    mig_rows = bool(con.execute("SELECT count(*) FROM _eff_count WHERE is_mig").fetchall()[0][0])
    for t in ("_eff_count", "_eff_srch"):
        con.execute(f"DROP TABLE {t}")
    return _gid_groups([n for (n,) in con.execute("SELECT n FROM _eff_src ORDER BY gid").fetchall()],
                       group_samples or GROUP_SAMPLES), mig_rows


def _gid_groups(samples: list[int], limit: int) -> list[tuple[int, int]]:
    """Consecutive ``gid`` ranges (1-based, inclusive) over GPUs with these sample counts, each of
    about an equal share of the samples, with as few groups as keep a share within ``limit``. A GPU
    is never split: one larger than the share ends its group, and the rest is shared anew."""
    groups: list[tuple[int, int]] = []
    first, held, rest = 1, 0, sum(samples)
    limit = max(1, limit)
    for gid, n in enumerate(samples, start=1):
        held += n
        parts = -(-rest // limit)  # groups the samples not yet in a group need
        if parts > 1 and held * parts >= rest:
            groups.append((first, gid))
            first, rest, held = gid + 1, rest - held, 0
    if first <= len(samples):
        groups.append((first, len(samples)))
    return groups or [(1, 0)]  # no GPU: one empty group, so that every table and counter is made


def _picked_samples_sql(samples_sql: str, gid_where: str, *extra: str, group_of: str | None = None,
                        mig_rows: bool = True) -> str:
    """SQL: the samples of the picked source of the GPUs ``gid_where`` selects (on ``gid``), as
    per-sample values (parameters: the relation's, then the read range's two ends); ``extra``
    columns of the samples (``r.``) after ``gid``; ``group_of``: an expression of ``gid`` given
    first, as ``grp``. ``mig_rows``: whether the read range has MIG rows, which are left out; a
    range without any is read without the test (its columns and string matches: about 0.07 s of CPU
    a 1,000-GPU group)."""
    grp = f"{group_of} AS grp, " if group_of else ""
    not_mig = f" AND NOT {_MIG_R}" if mig_rows else ""
    return f"""
        SELECT {"p.grp, " if group_of else ""}p.gid, {"".join(c + ", " for c in extra)}epoch_us(r.sample_utc) AS t, p.sc,
               {_NUM.format(c="r.util_pct")} AS util, {_POWER.format(c="r.power_w")} AS power,
               {_PLIMIT} AS plimit, {_NUM.format(c="r.energy_mj")} AS energy_mj
        FROM {samples_sql} r
        JOIN (SELECT {grp}gid, gpu_id, h, source, sc FROM _eff_srch2 WHERE {gid_where}) p
          ON p.gpu_id = r.gpu_id AND p.source = r.source AND p.h = epoch_us(r.sample_utc) // {_HOUR_US}
        WHERE r.sample_utc >= ? AND r.sample_utc < ?{not_mig}
    """


_STAGE_PREFIX = "efficiency-groups-"
#: A one-pass folder older than this was left by a process that was killed (a run's is removed
#: when its step ends, also on an error).
_STALE_STAGE_S = 86_400


def _remove_stale_stages(where: Path) -> None:
    for old in where.glob(f"{_STAGE_PREFIX}*"):
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > _STALE_STAGE_S:
                shutil.rmtree(old, ignore_errors=True)


def _stage_groups_once(con, samples_sql, params, lo, hi, groups: list[tuple[int, int]], mig_rows: bool,
                       where: Path) -> None:
    """Every group's samples (as :func:`_picked_samples_sql` gives them) read from the files in one
    pass and written to ``where/grp=<k>/`` (k: the group's index), Parquet."""
    grp = "CASE " + " ".join(f"WHEN gid <= {int(hi_gid)} THEN {k}" for k, (_, hi_gid) in enumerate(groups)) + " END"
    sql = _picked_samples_sql(samples_sql, "true", group_of=grp, mig_rows=mig_rows)
    target = str(where).replace("'", "''")
    con.execute(f"COPY ({sql}) TO '{target}' (FORMAT parquet, PARTITION_BY (grp), COMPRESSION '{_STAGE_CODEC}')",
                [*params, lo, hi])


def _stage_samples(con, samples_sql, params, lo, hi, s_us, e_us, states_sql, states_params, counters, gids,
                   staged: Path | None = None, mig_rows: bool = True):
    """Stage one group of GPUs (``gids``: a ``gid`` range): ``_eff_samples`` (the picked source's
    samples of each GPU with the next sample's values; the one table as long as the samples) and
    ``_eff_gpu`` (per GPU: cadence and spec); the group's counters are added. The segments are the
    view ``_eff_seg``: over columns of the samples that :func:`_segment_columns` made in numpy where
    the samples were ordered there, else :func:`_seg_sql` over the window query's samples. ``staged``:
    the group's folder of :func:`_stage_groups_once`, read instead of the files; ``mig_rows``: whether
    the read range has MIG rows (:func:`_picked_samples_sql`)."""
    _drop_samples(con)  # the previous group's, before this one's is made
    # The group's samples of the picked source, as per-sample values; then the next sample's values
    # (the segment to the next sample). A repeated (GPU, time) gives a zero-length segment, dropped.
    if staged is not None and not staged.is_dir():
        staged = None  # (a group without samples in the read range has no folder)
    gparams = [*params, lo, hi]

    def group(*extra: str) -> str:
        return _picked_samples_sql(samples_sql, f"gid BETWEEN {int(gids[0])} AND {int(gids[1])}", *extra,
                                   mig_rows=mig_rows)

    first = ("SELECT gid, t, sc, util, power, plimit, energy_mj FROM read_parquet(?)",
             [[str(f) for f in sorted(staged.glob("*.parquet"))]]) if staged is not None else (group(), gparams)
    # (the rare group with a repeated (GPU, time) is read from the files again, with the hosts)
    staged_values = _stage_next_values(con, *first, window=(s_us, e_us))
    seg_inputs = None
    if staged_values is not None:
        repeats, interpolated, seg_inputs = staged_values
        del staged_values  # (the arrays go with the segments below)
    else:
        # A GPU with two samples at one time (the same sample under two host names: one exporter
        # scraped by two jobs) keeps one, the first by host; the other is counted as a duplicate.
        one_per_time = (f"SELECT * FROM ({group('r.host')}) "
                        "QUALIFY row_number() OVER (PARTITION BY gid, t ORDER BY host) = 1")
        windowed = f"""
            SELECT gid, t, util, power, plimit, energy_mj, stall_interpolated,
                   lead(t) OVER w AS nt, lead(util) OVER w AS util1, lead(power) OVER w AS power1,
                   lead(plimit) OVER w AS plimit1,
                   CASE WHEN lead(sc) OVER w = sc AND NOT step_dropped THEN lead(energy_mj) OVER w END AS energy1,
                   count(power) OVER (w ROWS UNBOUNDED PRECEDING) AS pn, lead(t) OVER w - t AS d
            FROM ({_STALLS_SQL.format(src=_KEEP_READINGS_SQL.format(src=one_per_time), catch_up=STALL_CATCH_UP,
                                      gap=GAP_FACTOR)})
            WINDOW w AS (PARTITION BY gid ORDER BY t)"""
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE _eff_samples_w AS
            SELECT * EXCLUDE (d) FROM ({_LC_SQL.format(src=windowed)})
            """,
            gparams,
        )
        [(interpolated,)] = con.execute("SELECT count(*) FILTER (WHERE stall_interpolated) FROM _eff_samples_w "
                                        "WHERE t >= ? AND t < ?", [s_us, e_us]).fetchall()
        con.execute("CREATE OR REPLACE TEMP VIEW _eff_samples AS SELECT * EXCLUDE (stall_interpolated) FROM _eff_samples_w")
        [(dups,)] = con.execute(
            f"SELECT count(*) - count(DISTINCT (gid, t)) FROM ({group()}) WHERE t >= ? AND t < ?",
            [*gparams, s_us, e_us]).fetchall()
        counters["duplicate_samples_dropped"] += float(dups)
        counters["samples_dropped_other_source"] -= float(dups)
        [(repeats,)] = con.execute(
            f"SELECT count(*) FROM ({group()}) WHERE t >= ? AND t < ?", [*gparams, s_us, e_us]).fetchall()
        repeats -= dups + con.execute("SELECT count(*) FROM _eff_samples WHERE t >= ? AND t < ?",
                                      [s_us, e_us]).fetchall()[0][0]
    counters["repeated_readings_dropped"] += float(repeats)
    counters["counter_readings_interpolated"] += float(interpolated)
    counters["samples_dropped_other_source"] -= float(repeats)
    kept = con.execute("SELECT count(*) FROM _eff_samples WHERE t >= ? AND t < ?", [s_us, e_us]).fetchall()[0][0]
    counters["samples_dropped_other_source"] -= float(kept)
    # Per GPU: host, device (samples, else gpu_states), cadence, spec.
    state_dev = ""
    if states_sql is not None:
        state_dev = (
            f"LEFT JOIN (SELECT gpu_id, mode(device_name) AS st_device FROM {states_sql} "
            "WHERE device_name IS NOT NULL GROUP BY gpu_id) sd USING (gpu_id)"
        )
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _eff_gpu0 AS
        WITH g AS (
            SELECT gid, median(nt - t) FILTER (WHERE nt > t) AS cadence_us FROM _eff_samples GROUP BY gid
        )
        SELECT g.gid, src.gpu_id, src.host,
               {"coalesce(src.device_name, sd.st_device)" if state_dev else "src.device_name"} AS device_name,
               g.cadence_us
        FROM g JOIN _eff_src src USING (gid) {state_dev}
        """,
        list(states_params) if state_dev else [],
    )
    names = [r[0] for r in con.execute("SELECT DISTINCT device_name FROM _eff_gpu0").fetchall()]
    with contextlib.suppress(duckdb.Error, KeyError):
        con.unregister("_eff_specmap")  # the previous group's
    con.register("_eff_specmap", name_map(names))
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _eff_gpu AS
        SELECT g.gid, g.gpu_id, g.host, g.device_name, g.cadence_us,
               coalesce(m.tdp_w, {_default("tdp_w")}) AS tdp_w,
               coalesce(m.idle_power_w, {_default("idle_power_w")}) AS idle_power_w,
               coalesce(m.achievable_tflops, {_default("achievable_tflops")}) AS achievable_tflops,
               coalesce(m.spec_known, false) AS spec_known
        FROM _eff_gpu0 g LEFT JOIN _eff_specmap m USING (device_name)
        """
    )
    con.execute("DROP TABLE IF EXISTS _eff_gpu0")
    # The cadence in force per GPU and UTC hour: the median of the hour's intervals where it has at
    # least LOCAL_CADENCE_MIN_INTERVALS of them, else the GPU's (the median of all its intervals):
    # a logger whose interval changed in the day (60 s, then 10 s) has no gaps in either part,
    # while an hour of a few scattered samples is still judged against the GPU's cadence.
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _eff_cad AS
        SELECT c.gid, c.h,
               CASE WHEN c.n >= {LOCAL_CADENCE_MIN_INTERVALS} THEN c.cad_us ELSE g.cadence_us END AS cadence_us
        FROM (SELECT gid, t // {_HOUR_US} AS h, count(*) FILTER (WHERE nt > t) AS n,
                     median(nt - t) FILTER (WHERE nt > t) AS cad_us
              FROM _eff_samples GROUP BY ALL) c
        JOIN _eff_gpu g USING (gid)
        """
    )
    # Each sample's hour cadence (``cad_us``, :data:`_CADENCE_JOIN`) and the segments (``_eff_seg``),
    # made once for the group's queries: in numpy, as columns of the samples, where the samples were
    # ordered there; else views.
    if seg_inputs is not None:
        # the counter readings and the next sample's values are the segments' only: the samples are
        # registered again without them, with the segments' columns instead
        samples = seg_inputs.pop("table").drop_columns(["energy_mj", "util1", "power1", "plimit1", "energy1"])
        con.register("_eff_samples", samples)  # (the full table let go, its arrays with seg_inputs')
        columns = _segment_columns(con, seg_inputs)
        for name, column in columns.items():
            samples = samples.append_column(name, column)
        del seg_inputs, columns
        con.register("_eff_samples", samples)
        del samples
        con.execute(f"CREATE OR REPLACE TEMP VIEW _eff_seg AS {_SEG_VIEW}")
    else:
        con.execute(f"""CREATE OR REPLACE TEMP VIEW _eff_samples AS
                        SELECT s.* EXCLUDE (stall_interpolated), cad.cadence_us AS cad_us
                        FROM _eff_samples_w s {_CADENCE_JOIN.format(s="s")}""")
        con.execute(f"CREATE OR REPLACE TEMP VIEW _eff_seg AS {_seg_sql()}")
    seg = con.execute(
        "SELECT count(*), count(energy_counter_j) FROM _eff_seg WHERE b > ? AND a < ?", [s_us, e_us]
    ).fetchall()[0]
    counters["segments"] = counters.get("segments", 0.0) + float(seg[0])
    counters["segments_energy_from_counter"] = counters.get("segments_energy_from_counter", 0.0) + float(seg[1])
    row = con.execute(
        f"""
        SELECT count(*) FILTER (WHERE s.nt - s.t > {GAP_FACTOR} * s.cad_us
                                       AND NOT coalesce(s.nt - s.t <= {GAP_FACTOR} * s.lc, false) AND s.nt > ? AND s.t < ?),
               count(DISTINCT s.gid) FILTER (WHERE s.t >= ? AND s.t < ?)
        FROM _eff_samples s
        """,
        [s_us, e_us, s_us, e_us],
    ).fetchall()[0]
    counters["gaps_over_3x_cadence"] = counters.get("gaps_over_3x_cadence", 0.0) + float(row[0])
    counters["gpus"] = counters.get("gpus", 0.0) + float(row[1])


_NEXT = (("t", "nt"), ("util", "util1"), ("power", "power1"), ("plimit", "plimit1"), ("energy_mj", "energy1"))


#: Consecutive intervals of a GPU within this factor of each other keep one cadence (a run).
RUN_RATIO = 1.5


def _neighbour_cadence(t: np.ndarray, last: np.ndarray) -> pa.Array:
    """Per sample (rows in (GPU, time) order, ``last``: a GPU's last sample), the cadence of the run
    of intervals its own interval belongs to: consecutive intervals of the GPU each within
    :data:`RUN_RATIO` of the one before; the run's shortest interval where the run has at least
    :data:`LOCAL_CADENCE_MIN_INTERVALS` of them, else null (as for a GPU's last sample). ``lc`` of
    :func:`_stage_next_values`, as :data:`_LC_SQL` gives it."""
    n = len(t)
    if n == 0:
        return pa.array([], pa.int64())
    has = ~last
    d = np.empty(n, dtype=np.int64)  # the interval to the next sample; a GPU's last: none (0)
    np.subtract(t[1:], t[:-1], out=d[:-1])
    d[-1] = 0
    d[last] = 0
    # a run goes on where this interval and the one before are both the GPU's and within the ratio
    same_run = np.zeros(n, dtype=bool)
    same_run[1:] = has[1:] & has[:-1] & (d[1:] <= RUN_RATIO * d[:-1]) & (d[:-1] <= RUN_RATIO * d[1:])
    starts = np.flatnonzero(~same_run)
    lengths = np.diff(np.r_[starts, n])
    size = np.add.reduceat(has, starts)  # intervals of the run (a GPU's last sample is a run of none)
    lowest = np.minimum.reduceat(np.where(has, d, np.iinfo(np.int64).max), starts)
    keep = np.repeat(size >= LOCAL_CADENCE_MIN_INTERVALS, lengths) & has
    return pa.array(np.repeat(lowest, lengths), mask=~keep)


#: ``lc`` of :func:`_neighbour_cadence` in SQL, from a subquery ``{src}`` with ``gid``, ``t`` and
#: ``d`` (the interval to the next sample, null at a GPU's last), ordered by time per GPU.
_LC_SQL = f"""
    SELECT * EXCLUDE (brk, run),
           CASE WHEN d IS NOT NULL AND count(d) OVER r >= {LOCAL_CADENCE_MIN_INTERVALS} THEN min(d) OVER r END AS lc
    FROM (
        SELECT *, sum(brk) OVER (PARTITION BY gid ORDER BY t ROWS UNBOUNDED PRECEDING) AS run
        FROM (
            SELECT *, CASE WHEN d IS NOT NULL AND lag(d) OVER (PARTITION BY gid ORDER BY t) IS NOT NULL
                                AND d <= {RUN_RATIO} * lag(d) OVER (PARTITION BY gid ORDER BY t)
                                AND lag(d) OVER (PARTITION BY gid ORDER BY t) <= {RUN_RATIO} * d
                           THEN 0 ELSE 1 END AS brk
            FROM ({{src}})
        )
    )
    WINDOW r AS (PARTITION BY gid, run)"""


def _drop_samples(con) -> None:
    """Drop ``_eff_samples``: the Arrow table registered under the name, or the view of the window
    query's table; and the view of its segments, ``_eff_seg``."""
    for name in ("_eff_seg", "_eff_samples"):
        with contextlib.suppress(duckdb.Error, KeyError):
            con.unregister(name)
        con.execute(f"DROP VIEW IF EXISTS {name}")
    con.execute("DROP TABLE IF EXISTS _eff_samples_w")


#: The rows of ``{src}`` (gid, t, sc, util, power, energy_mj; one per GPU and time) that are not a
#: repeat of the GPU's previous reading (see the module docstring); :func:`_repeated_readings` in SQL.
_KEEP_READINGS_SQL = """
    SELECT * EXCLUDE (rep, nxt) FROM (
        SELECT *, first_value(CASE WHEN NOT rep THEN struct_pack(e := energy_mj, s := sc) END IGNORE NULLS)
                      OVER (PARTITION BY gid ORDER BY t ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS nxt
        FROM (
            SELECT *, coalesce(lag(sc) OVER rw = sc AND lag(energy_mj) OVER rw = energy_mj AND power > 0
                               AND lag(power) OVER rw = power AND lag(util) OVER rw IS NOT DISTINCT FROM util,
                               false) AS rep
            FROM ({src})
            WINDOW rw AS (PARTITION BY gid ORDER BY t)))
    WHERE NOT (rep AND coalesce(nxt.s = sc AND nxt.e > energy_mj, false))"""


def _repeated_readings(same_gpu: np.ndarray, sc: np.ndarray, util: np.ndarray, power: np.ndarray,
                       energy: np.ndarray) -> np.ndarray:
    """Per sample (rows in (GPU, time) order; values NaN where null): whether it repeats the GPU's
    previous sample's reading -- same source, the energy counter unmoved while the power read above
    0, the same power and utilization (both unknown counts as the same) -- and the counter moves on
    at the GPU's next sample that is no such repeat (a counter stuck for good is no repeat: its
    samples stay, with the trapezoid power)."""
    n = len(sc)
    rep = np.zeros(n, dtype=bool)
    if n < 2:
        return rep
    same_util = (util[1:] == util[:-1]) | (np.isnan(util[1:]) & np.isnan(util[:-1]))
    rep[1:] = (same_gpu & (sc[1:] == sc[:-1]) & (energy[1:] == energy[:-1]) & (power[1:] > 0)
               & (power[1:] == power[:-1]) & same_util)
    if not rep.any():
        return rep
    # the first sample at or after each that is not a repeat (n where none)
    nxt = np.minimum.accumulate(np.where(rep, n, np.arange(n))[::-1])[::-1]
    gid_change = np.zeros(n, dtype=np.int64)
    gid_change[1:] = np.cumsum(~same_gpu)  # a GPU's number among the rows' GPUs
    at = np.minimum(nxt, n - 1)
    moves = (nxt < n) & (gid_change[at] == gid_change) & (sc[at] == sc) & (energy[at] > energy)
    return rep & moves


def _stalled_counter(same_gpu: np.ndarray, sc: np.ndarray, t: np.ndarray, energy: np.ndarray,
                     power: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The energy counter readings (rows in (GPU, time) order, NaN where null) with each stall that
    the counter moves on from read as moving evenly (see the module docstring), the rows whose
    readings were so replaced, and the rows whose segment to the next sample must not take the
    counter's step. A stalled sample has the previous sample's reading, of the same GPU and source
    (a power reading at or below 0 W is none: :data:`_POWER`). A run of stalls is replaced when the sample after it is of
    the same GPU and source with a higher reading (``e_k + (e_next - e_k) (t - t_k) / (t_next -
    t_k)``, ``k`` the sample the run stalled at), the step gives at least :data:`STALL_CATCH_UP` of
    the trapezoid power over the whole span it covers, ``t_k`` to ``t_next`` (the intervals with a
    power reading at either end), every interval from ``k`` to the next is within
    :data:`GAP_FACTOR` of the shortest (no hole is read into), and ``k`` is not the GPU's first
    sample read (the stall may have begun before it). A run the counter steps on from but that is
    not so replaced leaves its step (the last stalled sample's segment) to the power where that
    segment has a power reading: the stall's segments took the power, and the step may hold their
    energy again. :data:`_STALLS_SQL` in SQL."""
    n = len(energy)
    stalled = np.zeros(n, dtype=bool)
    none = np.zeros(0, dtype=np.int64)
    if n < 3:
        return energy, none, none
    # (a reading at or below 0 W is none already: _POWER)
    stalled[1:] = same_gpu & (sc[1:] == sc[:-1]) & (energy[1:] == energy[:-1])
    if not stalled.any():
        return energy, none, none
    edge = np.diff(np.r_[0, stalled.astype(np.int8), 0])
    first, last = np.flatnonzero(edge == 1), np.flatnonzero(edge == -1) - 1  # each run of stalls
    k, nxt = first - 1, last + 1
    at = np.minimum(nxt, n - 1)
    d = np.r_[0, np.diff(t), 0]  # d[i]: the interval to sample i from the one before
    bounds = np.ravel(np.column_stack((first, at + 1)))  # each run's intervals: d[first .. next]
    d_max, d_min = np.maximum.reduceat(d, bounds)[::2], np.minimum.reduceat(d, bounds)[::2]
    # the trapezoid power of each interval (to sample i from the one before; one end unknown: the
    # other's), and the span's mean over the intervals that have one
    p0, p1 = np.r_[np.nan, power[:-1], np.nan], np.r_[power, np.nan]
    trap = np.where(np.isnan(p0), p1, np.where(np.isnan(p1), p0, (p0 + p1) / 2))
    read = ~np.isnan(trap)
    span_j = np.add.reduceat(np.where(read, trap * d, 0.0), bounds)[::2]
    span_us = np.add.reduceat(np.where(read, d, 0), bounds)[::2]
    # the counter caught up: its step over the run gives at least STALL_CATCH_UP of the power's energy
    # over the same span (a counter that resumed without counting the stall steps by one interval's)
    with np.errstate(invalid="ignore", divide="ignore"):
        known = span_j / span_us
        step_w = (energy[at] - energy[k]) / 1000.0 / ((t[at] - t[k]) / 1e6)
        steps = ((nxt < n) & np.r_[same_gpu, False][last] & (sc[at] == sc[k]) & (energy[at] > energy[k]))
        # (no power read over the span: nothing to compare the step with, the counter is all there is)
        moves = (steps & np.r_[False, same_gpu][k] & (d_max <= GAP_FACTOR * d_min)
                 & (np.isnan(known) | (step_w >= STALL_CATCH_UP * known)))
    # a step not read as the stall's catch-up: its segment takes the power where it has a reading
    dropped = last[steps & ~moves & ~(np.isnan(power[last]) & np.isnan(power[at]))]
    if not moves.any():
        return energy, none, dropped
    run_of = np.repeat(np.arange(len(first)), last - first + 1)  # per stalled sample (in order), its run
    pick = moves[run_of]
    rows, run = np.flatnonzero(stalled)[pick], run_of[pick]
    kk, nn = k[run], nxt[run]
    out = energy.copy()
    out[rows] = energy[kk] + (energy[nn] - energy[kk]) * (t[rows] - t[kk]) / (t[nn] - t[kk])
    return out, rows, dropped


#: A stalled counter's step at the sample it moves on at, as a share of the trapezoid power's energy
#: over the span the step covers (from the sample the counter stalled at to that one), from which the
#: step is read as the stall's energy (else the counter resumed without counting the stall, whose
#: segments, and the step's, keep the trapezoid power).
STALL_CATCH_UP = 0.75

#: :func:`_stalled_counter` in SQL, over a subquery ``{src}`` (gid, t, sc, power, energy_mj, ...; one
#: row per GPU and time), with the columns ``stall_interpolated`` and ``step_dropped`` (the segment to
#: the next sample takes no counter delta); ``{catch_up}``: STALL_CATCH_UP, ``{gap}``: GAP_FACTOR.
#: ``g`` numbers a GPU's runs: a sample that is no stall and the stalls after it; ``tj`` / ``tus``:
#: the trapezoid power x the interval from the sample before, and that interval, where it has a power.
_STALLS_SQL = """
    SELECT * EXCLUDE (stalled, prev_t, prev_power, d, g, d_max, d_min, an, nx, energy_mj, catch_up, steps,
                      tj, tus, g_j, g_us, g_last),
           CASE WHEN catch_up THEN an.e + (nx.e - an.e) * (t - an.t) / (nx.t - an.t) ELSE energy_mj END AS energy_mj,
           catch_up AS stall_interpolated,
           coalesce(steps AND NOT catch_up AND t = g_last AND (power IS NOT NULL OR nx.p IS NOT NULL),
                    false) AS step_dropped
    FROM (
        SELECT *, coalesce(steps AND NOT an.first
                           AND greatest(d_max, nx.d) <= {gap} * least(d_min, nx.d)
                           AND coalesce((nx.e - an.e) / 1000.0 / ((nx.t - an.t) / 1e6)
                                        >= {catch_up} * ((coalesce(g_j, 0) + coalesce(nx.tj, 0))
                                                         / nullif(coalesce(g_us, 0) + coalesce(nx.tus, 0), 0)),
                                        true),
                           false) AS catch_up
        FROM (
            SELECT *, coalesce(stalled AND nx.s = sc AND nx.e > an.e, false) AS steps
            FROM (
                SELECT *,
                       last_value(CASE WHEN NOT stalled
                                       THEN struct_pack(t := t, e := energy_mj, first := prev_t IS NULL) END
                                  IGNORE NULLS)
                           OVER (PARTITION BY gid ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS an,
                       first_value(CASE WHEN NOT stalled
                                        THEN struct_pack(t := t, e := energy_mj, s := sc, p := power, d := d,
                                                         tj := tj, tus := tus) END
                                   IGNORE NULLS)
                           OVER (PARTITION BY gid ORDER BY t ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS nx,
                       max(CASE WHEN stalled THEN d END) OVER (PARTITION BY gid, g) AS d_max,
                       min(CASE WHEN stalled THEN d END) OVER (PARTITION BY gid, g) AS d_min,
                       sum(CASE WHEN stalled THEN tj END) OVER (PARTITION BY gid, g) AS g_j,
                       sum(CASE WHEN stalled THEN tus END) OVER (PARTITION BY gid, g) AS g_us,
                       max(t) OVER (PARTITION BY gid, g) AS g_last
                FROM (
                    SELECT *, sum(CASE WHEN stalled THEN 0 ELSE 1 END) OVER (PARTITION BY gid ORDER BY t
                                                                             ROWS UNBOUNDED PRECEDING) AS g,
                           coalesce((prev_power + power) / 2, prev_power, power) * d AS tj,
                           CASE WHEN coalesce(prev_power, power) IS NOT NULL THEN d END AS tus
                    FROM (
                        SELECT *, coalesce(lag(sc) OVER w = sc AND lag(energy_mj) OVER w = energy_mj, false) AS stalled,
                               lag(t) OVER w AS prev_t, lag(power) OVER w AS prev_power, t - lag(t) OVER w AS d
                        FROM ({src})
                        WINDOW w AS (PARTITION BY gid ORDER BY t))))))"""


def _in_order(table: pa.Table, name: str, order: np.ndarray) -> np.ndarray:
    """A column's values in (GPU, time) order, null as NaN (_NUM, _PLIMIT)."""
    return table[name].to_numpy(zero_copy_only=False)[order]


def _stage_next_values(con, group_sql: str, params: list, window: tuple[int, int]) -> tuple[int, int] | None:
    """``_eff_samples`` from the group's samples (``group_sql``: gid, t, sc, util, power, plimit,
    energy_mj) with each GPU's next sample's values (the next energy reading only where the next
    sample is of the same source ``sc``) and its running count of power readings, as the
    window ``PARTITION BY gid ORDER BY t`` gives them: the rows ordered by (gid, t) in numpy
    (the clean files come nearly in time order, so the sort is quick) instead of by DuckDB's window
    sort (a 1,000-GPU group of 1.5 M samples: 1.0 s, this way 0.5 s), and registered with DuckDB as
    an Arrow table over the numpy arrays (not copied into a table). Returns the samples inside
    ``window`` (µs) dropped as repeated readings (:func:`_repeated_readings`). A GPU with two
    samples at one time (under two host names), which a clean day does not have: the group returns
    None, and the window query is made instead (keeping one of them), as for a group without
    samples."""
    scanned = con.sql(group_sql, params=params).to_arrow_table()
    if not scanned.num_rows:
        return None
    gid, t = scanned["gid"].to_numpy(), scanned["t"].to_numpy()
    order = _gpu_time_order(gid, t)
    gid, t = gid[order], t[order]
    same_gpu = gid[1:] == gid[:-1]
    if bool(np.any(same_gpu & (t[1:] == t[:-1]))):
        return None
    # the values in (GPU, time) order, each taken once (null as NaN: _NUM, _PLIMIT)
    sc = scanned["sc"].to_numpy()[order]
    ordered = {name: _in_order(scanned, name, order) for name, _ in _NEXT if name != "t"}
    del scanned, order
    repeated = _repeated_readings(same_gpu, sc, ordered["util"], ordered["power"], ordered["energy_mj"])
    repeats = int(np.count_nonzero(repeated & (t >= window[0]) & (t < window[1])))
    if repeated.any():
        keep = ~repeated
        gid, t, sc = gid[keep], t[keep], sc[keep]
        ordered = {name: values[keep] for name, values in ordered.items()}
        same_gpu = gid[1:] == gid[:-1]
    ordered["energy_mj"], moved, dropped = _stalled_counter(same_gpu, sc, t, ordered["energy_mj"], ordered["power"])
    interpolated = int(np.count_nonzero((t[moved] >= window[0]) & (t[moved] < window[1])))
    n = len(gid)
    last = np.ones(n, dtype=bool)  # a GPU's last sample: no next one
    last[:-1] = ~same_gpu
    no_delta = np.zeros(n, dtype=bool)  # no counter delta to the next sample: it is another source's,
    no_delta[:-1] = sc[1:] != sc[:-1]
    no_delta[dropped] = True  # or this is a stall's step not read as its catch-up
    del sc
    columns: dict[str, pa.Array] = {"gid": pa.array(gid)}
    nexts: dict[str, pa.Array] = {"lc": _neighbour_cadence(t, last)}
    # the arrays the segments are made of (:func:`_segment_columns`), the registered table's own
    seg_inputs: dict[str, np.ndarray | pa.Array] = {"gid": gid, "last": last, "no_delta": no_delta,
                                                    "lc": nexts["lc"]}
    for name, next_name in _NEXT:
        values = t if name == "t" else ordered.pop(name)
        following = np.empty_like(values)
        following[:-1] = values[1:]
        seg_inputs[name], seg_inputs[next_name] = values, following
        if name == "t":
            columns[name], nexts[next_name] = pa.array(values), pa.array(following, mask=last)
            continue
        missing = np.isnan(values)  # the values are NaN only where null (_NUM, _PLIMIT)
        columns[name] = pa.array(values, mask=missing)
        nexts[next_name] = pa.array(following, mask=last | np.isnan(following)
                                    | (no_delta if name == "energy_mj" else False))
        if name == "power":  # count(power) over the GPU's rows so far
            have = ~missing
            running = np.cumsum(have)
            starts = np.flatnonzero(np.r_[True, ~same_gpu])
            power_count = running - np.repeat(running[starts] - have[starts], np.diff(np.r_[starts, n]))
    seg_inputs["table"] = pa.table({**columns, **nexts, "pn": pa.array(power_count)})
    con.register("_eff_samples", seg_inputs["table"])
    return repeats, interpolated, seg_inputs


def _segment_columns(con, seg_inputs: dict) -> dict[str, pa.Array]:
    """The segments of :func:`_seg_sql` as columns of the samples (a segment is a sample's, to the
    next one), made in numpy from the arrays :func:`_stage_next_values` registered as
    ``_eff_samples`` (rows in (GPU, time) order), the cadences of ``_eff_cad`` and the TDPs of
    ``_eff_gpu``: the cadence of the sample's hour ``cad_us`` (:data:`_CADENCE_JOIN`), ``seg`` (the
    sample starts a segment) and the segment's trapezoid ``seg_util``,
    ``seg_power``, ``seg_plimit`` and ``seg_energy_j`` (its counter energy), which :data:`_SEG_VIEW`
    reads. The same operations in IEEE doubles as the SQL, so the same values bit for bit. The next
    sample's values and the counter readings are no longer the samples' (``seg_inputs`` is emptied):
    their arrays take the results, so that the group's memory does not grow."""
    gid, t, nt = seg_inputs.pop("gid"), seg_inputs.pop("t"), seg_inputs.pop("nt")
    # the cadence of each sample's GPU and UTC hour (_CADENCE_JOIN: every sample's (gid, hour) is in
    # _eff_cad, its cadence null for a GPU with no interval), looked up by the key (gid, hour)
    # (the rows come in (gid, hour) runs: each run's key is looked up once)
    cad = con.sql("SELECT gid, h, cadence_us FROM _eff_cad ORDER BY gid, h").to_arrow_table()
    key = (cad["gid"].to_numpy().astype(np.int64) << 32) | cad["h"].to_numpy().astype(np.int64)
    at = gid << 32
    at |= t // _HOUR_US
    # (a null cadence as NaN: no comparison holds)
    cad_us = _looked_up_by_run(at, key, cad["cadence_us"].to_numpy(zero_copy_only=False))
    out: dict[str, pa.Array] = {"cad_us": pa.array(cad_us, mask=np.isnan(cad_us))}
    del at, key, cad
    d = nt - t  # (at a GPU's last sample: another GPU's time, left out by ``last``)
    with np.errstate(invalid="ignore"):
        seg = d <= GAP_FACTOR * cad_us  # (an integer interval compared as a double, as in DuckDB)
    del cad_us
    # or within GAP_FACTOR x its run's cadence (DuckDB compares 3.0 x lc as an exact DECIMAL: integers
    # here, GAP_FACTOR being whole)
    assert GAP_FACTOR == int(GAP_FACTOR)
    lc = seg_inputs.pop("lc")
    seg |= lc.is_valid().to_numpy(zero_copy_only=False) & (d <= int(GAP_FACTOR) * lc.fill_null(0).to_numpy())
    del lc
    seg &= ~seg_inputs.pop("last") & (d > 0)
    len_s = d / _US
    del d, t, nt
    out["seg"] = pa.array(seg)
    for name in ("util", "power", "plimit"):  # _trap, into the next sample's array
        v0, v1 = seg_inputs.pop(name), seg_inputs.pop(name + "1")
        n0, n1 = np.isnan(v0), np.isnan(v1)
        both = ~(n0 | n1)
        np.add(v0, v1, out=v1, where=both)
        np.divide(v1, 2, out=v1, where=both)  # (v0 + v1) / 2
        np.copyto(v1, v0, where=n1 & ~n0)  # one end unknown: the other's (v0 unknown: v1 as it is)
        out["seg_" + name] = pa.array(v1, mask=n0 & n1)
        if name == "plimit":
            plimit = v1  # (NaN where null)
        del v0, v1, n0, n1, both
    # the counter's delta where both ends have a reading of one source (energy1 is null otherwise),
    # it moved, and it implies at most COUNTER_MAX_POWER_FACTOR x the max power, coalesce(plimit, tdp)
    gpu = con.sql("SELECT gid, tdp_w FROM _eff_gpu ORDER BY gid").to_arrow_table()
    tdp = _looked_up_by_run(gid, gpu["gid"].to_numpy(), gpu["tdp_w"].to_numpy())
    max_power = np.where(np.isnan(plimit), tdp, plimit)
    del gid, gpu, tdp, plimit
    e0, delta_j = seg_inputs.pop("energy_mj"), seg_inputs.pop("energy1")
    delta_j[seg_inputs.pop("no_delta")] = np.nan
    with np.errstate(invalid="ignore", divide="ignore"):  # (rows that are no segment: any value)
        counted = delta_j > e0
        np.subtract(delta_j, e0, out=delta_j)
        np.divide(delta_j, 1000.0, out=delta_j)  # (e1 - e0) / 1000.0
        np.divide(delta_j, len_s, out=e0)
        counted &= e0 <= COUNTER_MAX_POWER_FACTOR * max_power
    out["seg_energy_j"] = pa.array(delta_j, mask=~counted)
    return out


def _looked_up_by_run(row_keys: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` (by sorted ``keys``) at each row's key, the rows' keys coming in runs of one key:
    each run's key looked up once."""
    starts = np.flatnonzero(np.r_[True, row_keys[1:] != row_keys[:-1]])
    return np.repeat(values[np.searchsorted(keys, row_keys[starts])], np.diff(np.r_[starts, len(row_keys)]))


#: The segments (:func:`_seg_sql`) over the samples' segment columns (:func:`_segment_columns`).
_SEG_VIEW = f"""
    SELECT gid, t AS a, nt AS b, (nt - t) / {_US}.0 AS len_s, seg_util AS util, seg_power AS power,
           seg_plimit AS plimit, seg_energy_j AS energy_counter_j, seg_power * ((nt - t) / {_US}.0) AS energy_power_j
    FROM _eff_samples WHERE seg"""


def _seg_sql() -> str:
    """SQL (a subquery) for the segments: consecutive samples of a GPU no further apart than
    GAP_FACTOR x cadence, each covering ``[a, b)`` with the trapezoid values and its energy."""
    return f"""
        SELECT gid, a, b, len_s, util, power, plimit,
               CASE WHEN e0 IS NOT NULL AND e1 IS NOT NULL AND e1 > e0
                         AND (e1 - e0) / 1000.0 / len_s <= {COUNTER_MAX_POWER_FACTOR} * coalesce(plimit, tdp_w)
                    THEN (e1 - e0) / 1000.0 END AS energy_counter_j,
               power * len_s AS energy_power_j
        FROM (
            SELECT o.gid, t AS a, nt AS b, (nt - t) / {_US}.0 AS len_s,
                   {_trap("util")} AS util, {_trap("power")} AS power, {_trap("plimit")} AS plimit,
                   energy_mj AS e0, energy1 AS e1, g.tdp_w
            FROM (SELECT * RENAME (util AS util0, power AS power0, plimit AS plimit0) FROM _eff_samples) o
            JOIN _eff_gpu g USING (gid)
            WHERE nt IS NOT NULL AND nt > t
              AND ((nt - t) <= {GAP_FACTOR} * o.cad_us OR (nt - t) <= {GAP_FACTOR} * o.lc)
        )"""


#: Joins ``_eff_cad cad``, the hour's cadence at each sample of ``{s}``: the samples' ``cad_us``
#: (:func:`_stage_samples`). The cadence in force is ``greatest(cad_us, lc)`` (its run's where larger;
#: written as two comparisons where it filters: the ``greatest`` made DuckDB plan the job runs' segment
#: join twice as slow).
_CADENCE_JOIN = "JOIN _eff_cad cad ON cad.gid = {s}.gid AND cad.h = {s}.t // " + str(_HOUR_US)


def _default(col: str) -> str:
    return repr(float(getattr(UNKNOWN, col)))


_NO_END = 2**63 - 1  #: the end of a run that has not ended (BIGINT max)


def _stage_held(con, states_sql, states_params, s_us, e_us, have_jobs=False):
    bucket_us = int(STATE_BUCKET.total_seconds() * _US)
    lo = s_us - int(LOOKAROUND.total_seconds() * _US) - bucket_us
    hi = e_us + int(LOOKAROUND.total_seconds() * _US)
    # Candidates: samples at idle power whose 5-minute state bucket is busy; a run is a sequence of
    # candidates that are consecutive power readings (pn = running count of readings) of one job
    # with no gap over GAP_FACTOR x cadence.
    #
    # The state is the bucket's (a claim in any of its snapshots ranks first), so a job that ended
    # at 10:02 still names the GPU until 10:05. Where the job records give the job's runs on the GPU
    # (``_eff_heldjob``: runs listing the GPU, or with no GPU list, overlapping the window and its
    # look-around), a candidate counts only inside one of them (``rs <= t < re``; the job's runs on
    # the GPU merged where they overlap or touch), a run of candidates does not go on from one job
    # run into another, and the last sample stands for its cadence only up to the job run's end:
    # the held-idle run ends at min(last sample + cadence, job run end). A job the records do not
    # give on the GPU (no record read, none in the read range, or only runs listing other GPUs)
    # keeps the state's extent, to the end of the last bucket naming it.
    #
    # Likewise a job that started at 10:02 is named from the 10:05 bucket on (the 10:00 bucket's
    # snapshot saw no claim, or the claim of a job that ended at 10:01): a sample that is no job's
    # candidate by the state, inside a run the records give on the GPU and in the bucket just before
    # one naming that job, is that job's candidate (one job at most: the state names one a bucket,
    # and a job's runs on a GPU are merged), so the held-idle run starts with the job's first
    # sample. Only that bucket: the records do not overrule a state that saw the GPU unclaimed
    # later (a run record without an end, from a queue snapshot, would otherwise hold the GPU for
    # the rest of the data).
    bound = clip = records = ""
    if have_jobs:
        bound = f""", hj0 AS (  -- the job runs bounding the group's (GPU, job) pairs
            SELECT g.gid, j.global_job_id AS job, j.rs, coalesce(j.re, {_NO_END}) AS re
            FROM _eff_heldjob j JOIN _eff_gpu g ON g.gpu_id = j.gpu
            UNION ALL
            SELECT p.gid, j.global_job_id, j.rs, coalesce(j.re, {_NO_END})
            FROM _eff_heldjob j JOIN (SELECT DISTINCT gid, job FROM st) p ON p.job = j.global_job_id
            WHERE j.gpu IS NULL
        ), hj1 AS (
            SELECT *, max(re) OVER (PARTITION BY gid, job ORDER BY rs, re
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_re
            FROM hj0
        ), hj2 AS (
            SELECT *, sum(CASE WHEN prev_re >= rs THEN 0 ELSE 1 END)
                          OVER (PARTITION BY gid, job ORDER BY rs, re ROWS UNBOUNDED PRECEDING) AS isl
            FROM hj1
        ), hj AS (  -- merged: disjoint per (GPU, job)
            SELECT gid, job, min(rs) AS rs, max(re) AS re FROM hj2 GROUP BY gid, job, isl
        ), known AS (
            SELECT DISTINCT gid, job FROM hj
        )"""
        clip = """
            LEFT JOIN hj ON hj.gid = low.gid AND hj.job = st.job AND low.t >= hj.rs AND low.t < hj.re
            LEFT JOIN known k ON k.gid = low.gid AND k.job = st.job
            WHERE k.job IS NULL OR hj.re IS NOT NULL"""
        records = f"""
        ), c AS (
            SELECT * FROM c1
            UNION ALL
            SELECT low.*, hj.job, hj.re FROM low
            JOIN hj ON hj.gid = low.gid AND low.t >= hj.rs AND low.t < hj.re
            JOIN st nx ON nx.gid = low.gid AND nx.bt = low.bt + {bucket_us} AND nx.job = hj.job
            LEFT JOIN c1 ON c1.gid = low.gid AND c1.t = low.t
            WHERE c1.gid IS NULL"""
    job_end = "hj.re" if have_jobs else "CAST(NULL AS BIGINT)"
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _eff_held AS
        WITH low AS (
            -- candidates (cand), and the samples with no power reading after the GPU's first
            -- reading, which only carry the time between samples (neither extend nor break a run)
            SELECT s.gid, s.t, s.nt, s.power, s.pn, greatest(s.cad_us, s.lc) AS cadence_us,
                   (s.t // {bucket_us}) * {bucket_us} AS bt, s.power IS NOT NULL AS cand
            FROM _eff_samples s JOIN _eff_gpu g USING (gid)
            WHERE s.cad_us IS NOT NULL
              AND ((s.power IS NULL AND s.pn > 0) OR s.power <= {HELD_IDLE_POWER_FACTOR} * g.idle_power_w
                   OR s.power / coalesce(s.plimit, g.tdp_w) <= {HELD_IDLE_PIF_MAX})
        ), st AS (
            SELECT g.gid, epoch_us(x.bucket_start_utc) AS bt, min(x.global_job_id) AS job
            FROM {states_sql} x JOIN _eff_gpu g ON g.gpu_id = x.gpu_id
            WHERE x.state LIKE 'busy%' AND epoch_us(x.bucket_start_utc) >= {lo} AND epoch_us(x.bucket_start_utc) < {hi}
            GROUP BY ALL
        ){bound}, {"c1" if have_jobs else "c"} AS (
            SELECT low.*, st.job, {job_end} AS job_end FROM low JOIN st USING (gid, bt){clip}{records}
        ), y AS (
            SELECT *, lag(t) OVER w AS pt, lag(cadence_us) OVER w AS pcadence_us,
                   last_value(CASE WHEN cand THEN struct_pack(pn := pn, job := job, job_end := job_end) END
                              IGNORE NULLS) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pc
            FROM c WINDOW w AS (PARTITION BY gid ORDER BY t)
        ), z AS (
            SELECT *,
                   -- the interval from the sample before (a candidate or a sample without power) is
                   -- that sample's: judged by its cadence; the power readings, the job and its run
                   -- go on from the candidate before
                   sum(CASE WHEN t - pt <= {GAP_FACTOR} * pcadence_us
                                 AND (pc.pn = pn - 1 OR NOT cand)
                                 AND job IS NOT DISTINCT FROM pc.job AND job_end IS NOT DISTINCT FROM pc.job_end
                            THEN 0 ELSE 1 END)
                       OVER (PARTITION BY gid ORDER BY t ROWS UNBOUNDED PRECEDING) AS grp,
                   CAST(least(t + least(cadence_us, coalesce(nt - t, cadence_us)), coalesce(job_end, {_NO_END}))
                        AS BIGINT) AS t_end
            FROM y
        ), runs AS (
            SELECT gid, grp, any_value(job) FILTER (WHERE cand) AS job, min(t) FILTER (WHERE cand) AS t0,
                   max(t_end) FILTER (WHERE cand) AS t1, count(*) FILTER (WHERE cand) AS n,
                   {exact_avg('power', f't >= {s_us} AND t < {e_us}')} AS p_day, {exact_avg('power')} AS p_all
            FROM z GROUP BY gid, grp
        )
        SELECT g.gpu_id, g.host, g.device_name, r.job AS global_job_id,
               greatest(r.t0, {s_us}) AS a, least(r.t1, {e_us}) AS b,
               (r.t1 - r.t0) / {_US}.0 AS run_duration_s, coalesce(r.p_day, r.p_all) AS mean_power_w,
               r.n AS samples, r.t0 < {s_us} AS clipped_start, r.t1 > {e_us} AS clipped_end
        FROM runs r JOIN _eff_gpu g USING (gid)
        WHERE r.t1 - r.t0 >= {int(HELD_IDLE_MIN_S * _US)} AND r.t1 > {s_us} AND r.t0 < {e_us}
        """,
        list(states_params),
    )


def _held_table(con) -> pa.Table:
    t = con.sql(
        f"""
        SELECT gpu_id, host, device_name, global_job_id, {_ts("a")} AS start_utc, {_ts("b")} AS end_utc,
               (b - a) / {_US}.0 AS duration_s, run_duration_s, mean_power_w, samples,
               clipped_start, clipped_end
        FROM _eff_held ORDER BY gpu_id, a
        """
    ).to_arrow_table()
    return conform(t, HELD_IDLE_INTERVALS)


def _hourly(con, s_us, e_us, states_sql, states_params) -> pa.Table:
    def hour(expr: str) -> str:
        """The start of the hour of the day that ``expr`` (epoch us, within the day) falls in: hours
        counted from the day's start, which are UTC hours unless the partition zone's offset is
        not a whole number of hours (India, Adelaide): then a UTC hour would straddle two days."""
        return f"({s_us} + (({expr}) - {s_us}) // {_HOUR_US} * {_HOUR_US})"

    have_states = states_sql is not None
    busy = held = ""
    params: list = []
    if have_states:
        busy = f"""
        , st_h AS (
            SELECT gpu_id, {hour('epoch_us(bucket_start_utc)')} AS h,
                   count(*) FILTER (WHERE state LIKE 'busy%') / count(*) AS state_busy_share
            FROM {states_sql}
            WHERE epoch_us(bucket_start_utc) >= {s_us} AND epoch_us(bucket_start_utc) < {e_us}
            GROUP BY ALL
        ), held_p AS (
            SELECT gpu_id, a, b, unnest(generate_series({hour('a')}, {hour('b - 1')}, {_HOUR_US})) AS h
            FROM _eff_held
        ), held_h AS (
            SELECT gpu_id, h, sum(least(b, h + {_HOUR_US}) - greatest(a, h)) / {_US}.0 AS held_idle_s
            FROM held_p GROUP BY ALL
        )"""
        held = """
            LEFT JOIN st_h USING (gpu_id, h) LEFT JOIN held_h USING (gpu_id, h)"""
        params = list(states_params)
    # an hour without a state row (a telemetry-only host, or past the GPU's states) and without held
    # time is unknown, as its state_busy_share, not "not held"
    no_state = "st_h.state_busy_share IS NULL AND held_h.held_idle_s IS NULL"
    cols_states = (
        f"st_h.state_busy_share, CASE WHEN NOT ({no_state}) THEN coalesce(held_h.held_idle_s, 0.0) END AS held_idle_s, "
        f"CASE WHEN NOT ({no_state}) THEN coalesce(held_h.held_idle_s, 0.0) >= {HELD_IDLE_HOUR_S} END AS held_but_idle"
        if have_states
        else "CAST(NULL AS DOUBLE) AS state_busy_share, CAST(NULL AS DOUBLE) AS held_idle_s, "
             "CAST(NULL AS BOOLEAN) AS held_but_idle"
    )
    sql = f"""
        WITH inwin AS (
            SELECT *, greatest(a, {s_us}) AS a1, least(b, {e_us}) AS b1 FROM _eff_seg
            WHERE b > {s_us} AND a < {e_us}
        ), hours AS (  -- a segment once per hour it overlaps (one branch: two over the same segments
                       -- made DuckDB hold all of them in memory to read them twice)
            SELECT *, unnest(generate_series({hour('a1')}, {hour('b1 - 1')}, {_HOUR_US})) AS h
            FROM inwin
        ), pieces AS (
            SELECT *, greatest(a1, h) AS ca, least(b1, h + {_HOUR_US}) AS cb FROM hours
        ), pw AS (
            SELECT *, cb - ca AS w_us, (cb - ca) / {_US}.0 AS w FROM pieces WHERE cb > ca
        ), seg_h AS (
            SELECT gid, h, sum(cb - ca) / {_US}.0 AS coverage_s,
                   sum(cb - ca) FILTER (WHERE util IS NOT NULL) / {_US}.0 AS util_cov_s,
                   sum(cb - ca) FILTER (WHERE power IS NOT NULL) / {_US}.0 AS power_cov_s,
                   {_mean_us("util", "w_us")} AS util_tw, {_mean_us("power", "w_us")} AS power_tw,
                   {_mean_us("plimit", "w_us")} AS plimit_tw,
                   {exact_sum('coalesce(energy_counter_j, energy_power_j) * w / len_s')} AS energy_j,
                   count(energy_counter_j) AS n_counter,
                   count(*) FILTER (WHERE energy_counter_j IS NULL AND energy_power_j IS NOT NULL) AS n_power
            FROM pw GROUP BY gid, h
        ), smp_h AS (
            SELECT gid, {hour('t')} AS h, count(*) AS samples,
                   {exact_avg('util')} AS util_m, {exact_avg('power')} AS power_m,
                   {exact_avg('plimit')} AS plimit_m
            FROM _eff_samples WHERE t >= {s_us} AND t < {e_us} GROUP BY ALL
        ){busy}, base AS (
            SELECT gid, h, coalesce(smp_h.samples, 0) AS samples, coalesce(seg_h.coverage_s, 0.0) AS coverage_s,
                   coalesce(seg_h.util_cov_s, 0.0) AS util_coverage_s,
                   coalesce(seg_h.power_cov_s, 0.0) AS power_coverage_s,
                   -- the plain means only for an hour without covered time (all its samples isolated):
                   -- an hour whose segments have no power reading has no power, whatever a lone sample says
                   CASE WHEN coalesce(seg_h.coverage_s, 0.0) > 0 THEN util_tw ELSE util_m END AS util,
                   CASE WHEN coalesce(seg_h.coverage_s, 0.0) > 0 THEN power_tw ELSE power_m END AS power,
                   CASE WHEN coalesce(seg_h.coverage_s, 0.0) > 0 THEN plimit_tw ELSE plimit_m END AS plimit,
                   energy_j, n_counter, n_power
            FROM smp_h FULL OUTER JOIN seg_h USING (gid, h)
        ), m AS (
            SELECT b.*, g.gpu_id, g.host, g.device_name, g.tdp_w, g.achievable_tflops, g.spec_known,
                   coalesce(b.plimit, g.tdp_w) AS max_power_w,
                   CASE WHEN b.plimit IS NOT NULL THEN 'sampled_limit' WHEN g.spec_known THEN 'spec'
                        ELSE 'default' END AS max_power_source
            FROM base b JOIN _eff_gpu g USING (gid)
        ), f AS (
            SELECT *, {pif_sql("power", "max_power_w")} AS pif FROM m
        ), r AS (
            SELECT *, achievable_tflops * pif AS realized_tflops,
                   {clip_sql("100.0 * (achievable_tflops * pif) / achievable_tflops", 0.0, 100.0)} AS rfu_pct
            FROM f
        )
        SELECT r.gpu_id, r.host, r.device_name, {_ts("r.h")} AS hour_start_utc, r.samples, r.coverage_s,
               r.util_coverage_s, r.power_coverage_s,
               r.util AS util_pct, r.power AS power_w, r.max_power_w, r.max_power_source, r.pif,
               r.achievable_tflops, r.realized_tflops, r.rfu_pct, r.util - r.rfu_pct AS efficiency_gap_pp,
               {class_sql("r.util", "r.pif")} AS efficiency_class,
               r.energy_j / 3.6e6 AS energy_kwh,
               CASE WHEN coalesce(r.n_counter, 0) > 0 AND coalesce(r.n_power, 0) > 0 THEN 'mixed'
                    WHEN coalesce(r.n_counter, 0) > 0 THEN 'counter'
                    WHEN coalesce(r.n_power, 0) > 0 THEN 'power' END AS energy_source,
               r.spec_known, {cols_states}
        FROM r{held}
        ORDER BY r.gpu_id, r.h
    """
    return conform(con.sql(sql, params=params or None).to_arrow_table(), GPU_HOURLY_EFFICIENCY)


def _stage_jobruns(con, jobs_sql, jobs_params, s_us, e_us) -> None:
    """``_eff_jobruns`` (one row per job run overlapping the window, clipped to it) and
    ``_eff_jobgpu`` (the GPUs of those runs and of the look-around's, which its users leave out by
    joining ``_eff_jobruns``); ``_eff_jobpart`` collects each GPU group's share of the runs.
    ``_eff_heldjob``: the runs overlapping the window and its look-around, unclipped, once per
    listed GPU (``gpu`` null for a run whose GPU list is unknown), which bound the held-idle runs
    (:func:`_stage_held`)."""
    look_us = int(LOOKAROUND.total_seconds() * _US)
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _eff_jobruns_all AS
        WITH base AS (
            SELECT * FROM {jobs_sql}
        ), ranked AS (
            SELECT global_job_id, run_index, host, assigned_gpus, is_backfill_slot, request_gpus,
                   epoch_us(run_start_utc) AS rs,
                   CASE WHEN run_end_utc IS NOT NULL THEN epoch_us(run_end_utc) END AS re,
                   row_number() OVER (PARTITION BY global_job_id, run_index
                                      ORDER BY (doc_kind = 'epoch') DESC, record_utc DESC NULLS LAST,
                                               run_end_utc DESC NULLS LAST) AS rn
            FROM base
            WHERE run_start_utc IS NOT NULL
        ), chosen AS (
            SELECT * EXCLUDE (rn),
                   -- the job's next run's start (strictly later)
                   min(rs) OVER (PARTITION BY global_job_id ORDER BY rs
                                 RANGE BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS next_rs
            FROM ranked WHERE rn = 1
        ), vacated AS (  -- per open run: the job's earliest LastVacateTime after its start (one at its
                         -- start is the vacate before it, a zero-length run)
            SELECT o.global_job_id, o.run_index, min(epoch_us(b.last_vacate_utc)) AS vac
            FROM chosen o JOIN base b ON b.global_job_id = o.global_job_id AND epoch_us(b.last_vacate_utc) > o.rs
            WHERE o.re IS NULL GROUP BY ALL
        ), run_gpu AS (
            SELECT global_job_id, run_index, rs, re, trim(unnest(string_split(assigned_gpus, ','))) AS gpu
            FROM chosen WHERE nullif(trim(assigned_gpus), '') IS NOT NULL
        ), taken AS (  -- per open run: the first start of another job's run on one of its GPUs
            SELECT o.global_job_id, o.run_index, min(x.rs) AS other_rs
            FROM run_gpu o JOIN run_gpu x ON x.gpu = o.gpu AND x.global_job_id <> o.global_job_id AND x.rs > o.rs
            WHERE o.re IS NULL AND o.gpu <> '' GROUP BY ALL
        ), ended AS (
            -- an open run (no end: a queue snapshot's, which a later record of the job superseded)
            -- ends at the earliest of the job's next run, its vacate, another job on its GPU
            SELECT c.* EXCLUDE (re, next_rs),
                   CASE WHEN c.re IS NOT NULL THEN c.re ELSE least(c.next_rs, v.vac, tk.other_rs) END AS re
            FROM chosen c
            LEFT JOIN vacated v USING (global_job_id, run_index)
            LEFT JOIN taken tk USING (global_job_id, run_index)
        )
        SELECT global_job_id, run_index, host, assigned_gpus, is_backfill_slot AS is_backfill, request_gpus, rs, re
        FROM ended
        WHERE rs < {e_us + look_us} AND (re IS NULL OR (re > {s_us - look_us} AND re >= rs))
        """,
        list(jobs_params),
    )
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _eff_jobruns AS
        SELECT global_job_id, run_index, host, is_backfill, rs, re,
               greatest(rs, {s_us}) AS cs, least(coalesce(re, {e_us}), {e_us}) AS ce,
               rs < {s_us} AS clipped_start, re IS NULL OR re > {e_us} AS clipped_end
        FROM _eff_jobruns_all
        WHERE rs < {e_us} AND (re IS NULL OR re > {s_us})
          -- GPU jobs only: a run that asked for no GPU and was given none is a CPU job
          AND (request_gpus IS NULL OR request_gpus > 0 OR nullif(trim(assigned_gpus), '') IS NOT NULL)
        """
    )
    # The runs' GPUs, split once for every run read (the users below join the window's runs).
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _eff_jobgpu AS
        SELECT DISTINCT global_job_id, run_index, gpu,
               (gpu LIKE 'MIG-%' OR gpu LIKE 'GPU-MIG-%' OR contains(gpu, '/')) AS is_mig
        FROM (
            SELECT global_job_id, run_index, trim(unnest(string_split(assigned_gpus, ','))) AS gpu
            FROM _eff_jobruns_all WHERE assigned_gpus IS NOT NULL
        ) WHERE gpu <> ''
        """
    )
    # A run with a GPU list (whole GPUs or MIG ids) bounds the jobs on those GPUs; one whose list is
    # unknown (null or empty) bounds the job on any GPU.
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _eff_heldjob AS
        SELECT r.global_job_id, jg.gpu, r.rs, r.re
        FROM _eff_jobruns_all r LEFT JOIN _eff_jobgpu jg USING (global_job_id, run_index)
        """
    )
    con.execute("DROP TABLE IF EXISTS _eff_jobruns_all")
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _eff_jobpart (
            global_job_id VARCHAR, run_index BIGINT, gpu VARCHAR, cov_us HUGEINT, util DOUBLE, cov_u_us HUGEINT,
            power DOUBLE, cov_p_us HUGEINT, plimit DOUBLE, energy_j DOUBLE, device_name VARCHAR, ach DOUBLE,
            maxp DOUBLE, pif DOUBLE, samples BIGINT, held_us HUGEINT)
        """
    )


def _stage_job_gpus(con, have_states) -> None:
    """The current GPU group's share of each job run into ``_eff_jobpart``: per (run, GPU) the
    time-weighted means over its segments; per run its samples and held-idle time on these GPUs."""
    # The runs' GPUs of this group, as a table: joined to the segments as a subquery, DuckDB could
    # start with a range join of every run and every segment (its row estimates of temporary tables
    # are poor) before the GPU equality cut it down.
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _eff_jg AS
        SELECT jg.global_job_id, jg.run_index, jg.gpu, g.gid, j.cs, j.ce
        FROM _eff_jobgpu jg JOIN _eff_jobruns j USING (global_job_id, run_index)
        JOIN _eff_gpu g ON g.gpu_id = jg.gpu
        WHERE NOT jg.is_mig
        """
    )
    con.execute(
        f"""
        INSERT INTO _eff_jobpart BY NAME
        WITH ov AS (
            SELECT jg.global_job_id, jg.run_index, jg.gpu,
                   least(s.b, jg.ce) - greatest(s.a, jg.cs) AS w_us,
                   (least(s.b, jg.ce) - greatest(s.a, jg.cs)) / {_US}.0 AS w, s.len_s,
                   s.util, s.power, s.plimit, coalesce(s.energy_counter_j, s.energy_power_j) AS energy_j
            FROM _eff_jg jg JOIN _eff_seg s ON s.gid = jg.gid AND s.a < jg.ce AND s.b > jg.cs
        ), per_gpu AS (
            SELECT global_job_id, run_index, gpu, sum(w_us) AS cov_us,
                   {_mean_us("util", "w_us")} AS util, sum(w_us) FILTER (WHERE util IS NOT NULL) AS cov_u_us,
                   {_mean_us("power", "w_us")} AS power, sum(w_us) FILTER (WHERE power IS NOT NULL) AS cov_p_us,
                   {_mean_us("plimit", "w_us")} AS plimit,
                   {exact_sum('energy_j * w / len_s')} AS energy_j
            FROM ov GROUP BY ALL
        ), per_gpu2 AS (
            SELECT p.*, g.device_name, g.achievable_tflops AS ach,
                   coalesce(p.plimit, g.tdp_w) AS maxp,
                   {pif_sql("p.power", "coalesce(p.plimit, g.tdp_w)")} AS pif
            FROM per_gpu p JOIN _eff_gpu g ON g.gpu_id = p.gpu
        )
        SELECT * FROM per_gpu2
        """
    )
    con.execute(
        """
        INSERT INTO _eff_jobpart BY NAME
        SELECT jg.global_job_id, jg.run_index, count(*) AS samples
        FROM _eff_jg jg JOIN _eff_samples s ON s.gid = jg.gid AND s.t >= jg.cs AND s.t < jg.ce
        GROUP BY ALL
        """
    )
    if have_states:
        con.execute(
            """
            INSERT INTO _eff_jobpart BY NAME
            SELECT jg.global_job_id, jg.run_index, sum(least(h.b, j.ce) - greatest(h.a, j.cs)) AS held_us
            FROM _eff_jobgpu jg JOIN _eff_jobruns j USING (global_job_id, run_index)
            JOIN _eff_held h ON h.gpu_id = jg.gpu AND h.global_job_id = jg.global_job_id
                            AND h.a < j.ce AND h.b > j.cs
            WHERE NOT jg.is_mig GROUP BY ALL
            """
        )


def _jobs(con, have_states) -> pa.Table:
    """The job table from the runs and every group's share in ``_eff_jobpart``."""
    held_cte = held_join = ""
    held_col = "CAST(NULL AS DOUBLE) AS held_idle_s"
    if have_states:
        held_cte = """
        , jheld AS (
            SELECT global_job_id, run_index, sum(held_us) / 1e6 AS held_idle_s
            FROM _eff_jobpart WHERE held_us IS NOT NULL GROUP BY ALL
        )"""
        held_join = "LEFT JOIN jheld USING (global_job_id, run_index)"
        held_col = "coalesce(jheld.held_idle_s, 0.0) AS held_idle_s"
    sql = f"""
        WITH per_gpu2 AS (
            SELECT * FROM _eff_jobpart WHERE cov_us IS NOT NULL
        ), agg AS (
            SELECT global_job_id, run_index, sum(cov_us) / {_US}.0 AS cov,
                   -- a run on GPUs of several models names them all
                   string_agg(DISTINCT device_name, ' + ' ORDER BY device_name) AS device_name,
                   {_mean_us("util", "cov_u_us")} AS util,
                   {_mean_us("power", "cov_p_us")} AS power,
                   {_mean_us("maxp", "cov_p_us")} AS maxp,
                   {_mean_us("pif", "cov_p_us")} AS pif,
                   {exact_sum('ach * pif * cov_p_us', 'pif IS NOT NULL')}
                     / nullif({exact_sum('ach * cov_p_us', 'pif IS NOT NULL')}, 0) AS rfu_frac,
                   {exact_sum('energy_j')} AS energy_j
            FROM per_gpu2 GROUP BY ALL
        ), smp AS (
            SELECT global_job_id, run_index, CAST(sum(samples) AS BIGINT) AS samples
            FROM _eff_jobpart WHERE samples IS NOT NULL GROUP BY ALL
        ), cnt AS (
            SELECT global_job_id, run_index, count(*) FILTER (WHERE NOT is_mig) AS gpus,
                   count(*) FILTER (WHERE is_mig) AS mig_devices
            FROM _eff_jobgpu GROUP BY ALL
        ){held_cte}, out AS (
            SELECT j.global_job_id, j.run_index, j.host, agg.device_name,
                   coalesce(cnt.gpus, 0) AS gpus, coalesce(cnt.mig_devices, 0) AS mig_devices,
                   j.cs, j.ce, j.clipped_start, j.clipped_end, (j.ce - j.cs) / {_US}.0 AS duration_s,
                   coalesce(smp.samples, 0) AS samples,
                   CASE WHEN coalesce(cnt.gpus, 0) = 0 OR j.ce <= j.cs OR agg.cov IS NULL THEN 0.0
                        ELSE least(agg.cov / (cnt.gpus * (j.ce - j.cs) / {_US}.0), 1.0) END AS sample_coverage,
                   agg.util, agg.power, agg.maxp, agg.pif,
                   {clip_sql("100.0 * agg.rfu_frac", 0.0, 100.0)} AS rfu_pct,
                   agg.energy_j, j.is_backfill, {held_col}
            FROM _eff_jobruns j
            LEFT JOIN agg USING (global_job_id, run_index)
            LEFT JOIN smp USING (global_job_id, run_index)
            LEFT JOIN cnt USING (global_job_id, run_index)
            {held_join}
        )
        SELECT global_job_id, run_index, host, device_name, gpus, mig_devices,
               {_ts("cs")} AS run_start_utc, {_ts("ce")} AS run_end_utc, clipped_start, clipped_end,
               duration_s, samples, sample_coverage,
               util AS util_pct, power AS power_w, maxp AS max_power_w, pif, rfu_pct,
               util - rfu_pct AS efficiency_gap_pp, {class_sql("util", "pif")} AS efficiency_class,
               energy_j / 3.6e6 AS energy_kwh, held_idle_s, is_backfill
        FROM out ORDER BY global_job_id, run_index
    """
    return conform(con.sql(sql).to_arrow_table(), JOB_EFFICIENCY)


# --------------------------------------------------------------------------------------------------
# Fleet / daily roll-ups
# --------------------------------------------------------------------------------------------------


def efficiency_daily(hourly: pa.Table, held_idle: pa.Table | None, day_start_utc: dt.datetime) -> pa.Table:
    """``metrics/efficiency_daily`` from one day's hourly table (and held-idle intervals, if detected)."""
    con = db_connect()
    try:
        con.register("hourly", hourly)
        held_sql = "SELECT CAST(NULL AS VARCHAR) AS device_name, CAST(NULL AS DOUBLE) AS duration_s LIMIT 0"
        if held_idle is not None:
            con.register("held", held_idle)
            held_sql = "SELECT device_name, duration_s FROM held"
        have_held = "true" if held_idle is not None else "false"
        t = con.sql(
            f"""
            WITH h AS (SELECT coalesce(device_name, 'unknown') AS device_name, * EXCLUDE (device_name) FROM hourly),
            hi AS (SELECT coalesce(device_name, 'unknown') AS device_name, duration_s FROM ({held_sql})),
            per AS (
                SELECT GROUPING(device_name) AS is_all, device_name,
                       count(DISTINCT gpu_id) AS gpus, {exact_sum('coverage_s')} / 3600.0 AS gpu_hours_sampled,
                       {exact_weighted_avg("util_pct", _UTIL_W)} AS util_pct,
                       100.0 * {_RFU_NUM} / nullif({_RFU_DEN}, 0) AS rfu_pct_fleet,
                       {exact_sum('energy_kwh')} AS energy_kwh
                FROM h GROUP BY GROUPING SETS ((device_name), ())
            ), held_per AS (
                SELECT GROUPING(device_name) AS is_all, device_name, {exact_sum('duration_s')} / 3600.0 AS held_h
                FROM hi GROUP BY GROUPING SETS ((device_name), ())
            )
            SELECT ? AS day_start_utc,
                   CASE WHEN per.is_all = 1 THEN 'ALL' ELSE per.device_name END AS device_name,
                   coalesce(per.gpus, 0) AS gpus, coalesce(per.gpu_hours_sampled, 0.0) AS gpu_hours_sampled,
                   per.util_pct, per.rfu_pct_fleet, per.energy_kwh,
                   CASE WHEN {have_held} THEN coalesce(held_per.held_h, 0.0) END AS held_idle_gpu_hours
            FROM per LEFT JOIN held_per
              ON per.is_all = held_per.is_all AND per.device_name IS NOT DISTINCT FROM held_per.device_name
            ORDER BY per.is_all DESC, per.device_name
            """,
            params=[day_start_utc],
        ).to_arrow_table()
    finally:
        con.close()
    return conform(t, EFFICIENCY_DAILY)


def fleet_rfu(hourly: pa.Table, tz: str = "UTC") -> dict[str, dict[str, float | None]]:
    """Capability-weighted fleet RFU (%) per day (in ``tz``) and device class:
    ``{"2025-08-05": {"ALL": 41.2, "NVIDIA A100-SXM4-80GB": 55.0, ...}}`` --
    ``100 x sum(realized_tflops x power_coverage_s) / sum(achievable_tflops x power_coverage_s)`` over
    GPU-hours with a PIF (``coverage_s`` where a day was written without it); None for a class
    without any."""
    con = db_connect()
    try:
        con.register("hourly", hourly)
        rows = con.execute(
            f"""
            SELECT day, GROUPING(device_name) AS is_all, device_name,
                   100.0 * {_RFU_NUM} / nullif({_RFU_DEN}, 0)
            FROM (SELECT CAST(timezone(?, hour_start_utc) AS DATE) AS day,
                         coalesce(device_name, 'unknown') AS device_name, realized_tflops, achievable_tflops,
                         coverage_s, {_POWER_W} AS power_coverage_s, pif FROM hourly)
            GROUP BY GROUPING SETS ((day, device_name), (day))
            ORDER BY day, is_all DESC, device_name
            """,
            [tz],
        ).fetchall()
    finally:
        con.close()
    out: dict[str, dict[str, float | None]] = {}
    for day, is_all, device, value in rows:
        out.setdefault(day.isoformat(), {})["ALL" if is_all else device] = (
            None if value is None else float(value)
        )
    return out
