"""Rendered plots (matplotlib, Agg backend, no global pyplot state).

Every function returns PNG bytes; figures are created with ``matplotlib.figure.Figure`` directly
so nothing leaks between assets or threads. What keeps a day of plots cheap (about 25 images):

* a figure is drawn once; the full PNG and its preview come from the same pixels
  (:func:`png_and_preview`); the PNG is written unfiltered at zlib level 1 (:func:`_png_rgb`);
* text is shaped and rasterized once per distinct string, font and dpi in the process
  (:class:`_Renderer`, :class:`_LabelText`): output is identical, pixel for pixel;
* ticks are drawn as a few light artists instead of matplotlib ``Tick`` objects
  (:func:`light_ticks`), and many in-axes annotations as one :class:`TextBatch`;
* the heatmap is built with numpy, blitted at device resolution (:class:`_PixelImage`) and one
  figure is redrawn for the fleet and every device class (:func:`gpu_timeline_heatmaps`).

The caches are process-wide and bounded; they hold no figure, only strings' bitmaps and sizes.

The text cache, the layout cache and the light ticks use matplotlib internals (the Agg renderer's
text drawing, ``Text._get_layout``, Axis tick machinery) of the pinned ``matplotlib==3.11.2``: the
text path falls back to matplotlib's own on any error; the others are covered by the plot tests,
which must pass before the pin is moved.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import gc
import io
import math
import struct
import weakref
import zlib
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from matplotlib.artist import Artist  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.layout_engine import ConstrainedLayoutEngine  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator  # noqa: E402
from matplotlib.transforms import ScaledTranslation  # noqa: E402
from PIL import Image  # noqa: E402

from gpu_pipeline.lib.schemas import STATES  # noqa: E402
from gpu_pipeline.lib.states import BUCKET  # noqa: E402

# DESIGN.md 5.1 palette; idle_backfill (not in the original tool) is a pale orange between
# idle_shared and na so it reads as "idle capacity".
STATE_COLORS: dict[str, str] = {
    "idle_prioritized": "#ff4444",
    "idle_shared": "#ff8800",
    "idle_backfill": "#ffcc80",
    "busy_prioritized": "#44ff44",
    "busy_shared": "#00cc99",
    "busy_backfill": "#4488ff",
    "na": "#cccccc",
}
STATE_LABELS: dict[str, str] = {
    "idle_prioritized": "Idle (prioritized)",
    "idle_shared": "Idle (open capacity)",
    "idle_backfill": "Idle (backfill slot only)",
    "busy_prioritized": "Busy (prioritized)",
    "busy_shared": "Busy (open capacity)",
    "busy_backfill": "Busy (backfill)",
    "na": "Not available / no data",
}
MAX_ROW_LABELS = 60
#: RGBA of each state code (index into ``STATES``).
_PALETTE = np.array([[round(255 * c) for c in to_rgba(STATE_COLORS[s])] for s in STATES], dtype=np.uint8)
HEATMAP_DPI = 100
#: The ``metrics/gpu_states`` columns :func:`gpu_timeline_heatmaps` reads.
HEATMAP_COLUMNS = ("bucket_start_utc", "gpu_id", "host", "device_name", "state")
HEATMAP_PREVIEW_WIDTH_PX = 900
BUCKET_S = int(BUCKET.total_seconds())  #: a heatmap column: one 5-minute state bucket
#: zlib level of the full PNGs: 1 encodes several times faster than the default 6; plots are
#: flat colors and text, so the files grow by well under 2x. Previews are small (and embedded in
#: the asset metadata): they keep the default level.
PNG_COMPRESS_LEVEL = 1
PREVIEW_COMPRESS_LEVEL = 6


@contextlib.contextmanager
def heap_frozen():
    """Keep the objects alive now out of the cyclic garbage collector's scans while plots are
    built (``gc.freeze``): figures allocate hundreds of thousands of short-lived objects, and each
    full collection would otherwise walk the whole heap of the process (tables, Dagster state)
    again. Objects are never leaked: the heap is unfrozen at the end."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass
class Rendered:
    png: bytes
    preview_png: bytes
    numbers: dict[str, float]

    def preview_markdown(self, alt: str) -> str:
        b64 = base64.b64encode(self.preview_png).decode()
        return f"![{alt}](data:image/png;base64,{b64})"


