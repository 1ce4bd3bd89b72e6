"""The daily job over every layer, its nightly schedule and the late-records schedule."""

from __future__ import annotations

import os
from collections.abc import Mapping

import dagster as dg

from gpu_pipeline.defs.freshness import FRESHNESS_CHECKS
from gpu_pipeline.defs.partitions import daily_partitions
from gpu_pipeline.defs.raw.job_documents import KEY as JOB_DOCUMENTS_KEY
from gpu_pipeline.defs.resources import DEFAULT_LOOKAHEAD_DAYS, LOOKAHEAD_ENV
from gpu_pipeline.lib.envutil import whole_number_env

#: The freshness checks, which the jobs leave to their sensor: a run of the day's assets evaluating them
#: at its end would only say whether the day due at the last deadline was in before it.
FRESHNESS_SELECTION = dg.AssetSelection.checks(*FRESHNESS_CHECKS)

daily_pipeline = dg.define_asset_job(
    name="daily_pipeline",
    selection=dg.AssetSelection.all() - FRESHNESS_SELECTION,
    partitions_def=daily_partitions,
    description="Every daily asset (raw -> clean -> metrics -> plots) for one day or a range of days.",
)

ENV_MAX_RUNTIME = "GPU_PIPELINE_RUN_MAX_RUNTIME_S"
DEFAULT_MAX_RUNTIME_S = 4 * 3600


def max_runtime_tags(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The ``dagster/max_runtime`` tag of the runs that the schedules and the sensor launch: with
    run monitoring on (the ``dagster.yaml`` template), the daemon stops such a run after this many
    seconds and marks it failed, so a hung run does not hold its day's place in the run queue (one
    run per partition) or the sensor's cursor for ever. ``GPU_PIPELINE_RUN_MAX_RUNTIME_S``, default
    4 hours (a 10,000-GPU day takes minutes); ``0`` = no limit. Runs launched by hand (a backfill
    from the UI, ``gpu-pipeline materialize``) get no limit: a long backfill is not cut short."""
    seconds = whole_number_env(ENV_MAX_RUNTIME, DEFAULT_MAX_RUNTIME_S, "seconds", "no limit", environ)
    return {"dagster/max_runtime": str(seconds)} if seconds else {}


nightly_schedule = dg.build_schedule_from_partitioned_job(
    daily_pipeline,
    name="nightly_pipeline",
    description="Materializes yesterday's partition of every daily asset at 02:15 (partition time zone).",
    hour_of_day=2,
    minute_of_hour=15,
    tags=max_runtime_tags(),
    default_status=dg.DefaultScheduleStatus.STOPPED,
)


def late_records_days(environ: Mapping[str, str] = os.environ) -> int:
    """How many complete days ``late_records_rerun`` re-runs: the job records' look-ahead
    (``GPU_PIPELINE_JOBS_LOOKAHEAD_DAYS``, default 7; at least 1). A job is recorded when it leaves the
    queue, so a day's records keep arriving for as long as its jobs run; a nightly run reads the files up
    to that many days after its day, and so does this re-run for every day it covers."""
    return max(1, whole_number_env(LOOKAHEAD_ENV, DEFAULT_LOOKAHEAD_DAYS, "days", "the day's own files only",
                                   environ))


#: What a late job record changes: the job records and everything that reads them (evictions, job
#: efficiency, demand, coverage, their plots). The slot snapshots, the telemetry and the states they do
#: not touch are not read again.
late_records_pipeline = dg.define_asset_job(
    name="late_records_pipeline",
    selection=dg.AssetSelection.assets(JOB_DOCUMENTS_KEY).downstream() - FRESHNESS_SELECTION,
    partitions_def=daily_partitions,
    description="The job records and every asset downstream of them, for a day or a range of days.",
)


@dg.schedule(
    cron_schedule="45 5 * * *",
    job=late_records_pipeline,
    name="late_records_rerun",
    description=(
        "Re-materializes the job records and everything downstream of them for the last "
        f"{LOOKAHEAD_ENV} (default {DEFAULT_LOOKAHEAD_DAYS}) complete days at 05:45 (partition time zone) as ONE "
        "range run, so job records that arrive late (a job is recorded when it leaves the queue) are picked "
        "up. Re-runs replace partitions; they never append."
    ),
    execution_timezone=daily_partitions.timezone,
    default_status=dg.DefaultScheduleStatus.STOPPED,
)
def late_records_rerun(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
    keys = daily_partitions.get_partition_keys(current_time=context.scheduled_execution_time)
    last = keys[-late_records_days():]
    if not last:  # the partitions' first day is not complete yet
        return dg.SkipReason("no complete day yet: the partitions start today")
    return dg.RunRequest(
        run_key=f"late-{last[0]}-{last[-1]}",
        tags={
            **max_runtime_tags(),
            "dagster/asset_partition_range_start": last[0],
            "dagster/asset_partition_range_end": last[-1],
        },
    )
