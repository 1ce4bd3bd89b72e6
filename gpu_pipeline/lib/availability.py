"""Backfill availability periods (DESIGN.md 5.3), in DuckDB SQL over the 5-minute GPU states.

A *period* is a maximal interval in which a GPU could take a backfill job: its primary slot is not
Claimed and the GPU is neither dropped out nor drained, and no backfill job runs on it. On the
per-GPU state table (:data:`~gpu_pipeline.lib.schemas.GPU_STATES`) these are the runs of
consecutive buckets whose state is one of :data:`AVAILABLE_STATES`:

* ``idle_prioritized`` / ``idle_shared`` -- the primary slot is Unclaimed;
* ``idle_backfill`` counts too: the GPU was seen only through an Unclaimed backfill slot (no
  primary row named it), so it was free and a backfill job could have started on it. Its period
  gets the tier ``backfill`` unless the same period also saw the primary slot (then that tier).

Timing. Snapshots are points in time, so a period runs from the first snapshot that saw the GPU
available to the first snapshot that saw it otherwise. The time of a bucket's observation is the
bucket's ``snapshot_utc`` (the snapshot its state was taken from, possibly an earlier snapshot
carried into a bucket that had none); a GPU absent from the bucket's snapshot (``na`` /
``dropout``) is dated by the bucket's first snapshot (from the clean slot snapshots when they are
passed, else the earliest ``snapshot_utc`` of any GPU in that bucket); a bucket without any
snapshot (``no_snapshot``) by its start. Buckets that carry the same snapshot have the same state,
so at a cadence of a bucket or slower a period's start and end are exact snapshot times. With
snapshots faster than a bucket, a bucket's time is the snapshot its state came from (the latest of
its highest rank), not the first snapshot seen available or otherwise: an end may then be off by up
to a bucket plus the cadence, more than ``resolution_s`` (the interval between those bucket
snapshots) says (README, availability_periods).

``resolution_s`` (per row) bounds the timing error: the true start lies in the interval between
the snapshot before ``start_utc`` and ``start_utc``, the true end between the last snapshot seen
available and ``end_utc``; ``resolution_s`` is the longer of those two snapshot intervals (those at
clipped day boundaries are exact and left out; when both ends are clipped it is the day's median
snapshot interval, the observed cadence).

End reasons, from the first observation after the period:

* ``backfill_claimed`` -- ``busy_backfill`` (``backfill_job_id`` = that observation's job), or ``na``
  with its backfill slot ``Matched`` (a job being started there, not named yet);
* ``primary_claimed``  -- ``busy_prioritized`` / ``busy_shared``, or ``na`` with its slot ``Matched``;
* ``dropout``          -- ``na`` with ``na_reason`` ``dropout`` (GPU absent from the snapshot) or
  ``no_snapshot`` (the collector saw nothing);
* ``drained``          -- ``na`` with another slot state as reason (Drained, Owner, Preempting, ...);
* ``open``             -- still available at the last observation of the day.

Day boundaries. Periods are clipped to the partition day ``[start_utc, end_utc)`` (23 or 25 hours
on DST days of a local partition zone; the caller passes the window). An ``open`` piece ends at the
day end with ``continues_after_day = true``. ``starts_before_day`` is looked up in the previous
day's states (pass them in the same relation; only its last bucket per GPU is read):

* ``true``  -- the GPU was available at the previous day's last observation; the piece starts at
  the day start. If the day's first observation already shows it otherwise, a short *closing
  piece* ``[day start, that observation)`` is emitted with the real end reason, because the period
  ends at the first snapshot seen otherwise even when that is after midnight. The piece is empty
  (end = start) when that observation is a snapshot taken just before midnight and carried into
  the day's first bucket; a GPU not seen in the day at all (its host down) gets a ``dropout``
  closing piece up to the day's first observation;
* ``false`` -- the previous day is present and the GPU was not available at its end (or was not
  seen that day), or the period starts after the day's first bucket;
* ``null``  -- the period is available in the day's first bucket and the previous day's states are
  not in the relation (no rows before the day start): unknown. The start is then the first
  snapshot seen available (clipped to the day start).

:func:`stitched_periods_sql` joins the clipped pieces of several days back into whole periods
(a piece that continues after its day is followed by the next day's piece that starts before its
day at exactly that instant). :func:`compute_availability_summary` summarizes the *whole* periods
that end in the day (see its docstring).
"""

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.db import exact_avg, exact_sum
from gpu_pipeline.lib.schemas import TS, TableSpec, _f, conform
from gpu_pipeline.lib.states import part_gap_sql

