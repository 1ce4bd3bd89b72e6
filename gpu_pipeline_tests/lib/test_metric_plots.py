"""Metric plots: valid PNGs, hand-computed key figures, no-data figures, scale, no pyplot state."""

import datetime as dt
import io
import time

import matplotlib
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from PIL import Image

from gpu_pipeline.lib import metric_plots as M
from gpu_pipeline.lib import plot_style as S
from gpu_pipeline.lib.allocation import ALLOCATION_BUCKETS, ALLOCATION_DAILY
from gpu_pipeline.lib.availability import AVAILABILITY_PERIODS
from gpu_pipeline.lib.demand import DEMAND_CAPACITY, DEMAND_TOP_CONTRIBUTORS
from gpu_pipeline.lib.efficiency import GPU_HOURLY_EFFICIENCY
from gpu_pipeline.lib.evictions import EVICTION_RATES, EVICTIONS
from gpu_pipeline.lib.schemas import GPU_STATES, conform

DAY = dt.date(2026, 11, 17)
TZ = "America/Chicago"
T0 = dt.datetime(2026, 11, 17, 6, tzinfo=dt.UTC)  # local midnight of DAY in Chicago (CST, UTC-6)
H100 = "NVIDIA H100 80GB HBM3"
A10 = "NVIDIA A10"


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def image(png: bytes) -> np.ndarray:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=float) / 255.0


def check(r: S.Rendered) -> np.ndarray:
    """A valid PNG, a preview at most 480 px wide, finite float numbers."""
    img = image(r.png)
    assert img.shape[0] > 100 and img.shape[1] > 300
    preview = image(r.preview_png)
    assert preview.shape[1] <= S.PREVIEW_WIDTH_PX
    assert all(isinstance(v, float) and np.isfinite(v) for v in r.numbers.values())
    return img


def is_no_data(r: S.Rendered) -> bool:
    """The render_no_data figure: 10 x 3 in at 100 dpi, no key figure but coverage."""
    return image(r.png).shape[:2] == (300, 1000) and set(r.numbers) <= {"coverage_pct"}


def hexrgb(h: str) -> np.ndarray:
    return np.array([int(h[i:i + 2], 16) / 255 for i in (1, 3, 5)])


def pixels_of(img: np.ndarray, color: str) -> int:
    return int(np.isclose(img, hexrgb(color), atol=0.012).all(axis=-1).sum())


def table(spec, rows: list[dict]) -> pa.Table:
    return conform(pa.Table.from_pylist(rows), spec)


def bucket(b: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=5 * b)


def full_day_buckets() -> pa.Table:
    """288 buckets: priority claims b % 3 of 4 GPUs (0, 25, 50 %: mean 25, median 25), shared 2 of
    2 (100 %), backfill 1 of 2 (50 %), TOTAL (b % 3) + 2 of 6 (mean 50 %); H100 rows as well."""
    rows = []
    for b in range(288):
        k = b % 3
        for device in ("ALL", H100):
            for tier, c, t in (("priority", k, 4), ("shared", 2, 2), ("backfill", 1, 2), ("TOTAL", k + 2, 6)):
                rows.append({"bucket_start_utc": bucket(b), "tier": tier, "device_name": device,
                             "claimed_gpus": c, "total_gpus": t, "allocation_pct": 100.0 * c / t})
    return table(ALLOCATION_BUCKETS, rows)


def partial_buckets() -> pa.Table:
    """Four buckets; priority: 0 of 1, 1 of 2, 0 of 0 (null %), 2 of 2 -> mean % over buckets with
    capacity = (0 + 50 + 100) / 3 = 50; mean claimed 0.75, mean total 1.25 over the 4 buckets."""
    rows = []
    for b, (c, t) in enumerate(((0, 1), (1, 2), (0, 0), (2, 2))):
        for tier in ("priority", "shared", "backfill", "TOTAL"):
            rows.append({"bucket_start_utc": bucket(100 + b), "tier": tier, "device_name": "ALL",
                         "claimed_gpus": c, "total_gpus": t, "allocation_pct": 100.0 * c / t if t else None})
    return table(ALLOCATION_BUCKETS, rows)


def daily_table(devices: list[str]) -> pa.Table:
    rows = []
    for i, device in enumerate(["ALL", *devices]):
        for j, tier in enumerate(("priority", "shared", "backfill", "TOTAL")):
            rows.append({"day_start_utc": T0, "tier": tier, "device_name": device,
                         "allocation_pct": 10.0 * j + (5.0 if device == "ALL" else i),
                         "avg_claimed_gpus": 1.0 + i, "avg_total_gpus": 4.0 + i, "buckets": 288,
                         "buckets_with_capacity": 288, "buckets_expected": 288})
    return table(ALLOCATION_DAILY, rows)


def states_table() -> pa.Table:
    """2 GPUs x 288 buckets: GPU 0 busy_prioritized, GPU 1 idle_shared half the day then na."""
    rows = []
    for b in range(288):
        rows.append({"bucket_start_utc": bucket(b), "gpu_id": "GPU-00000000", "host": "h1",
                     "state": "busy_prioritized", "n_slot_rows": 1})
        rows.append({"bucket_start_utc": bucket(b), "gpu_id": "GPU-00000001", "host": "h1",
                     "state": "idle_shared" if b < 144 else "na", "n_slot_rows": 1})
    return table(GPU_STATES, rows)


def period(minutes: float, reason: str, device: str = H100, **kw) -> dict:
    start = T0 + dt.timedelta(hours=2)
    return {"gpu_id": "GPU-00000001", "host": "h1", "device_name": device, "tier": "priority",
            "start_utc": start, "end_utc": start + dt.timedelta(minutes=minutes), "duration_s": 60.0 * minutes,
            "end_reason": reason, "resolution_s": 300.0, "continues_after_day": reason == "open", **kw}


def periods_table() -> pa.Table:
    # Ended: 5, 10, 15, 60 min (median 12.5); claimed by backfill: 10 and 60 min; one open.
    return table(AVAILABILITY_PERIODS, [
        period(5, "primary_claimed"), period(10, "backfill_claimed", A10), period(15, "dropout"),
        period(60, "backfill_claimed"), period(30, "open"),
    ])


def eviction(local_hour: int, minute: int, runtime_s: float, lost: float, device: str = H100, lb: bool = False):
    at = T0 + dt.timedelta(hours=local_hour, minutes=minute)
    return {"global_job_id": f"s#{local_hour}.{minute}#1", "n_gpus": 1, "device_name": device,
            "started_utc": at - dt.timedelta(seconds=runtime_s), "evicted_utc": at, "runtime_s": runtime_s,
            "runtime_is_lower_bound": lb, "lost_gpu_hours": lost, "resolution_s": 1.0, "detected_by": "job_records"}


def evictions_table() -> pa.Table:
    return table(EVICTIONS, [eviction(3, 5, 600, 1.0), eviction(3, 40, 1200, 0.5, A10),
                             eviction(15, 0, 3600, 2.0, lb=True)])


