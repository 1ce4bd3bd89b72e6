"""Allocation by tier per 5-minute bucket and per day (DESIGN.md 5.2), in DuckDB SQL.

Computed from the clean slot snapshots, not from the per-GPU states: the tier belongs to a slot
*row*, and one GPU can have rows in two tiers at once (a prioritized GPU's primary slot and the
backfill slot that copies it from AvailableGPUs).

Per bucket ``b``, tier ``c`` (priority / shared / backfill) and device ``d``:

* ``claimed_gpus`` = unique GPUs with a ``Claimed`` row of tier ``c`` in the bucket's snapshots;
* ``total_gpus``   = unique GPUs with a ``Claimed`` or ``Unclaimed`` row of tier ``c``;
* ``allocation_pct`` = ``100 * claimed / total`` (null when ``total`` is 0).

A GPU counts as claimed in a tier if *any* of its rows of that tier is Claimed (a partitionable slot
lists every GPU of the host as Unclaimed while its dynamic slots hold some of them as Claimed; with
several snapshots in one bucket, Claimed in any of them wins, as in the state ranking). Rows in any
other state (Drained, Owner, Matched, Preempting, Backfill) are neither claimed nor capacity.

**The original tool's trap.** A prioritized GPU whose primary slot is Unclaimed while its backfill
slot runs a job counts as *unclaimed* in the priority tier (idle from the owner's point of view) and
*claimed* in the backfill tier. It stays in the priority totals; the per-GPU state table calls it
``busy_backfill``, which is why this module does not derive tiers from the winning state.

Extra rows:

* tier ``TOTAL``: every GPU once per bucket, the union over tiers: in ``total`` when any of its rows
  (any tier) is Claimed or Unclaimed, ``claimed`` when any of its rows is Claimed. Its claimed count
  is exactly the number of ``busy_*`` GPUs of the state table; its total is the number of GPUs
  whose state is not ``na``, plus the (rare) GPUs whose primary slot is in another state (Drained,
  Owner) while an Unclaimed backfill slot offers them -- the state ranking calls those ``na``, here
  they are backfill capacity;
* device ``ALL``: every device of the tier together. Rows of GPUs without a device name are
  grouped under ``unknown``.

Buckets and snapshots: exactly the assignment of :mod:`gpu_pipeline.lib.states` (the SQL below
reuses its CTEs): a bucket uses the snapshots taken inside it, else the latest earlier snapshot if
it is younger than the larger of ``STALE_FACTOR`` x the cadence in force after it (the median of
the five gaps around the next one) and 2 x cadence - half a bucket (one missed snapshot bridged); a bucket with neither is not covered and
has no rows (it is unknown, not zero). Only GPUs seen during the window count, as in the state table.

Rows per covered bucket: ``(tier, ALL)`` for the three tiers and ``TOTAL`` always (zeros included),
and ``(tier, device)`` for every pair with a slot row of any state during the window (zeros in
buckets where the pair has no Claimed/Unclaimed row: a drained tier shows 0 of 0 instead of
vanishing), so daily means are over the same buckets for every row.

Daily report (:func:`allocation_daily`): per tier and device, ``allocation_pct`` = mean of the
per-bucket pct over covered buckets with ``total > 0`` (the original tool's figure: on its 8-row
fixture Priority 25.0 % with avg 0.5 / 1.5 GPUs, i.e. the mean of 0 % and 50 %, not
avg_claimed / avg_total = 33 %), ``avg_claimed_gpus`` / ``avg_total_gpus`` = means over all covered
buckets, ``buckets`` = covered buckets, ``buckets_with_capacity`` = those with ``total > 0``,
``buckets_expected`` = buckets in the window (coverage).
"""

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa

from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, TIERS, TS, TableSpec, _f, conform
from gpu_pipeline.lib.states import BUCKET, LOOKBACK, STALE_FACTOR, with_bucket_snaps
from gpu_pipeline.lib.store import Store, connect

TOTAL_TIER = "TOTAL"
ALL_DEVICES = "ALL"
UNKNOWN_DEVICE = "unknown"
ALLOCATION_TIERS: tuple[str, ...] = (*TIERS, TOTAL_TIER)

