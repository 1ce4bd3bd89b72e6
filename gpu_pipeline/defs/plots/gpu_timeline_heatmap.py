"""Plot layer: the GPU timeline heatmap PNG per day."""

import datetime as dt

import dagster as dg

from gpu_pipeline.defs.common import OWNERS, DayOutcome, materialize_result, run_days
from gpu_pipeline.defs.metrics.gpu_states import KEY as STATES_KEY
from gpu_pipeline.defs.partitions import TIMEZONE, daily_backfill_policy, daily_partitions
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.plots import HEATMAP_COLUMNS as COLUMNS
from gpu_pipeline.lib.plots import gpu_timeline_heatmaps as render
from gpu_pipeline.lib.plots import heap_frozen
from gpu_pipeline.lib.schemas import GPU_STATES

NAME = "gpu_timeline_heatmap"
KEY = dg.AssetKey(["plots", NAME])


@dg.asset(
    key=KEY,
    group_name="plots",
    description=(
        "Heatmap of every GPU's state per 5-minute bucket for the day (rows = GPUs grouped by host, "
        "colors = the six states of DESIGN.md 5.1 plus idle_backfill). PNG under "
        "<data_root>/plots/gpu_timeline_heatmap/date=YYYY-MM-DD/, plus one image per device class "
        "(gpu_timeline_heatmap__<device>.png)."
    ),
    deps=[STATES_KEY],
    partitions_def=daily_partitions,
    backfill_policy=daily_backfill_policy,
    kinds={"matplotlib", "png"},
    owners=OWNERS,
)
def gpu_timeline_heatmap(context: dg.AssetExecutionContext, data_store: DataStoreResource) -> dg.MaterializeResult:
    store = data_store.store()

    def one_day(day: str) -> DayOutcome:
        states = store.read_table(GPU_STATES, day, columns=COLUMNS)
        # the fleet image and one per device class (same file name with __<device>), decoded once
        rendered, per_device = render(states, dt.date.fromisoformat(day), TIMEZONE)
        result = store.write_plot(NAME, day, rendered.png)
        for device, image in per_device.items():
            store.write_plot(NAME, day, image.png, variant=device)
        store.drop_other_plot_variants(NAME, day, per_device)  # a re-run replaces, never appends
        return DayOutcome(
            day=day,
            result=result,
            metrics=rendered.numbers,
            details={"path": dg.MetadataValue.path(result.path), "device_images": len(per_device),
                     "preview": dg.MetadataValue.md(rendered.preview_markdown(f"GPU timeline {day}"))},
        )

    with heap_frozen():
        outcomes = run_days(context, one_day)
    return materialize_result(None, outcomes)