def rates_table() -> pa.Table:
    rows = [{"device_name": "ALL", "tier": "ALL", "hour_local": h, "evictions": 0, "backfill_gpu_hours": 1.25,
             "evictions_per_backfill_gpu_hour": 0.0, "lost_gpu_hours": 0.0} for h in range(24)]
    rows.append({"device_name": "ALL", "tier": "ALL", "hour_local": None, "evictions": 3, "backfill_gpu_hours": 30.0,
                 "evictions_per_backfill_gpu_hour": 0.1, "lost_gpu_hours": 3.5})
    return table(EVICTION_RATES, rows)


def hourly_row(hour: int, util, pif, cls, coverage_s=3600.0, device=H100, realized=None, achievable=100.0):
    return {"gpu_id": f"GPU-{hour:08x}", "device_name": device, "hour_start_utc": T0 + dt.timedelta(hours=hour),
            "samples": 60, "coverage_s": coverage_s, "util_pct": util, "pif": pif, "max_power_w": 700.0,
            "max_power_source": "spec", "achievable_tflops": achievable,
            "realized_tflops": realized if realized is not None else (None if pif is None else achievable * pif),
            "efficiency_class": cls, "spec_known": True}


def hourly_table() -> pa.Table:
    """Classified GPU-hours: Efficient 1 h, Idle 1 h, Moderate 0.5 h, Inefficient 0.5 h; one row
    without power (no class, 1 h)."""
    return table(GPU_HOURLY_EFFICIENCY, [
        hourly_row(0, 95.0, 0.9, "Efficient"), hourly_row(1, 5.0, 0.1, "Idle", device=A10),
        hourly_row(2, 50.0, 0.55, "Moderate", coverage_s=1800.0), hourly_row(3, 30.0, 0.3, "Inefficient", 1800.0),
        hourly_row(4, 60.0, None, None),
    ])


def capacity_table() -> pa.Table:
    """htcondor ALL: demand 10, idle 5 every hour; CIS 0.6 (Warning) the first 12 hours, 0.8
    (Critical) after; one device class with demand 0; kueue ALL: demand 2, idle 8."""
    rows = []
    for h in range(24):
        base = {"hour_start_utc": T0 + dt.timedelta(hours=h), "idle_open_gpus": 2.0, "busy_gpus": 15.0,
                "total_gpus": 20.0, "allocation_pct": 75.0, "dcr_capped": False, "zero_idle": False, "qps": 0.3}
        rows.append({**base, "source": "htcondor", "device_class": "ALL", "demand_gpus": 10.0, "idle_gpus": 5.0,
                     "dcr": 2.0, "cis": 0.6 if h < 12 else 0.8, "severity": "Warning" if h < 12 else "Critical"})
        rows.append({**base, "source": "htcondor", "device_class": H100, "demand_gpus": 0.0, "idle_gpus": 3.0,
                     "dcr": 0.0, "cis": 0.1, "severity": "Healthy"})
        rows.append({**base, "source": "kueue", "device_class": "ALL", "demand_gpus": 2.0, "idle_gpus": 8.0,
                     "dcr": 0.25, "cis": 0.2, "severity": "Healthy"})
    return table(DEMAND_CAPACITY, rows)


def top_table() -> pa.Table:
    rows = []
    for rank, (owner, gh) in enumerate((("alice", 60.0), ("bob", 30.0), ("carol", 10.0)), start=1):
        rows.append({"day_start_utc": T0, "source": "htcondor", "dimension": "owner", "key": owner,
                     "demand_gpu_hours": gh, "share": gh / 100.0, "jobs": 3, "rank": rank})
    rows.append({"day_start_utc": T0, "source": "htcondor", "dimension": "device_class", "key": "ANY",
                 "demand_gpu_hours": 100.0, "share": 1.0, "jobs": 9, "rank": 1})
    rows.append({"day_start_utc": T0, "source": "kueue", "dimension": "cluster_queue", "key": "cq-a",
                 "demand_gpu_hours": 8.0, "share": 1.0, "jobs": None, "rank": 1})
    return table(DEMAND_TOP_CONTRIBUTORS, rows)


# ---------------------------------------------------------------------------------------------
# Allocation
# ---------------------------------------------------------------------------------------------


def test_allocation_over_day_means_per_tier():
    r = M.allocation_over_day(full_day_buckets(), DAY, TZ)
    check(r)
    assert r.numbers["allocation_pct_priority"] == pytest.approx(25.0)
    assert r.numbers["allocation_pct_shared"] == pytest.approx(100.0)
    assert r.numbers["allocation_pct_backfill"] == pytest.approx(50.0)
    assert r.numbers["allocation_pct_TOTAL"] == pytest.approx(50.0)
    assert r.numbers["gpus_total"] == pytest.approx(6.0)
    assert r.numbers["coverage_pct"] == pytest.approx(100.0)


def test_partial_day_skips_buckets_without_capacity_and_reports_coverage():
    r = M.allocation_over_day(partial_buckets(), DAY, TZ)
    check(r)
    assert r.numbers["allocation_pct_priority"] == pytest.approx(50.0)  # the 0-of-0 bucket is left out
    assert r.numbers["coverage_pct"] == pytest.approx(100.0 * 4 / 288)
    c = M.allocation_counts(partial_buckets(), DAY, TZ)
    assert c.numbers["avg_claimed_gpus_priority"] == pytest.approx(0.75)
    assert c.numbers["avg_total_gpus_priority"] == pytest.approx(1.25)
    # A caller can demand more coverage: then the day is a no-data figure.
    r = M.allocation_over_day(partial_buckets(), DAY, TZ, min_coverage_pct=50)
    assert is_no_data(r) and r.numbers == {"coverage_pct": pytest.approx(100.0 * 4 / 288)}


def test_allocation_counts_draws_the_tier_colors():
    r = M.allocation_counts(full_day_buckets(), DAY, TZ)
    img = check(r)
    assert r.numbers["avg_claimed_gpus_priority"] == pytest.approx(1.0)
    assert r.numbers["avg_total_gpus_priority"] == pytest.approx(4.0)
    assert r.numbers["avg_claimed_gpus_TOTAL"] == pytest.approx(3.0)
    for tier, color in S.TIER_COLORS.items():
        assert pixels_of(img, color) > 2000, f"{tier} color {color} not drawn"
        if tier != "shared":  # shared is fully claimed: no unclaimed tint
            assert pixels_of(img, S.TIER_LIGHT_COLORS[tier]) > 500, f"{tier} tint not drawn"


