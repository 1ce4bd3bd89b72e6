"""Terapixel-style CSVs (Newcastle's 1024-GPU rendering run, DESIGN.md 4.3): GPU samples, task runs
and per-task GPU means.

The public dataset has three CSV files with a header line:

``gpu.csv``
    ``timestamp,hostname,gpuSerial,gpuUUID,powerDrawWatt,gpuTempC,gpuUtilPerc,gpuMemUtilPerc``, one
    row per GPU every ~2 s (one GPU per host). :func:`parse_gpu_csv` turns it into
    :data:`~gpu_pipeline.lib.schemas.GPU_SAMPLES` rows with ``source='terapixel'`` and returns the same
    :class:`~gpu_pipeline.lib.telemetry.ParseResult` as the other telemetry parsers.
``application-checkpoints.csv``
    ``timestamp,hostname,eventName,eventType,jobId,taskId``: START/STOP events of the render steps
    (``TotalRender``, ``Render``, ``Saving Config``, ``Tiling``, ``Uploading``).
    :func:`parse_task_runs` pairs them into :data:`TASK_RUNS` (one row per task x step x run).
``task-x-y.csv``
    ``taskId,jobId,x,y,level``: the tile a task renders, joined onto the task runs.

Reading
    Files are read with ``pyarrow.csv``, streamed in 16 MiB blocks parsed on several threads, every
    cell as text (low-cardinality columns such as hostname and UUID dictionary-encoded), and typed
    with Arrow's vectorized casts and NumPy: there is no Python loop per row (per-value work runs on
    the distinct values of a dictionary, per-row Python only on rows being quarantined). A 1024-GPU
    day of ~44M gpu.csv rows is never held as text at once, and with a time window only the rows in
    it are kept. Columns are found by header name (other columns are ignored; a missing one raises
    ``ValueError``: the file is not of this kind); cells are trimmed before they are judged. A line
    number is the physical line in the file (the header is line 1); the raw line in the quarantine
    is rebuilt from the cells read, joined with ``,`` (the dataset has no quoting). Lines with the
    wrong number of fields are quarantined; blank lines and repeated header lines are skipped and
    counted (``blank_lines``, ``repeated_headers``).

Timestamps
    ISO 8601 as Arrow parses it into ``timestamp[us, UTC]``: ``2018-11-08T07:41:55.921Z`` (``T`` or
    a space, seconds and up to 6 fraction digits optional) with ``Z`` or an offset (``+01:00``,
    ``+0100``). A time without a zone, or an impossible one, is unparseable (quarantined).

GPU samples (:func:`parse_gpu_csv`)
    ``host`` = ``hostname``; ``gpu_uuid`` is the UUID in lower case and ``gpu_id`` the HTCondor short
    id (``GPU-`` + first 8 hex digits, exactly :func:`~gpu_pipeline.lib.telemetry.short_gpu_id` of a
    full UUID); ``power_w``, ``temp_c``, ``util_pct``, ``mem_util_pct`` from ``powerDrawWatt``,
    ``gpuTempC``, ``gpuUtilPerc``, ``gpuMemUtilPerc``. ``gpuSerial`` has no column in ``gpu_samples``
    and is not kept. Quarantined (line number and reason): an unparseable timestamp, a missing
    hostname, a missing or malformed UUID, a value that is not a finite number. An empty value is null
    (counted as ``empty_values``), not an error. With ``start_utc``/``end_utc`` only samples in
    ``[start_utc, end_utc)`` are returned; rows outside are counted (``outside_window``) and never
    quarantined, while a row whose timestamp cannot be read is quarantined whatever the window (its
    time is unknown). Range checks (0-100 %, ...) are left to ``samples.clean_samples``.

Task runs (:func:`parse_task_runs`)
    1. Exact duplicate rows (all six cells equal as text) keep their first line; the others are
       dropped and counted (``duplicate_events``).
    2. Rows with an unparseable timestamp, an ``eventType`` other than START/STOP (case-insensitive)
       or an empty hostname/eventName/jobId/taskId are quarantined.
    3. Pairing: events are grouped by (hostname, jobId, taskId, eventName) and ordered by timestamp,
       then START before STOP, then by line. At one instant START comes first, so a zero-duration
       step pairs whichever line the log wrote first -- except when a START of an earlier instant is
       still open: then the STOP of the instant comes first and ends it, and the instant's START opens
       the next run (back-to-back runs). Each START is paired with the event right after it when
       that is a STOP. A START followed by another START, or by nothing, is an
       *unmatched START*; a STOP not preceded by a START is an *unmatched STOP*. Both are quarantined
       with the reason (``unmatched_start``, ``unmatched_stop``). A START/STOP pair that follows an
       earlier pair of the same task and step is a re-execution: it is kept as a run of its own.
    4. ``run_index`` numbers the runs of one (jobId, taskId, eventName) 0, 1, ... by start time,
       across hosts (a task re-executed on another host continues the count). Counted: runs with
       ``run_index >= 1`` (``reexecuted_runs``) and distinct (jobId, taskId) with any
       (``reexecuted_tasks``).
    5. ``x``, ``y``, ``level`` come from ``task-x-y.csv`` by (jobId, taskId) (``runs_without_xy``
       when absent). Exact duplicate task rows are counted (``task_xy_duplicates``); a task listed
       with different tiles keeps its first line (``task_xy_conflicts``); rows whose x/y/level are
       not integers are quarantined.
    6. ``gpu_uuid``/``gpu_id``: the GPU the host reports in ``gpu.csv`` (a path, or an already parsed
       ``gpu_samples`` table). A host that reports several GPUs gets none (``hosts_with_several_gpus``);
       runs without a GPU are counted (``runs_without_gpu``) when GPU data was given.

Per-task GPU means (:func:`task_gpu_means`)
    For each run, the time-weighted mean of its GPU's samples with ``start_utc <= sample_utc <
    end_utc``: a sample holds its value until the GPU's next sample, at most ``max_hold_s`` (a gap in
    the telemetry does not stretch one value), and never past ``end_utc``. The time between
    ``start_utc`` and the first sample is not covered (``covered_s`` says how much was). The
    interval join is sort-based (samples sorted by GPU and time, each run's range found by binary
    search and summed directly): O((samples + runs) log samples), no per-host quadratic join; the
    tests check it against a plain DuckDB interval join.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import functools
import heapq
import io
import random
import re
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from gpu_pipeline.lib.schemas import GPU_SAMPLES, TS, TableSpec, _f, conform, quarantine_spec
from gpu_pipeline.lib.telemetry import ParseResult, QuarantinedLine, quarantine_lines_table, short_gpu_id

UTC = dt.UTC

GPU_CSV_COLUMNS: tuple[str, ...] = (
    "timestamp", "hostname", "gpuSerial", "gpuUUID", "powerDrawWatt", "gpuTempC", "gpuUtilPerc",
    "gpuMemUtilPerc",
)
CHECKPOINT_COLUMNS: tuple[str, ...] = ("timestamp", "hostname", "eventName", "eventType", "jobId", "taskId")
TASK_XY_COLUMNS: tuple[str, ...] = ("taskId", "jobId", "x", "y", "level")
EVENT_NAMES: tuple[str, ...] = ("TotalRender", "Render", "Saving Config", "Tiling", "Uploading")

TASK_RUNS = TableSpec(
    layer="clean",
    name="task_runs",
    description=(
        "Terapixel render task runs: one row per task x step (eventName) x run, paired from the START/STOP "
        "events of application-checkpoints.csv (exact duplicate events dropped and counted, unmatched "
        "events quarantined, re-executions kept as runs of their own), with the task's tile from "
        "task-x-y.csv and the host's GPU from gpu.csv."
    ),
    key=("job_id", "task_id", "event_name", "run_index"),
    schema=pa.schema(
        [
            _f("job_id", pa.string(), "jobId, e.g. 1024-lvl12-<uuid>", nullable=False),
            _f("task_id", pa.string(), "taskId (UUID)", nullable=False),
            _f("event_name", pa.string(), "Step: TotalRender, Render, Saving Config, Tiling, Uploading",
               nullable=False),
            _f("run_index", pa.int32(), "0-based run of this task and step (1, 2, ...: re-executions), "
               "by start time", nullable=False),
            _f("host", pa.string(), "hostname the run's events came from", nullable=False),
            _f("gpu_uuid", pa.string(), "Full UUID of the host's GPU (from gpu.csv; null when unknown)"),
            _f("gpu_id", pa.string(), "HTCondor short id GPU-xxxxxxxx of the host's GPU"),
            _f("start_utc", TS, "Time of the START event (UTC)", nullable=False),
            _f("end_utc", TS, "Time of the STOP event (UTC)", nullable=False),
            _f("duration_s", pa.float64(), "end_utc - start_utc (s)", nullable=False),
            _f("x", pa.int32(), "Tile x (task-x-y.csv; null when the task is not listed)"),
            _f("y", pa.int32(), "Tile y (task-x-y.csv)"),
            _f("level", pa.int32(), "Zoom level of the tile (task-x-y.csv)"),
            _f("start_line", pa.int64(), "Line of the START event in the checkpoints file", nullable=False),
            _f("stop_line", pa.int64(), "Line of the STOP event in the checkpoints file", nullable=False),
            _f("source_file", pa.string(), "Checkpoints file the events were read from"),
        ]
    ),
)

TASK_GPU_MEANS = TableSpec(
    layer="metrics",
    name="task_gpu_means",
    description=(
        "Per-task GPU means (DESIGN.md 5.5): each task run with the time-weighted mean utilization, power "
        "and temperature of its host's GPU over [start_utc, end_utc); nulls and samples=0 when the GPU "
        "has no sample in the run."
    ),
    key=TASK_RUNS.key,
    schema=pa.schema(
        list(TASK_RUNS.schema)
        + [
            _f("samples", pa.int64(), "GPU samples with start_utc <= sample_utc < end_utc", nullable=False),
            _f("covered_s", pa.float64(), "Run time covered by those samples (each holds until the next "
               "sample, at most max_hold_s, never past end_utc)", nullable=False),
            _f("util_pct_mean", pa.float64(), "Time-weighted mean GPU utilization (%)"),
            _f("mem_util_pct_mean", pa.float64(), "Time-weighted mean memory utilization (%)"),
            _f("power_w_mean", pa.float64(), "Time-weighted mean power draw (W)"),
            _f("temp_c_mean", pa.float64(), "Time-weighted mean GPU temperature (C)"),
            _f("energy_j", pa.float64(), "Power integrated over the covered time (J)"),
        ]
    ),
)

QUARANTINE_TASK_RUNS = quarantine_spec("task_runs")


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------

_BLOCK = 16 << 20
_DICT = pa.dictionary(pa.int32(), pa.string())
_UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


def _source(path_or_text: str | Path) -> tuple[Any, str | None]:
    """(what pyarrow reads, the path). A ``Path`` is a file; a ``str`` with a newline is CSV text, else
    a file name (missing: ``FileNotFoundError``)."""
    if isinstance(path_or_text, str) and "\n" not in path_or_text:
        path_or_text = Path(path_or_text)
    if isinstance(path_or_text, Path):
        if not path_or_text.is_file():
            raise FileNotFoundError(f"no such Terapixel CSV file: {path_or_text}")
        return str(path_or_text), str(path_or_text)
    if not isinstance(path_or_text, str):
        raise TypeError(f"expected a path or CSV text, got {type(path_or_text).__name__}")
    return path_or_text.encode("utf-8"), None


def _names_its_file(fn: Callable) -> Callable:
    """Arrow's own failures while reading a file (the wide line that takes a block, dictionaries it
    cannot unify) name the file."""
    @functools.wraps(fn)
    def wrapped(path_or_text: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(path_or_text, *args, **kwargs)
        except pa.ArrowException as exc:
            what = path_or_text if isinstance(path_or_text, Path) or "\n" not in str(path_or_text) else "CSV text"
            raise ValueError(f"{what}: unreadable Terapixel CSV: {exc}") from exc
    return wrapped


def _open(src: Any) -> BinaryIO:
    return io.BytesIO(src) if isinstance(src, bytes) else open(src, "rb")  # noqa: SIM115


class _Scan:
    """A streaming read of one CSV: the wanted columns as text (``dict_columns`` dictionary-encoded),
    batch by batch with the ordinal of the batch's first data row, and the rows pyarrow rejected for
    their number of fields. A blank line is a row of empty cells, so ordinals count it."""

    def __init__(self, path_or_text: str | Path, columns: Sequence[str], kind: str,
                 dict_columns: Sequence[str] = ()) -> None:
        self.src, self.path = _source(path_or_text)
        self.what = self.path or f"{kind} text"
        self.kind = kind
        self.columns = tuple(columns)
        self.dict_columns = set(dict_columns)
        self.invalid: list[tuple[int | None, str, int]] = []
        with _open(self.src) as fh:
            first = fh.readline().decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n")
        self.header = [c.strip() for c in next(csv.reader([first]))] if first.strip() else None
        if self.header is not None:
            missing = [c for c in self.columns if c not in self.header]
            if missing:
                raise ValueError(f"{self.what}: not a Terapixel {kind}: missing columns {missing} "
                                 f"(header: {self.header})")

    def _reader(self, threads: bool, columns: Sequence[str], handler: Callable) -> pacsv.CSVStreamingReader:
        assert self.header is not None
        return pacsv.open_csv(
            _open(self.src),
            read_options=pacsv.ReadOptions(use_threads=threads, block_size=_BLOCK),
            # no quoting in the dataset: a stray '"' opened a quoted cell that took the rest of the file
            parse_options=pacsv.ParseOptions(ignore_empty_lines=False, invalid_row_handler=handler,
                                             quote_char=False, escape_char=False),
            convert_options=pacsv.ConvertOptions(
                column_types={c: _DICT if c in self.dict_columns else pa.string() for c in self.header},
                include_columns=list(columns),
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )

    def batches(self) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(ordinal of the first row, batch), in file order; pyarrow parses on several threads."""
        if self.header is None:
            return

        def handler(row: Any) -> str:
            self.invalid.append((row.number, row.text, row.actual_columns))
            return "skip"

        offset = 0
        with self._unreadable(), self._reader(True, self.columns, handler) as reader:
            for batch in reader:
                yield offset, batch
                offset += batch.num_rows

    @contextlib.contextmanager
    def _unreadable(self) -> Iterator[None]:
        """What pyarrow cannot read (bytes that are not UTF-8, a line longer than a block) fails the
        file, naming it."""
        try:
            yield
        except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
            raise ValueError(f"{self.what}: unreadable Terapixel {self.kind}: {exc}") from exc

    def invalid_lines(self) -> list[tuple[int, str, int]]:
        """Line number, text and field count of each rejected row. Multithreaded parsing does not know
        line numbers, so a file with rejected rows is read once more on one thread (rare)."""
        if any(n is None for n, _, _ in self.invalid):
            found: list[tuple[int | None, str, int]] = []

            def handler(row: Any) -> str:
                found.append((row.number, row.text, row.actual_columns))
                return "skip"

            with self._unreadable(), self._reader(False, self.columns[:1], handler) as reader:
                for _ in reader:
                    pass
            self.invalid = found
        return sorted((int(n or 0), t, k) for n, t, k in self.invalid)

    def lines_of(self, ordinals: np.ndarray) -> np.ndarray:
        """Physical line numbers (header = line 1) of data rows given by ordinal."""
        ordinals = np.asarray(ordinals, dtype=np.int64)
        bad = np.array([n for n, _, _ in self.invalid_lines()], dtype=np.int64)
        if not len(bad):
            return ordinals + 2
        before = bad - 2 - np.arange(len(bad))  # rows read before the i-th rejected line
        return ordinals + 2 + np.searchsorted(before, ordinals, side="right")

    def quarantine(self, ordinals: np.ndarray, reasons: Sequence[str], raw: Sequence[str],
                   times: Sequence[dt.datetime | None] | None = None) -> list[QuarantinedLine]:
        """QuarantinedLine for rows given by ordinal (with their time, where read), plus the rejected
        rows, by line."""
        lines = self.lines_of(ordinals).tolist()
        when = times if times is not None else [None] * len(lines)
        out = [QuarantinedLine(ln, r, t, self.path, at)
               for ln, r, t, at in zip(lines, reasons, raw, when, strict=True)]
        out += [QuarantinedLine(ln, f"expected {len(self.header or ())} fields, got {k}", text, self.path)
                for ln, text, k in self.invalid_lines()]
        return sorted(out, key=lambda q: q.line_number)


