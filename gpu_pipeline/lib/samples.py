"""One day of GPU telemetry: gather the raw samples, then validate them into ``clean/gpu_samples``.

Raw: every configured source parsed into the ``gpu_samples`` schema (``telemetry.TelemetryDir``
for nvidia-smi and DCGM files, a few at a time; the NVML sampler's daily Parquet files). Clean: rows
with a value outside its physical range (utilization and activity 0-100 %, power and memory >= 0,
temperature -40..150 C, power limit > 0) are quarantined with the reason -- never clipped silently --
and repeated (sample_utc, source, host, gpu_id) keys keep their first row (counted).

The assets write both steps without holding the day (:func:`write_raw_samples`,
:func:`write_clean_samples`); :func:`raw_samples` and :func:`clean_samples` are the same rules on
tables held in memory.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpu_pipeline.lib.coverage import SeriesPoints, keep_coverage
from gpu_pipeline.lib.coverage_table import TELEMETRY_SERIES, TELEMETRY_TIME
from gpu_pipeline.lib.memory import give_back
from gpu_pipeline.lib.prefetch import Prefetch
from gpu_pipeline.lib.prometheus_source import PrometheusConfig, fetch_dcgm_range
from gpu_pipeline.lib.schemas import (
    GPU_SAMPLES,
    QUARANTINE_GPU_SAMPLES,
    RAW_GPU_TELEMETRY,
    TS,
    conform,
    sorted_rows,
)
from gpu_pipeline.lib.spill import TimeSlabSorter
from gpu_pipeline.lib.store import ContentMismatch, Store, WriteResult
from gpu_pipeline.lib.telemetry import TelemetryDir, quarantine_lines_table
from gpu_pipeline.lib.terapixel import parse_gpu_csv
from gpu_pipeline.lib.timeutil import epoch_us

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


def nvml_files(root: Path, start_utc: dt.datetime, end_utc: dt.datetime) -> list[Path]:
    """The NVML sampler's files ``root/nvml/HOST/nvml-YYYY-MM-DD.parquet`` (UTC days) that may hold
    samples of [start_utc, end_utc), and the files ``nvml-YYYY-MM-DD.<stamp>.parquet`` a sampler
    writes beside a day's file it can neither read nor move aside."""
    base = root / "nvml"
    if not base.is_dir():
        return []
    days = {(start_utc + dt.timedelta(days=i)).date().isoformat() for i in range((end_utc - start_utc).days + 2)}
    return [path for path in sorted(base.glob("*/nvml-*.parquet"))
            if path.stem.removeprefix("nvml-").split(".")[0] in days]


def nvml_file_samples(path: Path, start_utc: dt.datetime, end_utc: dt.datetime,
                      source_file: str | None = None) -> pa.Table:
    """One NVML sampler file's samples of [start_utc, end_utc), in the raw schema, ``source_file``
    set on every row (default: ``path``; the raw readers give the path relative to the telemetry
    folder, as for its nvidia-smi and DCGM files). A file that cannot be read fails with its path in
    the message."""
    try:
        file = pq.ParquetFile(path)  # one open and one footer read for the columns and the rows
        t = file.read(columns=[c for c in file.schema_arrow.names
                               if c in GPU_SAMPLES.schema.names and c != "source_file"])
        t = conform(_rows_within(t, start_utc, end_utc), RAW_GPU_TELEMETRY)
    except (pa.ArrowException, ValueError, OSError, KeyError) as exc:  # KeyError: no sample_utc column
        raise ValueError(f"{path}: unreadable NVML sampler file: {exc}") from exc
    at = t.schema.get_field_index("source_file")
    src = str(path) if source_file is None else source_file
    return t.set_column(at, t.schema.field(at), pa.repeat(pa.scalar(src, t.schema.field(at).type), t.num_rows))


