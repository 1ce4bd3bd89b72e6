"""The metric plots as (day, plot) tasks, rendered by this process and a helper process at once.

Matplotlib holds the GIL while it draws, so a second core only helps from another process
(:mod:`gpu_pipeline.lib.helper_pool`). Each process reads a day's input tables from the store
itself, once, so only the finished PNG bytes travel back. Every task of the range is queued for the
helper up front, in day order; when this process takes a day, it renders from the end of that day's
list what the helper has not started, then takes the helper's share.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.lib import metric_plots as P
from gpu_pipeline.lib.allocation import ALLOCATION_BUCKETS, ALLOCATION_DAILY
from gpu_pipeline.lib.availability import (
    AVAILABILITY_PERIODS,
    WHOLE_PERIOD_LOOKBACK_DAYS,
    whole_periods_ending,
)
from gpu_pipeline.lib.demand import DEMAND_CAPACITY, DEMAND_TOP_CONTRIBUTORS
from gpu_pipeline.lib.efficiency import GPU_HOURLY_EFFICIENCY
from gpu_pipeline.lib.evictions import EVICTION_RATES, EVICTIONS
from gpu_pipeline.lib.helper_pool import HelperPool, Task, default_helpers
from gpu_pipeline.lib.plot_style import Rendered
from gpu_pipeline.lib.schemas import GPU_STATES, TableSpec
from gpu_pipeline.lib.store import Store, connect
from gpu_pipeline.lib.timeutil import day_window


@dataclass(frozen=True)
class PlotDef:
    render: Callable[..., Rendered]
    inputs: tuple[TableSpec, ...]  # the partition tables, in the function's argument order
    description: str
    columns: dict[str, tuple[str, ...]] | None = None  # input path -> the only columns the plot reads
    day_devices: bool = False  # colored by device class: gets the day's classes (one color per class)
    whole_periods: bool = False  # availability periods as the whole periods that end in the day


PLOTS: dict[str, PlotDef] = {
    "allocation_over_day": PlotDef(P.allocation_over_day, (ALLOCATION_BUCKETS,), "Allocation % per tier over the day."),
    "allocation_counts": PlotDef(P.allocation_counts, (ALLOCATION_BUCKETS,), "GPUs claimed vs available per tier."),
    "allocation_heatmap": PlotDef(P.allocation_heatmap, (ALLOCATION_DAILY,), "Device x tier allocation % with values."),
    "allocation_distribution": PlotDef(P.allocation_distribution, (ALLOCATION_BUCKETS,),
                                       "Distribution of per-bucket allocation % per tier."),
    "daily_dashboard": PlotDef(P.daily_dashboard, (ALLOCATION_BUCKETS, ALLOCATION_DAILY, GPU_STATES),
                               "One-page daily report: allocation lines, counts, heatmap, distribution, state shares.",
                               columns={GPU_STATES.path: ("state",)}),
    "availability_durations": PlotDef(P.availability_durations, (AVAILABILITY_PERIODS,),
                                      "Backfill availability period durations (whole periods that ended in the day): "
                                      "histogram + ECDF by device class.", day_devices=True, whole_periods=True),
    "time_to_claim": PlotDef(P.time_to_claim, (AVAILABILITY_PERIODS,), "Time until a backfill job claims an idle GPU.",
                             day_devices=True, whole_periods=True),
    "evictions_by_hour": PlotDef(P.evictions_by_hour, (EVICTIONS, EVICTION_RATES),
                                 "Evictions and lost GPU-hours by local hour of day and device class.", day_devices=True),
    "runtime_to_eviction": PlotDef(P.runtime_to_eviction, (EVICTIONS,), "ECDF of runtime before eviction by device.", day_devices=True),
    "efficiency_scatter": PlotDef(P.efficiency_scatter, (GPU_HOURLY_EFFICIENCY,),
                                  "Utilization vs power intensity (PIF) per GPU-hour with the class thresholds."),
    "efficiency_classes": PlotDef(P.efficiency_classes, (GPU_HOURLY_EFFICIENCY,), "GPU-hours per efficiency class."),
    "rfu_over_day": PlotDef(P.rfu_over_day, (GPU_HOURLY_EFFICIENCY,), "Fleet utilization vs capability-weighted RFU."),
    "demand_capacity_panels": PlotDef(P.demand_capacity_panels, (DEMAND_CAPACITY,),
                                      "Demand vs idle capacity, allocation vs efficiency gap, CIS with thresholds."),
    "imbalance_heatmap": PlotDef(P.imbalance_heatmap, (DEMAND_CAPACITY,), "Hour x device-class demand/capacity ratio."),
    "top_contributors": PlotDef(P.top_contributors, (DEMAND_TOP_CONTRIBUTORS,), "Top contributors to idle demand.", day_devices=True),
}


class _DayTables:
    """A day's input tables, each read once (missing partitions read as empty tables)."""

    def __init__(self, store: Store):
        self.store = store
        self.day: str | None = None
        self.tables: dict[tuple[str, tuple[str, ...] | None], pa.Table] = {}
        self.devices: list[str] | None = None

    def _day(self, day: str) -> None:
        if day != self.day:
            self.day, self.tables, self.devices = day, {}, None

    def day_devices(self, day: str) -> list[str]:
        """The day's device classes: every ``device_name`` of its GPU states."""
        self._day(day)
        if self.devices is None:
            names = (self.store.read_table(GPU_STATES, day, ["device_name"], dictionary=["device_name"])["device_name"]
                     if self.store.has_partition(GPU_STATES, day) else pa.chunked_array([], pa.string()))
            self.devices = sorted(str(x) for x in pc.unique(names.combine_chunks()).to_pylist() if x is not None)
        return self.devices

    def whole_periods(self, day: str, tz: str) -> pa.Table:
        """The whole availability periods that end in the day (the day's pieces stitched to those of
        the week before, as the summary takes them)."""
        self._day(day)
        key = ("whole periods", None)
        if key not in self.tables:
            d = dt.date.fromisoformat(day)
            days = [(d - dt.timedelta(days=k)).isoformat() for k in range(WHOLE_PERIOD_LOOKBACK_DAYS, -1, -1)]
            sql, params = self.store.relation_sql(AVAILABILITY_PERIODS, days)
            con = connect()
            try:
                self.tables[key] = whole_periods_ending(con, sql, params, *day_window(day, tz))
            finally:
                con.close()
        return self.tables[key]

    def get(self, spec: TableSpec, day: str, columns: tuple[str, ...] | None = None) -> pa.Table:
        self._day(day)
        key = (spec.path, columns)
        if key not in self.tables:
            if self.store.has_partition(spec, day):
                self.tables[key] = self.store.read_table(spec, day, columns=columns)
            else:
                empty = spec.empty()
                self.tables[key] = empty if columns is None else empty.select(list(columns))
        return self.tables[key]


