"""Plots of the metric tables, one day at a time (DESIGN.md 5.2-5.6).

Every function takes the pyarrow table(s) of ONE partition day (the rows of ``date=YYYY-MM-DD``,
extra columns such as the hive ``date`` are ignored) plus the day and the partition time zone, and
returns :class:`~gpu_pipeline.lib.plots.Rendered`: the PNG, a preview at most 480 px wide, and
``numbers`` -- the key figures the plot shows (e.g. ``allocation_pct_priority``), as floats. An
empty day gives the "No data — coverage N %" figure (``numbers`` then holds at most
``coverage_pct``), never an exception. A partial day is drawn as far as it goes, with its coverage
in the subtitle and in ``numbers["coverage_pct"]``.

Coverage is computed from the table where it can be (5-minute buckets or hours present / expected
in the local day, 23 or 25 hours on DST days); callers that know it better (the coverage table)
pass ``coverage_pct``. ``min_coverage_pct`` turns a day below that coverage into the no-data figure.

Style (titles with date and zone, units on every axis, local time axes, tier / state / device-class
colors, folding beyond 12 categories) comes from :mod:`gpu_pipeline.lib.plot_style`. Only
``matplotlib.figure.Figure`` is used (Agg), never pyplot. The figures colored by device class take
``day_devices``, the day's device classes (``metrics/gpu_states``), so that a class has one color in
all of them (:func:`~gpu_pipeline.lib.plot_style.device_colors`).
"""

from __future__ import annotations

import datetime as dt
import re
import textwrap
from collections.abc import Callable, Sequence
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm, ListedColormap, LogNorm, Normalize, to_rgb
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from gpu_pipeline.lib import plot_style as S
from gpu_pipeline.lib.allocation import ALL_DEVICES, TOTAL_TIER
from gpu_pipeline.lib.demand import DCR_MAX, EPSILON
from gpu_pipeline.lib.efficiency import (
    BOTTLENECK_PIF,
    EFFICIENT_PIF,
    HIGH_UTIL_PCT,
    IDLE_UTIL_PCT,
    MID_UTIL_PCT,
    MODERATE_PIF,
)
from gpu_pipeline.lib.plot_style import Rendered
from gpu_pipeline.lib.timeutil import day_window

__all__ = [
    "allocation_counts",
    "allocation_distribution",
    "allocation_heatmap",
    "allocation_over_day",
    "availability_durations",
    "daily_dashboard",
    "demand_capacity_panels",
    "efficiency_classes",
    "efficiency_scatter",
    "evictions_by_hour",
    "imbalance_heatmap",
    "rfu_over_day",
    "runtime_to_eviction",
    "time_to_claim",
    "top_contributors",
]

BUCKET_S = 300.0
HOUR_S = 3600.0
TIERS3: tuple[str, ...] = ("priority", "shared", "backfill")
TIERS4: tuple[str, ...] = (*TIERS3, TOTAL_TIER)
#: Above this many points the efficiency scatter becomes a 2-D histogram.
SCATTER_MAX_POINTS = 50_000
CIS_WARNING = 0.5
CIS_CRITICAL = 0.7
DCR_DISPLAY_MIN = 0.01
DCR_DISPLAY_MAX = 100.0
ZERO_DEMAND_COLOR = "#e4e9ef"
DASHBOARD_SIZE_IN = (11.69, 8.27)  # A4 landscape
DASHBOARD_DPI = 150


# ---------------------------------------------------------------------------------------------
# Column access
# ---------------------------------------------------------------------------------------------


def _require(table: pa.Table, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{what}: the table lacks the columns {missing} (has {table.column_names})")


def _times_s(table: pa.Table, name: str) -> np.ndarray:
    """A timestamp column as epoch seconds (float64; null -> NaN)."""
    col = table.column(name).cast(pa.int64())
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=float) / 1e6


def _num(table: pa.Table, name: str) -> np.ndarray:
    """A numeric column as float64 (null -> NaN)."""
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    col = table.column(name)
    if pa.types.is_boolean(col.type):
        col = col.cast(pa.int8())
    return np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=float)


def _epoch_s(table: pa.Table, name: str) -> np.ndarray:
    """A timestamp column as epoch seconds (null -> NaN)."""
    col = table.column(name)
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("us", tz="UTC"), safe=False)
    as_int = pc.cast(col, pa.int64())
    return np.asarray(as_int.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=float) / 1e6


def _codes(table: pa.Table, name: str) -> tuple[np.ndarray, list[str]]:
    """A string column as integer codes (null -> -1) and the distinct values: fast for millions."""
    if name not in table.column_names or table.num_rows == 0:
        return np.full(table.num_rows, -1, dtype=np.int64), []
    arr = table.column(name).combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    idx = pc.fill_null(arr.indices.cast(pa.int64()), -1)
    return np.asarray(idx.to_numpy(zero_copy_only=False), dtype=np.int64), [str(v) for v in arr.dictionary.to_pylist()]


def _strs(table: pa.Table, name: str, null: str = "unknown") -> np.ndarray:
    """A (small) string column as an object array, nulls replaced."""
    if name not in table.column_names:
        return np.full(table.num_rows, null, dtype=object)
    codes, labels = _codes(table, name)
    lut = np.array([*labels, null], dtype=object)
    return lut[np.where(codes < 0, len(labels), codes)]


def _coverage_pct(times_s: np.ndarray, day: dt.date, tz: str, step_s: float) -> float:
    """Share (%) of the day's steps (5-minute buckets, hours) that have at least one row."""
    start, end = S.day_bounds_s(day, tz)
    n = max(1, int(round((end - start) / step_s)))
    t = times_s[np.isfinite(times_s)]
    idx = np.floor((t - start) / step_s + 1e-6).astype(np.int64)
    idx = idx[(idx >= 0) & (idx < n)]
    return 100.0 * np.unique(idx).size / n


def _local_hour(epoch_s: np.ndarray, tz: str) -> np.ndarray:
    """Local hour of day (0-23) of each epoch second; vectorized over 15-minute steps (every
    UTC offset is a multiple of 15 minutes)."""
    out = np.full(epoch_s.shape, -1, dtype=np.int64)
    ok = np.isfinite(epoch_s)
    if not ok.any():
        return out
    q = np.floor(epoch_s[ok] / 900.0).astype(np.int64)
    uniq, inv = np.unique(q, return_inverse=True)
    zone = ZoneInfo(tz)
    hours = np.array([dt.datetime.fromtimestamp(int(u) * 900, zone).hour for u in uniq], dtype=np.int64)
    out[ok] = hours[inv]
    return out


def _coverage_note(coverage: float | None) -> str | None:
    if coverage is None or coverage >= 99.5:
        return None
    return f"partial day: coverage {coverage:.0f} %"


