"""Raw layer: one day of HTCondor slot snapshots out of the monthly archives."""

import dagster as dg
import pyarrow.compute as pc

from gpu_pipeline.defs.common import (
    DayOutcome,
    daily_table_asset,
    gate_check,
    kept_days,
    log_kept,
    materialize_result,
    run_days,
    table_key,
    window,
    write_unless_empty,
)
from gpu_pipeline.defs.resources import CondorArchiveResource, DataStoreResource
from gpu_pipeline.lib.condor_archive import LATER_COLUMNS, read_window, rejected_rows
from gpu_pipeline.lib.coverage_table import snapshot_coverage
from gpu_pipeline.lib.schemas import QUARANTINE_CONDOR_RAW as QUARANTINE_RAW
from gpu_pipeline.lib.schemas import RAW_CONDOR_SLOT_SNAPSHOTS as SPEC
from gpu_pipeline.lib.schemas import conform

KEY = table_key(SPEC)
HAS_SNAPSHOTS = dg.AssetCheckSpec(
    "has_snapshots",
    asset=KEY,
    blocking=True,
    description="Every day of the run has at least one slot snapshot (a run whose every day is empty stops "
                "downstream; in a range with good days it fails as a warning naming the empty days).",
)

#: Share of the day's expected snapshots (from the archive's own cadence) below which a day fails ``coverage``.
MIN_COVERAGE = 0.8
COVERAGE = dg.AssetCheckSpec(
    "coverage",
    asset=KEY,
    description=f"Snapshots seen >= {MIN_COVERAGE:.0%} of those the archive's observed cadence makes expected over "
                "the day, and every month archive the day's window needs is there (a UTC day of a local-time "
                "archive reads hours of the local day before). A warning, not blocking: the states mark the "
                "buckets no snapshot covers (na, no_snapshot), so the day's seen hours still give metrics.",
)

SCHEMA_DRIFT = dg.AssetCheckSpec(
    "schema_drift",
    asset=KEY,
    description="Every archive read has the columns the pipeline reads (those only later months have excepted: "
                "PreventJobsReason, Disk); absent ones are read as null (a missing PrioritizedProjects makes every "
                "GPU open capacity). Columns the pipeline does not know are dropped and listed, not failed.",
)


def drift_check(outcomes: list[DayOutcome]) -> dg.AssetCheckResult:
    """``schema_drift`` over the run's days: fails (WARN) naming the file and the columns absent from it."""
    absent: dict[str, list[str]] = {}
    extra: dict[str, list[str]] = {}
    for o in outcomes:
        for path, cols in (o.details or {}).get("columns_absent_in_source", {}).items():
            if missing := [c for c in cols if c not in LATER_COLUMNS]:
                absent[path] = missing
        extra.update((o.details or {}).get("extra_columns_dropped", {}))
    return dg.AssetCheckResult(
        check_name=SCHEMA_DRIFT.name, asset_key=KEY, passed=not absent, severity=dg.AssetCheckSeverity.WARN,
        metadata={"columns_absent": dg.MetadataValue.json(absent), "columns_dropped": dg.MetadataValue.json(extra)},
    )


