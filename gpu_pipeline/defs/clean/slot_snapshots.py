"""Clean layer: typed, UTC, tiered slot snapshots (one row per snapshot x slot x GPU)."""

import dagster as dg

from gpu_pipeline.defs.common import (
    DayOutcome,
    daily_table_asset,
    materialize_result,
    run_days,
    table_key,
    violations_check,
)
from gpu_pipeline.defs.raw.condor_slot_snapshots import KEY as RAW_KEY
from gpu_pipeline.defs.resources import CondorArchiveResource, DataStoreResource
from gpu_pipeline.lib.db import connect
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS as SPEC
from gpu_pipeline.lib.schemas import QUARANTINE, RAW_CONDOR_SLOT_SNAPSHOTS
from gpu_pipeline.lib.slots import CLEAN_INPUT_COLUMNS, DICTIONARY_COLUMNS, clean_slot_rows, gpu_id_collisions

KEY = table_key(SPEC)
UNIQUE_KEY = dg.AssetCheckSpec(
    "unique_snapshot_slot_gpu",
    asset=KEY,
    description="(snapshot_utc, slot_name, gpu_id) is unique.",
)


ONE_HOST = dg.AssetCheckSpec(
    "gpu_id_on_one_host",
    asset=KEY,
    description="No GPU id is named by slots of two hosts in one snapshot (two boards with the same HTCondor short "
                "id, or HTCondor 9.1's 4-hex MIG ids): the states and every table keyed by gpu_id would read them as "
                "one GPU. A warning naming the ids and their hosts.",
)


@daily_table_asset(SPEC, deps=[RAW_KEY], check_specs=[UNIQUE_KEY, ONE_HOST])
def slot_snapshots(
    context: dg.AssetExecutionContext,
    data_store: DataStoreResource,
    condor_archive: CondorArchiveResource,
) -> dg.MaterializeResult:
    store = data_store.store()
    duplicate_keys: dict[str, int] = {}
    collisions: dict[str, dict] = {}

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
        if cleaned.rows_out:
            con = connect()
            try:
                total, found = gpu_id_collisions(con, *store.relation_sql(SPEC, [day]))
            finally:
                con.close()
            if found:
                collisions[day] = {"gpu_ids": total, "examples": found}
                context.log.warning(f"{day}: {total} GPU id(s) named by two hosts in one snapshot (short ids that "
                                    "collide, or one board two hosts advertise), read as one GPU downstream: "
                                    f"{dict(list(found.items())[:3])}")
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
    one_host = violations_check(ONE_HOST, KEY, collisions, "gpu_ids_on_several_hosts_by_day", dg.AssetCheckSeverity.WARN)
    return materialize_result(SPEC, outcomes, check_results=[check, one_host])