BUCKET = dt.timedelta(minutes=5)
#: States in which a GPU can take a backfill job.
AVAILABLE_STATES: tuple[str, ...] = ("idle_prioritized", "idle_shared", "idle_backfill")
END_REASONS: tuple[str, ...] = ("backfill_claimed", "primary_claimed", "dropout", "drained", "open")
#: Label of the aggregate rows of the summary.
ALL = "ALL"

AVAILABILITY_PERIODS = TableSpec(
    layer="metrics",
    name="availability_periods",
    description=(
        "Backfill availability periods (DESIGN.md 5.3): maximal intervals in which a GPU's primary slot "
        "was not Claimed and the GPU was not dropped out, drained or running a backfill job, from the "
        "first snapshot seen available to the first snapshot seen otherwise. Clipped to the partition "
        "day; stitch pieces across days with availability.stitched_periods_sql."
    ),
    key=("gpu_id", "start_utc"),
    schema=pa.schema(
        [
            _f("gpu_id", pa.string(), "HTCondor short GPU id", nullable=False),
            _f("host", pa.string(), "Host of the GPU", nullable=False),
            _f("device_name", pa.string(), "GPU model name"),
            _f("tier", pa.string(), "priority or shared (tier of the primary slot seen idle); backfill when "
               "the GPU was seen idle only through a backfill slot (idle_backfill)", nullable=False),
            _f("start_utc", TS, "First snapshot that saw the GPU available (the day start when the period "
               "began before the day)", nullable=False),
            _f("end_utc", TS, "First snapshot that saw the GPU otherwise (the day end when still open)",
               nullable=False),
            _f("duration_s", pa.float64(), "end_utc - start_utc of this piece (s)", nullable=False),
            _f("end_reason", pa.string(), "One of " + ", ".join(END_REASONS), nullable=False),
            _f("backfill_job_id", pa.string(), "GlobalJobId of the backfill job that claimed the GPU "
               "(end_reason backfill_claimed)"),
            _f("resolution_s", pa.float64(), "Timing uncertainty: the longest snapshot interval bounding the "
               "start or end (the day's median snapshot interval when both ends are clipped)", nullable=False),
            _f("starts_before_day", pa.bool_(), "The period was already available at the previous day's last "
               "observation; null when the previous day's states were not available and the GPU was "
               "available in the day's first bucket"),
            _f("continues_after_day", pa.bool_(), "Still available at the day's last observation "
               "(end_reason open, end_utc = day end)", nullable=False),
        ]
    ),
)

AVAILABILITY_SUMMARY = TableSpec(
    layer="metrics",
    name="availability_summary",
    description=(
        "Availability periods summarized per device_name x tier, with ALL rows (per device, per tier, "
        "and overall). Duration statistics are over whole periods (pieces of earlier days stitched on) "
        "that ended in the day; periods still open at the day end are only counted."
    ),
    key=("device_name", "tier"),
    schema=pa.schema(
        [
            _f("device_name", pa.string(), "GPU model name, or ALL"),
            _f("tier", pa.string(), "priority, shared, backfill, or ALL", nullable=False),
            _f("periods", pa.int64(), "Whole periods that ended in the day (end_reason not open)", nullable=False),
            _f("periods_open_at_day_end", pa.int64(), "Periods still available at the day end (not in the "
               "duration statistics; counted on the day they end)", nullable=False),
            _f("periods_start_truncated", pa.int64(), "Ended periods whose start lies before the days read "
               "(starts_before_day true or unknown on their first piece): their duration is a lower bound",
               nullable=False),
            _f("available_gpu_hours", pa.float64(), "GPU-hours available within the day: sum of the day's "
               "clipped pieces, open ones included", nullable=False),
            _f("duration_mean_s", pa.float64(), "Mean whole-period duration (s)"),
            _f("duration_median_s", pa.float64(), "Median whole-period duration (s, interpolated)"),
            _f("duration_p90_s", pa.float64(), "90th percentile of whole-period duration (s, interpolated)"),
            _f("duration_min_s", pa.float64(), "Shortest whole period (s)"),
            _f("duration_max_s", pa.float64(), "Longest whole period (s)"),
            _f("duration_std_s", pa.float64(), "Sample standard deviation of duration (s); null below 2 periods"),
            _f("backfill_claims", pa.int64(), "Ended periods with end_reason backfill_claimed", nullable=False),
            _f("time_to_claim_mean_s", pa.float64(), "Mean duration of the periods a backfill job ended (s): "
               "time from the GPU becoming available to a backfill claim"),
            _f("time_to_claim_median_s", pa.float64(), "Median time to a backfill claim (s, interpolated)"),
            _f("time_to_claim_p90_s", pa.float64(), "90th percentile of time to a backfill claim (s)"),
            _f("resolution_median_s", pa.float64(), "Median timing resolution of the ended periods (s)"),
        ]
    ),
)