class _Renderer(RendererAgg):
    """``RendererAgg`` that shapes and rasterizes each distinct plain string once per process.

    Matplotlib 3.11 renders text glyph by glyph from Python and measures it again for every new
    renderer (that is, every figure); the plots draw thousands of short, mostly repeated strings
    (tick labels, cell values, legends), which made text the largest single cost. Here a string is
    laid out and rasterized in one piece per font, size and dpi (the FreeType calls of
    ``RendererAgg.draw_text`` in matplotlib 3.10) and the bitmap and its metrics are reused: a
    cached string draws exactly the pixels of a fresh one, so equal figures still give equal
    bytes. Math text, non-antialiased text, OpenType features or a language tag, and any failure
    of that path fall back to the stock renderer."""

    def _key(self, prop) -> tuple:
        return (tuple(prop.get_family()), prop.get_style(), prop.get_variant(), prop.get_weight(),
                prop.get_stretch(), prop.get_size_in_points(), prop.get_file(), self.dpi, get_hinting_flag())

    def _raster(self, s: str, prop) -> tuple[np.ndarray, float, float, float, float, float] | None:
        try:
            return _text_raster(s, self._key(prop), prop, self)
        except Exception:  # noqa: BLE001 -- any surprise: the stock path draws it
            return None

    def _get_font_height_metrics(self, prop) -> tuple[float | None, float | None, float | None]:
        """Ascent, descent and line gap of the font (pixels), as ``Text._get_layout`` computes
        them from the OS/2 or hhea table when the renderer has no such method, cached."""
        try:
            key = self._key(prop)
            found = _FONT_HEIGHTS.get(key)
            if found is None:
                font = self._prepare_font(prop)
                found = (None, None, None)
                for table_name, gap, ascent, descent in (("OS/2", "sTypoLineGap", "sTypoAscender", "sTypoDescender"),
                                                         ("hhea", "lineGap", "ascent", "descent")):
                    table = font.get_sfnt_table(table_name)
                    if table is None:
                        continue
                    scale = prop.get_size_in_points() * self.dpi / 72 / font.get_sfnt_table("head")["unitsPerEm"]
                    found = (table[ascent] * scale, -table[descent] * scale, table[gap] * scale)
                    break
                _FONT_HEIGHTS[key] = found
            return found
        except Exception:  # noqa: BLE001 -- matplotlib measures it itself
            return None, None, None

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):  # noqa: D102
        plain = (not ismath and gc.get_antialiased()
                 and (mtext is None or (not getattr(mtext, "get_fontfeatures", lambda: None)()
                                        and not getattr(mtext, "get_language", lambda: None)())))
        entry = self._raster(s, prop) if plain else None
        if entry is None:
            return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
        image, xo, yo, _w, _h, d = entry
        rad = math.radians(angle)
        x = round(x + xo + d * math.sin(rad))
        y = round(y + yo + d * math.cos(rad))
        self._renderer.draw_text_image(image, x, y + 1, angle, gc)

    def get_text_width_height_descent(self, s, prop, ismath):  # noqa: D102
        entry = self._raster(s, prop) if ismath is False else None
        if entry is None:
            return super().get_text_width_height_descent(s, prop, ismath)
        return entry[3], entry[4], entry[5]


_TEXT_CACHE: dict[tuple, tuple[np.ndarray, float, float, float, float, float]] = {}
_FONT_HEIGHTS: dict[tuple, tuple[float | None, float | None, float | None]] = {}
_TEXT_CACHE_MAX = 20_000


def _text_raster(s: str, key: tuple, prop, renderer: _Renderer) -> tuple[np.ndarray, float, float, float, float, float]:
    """Bitmap, bitmap offset, width, height and descent (pixels) of ``s``, cached by ``s`` and
    ``key`` (everything the result depends on: font properties, dpi, hinting); ``prop`` and
    ``renderer`` are only used to rasterize on a miss."""
    entry = _TEXT_CACHE.get((s, key))
    if entry is not None:
        return entry
    font = renderer._prepare_font(prop)
    font.set_text(s, 0, flags=key[-1])
    w, h = font.get_width_height()
    d = font.get_descent()
    font.draw_glyphs_to_bitmap(antialiased=True)
    xo, yo = font.get_bitmap_offset()
    entry = (np.array(font.get_image(), dtype=np.uint8), xo / 64.0, yo / 64.0, w / 64.0, h / 64.0, d / 64.0)
    if len(_TEXT_CACHE) >= _TEXT_CACHE_MAX:
        _TEXT_CACHE.clear()
    _TEXT_CACHE[(s, key)] = entry
    return entry


class _Canvas(FigureCanvasAgg):
    """An Agg canvas drawing with :class:`_Renderer`."""

    def get_renderer(self):  # noqa: D102
        w, h = self.get_width_height(physical=True)
        key = (w, h, self.figure.dpi)
        if getattr(self, "_renderer_key", None) != key:
            self.renderer = _Renderer(w, h, self.figure.dpi)
            self._renderer_key = key
        return self.renderer


