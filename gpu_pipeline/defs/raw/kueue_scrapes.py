"""Raw layer: Kueue /metrics scrape files of each day (Kubernetes demand)."""

import dagster as dg

from gpu_pipeline.defs.common import (
    DayOutcome,
    daily_table_asset,
    gate_check,
    kept_days,
    materialize_result,
    run_days,
    table_key,
    window,
    write_unless_empty,
)
from gpu_pipeline.defs.resources import DataStoreResource, KueueResource
from gpu_pipeline.lib.kueue_source import RAW_KUEUE_SCRAPES as SPEC
from gpu_pipeline.lib.kueue_source import raw_scrapes

KEY = table_key(SPEC)
HAS_SCRAPES = dg.AssetCheckSpec(
    "has_scrapes", asset=KEY, blocking=True,
    description="When a Kueue scrape directory is configured, every day of the run has scrapes.",
)


@daily_table_asset(SPEC, kinds={"kubernetes", "parquet"}, check_specs=[HAS_SCRAPES])
def kueue_scrapes(
    context: dg.AssetExecutionContext, data_store: DataStoreResource, kueue: KueueResource
) -> dg.MaterializeResult:
    store = data_store.store()

    def one_day(day: str) -> DayOutcome:
        start, end = window(day)
        table = raw_scrapes(kueue.scrape_dir, start, end) if kueue.enabled else SPEC.empty()
        in_window = sum(table["in_window"].to_pylist()) if table.num_rows else 0
        result = write_unless_empty(context, store, SPEC, day, kueue.enabled and not in_window,
                                    lambda: store.write_partition(SPEC, day, table),
                                    "the scrape directory gives no scrape within the day")
        return DayOutcome(day=day, result=result, metrics={"scrapes": in_window})

    outcomes = run_days(context, one_day)
    empty = [o.day for o in outcomes if not o.metrics.get("scrapes")]
    check = gate_check(HAS_SCRAPES, outcomes, "days_without_scrapes", empty, applies=kueue.enabled,
                       enabled=kueue.enabled, days_kept_as_written_before=kept_days(outcomes))
    return materialize_result(SPEC, outcomes, check_results=[check])
