"""The instance template's SQLite storage (``gpu_pipeline.instance_storage``): Dagster's own files
and schema, an event log that keeps its database connections open.

Each test runs small partitioned range runs on a ``$DAGSTER_HOME`` made from the repository's
``dagster.yaml`` and reads what they stored back, through the pooled storage and through Dagster's
own SQLite storage on the same directory."""

import multiprocessing
import shutil
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.event_log.sqlite import sqlite_event_log

from gpu_pipeline import instance_storage
from gpu_pipeline.instance_storage import PooledSqliteEventLogStorage

TEMPLATE = Path(__file__).resolve().parents[2] / "dagster.yaml"
DAYS = ["2025-08-04", "2025-08-05", "2025-08-06"]
PARTS = dg.DailyPartitionsDefinition(start_date="2025-08-01")


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.single_run())
def first(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"days": len(context.partition_keys)})


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.single_run(), deps=[first])
def second(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"days": len(context.partition_keys)})


JOB = dg.Definitions(
    assets=[first, second],
    jobs=[dg.define_asset_job("two")],
    executor=dg.in_process_executor,
).resolve_job_def("two")


def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, yaml_text: str | None = None) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    if yaml_text is None:
        shutil.copyfile(TEMPLATE, home / "dagster.yaml")
    else:
        (home / "dagster.yaml").write_text(yaml_text)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def _range_run(instance: dg.DagsterInstance, start: str = DAYS[0], end: str = DAYS[-1]) -> str:
    result = JOB.execute_in_process(instance=instance, tags={
        "dagster/asset_partition_range_start": start, "dagster/asset_partition_range_end": end})
    assert result.success
    return result.run_id


def _materialized(instance: dg.DagsterInstance) -> dict[str, set[str]]:
    return {key.to_user_string(): set(instance.get_materialized_partitions(key))
            for key in (dg.AssetKey("first"), dg.AssetKey("second"))}


def _event_types(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.dagster_event.event_type_value for e in instance.all_logs(run_id) if e.is_dagster_event]


def test_the_template_uses_the_pooled_event_log_on_dagsters_own_files(tmp_path, monkeypatch):
    home = _home(tmp_path, monkeypatch)
    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.event_log_storage, PooledSqliteEventLogStorage)
        assert type(instance.run_storage).__name__ == "SqliteRunStorage"
        run_id = _range_run(instance)
        assert _materialized(instance) == {"first": set(DAYS), "second": set(DAYS)}
    # Dagster's default SQLite layout under $DAGSTER_HOME.
    assert (home / "history" / "runs.db").is_file()
    assert (home / "history" / "runs" / "index.db").is_file()
    assert (home / "history" / "runs" / f"{run_id}.db").is_file()
    assert (home / "schedules" / "schedules.db").is_file()


def test_dagsters_own_sqlite_storage_reads_what_it_stored_and_the_other_way_round(tmp_path, monkeypatch):
    home = _home(tmp_path, monkeypatch)
    with dg.DagsterInstance.get() as instance:
        pooled_run = _range_run(instance, DAYS[0], DAYS[1])
        pooled_events = _event_types(instance, pooled_run)
    # The same directory opened with no `storage:` key: Dagster's SqliteEventLogStorage.
    _home(tmp_path, monkeypatch, "telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.get() as instance:
        assert type(instance.event_log_storage).__name__ == "SqliteEventLogStorage"
        assert _event_types(instance, pooled_run) == pooled_events
        assert pooled_events.count("ASSET_MATERIALIZATION") == 4  # two assets x two days
        assert _materialized(instance) == {"first": set(DAYS[:2]), "second": set(DAYS[:2])}
        plain_run = _range_run(instance, DAYS[2], DAYS[2])
        plain_events = _event_types(instance, plain_run)
    shutil.copyfile(TEMPLATE, home / "dagster.yaml")
    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.event_log_storage, PooledSqliteEventLogStorage)
        assert _event_types(instance, plain_run) == plain_events
        assert _materialized(instance) == {"first": set(DAYS), "second": set(DAYS)}
        assert [r.dagster_run.run_id for r in instance.get_run_records()] == [plain_run, pooled_run]


def test_one_engine_per_database_however_many_events(tmp_path, monkeypatch):
    """Dagster's own event log creates an engine for every event; this one for every database."""
    _home(tmp_path, monkeypatch)
    created: list[str] = []
    real = instance_storage.create_engine

    def counting(url, **kwargs):  # noqa: ANN001, ANN003, ANN202
        created.append(str(url))
        return real(url, **kwargs)

    dagster_created: list[str] = []
    dagster_real = sqlite_event_log.create_engine

    def dagster_counting(url, **kwargs):  # noqa: ANN001, ANN003, ANN202
        dagster_created.append(str(url))
        return dagster_real(url, **kwargs)

    monkeypatch.setattr(instance_storage, "create_engine", counting)
    with dg.DagsterInstance.get() as instance:
        monkeypatch.setattr(sqlite_event_log, "create_engine", dagster_counting)
        run_id = _range_run(instance)
        events = len(instance.all_logs(run_id))
        assert events > 20
        assert sorted(Path(u).name for u in created) == sorted(["index.db", f"{run_id}.db"])
        # Dagster's has_table (an engine per call, one call per asset event) once per table.
        assert _event_types(instance, run_id).count("ASSET_MATERIALIZATION") == 6
        assert len(dagster_created) <= 2
        assert sorted(instance.event_log_storage.open_databases()) == sorted(["index", run_id])