_PERIODS_SQL = """
WITH
params AS (
    SELECT CAST($start AS TIMESTAMPTZ) AS s, CAST($end AS TIMESTAMPTZ) AS e,
           CAST($bucket_s AS DOUBLE) AS bucket_s,
           to_microseconds(CAST($bucket_s * 1000000 AS BIGINT)) AS bucket
),
src AS (SELECT * FROM {states}),
prev_exists AS (SELECT count(*) > 0 AS known FROM src, params WHERE src.bucket_start_utc < params.s),
-- host and device are constant per GPU and day (the GPUs seen in the day)
day_gpus AS (
    SELECT gpu_id, arg_max(host, bucket_start_utc) AS host, max(device_name) AS device_name
    FROM src, params WHERE src.bucket_start_utc >= params.s GROUP BY gpu_id
),
snap_times AS ({snap_times}),
snap_gaps AS (SELECT epoch(t) - epoch(lag(t) OVER (ORDER BY t)) AS d FROM snap_times),
cadence AS (
    -- the gaps between snapshots, not between the parts of one (states.SNAPSHOT_PARTS_MAX_US)
    SELECT coalesce(median(d), (SELECT bucket_s FROM params)) AS cadence_s
    FROM snap_gaps, ({part_gap}) pg WHERE d > pg.p
),
-- first snapshot of each bucket: from the clean snapshots when given, else from the states
clean_first AS (
    SELECT params.s + to_microseconds(
               CAST(floor((epoch_us(t) - epoch_us(params.s)) / (params.bucket_s * 1e6)) AS BIGINT)
               * CAST(params.bucket_s * 1e6 AS BIGINT)) AS bucket_start_utc,
           min(t) AS first_snap
    FROM {clean_times}, params
    GROUP BY 1
),
state_first AS (
    SELECT bucket_start_utc, min(snapshot_utc) AS first_snap FROM src GROUP BY 1
),
obs AS (
    SELECT r.gpu_id, r.bucket_start_utc, r.state, r.tier, r.global_job_id,
           r.na_reason, r.slot_name,
           coalesce(r.snapshot_utc, cf.first_snap, sf.first_snap, r.bucket_start_utc) AS obs_utc,
           r.bucket_start_utc < params.s AS is_prev,
           r.state IN ('idle_prioritized', 'idle_shared', 'idle_backfill') AS avail
    FROM src r
    CROSS JOIN params
    LEFT JOIN clean_first cf ON cf.bucket_start_utc = r.bucket_start_utc
    LEFT JOIN state_first sf ON sf.bucket_start_utc = r.bucket_start_utc
),
-- run-length encoding: the rows that differ from the bucket before (a self-join on the 5-minute
-- grid of gpu_states, much cheaper than a window over every row); the rest runs on these few rows
seg_starts AS (
    SELECT o.*, p.obs_utc AS prev_obs
    FROM obs o
    LEFT JOIN (
        SELECT gpu_id, bucket_start_utc + params.bucket AS next_bucket, avail, tier, obs_utc
        FROM obs, params
    ) p ON p.gpu_id = o.gpu_id AND p.next_bucket = o.bucket_start_utc
    WHERE p.gpu_id IS NULL OR o.avail <> p.avail OR (o.avail AND o.tier IS DISTINCT FROM p.tier)
),
segs AS (
    SELECT *,
           coalesce(lag(avail) OVER w, false) AS prev_seg_avail,
           lead(state) OVER w AS next_state,
           lead(obs_utc) OVER w AS next_obs,
           lead(global_job_id) OVER w AS next_job,
           lead(na_reason) OVER w AS next_na_reason,
           lead(slot_name) OVER w AS next_slot,
           lead(prev_obs) OVER w AS seg_last_obs
    FROM seg_starts
    WINDOW w AS (PARTITION BY gpu_id ORDER BY bucket_start_utc)
),
islands AS (
    SELECT *,
           sum(CASE WHEN avail AND NOT prev_seg_avail THEN 1 ELSE 0 END)
               OVER (PARTITION BY gpu_id ORDER BY bucket_start_utc ROWS UNBOUNDED PRECEDING) AS island
    FROM segs
),
periods AS (
    SELECT gpu_id, island,
           arg_min(tier, (tier = 'backfill', bucket_start_utc)) AS tier,
           min(bucket_start_utc) AS first_bucket,
           bool_or(is_prev) AS has_prev_row,
           min(obs_utc) AS start_obs,
           arg_min_null(prev_obs, bucket_start_utc) AS before_obs,
           arg_max_null(seg_last_obs, bucket_start_utc) AS last_obs,
           arg_max_null(next_state, bucket_start_utc) AS next_state,
           arg_max_null(next_obs, bucket_start_utc) AS next_obs,
           arg_max_null(next_job, bucket_start_utc) AS next_job,
           arg_max_null(next_na_reason, bucket_start_utc) AS next_na_reason,
           arg_max_null(next_slot, bucket_start_utc) AS next_slot
    FROM islands
    WHERE avail
    GROUP BY gpu_id, island
),
shaped AS (
    SELECT p.*, dg.host, dg.device_name,
           CASE WHEN has_prev_row THEN params.s ELSE greatest(start_obs, params.s) END AS start_utc,
           CASE WHEN next_state IS NULL THEN params.e ELSE least(greatest(next_obs, params.s), params.e)
           END AS end_utc,
           CASE
               WHEN next_state IS NULL THEN 'open'
               WHEN next_state = 'busy_backfill' THEN 'backfill_claimed'
               WHEN next_state IN ('busy_prioritized', 'busy_shared') THEN 'primary_claimed'
               -- a slot Matched: a job is being started on it, a claim (the job not named yet)
               WHEN next_na_reason = 'Matched' AND contains(lower(next_slot), 'backfill') THEN 'backfill_claimed'
               WHEN next_na_reason = 'Matched' THEN 'primary_claimed'
               WHEN next_na_reason IS NULL OR next_na_reason IN ('dropout', 'no_snapshot') THEN 'dropout'
               ELSE 'drained'
           END AS end_reason,
           CASE
               WHEN has_prev_row THEN true
               WHEN pe.known THEN false
               WHEN first_bucket = params.s THEN NULL
               ELSE false
           END AS starts_before_day,
           CASE WHEN has_prev_row OR before_obs IS NULL THEN NULL
                ELSE epoch(start_obs) - epoch(before_obs) END AS start_gap_s,
           CASE WHEN next_state IS NULL OR last_obs IS NULL THEN NULL
                ELSE epoch(next_obs) - epoch(last_obs) END AS end_gap_s
    FROM periods p
    -- the GPUs seen in the day (one not seen at all: see vanished)
    JOIN day_gpus dg ON dg.gpu_id = p.gpu_id
    CROSS JOIN params
    CROSS JOIN prev_exists pe
),
-- available at the previous day's last bucket and not seen in the day at all (its host gone): the
-- period ends as a dropout at the day's first snapshot (the day's start when the collector saw
-- nothing); not the first bucket's snapshot, which is the last one before midnight when the
-- collector missed that bucket
vanished AS (
    SELECT r.gpu_id, r.host, r.device_name, r.tier
    FROM src r, params
    WHERE r.bucket_start_utc < params.s AND r.state IN ('idle_prioritized', 'idle_shared', 'idle_backfill')
      AND r.gpu_id NOT IN (SELECT gpu_id FROM day_gpus)
),
day_first AS (
    SELECT least(coalesce(
               (SELECT min(first_snap) FROM clean_first WHERE first_snap >= params.s AND first_snap < params.e),
               (SELECT min(snapshot_utc) FROM src WHERE snapshot_utc >= params.s AND snapshot_utc < params.e),
               params.s), params.e) AS t
    FROM params
),
pieces AS (
    SELECT gpu_id, host, device_name, tier, start_utc, end_utc, end_reason, next_job, start_gap_s,
           end_gap_s, starts_before_day
    FROM shaped
    UNION ALL
    SELECT v.gpu_id, v.host, v.device_name, v.tier, params.s, d.t, 'dropout', NULL, NULL, NULL, true
    FROM vanished v, day_first d, params
)
SELECT
    gpu_id, host, device_name, tier, start_utc, end_utc,
    epoch(end_utc) - epoch(start_utc) AS duration_s,
    end_reason,
    CASE WHEN end_reason = 'backfill_claimed' THEN next_job END AS backfill_job_id,
    coalesce(greatest(start_gap_s, end_gap_s), c.cadence_s) AS resolution_s,
    starts_before_day,
    end_reason = 'open' AS continues_after_day
FROM pieces
CROSS JOIN cadence c
-- a closing piece is kept even when empty: the period ended at the day's start (the first
-- observation of the day was carried from a snapshot just before midnight)
WHERE end_utc > start_utc OR (starts_before_day AND end_reason <> 'open')
ORDER BY host, gpu_id, start_utc
"""