@daily_table_asset(SPEC, kinds={"htcondor", "sqlite", "parquet"}, check_specs=[HAS_SNAPSHOTS, COVERAGE, SCHEMA_DRIFT])
def condor_slot_snapshots(
    context: dg.AssetExecutionContext,
    data_store: DataStoreResource,
    condor_archive: CondorArchiveResource,
) -> dg.MaterializeResult:
    store = data_store.store()

    def one_day(day: str) -> DayOutcome:
        start, end = window(day)
        read = read_window(condor_archive.path, start, end, condor_archive.source_timezone)

        def write():
            # streamed into the file (no second copy of a 5 M-row day as Parquet bytes in memory)
            written = store.write_partition_batches(SPEC, day, conform(read.table, SPEC).to_batches())
            store.write_partition(QUARANTINE_RAW, day, rejected_rows(read))
            return written

        # an archive that gives nothing for the day (no snapshot, no row set aside) keeps what an
        # earlier run wrote (and its quarantine), rather than emptying the day; rows it cannot read are
        # written to the quarantine as always, which says why the day has none. So does one that gives
        # part of it because a month file the window needs is gone (retention), where the earlier run
        # wrote more rows: a re-run does not replace a whole day with its other month's hours.
        kept = None
        if read.missing_months and (before := store.kept_partition(SPEC, day)) is not None \
                and before.rows > read.table.num_rows:
            kept = before
            log_kept(context, SPEC, day, f"no archive for month(s) {read.missing_months}", kept,
                     instead=f"the {read.table.num_rows:,} rows the months left give")
        result = kept or write_unless_empty(context, store, SPEC, day, not read.snapshots and not read.rejected,
                                            write, "the archive gives nothing for the day")
        # a kept partition (an earlier run's, for a source that gives nothing or less now) on what it keeps
        held = store.read_table(SPEC, day, ["snapshot_utc"]) if result.kept else read.table
        cov = snapshot_coverage(held, start, end)
        details = {"source_files": read.files, "read_paths": read.read_paths}
        if read.missing_months:
            details["missing_months"] = read.missing_months
            context.log.warning(f"{day}: no archive for month(s) {read.missing_months}")
        if read.shadowed_files:
            details["files_not_read"] = read.shadowed_files
            context.log.warning(f"{day}: archive file(s) not read, another file of their month is (a .db before a "
                                f".sqlite before a .parquet): {read.shadowed_files}")
        if read.extra_columns:
            details["extra_columns_dropped"] = read.extra_columns
        if read.missing_columns:
            details["columns_absent_in_source"] = read.missing_columns
        if read.non_numeric:
            details["non_numeric_values_nulled"] = read.non_numeric
        metrics = {"snapshots": read.snapshots, "rows_unparseable_timestamp": read.unparseable_timestamps,
                   "snapshot_coverage_pct": round(100.0 * cov.coverage, 2), "snapshot_cadence_s": cov.cadence_s or 0.0,
                   "snapshot_gaps": float(cov.gaps)}
        if result.kept:  # ``snapshots`` is what the source gives now; the partition holds these
            metrics["snapshots_kept"] = pc.count_distinct(held.column("snapshot_utc")).as_py()
        return DayOutcome(day=day, result=result, metrics=metrics, details=details)

    outcomes = run_days(context, one_day)
    empty = [o.day for o in outcomes if not o.metrics.get("snapshots")]
    check = gate_check(HAS_SNAPSHOTS, outcomes, "days_without_snapshots", empty,
                       days_kept_as_written_before=kept_days(outcomes))
    return materialize_result(SPEC, outcomes, check_results=[check, coverage_check(outcomes), drift_check(outcomes)])


def coverage_check(outcomes: list[DayOutcome]) -> dg.AssetCheckResult:
    """``coverage`` over the run's days: fails (WARN) naming the days below :data:`MIN_COVERAGE` and those
    missing a month archive their window needs (a day kept as an earlier run wrote it is measured on
    what it keeps)."""
    covs = {o.day: o.metrics["snapshot_coverage_pct"] / 100.0 for o in outcomes}
    missing = {o.day: o.details["missing_months"] for o in outcomes if (o.details or {}).get("missing_months")}
    low = {d: round(c, 4) for d, c in covs.items() if c < MIN_COVERAGE}
    return dg.AssetCheckResult(
        check_name=COVERAGE.name, asset_key=KEY, passed=not low and not missing,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"below_threshold": dg.MetadataValue.json(low), "coverage_by_day": dg.MetadataValue.json(covs),
                  "missing_months_by_day": dg.MetadataValue.json(missing),
                  "days_kept_as_written_before": dg.MetadataValue.json(kept_days(outcomes))},
    )
