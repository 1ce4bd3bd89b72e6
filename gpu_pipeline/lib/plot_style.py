"""One style for every plot: palettes, titles, time axes, unit labels, figure factory, PNG helpers.

Everything here draws on ``matplotlib.figure.Figure`` objects (Agg backend, never pyplot), so
nothing leaks between assets or threads; fonts and colors are set per artist, not through the
global ``rcParams``. The state palette (DESIGN.md 5.1), :class:`Rendered` and
:func:`render_no_data` are the ones of :mod:`gpu_pipeline.lib.plots`, re-exported here.

Conventions
    * titles read ``"<what> — YYYY-MM-DD (<time zone>)"`` (:func:`title`);
    * every axis names its quantity and unit, e.g. ``"allocation (%)"`` (:func:`unit_label`);
    * time axes are "hours since the local midnight" of the partition day (23 or 25 hours on DST
      days), ticked on local whole hours and labelled in the partition time zone
      (:func:`set_time_axis`);
    * tiers always have :data:`TIER_COLORS` (darker shades of the busy-state hues: priority green,
      shared teal, backfill blue; TOTAL black and dashed);
    * device classes get a stable color from :data:`DEVICE_CYCLE` (:func:`device_colors`); at most
      :data:`MAX_CATEGORIES` categories are drawn, the rest is folded into ``"other"``
      (:func:`fold_top`).
"""

from __future__ import annotations

import datetime as dt
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import is_color_like, to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.markers import TICKDOWN
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from numpy.typing import ArrayLike

from gpu_pipeline.lib.plots import (
    MAX_ROW_LABELS,
    STATE_COLORS,
    STATE_LABELS,
    Rendered,
    _Canvas,
    light_ticks,
    render_no_data,
)
from gpu_pipeline.lib.plots import add_texts as texts
from gpu_pipeline.lib.plots import png_and_preview as _png_and_preview
from gpu_pipeline.lib.plots import set_fixed_ticks as set_ticks
from gpu_pipeline.lib.schemas import STATES
from gpu_pipeline.lib.timeutil import day_window

__all__ = [
    "CLASS_COLORS",
    "CLASS_ORDER",
    "DEVICE_CYCLE",
    "DPI",
    "MAX_CATEGORIES",
    "MAX_ROW_LABELS",
    "OTHER",
    "OTHER_COLOR",
    "PSEUDO_CLASSES",
    "PSEUDO_CLASS_COLOR",
    "PREVIEW_WIDTH_PX",
    "SEVERITY_COLORS",
    "STATES",
    "STATE_COLORS",
    "STATE_LABELS",
    "TIER_COLORS",
    "TIER_LABELS",
    "TIER_LIGHT_COLORS",
    "TIER_ORDER",
    "Rendered",
    "bars",
    "day_bounds_s",
    "device_colors",
    "column_or_none",
    "ecdf",
    "finish",
    "fold_top",
    "hours_since_start",
    "lighten",
    "minor_ticks",
    "new_figure",
    "png_and_preview",
    "no_data",
    "render_no_data",
    "set_hour_of_day_axis",
    "set_log_minutes_axis",
    "set_time_axis",
    "set_ticks",
    "short_device",
    "style_axes",
    "text_color_for",
    "texts",
    "tier_style",
    "title",
    "unit_label",
]

DPI = 100  #: resolution of the full PNG (the dashboard uses more, see metric_plots)
PREVIEW_WIDTH_PX = 480
MAX_CATEGORIES = 12  #: categories drawn before folding the rest into "other"
OTHER = "other"
OTHER_COLOR = "#9e9e9e"
ALL_COLOR = "#222222"
#: Device-class keys that are no device class (demand of jobs that name no device, a missing key):
#: a color of their own, never one of :data:`DEVICE_CYCLE`'s, and not counted as classes.
PSEUDO_CLASSES: tuple[str, ...] = ("ANY", "(none)")
PSEUDO_CLASS_COLOR = "#888888"

# Font sizes (points), used explicitly instead of rcParams so no global state changes.
FS_TITLE = 12
FS_PANEL = 10
FS_LABEL = 9
FS_TICK = 8
FS_NOTE = 7.5