ALLOCATION_BUCKETS = TableSpec(
    layer="metrics",
    name="allocation_buckets",
    description=(
        "Allocation by tier per 5-minute bucket (DESIGN.md 5.2), from the clean slot snapshots: per "
        "bucket, tier (priority / shared / backfill, and TOTAL = each GPU once) and device (and ALL), "
        "the unique GPUs Claimed and Claimed-or-Unclaimed. A prioritized GPU whose primary slot is "
        "Unclaimed while its backfill slot is Claimed is unclaimed in priority and claimed in backfill. "
        "Buckets without any snapshot (not even a carried one) have no rows."
    ),
    key=("bucket_start_utc", "tier", "device_name"),
    schema=pa.schema(
        [
            _f("bucket_start_utc", TS, "Start of the 5-minute bucket (UTC)", nullable=False),
            _f("tier", pa.string(), "priority, shared, backfill (tier of the slot row), or TOTAL (each "
               "GPU once: union over tiers)", nullable=False),
            _f("device_name", pa.string(), "GPU model name; ALL = every device; unknown = no name in "
               "the snapshots", nullable=False),
            _f("claimed_gpus", pa.int64(), "Unique GPUs with a Claimed row of the tier (TOTAL: of any "
               "tier)", nullable=False),
            _f("total_gpus", pa.int64(), "Unique GPUs with a Claimed or Unclaimed row of the tier "
               "(TOTAL: of any tier)", nullable=False),
            _f("allocation_pct", pa.float64(), "100 * claimed_gpus / total_gpus (null when total is 0)"),
        ]
    ),
)

ALLOCATION_DAILY = TableSpec(
    layer="metrics",
    name="allocation_daily",
    description=(
        "Daily allocation report by tier and device (DESIGN.md 5.2): allocation_pct = mean of the "
        "per-bucket pct over buckets with capacity; mean claimed and total GPUs over covered buckets."
    ),
    key=("day_start_utc", "tier", "device_name"),
    schema=pa.schema(
        [
            _f("day_start_utc", TS, "Start of the day (partition window) the row summarizes (UTC)",
               nullable=False),
            _f("tier", pa.string(), "priority, shared, backfill or TOTAL", nullable=False),
            _f("device_name", pa.string(), "GPU model name, or ALL", nullable=False),
            _f("allocation_pct", pa.float64(), "Mean over buckets with total_gpus > 0 of 100 * claimed / "
               "total (null when no bucket had capacity)"),
            _f("avg_claimed_gpus", pa.float64(), "Mean claimed GPUs over covered buckets", nullable=False),
            _f("avg_total_gpus", pa.float64(), "Mean Claimed-or-Unclaimed GPUs over covered buckets",
               nullable=False),
            _f("buckets", pa.int32(), "Covered buckets (with a snapshot of their own or carried)",
               nullable=False),
            _f("buckets_with_capacity", pa.int32(), "Covered buckets with total_gpus > 0", nullable=False),
            _f("buckets_expected", pa.int32(), "Buckets in the day", nullable=False),
        ]
    ),
)

# Columns of the clean slot table the allocation reads (the temp table holds only these).
ALLOCATION_COLUMNS = ("snapshot_utc", "gpu_id", "device_name", "tier", "slot_state")

_TIER_ORDER = ", ".join(f"'{t}'" for t in ALLOCATION_TIERS)

