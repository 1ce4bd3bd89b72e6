"""Rendered plots (matplotlib, Agg backend, no global pyplot state).

Every function returns PNG bytes; figures are created with ``matplotlib.figure.Figure`` directly
so nothing leaks between assets or threads. A figure is drawn once: the full PNG and its preview
are encoded from the same pixels (:func:`png_and_preview`).
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import math
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
from matplotlib.patches import Patch  # noqa: E402
from PIL import Image  # noqa: E402

from gpu_pipeline.lib.schemas import STATES  # noqa: E402

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
#: zlib level of the full PNGs: 1 encodes several times faster than the default 6; plots are
#: flat colors and text, so the files grow by well under 2x. Previews are small (and embedded in
#: the asset metadata): they keep the default level.
PNG_COMPRESS_LEVEL = 1
PREVIEW_COMPRESS_LEVEL = 6


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
    laid out once per font, size and dpi -- the FreeType calls of ``RendererAgg.draw_text`` of
    matplotlib 3.10 -- and the bitmap and its metrics are reused, pixel for pixel the same as a
    fresh rendering. Math text, non-antialiased text, OpenType features or a language tag, and
    any failure of that path fall back to the stock renderer."""

    def _raster(self, s: str, prop) -> tuple[np.ndarray, float, float, float, float, float] | None:
        try:
            key = (tuple(prop.get_family()), prop.get_style(), prop.get_variant(), prop.get_weight(),
                   prop.get_stretch(), prop.get_size_in_points(), prop.get_file(), self.dpi, get_hinting_flag())
            return _text_raster(s, key, prop, self)
        except Exception:  # noqa: BLE001 -- any surprise: the stock path draws it
            return None

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


def _encode(image: Image.Image, level: int = PNG_COMPRESS_LEVEL) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="png", compress_level=level)
    return buf.getvalue()


def png_and_preview(
    fig: Figure, dpi: int, preview_width_px: int | None, *, canvas: FigureCanvasAgg | None = None
) -> tuple[bytes, bytes]:
    """Draw ``fig`` once at ``dpi`` and return the PNG and a preview at most ``preview_width_px``
    wide (``None``: no preview, ``b""``), downscaled from the same pixels: one layout and one
    rendering. RGB (the figures are opaque), no metadata, so equal figures give equal bytes."""
    fig.set_dpi(dpi)
    if canvas is None:
        canvas = _Canvas(fig)
    canvas.draw()
    image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    image = image.convert("RGB")
    full = _encode(image)
    if preview_width_px is None:
        return full, b""
    w, h = image.size
    if w > preview_width_px:
        # reducing_gap: a fast integer box reduction first, Lanczos for the last factor < 3
        image = image.resize((preview_width_px, max(1, round(h * preview_width_px / w))),
                             Image.Resampling.LANCZOS, reducing_gap=3.0)
    # 256 colors (octree): a preview a quarter the size of the RGB one, embedded in the metadata
    image = image.quantize(256, method=Image.Quantize.FASTOCTREE)
    return full, _encode(image, PREVIEW_COMPRESS_LEVEL)


def render_no_data(title: str, message: str) -> Rendered:
    fig = Figure(figsize=(10, 3))
    ax = fig.add_subplot()
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=14, color="#555555")
    png, preview = png_and_preview(fig, 100, HEATMAP_PREVIEW_WIDTH_PX)
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
    return _HeatmapFigure().render(_encode_states(states), None, tz, full_title, preview)


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
    main = figure.render(enc, None, tz, full_title, True)
    dev = pc.dictionary_encode(states.column("device_name").combine_chunks())
    dev_idx = np.asarray(pc.fill_null(dev.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    names = dev.dictionary.to_pylist()
    out: dict[str, Rendered] = {}
    for k in sorted(range(len(names)), key=names.__getitem__):
        device = names[k]
        if device:
            out[device] = figure.render(enc, dev_idx == k, tz, f"{title}: {device} — {day.isoformat()} ({tz})", False)
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

    def render(self, enc: _Encoded, rows: np.ndarray | None, tz: str, full_title: str, preview: bool) -> Rendered:
        bucket, gpu, host, state = enc.bucket, enc.gpu, enc.host, enc.state
        if rows is not None:
            bucket, gpu, host, state = bucket[rows], gpu[rows], host[rows], state[rows]
        # Rows: the distinct (host, gpu) pairs sorted by name; a GPU's data goes to its last pair.
        pair = np.unique(host * enc.gpus + gpu)
        last = np.full(enc.gpus, -1, dtype=np.int64)
        np.maximum.at(last, pair % enc.gpus, np.arange(pair.size))
        times, col_of_record = np.unique(bucket, return_inverse=True)
        mat = np.full((pair.size, times.size), STATES.index("na"), dtype=np.int8)
        mat[last[gpu], col_of_record] = state

        n_gpus = int(pair.size)
        fig, ax = self.fig, self.ax
        # Fixed margins in inches: title on top; tick labels, axis label and a 2-row legend below.
        bottom_in, top_in = 0.95, 0.45
        height = float(np.clip(n_gpus * 0.03, 2.5, 26.0)) + bottom_in + top_in
        fig.set_size_inches(14, height)
        ax.set_position((0.16, bottom_in / height, 0.82, 1 - (bottom_in + top_in) / height))
        start = times[0] / 1e6
        end = times[-1] / 1e6 + 300
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
        labels = [f"{enc.host_names[h].split('.')[0]} ({n})" for h, n in zip(pair_host[starts], ends - starts,
                                                                               strict=True)]
        self.bounds.set_segments([((0, b), (hours, b)) for b in starts[1:]])
        self.bounds.set_linewidth(0.6 if n_gpus < 400 else 0.3)
        step = max(1, int(np.ceil(len(centers) / MAX_ROW_LABELS)))
        ax.set_yticks(centers[::step], labels[::step], fontsize=8 if len(centers) <= 40 else 6)
        # Time axis in the configured time zone: ticks on local whole hours.
        first_tick = (60 - t0.minute) % 60 / 60.0
        ticks = np.arange(first_tick, hours + 1e-9, 2.0 if hours > 12 else 1.0)
        ax.set_xticks(ticks, [(t0 + dt.timedelta(hours=float(h))).strftime("%H:%M") for h in ticks], fontsize=8)
        ax.set_xlabel(f"time of day ({tz})")
        ax.set_ylabel(f"GPUs grouped by host ({n_gpus} GPUs, {len(centers)} hosts)")

        counts = np.bincount(mat.ravel(), minlength=len(STATES))
        share = counts / counts.sum()
        for k, (text, s) in enumerate(zip(self.legend.get_texts(), STATES, strict=True)):
            text.set_text(f"{STATE_LABELS[s]}: {share[k]:.1%}")
        ax.set_title(full_title)
        numbers = {f"share_{s}": float(share[k]) for k, s in enumerate(STATES)}
        numbers["gpus"] = float(n_gpus)
        numbers["hosts"] = float(len(centers))
        png, small = png_and_preview(fig, HEATMAP_DPI, HEATMAP_PREVIEW_WIDTH_PX if preview else None,
                                     canvas=self.canvas)
        return Rendered(png=png, preview_png=small, numbers=numbers)
