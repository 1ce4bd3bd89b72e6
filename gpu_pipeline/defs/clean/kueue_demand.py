"""Clean layer: Kueue queue / resource / admission-wait rows of each day."""

import dagster as dg

from gpu_pipeline.defs.common import DayOutcome, materialize_result, run_days, table_asset_metadata
from gpu_pipeline.defs.partitions import daily_backfill_policy, daily_partitions
from gpu_pipeline.defs.raw.kueue_scrapes import KEY as RAW_KEY
from gpu_pipeline.defs.resources import DataStoreResource, KueueResource
from gpu_pipeline.lib.kueue import KUEUE_DEMAND as SPEC
from gpu_pipeline.lib.kueue_source import RAW_KUEUE_SCRAPES, clean_scrapes

KEY = dg.AssetKey(["clean", "kueue_demand"])


@dg.asset(
    key=KEY,
    group_name="clean",
    description=SPEC.description,
    deps=[RAW_KEY],
    partitions_def=daily_partitions,
    backfill_policy=daily_backfill_policy,
    kinds={"kubernetes", "parquet"},
    owners=["team:gpu-ops"],
    metadata=table_asset_metadata(SPEC),
)
def kueue_demand(
    context: dg.AssetExecutionContext, data_store: DataStoreResource, kueue: KueueResource
) -> dg.MaterializeResult:
    store = data_store.store()

    def one_day(day: str) -> DayOutcome:
        table, counters = clean_scrapes(store.read_table(RAW_KUEUE_SCRAPES, day), kueue.cluster or None)
        result = store.write_partition(SPEC, day, table)
        return DayOutcome(day=day, result=result, metrics={k: float(v) for k, v in counters.items()})

    return materialize_result(SPEC, run_days(context, one_day))
