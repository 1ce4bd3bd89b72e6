"""The one way the pipeline opens DuckDB: in memory, UTC session time zone, and the operator's limits.

``GPU_PIPELINE_DUCKDB_MEMORY_LIMIT`` (e.g. ``1GB``) caps DuckDB's buffer memory in the process; sorts,
joins and aggregates beyond it spill to ``GPU_PIPELINE_DUCKDB_TEMP_DIR`` (default: a folder in the
system temp directory). ``GPU_PIPELINE_DUCKDB_THREADS`` caps its threads. Unset: DuckDB's defaults
(80 % of RAM, all cores), except that a memory limit without a thread count gives one thread per
:data:`MEMORY_PER_THREAD` of it (at least one, at most the cores). On a 16-core machine, all sixteen
threads under a 1 GB limit (60 MiB each, under DuckDB's stated minimum of 125 MB a thread) made the
efficiency step spend 7.5 times the CPU of two threads, and more wall (:func:`threads_for_memory`;
README, Performance).

Each :func:`connect` returns a new connection -- its own session: temporary tables, registered Arrow
tables and settings such as the time zone are its own and go when it is closed -- to one in-memory
database per process and set of limits, started at the first call. Starting a database costs 30-90 ms
(its catalog, buffer manager and threads), a connection to a running one well under 1 ms, and a day
of the pipeline's steps opens 14. The limits hold for the process's connections together. Pipeline
code creates only temporary tables and views: anything else would outlive its connection.

A running database keeps the memory its queries freed for its next ones (up to 128 MiB per thread,
and up to 512 MiB of a bulk free); :func:`release_memory` gives it back, which the assets do after
each day, as closing a database of its own did.

Its buffer blocks (sorts, hash tables, temporary tables, query results) come from a block allocator
that keeps up to ``GPU_PIPELINE_DUCKDB_BLOCK_MEMORY`` (default 512MB; ``0`` turns it off) of the
pages it has used, so the next query reuses them instead of asking the kernel for new zeroed pages
(40 % fewer page faults in a range run; README, Performance). That memory goes back only when the
database closes: :func:`close_databases` closes the process's databases, which the assets do at the
end of each step, so a step's blocks are not held through the next step's.
"""

from __future__ import annotations

import atexit
import os
import tempfile
import threading
from pathlib import Path

import duckdb

from gpu_pipeline.lib.envutil import whole_number_env

ENV_MEMORY_LIMIT = "GPU_PIPELINE_DUCKDB_MEMORY_LIMIT"
ENV_THREADS = "GPU_PIPELINE_DUCKDB_THREADS"
ENV_TEMP_DIR = "GPU_PIPELINE_DUCKDB_TEMP_DIR"
ENV_BLOCK_MEMORY = "GPU_PIPELINE_DUCKDB_BLOCK_MEMORY"
DEFAULT_BLOCK_MEMORY = "512MB"
#: DuckDB memory a thread gets at least when the memory limit, not the operator, sets the thread count:
#: two threads under the bench's 1 GB, as on a two-core machine (DuckDB's guide: at least 125 MB a
#: thread, 1-4 GB for the best speed).
MEMORY_PER_THREAD = 400 * 2**20

_lock = threading.Lock()
# (pid, threads, memory limit, spill folder, block memory) -> database
_databases: dict[tuple, duckdb.DuckDBPyConnection] = {}
# A forked child's copies of its parent's databases: never used, closed or freed there (their threads
# are the parent's: freeing one there crashes the child).
_inherited: list[duckdb.DuckDBPyConnection] = []


def _set_aside_inherited(pid: int) -> None:
    """Move a forked parent's databases out of the registry, into ``_inherited`` (call under the lock)."""
    for key in [k for k in _databases if k[0] != pid]:
        _inherited.append(_databases.pop(key))