def _encode(image: Image.Image, level: int = PREVIEW_COMPRESS_LEVEL) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="png", compress_level=level)
    return buf.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_rgb(rgba: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of ``rgba`` (h, w, 4; alpha dropped): every scanline with filter type 0
    and zlib at :data:`PNG_COMPRESS_LEVEL`. Plots are long runs of flat color that deflate well
    unfiltered, so this is about as small as Pillow's adaptive filtering and 2-3x faster."""
    h, w = rgba.shape[:2]
    rows = np.empty((h, 1 + 3 * w), dtype=np.uint8)
    rows[:, 0] = 0  # filter type "None"
    rows[:, 1:].reshape(h, w, 3)[...] = rgba[..., :3]
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit truecolor, no interlace
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(rows.data, PNG_COMPRESS_LEVEL)) + _png_chunk(b"IEND", b""))


#: Axes positions (figure fractions) are rounded to this after the layout: a millionth of the
#: figure is a thousandth of a pixel at the plots' sizes.
LAYOUT_STEP = 1e-6


def _settle_layout(fig: Figure) -> None:
    """Run the figure's constrained layout once, as drawing would, round every axes' position to
    :data:`LAYOUT_STEP`, and leave the positions fixed for the draw. The layout solver's result
    varies in the last bits with where its objects lie in memory (an axes' scale one ulp apart
    moved a line's antialiased edge by one gray level: the same figure gave other bytes now and
    then); rounded, equal figures give equal bytes."""
    engine = fig.get_layout_engine()
    if not isinstance(engine, ConstrainedLayoutEngine) or not fig.axes:
        return
    engine.execute(fig)
    for ax in fig.axes:
        box = ax.get_position(original=False)
        x0, y0, x1, y1 = (round(v / LAYOUT_STEP) * LAYOUT_STEP for v in (box.x0, box.y0, box.x1, box.y1))
        ax.set_position([x0, y0, x1 - x0, y1 - y0], which="both")
    fig.set_layout_engine("none")


def png_and_preview(
    fig: Figure, dpi: int, preview_width_px: int | None, *, canvas: FigureCanvasAgg | None = None
) -> tuple[bytes, bytes]:
    """Draw ``fig`` once at ``dpi`` and return the PNG and a preview at most ``preview_width_px``
    wide (``None``: no preview, ``b""``), downscaled from the same pixels: one layout and one
    rendering. RGB (the figures are opaque), no metadata, so equal figures give equal bytes."""
    fig.set_dpi(dpi)
    if canvas is None:
        canvas = _Canvas(fig)
    _settle_layout(fig)  # (the layout measures text with the canvas's renderer, as the draw would)
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    full = _png_rgb(rgba)
    if preview_width_px is None:
        return full, b""
    image = Image.fromarray(rgba).convert("RGB")
    w, h = image.size
    if w > preview_width_px:
        # reducing_gap: a fast integer box reduction first, Lanczos only for the last factor < 1.1
        image = image.resize((preview_width_px, max(1, round(h * preview_width_px / w))),
                             Image.Resampling.LANCZOS, reducing_gap=1.1)
    # 256 colors (octree): a preview a quarter the size of the RGB one, embedded in the metadata
    image = image.quantize(256, method=Image.Quantize.FASTOCTREE)
    return full, _encode(image)


_LAYOUTS: dict[tuple, tuple] = {}


class _LabelText(Text):
    """A ``Text`` whose layout (extent and line offsets relative to its anchor, independent of
    where it is) is computed once per distinct string, font, alignment, rotation and dpi in the
    process: tick labels are measured by every layout pass and draw, and repeat across figures."""

    def _get_layout(self, renderer):
        if self.get_usetex() or self.get_wrap():
            return super()._get_layout(renderer)
        fp = self._fontproperties
        key = (self.get_text(), tuple(fp.get_family()), fp.get_style(), fp.get_variant(), fp.get_weight(),
               fp.get_stretch(), fp.get_size_in_points(), fp.get_file(), fp.get_math_fontfamily(),
               self.get_figure(root=True).dpi, self.get_rotation(), self.get_rotation_mode(),
               self.get_horizontalalignment(), self.get_verticalalignment(), self._get_multialignment(),
               self._linespacing, self.get_parse_math(), type(renderer))
        layout = _LAYOUTS.get(key)
        if layout is None:
            layout = super()._get_layout(renderer)
            if len(_LAYOUTS) >= _TEXT_CACHE_MAX:
                _LAYOUTS.clear()
            _LAYOUTS[key] = layout
        return layout