def _wrap_phrases(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken between phrases first (at a " · ",
    which the break replaces, or after a ";"; a line read "white: no" / "data"), inside a phrase
    only where it alone is too long."""
    pieces = re.split(r"(\s+·\s+)", text)  # phrase, separator, phrase, ...
    lines: list[str] = []
    for k in range(0, len(pieces), 2):
        for i, phrase in enumerate(re.split(r"(?<=;) +", pieces[k])):
            joiner = pieces[k - 1] if i == 0 and k else " "
            if lines and len(lines[-1] + joiner + phrase) <= width:
                lines[-1] += joiner + phrase
            else:
                lines.extend(textwrap.wrap(phrase, width) or [""])
    return lines


def _titled(fig, name: str, day: dt.date, tz: str, *notes: str | None) -> None:
    """Figure title with the date and zone; notes joined on a second line, wrapped (between notes
    first, then between a note's phrases) to the figure's width, so that no note runs off the
    figure's edges."""
    width = max(20, int(fig.get_figwidth() * 72 / (S.FS_TITLE * 0.62)))  # characters a line holds
    lines: list[str] = []
    for note in (n for n in notes if n):
        for k, part in enumerate(note.split("\n")):  # a note's own line breaks are kept
            if k == 0 and lines and len(f"{lines[-1]}  ·  {part}") <= width:
                lines[-1] = f"{lines[-1]}  ·  {part}"
            else:
                lines.extend(_wrap_phrases(part, width))
    text = S.title(name, day, tz)
    fig.suptitle("\n".join([text, *lines]), fontsize=S.FS_TITLE)


def _legend_right(ax: Axes, handles, labels=None, title: str | None = None, fontsize: float = S.FS_NOTE):
    """Legend outside the axes on the right (never over the data)."""
    kw = {"handles": handles} if labels is None else {"handles": handles, "labels": labels}
    return ax.legend(**kw, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=fontsize,
                     title=title, title_fontsize=fontsize, frameon=False, borderaxespad=0.0)


def _legend_top(ax: Axes, handles, ncol: int, fontsize: float = S.FS_NOTE):
    """Legend in one band just above the axes (never over the data)."""
    return ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=ncol,
                     fontsize=fontsize, frameon=False, borderaxespad=0.0, handlelength=1.8,
                     columnspacing=1.2)


def _check_coverage(
    name: str, day: dt.date, tz: str, coverage: float | None, min_coverage_pct: float, reason: str
) -> Rendered | None:
    if coverage is not None and min_coverage_pct and coverage < min_coverage_pct:
        return S.no_data(name, day, tz, f"{reason} (below the {min_coverage_pct:.0f} % needed)", coverage)
    return None


def _with_coverage(numbers: dict[str, float], coverage: float | None) -> dict[str, float]:
    if coverage is not None:
        numbers["coverage_pct"] = coverage
    return numbers


# ---------------------------------------------------------------------------------------------
# Allocation (DESIGN.md 5.2)
# ---------------------------------------------------------------------------------------------

_BUCKET_COLS = ("bucket_start_utc", "tier", "device_name", "claimed_gpus", "total_gpus", "allocation_pct")


class _Grid:
    """The allocation buckets of one device (ALL) on the day's 5-minute grid (NaN = not covered)."""

    def __init__(self, buckets: pa.Table, day: dt.date, tz: str, device: str = ALL_DEVICES):
        _require(buckets, _BUCKET_COLS, "allocation_buckets")
        start, end = S.day_bounds_s(day, tz)
        self.n = max(1, int(round((end - start) / BUCKET_S)))
        t = _epoch_s(buckets, "bucket_start_utc")
        self.coverage = _coverage_pct(t, day, tz, BUCKET_S)
        dev = _strs(buckets, "device_name")
        tier = _strs(buckets, "tier")
        idx = np.floor((t - start) / BUCKET_S + 1e-6)
        keep = (dev == device) & np.isfinite(idx) & (idx >= 0) & (idx < self.n)
        idx = idx[keep].astype(np.int64)
        tier = tier[keep]
        claimed = _num(buckets, "claimed_gpus")[keep]
        total = _num(buckets, "total_gpus")[keep]
        pct = _num(buckets, "allocation_pct")[keep]
        self.claimed: dict[str, np.ndarray] = {}
        self.total: dict[str, np.ndarray] = {}
        self.pct: dict[str, np.ndarray] = {}
        self.covered = np.zeros(self.n, dtype=bool)
        self.covered[idx] = True
        for tname in TIERS4:
            m = tier == tname
            c = np.full(self.n, np.nan)
            tt = np.full(self.n, np.nan)
            p = np.full(self.n, np.nan)
            c[idx[m]] = claimed[m]
            tt[idx[m]] = total[m]
            p[idx[m]] = pct[m]
            self.claimed[tname], self.total[tname], self.pct[tname] = c, tt, p
        self.hours = self.n * BUCKET_S / HOUR_S

    @property
    def empty(self) -> bool:
        return not self.covered.any()

    def edges_h(self) -> np.ndarray:
        return np.arange(self.n + 1) * BUCKET_S / HOUR_S

    def mean_pct(self, tier: str) -> float:
        p = self.pct[tier]
        p = p[np.isfinite(p)]
        return float(p.mean()) if p.size else float("nan")

    def mean_count(self, values: np.ndarray) -> float:
        v = values[self.covered]
        v = v[np.isfinite(v)]
        return float(v.mean()) if v.size else float("nan")


def _step(ax: Axes, edges: np.ndarray, y: np.ndarray, **kw):
    """A post-step line over 5-minute bins; NaN bins are gaps."""
    return ax.plot(edges, np.append(y, y[-1] if y.size else np.nan), drawstyle="steps-post", **kw)


def _draw_allocation_lines(ax: Axes, g: _Grid, day: dt.date, tz: str, *, compact: bool = False) -> dict[str, float]:
    edges = g.edges_h()
    numbers: dict[str, float] = {}
    handles = []
    for tier in TIERS4:
        mean = g.mean_pct(tier)
        numbers[f"allocation_pct_{tier}"] = mean
        if not np.isfinite(g.pct[tier]).any():
            continue
        kw = S.tier_style(tier)
        if tier != TOTAL_TIER:
            kw["alpha"] = 0.9
        (line,) = _step(ax, edges, g.pct[tier], zorder=3 if tier == TOTAL_TIER else 2, **kw)
        line.set_label(f"{tier} {mean:.1f} %" if compact else f"{S.TIER_LABELS[tier]}: mean {mean:.1f} %")
        handles.append(line)
    ax.set_ylim(-2, 104)
    S.set_ticks(ax.yaxis, range(0, 101, 20))
    ax.set_ylabel(S.unit_label("allocation", "% of claimable GPUs"), fontsize=S.FS_LABEL)
    S.style_axes(ax, grid="both")
    S.set_time_axis(ax, day, tz)
    _shade_uncovered(ax, g.covered, edges)
    if handles:
        _legend_top(ax, handles, ncol=len(handles))
    return numbers


def _shade_uncovered(ax: Axes, covered: np.ndarray, edges: np.ndarray) -> None:
    """Hatch the buckets without any snapshot (unknown, not zero)."""
    if covered.all() or not covered.any():
        return
    i = 0
    n = covered.size
    while i < n:
        if covered[i]:
            i += 1
            continue
        j = i
        while j < n and not covered[j]:
            j += 1
        ax.axvspan(edges[i], edges[j], facecolor="#f4f4f4", hatch="//", edgecolor="#cccccc", linewidth=0, zorder=0)
        i = j


def allocation_over_day(
    buckets: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None, min_coverage_pct: float = 0.0
) -> Rendered:
    """Allocation % per tier over the day (device ALL): one step line per tier, TOTAL dashed.

    ``numbers``: ``allocation_pct_<tier>`` (mean of the per-bucket % over buckets with capacity,
    as in ``allocation_daily``), ``gpus_total`` (mean TOTAL claimable GPUs), ``coverage_pct``."""
    name = "Allocation by tier"
    g = _Grid(buckets, day, tz)
    coverage = g.coverage if coverage_pct is None else coverage_pct
    if g.empty:
        return S.no_data(name, day, tz, "no allocation bucket in the day", coverage)
    if (r := _check_coverage(name, day, tz, coverage, min_coverage_pct, "too few buckets")) is not None:
        return r
    fig = S.new_figure(12, 4.6)
    ax = fig.add_subplot()
    numbers = _draw_allocation_lines(ax, g, day, tz)
    numbers["gpus_total"] = g.mean_count(g.total[TOTAL_TIER])
    _titled(fig, name, day, tz, f"device ALL, 5-minute buckets; {numbers['gpus_total']:.0f} claimable GPUs "
            "on average", _coverage_note(coverage))
    return S.finish(fig, _with_coverage(numbers, coverage))


def allocation_counts(
    buckets: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None, min_coverage_pct: float = 0.0
) -> Rendered:
    """GPUs claimed vs claimable per tier over the day (device ALL): one panel per tier (priority,
    shared, backfill, TOTAL), claimed GPUs as a solid area, unclaimed capacity as its light tint
    on top (the top edge is the claimable total).

    ``numbers``: ``avg_claimed_gpus_<tier>``, ``avg_total_gpus_<tier>`` (means over covered
    buckets, as in ``allocation_daily``), ``coverage_pct``."""
    name = "GPUs claimed vs claimable by tier"
    g = _Grid(buckets, day, tz)
    coverage = g.coverage if coverage_pct is None else coverage_pct
    if g.empty:
        return S.no_data(name, day, tz, "no allocation bucket in the day", coverage)
    if (r := _check_coverage(name, day, tz, coverage, min_coverage_pct, "too few buckets")) is not None:
        return r
    fig = S.new_figure(12, 8.2)
    axes = fig.subplots(4, 1, sharex=True)
    edges = g.edges_h()
    numbers: dict[str, float] = {}
    for ax, tier in zip(axes, TIERS4, strict=True):
        claimed, total = g.claimed[tier], g.total[tier]
        mc, mt = g.mean_count(claimed), g.mean_count(total)
        numbers[f"avg_claimed_gpus_{tier}"] = mc
        numbers[f"avg_total_gpus_{tier}"] = mt
        x = edges
        c2 = np.append(claimed, claimed[-1])
        t2 = np.append(total, total[-1])
        ok = np.isfinite(c2) & np.isfinite(t2)
        # a covered bucket is filled up to its end edge: with where=ok alone, fill_between fills
        # only between two covered edges, leaving the bucket before a gap (and a lone one) blank
        span = ok.copy()
        span[1:] |= ok[:-1]
        ax.fill_between(x, 0, np.nan_to_num(c2), where=span, step="post", color=S.TIER_COLORS[tier],
                        linewidth=0, label="claimed")
        ax.fill_between(x, np.nan_to_num(c2), np.nan_to_num(t2), where=span, step="post",
                        color=S.TIER_LIGHT_COLORS[tier], linewidth=0, label="unclaimed (idle capacity)")
        ax.plot(x, np.where(ok, t2, np.nan), drawstyle="steps-post", color=S.TIER_COLORS[tier], linewidth=0.8)
        top = np.nanmax(t2) if np.isfinite(t2).any() else 0.0
        ax.set_ylim(0, max(1.0, top * 1.12))
        ax.set_ylabel(S.unit_label("GPUs", "count"), fontsize=S.FS_LABEL)
        S.style_axes(ax)
        ax.yaxis.get_major_locator().set_params(integer=True)
        pct = numbers.get(f"allocation_pct_{tier}", g.mean_pct(tier))
        if np.isfinite(mc) and np.isfinite(mt):
            text = f"{S.TIER_LABELS[tier]}: {mc:.1f} of {mt:.1f} GPUs claimed on average" + (
                f" ({pct:.1f} % mean allocation)" if np.isfinite(pct) else "")
        else:  # a tier without a row in the day (a pool without backfill slots): no count to state
            text = f"{S.TIER_LABELS[tier]}: no data (no row for this tier in the day)"
        ax.set_title(text, loc="left", fontsize=S.FS_PANEL, color=S.TIER_COLORS[tier] if tier != TOTAL_TIER else "black")
        _shade_uncovered(ax, g.covered, edges)
        S.set_time_axis(ax, day, tz, label=ax is axes[-1])
    handles = [Patch(color="#555555", label="claimed GPUs (tier color)"),
               Patch(color=S.lighten("#555555", 0.7), label="unclaimed claimable GPUs (light tint)")]
    axes[0].legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.02), ncol=2, fontsize=S.FS_NOTE,
                   frameon=False, borderaxespad=0.0)
    _titled(fig, name, day, tz, "device ALL, 5-minute buckets", _coverage_note(coverage))
    return S.finish(fig, _with_coverage(numbers, coverage))


def _draw_allocation_heatmap(ax: Axes, daily: pa.Table, *, compact: bool = False) -> dict[str, float]:
    """Device x tier allocation % (rows: ALL first, then devices by size, folded beyond 12)."""
    tier = _strs(daily, "tier")
    dev = _strs(daily, "device_name")
    pct = _num(daily, "allocation_pct")
    claimed = _num(daily, "avg_claimed_gpus")
    total = _num(daily, "avg_total_gpus")
    size = {d: float(np.nansum(total[(dev == d) & (tier == TOTAL_TIER)])) for d in set(dev.tolist()) - {ALL_DEVICES}}
    shown, label_of = S.fold_top(size)
    rows = ([ALL_DEVICES] if ALL_DEVICES in set(dev.tolist()) else []) + shown
    mat = np.full((len(rows), len(TIERS4)), np.nan)
    c_mat = np.full_like(mat, np.nan)
    t_mat = np.full_like(mat, np.nan)
    for i, row in enumerate(rows):
        for j, tname in enumerate(TIERS4):
            if row == S.OTHER:
                m = (tier == tname) & np.array([label_of.get(d) == S.OTHER for d in dev], dtype=bool)
                cs, ts = np.nansum(claimed[m]), np.nansum(total[m])
                if m.any():
                    c_mat[i, j], t_mat[i, j] = cs, ts
                    mat[i, j] = 100.0 * cs / ts if ts > 0 else np.nan
                continue
            m = (tier == tname) & (dev == row)
            if m.any():
                k = np.flatnonzero(m)[0]
                mat[i, j], c_mat[i, j], t_mat[i, j] = pct[k], claimed[k], total[k]
    cmap = ListedColormap(_sequential(256)).with_extremes(bad="#eeeeee")
    im = ax.imshow(np.ma.masked_invalid(mat), aspect="auto", cmap=cmap, vmin=0, vmax=100, interpolation="nearest")
    fs = S.FS_NOTE if compact else (S.FS_LABEL if len(rows) <= 8 else S.FS_NOTE)
    cells: tuple[list, list, list, list] = ([], [], [], [])
    for i in range(len(rows)):
        for j in range(len(TIERS4)):
            v = mat[i, j]
            if np.isfinite(v):
                color = S.text_color_for(cmap(v / 100.0))
                text = f"{v:.0f} %" if compact else f"{v:.1f} %\n{c_mat[i, j]:.1f} / {t_mat[i, j]:.1f}"
            else:
                color, text = "#777777", "—" if not np.isfinite(t_mat[i, j]) else "no GPUs"
            for lst, item in zip(cells, (j, i, text, {"color": color, "fontweight": "bold" if rows[i] == ALL_DEVICES
                                                      else "normal"}), strict=True):
                lst.append(item)
    S.texts(ax, *cells, ha="center", va="center", fontsize=fs)
    S.set_ticks(ax.xaxis, range(len(TIERS4)), [t if compact else S.TIER_LABELS[t].replace(" (", "\n(") for t in TIERS4],
                fontsize=S.FS_NOTE if compact else S.FS_TICK, styles=[{"color": S.TIER_COLORS[t]} for t in TIERS4])
    ylabels = []
    for row in rows:
        if row == S.OTHER:
            n_other = sum(1 for v in label_of.values() if v == S.OTHER)
            ylabels.append(f"other ({n_other} classes)")
        else:
            n = size.get(row, float(np.nansum(total[(dev == row) & (tier == TOTAL_TIER)])))
            ylabels.append(f"{S.short_device(row)} ({n:.0f})" if not compact else S.short_device(row))
    S.set_ticks(ax.yaxis, range(len(rows)), ylabels, fontsize=S.FS_TICK)
    if rows and rows[0] == ALL_DEVICES and len(rows) > 1:
        ax.axhline(0.5, color="white", linewidth=3)
    ax.tick_params(length=0)
    for sp in ax.spines.values():
        sp.set_visible(False)
    ax.set_xlabel("tier", fontsize=S.FS_LABEL)
    ax.set_ylabel("device class" + ("" if compact else " (mean claimable GPUs)"), fontsize=S.FS_LABEL)
    cb = ax.figure.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    cb.set_label(S.unit_label("allocation", "%"), fontsize=S.FS_LABEL)
    cb.ax.tick_params(labelsize=S.FS_TICK)
    numbers = {}
    if ALL_DEVICES in rows:
        for j, tname in enumerate(TIERS4):
            numbers[f"allocation_pct_{tname}"] = mat[0, j]
    numbers["devices"] = float(len(size))
    return numbers


def _sequential(n: int) -> list:
    """White-to-blue-green ramp (allocation: pale = idle capacity, dark = busy)."""
    base = colormaps["YlGnBu"]
    return [base(0.05 + 0.9 * i / (n - 1)) for i in range(n)]


def _daily_coverage(daily: pa.Table) -> float | None:
    tier = _strs(daily, "tier")
    dev = _strs(daily, "device_name")
    m = (tier == TOTAL_TIER) & (dev == ALL_DEVICES)
    if not m.any():
        return None
    b, e = _num(daily, "buckets")[m][0], _num(daily, "buckets_expected")[m][0]
    return 100.0 * b / e if np.isfinite(b) and np.isfinite(e) and e > 0 else None


def allocation_heatmap(
    daily: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None, min_coverage_pct: float = 0.0
) -> Rendered:
    """Device class x tier heatmap of the daily allocation % (``allocation_daily``), the value,
    mean claimed / claimable GPUs written in each cell; the ALL row first, device classes by size
    (more than 12 folded into "other" = sum claimed / sum claimable).

    ``numbers``: ``allocation_pct_<tier>`` of device ALL, ``devices``, ``coverage_pct``."""
    name = "Allocation by device and tier"
    _require(daily, ("tier", "device_name", "allocation_pct", "avg_claimed_gpus", "avg_total_gpus"), "allocation_daily")
    coverage = _daily_coverage(daily) if coverage_pct is None else coverage_pct
    if daily.num_rows == 0:
        return S.no_data(name, day, tz, "no allocation_daily row for the day", 0.0 if coverage is None else coverage)
    if (r := _check_coverage(name, day, tz, coverage, min_coverage_pct, "too few buckets")) is not None:
        return r
    n_rows = min(len(set(_strs(daily, "device_name").tolist())), S.MAX_CATEGORIES + 2)
    fig = S.new_figure(9, 1.6 + 0.55 * n_rows)
    ax = fig.add_subplot()
    numbers = _draw_allocation_heatmap(ax, daily)
    _titled(fig, name, day, tz, "mean allocation % of the 5-minute buckets; cells: % and mean claimed / claimable GPUs",
            _coverage_note(coverage))
    return S.finish(fig, _with_coverage(numbers, coverage))


