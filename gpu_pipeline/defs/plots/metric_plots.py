"""Plot assets of the metric tables: one PNG per plot per day, with a preview and the key numbers."""

import datetime as dt

import dagster as dg

from gpu_pipeline.defs.common import (
    DayOutcome,
    SelectedStore,
    materialize_result,
    run_days_multi,
    selected_results,
    table_key,
)
from gpu_pipeline.defs.partitions import TIMEZONE, daily_backfill_policy, daily_partitions
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib import metric_plots as P
from gpu_pipeline.lib.allocation import ALLOCATION_BUCKETS, ALLOCATION_DAILY
from gpu_pipeline.lib.availability import AVAILABILITY_PERIODS
from gpu_pipeline.lib.demand import DEMAND_CAPACITY, DEMAND_TOP_CONTRIBUTORS
from gpu_pipeline.lib.efficiency import GPU_HOURLY_EFFICIENCY
from gpu_pipeline.lib.evictions import EVICTION_RATES, EVICTIONS
from gpu_pipeline.lib.plots import heap_frozen
from gpu_pipeline.lib.schemas import GPU_STATES

# plot name -> (function, input tables in argument order, description)
PLOT_INPUTS = {
    "allocation_over_day": (P.allocation_over_day, [ALLOCATION_BUCKETS], "Allocation % per tier over the day."),
    "allocation_counts": (P.allocation_counts, [ALLOCATION_BUCKETS], "GPUs claimed vs available per tier."),
    "allocation_heatmap": (P.allocation_heatmap, [ALLOCATION_DAILY], "Device x tier allocation % with values."),
    "allocation_distribution": (P.allocation_distribution, [ALLOCATION_BUCKETS],
                                "Distribution of per-bucket allocation % per tier."),
    "daily_dashboard": (P.daily_dashboard, [ALLOCATION_BUCKETS, ALLOCATION_DAILY, GPU_STATES],
                        "One-page daily report: allocation lines, counts, heatmap, distribution, state shares."),
    "availability_durations": (P.availability_durations, [AVAILABILITY_PERIODS],
                               "Backfill availability period durations: histogram + ECDF by device class."),
    "time_to_claim": (P.time_to_claim, [AVAILABILITY_PERIODS], "Time until a backfill job claims an idle GPU."),
    "evictions_by_hour": (P.evictions_by_hour, [EVICTIONS, EVICTION_RATES],
                          "Evictions and lost GPU-hours by local hour of day and device class."),
    "runtime_to_eviction": (P.runtime_to_eviction, [EVICTIONS], "ECDF of runtime before eviction by device."),
    "efficiency_scatter": (P.efficiency_scatter, [GPU_HOURLY_EFFICIENCY],
                           "Utilization vs power intensity (PIF) per GPU-hour with the class thresholds."),
    "efficiency_classes": (P.efficiency_classes, [GPU_HOURLY_EFFICIENCY], "GPU-hours per efficiency class."),
    "rfu_over_day": (P.rfu_over_day, [GPU_HOURLY_EFFICIENCY], "Fleet utilization vs capability-weighted RFU."),
    "demand_capacity_panels": (P.demand_capacity_panels, [DEMAND_CAPACITY],
                               "Demand vs idle capacity, allocation vs efficiency gap, CIS with thresholds."),
    "imbalance_heatmap": (P.imbalance_heatmap, [DEMAND_CAPACITY], "Hour x device-class demand/capacity ratio."),
    "top_contributors": (P.top_contributors, [DEMAND_TOP_CONTRIBUTORS], "Top contributors to idle demand."),
}
KEYS = {name: dg.AssetKey(["plots", name]) for name in PLOT_INPUTS}


@dg.multi_asset(
    can_subset=True,
    specs=[
        dg.AssetSpec(
            key=KEYS[name],
            group_name="plots",
            description=f"{desc} PNG under <data_root>/plots/{name}/date=YYYY-MM-DD/.",
            deps=sorted({table_key(s) for s in inputs}, key=lambda k: k.to_user_string()),
            partitions_def=daily_partitions,
            kinds={"matplotlib", "png"},
            owners=["team:gpu-ops"],
        )
        for name, (_, inputs, desc) in PLOT_INPUTS.items()
    ],
    partitions_def=daily_partitions,
    backfill_policy=daily_backfill_policy,
    name="metric_plots",
)
def metric_plots(context: dg.AssetExecutionContext, data_store: DataStoreResource):
    store = SelectedStore(data_store.store(), context)
    selected = set(context.selected_asset_keys)
    previews: dict[str, str] = {}

    def read(spec, day):
        return store.read_table(spec, day) if store.has_partition(spec, day) else spec.empty()

    def one_day(day: str):
        date = dt.date.fromisoformat(day)
        out = {}
        cache: dict[str, object] = {}  # each input table read once a day
        for name, (fn, inputs, _) in PLOT_INPUTS.items():
            if KEYS[name] not in selected:  # not rendered when the run did not select it
                continue
            tables = []
            for spec in inputs:
                if spec.path not in cache:
                    cache[spec.path] = read(spec, day)
                tables.append(cache[spec.path])
            rendered = fn(*tables, date, TIMEZONE)
            result = store.write_plot(name, day, rendered.png)
            if result is None:  # not selected in this run
                continue
            previews[f"{name}/{day}"] = rendered.preview_markdown(f"{name} {day}")
            out[KEYS[name]] = DayOutcome(day=day, result=result, metrics=rendered.numbers,
                                         details={"path": result.path})
        return out

    with heap_frozen():
        outcomes = run_days_multi(context, list(KEYS.values()), one_day)
    results: list = []
    for name, key in KEYS.items():
        if not outcomes[key]:
            continue
        last = outcomes[key][-1]
        results.append(materialize_result(None, outcomes[key], asset_key=key, extra={
            "path": dg.MetadataValue.path(last.result.path),
            "preview": dg.MetadataValue.md(previews[f"{name}/{last.day}"]),
        }))
    yield from selected_results(context, results)
