"""Terapixel-style render task runs (clean) and their GPU means (metrics), per day."""

import datetime as dt
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.defs.clean.gpu_samples import KEY as SAMPLES_KEY
from gpu_pipeline.defs.common import (
    daily_table_asset,
    materialize_result,
    outcome,
    run_days,
    table_key,
    window,
)
from gpu_pipeline.defs.resources import DataStoreResource, TelemetryResource
from gpu_pipeline.lib.schemas import GPU_SAMPLES
from gpu_pipeline.lib.terapixel import (
    QUARANTINE_TASK_RUNS,
    TASK_GPU_MEANS,
    TASK_RUNS,
    parse_task_runs,
    task_gpu_means,
)

RUNS_KEY, MEANS_KEY = table_key(TASK_RUNS), table_key(TASK_GPU_MEANS)


@daily_table_asset(TASK_RUNS, [], {"csv", "parquet"})
def task_runs(context: dg.AssetExecutionContext, data_store: DataStoreResource, telemetry: TelemetryResource):
    store = data_store.store()
    base = telemetry.terapixel_dir.strip()
    parsed = None
    if base:
        d = Path(base)
        xy = d / "task-x-y.csv"
        parsed = parse_task_runs(d / "application-checkpoints.csv", xy if xy.is_file() else None)

    first_run_day = None
    set_aside = parsed.quarantine_table() if parsed is not None else None  # the file's lines set aside
    if parsed is not None:
        from gpu_pipeline.defs.partitions import TIMEZONE
        from gpu_pipeline.lib.timeutil import to_local_naive

        # the file's first day: of its first run, or its first event set aside with a time, else of
        # the file's last change (a file of lines without any readable time)
        times = [t for t in (pc.min(parsed.table["start_utc"]).as_py() if parsed.table.num_rows else None,
                             pc.min(set_aside["record_utc"]).as_py()) if t is not None]
        first = min(times) if times else dt.datetime.fromtimestamp(
            Path(parsed.files[0]).stat().st_mtime, dt.UTC) if parsed.files else None
        first_run_day = to_local_naive(first, TIMEZONE).date().isoformat() if first is not None else None

    def one_day(day: str):
        start, end = window(day)
        if parsed is None:
            runs, quarantine = TASK_RUNS.empty(), QUARANTINE_TASK_RUNS.empty()
        else:
            t = parsed.table
            s = pa.scalar(start, t["start_utc"].type)
            e = pa.scalar(end, t["start_utc"].type)
            runs = t.filter(pc.and_(pc.greater_equal(t["start_utc"], s), pc.less(t["start_utc"], e)))
            # lines set aside are reported on the day their time falls in; lines without a readable
            # time on the file's first day
            q = set_aside
            when = q["record_utc"]
            first_day = day == first_run_day
            keep = pc.or_(
                pc.and_(pc.greater_equal(when, pa.scalar(start, when.type)), pc.less(when, pa.scalar(end, when.type))),
                pc.and_(pc.is_null(when), pa.scalar(first_day)),
            )
            quarantine = q.filter(pc.fill_null(keep, first_day))
        store.write_partition(QUARANTINE_TASK_RUNS, day, quarantine)
        # the day's own figures: its runs' re-executions and its unmatched events (the quarantined
        # lines of the day); the exact duplicates dropped are counted over the file, and reported
        # once, on the file's first day of runs
        reasons = quarantine["reason"].to_pylist() if parsed is not None else []
        counters = {
            "reexecuted_runs": float(pc.sum(pc.greater_equal(runs["run_index"], 1)).as_py() or 0),
            "unmatched_start": float(sum(r.startswith("unmatched START") for r in reasons)),
            "unmatched_stop": float(sum(r.startswith("unmatched STOP") for r in reasons)),
        }
        if parsed is not None and day == first_run_day:
            counters["duplicate_events_in_file"] = float(parsed.counters.get("duplicate_events", 0))
        return outcome(day, store.write_partition(TASK_RUNS, day, runs), runs, **counters)

    return materialize_result(TASK_RUNS, run_days(context, one_day))


# A step of its own: it reads the telemetry, whose blocking checks must not stop the task runs too.
@daily_table_asset(TASK_GPU_MEANS, [RUNS_KEY, SAMPLES_KEY])
def task_gpu_means_asset(context: dg.AssetExecutionContext, data_store: DataStoreResource):
    store = data_store.store()

    def one_day(day: str):
        runs = store.read_table(TASK_RUNS, day) if store.has_partition(TASK_RUNS, day) else TASK_RUNS.empty()
        # only the render farm's samples (filtered while the file is read: a day of a large pool's
        # 30-second telemetry is millions of rows); a run that goes on past midnight also reads the
        # next day's (the neighbour sensor re-runs the day when they come)
        _, end = window(day)
        days = [day]
        if runs.num_rows and pc.max(runs["end_utc"]).as_py() > end:
            days.append((dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat())
        parts = [store.read_table(GPU_SAMPLES, d, where=("source", "==", "terapixel"))
                 for d in days if runs.num_rows and store.has_partition(GPU_SAMPLES, d)]
        samples = pa.concat_tables(parts) if parts else GPU_SAMPLES.empty()
        means = task_gpu_means(runs, samples) if runs.num_rows else TASK_GPU_MEANS.empty()
        return outcome(day, store.write_partition(TASK_GPU_MEANS, day, means), means)

    return materialize_result(TASK_GPU_MEANS, run_days(context, one_day))