def _draw_allocation_distribution(ax: Axes, g: _Grid, *, compact: bool = False) -> dict[str, float]:
    data, pos, tiers = [], [], []
    for i, tier in enumerate(TIERS4):
        p = g.pct[tier]
        p = p[np.isfinite(p)]
        if p.size:
            data.append(p)
            pos.append(i)
            tiers.append(tier)
    numbers: dict[str, float] = {}
    if not data:
        ax.text(0.5, 0.5, "no bucket with capacity", transform=ax.transAxes, ha="center", va="center")
        return numbers
    violins = [(d, p) for d, p in zip(data, pos, strict=True) if np.unique(d).size > 1]
    if violins:
        parts = ax.violinplot([d for d, _ in violins], positions=[p for _, p in violins], widths=0.8,
                              showextrema=False)
        for body, (_, p) in zip(parts["bodies"], violins, strict=True):
            t = TIERS4[p]
            body.set_facecolor(S.TIER_LIGHT_COLORS[t])
            body.set_edgecolor(S.TIER_COLORS[t])
            body.set_alpha(1.0)
            body.set_linewidth(0.8)
    bp = ax.boxplot(data, positions=pos, widths=0.18, patch_artist=True, showfliers=False,
                    medianprops={"color": "white", "linewidth": 1.6}, whiskerprops={"linewidth": 1.0},
                    capprops={"linewidth": 1.0})
    for box, t in zip(bp["boxes"], tiers, strict=True):
        box.set_facecolor(S.TIER_COLORS[t])
        box.set_edgecolor(S.TIER_COLORS[t])
    means = [float(d.mean()) for d in data]
    ax.scatter(pos, means, marker="D", s=18, color="white", edgecolor="black", zorder=4, linewidth=0.7)
    for d, p, t, mean in zip(data, pos, tiers, means, strict=True):
        numbers[f"median_allocation_pct_{t}"] = float(np.median(d))
        numbers[f"allocation_pct_{t}"] = mean
        if not compact:
            ax.text(p + 0.12, mean, f" mean {mean:.1f} %", va="center", fontsize=S.FS_NOTE)
    S.set_ticks(ax.xaxis, range(len(TIERS4)), [t if compact else S.TIER_LABELS[t].replace(" (", "\n(") for t in TIERS4],
                fontsize=S.FS_TICK, styles=[{"color": S.TIER_COLORS[t]} for t in TIERS4])
    ax.set_xlim(-0.6, len(TIERS4) - 0.4)
    ax.set_ylim(-3, 103)
    ax.set_ylabel(S.unit_label("allocation per 5-min bucket", "%"), fontsize=S.FS_LABEL)
    ax.set_xlabel("tier", fontsize=S.FS_LABEL)
    S.style_axes(ax)
    return numbers


def allocation_distribution(
    buckets: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None, min_coverage_pct: float = 0.0
) -> Rendered:
    """Distribution of the per-bucket allocation % per tier (device ALL): violin (shape), box
    (quartiles, whiskers 1.5 IQR, white median line) and the mean (diamond).

    ``numbers``: ``median_allocation_pct_<tier>``, ``allocation_pct_<tier>`` (mean), ``coverage_pct``."""
    name = "Allocation distribution by tier"
    g = _Grid(buckets, day, tz)
    coverage = g.coverage if coverage_pct is None else coverage_pct
    if g.empty:
        return S.no_data(name, day, tz, "no allocation bucket in the day", coverage)
    if (r := _check_coverage(name, day, tz, coverage, min_coverage_pct, "too few buckets")) is not None:
        return r
    fig = S.new_figure(8, 5)
    ax = fig.add_subplot()
    numbers = _draw_allocation_distribution(ax, g)
    _titled(fig, name, day, tz, "device ALL; one value per 5-minute bucket with capacity", _coverage_note(coverage))
    return S.finish(fig, _with_coverage(numbers, coverage))


def _draw_hourly_count_bars(ax: Axes, g: _Grid, day: dt.date, tz: str) -> None:
    """Per local hour and tier: mean claimed GPUs (solid) and unclaimed capacity (tint) stacked."""
    per_hour = int(HOUR_S / BUCKET_S)
    n_h = int(np.ceil(g.n / per_hour))
    width = 0.8 / len(TIERS3)
    for k, tier in enumerate(TIERS3):
        c = np.full(n_h, np.nan)
        t = np.full(n_h, np.nan)
        for h in range(n_h):
            sl = slice(h * per_hour, min(g.n, (h + 1) * per_hour))
            cov = g.covered[sl]
            # a tier without a row in a covered hour (a pool without backfill) draws no bar either
            cs, ts = g.claimed[tier][sl][cov], g.total[tier][sl][cov]
            if np.isfinite(cs).any():
                c[h] = np.nanmean(cs)
            if np.isfinite(ts).any():
                t[h] = np.nanmean(ts)
        x = np.arange(n_h) + 0.1 + width * (k + 0.5)
        # an hour without any snapshot draws no bar (unknown, hatched below), not a bar of 0 GPUs
        S.bars(ax, x, c, width * 0.95, color=S.TIER_COLORS[tier])
        S.bars(ax, x, t - c, width * 0.95, c, color=S.TIER_LIGHT_COLORS[tier])
    _shade_uncovered(ax, g.covered, g.edges_h())
    ax.set_ylabel(S.unit_label("GPUs, hourly mean", "count"), fontsize=S.FS_LABEL)
    S.style_axes(ax)
    S.set_time_axis(ax, day, tz)
    handles = [Patch(color=S.TIER_COLORS[t], label=f"{t} claimed") for t in TIERS3]
    handles += [Patch(color=S.lighten("#555555", 0.7), label="unclaimed (tint)")]
    _legend_top(ax, handles, ncol=4)


def _draw_state_share(ax: Axes, states: pa.Table | None) -> dict[str, float]:
    """One 100 % bar of the GPU-bucket share of each state (DESIGN.md 5.1 palette), legend below."""
    numbers: dict[str, float] = {}
    ax.set_yticks([])
    for sp in ("top", "right", "left"):
        ax.spines[sp].set_visible(False)
    ax.set_xlim(0, 100)
    ax.set_xlabel(S.unit_label("share of GPU x 5-minute buckets", "%"), fontsize=S.FS_LABEL)
    ax.tick_params(labelsize=S.FS_TICK)
    ax.set_ylim(-0.5, 0.5)
    ax.set_title("GPU state share over the day", loc="left", fontsize=S.FS_PANEL)
    if states is None or states.num_rows == 0 or "state" not in states.column_names:
        ax.text(50, 0, "no GPU state data", ha="center", va="center", fontsize=S.FS_LABEL, color="#777777")
        return numbers
    codes, labels = _codes(states, "state")
    counts = np.bincount(codes[codes >= 0], minlength=len(labels))
    total = counts.sum()
    left = 0.0
    handles = []
    for s in S.STATES:
        share = float(counts[labels.index(s)]) / total if s in labels and total else 0.0
        numbers[f"share_{s}"] = share
        handles.append(Patch(facecolor=S.STATE_COLORS[s], edgecolor="#888888", linewidth=0.5,
                             label=f"{S.STATE_LABELS[s]} {100 * share:.1f} %"))
        if share <= 0:
            continue
        ax.barh(0, 100 * share, left=left, color=S.STATE_COLORS[s], edgecolor="white", linewidth=0.8, height=0.8)
        if share >= 0.03:
            ax.text(left + 50 * share, 0, f"{100 * share:.0f} %" if share < 0.12 else
                    f"{S.STATE_LABELS[s].split(' / ')[0]} {100 * share:.1f} %",
                    ha="center", va="center", fontsize=S.FS_NOTE, color="black", in_layout=False)
        left += 100 * share
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.55), ncol=4, fontsize=S.FS_NOTE,
              frameon=False, borderaxespad=0.0, handlelength=1.2)
    return numbers


def daily_dashboard(
    buckets: pa.Table,
    daily: pa.Table,
    states: pa.Table | None,
    day: dt.date,
    tz: str,
    *,
    coverage_pct: float | None = None,
    min_coverage_pct: float = 0.0,
) -> Rendered:
    """The daily allocation report on one A4-landscape page: allocation % over the day per tier,
    the device x tier heatmap, hourly claimed / claimable GPUs per tier, the per-bucket
    distribution, and the share of each GPU state (``metrics/gpu_states``) as one bar.

    ``numbers``: ``allocation_pct_<tier>`` (device ALL), ``gpus_total``, ``share_<state>``,
    ``coverage_pct``."""
    name = "Daily GPU allocation report"
    g = _Grid(buckets, day, tz)
    coverage = g.coverage if coverage_pct is None else coverage_pct
    if g.empty and daily.num_rows == 0:
        return S.no_data(name, day, tz, "no allocation data in the day", coverage)
    if (r := _check_coverage(name, day, tz, coverage, min_coverage_pct, "too few buckets")) is not None:
        return r
    fig = S.new_figure(*DASHBOARD_SIZE_IN)
    gs = fig.add_gridspec(3, 2, height_ratios=[1.0, 1.0, 0.36], width_ratios=[1.7, 1.0])
    ax_line = fig.add_subplot(gs[0, 0])
    ax_bar = fig.add_subplot(gs[1, 0], sharex=ax_line)
    ax_heat = fig.add_subplot(gs[0, 1])
    ax_dist = fig.add_subplot(gs[1, 1])
    ax_state = fig.add_subplot(gs[2, :])
    numbers: dict[str, float] = {}
    if not g.empty:
        numbers.update(_draw_allocation_lines(ax_line, g, day, tz, compact=True))
        ax_line.set_xlabel("")
        _draw_hourly_count_bars(ax_bar, g, day, tz)
        _draw_allocation_distribution(ax_dist, g, compact=True)
        numbers["gpus_total"] = g.mean_count(g.total[TOTAL_TIER])
    else:
        for ax in (ax_line, ax_bar, ax_dist):
            ax.axis("off")
            ax.text(0.5, 0.5, "no allocation buckets", transform=ax.transAxes, ha="center")
    ax_line.set_title("Allocation % per tier (device ALL, 5-minute buckets)", loc="left", fontsize=S.FS_PANEL, pad=16)
    ax_bar.set_title("GPUs claimed (solid) vs claimable (solid + tint) per hour", loc="left",
                     fontsize=S.FS_PANEL, pad=16)
    ax_dist.set_title("Per-bucket allocation %", loc="left", fontsize=S.FS_PANEL)
    if daily.num_rows:
        heat = _draw_allocation_heatmap(ax_heat, daily, compact=True)
        for k, v in heat.items():
            numbers.setdefault(k, v)
        ax_heat.set_xlabel("")
    else:
        ax_heat.axis("off")
        ax_heat.text(0.5, 0.5, "no daily allocation rows", transform=ax_heat.transAxes, ha="center")
    ax_heat.set_title("Mean allocation % by device", loc="left", fontsize=S.FS_PANEL)
    numbers.update(_draw_state_share(ax_state, states))
    key = "  ·  ".join(
        f"{t} {numbers[f'allocation_pct_{t}']:.1f} %" for t in TIERS4
        if np.isfinite(numbers.get(f"allocation_pct_{t}", np.nan))
    )
    gpus = numbers.get("gpus_total")
    _titled(fig, name, day, tz, key + (f"  ·  {gpus:.0f} claimable GPUs" if gpus and np.isfinite(gpus) else ""),
            _coverage_note(coverage))
    return S.finish(fig, _with_coverage(numbers, coverage), dpi=DASHBOARD_DPI)


# ---------------------------------------------------------------------------------------------
# Availability periods (DESIGN.md 5.3) and evictions (5.4): duration distributions
# ---------------------------------------------------------------------------------------------


def _device_groups(devices: np.ndarray, weights: np.ndarray | None = None) -> tuple[list[str], np.ndarray]:
    """Device labels folded to at most 12 (+ other) by row count (or ``weights``); returns the
    labels to draw and the label of each row."""
    w: dict[str, float] = {}
    for d, x in zip(devices.tolist(), (np.ones(devices.size) if weights is None else weights).tolist(), strict=True):
        w[d] = w.get(d, 0.0) + (x if np.isfinite(x) else 0.0)
    shown, label_of = S.fold_top(w)
    return shown, np.array([label_of[d] for d in devices.tolist()], dtype=object)