def _plain(arr: pa.Array) -> pa.Array:
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def _bisect_cast(x: pa.Array, type_: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    try:
        return x.cast(type_), np.zeros(len(x), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if len(x) == 1:
            return pa.nulls(1, type_), np.ones(1, dtype=bool)
    mid = len(x) // 2
    (a, am), (b, bm) = _bisect_cast(x.slice(0, mid), type_), _bisect_cast(x.slice(mid), type_)
    return pa.concat_arrays([a, b]), np.concatenate([am, bm])


def _cast(arr: pa.Array, type_: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """Text cells cast to ``type_`` with Arrow's parsers: empty (or blank) cells are null; cells that
    do not parse, even trimmed, are null and flagged in the mask. A clean column costs one vectorized
    cast; one with bad cells is bisected (casts of halves), so the extra cost grows with the number of
    bad cells, not with the rows."""
    empty = pc.equal(arr, "")
    x = pc.if_else(empty, pa.scalar(None, pa.string()), arr) if pc.any(empty).as_py() else arr
    try:
        return x.cast(type_), np.zeros(len(x), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    x = pc.utf8_trim_whitespace(x)
    x = pc.if_else(pc.equal(x, ""), pa.scalar(None, pa.string()), x)
    return _bisect_cast(x, type_)


def _cast_float(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """As :func:`_cast` to float64; NaN and infinities count as bad (and become null)."""
    values, bad = _cast(arr, pa.float64())
    nonfinite = pc.fill_null(pc.invert(pc.is_finite(values)), False).to_numpy(zero_copy_only=False)
    if nonfinite.any():
        bad = bad | nonfinite
        values = pc.if_else(pa.array(nonfinite), pa.scalar(None, pa.float64()), values)
    return values, bad


def _dict_map(arr: pa.Array, fn: Callable[[str], Any], cache: dict[str, Any]) -> tuple[list[Any], np.ndarray]:
    """``fn`` of each distinct value of a dictionary array (memoized in ``cache``): the per-value
    results and the row -> value index."""
    results = []
    for v in arr.dictionary.to_pylist():
        if v not in cache:
            cache[v] = fn(v)
        results.append(cache[v])
    return results, arr.indices.to_numpy(zero_copy_only=False)


def _mask_of(flags: list[bool], idx: np.ndarray) -> np.ndarray:
    return np.asarray(flags, dtype=bool)[idx] if flags else np.zeros(len(idx), dtype=bool)


def _special_rows(batch: pa.RecordBatch, columns: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(blank line, repeated header line) masks; only rows whose first cell is empty or the first
    column name are looked at closely."""
    first = _plain(batch.column(columns[0]))
    blank = pc.equal(first, "").to_numpy(zero_copy_only=False)
    header = pc.equal(first, columns[0]).to_numpy(zero_copy_only=False)
    for mask, want in ((blank, None), (header, columns)):
        rows = np.flatnonzero(mask)
        if len(rows):
            sub = batch.take(pa.array(rows)).to_pylist()
            ok = [all(str(r[c]).strip() == (c if want else "") for c in columns) for r in sub]
            mask[rows] = ok
    return blank, header


def _raw_lines(batch: pa.RecordBatch | pa.Table, rows: np.ndarray, columns: Sequence[str]) -> list[str]:
    if not len(rows):
        return []
    return [",".join(str(r[c]) for c in columns) for r in batch.take(pa.array(rows)).to_pylist()]


_Check = tuple[np.ndarray, "str | list[str | None]"]


def _reasons(rows: np.ndarray, checks: Sequence[_Check]) -> list[str]:
    """'; '-joined reasons of the given rows (only rows being quarantined are looked at). A check is
    (mask, message) or (row -> value index, message per distinct value or None)."""
    out = []
    for i in rows.tolist():
        parts = []
        for m, msg in checks:
            if isinstance(msg, str):
                if m[i]:
                    parts.append(msg)
            elif msg[m[i]] is not None:
                parts.append(msg[m[i]])
        out.append("; ".join(parts))
    return out


def _utc_param(value: dt.datetime | None, what: str) -> dt.datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware (UTC), got naive {value!r}")
    return value.astimezone(UTC)


def _finish_counters(counters: Counter[str]) -> Counter[str]:
    return Counter({k: v for k, v in counters.items() if v or k in ("rows_out", "quarantined_lines")})


# ----------------------------------------------------------------------------------------------
# gpu.csv -> gpu_samples
# ----------------------------------------------------------------------------------------------

_GPU_VALUES = (  # csv column -> gpu_samples column
    ("gpuUtilPerc", "util_pct"),
    ("gpuMemUtilPerc", "mem_util_pct"),
    ("powerDrawWatt", "power_w"),
    ("gpuTempC", "temp_c"),
)
_GPU_DICT_COLUMNS = ("hostname", "gpuSerial", "gpuUUID")
_TS_MSG = "timestamp: not an ISO 8601 time with zone"


def _uuid_info(value: str) -> tuple[str | None, str | None, str | None]:
    """(reason, canonical UUID, short id) of one gpuUUID cell."""
    s = value.strip()
    if not s:
        return "gpuUUID: missing", None, None
    if not _UUID_RE.match(s):
        return "gpuUUID: not a GPU UUID", None, None
    return None, "GPU-" + s[4:].lower(), short_gpu_id(s)


def _gpu_batch(batch: pa.RecordBatch, start: dt.datetime | None, end: dt.datetime | None,
               caches: dict[str, dict], counters: Counter[str]) -> tuple[pa.RecordBatch | None, np.ndarray, list[str]]:
    """One batch of gpu.csv: (kept rows, row numbers in the batch to quarantine, their reasons)."""
    blank, header = _special_rows(batch, GPU_CSV_COLUMNS)
    skip = blank | header
    counters["blank_lines"] += int(blank.sum())
    counters["repeated_headers"] += int(header.sum())
    ts_text = batch.column("timestamp")
    ts, ts_bad = _cast(ts_text, TS)
    ts_missing = ts.is_null().to_numpy(zero_copy_only=False) & ~ts_bad
    no_ts = ts_bad | ts_missing
    host = batch.column("hostname")
    host_vals, host_idx = _dict_map(host, str.strip, caches["host"])
    host_missing = _mask_of([not h for h in host_vals], host_idx)
    uuid_info, uuid_idx = _dict_map(batch.column("gpuUUID"), _uuid_info, caches["uuid"])
    uuid_reason = [r for r, _, _ in uuid_info]
    uuid_bad = _mask_of([r is not None for r in uuid_reason], uuid_idx)
    values = {}
    checks: list[_Check] = [
        (ts_bad, _TS_MSG), (ts_missing, "timestamp: missing"), (host_missing, "hostname: missing"),
        (uuid_idx, uuid_reason),
    ]
    bad = no_ts | host_missing | uuid_bad
    for col, out in _GPU_VALUES:
        v, b = _cast_float(batch.column(col))
        values[out] = v
        checks.append((b, f"{col}: not a finite number"))
        bad |= b
    in_window = ~no_ts
    if start is not None or end is not None:
        lo = pc.greater_equal(ts, pa.scalar(start, TS)) if start is not None else None
        hi = pc.less(ts, pa.scalar(end, TS)) if end is not None else None
        cond = lo if hi is None else hi if lo is None else pc.and_(lo, hi)
        in_window &= pc.fill_null(cond, False).to_numpy(zero_copy_only=False)
    counters["outside_window"] += int((~skip & ~no_ts & ~in_window).sum())
    quarantine = np.flatnonzero(~skip & bad & (no_ts | in_window))
    keep = ~skip & ~bad & in_window
    counters["data_lines"] += int((~skip).sum())
    reasons = _reasons(quarantine, checks)
    if not keep.any():
        return None, quarantine, reasons
    arrays = {
        "sample_utc": ts,
        "host": pa.DictionaryArray.from_arrays(host_idx, pa.array(host_vals, pa.string())),
        "gpu_uuid": pa.DictionaryArray.from_arrays(uuid_idx, pa.array([c for _, c, _ in uuid_info], pa.string())),
        "gpu_id": pa.DictionaryArray.from_arrays(uuid_idx, pa.array([g for _, _, g in uuid_info], pa.string())),
        **values,
    }
    out = pa.RecordBatch.from_pydict(arrays)
    if not keep.all():
        out = out.filter(pa.array(keep))
    counters["empty_values"] += sum(out.column(c).null_count for _, c in _GPU_VALUES)
    return out, quarantine, reasons


@_names_its_file
def parse_gpu_csv(
    path_or_text: str | Path,
    source_file: str | None = None,
    *,
    start_utc: dt.datetime | None = None,
    end_utc: dt.datetime | None = None,
) -> ParseResult:
    """Parse a Terapixel ``gpu.csv`` (file or text) into ``gpu_samples`` rows (``source='terapixel'``),
    sorted by (sample_utc, host, gpu_id). ``start_utc``/``end_utc`` (aware) keep only samples in
    ``[start_utc, end_utc)``; either may be left open. ``source_file`` defaults to the path. See the
    module docstring for the mapping, nulls and the quarantine."""
    start = _utc_param(start_utc, "start_utc")
    end = _utc_param(end_utc, "end_utc")
    scan = _Scan(path_or_text, GPU_CSV_COLUMNS, "gpu.csv", _GPU_DICT_COLUMNS)
    source = source_file if source_file is not None else scan.path
    scan.path = source
    counters: Counter[str] = Counter()
    caches: dict[str, dict] = {"host": {}, "uuid": {}}
    kept: list[pa.RecordBatch] = []
    q_ordinals: list[np.ndarray] = []
    q_reasons: list[str] = []
    q_raw: list[str] = []
    for offset, batch in scan.batches():
        good, bad_rows, reasons = _gpu_batch(batch, start, end, caches, counters)
        if good is not None:
            kept.append(good)
        if len(bad_rows):
            q_ordinals.append(bad_rows + offset)
            q_reasons += reasons
            q_raw += _raw_lines(batch, bad_rows, GPU_CSV_COLUMNS)
    counters["data_lines"] += len(scan.invalid)
    quarantine = scan.quarantine(
        np.concatenate(q_ordinals) if q_ordinals else np.zeros(0, np.int64), q_reasons, q_raw
    )
    n = sum(b.num_rows for b in kept)
    if n:
        table = pa.Table.from_batches(kept).unify_dictionaries().combine_chunks()
        # sort by (sample_utc, host, gpu_id) on integers: the rank of each dictionary value
        keys = [table.column("sample_utc").cast(pa.int64()).to_numpy()]
        for c in ("host", "gpu_id"):
            col = table.column(c).chunk(0)
            by_value = pc.array_sort_indices(col.dictionary).to_numpy()
            rank = np.empty(len(by_value), dtype=np.int64)
            rank[by_value] = np.arange(len(by_value))
            keys.append(rank[col.indices.to_numpy(zero_copy_only=False)])
        ts_, h_, g_ = keys
        in_order = (ts_[1:] > ts_[:-1]) | ((ts_[1:] == ts_[:-1]) & (
            (h_[1:] > h_[:-1]) | ((h_[1:] == h_[:-1]) & (g_[1:] >= g_[:-1]))))
        if not in_order.all():
            table = table.take(pa.array(np.lexsort(keys[::-1])))
        table = pa.table({
            "sample_utc": table.column("sample_utc"),
            "source": pa.repeat(pa.scalar("terapixel"), n),
            **{c: table.column(c).cast(pa.string()) for c in ("host", "gpu_uuid", "gpu_id")},
            **{out: table.column(out) for _, out in _GPU_VALUES},
            "source_file": pa.repeat(pa.scalar(source, pa.string()), n),
        })
        table = conform(table, GPU_SAMPLES)
    else:
        table = GPU_SAMPLES.empty()
    counters["rows_out"] = table.num_rows
    counters["quarantined_lines"] = len(quarantine)
    return ParseResult(table, quarantine, _finish_counters(counters), [source] if source else [])


# ----------------------------------------------------------------------------------------------
# application-checkpoints.csv (+ task-x-y.csv, gpu.csv) -> task_runs
# ----------------------------------------------------------------------------------------------


@dataclass
class TaskRunsResult:
    """Rows conformed to :data:`TASK_RUNS`, quarantined lines (checkpoint events and task-x-y rows,
    each with its file) and counters."""

    table: pa.Table
    quarantine: list[QuarantinedLine] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)
    files: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.table.num_rows

    def quarantine_table(self) -> pa.Table:
        """The quarantined lines as rows of the project's quarantine table schema."""
        return quarantine_lines_table(self.quarantine, TASK_RUNS.path)


def _codes(arr: pa.ChunkedArray | pa.Array, fn: Callable[[str], str] | None = None) -> tuple[np.ndarray, pa.Array]:
    """Integer codes of a (dictionary) string column, equal codes for equal values (after ``fn``),
    and the values by code."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    values = arr.dictionary
    if fn is not None:
        values = pa.array([fn(v) for v in values.to_pylist()], pa.string())
    enc = pc.dictionary_encode(values)
    remap = enc.indices.to_numpy(zero_copy_only=False)
    idx = arr.indices.to_numpy(zero_copy_only=False)
    return remap[idx] if len(idx) else np.zeros(0, np.int64), enc.dictionary


def _same_as_previous(sorted_keys: Sequence[np.ndarray]) -> np.ndarray:
    """For rows sorted by ``sorted_keys``: whether each row has the same keys as the row before it."""
    n = len(sorted_keys[0])
    same = np.zeros(n, dtype=bool)
    if n > 1:
        same[1:] = True
        for k in sorted_keys:
            same[1:] &= k[1:] == k[:-1]
    return same


_CP_DICT_COLUMNS = ("hostname", "eventName", "eventType", "jobId", "taskId")


def _checkpoint_batch(batch: pa.RecordBatch, offset: int, counters: Counter[str]) -> pa.RecordBatch | None:
    """One batch of application-checkpoints.csv: its data rows with ordinal, ts and the reason a row
    is invalid (null when valid); blank and repeated header lines dropped (counted)."""
    blank, header = _special_rows(batch, CHECKPOINT_COLUMNS)
    counters["blank_lines"] += int(blank.sum())
    counters["repeated_headers"] += int(header.sum())
    rows = np.flatnonzero(~(blank | header))
    if not len(rows):
        return None
    ts, ts_bad = _cast(batch.column("timestamp"), TS)
    ts_missing = ts.is_null().to_numpy(zero_copy_only=False) & ~ts_bad
    checks: list[_Check] = [(ts_bad, _TS_MSG), (ts_missing, "timestamp: missing")]
    bad = ts_bad | ts_missing
    for col in ("hostname", "eventName", "eventType", "jobId", "taskId"):
        if col == "eventType":
            def check(v: str) -> str | None:
                s = v.strip().upper()
                return None if s in ("START", "STOP") else f"eventType: expected START or STOP, got {v.strip()!r}"
        else:
            def check(v: str, col: str = col) -> str | None:
                return None if v.strip() else f"{col}: missing"
        msgs, idx = _dict_map(batch.column(col), check, {})
        checks.append((idx, msgs))
        bad |= _mask_of([m is not None for m in msgs], idx)
    reason = np.full(batch.num_rows, None, dtype=object)
    bad_rows = rows[bad[rows]]
    reason[bad_rows] = _reasons(bad_rows, checks)
    take = pa.array(rows)
    return pa.RecordBatch.from_pydict({
        "ordinal": pa.array(rows + offset, pa.int64()),
        "ts": ts.take(take),
        "reason": pa.array(reason[rows], pa.string()),
        **{c: batch.column(c).take(take) for c in CHECKPOINT_COLUMNS},
    })


def _host_gpus(gpu: Any, counters: Counter[str]) -> pa.Table | None:
    """(host, gpu_uuid, gpu_id) of each host that reports exactly one GPU, from a gpu.csv path/text, a
    ParseResult or a gpu_samples table."""
    if gpu is None:
        return None
    pairs: set[tuple[str, str, str]] = set()
    if isinstance(gpu, (str, Path)):
        scan = _Scan(gpu, ("hostname", "gpuUUID"), "gpu.csv", ("hostname", "gpuUUID"))
        cache: dict[str, Any] = {}
        for _, batch in scan.batches():
            h, u = batch.column("hostname"), batch.column("gpuUUID")
            info, uidx = _dict_map(u, _uuid_info, cache)
            hidx = h.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            combined = np.unique(hidx * max(len(info), 1) + uidx)
            hosts = h.dictionary.to_pylist()
            for c in combined.tolist():
                host, (reason, uuid, gpu_id) = hosts[c // max(len(info), 1)].strip(), info[c % max(len(info), 1)]
                if host and reason is None:
                    pairs.add((host, uuid, gpu_id))
    else:
        samples = getattr(gpu, "table", gpu)
        if not isinstance(samples, pa.Table):
            raise TypeError(f"gpu: expected a path, CSV text, ParseResult or table, got {type(gpu).__name__}")
        distinct = samples.group_by(["host", "gpu_uuid", "gpu_id"]).aggregate([])
        pairs = {(h, u, g) for h, u, g in zip(*(distinct.column(c).to_pylist() for c in ("host", "gpu_uuid", "gpu_id")),
                                             strict=True) if h is not None}
    by_host: dict[str, set[tuple[str, str]]] = {}
    for h, u, g in pairs:
        by_host.setdefault(h, set()).add((u, g))
    counters["hosts_with_several_gpus"] += sum(len({g for _, g in v}) > 1 for v in by_host.values())
    single = sorted((h, *next(iter(v))) for h, v in by_host.items() if len({g for _, g in v}) == 1)
    return pa.table({
        "host": pa.array([h for h, _, _ in single], pa.string()),
        "gpu_uuid": pa.array([u for _, u, _ in single], pa.string()),
        "gpu_id": pa.array([g for _, _, g in single], pa.string()),
    })


def _task_xy(task_xy: str | Path, counters: Counter[str]) -> tuple[pa.Table, list[QuarantinedLine], str | None]:
    """task-x-y.csv: (job_id, task_id, x, y, level) per task, quarantined rows, the path."""
    scan = _Scan(task_xy, TASK_XY_COLUMNS, "task-x-y.csv", ("jobId",))
    parts, q_ord, q_reason, q_raw = [], [], [], []
    for offset, batch in scan.batches():
        blank, header = _special_rows(batch, TASK_XY_COLUMNS)
        counters["blank_lines"] += int(blank.sum())
        rows = ~(blank | header)
        checks: list[_Check] = []
        bad = np.zeros(batch.num_rows, dtype=bool)
        ids = {}
        for col in ("taskId", "jobId"):
            ids[col] = pc.utf8_trim_whitespace(_plain(batch.column(col)))
            missing = pc.equal(ids[col], "").to_numpy(zero_copy_only=False)
            checks.append((missing, f"{col}: missing"))
            bad |= missing
        nums = {}
        for col in ("x", "y", "level"):
            v, b = _cast(batch.column(col), pa.int32())
            b = b | v.is_null().to_numpy(zero_copy_only=False)
            nums[col] = v
            checks.append((b, f"{col}: not an integer"))
            bad |= b
        bad_rows = np.flatnonzero(rows & bad)
        if len(bad_rows):
            q_ord.append(bad_rows + offset)
            q_reason += _reasons(bad_rows, checks)
            q_raw += _raw_lines(batch, bad_rows, TASK_XY_COLUMNS)
        take = pa.array(np.flatnonzero(rows & ~bad))
        parts.append(pa.table({
            "ordinal": pa.array(np.flatnonzero(rows & ~bad) + offset, pa.int64()),
            "job_id": ids["jobId"].take(take), "task_id": ids["taskId"].take(take),
            **{c: nums[c].take(take) for c in ("x", "y", "level")},
        }))
    quarantine = scan.quarantine(np.concatenate(q_ord) if q_ord else np.zeros(0, np.int64), q_reason, q_raw)
    xy = pa.concat_tables(parts) if parts else pa.table({
        "ordinal": pa.array([], pa.int64()), "job_id": pa.array([], pa.string()),
        "task_id": pa.array([], pa.string()), **{c: pa.array([], pa.int32()) for c in ("x", "y", "level")}})
    job, _ = _codes(xy.column("job_id"))
    task, _ = _codes(xy.column("task_id"))
    ordinal = xy.column("ordinal").to_numpy()
    order = np.lexsort((ordinal, task, job))
    same_task = _same_as_previous([job[order], task[order]])
    tiles = [xy.column(c).to_numpy()[order] for c in ("x", "y", "level")]
    first = np.maximum.accumulate(np.where(same_task, 0, np.arange(len(order))))
    identical = same_task & np.logical_and.reduce([t == t[first] for t in tiles]) if len(order) else same_task
    counters["task_xy_duplicates"] += int(identical.sum())
    counters["task_xy_conflicts"] += int((same_task & ~identical).sum())
    keep = xy.take(pa.array(order[~same_task])).drop_columns(["ordinal"])
    counters["task_xy_rows"] += keep.num_rows
    return keep, quarantine, scan.path


@_names_its_file
def parse_task_runs(
    checkpoints: str | Path,
    task_xy: str | Path | None = None,
    gpu: Any = None,
    *,
    source_file: str | None = None,
) -> TaskRunsResult:
    """Pair the START/STOP events of ``application-checkpoints.csv`` (file or text) into
    :data:`TASK_RUNS` rows, with tiles from ``task_xy`` (``task-x-y.csv``) and the host's GPU from
    ``gpu`` (``gpu.csv`` path or text, a :class:`ParseResult` or a ``gpu_samples`` table). Sorted by
    (start_utc, host, job_id, task_id, event_name, run_index). See the module docstring for the rules."""
    scan = _Scan(checkpoints, CHECKPOINT_COLUMNS, "application-checkpoints.csv", _CP_DICT_COLUMNS)
    source = source_file if source_file is not None else scan.path
    scan.path = source
    counters: Counter[str] = Counter()
    files = [source] if source else []
    xy, xy_quarantine = None, []
    if task_xy is not None:
        xy, xy_quarantine, xy_path = _task_xy(task_xy, counters)
        files += [xy_path] if xy_path else []
    host_gpu = _host_gpus(gpu, counters)
    if isinstance(gpu, (str, Path)) and "\n" not in str(gpu):
        files.append(str(gpu))

    parts = [b for offset, batch in scan.batches() if (b := _checkpoint_batch(batch, offset, counters)) is not None]
    ev = pa.Table.from_batches(parts).unify_dictionaries() if parts else None
    n = ev.num_rows if ev is not None else 0
    counters["data_lines"] = n + len(scan.invalid)
    if not n:
        counters.update(rows_out=0)
        quarantine = scan.quarantine(np.zeros(0, np.int64), [], []) + xy_quarantine
        counters["quarantined_lines"] = len(quarantine)
        return TaskRunsResult(TASK_RUNS.empty(), quarantine, _finish_counters(counters), files)

    ordinal = ev.column("ordinal").to_numpy()
    # 1. exact duplicates: same text in all six cells; the first line stays
    raw = [_codes(ev.column(c))[0] for c in CHECKPOINT_COLUMNS]
    order = np.lexsort([ordinal] + raw[::-1])
    dup = np.zeros(n, dtype=bool)
    dup[order] = _same_as_previous([r[order] for r in raw])
    counters["duplicate_events"] = int(dup.sum())
    reason = ev.column("reason").combine_chunks()
    invalid = reason.is_valid().to_numpy(zero_copy_only=False)
    q_rows: list[np.ndarray] = [np.flatnonzero(~dup & invalid)]
    q_reasons: list[str] = reason.take(pa.array(q_rows[0])).to_pylist()

    # 2. pairing per (host, job, task, event) by (ts, line)
    host, host_vals = _codes(ev.column("hostname"), str.strip)
    job, job_vals = _codes(ev.column("jobId"), str.strip)
    task, task_vals = _codes(ev.column("taskId"), str.strip)
    name, name_vals = _codes(ev.column("eventName"), str.strip)
    etype, etype_vals = _codes(ev.column("eventType"), lambda v: v.strip().upper())
    is_start_code = np.array([v == "START" for v in etype_vals.to_pylist()], dtype=bool)
    ts = pc.fill_null(ev.column("ts").combine_chunks().cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    valid = np.flatnonzero(~dup & ~invalid)
    is_start = is_start_code[etype]
    order = valid[np.lexsort((ordinal[valid], ~is_start[valid], ts[valid], name[valid], task[valid], job[valid],
                              host[valid]))]
    order = _stop_first_after_an_open_start(order, is_start, (host, job, task, name), ts)
    group = _same_as_previous([k[order] for k in (host, job, task, name)])  # same group as the previous
    start = is_start[order]
    nxt_same = np.append(group[1:], False)
    nxt_start = np.append(start[1:], False)
    paired = start & nxt_same & ~nxt_start
    paired_stop = np.insert(paired[:-1], 0, False) if len(paired) else paired
    unmatched_start = start & ~paired
    unmatched_stop = ~start & ~paired_stop
    counters["unmatched_start"] = int(unmatched_start.sum())
    counters["unmatched_stop"] = int(unmatched_stop.sum())
    counters["unknown_event_names"] = int(np.isin(
        name[valid], np.flatnonzero(~np.isin(name_vals.to_numpy(zero_copy_only=False), EVENT_NAMES))).sum())
    for mask, msg in ((unmatched_start, "START"), (unmatched_stop, "STOP")):
        pos = np.flatnonzero(mask)
        q_rows.append(order[pos])
        for p in pos.tolist():
            if msg == "START":
                q_reasons.append(
                    f"unmatched START: followed by another START at {_iso(ts[order[p + 1]])}"
                    if nxt_same[p] else "unmatched START: no STOP follows")
            else:
                q_reasons.append("unmatched STOP: follows another STOP" if group[p]
                                 else "unmatched STOP: no START before it")
    q_all = np.concatenate(q_rows)
    q_raw = _raw_lines(ev, q_all, CHECKPOINT_COLUMNS)
    # each set-aside event's time where it was read (the day that reports it)
    q_times = ev.column("ts").combine_chunks().take(pa.array(q_all, pa.int64())).to_pylist()
    quarantine = scan.quarantine(ordinal[q_all], q_reasons, q_raw, q_times)
    quarantine = sorted(quarantine, key=lambda q: q.line_number) + xy_quarantine

    # 3. runs, numbered per (job, task, event) by start
    s = order[np.flatnonzero(paired)]
    e = order[np.flatnonzero(paired) + 1]
    by_run = np.lexsort((ordinal[s], ts[s], name[s], task[s], job[s]))
    same_run_key = _same_as_previous([job[s][by_run], task[s][by_run], name[s][by_run]])
    first = np.maximum.accumulate(np.where(same_run_key, 0, np.arange(len(s))))
    run_index = np.empty(len(s), dtype=np.int32)
    run_index[by_run] = np.arange(len(s)) - first
    again = run_index >= 1
    counters["reexecuted_runs"] = int(again.sum())
    counters["reexecuted_tasks"] = len(np.unique(np.stack([job[s][again], task[s][again]]), axis=1).T) if again.any() else 0
    lines = scan.lines_of(np.concatenate([ordinal[s], ordinal[e]]))
    runs = pa.table({
        "job_id": job_vals.take(pa.array(job[s])),
        "task_id": task_vals.take(pa.array(task[s])),
        "event_name": name_vals.take(pa.array(name[s])),
        "run_index": pa.array(run_index, pa.int32()),
        "host": host_vals.take(pa.array(host[s])),
        "start_utc": pa.array(ts[s], pa.int64()).cast(TS),
        "end_utc": pa.array(ts[e], pa.int64()).cast(TS),
        "duration_s": pa.array((ts[e] - ts[s]) / 1e6, pa.float64()),
        "start_line": pa.array(lines[: len(s)], pa.int64()),
        "stop_line": pa.array(lines[len(s):], pa.int64()),
        "source_file": pa.repeat(pa.scalar(source, pa.string()), len(s)),
    })
    if xy is not None:
        runs = runs.join(xy, keys=["job_id", "task_id"], join_type="left outer")
        counters["runs_without_xy"] = runs.column("level").null_count
    if host_gpu is not None:
        runs = runs.join(host_gpu, keys="host", join_type="left outer")
        counters["runs_without_gpu"] = runs.column("gpu_id").null_count
    runs = runs.sort_by([(c, "ascending") for c in ("start_utc", "host", "job_id", "task_id", "event_name", "run_index")])
    table = conform(runs, TASK_RUNS)
    counters["rows_out"] = table.num_rows
    counters["quarantined_lines"] = len(quarantine)
    return TaskRunsResult(table, quarantine, _finish_counters(counters), files)


def _stop_first_after_an_open_start(order: np.ndarray, is_start: np.ndarray, keys: Sequence[np.ndarray],
                                    ts: np.ndarray) -> np.ndarray:
    """``order`` (rows sorted by group ``keys``, ts, START before STOP, line) with the STOPs of an
    instant moved before its STARTs where the event before the instant is a START (it is still open:
    the instant's STOP ends it, its START opens the next run). Only instants holding both a START and
    a STOP are looked at (rare); a chain of back-to-back instants is followed in order."""
    n = len(order)
    if n < 2:
        return order
    group = _same_as_previous([k[order] for k in keys])
    same_instant = group & _same_as_previous([ts[order]])
    start = is_start[order]
    heads = np.flatnonzero(~same_instant)
    ends = np.append(heads[1:], n)
    both = np.flatnonzero(start[heads] & ~start[ends - 1])  # START first and STOP last: both kinds
    if not len(both):
        return order
    order = order.copy()
    ends_open: dict[int, bool] = {}  # instant -> its last event is a START, in the final order
    for i in both.tolist():
        h, e = int(heads[i]), int(ends[i])
        before_open = bool(group[h]) and ends_open.get(i - 1, bool(start[h - 1]))
        if before_open:
            seg, s = order[h:e], start[h:e]
            order[h:e] = np.concatenate([seg[~s], seg[s]])
        ends_open[i] = before_open
    return order


def _iso(us: int) -> str:
    """The dataset's format, ``2018-11-08T07:42:30.100Z`` (microseconds when there are any)."""
    t = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(us))
    return t.isoformat(timespec="milliseconds" if us % 1000 == 0 else "microseconds") + "Z"


# ----------------------------------------------------------------------------------------------
# Per-task GPU means
# ----------------------------------------------------------------------------------------------

_MEAN_VALUES = (("util_pct", "util_pct_mean"), ("mem_util_pct", "mem_util_pct_mean"),
                ("power_w", "power_w_mean"), ("temp_c", "temp_c_mean"))


def _range_sums(x: np.ndarray, i0: np.ndarray, i1: np.ndarray) -> np.ndarray:
    """``x[i0[k]:i1[k]].sum()`` for every k (0 where empty); ``i0`` sorted ascending. Each range is
    summed directly (no prefix-sum cancellation); the cost is the total length of the ranges plus
    one pass over ``x``."""
    if not len(i0):
        return np.zeros(0)
    padded = np.append(x, 0.0)
    sums = np.add.reduceat(padded, np.column_stack([i0, i1]).ravel())[::2]
    return np.where(i1 > i0, sums, 0.0)


def task_gpu_means(task_runs: Any, samples: Any, *, max_hold_s: float = 10.0) -> pa.Table:
    """Per task run, the time-weighted mean util/memory util/power/temperature of its GPU's samples in
    ``[start_utc, end_utc)`` (:data:`TASK_GPU_MEANS`, rows in the order of ``task_runs``).

    ``task_runs``: a :data:`TASK_RUNS` table or :class:`TaskRunsResult`; ``samples``: a
    ``gpu_samples`` table or :class:`ParseResult`. The run's GPU is its ``gpu_id`` on its host, else
    the single GPU its host reports in ``samples``, else (a GPU replaced in the day) the host's GPU
    with the most samples during the run; its ``gpu_id`` and ``gpu_uuid`` are filled in from the
    samples where the run had none. Samples of one GPU at one instant are averaged first. Sample *i* at ``t_i``
    weighs ``min(t_next, t_i + max_hold_s, end_utc) - t_i`` where ``t_next`` is the GPU's next sample;
    each mean ignores null values (and their weights). ``energy_j`` is the power integrated over the
    covered time. A run without samples has ``samples = 0``, ``covered_s = 0`` and null means.

    The interval join is sort-based: samples sorted by (GPU, time), each run's sample range found by
    binary search and summed directly, so the cost is O((samples + runs) log samples)."""
    if not max_hold_s > 0:
        raise ValueError(f"max_hold_s must be > 0, got {max_hold_s}")
    runs = getattr(task_runs, "table", task_runs)
    runs = conform(runs.select(TASK_RUNS.schema.names), TASK_RUNS)
    samp = getattr(samples, "table", samples)
    if "gpu_uuid" not in samp.column_names:
        samp = samp.append_column("gpu_uuid", pa.nulls(samp.num_rows, pa.string()))
    samp = samp.select(["sample_utc", "host", "gpu_id", "gpu_uuid"] + [c for c, _ in _MEAN_VALUES])
    if samp.column("host").null_count:
        samp = samp.filter(pc.is_valid(samp.column("host")))
    hold_us = int(round(max_hold_s * 1e6))

    # GPU keys: dense codes of (host, gpu_id)
    host_code, host_vals = _codes(samp.column("host"))
    gpu_code, gpu_vals = _codes(samp.column("gpu_id"))
    pair = host_code.astype(np.int64) * max(len(gpu_vals), 1) + gpu_code
    pairs, first_row, key = np.unique(pair, return_index=True, return_inverse=True)
    pair_uuid = samp.column("gpu_uuid").take(pa.array(first_row, pa.int64())) if samp.num_rows else pa.array([], pa.string())
    t = samp.column("sample_utc").cast(pa.int64()).to_numpy() if samp.num_rows else np.zeros(0, np.int64)
    vals = {c: pc.fill_null(samp.column(c).cast(pa.float64()), np.nan).to_numpy() if samp.num_rows
            else np.zeros(0) for c, _ in _MEAN_VALUES}

    order = np.lexsort((t, key))
    key, t = key[order], t[order]
    vals = {c: v[order] for c, v in vals.items()}
    dup = _same_as_previous([key, t])
    if dup.any():  # average the samples of one GPU at one instant
        starts = np.flatnonzero(~dup)
        for c, v in vals.items():
            ok = ~np.isnan(v)
            total = np.add.reduceat(np.where(ok, v, 0.0), starts)
            count = np.add.reduceat(ok.astype(np.int64), starts)
            with np.errstate(invalid="ignore", divide="ignore"):
                vals[c] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        key, t = key[starts], t[starts]
    n_samples = len(t)
    same_next = np.append(key[1:] == key[:-1], False) if n_samples else np.zeros(0, bool)
    t_next = np.where(same_next, np.append(t[1:], 0), t + hold_us)
    t_until = np.minimum(t_next, t + hold_us)

    # composite (GPU, time) position that increases along the sorted samples
    t0 = int(t.min()) if n_samples else 0
    span = (int(t.max()) - t0 + 2) if n_samples else 1
    if len(pairs) * span >= 2**62:
        raise ValueError("task_gpu_means: sample times span too long for the composite search key")
    pos = key * span + (t - t0)

    # runs -> GPU key: the run's gpu_id on its host, else the host's only GPU (-1: none)
    n_gpu = max(len(gpu_vals), 1)
    r_host = pc.fill_null(pc.index_in(runs.column("host"), value_set=host_vals), -1).to_numpy()
    r_gpu = pc.fill_null(pc.index_in(runs.column("gpu_id"), value_set=gpu_vals), -1).to_numpy()
    r_has_gpu = runs.column("gpu_id").is_valid().to_numpy(zero_copy_only=False)
    pair_host, pair_gpu = pairs // n_gpu, pairs % n_gpu
    single = np.bincount(pair_host, minlength=len(host_vals))[pair_host] == 1
    only_gpu = np.full(len(host_vals) + 1, -1, dtype=np.int64)  # the last slot answers host -1
    only_gpu[pair_host[single]] = pair_gpu[single]
    r_gpu = np.where(r_has_gpu, r_gpu, only_gpu[r_host])
    start = runs.column("start_utc").cast(pa.int64()).to_numpy()
    end = runs.column("end_utc").cast(pa.int64()).to_numpy()
    lo = np.clip(start - t0, 0, span - 1)
    hi = np.clip(end - t0, 0, span - 1)
    # a host that reported several GPUs in the samples (a GPU replaced in the day): a run without a
    # GPU of its own takes the one with the most samples during the run
    several = np.flatnonzero(~r_has_gpu & (r_host >= 0) & (r_gpu < 0))
    for i in several.tolist():
        best, most = -1, 0
        for kk in np.flatnonzero(pair_host == r_host[i]).tolist():
            got = int(np.searchsorted(pos, kk * span + hi[i]) - np.searchsorted(pos, kk * span + lo[i]))
            if got > most:
                best, most = int(pair_gpu[kk]), got
        r_gpu[i] = best
    want = np.where((r_host >= 0) & (r_gpu >= 0), r_host.astype(np.int64) * n_gpu + r_gpu, -1)
    k = np.minimum(np.searchsorted(pairs, want), max(len(pairs) - 1, 0))
    found = (want >= 0) & (pairs[k] == want) if len(pairs) else np.zeros(len(want), dtype=bool)
    i0 = np.where(found, np.searchsorted(pos, k * span + lo, side="left"), 0)
    i1 = np.where(found, np.searchsorted(pos, k * span + hi, side="left"), 0)
    i1 = np.maximum(i0, i1)
    n = i1 - i0
    last = np.maximum(i1 - 1, 0)
    has = n > 0
    cut = np.where(has, (t_until[last] - np.minimum(t_until[last], end)) / 1e6, 0.0) if n_samples else np.zeros(len(n))

    w = (t_until - t) / 1e6
    by_i0 = np.argsort(i0, kind="stable")
    a, b = i0[by_i0], i1[by_i0]

    def sums(x: np.ndarray) -> np.ndarray:
        out = np.empty(len(a))
        out[by_i0] = _range_sums(x, a, b)
        return out

    result: dict[str, pa.Array] = {"samples": pa.array(n.astype(np.int64))}
    covered = np.where(has, sums(w) - cut, 0.0)
    result["covered_s"] = pa.array(covered)
    for c, out in _MEAN_VALUES:
        v = vals[c]
        ok = ~np.isnan(v)
        last_ok = ok[last] if n_samples else np.zeros(len(n), bool)
        weight = sums(np.where(ok, w, 0.0)) - np.where(has & last_ok, cut, 0.0)
        value = sums(np.where(ok, w * v, 0.0)) - np.where(has & last_ok, np.nan_to_num(v[last] if n_samples else 0.0) * cut, 0.0)
        good = has & (weight > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            result[out] = pa.array(np.where(good, value / np.where(good, weight, 1.0), 0.0), mask=~good)
        if c == "power_w":
            result["energy_j"] = pa.array(np.where(good, value, 0.0), mask=~good)
    table = runs
    if len(pairs):  # the GPU the means come from, where the run did not name one
        taken = pa.array(np.where(found & ~r_has_gpu, k, -1))
        use = pc.greater_equal(taken, 0)
        at = pc.if_else(use, taken, 0)
        for col, values in (("gpu_id", gpu_vals.take(pa.array(pair_gpu)) if len(gpu_vals) else None),
                            ("gpu_uuid", pair_uuid)):
            if values is None:
                continue
            i = table.column_names.index(col)
            table = table.set_column(i, col, pc.if_else(use, values.take(at).cast(pa.string()),
                                                        table.column(col).cast(pa.string())))
    for name in ("samples", "covered_s", *[o for _, o in _MEAN_VALUES], "energy_j"):
        table = table.append_column(name, result[name])
    return conform(table, TASK_GPU_MEANS)


# ----------------------------------------------------------------------------------------------
# Sample generator
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TerapixelSample:
    """What :func:`write_terapixel_sample` wrote, with the counts the parsers must find."""

    gpu_csv: Path
    checkpoints_csv: Path
    task_xy_csv: Path
    start_utc: dt.datetime
    end_utc: dt.datetime
    hosts: tuple[str, ...]
    gpu_uuids: dict[str, str]  # host -> GPU UUID
    jobs: tuple[str, ...]
    gpu_rows: int
    checkpoint_rows: int  # data lines, duplicates included
    duplicate_rows: int
    tasks: int  # distinct (jobId, taskId) executed
    task_runs: int  # START/STOP pairs = rows of task_runs
    reexecuted_tasks: int
    reexecuted_task: tuple[str, str] | None  # (jobId, taskId)


def _uuid4(rng: random.Random) -> str:
    return str(uuidlib.UUID(int=rng.getrandbits(128), version=4))


def _iso_ms(ms: np.ndarray) -> pa.Array:
    """``2018-11-08T07:41:55.921Z`` for milliseconds since the epoch (Arrow's cast prints 3 digits)."""
    text = pc.replace_substring(pa.array(ms, pa.timestamp("ms")).cast(pa.string()), " ", "T")
    return pc.binary_join_element_wise(text, pa.scalar("Z"), "")


def _write_csv(path: Path, header: Sequence[str], columns: dict[str, pa.Array]) -> None:
    with path.open("wb") as fh:
        fh.write((",".join(header) + "\n").encode())
        if len(next(iter(columns.values()))):
            pacsv.write_csv(
                pa.table({k: v.cast(pa.string()) for k, v in columns.items()}), fh,
                pacsv.WriteOptions(include_header=False, quoting_style="none"),
            )


def write_terapixel_sample(
    out_dir: str | Path,
    start_utc: dt.datetime,
    hosts: int = 4,
    hours: float = 2,
    seed: int = 0,
    *,
    duplicates: int = 3,
) -> TerapixelSample:
    """Write a small deterministic Terapixel-style run to ``out_dir``: ``gpu.csv``,
    ``application-checkpoints.csv`` and ``task-x-y.csv`` in the dataset's exact format, and return
    what was written with the counts the parsers must find (:class:`TerapixelSample`).

    ``hosts`` hosts with one GPU each render tiles back to back during ``[start_utc, start_utc +
    hours)``: three jobs in order, ``1024-lvl4-<uuid>`` (1 tile), ``1024-lvl8-<uuid>`` (16x16) and
    ``1024-lvl12-<uuid>`` (256x256); a host stops when its next task would not end in time or every
    tile is rendered. Each task is TotalRender around Render (15-40 s), Saving Config, Tiling and
    Uploading. GPU samples every ~2 s per host (+-20 ms jitter): busy during Render, light load in the
    rest of TotalRender, idle otherwise. Timestamps have milliseconds (``start_utc`` is truncated to
    the millisecond). The second task dispatched is executed once more after half of the run (or
    when the tiles run out, if earlier): one re-executed task, 5 runs with ``run_index`` 1. The
    checkpoint file is in time order with ``duplicates`` of its rows repeated at random places
    (exact duplicates). Same arguments, same bytes."""
    start = _utc_param(start_utc, "start_utc")
    if start is None:
        raise ValueError("start_utc is required")
    start = start.replace(microsecond=start.microsecond // 1000 * 1000)  # the files have milliseconds
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    start_ms = (start - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(milliseconds=1)
    end_ms = start_ms + int(round(hours * 3_600_000))
    hostnames = tuple(f"{rng.getrandbits(128):032x}{i:06d}" for i in range(hosts))
    serials = [f"32{rng.randrange(10**10):010d}" for _ in range(hosts)]
    uuids = [f"GPU-{_uuid4(rng)}" for _ in range(hosts)]
    jobs = tuple(f"1024-lvl{level}-{_uuid4(rng)}" for level in (4, 8, 12))

    def tiles() -> Iterator[tuple[str, int, int, int]]:
        yield jobs[0], 4, 0, 0
        for level, job, side in ((8, jobs[1], 16), (12, jobs[2], 256)):
            for y in range(side):
                for x in range(side):
                    yield job, level, x, y

    tile_iter = tiles()
    events: list[tuple[int, int, int, str, str, str, str]] = []  # ms, seq, host, name, type, job, task
    xy_rows: list[tuple[str, str, int, int, int]] = []
    render: list[list[tuple[int, int]]] = [[] for _ in range(hosts)]
    total: list[list[tuple[int, int]]] = [[] for _ in range(hosts)]
    free = [(start_ms + rng.randrange(0, 5000), h) for h in range(hosts)]
    executions = 0
    reexecuted: tuple[str, str] | None = None
    second: tuple[str, str] | None = None
    heapq.heapify(free)
    while free:
        t, h = heapq.heappop(free)
        steps = [("Render", rng.randrange(15_000, 40_000))]
        steps += [("Saving Config", rng.randrange(2, 20)), ("Tiling", rng.randrange(500, 1500)),
                  ("Uploading", rng.randrange(1000, 4000))]
        length = 50 + sum(d + 5 for _, d in steps) + 10
        if t + length >= end_ms:
            continue  # this host is done
        tile = None
        if reexecuted is None and second is not None and t >= (start_ms + end_ms) // 2:
            job, task = reexecuted = second
        elif (tile := next(tile_iter, None)) is None:
            if reexecuted is not None or second is None:
                continue  # every tile rendered: the run is over for this host
            job, task = reexecuted = second
        if tile is not None:
            job, level, x, y = tile
            task = _uuid4(rng)
            xy_rows.append((task, job, x, y, level))
            if len(xy_rows) == 2:
                second = (job, task)
        executions += 1
        seq = len(events)
        ev = [(t, "TotalRender", "START")]
        c = t + rng.randrange(20, 50)
        for name, d in steps:
            ev.append((c, name, "START"))
            ev.append((c + d, name, "STOP"))
            if name == "Render":
                render[h].append((c, c + d))
            c += d + rng.randrange(1, 5)
        ev.append((c + rng.randrange(1, 10), "TotalRender", "STOP"))
        total[h].append((t, ev[-1][0]))
        events += [(ms, seq + i, h, n, typ, job, task) for i, (ms, n, typ) in enumerate(ev)]
        heapq.heappush(free, (ev[-1][0] + rng.randrange(500, 3000), h))

    # checkpoints: time order, then `duplicates` rows repeated at random places
    events.sort()
    rows = [(ms, hostnames[h], n, typ, job, task) for ms, _, h, n, typ, job, task in events]
    for i in rng.sample(range(len(rows)), min(duplicates, len(rows))):
        rows.insert(rng.randrange(len(rows) + 1), rows[i])
    cols = list(zip(*rows, strict=True)) if rows else [[]] * 6
    _write_csv(out / "application-checkpoints.csv", CHECKPOINT_COLUMNS, {
        "timestamp": _iso_ms(np.array(cols[0], dtype=np.int64)),
        **{name: pa.array(cols[i], pa.string()) for i, name in enumerate(CHECKPOINT_COLUMNS[1:], 1)},
    })
    xy_cols = list(zip(*xy_rows, strict=True)) if xy_rows else [[]] * 5
    _write_csv(out / "task-x-y.csv", TASK_XY_COLUMNS,
               {name: pa.array(xy_cols[i]) for i, name in enumerate(TASK_XY_COLUMNS)})

    # gpu.csv: every ~2 s per host, busy during Render, light load in the rest of TotalRender
    parts = []
    for h in range(hosts):
        first = start_ms + int(nrng.integers(0, 2000))
        ts = np.arange(first, end_ms - 20, 2000, dtype=np.int64)
        ts = ts + nrng.integers(-20, 21, size=len(ts))
        ts = ts[ts >= start_ms]

        def inside(intervals: list[tuple[int, int]], ts: np.ndarray = ts) -> np.ndarray:
            if not intervals:
                return np.zeros(len(ts), dtype=bool)
            a = np.array(intervals, dtype=np.int64)
            i = np.searchsorted(a[:, 0], ts, side="right") - 1
            return (i >= 0) & (ts < a[np.maximum(i, 0), 1])

        busy, load = inside(render[h]), inside(total[h])
        n = len(ts)
        util = np.where(busy, nrng.integers(80, 101, n), np.where(load, nrng.integers(0, 16, n), 0))
        mem = np.where(busy, nrng.integers(25, 61, n), np.where(load, nrng.integers(0, 11, n), 0))
        power = np.where(busy, nrng.uniform(140, 250, n), np.where(load, nrng.uniform(40, 80, n),
                                                                   nrng.uniform(22, 30, n))).round(2)
        temp = np.where(busy, nrng.integers(45, 61, n), nrng.integers(33, 45, n))
        parts.append((ts, np.full(n, h), power, temp, util, mem))
    ts, hidx, power, temp, util, mem = (np.concatenate(x) for x in zip(*parts, strict=True))
    order = np.argsort(ts, kind="stable")
    hidx = hidx[order]
    _write_csv(out / "gpu.csv", GPU_CSV_COLUMNS, {
        "timestamp": _iso_ms(ts[order]),
        "hostname": pa.array(np.array(hostnames, dtype=object)[hidx], pa.string()),
        "gpuSerial": pa.array(np.array(serials, dtype=object)[hidx], pa.string()),
        "gpuUUID": pa.array(np.array(uuids, dtype=object)[hidx], pa.string()),
        "powerDrawWatt": pa.array(power[order]),
        "gpuTempC": pa.array(temp[order]),
        "gpuUtilPerc": pa.array(util[order]),
        "gpuMemUtilPerc": pa.array(mem[order]),
    })
    return TerapixelSample(
        gpu_csv=out / "gpu.csv",
        checkpoints_csv=out / "application-checkpoints.csv",
        task_xy_csv=out / "task-x-y.csv",
        start_utc=start,
        end_utc=start + dt.timedelta(milliseconds=end_ms - start_ms),
        hosts=hostnames,
        gpu_uuids=dict(zip(hostnames, uuids, strict=True)),
        jobs=jobs,
        gpu_rows=len(ts),
        checkpoint_rows=len(rows),
        duplicate_rows=min(duplicates, len(events)),
        tasks=len(xy_rows),
        task_runs=executions * len(EVENT_NAMES),
        reexecuted_tasks=int(reexecuted is not None),
        reexecuted_task=reexecuted,
    )
