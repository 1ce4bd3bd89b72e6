"""The per-source, per-day coverage and quality table (DESIGN.md 5.7).

One row per source per day: what was seen against what the source's own observed cadence says
should have been seen, the gaps, how many snapshot GPUs have telemetry, telemetry series that are
silently zero all day, and the rows quarantined (with the reasons), so a 0 from a broken exporter
is not read as an idle GPU.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.lib.coverage import Coverage, coverage, coverage_of_points, register_columns, source_rows
from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.schemas import TS, TableSpec, _f, conform
from gpu_pipeline.lib.states import snapshot_firsts
from gpu_pipeline.lib.timeutil import epoch_us

#: A telemetry series: one GPU of one source (whatever host name its samples came under: one GPU
#: logged under two spellings of its host is one series); its samples' time column. A GPU read by
#: several sources is measured by its best series (``coverage``).
TELEMETRY_SERIES = ("source", "gpu_id")
TELEMETRY_TIME = "sample_utc"

COVERAGE = TableSpec(
    layer="metrics",
    name="coverage",
    description=(
        "Coverage and quality per source per day: samples seen vs expected from the observed cadence, "
        "gaps longer than 3 x cadence, GPUs with telemetry vs GPUs in snapshots, silent-zero telemetry "
        "series, rows quarantined and why."
    ),
    key=("day_start_utc", "source"),
    schema=pa.schema(
        [
            _f("day_start_utc", TS, "Start of the partition day (UTC)", nullable=False),
            _f("source", pa.string(), "slot_snapshots, gpu_telemetry, job_records, kueue or task_runs (a "
               "render farm's task events)", nullable=False),
            _f("series", pa.int64(), "Series observed (1 for the pool's snapshots; GPUs for telemetry)"),
            _f("samples", pa.int64(), "Distinct sample times seen, summed over series"),
            _f("expected_samples", pa.float64(), "Window length / the series' cadence (its telemetry "
               "source's), summed over series"),
            _f("coverage_pct", pa.float64(), "100 x the mean over series of min(1, samples / expected): "
               "every GPU weighs the same (one read by several telemetry sources by its best)"),
            _f("cadence_s", pa.float64(), "Observed cadence: median of the series' median intervals (s); "
               "each telemetry source is measured against its own"),
            _f("gaps", pa.int64(), "Intervals without a sample of a series longer than 3 x its cadence, the "
               "window's start to a first sample and a last sample to its end included"),
            _f("longest_gap_s", pa.float64(), "Longest interval without a sample of a series, the window's edges "
               "included (s)"),
            _f("gpus_in_snapshots", pa.int64(), "GPUs seen in the day's slot snapshots"),
            _f("gpus_with_telemetry", pa.int64(), "Of those, GPUs with at least one telemetry sample"),
            _f("gpus_with_telemetry_pct", pa.float64(), "100 x gpus_with_telemetry / gpus_in_snapshots"),
            _f("silent_zero_series", pa.int64(), "Telemetry GPUs whose utilization and power are 0 in every "
               "sample of the day while the GPU was busy in at least one bucket (a null reading is no 0; "
               "a GPU whose utilization or power was never read is not counted)"),
            _f("rows_in", pa.int64(), "Rows read from the source for the day"),
            _f("rows_quarantined", pa.int64(), "Rows set aside (quarantine tables)"),
            _f("quarantine_reasons", pa.string(), "JSON object: reason -> rows"),
        ]
    ),
)


def _reasons(q: pa.Table) -> tuple[int, str]:
    if q.num_rows == 0:
        return 0, "{}"
    counts: dict[str, int] = {}
    for r in q.column("reason").to_pylist():
        key = r.split(":", 1)[0] if r else "unknown"
        counts[key] = counts.get(key, 0) + 1
    return q.num_rows, json.dumps(dict(sorted(counts.items())))


#: The columns :func:`coverage_rows` reads from each input table (the asset reads only these).
COVERAGE_COLUMNS = {
    "slots": ["snapshot_utc", "gpu_id"],
    "states": ["gpu_id", "state"],
    "samples": ["sample_utc", "source", "host", "gpu_id", "util_pct", "power_w"],
    "jobs": ["global_job_id"],
}


def snapshot_coverage(slots: pa.Table, day_start: dt.datetime, day_end: dt.datetime) -> Coverage:
    """The pool's snapshots against their cadence: a snapshot written in parts seconds apart (two
    collectors writing one archive) is one snapshot, at its first part's time
    (:func:`~gpu_pipeline.lib.states.snapshot_firsts`), as the states take it."""
    if not slots.num_rows:
        return coverage(slots, "snapshot_utc", [], day_start, day_end)
    # the distinct times first (a 10,000-GPU day: 5 M rows, a few hundred snapshots)
    t_us = np.unique(pc.cast(pc.unique(slots.column("snapshot_utc")), pa.int64()).to_numpy(zero_copy_only=False))
    t_us = t_us[(t_us >= epoch_us(day_start)) & (t_us < epoch_us(day_end))]
    first = np.unique(snapshot_firsts(t_us))
    return coverage_of_points(np.zeros(len(first), dtype=np.int64), first, day_start, day_end)


def coverage_rows(
    day_start: dt.datetime,
    day_end: dt.datetime,
    slots: pa.Table,
    states: pa.Table,
    samples: pa.Table | Path,
    jobs: pa.Table,
    kueue: pa.Table | None,
    quarantines: dict[str, list[pa.Table]],
    rows_in: dict[str, int] | None = None,
    telemetry_coverage: Coverage | None = None,
    task_runs: int | None = None,
) -> pa.Table:
    """Coverage rows of one day from the day's clean tables and quarantine tables (``samples`` may be
    the day's ``clean/gpu_samples`` file, read by DuckDB; ``telemetry_coverage``: the samples'
    :func:`~gpu_pipeline.lib.coverage.coverage` when already known, e.g. from
    :func:`~gpu_pipeline.lib.coverage.partition_coverage`); ``task_runs``: the day's task runs of a
    render farm, where one is read (a ``task_runs`` row with its quarantine), else None (no row)."""
    rows_in = rows_in or {}
    out = []
    snap_gpus = pc.unique(slots.column("gpu_id")) if slots.num_rows else pa.array([], pa.string())

    def base(source: str) -> dict:
        q = quarantines.get(source, [])
        qt = pa.concat_tables(q) if q else None
        n_q, reasons = _reasons(qt) if qt is not None else (0, "{}")
        return {"day_start_utc": day_start, "source": source, "rows_quarantined": n_q,
                "quarantine_reasons": reasons, "rows_in": rows_in.get(source)}

    cov = snapshot_coverage(slots, day_start, day_end)
    out.append({**base("slot_snapshots"), "series": cov.series, "samples": cov.samples,
                "expected_samples": cov.expected, "coverage_pct": 100 * cov.coverage, "cadence_s": cov.cadence_s,
                "gaps": cov.gaps, "longest_gap_s": cov.longest_gap_s, "gpus_in_snapshots": len(snap_gpus)})

    cov = telemetry_coverage or coverage(samples, TELEMETRY_TIME, list(TELEMETRY_SERIES), day_start, day_end)
    tel_gpus = pa.array([], pa.string())
    silent = 0
    if source_rows(samples):
        con = db_connect()
        try:
            # a file is read by DuckDB, not held: a day of 30-second samples is large
            register_columns(con, "s", samples, ["gpu_id", "util_pct", "power_w"])
            tel_gpus = con.sql("SELECT DISTINCT gpu_id FROM s").to_arrow_table()["gpu_id"].combine_chunks()
            con.register("g", states.select(["gpu_id", "state"]))
            silent = con.sql(
                """
                SELECT count(*) FROM (
                    SELECT gpu_id FROM s GROUP BY gpu_id
                    -- 0 % and 0 W read, and nothing else: a reading of nulls only ([Unknown Error],
                    -- [N/A]) is no 0, and a 0 % beside a power never read may be a real idle
                    HAVING count(util_pct) > 0 AND count(power_w) > 0
                       AND max(abs(util_pct)) = 0 AND max(abs(power_w)) = 0
                ) z
                WHERE z.gpu_id IN (SELECT gpu_id FROM g WHERE state LIKE 'busy_%')
                """
            ).fetchall()[0][0]
        finally:
            con.close()
    with_tel = int(pc.sum(pc.is_in(snap_gpus, value_set=tel_gpus)).as_py() or 0)
    out.append({**base("gpu_telemetry"), "series": cov.series, "samples": cov.samples,
                "expected_samples": cov.expected, "coverage_pct": 100 * cov.coverage, "cadence_s": cov.cadence_s,
                "gaps": cov.gaps, "longest_gap_s": cov.longest_gap_s, "gpus_in_snapshots": len(snap_gpus),
                "gpus_with_telemetry": with_tel,
                "gpus_with_telemetry_pct": 100.0 * with_tel / len(snap_gpus) if len(snap_gpus) else None,
                "silent_zero_series": int(silent)})

    out.append({**base("job_records"), "series": None, "samples": jobs.num_rows})
    if task_runs is not None:
        out.append({**base("task_runs"), "series": None, "samples": task_runs})
    if kueue is not None:
        times = kueue.select(["sample_utc"]) if kueue.num_rows else pa.table({"sample_utc": pa.array([], TS)})
        cov = coverage(times, "sample_utc", [], day_start, day_end)
        out.append({**base("kueue"), "series": cov.series, "samples": cov.samples, "expected_samples": cov.expected,
                    "coverage_pct": 100 * cov.coverage, "cadence_s": cov.cadence_s, "gaps": cov.gaps,
                    "longest_gap_s": cov.longest_gap_s})
    return conform(pa.Table.from_pylist(out, schema=COVERAGE.schema), COVERAGE)