_STATE_SNAP_TIMES = """
    SELECT DISTINCT snapshot_utc AS t FROM src, params
    WHERE snapshot_utc IS NOT NULL AND snapshot_utc >= params.s AND snapshot_utc < params.e
"""
_NO_CLEAN_TIMES = "(SELECT CAST(NULL AS TIMESTAMPTZ) AS t LIMIT 0)"


def compute_availability_periods(
    con: duckdb.DuckDBPyConnection,
    states_from_sql: str,
    params: list,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    snapshots_from_sql: str | None = None,
    snapshot_params: list | None = None,
    bucket: dt.timedelta = BUCKET,
) -> pa.Table:
    """Availability periods of the day ``[start_utc, end_utc)``, clipped to it.

    ``states_from_sql`` / ``params``: a FROM-clause over ``metrics/gpu_states`` (e.g.
    ``Store.relation_sql(GPU_STATES, [previous_day, day])``). Include the previous day to fill
    ``starts_before_day`` (only its last bucket is read); rows outside the day are ignored.
    ``snapshots_from_sql`` / ``snapshot_params`` (optional): a FROM-clause over
    ``clean/slot_snapshots`` of the day, giving the exact time of snapshots that did not name a
    GPU (dropouts) and the cadence even when every GPU dropped out.
    """
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _avail_states AS SELECT bucket_start_utc, gpu_id, host, device_name, "
        "state, tier, global_job_id, snapshot_utc, na_reason, "
        # the slot only where its kind decides the end reason (a Matched slot's claim)
        "CASE WHEN na_reason = 'Matched' THEN slot_name END AS slot_name "
        f"FROM {states_from_sql} "
        "WHERE bucket_start_utc >= CAST(? AS TIMESTAMPTZ) AND bucket_start_utc < CAST(? AS TIMESTAMPTZ)",
        [*params, start_utc - bucket, end_utc],
    )
    clean_times = _NO_CLEAN_TIMES
    snap_times = _STATE_SNAP_TIMES
    if snapshots_from_sql is not None:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _avail_snaps AS SELECT DISTINCT snapshot_utc AS t "
            f"FROM {snapshots_from_sql} WHERE snapshot_utc >= CAST(? AS TIMESTAMPTZ) "
            "AND snapshot_utc < CAST(? AS TIMESTAMPTZ)",
            [*(snapshot_params or []), start_utc, end_utc],
        )
        clean_times = "_avail_snaps"
        snap_times = "SELECT t FROM _avail_snaps"
    try:
        sql = _PERIODS_SQL.format(states="_avail_states", snap_times=snap_times, clean_times=clean_times,
                                  part_gap=part_gap_sql("snap_gaps", "d", 1e-6))
        table = con.sql(
            sql,
            params={"start": start_utc, "end": end_utc, "bucket_s": bucket.total_seconds()},
        ).to_arrow_table()
    finally:
        con.execute("DROP TABLE IF EXISTS _avail_states")
        con.execute("DROP TABLE IF EXISTS _avail_snaps")
    return conform(table, AVAILABILITY_PERIODS)


