"""The daily job over every layer, its nightly schedule and the late-records schedule."""

from __future__ import annotations

import dagster as dg

from gpu_pipeline.defs.partitions import daily_partitions

daily_pipeline = dg.define_asset_job(
    name="daily_pipeline",
    selection=dg.AssetSelection.all(),
    partitions_def=daily_partitions,
    description="Every daily asset (raw -> clean -> metrics -> plots) for one day or a range of days.",
)

nightly_schedule = dg.build_schedule_from_partitioned_job(
    daily_pipeline,
    name="nightly_pipeline",
    description="Materializes yesterday's partition of every daily asset at 02:15 (partition time zone).",
    hour_of_day=2,
    minute_of_hour=15,
    default_status=dg.DefaultScheduleStatus.STOPPED,
)
