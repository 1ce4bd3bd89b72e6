"""Per-GPU state per 5-minute bucket (DESIGN.md 5.1), in DuckDB SQL.

For each bucket of the day:
1. The bucket's snapshots are those whose time falls in it. A bucket with none takes the latest
   earlier snapshot if it is younger than ``stale_factor`` x the observed cadence (so 15-minute
   archives fill 5-minute buckets, and a single missed snapshot does not blank the pool); otherwise
   every GPU is ``na`` with reason ``no_snapshot``.
2. Every slot row of those snapshots that names a GPU is ranked:
   claimed primary (5) > claimed backfill (4) > unclaimed primary (3) > other primary state (2)
   > unclaimed backfill (1) > other backfill state (0); within equal rank the latest snapshot wins
   (then the slot name, for determinism).
3. The winner gives the state: 5 -> busy_prioritized / busy_shared (by tier), 4 -> busy_backfill,
   3 -> idle_prioritized / idle_shared, 2 -> na (reason = slot state, e.g. Drained),
   1 -> idle_backfill (idle capacity seen only through a backfill slot), 0 -> na.
4. A GPU seen during the day but named by no row of the bucket's snapshots is ``na`` (dropout).

So a GPU whose primary slot is Unclaimed while its backfill slot runs a job is busy_backfill.
"""

from __future__ import annotations

import datetime as dt

import duckdb
import numpy as np
import pyarrow as pa

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES, conform
from gpu_pipeline.lib.store import Store

BUCKET = dt.timedelta(minutes=5)
STALE_FACTOR = 1.5
LOOKBACK = dt.timedelta(hours=1)

# The bucket -> snapshot assignment, shared with allocation.py. It needs a CTE ``rows`` with the
# snapshot time ``t_us`` (epoch microseconds) of every slot row before the window's end, and ``params``.
PARAMS_SQL = """
params AS (
    SELECT epoch_us(CAST($start AS TIMESTAMPTZ)) AS s_us,
           epoch_us(CAST($end AS TIMESTAMPTZ)) AS e_us,
           CAST($bucket_us AS BIGINT) AS b_us
)"""

BUCKET_SNAPS_SQL = """
snaps AS (SELECT DISTINCT t_us FROM rows),
cadence AS (
    SELECT coalesce(median(d), (SELECT b_us FROM params)) AS c_us
    FROM (SELECT t_us - lag(t_us) OVER (ORDER BY t_us) AS d FROM snaps)
    WHERE d > 0
),
buckets AS (
    SELECT generate_series AS b_start_us
    FROM params, generate_series(params.s_us, params.e_us - 1, params.b_us)
),
in_bucket AS (
    SELECT p.s_us + ((s.t_us - p.s_us) // p.b_us) * p.b_us AS b_start_us, s.t_us
    FROM snaps s, params p
    WHERE s.t_us >= p.s_us
),
carried AS (
    SELECT b.b_start_us, max(s.t_us) AS t_us
    FROM buckets b
    JOIN snaps s ON s.t_us < b.b_start_us
    CROSS JOIN cadence c
    WHERE b.b_start_us NOT IN (SELECT b_start_us FROM in_bucket)
      AND s.t_us >= b.b_start_us - CAST(c.c_us * $stale_factor AS BIGINT)
    GROUP BY b.b_start_us
),
bucket_snaps AS (
    SELECT * FROM in_bucket UNION ALL SELECT * FROM carried
)"""


def with_bucket_snaps(rows_cte: str) -> str:
    """``WITH params, rows, <bucket assignment CTEs>,`` for a query that goes on with more CTEs."""
    return "WITH" + PARAMS_SQL + ",\n" + rows_cte.strip("\n") + "," + BUCKET_SNAPS_SQL + ",\n"


# Columns of the clean slot table the state SQL reads (the temp table holds only these).
STATE_COLUMNS = ("snapshot_utc", "gpu_id", "slot_name", "host", "device_name", "tier", "is_backfill_slot",
                 "slot_state", "global_job_id", "remote_owner", "gpu_usage_pct")

