"""Rendered plots (matplotlib, Agg backend, no global pyplot state).

Every function returns PNG bytes; figures are created with ``matplotlib.figure.Figure`` directly
so nothing leaks between assets or threads.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

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


@dataclass
class Rendered:
    png: bytes
    preview_png: bytes
    numbers: dict[str, float]

    def preview_markdown(self, alt: str) -> str:
        b64 = base64.b64encode(self.preview_png).decode()
        return f"![{alt}](data:image/png;base64,{b64})"


def _png(fig: Figure, dpi: int) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def _preview(fig: Figure, width_px: int = 900) -> bytes:
    w_in = fig.get_figwidth()
    return _png(fig, dpi=max(20, int(width_px / w_in)))


def render_no_data(title: str, message: str) -> Rendered:
    fig = Figure(figsize=(10, 3))
    ax = fig.add_subplot()
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=14, color="#555555")
    return Rendered(png=_png(fig, 100), preview_png=_preview(fig), numbers={})


def gpu_timeline_heatmap(
    states: pa.Table,
    day: dt.date,
    tz: str = "UTC",
    title: str = "GPU timeline",
) -> Rendered:
    """Heatmap of GPU state per 5-minute bucket: one row per GPU, grouped by host.

    ``states`` has the ``metrics/gpu_states`` columns. Readable from 10 to 2,000 GPUs: rows shrink
    to one pixel, host labels are thinned to at most ``MAX_ROW_LABELS``, host boundaries are drawn.
    """
    full_title = f"{title} — {day.isoformat()} ({tz})"
    if states.num_rows == 0:
        return render_no_data(full_title, "No data: no GPU was seen in any snapshot this day")

    code_of = {s: i for i, s in enumerate(STATES)}
    buckets = np.array(states.column("bucket_start_utc").cast(pa.int64()).to_numpy())
    gpu = states.column("gpu_id").to_pylist()
    host = states.column("host").to_pylist()
    state = states.column("state").to_pylist()

    order = sorted({(h, g) for h, g in zip(host, gpu, strict=True)})
    row_of = {g: i for i, (_, g) in enumerate(order)}
    times = np.unique(buckets)
    col_of = {t: i for i, t in enumerate(times)}
    mat = np.full((len(order), len(times)), code_of["na"], dtype=np.int8)
    for g, t, s in zip(gpu, buckets, state, strict=True):
        mat[row_of[g], col_of[t]] = code_of[s]

    n_gpus = len(order)
    # Fixed margins in inches: title on top; tick labels, axis label and a 2-row legend below.
    bottom_in, top_in = 0.95, 0.45
    height = float(np.clip(n_gpus * 0.03, 2.5, 26.0)) + bottom_in + top_in
    fig = Figure(figsize=(14, height))
    ax = fig.add_axes((0.16, bottom_in / height, 0.82, 1 - (bottom_in + top_in) / height))
    cmap = ListedColormap([STATE_COLORS[s] for s in STATES])
    norm = BoundaryNorm(np.arange(len(STATES) + 1) - 0.5, cmap.N)
    start = times[0] / 1e6
    end = times[-1] / 1e6 + 300
    zone = ZoneInfo(tz)
    t0 = dt.datetime.fromtimestamp(start, zone)
    ax.imshow(
        mat,
        aspect="auto",
        interpolation="nearest",
        cmap=cmap,
        norm=norm,
        extent=(0, (end - start) / 3600.0, n_gpus, 0),
    )
    # Host boundaries and thinned host labels at group centres.
    hosts_in_order = [h for h, _ in order]
    bounds, centers, labels = [], [], []
    i = 0
    while i < n_gpus:
        j = i
        while j < n_gpus and hosts_in_order[j] == hosts_in_order[i]:
            j += 1
        if i > 0:
            bounds.append(i)
        centers.append((i + j) / 2)
        labels.append(f"{hosts_in_order[i].split('.')[0]} ({j - i})")
        i = j
    if bounds:
        ax.hlines(bounds, 0, (end - start) / 3600.0, colors="white", linewidth=0.6 if n_gpus < 400 else 0.3)
    step = max(1, int(np.ceil(len(centers) / MAX_ROW_LABELS)))
    ax.set_yticks(centers[::step])
    ax.set_yticklabels(labels[::step], fontsize=8 if len(centers) <= 40 else 6)
    # Time axis in the configured time zone: ticks on local whole hours.
    hours = (end - start) / 3600.0
    first_tick = (60 - t0.minute) % 60 / 60.0
    ticks = np.arange(first_tick, hours + 1e-9, 2.0 if hours > 12 else 1.0)
    ax.set_xticks(ticks)
    ax.set_xticklabels(
        [(t0 + dt.timedelta(hours=float(h))).strftime("%H:%M") for h in ticks], fontsize=8
    )
    ax.set_xlabel(f"time of day ({tz})")
    ax.set_ylabel(f"GPUs grouped by host ({n_gpus} GPUs, {len(centers)} hosts)")

    counts = np.bincount(mat.ravel(), minlength=len(STATES))
    share = counts / counts.sum()
    handles = [
        Patch(facecolor=STATE_COLORS[s], edgecolor="#666666", label=f"{STATE_LABELS[s]}: {share[k]:.1%}")
        for k, s in enumerate(STATES)
    ]
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.57, 0.0), ncol=4, fontsize=8, frameon=False)
    ax.set_title(full_title)
    numbers = {f"share_{s}": float(share[k]) for k, s in enumerate(STATES)}
    numbers["gpus"] = float(n_gpus)
    numbers["hosts"] = float(len(centers))
    return Rendered(png=_png(fig, 100), preview_png=_preview(fig), numbers=numbers)
