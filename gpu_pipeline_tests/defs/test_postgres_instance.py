"""Dagster instance storage on a REAL PostgreSQL server (``dagster.postgres.yaml``).

The pipeline runs in subprocesses (``gpu-pipeline materialize``) so the instance is loaded from
``$DAGSTER_HOME/dagster.yaml`` exactly as in production; what it stored is then read back through
``DagsterInstance.get()`` and with plain SQL (psycopg2). The concurrency tests run a 14-day backfill
as two concurrent 7-day range runs, on PostgreSQL and on the default SQLite storage.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES, RAW_CONDOR_SLOT_SNAPSHOTS
from gpu_pipeline.lib.store import Store
from gpu_pipeline_tests.defs.test_definitions import _hand_archive
from gpu_pipeline_tests.postgres_server import PostgresServer, find_bindir

REPO = Path(__file__).resolve().parents[2]
PG_TEMPLATE = REPO / "dagster.postgres.yaml"
SQLITE_TEMPLATE = REPO / "dagster.yaml"
GPU_PIPELINE = Path(sys.executable).with_name("gpu-pipeline")
RUN_TIMEOUT_S = 150
PG_USER = "gpu_pipeline"

pytestmark = pytest.mark.skipif(
    find_bindir() is None,
    reason="PostgreSQL server binaries (initdb, postgres, pg_ctl, pg_isready) not found in "
           "/usr/lib/postgresql/*/bin or on PATH: install the Debian package 'postgresql'",
)


class PgInstance:
    """The session's server plus the login role the Dagster instance uses (password in env only)."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self.password = secrets.token_urlsafe(18)
        server.create_role(PG_USER, self.password)

    def new_database(self, name: str) -> str:
        self.server.create_database(name, owner=PG_USER)
        return name

    def env(self, db: str) -> dict[str, str]:
        return {
            "DAGSTER_PG_HOST": self.server.host,
            "DAGSTER_PG_PORT": str(self.server.port),
            "DAGSTER_PG_USER": PG_USER,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_DB": db,
        }

    def connect(self, db: str):
        return self.server.connect(db, PG_USER, self.password)


@pytest.fixture(scope="session")
def postgres() -> PgInstance:
    """A PostgreSQL server on 127.0.0.1 with the role ``gpu_pipeline`` and the database ``dagster``."""
    with PostgresServer() as server:
        pg = PgInstance(server)
        pg.new_database("dagster")
        yield pg


@pytest.fixture(scope="module", autouse=True)
def _bytecode_cache(tmp_path_factory) -> None:
    """The five ``gpu-pipeline`` processes share a private bytecode cache: where the environment
    sets PYTHONDONTWRITEBYTECODE and the venv has no .pyc files, each process would otherwise
    compile Dagster from source again (about 7 s of CPU instead of 3 on the project's machine)."""
    global _PYCACHE
    _PYCACHE = tmp_path_factory.mktemp("pycache")


_PYCACHE: Path | None = None


