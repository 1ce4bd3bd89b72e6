"""The metric plots as (day, plot) tasks, rendered by this process and a helper process at once.

Matplotlib holds the GIL while it draws, so a second core only helps from another process. The
helper is started with ``spawn`` (a fresh interpreter that imports only this module's
dependencies, never a fork of a process holding DuckDB and Arrow threads); it reads its input
tables from the store itself, so only the finished PNG bytes travel back.

Work is shared by stealing: every task of the range is queued for the helper up front, in day
order; when this process takes a day, it renders from the end of that day's list every task the
helper has not started yet (a queued task can be cancelled, a started one cannot), then waits for
the helper's share. The result of a task does not depend on which process rendered it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import multiprocessing
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import pyarrow as pa

from gpu_pipeline.lib import metric_plots as P
from gpu_pipeline.lib.allocation import ALLOCATION_BUCKETS, ALLOCATION_DAILY
from gpu_pipeline.lib.availability import AVAILABILITY_PERIODS
from gpu_pipeline.lib.demand import DEMAND_CAPACITY, DEMAND_TOP_CONTRIBUTORS
from gpu_pipeline.lib.efficiency import GPU_HOURLY_EFFICIENCY
from gpu_pipeline.lib.evictions import EVICTION_RATES, EVICTIONS
from gpu_pipeline.lib.plot_style import Rendered
from gpu_pipeline.lib.schemas import GPU_STATES, TableSpec
from gpu_pipeline.lib.store import Store


@dataclass(frozen=True)
class PlotDef:
    render: Callable[..., Rendered]
    inputs: tuple[TableSpec, ...]  # the partition tables, in the function's argument order
    description: str
    columns: dict[str, tuple[str, ...]] | None = None  # input path -> the only columns the plot reads


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
                                      "Backfill availability period durations: histogram + ECDF by device class."),
    "time_to_claim": PlotDef(P.time_to_claim, (AVAILABILITY_PERIODS,), "Time until a backfill job claims an idle GPU."),
    "evictions_by_hour": PlotDef(P.evictions_by_hour, (EVICTIONS, EVICTION_RATES),
                                 "Evictions and lost GPU-hours by local hour of day and device class."),
    "runtime_to_eviction": PlotDef(P.runtime_to_eviction, (EVICTIONS,), "ECDF of runtime before eviction by device."),
    "efficiency_scatter": PlotDef(P.efficiency_scatter, (GPU_HOURLY_EFFICIENCY,),
                                  "Utilization vs power intensity (PIF) per GPU-hour with the class thresholds."),
    "efficiency_classes": PlotDef(P.efficiency_classes, (GPU_HOURLY_EFFICIENCY,), "GPU-hours per efficiency class."),
    "rfu_over_day": PlotDef(P.rfu_over_day, (GPU_HOURLY_EFFICIENCY,), "Fleet utilization vs capability-weighted RFU."),
    "demand_capacity_panels": PlotDef(P.demand_capacity_panels, (DEMAND_CAPACITY,),
                                      "Demand vs idle capacity, allocation vs efficiency gap, CIS with thresholds."),
    "imbalance_heatmap": PlotDef(P.imbalance_heatmap, (DEMAND_CAPACITY,), "Hour x device-class demand/capacity ratio."),
    "top_contributors": PlotDef(P.top_contributors, (DEMAND_TOP_CONTRIBUTORS,), "Top contributors to idle demand."),
}

PLOT_WORKERS_ENV = "GPU_PIPELINE_PLOT_WORKERS"


def default_workers() -> int:
    """Helper processes: ``GPU_PIPELINE_PLOT_WORKERS`` if set (0 = render everything here), else
    one when the machine has a second core."""
    value = os.environ.get(PLOT_WORKERS_ENV, "").strip()
    if value:
        n = int(value)
        if n < 0:
            raise ValueError(f"{PLOT_WORKERS_ENV}={value!r}: expected 0 or more")
        return n
    return 1 if (os.cpu_count() or 1) > 1 else 0


class _DayTables:
    """A day's input tables, each read once (missing partitions read as empty tables)."""

    def __init__(self, store: Store):
        self.store = store
        self.day: str | None = None
        self.tables: dict[tuple[str, tuple[str, ...] | None], pa.Table] = {}

    def get(self, spec: TableSpec, day: str, columns: tuple[str, ...] | None = None) -> pa.Table:
        if day != self.day:
            self.day, self.tables = day, {}
        key = (spec.path, columns)
        if key not in self.tables:
            if self.store.has_partition(spec, day):
                self.tables[key] = self.store.read_table(spec, day, columns=columns)
            else:
                empty = spec.empty()
                self.tables[key] = empty if columns is None else empty.select(list(columns))
        return self.tables[key]


def render_plot(tables: _DayTables, name: str, day: str, tz: str) -> Rendered:
    plot = PLOTS[name]
    columns = plot.columns or {}
    return plot.render(*(tables.get(spec, day, columns.get(spec.path)) for spec in plot.inputs),
                       dt.date.fromisoformat(day), tz)


_helper_tables: _DayTables | None = None


def _helper_render(root: str, name: str, day: str, tz: str) -> Rendered:
    """A task in the helper process (its tables are kept for the day's next task)."""
    global _helper_tables
    if _helper_tables is None or str(_helper_tables.store.root) != root:
        _helper_tables = _DayTables(Store(root))
    return render_plot(_helper_tables, name, day, tz)


@contextlib.contextmanager
def _bare_main() -> Iterator[None]:
    """A spawned process first re-imports the parent's ``__main__`` (for functions pickled from
    there); the helper's functions live in this module, so it is started from an empty main instead
    (under Dagster the main module is its CLI, whose import would cost the helper seconds and memory)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class PlotRenderer:
    """Renders the ``names`` plots of ``days`` here and in ``workers`` helper processes.

    Use as a context manager; :meth:`day` returns one day's ``{name: Rendered}`` (days in any
    order, each once) and raises the first error of the day's plots, wherever it was rendered."""

    def __init__(self, store: Store, days: Iterable[str], names: Iterable[str], tz: str, workers: int | None = None):
        self.store, self.tz = store, tz
        self.days, self.names = list(days), list(names)
        self.workers = default_workers() if workers is None else workers
        self._tables = _DayTables(store)
        self._pool: ProcessPoolExecutor | None = None
        self._queued: dict[str, list[tuple[str, Future]]] = {}
        self.rendered = {"here": 0, "helpers": 0}  # plots by where they were drawn

    def __enter__(self) -> PlotRenderer:
        if self.workers > 0 and self.names and self.days:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"))
            with _bare_main():  # the helpers start at their first task
                for day in self.days:
                    self._queued[day] = [(name, self._pool.submit(_helper_render, str(self.store.root), name, day,
                                                                  self.tz))
                                         for name in self.names]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def day(self, day: str) -> dict[str, Rendered]:
        queued = self._queued.pop(day, None)
        if queued is None:  # no helper: everything here
            return {name: self._here(name, day) for name in self.names}
        done: dict[str, Rendered] = {}
        for name, future in reversed(queued):  # steal from the end what the helper has not started
            if future.cancel():
                done[name] = self._here(name, day)
        for name, future in queued:
            if name not in done:
                try:
                    done[name] = future.result()
                    self.rendered["helpers"] += 1
                except BrokenProcessPool:  # the helper died (e.g. killed for memory): render it here
                    done[name] = self._here(name, day)
        return {name: done[name] for name in self.names}

    def _here(self, name: str, day: str) -> Rendered:
        rendered = render_plot(self._tables, name, day, self.tz)
        self.rendered["here"] += 1
        return rendered
