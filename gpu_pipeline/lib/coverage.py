"""Coverage of a time series source over a window: observed cadence, expected vs seen, gaps.

The cadence is never assumed: it is the median interval between consecutive distinct timestamps
of each series (a GPU of one source, or the pool for snapshots). Series of one source
(the value of a ``source`` column among the series columns, :data:`CADENCE_GROUP`) share a cadence,
the median of the cadences of their series with at least :data:`MIN_INTERVALS` intervals (a source
without such a series takes the median over all series): a 2-second exporter and a 60-second
logger are each measured against their own (one cadence over both let the fast series' samples
hide an outage of the slow ones), and a GPU that sent two samples all day is not read as a series
of a 12-hour cadence. A series' expected samples = window length / its source's cadence; its share
min(1, seen / expected). A GPU read by several sources (series that differ only in ``source``) is
measured by its best series (the greatest share, then the most samples, the fewest gaps): a GPU
read all day by DCGM and for two hours by nvidia-smi is covered all day, and nvidia-smi's 22 hours
without samples are not its gaps. The window's ``coverage`` is the mean of those shares, every GPU
weighing the same; ``series``, ``samples``, ``expected``, the gaps and the longest gap are those of
the GPUs' best series; ``cadence_s`` is the median of all series' cadences. A gap is an interval
longer than ``gap_factor`` x the series' cadence without a sample of the series: between two of its
samples, or at an edge of the window (from the window's start to the series' first sample, from its
last sample to the window's end), so that a collector that stopped at 06:00 shows an 18-hour gap,
as a day without any sample shows one of the whole window. A window where no series has two
samples has no cadence to expect samples from: its coverage is 0 and its gaps 1, as a window without
samples.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.schemas import TableSpec
from gpu_pipeline.lib.store import Store
from gpu_pipeline.lib.timeutil import epoch_us

#: The series column whose values share a cadence (see the module docstring).
CADENCE_GROUP = "source"
#: Intervals a series needs for its cadence to count towards its source's.
MIN_INTERVALS = 3


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
        return _no_points(window_s)
    con = db_connect()
    try:
        register_columns(con, "_cov_points", table, [time_col, *series_cols])
        # Each series (a distinct value of series_cols, nulls included) gets an integer code first, so
        # that the distinct timestamps and the window over them carry 16 bytes a row, not the text.
        group = f'"{CADENCE_GROUP}"' if CADENCE_GROUP in series_cols else "NULL"
        if series_cols:
            cols = ", ".join(f'"{c}"' for c in series_cols)
            on = " AND ".join(f'p."{c}" IS NOT DISTINCT FROM s."{c}"' for c in series_cols)
            con.execute(f"CREATE OR REPLACE TEMP TABLE _cov_series AS "
                        f"SELECT row_number() OVER () AS k, {cols} FROM _cov_points GROUP BY ALL")
            points = f'SELECT DISTINCT s.k, epoch_us(p."{time_col}") AS t FROM _cov_points p JOIN _cov_series s ON {on}'
            unit_cols = _unit_columns(series_cols)
            unit = "k"  # each series its own unit
            if unit_cols is not None:
                unit = "dense_rank() OVER (ORDER BY " + ", ".join(f'"{c}"' for c in unit_cols) + ")"
            groups = f"SELECT k, dense_rank() OVER (ORDER BY {group}) AS g, {unit} AS u FROM _cov_series"
        else:
            points = f'SELECT DISTINCT 0 AS k, epoch_us("{time_col}") AS t FROM _cov_points'
            groups = "SELECT 0 AS k, 0 AS g, 0 AS u"
        s_us, e_us = epoch_us(start_utc), epoch_us(end_utc)
        # Each series' cadence is its source's (the median of its series' cadences; the median of
        # all series' where a source has none). The intervals: between a series' consecutive distinct
        # times, and its window edges (from the window's start to its first time, from its last time
        # to the window's end; none below 0), each a gap when longer than gap_factor x its cadence.
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE _cov_per AS
            WITH pts AS ({points}),
            d AS (SELECT k, t, t - lag(t) OVER (PARTITION BY k ORDER BY t) AS dt_us FROM pts),
            per AS (SELECT k, count(*) AS n, median(dt_us) AS cad, min(t) AS t0, max(t) AS t1 FROM d GROUP BY k),
            kg AS ({groups}),
            allc AS (SELECT median(cad) AS c FROM per WHERE cad IS NOT NULL),
            grp AS (SELECT kg.g, median(per.cad) AS c FROM per JOIN kg USING (k)
                    WHERE per.cad IS NOT NULL AND per.n > {MIN_INTERVALS} GROUP BY kg.g),
            per2 AS (SELECT per.*, kg.u, coalesce(grp.c, allc.c) AS c
                     FROM per JOIN kg USING (k) LEFT JOIN grp USING (g), allc),
            iv AS (SELECT k, d.dt_us, per2.c FROM d JOIN per2 USING (k) WHERE d.dt_us IS NOT NULL
                   UNION ALL SELECT k, greatest(t0 - {s_us}, 0), c FROM per2
                   UNION ALL SELECT k, greatest({e_us} - t1, 0), c FROM per2),
            ivk AS (SELECT k, count(*) FILTER (WHERE dt_us > {gap_factor} * c) AS gaps, max(dt_us) AS longest
                    FROM iv GROUP BY k)
            SELECT n, c, u, ivk.gaps, ivk.longest, (SELECT c FROM allc) AS all_c
            FROM per2 JOIN ivk USING (k)
            """
        )
        per = con.sql("SELECT n, c, u, gaps, longest FROM _cov_per").fetchnumpy()
        cad_us = con.sql("SELECT any_value(all_c) FROM _cov_per").fetchall()[0][0]
    finally:
        con.close()  # its temporary tables and view go with it
    return _coverage_of(np.asarray(per["n"], dtype=np.int64), np.asarray(per["c"], dtype=np.float64), cad_us,
                        np.asarray(per["gaps"], dtype=np.int64), np.asarray(per["longest"], dtype=np.int64),
                        window_s, np.asarray(per["u"], dtype=np.int64))


