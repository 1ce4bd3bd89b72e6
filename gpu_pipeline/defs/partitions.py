"""The one daily partitions definition shared by every daily asset.

Start date and time zone are structural, so they are read when the definitions load:
``GPU_PIPELINE_START_DATE`` (default 2025-01-01) and ``GPU_PIPELINE_TIMEZONE`` (default UTC).
A partition key ``YYYY-MM-DD`` is that calendar day in that time zone.
"""

from __future__ import annotations

import os

import dagster as dg

DEFAULT_START_DATE = "2025-01-01"
DEFAULT_TIMEZONE = "UTC"

START_DATE = os.environ.get("GPU_PIPELINE_START_DATE", DEFAULT_START_DATE)
TIMEZONE = os.environ.get("GPU_PIPELINE_TIMEZONE", DEFAULT_TIMEZONE)

daily_partitions = dg.DailyPartitionsDefinition(start_date=START_DATE, timezone=TIMEZONE)

# One policy for the whole daily chain: a UI backfill of N days becomes one run per asset chain,
# not N runs (the backfill daemon launches about one run per second).
daily_backfill_policy = dg.BackfillPolicy.single_run()
