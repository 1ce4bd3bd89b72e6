"""lib/db.connect: each connection its own session (UTC) of the process's database, with the limits from the
arguments or the environment; release_memory, the block allocator and close_databases."""

import inspect
import multiprocessing
import os
import re
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from gpu_pipeline.lib import db, store
from gpu_pipeline.lib.db import ENV_MEMORY_LIMIT, ENV_THREADS, connect


def _setting(con, name):
    return con.execute(f"SELECT current_setting('{name}')").fetchone()[0]


def test_connections_do_not_share_their_session():
    a, b = connect(), connect()
    a.execute("CREATE TEMP TABLE only_a AS SELECT 1 AS x")
    a.register("arrow_a", pa.table({"x": [1, 2]}))
    a.execute("SET TimeZone = 'America/Chicago'")
    for name in ("only_a", "arrow_a"):
        with pytest.raises(Exception, match="does not exist"):
            b.execute(f"SELECT * FROM {name}")
    assert a.execute("SELECT count(*) FROM arrow_a").fetchone()[0] == 2
    assert _setting(b, "TimeZone") in ("UTC", "Etc/UTC")
    a.close()
    c = connect()  # a closed connection leaves nothing behind
    assert _setting(c, "TimeZone") in ("UTC", "Etc/UTC")
    with pytest.raises(Exception, match="does not exist"):
        c.execute("SELECT * FROM only_a")
    assert b.execute("SELECT 41 + 1").fetchone()[0] == 42
    b.close()
    c.close()


def test_limits_come_from_the_arguments_or_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPU_PIPELINE_DUCKDB_TEMP_DIR", str(tmp_path / "spill"))
    monkeypatch.setenv(ENV_MEMORY_LIMIT, "300MB")
    monkeypatch.setenv(ENV_THREADS, "1")
    con = connect()
    assert _setting(con, "memory_limit") == "286.1 MiB" and _setting(con, "threads") == 1
    assert (tmp_path / "spill").is_dir()
    other = connect(threads=2, memory_limit="500MB")
    assert _setting(other, "memory_limit") == "476.8 MiB" and _setting(other, "threads") == 2
    assert _setting(connect(), "memory_limit") == "286.1 MiB"  # the environment again
    monkeypatch.delenv(ENV_MEMORY_LIMIT)
    monkeypatch.delenv(ENV_THREADS)
    assert _setting(connect(), "memory_limit") != "286.1 MiB"


def test_a_memory_limit_without_a_thread_count_gives_each_thread_enough_memory(monkeypatch, tmp_path):
    """DuckDB's default of one thread per core under a small memory limit leaves each thread less
    than it needs: the limit sets the thread count unless the operator does."""
    monkeypatch.setenv("GPU_PIPELINE_DUCKDB_TEMP_DIR", str(tmp_path / "spill"))
    monkeypatch.delenv(ENV_THREADS, raising=False)
    cores = _setting(connect(), "threads")  # no limit: DuckDB's default, every core
    assert _setting(connect(memory_limit="300MB"), "threads") == 1  # 286 MiB: one thread
    big = connect(memory_limit="2GB")  # 1.9 GiB: 4 threads, as long as there are 4 cores
    assert _setting(big, "threads") == min(cores, 4)
    monkeypatch.setenv(ENV_THREADS, "2")
    assert _setting(connect(memory_limit="300MB"), "threads") == 2  # the operator's count wins
    # The rule itself, on the 16-core machine of README, Performance: 1 GB -> 2 threads, not 16.
    assert db.threads_for_memory(10**9, 16) == 2
    assert db.threads_for_memory(8 * 10**9, 16) == 16
    assert db.threads_for_memory(4 * 10**9, 16) == 9
    assert db.threads_for_memory(100 * 2**20, 16) == 1
    assert db.threads_for_memory(None, 16) == 16


