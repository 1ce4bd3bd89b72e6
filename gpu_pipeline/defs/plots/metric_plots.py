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


@dg.multi_asset(
    can_subset=True,
    specs=[
        dg.AssetSpec(
            key=KEYS[name],
            group_name="plots",
            description=f"{plot.description} PNG under <data_root>/plots/{name}/date=YYYY-MM-DD/.",
            deps=sorted({table_key(s) for s in plot.inputs}, key=lambda k: k.to_user_string()),
            partitions_def=daily_partitions,
            kinds={"matplotlib", "png"},
            owners=OWNERS,
        )
        for name, plot in PLOTS.items()
    ],
    partitions_def=daily_partitions,
    backfill_policy=daily_backfill_policy,
    name="metric_plots",
)
def metric_plots(context: dg.AssetExecutionContext, data_store: DataStoreResource):
    store = data_store.store()
    selected = set(context.selected_asset_keys)
    names = [name for name in PLOTS if KEYS[name] in selected]  # only the plots the run selected

    def one_day(day: str):
        out = {}
        for name, rendered in renderer.day(day).items():
            result = store.write_plot(name, day, rendered.png)
            out[KEYS[name]] = DayOutcome(day=day, result=result, metrics=rendered.numbers, details={
                "path": dg.MetadataValue.path(result.path),
                "preview": dg.MetadataValue.md(rendered.preview_markdown(f"{name} {day}"))})
        return out

    # This process and a helper process render the range's plots at once (GPU_PIPELINE_HELPERS).
    with heap_frozen(), PlotRenderer(store, context.partition_keys, names, TIMEZONE) as renderer:
        outcomes = run_days_multi(context, list(KEYS.values()), one_day)
    results = [materialize_result(None, outcomes[key], asset_key=key) for key in KEYS.values() if outcomes[key]]
    yield from selected_results(context, results)
