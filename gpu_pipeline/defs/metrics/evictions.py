"""Metrics: backfill evictions (job records and snapshots, merged) and eviction rates (5.4)."""

import datetime as dt

import dagster as dg
import pyarrow.compute as pc

from gpu_pipeline.defs.clean.jobs import KEY as JOBS_KEY
from gpu_pipeline.defs.clean.slot_snapshots import KEY as SLOTS_KEY
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
from gpu_pipeline.defs.metrics.gpu_states import KEY as STATES_KEY
from gpu_pipeline.defs.partitions import TIMEZONE
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.evictions import EVICTION_RATES, EVICTIONS, compute_eviction_rates, compute_evictions
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES, JOBS
from gpu_pipeline.lib.store import connect

EVICTIONS_KEY, RATES_KEY = table_key(EVICTIONS), table_key(EVICTION_RATES)
DEPS = [STATES_KEY, JOBS_KEY, SLOTS_KEY]
RATES_OK = dg.AssetCheckSpec("rates_valid", asset=RATES_KEY,
                             description="Eviction rates are finite and >= 0; lost GPU-hours >= 0.")


@daily_tables_asset(
    "evictions",
    [table_spec_asset(EVICTIONS, DEPS), table_spec_asset(EVICTION_RATES, DEPS)],
    [RATES_OK],
)
def evictions(context: dg.AssetExecutionContext, data_store: DataStoreResource):
    store = SelectedStore(data_store.store(), context)
    bad: dict[str, int] = {}

    def one_day(day: str):
        start, end = window(day)
        days = [(dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat(), day]
        con = connect()
        try:
            st_sql, st_params = store.relation_sql(GPU_STATES, days)
            j_sql, j_params = store.relation_sql(JOBS, days)
            sn_sql, sn_params = store.relation_sql(CLEAN_SLOT_SNAPSHOTS, days)
            ev = compute_evictions(con, start, end, states_from_sql=st_sql, states_params=st_params,
                                   jobs_from_sql=j_sql, jobs_params=j_params,
                                   snapshots_from_sql=sn_sql, snapshots_params=sn_params)
            con.register("day_evictions", ev)
            d_sql, d_params = store.relation_sql(GPU_STATES, [day])
            rates = compute_eviction_rates(con, "day_evictions", [], d_sql, d_params, start, end, tz=TIMEZONE,
                                           snapshots_from_sql=sn_sql, snapshots_params=sn_params)
        finally:
            con.close()
        r = rates["evictions_per_backfill_gpu_hour"]
        bad[day] = int(pc.sum(pc.or_(pc.invert(pc.is_finite(pc.fill_null(r, 0.0))), pc.less(pc.fill_null(r, 0.0), 0))).as_py() or 0) + int(
            pc.sum(pc.less(pc.fill_null(ev["lost_gpu_hours"], 0.0), 0)).as_py() or 0)
        both = sum(1 for x in ev["detected_by"].to_pylist() if x and "," in x)
        kpis = {"evictions": float(ev.num_rows), "seen_by_both_detectors": float(both),
                "lost_gpu_hours": float(pc.sum(ev["lost_gpu_hours"]).as_py() or 0.0)}
        overall = [x for x in rates.to_pylist() if x["device_name"] == "ALL" and x["tier"] == "ALL"
                   and x["hour_local"] is None]
        if overall and overall[0]["evictions_per_backfill_gpu_hour"] is not None:
            kpis["evictions_per_backfill_gpu_hour"] = overall[0]["evictions_per_backfill_gpu_hour"]
        return {
            EVICTIONS_KEY: outcome(day, store.write_partition(EVICTIONS, day, ev), ev, **kpis),
            RATES_KEY: outcome(day, store.write_partition(EVICTION_RATES, day, rates), rates),
        }

    out = run_days_multi(context, [EVICTIONS_KEY, RATES_KEY], one_day)
    yield from tables_results(context, out, {EVICTIONS_KEY: EVICTIONS, RATES_KEY: EVICTION_RATES},
                              [violations_check(RATES_OK, RATES_KEY, bad)])
