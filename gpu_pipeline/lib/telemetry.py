"""GPU telemetry parsers: nvidia-smi CSV logs and dcgm-exporter scrapes into one ``gpu_samples`` table
(DESIGN.md 4.3).

Every parser returns a :class:`ParseResult`: the rows conformed to :data:`GPU_SAMPLES`, the input lines
set aside with their line number and reason (``quarantine``), and counters of everything skipped.
Nothing is dropped silently and a bad line never produces a partial row.

GPU identity
    ``gpu_uuid`` is the full UUID ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``; ``gpu_id`` is the
    HTCondor short id (``GPU-`` + first 8 hex digits, lower case, see :func:`short_gpu_id`) so that
    samples join slot snapshots. A MIG instance keeps its ``MIG-...`` UUID as ``gpu_id`` when the
    source names it. dcgm-exporter does not: its MIG series carry the parent ``UUID`` plus
    ``GPU_I_ID``, so the instance's ``gpu_id`` is ``f"{parent_uuid}/{GPU_I_ID}"`` (unique per host and
    stable while the MIG layout is; it does not join HTCondor's ``MIG-...`` ids) and ``gpu_uuid`` is
    the parent's UUID. A label value that is a ``MIG-<uuid>`` is used when present.

nvidia-smi (``--query-gpu=... --format=csv[,noheader][,nounits]``)
    Read with the ``csv`` module (``", "`` separator, one record per physical line, no quoting).
    Header cells carry units (``memory.used [MiB]``), values may too (``38 %``); ``[N/A]``,
    ``[Not Supported]``, ``[Unknown Error]``, any other bracketed note (deprecated fields) and
    ``N/A`` read as null. Header lines repeated mid-file (``nvidia-smi -l`` restarted) are skipped
    and counted; a header naming other fields replaces the current one (counted). Lines with the wrong
    number of fields, an unreadable timestamp or number, or no GPU UUID are quarantined whole.
    Timestamps ``2026/07/14 08:12:38.696`` are naive local time in ``source_tz``. An ambiguous local
    time (the repeated hour when daylight saving time ends) is resolved with ``fold=0``, i.e. as the
    *first* occurrence (daylight time); pass ``ambiguous="order"`` to take a backward jump of the log
    inside that hour as the start of the second occurrence (``fold=1``), the way
    ``condor_archive`` resolves it. A non-existent local time (the skipped hour in spring) is mapped
    with ``fold=0`` as well (the offset before the change, PEP 495). Both are counted
    (``ambiguous_local_times``, ``nonexistent_local_times``).

dcgm-exporter (Prometheus text exposition)
    Parsed with ``prometheus_client.parser`` and pivoted to one row per (timestamp, host, GPU, MIG
    instance). Series of one GPU that differ only in other labels (``pod``, ``container``, driver
    version ...) fill the same row. A second sample of one metric for one row is a duplicate when its
    labels are identical (kept first, ``duplicate_samples``) and a conflict otherwise (kept first,
    ``conflicting_samples``). DCGM "blank" sentinels (values >= 0x7ffffff0 for 32-bit fields, the
    int64 / fp64 blanks for the energy counter) and NaN read as null. MIG instances export no
    GPU_UTIL, so ``util_pct`` stays null there; the DCP ratios (0-1) are stored as percent.
    Invalid lines are quarantined (line number, the parser's reason, the text) and everything else
    is kept: one bad line costs only its own samples, never the file. ``prometheus_client`` spends
    ~70 us per sample line, almost all in label parsing, so by default it parses each distinct series
    (``name{labels}``) once and sample lines reuse it (see :func:`parse_dcgm_text`); with
    ``whole_file=True`` the parser reads the whole file in one pass, and when it raises (it does not
    say where) the file is validated line by line, the lines it rejects are quarantined and the rest
    is parsed again. Both give the same rows and counters (tested).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.parser import text_fd_to_metric_families, text_string_to_metric_families

from gpu_pipeline.lib.schemas import GPU_SAMPLES, QUARANTINE, TS, conform

UTC = dt.UTC


_FLOAT_COLUMNS = tuple(f.name for f in GPU_SAMPLES.schema if f.type == pa.float64())

# ----------------------------------------------------------------------------------------------
# Common pieces
# ----------------------------------------------------------------------------------------------

_UUID_RE = re.compile(r"^GPU-([0-9a-fA-F]{8})(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_SHORT_RE = re.compile(r"^(?:GPUs_)?GPU[-_]([0-9a-fA-F]{8})$")
_MIG_UUID_RE = re.compile(r"^MIG-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


def short_gpu_id(uuid: str) -> str:
    """The HTCondor short id of a GPU: ``GPU-`` + the first 8 hex digits of its UUID, lower case.

    Accepts the full UUID ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (any case) or an id that is
    already short (``GPU-xxxxxxxx`` / ``GPUs_GPU_xxxxxxxx``). MIG ids (``MIG-...``, ``MIG-GPU-...``) and
    DCGM MIG keys (``<uuid>/<GPU_I_ID>``) are returned unchanged. Anything else raises ``ValueError``.
    """
    s = (uuid or "").strip()
    if s.upper().startswith("MIG-") or "/" in s:
        return s
    m = _UUID_RE.match(s) or _SHORT_RE.match(s)
    if not m:
        raise ValueError(f"not a GPU UUID: {uuid!r}")
    return "GPU-" + m.group(1).lower()


def _canonical_uuid(uuid: str) -> str:
    """A full ``GPU-`` UUID in lower case (nvidia-smi and DCGM print it so); anything else unchanged."""
    s = uuid.strip()
    return "GPU-" + s[4:].lower() if _UUID_RE.match(s) else s


class QuarantinedLine(NamedTuple):
    """An input line set aside: ``(line_number, reason, raw_line)`` plus the file it came from."""

    line_number: int
    reason: str
    raw_line: str
    source_file: str | None = None


def quarantine_lines_table(lines: Sequence[QuarantinedLine], source_table: str) -> pa.Table:
    """Quarantined text lines as rows of the project's quarantine table schema."""
    arrays = {
        "source_table": pa.array([source_table] * len(lines), type=pa.string()),
        "reason": pa.array([q.reason for q in lines], type=pa.string()),
        "source_file": pa.array([q.source_file for q in lines], type=pa.string()),
        "source_row": pa.array([q.line_number for q in lines], type=pa.int64()),
        "row_json": pa.array([json.dumps({"line": q.raw_line}) for q in lines], type=pa.string()),
    }
    return conform(pa.table(arrays), QUARANTINE)