_tables: _DayTables | None = None  # this process's tables of the day it renders


def render_plot(root: str, name: str, day: str, tz: str) -> Rendered:
    """Plot ``name`` of ``day`` from the tables under the data root ``root`` (a day's tables are
    kept for its next plot)."""
    global _tables
    if _tables is None or str(_tables.store.root) != root:
        _tables = _DayTables(Store(root))
    plot = PLOTS[name]
    columns = plot.columns or {}
    extra = {"day_devices": _tables.day_devices(day)} if plot.day_devices else {}
    return plot.render(*(_tables.whole_periods(day, tz) if plot.whole_periods and spec is AVAILABILITY_PERIODS
                         else _tables.get(spec, day, columns.get(spec.path)) for spec in plot.inputs),
                       dt.date.fromisoformat(day), tz, **extra)


class PlotRenderer:
    """Renders the ``names`` plots of ``days`` here and in ``workers`` helper processes (default:
    ``GPU_PIPELINE_HELPERS``, see :func:`~gpu_pipeline.lib.helper_pool.default_helpers`).

    Use as a context manager; :meth:`day` returns one day's ``{name: Rendered}`` (days in any
    order, each once) and raises the first error of the day's plots, wherever it was rendered.
    ``rendered`` counts plots by where they were drawn."""

    def __init__(self, store: Store, days: Iterable[str], names: Iterable[str], tz: str, workers: int | None = None):
        self.root, self.tz = str(store.root), tz
        self.days, self.names = list(days), list(names)
        self._helpers = HelperPool(default_helpers() if workers is None else workers)
        self._queued: dict[str, list[Task]] = {}
        self.rendered = self._helpers.ran

    def __enter__(self) -> PlotRenderer:
        self._helpers.__enter__()
        for day in self.days:  # the helper starts at its first task
            self._queued[day] = [self._helpers.submit(render_plot, self.root, name, day, self.tz) for name in self.names]
        return self

    def __exit__(self, *exc: object) -> None:
        global _tables
        self._helpers.__exit__(*exc)
        _tables = None  # the last day's tables are not kept past the step

    def day(self, day: str) -> dict[str, Rendered]:
        outcomes = self._helpers.run_all(self._queued.pop(day))
        for _, error in outcomes:
            if error is not None:
                raise error
        return {name: rendered for name, (rendered, _) in zip(self.names, outcomes, strict=True)}