def test_at_most_max_open_databases_the_least_recently_used_closed_first(tmp_path, monkeypatch):
    _home(tmp_path, monkeypatch, TEMPLATE.read_text().replace(
        "base_dir: {env: DAGSTER_HOME}", "base_dir: {env: DAGSTER_HOME}\n      max_open_databases: 2"))
    with dg.DagsterInstance.get() as instance:
        storage = instance.event_log_storage
        runs = [_range_run(instance, day, day) for day in DAYS]
        assert len(storage.open_databases()) == 2
        assert storage.open_databases()[-1] in {"index", runs[-1]}
        # A closed run database opens again when it is read.
        assert "ASSET_MATERIALIZATION" in _event_types(instance, runs[0])
        assert storage.open_databases()[-1] == runs[0]
        assert len(storage.open_databases()) == 2


def test_a_bad_max_open_databases_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_open_databases must be at least 1, not 0"):
        PooledSqliteEventLogStorage(str(tmp_path), max_open_databases=0)


def test_wipe_closes_the_databases_it_deletes_and_events_are_stored_again(tmp_path, monkeypatch):
    home = _home(tmp_path, monkeypatch)
    with dg.DagsterInstance.get() as instance:
        old_run = _range_run(instance)
        assert old_run in instance.event_log_storage.open_databases()
        instance.event_log_storage.wipe()
        # The run's database was closed before its file was deleted; the index was emptied after.
        assert instance.event_log_storage.open_databases() == ["index"]
        assert not (home / "history" / "runs" / f"{old_run}.db").exists()
        assert _materialized(instance) == {"first": set(), "second": set()}
        new_run = _range_run(instance, DAYS[0], DAYS[0])
        assert (home / "history" / "runs" / f"{new_run}.db").is_file()
        assert _materialized(instance) == {"first": {DAYS[0]}, "second": {DAYS[0]}}


def _child_reads(queue: multiprocessing.Queue, run_id: str) -> None:
    # The parent's instance, inherited through fork, read with the child's own connections.
    instance = _FORKED_INSTANCE
    assert instance is not None
    days = sorted(_materialized(instance)["first"])
    events = len(instance.all_logs(run_id))
    queue.put((days, events, [id(e) for e in instance.event_log_storage._engines.values()]))


_FORKED_INSTANCE: dg.DagsterInstance | None = None


def test_a_forked_child_opens_its_own_connections_and_leaves_the_parents_open(tmp_path, monkeypatch):
    global _FORKED_INSTANCE  # noqa: PLW0603
    _home(tmp_path, monkeypatch)
    with dg.DagsterInstance.get() as instance:
        run_id = _range_run(instance)
        events = len(instance.all_logs(run_id))
        parents = {id(e) for e in instance.event_log_storage._engines.values()}
        assert len(parents) == 2
        _FORKED_INSTANCE = instance
        try:
            ctx = multiprocessing.get_context("fork")
            queue = ctx.Queue()
            child = ctx.Process(target=_child_reads, args=(queue, run_id))
            child.start()
            days, child_events, child_engines = queue.get(timeout=60)
            child.join(60)
        finally:
            _FORKED_INSTANCE = None
        assert child.exitcode == 0
        assert (days, child_events) == (DAYS, events)
        assert len(child_engines) == 2 and not parents & set(child_engines)
        # The parent's pooled connections still work after the child exited.
        assert {id(e) for e in instance.event_log_storage._engines.values()} == parents
        assert len(instance.all_logs(run_id)) == events
        _range_run(instance, DAYS[0], DAYS[0])


def test_both_instance_templates_queue_one_single_day_run_per_partition(tmp_path, monkeypatch):
    """The run queue holds a second single-day run of the same partition back (the README's "two
    runs of the same day"). The PostgreSQL template an operator copies for production must queue
    runs the same way: it lacked the partition limit, so two runs of one day could run at once."""
    import yaml

    queues = {name: yaml.safe_load((TEMPLATE.parent / name).read_text())["run_queue"]
              for name in ("dagster.yaml", "dagster.postgres.yaml")}
    assert queues["dagster.yaml"] == queues["dagster.postgres.yaml"]
    _home(tmp_path, monkeypatch)
    with dg.DagsterInstance.get() as instance:
        limits = instance.run_coordinator.get_run_queue_config().tag_concurrency_limits
    assert {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits


def test_both_instance_templates_monitor_runs_the_same_way(tmp_path, monkeypatch):
    """Run monitoring (the daemon stops a scheduled run over its ``dagster/max_runtime``;
    e2e/test_run_monitoring.py) is on in both templates, with the same settings."""
    import yaml

    got = {name: yaml.safe_load((TEMPLATE.parent / name).read_text())["run_monitoring"]
           for name in ("dagster.yaml", "dagster.postgres.yaml")}
    assert got["dagster.yaml"] == got["dagster.postgres.yaml"]
    _home(tmp_path, monkeypatch)
    with dg.DagsterInstance.get() as instance:
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_max_resume_run_attempts == 0  # the default launcher cannot resume
