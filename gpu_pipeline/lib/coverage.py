"""Coverage of a time series source over a window: observed cadence, expected vs seen, gaps.

The cadence is never assumed: it is the median interval between consecutive distinct timestamps
of each series (a GPU of one source on one host, or the pool for snapshots), and the window's
cadence the median of the series' cadences. Expected samples = window length / cadence;
a gap is an interval longer than ``gap_factor`` x cadence.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.schemas import TableSpec
from gpu_pipeline.lib.store import Store


@dataclass(frozen=True)
class Coverage:
    series: int
    samples: int
    cadence_s: float | None
    expected: float
    coverage: float
    gaps: int
    longest_gap_s: float

    def as_metadata(self, prefix: str) -> dict[str, float]:
        return {
            f"{prefix}_series": float(self.series),
            f"{prefix}_samples": float(self.samples),
            f"{prefix}_cadence_s": float(self.cadence_s or 0.0),
            f"{prefix}_coverage_pct": 100.0 * self.coverage,
            f"{prefix}_gaps": float(self.gaps),
            f"{prefix}_longest_gap_s": float(self.longest_gap_s),
        }


def coverage(
    table: pa.Table | Path,
    time_col: str,
    series_cols: list[str],
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    gap_factor: float = 3.0,
) -> Coverage:
    """Coverage of ``table`` (one row per sample) over [start_utc, end_utc); ``table`` may be a
    Parquet file (read by DuckDB, within its memory limit, instead of held)."""
    window_s = (end_utc - start_utc).total_seconds()
    if source_rows(table) == 0:
        return Coverage(0, 0, None, 0.0, 0.0, 0, window_s)
    con = db_connect()
    try:
        register_columns(con, "_cov_points", table, [time_col, *series_cols])
        # Each series (a distinct value of series_cols, nulls included) gets an integer code first, so
        # that the distinct timestamps and the window over them carry 16 bytes a row, not the text.
        if series_cols:
            cols = ", ".join(f'"{c}"' for c in series_cols)
            on = " AND ".join(f'p."{c}" IS NOT DISTINCT FROM s."{c}"' for c in series_cols)
            con.execute(f"CREATE OR REPLACE TEMP TABLE _cov_series AS "
                        f"SELECT row_number() OVER () AS k, {cols} FROM _cov_points GROUP BY ALL")
            points = f'SELECT DISTINCT s.k, epoch_us(p."{time_col}") AS t FROM _cov_points p JOIN _cov_series s ON {on}'
        else:
            points = f'SELECT DISTINCT 0 AS k, epoch_us("{time_col}") AS t FROM _cov_points'
        row = con.sql(
            f"""
            WITH pts AS ({points}),
            d AS (SELECT k, t, t - lag(t) OVER (PARTITION BY k ORDER BY t) AS dt_us FROM pts),
            per AS (SELECT k, count(*) AS n, median(dt_us) AS cad FROM d GROUP BY k),
            cad AS (SELECT median(cad) AS c FROM per WHERE cad IS NOT NULL)
            SELECT (SELECT count(*) FROM per), (SELECT sum(n) FROM per), (SELECT c FROM cad),
                   (SELECT count(*) FROM d, cad WHERE d.dt_us > {gap_factor} * cad.c),
                   (SELECT max(dt_us) FROM d)
            """
        ).fetchall()[0]
    finally:
        con.close()  # its temporary table and view go with it
    series, samples, cad_us, gaps, max_gap_us = row
    cad_s = float(cad_us) / 1e6 if cad_us else None
    expected = series * window_s / cad_s if cad_s else float(series)
    cov = min(1.0, samples / expected) if expected else 0.0
    return Coverage(
        series=int(series),
        samples=int(samples),
        cadence_s=cad_s,
        expected=float(expected),
        coverage=float(cov),
        gaps=int(gaps or 0),
        longest_gap_s=float(max_gap_us or 0) / 1e6,
    )


def register_columns(con: duckdb.DuckDBPyConnection, name: str, source: pa.Table | Path, columns: list[str]) -> None:
    """``columns`` of a table, or of a Parquet file (read by DuckDB as the query runs, not held), as
    ``name`` on this connection only: a temporary view of the file (a relation's ``create_view``
    would make a view in the database that every connection sees and that outlives this one), or
    the registered table."""
    cols = ", ".join(f'"{c}"' for c in columns)
    if isinstance(source, Path):
        path = str(source).replace("'", "''")
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT {cols} FROM read_parquet('{path}')")
    else:
        con.register(name, source.select(columns))


def source_rows(source: pa.Table | Path) -> int:
    """Rows of a table, or of a Parquet file (from its footer)."""
    return pq.ParquetFile(source).metadata.num_rows if isinstance(source, Path) else source.num_rows


#: The partition note that keeps a file's coverage (:func:`partition_coverage`).
COVERAGE_NOTE = "coverage"
_NOTE_VERSION = 1  # bump when coverage() changes what it measures


def partition_coverage(store: Store, spec: TableSpec, day: str, time_col: str, series_cols: list[str],
                       start_utc: dt.datetime, end_utc: dt.datetime, gap_factor: float = 3.0,
                       also: tuple[TableSpec, ...] = ()) -> Coverage:
    """:func:`coverage` of the day's partition file of ``spec``, kept in the partition's
    :data:`COVERAGE_NOTE` with the file's SHA-256 and the arguments. Bytes measured before with the
    same arguments, under this partition or one of the ``also`` tables' (most days the clean
    telemetry file is the raw file copied), are not measured again: hashing a file takes a few
    hundredths of a second per 100 MB, measuring a 1,000-GPU day of telemetry 0.6 s. A note is
    kept only when the file was not replaced while it was measured."""
    path = store.partition_file(spec, day)
    before = store.partition_identity(spec, day)
    digest = store.partition_sha256(spec, day)
    args = {"time_col": time_col, "series_cols": list(series_cols), "start_utc": start_utc.isoformat(),
            "end_utc": end_utc.isoformat(), "gap_factor": gap_factor, "version": _NOTE_VERSION}
    for owner in (spec, *also):
        note = store.read_partition_note(owner, day, COVERAGE_NOTE)
        if note and note.get("sha256") == digest and note.get("args") == args:
            try:
                return Coverage(**note["result"])
            except (TypeError, KeyError):
                pass  # a note of another shape: measured again below
    cov = coverage(path, time_col, series_cols, start_utc, end_utc, gap_factor)
    if store.partition_identity(spec, day) == before:
        store.write_partition_note(spec, day, COVERAGE_NOTE,
                                   {"sha256": digest, "args": args, "result": dataclasses.asdict(cov)})
    return cov
