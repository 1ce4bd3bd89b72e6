"""Plot assets of the metric tables: one PNG per plot per day, with a preview and the key numbers."""

import dagster as dg

from gpu_pipeline.defs.common import (
    OWNERS,
    DayOutcome,
    materialize_result,
    run_days_multi,
    selected_results,
    table_key,
)
from gpu_pipeline.defs.partitions import TIMEZONE, daily_backfill_policy, daily_partitions
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.plot_tasks import PLOTS, PlotRenderer
from gpu_pipeline.lib.plots import heap_frozen

KEYS = {name: dg.AssetKey(["plots", name]) for name in PLOTS}


#: The plots in steps of their own by the sources they draw on, so that a source's blocking check
#: stops only its own plots (one step for all: an empty Kueue day skipped the allocation,
#: availability and eviction plots too, as Dagster skips a step any of whose inputs is skipped).
GROUPS: dict[str, tuple[str, ...]] = {
    "metric_plots": ("allocation_over_day", "allocation_counts", "allocation_heatmap", "allocation_distribution",
                     "daily_dashboard", "availability_durations", "time_to_claim"),
    "eviction_plots": ("evictions_by_hour", "runtime_to_eviction"),
    "efficiency_plots": ("efficiency_scatter", "efficiency_classes", "rfu_over_day"),
    "demand_plots": ("demand_capacity_panels", "imbalance_heatmap", "top_contributors"),
}
assert sorted(n for names in GROUPS.values() for n in names) == sorted(PLOTS), "every plot in one group"


def _plots_asset(step: str, group: tuple[str, ...], helpers: int | None = None) -> dg.AssetsDefinition:
    """The multi-asset of the ``group`` plots, drawn here and in ``helpers`` helper processes
    (default: ``GPU_PIPELINE_HELPERS``)."""
    keys = [KEYS[name] for name in group]

    @dg.multi_asset(
        can_subset=True,
        specs=[
            dg.AssetSpec(
                key=KEYS[name],
                group_name="plots",
                description=f"{PLOTS[name].description} PNG under <data_root>/plots/{name}/date=YYYY-MM-DD/.",
                deps=sorted({table_key(s) for s in PLOTS[name].inputs}, key=lambda k: k.to_user_string()),
                partitions_def=daily_partitions,
                kinds={"matplotlib", "png"},
                owners=OWNERS,
            )
            for name in group
        ],
        partitions_def=daily_partitions,
        backfill_policy=daily_backfill_policy,
        name=step,
    )
    def plots(context: dg.AssetExecutionContext, data_store: DataStoreResource):
        store = data_store.store()
        selected = set(context.selected_asset_keys)
        names = [name for name in group if KEYS[name] in selected]  # only the plots the run selected

        def one_day(day: str):
            out = {}
            for name, rendered in renderer.day(day).items():
                result = store.write_plot(name, day, rendered.png)
                out[KEYS[name]] = DayOutcome(day=day, result=result, metrics=rendered.numbers, details={
                    "path": dg.MetadataValue.path(result.path),
                    "preview": dg.MetadataValue.md(rendered.preview_markdown(f"{name} {day}"))})
            return out

        # This process and the group's helper processes render the range's plots at once.
        with heap_frozen(), PlotRenderer(store, context.partition_keys, names, TIMEZONE, helpers) as renderer:
            outcomes = run_days_multi(context, keys, one_day)
        results = [materialize_result(None, outcomes[key], asset_key=key) for key in keys if outcomes[key]]
        yield from selected_results(context, results)

    return plots


# The small groups are drawn in the step's own process: a helper's start (a fresh interpreter)
# cost more than it saved there (a 1,000-GPU week: 1.8-3.3 s in process, 2.5-4.0 s with a helper;
# the seven plots of metric_plots 6.1 s in process, 4.1 s with one).
metric_plots = _plots_asset("metric_plots", GROUPS["metric_plots"])
eviction_plots = _plots_asset("eviction_plots", GROUPS["eviction_plots"], helpers=0)
efficiency_plots = _plots_asset("efficiency_plots", GROUPS["efficiency_plots"], helpers=0)
demand_plots = _plots_asset("demand_plots", GROUPS["demand_plots"], helpers=0)
