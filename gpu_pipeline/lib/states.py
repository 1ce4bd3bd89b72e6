"""Per-GPU state per 5-minute bucket (DESIGN.md 5.1), in DuckDB SQL.

For each bucket of the day:
1. The bucket's snapshots are those whose time falls in it (a snapshot written in parts seconds
   apart by the time of its first part: :data:`SNAPSHOT_PARTS_MAX_US`). A bucket with none takes
   the latest earlier snapshot, every part of it, if the bucket starts less than the larger of
   ``stale_factor`` x the cadence in force and 2 x cadence - half a bucket after it -- the cadence
   in force after a snapshot being the median of the five gaps between snapshots around the one
   that follows it where most of them agree with it (within ``RUN_AGREE``), else the day's median,
   so that a day of 15-minute snapshots, then 5-minute ones, is read at each part's own (the day's
   median, 5 minutes, blanked a third of the 15-minute part's buckets), while an outage -- one long
   gap among short ones, or a few snapshots taken by hand in it -- stays an outage (so 15-minute archives fill 5-minute buckets,
   and a single missed snapshot does not blank the pool: at 5-minute cadence both give 7.5 minutes,
   at 15-minute cadence the second gives 27.5, where 1.5 x cadence, 22.5, left the last bucket
   before the next snapshot blank); otherwise every GPU is ``na`` with reason ``no_snapshot``.
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
import pyarrow.compute as pc

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES, conform
from gpu_pipeline.lib.store import Store
from gpu_pipeline.lib.timeutil import epoch_us

BUCKET = dt.timedelta(minutes=5)
STALE_FACTOR = 1.5
#: Gaps around a snapshot within this factor of their median agree on a cadence (see BUCKET_SNAPS_SQL).
RUN_AGREE = 1.5
LOOKBACK = dt.timedelta(hours=1)

# The bucket -> snapshot assignment, shared with allocation.py. It needs a CTE ``rows`` with the
# snapshot time ``t_us`` (epoch microseconds) of every slot row before the window's end, and ``params``.
PARAMS_SQL = """
params AS (
    SELECT epoch_us(CAST($start AS TIMESTAMPTZ)) AS s_us,
           epoch_us(CAST($end AS TIMESTAMPTZ)) AS e_us,
           CAST($bucket_us AS BIGINT) AS b_us
)"""

#: Snapshot times closer than this are parts of one snapshot of the pool (two collectors, or a pool
#: queried in pieces, writing one archive seconds apart) -- when also closer than
#: SNAPSHOT_PARTS_SHARE of the day's 90th-percentile gap between snapshot times (a 30-s collector's
#: snapshots are each its own). A snapshot is known by its first part's time: its bucket, the
#: cadence (the median gap between snapshots: the parts' 2-s gaps made a 15-minute archive's cadence
#: 2 s, and 2 of 3 buckets blank), and a bucket without one carries every part of the latest.
SNAPSHOT_PARTS_MAX_US = 60_000_000
SNAPSHOT_PARTS_SHARE = 0.1
SNAPSHOT_PARTS_QUANTILE = 0.9


def snapshot_part_gap_us(t_us: np.ndarray) -> float:
    """The longest gap between two parts of one snapshot, of sorted distinct snapshot times (µs)."""
    gaps = np.diff(np.asarray(t_us, dtype=np.int64))
    gaps = gaps[gaps > 0]
    if not len(gaps):
        return 0.0
    return min(float(SNAPSHOT_PARTS_MAX_US), SNAPSHOT_PARTS_SHARE * float(np.quantile(gaps, SNAPSHOT_PARTS_QUANTILE)))


def snapshot_firsts(t_us: np.ndarray) -> np.ndarray:
    """Per sorted distinct snapshot time (µs), the time of its snapshot's first part."""
    t_us = np.asarray(t_us, dtype=np.int64)
    if not len(t_us):
        return t_us
    new = np.concatenate(([True], np.diff(t_us) > snapshot_part_gap_us(t_us)))
    return t_us[new][np.cumsum(new) - 1]