def _fold_codes(codes: np.ndarray, labels: list[str], weights: np.ndarray) -> tuple[list[str], np.ndarray, int]:
    """Like :func:`_device_groups` on integer codes (null = -1 -> "unknown"): the labels to draw
    (at most 12 + "other"), each row's index into them, and how many labels were folded."""
    names = [*labels, "unknown"]
    c = np.where(codes < 0, len(labels), codes)
    w = np.bincount(c, weights=weights, minlength=len(names))
    present = np.bincount(c, minlength=len(names)) > 0
    shown, label_of = S.fold_top({names[i]: float(w[i]) for i in range(len(names)) if present[i]})
    pos = {lab: k for k, lab in enumerate(shown)}
    lut = np.array([pos.get(label_of.get(n, S.OTHER), 0) for n in names], dtype=np.int64)
    return shown, lut[c], sum(1 for v in label_of.values() if v == S.OTHER)


def _log_bins(lo: float, hi: float, n: int, min_width: float) -> np.ndarray:
    """Log-spaced bin edges from ``lo`` to ``hi``, each bin at least ``min_width`` wide: durations
    measured from 5-minute snapshots are multiples of ~5 minutes, and narrower bins would show
    empty gaps between those values."""
    ratio = (hi / lo) ** (1.0 / n)
    edges = [lo]
    while edges[-1] < hi:
        edges.append(max(edges[-1] * ratio, edges[-1] + min_width))
    return np.array(edges)


def _duration_figure(
    minutes: np.ndarray, devices: np.ndarray, name: str, day: dt.date, tz: str, quantity: str,
    note: str, *, histogram: bool = True, day_devices: Sequence[str] = (),
) -> tuple[object, dict[str, float]]:
    """Histogram (stacked by device class, log bins) and ECDF per device class + ALL, log x."""
    shown, label = _device_groups(devices)
    colors = S.device_colors(shown, day_devices)
    lo = max(0.5, float(np.nanmin(minutes)) * 0.8)
    hi = max(lo * 2, float(np.nanmax(minutes)) * 1.25)
    fig = S.new_figure(13 if histogram else 9.5, 4.8)
    axes = fig.subplots(1, 2 if histogram else 1, squeeze=False)[0]
    if histogram:
        ax = axes[0]
        bins = _log_bins(lo, hi, 24, min_width=BUCKET_S / 60.0)
        bottom = np.zeros(bins.size - 1)
        for d in shown:  # stacked histogram, one collection per device class
            counts = np.histogram(minutes[label == d], bins=bins)[0].astype(float)
            S.bars(ax, bins[:-1], counts, np.diff(bins), bottom, align="edge", color=colors[d], edgecolor="white",
                   linewidth=0.4)
            bottom += counts
        S.set_log_minutes_axis(ax, lo, hi, quantity)
        ax.set_ylabel(S.unit_label("count", "per bin"), fontsize=S.FS_LABEL)
        S.style_axes(ax)
        ax.set_title("histogram, stacked by device class", loc="left", fontsize=S.FS_PANEL)
    ax = axes[-1]
    handles = []
    for d in shown:
        x, y = S.ecdf(minutes[label == d])
        if x.size == 0:
            continue
        (ln,) = ax.step(np.r_[lo, x], np.r_[0, y], where="post", color=colors[d], linewidth=1.1, alpha=0.9)
        ln.set_label(f"{S.short_device(d)} (n={x.size}, median {np.median(x):.0f} min)")
        handles.append(ln)
    x, y = S.ecdf(minutes)
    (ln,) = ax.step(np.r_[lo, x], np.r_[0, y], where="post", color="black", linewidth=2.2)
    ln.set_label(f"ALL (n={x.size}, median {np.median(x):.0f} min)")
    handles.insert(0, ln)
    for q in (0.5, 0.9):
        ax.axhline(q, color="#999999", linewidth=0.6, linestyle=":")
        ax.text(lo, q, f" p{q * 100:.0f}", va="bottom", ha="left", fontsize=S.FS_NOTE, color="#777777",
                in_layout=False)
    S.set_log_minutes_axis(ax, lo, hi, quantity)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel(S.unit_label("cumulative share", "0-1"), fontsize=S.FS_LABEL)
    S.style_axes(ax, grid="both")
    ax.set_title("ECDF by device class", loc="left", fontsize=S.FS_PANEL)
    _legend_right(ax, handles, title="device class")
    _titled(fig, name, day, tz, note)
    numbers = {
        "count": float(minutes.size),
        "median_min": float(np.median(minutes)),
        "p90_min": float(np.percentile(minutes, 90)),
        "mean_min": float(np.mean(minutes)),
    }
    return fig, numbers


def availability_durations(
    periods: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None,
    day_devices: Sequence[str] = (),
) -> Rendered:
    """Durations of the backfill availability periods that ended in the day (not ``open``),
    histogram and ECDF by device class, log x in minutes. ``periods``: the whole periods that end in
    the day (:func:`~gpu_pipeline.lib.availability.whole_periods_ending`, as the summary takes
    them); one still cut off by the first day read (``starts_before_day``) is a lower bound. The
    day's own pieces may be given instead (a piece that began before midnight then counted from it).

    ``numbers``: ``count``, ``median_min``, ``p90_min``, ``mean_min``, ``open_at_day_end``,
    ``available_gpu_hours`` (all pieces, open ones included)."""
    name = "Backfill availability period durations"
    _require(periods, ("duration_s", "end_reason", "device_name"), "availability_periods")
    dur = _num(periods, "duration_s")
    reason = _strs(periods, "end_reason")
    ended = (reason != "open") & np.isfinite(dur) & (dur > 0)
    if not ended.any():
        msg = "no availability period ended in the day"
        if periods.num_rows:
            msg += f" ({periods.num_rows} still open at the day end)"
        return S.no_data(name, day, tz, msg, coverage_pct)
    truncated = np.asarray(_num(periods, "starts_before_day") == 1)[ended].sum()
    note = (f"{int(ended.sum())} periods ended in the day; {int((reason == 'open').sum())} still open at the "
            f"day end (not shown); {int(truncated)} began before the days read (lower bounds)")
    fig, numbers = _duration_figure(dur[ended] / 60.0, _strs(periods, "device_name")[ended], name, day, tz,
                                    "period duration", note, day_devices=day_devices)
    numbers["open_at_day_end"] = float((reason == "open").sum())
    # the day's own hours: each period clipped to the day (a whole period may reach back a week)
    s, e = day_window(day.isoformat(), tz)
    start = _times_s(periods, "start_utc")
    end = _times_s(periods, "end_utc")
    numbers["available_gpu_hours"] = float(np.nansum(np.clip(np.minimum(end, e.timestamp())
                                                             - np.maximum(start, s.timestamp()), 0, None)) / HOUR_S)
    return S.finish(fig, _with_coverage(numbers, coverage_pct))


def time_to_claim(
    periods: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None, day_devices: Sequence[str] = ()
) -> Rendered:
    """Time from a GPU becoming available to a backfill job claiming it: durations of the periods
    that ended ``backfill_claimed``, histogram and ECDF by device class (log x, minutes).
    ``periods`` as :func:`availability_durations` takes them (the whole periods that end in the day:
    a GPU idle from 23:05 and claimed at 00:30 waited 85 minutes, not 30).

    ``numbers``: ``count`` (claims), ``median_min``, ``p90_min``, ``mean_min``,
    ``claimed_share`` (claims / periods that ended in the day)."""
    name = "Time to backfill claim"
    _require(periods, ("duration_s", "end_reason", "device_name"), "availability_periods")
    dur = _num(periods, "duration_s")
    reason = _strs(periods, "end_reason")
    claimed = (reason == "backfill_claimed") & np.isfinite(dur) & (dur > 0)
    ended = int(((reason != "open") & np.isfinite(dur)).sum())
    if not claimed.any():
        msg = "no backfill job claimed an available GPU in the day"
        if ended:
            msg += f" ({ended} periods ended otherwise)"
        return S.no_data(name, day, tz, msg, coverage_pct)
    n = int(claimed.sum())
    note = f"{n} of {ended} ended periods ended with a backfill claim ({100.0 * n / max(ended, 1):.0f} %)"
    truncated = int(np.asarray(_num(periods, "starts_before_day") == 1)[claimed].sum())
    if truncated:
        note += f"; {truncated} began before the days read (lower bounds)"
    fig, numbers = _duration_figure(dur[claimed] / 60.0, _strs(periods, "device_name")[claimed], name, day, tz,
                                    "time to claim", note, day_devices=day_devices)
    numbers["claimed_share"] = n / max(ended, 1)
    return S.finish(fig, _with_coverage(numbers, coverage_pct))


def runtime_to_eviction(
    evictions: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None, day_devices: Sequence[str] = ()
) -> Rendered:
    """ECDF of the runtime of backfill runs before their eviction, by device class (log x in
    minutes). Runtimes that are lower bounds (run already going at the first snapshot read) are
    counted and noted.

    ``numbers``: ``count``, ``median_min``, ``p90_min``, ``mean_min``, ``lower_bound_runtimes``."""
    name = "Runtime before eviction"
    _require(evictions, ("runtime_s", "device_name"), "evictions")
    rt = _num(evictions, "runtime_s")
    ok = np.isfinite(rt) & (rt > 0)
    if not ok.any():
        msg = "no eviction in the day" if evictions.num_rows == 0 else "no eviction with a known runtime"
        return S.no_data(name, day, tz, msg, coverage_pct)
    lb = int(np.nansum(_num(evictions, "runtime_is_lower_bound")[ok] == 1))
    note = f"{int(ok.sum())} evictions" + (f"; {lb} runtimes are lower bounds" if lb else "")
    fig, numbers = _duration_figure(rt[ok] / 60.0, _strs(evictions, "device_name")[ok], name, day, tz,
                                    "runtime before eviction", note, histogram=False, day_devices=day_devices)
    numbers["lower_bound_runtimes"] = float(lb)
    return S.finish(fig, _with_coverage(numbers, coverage_pct))