class TextBatch(Artist):
    """Many short annotations in an axes (cell values, bar labels) drawn by ONE artist through
    one reused text: each is what ``ax.text(x, y, s, **style)`` draws, without an artist per
    string to create, lay out and draw. Kept out of the layout (they lie inside the axes).
    ``styles``: per-text ``color`` / ``fontweight`` (others come from ``style``)."""

    def __init__(self, ax, xs, ys, strings, styles=None, **style):
        super().__init__()
        style.setdefault("verticalalignment", style.pop("va", "baseline"))
        style.setdefault("horizontalalignment", style.pop("ha", "left"))
        style.setdefault("transform", ax.transData)
        style.setdefault("clip_on", False)
        self._text = _LabelText(0, 0, "", **style)
        self._text.set_figure(ax.get_figure(root=False))
        self._color = self._text.get_color()
        self._weight = self._text.get_fontweight()
        self._items = list(zip(xs, ys, strings, styles or [None] * len(strings), strict=True))
        self.set_zorder(self._text.get_zorder())
        self.set_in_layout(False)

    def draw(self, renderer):  # noqa: D102
        if not self.get_visible():
            return
        text = self._text
        for x, y, s, own in self._items:
            text.set_text(s)
            text.set_position((x, y))
            text.set_color(own.get("color", self._color) if own else self._color)
            text.set_fontweight(own.get("fontweight", self._weight) if own else self._weight)
            text.draw(renderer)
        self.stale = False


def add_texts(ax, xs, ys, strings, styles=None, **style) -> TextBatch:
    """Add a :class:`TextBatch` to ``ax`` (like ``ax.text`` for each string)."""
    batch = TextBatch(ax, xs, ys, strings, styles, **style)
    ax.add_artist(batch)
    return batch


#: Per-label text properties of axes labelled with :func:`set_fixed_ticks` (index = tick).
_LABEL_STYLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def set_fixed_ticks(axis, ticks, labels=None, *, fontsize: float | None = None,
                    styles: list[dict] | None = None) -> None:
    """``axis.set_ticks(ticks, labels, fontsize=...)`` without creating a ``Tick`` per label
    (:func:`light_ticks` draws them); ``styles``: text properties per label (e.g. ``color``,
    ``fontweight``). Unlike ``set_ticks`` the view limits are not widened to the ticks: set them."""
    axis.set_major_locator(FixedLocator(ticks))
    if labels is not None:
        axis.set_major_formatter(FixedFormatter(list(labels)))
    if fontsize is not None:
        axis.set_tick_params(labelsize=fontsize)
    if styles:
        _LABEL_STYLES[axis] = list(styles)
    else:
        _LABEL_STYLES.pop(axis, None)


def light_ticks(fig: Figure, renderer: RendererAgg) -> list:
    """Replace the ``Tick`` objects of every plain axis of ``fig`` by three light artists per
    side: one marker line for the tick marks, one line collection for the grid lines and one
    ``Text`` per label -- same positions, sizes, colors and fonts.

    A matplotlib ``Tick`` is five artists that are created, updated and measured again by every
    layout pass and every draw; with ~700 ticks a day they were the largest cost of the plots.
    The ticks are those matplotlib would draw now (its locator and formatter, the view limits,
    per-label colors and weights already set); the axis label is placed where matplotlib would
    put it (``labelpad`` beyond the tick labels); colorbars and minor ticks too. Axes that are off
    and axes whose formatter has an offset text are left to matplotlib. Call it once everything
    is drawn on the
    figure, with a renderer at the figure's dpi (to measure the labels). Returns the artists
    it added."""
    plans = []
    for ax in fig.axes:
        light = ax.axison
        for axis in (ax.xaxis, ax.yaxis):
            plan = _tick_plan(ax, axis) if light else None
            if plan is not None:
                plans.append(plan)
            elif _LABEL_STYLES.get(axis):  # matplotlib draws these ticks: style its labels
                for label, style in zip(axis.get_ticklabels(), _LABEL_STYLES[axis], strict=False):
                    label.update(style)
    # Shared axes share their locator: every plan is computed before any axis is emptied.
    for ax, axis, artists, offset in plans:
        # No location (an empty FixedLocator, not a NullLocator: the axis still reports its ticks
        # at the bottom / left, so titles are not pushed around a phantom top axis).
        axis.set_major_locator(FixedLocator([]))
        axis.set_minor_locator(NullLocator())
        axis.minorTicks = []  # no minor tick either (the axis would create one to draw none)
        for artist in artists:
            ax.add_artist(artist)
        _place_axis_label(ax, axis, offset, renderer, [a for a in artists if isinstance(a, Text)])
    return [a for plan in plans for a in plan[2]]


