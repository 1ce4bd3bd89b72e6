"""Metrics: coverage and quality per source per day (DESIGN.md 5.7)."""

import dagster as dg

from gpu_pipeline.defs.clean.gpu_samples import KEY as SAMPLES_KEY
from gpu_pipeline.defs.clean.jobs import KEY as JOBS_KEY
from gpu_pipeline.defs.clean.kueue_demand import KEY as KUEUE_KEY
from gpu_pipeline.defs.clean.slot_snapshots import KEY as SLOTS_KEY
from gpu_pipeline.defs.clean.task_runs import RUNS_KEY as TASK_RUNS_KEY
from gpu_pipeline.defs.common import (
    DayOutcome,
    daily_table_asset,
    materialize_result,
    run_days,
    table_key,
    window,
)
from gpu_pipeline.defs.metrics.gpu_states import KEY as STATES_KEY
from gpu_pipeline.defs.resources import DataStoreResource, KueueResource, TelemetryResource
from gpu_pipeline.lib import schemas as S
from gpu_pipeline.lib.coverage import partition_coverage
from gpu_pipeline.lib.coverage_table import COVERAGE as SPEC
from gpu_pipeline.lib.coverage_table import COVERAGE_COLUMNS, TELEMETRY_SERIES, TELEMETRY_TIME, coverage_rows
from gpu_pipeline.lib.kueue import KUEUE_DEMAND
from gpu_pipeline.lib.kueue_source import QUARANTINE_KUEUE_DEMAND, RAW_KUEUE_SCRAPES
from gpu_pipeline.lib.terapixel import QUARANTINE_TASK_RUNS, TASK_RUNS

KEY = table_key(SPEC)


@daily_table_asset(SPEC, deps=[SLOTS_KEY, STATES_KEY, SAMPLES_KEY, JOBS_KEY, KUEUE_KEY, TASK_RUNS_KEY])
def coverage(context: dg.AssetExecutionContext, data_store: DataStoreResource,
             kueue: KueueResource, telemetry: TelemetryResource) -> dg.MaterializeResult:
    store = data_store.store()

    def read(spec, day, columns=None):
        if not store.has_partition(spec, day):
            empty = spec.empty()
            return empty.select(columns) if columns is not None else empty
        return store.read_table(spec, day, columns)

    def samples_file(day: str):
        """The day's samples as their file (read by DuckDB), or an empty table."""
        if store.has_partition(S.GPU_SAMPLES, day):
            return store.partition_file(S.GPU_SAMPLES, day)
        return S.GPU_SAMPLES.empty().select(COVERAGE_COLUMNS["samples"])

    def samples_coverage(day: str, start, end):
        """The samples' coverage, measured once per file's bytes (the raw step measured the raw file,
        which the clean step copies on a day with nothing to clean)."""
        if not store.has_partition(S.GPU_SAMPLES, day):
            return None
        return partition_coverage(store, S.GPU_SAMPLES, day, TELEMETRY_TIME, list(TELEMETRY_SERIES), start, end,
                                  also=(S.RAW_GPU_TELEMETRY,))

    def one_day(day: str) -> DayOutcome:
        start, end = window(day)
        scrapes = read(KUEUE_DEMAND, day, ["sample_utc"])
        kueue_quarantine = read(QUARANTINE_KUEUE_DEMAND, day)
        # a configured Kueue source has its row every day, with no readable scrape too (its coverage 0,
        # its quarantine counted); an unconfigured one where a day still holds its rows
        kueue_row = kueue.enabled or scrapes.num_rows > 0 or kueue_quarantine.num_rows > 0
        # a render farm's task events, where one is read (its events set aside counted here too)
        task_quarantine = read(QUARANTINE_TASK_RUNS, day)
        task_runs = store.row_count(TASK_RUNS, day)
        task_row = bool(telemetry.terapixel_dir.strip()) or task_quarantine.num_rows > 0 or task_runs > 0
        table = coverage_rows(
            start, end, read(S.CLEAN_SLOT_SNAPSHOTS, day, COVERAGE_COLUMNS["slots"]),
            read(S.GPU_STATES, day, COVERAGE_COLUMNS["states"]), samples_file(day),
            read(S.JOBS, day, COVERAGE_COLUMNS["jobs"]), scrapes if kueue_row else None,
            {
                "slot_snapshots": [read(S.QUARANTINE_CONDOR_RAW, day), read(S.QUARANTINE, day)],
                "gpu_telemetry": [read(S.QUARANTINE_GPU_TELEMETRY, day), read(S.QUARANTINE_GPU_SAMPLES, day)],
                "job_records": [read(S.QUARANTINE_JOBS, day)],
                "kueue": [kueue_quarantine],
                "task_runs": [task_quarantine],
            },
            rows_in={"slot_snapshots": store.row_count(S.RAW_CONDOR_SLOT_SNAPSHOTS, day),
                     "gpu_telemetry": store.row_count(S.RAW_GPU_TELEMETRY, day),
                     "job_records": store.row_count(S.RAW_JOB_DOCUMENTS, day),
                     "kueue": store.row_count(RAW_KUEUE_SCRAPES, day)},
            telemetry_coverage=samples_coverage(day, start, end),
            task_runs=task_runs if task_row else None,
        )
        metrics = {f"{r['source']}_coverage_pct": r["coverage_pct"] for r in table.to_pylist()
                   if r["coverage_pct"] is not None}
        tel = [r for r in table.to_pylist() if r["source"] == "gpu_telemetry"]
        if tel and tel[0]["gpus_with_telemetry_pct"] is not None:
            metrics["gpus_with_telemetry_pct"] = tel[0]["gpus_with_telemetry_pct"]
        return DayOutcome(day=day, result=store.write_partition(SPEC, day, table), metrics=metrics)

    return materialize_result(SPEC, run_days(context, one_day))
