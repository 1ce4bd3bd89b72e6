"""Metrics layer: per-GPU state per 5-minute bucket (DESIGN.md 5.1)."""

import dagster as dg
import pyarrow.compute as pc

from gpu_pipeline.defs.clean.slot_snapshots import KEY as CLEAN_KEY
from gpu_pipeline.defs.common import (
    DayOutcome,
    daily_table_asset,
    materialize_result,
    run_days,
    table_key,
    window,
)
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.schemas import GPU_STATES as SPEC
from gpu_pipeline.lib.schemas import STATES
from gpu_pipeline.lib.states import BUCKET, bucket_count, states_for_day

KEY = table_key(SPEC)
CONSERVATION = dg.AssetCheckSpec(
    "gpu_hours_conserved",
    asset=KEY,
    description="Every GPU has exactly one row per bucket of the day (sum of states = GPUs x day length).",
)


@daily_table_asset(SPEC, deps=[CLEAN_KEY], check_specs=[CONSERVATION])
def gpu_states(context: dg.AssetExecutionContext, data_store: DataStoreResource) -> dg.MaterializeResult:
    store = data_store.store()
    bad_days: dict[str, str] = {}

    def one_day(day: str) -> DayOutcome:
        start, end = window(day)
        # the day's and the day before's clean partitions (the first bucket may carry a snapshot)
        table = states_for_day(store, day, start, end)
        result = store.write_partition(SPEC, day, table)
        n_buckets = bucket_count(start, end, BUCKET)
        gpus = len(pc.unique(table.column("gpu_id")))
        if table.num_rows != gpus * n_buckets:
            bad_days[day] = f"{table.num_rows} rows != {gpus} GPUs x {n_buckets} buckets"
        counts = dict(zip(*pc.value_counts(table.column("state")).flatten(), strict=True)) if table.num_rows else {}
        counts = {str(k): int(v) for k, v in zip(counts.keys(), counts.values(), strict=True)}
        metrics = {"gpus": gpus, "buckets": n_buckets}
        for s in STATES:
            metrics[f"{s}_share"] = counts.get(s, 0) / table.num_rows if table.num_rows else 0.0
        return DayOutcome(day=day, result=result, metrics=metrics)

    outcomes = run_days(context, one_day)
    check = dg.AssetCheckResult(
        check_name=CONSERVATION.name,
        passed=not bad_days,
        metadata={"violations": dg.MetadataValue.json(bad_days)},
    )
    return materialize_result(SPEC, outcomes, check_results=[check])