def _tick_plan(ax, axis):
    """The light artists of ``axis`` (major and minor ticks), or None to leave it to matplotlib."""
    if not axis.get_visible():
        return None
    is_x = axis is ax.xaxis
    low, high = sorted(axis.get_view_interval())
    scale = axis.get_transform()
    lo_t, hi_t = scale.transform([low, high])
    slack = (hi_t - lo_t) * 1e-10
    zorder = axis.get_zorder()
    artists: list = []
    offset = 0.0  # points from the spine to the outer edge of the tick labels
    for major in (True, False):
        if major:
            locs, formatter = axis.get_majorticklocs(), axis.get_major_formatter()
        else:  # without the locations of major ticks, as matplotlib draws them
            if isinstance(axis.get_minor_locator(), NullLocator):
                continue
            locs, formatter = axis.get_minorticklocs(), axis.get_minor_formatter()
        locs = np.asarray(locs, dtype=float)
        labels = formatter.format_ticks(locs) if locs.size else []
        if getattr(formatter, "get_offset", lambda: "")():
            return None
        if not locs.size:
            continue
        loc_t = scale.transform(locs)
        ticks = axis.majorTicks if major else axis.minorTicks  # the first one is created when none was
        ref = ticks[0]
        styles = _LABEL_STYLES.get(axis, []) if major else []
        shown = [i for i in range(locs.size) if lo_t - slack <= loc_t[i] <= hi_t + slack]
        xs = locs[shown]
        for side, line, label in ((1, ref.tick1line, ref.label1), (2, ref.tick2line, ref.label2)):
            which = f"tick{side}"
            if line.get_visible() and xs.size and line.get_markersize() > 0:
                transform = ax.get_xaxis_transform(which=which) if is_x else ax.get_yaxis_transform(which=which)
                pos = np.zeros(xs.size) if side == 1 else np.ones(xs.size)
                artists.append(Line2D(xs if is_x else pos, pos if is_x else xs, transform=transform,
                                      linestyle="none", marker=line.get_marker(), markersize=line.get_markersize(),
                                      markeredgewidth=line.get_markeredgewidth(), color=line.get_markeredgecolor(),
                                      clip_on=False, zorder=zorder))
            if label.get_visible():
                across = label.get_position()[1 if is_x else 0]  # 0 or 1 in axes coordinates
                for i in shown:
                    if not labels[i]:
                        continue
                    tick = ticks[i] if i < len(ticks) else ref
                    own = tick.label1 if side == 1 else tick.label2
                    text = _LabelText(locs[i] if is_x else across, across if is_x else locs[i], labels[i],
                                      transform=label.get_transform(), verticalalignment=label.get_verticalalignment(),
                                      horizontalalignment=label.get_horizontalalignment(),
                                      fontproperties=own.get_fontproperties(), color=own.get_color(),
                                      rotation=own.get_rotation(), clip_on=False, zorder=zorder)
                    if i < len(styles) and styles[i]:
                        text.update(styles[i])
                    artists.append(text)
                offset = max(offset, ref.get_pad() + ref.get_tick_padding())
        grid = ref.gridline
        if grid.get_visible() and xs.size:
            transform = ax.get_xaxis_transform(which="grid") if is_x else ax.get_yaxis_transform(which="grid")
            segments = [((v, 0), (v, 1)) if is_x else ((0, v), (1, v)) for v in xs]
            artists.append(LineCollection(segments, transform=transform, colors=[grid.get_color()],
                                          linewidths=grid.get_linewidth(), linestyles=grid.get_linestyle(),
                                          alpha=grid.get_alpha(), zorder=zorder))
    return ax, axis, artists, offset


def _place_axis_label(ax, axis, offset: float, renderer: RendererAgg, labels: list) -> None:
    """Put the axis label ``labelpad`` beyond the tick labels, as ``Axis`` itself does."""
    if not axis.label.get_visible() or not axis.label.get_text():
        return
    is_x = axis is ax.xaxis
    per_pt = renderer.points_to_pixels(1.0)
    extent = 0.0
    for t in labels:
        box = t.get_window_extent(renderer)
        extent = max(extent, (box.height if is_x else box.width) / per_pt)
    gap = (offset + extent if labels else 0.0) + axis.labelpad
    side = axis.get_label_position()
    sign = -1.0 if side in ("bottom", "left") else 1.0
    shift = ScaledTranslation(0, sign * gap / 72, ax.figure.dpi_scale_trans) if is_x else (
        ScaledTranslation(sign * gap / 72, 0, ax.figure.dpi_scale_trans))
    x, y = axis.label.get_position()
    if is_x:
        axis.set_label_coords(x, 0.0 if side == "bottom" else 1.0, transform=ax.transAxes + shift)
    else:
        axis.set_label_coords(0.0 if side == "left" else 1.0, y, transform=ax.transAxes + shift)