def evictions_by_hour(
    evictions: pa.Table, rates: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None,
    day_devices: Sequence[str] = (),
) -> Rendered:
    """Evictions (top) and lost GPU-hours (bottom) by local hour of day, stacked by device class;
    the top panel also draws the eviction rate per backfill GPU-hour (``eviction_rates``, device
    and tier ALL) on its right axis.

    ``numbers``: ``evictions``, ``lost_gpu_hours``, ``backfill_gpu_hours``,
    ``evictions_per_backfill_gpu_hour``, ``peak_hour`` (local hour with most evictions)."""
    name = "Backfill evictions by hour"
    _require(evictions, ("evicted_utc", "device_name", "lost_gpu_hours"), "evictions")
    rate_hour = np.full(24, np.nan)
    bf_hours = np.full(24, np.nan)
    day_rate = day_bf = np.nan
    if rates.num_rows and {"device_name", "tier", "hour_local"} <= set(rates.column_names):
        rdev, rtier = _strs(rates, "device_name"), _strs(rates, "tier")
        hl = _num(rates, "hour_local")
        allrow = (rdev == "ALL") & (rtier == "ALL")
        rr, bh = _num(rates, "evictions_per_backfill_gpu_hour"), _num(rates, "backfill_gpu_hours")
        for k in np.flatnonzero(allrow):
            if np.isfinite(hl[k]) and 0 <= hl[k] < 24:
                rate_hour[int(hl[k])], bf_hours[int(hl[k])] = rr[k], bh[k]
            elif not np.isfinite(hl[k]):
                day_rate, day_bf = rr[k], bh[k]
    if evictions.num_rows == 0 and not np.isfinite(bf_hours).any():
        return S.no_data(name, day, tz, "no eviction and no backfill hours in the day", coverage_pct)
    hour = _local_hour(_epoch_s(evictions, "evicted_utc"), tz)
    lost = _num(evictions, "lost_gpu_hours")
    shown, label = _device_groups(_strs(evictions, "device_name")) if evictions.num_rows else ([], np.array([]))
    colors = S.device_colors(shown, day_devices)
    fig = S.new_figure(12, 7)
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    x = np.arange(24)
    bottom1 = np.zeros(24)
    bottom2 = np.zeros(24)
    handles = []
    for d in shown:
        m = label == d
        cnt = np.bincount(hour[m & (hour >= 0)], minlength=24)[:24].astype(float)
        lg = np.bincount(hour[m & (hour >= 0)], weights=np.nan_to_num(lost[m & (hour >= 0)]), minlength=24)[:24]
        S.bars(ax1, x, cnt, 0.8, bottom1, color=colors[d])
        S.bars(ax2, x, lg, 0.8, bottom2, color=colors[d])
        bottom1 += cnt
        bottom2 += lg
        handles.append(Patch(color=colors[d], label=f"{S.short_device(d)} ({int(m.sum())})"))
    for ax in (ax1, ax2):
        S.style_axes(ax)
        S.set_hour_of_day_axis(ax, tz, label=ax is ax2)
    ax1.set_ylabel(S.unit_label("evictions", "count"), fontsize=S.FS_LABEL)
    ax1.yaxis.get_major_locator().set_params(integer=True)
    ax1.set_ylim(0, max(1.0, bottom1.max() * 1.15))
    ax2.set_ylabel(S.unit_label("lost work", "GPU-hours"), fontsize=S.FS_LABEL)
    ax2.set_ylim(0, max(0.1, bottom2.max() * 1.15))
    if np.isfinite(rate_hour).any():
        tw = ax1.twinx()
        tw.plot(x, rate_hour, color="black", marker="o", markersize=3, linewidth=1.0)
        tw.set_ylabel(S.unit_label("eviction rate", "per backfill GPU-hour"), fontsize=S.FS_LABEL)
        tw.tick_params(labelsize=S.FS_TICK)
        tw.set_ylim(0, max(0.05, np.nanmax(rate_hour) * 1.15))
        tw.spines["top"].set_visible(False)
        handles.append(Line2D([], [], color="black", marker="o", markersize=3, label="rate per backfill GPU-hour"))
    if evictions.num_rows == 0:
        ax1.text(0.5, 0.5, "no eviction in the day", transform=ax1.transAxes, ha="center", color="#777777")
    ax1.set_title("evictions per hour, stacked by device class", loc="left", fontsize=S.FS_PANEL)
    ax2.set_title("lost GPU-hours (badput) per hour", loc="left", fontsize=S.FS_PANEL)
    if handles:
        _legend_right(ax2, handles, title="device class (evictions)")
    total_lost = float(np.nansum(lost))
    n_ev = float(evictions.num_rows)
    bf_total = day_bf if np.isfinite(day_bf) else float(np.nansum(bf_hours))
    _titled(fig, name, day, tz, f"{int(n_ev)} evictions, {total_lost:.1f} lost GPU-hours"
            + (f", {bf_total:.0f} backfill GPU-hours" if np.isfinite(bf_total) and bf_total > 0 else ""))
    numbers = {"evictions": n_ev, "lost_gpu_hours": total_lost, "backfill_gpu_hours": bf_total,
               "evictions_per_backfill_gpu_hour": day_rate if np.isfinite(day_rate) else (
                   n_ev / bf_total if bf_total and np.isfinite(bf_total) else np.nan)}
    if n_ev:
        numbers["peak_hour"] = float(np.argmax(bottom1))
    return S.finish(fig, _with_coverage(numbers, coverage_pct))


# ---------------------------------------------------------------------------------------------
# Efficiency (DESIGN.md 5.5)
# ---------------------------------------------------------------------------------------------


def _class_codes(util: np.ndarray, pif: np.ndarray) -> np.ndarray:
    """The seed classification, vectorized: index into plot_style.CLASS_ORDER (-1 = no class)."""
    out = np.full(util.shape, -1, dtype=np.int64)
    idx = {c: i for i, c in enumerate(S.CLASS_ORDER)}
    has_u, has_p = np.isfinite(util), np.isfinite(pif)
    out[has_u & has_p] = idx["Inefficient"]
    out[has_u & has_p & (util >= MID_UTIL_PCT) & (pif >= MODERATE_PIF)] = idx["Moderate"]
    out[has_u & has_p & (util >= HIGH_UTIL_PCT) & (pif < BOTTLENECK_PIF)] = idx["Bottlenecked"]
    out[has_u & has_p & (util >= HIGH_UTIL_PCT) & (pif >= EFFICIENT_PIF)] = idx["Efficient"]
    out[has_u & (util < IDLE_UTIL_PCT)] = idx["Idle"]
    return out


def _hourly_coverage(hourly: pa.Table, day: dt.date, tz: str) -> float | None:
    if "hour_start_utc" not in hourly.column_names:
        return None
    return _coverage_pct(_epoch_s(hourly, "hour_start_utc"), day, tz, HOUR_S)


def _draw_class_regions(ax: Axes) -> None:
    """Shade the class regions of the util x PIF plane and draw the thresholds."""
    u = np.linspace(0, 100, 401)
    p = np.linspace(0, 1, 401)
    uu, pp = np.meshgrid(u, p)
    codes = _class_codes(uu, pp)
    colors = [S.lighten(S.CLASS_COLORS[c], 0.88) for c in S.CLASS_ORDER]
    cmap = ListedColormap(colors)
    norm = BoundaryNorm(np.arange(len(colors) + 1) - 0.5, cmap.N)
    ax.imshow(codes, origin="lower", extent=(0, 100, 0, 1), aspect="auto", cmap=cmap, norm=norm,
              interpolation="nearest", zorder=0)
    for x in (IDLE_UTIL_PCT, MID_UTIL_PCT, HIGH_UTIL_PCT):
        ax.axvline(x, color="#555555", linewidth=0.8, linestyle="--", zorder=3)
        ax.text(x, 1.005, f"{x:g} %", ha="center", va="bottom", fontsize=S.FS_NOTE, color="#555555",
                transform=ax.get_xaxis_transform())
    for y, x0 in ((MODERATE_PIF, MID_UTIL_PCT), (BOTTLENECK_PIF, HIGH_UTIL_PCT), (EFFICIENT_PIF, HIGH_UTIL_PCT)):
        ax.plot([x0, 100], [y, y], color="#555555", linewidth=0.8, linestyle="--", zorder=3)
        ax.text(100.5, y, f"PIF {y:g}", ha="left", va="center", fontsize=S.FS_NOTE, color="#555555",
                clip_on=False)
    # Class names in their regions.
    for cname, (x, y) in {"Idle": (5, 0.5), "Inefficient": (25, 0.9), "Moderate": (55, 0.9),
                          "Efficient": (85, 0.97), "Bottlenecked": (85, 0.25)}.items():
        ax.text(x, y, cname, ha="center", va="center", fontsize=S.FS_NOTE, color="#333333", zorder=5,
                fontstyle="italic", alpha=0.8, in_layout=False)


def efficiency_scatter(
    hourly: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None
) -> Rendered:
    """Utilization vs power-intensity factor per GPU-hour (``gpu_hourly_efficiency``), with the
    class thresholds (util 10 / 40 / 70 %, PIF 0.5 / 0.6 / 0.75) and the class regions shaded.
    Up to 50,000 points: a scatter colored by ``efficiency_class``; above: a 2-D histogram of
    GPU-hours (log colors), so millions of rows draw in well under a second.

    A row is a GPU x hour, sampled for ``coverage_s`` of it: the title counts rows and their sampled
    GPU-hours. A row without utilization or PIF (no power reading) has no point: the title says how
    many rows and sampled GPU-hours are not drawn, and the legend's shares are of all the day's
    sampled GPU-hours, drawn or not, as in :func:`efficiency_classes` ("no class" among them: an
    hour under 10 % utilization is Idle without a power reading, one above has no class).

    ``numbers``: ``points`` (rows drawn), ``gpu_hours`` (sampled GPU-hours of the points),
    ``rows_not_drawn``, ``gpu_hours_not_drawn``, ``share_<class>`` and ``share_no_class`` (when
    any; shares of all sampled GPU-hours, the same as ``efficiency_classes``), ``density`` (1
    when drawn as a histogram), ``coverage_pct``."""
    name = "GPU efficiency: utilization vs power intensity"
    _require(hourly, ("util_pct", "pif"), "gpu_hourly_efficiency")
    coverage = _hourly_coverage(hourly, day, tz) if coverage_pct is None else coverage_pct
    util = _num(hourly, "util_pct")
    pif = _num(hourly, "pif")
    ok = np.isfinite(util) & np.isfinite(pif)
    if not ok.any():
        reason = "no GPU-hour in the day" if hourly.num_rows == 0 else "no GPU-hour with both utilization and power"
        return S.no_data(name, day, tz, reason, 0.0 if hourly.num_rows == 0 and coverage is None else coverage)
    weight = _num(hourly, "coverage_s") / HOUR_S if "coverage_s" in hourly.column_names else np.ones(util.size)
    weight = np.where(np.isfinite(weight), weight, 0.0)
    ccodes, clabels = _codes(hourly, "efficiency_class")
    class_idx = np.full(len(clabels) + 1, -1, dtype=np.int64)
    for i, c in enumerate(clabels):
        class_idx[i] = S.CLASS_ORDER.index(c) if c in S.CLASS_ORDER else -1
    cls = class_idx[np.where(ccodes < 0, len(clabels), ccodes)]
    u, p, w, c = util[ok], np.clip(pif[ok], 0, 1), weight[ok], cls[ok]
    n = int(u.size)
    fig = S.new_figure(10.5, 6.6)
    ax = fig.add_subplot()
    _draw_class_regions(ax)
    density = n > SCATTER_MAX_POINTS
    if density:
        # Cells are 1 % x 1/60 PIF: every class threshold is a cell edge, so each cell lies in one
        # class region. A cell's color is its class color, mixed with white by its log density.
        nu, npf = 100, 60
        h, _, _ = np.histogram2d(np.clip(u, 0, 100), p, bins=(nu, npf), range=((0, 100), (0, 1)), weights=w)
        h = h.T
        filled = h > 0
        vmin = float(h[filled].min()) if filled.any() else 1.0
        vmax = float(h.max()) if filled.any() else 1.0
        norm = LogNorm(vmin=min(vmin, vmax * 0.999), vmax=vmax)
        level = np.zeros(h.shape)
        level[filled] = 0.15 + 0.85 * np.clip(norm(h[filled]), 0, 1)
        cu, cp = np.meshgrid((np.arange(nu) + 0.5), (np.arange(npf) + 0.5) / npf)
        cell_class = _class_codes(cu, cp)
        base = np.array([to_rgb(S.CLASS_COLORS[k]) for k in S.CLASS_ORDER])[cell_class]
        rgba = np.ones((npf, nu, 4))
        rgba[..., :3] = 1.0 - level[..., None] * (1.0 - base * 0.85)
        rgba[..., 3] = filled.astype(float)
        ax.imshow(rgba, origin="lower", extent=(0, 100, 0, 1), aspect="auto", interpolation="nearest", zorder=2)
        sm = ScalarMappable(norm=norm, cmap=colormaps["Greys"])
        cb = fig.colorbar(sm, ax=ax, fraction=0.035, pad=0.01)
        cb.set_label("GPU-hours per cell (log; darker = more)", fontsize=S.FS_LABEL)
        cb.ax.tick_params(labelsize=S.FS_TICK)
    else:
        size = float(np.clip(2000.0 / max(n, 1) ** 0.75, 2, 30))
        alpha = float(np.clip(30.0 / max(n, 1) ** 0.5, 0.15, 0.9))
        # One marker line per class ("no class" first, then the classes in order: the stacking of a
        # scatter sorted by class), each point a disc of area ``size`` pt^2.
        for k in (-1, *range(len(S.CLASS_ORDER))):
            m = (c < 0) if k < 0 else (c == k)
            if m.any():
                ax.plot(u[m], p[m], linestyle="none", marker="o", markersize=size ** 0.5, markeredgewidth=0,
                        color=S.CLASS_COLORS["no class" if k < 0 else S.CLASS_ORDER[k]], alpha=alpha, zorder=2,
                        scalex=False, scaley=False)
    total_w = float(w.sum())
    all_w = float(weight.sum())
    rows_out = int(util.size - n)
    numbers: dict[str, float] = {"points": float(n), "gpu_hours": total_w, "rows_not_drawn": float(rows_out),
                                 "gpu_hours_not_drawn": all_w - total_w, "density": float(density)}
    # shares of all the day's sampled GPU-hours, the rows not drawn included, as efficiency_classes
    # gives them (an hour under 10 % utilization is Idle without a power reading, one above has no
    # class: neither has a PIF to be drawn at)
    per_class = np.bincount(np.where(cls >= 0, cls, len(S.CLASS_ORDER)), weights=weight,
                            minlength=len(S.CLASS_ORDER) + 1)
    handles = []
    for i, cname in enumerate((*S.CLASS_ORDER, "no class")):
        share = float(per_class[i]) / all_w if all_w > 0 else 0.0
        if cname == "no class" and per_class[i] <= 0:
            continue
        numbers[f"share_{cname.replace(' ', '_')}"] = share
        label = f"{cname}: {100 * share:.1f} %" + (  # unless a row without a class label has a point
            " (not drawn: no utilization or power reading)" if cname == "no class" and not (c < 0).any() else "")
        handles.append(Patch(facecolor=S.CLASS_COLORS[cname], edgecolor="#bbbbbb" if cname == "no class" else "none",
                             hatch="///" if cname == "no class" else None, label=label))
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 1)
    ax.set_xlabel(S.unit_label("GPU utilization, hourly mean", "%"), fontsize=S.FS_LABEL)
    ax.set_ylabel(S.unit_label("power intensity factor PIF", "power / max power, 0-1"), fontsize=S.FS_LABEL)
    ax.tick_params(labelsize=S.FS_TICK)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.1), ncol=3, fontsize=S.FS_NOTE,
              frameon=False, title=f"efficiency class (color of the points / regions): share of all {all_w:,.1f} "
              "sampled GPU-hours", title_fontsize=S.FS_NOTE)
    rows_text = f"{n:,} rows (GPU x hour), {total_w:,.1f} sampled GPU-hours"
    how = (f"{rows_text} binned (2-D histogram: class color, darker = more GPU-hours, log)" if density
           else f"{rows_text}, one point each, colored by class")
    not_drawn = (f"not drawn: {rows_out:,} rows, {all_w - total_w:,.1f} sampled GPU-hours without a utilization or"
                 " power reading" if rows_out else None)
    _titled(fig, name, day, tz, how, not_drawn, _coverage_note(coverage))
    return S.finish(fig, _with_coverage(numbers, coverage))


