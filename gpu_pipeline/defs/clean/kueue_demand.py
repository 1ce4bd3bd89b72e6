"""Clean layer: Kueue queue / resource / admission-wait rows of each day."""

import dagster as dg

from gpu_pipeline.defs.common import (
    DayOutcome,
    daily_table_asset,
    materialize_result,
    run_days,
    table_key,
)
from gpu_pipeline.defs.raw.kueue_scrapes import KEY as RAW_KEY
from gpu_pipeline.defs.resources import DataStoreResource, KueueResource
from gpu_pipeline.lib.kueue import KUEUE_DEMAND as SPEC
from gpu_pipeline.lib.kueue_source import QUARANTINE_KUEUE_DEMAND, RAW_KUEUE_SCRAPES, clean_scrapes

KEY = table_key(SPEC)


@daily_table_asset(SPEC, deps=[RAW_KEY], kinds={"kubernetes", "parquet"})
def kueue_demand(
    context: dg.AssetExecutionContext, data_store: DataStoreResource, kueue: KueueResource
) -> dg.MaterializeResult:
    store = data_store.store()

    def one_day(day: str) -> DayOutcome:
        table, counters, quarantine = clean_scrapes(store.read_table(RAW_KUEUE_SCRAPES, day), kueue.cluster or None)
        for path in quarantine["source_file"].to_pylist():
            context.log.warning(f"{day}: Kueue scrape {path} set aside as unreadable (quarantine/kueue_demand)")
        store.write_partition(QUARANTINE_KUEUE_DEMAND, day, quarantine)
        if counters.get("inactive_cluster_queues"):
            context.log.info(f"{day}: {counters['inactive_cluster_queues']} Kueue ClusterQueue(s) not active in a "
                             "scrape (pending, terminated): of their quota only the GPUs they hold count as capacity")
        result = store.write_partition(SPEC, day, table)
        return DayOutcome(day=day, result=result, metrics={k: float(v) for k, v in counters.items()})

    return materialize_result(SPEC, run_days(context, one_day))
