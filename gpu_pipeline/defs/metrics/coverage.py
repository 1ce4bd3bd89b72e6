"""Metrics: coverage and quality per source per day (DESIGN.md 5.7)."""

import dagster as dg

from gpu_pipeline.defs.clean.gpu_samples import KEY as SAMPLES_KEY
from gpu_pipeline.defs.clean.jobs import KEY as JOBS_KEY
from gpu_pipeline.defs.clean.kueue_demand import KEY as KUEUE_KEY
from gpu_pipeline.defs.clean.slot_snapshots import KEY as SLOTS_KEY
from gpu_pipeline.defs.common import DayOutcome, materialize_result, run_days, table_asset_metadata, window
from gpu_pipeline.defs.metrics.gpu_states import KEY as STATES_KEY
from gpu_pipeline.defs.partitions import daily_backfill_policy, daily_partitions
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib import schemas as S
from gpu_pipeline.lib.coverage_table import COVERAGE as SPEC
from gpu_pipeline.lib.coverage_table import coverage_rows
from gpu_pipeline.lib.kueue import KUEUE_DEMAND

KEY = dg.AssetKey(["metrics", "coverage"])


@dg.asset(
    key=KEY,
    group_name="metrics",
    description=SPEC.description,
    deps=[SLOTS_KEY, STATES_KEY, SAMPLES_KEY, JOBS_KEY, KUEUE_KEY],
    partitions_def=daily_partitions,
    backfill_policy=daily_backfill_policy,
    kinds={"duckdb", "parquet"},
    owners=["team:gpu-ops"],
    metadata=table_asset_metadata(SPEC),
)
def coverage(context: dg.AssetExecutionContext, data_store: DataStoreResource) -> dg.MaterializeResult:
    store = data_store.store()

    def read(spec, day):
        return store.read_table(spec, day) if store.has_partition(spec, day) else spec.empty()

    def one_day(day: str) -> DayOutcome:
        start, end = window(day)
        kueue = read(KUEUE_DEMAND, day)
        table = coverage_rows(
            start, end, read(S.CLEAN_SLOT_SNAPSHOTS, day), read(S.GPU_STATES, day), read(S.GPU_SAMPLES, day),
            read(S.JOBS, day), kueue if kueue.num_rows else None,
            {
                "slot_snapshots": [read(S.QUARANTINE_CONDOR_RAW, day), read(S.QUARANTINE, day)],
                "gpu_telemetry": [read(S.QUARANTINE_GPU_TELEMETRY, day), read(S.QUARANTINE_GPU_SAMPLES, day)],
                "job_records": [read(S.QUARANTINE_JOBS, day)],
            },
            rows_in={"slot_snapshots": read(S.RAW_CONDOR_SLOT_SNAPSHOTS, day).num_rows,
                     "gpu_telemetry": read(S.RAW_GPU_TELEMETRY, day).num_rows,
                     "job_records": read(S.RAW_JOB_DOCUMENTS, day).num_rows},
        )
        metrics = {f"{r['source']}_coverage_pct": r["coverage_pct"] for r in table.to_pylist()
                   if r["coverage_pct"] is not None}
        tel = [r for r in table.to_pylist() if r["source"] == "gpu_telemetry"]
        if tel and tel[0]["gpus_with_telemetry_pct"] is not None:
            metrics["gpus_with_telemetry_pct"] = tel[0]["gpus_with_telemetry_pct"]
        return DayOutcome(day=day, result=store.write_partition(SPEC, day, table), metrics=metrics)

    return materialize_result(SPEC, run_days(context, one_day))
