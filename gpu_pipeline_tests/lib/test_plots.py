import datetime as dt
import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.image import imread

from gpu_pipeline.lib.plots import STATE_COLORS, gpu_timeline_heatmap, gpu_timeline_heatmaps
from gpu_pipeline.lib.schemas import GPU_STATES, STATES, conform

DAY = dt.date(2025, 8, 6)


def states_table(n_gpus: int, hosts: int) -> pa.Table:
    t0 = dt.datetime(2025, 8, 6, 5, tzinfo=dt.UTC)
    rows = []
    for g in range(n_gpus):
        for b in range(288):
            rows.append({"bucket_start_utc": t0 + dt.timedelta(minutes=5 * b), "gpu_id": f"GPU-{g:08x}",
                         "host": f"host{g % hosts:03d}.example.edu", "state": STATES[(g + b // 48) % len(STATES)],
                         "n_slot_rows": 1})
    return conform(pa.Table.from_pylist(rows), GPU_STATES)


def pixels(png: bytes) -> np.ndarray:
    return imread(io.BytesIO(png))


def hexrgb(h: str) -> np.ndarray:
    return np.array([int(h[i:i + 2], 16) / 255 for i in (1, 3, 5)])


def test_heatmap_uses_the_documented_colors_and_shares():
    r = gpu_timeline_heatmap(states_table(20, 5), DAY, "America/Chicago")
    img = pixels(r.png)[..., :3]
    for state, color in STATE_COLORS.items():
        hit = np.isclose(img, hexrgb(color), atol=0.01).all(axis=-1).sum()
        assert hit > 100, f"{state} color {color} not drawn"
    assert abs(sum(v for k, v in r.numbers.items() if k.startswith("share_")) - 1.0) < 1e-9
    assert r.numbers["gpus"] == 20 and r.numbers["hosts"] == 5
    assert r.preview_markdown("x").startswith("![x](data:image/png;base64,")
    assert len(r.preview_png) < len(r.png)


def test_heatmap_scales_to_a_thousand_gpus():
    r = gpu_timeline_heatmap(states_table(1000, 125), DAY, "UTC")
    h, w = pixels(r.png).shape[:2]
    assert h >= 1000 * 0.9  # at least about one pixel row per GPU
    assert w == 1400


def test_every_gpu_has_its_row_past_the_height_where_the_image_stopped_growing():
    """3,000 GPUs (past 2,600, where the image stopped growing and the resize to its rows dropped
    GPUs): one GPU in seven idle all day among busy ones, and each is a band of its own in the
    image; hosts of eight GPUs, a few pixels apart, draw no separators that would tint the cells."""
    n = 3000
    t0 = dt.datetime(2025, 8, 6, 5, tzinfo=dt.UTC)
    buckets = pa.array([t0 + dt.timedelta(minutes=5 * b) for b in range(288)] * n, GPU_STATES.schema.field(
        "bucket_start_utc").type)
    gpus = np.repeat(np.arange(n), 288)
    table = conform(pa.table({
        "bucket_start_utc": buckets, "gpu_id": pa.array([f"GPU-{g:08x}" for g in gpus]),
        "host": pa.array([f"host{g // 8:04d}" for g in gpus]),
        "state": pa.array(np.where(gpus % 7 == 3, "idle_shared", "busy_shared")),
        "n_slot_rows": pa.array(np.ones(n * 288, dtype=np.int64))}), GPU_STATES)
    img = pixels(gpu_timeline_heatmap(table, DAY, "UTC").png)[..., :3]
    idle_rows = np.isclose(img, hexrgb(STATE_COLORS["idle_shared"]), atol=0.01).all(axis=-1).sum(axis=1) > 500
    bands = int(np.count_nonzero(idle_rows[1:] & ~idle_rows[:-1]) + idle_rows[0])
    assert bands == len(range(3, n, 7))
    busy = np.isclose(img, hexrgb(STATE_COLORS["busy_shared"]), atol=0.01).all(axis=-1)
    assert busy.sum() > 0.8 * (6 / 7) * n * 1000  # the cells keep the legend's colour


def test_empty_day_renders_a_no_data_figure():
    r = gpu_timeline_heatmap(GPU_STATES.empty(), DAY)
    assert pixels(r.png).shape[0] > 100
    assert r.numbers == {}


def test_fleet_and_device_images_in_one_call_equal_separate_renders():
    """gpu_timeline_heatmaps reuses one figure for every image: each must be what a fresh
    gpu_timeline_heatmap of the same rows draws, byte for byte (equal figures, equal PNGs)."""
    states = states_table(24, 6)
    devices = pa.array(["NVIDIA A100" if int(g[-8:], 16) % 3 else "NVIDIA H100" for g in
                        states.column("gpu_id").to_pylist()])
    states = states.set_column(states.schema.get_field_index("device_name"), "device_name", devices)
    main, per_device = gpu_timeline_heatmaps(states, DAY, "America/Chicago")
    alone = gpu_timeline_heatmap(states, DAY, "America/Chicago")
    assert main.png == alone.png and main.preview_png == alone.preview_png and main.numbers == alone.numbers
    assert list(per_device) == ["NVIDIA A100", "NVIDIA H100"]
    for device, image in per_device.items():
        rows = states.filter(pc.equal(states["device_name"], device))
        fresh = gpu_timeline_heatmap(rows, DAY, "America/Chicago", title=f"GPU timeline: {device}")
        assert image.png == fresh.png and image.numbers == fresh.numbers
        assert image.numbers["gpus"] == len(set(rows.column("gpu_id").to_pylist()))


def test_heatmap_time_labels_are_local_clock_times_on_dst_days(monkeypatch):
    """On the days the clocks change, each tick reads the local time at its instant (a timedelta
    added to the local midnight kept the wall clock: every label after 02:00 an hour off)."""
    from zoneinfo import ZoneInfo

    from gpu_pipeline.lib import plots

    ticks = []
    real = plots.set_fixed_ticks

    def capture(axis, positions, labels, **kw):
        if axis.axis_name == "x":
            ticks.append((list(positions), list(labels)))
        return real(axis, positions, labels, **kw)

    monkeypatch.setattr(plots, "set_fixed_ticks", capture)
    zone = ZoneInfo("America/Chicago")
    for day, hours in ((dt.date(2025, 3, 9), 23), (dt.date(2025, 11, 2), 25)):
        start = dt.datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(dt.UTC)
        rows = [{"bucket_start_utc": start + dt.timedelta(minutes=5 * b), "gpu_id": "GPU-1", "host": "h1",
                 "state": "idle_shared", "n_slot_rows": 1} for b in range(hours * 12)]
        ticks.clear()
        gpu_timeline_heatmap(conform(pa.Table.from_pylist(rows), GPU_STATES), day, "America/Chicago")
        (positions, labels), = ticks
        expected = [(start + dt.timedelta(hours=h)).astimezone(zone).strftime("%H:%M") for h in positions]
        assert labels == expected and len(positions) >= 11
        assert labels[1] == ("03:00" if hours == 23 else "01:00")  # two hours after midnight
        assert labels[-1] == "23:00"


def test_heatmap_columns_are_the_days_buckets_even_where_the_table_has_none():
    """Buckets missing from the table are na where they are: the time axis is the local day, not
    the buckets present squeezed over it (a 6-hour hole drew 12:00 at 08:00, shares without it)."""
    from gpu_pipeline.lib.plot_style import day_bounds_s

    tz = "America/Chicago"
    start, _ = day_bounds_s(DAY, tz)

    def rows(buckets):
        return conform(pa.Table.from_pylist([
            {"bucket_start_utc": dt.datetime.fromtimestamp(start + 300 * b, dt.UTC), "gpu_id": "GPU-1", "host": "h1",
             "state": "busy_shared" if b < 144 else "idle_shared", "n_slot_rows": 1} for b in buckets]), GPU_STATES)

    full = gpu_timeline_heatmap(rows(range(288)), DAY, tz)
    hole = gpu_timeline_heatmap(rows([b for b in range(288) if not 24 <= b < 96]), DAY, tz)
    late = gpu_timeline_heatmap(rows(range(36, 288)), DAY, tz)
    assert (full.numbers["share_na"], full.numbers["share_busy_shared"]) == (0.0, 0.5)
    assert (hole.numbers["share_na"], hole.numbers["share_busy_shared"], hole.numbers["share_idle_shared"]) == (
        0.25, 0.25, 0.5)
    assert late.numbers["share_na"] == 36 / 288
    # where the switch from busy to idle is drawn: the same column, 12:00 local, in both images
    def switch(png):
        img = pixels(png)[..., :3]
        busy, idle = hexrgb(STATE_COLORS["busy_shared"]), hexrgb(STATE_COLORS["idle_shared"])
        y = np.flatnonzero(np.isclose(img, idle, atol=0.01).all(axis=-1).any(axis=1))[0]
        row = img[y]
        last_busy = np.flatnonzero(np.isclose(row, busy, atol=0.01).all(axis=-1))[-1]
        return last_busy

    assert switch(hole.png) == switch(full.png)


def test_a_layout_a_few_ulps_apart_gives_the_same_png(monkeypatch):
    """The constrained layout solver's positions vary in the last bits with where its objects lie in
    memory; an axes' scale one ulp apart moved a line's antialiased edge by one gray level, so a
    re-run's plot had other bytes now and then. The positions are rounded to a millionth of the
    figure before the draw: layouts that round alike give the same PNG (drawn as they came, these
    did not), and the figure is drawn without running the layout again."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    from gpu_pipeline.lib import plot_style as S
    from gpu_pipeline.lib.plots import LAYOUT_STEP, png_and_preview

    def on_grid(v: float) -> float:
        return round(v / LAYOUT_STEP) * LAYOUT_STEP

    def figure(jitter: float):
        real = ConstrainedLayoutEngine.execute

        def execute(self, fig):  # the solver's result, a part of a step off the grid
            out = real(self, fig)
            for ax in fig.axes:
                box = ax.get_position(original=False)
                x0, y0, x1, y1 = (on_grid(v) + jitter * LAYOUT_STEP for v in (box.x0, box.y0, box.x1, box.y1))
                ax.set_position([x0, y0, x1 - x0, y1 - y0], which="active")
            return out

        monkeypatch.setattr(ConstrainedLayoutEngine, "execute", execute)
        fig = S.new_figure(6, 4)
        ax = fig.subplots()
        x = np.linspace(0.0, 10.0, 200)
        ax.plot(x, np.sin(x) * 37.3 + 0.123, linewidth=1.3)
        ax.plot(x, np.cos(x * 1.7) * 21.1, linestyle="--")
        ax.set_title("a line whose antialiased edges cross many pixels")
        return fig

    pngs = set()
    for jitter in (0.0, 0.3, -0.3, 0.45):
        fig = figure(jitter)
        pngs.add(png_and_preview(fig, 100, None)[0])
        box = fig.axes[0].get_position()
        assert all(abs(v - on_grid(v)) < 1e-12 for v in (box.x0, box.y0, box.x1, box.y1))
        assert not isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    assert len(pngs) == 1


def test_a_gpu_that_changes_host_has_one_row_and_is_counted_once(monkeypatch):
    """Two GPUs busy all day, GPU-b on hostB until 14:00 and on hostC after: two rows, not three
    (its hostB row was an extra grey row, all its cells on hostC's), two GPUs, no na share; its
    row is under hostB, where it was longest, and the label says one GPU there also ran elsewhere."""
    t0 = dt.datetime(2025, 8, 6, tzinfo=dt.UTC)
    rows = [{"bucket_start_utc": t0 + dt.timedelta(minutes=5 * b), "gpu_id": gpu, "host": host,
             "state": "busy_shared", "n_slot_rows": 1}
            for b in range(288)
            for gpu, host in (("GPU-a", "hostA"), ("GPU-b", "hostB" if b < 168 else "hostC"))]
    states = conform(pa.Table.from_pylist(rows), GPU_STATES)
    from gpu_pipeline.lib import plots

    ticks = {}
    set_fixed_ticks = plots.set_fixed_ticks

    def keep(axis, positions, labels=None, **kw):
        ticks[axis.axis_name] = list(labels or [])
        return set_fixed_ticks(axis, positions, labels, **kw)

    monkeypatch.setattr(plots, "set_fixed_ticks", keep)
    r = gpu_timeline_heatmap(states, DAY, "UTC")
    assert r.numbers["gpus"] == 2 and r.numbers["gpus_moved"] == 1 and r.numbers["hosts"] == 3
    assert r.numbers["share_busy_shared"] == 1.0 and r.numbers["share_na"] == 0.0
    img = pixels(r.png)[..., :3]
    na = np.isclose(img, hexrgb(STATE_COLORS["na"]), atol=0.01).all(axis=-1).sum(axis=1) > 500
    busy = np.isclose(img, hexrgb(STATE_COLORS["busy_shared"]), atol=0.01).all(axis=-1).sum(axis=1) > 500
    assert not na.any()  # no grey row
    assert int(np.count_nonzero(busy[1:] & ~busy[:-1]) + busy[0]) == 2  # two bands of busy rows
    assert ticks["y"] == ["hostA (1)", "hostB (1, 1 moved)"], ticks["y"]