# The bucket -> snapshot assignment is states.py's own SQL; only what follows it differs.
_ALLOCATION_REST = f"""gpu_dev AS (
    SELECT gpu_id,
           coalesce(arg_max(device_name, (device_name IS NOT NULL, t_us)), '{UNKNOWN_DEVICE}') AS device_name
    FROM rows, params p
    WHERE rows.t_us >= p.s_us
    GROUP BY gpu_id
),
per_tier AS (
    SELECT bs.b_start_us, r.gpu_id, r.tier, bool_or(r.slot_state = 'Claimed') AS claimed
    FROM bucket_snaps bs JOIN rows r ON r.t_us = bs.t_us
    WHERE r.slot_state IN ('Claimed', 'Unclaimed')
    GROUP BY bs.b_start_us, r.gpu_id, r.tier
),
per_gpu AS (
    SELECT b_start_us, gpu_id, tier, claimed FROM per_tier
    UNION ALL
    SELECT b_start_us, gpu_id, '{TOTAL_TIER}' AS tier, bool_or(claimed) AS claimed
    FROM per_tier GROUP BY b_start_us, gpu_id
),
counts AS (
    SELECT pg.b_start_us, pg.tier,
           CASE WHEN grouping(d.device_name) = 1 THEN '{ALL_DEVICES}' ELSE d.device_name END AS device_name,
           count(*) FILTER (WHERE pg.claimed) AS claimed_gpus,
           count(*) AS total_gpus
    FROM per_gpu pg JOIN gpu_dev d ON d.gpu_id = pg.gpu_id
    GROUP BY GROUPING SETS ((pg.b_start_us, pg.tier, d.device_name), (pg.b_start_us, pg.tier))
),
covered AS (SELECT DISTINCT b_start_us FROM bucket_snaps),
combos AS (
    -- every (tier, device) with a slot row of any state during the window, so a drained tier shows
    -- zeros instead of vanishing
    SELECT DISTINCT r.tier, d.device_name
    FROM rows r JOIN gpu_dev d ON d.gpu_id = r.gpu_id, params p
    WHERE r.t_us >= p.s_us
    UNION
    SELECT DISTINCT '{TOTAL_TIER}', device_name FROM gpu_dev
    UNION
    SELECT unnest([{_TIER_ORDER}]) AS tier, '{ALL_DEVICES}' AS device_name
)
SELECT
    make_timestamptz(cv.b_start_us) AS bucket_start_utc,
    cb.tier,
    cb.device_name,
    coalesce(c.claimed_gpus, 0) AS claimed_gpus,
    coalesce(c.total_gpus, 0) AS total_gpus,
    CASE WHEN c.total_gpus > 0 THEN 100.0 * c.claimed_gpus / c.total_gpus END AS allocation_pct
FROM covered cv
CROSS JOIN combos cb
LEFT JOIN counts c
  ON c.b_start_us = cv.b_start_us AND c.tier = cb.tier AND c.device_name = cb.device_name
ORDER BY cv.b_start_us, list_position([{_TIER_ORDER}], cb.tier), cb.device_name = '{ALL_DEVICES}',
         cb.device_name
"""


def _allocation_sql(from_sql: str, where: str) -> str:
    """The allocation SQL with its rows from ``from_sql`` (a temp table ``slot_rows`` of clean rows,
    or the Parquet partitions as ``$files``)."""
    return with_bucket_snaps(f"""
rows AS (
    SELECT epoch_us(r.snapshot_utc) AS t_us, r.gpu_id, r.device_name, r.tier, r.slot_state
    FROM {from_sql}, params p
    WHERE epoch_us(r.snapshot_utc) < p.e_us{where}
)""") + _ALLOCATION_REST


ALLOCATION_SQL = _allocation_sql("slot_rows r", "")
# Straight from the day's and the day before's Parquet partitions, from LOOKBACK before the window.
ALLOCATION_SQL_PARQUET = _allocation_sql(
    "read_parquet($files, union_by_name=false) r",
    " AND r.snapshot_utc >= CAST($start AS TIMESTAMPTZ) - to_microseconds(CAST($lookback_us AS BIGINT))",
)

DAILY_SQL = f"""
SELECT
    CAST($day_start AS TIMESTAMPTZ) AS day_start_utc,
    tier,
    device_name,
    -- ordered list -> the mean is summed in one fixed order: identical bytes on every re-run
    list_avg(list(allocation_pct ORDER BY bucket_start_utc) FILTER (WHERE total_gpus > 0)) AS allocation_pct,
    sum(claimed_gpus) / count(*) AS avg_claimed_gpus,
    sum(total_gpus) / count(*) AS avg_total_gpus,
    CAST(count(*) AS INTEGER) AS buckets,
    CAST(count(*) FILTER (WHERE total_gpus > 0) AS INTEGER) AS buckets_with_capacity,
    CAST($expected AS INTEGER) AS buckets_expected
FROM alloc_buckets
GROUP BY tier, device_name
ORDER BY list_position([{_TIER_ORDER}], tier), device_name = '{ALL_DEVICES}', device_name
"""


