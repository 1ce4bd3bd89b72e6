"""Freshness checks: has yesterday's partition of every end product been written by a deadline?

A nightly run that failed, was never launched (the schedule stopped) or is still queued leaves no
trace on the assets themselves: their last partition is simply the day before. These checks turn that
into a failed check in the UI (and in the alerting that reads check results). The sensor runs in the
daemon: a daemon that is down evaluates nothing, so watch it too (``dagster-daemon liveness-check``).

``GPU_PIPELINE_FRESHNESS_DEADLINE``: a cron string in the partitions' time zone (default ``0 8 * * *``,
08:00, after the nightly run at 02:15 and the late-records run at 05:45). Once a tick has passed, the
check of an asset fails until the partition that ended before that tick is materialized. ``off``
defines no checks and no sensor. The checks are Dagster's time-partition freshness checks on the
daily assets that no other asset reads (the plots and the metric tables that are not plotted): a
nightly run writes them last, so they stand for the run (not every one for everything upstream of
it: the late-records run re-writes the job records' chain alone, and ``metrics/coverage`` with it). The
sensor ``freshness_checks_sensor`` evaluates them (stopped by default, like the schedules): Dagster's
freshness sensor, once a day is due (its check fails its whole run while none is), and again for
checks whose run ended without evaluating them (Dagster's waits on those for ever).

The end products are found from the assets' own dependencies, so an asset added later is covered
without a list here. The jobs leave these checks out (``defs/jobs.py``, and the neighbour sensor's
re-runs): a run of the day's assets evaluating them at its end would only say whether the day due at
the last deadline was in before it.
"""

from __future__ import annotations

import datetime as dt
import importlib
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence

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


def build_freshness_checks(assets: Iterable[dg.AssetsDefinition], deadline: str | None, timezone: str,
                           partitions_def: dg.TimeWindowPartitionsDefinition = daily_partitions,
                           ) -> tuple[list[dg.AssetChecksDefinition], list[dg.SensorDefinition]]:
    """The freshness checks of the end products of ``assets`` and the sensor that evaluates them (none
    when ``deadline`` is None; ``partitions_def``: the assets', which says when a day is due). A
    deadline that is no cron string raises ValueError naming the variable."""
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
        inner = dg.build_sensor_for_freshness_checks(freshness_checks=checks, name=SENSOR_NAME)
    keys = [key for c in checks for key in c.check_keys]

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=SENSOR_INTERVAL_S,
        asset_selection=dg.AssetSelection.checks(*checks),
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(f"Evaluates the end products' freshness checks (deadline {deadline}, {timezone}): Dagster's "
                     "freshness sensor, once a day is due, and again for checks whose run ended without them."),
    )
    def freshness_checks_sensor(context: dg.SensorEvaluationContext):
        now = dt.datetime.now(dt.UTC)
        if due_day(partitions_def, deadline, timezone, now) is None:
            # (Dagster's check fails its whole run when no day is due: a fresh install's first hours)
            return dg.SkipReason(f"no day is due yet: the first is due at the first {deadline} ({timezone}) "
                                 "after it ends")
        stuck = stuck_checks(context.instance, keys)
        if stuck:
            return dg.RunRequest(asset_check_keys=stuck)
        return inner(context)

    return checks, [freshness_checks_sensor]


def due_day(partitions_def: dg.TimeWindowPartitionsDefinition, deadline: str, timezone: str,
            now: dt.datetime) -> str | None:
    """The day whose partition the freshness checks want at ``now``: the last that ended before the
    last ``deadline`` tick (as Dagster's check reads it), or None when no day is due yet."""
    from dagster._utils.schedules import get_latest_completed_cron_tick  # (what the check itself uses)

    tick = get_latest_completed_cron_tick(deadline, now, timezone)
    keys = partitions_def.get_partition_keys(current_time=tick) if tick is not None else []
    return keys[-1] if keys else None


def stuck_checks(instance: dg.DagsterInstance, keys: Sequence[dg.AssetCheckKey]) -> list[dg.AssetCheckKey]:
    """The checks whose last evaluation was planned in a run that ended without it (the run failed,
    was terminated or never started): Dagster's sensor waits on such a check for ever."""
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    summaries = instance.event_log_storage.get_asset_check_summary_records(list(keys))
    stuck = []
    for key in keys:
        last = summaries[key].last_check_execution_record
        if last is None or last.status != AssetCheckExecutionRecordStatus.PLANNED:
            continue
        run = instance.get_run_by_id(last.run_id)
        if run is None or run.is_finished:
            stuck.append(key)
    return stuck


FRESHNESS_CHECKS, FRESHNESS_SENSORS = build_freshness_checks(
    daily_assets(), freshness_deadline(), daily_partitions.timezone)
