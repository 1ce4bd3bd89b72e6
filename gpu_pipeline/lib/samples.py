"""One day of GPU telemetry: gather the raw samples, then validate them into ``clean/gpu_samples``.

Raw: every configured source parsed into the ``gpu_samples`` schema (``telemetry.read_telemetry_dir``
for nvidia-smi and DCGM files, the NVML sampler's daily Parquet files). Clean: rows with a value
outside its physical range (utilization and activity 0-100 %, power and memory >= 0, temperature
-40..150 C, power limit > 0) are quarantined with the reason -- never clipped silently -- and repeated
(sample_utc, source, host, gpu_id) keys keep their first row (counted).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpu_pipeline.lib.prometheus_source import PrometheusConfig, fetch_dcgm_range
from gpu_pipeline.lib.schemas import (
    GPU_SAMPLES,
    QUARANTINE_GPU_SAMPLES,
    RAW_GPU_TELEMETRY,
    conform,
    sorted_rows,
)
from gpu_pipeline.lib.telemetry import read_telemetry_dir
from gpu_pipeline.lib.terapixel import parse_gpu_csv

# column -> (min, max) inclusive; None = unbounded
RANGES: dict[str, tuple[float | None, float | None]] = {
    "util_pct": (0, 100),
    "mem_util_pct": (0, 100),
    "gr_engine_active_pct": (0, 100),
    "sm_active_pct": (0, 100),
    "tensor_active_pct": (0, 100),
    "mem_used_mib": (0, None),
    "mem_total_mib": (0, None),
    "power_w": (0, None),
    "power_limit_w": (1e-9, None),
    "temp_c": (-40, 150),
    "sm_clock_mhz": (0, None),
    "energy_mj": (0, None),
}


@dataclass
class RawSamples:
    table: pa.Table
    files: list[str] = field(default_factory=list)
    quarantine: pa.Table | None = None
    counters: dict[str, int] = field(default_factory=dict)


def read_nvml_dir(root: Path, start_utc: dt.datetime, end_utc: dt.datetime) -> tuple[pa.Table, list[str]]:
    """The NVML sampler's files ``root/nvml/HOST/nvml-YYYY-MM-DD.parquet`` (UTC days) in the window."""
    base = root / "nvml"
    if not base.is_dir():
        return RAW_GPU_TELEMETRY.empty(), []
    days = {(start_utc + dt.timedelta(days=i)).date().isoformat() for i in range((end_utc - start_utc).days + 2)}
    tables, files = [], []
    for path in sorted(base.glob("*/nvml-*.parquet")):
        if path.stem.removeprefix("nvml-") not in days:
            continue
        t = pq.read_table(path)
        t = t.filter(pc.and_(pc.greater_equal(t["sample_utc"], pa.scalar(start_utc, t["sample_utc"].type)),
                             pc.less(t["sample_utc"], pa.scalar(end_utc, t["sample_utc"].type))))
        tables.append(conform(t.select([c for c in t.column_names if c in GPU_SAMPLES.schema.names]), RAW_GPU_TELEMETRY))
        files.append(str(path))
    return (pa.concat_tables(tables) if tables else RAW_GPU_TELEMETRY.empty()), files


def raw_samples(
    telemetry_dir: str | Path | None,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    source_tz: str,
    margin_days: int = 0,
    prometheus: PrometheusConfig | None = None,
    terapixel_dir: str | Path | None = None,
) -> RawSamples:
    """Samples of [start_utc, end_utc) from the telemetry files and/or Prometheus.

    ``margin_days`` = 0 reads only files whose name carries a local date of the window (files rolled
    at local midnight); raise it for loggers that roll at another time."""
    parts: list[pa.Table] = []
    files: list[str] = []
    quarantine = None
    counters: dict[str, int] = {}
    if telemetry_dir:
        root = Path(telemetry_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: telemetry directory does not exist")
        parsed = read_telemetry_dir(root, start_utc, end_utc, source_tz, margin_days=margin_days)
        nvml, nvml_files = read_nvml_dir(root, start_utc, end_utc)
        parts += [conform(parsed.table, RAW_GPU_TELEMETRY), nvml]
        files += list(parsed.files) + nvml_files
        quarantine = parsed.quarantine_table()
        counters.update(parsed.counters)
    if terapixel_dir:
        gpu_csv = Path(terapixel_dir) / "gpu.csv"
        if not gpu_csv.is_file():
            raise FileNotFoundError(f"{gpu_csv}: Terapixel gpu.csv not found")
        tp = parse_gpu_csv(gpu_csv, start_utc=start_utc, end_utc=end_utc)
        parts.append(conform(tp.table, RAW_GPU_TELEMETRY))
        files.append(str(gpu_csv))
        tq = tp.quarantine_table()
        quarantine = tq if quarantine is None else pa.concat_tables([quarantine, tq])
        counters.update({f"terapixel_{k}": v for k, v in tp.counters.items()})
    if prometheus is not None:
        fetched = fetch_dcgm_range(prometheus, start_utc, end_utc)
        parts.append(conform(fetched.table, RAW_GPU_TELEMETRY))
        counters.update({f"prometheus_{k}": v for k, v in fetched.counters.items()})
    table = pa.concat_tables(parts) if parts else RAW_GPU_TELEMETRY.empty()
    table = sorted_rows(table, _KEY)
    return RawSamples(table=table, files=files, quarantine=quarantine, counters=counters)


@dataclass
class CleanSamples:
    table: pa.Table
    quarantine: pa.Table
    rows_in: int = 0
    duplicates_dropped: int = 0
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)