def _us(delta: dt.timedelta) -> int:
    return int(delta / dt.timedelta(microseconds=1))


def _params(start_utc: dt.datetime, end_utc: dt.datetime, bucket: dt.timedelta) -> dict:
    """The named parameters of the allocation SQL (both row sources)."""
    return {"start": start_utc, "end": end_utc, "bucket_us": _us(bucket), "stale_factor": STALE_FACTOR}


def compute_allocation_buckets(
    con: duckdb.DuckDBPyConnection,
    rows_from_sql: str,
    params: list,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    bucket: dt.timedelta = BUCKET,
) -> pa.Table:
    """``metrics/allocation_buckets`` rows for the buckets of ``[start_utc, end_utc)``.

    ``rows_from_sql`` is a FROM-clause yielding clean slot rows (e.g. ``Store.relation_sql`` over
    the day and the day before, so the first bucket can carry an earlier snapshot, as for the
    states). Uses (and replaces) the temp table ``slot_rows`` on ``con``, as the states do.
    """
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE slot_rows AS SELECT {', '.join(ALLOCATION_COLUMNS)} FROM {rows_from_sql} "
        f"WHERE snapshot_utc >= CAST(? AS TIMESTAMPTZ) - to_microseconds(CAST(? AS BIGINT))",
        [*params, start_utc, _us(LOOKBACK)],
    )
    try:
        table = con.sql(ALLOCATION_SQL, params=_params(start_utc, end_utc, bucket)).to_arrow_table()
    finally:
        con.execute("DROP TABLE IF EXISTS slot_rows")
    return conform(table, ALLOCATION_BUCKETS)


def allocation_daily(
    buckets: pa.Table, start_utc: dt.datetime, end_utc: dt.datetime, bucket: dt.timedelta = BUCKET
) -> pa.Table:
    """``metrics/allocation_daily`` from one day's ``allocation_buckets`` rows."""
    expected = -(-_us(end_utc - start_utc) // _us(bucket))
    con = connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("alloc_buckets", conform(buckets, ALLOCATION_BUCKETS))
        table = con.sql(DAILY_SQL, params={"day_start": start_utc, "expected": expected}).to_arrow_table()
    finally:
        con.close()
    return conform(table, ALLOCATION_DAILY)


def allocation_from_table(
    rows: pa.Table, start_utc: dt.datetime, end_utc: dt.datetime, bucket: dt.timedelta = BUCKET
) -> tuple[pa.Table, pa.Table]:
    """(bucket rows, daily rows) from an in-memory clean slot table (tests and small inputs)."""
    con = connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("clean_in", rows)
        buckets = compute_allocation_buckets(con, "clean_in", [], start_utc, end_utc, bucket)
    finally:
        con.close()
    return buckets, allocation_daily(buckets, start_utc, end_utc, bucket)


def allocation_for_day(
    store: Store, day: dt.date | str, start_utc: dt.datetime, end_utc: dt.datetime
) -> tuple[pa.Table, pa.Table]:
    """One partition: (bucket rows, daily rows) from the clean slot snapshots of the day and the day
    before (for the carried-forward first bucket), read straight from their Parquet files."""
    d = dt.date.fromisoformat(day) if isinstance(day, str) else day
    days = [(d - dt.timedelta(days=1)).isoformat(), d.isoformat()]
    files = store.files(CLEAN_SLOT_SNAPSHOTS, days)
    if not files:
        return allocation_from_table(CLEAN_SLOT_SNAPSHOTS.empty(), start_utc, end_utc)
    con = connect()
    try:
        if store.older_files(CLEAN_SLOT_SNAPSHOTS, files):  # read by name, through a temp table
            buckets = compute_allocation_buckets(con, *store.relation_sql(CLEAN_SLOT_SNAPSHOTS, days), start_utc, end_utc)
            return buckets, allocation_daily(buckets, start_utc, end_utc)
        params = {**_params(start_utc, end_utc, BUCKET), "files": files, "lookback_us": _us(LOOKBACK)}
        buckets = conform(con.sql(ALLOCATION_SQL_PARQUET, params=params).to_arrow_table(), ALLOCATION_BUCKETS)
    finally:
        con.close()
    return buckets, allocation_daily(buckets, start_utc, end_utc)