# ---------------------------------------------------------------------------------------------
# Palettes
# ---------------------------------------------------------------------------------------------

TIER_ORDER: tuple[str, ...] = ("priority", "shared", "backfill", "TOTAL")
#: Tier colors: darker shades of the busy-state hues of DESIGN.md 5.1 (busy_prioritized #44ff44,
#: busy_shared #00cc99, busy_backfill #4488ff) so lines stay visible on white; TOTAL is black.
TIER_COLORS: dict[str, str] = {
    "priority": "#1f9e1f",
    "shared": "#00a383",
    "backfill": "#2f6fe0",
    "TOTAL": "#222222",
}
TIER_LABELS: dict[str, str] = {
    "priority": "priority",
    "shared": "shared (open capacity)",
    "backfill": "backfill",
    "TOTAL": "TOTAL (each GPU once)",
}


def lighten(color: str, amount: float = 0.6) -> str:
    """Mix ``color`` with white (0 = unchanged, 1 = white); an opaque color, not an alpha."""
    r, g, b = to_rgb(color)
    return to_hex((r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount))


#: Light tints of the tier colors (unclaimed capacity in stacked areas and bars).
TIER_LIGHT_COLORS: dict[str, str] = {t: lighten(c, 0.7) for t, c in TIER_COLORS.items()}


def tier_style(tier: str) -> dict[str, object]:
    """Line keyword arguments of a tier: its color; TOTAL dashed and a little thicker."""
    if tier == "TOTAL":
        return {"color": TIER_COLORS[tier], "linestyle": "--", "linewidth": 1.8}
    return {"color": TIER_COLORS.get(tier, OTHER_COLOR), "linestyle": "-", "linewidth": 1.4}


#: Device-class color cycle (tab10 without its gray, plus navy, dark teal, salmon and plum): 13
#: colors, as :func:`fold_top` draws up to 13 classes unfolded; gray is "other".
DEVICE_CYCLE: tuple[str, ...] = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#bcbd22", "#17becf", "#393b79", "#01665e", "#ff9896", "#7b4173",
)

#: Efficiency classes (DESIGN.md 5.5) from best to worst, then Idle.
CLASS_ORDER: tuple[str, ...] = ("Efficient", "Moderate", "Bottlenecked", "Inefficient", "Idle")
CLASS_COLORS: dict[str, str] = {
    "Efficient": "#1a9850",
    "Moderate": "#7fbc41",
    "Bottlenecked": "#fdae61",
    "Inefficient": "#d73027",
    "Idle": "#9e9e9e",
    "no class": "#e6e6e6",
}
#: Demand-capacity severities (DESIGN.md 5.6).
SEVERITY_COLORS: dict[str, str] = {
    "Healthy": "#1a9850",
    "Moderate": "#fee08b",
    "Warning": "#fc8d59",
    "Critical": "#d73027",
}


def device_colors(names: Iterable[str], day_devices: Iterable[str] = ()) -> dict[str, str]:
    """A color per device class: each name hashes (crc32) to a slot of :data:`DEVICE_CYCLE`,
    colliding names take the next free slot. The names of ``day_devices`` (the day's device
    classes, the same for every figure of the day) are placed first, in sorted order, then the
    other ``names``: so a class has the same color in every figure of the day that passes the
    same ``day_devices``, whichever classes each figure shows (without it, the colors depend on
    the set of ``names``: two figures of one day could give one color to two classes). A day of
    more classes than colors gives up the day's placement: within a figure colors stay distinct.
    ``"other"`` is gray, ``"ALL"`` black, the :data:`PSEUDO_CLASSES` (``"ANY"``, ``"(none)"``) a
    darker gray and not counted as classes (a day of 13 classes plus ``"ANY"`` keeps its
    placement); beyond 13 classes the cycle repeats (fold first with :func:`fold_top`)."""
    out: dict[str, str] = {}
    used: set[int] = set()
    n = len(DEVICE_CYCLE)
    not_classes = {OTHER, "ALL", *PSEUDO_CLASSES}
    first = sorted(set(day_devices) - not_classes)
    if len(set(first) | (set(names) - not_classes)) > n:
        first = []  # more classes than colors: distinct colors within the figure come first
    for name in [*first, *sorted(set(names) - set(first))]:
        if name == OTHER:
            out[name] = OTHER_COLOR
            continue
        if name == "ALL":
            out[name] = ALL_COLOR
            continue
        if name in PSEUDO_CLASSES:
            out[name] = PSEUDO_CLASS_COLOR
            continue
        slot = zlib.crc32(name.encode()) % n
        if len(used) < n:
            while slot in used:
                slot = (slot + 1) % n
        used.add(slot)
        out[name] = DEVICE_CYCLE[slot]
    return out