def availability_periods_from_tables(
    states: pa.Table,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    previous_states: pa.Table | None = None,
    snapshots: pa.Table | None = None,
) -> pa.Table:
    """Convenience for tests and small inputs: periods from in-memory state tables."""
    con = db_connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        both = states if previous_states is None else pa.concat_tables([previous_states, states])
        con.register("_states_in", both)
        if snapshots is not None:
            con.register("_snaps_in", snapshots)
        return compute_availability_periods(
            con, "_states_in", [], start_utc, end_utc, "_snaps_in" if snapshots is not None else None
        )
    finally:
        con.close()


def stitched_periods_sql(pieces_from_sql: str) -> str:
    """SQL (a SELECT, usable as a view body) joining clipped pieces into whole periods.

    ``pieces_from_sql`` is a FROM-clause over ``metrics/availability_periods`` of several days.
    A piece joins the one before it (same GPU) when that one ``continues_after_day``, this one
    ``starts_before_day`` and it starts exactly where the earlier one ended (the day boundary).
    The result has the columns of :data:`AVAILABILITY_PERIODS` plus ``n_pieces``; there
    ``starts_before_day`` / ``continues_after_day`` describe the stitched period's first / last
    piece, i.e. true/null when the period is still cut off by a day that was not read.
    """
    return f"""
    WITH pieces AS (SELECT * FROM {pieces_from_sql}),
    marked AS (
        SELECT *,
               CASE WHEN coalesce(starts_before_day, false)
                         AND coalesce(lag(continues_after_day) OVER w, false)
                         AND lag(end_utc) OVER w = start_utc
                    THEN 0 ELSE 1 END AS new_period
        FROM pieces
        WINDOW w AS (PARTITION BY gpu_id ORDER BY start_utc, end_utc)
    ),
    numbered AS (
        SELECT *, sum(new_period) OVER (PARTITION BY gpu_id ORDER BY start_utc, end_utc
                                        ROWS UNBOUNDED PRECEDING) AS period_no
        FROM marked
    )
    SELECT gpu_id,
           arg_max(host, start_utc) AS host,
           arg_max(device_name, (device_name IS NOT NULL, start_utc)) AS device_name,
           arg_min(tier, (tier = 'backfill', start_utc)) AS tier,
           min(start_utc) AS start_utc,
           max(end_utc) AS end_utc,
           epoch(max(end_utc)) - epoch(min(start_utc)) AS duration_s,
           arg_max(end_reason, start_utc) AS end_reason,
           arg_max_null(backfill_job_id, start_utc) AS backfill_job_id,
           max(resolution_s) AS resolution_s,
           arg_min_null(starts_before_day, start_utc) AS starts_before_day,
           arg_max(continues_after_day, start_utc) AS continues_after_day,
           count(*) AS n_pieces
    FROM numbered
    GROUP BY gpu_id, period_no
    """


