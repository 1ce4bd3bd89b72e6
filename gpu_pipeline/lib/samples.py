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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.prometheus_source import PrometheusConfig, fetch_dcgm_range
from gpu_pipeline.lib.schemas import GPU_SAMPLES, QUARANTINE_GPU_SAMPLES, RAW_GPU_TELEMETRY, conform
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
    table = table.sort_by([("sample_utc", "ascending"), ("host", "ascending"), ("gpu_id", "ascending"),
                           ("source", "ascending")])
    return RawSamples(table=table, files=files, quarantine=quarantine, counters=counters)


@dataclass
class CleanSamples:
    table: pa.Table
    quarantine: pa.Table
    rows_in: int = 0
    duplicates_dropped: int = 0
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)


def _violation_sql() -> str:
    parts = []
    for col, (lo, hi) in RANGES.items():
        conds = [f"isnan({col})"]
        if lo is not None:
            conds.append(f"{col} < {lo}")
        if hi is not None:
            conds.append(f"{col} > {hi}")
        parts.append(f"CASE WHEN {col} IS NOT NULL AND ({' OR '.join(conds)}) THEN '{col}' END")
    return f"concat_ws(',', {', '.join(parts)})"


def clean_samples(raw: pa.Table) -> CleanSamples:
    con = db_connect()
    try:
        con.register("raw_samples", raw)
        checked = con.sql(
            f"""
            SELECT *, {_violation_sql()} AS bad,
                   row_number() OVER (PARTITION BY sample_utc, source, host, gpu_id
                                      ORDER BY source_file NULLS LAST) AS dup
            FROM raw_samples
            """
        ).to_arrow_table()
    finally:
        con.close()
    bad = checked["bad"]
    is_bad = pc.not_equal(bad, "")
    dup = pc.greater(checked["dup"], 1)
    good = checked.filter(pc.and_(pc.invert(is_bad), pc.invert(dup)))
    rejected = checked.filter(is_bad)
    reasons: dict[str, int] = {}
    q_rows = []
    for r in rejected.drop_columns(["dup"]).to_pylist():
        cols = r.pop("bad").split(",")
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
    dups = int(pc.sum(pc.and_(dup, pc.invert(is_bad))).as_py() or 0)
    good = good.drop_columns(["bad", "dup"]).sort_by(
        [("sample_utc", "ascending"), ("host", "ascending"), ("gpu_id", "ascending"), ("source", "ascending")]
    )
    return CleanSamples(
        table=conform(good, GPU_SAMPLES),
        quarantine=quarantine,
        rows_in=raw.num_rows,
        duplicates_dropped=dups,
        quarantined_by_reason=dict(sorted(reasons.items())),
    )