def test_connections_are_sessions_of_one_database_per_process_and_limits(monkeypatch):
    started = []
    real = duckdb.connect
    monkeypatch.setattr(db.duckdb, "connect", lambda *a, **k: started.append(a) or real(*a, **k))
    monkeypatch.setattr(db, "_databases", {})
    cons = [connect() for _ in range(3)]
    assert len(started) == 1  # one database, three sessions of it
    cons.append(connect(threads=1))  # other limits: another database
    assert len(started) == 2
    fresh = real(":memory:")
    assert _setting(cons[-1], "threads") == 1 and _setting(cons[0], "threads") == _setting(fresh, "threads")
    fresh.close()
    assert [_setting(c, "TimeZone") in ("UTC", "Etc/UTC") for c in cons] == [True] * 4
    for con in cons:
        con.close()
    db.close_databases()


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _held_then_released() -> tuple[float, float, float]:
    """RSS (MiB): before, what a dropped temporary table and a distinct count leave with the
    database (checked to be > 100 MiB), and what stays after ``release_memory``."""
    con = connect()
    before = _rss_mib()
    con.execute("CREATE TEMP TABLE big AS SELECT range AS i, range::VARCHAR || '-' || range::VARCHAR AS s "
                "FROM range(6000000)")
    con.execute("SELECT count(DISTINCT s) FROM big").fetchone()
    con.close()  # the table is dropped, its memory kept by the database for its next queries
    held = _rss_mib() - before
    assert held > 100, held
    db.release_memory()
    return before, held, _rss_mib() - before


def test_release_memory_gives_back_what_closed_connections_freed(monkeypatch):
    monkeypatch.setenv(db.ENV_BLOCK_MEMORY, "0")  # no block allocator: everything freed goes back
    db.close_databases()
    _, held, after = _held_then_released()
    assert after < held / 3, (held, after)
    check, fresh = connect(), duckdb.connect()  # the flush thresholds are back at DuckDB's defaults
    for name in ("allocator_flush_threshold", "allocator_bulk_deallocation_flush_threshold"):
        assert _setting(check, name) == _setting(fresh, name)
    assert _setting(check, "block_allocator_memory") == "0 bytes"
    check.close()
    fresh.close()
    db.close_databases()


def test_block_pages_stay_until_the_database_closes(monkeypatch):
    monkeypatch.setenv(db.ENV_BLOCK_MEMORY, "256MB")
    db.close_databases()
    con = connect()
    assert _setting(con, "block_allocator_memory") == "244.1 MiB"
    con.close()
    before, held, kept = _held_then_released()
    assert kept < 256 + 64, (held, kept)  # the block allocator's pages, at most its size, stay
    db.close_databases()
    gone = _rss_mib() - before
    assert gone < held / 3 and gone < kept, (held, kept, gone)
    again = connect()  # a new database starts, with the same settings
    assert again.execute("SELECT 41 + 1").fetchone()[0] == 42
    assert _setting(again, "block_allocator_memory") == "244.1 MiB"
    again.close()
    db.close_databases()


def test_the_default_block_memory():
    con = connect()
    assert _setting(con, "block_allocator_memory") == "488.2 MiB"  # 512MB
    con.close()


def _child_query(out):
    con = connect()
    out.put((os.getpid(), con.execute("SELECT sum(range) FROM range(1000)").fetchone()[0]))
    con.close()


def test_a_forked_child_starts_its_own_database():
    connect().close()  # the parent's database runs (and so do its threads)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_query, args=(out,))
    child.start()
    child.join(60)
    assert child.exitcode == 0, "the child hung or failed on the parent's database"
    pid, total = out.get(timeout=5)
    assert pid != os.getpid() and total == 499500


def test_pipeline_code_creates_only_temporary_tables_and_views():
    """A table or view in the shared database's catalog would outlive its connection (and collide
    with the next day's)."""
    pattern = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?(?!TEMP\b|TEMPORARY\b)(\w+)", re.IGNORECASE)
    root = Path(db.__file__).resolve().parents[1]
    # The analyst catalog's schemas and views are meant to stay: written to a database file, or made
    # for the one query of the ``sql`` command's process.
    catalog = inspect.getsource(store.create_catalog)
    found = []
    for path in sorted(root.rglob("*.py")):
        for match in pattern.finditer(path.read_text().replace(catalog, "")):
            if match.group(1).upper() in ("TABLE", "VIEW", "MACRO", "SEQUENCE", "TYPE", "SCHEMA", "INDEX"):
                found.append(f"{path.relative_to(root)}: {match.group(0)}")
    # the SQLite archive writers' CREATE TABLE text is SQLite's, not DuckDB's
    found = [f for f in found if not f.startswith(("lib/sim_condor.py", "lib/condor_collector.py"))]
    assert not found, found


# --- exact_sum / exact_avg ------------------------------------------------------------------------

def _threaded() -> duckdb.DuckDBPyConnection:
    """A database of its own on four threads, so that one group's rows are summed by several."""
    con = duckdb.connect()
    con.execute("SET threads = 4")
    return con


