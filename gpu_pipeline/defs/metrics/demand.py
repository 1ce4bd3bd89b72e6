"""Metrics: demand vs capacity per hour and device class, and top contributors (DESIGN.md 5.6)."""

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.defs.clean.jobs import KEY as JOBS_KEY
from gpu_pipeline.defs.clean.kueue_demand import KEY as KUEUE_KEY
from gpu_pipeline.defs.common import (
    SelectedStore,
    daily_tables_asset,
    outcome,
    run_days_multi,
    table_key,
    table_spec_asset,
    tables_results,
    violations_check,
    window,
)
from gpu_pipeline.defs.metrics.efficiency import KEYS as EFFICIENCY_KEYS
from gpu_pipeline.defs.metrics.gpu_states import KEY as STATES_KEY
from gpu_pipeline.defs.resources import DataStoreResource, KueueResource
from gpu_pipeline.lib.demand import (
    ALL_DEVICES,
    DEMAND_CAPACITY,
    DEMAND_TOP_CONTRIBUTORS,
    SEVERITIES,
    demand_for_day,
    efficiency_by_class_sql,
)
from gpu_pipeline.lib.efficiency import GPU_HOURLY_EFFICIENCY
from gpu_pipeline.lib.kueue_source import QUARANTINE_KUEUE_DEMAND
from gpu_pipeline.lib.schemas import GPU_STATES

CAP_KEY, TOP_KEY = table_key(DEMAND_CAPACITY), table_key(DEMAND_TOP_CONTRIBUTORS)
DEPS = [JOBS_KEY, STATES_KEY, KUEUE_KEY, EFFICIENCY_KEYS[0]]
FINITE = dg.AssetCheckSpec("dcr_finite_and_shares_in_range", asset=CAP_KEY,
                           description="DCR is finite wherever it is known; contributor shares are within [0, 1].")


def severity_hours(capacity: pa.Table) -> dict[str, float]:
    """``hours_<severity>_<source>``: the hours of each severity, per source, counted on the source's
    ``ALL`` rows (the whole pool: one row per hour), as the demand plot counts them. The rows of the
    device models are not more hours; a source without an ``ALL`` row in the day has no key."""
    rows = zip(capacity["source"].to_pylist(), capacity["device_class"].to_pylist(),
               capacity["severity"].to_pylist(), strict=True)
    per_source: dict[str, list[str]] = {}
    for source, device_class, severity in rows:
        if device_class == ALL_DEVICES:
            per_source.setdefault(source, []).append(severity)
    return {f"hours_{sev.lower()}_{source}": float(sevs.count(sev))
            for source, sevs in sorted(per_source.items()) for sev in SEVERITIES}


@daily_tables_asset(
    "demand_capacity",
    [table_spec_asset(DEMAND_CAPACITY, DEPS), table_spec_asset(DEMAND_TOP_CONTRIBUTORS, DEPS)],
    [FINITE],
)
def demand_capacity(context: dg.AssetExecutionContext, data_store: DataStoreResource, kueue: KueueResource):
    store = SelectedStore(data_store.store(), context)
    gpus_per_workload = kueue.gpus_per_workload_value()
    gpu_resources = kueue.gpu_resources_value()
    bad: dict[str, int] = {}

    def one_day(day: str):
        start, end = window(day)
        eff_sql, eff_params = store.relation_sql(GPU_HOURLY_EFFICIENCY, [day])
        st_sql, st_params = store.relation_sql(GPU_STATES, [day])
        # the pool's GPUs only: telemetry-only hosts (a render farm outside HTCondor) have
        # efficiency rows but are not the capacity these rows compare demand with
        pool_eff = f"(SELECT * FROM {eff_sql} WHERE gpu_id IN (SELECT gpu_id FROM {st_sql}))"
        # a day of a Kueue source (configured, or with scrapes set aside that day) has its Kueue hours
        # even when no scrape of the day was readable (every curl failed): Unknown, coverage 0, as
        # metrics/coverage has its Kueue row at 0 %
        kueue_configured = kueue.enabled or store.row_count(QUARANTINE_KUEUE_DEMAND, day) > 0
        res = demand_for_day(store, day, start, end, efficiency_from_sql=efficiency_by_class_sql(pool_eff),
                             efficiency_params=[*eff_params, *st_params], kueue_gpus_per_workload=gpus_per_workload,
                             kueue_resources=gpu_resources, kueue_configured=kueue_configured)
        dcr, share = res.capacity["dcr"], res.top["share"]
        bad[day] = int(pc.sum(pc.invert(pc.is_finite(pc.fill_null(dcr, 0.0)))).as_py() or 0) + int(
            pc.sum(pc.or_(pc.less(share, -1e-9), pc.greater(share, 1 + 1e-9))).as_py() or 0)
        kpis = severity_hours(res.capacity)
        # jobs whose requirements the ClassAd parser could not read count as device class ANY
        kpis["unreadable_requirements"] = float(res.unreadable_requirements)
        if res.unreadable_requirements:
            context.log.warning(f"{day}: the requirements of {res.unreadable_requirements} job(s) of the day's "
                                "demand name a device but could not be read; they count as device class ANY")
        return {
            CAP_KEY: outcome(day, store.write_partition(DEMAND_CAPACITY, day, res.capacity), res.capacity, **kpis),
            TOP_KEY: outcome(day, store.write_partition(DEMAND_TOP_CONTRIBUTORS, day, res.top), res.top),
        }

    out = run_days_multi(context, [CAP_KEY, TOP_KEY], one_day)
    yield from tables_results(context, out, {CAP_KEY: DEMAND_CAPACITY, TOP_KEY: DEMAND_TOP_CONTRIBUTORS},
                              [violations_check(FINITE, CAP_KEY, bad)])