#: Days before a day whose pieces are stitched with its own into the whole periods that end in it
#: (the summary, and the duration plots): a longer period is a lower bound.
WHOLE_PERIOD_LOOKBACK_DAYS = 7


def whole_periods_ending(con: duckdb.DuckDBPyConnection, pieces_from_sql: str, params: list,
                         start_utc: dt.datetime, end_utc: dt.datetime) -> pa.Table:
    """The whole (stitched) periods whose last piece lies in the day, as the summary takes them
    (ending in ``(start_utc, end_utc]``, or at ``start_utc`` without going on: the day's empty
    closing piece): those that ended in the day, and those still open at its end (``open``);
    ``pieces_from_sql`` should hold
    the day's pieces and :data:`WHOLE_PERIOD_LOOKBACK_DAYS` before. Columns of
    :data:`AVAILABILITY_PERIODS`; ``starts_before_day`` true where a period is still cut off by the
    first day read."""
    sql = (f"SELECT * EXCLUDE (n_pieces) FROM ({stitched_periods_sql(pieces_from_sql)}) "
           "WHERE (end_utc > ? OR (end_utc = ? AND NOT continues_after_day)) AND end_utc <= ? "
           "ORDER BY host, gpu_id, start_utc")
    return conform(con.sql(sql, params=[*params, start_utc, start_utc, end_utc]).to_arrow_table(),
                   AVAILABILITY_PERIODS)


