"""The one daily partitions definition shared by every daily asset.

Start date and time zone are structural, so they are read when the definitions load:
``GPU_PIPELINE_START_DATE`` (default 2025-01-01) and ``GPU_PIPELINE_TIMEZONE`` (default UTC).
A partition key ``YYYY-MM-DD`` is that calendar day in that time zone.
"""

from __future__ import annotations

import datetime as dt
import os

import dagster as dg

from gpu_pipeline.lib.envutil import zone_env

DEFAULT_START_DATE = "2025-01-01"
DEFAULT_TIMEZONE = "UTC"

# a blank value (a ``.env`` line ``GPU_PIPELINE_TIMEZONE=``) is the default, as when unset
START_DATE = (os.environ.get("GPU_PIPELINE_START_DATE") or "").strip() or DEFAULT_START_DATE
TIMEZONE = zone_env("GPU_PIPELINE_TIMEZONE", DEFAULT_TIMEZONE)
try:  # exactly YYYY-MM-DD, as Dagster reads it (fromisoformat also takes 20250301 and 2025-W10-1)
    dt.datetime.strptime(START_DATE, "%Y-%m-%d")
    if len(START_DATE) != 10:
        raise ValueError
except ValueError:
    raise ValueError(f"GPU_PIPELINE_START_DATE={START_DATE!r}: expected a date YYYY-MM-DD") from None

daily_partitions = dg.DailyPartitionsDefinition(start_date=START_DATE, timezone=TIMEZONE)

# One policy for the whole daily chain: a UI backfill of N days becomes one run per asset chain,
# not N runs (the backfill daemon launches about one run per second).
daily_backfill_policy = dg.BackfillPolicy.single_run()
