"""The metric plots rendered here and in a helper process: the same images, errors and fallbacks."""

import datetime as dt

import pytest

from gpu_pipeline.lib.allocation import ALLOCATION_BUCKETS, ALLOCATION_DAILY
from gpu_pipeline.lib.availability import AVAILABILITY_PERIODS
from gpu_pipeline.lib.demand import DEMAND_CAPACITY, DEMAND_TOP_CONTRIBUTORS
from gpu_pipeline.lib.efficiency import GPU_HOURLY_EFFICIENCY
from gpu_pipeline.lib.evictions import EVICTION_RATES, EVICTIONS
from gpu_pipeline.lib.helper_pool import HELPERS_ENV
from gpu_pipeline.lib.plot_tasks import PLOTS, PlotRenderer
from gpu_pipeline.lib.schemas import GPU_STATES
from gpu_pipeline.lib.store import Store
from gpu_pipeline_tests.lib import test_metric_plots as M

DAY = M.DAY.isoformat()
NEXT = (M.DAY + dt.timedelta(days=1)).isoformat()  # no partitions: every plot is the no-data figure


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "data")
    for spec, table in ((ALLOCATION_BUCKETS, M.full_day_buckets()), (ALLOCATION_DAILY, M.daily_table([M.H100, M.A10])),
                        (GPU_STATES, M.states_table()), (AVAILABILITY_PERIODS, M.periods_table()),
                        (EVICTIONS, M.evictions_table()), (EVICTION_RATES, M.rates_table()),
                        (GPU_HOURLY_EFFICIENCY, M.hourly_table()), (DEMAND_CAPACITY, M.capacity_table()),
                        (DEMAND_TOP_CONTRIBUTORS, M.top_table())):
        s.write_partition(spec, DAY, table)
    return s


def render_all(store: Store, workers: int, days=(DAY, NEXT)) -> tuple[dict, dict]:
    with PlotRenderer(store, days, list(PLOTS), M.TZ, workers=workers) as r:
        if workers:  # let the helper start and take a task, so that both processes draw
            r._queued[days[0]][0].future.result(timeout=120)
        out = {(day, name): rendered for day in days for name, rendered in r.day(day).items()}
    return out, r.rendered


def test_plots_drawn_by_the_helper_are_the_plots_drawn_here(store):
    alone, where_alone = render_all(store, workers=0)
    shared, where_shared = render_all(store, workers=1)
    assert set(shared) == set(alone) == {(d, n) for d in (DAY, NEXT) for n in PLOTS}
    assert where_alone == {"here": 30, "helpers": 0}
    assert where_shared["helpers"] >= 1 and where_shared["here"] + where_shared["helpers"] == 30
    for key, image in alone.items():
        assert shared[key].png == image.png, key
        assert shared[key].numbers == image.numbers, key
    assert alone[(DAY, "allocation_over_day")].numbers["allocation_pct_priority"] == pytest.approx(25.0)
    assert M.is_no_data(alone[(NEXT, "allocation_over_day")])


def test_an_error_in_the_helper_is_raised_for_its_day(store):
    bad = store.partition_file(ALLOCATION_BUCKETS, DAY)
    bad.write_bytes(b"not parquet")
    with PlotRenderer(store, [DAY], ["allocation_over_day", "allocation_counts"], M.TZ, workers=1) as r:
        first = r._queued[DAY][0].future
        with pytest.raises(Exception, match="Parquet|parquet"):
            first.result(timeout=120)  # the helper's own failure ...
        with pytest.raises(Exception, match="Parquet|parquet"):
            r.day(DAY)  # ... and the day's


def test_a_dead_helper_costs_time_not_plots(store):
    with PlotRenderer(store, [DAY, NEXT], ["allocation_over_day", "time_to_claim"], M.TZ, workers=1) as r:
        r._queued[DAY][0].future.result(timeout=120)
        for process in list(r._helpers._pool._processes.values()):
            process.kill()
        r._queued[NEXT][-1].future.exception(timeout=120)  # the pool has seen it die (no cancel races its clean-up)
        out = {day: r.day(day) for day in (DAY, NEXT)}
    assert r.rendered["here"] >= 2  # at least the second day's, after the helper was gone
    assert {d: sorted(v) for d, v in out.items()} == {d: ["allocation_over_day", "time_to_claim"] for d in (DAY, NEXT)}
    assert out[DAY]["allocation_over_day"].numbers["allocation_pct_priority"] == pytest.approx(25.0)


def test_plot_helpers_from_the_environment(monkeypatch, store):
    monkeypatch.setenv(HELPERS_ENV, "0")
    with PlotRenderer(store, [DAY], ["time_to_claim"], M.TZ) as r:
        r.day(DAY)
    assert r.rendered == {"here": 1, "helpers": 0}


def test_a_device_class_has_one_color_in_every_figure_of_the_day(tmp_path, monkeypatch):
    """Two classes whose names hash to one color slot: a figure showing only the second gave it
    that slot's color, a figure showing both gave it the next one. The figures of a day now place
    the day's classes (its GPU states') first, so each class keeps one color across them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpu_pipeline.lib import metric_plots as P
    from gpu_pipeline.lib import plot_style as S
    from gpu_pipeline.lib import plot_tasks

    first, second = "NVIDIA Model 0", "NVIDIA Model 3"  # crc32 % 13 == 2 for both

    def devices(table: pa.Table, names: list[str]) -> pa.Table:
        values = pa.array([names[i % len(names)] for i in range(table.num_rows)], pa.string())
        return table.set_column(table.schema.get_field_index("device_name"), "device_name", values)

    periods, evictions = devices(M.periods_table(), [second]), devices(M.evictions_table(), [first, second])
    s = Store(tmp_path / "data")
    for spec, table in ((GPU_STATES, devices(M.states_table(), [first, second])), (AVAILABILITY_PERIODS, periods),
                        (EVICTIONS, evictions), (EVICTION_RATES, M.rates_table())):
        s.write_partition(spec, DAY, table)
    seen = []
    real = S.device_colors

    def record(names, day_devices=()):
        seen.append(real(names, day_devices))
        return seen[-1]

    monkeypatch.setattr(S, "device_colors", record)
    # without the day's classes the two figures disagree (the defect this guards against)
    P.availability_durations(periods, M.DAY, M.TZ)
    P.evictions_by_hour(evictions, M.rates_table(), M.DAY, M.TZ)
    assert seen[0][second] != seen[1][second]
    seen.clear()
    for name in ("availability_durations", "time_to_claim", "evictions_by_hour", "runtime_to_eviction"):
        plot_tasks.render_plot(str(s.root), name, DAY, M.TZ)
    assert len(seen) == 4 and {c[second] for c in seen} == {seen[0][second]} and seen[2][first] != seen[2][second]
    assert plot_tasks._tables.day_devices(DAY) == [first, second]
    assert set(pc.unique(s.read_table(GPU_STATES, DAY)["device_name"]).to_pylist()) == {first, second}