def _base_env() -> dict[str, str]:
    """This process's environment without any pipeline, Dagster or libpq setting."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPU_PIPELINE_", "DAGSTER_", "PG")) and k != "PYTHONDONTWRITEBYTECODE"}
    if _PYCACHE is not None:
        env["PYTHONPYCACHEPREFIX"] = str(_PYCACHE)
    return env


def _pipeline_env(home: Path, data_root: Path, archive: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = _base_env()
    env.update({
        "DAGSTER_HOME": str(home),
        "GPU_PIPELINE_DATA_ROOT": str(data_root),
        "GPU_PIPELINE_CONDOR_ARCHIVE": str(archive),
        "GPU_PIPELINE_SOURCE_TZ": "UTC",
        "GPU_PIPELINE_START_DATE": "2025-08-01",
    })
    env.update(extra or {})
    return env


def _home(path: Path, template: Path) -> Path:
    path.mkdir(parents=True)
    shutil.copyfile(template, path / "dagster.yaml")
    return path


def _launch(env: dict[str, str], cwd: Path, start: str, end: str) -> subprocess.Popen:
    # cwd is an empty temp dir, so no `.env` of a checkout is read by the command.
    return subprocess.Popen(
        [str(GPU_PIPELINE), "materialize", "--start", start, "--end", end],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    results = []
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            pytest.fail(f"gpu-pipeline materialize did not finish in {RUN_TIMEOUT_S} s:\n{out[-6000:]}")
        results.append((proc.returncode, out))
    return results


def _days(first: int, last: int) -> list[str]:
    return [f"2025-08-{d:02d}" for d in range(first, last + 1)]


def _sqlite_files(home: Path) -> list[Path]:
    return sorted(p for p in home.rglob("*")
                  if p.is_file() and (p.suffix in {".db", ".sqlite", ".sqlite3"} or p.name.endswith(("-wal", "-journal"))))


def _assert_tables_written(data_root: Path, days: list[str]) -> None:
    store = Store(data_root)
    for spec in (RAW_CONDOR_SLOT_SNAPSHOTS, CLEAN_SLOT_SNAPSHOTS, GPU_STATES):
        assert store.partition_days(spec) == days, spec.path
    for day in days:
        assert store.plot_file("gpu_timeline_heatmap", day).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", day


@pytest.mark.slow
def test_a_range_run_stores_its_run_events_and_materializations_in_postgres(postgres, tmp_path, monkeypatch,
                                                                           loaded_defs):
    days = _days(5, 6)
    _hand_archive(tmp_path / "archive", days)
    home = _home(tmp_path / "dagster_home", PG_TEMPLATE)
    db = "dagster"
    pg_env = postgres.env(db)
    assert postgres.password not in (home / "dagster.yaml").read_text()

    env = _pipeline_env(home, tmp_path / "data", tmp_path / "archive", pg_env)
    [(rc, out)] = _finish([_launch(env, tmp_path, days[0], days[-1])])
    assert rc == 0, out[-6000:]
    assert f"daily_pipeline {days[0]} .. {days[-1]}: SUCCESS" in out
    _assert_tables_written(tmp_path / "data", days)

    # Nothing went to SQLite files under DAGSTER_HOME (runs.db, history/runs/*.db, schedules.db, ...).
    assert _sqlite_files(home) == []
    assert not (home / "history").exists() and not (home / "schedules").exists()

    # Through Dagster: the instance from DAGSTER_HOME is PostgreSQL-backed and holds the run.
    all_keys = set(loaded_defs.resolve_asset_graph().get_all_asset_keys())
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    for key, value in pg_env.items():
        monkeypatch.setenv(key, value)
    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        records = instance.get_run_records()
        assert len(records) == 1
        run = records[0].dagster_run
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.job_name == "daily_pipeline"
        assert run.tags["dagster/asset_partition_range_start"] == days[0]
        assert run.tags["dagster/asset_partition_range_end"] == days[-1]
        event_types = {e.dagster_event.event_type for e in instance.all_logs(run.run_id) if e.dagster_event}
        assert {dg.DagsterEventType.RUN_START, dg.DagsterEventType.STEP_SUCCESS,
                dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.RUN_SUCCESS} <= event_types
        planned = {r.asset_key for r in instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED, limit=1000).records}
        assert planned == all_keys
        for key in sorted(all_keys, key=lambda k: k.to_user_string()):
            mats = instance.fetch_materializations(key, limit=100).records
            assert sorted(m.partition_key for m in mats) == days, key.to_user_string()
            assert {m.run_id for m in mats} == {run.run_id}

    # The same rows, read with plain SQL from the database the instance points at.
    con = postgres.connect(db)
    try:
        with con.cursor() as cur:
            cur.execute("SELECT run_id, status FROM runs")
            assert cur.fetchall() == [(run.run_id, "SUCCESS")]
            cur.execute("SELECT count(*) FROM event_logs WHERE run_id = %s", (run.run_id,))
            assert cur.fetchone()[0] > 20
            # (RUN_SUCCESS is stored under its legacy name PIPELINE_SUCCESS)
            cur.execute("SELECT run_id FROM event_logs WHERE dagster_event_type = %s",
                        (dg.DagsterEventType.RUN_SUCCESS.value,))
            assert cur.fetchall() == [(run.run_id,)]
            cur.execute("SELECT asset_key, partition FROM event_logs "
                        "WHERE dagster_event_type = 'ASSET_MATERIALIZATION'")
            rows = cur.fetchall()
            cur.execute("SELECT count(*) FROM asset_keys")
            n_asset_keys = cur.fetchone()[0]
    finally:
        con.close()
    assert len(rows) == len(all_keys) * len(days)
    assert sorted((dg.AssetKey.from_db_string(k), p) for k, p in rows) == sorted(
        ((k, d) for k in all_keys for d in days), key=lambda kp: (kp[0].to_user_string(), kp[1]))
    assert n_asset_keys == len(all_keys)


# ---------------------------------------------------------------------------------------------
# Issue "concurrency": a 14-day backfill as 2 concurrent range runs on one instance and data root.
# ---------------------------------------------------------------------------------------------

FIRST_WEEK, SECOND_WEEK = _days(1, 7), _days(8, 14)


def _assert_overlapping(intervals: list[tuple[float, float]]) -> None:
    """The runs were really concurrent: each started before the other finished."""
    assert len(intervals) == 2 and all(s and e for s, e in intervals), intervals
    (s1, e1), (s2, e2) = intervals
    assert s1 < e2 and s2 < e1, f"runs did not overlap: {intervals}"


def _two_concurrent_weeks(tmp_path: Path, home: Path, extra: dict[str, str] | None = None) -> list[tuple[int, str]]:
    _hand_archive(tmp_path / "archive", FIRST_WEEK + SECOND_WEEK)
    env = _pipeline_env(home, tmp_path / "data", tmp_path / "archive", extra)
    procs = [_launch(env, tmp_path, week[0], week[-1]) for week in (FIRST_WEEK, SECOND_WEEK)]
    return _finish(procs)


@pytest.mark.slow
def test_a_14_day_backfill_as_two_concurrent_runs_completes_on_postgres(postgres, tmp_path):
    db = postgres.new_database("dagster_backfill")  # a fresh database: both processes create the schema
    home = _home(tmp_path / "dagster_home", PG_TEMPLATE)
    results = _two_concurrent_weeks(tmp_path, home, postgres.env(db))
    for (rc, out), week in zip(results, (FIRST_WEEK, SECOND_WEEK), strict=True):
        assert rc == 0, out[-6000:]
        assert f"daily_pipeline {week[0]} .. {week[-1]}: SUCCESS" in out
        assert "database is locked" not in out
    _assert_tables_written(tmp_path / "data", FIRST_WEEK + SECOND_WEEK)
    assert _sqlite_files(home) == []

    con = postgres.connect(db)
    try:
        with con.cursor() as cur:
            cur.execute("SELECT status, start_time, end_time FROM runs")
            runs = cur.fetchall()
            assert [status for status, _, _ in runs] == ["SUCCESS", "SUCCESS"]
            _assert_overlapping([(start, end) for _, start, end in runs])
            cur.execute("SELECT DISTINCT partition FROM event_logs "
                        "WHERE dagster_event_type = 'ASSET_MATERIALIZATION' ORDER BY 1")
            assert [p for (p,) in cur.fetchall()] == FIRST_WEEK + SECOND_WEEK
    finally:
        con.close()


@pytest.mark.slow
def test_a_14_day_backfill_as_two_concurrent_runs_on_the_default_sqlite_storage(tmp_path, monkeypatch):
    """The same backfill on ``dagster.yaml``'s default SQLite storage (runs.db, index.db, one
    event-log file per run, schedules.db under $DAGSTER_HOME).

    What is true (measured on this project): two processes that are the FIRST to use a fresh SQLite
    home race creating its schema and one of them can die before its run starts with
    ``sqlite3.OperationalError: table alembic_version already exists`` (5 of 12 trials), so the
    home is initialized once first, as any earlier command (``gpu-pipeline ui``, a first run)
    would have done. On an initialized home the two concurrent runs complete and SQLite never
    answered "database is locked" (its busy timeout absorbs two writers). PostgreSQL has neither
    limit: the test above starts both runs on an empty database."""
    home = _home(tmp_path / "dagster_home", SQLITE_TEMPLATE)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as instance:  # creates the SQLite schema, like a first command
        assert instance.get_run_records() == []
    assert (home / "history" / "runs.db").is_file()
    results = _two_concurrent_weeks(tmp_path, home)
    for (rc, out), week in zip(results, (FIRST_WEEK, SECOND_WEEK), strict=True):
        assert "database is locked" not in out, out[-6000:]
        assert rc == 0, out[-6000:]
        assert f"daily_pipeline {week[0]} .. {week[-1]}: SUCCESS" in out
    _assert_tables_written(tmp_path / "data", FIRST_WEEK + SECOND_WEEK)
    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "SqliteRunStorage"
        records = instance.get_run_records()
        assert [r.dagster_run.status for r in records] == [dg.DagsterRunStatus.SUCCESS] * 2
        _assert_overlapping([(r.start_time, r.end_time) for r in records])