def efficiency_classes(
    hourly: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None
) -> Rendered:
    """GPU-hours per efficiency class, by device class (rows; ALL first): absolute GPU-hours on
    the left, shares on the right. GPU-hours without a class (no utilization or power) are
    shown as "no class".

    ``numbers``: ``gpu_hours``, ``gpu_hours_<class>`` and ``share_<class>`` (device ALL,
    shares of all GPU-hours, "no class" as ``no_class``), ``coverage_pct``."""
    name = "Efficiency classes by device"
    _require(hourly, ("device_name", "efficiency_class"), "gpu_hourly_efficiency")
    coverage = _hourly_coverage(hourly, day, tz) if coverage_pct is None else coverage_pct
    if hourly.num_rows == 0:
        return S.no_data(name, day, tz, "no GPU-hour in the day", 0.0 if coverage is None else coverage)
    gh = _num(hourly, "coverage_s") / HOUR_S if "coverage_s" in hourly.column_names else np.ones(hourly.num_rows)
    gh = np.where(np.isfinite(gh), gh, 0.0)
    # Integer codes throughout: millions of GPU-hours stay fast.
    shown, group, n_other = _fold_codes(*_codes(hourly, "device_name"), gh)
    ccodes, clabels = _codes(hourly, "efficiency_class")
    cats = [*S.CLASS_ORDER, "no class"]
    cat_of = np.array([cats.index(c) if c in S.CLASS_ORDER else len(cats) - 1 for c in clabels] + [len(cats) - 1])
    cat = cat_of[np.where(ccodes < 0, len(clabels), ccodes)]
    rows = ["ALL", *shown]
    mat = np.zeros((len(rows), len(cats)))
    mat[0] = np.bincount(cat, weights=gh, minlength=len(cats))
    mat[1:] = np.bincount(group * len(cats) + cat, weights=gh, minlength=len(shown) * len(cats)).reshape(
        len(shown), len(cats))
    if not (mat[:, -1] > 0).any():
        cats, mat = cats[:-1], mat[:, :-1]
    fig = S.new_figure(13, 1.8 + 0.42 * len(rows))
    ax_abs, ax_share = fig.subplots(1, 2, sharey=True, width_ratios=[1, 1])
    y = np.arange(len(rows))
    left_a = np.zeros(len(rows))
    left_s = np.zeros(len(rows))
    totals = mat.sum(axis=1)
    shares = np.divide(mat, totals[:, None], out=np.zeros_like(mat), where=totals[:, None] > 0)
    cells: tuple[list, list, list, list] = ([], [], [], [])
    for j, cname in enumerate(cats):
        color = S.CLASS_COLORS[cname]
        # The ALL row dwarfs the devices in GPU-hours: draw it on the share panel only.
        S.bars(ax_abs, y[1:], mat[1:, j], 0.7, left_a[1:], horizontal=True, color=color,
               hatch="///" if cname == "no class" else None, edgecolor="#bbbbbb")
        S.bars(ax_share, y, 100 * shares[:, j], 0.7, left_s, horizontal=True, color=color,
               hatch="///" if cname == "no class" else None, edgecolor="#bbbbbb")
        for i in range(len(rows)):
            if shares[i, j] >= 0.07:
                for lst, item in zip(cells, (left_s[i] + 50 * shares[i, j], y[i], f"{100 * shares[i, j]:.0f}",
                                             {"color": S.text_color_for(to_rgb(color))}), strict=True):
                    lst.append(item)
        left_a += mat[:, j]
        left_s += 100 * shares[:, j]
    S.texts(ax_share, *cells, ha="center", va="center", fontsize=S.FS_NOTE)
    for i in range(1, len(rows)):
        ax_abs.text(left_a[i], y[i], f" {totals[i]:.0f}", va="center", fontsize=S.FS_NOTE)
    ax_abs.text(ax_abs.get_xlim()[1] * 0.01, 0, f"ALL: {totals[0]:,.0f} GPU-hours (shares at right)", va="center", fontsize=S.FS_NOTE,
                color="#333333")
    ax_abs.set_xlim(0, max(1.0, left_a[1:].max() * 1.12) if len(rows) > 1 else 1.0)
    S.set_ticks(ax_abs.yaxis, y, [S.short_device(r) if r != S.OTHER else f"other ({n_other} classes)" for r in rows],
                fontsize=S.FS_TICK, styles=[{"fontweight": "bold"}])
    ax_abs.invert_yaxis()
    ax_abs.set_xlabel(S.unit_label("sampled GPU-hours", "h"), fontsize=S.FS_LABEL)
    ax_share.set_xlabel(S.unit_label("share of the device's GPU-hours", "%"), fontsize=S.FS_LABEL)
    ax_share.set_xlim(0, 100)
    for ax in (ax_abs, ax_share):
        S.style_axes(ax, grid="x")
    ax_abs.set_title("GPU-hours per class", loc="left", fontsize=S.FS_PANEL)
    ax_share.set_title("share per class (%)", loc="left", fontsize=S.FS_PANEL)
    _legend_right(ax_share, [Patch(color=S.CLASS_COLORS[c], label=c) for c in cats], title="efficiency class")
    _titled(fig, name, day, tz, f"Efficient: util ≥ {HIGH_UTIL_PCT:g} %, PIF ≥ {EFFICIENT_PIF:g} · Moderate: util ≥ "
            f"{MID_UTIL_PCT:g} %, PIF ≥ {MODERATE_PIF:g} · Bottlenecked: util ≥ {HIGH_UTIL_PCT:g} %, PIF < "
            f"{BOTTLENECK_PIF:g} · Idle: util < {IDLE_UTIL_PCT:g} % · else Inefficient", _coverage_note(coverage))
    numbers: dict[str, float] = {"gpu_hours": float(totals[0])}
    for j, cname in enumerate(cats):
        key = cname.replace(" ", "_")
        numbers[f"gpu_hours_{key}"] = float(mat[0, j])
        numbers[f"share_{key}"] = float(shares[0, j])
    return S.finish(fig, _with_coverage(numbers, coverage))


def rfu_over_day(hourly: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None) -> Rendered:
    """Fleet utilization vs capability-weighted RFU per hour: utilization = the mean of ``util_pct``
    weighted by the time it was known (``util_coverage_s``); RFU = 100 x sum(realized_tflops x
    power time) / sum(achievable_tflops x power time) over GPU-hours with a PIF, power time =
    ``power_coverage_s`` (as ``efficiency_daily``; ``coverage_s`` for days written without them).
    The band between them is the efficiency gap.

    ``numbers``: ``util_pct``, ``rfu_pct_fleet``, ``efficiency_gap_pp`` (day), ``hours``,
    ``coverage_pct``."""
    name = "Fleet utilization vs RFU"
    _require(hourly, ("hour_start_utc", "util_pct", "pif", "realized_tflops", "achievable_tflops"), "gpu_hourly_efficiency")
    coverage = _hourly_coverage(hourly, day, tz) if coverage_pct is None else coverage_pct
    if hourly.num_rows == 0:
        return S.no_data(name, day, tz, "no GPU-hour in the day", 0.0 if coverage is None else coverage)
    start, end = S.day_bounds_s(day, tz)
    n_h = max(1, int(np.ceil((end - start) / HOUR_S - 1e-9)))
    t = _epoch_s(hourly, "hour_start_utc")
    h = np.floor((t - start) / HOUR_S + 1e-6)
    ok_t = np.isfinite(h) & (h >= 0) & (h < n_h)
    h = np.where(ok_t, h, 0).astype(np.int64)
    cov = _num(hourly, "coverage_s") if "coverage_s" in hourly.column_names else np.full(hourly.num_rows, HOUR_S)
    cov = np.where(np.isfinite(cov), cov, 0.0)

    def known_time(col: str) -> np.ndarray:  # the time a reading was known; coverage_s in older days
        w = _num(hourly, col) if col in hourly.column_names else np.full(hourly.num_rows, np.nan)
        return np.where(np.isfinite(w), w, cov)

    cov_u, cov_p = known_time("util_coverage_s"), known_time("power_coverage_s")
    util = _num(hourly, "util_pct")
    pif = _num(hourly, "pif")
    real = _num(hourly, "realized_tflops")
    ach = _num(hourly, "achievable_tflops")
    mu = ok_t & np.isfinite(util)
    mr = ok_t & np.isfinite(pif) & np.isfinite(real) & np.isfinite(ach)
    u_num = np.bincount(h[mu], weights=(util * cov_u)[mu], minlength=n_h)
    u_den = np.bincount(h[mu], weights=cov_u[mu], minlength=n_h)
    r_num = np.bincount(h[mr], weights=(real * cov_p)[mr], minlength=n_h)
    r_den = np.bincount(h[mr], weights=(ach * cov_p)[mr], minlength=n_h)
    gpus = np.bincount(h[ok_t], minlength=n_h)
    with np.errstate(invalid="ignore", divide="ignore"):
        u_h = np.where(u_den > 0, u_num / u_den, np.nan)
        r_h = np.where(r_den > 0, 100 * r_num / r_den, np.nan)
    if not (np.isfinite(u_h).any() or np.isfinite(r_h).any()):
        return S.no_data(name, day, tz, "no GPU-hour with utilization or power", coverage)
    day_u = float(u_num.sum() / u_den.sum()) if u_den.sum() > 0 else np.nan
    day_r = float(100 * r_num.sum() / r_den.sum()) if r_den.sum() > 0 else np.nan
    fig = S.new_figure(12, 5.6)
    ax, ax_n = fig.subplots(2, 1, sharex=True, height_ratios=[4, 1])
    x = np.arange(n_h) + 0.5
    ax.fill_between(x, r_h, u_h, where=np.isfinite(u_h) & np.isfinite(r_h) & (u_h >= r_h), color="#f4a582",
                    alpha=0.45, linewidth=0, label="efficiency gap (util > RFU)", interpolate=True)
    ax.fill_between(x, u_h, r_h, where=np.isfinite(u_h) & np.isfinite(r_h) & (r_h > u_h), color="#92c5de",
                    alpha=0.45, linewidth=0, label="RFU above util", interpolate=True)
    ax.plot(x, u_h, color="#222222", marker="o", markersize=3.5, linewidth=1.6,
            label=f"utilization (coverage-weighted): day {day_u:.1f} %")
    ax.plot(x, r_h, color="#7b3294", marker="s", markersize=3.5, linewidth=1.6,
            label=f"RFU (capability-weighted): day {day_r:.1f} %")
    ax.set_ylim(0, 105)
    ax.set_ylabel(S.unit_label("fleet utilization / RFU", "%"), fontsize=S.FS_LABEL)
    S.style_axes(ax, grid="both")
    hs = ax.get_legend_handles_labels()[0]
    _legend_top(ax, hs[2:] + hs[:2], ncol=4)
    S.bars(ax_n, x, gpus, 0.8, color="#bbbbbb")
    ax_n.set_ylabel(S.unit_label("GPUs sampled", "count"), fontsize=S.FS_LABEL)
    ax_n.yaxis.get_major_locator().set_params(integer=True, nbins=3)
    S.style_axes(ax_n)
    S.set_time_axis(ax, day, tz, label=False)
    S.set_time_axis(ax_n, day, tz)
    _titled(fig, name, day, tz, f"per hour; efficiency gap {day_u - day_r:+.1f} pp over the day",
            _coverage_note(coverage))
    numbers = {"util_pct": day_u, "rfu_pct_fleet": day_r, "efficiency_gap_pp": day_u - day_r,
               "hours": float(np.isfinite(u_h).sum())}
    return S.finish(fig, _with_coverage(numbers, coverage))


