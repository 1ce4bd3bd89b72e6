"""Freshness checks: has yesterday's partition of every end product been written by a deadline?

A nightly run that failed, was never launched (the daemon down, the schedule stopped) or is still
queued leaves no trace on the assets themselves: their last partition is simply the day before. These
checks turn that into a failed check in the UI (and in the alerting that reads check results).

``GPU_PIPELINE_FRESHNESS_DEADLINE``: a cron string in the partitions' time zone (default ``0 8 * * *``,
08:00, after the nightly run at 02:15 and the late-records run at 05:45). Once a tick has passed, the
check of an asset fails until the partition that ended before that tick is materialized. ``off``
defines no checks and no sensor. The checks are Dagster's time-partition freshness checks on the
daily assets that no other asset reads (the plots and the metric tables that are not plotted): when
those are fresh, so is everything upstream of them in the same run. The sensor
``freshness_checks_sensor`` evaluates them (stopped by default, like the schedules).

The end products are found from the assets' own dependencies, so an asset added later is covered
without a list here. The jobs leave these checks out (``defs/jobs.py``): a run that evaluated them
at its end would judge a deadline hours away.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Iterable, Mapping

import dagster as dg

from gpu_pipeline.defs.partitions import daily_partitions

FRESHNESS_ENV = "GPU_PIPELINE_FRESHNESS_DEADLINE"
DEFAULT_DEADLINE = "0 8 * * *"
SENSOR_NAME = "freshness_checks_sensor"
LAYERS = ("raw", "clean", "metrics", "plots")
#: how often the sensor may evaluate; each evaluation that runs checks is one small run
SENSOR_INTERVAL_S = 15 * 60


def freshness_deadline(environ: Mapping[str, str] = os.environ) -> str | None:
    """The deadline cron from ``GPU_PIPELINE_FRESHNESS_DEADLINE`` (default when unset or blank;
    ``None`` for ``off``)."""
    text = " ".join((environ.get(FRESHNESS_ENV) or "").split()) or DEFAULT_DEADLINE
    return None if text.lower() in ("off", "none", "0") else text


def end_products(assets: Iterable[dg.AssetsDefinition]) -> list[dg.AssetKey]:
    """The keys of ``assets`` that none of them reads."""
    assets = list(assets)
    read = {key for a in assets for key in a.dependency_keys}
    return sorted({key for a in assets for key in a.keys} - read, key=lambda k: k.to_user_string())


def daily_assets() -> list[dg.AssetsDefinition]:
    """Every asset of the four layers, as their packages define them."""
    packages = [importlib.import_module(f"gpu_pipeline.defs.{layer}") for layer in LAYERS]
    return [a for p in packages for a in dg.load_assets_from_package_module(p)
            if isinstance(a, dg.AssetsDefinition)]


def build_freshness_checks(assets: Iterable[dg.AssetsDefinition], deadline: str | None, timezone: str
                           ) -> tuple[list[dg.AssetChecksDefinition], list[dg.SensorDefinition]]:
    """The freshness checks of the end products of ``assets`` and the sensor that evaluates them (none
    when ``deadline`` is None). A deadline that is no cron string raises ValueError naming the
    variable."""
    if deadline is None:
        return [], []
    with warnings.catch_warnings():
        # superseded by FreshnessPolicy, which judges an asset's last materialization, not its last
        # partition: a backfill of an old day would read as fresh
        warnings.simplefilter("ignore", category=dg.SupersessionWarning)
        try:
            checks = list(dg.build_time_partition_freshness_checks(
                assets=end_products(assets),
                deadline_cron=deadline,
                timezone=timezone,
                severity=dg.AssetCheckSeverity.ERROR,
            ))
        except Exception as exc:  # dagster's CheckError: "Invalid cron string."
            raise ValueError(f"{FRESHNESS_ENV}={deadline!r}: expected a cron string such as "
                             f"{DEFAULT_DEADLINE!r}, or off ({exc})") from None
        sensor = dg.build_sensor_for_freshness_checks(
            freshness_checks=checks,
            name=SENSOR_NAME,
            minimum_interval_seconds=SENSOR_INTERVAL_S,
            default_status=dg.DefaultSensorStatus.STOPPED,
        )
    return checks, [sensor]


FRESHNESS_CHECKS, FRESHNESS_SENSORS = build_freshness_checks(
    daily_assets(), freshness_deadline(), daily_partitions.timezone)