def part_gap_sql(gaps: str, d: str, unit: float = 1.0) -> str:
    """The SQL of :func:`snapshot_part_gap_us` over the positive gaps ``d`` of ``gaps`` (a FROM
    clause), in µs (``unit`` 1) or seconds (``unit`` 1e-6); 0 without a gap."""
    return (f"SELECT least({SNAPSHOT_PARTS_MAX_US * unit!r}, {SNAPSHOT_PARTS_SHARE!r} * "
            f"coalesce(quantile_cont({d}, {SNAPSHOT_PARTS_QUANTILE!r}), 0)) AS p FROM {gaps} WHERE {d} > 0")


BUCKET_SNAPS_SQL = f"""
snap_gaps AS (
    SELECT t_us, t_us - lag(t_us) OVER (ORDER BY t_us) AS d FROM (SELECT DISTINCT t_us FROM rows)
),
part_gap AS ({part_gap_sql("snap_gaps", "d")}),
snaps AS (  -- each snapshot time with its snapshot's first part (f_us)
    SELECT t_us, min(t_us) OVER (PARTITION BY part_of) AS f_us
    FROM (SELECT g.t_us, sum(CASE WHEN g.d IS NULL OR g.d > pg.p THEN 1 ELSE 0 END) OVER (ORDER BY g.t_us) AS part_of
          FROM snap_gaps g CROSS JOIN part_gap pg)
),
cadence AS (
    SELECT coalesce(median(d), (SELECT b_us FROM params)) AS c_us
    FROM (SELECT f_us - lag(f_us) OVER (ORDER BY f_us) AS d FROM (SELECT DISTINCT f_us FROM snaps))
    WHERE d > 0
),
buckets AS (
    SELECT generate_series AS b_start_us
    FROM params, generate_series(params.s_us, params.e_us - 1, params.b_us)
),
in_bucket AS (
    SELECT p.s_us + ((s.f_us - p.s_us) // p.b_us) * p.b_us AS b_start_us, s.t_us
    FROM snaps s, params p
    WHERE s.f_us >= p.s_us
),
local_cadence AS (
    -- the cadence in force after each snapshot: the median of the five gaps around the one that
    -- follows it, where most of them are within 1.5x of it (a day of 15-minute snapshots, then
    -- 5-minute ones, is read at each part's own), else the day's (an outage with a snapshot or two
    -- taken by hand in it is gaps that do not agree: still an outage)
    SELECT f_us,
           CASE WHEN len(list_filter(gl, lambda x: x <= {RUN_AGREE} * m AND x * {RUN_AGREE} >= m)) * 2 > len(gl)
                THEN m ELSE (SELECT c_us FROM cadence) END AS c_us
    FROM (
        SELECT f_us, gl, list_median(gl) AS m
        FROM (SELECT f_us, list(g) FILTER (WHERE g IS NOT NULL)
                               OVER (ORDER BY f_us ROWS BETWEEN 1 PRECEDING AND 3 FOLLOWING) AS gl
              FROM (SELECT f_us, f_us - lag(f_us) OVER (ORDER BY f_us) AS g FROM (SELECT DISTINCT f_us FROM snaps)))
    )
),
carried_last AS (  -- the latest earlier snapshot, if it is recent enough at its cadence
    SELECT l.b_start_us, l.last_f
    FROM (SELECT b.b_start_us, max(s.f_us) AS last_f
          FROM buckets b JOIN snaps s ON s.f_us < b.b_start_us
          WHERE b.b_start_us NOT IN (SELECT b_start_us FROM in_bucket)
          GROUP BY b.b_start_us) l
    JOIN local_cadence c ON c.f_us = l.last_f
    CROSS JOIN params p
    WHERE l.last_f >= l.b_start_us - greatest(CAST(c.c_us * $stale_factor AS BIGINT), 2 * c.c_us - p.b_us // 2)
),
carried AS (  -- the latest snapshot, every part of it
    SELECT cl.b_start_us, s.t_us FROM carried_last cl JOIN snaps s ON s.f_us = cl.last_f
),
bucket_snaps AS (
    SELECT * FROM in_bucket UNION ALL SELECT * FROM carried
)"""


def bucket_snaps_sql(rows_cte: str) -> str:
    """``WITH params, rows, <bucket assignment CTEs>`` (no trailing comma: a SELECT may follow)."""
    return "WITH" + PARAMS_SQL + ",\n" + rows_cte.strip("\n") + "," + BUCKET_SNAPS_SQL