def _session(threads: int | None, memory_limit: str | None, spill: str | None,
             block_memory: str) -> duckdb.DuckDBPyConnection:
    """A new connection to this process's in-memory database with these limits, which starts at its
    first use (connections are made under the lock: the database object is shared by threads)."""
    key = (os.getpid(), threads, memory_limit, spill, block_memory)
    with _lock:
        db = _databases.get(key)
        if db is None:
            _set_aside_inherited(key[0])
            db = duckdb.connect(":memory:")
            if memory_limit:
                try:
                    Path(spill).mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise ValueError(f"{ENV_TEMP_DIR}={spill!r}: cannot make the folder ({exc})") from None
                _set(db, "memory_limit", memory_limit, ENV_MEMORY_LIMIT, "a size such as 1GB or 80%")
                db.execute("SET temp_directory = ?", [spill])
                if not threads:  # the limit in bytes, however the operator wrote it (1GB, 80%, ...)
                    limit, cores = db.execute("SELECT parse_formatted_bytes(current_setting('memory_limit')), "
                                              "current_setting('threads')").fetchone()
                    threads = threads_for_memory(limit, int(cores))
            if threads:
                db.execute(f"SET threads = {int(threads)}")
            _set(db, "block_allocator_memory", block_memory, ENV_BLOCK_MEMORY, "a size such as 512MB, or 0")
            _databases[key] = db
        return db.cursor()


def _set(db: duckdb.DuckDBPyConnection, setting: str, value: str, variable: str, expected: str) -> None:
    """``SET setting = value``, where the value is the variable's: an error names the variable."""
    try:
        db.execute(f"SET {setting} = ?", [value])
    except duckdb.Error as exc:
        raise ValueError(f"{variable}={value!r}: expected {expected} ({exc})") from None