# The rank of a slot row (module docstring, step 2), of the row ``r``: the state SQL ranks every row
# by it and gives it again for each bucket's winner, read back with the winner's other columns.
_RANK_CODE = """CASE
            WHEN NOT r.is_backfill_slot AND r.slot_state = 'Claimed' THEN 5
            WHEN r.is_backfill_slot AND r.slot_state = 'Claimed' THEN 4
            WHEN NOT r.is_backfill_slot AND r.slot_state = 'Unclaimed' THEN 3
            WHEN NOT r.is_backfill_slot THEN 2
            WHEN r.slot_state = 'Unclaimed' THEN 1
            ELSE 0
        END"""

# The state SQL reads its rows from one of two sources (see _state_sql): a temp table ``slot_rows``
# (any FROM clause copied in, e.g. an in-memory table), or the day's and the day before's Parquet
# partitions straight (``$files``). A winner's own columns are fetched at the end by a row id: the
# temp table's ``rowid``, or a Parquet row's file number and row number in the file.
_STATE_HEAD = """
rows AS (
    SELECT {rid} AS rid, epoch_us(r.snapshot_utc) AS t_us, r.gpu_id, r.slot_name, r.host, r.device_name,
        {rank_code} AS rank_code
    FROM {rows_from} r, params p
    WHERE epoch_us(r.snapshot_utc) < p.e_us{where}
)"""
_STATE_REST = """-- Order numbers of snapshot times and slot names, so that (rank, time, slot name) packs into one
-- BIGINT: rank_code * 2^48 + snapshot number * 2^24 + slot-name number.
snap_no AS (SELECT t_us, row_number() OVER (ORDER BY t_us) AS snap_no FROM snaps),
name_no AS (
    SELECT slot_name, row_number() OVER (ORDER BY slot_name) AS name_no
    FROM (SELECT DISTINCT slot_name FROM rows)
),
gpus AS (
    SELECT *, row_number() OVER (ORDER BY host, gpu_id) - 1 AS g_no  -- output order
    FROM (
        SELECT gpu_id,
               arg_max(host, t_us) AS host,
               -- the latest name, a named row before an unnamed one: (named, time) packed in a BIGINT
               arg_max(device_name, CAST(device_name IS NOT NULL AS BIGINT) * 4611686018427387904 + t_us)
                   AS device_name
        FROM rows, params p
        WHERE rows.t_us >= p.s_us
        GROUP BY gpu_id
    )
),
-- A (GPU, bucket) is known by its row in the output, GPU-major: pos = g_no * $n_buckets + bucket
-- number. Grouping and joining on that one integer is cheaper than on (bucket, GPU id text).
ranked AS (
    SELECT g.g_no * $n_buckets + (bs.b_start_us - p.s_us) // p.b_us AS pos, r.rid,
        r.rank_code * 281474976710656 + sn.snap_no * 16777216 + nn.name_no AS win_key
    FROM bucket_snaps bs
    JOIN rows r ON r.t_us = bs.t_us
    JOIN snap_no sn ON sn.t_us = r.t_us
    JOIN name_no nn ON nn.slot_name = r.slot_name
    JOIN gpus g ON g.gpu_id = r.gpu_id
    CROSS JOIN params p
),
best AS (
    SELECT pos, arg_max(rid, win_key) AS rid, count(*) AS n_slot_rows
    FROM ranked
    GROUP BY pos
),
winners AS (
    SELECT best.pos, best.n_slot_rows,
        struct_pack(r.tier, r.slot_name, r.slot_state, r.global_job_id, r.remote_owner, r.gpu_usage_pct,
                    r.snapshot_utc,
                    rank_code := {rank_code}) AS w
    FROM best JOIN {winner_join}
),
covered AS (SELECT DISTINCT b_start_us FROM bucket_snaps),
grid AS (
    SELECT b.b_start_us, g.gpu_id, g.host, g.device_name,
           g.g_no * $n_buckets + (b.b_start_us - p.s_us) // p.b_us AS pos
    FROM buckets b CROSS JOIN gpus g CROSS JOIN params p
)
-- A GPU's own columns are given on its first bucket's row only and repeated by with_gpu_columns()
-- (converting 1,000 names once instead of 288,000 times, and sorting rows without them).
SELECT
    make_timestamptz(b.b_start_us) AS bucket_start_utc,
    CASE WHEN b.b_start_us = p.s_us THEN b.gpu_id END AS gpu_id,
    CASE WHEN b.b_start_us = p.s_us THEN b.host END AS host,
    CASE WHEN b.b_start_us = p.s_us THEN b.device_name END AS device_name,
    CASE
        WHEN w.w IS NULL THEN 'na'
        WHEN w.w.rank_code = 5 AND w.w.tier = 'priority' THEN 'busy_prioritized'
        WHEN w.w.rank_code = 5 THEN 'busy_shared'
        WHEN w.w.rank_code = 4 THEN 'busy_backfill'
        WHEN w.w.rank_code = 3 AND w.w.tier = 'priority' THEN 'idle_prioritized'
        WHEN w.w.rank_code = 3 THEN 'idle_shared'
        WHEN w.w.rank_code = 1 THEN 'idle_backfill'
        ELSE 'na'
    END AS state,
    CASE WHEN w.w.rank_code IN (0, 2) THEN NULL ELSE w.w.tier END AS tier,
    w.w.slot_name AS slot_name,
    w.w.slot_state AS slot_state,
    CASE WHEN w.w.rank_code IN (4, 5) THEN w.w.global_job_id END AS global_job_id,
    CASE WHEN w.w.rank_code IN (4, 5) THEN w.w.remote_owner END AS remote_owner,
    w.w.gpu_usage_pct AS gpu_usage_pct,
    w.w.snapshot_utc AS snapshot_utc,
    CAST(coalesce(w.n_slot_rows, 0) AS INTEGER) AS n_slot_rows,
    CASE
        WHEN cv.b_start_us IS NULL THEN 'no_snapshot'
        WHEN w.w IS NULL THEN 'dropout'
        WHEN w.w.rank_code IN (0, 2) THEN w.w.slot_state
    END AS na_reason,
    b.pos
FROM grid b
CROSS JOIN params p
LEFT JOIN winners w ON w.pos = b.pos
LEFT JOIN covered cv ON cv.b_start_us = b.b_start_us
ORDER BY b.pos
"""