def with_bucket_snaps(rows_cte: str) -> str:
    """``WITH params, rows, <bucket assignment CTEs>,`` for a query that goes on with more CTEs."""
    return bucket_snaps_sql(rows_cte) + ",\n"


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

# The state SQL runs as three statements over one source of clean slot rows ``{src}``: the temp
# table ``slot_rows`` (any FROM clause copied in, e.g. an in-memory table), or the day's and the
# day before's Parquet partitions straight (``$files``). A row is known by a row id: the temp
# table's ``rowid``, or a Parquet row's file number * 2^40 + its row number in the file.
#
# 1. The GPUs seen during the window, numbered in output order (host, GPU id), with the latest host
#    and device name (a named row before an unnamed one: (named, time) packed in a BIGINT).
_GPUS_SQL = """
CREATE OR REPLACE TEMP TABLE _st_gpus AS
SELECT *, row_number() OVER (ORDER BY host, gpu_id) - 1 AS g_no
FROM (
    SELECT gpu_id,
           arg_max(host, t_us) AS host,
           arg_max(device_name, CAST(device_name IS NOT NULL AS BIGINT) * 4611686018427387904 + t_us)
               AS device_name
    FROM (SELECT gpu_id, host, device_name, epoch_us(snapshot_utc) AS t_us FROM {src} r
          WHERE r.snapshot_utc >= CAST($start AS TIMESTAMPTZ) AND r.snapshot_utc < CAST($end AS TIMESTAMPTZ))
    GROUP BY gpu_id
)"""
# 2. Each bucket's snapshots (the bucket assignment shared with allocation.py), from the snapshot
#    times alone.
_BUCKET_SNAPS_STMT = "CREATE OR REPLACE TEMP TABLE _st_bsnaps AS\n" + bucket_snaps_sql("""
rows AS (
    SELECT DISTINCT epoch_us(r.snapshot_utc) AS t_us FROM {src} r WHERE {window}
)""") + "\nSELECT b_start_us, t_us FROM bucket_snaps"
# 3. The winner of each (GPU, bucket) that has rows, with its state. A (GPU, bucket) is known by its
#    row in the output, GPU-major: pos = GPU number * $n_buckets + bucket number; (rank, snapshot
#    time, slot name) pack into one BIGINT: rank_code * 2^48 + snapshot number * 2^24 + slot-name
#    number. The rows carry integers only (the GPU and slot name numbered as they are read): what
#    the joins and the grouping hold stays small however many GPUs. The winners' own columns are
#    read back by row id at the end. The dense grid (GPUs without a row in a bucket) is laid out by
#    _assemble(), not sorted here.
_WINNERS_SQL = """
WITH""" + PARAMS_SQL + """,
name_no AS (
    SELECT slot_name, row_number() OVER (ORDER BY slot_name) AS name_no
    FROM (SELECT DISTINCT r.slot_name FROM {src} r WHERE {window})
),
rows AS (
    SELECT {rid} AS rid, epoch_us(r.snapshot_utc) AS t_us, g.g_no, nn.name_no, {rank_code} AS rank_code
    FROM {src} r
    JOIN _st_gpus g ON g.gpu_id = r.gpu_id
    JOIN name_no nn ON nn.slot_name = r.slot_name
    WHERE {window}
),
snap_no AS (
    SELECT t_us, row_number() OVER (ORDER BY t_us) AS snap_no FROM (SELECT DISTINCT t_us FROM _st_bsnaps)
),
best AS (
    SELECT r.g_no * $n_buckets + (bs.b_start_us - p.s_us) // p.b_us AS pos,
           arg_max(r.rid, r.rank_code * 281474976710656 + sn.snap_no * 16777216 + r.name_no) AS rid,
           count(*) AS n_slot_rows
    FROM _st_bsnaps bs
    JOIN rows r ON r.t_us = bs.t_us
    JOIN snap_no sn ON sn.t_us = bs.t_us
    CROSS JOIN params p
    GROUP BY ALL
),
winners AS (
    SELECT best.pos, best.n_slot_rows, r.tier, r.slot_name, r.slot_state, r.global_job_id, r.remote_owner,
           r.gpu_usage_pct, r.snapshot_utc, {rank_code} AS rc
    FROM best JOIN (SELECT *, {rid} AS rid FROM {src} r WHERE {window}) r ON r.rid = best.rid
)
SELECT pos,
    CASE
        WHEN rc = 5 AND tier = 'priority' THEN 'busy_prioritized'
        WHEN rc = 5 THEN 'busy_shared'
        WHEN rc = 4 THEN 'busy_backfill'
        WHEN rc = 3 AND tier = 'priority' THEN 'idle_prioritized'
        WHEN rc = 3 THEN 'idle_shared'
        WHEN rc = 1 THEN 'idle_backfill'
        ELSE 'na'
    END AS state,
    CASE WHEN rc IN (0, 2) THEN NULL ELSE tier END AS tier,
    slot_name,
    slot_state,
    CASE WHEN rc IN (4, 5) THEN global_job_id END AS global_job_id,
    CASE WHEN rc IN (4, 5) THEN remote_owner END AS remote_owner,
    gpu_usage_pct,
    snapshot_utc,
    CAST(n_slot_rows AS INTEGER) AS n_slot_rows,
    CASE WHEN rc IN (0, 2) THEN slot_state END AS na_reason
FROM winners"""
# The hour before the window (LOOKBACK), for the first bucket's carried snapshot.
_LOOKBACK_SQL = f"INTERVAL {int(LOOKBACK.total_seconds())} SECOND"
_WINDOW = (f"r.snapshot_utc >= CAST($start AS TIMESTAMPTZ) - {_LOOKBACK_SQL} "
           "AND r.snapshot_utc < CAST($end AS TIMESTAMPTZ)")