def threads_for_memory(limit_bytes: int | None, cores: int) -> int:
    """DuckDB threads for a memory limit: one per :data:`MEMORY_PER_THREAD`, at least 1, at most
    ``cores`` (``cores`` when the limit is unknown)."""
    if not limit_bytes:
        return cores
    return max(1, min(cores, limit_bytes // MEMORY_PER_THREAD))


def _mine() -> list[duckdb.DuckDBPyConnection]:
    """This process's databases (not a forked parent's)."""
    with _lock:
        return [db for key, db in _databases.items() if key[0] == os.getpid()]


def _spill_path() -> Path:
    return Path(os.environ.get(ENV_TEMP_DIR) or Path(tempfile.gettempdir()) / "gpu_pipeline_duckdb")


def spill_dir() -> Path:
    """The folder DuckDB spills to (``GPU_PIPELINE_DUCKDB_TEMP_DIR``, else the system's temporary
    folder's ``gpu_pipeline_duckdb``), made if missing: for a step's own temporary files too."""
    path = _spill_path()
    path.mkdir(parents=True, exist_ok=True)
    return path


def connect(threads: int | None = None, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """A new connection, with UTC session time zone, to the process's in-memory database with these
    limits; arguments win over the environment. Close it when done."""
    threads = threads or whole_number_env(ENV_THREADS, 0, "threads", "DuckDB's own choice, or one per 400 MiB "
                                          "of a memory limit") or None
    memory_limit = memory_limit or (os.environ.get(ENV_MEMORY_LIMIT) or "").strip() or None
    spill = None
    if memory_limit:  # made when the database starts
        spill = str(_spill_path())
    block_memory = (os.environ.get(ENV_BLOCK_MEMORY) or "").strip() or DEFAULT_BLOCK_MEMORY
    con = _session(threads, memory_limit, spill, "0MB" if block_memory == "0" else block_memory)
    con.execute("SET TimeZone = 'UTC'")
    return con


def release_memory() -> None:
    """Give the memory that this process's databases freed, and keep for their next queries, back to
    the system: one task run with the allocator's flush thresholds at zero flushes its caches (2-5 ms
    when little is held; returning a few hundred MiB takes 40-90 ms, as closing a database did)."""
    for db in _mine():
        with _lock:
            con = db.cursor()
        try:
            con.execute("SET allocator_flush_threshold = '0MB'")
            con.execute("SET allocator_bulk_deallocation_flush_threshold = '0MB'")
            con.execute("SELECT 1").fetchall()
        finally:
            con.execute("RESET allocator_flush_threshold")
            con.execute("RESET allocator_bulk_deallocation_flush_threshold")
            con.close()


def close_databases() -> None:
    """Close this process's databases, giving back all their memory, the block allocator's included;
    the next :func:`connect` starts a new one. Connections still open to them stop working: call it
    only when none is in use (the assets do at the end of a step)."""
    with _lock:
        _set_aside_inherited(os.getpid())
        mine = list(_databases.values())
        _databases.clear()
    for db in mine:
        db.close()


# Closed before the interpreter tears the DuckDB module down (left open at exit, the binding reports
# them as leaked).
atexit.register(close_databases)


# --- Sums that do not depend on the order of the rows -------------------------------------------
#
# DuckDB aggregates in parallel: each thread sums its share of a group's rows, and the partial sums
# are added in whatever order the threads finish. Floating-point addition is not associative, so the
# same rows can give sums that differ in the last bits from one run to the next, and a re-run of a
# day writes different bytes. The sums below add integers instead, which is exact and the same in
# any order: each value is split into its nearest integer and the rest (within +-0.5), the rest
# scaled by 2^62 (exact: a power of two) and rounded, and both are summed as BIGINT (into HUGEINT);
# the two exact totals then make one DOUBLE. A value is so taken within 2^-63 (1e-19) of itself,
# whole numbers exactly, and the total is within an ulp or two of the exact sum of the values --
# better than a floating-point sum, whose error grows with the rows. The floating-point sum is
# computed too, as the guard: where it is not finite (an infinite or NaN value) or not below 4e18,
# it is the answer, as before. (Values beyond BIGINT, |value| > 9.2e18, would be left out of the
# exact sum, so a group of such values that cancel to below 4e18 would be summed wrong; no metric
# here comes near that: the largest, demand in GPU-microseconds, stays below 1e16.) Measured on 4 M
# rows in 20 k groups: 0.066 s against 0.029 s for a plain sum (a DECIMAL(38, 18) sum: 0.15 s); in
# a query with few rows the cost is DuckDB's planning, which grows with the aggregates: three here.

_SCALE = "4611686018427387904.0"  # 2^62


def exact_sum(value: str, where: str | None = None) -> str:
    """SQL for ``sum(value) [FILTER (WHERE where)]`` over DOUBLE values, as DOUBLE, the same whatever the
    order in which the rows are added (see above). NULL when no row counts, as ``sum``."""
    f = f" FILTER (WHERE {where})" if where else ""
    whole = f"TRY_CAST(round({value}) AS BIGINT)"
    rest = f"TRY_CAST(round(({value} - round({value})) * {_SCALE}) AS BIGINT)"
    return (f"(CASE WHEN abs(sum({value}){f}) < 4e18 "
            f"THEN CAST(sum({whole}){f} AS DOUBLE) + CAST(sum({rest}){f} AS DOUBLE) / {_SCALE} "
            f"ELSE sum({value}){f} END)")


def exact_weighted_avg(value: str, weight: str) -> str:
    """SQL: the ``weight``-weighted mean of ``value`` over the rows where it is known, by
    :func:`exact_sum` (NULL when no row has both)."""
    known = f"{value} IS NOT NULL"
    return f"({exact_sum(f'{value} * {weight}', known)} / nullif({exact_sum(weight, known)}, 0))"


def exact_avg(value: str, where: str | None = None) -> str:
    """SQL for ``avg(value) [FILTER (WHERE where)]`` by :func:`exact_sum`."""
    f = f" FILTER (WHERE {where})" if where else ""
    return f"({exact_sum(value, where)} / nullif(count({value}){f}, 0))"