def test_exact_sum_does_not_depend_on_the_order_of_the_rows():
    import math

    import numpy as np

    rng = np.random.default_rng(7)
    groups, per_group = 50, 8_000  # 400k rows: several row groups, scanned by several threads
    values = rng.lognormal(0.0, 3.0, groups * per_group) * rng.choice([-1.0, 1.0], groups * per_group)
    table = pa.table({"g": np.repeat(np.arange(groups), per_group), "v": values})
    shuffled = table.take(pa.array(rng.permutation(len(values))))
    fsum = {g: math.fsum(values[g * per_group:(g + 1) * per_group]) for g in range(groups)}
    con = _threaded()
    try:
        con.register("t", table)
        con.register("shuffled", shuffled)
        exact = f"SELECT g, {db.exact_sum('v')} FROM {{}} GROUP BY g"
        first = dict(con.sql(exact.format("t")).fetchall())
        for name in ("shuffled", "t", "shuffled"):
            assert dict(con.sql(exact.format(name)).fetchall()) == first
        for g in range(groups):
            # each value is taken within about an ulp of itself (a float sum's bound is n - 1 times this)
            magnitude = math.fsum(np.abs(values[g * per_group:(g + 1) * per_group]))
            assert abs(first[g] - fsum[g]) <= 2.0 ** -52 * magnitude + math.ulp(fsum[g])
        # the data tells the two apart: a plain floating-point sum changes with the order
        plain = "SELECT g, sum(v) FROM {} GROUP BY g"
        assert dict(con.sql(plain.format("t")).fetchall()) != dict(con.sql(plain.format("shuffled")).fetchall())
        avg = f"SELECT g, {db.exact_avg('v')} FROM {{}} GROUP BY g"
        assert dict(con.sql(avg.format("shuffled")).fetchall()) == {g: first[g] / per_group for g in range(groups)}
    finally:
        con.close()


@pytest.mark.parametrize(
    ("values", "where", "expected"),
    [
        ([0.1, 0.2, 0.3], None, 0.6),                  # a float sum gives 0.6000000000000001
        ([0.1, 0.2, 0.3], "v > 0.15", 0.5),            # FILTER
        ([None, None], None, None),                    # no known value: NULL, as sum()
        ([], None, None),                              # no row: NULL
        ([1.0, float("inf")], None, float("inf")),     # not finite: the float sum's answer
        ([1e30, 2.0], None, 1e30),                     # beyond the exact range: the float sum
        ([-1.5, 1.5, None], None, 0.0),
        ([2.7e9, 1.0, 0.3], None, 2700000001.3),      # whole numbers stay whole (no 2699999999.99...)
        ([1e-7, 2e-7], None, pytest.approx(3e-7, rel=0, abs=1e-18)),  # each value within 2^-63
    ],
)
def test_exact_sum_edges(values, where, expected):
    con = _threaded()
    try:
        con.register("t", pa.table({"v": pa.array(values, pa.float64())}))
        got = con.sql(f"SELECT {db.exact_sum('v', where)} FROM t").fetchall()[0][0]
    finally:
        con.close()
    assert got == expected


def test_exact_sum_of_nan_is_nan():
    con = _threaded()
    try:
        con.register("t", pa.table({"v": pa.array([1.0, float("nan")])}))
        got = con.sql(f"SELECT {db.exact_sum('v')}, {db.exact_avg('v')} FROM t").fetchall()[0]
    finally:
        con.close()
    assert all(x != x for x in got)


@pytest.mark.parametrize("variable, value, says", [
    (ENV_THREADS, "4x", "expected a whole number of threads"),
    (ENV_THREADS, "-2", "negative"),
    (ENV_MEMORY_LIMIT, "lots", "expected a size"),
    (db.ENV_BLOCK_MEMORY, "half", "expected a size"),
])
def test_a_bad_setting_is_an_error_naming_its_variable(monkeypatch, variable, value, says):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=re.escape(f"{variable}={value!r}: ") + says):
        connect()


def test_a_spill_folder_that_cannot_be_made_is_an_error_naming_its_variable(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(ENV_MEMORY_LIMIT, "345MB")  # a database of its own (the limits are its key)
    monkeypatch.setenv(db.ENV_TEMP_DIR, str(tmp_path / "file" / "spill"))
    with pytest.raises(ValueError, match=re.escape(f"{db.ENV_TEMP_DIR}=") + ".*cannot make the folder"):
        connect()