def _statements(parquet: bool) -> tuple[str, str, str]:
    """The three statements over the temp table ``slot_rows``, or (``parquet``) over ``$files``."""
    if parquet:
        src, rid = "read_parquet($files, union_by_name=false)", "r.file_index * 1099511627776 + r.file_row_number"
    else:
        src, rid = "slot_rows", "r.rowid"

    def fill(sql: str) -> str:
        return (sql.replace("{src}", src).replace("{rid}", rid).replace("{window}", _WINDOW)
                .replace("{rank_code}", _RANK_CODE))

    return fill(_GPUS_SQL), fill(_BUCKET_SNAPS_STMT), fill(_WINNERS_SQL)


STATE_STATEMENTS = _statements(parquet=False)
STATE_STATEMENTS_PARQUET = _statements(parquet=True)


def _run_state_statements(
    con: duckdb.DuckDBPyConnection, statements: tuple[str, str, str], params: dict
) -> pa.Table:
    """Run the three statements on ``con`` and lay their winners out on the dense grid."""
    gpus_sql, bsnaps_sql, winners_sql = statements
    try:
        con.execute(gpus_sql, _used(gpus_sql, params))
        con.execute(bsnaps_sql, _used(bsnaps_sql, params))
        table = con.sql(winners_sql, params=_used(winners_sql, params)).to_arrow_table()
        # held by this dict alone, so that _assemble() lets each column go once it has laid it out
        winners = dict(zip(table.column_names, table.columns, strict=True))
        del table
        gpus = con.sql("SELECT gpu_id, host, device_name FROM _st_gpus ORDER BY g_no").to_arrow_table()
        covered = con.sql(
            "SELECT DISTINCT (b_start_us - epoch_us(CAST($start AS TIMESTAMPTZ))) // $bucket_us FROM _st_bsnaps",
            params={"start": params["start"], "bucket_us": params["bucket_us"]},
        ).fetchnumpy()
    finally:
        con.execute("DROP TABLE IF EXISTS _st_gpus")
        con.execute("DROP TABLE IF EXISTS _st_bsnaps")
    (covered_no,) = covered.values()
    return _assemble(winners, gpus, np.asarray(covered_no, dtype=np.int64), params)


def _used(sql: str, params: dict) -> dict:
    """The named parameters ``sql`` uses (DuckDB refuses unused ones)."""
    return {k: v for k, v in params.items() if f"${k}" in sql}