_DEVICE_PREFIXES = ("NVIDIA GeForce ", "NVIDIA Tesla ", "NVIDIA Quadro ", "NVIDIA ", "Tesla ", "Quadro ")


def short_device(name: str) -> str:
    """A thin label for a GPU model: vendor words dropped (``NVIDIA GeForce RTX 2080 Ti`` ->
    ``RTX 2080 Ti``, ``Tesla V100-SXM2-32GB`` -> ``V100-SXM2-32GB``), then cut to 24 characters."""
    for p in _DEVICE_PREFIXES:
        if name.startswith(p) and len(name) > len(p):
            name = name[len(p):]
            break
    return name if len(name) <= 24 else name[:23] + "…"


def fold_top(weights: Mapping[str, float], max_n: int = MAX_CATEGORIES) -> tuple[list[str], dict[str, str]]:
    """Keep the ``max_n`` heaviest categories (ties by name), fold the rest into ``"other"``.

    Returns the labels to draw, heaviest first (``"other"`` last when anything was folded), and
    the label of every input key. With ``max_n + 1`` categories or fewer nothing is folded."""
    keys = sorted(weights, key=lambda k: (-float(weights[k] or 0.0), str(k)))
    if len(keys) <= max_n + 1:
        return keys, {k: k for k in keys}
    kept = keys[:max_n]
    label = {k: (k if i < max_n else OTHER) for i, k in enumerate(keys)}
    return [*kept, OTHER], label


# ---------------------------------------------------------------------------------------------
# Titles, labels, figures
# ---------------------------------------------------------------------------------------------


def title(name: str, day: dt.date, tz: str) -> str:
    """``"Allocation by tier — 2026-11-17 (America/Chicago)"``."""
    return f"{name} — {day.isoformat()} ({tz})"


def unit_label(quantity: str, unit: str) -> str:
    """An axis label with its unit: ``unit_label("allocation", "%")`` -> ``"allocation (%)"``."""
    return f"{quantity} ({unit})"


def new_figure(width_in: float, height_in: float, *, layout: str | None = "constrained") -> Figure:
    """A detached figure (no pyplot registry), white background, constrained layout."""
    fig = Figure(figsize=(width_in, height_in), layout=layout, facecolor="white")
    if layout == "constrained":
        fig.get_layout_engine().set(h_pad=0.06, w_pad=0.06, hspace=0.04, wspace=0.04)
    return fig


def style_axes(ax: Axes, *, grid: str | None = "y") -> None:
    """Light grid behind the data, no top/right spines, small tick labels."""
    ax.tick_params(labelsize=FS_TICK)
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    if grid:
        ax.grid(True, axis=grid, color="#e3e3e3", linewidth=0.6)
        ax.set_axisbelow(True)


def png_and_preview(fig: Figure, dpi: int = DPI, preview_width_px: int = PREVIEW_WIDTH_PX) -> tuple[bytes, bytes]:
    """Draw ``fig`` once at ``dpi`` and return the PNG and a preview at most ``preview_width_px``
    wide, downscaled from the same pixels: one layout and one rendering instead of two. RGB, no
    metadata, so equal figures give equal bytes (:func:`gpu_pipeline.lib.plots.png_and_preview`)."""
    return _png_and_preview(fig, dpi, preview_width_px)