@dataclass
class ParseResult:
    """Rows conformed to :data:`GPU_SAMPLES`, quarantined lines and counters."""

    table: pa.Table
    quarantine: list[QuarantinedLine] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)
    files: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.table.num_rows

    def quarantine_table(self) -> pa.Table:
        """The quarantined lines as rows of the project's quarantine table schema."""
        return quarantine_lines_table(self.quarantine, GPU_SAMPLES.path)


_FILE_SUFFIXES = (".csv", ".prom", ".txt", ".log")


def _source_lines(path_or_text: str | Path) -> tuple[Callable[[], Iterator[str]], str | None]:
    """A factory of fresh line iterators over the input, and the path when the input is a file.

    A ``Path`` is a file. A ``str`` is text when it contains a newline; otherwise it is a file when
    one exists under that name or the name ends in a telemetry file suffix (a missing file then raises
    ``FileNotFoundError`` instead of being parsed as one line of text), else one line of text."""
    if isinstance(path_or_text, str) and "\n" not in path_or_text:
        if Path(path_or_text).is_file():
            path_or_text = Path(path_or_text)
        elif path_or_text.endswith(_FILE_SUFFIXES):
            raise FileNotFoundError(f"no such telemetry file: {path_or_text}")
    if isinstance(path_or_text, Path):
        path = Path(path_or_text)

        def from_file() -> Iterator[str]:
            with path.open(encoding="utf-8", errors="replace", newline="") as fh:
                yield from fh

        return from_file, str(path)
    if not isinstance(path_or_text, str):
        raise TypeError(f"expected a path or text, got {type(path_or_text).__name__}")
    text = path_or_text
    return (lambda: iter(io.StringIO(text, newline=""))), None


def _finish(columns: dict[str, list], quarantine: list[QuarantinedLine], counters: Counter[str],
            files: list[str]) -> ParseResult:
    arrays = {}
    for f in GPU_SAMPLES.schema:
        values = columns.get(f.name)
        if values is not None:
            if f.name == "sample_utc":  # int64 microseconds since the epoch
                arrays[f.name] = pa.array(values, type=pa.int64()).cast(f.type)
            else:
                arrays[f.name] = pa.array(values, type=f.type)
    table = conform(pa.table(arrays), GPU_SAMPLES) if arrays else GPU_SAMPLES.empty()
    table = _sorted(table)
    counters["rows_out"] = table.num_rows
    counters["quarantined_lines"] = len(quarantine)
    return ParseResult(table=table, quarantine=quarantine, counters=counters, files=files)


def _sorted(table: pa.Table) -> pa.Table:
    if table.num_rows < 2:
        return table
    return table.sort_by([("sample_utc", "ascending"), ("host", "ascending"), ("gpu_id", "ascending")])


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_US = dt.timedelta(microseconds=1)


