"""Clean layer: typed, UTC, tiered slot snapshots (one row per snapshot x slot x GPU)."""

import dagster as dg

from gpu_pipeline.defs.common import (
    DayOutcome,
    daily_table_asset,
    materialize_result,
    run_days,
    table_key,
)
from gpu_pipeline.defs.raw.condor_slot_snapshots import KEY as RAW_KEY
from gpu_pipeline.defs.resources import CondorArchiveResource, DataStoreResource
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS as SPEC
from gpu_pipeline.lib.schemas import QUARANTINE, RAW_CONDOR_SLOT_SNAPSHOTS
from gpu_pipeline.lib.slots import CLEAN_INPUT_COLUMNS, DICTIONARY_COLUMNS, clean_slot_rows

KEY = table_key(SPEC)
UNIQUE_KEY = dg.AssetCheckSpec(
    "unique_snapshot_slot_gpu",
    asset=KEY,
    description="(snapshot_utc, slot_name, gpu_id) is unique.",
)


@daily_table_asset(SPEC, deps=[RAW_KEY], check_specs=[UNIQUE_KEY])
def slot_snapshots(
    context: dg.AssetExecutionContext,
    data_store: DataStoreResource,
    condor_archive: CondorArchiveResource,
) -> dg.MaterializeResult:
    store = data_store.store()
    duplicate_keys: dict[str, int] = {}

    def one_day(day: str) -> DayOutcome:
        # Only the columns cleaning reads, repetitive text dictionary-encoded (a 10,000-GPU day is
        # 5.6 M rows); quarantined rows are re-read whole. The clean rows stream from DuckDB into
        # the partition file, one row group at a time.
        cleaned = clean_slot_rows(
            store.read_table(RAW_CONDOR_SLOT_SNAPSHOTS, day, CLEAN_INPUT_COLUMNS, dictionary=DICTIONARY_COLUMNS),
            condor_archive.excluded_patterns(),
            full_rows=lambda idx: store.read_table(RAW_CONDOR_SLOT_SNAPSHOTS, day).take(idx),
            sink=lambda batches: store.write_partition_batches(SPEC, day, batches),
        )
        store.write_partition(QUARANTINE, day, cleaned.quarantine)
        duplicate_keys[day] = cleaned.duplicate_keys
        return DayOutcome(
            day=day,
            result=cleaned.written,
            metrics={
                "rows_in": cleaned.rows_in,
                "rows_excluded_hosts": sum(cleaned.excluded_by_host.values()),
                "rows_quarantined": cleaned.quarantine.num_rows,
                "duplicate_rows_dropped": cleaned.duplicates_dropped,
                "gpu_usage_out_of_range_nulled": cleaned.usage_out_of_range_nulled,
                "gpus": cleaned.gpus,
            },
            details={
                "excluded_rows_by_host": cleaned.excluded_by_host,
                "quarantined_by_reason": cleaned.quarantined_by_reason,
            },
        )

    outcomes = run_days(context, one_day)
    check = dg.AssetCheckResult(
        check_name=UNIQUE_KEY.name,
        passed=not any(duplicate_keys.values()),
        metadata={"duplicate_keys_by_day": dg.MetadataValue.json(duplicate_keys)},
    )
    return materialize_result(SPEC, outcomes, check_results=[check])