def render_no_data(title: str, message: str, preview_width_px: int = HEATMAP_PREVIEW_WIDTH_PX) -> Rendered:
    """The "No data" figure: the title and the message (its preview as wide as the figure it
    stands for: the heatmap's by default)."""
    fig = Figure(figsize=(10, 3))
    ax = fig.add_subplot()
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=14, color="#555555")
    png, preview = png_and_preview(fig, 100, preview_width_px)
    return Rendered(png=png, preview_png=preview, numbers={})


class _PixelImage(Artist):
    """A categorical image filling its axes, scaled to device pixels with nearest-neighbour in
    PIL and blitted once: what ``imshow(interpolation="nearest")`` draws, without Agg's generic
    resampler (the slowest part of a 1,000-GPU heatmap)."""

    def __init__(self, ax):
        super().__init__()
        self.axes = ax
        self.set_figure(ax.figure)
        self.set_transform(ax.transAxes)
        self._small: Image.Image | None = None
        self.zorder = 0

    def set_data(self, rgba: np.ndarray) -> None:
        """``rgba``: (rows, columns, 4) uint8, row 0 at the top of the axes."""
        self._small = Image.fromarray(np.ascontiguousarray(rgba[::-1]), "RGBA")  # Agg rows run bottom-up
        self.stale = True

    def draw(self, renderer):
        if not self.get_visible() or self._small is None:
            return
        box = self.axes.bbox
        x0, x1 = int(round(box.x0)), int(round(box.x1))
        y0, y1 = int(round(box.y0)), int(round(box.y1))
        if x1 <= x0 or y1 <= y0:
            return
        pixels = np.array(self._small.resize((x1 - x0, y1 - y0), Image.Resampling.NEAREST))
        gc = renderer.new_gc()
        gc.set_clip_rectangle(None)
        renderer.draw_image(gc, x0, y0, pixels)
        gc.restore()
        self.stale = False


@dataclass
class _Encoded:
    """The ``metrics/gpu_states`` columns the heatmap needs, as integer codes (decoded once)."""

    bucket: np.ndarray  # int64 microseconds
    gpu: np.ndarray  # rank of the gpu id in sorted order
    host: np.ndarray  # rank of the host in sorted order
    state: np.ndarray  # index into STATES
    gpus: int
    host_names: list[str]