def _to_us(value: dt.datetime) -> int:
    """Microseconds since the epoch of an aware datetime (sample times travel as int64 until the
    table is built, which is cheaper than converting Python datetimes)."""
    return (value - _EPOCH) // _US


def _utc(value: dt.datetime, what: str) -> dt.datetime:
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware (UTC), got naive {value!r}")
    return value.astimezone(UTC)


# ----------------------------------------------------------------------------------------------
# nvidia-smi --query-gpu CSV
# ----------------------------------------------------------------------------------------------

#: The query of DESIGN.md 4.3, assumed for header-less input when the caller passes no ``fields``.
DEFAULT_QUERY_FIELDS: tuple[str, ...] = (
    "timestamp", "index", "name", "uuid", "serial", "utilization.gpu", "utilization.memory",
    "memory.total", "memory.used", "power.draw", "power.limit", "temperature.gpu",
)

# nvidia-smi field (lower case, unit removed) -> (output column, priority; lower wins when a query
# names several fields that feed one column).
_NVSMI_FIELDS: dict[str, tuple[str, int]] = {
    "timestamp": ("timestamp", 0),
    "index": ("gpu_index", 0),
    "name": ("device_name", 0),
    "gpu_name": ("device_name", 1),
    "uuid": ("gpu_uuid", 0),
    "gpu_uuid": ("gpu_uuid", 1),
    "utilization.gpu": ("util_pct", 0),
    "utilization.memory": ("mem_util_pct", 0),
    "memory.total": ("mem_total_mib", 0),
    "memory.used": ("mem_used_mib", 0),
    "power.draw": ("power_w", 0),
    "power.draw.average": ("power_w", 1),
    "power.draw.instant": ("power_w", 2),
    "power.limit": ("power_limit_w", 0),
    "enforced.power.limit": ("power_limit_w", 1),
    "temperature.gpu": ("temp_c", 0),
    "clocks.sm": ("sm_clock_mhz", 0),
    "clocks.current.sm": ("sm_clock_mhz", 0),
    "hostname": ("hostname", 0),
}
_NVSMI_STRING_COLUMNS = {"device_name", "gpu_uuid", "hostname"}
_NVSMI_OUT = ("sample_utc", "source", "host", "gpu_uuid", "gpu_id", "gpu_index", "device_name",
              *_FLOAT_COLUMNS, "source_file")
# Fields that make a line a header when every cell looks like a field name.
_HEADER_MARKERS = set(_NVSMI_FIELDS) | {"serial", "pci.bus_id", "driver_version", "count", "pstate"}
_FIELD_CELL_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)\s*(?:\[([^\]]*)\])?$")
_NA_VALUES = {"", "n/a", "na", "not supported", "unknown error", "not available"}
_TS_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S")


class _BadValue(ValueError):
    pass


def _header_cells(cells: Sequence[str]) -> list[tuple[str, str | None]] | None:
    """``[(field, unit)]`` when the line is an nvidia-smi header, else ``None``."""
    parsed = []
    for c in cells:
        m = _FIELD_CELL_RE.match(c)
        if not m:
            return None
        parsed.append((m.group(1), m.group(2)))
    if not any(name.lower() in _HEADER_MARKERS for name, _ in parsed):
        return None
    return parsed


def _is_na(value: str) -> bool:
    v = value.strip()
    return (v.startswith("[") and v.endswith("]")) or v.lower() in _NA_VALUES


def _number(value: str, unit: str | None, fieldname: str) -> float | None:
    if _is_na(value):
        return None
    parts = value.split()
    if len(parts) > 2:
        raise _BadValue(f"{fieldname}: not a number: {value!r}")
    try:
        number = float(parts[0])
    except ValueError:
        raise _BadValue(f"{fieldname}: not a number: {value!r}") from None
    if len(parts) == 2 and unit is not None and parts[1] != unit:
        raise _BadValue(f"{fieldname}: unit {parts[1]!r} where the header says [{unit}]")
    if math.isnan(number):
        return None
    return number


@dataclass
class _Layout:
    """Where each output column is found in a row of the current header."""

    n_fields: int
    names: tuple[str, ...]
    # column -> [(cell index, unit)] in priority order
    cells: dict[str, list[tuple[int, str | None]]]


def _layout(fields: Sequence[tuple[str, str | None]]) -> _Layout:
    found: dict[str, list[tuple[int, int, str | None]]] = {}
    for i, (name, unit) in enumerate(fields):
        target = _NVSMI_FIELDS.get(name.lower())
        if target is not None:
            found.setdefault(target[0], []).append((target[1], i, unit))
    cells = {col: [(i, unit) for _, i, unit in sorted(v)] for col, v in found.items()}
    return _Layout(len(fields), tuple(name.lower() for name, _ in fields), cells)