def _unit_columns(series_cols: Sequence[str]) -> list[str] | None:
    """The columns naming a series' unit (a GPU: every series column but the source), or None where
    each series is its own (no ``source`` column among them)."""
    if CADENCE_GROUP not in series_cols:
        return None
    return [c for c in series_cols if c != CADENCE_GROUP]


def _no_points(window_s: float) -> Coverage:
    """No sample in the window: the whole window is one gap."""
    return Coverage(0, 0, None, 0.0, 0.0, 1, window_s)


def _coverage_of(n: np.ndarray, c_us: np.ndarray, cad_us: float | None, gaps: np.ndarray,
                 longest_us: np.ndarray, window_s: float, units: np.ndarray | None = None) -> Coverage:
    """The figures from each series' distinct samples ``n``, cadence ``c_us``, gaps and longest
    interval (edges included), summed exactly (``math.fsum``), so that the order the series come in
    changes no bit. Every series has a cadence once any has (its source's, else the median of all,
    ``cad_us``). ``units``: each series' unit (its GPU); a unit read by several series (sources) is
    measured by its best one (:func:`_best_of_units`). Where no series has two samples (``cad_us``
    unknown), nothing says how many were expected: the coverage is 0 and the expected samples 0, as
    for a window without samples, not 100 % (each series measured against its own single sample),
    which passed a day where a broken collector sent one sample a GPU."""
    if not cad_us:
        if units is not None and len(n):
            best = _best_of_units(units, np.zeros(len(n)), n, gaps, longest_us)
            n, longest_us = n[best], longest_us[best]
        # as a window without samples: one gap, the longest silence (a dead source reads no fewer
        # gaps than one that sent two samples five minutes apart)
        return Coverage(int(len(n)), int(n.sum()), None, 0.0, 0.0, 1, float(longest_us.max(initial=0)) / 1e6)
    expected = window_s * 1e6 / c_us  # a series' expected samples: the window over its cadence
    share = np.minimum(1.0, n / expected)
    if units is not None and len(n):
        best = _best_of_units(units, share, n, gaps, longest_us)
        n, expected, share, gaps, longest_us = n[best], expected[best], share[best], gaps[best], longest_us[best]
    longest = float(longest_us.max(initial=0)) / 1e6
    return Coverage(
        series=int(len(n)),
        samples=int(n.sum()),
        cadence_s=float(cad_us) / 1e6,
        expected=math.fsum(expected.tolist()),
        coverage=math.fsum(share.tolist()) / len(n),
        gaps=int(gaps.sum()),
        longest_gap_s=longest,
    )