_PARQUET_ROWS = "read_parquet($files, union_by_name=false)"
_FROM_LOOKBACK = "snapshot_utc >= CAST($start AS TIMESTAMPTZ) - INTERVAL 1 HOUR"


def _state_sql(parquet: bool) -> str:
    """The state SQL over the temp table ``slot_rows``, or (``parquet``) over ``$files`` from an hour
    before ``$start``. A Parquet row's id is its file's number in ``$files`` * 2^40 + its row number
    in the file, and the winners' columns are read back by it (only from the window's row groups)."""
    if parquet:
        rid, rows_from, where = "r.file_index * 1099511627776 + r.file_row_number", _PARQUET_ROWS, f" AND r.{_FROM_LOOKBACK}"
        winner_join = (f"(SELECT *, file_index * 1099511627776 + file_row_number AS rid FROM {_PARQUET_ROWS} "
                       f"WHERE {_FROM_LOOKBACK} AND snapshot_utc < CAST($end AS TIMESTAMPTZ)) r ON r.rid = best.rid")
    else:
        rid, rows_from, where = "r.rowid", "slot_rows", ""
        winner_join = "slot_rows r ON r.rowid = best.rid"
    head = _STATE_HEAD.format(rid=rid, rows_from=rows_from, where=where, rank_code=_RANK_CODE)
    rest = _STATE_REST.replace("{winner_join}", winner_join).replace("{rank_code}", _RANK_CODE)
    return with_bucket_snaps(head) + rest


STATE_SQL = _state_sql(parquet=False)
STATE_SQL_PARQUET = _state_sql(parquet=True)


