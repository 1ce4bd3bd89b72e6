"""Raw layer: the HTCondor job documents (Elasticsearch or offline files) that overlap each day."""

import datetime as dt

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
from gpu_pipeline.defs.resources import DataStoreResource, JobRecordsResource
from gpu_pipeline.lib.job_source import (
    FileDocsCache,
    RawDocs,
    documents_of_the_day,
    raw_docs_from_es,
    raw_docs_from_files,
)
from gpu_pipeline.lib.schemas import RAW_JOB_DOCUMENTS as SPEC

KEY = table_key(SPEC)
HAS_DOCUMENTS = dg.AssetCheckSpec(
    "has_documents",
    asset=KEY,
    blocking=True,
    description="When a job-record source is configured, every day of the run has documents of its own (not only "
                "records of the days around it that the day reads for runs crossing it).",
)


@daily_table_asset(SPEC, kinds={"elasticsearch", "parquet"}, check_specs=[HAS_DOCUMENTS])
def job_documents(
    context: dg.AssetExecutionContext, data_store: DataStoreResource, job_records: JobRecordsResource
) -> dg.MaterializeResult:
    store = data_store.store()
    mode = job_records.mode
    if mode == "off":
        context.log.info("no job-record source configured (GPU_PIPELINE_ES_HOSTS / GPU_PIPELINE_JOBS_DIR): "
                         "writing empty partitions")

    files_cache = FileDocsCache()  # a range run reads each file once, though days' file sets overlap

    def one_day(day: str) -> DayOutcome:
        start, end = window(day)
        if mode == "elasticsearch":
            raw = raw_docs_from_es(job_records.es_config(), start, end)
        elif mode == "files":
            raw = raw_docs_from_files(job_records.files_dir, start, end, job_records.lookahead_days_value(),
                                      cache=files_cache)
        else:
            raw = RawDocs(table=SPEC.empty())
        # the day's own documents: the files of the days around it alone (the day's file expired,
        # the later ones not yet) are none
        of_day = documents_of_the_day(raw.table, dt.date.fromisoformat(day))
        result = write_unless_empty(context, store, SPEC, day, mode != "off" and not of_day,
                                    lambda: store.write_partition(SPEC, day, raw.table),
                                    "the job-record source gives no document for the day")
        metrics = {"documents": raw.table.num_rows, "documents_of_the_day": of_day}
        if raw.es_total is not None:
            metrics.update(es_hits_total=raw.es_total, es_pages=raw.es_pages or 0, es_retries=raw.es_retries or 0)
        return DayOutcome(day=day, result=result, metrics=metrics, details={"files": raw.files, "mode": mode})

    outcomes = run_days(context, one_day)
    empty = [o.day for o in outcomes if not o.metrics.get("documents_of_the_day")]
    check = gate_check(HAS_DOCUMENTS, outcomes, "days_without_documents", empty, applies=mode != "off", mode=mode,
                       days_kept_as_written_before=kept_days(outcomes))
    return materialize_result(SPEC, outcomes, check_results=[check])