def bars(
    ax: Axes,
    x: ArrayLike,
    height: ArrayLike,
    width: ArrayLike = 0.8,
    bottom: ArrayLike = 0.0,
    *,
    horizontal: bool = False,
    align: str = "center",
    color: object = None,
    edgecolor: object = "none",
    linewidth: float = 0.0,
    **kwargs: object,
) -> PolyCollection:
    """``ax.bar`` (``horizontal=True``: ``ax.barh``, ``x`` then being the y positions and
    ``bottom`` the left ends) drawn as ONE collection of rectangles instead of a patch per bar:
    the same picture, a fraction of the cost to build, lay out and draw. Non-finite bars are
    skipped; ``color`` is one color or one per bar. The value axis sticks to 0 like ``bar``."""
    x, h, w, b = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (x, height, width, bottom)))
    lo = x - w / 2 if align == "center" else x
    hi = lo + w
    top = b + h
    ok = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(b) & np.isfinite(top)
    if horizontal:
        verts = np.stack([np.stack([b, lo], -1), np.stack([b, hi], -1), np.stack([top, hi], -1),
                          np.stack([top, lo], -1)], axis=1)
    else:
        verts = np.stack([np.stack([lo, b], -1), np.stack([hi, b], -1), np.stack([hi, top], -1),
                          np.stack([lo, top], -1)], axis=1)
    colors = color
    if color is not None and not is_color_like(color):  # one color per bar
        colors = [c for c, k in zip(color, ok.ravel(), strict=True) if k]
    coll = PolyCollection(verts[ok], closed=True, facecolors=colors, edgecolors=edgecolor, linewidths=linewidth,
                          **kwargs)
    (coll.sticky_edges.x if horizontal else coll.sticky_edges.y).append(0.0)
    ax.add_collection(coll, autolim=True)
    return coll


def finish(fig: Figure, numbers: Mapping[str, float], *, dpi: int = DPI) -> Rendered:
    """PNG bytes at ``dpi``, a preview at most :data:`PREVIEW_WIDTH_PX` wide, and the numbers
    (finite floats only: NaN / None figures are left out)."""
    clean = {}
    for k, v in numbers.items():
        if v is None:
            continue
        f = float(v)
        if math.isfinite(f):
            clean[k] = f
    fig.set_dpi(dpi)
    canvas = _Canvas(fig)
    light_ticks(fig, canvas.get_renderer())
    png, preview = _png_and_preview(fig, dpi, PREVIEW_WIDTH_PX, canvas=canvas)
    return Rendered(png=png, preview_png=preview, numbers=clean)


def no_data(name: str, day: dt.date, tz: str, reason: str, coverage_pct: float | None) -> Rendered:
    """The "No data — coverage N %" figure of :func:`render_no_data`; ``numbers`` holds only
    ``coverage_pct`` when it is known."""
    cov = "unknown" if coverage_pct is None else f"{coverage_pct:.0f} %"
    rendered = render_no_data(title(name, day, tz), f"No data — coverage {cov}\n{reason}", PREVIEW_WIDTH_PX)
    rendered.numbers = {} if coverage_pct is None else {"coverage_pct": float(coverage_pct)}
    return rendered


def text_color_for(rgba: Sequence[float]) -> str:
    """Black or white, whichever reads better on a cell of color ``rgba``."""
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


# ---------------------------------------------------------------------------------------------
# Time
# ---------------------------------------------------------------------------------------------


def day_bounds_s(day: dt.date, tz: str) -> tuple[float, float]:
    """The partition day ``[start, end)`` in epoch seconds (local midnight to local midnight)."""
    start, end = day_window(day, tz)
    return start.timestamp(), end.timestamp()


def hours_since_start(epoch_s: np.ndarray, day: dt.date, tz: str) -> np.ndarray:
    """Epoch seconds -> hours since the local midnight that starts ``day`` (the x of time axes)."""
    start, _ = day_bounds_s(day, tz)
    return (np.asarray(epoch_s, dtype=float) - start) / 3600.0