def compute_gpu_states(
    con: duckdb.DuckDBPyConnection,
    rows_from_sql: str,
    params: list,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    bucket: dt.timedelta = BUCKET,
) -> pa.Table:
    """States for the buckets of [start_utc, end_utc).

    ``rows_from_sql`` is a FROM-clause yielding clean slot rows (e.g. ``Store.relation_sql``);
    include the hour before ``start_utc`` so the first bucket can carry an earlier snapshot.
    """
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE slot_rows AS SELECT {', '.join(STATE_COLUMNS)} FROM {rows_from_sql} "
        f"WHERE snapshot_utc >= CAST(? AS TIMESTAMPTZ) - INTERVAL 1 HOUR",
        [*params, start_utc],
    )
    params = _state_params(start_utc, end_utc, bucket)
    return with_gpu_columns(con.sql(STATE_SQL, params=params).to_arrow_table(), params["n_buckets"])


def bucket_count(start_utc: dt.datetime, end_utc: dt.datetime, bucket: dt.timedelta) -> int:
    """The buckets of [start_utc, end_utc): the rows of the ``buckets`` CTE (the last may be short)."""
    us = dt.timedelta(microseconds=1)
    return max(0, -(-((end_utc - start_utc) // us) // (bucket // us)))


def _state_params(start_utc: dt.datetime, end_utc: dt.datetime, bucket: dt.timedelta) -> dict:
    return {"start": start_utc, "end": end_utc, "bucket_us": int(bucket / dt.timedelta(microseconds=1)),
            "stale_factor": STALE_FACTOR, "n_buckets": bucket_count(start_utc, end_utc, bucket)}


_GPU_COLUMNS = ("gpu_id", "host", "device_name")


def with_gpu_columns(table: pa.Table, n_buckets: int) -> pa.Table:
    """The state SQL's rows (GPU by GPU, bucket by bucket, a dense grid: row ``pos`` = GPU number *
    ``n_buckets`` + bucket number) with each GPU's own columns, which the SQL gives on its first
    bucket's row only, repeated on all its rows."""
    pos = table.column("pos").to_numpy()
    if len(pos) % max(n_buckets, 1) or not np.array_equal(pos, np.arange(len(pos))):
        raise RuntimeError(f"state rows are not a dense grid of {n_buckets} buckets per GPU in order")
    table = table.drop_columns(["pos"])
    firsts = pa.array(np.arange(0, len(pos), max(n_buckets, 1), dtype=np.int64))
    repeat = pa.array(np.repeat(np.arange(len(firsts), dtype=np.int64), n_buckets))
    for name in _GPU_COLUMNS:
        column = table.column(name).take(firsts).combine_chunks().take(repeat)
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return conform(table, GPU_STATES)


def states_for_day(store: Store, day: dt.date | str, start_utc: dt.datetime, end_utc: dt.datetime) -> pa.Table:
    """One partition's states, read straight from the clean slot snapshots' Parquet files of the day
    and the day before (for the carried-forward first bucket): the table :func:`compute_gpu_states`
    gives on the same rows, without copying them into a temp table first."""
    d = dt.date.fromisoformat(day) if isinstance(day, str) else day
    files = store.files(CLEAN_SLOT_SNAPSHOTS, [(d - dt.timedelta(days=1)).isoformat(), d.isoformat()])
    if not files:
        return states_from_table(CLEAN_SLOT_SNAPSHOTS.empty(), start_utc, end_utc)
    con = db_connect()
    try:
        params = _state_params(start_utc, end_utc, BUCKET)
        table = con.sql(STATE_SQL_PARQUET, params={**params, "files": files}).to_arrow_table()
        return with_gpu_columns(table, params["n_buckets"])
    finally:
        con.close()


def states_from_table(
    rows: pa.Table, start_utc: dt.datetime, end_utc: dt.datetime, bucket: dt.timedelta = BUCKET
) -> pa.Table:
    """Convenience for tests and small inputs: states from an in-memory clean table."""
    con = db_connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("clean_in", rows)
        return compute_gpu_states(con, "clean_in", [], start_utc, end_utc, bucket)
    finally:
        con.close()