def _best_of_units(units: np.ndarray, share: np.ndarray, n: np.ndarray, gaps: np.ndarray,
                   longest_us: np.ndarray) -> np.ndarray:
    """Per unit, the index of its best series: the greatest share, then the most samples, the fewest
    gaps, the shortest longest interval (series equal in all of these give the same figures). A GPU
    read all day by one source and for two hours by another is covered all day, and the other
    source's edges (22 hours without its samples) are not its gaps; a GPU whose source changed in
    the day (each half the day) reads as half covered, a lower bound."""
    order = np.lexsort((longest_us, gaps, -n, -share, units))
    first = np.r_[True, units[order][1:] != units[order][:-1]]
    return np.sort(order[first])


def series_time_order(series: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The rows' order by (series, t), ties in row order: ``np.lexsort((t, series))``, made as two
    stable sorts, by time first (rows come nearly in time order: a merge sort of few runs), then by
    series as a 16-bit key (a radix sort, no comparisons). A 1,000-GPU group of 1.5 M samples:
    0.07-0.10 s -> 0.03-0.04 s. Series numbers spanning more than 16 bits take ``lexsort``."""
    if not len(series):
        return np.zeros(0, dtype=np.intp)
    lo = int(series.min())
    if int(series.max()) - lo >= 1 << 16:
        return np.lexsort((t, series))
    if (t[1:] >= t[:-1]).all():  # rows in time order already (a raw file's): the sort by time keeps them so
        return np.argsort((series - lo).astype(np.uint16), kind="stable")
    by_time = np.argsort(t, kind="stable")
    return by_time[np.argsort((series[by_time] - lo).astype(np.uint16), kind="stable")]


def _median(values: np.ndarray) -> float:
    """The median as DuckDB's ``median`` gives it: the middle value, or the mean of the two middle
    ones, in float64."""
    n = len(values)
    lo, hi = (n - 1) // 2, n // 2
    part = np.partition(values, (lo, hi))
    return (float(part[lo]) + float(part[hi])) / 2


def coverage_of_points(series: np.ndarray, t_us: np.ndarray, start_utc: dt.datetime, end_utc: dt.datetime,
                       gap_factor: float = 3.0, groups: np.ndarray | None = None,
                       units: np.ndarray | None = None) -> Coverage:
    """:func:`coverage` of samples given as their series' numbers (non-negative integers, one per
    distinct series key) and their times (epoch microseconds, none missing), in numpy: the same
    figures as the SQL, without a database. ``groups[s]`` is the cadence group (source) of series
    number ``s`` (default: one group), ``units[s]`` its unit (GPU; default: each series its own).
    Besides its inputs it holds about three int64 arrays of their length at once (a 1,000-GPU day
    of telemetry: 70 MB)."""
    window_s = (end_utc - start_utc).total_seconds()
    if len(t_us) == 0:
        return _no_points(window_s)
    series, t_us = np.asarray(series), np.asarray(t_us, dtype=np.int64)
    order = series_time_order(series, t_us)
    t = t_us[order]
    k = series[order]
    del order
    same = k[1:] == k[:-1]  # a point after another of its series
    first, last = np.r_[True, ~same], np.r_[~same, True]
    ids = k[first].astype(np.int64)  # the series present, in order
    # the window's edges: from its start to each series' first time, from each last time to its end
    s_us, e_us = epoch_us(start_utc), epoch_us(end_utc)
    edges = np.maximum(np.r_[t[first] - s_us, e_us - t[last]], 0)
    d = np.diff(t)
    del t
    repeated = same & (d == 0)  # the same (series, time) again: one point
    interval = same & (d != 0)  # between two distinct points of a series, one after the other
    starts = np.flatnonzero(first)
    rows = np.diff(np.r_[starts, len(k)])
    # distinct points of each series (its rows less its repeats: few, most days none), in the order of ids
    n = rows - np.bincount(np.searchsorted(starts, np.flatnonzero(repeated) + 1, side="right") - 1, minlength=len(ids))
    dt_us = d[interval]  # each series' intervals, the series in the order of ids
    del d, k, repeated, interval, same
    m = len(ids)
    per = n - 1  # each series' intervals: between its distinct points
    unit = None if units is None else np.asarray(units, dtype=np.int64)[ids]
    longest = np.maximum(edges[:m], edges[m:])  # per series, its intervals' below
    if len(dt_us) == 0:  # no series has two points: no cadence
        return _coverage_of(n, np.full(m, np.nan), None, np.zeros(m, np.int64), longest, window_s, unit)
    has = per > 0  # the series that have a cadence
    bounds = np.r_[0, np.cumsum(per[has])]
    cads = np.array([_median(dt_us[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)])
    with_cad = ids[has]  # the series that have a cadence, in order
    cad_us = _median(cads)
    group = (np.zeros(int(ids.max()) + 1, dtype=np.int64) if groups is None
             else np.asarray(groups, dtype=np.int64))
    of_group = {}
    enough = np.diff(bounds) >= MIN_INTERVALS  # series whose cadence counts towards their source's
    g_of = group[with_cad]
    for g in np.unique(g_of[enough]):
        of_group[int(g)] = _median(cads[enough & (g_of == g)])
    c = np.array([of_group.get(int(g), cad_us) for g in group[ids]], dtype=np.float64)
    # each series' intervals and edges against its own cadence (compared as float64, as in the SQL)
    limit = gap_factor * c
    gaps = (edges[:m] > limit).astype(np.int64) + (edges[m:] > limit).astype(np.int64)
    cut = np.flatnonzero(has)
    gaps[cut] += np.add.reduceat(dt_us > np.repeat(limit[has], per[has]), bounds[:-1], dtype=np.int64)
    longest[cut] = np.maximum(longest[cut], np.maximum.reduceat(dt_us, bounds[:-1]))
    return _coverage_of(n, c, cad_us, gaps, longest, window_s, unit)


class SeriesPoints:
    """The (series, time) points of rows seen a batch at a time, for :func:`coverage_of_points`: a
    series is a distinct value of ``series_cols`` (nulls included, as in GROUP BY), numbered as it is
    first seen; 12 bytes a row are kept, not the rows. A row without a time, times in another unit
    than microseconds, or a batch of too many distinct keys to number at once make the points
    unusable (``coverage`` gives None: measure the file instead), and so does ``coverage``, which
    lets them go."""

    def __init__(self, time_col: str, series_cols: Sequence[str]):
        self.time_col, self.series_cols = time_col, tuple(series_cols)
        self._numbers: dict[tuple, int] = {}
        # the same numbers, looked up without Python per key: each column's values numbered as first
        # seen (``_value_ids``), a key's numbers combined into one integer (``_keys``, ascending, with
        # the series' numbers in ``_key_numbers``); off (``_fast``) once a column's values outgrow it
        self._value_ids: list[dict] = [{} for _ in self.series_cols]
        self._keys = np.zeros(0, dtype=np.int64)
        self._key_numbers = np.zeros(0, dtype=np.int64)
        self._fast = True
        self._series: list[np.ndarray] = []
        self._times: list[np.ndarray] = []
        self.usable = True

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        if not self.usable or batch.num_rows == 0:
            return
        times = batch.column(self.time_col)
        if times.null_count or times.type != pa.timestamp("us", tz=getattr(times.type, "tz", None)):
            self._give_up()  # not epoch microseconds throughout: the file is measured instead
            return
        # each column's values numbered in the batch, the columns' numbers combined into one
        code = np.zeros(batch.num_rows, dtype=np.int64)
        values: list[list] = []
        size = 1
        for col in self.series_cols:
            encoded = pc.dictionary_encode(batch.column(col))
            if isinstance(encoded, pa.ChunkedArray):
                encoded = encoded.combine_chunks()
            dictionary = encoded.dictionary.to_pylist() + [None]  # the last number: null
            size *= len(dictionary)
            if size >= 1 << 62:  # the batch's combined numbers would overflow: the file is measured instead
                self._give_up()
                return
            code = code * len(dictionary) + pc.fill_null(encoded.indices, len(dictionary) - 1).to_numpy()
            values.append(dictionary)
        combos = pc.dictionary_encode(pa.array(code))
        numbers = self._numbers_of(combos.dictionary.to_numpy(), values)
        self._series.append(numbers[combos.indices.to_numpy()].astype(np.int32 if len(self._numbers) < 1 << 31
                                                                     else np.int64))
        # a copy: a view would keep the batch's whole buffer alive (a spill slab read back is one)
        self._times.append(times.cast(pa.int64()).to_numpy().copy())

    def _numbers_of(self, combos: np.ndarray, values: list[list]) -> np.ndarray:
        """The series numbers of the batch's combined numbers ``combos`` (distinct, in the order first
        seen in the batch; each column's number in its ``values``, the last column's least
        significant), a series not seen before numbered in that order."""
        numbers = np.empty(len(combos), dtype=np.int64)
        if self._fast:
            # each column's number of each combination, as the numbers of the values across batches
            bits = 62 // max(1, len(values))
            rest = combos.copy()
            ids = []
            for dictionary, known in zip(reversed(values), reversed(self._value_ids), strict=True):
                at = rest % len(dictionary)
                rest //= len(dictionary)
                ids.append(np.array([known.setdefault(v, len(known)) for v in dictionary], dtype=np.int64)[at])
            if all(len(known) <= 1 << bits for known in self._value_ids):
                keys = np.zeros(len(combos), dtype=np.int64)
                for col_ids in reversed(ids):
                    keys = (keys << bits) | col_ids
                where = np.minimum(np.searchsorted(self._keys, keys), max(len(self._keys) - 1, 0))
                found = (self._keys[where] == keys) if len(self._keys) else np.zeros(len(keys), dtype=bool)
                numbers[found] = self._key_numbers[where[found]]
                new = np.flatnonzero(~found)
                if not len(new):
                    return numbers
                for i in new.tolist():
                    numbers[i] = self._numbers.setdefault(self._key_of(int(combos[i]), values), len(self._numbers))
                keys = np.concatenate((self._keys, keys[new]))
                order = np.argsort(keys, kind="stable")
                self._keys = keys[order]
                self._key_numbers = np.concatenate((self._key_numbers, numbers[new]))[order]
                return numbers
            self._fast = False
            self._value_ids, self._keys, self._key_numbers = [], np.zeros(0, np.int64), np.zeros(0, np.int64)
        for i, combo in enumerate(combos.tolist()):
            numbers[i] = self._numbers.setdefault(self._key_of(combo, values), len(self._numbers))
        return numbers

    @staticmethod
    def _key_of(combo: int, values: list[list]) -> tuple:
        """A series' key from its combined number: the columns' values, the last column's first."""
        key = []
        for dictionary in reversed(values):
            combo, at = divmod(combo, len(dictionary))
            key.append(dictionary[at])
        return tuple(key)

    def _give_up(self) -> None:
        self.usable = False
        self._series, self._times = [], []

    def coverage(self, start_utc: dt.datetime, end_utc: dt.datetime, gap_factor: float = 3.0) -> Coverage | None:
        if not self.usable:
            return None
        if not self._times:
            self.usable = False
            return coverage_of_points(np.zeros(0, np.int64), np.zeros(0, np.int64), start_utc, end_utc, gap_factor)
        series = np.concatenate(self._series)
        self._series, self.usable = [], False  # the points are let go: a second call gives None
        if len(self._numbers) <= 1 << 16:
            series = series.astype(np.uint16)
        times = np.concatenate(self._times)
        self._times = []
        return coverage_of_points(series, times, start_utc, end_utc, gap_factor, self._groups(), self._units())

    def _groups(self) -> np.ndarray | None:
        """Each series number's cadence group: its ``source`` value's rank (as the SQL's dense_rank,
        nulls last), or None without a ``source`` column."""
        if CADENCE_GROUP not in self.series_cols:
            return None
        at = len(self.series_cols) - 1 - self.series_cols.index(CADENCE_GROUP)  # keys are built last column first
        values = [key[at] for key in self._numbers]  # in series-number order (dicts keep insertion order)
        rank = {v: i for i, v in enumerate(sorted({v for v in values if v is not None}))}
        return np.array([rank.get(v, len(rank)) for v in values], dtype=np.int64)

    def _units(self) -> np.ndarray | None:
        """Each series number's unit (its key without the ``source`` value, numbered), or None
        without a ``source`` column (each series its own)."""
        if CADENCE_GROUP not in self.series_cols:
            return None
        at = len(self.series_cols) - 1 - self.series_cols.index(CADENCE_GROUP)
        number: dict[tuple, int] = {}
        return np.array([number.setdefault(key[:at] + key[at + 1:], len(number)) for key in self._numbers],
                        dtype=np.int64)


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
_NOTE_VERSION = 5  # bump when coverage() changes what it measures (2: the window's edges; 3: per-source
# cadence; 4: a GPU read by several sources measured by its best one; 5: a window without a cadence is
# one gap)


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
    args = _note_args(time_col, series_cols, start_utc, end_utc, gap_factor)
    for owner in (spec, *also):
        note = store.read_partition_note(owner, day, COVERAGE_NOTE)
        if note and note.get("sha256") == digest and note.get("args") == args:
            try:
                return Coverage(**note["result"])
            except (TypeError, KeyError):
                pass  # a note of another shape: measured again below
    cov = coverage(path, time_col, series_cols, start_utc, end_utc, gap_factor)
    if store.partition_identity(spec, day) == before:
        keep_coverage(store, spec, day, digest, cov, time_col, series_cols, start_utc, end_utc, gap_factor)
    return cov


def keep_coverage(store: Store, spec: TableSpec, day: str, sha256: str, cov: Coverage, time_col: str,
                  series_cols: Sequence[str], start_utc: dt.datetime, end_utc: dt.datetime,
                  gap_factor: float = 3.0) -> None:
    """Keep ``cov``, measured on the rows a writer wrote as the file of digest ``sha256`` (e.g. by
    :class:`SeriesPoints`), as the partition's note: :func:`partition_coverage` with these arguments
    then finds it for those bytes instead of reading the file."""
    store.write_partition_note(spec, day, COVERAGE_NOTE, {
        "sha256": sha256, "args": _note_args(time_col, series_cols, start_utc, end_utc, gap_factor),
        "result": dataclasses.asdict(cov)})


def _note_args(time_col: str, series_cols: Sequence[str], start_utc: dt.datetime, end_utc: dt.datetime,
               gap_factor: float) -> dict:
    return {"time_col": time_col, "series_cols": list(series_cols), "start_utc": start_utc.isoformat(),
            "end_utc": end_utc.isoformat(), "gap_factor": gap_factor, "version": _NOTE_VERSION}