# ---------------------------------------------------------------------------------------------
# Demand vs capacity (DESIGN.md 5.6)
# ---------------------------------------------------------------------------------------------

_SOURCE_STYLE = {"htcondor": "-", "kueue": "--"}


def _hour_rows(capacity: pa.Table, day: dt.date, tz: str) -> tuple[np.ndarray, np.ndarray, int]:
    start, end = S.day_bounds_s(day, tz)
    n_h = max(1, int(np.ceil((end - start) / HOUR_S - 1e-9)))
    t = _epoch_s(capacity, "hour_start_utc")
    h = np.floor((t - start) / HOUR_S + 1e-6)
    ok = np.isfinite(h) & (h >= 0) & (h < n_h)
    return np.where(ok, h, 0).astype(np.int64), ok, n_h


def _demand_coverage(capacity: pa.Table, day: dt.date, tz: str) -> float:
    """Share (%) of the day's hours with a known DCR (an hour of unknown demand or capacity --
    no slot snapshot -- has a row, and a null DCR)."""
    t = _epoch_s(capacity, "hour_start_utc")
    return _coverage_pct(np.where(np.isfinite(_num(capacity, "dcr")), t, np.nan), day, tz, HOUR_S)


def demand_capacity_panels(
    capacity: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None
) -> Rendered:
    """Three panels over the day for the whole pool (device class ALL), HTCondor solid and Kueue
    dashed when present: (1) GPU demand of idle jobs vs idle GPUs (and idle GPUs open to any
    job); (2) allocation % and, when the efficiency input was given, the efficiency gap
    util - RFU (pp); (3) the contention index CIS with the Warning (0.5) and Critical (0.7)
    lines, markers colored by severity.

    ``numbers`` per source: ``demand_gpus_<src>``, ``idle_gpus_<src>`` (day means), ``dcr_<src>``
    (day mean demand / day mean idle, capped at the table's :data:`~gpu_pipeline.lib.demand.DCR_MAX`
    = 1e6), ``hours_dcr_capped_<src>`` (hours whose DCR is at that cap), ``hours_zero_idle_<src>``, ``cis_max_<src>``,
    ``hours_warning_<src>``, ``hours_critical_<src>``, ``hours_unknown_<src>`` (no DCR: no slot
    snapshot in the hour, or unknown demand); ``coverage_pct`` (hours with a known DCR)."""
    name = "Demand vs capacity"
    _require(capacity, ("hour_start_utc", "source", "device_class", "demand_gpus", "idle_gpus", "cis", "dcr"),
             "demand_capacity")
    coverage = _demand_coverage(capacity, day, tz) if coverage_pct is None else coverage_pct
    dev = _strs(capacity, "device_class")
    src = _strs(capacity, "source")
    sel = dev == "ALL"
    if not sel.any():
        return S.no_data(name, day, tz, "no demand-capacity hour in the day", coverage)
    h, ok, n_h = _hour_rows(capacity, day, tz)
    x = np.arange(n_h) + 0.5
    fig = S.new_figure(12, 8.4)
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True, height_ratios=[1.2, 1.0, 1.0])
    numbers: dict[str, float] = {}
    sources = [s for s in ("htcondor", "kueue") if (sel & (src == s)).any()]
    sources += sorted(set(src[sel].tolist()) - set(sources))
    cols = {c: _num(capacity, c) for c in ("demand_gpus", "idle_gpus", "idle_open_gpus", "allocation_pct",
                                             "efficiency_gap_pp", "cis", "dcr")}
    sev = _strs(capacity, "severity", null="Healthy")
    capped = _dcr_capped(capacity)
    gap_drawn = False
    for s in sources:
        m = sel & (src == s) & ok
        ls = _SOURCE_STYLE.get(s, ":")

        def series(col: str, m=m) -> np.ndarray:
            out = np.full(n_h, np.nan)
            out[h[m]] = cols[col][m]
            return out

        dem, idle, idle_open = series("demand_gpus"), series("idle_gpus"), series("idle_open_gpus")
        ax1.plot(x, dem, color="#6a3d9a", linestyle=ls, marker="o", markersize=3, linewidth=1.6,
                 label=f"{s}: demand of idle jobs ({_mean_text(dem)})")
        ax1.plot(x, idle, color=S.STATE_COLORS["idle_shared"], linestyle=ls, marker="s", markersize=3, linewidth=1.6,
                 label=f"{s}: idle GPUs ({_mean_text(idle)})")
        if s != "kueue" and np.isfinite(idle_open).any():
            ax1.plot(x, idle_open, color=S.lighten(S.STATE_COLORS["idle_shared"], 0.35), linestyle=":", linewidth=1.2,
                     label=f"{s}: idle GPUs open to any job")
        alloc = series("allocation_pct")
        ax2.plot(x, alloc, color="#222222", linestyle=ls, marker="o", markersize=3, linewidth=1.5,
                 label=f"{s}: allocation (%)")
        gap = series("efficiency_gap_pp")
        if np.isfinite(gap).any():
            gap_drawn = True
            ax2.plot(x, gap, color="#7b3294", linestyle=ls, marker="s", markersize=3, linewidth=1.3,
                     label=f"{s}: efficiency gap util − RFU (pp)")
        cis = series("cis")
        ax3.plot(x, cis, color="#444444", linestyle=ls, linewidth=1.3, label=f"{s}: CIS", zorder=2)
        sv = np.full(n_h, "", dtype=object)
        sv[h[m]] = sev[m]
        for name_s, color in S.SEVERITY_COLORS.items():
            k = sv == name_s
            if k.any():
                ax3.scatter(x[k], cis[k], color=color, edgecolor="#333333", linewidths=0.4, s=26, zorder=3)
        numbers[f"demand_gpus_{s}"] = float(np.nanmean(dem)) if np.isfinite(dem).any() else np.nan
        numbers[f"idle_gpus_{s}"] = float(np.nanmean(idle)) if np.isfinite(idle).any() else np.nan
        # Day ratio of the means (the hourly DCR is capped at 1e6 in hours without idle GPUs, so
        # its mean would mean nothing).
        # over the hours where both are known (an hour without a slot snapshot has demand, no idle),
        # capped as the table caps each hour's (demand over no idle GPU all day read 1e7)
        both = np.isfinite(dem) & np.isfinite(idle)
        numbers[f"dcr_{s}"] = (float(min(np.mean(dem[both]) / max(np.mean(idle[both]), EPSILON), DCR_MAX))
                               if both.any() else np.nan)
        numbers[f"hours_dcr_capped_{s}"] = float(np.count_nonzero(capped[m]))
        numbers[f"hours_zero_idle_{s}"] = float(np.sum(np.isfinite(idle) & (idle <= 0)))
        numbers[f"cis_max_{s}"] = float(np.nanmax(cis)) if np.isfinite(cis).any() else np.nan
        numbers[f"hours_warning_{s}"] = float((sv == "Warning").sum())
        numbers[f"hours_critical_{s}"] = float((sv == "Critical").sum())
        numbers[f"hours_unknown_{s}"] = float((sv == "Unknown").sum())
    unknown = {s: int(numbers[f"hours_unknown_{s}"]) for s in sources if numbers[f"hours_unknown_{s}"]}
    if unknown:  # hours whose capacity is unknown have no CIS: say so where the CIS line is missing
        ax3.text(0.01, 0.97, "no CIS where capacity is unknown (severity Unknown): " + ", ".join(
                 f"{s} {n} h" for s, n in unknown.items()), transform=ax3.transAxes, va="top",
                 fontsize=S.FS_NOTE, color="#555555")
    ax3.axhline(CIS_WARNING, color=S.SEVERITY_COLORS["Warning"], linestyle="--", linewidth=1.1)
    ax3.axhline(CIS_CRITICAL, color=S.SEVERITY_COLORS["Critical"], linestyle="--", linewidth=1.1)
    ax3.text(1.005, CIS_WARNING, "Warning 0.5", transform=ax3.get_yaxis_transform(), va="center", fontsize=S.FS_NOTE,
             color="#b35806")
    ax3.text(1.005, CIS_CRITICAL, "Critical 0.7", transform=ax3.get_yaxis_transform(), va="center",
             fontsize=S.FS_NOTE, color=S.SEVERITY_COLORS["Critical"])
    ax1.set_ylabel(S.unit_label("GPUs", "hourly time-weighted mean"), fontsize=S.FS_LABEL)
    ax1.set_ylim(bottom=0)
    ax2.set_ylabel("allocation (%)" + (" / gap (pp)" if gap_drawn else ""), fontsize=S.FS_LABEL)
    ax2.set_ylim(min(0, np.nanmin(cols["efficiency_gap_pp"][sel]) - 5) if gap_drawn and
                 np.isfinite(cols["efficiency_gap_pp"][sel]).any() else 0, 105)
    ax3.set_ylabel(S.unit_label("contention index CIS", "0-1"), fontsize=S.FS_LABEL)
    ax3.set_ylim(0, 1.02)
    for ax in (ax1, ax2, ax3):
        S.style_axes(ax, grid="both")
        S.set_time_axis(ax, day, tz, label=ax is ax3)
        _legend_right(ax, ax.get_legend_handles_labels()[0])
    sev_handles = [Line2D([], [], marker="o", linestyle="", color=c, markeredgecolor="#333333", label=k)
                   for k, c in S.SEVERITY_COLORS.items()]
    leg = ax3.get_legend()
    ax3.legend(handles=leg.legend_handles + sev_handles, loc="upper left", bbox_to_anchor=(1.06, 1.0),
               fontsize=S.FS_NOTE, frameon=False, title="severity (markers)", title_fontsize=S.FS_NOTE)
    ax1.set_title("queued GPU demand vs idle GPUs", loc="left", fontsize=S.FS_PANEL)
    ax2.set_title("allocation" + (" and efficiency gap" if gap_drawn else "") , loc="left", fontsize=S.FS_PANEL)
    ax3.set_title("contention index (CIS)", loc="left", fontsize=S.FS_PANEL)
    _titled(fig, name, day, tz, "whole pool (device class ALL); " + ", ".join(
        f"{s} {'solid' if _SOURCE_STYLE.get(s) == '-' else 'dashed'}" for s in sources), _coverage_note(coverage))
    return S.finish(fig, _with_coverage(numbers, coverage))


def _dcr_capped(capacity: pa.Table) -> np.ndarray:
    """Rows whose DCR is at the table's cap (``dcr_capped``; from ``dcr`` where the column is absent)."""
    flag = _num(capacity, "dcr_capped")
    return np.where(np.isfinite(flag), flag > 0, _num(capacity, "dcr") >= DCR_MAX)


def _mean_text(values: np.ndarray) -> str:
    """A legend's "mean 4.2" of the hours with a value, or "unknown all day" when none has one."""
    known = np.isfinite(values)
    return f"mean {np.mean(values[known]):.1f}" if known.any() else "unknown all day"


def _fmt_dcr(v: float) -> str:
    if not np.isfinite(v):
        return ""
    if v == 0:
        return "0"
    if v < DCR_DISPLAY_MIN:
        return "<.01"
    if v >= DCR_DISPLAY_MAX:
        return f"≥{DCR_DISPLAY_MAX:g}"
    return f"{v:.2f}" if v < 1 else f"{v:.1f}" if v < 10 else f"{v:.0f}"


