"""Raw layer: Kueue /metrics scrape files of each day (Kubernetes demand)."""

import dagster as dg

from gpu_pipeline.defs.common import (
    DayOutcome,
    gate_check,
    materialize_result,
    run_days,
    table_asset_metadata,
    window,
)
from gpu_pipeline.defs.partitions import daily_backfill_policy, daily_partitions
from gpu_pipeline.defs.resources import DataStoreResource, KueueResource
from gpu_pipeline.lib.kueue_source import RAW_KUEUE_SCRAPES as SPEC
from gpu_pipeline.lib.kueue_source import raw_scrapes

KEY = dg.AssetKey(["raw", "kueue_scrapes"])
HAS_SCRAPES = dg.AssetCheckSpec(
    "has_scrapes", asset=KEY, blocking=True,
    description="When a Kueue scrape directory is configured, every day of the run has scrapes.",
)


@dg.asset(
    key=KEY,
    group_name="raw",
    description=SPEC.description,
    partitions_def=daily_partitions,
    backfill_policy=daily_backfill_policy,
    kinds={"kubernetes", "parquet"},
    owners=["team:gpu-ops"],
    metadata=table_asset_metadata(SPEC),
    check_specs=[HAS_SCRAPES],
)
def kueue_scrapes(
    context: dg.AssetExecutionContext, data_store: DataStoreResource, kueue: KueueResource
) -> dg.MaterializeResult:
    store = data_store.store()

    def one_day(day: str) -> DayOutcome:
        start, end = window(day)
        table = raw_scrapes(kueue.scrape_dir, start, end) if kueue.enabled else SPEC.empty()
        result = store.write_partition(SPEC, day, table)
        in_window = sum(table["in_window"].to_pylist()) if table.num_rows else 0
        return DayOutcome(day=day, result=result, metrics={"scrapes": in_window})

    outcomes = run_days(context, one_day)
    empty = [o.day for o in outcomes if not o.metrics.get("scrapes")]
    check = gate_check(HAS_SCRAPES, outcomes, "days_without_scrapes", empty, applies=kueue.enabled,
                       enabled=kueue.enabled)
    return materialize_result(SPEC, outcomes, check_results=[check])