def stitch_periods(con: duckdb.DuckDBPyConnection, pieces_from_sql: str, params: list) -> pa.Table:
    """Whole periods from the pieces of several days (see :func:`stitched_periods_sql`)."""
    sql = stitched_periods_sql(pieces_from_sql) + " ORDER BY host, gpu_id, start_utc"
    return con.sql(sql, params=params).to_arrow_table()


# Sums and means the same on every run (lib.db.exact_sum)
_SUMMARY_SUMS = {
    "piece_seconds": exact_sum("epoch(least(end_utc, params.e)) - epoch(greatest(start_utc, params.s))"),
    "mean_duration": exact_avg("duration_s", "ended"),
    "mean_claim": exact_avg("duration_s", "ended AND end_reason = 'backfill_claimed'"),
    "sum_h": exact_sum("h"),
}

_SUMMARY_SQL = """
WITH
params AS (SELECT CAST($start AS TIMESTAMPTZ) AS s, CAST($end AS TIMESTAMPTZ) AS e),
pieces AS (SELECT * FROM _avail_pieces),
whole AS ({stitched}),
-- whole periods whose last piece lies in the day (one that ended at the day's start: the day's
-- empty closing piece, the only piece that ends there without continuing after its day)
rows AS (
    SELECT w.*,
           NOT w.continues_after_day AS ended,
           w.continues_after_day AS open_at_end,
           coalesce(w.starts_before_day, true) AS truncated
    FROM whole w, params
    WHERE (w.end_utc > params.s OR (w.end_utc = params.s AND NOT w.continues_after_day)) AND w.end_utc <= params.e
),
day_hours AS (
    SELECT device_name, tier,
           {piece_seconds} / 3600.0 AS h
    FROM pieces, params
    WHERE end_utc > params.s AND start_utc < params.e
    GROUP BY ALL
),
stats AS (
    SELECT
        CASE WHEN grouping(device_name) = 1 THEN 'ALL' ELSE device_name END AS device_name,
        CASE WHEN grouping(tier) = 1 THEN 'ALL' ELSE tier END AS tier,
        count(*) FILTER (WHERE ended) AS periods,
        count(*) FILTER (WHERE open_at_end) AS periods_open_at_day_end,
        count(*) FILTER (WHERE ended AND truncated) AS periods_start_truncated,
        {mean_duration} AS duration_mean_s,
        quantile_cont(duration_s, 0.5) FILTER (WHERE ended) AS duration_median_s,
        quantile_cont(duration_s, 0.9) FILTER (WHERE ended) AS duration_p90_s,
        min(duration_s) FILTER (WHERE ended) AS duration_min_s,
        max(duration_s) FILTER (WHERE ended) AS duration_max_s,
        -- one thread over the sorted durations: the same bits on every run (a parallel stddev_samp
        -- merges its partial states in whatever order the threads finish)
        list_aggregate(list(duration_s ORDER BY duration_s) FILTER (WHERE ended), 'stddev_samp')
            AS duration_std_s,
        count(*) FILTER (WHERE ended AND end_reason = 'backfill_claimed') AS backfill_claims,
        {mean_claim} AS time_to_claim_mean_s,
        quantile_cont(duration_s, 0.5) FILTER (WHERE ended AND end_reason = 'backfill_claimed')
            AS time_to_claim_median_s,
        quantile_cont(duration_s, 0.9) FILTER (WHERE ended AND end_reason = 'backfill_claimed')
            AS time_to_claim_p90_s,
        quantile_cont(resolution_s, 0.5) FILTER (WHERE ended) AS resolution_median_s
    FROM rows
    GROUP BY GROUPING SETS ((device_name, tier), (device_name), (tier), ())
),
hours AS (
    SELECT CASE WHEN grouping(device_name) = 1 THEN 'ALL' ELSE device_name END AS device_name,
           CASE WHEN grouping(tier) = 1 THEN 'ALL' ELSE tier END AS tier,
           {sum_h} AS available_gpu_hours
    FROM day_hours
    GROUP BY GROUPING SETS ((device_name, tier), (device_name), (tier), ())
),
joined AS (
    SELECT coalesce(st.device_name, h.device_name) AS device_name,
           coalesce(st.tier, h.tier) AS tier,
           st.* EXCLUDE (device_name, tier),
           h.available_gpu_hours
    FROM stats st
    FULL OUTER JOIN hours h
      ON h.device_name IS NOT DISTINCT FROM st.device_name AND h.tier IS NOT DISTINCT FROM st.tier
)
SELECT device_name, coalesce(tier, 'ALL') AS tier,
       coalesce(periods, 0) AS periods,
       coalesce(periods_open_at_day_end, 0) AS periods_open_at_day_end,
       coalesce(periods_start_truncated, 0) AS periods_start_truncated,
       coalesce(available_gpu_hours, 0.0) AS available_gpu_hours,
       duration_mean_s, duration_median_s, duration_p90_s, duration_min_s,
       duration_max_s, duration_std_s,
       coalesce(backfill_claims, 0) AS backfill_claims,
       time_to_claim_mean_s, time_to_claim_median_s, time_to_claim_p90_s,
       resolution_median_s
FROM joined
ORDER BY device_name = 'ALL', device_name, tier = 'ALL', tier
"""


