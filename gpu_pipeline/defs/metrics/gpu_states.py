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
    description="Every GPU has exactly one row per bucket of the day: as many rows as buckets, each bucket once "
                "(so the states' GPU-hours are GPUs x day length, none counted twice and none missing).",
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
        per_gpu = table.group_by("gpu_id").aggregate([("bucket_start_utc", "count"),
                                                      ("bucket_start_utc", "count_distinct")])
        gpus = per_gpu.num_rows
        # each GPU on its own: one GPU's bucket twice and another's missing add up to the right total
        off = pc.or_(pc.not_equal(per_gpu["bucket_start_utc_count"], n_buckets),
                     pc.not_equal(per_gpu["bucket_start_utc_count_distinct"], n_buckets))
        if gpus and (n_off := int(pc.sum(off).as_py() or 0)):
            example = per_gpu.filter(off).slice(0, 1).to_pylist()[0]
            bad_days[day] = (f"{n_off} of {gpus} GPUs without exactly one row per bucket of {n_buckets} (e.g. "
                             f"{example['gpu_id']}: {example['bucket_start_utc_count']} rows, "
                             f"{example['bucket_start_utc_count_distinct']} buckets)")
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
