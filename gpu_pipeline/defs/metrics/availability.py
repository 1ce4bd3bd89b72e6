"""Metrics: backfill availability periods per GPU, and their summary by device and tier (5.3)."""

import datetime as dt

import dagster as dg
import pyarrow as pa
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
from gpu_pipeline.defs.metrics.gpu_states import KEY as STATES_KEY
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.availability import (
    AVAILABILITY_PERIODS,
    AVAILABILITY_SUMMARY,
    WHOLE_PERIOD_LOOKBACK_DAYS,
    compute_availability_periods,
    compute_availability_summary,
)
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_STATES
from gpu_pipeline.lib.store import connect

PERIODS_KEY, SUMMARY_KEY = table_key(AVAILABILITY_PERIODS), table_key(AVAILABILITY_SUMMARY)
LOOKBACK_DAYS = WHOLE_PERIOD_LOOKBACK_DAYS  # whole periods are summarized on the day they end, with up to a week of history
VALID = dg.AssetCheckSpec("periods_valid", asset=PERIODS_KEY,
                          description="Every period has end > start (end = start only for the closing piece "
                                      "of a period that ended at the day's start) and lies inside its day.")


def _days_back(day: str, n: int) -> list[str]:
    d = dt.date.fromisoformat(day)
    return [(d - dt.timedelta(days=i)).isoformat() for i in range(n, -1, -1)]


@daily_tables_asset(
    "availability",
    [table_spec_asset(AVAILABILITY_PERIODS, [STATES_KEY, SLOTS_KEY]),
     table_spec_asset(AVAILABILITY_SUMMARY, [STATES_KEY])], [VALID],
)
def availability(context: dg.AssetExecutionContext, data_store: DataStoreResource):
    store = SelectedStore(data_store.store(), context)
    bad: dict[str, int] = {}
    # this run's periods by day: the summary reads them from here, not from the store, where a run
    # of the summary alone does not write them (its earlier days would be missing or stale)
    computed: dict[str, pa.Table] = {}

    def one_day(day: str):
        start, end = window(day)
        con = connect()
        try:
            st_sql, st_params = store.relation_sql(GPU_STATES, _days_back(day, 1))
            sn_sql, sn_params = store.relation_sql(CLEAN_SLOT_SNAPSHOTS, [day])
            periods = compute_availability_periods(con, st_sql, st_params, start, end, sn_sql, sn_params)
            # written only when selected: a run of the summary alone leaves the periods' file as
            # Dagster recorded it (writing it there replaced it with no materialization)
            result = store.write_partition(AVAILABILITY_PERIODS, day, periods)
            # the summary: the look-back days' pieces computed in this run from memory, the others
            # from the store
            back = _days_back(day, LOOKBACK_DAYS)
            computed[day] = periods
            for old_day in [d for d in computed if d not in back]:
                del computed[old_day]
            prev_sql, p_params = store.relation_sql(AVAILABILITY_PERIODS, [d for d in back if d not in computed])
            con.register("periods_of_the_run", pa.concat_tables([computed[d] for d in back if d in computed]))
            summary = compute_availability_summary(
                con, f"(SELECT * FROM {prev_sql} UNION ALL BY NAME SELECT * FROM periods_of_the_run)", p_params,
                start, end)
        finally:
            con.close()
        s, e = periods["start_utc"], periods["end_utc"]
        closing = pc.and_(pc.fill_null(periods["starts_before_day"], False),
                          pc.not_equal(periods["end_reason"], "open"))
        empty = pc.and_(pc.equal(e, s), pc.invert(closing))
        bad[day] = int(pc.sum(pc.or_(pc.or_(pc.less(e, s), empty), pc.or_(
            pc.less(s, pa.scalar(start, s.type)), pc.greater(e, pa.scalar(end, e.type))))).as_py() or 0)
        all_row = [r for r in summary.to_pylist() if r["device_name"] == "ALL" and r["tier"] == "ALL"]
        # the summary's own count (whole periods that ended in the day); the day's rows are pieces:
        # those open at its end and those carried from the day before are no ended period of it
        kpis = {"periods": 0.0, "period_pieces": float(periods.num_rows)}
        if all_row:
            kpis.update(periods=float(all_row[0]["periods"] or 0),
                        median_period_s=all_row[0]["duration_median_s"] or 0.0,
                        median_time_to_claim_s=all_row[0]["time_to_claim_median_s"] or 0.0,
                        available_gpu_hours=all_row[0]["available_gpu_hours"] or 0.0)
        return {
            PERIODS_KEY: outcome(day, result, periods),
            SUMMARY_KEY: outcome(day, store.write_partition(AVAILABILITY_SUMMARY, day, summary), summary, **kpis),
        }

    out = run_days_multi(context, [PERIODS_KEY, SUMMARY_KEY], one_day)
    yield from tables_results(context, out, {PERIODS_KEY: AVAILABILITY_PERIODS, SUMMARY_KEY: AVAILABILITY_SUMMARY},
                              [violations_check(VALID, PERIODS_KEY, bad)])