# The duplicate key, in the output's sort order; among rows of one key the first by source_file
# (nulls last) is the one kept.
_KEY = ("sample_utc", "host", "gpu_id", "source")


def _out_of_range(table: pa.Table) -> dict[str, np.ndarray]:
    """Per checked column with some violation: which rows hold a value outside ``RANGES`` (NaN
    included; null is not a violation)."""
    masks = {}
    for col, (lo, hi) in RANGES.items():
        if col not in table.column_names:
            continue
        column = table[col]
        values = column.to_numpy()  # float64; nulls read as NaN and are masked out below
        with np.errstate(invalid="ignore"):
            out = np.isnan(values)
            if lo is not None:
                out |= values < lo
            if hi is not None:
                out |= values > hi
        out &= column.is_valid().to_numpy(zero_copy_only=False)
        if out.any():
            masks[col] = out
    return masks


def _repeats_previous(table: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
    """Per row of a table sorted on ``columns``: whether it has the previous row's key (two nulls
    are equal, as in GROUP BY)."""
    n = table.num_rows
    same = np.zeros(n, dtype=bool)
    if n < 2:
        return same
    same[1:] = True
    for col in columns:
        arr = table[col].combine_chunks()
        later, earlier = arr.slice(1), arr.slice(0, n - 1)
        equal = pc.fill_null(pc.equal(later, earlier), False).to_numpy(zero_copy_only=False)
        both_null = pc.and_(pc.is_null(later), pc.is_null(earlier)).to_numpy(zero_copy_only=False)
        same[1:] &= equal | both_null
    return same


def clean_samples(raw: pa.Table) -> CleanSamples:
    """Quarantine out-of-range rows and drop repeated keys, with the output sorted on ``_KEY``.

    One sort on ``_KEY`` + source_file (nulls last) puts a key's rows together with the one to keep
    first; a later row of the key is a duplicate unless it is quarantined itself. A quarantined first
    row still takes the key: the key's other rows are dropped as duplicates."""
    table = sorted_rows(raw, (*_KEY, "source_file"))
    violations = _out_of_range(table)
    is_bad = np.zeros(table.num_rows, dtype=bool)
    for mask in violations.values():
        is_bad |= mask
    dup = _repeats_previous(table, _KEY)
    good = table.filter(pa.array(~is_bad & ~dup))
    reasons: dict[str, int] = {}
    q_rows = []
    bad_rows = np.flatnonzero(is_bad)
    for i, r in zip(bad_rows.tolist(), table.take(pa.array(bad_rows)).to_pylist(), strict=True):
        cols = [c for c, mask in violations.items() if mask[i]]
        for c in cols:
            reasons[f"{c} out of range"] = reasons.get(f"{c} out of range", 0) + 1
        detail = ", ".join(f"{c}={r[c]!r} (allowed {RANGES[c][0]}..{RANGES[c][1]})" for c in cols)
        q_rows.append({
            "source_table": "raw/gpu_telemetry",
            "reason": f"value out of range: {detail}",
            "source_file": r.get("source_file"),
            "source_row": None,
            "record_utc": r["sample_utc"],
            "row_json": json.dumps(r, default=str, sort_keys=True),
        })
    quarantine = pa.Table.from_pylist(q_rows, schema=QUARANTINE_GPU_SAMPLES.schema) if q_rows else QUARANTINE_GPU_SAMPLES.empty()
    dups = int(np.count_nonzero(dup & ~is_bad))
    return CleanSamples(
        table=conform(good, GPU_SAMPLES),
        quarantine=quarantine,
        rows_in=raw.num_rows,
        duplicates_dropped=dups,
        quarantined_by_reason=dict(sorted(reasons.items())),
    )