def _relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` (``nvml/HOST/nvml-DAY.parquet``), as the telemetry files' rows name theirs."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _rows_within(t: pa.Table, start_utc: dt.datetime, end_utc: dt.datetime) -> pa.Table:
    """The rows of ``t`` with ``sample_utc`` in [start_utc, end_utc): a slice when the times are in
    order, as the sampler writes them (a filter copies every column: a 1,000-GPU day's files 0.2-0.4 s),
    else a filter."""
    times = t["sample_utc"]
    if times.type == TS and times.null_count == 0 and t.num_rows:
        us = times.cast(pa.int64()).to_numpy()
        if bool(np.all(us[1:] >= us[:-1])):
            first, stop = np.searchsorted(us, [epoch_us(start_utc), epoch_us(end_utc)], side="left")
            return t.slice(int(first), int(stop - first))
    return t.filter(pc.and_(pc.greater_equal(times, pa.scalar(start_utc, times.type)),
                            pc.less(times, pa.scalar(end_utc, times.type))))


def nvml_window_bytes(path: Path, start_utc: dt.datetime, end_utc: dt.datetime) -> int:
    """The Arrow size of an NVML sampler file's rows (its footer's row count times :data:`_ROW_BYTES`:
    the footer's byte sizes are of dictionary-encoded text, several times smaller) times the share of
    its UTC day within [start_utc, end_utc): the size of its rows in the window, roughly."""
    try:
        whole = pq.ParquetFile(path).metadata.num_rows * _ROW_BYTES
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{path}: unreadable NVML sampler file: {exc}") from exc
    try:
        day = dt.datetime.combine(dt.date.fromisoformat(path.stem.removeprefix("nvml-")), dt.time(),
                                  tzinfo=dt.UTC)
    except ValueError:
        return whole
    overlap = min(end_utc, day + dt.timedelta(days=1)) - max(start_utc, day)
    return int(whole * max(0.0, overlap / dt.timedelta(days=1)))


def read_nvml_dir(root: Path, start_utc: dt.datetime, end_utc: dt.datetime) -> tuple[pa.Table, list[str]]:
    """The NVML sampler's samples of [start_utc, end_utc) held as one table, and the files read
    (:class:`RawStream` reads them a file at a time)."""
    paths = nvml_files(root, start_utc, end_utc)
    tables = [nvml_file_samples(path, start_utc, end_utc, _relative(path, Path(root))) for path in paths]
    return (pa.concat_tables(tables) if tables else RAW_GPU_TELEMETRY.empty()), [str(p) for p in paths]


def raw_samples(
    telemetry_dir: str | Path | None,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    source_tz: str,
    margin_days: int = 0,
    prometheus: PrometheusConfig | None = None,
    terapixel_dir: str | Path | None = None,
    nvidia_smi_fields: Sequence[str] | None = None,
) -> RawSamples:
    """Samples of [start_utc, end_utc) from the telemetry files and/or Prometheus, held in memory and
    sorted on :data:`RAW_ORDER` (:class:`RawStream` and :func:`write_raw_samples` give the same rows
    without holding the day).

    ``margin_days`` = 0 reads only files whose name carries a local date of the window (files rolled
    at local midnight); raise it for loggers that roll at another time. ``nvidia_smi_fields``: the
    ``--query-gpu`` list of header-less nvidia-smi logs."""
    stream = RawStream(telemetry_dir, start_utc, end_utc, source_tz, margin_days, prometheus, terapixel_dir,
                       nvidia_smi_fields)
    parts = list(stream.parts())
    table = sorted_rows(pa.concat_tables(parts), RAW_ORDER) if parts else RAW_GPU_TELEMETRY.empty()
    return RawSamples(table=table, files=stream.files, quarantine=stream.quarantine, counters=stream.counters)


class RawStream:
    """The sources of :func:`raw_samples`, read part by part: :meth:`parts` yields tables of the
    raw schema (telemetry files a few at a time, then the NVML files, Terapixel, Prometheus);
    ``files``, ``quarantine`` and ``counters`` are complete once it is exhausted. Missing
    directories raise here, before anything is read."""

    def __init__(self, telemetry_dir: str | Path | None, start_utc: dt.datetime, end_utc: dt.datetime,
                 source_tz: str, margin_days: int = 0, prometheus: PrometheusConfig | None = None,
                 terapixel_dir: str | Path | None = None, nvidia_smi_fields: Sequence[str] | None = None):
        self.start_utc, self.end_utc = start_utc, end_utc
        self.prometheus = prometheus
        self.files: list[str] = []
        self.quarantine: pa.Table | None = None
        self.counters: dict[str, int] = {}
        self.root = self.reader = None
        self.nvml_paths: list[Path] = []
        if telemetry_dir:
            self.root = Path(telemetry_dir)
            if not self.root.is_dir():
                raise FileNotFoundError(f"{self.root}: telemetry directory does not exist")
            # the repeated hour of a DST fall-back by the log's order: a step back inside it starts the
            # second pass ("earlier" put both passes in the first hour, left the second empty and
            # dropped the samples whose keys collided as duplicates)
            self.reader = TelemetryDir(self.root, start_utc, end_utc, source_tz, ambiguous="order",
                                       margin_days=margin_days, nvidia_smi_fields=nvidia_smi_fields)
            self.nvml_paths = nvml_files(self.root, start_utc, end_utc)
        self.gpu_csv = None
        if terapixel_dir:
            self.gpu_csv = Path(terapixel_dir) / "gpu.csv"
            if not self.gpu_csv.is_file():
                raise FileNotFoundError(f"{self.gpu_csv}: Terapixel gpu.csv not found")

    @property
    def expected_bytes(self) -> int:
        """A rough size of the rows in memory, known before reading: half the telemetry files' text
        (a DCGM scrape's text is about 3.4x its rows, nvidia-smi CSV about 1x), and the NVML files'
        rows in the window (:func:`nvml_window_bytes`)."""
        text = self.reader.text_bytes // 2 if self.reader is not None else 0
        return text + sum(nvml_window_bytes(path, self.start_utc, self.end_utc) for path in self.nvml_paths)

    def parts(self) -> Iterator[pa.Table]:
        if self.reader is not None and self.root is not None:
            for part in self.reader.parts():
                yield conform(part, RAW_GPU_TELEMETRY)
            # the sampler's files one at a time: a day of a large pool's samples is not held at once
            for path in self.nvml_paths:
                part = nvml_file_samples(path, self.start_utc, self.end_utc, _relative(path, self.root))
                if part.num_rows:
                    yield part
            self.files += list(self.reader.files) + [str(p) for p in self.nvml_paths]
            self.quarantine = quarantine_lines_table(self.reader.quarantine, RAW_GPU_TELEMETRY.path)
            self.counters.update(self.reader.counters)
        if self.gpu_csv is not None:
            tp = parse_gpu_csv(self.gpu_csv, start_utc=self.start_utc, end_utc=self.end_utc)
            yield conform(tp.table, RAW_GPU_TELEMETRY)
            self.files.append(str(self.gpu_csv))
            tq = tp.quarantine_table()
            self.quarantine = tq if self.quarantine is None else pa.concat_tables([self.quarantine, tq])
            self.counters.update({f"terapixel_{k}": v for k, v in tp.counters.items()})
        if self.prometheus is not None:
            fetched = fetch_dcgm_range(self.prometheus, self.start_utc, self.end_utc)
            yield conform(fetched.table, RAW_GPU_TELEMETRY)
            self.counters.update({f"prometheus_{k}": v for k, v in fetched.counters.items()})


def write_raw_samples(store: Store, day: str, stream: RawStream, spill_dir: str | Path | None = None,
                      keep_if_empty: bool = False) -> WriteResult:
    """The stream's rows sorted on :data:`RAW_ORDER` into the day's ``raw/gpu_telemetry`` partition
    (the file :func:`raw_samples` + ``Store.write_partition`` would write), as :func:`write_sorted_raw`
    writes them."""
    # nothing read, nothing set aside (a stream whose lines are all unreadable writes its quarantine,
    # which says why the day has no sample)
    nothing = (lambda: stream.quarantine is None or not stream.quarantine.num_rows) if keep_if_empty else False
    return write_sorted_raw(store, day, stream.parts(), stream.start_utc, stream.end_utc,
                            keep_if_empty=nothing, expected_bytes=stream.expected_bytes, spill_dir=spill_dir)


def write_sorted_raw(store: Store, day: str, parts: Iterable[pa.Table], start_utc: dt.datetime,
                     end_utc: dt.datetime, keep_if_empty: bool | Callable[[], bool] = False,
                     **sorter: Any) -> WriteResult:
    """Rows of the raw schema within [start_utc, end_utc), part by part, sorted on :data:`RAW_ORDER`
    into the day's ``raw/gpu_telemetry`` partition through a
    :class:`~gpu_pipeline.lib.spill.TimeSlabSorter` (``sorter``: its keyword options): a day too
    large to hold is spilled to disk in time slabs and sorted one slab at a time. The rows are
    checked for the clean step on their way to the file (:class:`_CheckAsWritten`), and the answer
    kept beside it as the partition's :data:`CLEAN_CHECK_NOTE`; their coverage is measured on the
    way too (:class:`~gpu_pipeline.lib.coverage.SeriesPoints`) and kept as its coverage note, which
    the raw asset's coverage check finds instead of reading the file again. ``keep_if_empty`` (or
    what it answers once the parts are read): no row keeps the partition an earlier run wrote, with
    its notes (:meth:`Store.kept_partition`)."""
    with TimeSlabSorter(RAW_GPU_TELEMETRY.schema, RAW_ORDER, epoch_us(start_utc), epoch_us(end_utc),
                        **sorter) as slabs:
        for part in parts:
            slabs.add(part)
        if (not slabs.rows and (keep_if_empty() if callable(keep_if_empty) else keep_if_empty)
                and (kept := store.kept_partition(RAW_GPU_TELEMETRY, day)) is not None):
            return kept
        give_back()  # what the parsers freed, before the slabs are read back and sorted
        check = _CheckAsWritten()
        points = SeriesPoints(TELEMETRY_TIME, TELEMETRY_SERIES)
        # the slabs read back, sorted and checked on a thread of their own while this one encodes
        # the batches before them into the Parquet file: both mostly without the GIL (the batches
        # queued are slices of sorted slabs, and keep up to two of them alive besides the one
        # being sorted: a 1,000-GPU day's peak was the same with four batches ahead as with one)
        with Prefetch(_seen(points, check.passing(slabs.sorted_batches())), depth=_WRITE_AHEAD,
                      name="raw-sort") as batches:
            result = store.write_partition_batches(RAW_GPU_TELEMETRY, day, iter(batches), digest=True)
    store.write_partition_note(RAW_GPU_TELEMETRY, day, CLEAN_CHECK_NOTE, check.note(result))
    # the day's coverage, from the rows as they were written (the raw asset's coverage check finds
    # it), once what the writer freed is given back
    give_back()
    if (cov := points.coverage(start_utc, end_utc)) is not None:
        keep_coverage(store, RAW_GPU_TELEMETRY, day, result.sha256, cov, TELEMETRY_TIME, TELEMETRY_SERIES,
                      start_utc, end_utc)
    return result


def _seen(points: SeriesPoints, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        points.add(batch)
        yield batch


@dataclass
class CleanSamples:
    table: pa.Table
    quarantine: pa.Table
    rows_in: int = 0
    duplicates_dropped: int = 0
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)


# The duplicate key, in the output's sort order; among rows of one key the first by source_file
# (nulls last) is the one kept. The raw table is sorted on RAW_ORDER, so that its rows come in the
# order the cleaning keeps them.
_KEY = ("sample_utc", "host", "gpu_id", "source")
RAW_ORDER = (*_KEY, "source_file")
_CLEAN_BATCH_ROWS = 1 << 17
_ROW_BYTES = 280  # about, in Arrow (a DCGM row)
# Sorted batches of the raw step ready ahead of its Parquet writer (about 18 MB each at 280 bytes a row).
_WRITE_AHEAD = 4


_HIGHEST = float(np.finfo(np.float64).max)
_LOWEST = -_HIGHEST


def _out_of_range(table: pa.Table) -> dict[str, np.ndarray]:
    """Per checked column with some violation: which rows hold a value outside ``RANGES`` (NaN and
    ±inf included, also where the range is open on that side; null is not a violation)."""
    masks = {}
    for col, (lo, hi) in RANGES.items():
        if col not in table.column_names:
            continue
        column = table[col]
        values = column.to_numpy()  # float64; nulls read as NaN and are masked out below
        # within [lo, hi], an open side at the largest finite float: NaN and ±inf are never within
        with np.errstate(invalid="ignore"):
            within = ((values >= (_LOWEST if lo is None else lo))
                      & (values <= (_HIGHEST if hi is None else hi)))
        if within.all():  # (the usual column: no mask to make)
            continue
        out = ~within
        if column.null_count:
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
        if arr.null_count:
            equal = (pc.fill_null(pc.equal(later, earlier), False).to_numpy(zero_copy_only=False)
                     | pc.and_(pc.is_null(later), pc.is_null(earlier)).to_numpy(zero_copy_only=False))
        else:  # (no null to compare: the comparison has none either)
            equal = pc.equal(later, earlier).to_numpy(zero_copy_only=False)
        same[1:] &= equal
        if not same.any():  # no row left with the previous one's key so far: the later columns cannot add one
            break
    return same


def _out_of_order(table: pa.Table, columns: tuple[str, ...]) -> bool:
    """Whether some row of ``table`` comes before the previous one on ``columns`` (ascending, nulls
    last, as :func:`~gpu_pipeline.lib.schemas.sorted_rows` orders them)."""
    n = table.num_rows
    if n < 2:
        return False
    undecided = np.ones(n - 1, dtype=bool)
    for col in columns:
        arr = table[col].combine_chunks()
        later, earlier = arr.slice(1), arr.slice(0, n - 1)
        later_null = later.is_null().to_numpy(zero_copy_only=False)
        earlier_null = earlier.is_null().to_numpy(zero_copy_only=False)
        less = pc.fill_null(pc.less(later, earlier), False).to_numpy(zero_copy_only=False)
        greater = pc.fill_null(pc.greater(later, earlier), False).to_numpy(zero_copy_only=False)
        less |= earlier_null & ~later_null  # nulls last: a value after a null comes too early
        greater |= later_null & ~earlier_null
        if (undecided & less).any():
            return True
        undecided &= ~greater
        if not undecided.any():
            return False
    return False


#: The note the raw step keeps beside its partition (``Store.write_partition_note``): the clean
#: step's read-only pass, made on the rows as they were written (:class:`_CheckAsWritten`).
CLEAN_CHECK_NOTE = "clean-check"
#: Bump when the cleaning's rules change in a way RANGES, _KEY and RAW_ORDER do not show: a note
#: made under other rules is not used.
_CHECK_VERSION = 2  # 2: ±inf is out of range
_RULES = hashlib.sha256(repr((_CHECK_VERSION, sorted(RANGES.items()), _KEY, RAW_ORDER)).encode()).hexdigest()[:16]


class _CheckAsWritten:
    """The clean step's read-only pass (would the cleaning keep every row as it is?), made on the
    raw step's sorted batches on their way to the Parquet writer, instead of by decoding the file
    again in the clean step (a 1,000-GPU day: 0.7 s to decode, 0.4 s to check). :meth:`note` binds
    the answer to the bytes written by their SHA-256: the clean step copies the raw file only when
    the bytes it copies are those (:func:`write_clean_samples`)."""

    def __init__(self) -> None:
        self.cleaner = _Cleaner()
        self.gpus: set[str] = set()
        self.clean = True

    def passing(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if self.clean:  # the first row to drop or quarantine settles it
                self.cleaner.piece(pa.Table.from_batches([batch]), check_order=False)
                self.clean = not (self.cleaner.duplicates_dropped or self.cleaner.q_rows)
                self.gpus.update(pc.unique(batch["gpu_id"]).to_pylist())
            yield batch

    def note(self, written: WriteResult) -> dict:
        return {"rules": _RULES, "sha256": written.sha256, "rows": written.rows, "clean": self.clean,
                "gpus": len(self.gpus) if self.clean else None}


def _note_vouches(note: dict | None, raw: pq.ParquetFile) -> bool:
    """Whether the raw step's note says the file's rows need no cleaning, under these rules (its
    digest is checked as the file is copied)."""
    return (note is not None and note.get("rules") == _RULES and note.get("clean") is True
            and note.get("rows") == raw.metadata.num_rows and isinstance(note.get("sha256"), str)
            and isinstance(note.get("gpus"), int))


class RawNotSorted(ValueError):
    """A raw partition whose rows are not in :data:`RAW_ORDER` (one written by an earlier version)."""


class _Cleaner:
    """The cleaning of rows sorted on :data:`RAW_ORDER`, a piece at a time: each piece's rows are
    compared with the last row of the piece before (a repeated key across the cut is a duplicate)."""

    def __init__(self) -> None:
        self.rows_in = 0
        self.duplicates_dropped = 0
        self.reasons: dict[str, int] = {}
        self.q_rows: list[dict] = []
        self._last: pa.Table | None = None  # the previous piece's last row

    def piece(self, table: pa.Table, check_order: bool) -> pa.Table:
        n = table.num_rows
        if not n:
            return GPU_SAMPLES.empty()
        self.rows_in += n
        joined = table if self._last is None else pa.concat_tables([self._last, table])
        if check_order and _out_of_order(joined, RAW_ORDER):
            raise RawNotSorted(f"raw rows are not sorted on {RAW_ORDER}")
        dup = _repeats_previous(joined, _KEY)[joined.num_rows - n:]
        self._last = table.slice(n - 1)
        violations = _out_of_range(table)
        is_bad = np.zeros(n, dtype=bool)
        for mask in violations.values():
            is_bad |= mask
        bad_rows = np.flatnonzero(is_bad)
        for i, r in zip(bad_rows.tolist(), table.take(pa.array(bad_rows)).to_pylist(), strict=True):
            cols = [c for c, mask in violations.items() if mask[i]]
            for c in cols:
                self.reasons[f"{c} out of range"] = self.reasons.get(f"{c} out of range", 0) + 1
            detail = ", ".join(f"{c}={r[c]!r} (allowed {RANGES[c][0]}..{RANGES[c][1]})" for c in cols)
            self.q_rows.append({
                "source_table": "raw/gpu_telemetry",
                "reason": f"value out of range: {detail}",
                "source_file": r.get("source_file"),
                "source_row": None,
                "record_utc": r["sample_utc"],
                "row_json": json.dumps(r, default=str, sort_keys=True),
            })
        self.duplicates_dropped += int(np.count_nonzero(dup & ~is_bad))
        keep = ~is_bad & ~dup
        return conform(table if keep.all() else table.filter(pa.array(keep)), GPU_SAMPLES)

    def quarantine(self) -> pa.Table:
        if not self.q_rows:
            return QUARANTINE_GPU_SAMPLES.empty()
        return pa.Table.from_pylist(self.q_rows, schema=QUARANTINE_GPU_SAMPLES.schema)


def clean_samples(raw: pa.Table) -> CleanSamples:
    """Quarantine out-of-range rows and drop repeated keys, with the output sorted on ``_KEY``.

    One sort on ``_KEY`` + source_file (nulls last) puts a key's rows together with the one to keep
    first; a later row of the key is a duplicate unless it is quarantined itself. A quarantined first
    row still takes the key: the key's other rows are dropped as duplicates."""
    cleaner = _Cleaner()
    good = cleaner.piece(sorted_rows(raw, RAW_ORDER), check_order=False)
    return CleanSamples(
        table=good,
        quarantine=cleaner.quarantine(),
        rows_in=raw.num_rows,
        duplicates_dropped=cleaner.duplicates_dropped,
        quarantined_by_reason=dict(sorted(cleaner.reasons.items())),
    )


@dataclass
class CleanWrite:
    """What :func:`write_clean_samples` wrote and counted."""

    result: WriteResult
    quarantine: pa.Table
    rows_in: int
    duplicates_dropped: int
    quarantined_by_reason: dict[str, int]
    gpus: int  #: distinct gpu_id in the written rows
    repeated_keys: int  #: written rows whose key repeats the row before (0 unless something is wrong)
    sorted_raw: bool  #: False when the raw partition was out of order and had to be sorted first
    #: True when the raw step's note vouched for the raw file's bytes: copied without a read pass
    checked_when_written: bool = False


def _written_rows(batches: Iterable[pa.Table], seen: dict[str, object]) -> Iterator[pa.RecordBatch]:
    """Pass the cleaned pieces on as batches, counting distinct GPUs and keys that repeat the row
    before (across pieces too) into ``seen``."""
    gpus: set[str] = set()
    last: pa.Table | None = None
    repeated = 0
    for table in batches:
        if not table.num_rows:
            continue
        keys = table.select(list(_KEY))
        joined = keys if last is None else pa.concat_tables([last, keys])
        repeated += int(np.count_nonzero(_repeats_previous(joined, _KEY)))
        last = keys.slice(keys.num_rows - 1)
        gpus.update(pc.unique(table["gpu_id"]).to_pylist())
        yield from table.to_batches()
    seen["gpus"], seen["repeated_keys"] = len(gpus), repeated


def write_clean_samples(store: Store, day: str, spill_dir: str | Path | None = None,
                        batch_rows: int = _CLEAN_BATCH_ROWS, **sorter: Any) -> CleanWrite:
    """The day's ``raw/gpu_telemetry`` partition cleaned (:func:`clean_samples`) into
    ``clean/gpu_samples`` and its quarantine, a batch at a time: the raw rows are already in the
    order the cleaning needs. A raw partition that is not (written by an earlier version) is sorted
    first through a :class:`~gpu_pipeline.lib.spill.TimeSlabSorter`; the output is the same.

    A day with nothing to clean is the raw file copied. The raw step's note
    (:data:`CLEAN_CHECK_NOTE`, made as it wrote the file) says so without reading the rows again;
    the copy is hashed on its way and kept only when its bytes are those the note was made on. A
    raw file without a note, or another file than the note's, gets the read-only pass instead."""
    path = store.partition_file(RAW_GPU_TELEMETRY, day)

    def raw_batches() -> Iterator[pa.RecordBatch]:
        yield from pq.ParquetFile(path).iter_batches(batch_size=batch_rows)

    def cleaned(batches: Iterable[pa.RecordBatch], check_order: bool) -> tuple[_Cleaner, dict, Iterator[pa.RecordBatch]]:
        cleaner, seen = _Cleaner(), {}
        pieces = (cleaner.piece(pa.Table.from_batches([b]), check_order) for b in batches)
        return cleaner, seen, _written_rows(pieces, seen)

    sorted_raw = True
    result = None
    vouched = False
    note = store.read_partition_note(RAW_GPU_TELEMETRY, day, CLEAN_CHECK_NOTE)
    try:
        with path.open("rb") as raw_file:  # checked and copied from one open file, whatever replaces it
            raw = pq.ParquetFile(raw_file)
            same_layout = _same_layout(raw)
            if same_layout and _note_vouches(note, raw):
                # The raw step found nothing to clean in these very bytes: they are copied, hashed on the
                # way (another file than the note's is checked below instead).
                with contextlib.suppress(ContentMismatch):
                    result = store.write_partition_copy(GPU_SAMPLES, day, raw_file, sha256=note["sha256"])
                    cleaner, seen, vouched = _Cleaner(), {"gpus": note["gpus"], "repeated_keys": 0}, True
                    cleaner.rows_in = note["rows"]
            if result is None and same_layout:
                # A read-only pass first: when the rows are in order and the cleaning keeps every one as
                # it is (the usual day), the clean file is the raw file, which is copied instead of
                # written again (encoding a 1,000-GPU day is ~1.1 s of the step's ~2 s). The pass stops
                # at the first row to drop or quarantine: that day is written below.
                cleaner, seen, rows = cleaned(raw.iter_batches(batch_size=batch_rows), True)
                for _ in rows:
                    if cleaner.duplicates_dropped or cleaner.q_rows:
                        break
                # (checked again after the loop: a last piece dropped whole yields no rows to stop at)
                if not (cleaner.duplicates_dropped or cleaner.q_rows):
                    result = store.write_partition_copy(GPU_SAMPLES, day, raw_file)
        if result is None:
            cleaner, seen, rows = cleaned(raw_batches(), check_order=True)
            result = store.write_partition_batches(GPU_SAMPLES, day, rows)
    except RawNotSorted:
        sorted_raw = False
        start, end = (epoch_us(t) for t in _day_bounds(path))
        sorter.setdefault("expected_bytes", pq.ParquetFile(path).metadata.num_rows * _ROW_BYTES)
        with TimeSlabSorter(RAW_GPU_TELEMETRY.schema, RAW_ORDER, start, end, spill_dir=spill_dir, **sorter) as slabs:
            for batch in raw_batches():
                slabs.add(pa.Table.from_batches([batch]))  # add() takes the schema's columns and types
            cleaner, seen, rows = cleaned(slabs.sorted_batches(), check_order=False)
            result = store.write_partition_batches(GPU_SAMPLES, day, rows)
    quarantine = cleaner.quarantine()
    store.write_partition(QUARANTINE_GPU_SAMPLES, day, quarantine)
    return CleanWrite(result=result, quarantine=quarantine, rows_in=cleaner.rows_in,
                      duplicates_dropped=cleaner.duplicates_dropped,
                      quarantined_by_reason=dict(sorted(cleaner.reasons.items())),
                      gpus=int(seen["gpus"]), repeated_keys=int(seen["repeated_keys"]), sorted_raw=sorted_raw,
                      checked_when_written=vouched)


def _same_layout(raw: pq.ParquetFile) -> bool:
    """Whether a raw partition is laid out as the clean writer would write its rows: the clean
    schema (the two tables share it), this version's row groups and codec. A raw file of an earlier
    version is cleaned by writing its rows anew."""
    meta = raw.metadata
    size = GPU_SAMPLES.row_group_rows
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    return (raw.schema_arrow.equals(GPU_SAMPLES.schema, check_metadata=True)
            and all(g.num_rows == size for g in groups[:-1])
            and all(g.column(c).compression == "ZSTD" for g in groups for c in range(g.num_columns)))


def _day_bounds(path: Path) -> tuple[dt.datetime, dt.datetime]:
    """The window of a raw partition's sample times (the sorter's): its first, and just after its last."""
    times = pq.read_table(path, columns=["sample_utc"])["sample_utc"]
    lo, hi = pc.min_max(times).values()
    return lo.as_py(), hi.as_py() + dt.timedelta(microseconds=1)
