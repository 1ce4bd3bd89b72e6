"""Clean layer: one row per job run (epoch) overlapping the day, typed and UTC."""

import datetime as dt

import dagster as dg
import pyarrow.compute as pc

from gpu_pipeline.defs.common import (
    DayOutcome,
    daily_table_asset,
    materialize_result,
    run_days,
    table_key,
    violations_check,
    window,
)
from gpu_pipeline.defs.raw.job_documents import KEY as RAW_KEY
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.job_source import clean_job_documents, own_documents_set_aside
from gpu_pipeline.lib.schemas import JOBS as SPEC
from gpu_pipeline.lib.schemas import QUARANTINE_JOBS, RAW_JOB_DOCUMENTS

KEY = table_key(SPEC)
UNIQUE = dg.AssetCheckSpec("unique_run_key", asset=KEY, description="(global_job_id, run_index, doc_kind, source) is unique.")
VALID_INTERVALS = dg.AssetCheckSpec(
    "run_intervals_ordered", asset=KEY, description="queued <= run start <= run end wherever they are known."
)
JOB_RECORDS = dg.AssetCheckSpec(
    "documents_give_job_runs", asset=KEY,
    description="A day whose documents were all set aside (accounting records, ads without GlobalJobId, not JSON) "
                "has no job run: a warning naming the reasons (the raw step's has_documents counts documents, "
                "whatever they hold).",
)


def interval_violations(table) -> int:
    q, s, e = table["queued_utc"], table["run_start_utc"], table["run_end_utc"]
    bad = pc.or_kleene(pc.fill_null(pc.greater(q, s), False), pc.fill_null(pc.greater(s, e), False))
    return int(pc.sum(bad).as_py() or 0)


def duplicate_keys(table) -> int:
    keys = table.select(["global_job_id", "run_index", "doc_kind", "source"])
    return keys.num_rows - keys.group_by(keys.column_names).aggregate([]).num_rows


@daily_table_asset(
    SPEC,
    deps=[RAW_KEY],
    kinds={"parquet"},
    check_specs=[UNIQUE, VALID_INTERVALS, JOB_RECORDS],
    description=SPEC.description + " A run crossing midnight appears in each day it overlaps.",
)
def jobs(context: dg.AssetExecutionContext, data_store: DataStoreResource) -> dg.MaterializeResult:
    store = data_store.store()
    dupes: dict[str, int] = {}
    bad_intervals: dict[str, int] = {}
    all_aside: dict[str, dict[str, int]] = {}

    def one_day(day: str) -> DayOutcome:
        start, end = window(day)
        raw = store.read_table(RAW_JOB_DOCUMENTS, day)
        cleaned = clean_job_documents(raw, start, end)
        store.write_partition(QUARANTINE_JOBS, day, cleaned.quarantine)
        result = store.write_partition(SPEC, day, cleaned.table)
        dupes[day] = duplicate_keys(cleaned.table)
        bad_intervals[day] = interval_violations(cleaned.table)
        # the day's own documents all set aside (a format change, an accounting export): the neighbours'
        # files, read for the look-around, neither hide it nor raise it with a broken line
        own, aside = own_documents_set_aside(raw, cleaned.quarantine, dt.date.fromisoformat(day))
        if own and aside >= own:
            all_aside[day] = cleaned.quarantined_by_reason
            context.log.warning(f"{day}: every one of the day's own {own:,} job document(s) was set aside: "
                                f"{cleaned.quarantined_by_reason}")
        return DayOutcome(
            day=day,
            result=result,
            metrics={
                "documents_in": cleaned.docs_in,
                "rows_quarantined": cleaned.quarantine.num_rows,
                "duplicate_documents_dropped": cleaned.duplicates,
                "runs_outside_day": cleaned.outside_window,
                "runs_closed_by_later_record": cleaned.runs_closed_by_later_record,
                "stale_open_runs_dropped": cleaned.stale_open_runs_dropped,
            },
            details={"quarantined_by_reason": cleaned.quarantined_by_reason},
        )

    outcomes = run_days(context, one_day)
    checks = [
        dg.AssetCheckResult(check_name=UNIQUE.name, passed=not any(dupes.values()),
                            metadata={"duplicates_by_day": dg.MetadataValue.json(dupes)}),
        dg.AssetCheckResult(check_name=VALID_INTERVALS.name, passed=not any(bad_intervals.values()),
                            metadata={"violations_by_day": dg.MetadataValue.json(bad_intervals)}),
        violations_check(JOB_RECORDS, KEY, all_aside, "days_all_set_aside", dg.AssetCheckSeverity.WARN),
    ]
    return materialize_result(SPEC, outcomes, check_results=checks)