def _assemble(
    winners: dict[str, pa.ChunkedArray], gpus: pa.Table, covered_no: np.ndarray, params: dict
) -> pa.Table:
    """The state table: one row per GPU (in ``gpus``' order) per bucket, GPU by GPU. A (GPU, bucket)
    with a winner takes the winner's columns; one without is ``na``, ``dropout`` when a snapshot
    covers the bucket, else ``no_snapshot``. ``winners``' columns are taken out of the dict one at a
    time (at most one column is held twice: at 10,000 GPUs a full copy is about 400 MB)."""
    n_buckets = params["n_buckets"]
    n_rows = gpus.num_rows * n_buckets
    pos = winners.pop("pos").to_numpy()
    if len(pos) and (pos.min() < 0 or pos.max() >= n_rows):
        raise RuntimeError(f"state winners outside the grid of {gpus.num_rows} GPUs x {n_buckets} buckets")
    at = np.full(n_rows, -1, dtype=np.int64)
    at[pos] = np.arange(len(pos), dtype=np.int64)
    if np.count_nonzero(at >= 0) != len(pos):
        raise RuntimeError("more than one state winner for a (GPU, bucket)")
    has = at >= 0
    index = pa.array(at, mask=~has)
    taken = {name: winners.pop(name).take(index) for name in list(winners)}
    bucket_no = np.tile(np.arange(n_buckets, dtype=np.int64), gpus.num_rows)
    covered = np.zeros(max(n_buckets, 1), dtype=bool)
    covered[covered_no[(covered_no >= 0) & (covered_no < n_buckets)]] = True
    missing = pc.if_else(pa.array(covered[bucket_no]), pa.scalar("dropout"), pa.scalar("no_snapshot"))
    s_us = epoch_us(params["start"])
    starts = pa.array(s_us + bucket_no * params["bucket_us"], type=pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    gpu_rows = pa.array(np.repeat(np.arange(gpus.num_rows, dtype=np.int64), n_buckets))
    columns = {
        "bucket_start_utc": starts,
        **{name: gpus.column(name).take(gpu_rows) for name in _GPU_COLUMNS},
        **taken,
    }
    columns["state"] = pc.fill_null(columns["state"], "na")
    columns["n_slot_rows"] = pc.fill_null(columns["n_slot_rows"], 0)
    columns["na_reason"] = pc.if_else(pa.array(has), columns["na_reason"], missing)
    return conform(pa.table(columns), GPU_STATES)


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
        f"WHERE snapshot_utc >= CAST(? AS TIMESTAMPTZ) - {_LOOKBACK_SQL}",
        [*params, start_utc],
    )
    return _run_state_statements(con, STATE_STATEMENTS, _state_params(start_utc, end_utc, bucket))


def bucket_count(start_utc: dt.datetime, end_utc: dt.datetime, bucket: dt.timedelta) -> int:
    """The buckets of [start_utc, end_utc): the rows of the ``buckets`` CTE (the last may be short)."""
    us = dt.timedelta(microseconds=1)
    return max(0, -(-((end_utc - start_utc) // us) // (bucket // us)))


def _state_params(start_utc: dt.datetime, end_utc: dt.datetime, bucket: dt.timedelta) -> dict:
    return {"start": start_utc, "end": end_utc, "bucket_us": int(bucket / dt.timedelta(microseconds=1)),
            "stale_factor": STALE_FACTOR, "n_buckets": bucket_count(start_utc, end_utc, bucket)}


_GPU_COLUMNS = ("gpu_id", "host", "device_name")


def states_for_day(store: Store, day: dt.date | str, start_utc: dt.datetime, end_utc: dt.datetime) -> pa.Table:
    """One partition's states, read straight from the clean slot snapshots' Parquet files of the day
    and the day before (for the carried-forward first bucket): the table :func:`compute_gpu_states`
    gives on the same rows, without copying them into a temp table first."""
    d = dt.date.fromisoformat(day) if isinstance(day, str) else day
    days = [(d - dt.timedelta(days=1)).isoformat(), d.isoformat()]
    files = store.files(CLEAN_SLOT_SNAPSHOTS, days)
    if not files:
        return states_from_table(CLEAN_SLOT_SNAPSHOTS.empty(), start_utc, end_utc)
    con = db_connect()
    try:
        if store.older_files(CLEAN_SLOT_SNAPSHOTS, files):  # read by name, through a temp table
            return compute_gpu_states(con, *store.relation_sql(CLEAN_SLOT_SNAPSHOTS, days), start_utc, end_utc)
        return _run_state_statements(con, STATE_STATEMENTS_PARQUET,
                                     {**_state_params(start_utc, end_utc, BUCKET), "files": files})
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