def imbalance_heatmap(
    capacity: pa.Table, day: dt.date, tz: str, *, metric: str = "dcr", coverage_pct: float | None = None
) -> Rendered:
    """Hour x device-class heatmap of the demand-capacity ratio DCR (``metric="dcr"``: log colors
    from 0.01 to 100, diverging at 1 = demand equals idle capacity, values capped at 100 and
    written in the cells) or of the contention index (``metric="cis"``: 0-1, linear). Rows: the
    whole pool per source first (htcondor ALL, kueue ALL), then device classes by size (more than
    12 folded into "other": DCR = sum demand / sum idle, CIS = max).

    ``numbers``: ``max_dcr`` / ``max_cis`` (pool, htcondor; the table's value, not the color cap;
    a DCR at most the table's cap 1e6), ``hours_dcr_above_1`` and ``hours_dcr_capped`` (hours at that
    cap; pool, htcondor), ``device_classes``, ``coverage_pct``."""
    metric = metric.lower()
    if metric not in ("dcr", "cis"):
        raise ValueError(f"metric must be 'dcr' or 'cis', not {metric!r}")
    name = "Demand-capacity imbalance" + (" (DCR)" if metric == "dcr" else " (CIS)")
    _require(capacity, ("hour_start_utc", "source", "device_class", "dcr", "cis"), "demand_capacity")
    coverage = _demand_coverage(capacity, day, tz) if coverage_pct is None else coverage_pct
    if capacity.num_rows == 0:
        return S.no_data(name, day, tz, "no demand-capacity hour in the day", coverage)
    h, ok, n_h = _hour_rows(capacity, day, tz)
    dev = _strs(capacity, "device_class")
    src = _strs(capacity, "source")
    val = np.minimum(_num(capacity, metric), DCR_DISPLAY_MAX if metric == "dcr" else 1.0)
    demand = _num(capacity, "demand_gpus")
    idle = _num(capacity, "idle_gpus")
    total = _num(capacity, "total_gpus")
    pool_rows = [(s, "ALL") for s in ("htcondor", "kueue", *sorted(set(src.tolist()) - {"htcondor", "kueue"}))
                 if ((src == s) & (dev == "ALL")).any()]
    cls_mask = (dev != "ALL")
    size: dict[str, float] = {}
    for d in set(dev[cls_mask].tolist()):
        size[d] = float(np.nansum(total[cls_mask & (dev == d)]))
    shown, label_of = S.fold_top(size)
    rows = pool_rows + [("htcondor" if ((src == "htcondor") & (dev == d)).any() else "", d) for d in shown]
    mat = np.full((len(rows), n_h), np.nan)
    for i, (s, d) in enumerate(rows):
        if d == S.OTHER:
            # rows of unknown capacity (no slot snapshot: null idle, null DCR) are left out
            m = ok & cls_mask & np.isfinite(val) & np.array([label_of.get(x) == S.OTHER for x in dev], dtype=bool)
            for hh in range(n_h):
                k = m & (h == hh)
                if k.any():
                    if metric == "dcr":
                        mat[i, hh] = min(np.nansum(demand[k]) / max(np.nansum(idle[k]), 1e-6), DCR_DISPLAY_MAX)
                    else:
                        mat[i, hh] = np.nanmax(val[k])
            continue
        m = ok & (dev == d) & ((src == s) if s else True)
        mat[i, h[m]] = val[m]
    if metric == "dcr":
        cmap = colormaps["RdBu_r"]
        norm: Normalize = LogNorm(vmin=DCR_DISPLAY_MIN, vmax=DCR_DISPLAY_MAX)
        shown_vals = np.where(np.isfinite(mat), np.clip(mat, DCR_DISPLAY_MIN, DCR_DISPLAY_MAX), np.nan)
    else:
        cmap = colormaps["YlOrRd"]
        norm = Normalize(vmin=0, vmax=1)
        shown_vals = mat
    cmap = cmap.with_extremes(bad=(0, 0, 0, 0))  # hours without a row stay white (unknown)
    fig = S.new_figure(13, 1.9 + 0.42 * len(rows))
    ax = fig.add_subplot()
    zero = np.isfinite(mat) & (mat == 0) if metric == "dcr" else np.zeros(mat.shape, dtype=bool)
    im = ax.imshow(np.ma.masked_where(~np.isfinite(shown_vals) | zero, shown_vals), aspect="auto", cmap=cmap,
                   norm=norm, interpolation="nearest", extent=(0, n_h, len(rows), 0))
    if zero.any():
        # No queued demand is not "a huge surplus": a neutral tint, not the darkest blue.
        ax.imshow(np.ma.masked_where(~zero, np.ones(mat.shape)), aspect="auto", interpolation="nearest",
                  cmap=ListedColormap([ZERO_DEMAND_COLOR]), extent=(0, n_h, len(rows), 0))
    fs = 6.5 if n_h > 20 else S.FS_NOTE
    cells: tuple[list, list, list, list] = ([], [], [], [])
    for i in range(len(rows)):
        for j in range(n_h):
            v = mat[i, j]
            if not np.isfinite(v):
                continue
            text = _fmt_dcr(v) if metric == "dcr" else f"{v:.2f}"
            color = "#777777" if zero[i, j] else S.text_color_for(cmap(norm(shown_vals[i, j])))
            for lst, item in zip(cells, (j + 0.5, i + 0.5, text, {"color": color}), strict=True):
                lst.append(item)
    S.texts(ax, *cells, ha="center", va="center", fontsize=fs)
    ylabels = []
    for s, d in rows:
        if d == "ALL":
            ylabels.append(f"{s}: whole pool")
        elif d == S.OTHER:
            ylabels.append(f"other ({sum(1 for v in label_of.values() if v == S.OTHER)} classes)")
        else:
            ylabels.append(S.short_device(d))
    S.set_ticks(ax.yaxis, np.arange(len(rows)) + 0.5, ylabels, fontsize=S.FS_TICK,
                styles=[{"fontweight": "bold"} if d == "ALL" else {} for _s, d in rows])
    if pool_rows and len(rows) > len(pool_rows):
        ax.axhline(len(pool_rows), color="white", linewidth=3)
    S.set_time_axis(ax, day, tz)
    ax.tick_params(length=0)
    ax.set_ylabel("device class", fontsize=S.FS_LABEL)
    cb = fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01)
    if metric == "dcr":
        cb.set_label("DCR = demand / idle GPUs\n(log; capped at 100)", fontsize=S.FS_LABEL)  # two lines: a 1-row figure is short
        cb.set_ticks([0.01, 0.1, 1, 10, 100])
        cb.set_ticklabels(["≤0.01", "0.1", "1", "10", "≥100"])
    else:
        cb.set_label(S.unit_label("contention index CIS", "0-1"), fontsize=S.FS_LABEL)
        cb.set_ticks([0, 0.3, CIS_WARNING, CIS_CRITICAL, 1.0])
        cb.set_ticklabels(["0", "0.3 moderate", f"{CIS_WARNING:g} warning", f"{CIS_CRITICAL:g} critical", "1"])
        for y in (0.3, CIS_WARNING, CIS_CRITICAL):
            cb.ax.axhline(y, color="black", linewidth=1.0, linestyle="--")
    cb.ax.tick_params(labelsize=S.FS_TICK)
    note = ("blue: idle capacity exceeds queued demand · red: demand exceeds idle GPUs (DCR > 1) · "
            "gray 0: no queued demand · white: no data" if metric == "dcr" else "warning 0.5, critical 0.7")
    cls_rows = [i for i, (_s, d) in enumerate(rows) if d != "ALL"]
    if metric == "dcr" and cls_rows and all(zero[i][np.isfinite(mat[i])].all() for i in cls_rows):
        note += "\nno job named a device class: all queued demand is counted in the whole pool only"
    _titled(fig, name, day, tz, note, _coverage_note(coverage))
    numbers: dict[str, float] = {"device_classes": float(len(size))}
    pool = [i for i, (s, d) in enumerate(rows) if s == "htcondor" and d == "ALL"]
    if pool:
        r = mat[pool[0]]
        # from the table's own values: the matrix is capped for the colors (a DCR of 200 read 100)
        m = ok & (src == "htcondor") & (dev == "ALL")
        raw = _num(capacity, metric)[m]
        if np.isfinite(raw).any():
            numbers[f"max_{metric}"] = float(min(np.nanmax(raw), DCR_MAX) if metric == "dcr" else np.nanmax(raw))
        if metric == "dcr":
            numbers["hours_dcr_above_1"] = float(np.nansum(r > 1))
            numbers["hours_dcr_capped"] = float(np.count_nonzero(_dcr_capped(capacity)[m]))
    return S.finish(fig, _with_coverage(numbers, coverage))


_DIM_TITLES = {"device_class": "device class", "owner": "owner", "project": "project", "schedd": "schedd (queue)",
               "cluster_queue": "Kueue ClusterQueue"}


def top_contributors(
    top: pa.Table, day: dt.date, tz: str, *, coverage_pct: float | None = None, day_devices: Sequence[str] = ()
) -> Rendered:
    """Who queued the GPU demand: horizontal bars of idle-job GPU-hours for the top 10 keys of each
    dimension (device class, owner, project, schedd; Kueue ClusterQueue), one panel per source x
    dimension, with each key's share of the source's total.

    ``numbers``: ``demand_gpu_hours_<src>`` (the source's day total), ``top_share_<dimension>``
    (share of the largest key; HTCondor dimensions, Kueue ``cluster_queue``)."""
    name = "Top demand contributors"
    _require(top, ("source", "dimension", "key", "demand_gpu_hours", "share"), "demand_top_contributors")
    if top.num_rows == 0:
        return S.no_data(name, day, tz, "no queued GPU demand in the day", coverage_pct)
    src = _strs(top, "source")
    dim = _strs(top, "dimension")
    key = _strs(top, "key", null="(none)")
    gh = _num(top, "demand_gpu_hours")
    share = _num(top, "share")
    rank = _num(top, "rank") if "rank" in top.column_names else np.zeros(top.num_rows)
    dims = ("owner", "project", "device_class", "schedd", "cluster_queue")
    panels = []
    for s in ("htcondor", "kueue", *sorted(set(src.tolist()) - {"htcondor", "kueue"})):
        for d in (*dims, *sorted(set(dim[src == s].tolist()) - set(dims))):
            m = (src == s) & (dim == d)
            if m.any():
                panels.append((s, d, np.flatnonzero(m)))
    ncols = 2 if len(panels) > 1 else 1
    nrows = int(np.ceil(len(panels) / ncols))
    fig = S.new_figure(13, 1.0 + 3.0 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    numbers: dict[str, float] = {}
    for k, ax in enumerate(axes.ravel()):
        if k >= len(panels):
            ax.axis("off")
            continue
        s, d, idx = panels[k]
        idx = idx[np.lexsort((key[idx].astype(str), -gh[idx], rank[idx]))][:10]
        vals = gh[idx]
        labels = [str(x) if len(str(x)) <= 30 else str(x)[:29] + "…" for x in key[idx]]
        color = "#6a3d9a" if s == "htcondor" else "#1b7837"
        if d == "device_class":
            # ANY (jobs that name no device) and (none) are no classes: gray, and not counted (a day
            # of 13 classes made 14 and gave up the colors the other figures use)
            colors = S.device_colors(key[idx].tolist(), day_devices)
            bar_colors = [colors[x] for x in key[idx]]
        else:
            bar_colors = [color] * len(idx)
        y = np.arange(len(idx))
        S.bars(ax, y, vals, 0.7, horizontal=True, color=bar_colors)
        vmax = float(np.nanmax(vals)) if len(vals) else 1.0
        S.texts(ax, vals + vmax * 0.01, y, [f"{v:,.1f} ({100 * sh:.0f} %)" for v, sh in zip(vals, share[idx], strict=True)],
                va="center", fontsize=S.FS_NOTE)
        S.set_ticks(ax.yaxis, y, [S.short_device(x) if d == "device_class" else x for x in labels], fontsize=S.FS_TICK)
        ax.set_ylim(max(len(idx), 10) - 0.5, -0.5)  # 10 slots in every panel: bars keep one thickness
        ax.set_xlim(0, max(vmax, 1e-9) * 1.3)
        ax.set_xlabel(S.unit_label("queued GPU demand", "GPU-hours"), fontsize=S.FS_LABEL)
        S.style_axes(ax, grid="x")
        tot = float(vals[0] / share[idx][0]) if len(idx) and share[idx][0] > 0 else float(np.nansum(vals))
        numbers[f"demand_gpu_hours_{s}"] = tot
        numbers.setdefault(f"top_share_{d}", float(share[idx][0]) if len(idx) else np.nan)
        ax.set_title(f"{s} · by {_DIM_TITLES.get(d, d)} (top {len(idx)}; total {tot:,.0f} GPU-hours)", loc="left",
                     fontsize=S.FS_PANEL)
    _titled(fig, name, day, tz, "GPU-hours requested by idle (queued) jobs; share of the source's total in brackets"
            + ("; device class ANY = jobs that name no device" if "ANY" in set(key.tolist()) else ""))
    return S.finish(fig, _with_coverage(numbers, coverage_pct))


#: Every plot of this module by name (for assets and the review script).
PLOTS: dict[str, Callable[..., Rendered]] = {
    f.__name__: f
    for f in (
        allocation_over_day, allocation_counts, allocation_heatmap, allocation_distribution, daily_dashboard,
        availability_durations, time_to_claim, evictions_by_hour, runtime_to_eviction, efficiency_scatter,
        efficiency_classes, rfu_over_day, demand_capacity_panels, imbalance_heatmap, top_contributors,
    )
}