def _ranked(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Codes of a string column that sort like the strings, and the sorted distinct strings."""
    arr = pc.dictionary_encode(col.combine_chunks())
    names = arr.dictionary.to_pylist()
    order = sorted(range(len(names)), key=names.__getitem__)
    rank = np.empty(len(names), dtype=np.int64)
    rank[order] = np.arange(len(names))
    return rank[np.asarray(arr.indices.to_numpy(zero_copy_only=False), dtype=np.int64)], [names[i] for i in order]


def _encode_states(states: pa.Table) -> _Encoded:
    code_of = {s: i for i, s in enumerate(STATES)}
    gpu, gpu_names = _ranked(states.column("gpu_id"))
    host, host_names = _ranked(states.column("host"))
    st = pc.dictionary_encode(states.column("state").combine_chunks())
    lut = np.array([code_of[s] for s in st.dictionary.to_pylist()], dtype=np.int8)
    state = lut[np.asarray(st.indices.to_numpy(zero_copy_only=False), dtype=np.int64)] if len(lut) else (
        np.zeros(0, dtype=np.int8))
    bucket = np.asarray(states.column("bucket_start_utc").cast(pa.int64()).to_numpy(), dtype=np.int64)
    return _Encoded(bucket=bucket, gpu=gpu, host=host, state=state, gpus=len(gpu_names), host_names=host_names)


def _day_grid(day: dt.date, tz: str) -> tuple[float, float]:
    """The local day's bounds (epoch seconds): the heatmap's columns are its 5-minute buckets."""
    from gpu_pipeline.lib.plot_style import day_bounds_s  # plot_style imports this module

    return day_bounds_s(day, tz)


def gpu_timeline_heatmap(
    states: pa.Table,
    day: dt.date,
    tz: str = "UTC",
    title: str = "GPU timeline",
    *,
    preview: bool = True,
) -> Rendered:
    """Heatmap of GPU state per 5-minute bucket: one row per GPU, grouped by host.

    ``states`` has the ``metrics/gpu_states`` columns (at least :data:`HEATMAP_COLUMNS` but
    ``device_name``). Readable from 10 to 2,000 GPUs: rows shrink to one pixel, host labels are
    thinned to at most ``MAX_ROW_LABELS``, host boundaries are drawn. ``preview=False`` leaves
    ``preview_png`` empty (saves its encoding)."""
    full_title = f"{title} — {day.isoformat()} ({tz})"
    if states.num_rows == 0:
        return render_no_data(full_title, "No data: no GPU was seen in any snapshot this day")
    return _HeatmapFigure().render(_encode_states(states), None, _day_grid(day, tz), tz, full_title, preview)


def gpu_timeline_heatmaps(
    states: pa.Table, day: dt.date, tz: str = "UTC", title: str = "GPU timeline"
) -> tuple[Rendered, dict[str, Rendered]]:
    """The heatmap of all GPUs (with its preview) and one per device class (``device_name``, rows
    of that class only, titled ``"<title>: <device>"``, no preview), by device name. The columns
    are decoded once and one figure is redrawn for every image; each image shows what
    :func:`gpu_timeline_heatmap` of the matching rows shows."""
    full_title = f"{title} — {day.isoformat()} ({tz})"
    if states.num_rows == 0:
        return render_no_data(full_title, "No data: no GPU was seen in any snapshot this day"), {}
    enc = _encode_states(states)
    figure = _HeatmapFigure()
    grid = _day_grid(day, tz)
    main = figure.render(enc, None, grid, tz, full_title, True)
    dev = pc.dictionary_encode(states.column("device_name").combine_chunks())
    dev_idx = np.asarray(pc.fill_null(dev.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    names = dev.dictionary.to_pylist()
    out: dict[str, Rendered] = {}
    for k in sorted(range(len(names)), key=names.__getitem__):
        device = names[k]
        if device:
            out[device] = figure.render(enc, dev_idx == k, grid, tz, f"{title}: {device} — {day.isoformat()} ({tz})",
                                        False)
    return main, out


class _HeatmapFigure:
    """The heatmap's figure, built once and redrawn for each image (the fleet, then each device
    class): axes, ticks, legend and title are updated in place rather than rebuilt."""

    def __init__(self) -> None:
        self.fig = Figure(figsize=(14, 4))
        self.ax = self.fig.add_axes((0.16, 0.1, 0.82, 0.8))
        self.image = _PixelImage(self.ax)
        self.ax.add_artist(self.image)
        self.bounds = LineCollection([], colors="white")
        self.ax.add_collection(self.bounds, autolim=False)
        handles = [Patch(facecolor=STATE_COLORS[s], edgecolor="#666666", label=STATE_LABELS[s]) for s in STATES]
        self.legend = self.fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.57, 0.0), ncol=4,
                                      fontsize=8, frameon=False)
        self.canvas = _Canvas(self.fig)
        self.tick_artists: list = []

    def render(self, enc: _Encoded, rows: np.ndarray | None, grid: tuple[float, float], tz: str, full_title: str,
               preview: bool) -> Rendered:
        bucket, gpu, host, state = enc.bucket, enc.gpu, enc.host, enc.state
        if rows is not None:
            bucket, gpu, host, state = bucket[rows], gpu[rows], host[rows], state[rows]
        # Rows: one per GPU, under the host it was on in most buckets (a tie: the host it was on
        # last), sorted by host then GPU name. A GPU seen on several hosts (host renamed, board
        # moved) was a row per host, all its cells on the last, the others grey, counted twice.
        code = host * enc.gpus + gpu
        pair, count = np.unique(code, return_counts=True)
        pair_gpu = pair % enc.gpus
        n_hosts = int(np.unique(pair // enc.gpus).size)  # every host a GPU was seen on
        moved_gpu = np.bincount(pair_gpu, minlength=enc.gpus) > 1
        if moved_gpu.any():
            # only the rows of GPUs on several hosts (few) decide between their hosts
            sub = moved_gpu[gpu]
            last_seen = np.zeros(pair.size, dtype=np.int64)
            np.maximum.at(last_seen, np.searchsorted(pair, code[sub]), bucket[sub])
            order = np.lexsort((-last_seen, -count, pair_gpu))
            main = order[np.r_[True, pair_gpu[order][1:] != pair_gpu[order][:-1]]]
            pair = np.sort(pair[main])
            pair_gpu = pair % enc.gpus
        row_of = np.full(enc.gpus, -1, dtype=np.int64)
        row_of[pair_gpu] = np.arange(pair.size)
        n_moved = int(moved_gpu.sum())
        # Columns: every 5-minute bucket of the local day, whether the table has it or not (a bucket
        # missing from the table is drawn na where it is, not squeezed out of the time axis).
        start, end = grid
        n_cols = max(1, int(round((end - start) / BUCKET_S)))
        col = np.floor_divide(bucket - int(start * 1e6), int(BUCKET_S * 1e6))
        inside = (col >= 0) & (col < n_cols)
        mat = np.full((pair.size, n_cols), STATES.index("na"), dtype=np.int8)
        mat[row_of[gpu][inside], col[inside]] = state[inside]

        n_gpus = int(pair.size)
        fig, ax = self.fig, self.ax
        # Fixed margins in inches: title on top; tick labels, axis label and a 2-row legend below.
        bottom_in, top_in = 0.95, 0.45 + (0.25 if n_moved else 0.0)  # a second title line
        # at least one pixel row per GPU: a taller image past 26 inches (2,600 GPUs), not GPUs left out
        plot_in = max(float(np.clip(n_gpus * 0.03, 2.5, 26.0)), (n_gpus + 2) / HEATMAP_DPI)  # +2: rounding
        height = plot_in + bottom_in + top_in
        fig.set_size_inches(14, height)
        ax.set_position((0.16, bottom_in / height, 0.82, 1 - (bottom_in + top_in) / height))
        hours = (end - start) / 3600.0
        t0 = dt.datetime.fromtimestamp(start, ZoneInfo(tz))
        self.image.set_data(_PALETTE[mat])
        ax.set_xlim(0, hours)
        ax.set_ylim(n_gpus, 0)
        # Host boundaries and thinned host labels at group centres.
        pair_host = pair // enc.gpus
        starts = np.flatnonzero(np.r_[True, pair_host[1:] != pair_host[:-1]])
        ends = np.r_[starts[1:], n_gpus]
        centers = (starts + ends) / 2
        # a host's label counts its GPUs also seen on another host in the day ("moved")
        moved_rows = np.add.reduceat(moved_gpu[pair_gpu].astype(np.int64), starts) if n_gpus else np.zeros(0, int)
        labels = [f"{enc.host_names[h].split('.')[0]} ({n}" + (f", {k} moved)" if k else ")")
                  for h, n, k in zip(pair_host[starts], ends - starts, moved_rows, strict=True)]
        # host separators only where a GPU's row is a few pixels high: on thinner rows an antialiased
        # line tints a whole GPU's row (at 10,000 GPUs most of the plot lost the legend's colours)
        row_px = plot_in * HEATMAP_DPI / n_gpus
        self.bounds.set_segments([((0, b), (hours, b)) for b in starts[1:]] if row_px >= 3 else [])
        for side in ("top", "bottom"):  # nor a frame over the first and last GPU's rows
            ax.spines[side].set_visible(row_px >= 3)
        self.bounds.set_linewidth(0.6 if n_gpus < 400 else 0.3)
        step = max(1, int(np.ceil(len(centers) / MAX_ROW_LABELS)))
        set_fixed_ticks(ax.yaxis, centers[::step], labels[::step], fontsize=8 if len(centers) <= 40 else 6)
        # Time axis in the configured time zone: ticks on local whole hours.
        first_tick = (60 - t0.minute) % 60 / 60.0
        ticks = np.arange(first_tick, hours + 1e-9, 2.0 if hours > 12 else 1.0)
        # each label from the instant (a timedelta added to a local time keeps the wall clock across
        # a DST change: every label after 02:00 an hour off on a 23- or 25-hour day)
        set_fixed_ticks(ax.xaxis, ticks, [dt.datetime.fromtimestamp(start + h * 3600.0, t0.tzinfo).strftime("%H:%M")
                                          for h in ticks], fontsize=8)
        ax.set_xlabel(f"time of day ({tz})")
        ax.set_ylabel(f"GPUs grouped by host ({n_gpus} GPUs, {n_hosts} hosts)")

        counts = np.bincount(mat.ravel(), minlength=len(STATES))
        share = counts / counts.sum()
        for k, (text, s) in enumerate(zip(self.legend.get_texts(), STATES, strict=True)):
            text.set_text(f"{STATE_LABELS[s]}: {share[k]:.1%}")
        ax.set_title(full_title + (f"\n{n_moved} GPU{'s' if n_moved > 1 else ''} seen on more than one host: one row "
                                   "each, under the host it was on longest (label: moved)" if n_moved else ""))
        numbers = {f"share_{s}": float(share[k]) for k, s in enumerate(STATES)}
        numbers["gpus"] = float(n_gpus)
        numbers["hosts"] = float(n_hosts)
        numbers["gpus_moved"] = float(n_moved)
        for artist in self.tick_artists:  # the previous image's
            artist.remove()
        fig.set_dpi(HEATMAP_DPI)
        self.tick_artists = light_ticks(fig, self.canvas.get_renderer())
        png, small = png_and_preview(fig, HEATMAP_DPI, HEATMAP_PREVIEW_WIDTH_PX if preview else None,
                                     canvas=self.canvas)
        return Rendered(png=png, preview_png=small, numbers=numbers)