def set_time_axis(ax: Axes, day: dt.date, tz: str, *, label: bool = True, step_h: int | None = None) -> None:
    """x = hours since local midnight; limits = the whole day (23/24/25 h); ticks on local whole
    hours every ``step_h`` hours (2 by default, 3 on narrow axes), labelled ``HH:MM`` in ``tz``."""
    start, end = day_bounds_s(day, tz)
    hours = (end - start) / 3600.0
    zone = ZoneInfo(tz)
    t0 = dt.datetime.fromtimestamp(start, zone)
    first = ((60 - t0.minute) % 60) / 60.0
    if step_h is None:
        width = ax.get_position().width * ax.figure.get_figwidth()
        step_h = 2 if width >= 5 else 3 if width >= 3 else 6
    ticks = np.arange(first, hours + 1e-9, float(step_h))
    ax.set_xlim(0, hours)
    set_ticks(ax.xaxis, ticks, [dt.datetime.fromtimestamp(start + h * 3600.0, zone).strftime("%H:%M") for h in ticks],
              fontsize=FS_TICK)
    minor_ticks(ax, np.arange(first, hours + 1e-9, 1.0), ticks)
    if label:
        ax.set_xlabel(f"time of day ({tz})", fontsize=FS_LABEL)


def minor_ticks(ax: Axes, positions: np.ndarray, major: np.ndarray) -> None:
    """Minor x ticks at ``positions`` (those not on a ``major`` tick), drawn like matplotlib's
    (outward, 2 pt long, 0.6 pt wide, black) as ONE marker line below the axes instead of a
    ``Tick`` object each: a time axis has 24 of them, and ticks are among the costliest artists
    to create, lay out and draw."""
    ax.xaxis.set_minor_locator(NullLocator())
    pos = np.asarray(positions, dtype=float)
    pos = pos[~np.isclose(pos[:, None], np.asarray(major, dtype=float)[None, :]).any(axis=1)] if len(major) else pos
    if pos.size:
        ax.plot(pos, np.zeros(pos.size), transform=ax.get_xaxis_transform(), linestyle="none", marker=TICKDOWN,
                markersize=2.0, markeredgewidth=0.6, color="black", clip_on=False, scalex=False, scaley=False,
                zorder=2.5)


def set_hour_of_day_axis(ax: Axes, tz: str, *, label: bool = True) -> None:
    """Categorical x = local hour of day 0..23 (bars centred on the hour)."""
    ax.set_xlim(-0.6, 23.6)
    set_ticks(ax.xaxis, range(0, 24, 2), [f"{h:02d}:00" for h in range(0, 24, 2)], fontsize=FS_TICK)
    minor_ticks(ax, np.arange(24.0), np.arange(0.0, 24.0, 2.0))
    if label:
        ax.set_xlabel(f"hour of day ({tz})", fontsize=FS_LABEL)


_MINUTE_TICKS = (1, 2, 5, 10, 15, 30, 60, 120, 240, 480, 720, 1440, 2880, 10080)


def _minutes_text(m: float) -> str:
    if m >= 1440 and m % 1440 == 0:
        return f"{m / 1440:.0f} d"
    if m >= 60 and m % 60 == 0:
        return f"{m / 60:.0f} h"
    return f"{m:g} min"


def set_log_minutes_axis(ax: Axes, lo: float, hi: float, quantity: str) -> None:
    """Log x in minutes over ``[lo, hi]`` with readable ticks (5 min, 1 h, 8 h ...)."""
    lo = max(lo, 0.1)
    hi = max(hi, lo * 1.5)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ticks = [t for t in _MINUTE_TICKS if lo <= t <= hi]
    if len(ticks) > 7:
        ticks = [t for t in ticks if t in (1, 5, 15, 60, 240, 720, 1440, 10080)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _minutes_text(v)))
    ax.set_xlabel(f"{quantity} (minutes, log scale)", fontsize=FS_LABEL)


# ---------------------------------------------------------------------------------------------
# Small numeric helpers
# ---------------------------------------------------------------------------------------------


def ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their cumulative share (0-1], for a step plot (``where="post"``)."""
    x = np.sort(np.asarray(values, dtype=float))
    return x, np.arange(1, x.size + 1) / max(x.size, 1)


def column_or_none(table: pa.Table, name: str) -> pa.ChunkedArray | None:
    return table.column(name) if name in table.column_names else None