def test_allocation_counts_fills_every_covered_bucket_around_gaps():
    """A lone covered bucket and a covered hour between collector outages: each covered bucket is
    filled over its 5 minutes (the bucket before each gap, and so the lone one, were left blank)."""
    rows = [{"bucket_start_utc": bucket(b), "tier": tier, "device_name": "ALL", "claimed_gpus": c, "total_gpus": c,
             "allocation_pct": 100.0 if c else None}
            for b in [120, *range(144, 156)] for tier, c in (("priority", 0), ("shared", 4), ("backfill", 0),
                                                             ("TOTAL", 4))]
    img = image(M.allocation_counts(table(ALLOCATION_BUCKETS, rows), DAY, TZ).png)
    fill = np.isclose(img, hexrgb(S.TIER_COLORS["TOTAL"]), atol=0.012).all(axis=-1)
    panel = np.flatnonzero(fill.sum(axis=1) > 20)  # the pixel rows across the TOTAL panel's fill
    row = fill[panel[len(panel) // 2]]
    xs = np.flatnonzero(row)
    runs = [len(r) for r in np.split(xs, np.flatnonzero(np.diff(xs) > 1) + 1)]
    px_per_bucket = runs[-1] / 12
    assert px_per_bucket > 3
    assert runs[0] == pytest.approx(px_per_bucket, abs=1.5)  # the lone bucket, 10:00
    assert len(runs) == 2


def test_allocation_heatmap_reads_the_daily_table_and_folds_many_devices():
    r = M.allocation_heatmap(daily_table([H100, A10]), DAY, TZ)
    check(r)
    assert r.numbers["allocation_pct_priority"] == pytest.approx(5.0)
    assert r.numbers["allocation_pct_TOTAL"] == pytest.approx(35.0)
    assert r.numbers["devices"] == 2
    many = M.allocation_heatmap(daily_table([f"GPU model {i:02d}" for i in range(20)]), DAY, TZ)
    img = check(many)
    assert many.numbers["devices"] == 20
    assert img.shape[0] < 1200  # 12 rows + other + ALL, not 21


def test_allocation_distribution_medians():
    r = M.allocation_distribution(full_day_buckets(), DAY, TZ)
    check(r)
    assert r.numbers["median_allocation_pct_priority"] == pytest.approx(25.0)
    assert r.numbers["median_allocation_pct_shared"] == pytest.approx(100.0)
    assert r.numbers["allocation_pct_backfill"] == pytest.approx(50.0)


def test_daily_dashboard_is_an_a4_landscape_page_with_state_shares():
    r = M.daily_dashboard(full_day_buckets(), daily_table([H100]), states_table(), DAY, TZ)
    img = check(r)
    h, w = img.shape[:2]
    assert w / h == pytest.approx(297 / 210, rel=0.01) and w >= 1700
    assert r.numbers["allocation_pct_priority"] == pytest.approx(25.0)
    assert r.numbers["share_busy_prioritized"] == pytest.approx(0.5)
    assert r.numbers["share_idle_shared"] == pytest.approx(0.25)
    assert r.numbers["share_na"] == pytest.approx(0.25)
    for state in ("busy_prioritized", "idle_shared", "na"):
        assert pixels_of(img, S.STATE_COLORS[state]) > 1000, state
    for tier in ("priority", "shared", "backfill"):
        assert pixels_of(img, S.TIER_COLORS[tier]) > 500, tier
    # Without state rows the page still renders.
    assert "share_na" not in M.daily_dashboard(full_day_buckets(), daily_table([H100]), None, DAY, TZ).numbers


def test_the_dashboards_hourly_bars_leave_hours_without_a_snapshot_blank_and_hatched(monkeypatch):
    """Hours 2-4 without any snapshot (a collector outage: no allocation bucket) were drawn as bars
    of 0 GPUs, like hours with no capacity, and not hatched, while the panel above hatched them as
    unknown. Now they draw no bar, and the bar panel hatches them too."""
    from matplotlib.axes import Axes

    buckets = full_day_buckets()
    out = pc.and_(pc.greater_equal(buckets["bucket_start_utc"], pa.scalar(bucket(24), buckets["bucket_start_utc"].type)),
                  pc.less(buckets["bucket_start_utc"], pa.scalar(bucket(60), buckets["bucket_start_utc"].type)))
    buckets = buckets.filter(pc.invert(out))
    drawn, hatched = [], []
    real_bars, real_span = S.bars, Axes.axvspan

    def bars(ax, x, height, *a, **k):
        drawn.append((id(ax), np.asarray(height, dtype=float)))
        return real_bars(ax, x, height, *a, **k)

    def axvspan(ax, x0, x1, *a, **k):
        hatched.append((id(ax), round(float(x0), 3), round(float(x1), 3)))
        return real_span(ax, x0, x1, *a, **k)

    monkeypatch.setattr(S, "bars", bars)
    monkeypatch.setattr(Axes, "axvspan", axvspan)
    check(M.daily_dashboard(buckets, daily_table([H100]), states_table(), DAY, TZ))
    hourly = [(ax, h) for ax, h in drawn if len(h) == 24]
    assert len(hourly) == 6  # three tiers, claimed and unclaimed
    for _, h in hourly:
        assert np.isnan(h[2:5]).all() and np.isfinite(h[:2]).all() and np.isfinite(h[5:]).all()
    bar_axes = {ax for ax, _ in hourly}
    assert [(x0, x1) for ax, x0, x1 in hatched if ax in bar_axes] == [(2.0, 5.0)]


def test_dst_day_has_25_hours_of_buckets():
    day = dt.date(2026, 11, 1)  # CDT -> CST: 25 hours in America/Chicago
    start = dt.datetime(2026, 11, 1, 5, tzinfo=dt.UTC)
    rows = [{"bucket_start_utc": start + dt.timedelta(minutes=5 * b), "tier": tier, "device_name": "ALL",
             "claimed_gpus": 1, "total_gpus": 2, "allocation_pct": 50.0}
            for b in range(300) for tier in ("priority", "shared", "backfill", "TOTAL")]
    r = M.allocation_over_day(table(ALLOCATION_BUCKETS, rows), day, TZ)
    check(r)
    assert r.numbers["coverage_pct"] == pytest.approx(100.0)
    assert r.numbers["allocation_pct_TOTAL"] == pytest.approx(50.0)


# ---------------------------------------------------------------------------------------------
# Availability and evictions
# ---------------------------------------------------------------------------------------------


def test_availability_durations():
    r = M.availability_durations(periods_table(), DAY, TZ)
    check(r)
    assert r.numbers["count"] == 4
    assert r.numbers["median_min"] == pytest.approx(12.5)
    assert r.numbers["mean_min"] == pytest.approx(22.5)
    assert r.numbers["open_at_day_end"] == 1
    assert r.numbers["available_gpu_hours"] == pytest.approx(120 / 60)


def test_time_to_claim():
    r = M.time_to_claim(periods_table(), DAY, TZ)
    check(r)
    assert r.numbers["count"] == 2
    assert r.numbers["median_min"] == pytest.approx(35.0)
    assert r.numbers["claimed_share"] == pytest.approx(0.5)


def test_evictions_by_hour_uses_local_hours():
    r = M.evictions_by_hour(evictions_table(), rates_table(), DAY, TZ)
    check(r)
    assert r.numbers["evictions"] == 3
    assert r.numbers["lost_gpu_hours"] == pytest.approx(3.5)
    assert r.numbers["peak_hour"] == 3  # 09:05 and 09:40 UTC are 03:xx in Chicago
    assert r.numbers["evictions_per_backfill_gpu_hour"] == pytest.approx(0.1)
    assert r.numbers["backfill_gpu_hours"] == pytest.approx(30.0)
    # No eviction but backfill hours: a figure with zero bars, not an error.
    r = M.evictions_by_hour(EVICTIONS.empty(), rates_table(), DAY, TZ)
    check(r)
    assert r.numbers["evictions"] == 0


def test_runtime_to_eviction():
    r = M.runtime_to_eviction(evictions_table(), DAY, TZ)
    check(r)
    assert r.numbers["count"] == 3
    assert r.numbers["median_min"] == pytest.approx(20.0)
    assert r.numbers["lower_bound_runtimes"] == 1


def test_twenty_device_classes_fold_into_other():
    rows = [eviction(h % 24, 0, 600 + 60 * h, 0.1, device=f"Model {h:02d}") for h in range(20)]
    r = M.evictions_by_hour(table(EVICTIONS, rows), EVICTION_RATES.empty(), DAY, TZ)
    check(r)
    assert r.numbers["evictions"] == 20
    check(M.runtime_to_eviction(table(EVICTIONS, rows), DAY, TZ))


# ---------------------------------------------------------------------------------------------
# Efficiency
# ---------------------------------------------------------------------------------------------


def test_efficiency_scatter_shares_by_class():
    r = M.efficiency_scatter(hourly_table(), DAY, TZ)
    check(r)
    assert r.numbers["points"] == 4  # the row without power is not a point
    assert r.numbers["density"] == 0
    # shares of all 4 sampled GPU-hours, the hour without power (no class) among them
    assert r.numbers["share_Efficient"] == pytest.approx(1 / 4)
    assert r.numbers["share_Idle"] == pytest.approx(1 / 4)
    assert r.numbers["share_Moderate"] == pytest.approx(1 / 8)
    assert r.numbers["share_Inefficient"] == pytest.approx(1 / 8)
    assert r.numbers["share_Bottlenecked"] == 0
    assert r.numbers["share_no_class"] == pytest.approx(1 / 4)
    # an hour under 10 % utilization is Idle without a power reading: not a point, but its share
    # counts, as in efficiency_classes (the scatter's legend read Idle 0.0 %)
    t = table(GPU_HOURLY_EFFICIENCY, [hourly_row(0, 95.0, 0.9, "Efficient"), hourly_row(1, 3.0, None, "Idle")])
    r = M.efficiency_scatter(t, DAY, TZ)
    assert (r.numbers["points"], r.numbers["share_Idle"], r.numbers["share_Efficient"]) == (1, 0.5, 0.5)
    assert r.numbers["share_Idle"] == M.efficiency_classes(t, DAY, TZ).numbers["share_Idle"]


def test_efficiency_scatter_bins_two_million_points():
    n = 2_000_000
    rng = np.random.default_rng(7)
    util = rng.uniform(0, 100, n)
    pif = rng.uniform(0, 1, n)
    codes = M._class_codes(util, pif)
    t = pa.table({
        "util_pct": util, "pif": pif, "coverage_s": np.full(n, 3600.0),
        "efficiency_class": pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(S.CLASS_ORDER)),
    })
    t0 = time.perf_counter()
    r = M.efficiency_scatter(t, DAY, TZ)
    elapsed = time.perf_counter() - t0
    check(r)
    assert r.numbers["points"] == n and r.numbers["density"] == 1
    assert sum(r.numbers[f"share_{c}"] for c in S.CLASS_ORDER) == pytest.approx(1.0)
    assert r.numbers["share_Idle"] == pytest.approx(0.1, abs=0.01)
    assert len(r.png) < 400_000  # bounded: a 2-D histogram, not two million markers
    print(f"efficiency_scatter, 2,000,000 points: {elapsed:.2f} s")


def test_efficiency_classes_gpu_hours():
    r = M.efficiency_classes(hourly_table(), DAY, TZ)
    check(r)
    assert r.numbers["gpu_hours"] == pytest.approx(4.0)
    assert r.numbers["gpu_hours_Efficient"] == pytest.approx(1.0)
    assert r.numbers["gpu_hours_Moderate"] == pytest.approx(0.5)
    assert r.numbers["gpu_hours_no_class"] == pytest.approx(1.0)
    assert r.numbers["share_Idle"] == pytest.approx(0.25)


def test_rfu_over_day_is_capability_weighted():
    rows = [hourly_row(5, 80.0, 0.5, "Moderate", realized=50.0, achievable=100.0),
            hourly_row(5, 20.0, 0.2, "Inefficient", coverage_s=1800.0, realized=10.0, achievable=50.0)]
    r = M.rfu_over_day(table(GPU_HOURLY_EFFICIENCY, rows), DAY, TZ)
    check(r)
    assert r.numbers["util_pct"] == pytest.approx(60.0)  # (80 x 3600 + 20 x 1800) / 5400
    assert r.numbers["rfu_pct_fleet"] == pytest.approx(44.0)  # 100 (50 x 3600 + 10 x 1800) / (100 x 3600 + 50 x 1800)
    assert r.numbers["efficiency_gap_pp"] == pytest.approx(16.0)
    assert r.numbers["hours"] == 1


# ---------------------------------------------------------------------------------------------
# Demand and capacity
# ---------------------------------------------------------------------------------------------


def test_demand_capacity_panels():
    r = M.demand_capacity_panels(capacity_table(), DAY, TZ)
    check(r)
    assert r.numbers["demand_gpus_htcondor"] == pytest.approx(10.0)
    assert r.numbers["idle_gpus_htcondor"] == pytest.approx(5.0)
    assert r.numbers["dcr_htcondor"] == pytest.approx(2.0)
    assert r.numbers["cis_max_htcondor"] == pytest.approx(0.8)
    assert r.numbers["hours_warning_htcondor"] == 12
    assert r.numbers["hours_critical_htcondor"] == 12
    assert r.numbers["demand_gpus_kueue"] == pytest.approx(2.0)
    assert r.numbers["coverage_pct"] == pytest.approx(100.0)


def test_demand_panels_say_unknown_when_a_source_has_no_capacity_all_day(monkeypatch):
    """A Kueue cluster without its quota metrics has no idle GPUs all day (severity Unknown): the
    legend says so instead of "mean nan" (and no "Mean of empty slice" warning), and the CIS panel
    says why it has no line."""
    import warnings

    t = capacity_table()
    kueue = pc.equal(t["source"], "kueue")
    for c in ("idle_gpus", "idle_open_gpus", "cis", "dcr", "qps"):
        t = t.set_column(t.schema.get_field_index(c), c, pc.if_else(kueue, pa.scalar(None, t[c].type), t[c]))
    t = t.set_column(t.schema.get_field_index("severity"), "severity", pc.if_else(kueue, "Unknown", t["severity"]))
    drawn = {}
    finish = M.S.finish

    def keep(fig, numbers):
        drawn["texts"] = [x.get_text() for ax in fig.axes for x in ax.texts]
        drawn["labels"] = [lab for ax in fig.axes for lab in ax.get_legend_handles_labels()[1]]
        return finish(fig, numbers)

    monkeypatch.setattr(M.S, "finish", keep)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = M.demand_capacity_panels(t, DAY, TZ)
    check(r)
    assert "kueue: idle GPUs (unknown all day)" in drawn["labels"]
    assert "htcondor: idle GPUs (mean 5.0)" in drawn["labels"]
    assert not any("nan" in lab for lab in drawn["labels"])
    assert "no CIS where capacity is unknown (severity Unknown): kueue 24 h" in drawn["texts"]
    assert r.numbers["hours_unknown_kueue"] == 24


def test_demand_plots_with_hours_of_unknown_capacity():
    """Six hours without a slot snapshot: Unknown rows, null capacity and DCR; the plots draw the
    rest, count the six hours as unknown and leave them out of the coverage."""
    t = capacity_table()
    dark = pc.and_(pc.less(t["hour_start_utc"], pa.scalar(T0 + dt.timedelta(hours=6), t["hour_start_utc"].type)),
                   pc.equal(t["source"], "htcondor"))
    cols = {c: pc.if_else(dark, pa.scalar(None, t[c].type), t[c])
            for c in ("idle_gpus", "idle_open_gpus", "busy_gpus", "total_gpus", "allocation_pct", "dcr", "qps",
                      "cis", "zero_idle")}
    cols["severity"] = pc.if_else(dark, "Unknown", t["severity"])
    cols["demand_gpus"] = pc.if_else(dark, 40.0, t["demand_gpus"])  # demand known, capacity not
    for c, v in cols.items():
        t = t.set_column(t.schema.get_field_index(c), c, v)
    r = M.demand_capacity_panels(t, DAY, TZ)
    check(r)
    assert r.numbers["hours_unknown_htcondor"] == 6 and r.numbers["hours_warning_htcondor"] == 6
    assert r.numbers["idle_gpus_htcondor"] == pytest.approx(5.0)
    # the day's DCR over the hours where demand and idle are both known: 10 / 5, as every such hour
    # (the outage's demand over the other hours' idle made it (6 x 40 + 18 x 10) / 24 / 5 = 3.5)
    assert r.numbers["dcr_htcondor"] == pytest.approx(2.0)
    assert r.numbers["coverage_pct"] == pytest.approx(100.0)  # kueue ALL knows every hour
    only = t.filter(pc.equal(t["source"], "htcondor"))
    assert M.demand_capacity_panels(only, DAY, TZ).numbers["coverage_pct"] == pytest.approx(100.0 * 18 / 24)
    h = M.imbalance_heatmap(only, DAY, TZ)
    check(h)
    assert h.numbers["hours_dcr_above_1"] == 18 and h.numbers["coverage_pct"] == pytest.approx(75.0)


def test_imbalance_heatmap_other_row_leaves_hours_of_unknown_capacity_blank(monkeypatch):
    """14 device classes (two folded into "other"), the collector down 05:00-06:00: every row is
    blank in hour 5, "other" too (its sums took a null idle as 0: DCR 0, or >= 100 with demand)."""
    from gpu_pipeline.lib.demand import demand_from_tables
    from gpu_pipeline_tests.lib.test_demand import DAY as D_DAY
    from gpu_pipeline_tests.lib.test_demand import END as D_END
    from gpu_pipeline_tests.lib.test_demand import at, job, jobs, states

    def st(g, t):
        return "no_snapshot" if t.hour == 5 else ("idle_shared" if g % 2 else "busy_shared")

    parts = [states(14 - i, st, device=f"DEV{i:02d}", prefix=f"G{i:02d}-") for i in range(14)]
    jt = jobs([job("s1#1.0#1", 0, "job", queued=at(4), start=at(9), end=at(10), completion=at(10))])
    jt = jt.append_column("device_class", pa.array(["DEV13"]))  # a folded class with demand
    cap = demand_from_tables(jt, pa.concat_tables(parts), D_DAY, D_END).capacity
    cells = []
    texts = S.texts

    def capture(ax, xs, ys, labels, styles, **kw):
        cells.extend(zip(xs, ys, labels, strict=True))
        return texts(ax, xs, ys, labels, styles, **kw)

    monkeypatch.setattr(S, "texts", capture)
    check(M.imbalance_heatmap(cap, D_DAY.date(), "UTC"))
    other = 13.5  # row centres: the pool, 12 classes, other (DEV12 + DEV13)
    assert [t for x, y, t in cells if x == 5.5] == []
    # around it: DEV13's 1 GPU of demand over the folded classes' one idle GPU
    assert [t for x, y, t in cells if y == other and x in (4.5, 6.5)] == ["1.0", "1.0"]


def test_imbalance_heatmap():
    r = M.imbalance_heatmap(capacity_table(), DAY, TZ)
    check(r)
    assert r.numbers["max_dcr"] == pytest.approx(2.0)
    assert r.numbers["hours_dcr_above_1"] == 24
    assert r.numbers["device_classes"] == 1
    r = M.imbalance_heatmap(capacity_table(), DAY, TZ, metric="cis")
    check(r)
    assert r.numbers["max_cis"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="metric"):
        M.imbalance_heatmap(capacity_table(), DAY, TZ, metric="qps")
    # the figure's max is the table's, not the color scale's cap (100)
    t = capacity_table()
    pool = pc.and_(pc.equal(t["source"], "htcondor"), pc.equal(t["device_class"], "ALL"))
    t = t.set_column(t.schema.get_field_index("dcr"), "dcr", pc.if_else(pool, 200.0, t["dcr"]))
    assert M.imbalance_heatmap(t, DAY, TZ).numbers["max_dcr"] == pytest.approx(200.0)


def test_top_contributors():
    r = M.top_contributors(top_table(), DAY, TZ)
    check(r)
    assert r.numbers["demand_gpu_hours_htcondor"] == pytest.approx(100.0)
    assert r.numbers["top_share_owner"] == pytest.approx(0.6)
    assert r.numbers["demand_gpu_hours_kueue"] == pytest.approx(8.0)


# ---------------------------------------------------------------------------------------------
# Empty days, determinism, no global state
# ---------------------------------------------------------------------------------------------

EMPTY_CALLS = {
    "allocation_over_day": lambda: M.allocation_over_day(ALLOCATION_BUCKETS.empty(), DAY, TZ),
    "allocation_counts": lambda: M.allocation_counts(ALLOCATION_BUCKETS.empty(), DAY, TZ),
    "allocation_heatmap": lambda: M.allocation_heatmap(ALLOCATION_DAILY.empty(), DAY, TZ),
    "allocation_distribution": lambda: M.allocation_distribution(ALLOCATION_BUCKETS.empty(), DAY, TZ),
    "daily_dashboard": lambda: M.daily_dashboard(ALLOCATION_BUCKETS.empty(), ALLOCATION_DAILY.empty(),
                                                 GPU_STATES.empty(), DAY, TZ),
    "availability_durations": lambda: M.availability_durations(AVAILABILITY_PERIODS.empty(), DAY, TZ),
    "time_to_claim": lambda: M.time_to_claim(AVAILABILITY_PERIODS.empty(), DAY, TZ),
    "evictions_by_hour": lambda: M.evictions_by_hour(EVICTIONS.empty(), EVICTION_RATES.empty(), DAY, TZ),
    "runtime_to_eviction": lambda: M.runtime_to_eviction(EVICTIONS.empty(), DAY, TZ),
    "efficiency_scatter": lambda: M.efficiency_scatter(GPU_HOURLY_EFFICIENCY.empty(), DAY, TZ),
    "efficiency_classes": lambda: M.efficiency_classes(GPU_HOURLY_EFFICIENCY.empty(), DAY, TZ),
    "rfu_over_day": lambda: M.rfu_over_day(GPU_HOURLY_EFFICIENCY.empty(), DAY, TZ),
    "demand_capacity_panels": lambda: M.demand_capacity_panels(DEMAND_CAPACITY.empty(), DAY, TZ),
    "imbalance_heatmap": lambda: M.imbalance_heatmap(DEMAND_CAPACITY.empty(), DAY, TZ),
    "top_contributors": lambda: M.top_contributors(DEMAND_TOP_CONTRIBUTORS.empty(), DAY, TZ),
}


def test_every_plot_is_covered_by_the_empty_day_test():
    assert set(EMPTY_CALLS) == set(M.PLOTS) == set(M.__all__)


@pytest.mark.parametrize("name", sorted(EMPTY_CALLS))
def test_empty_day_gives_the_no_data_figure(name):
    r = EMPTY_CALLS[name]()
    assert is_no_data(r), name
    if "coverage_pct" in r.numbers:
        assert r.numbers["coverage_pct"] == 0
    # its preview is as wide as the metric plots' (it was the GPU heatmap's 900 px)
    assert Image.open(io.BytesIO(r.preview_png)).width <= S.PREVIEW_WIDTH_PX


def test_rows_without_usable_values_give_the_no_data_figure():
    only_open = table(AVAILABILITY_PERIODS, [period(30, "open")])
    assert is_no_data(M.availability_durations(only_open, DAY, TZ))
    assert is_no_data(M.time_to_claim(only_open, DAY, TZ))
    no_power = table(GPU_HOURLY_EFFICIENCY, [hourly_row(0, 50.0, None, None)])
    assert is_no_data(M.efficiency_scatter(no_power, DAY, TZ))
    check(M.efficiency_classes(no_power, DAY, TZ))  # one "no class" GPU-hour is still a figure


def test_same_input_gives_identical_bytes():
    a = M.allocation_heatmap(daily_table([H100, A10]), DAY, TZ)
    b = M.allocation_heatmap(daily_table([H100, A10]), DAY, TZ)
    assert a.png == b.png and a.preview_png == b.preview_png


def test_no_pyplot_figure_and_no_rcparams_change():
    import matplotlib.pyplot as plt

    before = dict(matplotlib.rcParams)
    assert plt.get_fignums() == []
    M.daily_dashboard(full_day_buckets(), daily_table([H100]), states_table(), DAY, TZ)
    M.efficiency_scatter(hourly_table(), DAY, TZ)
    M.imbalance_heatmap(capacity_table(), DAY, TZ)
    M.top_contributors(top_table(), DAY, TZ)
    assert plt.get_fignums() == []
    assert dict(matplotlib.rcParams) == before


def test_style_helpers():
    assert S.title("Allocation by tier", DAY, TZ) == "Allocation by tier — 2026-11-17 (America/Chicago)"
    assert S.unit_label("allocation", "%") == "allocation (%)"
    assert S.short_device("NVIDIA GeForce RTX 2080 Ti") == "RTX 2080 Ti"
    assert S.short_device("Tesla V100-SXM2-32GB") == "V100-SXM2-32GB"
    shown, label = S.fold_top({f"m{i:02d}": float(i) for i in range(20)})
    assert len(shown) == 13 and shown[-1] == "other" and label["m00"] == "other" and label["m19"] == "m19"
    colors = S.device_colors([f"m{i:02d}" for i in range(13)])
    assert len(set(colors.values())) == 13  # no two shown classes share a color (fold_top draws up to 13)
    assert len(S.fold_top({f"m{i:02d}": 1.0 for i in range(13)})[0]) == 13
    # the day's classes placed first never make two classes of one figure share a color: with
    # more classes in the day (or the figure's) than colors the figure's own come first
    for day, shown in (([f"NVIDIA Model {i}" for i in range(14)], ["NVIDIA Model 12", "NVIDIA Model 9"]),
                       ([f"NVIDIA Model {i}" for i in range(13)], ["unknown", "NVIDIA Model 7"])):
        got = S.device_colors(shown, day)
        assert got[shown[0]] != got[shown[1]]
    assert S.device_colors(["m01", "m02"])["m01"] == S.device_colors(["m02", "m01", "other"])["m01"]
    assert S.STATE_COLORS["busy_backfill"] == "#4488ff"  # the DESIGN.md 5.1 palette, re-exported


def test_long_title_notes_wrap_within_the_figure():
    """The notes under a title are wrapped to the figure's width (a partial day's coverage note
    ran past both edges of the efficiency class figure); a note's own line break is kept."""
    fig = S.new_figure(8, 3)
    notes = ("GPU-hours by class over the day's 1,234 GPU-hours, 87 without power readings (no class)",
             "partial day: coverage 75 % of the day's hours", "no job named a device class\nsecond line")
    M._titled(fig, "GPU efficiency classes", DAY, TZ, *notes)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box = fig._suptitle.get_window_extent(canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width
    text = fig._suptitle.get_text().split("\n")
    assert len(text) >= 4 and text[-1] == "second line" and "coverage 75 %" in fig._suptitle.get_text()


def test_dcr_heatmap_color_bar_label_fits_a_short_figure(monkeypatch):
    """With the whole pool as the only row the figure is 2.3 in tall: the color bar's label must
    fit in it (on one line it ran past the figure's top and bottom)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    t = capacity_table()
    t = t.filter(pc.and_(pc.equal(t["source"], "htcondor"), pc.equal(t["device_class"], "ALL")))
    boxes = []
    finish = S.finish

    def spy(fig, numbers, **kw):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        boxes.extend((ax.yaxis.label.get_window_extent(canvas.get_renderer()), fig.bbox.height)
                     for ax in fig.axes if ax.yaxis.label.get_text().startswith("DCR"))
        return finish(fig, numbers, **kw)

    monkeypatch.setattr(S, "finish", spy)
    check(M.imbalance_heatmap(t, DAY, TZ))
    ((box, height),) = boxes
    assert 0 <= box.y0 and box.y1 <= height


def test_the_duration_plots_draw_whole_periods_as_the_summary_counts_them(tmp_path):
    """A GPU idle from 23:05 and claimed by a backfill job at 00:30 waited 85 minutes: the plot drew
    the day's piece, 30 minutes from midnight, while availability_summary said 85. The plots now
    stitch the day's pieces to the week before's, as the summary does."""
    from gpu_pipeline.lib import plot_tasks
    from gpu_pipeline.lib.store import Store

    store = Store(tmp_path)
    d1, d2 = dt.datetime(2025, 8, 5, tzinfo=dt.UTC), dt.datetime(2025, 8, 6, tzinfo=dt.UTC)
    piece = {"gpu_id": "GPU-00000001", "host": "h1", "device_name": H100, "tier": "priority", "resolution_s": 300.0}
    store.write_partition(AVAILABILITY_PERIODS, "2025-08-05", table(AVAILABILITY_PERIODS, [
        {**piece, "start_utc": d1 + dt.timedelta(hours=23, minutes=5), "end_utc": d2, "duration_s": 55 * 60.0,
         "end_reason": "open", "starts_before_day": False, "continues_after_day": True}]))
    store.write_partition(AVAILABILITY_PERIODS, "2025-08-06", table(AVAILABILITY_PERIODS, [
        {**piece, "start_utc": d2, "end_utc": d2 + dt.timedelta(minutes=30), "duration_s": 30 * 60.0,
         "end_reason": "backfill_claimed", "starts_before_day": True, "continues_after_day": False},
        {**piece, "gpu_id": "GPU-00000002", "start_utc": d2 + dt.timedelta(hours=3),
         "end_utc": d2 + dt.timedelta(hours=3, minutes=10), "duration_s": 600.0, "end_reason": "backfill_claimed",
         "starts_before_day": False, "continues_after_day": False}]))
    plot_tasks._tables = None
    claim = plot_tasks.render_plot(str(store.root), "time_to_claim", "2025-08-06", "UTC").numbers
    assert (claim["count"], claim["mean_min"]) == (2, pytest.approx((85 + 10) / 2))
    durations = plot_tasks.render_plot(str(store.root), "availability_durations", "2025-08-06", "UTC").numbers
    assert (durations["count"], durations["mean_min"]) == (2, pytest.approx((85 + 10) / 2))
    assert durations["available_gpu_hours"] == pytest.approx((30 + 10) / 60)  # the day's own hours
    # the day before: its piece is still open at its end, so nothing ended there
    assert "count" not in plot_tasks.render_plot(str(store.root), "time_to_claim", "2025-08-05", "UTC").numbers


def test_a_whole_period_that_ends_at_the_days_first_instant_is_the_days_as_in_the_summary():
    """The day's empty closing piece (a period that ended exactly at midnight) is counted by the
    summary on that day; the whole periods the plots draw left it out of every day."""
    from gpu_pipeline.lib.availability import whole_periods_ending
    from gpu_pipeline.lib.store import connect

    d1, d2 = dt.datetime(2025, 8, 5, tzinfo=dt.UTC), dt.datetime(2025, 8, 6, tzinfo=dt.UTC)
    piece = {"gpu_id": "GPU-00000001", "host": "h1", "device_name": H100, "tier": "priority", "resolution_s": 300.0}
    pieces = table(AVAILABILITY_PERIODS, [
        {**piece, "start_utc": d1 + dt.timedelta(hours=22), "end_utc": d2, "duration_s": 7200.0, "end_reason": "open",
         "starts_before_day": False, "continues_after_day": True},
        {**piece, "start_utc": d2, "end_utc": d2, "duration_s": 0.0, "end_reason": "backfill_claimed",
         "starts_before_day": True, "continues_after_day": False}])
    con = connect()
    try:
        con.register("p", pieces)
        got = whole_periods_ending(con, "p", [], d2, d2 + dt.timedelta(days=1)).to_pylist()
        con.register("p1", pieces.slice(0, 1))  # the day before reads its own pieces and the week before
        before = whole_periods_ending(con, "p1", [], d1, d2).to_pylist()
    finally:
        con.close()
    assert [(r["end_reason"], r["duration_s"]) for r in got] == [("backfill_claimed", 7200.0)]
    assert [r["end_reason"] for r in before] == ["open"]  # still open at that day's end


# ---------------------------------------------------------------------------------------------
# Review 28e: what the figures say agrees with their numbers and with each other
# ---------------------------------------------------------------------------------------------


def capture_texts(monkeypatch) -> dict:
    """Record the text a figure draws (suptitle, panel titles, legend entries and titles, free
    texts) as S.finish receives it."""
    drawn: dict = {}
    finish = M.S.finish

    def keep(fig, numbers, **kw):
        drawn["suptitle"] = fig._suptitle.get_text() if fig._suptitle is not None else ""
        drawn["titles"] = [ax.get_title(loc="left") for ax in fig.axes]
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        drawn["legend"] = [t.get_text() for leg in legends for t in leg.get_texts()]
        drawn["legend_titles"] = [leg.get_title().get_text() for leg in legends]
        drawn["texts"] = [x.get_text() for ax in fig.axes for x in ax.texts]
        return finish(fig, numbers, **kw)

    monkeypatch.setattr(M.S, "finish", keep)
    return drawn


def no_power_hourly() -> pa.Table:
    """3 GPU-hours drawn (Efficient 1 h, Inefficient 1 h, Moderate 0.5 h) and 3 rows without a
    power reading, not drawn: two of 1 h with utilization >= 10 % (no class) and one Idle half hour.
    5 sampled GPU-hours in all."""
    return table(GPU_HOURLY_EFFICIENCY, [
        hourly_row(0, 95.0, 0.9, "Efficient"), hourly_row(1, 30.0, 0.3, "Inefficient"),
        hourly_row(2, 50.0, 0.55, "Moderate", coverage_s=1800.0),
        hourly_row(3, 60.0, None, None), hourly_row(4, 80.0, None, None),
        hourly_row(5, 3.0, None, "Idle", coverage_s=1800.0),
    ])


def test_efficiency_scatter_states_the_gpu_hours_it_does_not_draw(monkeypatch):
    """GPU-hours without a power reading have no point: the figure says how many there are, and its
    shares are of all sampled GPU-hours, "no class" among them, as in efficiency_classes (the
    legend read Efficient 40 % where the class figure read 20 %, and the 2 h without a class were
    nowhere on the scatter)."""
    classes = M.efficiency_classes(no_power_hourly(), DAY, TZ).numbers
    drawn = capture_texts(monkeypatch)
    r = M.efficiency_scatter(no_power_hourly(), DAY, TZ)
    check(r)
    assert r.numbers["points"] == 3 and r.numbers["gpu_hours"] == pytest.approx(2.5)
    assert r.numbers["rows_not_drawn"] == 3 and r.numbers["gpu_hours_not_drawn"] == pytest.approx(2.5)
    expected = {"Efficient": 1 / 5, "Inefficient": 1 / 5, "Moderate": 0.5 / 5, "Idle": 0.5 / 5, "Bottlenecked": 0.0,
                "no_class": 2 / 5}
    for key, share in expected.items():
        assert r.numbers[f"share_{key}"] == pytest.approx(share), key
    for key in expected:
        assert r.numbers[f"share_{key}"] == pytest.approx(classes[f"share_{key}"]), key
    assert "Efficient: 20.0 %" in drawn["legend"]
    assert any(t.startswith("no class") and "40.0 %" in t for t in drawn["legend"]), drawn["legend"]
    assert any("5.0 sampled GPU-hours" in t for t in drawn["legend_titles"]), drawn["legend_titles"]
    title = drawn["suptitle"].replace("\n", " ")
    assert "not drawn: 3 rows, 2.5 sampled GPU-hours without a utilization or power reading" in title, title


def test_efficiency_scatter_title_counts_rows_and_their_sampled_gpu_hours(monkeypatch):
    """Each row is a GPU x hour, here sampled a quarter of the hour: 4 rows are 1 sampled GPU-hour,
    not "4 GPU-hours"."""
    drawn = capture_texts(monkeypatch)
    rows = [hourly_row(h, 95.0, 0.9, "Efficient", coverage_s=900.0) for h in range(4)]
    r = M.efficiency_scatter(table(GPU_HOURLY_EFFICIENCY, rows), DAY, TZ)
    assert r.numbers["points"] == 4 and r.numbers["gpu_hours"] == pytest.approx(1.0)
    title = drawn["suptitle"].replace("\n", " ")
    assert "4 rows (GPU x hour), 1.0 sampled GPU-hours" in title, title
    assert "4 GPU-hours" not in title
    assert "not drawn" not in title  # every row has a point


def saturated_capacity() -> pa.Table:
    """The pool has no idle GPU all day and 10 GPUs of demand, as demand_capacity writes it: DCR at
    its cap 1e6 every hour, dcr_capped, zero_idle, Critical."""
    t = capacity_table()
    pool = pc.and_(pc.equal(t["source"], "htcondor"), pc.equal(t["device_class"], "ALL"))
    for col, v in (("idle_gpus", 0.0), ("idle_open_gpus", 0.0), ("demand_gpus", 10.0), ("dcr", 1e6),
                   ("dcr_capped", True), ("zero_idle", True), ("severity", "Critical")):
        t = t.set_column(t.schema.get_field_index(col), col, pc.if_else(pool, pa.scalar(v, t[col].type), t[col]))
    return t


def test_the_days_dcr_never_exceeds_the_tables_cap_in_either_figure():
    """10 GPUs of demand over 0 idle: the table caps the DCR at 1e6; the panels' day ratio read 1e7
    (10 / 1e-6) while the heatmap read 1e6. Both read 1e6 and count the 24 hours at the cap."""
    panels = M.demand_capacity_panels(saturated_capacity(), DAY, TZ).numbers
    heat = M.imbalance_heatmap(saturated_capacity(), DAY, TZ).numbers
    assert panels["dcr_htcondor"] == 1e6 and heat["max_dcr"] == 1e6
    assert panels["hours_dcr_capped_htcondor"] == 24 and heat["hours_dcr_capped"] == 24
    # an unsaturated day counts no hour at the cap
    assert M.demand_capacity_panels(capacity_table(), DAY, TZ).numbers["hours_dcr_capped_htcondor"] == 0
    assert M.imbalance_heatmap(capacity_table(), DAY, TZ).numbers["hours_dcr_capped"] == 0


def test_top_contributors_colors_a_class_as_the_other_figures_of_a_13_class_day():
    """A day of exactly 13 device classes (as many as colors): the device panel's key ANY (jobs
    that name no device) is not a class; counted as one it made 14, the day's placement was given up and a
    class took another class's color (L40S orange in the eviction figures, purple here)."""
    day13 = ["NVIDIA A10", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A30", "NVIDIA A40",
             "NVIDIA GeForce RTX 2080 Ti", "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA L40", "NVIDIA L40S",
             "Tesla T4", "Tesla V100-SXM2-32GB", "Quadro RTX 6000"]
    shown = [d for d in day13 if d != "NVIDIA A100-SXM4-40GB"][:9]
    keys = ["ANY", *shown]
    rows = [{"day_start_utc": T0, "source": "htcondor", "dimension": "device_class", "key": k,
             "demand_gpu_hours": 100.0 - 5 * i, "share": 0.05, "jobs": 1, "rank": i + 1} for i, k in enumerate(keys)]
    day_colors = S.device_colors(day13, day13)  # the colors of the day's other device figures
    img = check(M.top_contributors(table(DEMAND_TOP_CONTRIBUTORS, rows), DAY, TZ, day_devices=day13))
    assert len(set(day_colors.values())) == 13
    for d in shown:
        assert pixels_of(img, day_colors[d]) > 200, d
    for d in set(day13) - set(shown):  # a color of a class not on the figure is not drawn
        assert pixels_of(img, day_colors[d]) == 0, d


def test_title_notes_wrap_between_phrases():
    """The DCR heatmap's note is four phrases joined by " · ": wrapped to the figure's width, a
    line ends between two phrases, never inside one ("white: no" / "data")."""
    phrases = ["blue: idle capacity exceeds queued demand", "red: demand exceeds idle GPUs (DCR > 1)",
               "gray 0: no queued demand", "white: no data"]
    for width_in in (8, 10, 13):
        fig = S.new_figure(width_in, 3)
        M._titled(fig, "Demand-capacity imbalance (DCR)", DAY, TZ, " · ".join(phrases), "partial day: coverage 50 %")
        lines = fig._suptitle.get_text().split("\n")[1:]
        got = [p.strip() for line in lines for note in line.split("  ·  ") for p in note.split(" · ")]
        assert got == [*phrases, "partial day: coverage 50 %"], (width_in, lines)


def test_allocation_counts_says_no_data_for_a_tier_without_rows(monkeypatch):
    """A pool without backfill slots has no backfill rows: its panel says so ("nan of nan GPUs")."""
    drawn = capture_texts(monkeypatch)
    b = full_day_buckets()
    r = M.allocation_counts(b.filter(pc.not_equal(b["tier"], "backfill")), DAY, TZ)
    check(r)
    backfill = [t for t in drawn["titles"] if t.startswith(S.TIER_LABELS["backfill"])]
    assert backfill == [f"{S.TIER_LABELS['backfill']}: no data (no row for this tier in the day)"]
    assert not any("nan" in t for t in drawn["titles"])
    assert "avg_claimed_gpus_backfill" not in r.numbers and r.numbers["avg_claimed_gpus_priority"] == 1.0
    import warnings

    with warnings.catch_warnings():  # the dashboard's hourly bars of that tier: none, and no "Mean of empty slice"
        warnings.simplefilter("error", RuntimeWarning)
        check(M.daily_dashboard(b.filter(pc.not_equal(b["tier"], "backfill")), daily_table([H100]), states_table(),
                                DAY, TZ))
