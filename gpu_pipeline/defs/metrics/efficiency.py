"""Metrics: PIF / RFU / efficiency class per GPU-hour and per job run, energy, held-but-idle (5.5)."""

import datetime as dt

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.defs.clean.gpu_samples import KEY as SAMPLES_KEY
from gpu_pipeline.defs.clean.jobs import KEY as JOBS_KEY
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
from gpu_pipeline.lib.efficiency import (
    EFFICIENCY_DAILY,
    GPU_HOURLY_EFFICIENCY,
    HELD_IDLE_INTERVALS,
    JOB_EFFICIENCY,
    compute_efficiency,
)
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_SAMPLES, GPU_STATES, JOBS
from gpu_pipeline.lib.store import connect

SPECS = (GPU_HOURLY_EFFICIENCY, JOB_EFFICIENCY, HELD_IDLE_INTERVALS, EFFICIENCY_DAILY)
KEYS = [table_key(s) for s in SPECS]
#: The samples the day's figures left out, and why; in the daily table's metadata.
SAMPLE_COUNTERS = ("samples_in_window", "samples_dropped_other_source", "duplicate_samples_dropped",
                   "repeated_readings_dropped", "zero_power_readings",
                   "mig_samples_on_boards", "mig_samples_skipped", "gaps_over_3x_cadence")
DEPS = [SAMPLES_KEY, STATES_KEY, JOBS_KEY]
SUBSET = dg.AssetCheckSpec(
    "gpus_subset_of_snapshots", asset=KEYS[0],
    description="Every GPU of a pool host with efficiency rows was seen in the day's slot snapshots.",
)


@daily_tables_asset("efficiency", [table_spec_asset(s, DEPS) for s in SPECS], [SUBSET])
def efficiency(context: dg.AssetExecutionContext, data_store: DataStoreResource):
    store = SelectedStore(data_store.store(), context)
    strays: dict[str, list[str]] = {}

    def one_day(day: str):
        start, end = window(day)
        # the hour before the day and the hour after it, where they exist: a segment or a held-idle run
        # crossing midnight is judged on its whole length (the neighbour sensor recomputes the day
        # once the next day is there). The job records of those days too: a run of the job that ends
        # before midnight or starts after it bounds that held-idle run in the look-around (each run
        # read once: the record the job table would choose, whichever day holds it)
        d = dt.date.fromisoformat(day)
        days = [(d - dt.timedelta(days=1)).isoformat(), day, (d + dt.timedelta(days=1)).isoformat()]
        con = connect()
        try:
            s_sql, s_params = store.relation_sql(GPU_SAMPLES, days)
            st_sql, st_params = store.relation_sql(GPU_STATES, days)
            j_sql, j_params = store.relation_sql(JOBS, days)
            res = compute_efficiency(con, s_sql, s_params, start, end, states_sql=st_sql, states_params=st_params,
                                     jobs_sql=j_sql, jobs_params=j_params)
            slots_sql, slots_params = store.relation_sql(CLEAN_SLOT_SNAPSHOTS, [day])
            # GPUs of pool hosts must be in the snapshots; hosts outside the HTCondor pool (e.g. a
            # Terapixel render farm) have telemetry only. A board measured from its MIG instances is
            # left out: HTCondor may list only the instances.
            hourly_ids = res.hourly.select(["gpu_id", "host"])
            if res.mig_boards:
                hourly_ids = hourly_ids.filter(pc.invert(pc.is_in(hourly_ids["gpu_id"], pa.array(res.mig_boards))))
            con.register("hourly_rows", hourly_ids)
            strays[day] = [r[0] for r in con.sql(
                f"""WITH slots AS (SELECT DISTINCT host, gpu_id FROM {slots_sql})
                    SELECT DISTINCT gpu_id FROM hourly_rows
                    WHERE host IN (SELECT host FROM slots) AND gpu_id NOT IN (SELECT gpu_id FROM slots)
                    ORDER BY 1 LIMIT 20""", params=slots_params or None).fetchall()]
        finally:
            con.close()
        daily_all = [r for r in res.daily.to_pylist() if r["device_name"] == "ALL"]
        # an unknown figure (no power read all day) is left out, not charted as 0
        kpis = {k: daily_all[0][k] for k in ("rfu_pct_fleet", "util_pct", "energy_kwh")
                if daily_all and daily_all[0][k] is not None}
        kpis.update({k: res.counters[k] for k in SAMPLE_COUNTERS})
        tables = (res.hourly, res.jobs, res.held_idle, res.daily)
        return {key: outcome(day, store.write_partition(spec, day, t), t, **(kpis if spec is EFFICIENCY_DAILY else {}))
                for key, spec, t in zip(KEYS, SPECS, tables, strict=True)}

    out = run_days_multi(context, KEYS, one_day)
    yield from tables_results(context, out, dict(zip(KEYS, SPECS, strict=True)),
                              [violations_check(SUBSET, KEYS[0], strays, "gpus_not_in_snapshots")])
