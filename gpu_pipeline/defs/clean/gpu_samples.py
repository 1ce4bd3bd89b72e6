"""Clean layer: validated GPU telemetry samples (one schema for every source)."""

import dagster as dg

from gpu_pipeline.defs.common import (
    DayOutcome,
    daily_table_asset,
    materialize_result,
    run_days,
    table_key,
)
from gpu_pipeline.defs.raw.gpu_telemetry import KEY as RAW_KEY
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.samples import write_clean_samples
from gpu_pipeline.lib.schemas import GPU_SAMPLES as SPEC

KEY = table_key(SPEC)
MAX_QUARANTINE_SHARE = 0.01
RANGES_OK = dg.AssetCheckSpec(
    "values_in_range", asset=KEY,
    description=f"At most {MAX_QUARANTINE_SHARE:.0%} of the day's samples were quarantined for out-of-range values.",
)
UNIQUE = dg.AssetCheckSpec("unique_sample_key", asset=KEY, description="(sample_utc, source, host, gpu_id) is unique.")


@daily_table_asset(SPEC, deps=[RAW_KEY], check_specs=[RANGES_OK, UNIQUE])
def gpu_samples(context: dg.AssetExecutionContext, data_store: DataStoreResource) -> dg.MaterializeResult:
    store = data_store.store()
    shares: dict[str, float] = {}
    dupes: dict[str, int] = {}

    def one_day(day: str) -> DayOutcome:
        # the raw rows read, cleaned and written a batch at a time (they are stored in cleaning order)
        cleaned = write_clean_samples(store, day)
        shares[day] = cleaned.quarantine.num_rows / cleaned.rows_in if cleaned.rows_in else 0.0
        dupes[day] = cleaned.repeated_keys
        return DayOutcome(
            day=day,
            result=cleaned.result,
            metrics={
                "rows_in": cleaned.rows_in,
                "rows_quarantined": cleaned.quarantine.num_rows,
                "duplicate_rows_dropped": cleaned.duplicates_dropped,
                "gpus": cleaned.gpus,
            },
            details={"quarantined_by_reason": cleaned.quarantined_by_reason,
                     "raw_sorted_first": not cleaned.sorted_raw,
                     "checked_when_raw_was_written": cleaned.checked_when_written},
        )

    outcomes = run_days(context, one_day)
    checks = [
        dg.AssetCheckResult(check_name=RANGES_OK.name, passed=all(s <= MAX_QUARANTINE_SHARE for s in shares.values()),
                            metadata={"quarantined_share_by_day": dg.MetadataValue.json(shares)}),
        dg.AssetCheckResult(check_name=UNIQUE.name, passed=not any(dupes.values()),
                            metadata={"duplicates_by_day": dg.MetadataValue.json(dupes)}),
    ]
    return materialize_result(SPEC, outcomes, check_results=checks)
