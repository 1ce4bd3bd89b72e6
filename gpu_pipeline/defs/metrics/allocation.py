"""Metrics: allocation by tier and device per 5-minute bucket, and the daily report (DESIGN.md 5.2)."""

import dagster as dg
import pyarrow.compute as pc

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
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.allocation import ALLOCATION_BUCKETS, ALLOCATION_DAILY, allocation_for_day

BUCKETS_KEY, DAILY_KEY = table_key(ALLOCATION_BUCKETS), table_key(ALLOCATION_DAILY)
PCT_RANGE = dg.AssetCheckSpec("allocation_pct_in_range", asset=DAILY_KEY,
                              description="Every allocation_pct is within [0, 100] and claimed <= total.")


@daily_tables_asset(
    "allocation",
    [table_spec_asset(ALLOCATION_BUCKETS, [SLOTS_KEY]), table_spec_asset(ALLOCATION_DAILY, [SLOTS_KEY])],
    [PCT_RANGE],
)
def allocation(context: dg.AssetExecutionContext, data_store: DataStoreResource):
    store = SelectedStore(data_store.store(), context)
    bad: dict[str, int] = {}

    def one_day(day: str):
        start, end = window(day)
        buckets, daily = allocation_for_day(store, day, start, end)
        pct = daily["allocation_pct"]
        bad[day] = int(pc.sum(pc.or_(pc.less(pct, 0), pc.greater(pct, 100))).as_py() or 0) + int(
            pc.sum(pc.greater(buckets["claimed_gpus"], buckets["total_gpus"])).as_py() or 0)
        total = daily.filter(pc.and_(pc.equal(daily["tier"], "TOTAL"), pc.equal(daily["device_name"], "ALL")))
        # a tier without capacity all day (every priority host drained) has no allocation: no KPI, not 0 %
        kpis = {f"{r['tier'].lower()}_allocation_pct": r["allocation_pct"]
                for r in daily.filter(pc.equal(daily["device_name"], "ALL")).to_pylist()
                if r["allocation_pct"] is not None}
        kpis["avg_claimed_gpus"] = total["avg_claimed_gpus"][0].as_py() if total.num_rows else 0.0
        return {
            BUCKETS_KEY: outcome(day, store.write_partition(ALLOCATION_BUCKETS, day, buckets), buckets),
            DAILY_KEY: outcome(day, store.write_partition(ALLOCATION_DAILY, day, daily), daily, **kpis),
        }

    out = run_days_multi(context, [BUCKETS_KEY, DAILY_KEY], one_day)
    yield from tables_results(context, out, {BUCKETS_KEY: ALLOCATION_BUCKETS, DAILY_KEY: ALLOCATION_DAILY},
                              [violations_check(PCT_RANGE, DAILY_KEY, bad)])