def compute_availability_summary(
    con: duckdb.DuckDBPyConnection,
    periods_from_sql: str,
    params: list,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
) -> pa.Table:
    """Summary of the day ``[start_utc, end_utc)`` per device_name x tier, with ALL rows.

    ``periods_from_sql`` / ``params``: a FROM-clause over ``metrics/availability_periods`` of the
    day *and the days before it* (a look-back of a week is plenty in practice). Pieces are stitched
    (:func:`stitched_periods_sql`) and every whole period is counted once, on the day it ends:

    * duration and time-to-claim statistics use the whole periods that *ended* in the day
      (``end_reason`` not ``open``), with their full stitched duration. A period whose first piece
      still ``starts_before_day`` (true or null: the look-back did not reach its start) is included
      with the duration that was seen and counted in ``periods_start_truncated``;
    * periods still open at the day end are counted in ``periods_open_at_day_end`` only;
    * ``available_gpu_hours`` is the day's own availability (sum of its clipped pieces);
    * percentiles are interpolated (``quantile_cont``); ``std`` is the sample standard deviation.

    Pieces starting after the day are ignored, so passing later days does not change the result.
    """
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE _avail_pieces AS SELECT * FROM {periods_from_sql} "
        "WHERE start_utc < CAST(? AS TIMESTAMPTZ)",
        [*params, end_utc],
    )
    try:
        sql = _SUMMARY_SQL.format(stitched=stitched_periods_sql("pieces"), **_SUMMARY_SUMS)
        table = con.sql(sql, params={"start": start_utc, "end": end_utc}).to_arrow_table()
    finally:
        con.execute("DROP TABLE IF EXISTS _avail_pieces")
    return conform(table, AVAILABILITY_SUMMARY)


def availability_summary_from_table(
    periods: pa.Table, start_utc: dt.datetime, end_utc: dt.datetime
) -> pa.Table:
    """Convenience for tests and small inputs: the summary of in-memory period pieces."""
    con = db_connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("_periods_in", periods)
        return compute_availability_summary(con, "_periods_in", [], start_utc, end_utc)
    finally:
        con.close()
