import datetime as dt
import io

import numpy as np
import pyarrow as pa
from matplotlib.image import imread

from gpu_pipeline.lib.plots import STATE_COLORS, gpu_timeline_heatmap
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


def test_empty_day_renders_a_no_data_figure():
    r = gpu_timeline_heatmap(GPU_STATES.empty(), DAY)
    assert pixels(r.png).shape[0] > 100
    assert r.numbers == {}