class _Localizer:
    """Naive local time in ``tz`` -> aware UTC, with the DST policy of the module docstring."""

    def __init__(self, tz: str, ambiguous: str, counters: Counter[str]):
        if ambiguous not in ("earlier", "order"):
            raise ValueError(f"ambiguous must be 'earlier' or 'order', not {ambiguous!r}")
        self.zone = ZoneInfo(tz)
        self.order = ambiguous == "order"
        self.counters = counters
        self.max_seen: dt.datetime | None = None
        self.second_pass = False
        self._cache: dict[tuple[dt.datetime, int], int] = {}
        self._kind: dict[dt.datetime, str] = {}

    def _classify(self, naive: dt.datetime) -> str:
        kind = self._kind.get(naive)
        if kind is None:
            off0 = naive.replace(tzinfo=self.zone, fold=0).utcoffset()
            off1 = naive.replace(tzinfo=self.zone, fold=1).utcoffset()
            kind = "ok" if off0 == off1 else ("ambiguous" if off0 > off1 else "nonexistent")
            self._kind[naive] = kind
        return kind

    def __call__(self, naive: dt.datetime) -> int:
        """Microseconds since the epoch (UTC)."""
        kind = self._classify(naive)
        fold = 0
        if kind == "ambiguous":
            self.counters["ambiguous_local_times"] += 1
            if self.order:
                if not self.second_pass and self.max_seen is not None and \
                        naive < self.max_seen - dt.timedelta(minutes=1):
                    self.second_pass = True
                fold = 1 if self.second_pass else 0
        else:
            self.second_pass = False
            if kind == "nonexistent":
                self.counters["nonexistent_local_times"] += 1
        if self.max_seen is None or naive > self.max_seen:
            self.max_seen = naive
        key = (naive, fold)
        out = self._cache.get(key)
        if out is None:
            out = _to_us(naive.replace(tzinfo=self.zone, fold=fold))
            self._cache[key] = out
        return out


def _parse_local_ts(text: str) -> dt.datetime:
    t = text.strip()
    for fmt in _TS_FORMATS:
        try:
            return dt.datetime.strptime(t, fmt)
        except ValueError:
            continue
    raise _BadValue(f"timestamp: unreadable {text!r}")


def parse_nvidia_smi_csv(
    path_or_text: str | Path,
    source_tz: str,
    host: str | None = None,
    source_file: str | None = None,
    *,
    fields: Sequence[str] | None = None,
    default_time_utc: dt.datetime | None = None,
    ambiguous: str = "earlier",
) -> ParseResult:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`` output.

    ``fields``: the ``--query-gpu`` list, needed for ``noheader`` output (a header in the input
    wins); without either, :data:`DEFAULT_QUERY_FIELDS` is assumed (counted as
    ``assumed_default_fields``). ``host`` wins over a ``hostname`` field. ``default_time_utc`` is the
    sample time when the query has no ``timestamp`` field (required then). ``source_file`` defaults to
    the path. See the module docstring for nulls, quarantine and the DST policy."""
    lines, path = _source_lines(path_or_text)
    src = source_file if source_file is not None else path
    counters: Counter[str] = Counter()
    localize = _Localizer(source_tz, ambiguous, counters)
    default_ts = _to_us(_utc(default_time_utc, "default_time_utc")) if default_time_utc is not None else None
    quarantine: list[QuarantinedLine] = []
    out: dict[str, list] = {n: [] for n in _NVSMI_OUT}
    layout: _Layout | None = None

    def set_layout(new: _Layout) -> _Layout:
        if "timestamp" not in new.cells and default_ts is None:
            raise ValueError(
                f"{src or 'nvidia-smi text'}: the query has no timestamp field; pass default_time_utc"
            )
        if "gpu_uuid" not in new.cells:
            counters["layouts_without_uuid"] += 1
        return new

    for ln, raw in enumerate(lines(), 1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            counters["blank_lines"] += 1
            continue
        try:
            cells = next(csv.reader([line], delimiter=",", quoting=csv.QUOTE_NONE, skipinitialspace=True))
        except (csv.Error, StopIteration) as exc:
            quarantine.append(QuarantinedLine(ln, f"unreadable CSV line: {exc}", line, src))
            continue
        cells = [c.strip() for c in cells]
        header = _header_cells(cells)
        if header is not None:
            new = _layout(header)
            if layout is None:
                layout = set_layout(new)
            elif new.names == layout.names:
                counters["repeated_headers"] += 1
            else:
                counters["header_changes"] += 1
                layout = set_layout(new)
            continue
        if layout is None:
            query = list(fields) if fields else list(DEFAULT_QUERY_FIELDS)
            if not fields:
                counters["assumed_default_fields"] = 1
            parsed = []
            for q in query:
                m = _FIELD_CELL_RE.match(q.strip())
                parsed.append((m.group(1), m.group(2)) if m else (q.strip(), None))
            layout = set_layout(_layout(parsed))
        counters["data_lines"] += 1
        if len(cells) != layout.n_fields:
            quarantine.append(QuarantinedLine(
                ln, f"expected {layout.n_fields} fields, got {len(cells)}", line, src))
            continue
        try:
            row = _nvsmi_row(cells, layout)
            if "timestamp" in layout.cells:
                ts_text = row.pop("timestamp")
                if ts_text is None:
                    raise _BadValue("timestamp: missing")
                sample_utc = localize(_parse_local_ts(ts_text))
            else:
                sample_utc = default_ts
            uuid = row.get("gpu_uuid")
            if not uuid:
                raise _BadValue("no GPU UUID (uuid field absent or null)")
            gpu_id = short_gpu_id(uuid)
            row["gpu_uuid"] = _canonical_uuid(uuid)
        except _BadValue as exc:
            quarantine.append(QuarantinedLine(ln, str(exc), line, src))
            continue
        except ValueError as exc:  # short_gpu_id
            quarantine.append(QuarantinedLine(ln, f"uuid: {exc}", line, src))
            continue
        row_host = host if host is not None else row.pop("hostname", None)
        row.pop("hostname", None)
        out["sample_utc"].append(sample_utc)
        out["source"].append("nvidia-smi")
        out["host"].append(row_host)
        out["gpu_id"].append(gpu_id)
        out["source_file"].append(src)
        for col in ("gpu_uuid", "gpu_index", "device_name", *_FLOAT_COLUMNS):
            out[col].append(row.get(col))
    return _finish(out, quarantine, counters, [src] if src else [])


def _nvsmi_row(cells: Sequence[str], layout: _Layout) -> dict[str, object]:
    row: dict[str, object] = {}
    for col, sources in layout.cells.items():
        value: object = None
        for i, unit in sources:
            cell = cells[i]
            name = layout.names[i]
            if col == "timestamp" or col in _NVSMI_STRING_COLUMNS:
                value = None if _is_na(cell) else cell
            elif col == "gpu_index":
                if _is_na(cell):
                    value = None
                else:
                    try:
                        value = int(cell)
                    except ValueError:
                        raise _BadValue(f"{name}: not an integer: {cell!r}") from None
            else:
                value = _number(cell, unit, name)
            if value is not None:
                break
        row[col] = value
    return row


# ----------------------------------------------------------------------------------------------
# dcgm-exporter Prometheus text
# ----------------------------------------------------------------------------------------------

# metric -> (column, scale)
_DCGM_METRICS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),
    "DCGM_FI_DEV_FB_FREE": ("_fb_free", 1.0),
    "DCGM_FI_DEV_FB_RESERVED": ("_fb_reserved", 1.0),
    "DCGM_FI_DEV_FB_TOTAL": ("_fb_total", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_w", 1.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("_enforced_limit", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active_pct", 100.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active_pct", 100.0),
}
# DCGM blank sentinels: DCGM_INT32_BLANK (0x7ffffff0) and above for 32-bit fields; DCGM_FP64_BLANK
# (2**47) and DCGM_INT64_BLANK (0x7ffffffffffffff0) for the 64-bit energy counter.
_DCGM_INT32_BLANK = 0x7FFFFFF0
_DCGM_FP64_BLANK = 140737488355328.0


def _dcgm_blank(metric: str, value: float) -> bool:
    limit = _DCGM_FP64_BLANK if metric == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" else _DCGM_INT32_BLANK
    return value >= limit


class _ExpositionError(Exception):
    def __init__(self, exc: BaseException):
        super().__init__(str(exc) or type(exc).__name__)
        self.original = exc


def _parser_reason(exc: BaseException) -> str:
    detail = str(exc)
    return f"invalid exposition line: {type(exc).__name__}" + (f": {detail}" if detail else "")


def _line_error(line: str) -> str | None:
    """Why the exposition parser rejects this one line on its own (``None``: it accepts it)."""
    try:
        for _ in text_string_to_metric_families(line + "\n"):
            pass
    except Exception as exc:  # the parser raises bare ValueError, IndexError, ...
        return _parser_reason(exc)
    return None


def _prom_number(token: str) -> float:
    """A sample value or timestamp read by the exposition parser's own rule: int, else float, and no
    underscores (which Python's int()/float() would accept)."""
    if "_" in token:
        raise ValueError(f"invalid value {token!r}")
    try:
        return int(token)
    except ValueError:
        return float(token)


class _DcgmPivot:
    """Accumulates samples into one row per (timestamp, host, UUID, GPU_I_ID)."""

    def __init__(self, host: str | None, default_us: int | None, src: str | None):
        self.host = host
        self.default_us = default_us
        self.src = src
        self.rows: dict[tuple, dict] = {}
        self.counters: Counter[str] = Counter()
        self.quarantine: list[QuarantinedLine] = []

    # -- whole-file path: the parser reads the file in one pass ---------------------------------
    def add_families(self, lines: Iterable[str]) -> None:
        families = text_fd_to_metric_families(lines)  # type: ignore[arg-type]
        while True:
            try:
                family = next(families)
            except StopIteration:
                return
            except Exception as exc:  # anything the parser raises
                raise _ExpositionError(exc) from exc
            for sample in family.samples:
                # Counters declared without _total get it appended by the parser: map the family name.
                name = family.name if family.name in _DCGM_METRICS else sample.name
                self.sample(name, sample.labels, None, sample.value, sample.timestamp)

    # -- series-cache path: the parser reads each distinct series once ---------------------------
    def add_lines(self, lines: Iterable[str]) -> None:
        series_cache: dict[str, tuple[str, dict, int] | str | None] = {}
        comment_cache: dict[str, str | None] = {}
        for ln, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line:
                continue
            if line.startswith("#"):
                if line not in comment_cache:
                    comment_cache[line] = _line_error(line)
                reason = comment_cache[line]
                if reason is not None:
                    self.quarantine.append(QuarantinedLine(ln, reason, raw.rstrip("\r\n"), self.src))
                continue
            fast = self._split(line, series_cache)
            if isinstance(fast, tuple):
                name, labels, sig, value, ts = fast
                self.sample(name, labels, sig, value, ts)
                continue
            if isinstance(fast, str):
                self.quarantine.append(QuarantinedLine(ln, fast, raw.rstrip("\r\n"), self.src))
                continue
            # Any other shape: the parser reads the line as it is.
            try:
                families = list(text_string_to_metric_families(line + "\n"))
            except Exception as exc:  # anything the parser raises
                self.quarantine.append(QuarantinedLine(ln, _parser_reason(exc), raw.rstrip("\r\n"), self.src))
                continue
            for family in families:
                for sample in family.samples:
                    self.sample(sample.name, sample.labels, None, sample.value, sample.timestamp)

    @staticmethod
    def _split(line: str, cache: dict) -> tuple | str | None:
        """``(name, labels, signature, value, timestamp)`` for a line ``<series> <value> [<ts>]`` whose
        series the parser accepts on its own; a reason string when it rejects the series; ``None``
        for any other shape (the caller then hands the whole line to the parser)."""
        brace = line.rfind("}")
        if brace >= 0:
            series, rest = line[: brace + 1], line[brace + 1:].split()
        else:
            parts = line.split()
            series, rest = parts[0], parts[1:]
        if len(rest) not in (1, 2):
            return None
        try:
            value = _prom_number(rest[0])
            ts = _prom_number(rest[1]) / 1000 if len(rest) == 2 else None
        except ValueError:
            return None
        entry = cache.get(series, False)
        if entry is False:
            try:
                families = list(text_string_to_metric_families(series + " 0\n"))
                samples = [s for f in families for s in f.samples]
                # The series must be exactly name + labels (nothing left over for value/timestamp).
                if len(samples) == 1 and samples[0].value == 0 and samples[0].timestamp is None:
                    s0 = samples[0]
                    entry = (s0.name, s0.labels, hash(frozenset(s0.labels.items())))
                else:
                    entry = None
            except Exception as exc:  # anything the parser raises
                entry = _parser_reason(exc)
            cache[series] = entry
        if entry is None or isinstance(entry, str):
            return entry
        return (*entry, value, ts)

    # -- pivot -----------------------------------------------------------------------------------
    def sample(self, metric: str, labels: dict[str, str], sig: int | None, value: float,
               timestamp: float | None) -> None:
        c = self.counters
        c["samples"] += 1
        target = _DCGM_METRICS.get(metric)
        if target is None:
            c["unmapped_samples"] += 1
            return
        uuid = labels.get("UUID") or labels.get("uuid")
        if not uuid:
            c["samples_without_uuid"] += 1
            return
        if timestamp is not None:
            ts_us = round(float(timestamp) * 1_000_000)
        elif self.default_us is not None:
            ts_us = self.default_us
            c["samples_default_time"] += 1
        else:
            raise ValueError(
                f"{self.src or 'DCGM text'}: sample {metric} has no timestamp; pass default_time_utc"
            )
        gi = labels.get("GPU_I_ID") or None
        host = self.host if self.host is not None else (labels.get("Hostname") or labels.get("hostname"))
        key = (ts_us, host, uuid, gi)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = {"_labels": labels, "_seen": {}}
        col, scale = target
        if sig is None:
            sig = hash(frozenset(labels.items()))
        seen = row["_seen"].get(col)
        if seen is not None:
            c["duplicate_samples" if seen == sig else "conflicting_samples"] += 1
            return
        row["_seen"][col] = sig
        v = float(value)
        if math.isnan(v):
            c["nan_values"] += 1
            row[col] = None
        elif _dcgm_blank(metric, v):
            c["blank_values"] += 1
            row[col] = None
        else:
            row[col] = v * scale

    def columns(self) -> dict[str, list]:
        out: dict[str, list] = {n: [] for n in GPU_SAMPLES.schema.names}
        for (ts_us, host, uuid, gi), row in self.rows.items():
            labels = row["_labels"]
            if gi is None:
                try:
                    gpu_id = short_gpu_id(uuid)
                except ValueError:
                    self.counters["rows_bad_uuid"] += 1
                    continue
                gpu_uuid, mig_id = _canonical_uuid(uuid), None
            else:
                mig_uuid = next((v for v in labels.values() if _MIG_UUID_RE.match(v)), None)
                gpu_uuid = mig_uuid or _canonical_uuid(uuid)
                gpu_id = mig_uuid or f"{gpu_uuid}/{gi}"
                mig_id = int(gi) if gi.isdigit() else None
            out["sample_utc"].append(ts_us)
            out["source"].append("dcgm")
            out["host"].append(host)
            out["gpu_uuid"].append(gpu_uuid)
            out["gpu_id"].append(gpu_id)
            gpu = labels.get("gpu")
            out["gpu_index"].append(int(gpu) if gpu is not None and gpu.isdigit() else None)
            out["mig_profile"].append((labels.get("GPU_I_PROFILE") or None) if gi is not None else None)
            out["mig_instance_id"].append(mig_id)
            out["device_name"].append(labels.get("modelName") or None)
            if row.get("power_limit_w") is None:
                row["power_limit_w"] = row.get("_enforced_limit")
            total = row.get("_fb_total")
            if total is None and row.get("mem_used_mib") is not None and row.get("_fb_free") is not None:
                total = row["mem_used_mib"] + row["_fb_free"] + (row.get("_fb_reserved") or 0.0)
            row["mem_total_mib"] = total
            for col in _FLOAT_COLUMNS:
                out[col].append(row.get(col))
            out["source_file"].append(self.src)
        return out


def parse_dcgm_text(
    path_or_text: str | Path,
    host: str | None = None,
    default_time_utc: dt.datetime | None = None,
    source_file: str | None = None,
    *,
    whole_file: bool = False,
) -> ParseResult:
    """Parse a dcgm-exporter scrape (Prometheus text exposition; one scrape, or many with ms
    timestamps) into one row per (timestamp, host, GPU, MIG instance).

    ``host`` wins over the ``Hostname`` / ``hostname`` label (under Kubernetes that label is the
    exporter pod's name). Samples without their own timestamp get ``default_time_utc`` (e.g. the
    scrape file's mtime); without it such a sample raises ``ValueError``. Only GPUs with at least one
    mapped metric get a row.

    Parsing: ``prometheus_client``'s exposition parser costs ~70 us per sample line, almost all of it
    in label parsing (a day of 30-s scrapes of 8 GPUs is 300k lines). By default the parser therefore
    reads each distinct series (``name{labels}``) once and every sample line ``<series> <value>
    [<timestamp>]`` reuses it, its value and timestamp read with the parser's own number rule; a line
    of any other shape and every ``#`` line go through the parser as they are, and a line it rejects
    is quarantined. ``whole_file=True`` instead feeds the whole file to the parser in one pass; when it
    raises, the lines it rejects on their own are located, quarantined and the rest parsed again.
    Both give the same rows (tested)."""
    lines, path = _source_lines(path_or_text)
    src = source_file if source_file is not None else path
    default_us = _to_us(_utc(default_time_utc, "default_time_utc")) if default_time_utc is not None else None
    pivot = _DcgmPivot(host, default_us, src)
    if not whole_file:
        pivot.add_lines(lines())
        return _finish(pivot.columns(), pivot.quarantine, pivot.counters, [src] if src else [])
    quarantine: list[QuarantinedLine] = []
    try:
        pivot.add_families(lines())
    except _ExpositionError as first:
        bad: set[int] = set()
        for ln, raw in enumerate(lines(), 1):
            text = raw.rstrip("\r\n")
            if text.strip():
                reason = _line_error(text.strip())
                if reason is not None:
                    bad.add(ln)
                    quarantine.append(QuarantinedLine(ln, reason, text, src))
        if not bad:
            raise ValueError(
                f"{src or 'DCGM text'}: exposition parser failed ({first}) and no single invalid line "
                "could be located"
            ) from first.original
        pivot = _DcgmPivot(host, default_us, src)
        try:
            pivot.add_families(raw for ln, raw in enumerate(lines(), 1) if ln not in bad)
        except _ExpositionError as second:
            numbers = ", ".join(str(n) for n in sorted(bad))
            raise ValueError(
                f"{src or 'DCGM text'}: still unparseable after setting aside line(s) {numbers}: {second}"
            ) from second.original
    return _finish(pivot.columns(), quarantine, pivot.counters, [src] if src else [])


# ----------------------------------------------------------------------------------------------
# Directory of telemetry logs (the simulator's layout)
# ----------------------------------------------------------------------------------------------

_FILE_DAY_RE = re.compile(r"(\d{4}-\d{2}-\d{2})")


def _file_day(name: str) -> dt.date | None:
    m = _FILE_DAY_RE.search(name)
    if not m:
        return None
    try:
        return dt.date.fromisoformat(m.group(1))
    except ValueError:
        return None


def read_telemetry_dir(
    root: str | Path,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    source_tz: str,
    *,
    ambiguous: str = "earlier",
    margin_days: int = 1,
) -> ParseResult:
    """Samples in [start_utc, end_utc) from ``root/nvidia-smi/HOST/*.csv`` and
    ``root/dcgm/HOST/*.prom`` (host = directory name), sorted by (sample_utc, host, gpu_id).

    Files are parsed one at a time and only when the local date in their name (``...-YYYY-MM-DD``)
    lies within ``margin_days`` of the window's local dates (names without a date are always read:
    the margin covers loggers that roll files at UTC midnight or late). DCGM
    samples without a timestamp get the file's mtime. ``source_file`` is the path relative to
    ``root``. A missing ``root`` or source folder yields an empty table."""
    root = Path(root)
    start_utc, end_utc = _utc(start_utc, "start_utc"), _utc(end_utc, "end_utc")
    zone = ZoneInfo(source_tz)
    if end_utc <= start_utc:
        raise ValueError(f"empty window: end_utc {end_utc} <= start_utc {start_utc}")
    lo = start_utc.astimezone(zone).date() - dt.timedelta(days=margin_days)
    hi = (end_utc - _US).astimezone(zone).date() + dt.timedelta(days=margin_days)
    lo_s, hi_s = pa.scalar(start_utc, type=TS), pa.scalar(end_utc, type=TS)

    tables: list[pa.Table] = []
    quarantine: list[QuarantinedLine] = []
    counters: Counter[str] = Counter()
    files: list[str] = []
    for kind, pattern in (("nvidia-smi", "*.csv"), ("dcgm", "*.prom")):
        base = root / kind
        if not base.is_dir():
            continue
        for host_dir in sorted(p for p in base.iterdir() if p.is_dir()):
            for path in sorted(host_dir.glob(pattern)):
                day = _file_day(path.name)
                if day is not None and not lo <= day <= hi:
                    counters["files_outside_window"] += 1
                    continue
                rel = path.relative_to(root).as_posix()
                if kind == "nvidia-smi":
                    part = parse_nvidia_smi_csv(path, source_tz, host=host_dir.name, source_file=rel,
                                                ambiguous=ambiguous)
                else:
                    mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
                    part = parse_dcgm_text(path, host=host_dir.name, default_time_utc=mtime, source_file=rel)
                files.append(rel)
                counters.update({f"{kind}:{k}": v for k, v in part.counters.items()})
                quarantine.extend(part.quarantine)
                ts = part.table.column("sample_utc")
                mask = pc.and_(pc.greater_equal(ts, lo_s), pc.less(ts, hi_s))
                kept = part.table.filter(mask)
                counters["rows_outside_window"] += part.table.num_rows - kept.num_rows
                if kept.num_rows:
                    tables.append(kept)
                del part
    table = pa.concat_tables(tables) if tables else GPU_SAMPLES.empty()
    table = _sorted(table)
    counters["rows_out"] = table.num_rows
    counters["quarantined_lines"] = len(quarantine)
    counters["files_read"] = len(files)
    return ParseResult(table=table, quarantine=quarantine, counters=counters, files=files)
