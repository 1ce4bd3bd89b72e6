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

Compressed files
    A file compressed by its log rotation (``nvidia-smi-2025-08-04.csv.gz``, ``dcgm-....prom.zst``:
    gzip or zstd, by the name's last suffix) is read through pyarrow's codec as it is read, on every
    path below, with the same rows, counters and quarantined lines as its text; a truncated or
    corrupt one raises ``ValueError`` naming the file and codec.

Fast path
    The line-by-line parsers above define the semantics; they cost ~1 s per host-day file. Both
    parsers first try a vectorized fast path for the common well-formed file, which gives exactly
    their result (the same table, rows in the same order, the same counters, nothing quarantined),
    ~20 times faster for nvidia-smi and ~7 times for DCGM (2-core machine, 30-s samples of 8 GPUs).
    nvidia-smi lines are split by ``pyarrow.csv``; a DCGM file is read in 4 MB pieces of whole lines,
    each split into ``<series> <value> <ms timestamp>`` with numpy on its bytes (with Arrow kernels
    where its lines have another spacing), and pivoted with numpy. Numbers and timestamps are read
    by Arrow kernels (13-digit DCGM times eight bytes at a time) in the plain forms that both paths read identically (a decimal,
    ``2026/07/14 08:12:38.696``, DCGM millisecond integers); what has few distinct values (UUIDs,
    names, indices, DCGM series and ``#`` lines) goes through the line parsers' own helpers once per
    distinct value, and local times are mapped with ``zoneinfo`` once per distinct second. The fast
    path gives up on the whole input, which the line-by-line parser then reads, on anything it does
    not reproduce exactly: a blank, unreadable or quarantined line, a repeated or changed nvidia-smi
    header, a value in another form, an ambiguous or non-existent local time (the DST policy is the
    line parser's), a DCGM sample without timestamp, a duplicate or conflicting DCGM sample.
    ``fast=False`` forces the line-by-line parser; :attr:`ParseResult.fast_parsed` tells which path
    read an input. The directory reader also uses the fast path's timestamps to skip margin files
    without a sample in the window (:func:`read_telemetry_dir`).
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import datetime as dt
import io
import json
import math
import os
import re
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from prometheus_client.parser import text_fd_to_metric_families, text_string_to_metric_families

from gpu_pipeline.lib.exposition import line_error, parser_reason, split_sample_line
from gpu_pipeline.lib.schemas import GPU_SAMPLES, QUARANTINE, TS, conform, sorted_rows
from gpu_pipeline.lib.timeutil import epoch_us

UTC = dt.UTC


_FLOAT_COLUMNS = tuple(f.name for f in GPU_SAMPLES.schema if f.type == pa.float64())
_MAX_INT32 = 2**31 - 1  #: the largest GPU index / MIG instance id (an int32 column)

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
    """An input line set aside: ``(line_number, reason, raw_line)`` plus the file it came from and
    the time of its record, where known."""

    line_number: int | None
    reason: str
    raw_line: str | None
    source_file: str | None = None
    record_utc: dt.datetime | None = None


def quarantine_lines_table(lines: Sequence[QuarantinedLine], source_table: str) -> pa.Table:
    """Quarantined text lines as rows of the project's quarantine table schema."""
    arrays = {
        "source_table": pa.array([source_table] * len(lines), type=pa.string()),
        "reason": pa.array([q.reason for q in lines], type=pa.string()),
        "source_file": pa.array([q.source_file for q in lines], type=pa.string()),
        "source_row": pa.array([q.line_number for q in lines], type=pa.int64()),
        "record_utc": pa.array([q.record_utc for q in lines], type=QUARANTINE.schema.field("record_utc").type),
        "row_json": pa.array([json.dumps({"line": q.raw_line}) for q in lines], type=pa.string()),
    }
    return conform(pa.table(arrays), QUARANTINE)


@dataclass
class ParseResult:
    """Rows conformed to :data:`GPU_SAMPLES`, quarantined lines and counters.

    ``fast_parsed`` is how many of the inputs the vectorized fast path read (the others went through
    the line-by-line parser). It is not a counter, so a result compares equal whichever path made it.
    """

    table: pa.Table
    quarantine: list[QuarantinedLine] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)
    files: list[str] = field(default_factory=list)
    fast_parsed: int = field(default=0, compare=False)

    @property
    def rows(self) -> int:
        return self.table.num_rows

    def quarantine_table(self, source_table: str = "raw/gpu_telemetry") -> pa.Table:
        """The quarantined lines as rows of the project's quarantine table schema; ``source_table``:
        the table the source files' rows were read for."""
        return quarantine_lines_table(self.quarantine, source_table)


_FILE_SUFFIXES = (".csv", ".prom", ".txt", ".log", ".gz", ".zst")

# A telemetry file compressed by its log rotation (logrotate's ``compress``: gzip; or zstd), named
# with the codec's suffix after its own (``nvidia-smi-2025-08-04.csv.gz``): read through pyarrow's
# codec as it is read, never decompressed to disk. Exporter text and nvidia-smi logs compress 20-30
# times, so a day read from a slow disk costs a twentieth of the reading (and the codec's CPU).
_COMPRESSION = {".gz": "gzip", ".zst": "zstd"}
#: How many times its size a compressed file's text is taken to be, to plan memory before reading
#: (the spill's slabs, the threads' shares): an over-estimate only makes more, smaller slabs.
COMPRESSED_TEXT_FACTOR = 32


def compression_of(path: Path) -> str | None:
    """The codec of a compressed telemetry file (``"gzip"``, ``"zstd"``), None for plain text."""
    return _COMPRESSION.get(path.suffix.lower())


def text_bytes_estimate(path: Path, size: int) -> int:
    """The text size of a file of ``size`` bytes: that size, or for a compressed file
    :data:`COMPRESSED_TEXT_FACTOR` times it."""
    return size * COMPRESSED_TEXT_FACTOR if compression_of(path) else size


class _Decompressing(io.RawIOBase):
    """A compressed file's text as a readable binary stream, a read error naming the file and codec
    (a truncated or corrupt file fails its partition with that message)."""

    def __init__(self, path: Path, codec: str):
        self.path, self.codec = path, codec
        self._raw = path.open("rb")
        try:
            self._stream = pa.CompressedInputStream(self._raw, codec)
        except BaseException:
            self._raw.close()
            raise

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - any writable buffer
        try:
            return self._stream.readinto(buffer)
        except (OSError, pa.ArrowException) as exc:
            raise ValueError(f"{self.path}: cannot read the {self.codec}-compressed text: {exc}") from exc

    def fileno(self) -> int:
        return self._raw.fileno()  # the compressed file's, for _read_once

    def close(self) -> None:
        if not self.closed:
            try:
                self._stream.close()
            finally:
                self._raw.close()
        super().close()


def _open_binary(path: Path) -> BinaryIO:
    """The file's text as a binary stream: the file itself, or its decompressed text (buffered)."""
    codec = compression_of(path)
    if codec is None:
        return path.open("rb")
    return io.BufferedReader(_Decompressing(path, codec), buffer_size=1 << 20)


def _read_file_bytes(path: Path) -> bytes:
    with _open_binary(path) as fh:
        return fh.read()


def _resolve_source(path_or_text: str | Path) -> Path | str:
    """The input as a file ``Path`` or as text.

    A ``Path`` is a file. A ``str`` is text when it contains a newline; otherwise it is a file when
    one exists under that name or the name ends in a telemetry file suffix (a missing file then raises
    ``FileNotFoundError`` instead of being parsed as one line of text), else one line of text."""
    if isinstance(path_or_text, str) and "\n" not in path_or_text:
        if Path(path_or_text).is_file():
            return Path(path_or_text)
        if path_or_text.endswith(_FILE_SUFFIXES):
            raise FileNotFoundError(f"no such telemetry file: {path_or_text}")
    if not isinstance(path_or_text, (str, Path)):
        raise TypeError(f"expected a path or text, got {type(path_or_text).__name__}")
    return path_or_text


class _Unterminated(str):
    """A file's last line without its line end: the file was cut while it was written (a logger
    killed mid-line, a copy taken while the line was being written). Its value is not read: a
    temperature of ``65`` cut after its ``6`` reads as a valid 6."""


UNTERMINATED_REASON = "the file ends mid-line (cut while it was written): the line is not read"


def _source_lines(path_or_text: str | Path) -> tuple[Callable[[], Iterator[str]], str | None]:
    """A factory of fresh line iterators over the input, and the path when the input is a file
    (see :func:`_resolve_source`). A file's last line without a line end comes as
    :class:`_Unterminated` (text given in memory is taken as whole)."""
    source = _resolve_source(path_or_text)
    if isinstance(source, Path):

        def from_file() -> Iterator[str]:
            # utf-8-sig: a byte-order mark (a log written by a Windows tool) is not part of the header
            with io.TextIOWrapper(_open_binary(source), encoding="utf-8-sig", errors="replace", newline="") as fh:
                for line in fh:
                    yield line if line.endswith(("\n", "\r")) else _Unterminated(line)

        return from_file, str(source)
    text = source.removeprefix("\ufeff")
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
    return _result(table, quarantine, counters, files)


def _result(table: pa.Table, quarantine: list[QuarantinedLine], counters: Counter[str], files: list[str],
            fast_parsed: int = 0, sort: bool = True) -> ParseResult:
    """The parse result of a conformed table: rows sorted (unless ``sort`` is false: for a caller that
    sorts the rows of several results together), the row and quarantine counters set."""
    table = _sorted(table) if sort else table
    counters["rows_out"] = table.num_rows
    counters["quarantined_lines"] = len(quarantine)
    return ParseResult(table=table, quarantine=quarantine, counters=counters, files=files,
                       fast_parsed=fast_parsed)


def _sorted(table: pa.Table) -> pa.Table:
    return sorted_rows(table, ("sample_utc", "host", "gpu_id"))


_US = dt.timedelta(microseconds=1)


def _utc(value: dt.datetime, what: str) -> dt.datetime:
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware (UTC), got naive {value!r}")
    return value.astimezone(UTC)


# ----------------------------------------------------------------------------------------------
# Fast path (vectorized)
# ----------------------------------------------------------------------------------------------


class _NotFast(Exception):
    """The fast path met input it does not reproduce exactly: the line-by-line parser reads it."""


class _Staged(Protocol):
    """An input read by a fast path as far as its sample times; :meth:`finish` reads the rest."""

    sample_us: np.ndarray  # int64 microseconds since the epoch (UTC), one per sample line

    def finish(self, sort: bool = True) -> ParseResult: ...


def _try_fast(read: Callable[[], _Staged]) -> _Staged | None:
    """``read()``, or None when the fast path gives up on the input."""
    try:
        return read()
    except (_NotFast, pa.ArrowInvalid):  # ArrowInvalid: what Arrow rejects (a 30 February ...)
        return None


def _finish_or_slow(staged: _Staged | None, slow: Callable[[], ParseResult], sort: bool = True) -> ParseResult:
    """The fast path's result; the line-by-line parser's (always sorted) when the fast path gave up on
    the input. ``sort=False``: the fast path's rows in the order it made them (see :func:`_result`)."""
    if staged is not None:
        try:
            return staged.finish(sort)
        except (_NotFast, pa.ArrowInvalid):
            pass
    return slow()


def _read_once(fh: BinaryIO) -> None:
    """Tell the kernel that the open file's cached pages will not be read again. A telemetry file
    is read once a run; left in the page cache, a range run's text (19 GB a week at 1,000 GPUs)
    fills it and every later read pays for reclaiming it (a 1,000-GPU week's raw step from a cold
    cache: 92-103 s with the pages kept, 72-74 s with them dropped). Pages a logger has not yet
    written out are not dropped."""
    drop_cached_pages(fh.fileno())


def drop_cached_pages(fd: int) -> None:
    """Ask the kernel to drop the open file's cached pages (POSIX_FADV_DONTNEED on its whole length;
    no privileges needed; a no-op where the call is missing or refused)."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _source_bytes(path_or_text: str | Path) -> tuple[bytes, str | None]:
    """The input as UTF-8 bytes, and the path when it is a file (see :func:`_resolve_source`)."""
    source = _resolve_source(path_or_text)
    if isinstance(source, Path):
        with _open_binary(source) as fh:
            data = fh.read()
            _read_once(fh)
        return data, str(source)
    try:
        return source.encode("utf-8"), None
    except UnicodeEncodeError:  # lone surrogates: only the line parser keeps them as they are
        raise _NotFast from None


# A DCGM text is read in pieces of about this many bytes, each ending at a line end: a piece's split
# lines and tokens are copies of its text, so a whole 40 MB file at once held ~3x its size per thread.
_PIECE_BYTES = 4 << 20


def _source_pieces(path_or_text: str | Path) -> tuple[Iterator[bytes | bytearray | memoryview], str | None]:
    """The input as UTF-8 bytes in pieces of about :data:`_PIECE_BYTES` that each end at a newline
    (the last one where the input ends), and the path when it is a file (see :func:`_resolve_source`).
    A file is read a piece at a time."""
    source = _resolve_source(path_or_text)
    if isinstance(source, Path):
        return _file_pieces(source), str(source)
    return _file_pieces(io.BytesIO(_source_bytes(source)[0])), None


def _file_pieces(source: Path | io.BytesIO) -> Iterator[bytes | bytearray | memoryview]:
    """The text in pieces of about :data:`_PIECE_BYTES` that each end at a newline (the last one
    where the text ends). A plain file is read with ``os.pread`` from where the last piece ended,
    each piece a view of the bytes read: no buffer to zero and no unfinished line to copy, both of
    which held the GIL that the other parsing threads wait for; a compressed file or text in memory
    a piece at a time after the previous piece's unfinished line."""
    if isinstance(source, Path) and compression_of(source) is None and hasattr(os, "pread"):
        yield from _plain_file_pieces(source)
        return
    with _open_binary(source) if isinstance(source, Path) else source as fh:
        rest = b""
        while True:
            piece = bytearray(len(rest) + _PIECE_BYTES)
            piece[:len(rest)] = rest
            got = fh.readinto(memoryview(piece)[len(rest):])
            if not got:
                break
            end = len(rest) + got
            cut = piece.rfind(b"\n", len(rest), end) + 1
            if not cut:
                rest = bytes(piece[:end])
                continue
            rest = bytes(piece[cut:end])
            del piece[cut:]
            yield piece
        if rest:
            yield bytearray(rest)
        if isinstance(source, Path):
            _read_once(fh)


def _plain_file_pieces(path: Path) -> Iterator[bytes | memoryview]:
    with path.open("rb") as fh:
        fd, at, size = fh.fileno(), 0, _PIECE_BYTES
        while data := _pread_full(fd, size, at):
            if len(data) < size:  # the end of the file
                yield data
                break
            cut = data.rfind(b"\n") + 1
            if not cut:  # a line longer than a piece: a longer piece from the same place
                size *= 2
                continue
            yield data if cut == len(data) else memoryview(data)[:cut]
            at += cut
            size = _PIECE_BYTES
        _read_once(fh)


def _holds(piece: bytes | bytearray | memoryview, byte: bytes) -> bool:
    """Whether a piece of :func:`_file_pieces` holds ``byte`` (a view there is of the start of a
    bytes object, searched in place)."""
    if isinstance(piece, memoryview):
        assert isinstance(piece.obj, bytes) and piece.nbytes <= len(piece.obj)
        return piece.obj.find(byte, 0, piece.nbytes) >= 0
    return byte in piece


def _pread_full(fd: int, size: int, at: int) -> bytes:
    """``size`` bytes of the file from offset ``at``, fewer only where the file ends."""
    data = os.pread(fd, size, at)
    while 0 < len(data) < size and (more := os.pread(fd, size - len(data), at + len(data))):
        data += more  # a short read before the end
    return data


def _per_distinct(values: pa.Array | pa.ChunkedArray, fn: Callable[[str], object],
                  type_: pa.DataType) -> pa.Array:
    """``fn`` of every non-null value, called once per distinct value. A ``ValueError`` from ``fn``
    (the line parser quarantines such a value's line) raises ``_NotFast``."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = pc.dictionary_encode(values)
    try:
        mapped = [fn(v) for v in encoded.dictionary.to_pylist()]
    except ValueError as exc:
        raise _NotFast from exc
    return pa.array(mapped, type=type_).take(encoded.indices)


# (zone, naive local second) -> its UTC offset in microseconds, or None where the local time is
# ambiguous or does not exist (the two folds differ). The files of one day share their seconds; a
# day's are about 13 MB. Dropped when a telemetry directory's read ends, and past this many.
_ZONE_OFFSETS: dict[tuple[ZoneInfo, int], int | None] = {}
_ZONE_OFFSETS_MAX = 1 << 17
_ZONE_OFFSETS_LOCK = threading.Lock()
_MISSING = object()


def _fast_utc_us(naive_us: np.ndarray, zone: ZoneInfo) -> np.ndarray:
    """Naive local times (microseconds) in ``zone`` -> UTC microseconds, as :class:`_Localizer` maps
    them, with one ``zoneinfo`` lookup per distinct second (``zoneinfo`` compares whole local seconds
    with the transitions, so the offset cannot change within a second), remembered for the process
    (the day's files share their seconds). Arrow's own time zone conversion is not used: it misses
    transitions past the zone file's last explicit one (2037 in a fat file, far earlier in a slim
    one). An ambiguous or non-existent local time raises ``_NotFast``: the DST policy is the line
    parser's."""
    seconds, inverse = np.unique(naive_us // 1_000_000, return_inverse=True)
    keys = [(zone, second) for second in seconds.tolist()]
    offsets = [_ZONE_OFFSETS.get(key, _MISSING) for key in keys]
    new = [i for i, offset in enumerate(offsets) if offset is _MISSING]
    if new:
        local = seconds[new].astype("datetime64[s]").astype(object)  # naive datetimes (years 1000-9999)
        for i, t in zip(new, local, strict=True):
            offset = zone.utcoffset(t)  # fold=0, as t.replace(tzinfo=zone) reads it
            offsets[i] = offset // _US if offset == zone.utcoffset(t.replace(fold=1)) else None
        with _ZONE_OFFSETS_LOCK:
            if len(_ZONE_OFFSETS) + len(new) > _ZONE_OFFSETS_MAX:
                _ZONE_OFFSETS.clear()
            _ZONE_OFFSETS.update((keys[i], offsets[i]) for i in new)
    if None in offsets:
        raise _NotFast
    return naive_us - np.array(offsets, dtype=np.int64)[inverse]


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


def _check_ambiguous(ambiguous: str) -> None:
    if ambiguous not in ("earlier", "order"):
        raise ValueError(f"ambiguous must be 'earlier' or 'order', not {ambiguous!r}")


class _Localizer:
    """Naive local time in ``tz`` -> aware UTC, with the DST policy of the module docstring."""

    def __init__(self, tz: str, ambiguous: str, counters: Counter[str]):
        _check_ambiguous(ambiguous)
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
            out = epoch_us(naive.replace(tzinfo=self.zone, fold=fold))
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
    fast: bool = True,
) -> ParseResult:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`` output.

    ``fields``: the ``--query-gpu`` list, needed for ``noheader`` output (a header in the input
    wins); without either, :data:`DEFAULT_QUERY_FIELDS` is assumed (counted as
    ``assumed_default_fields``). ``host`` wins over a ``hostname`` field. ``default_time_utc`` is the
    sample time when the query has no ``timestamp`` field (without it, the lines of such a query are set
    aside, :data:`NO_TIME_REASON`, and counted, ``layouts_without_time``). ``source_file`` defaults to
    the path. See the module docstring for nulls, quarantine and the DST policy, and for the fast
    path that reads well-formed input (``fast=False`` forces the line-by-line parser)."""
    counters: Counter[str] = Counter()
    localize = _Localizer(source_tz, ambiguous, counters)  # checks the policy and the zone first
    default_ts = epoch_us(_utc(default_time_utc, "default_time_utc")) if default_time_utc is not None else None
    staged = _try_fast(partial(_NvsmiFast.read, path_or_text, localize.zone, host, source_file, fields)) \
        if fast else None
    return _finish_or_slow(staged, partial(_parse_nvidia_smi_lines, path_or_text, host, source_file, fields,
                                           localize, default_ts))


#: Why a line of an nvidia-smi query without the timestamp field is set aside.
NO_TIME_REASON = "no timestamp field in the query: the line's time is unknown"


def _parse_nvidia_smi_lines(
    path_or_text: str | Path,
    host: str | None,
    source_file: str | None,
    fields: Sequence[str] | None,
    localize: _Localizer,
    default_ts: int | None,
) -> ParseResult:
    """The line-by-line nvidia-smi parser (every input the fast path does not take)."""
    lines, path = _source_lines(path_or_text)
    src = source_file if source_file is not None else path
    counters = localize.counters
    quarantine: list[QuarantinedLine] = []
    out: dict[str, list] = {n: [] for n in _NVSMI_OUT}
    layout: _Layout | None = None

    def set_layout(new: _Layout) -> _Layout:
        if "timestamp" not in new.cells and default_ts is None:
            counters["layouts_without_time"] += 1  # its lines are set aside: their time is unknown
        if "gpu_uuid" not in new.cells:
            counters["layouts_without_uuid"] += 1
        return new

    for ln, raw in enumerate(lines(), 1):
        line = raw.rstrip("\r\n")
        if isinstance(raw, _Unterminated):
            quarantine.append(QuarantinedLine(ln, UNTERMINATED_REASON, line, src))
            continue
        if not line.strip():
            counters["blank_lines"] += 1
            continue
        try:
            cells = _csv_cells(line)
        except (csv.Error, StopIteration) as exc:
            quarantine.append(QuarantinedLine(ln, f"unreadable CSV line: {exc}", line, src))
            continue
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
            if not fields:
                counters["assumed_default_fields"] = 1
            layout = set_layout(_layout(_query_fields(fields)))
        counters["data_lines"] += 1
        if "timestamp" not in layout.cells and default_ts is None:
            # a query without the timestamp field (an inventory query, a layout changed mid-file): the
            # line's time is unknown (a logger's file holds many times; its modification time is only
            # the last line's)
            quarantine.append(QuarantinedLine(ln, NO_TIME_REASON, line, src))
            continue
        if len(cells) != layout.n_fields:
            quarantine.append(QuarantinedLine(
                ln, f"expected {layout.n_fields} fields, got {len(cells)}", line, src))
            continue
        try:
            row, nans = _nvsmi_row(cells, layout)
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
        if nans:
            counters["nan_values"] += nans
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


def query_fields_setting(text: str, name: str) -> tuple[str, ...] | None:
    """The ``--query-gpu`` list of a setting (``name``: its variable, for the message), comma-separated
    as nvidia-smi takes it (``timestamp,uuid,utilization.gpu,power.draw``), or None when empty. The
    list must name a ``timestamp`` and a UUID field (``uuid`` or ``gpu_uuid``: rows are keyed by
    them), each field once; a field this reader does not know is kept (its cells are skipped), so
    the list says where the known ones are."""
    raw = str(text).strip()
    if not raw:
        return None
    fields = tuple(f.strip() for f in raw.split(","))
    bad = [f for f in fields if not f or not _FIELD_CELL_RE.match(f)]
    if bad:
        raise ValueError(f"{name}={raw!r}: not an nvidia-smi --query-gpu field list (bad field {bad[0]!r})")
    names = [_FIELD_CELL_RE.match(f).group(1).lower() for f in fields]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{name}={raw!r}: field {repeated[0]!r} named twice")
    if "timestamp" not in names or not {"uuid", "gpu_uuid"} & set(names):
        raise ValueError(f"{name}={raw!r}: the list must name timestamp and uuid (rows are keyed by them)")
    return fields


def _csv_cells(line: str) -> list[str]:
    """The stripped cells of one line (``csv`` module: ``", "`` separated, no quoting)."""
    cells = next(csv.reader([line], delimiter=",", quoting=csv.QUOTE_NONE, skipinitialspace=True))
    return [c.strip() for c in cells]


def _query_fields(fields: Sequence[str] | None) -> list[tuple[str, str | None]]:
    """``[(field, unit)]`` of a ``--query-gpu`` list (:data:`DEFAULT_QUERY_FIELDS` when none)."""
    parsed = []
    for q in list(fields) if fields else list(DEFAULT_QUERY_FIELDS):
        m = _FIELD_CELL_RE.match(q.strip())
        parsed.append((m.group(1), m.group(2)) if m else (q.strip(), None))
    return parsed


def _nvsmi_row(cells: Sequence[str], layout: _Layout) -> tuple[dict[str, object], int]:
    """The row's values, and how many of them are null because a field read ``nan`` (``nvidia-smi``
    prints ``nan W`` / ``-nan W`` for a power it could not read); a value another field of the
    column gave (``power.draw.instant`` for ``power.draw``) is no null."""
    row: dict[str, object] = {}
    nans = 0
    for col, sources in layout.cells.items():
        value: object = None
        saw_nan = False
        for i, unit in sources:
            value = _nvsmi_value(col, cells[i], unit, layout.names[i])
            if value is not None:
                break
            saw_nan = saw_nan or cells[i].lstrip("+-")[:3].lower() == "nan"
        row[col] = value
        nans += value is None and saw_nan
    return row, nans


def _nvsmi_value(col: str, cell: str, unit: str | None, name: str) -> object:
    """One stripped cell of field ``name`` read for output column ``col``; raises ``_BadValue``."""
    if col == "timestamp" or col in _NVSMI_STRING_COLUMNS:
        return None if _is_na(cell) else cell
    if col == "gpu_index":
        if _is_na(cell):
            return None
        try:
            number = int(cell)
        except ValueError:
            raise _BadValue(f"{name}: not an integer: {cell!r}") from None
        if not -_MAX_INT32 - 1 <= number <= _MAX_INT32:
            raise _BadValue(f"{name}: out of range: {cell!r}")
        return number
    return _number(cell, unit, name)


# The fast path's cells: a timestamp as ``_parse_local_ts`` reads it (a date Arrow rejects gives up
# the fast path) and plain decimals. Only spaces are trimmed around a cell and the patterns admit
# no other white space, so a cell they match reads the same to the line parser, which strips any.
_FAST_TS_PATTERN = (r"^(?P<ts>[1-9][0-9]{3}/[0-9]{2}/[0-9]{2} (?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                    r"(?:\.[0-9]{1,6})?)$")
# nvidia-smi lines as the line parser splits them: one record per line, ", " separated, no quoting.
_CSV_SPLIT = pacsv.ParseOptions(delimiter=",", quote_char=False, escape_char=False, ignore_empty_lines=False)


def _number_pattern(unit: str | None) -> str:
    """A number cell the fast path reads: a plain decimal, then optionally the unit as a separate
    token, as ``_number`` accepts it: the header's unit, or any (printable ASCII) token when the
    header gives none."""
    if unit is None:
        suffix = "(?: [!-~]+)?"
    elif unit.split() == [unit]:
        suffix = f"(?: {re.escape(unit)})?"
    else:  # a unit no single token equals
        suffix = ""
    return rf"^(?P<number>-?[0-9]+(?:\.[0-9]+)?){suffix}$"


def _fast_cells(raw: pa.ChunkedArray, pattern: str, convert: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """``convert`` of each cell's value (``pattern``'s group), null where the line parser reads null
    (``[N/A]``, ``N/A`` ...); a cell that is neither raises ``_NotFast``. Each distinct cell is read
    once (a column of a day's log repeats most of its values)."""
    encoded = pc.dictionary_encode(raw.combine_chunks())
    text = pc.utf8_trim(encoded.dictionary, " ")
    value = pc.struct_field(pc.extract_regex(text, pattern), [0])  # null: no match
    if value.null_count:
        na = pc.or_(pc.and_(pc.starts_with(text, "["), pc.ends_with(text, "]")),
                    pc.is_in(pc.ascii_lower(text), value_set=pa.array(sorted(_NA_VALUES))))
        if not pc.all(pc.or_(na, pc.is_valid(value))).as_py():
            raise _NotFast
    return convert(value).take(encoded.indices)


def _to_float(numbers: pa.Array) -> pa.Array:
    return pc.cast(numbers, pa.float64())


def _to_naive_time(stamps: pa.Array) -> pa.Array:
    return pc.cast(pc.replace_substring(stamps, "/", "-"), pa.timestamp("us"))


def _blank_line_cr_or_nul(data: bytes) -> bool:
    """Whether ``data`` holds two newlines in a row, a CR or a NUL: one pass in numpy, which lets
    the other parsing threads run, where three searches of the bytes held the GIL (a day's
    nvidia-smi logs at 1,000 GPUs: 0.20 -> 0.06 s)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    at = np.flatnonzero(buf < 14)  # the few control bytes: LF (one a line), CR, NUL, TAB ...
    found = buf[at]
    if (found == 13).any() or (found == 0).any():
        return True
    return bool((np.diff(at[found == 10]) == 1).any())


class _NvsmiFast:
    """nvidia-smi CSV on the fast path. :meth:`read` takes the layout from the first line as the line
    parser does, splits every line with ``pyarrow.csv`` and localizes the timestamps; :meth:`finish`
    reads the other columns. Both raise ``_NotFast`` for anything the line parser might read
    differently (blank, repeated or changed header lines, a line of another field count, a value
    it would quarantine, an ambiguous or non-existent local time)."""

    def __init__(self, cells: pa.Table, layout: _Layout, sample_us: np.ndarray, host: str | None,
                 src: str | None, counters: Counter[str]):
        self.cells = cells
        self.layout = layout
        self.sample_us = sample_us
        self.host = host
        self.src = src
        self.counters = counters

    @classmethod
    def read(cls, path_or_text: str | Path, zone: ZoneInfo, host: str | None, source_file: str | None,
             fields: Sequence[str] | None) -> _NvsmiFast:
        data, path = _source_bytes(path_or_text)
        src = source_file if source_file is not None else path
        # Blank lines (counted), lone CRs (a line end to the line parser), a byte-order mark (skipped
        # by pyarrow.csv, part of the first cell to the line parser), NULs (older csv modules reject
        # them), a file cut mid-line (its last line set aside).
        if (not data or data.startswith((b"\n", codecs.BOM_UTF8)) or _blank_line_cr_or_nul(data)
                or (path is not None and not data.endswith((b"\n", b"\r")))):
            raise _NotFast
        end = data.find(b"\n")
        first = (data if end < 0 else data[:end]).decode("utf-8", errors="replace")
        if not first.strip():
            raise _NotFast
        try:
            header = _header_cells(_csv_cells(first))
        except csv.Error:
            raise _NotFast from None
        counters: Counter[str] = Counter()
        if header is not None:
            layout = _layout(header)
        else:
            layout = _layout(_query_fields(fields))
            if not fields:
                counters["assumed_default_fields"] = 1
        if "timestamp" not in layout.cells or "gpu_uuid" not in layout.cells:
            raise _NotFast
        names = [str(i) for i in range(layout.n_fields)]
        cells = pacsv.read_csv(
            pa.py_buffer(data),
            read_options=pacsv.ReadOptions(skip_rows=int(header is not None), column_names=names,
                                           use_threads=False),
            parse_options=_CSV_SPLIT,
            convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string())),
        ).combine_chunks()
        limit = csv.field_size_limit()  # a longer cell makes the line unreadable to the csv module
        if cells.num_rows == 0 or (
            len(data) > limit and any(pc.max(pc.binary_length(c)).as_py() > limit for c in cells.columns)
        ):
            raise _NotFast
        naive = pc.coalesce(*(_fast_cells(cells.column(i), _FAST_TS_PATTERN, _to_naive_time)
                              for i, _ in layout.cells["timestamp"]))
        if naive.null_count:  # "timestamp: missing"
            raise _NotFast
        sample_us = _fast_utc_us(naive.cast(pa.int64()).to_numpy(), zone)
        return cls(cells, layout, sample_us, host, src, counters)

    def _source(self, col: str, i: int, unit: str | None) -> pa.Array | pa.ChunkedArray:
        """Output column ``col`` as read from field ``i`` alone."""
        raw = self.cells.column(i)
        if col in _FLOAT_COLUMNS:
            return _fast_cells(raw, _number_pattern(unit), _to_float)
        name = self.layout.names[i]
        return _per_distinct(raw, lambda cell: _nvsmi_value(col, cell.strip(), unit, name),
                             pa.int32() if col == "gpu_index" else pa.string())

    def finish(self, sort: bool = True) -> ParseResult:
        return self._finish([(self.host, self.src, self.cells.num_rows)], sort)

    @classmethod
    def finish_many(cls, staged: Sequence[_NvsmiFast], sort: bool = True) -> ParseResult:
        """One result for several files read on the fast path (their rows together, sorted unless
        ``sort`` is false, their counters summed, ``files`` in order): the cells are read once for all
        of them, which is what a small file's parse mostly costs. Raises ``_NotFast`` when the files do
        not share one layout or a host is not given, or when any of them would (then each is finished
        on its own)."""
        first = staged[0]
        if any(s.layout != first.layout or s.host is None for s in staged):
            raise _NotFast
        counters: Counter[str] = Counter()
        for s in staged:
            counters.update(s.counters)
        merged = cls(pa.concat_tables([s.cells for s in staged]), first.layout,
                     np.concatenate([s.sample_us for s in staged]), None, None, counters)
        return merged._finish([(s.host, s.src, s.cells.num_rows) for s in staged], sort)

    def _finish(self, files: list[tuple[str | None, str | None, int]], sort: bool = True) -> ParseResult:
        """The rows of the cells, which are those of ``files``: (host, source file, rows) in order."""
        n = self.cells.num_rows
        read = {col: pc.coalesce(*(self._source(col, i, unit) for i, unit in sources))
                for col, sources in self.layout.cells.items() if col != "timestamp"}
        uuid = read.pop("gpu_uuid")
        if uuid.null_count:  # "no GPU UUID"
            raise _NotFast
        hostname = read.pop("hostname", None)
        counts = [rows for _, _, rows in files]
        if len(files) > 1 or files[0][0] is not None or hostname is None:
            hostname = _per_file([host for host, _, _ in files], counts)
        columns = {
            **read,
            "sample_utc": pa.array(self.sample_us, type=pa.int64()).cast(TS),
            "source": pa.repeat("nvidia-smi", n),
            "host": hostname,
            "gpu_id": _per_distinct(uuid, short_gpu_id, pa.string()),
            "gpu_uuid": _per_distinct(uuid, _canonical_uuid, pa.string()),
            "source_file": _per_file([src for _, src, _ in files], counts),
        }
        self.counters["data_lines"] = n
        return _result(conform(pa.table(columns), GPU_SAMPLES), [], self.counters,
                       [src for _, src, _ in files if src], fast_parsed=len(files), sort=sort)


def _per_file(values: list[str | None], counts: list[int]) -> pa.Array:
    """A string column holding ``values[i]`` ``counts[i]`` times, in order."""
    if len(values) == 1:
        return pa.repeat(pa.scalar(values[0], pa.string()), counts[0])
    return pa.array(values, pa.string()).take(pa.array(np.repeat(np.arange(len(values)), counts)))


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


def _dcgm_blank_limit(metric: str) -> float:
    """The smallest value of ``metric`` that is a DCGM blank sentinel."""
    return _DCGM_FP64_BLANK if metric == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" else _DCGM_INT32_BLANK


def _dcgm_blank(metric: str, value: float) -> bool:
    return value >= _dcgm_blank_limit(metric)


def _dcgm_row_key(labels: dict[str, str], host: str | None) -> tuple[str | None, str | None, str | None]:
    """``(UUID, GPU_I_ID, host)`` of a sample's row (with its timestamp); the ``host`` argument wins
    over the ``Hostname`` / ``hostname`` label."""
    uuid = labels.get("UUID") or labels.get("uuid")
    gi = labels.get("GPU_I_ID") or None
    return uuid, gi, host if host is not None else (labels.get("Hostname") or labels.get("hostname"))


class _DcgmRowIds(NamedTuple):
    """The identity columns of a DCGM row, from its key and the labels of its first sample."""

    gpu_uuid: str
    gpu_id: str
    gpu_index: int | None
    mig_profile: str | None
    mig_instance_id: int | None
    device_name: str | None


def _label_int(text: str | None) -> int | None:
    """A label's value as a 32-bit count (a GPU index, a MIG instance id): ASCII digits within int32,
    else None (``"²"`` is a digit to ``str.isdigit``, not to ``int``)."""
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 10:
        return None
    number = int(text)
    return number if number <= _MAX_INT32 else None


def _dcgm_row_ids(uuid: str, gi: str | None, labels: dict[str, str]) -> _DcgmRowIds | None:
    """The identity of the row of GPU ``uuid`` (``gi`` None) or of its MIG instance ``gi``; None when
    ``uuid`` is not a GPU UUID (the row is dropped, ``rows_bad_uuid``)."""
    if gi is None:
        try:
            gpu_id = short_gpu_id(uuid)
        except ValueError:
            return None
        gpu_uuid, mig_id = _canonical_uuid(uuid), None
    else:
        mig_uuid = next((v for v in labels.values() if _MIG_UUID_RE.match(v)), None)
        gpu_uuid = mig_uuid or _canonical_uuid(uuid)
        gpu_id = mig_uuid or f"{gpu_uuid}/{gi}"
        mig_id = _label_int(gi)
    return _DcgmRowIds(
        gpu_uuid=gpu_uuid,
        gpu_id=gpu_id,
        gpu_index=_label_int(labels.get("gpu")),
        mig_profile=(labels.get("GPU_I_PROFILE") or None) if gi is not None else None,
        mig_instance_id=mig_id,
        device_name=labels.get("modelName") or None,
    )


class _BadSample(ValueError):
    """A sample line the exposition parser reads but no row can hold (a timestamp that is not a
    finite time within int64 microseconds): the line is quarantined."""


#: a DCGM timestamp (seconds) beyond this is no time a row can hold (int64 microseconds)
_MAX_TS_S = float(2**63 // 1_000_000)


class _ExpositionError(Exception):
    def __init__(self, exc: BaseException):
        super().__init__(str(exc) or type(exc).__name__)
        self.original = exc


_LABEL_NAME = r"[a-zA-Z][a-zA-Z0-9_]*|_[a-zA-Z0-9][a-zA-Z0-9_]*"
_PLAIN_VALUE = r'"[^"\\\n{},=]*"'
_PLAIN_SERIES = re.compile(
    rf"([a-zA-Z_:][a-zA-Z0-9_:]*)\{{((?:{_LABEL_NAME})={_PLAIN_VALUE}(?:,(?:{_LABEL_NAME})={_PLAIN_VALUE})*)\}}"
)
_PLAIN_LABEL = re.compile(rf'({_LABEL_NAME})="([^"]*)"')


@lru_cache(maxsize=1 << 16)
def _series_entry(series: str) -> tuple[str, dict[str, str], int] | str | None:
    """``(name, labels, signature)`` when the exposition parser reads ``series`` (``name{labels}``) on
    its own as exactly one series; its reason when it rejects it; None for anything else.

    Remembered for the process (the same series recur in every file of a host, day after day, so a
    range run parses each once); the labels dict is shared and never modified. A series in the plain
    form ``name{label="value",...}`` (no escapes, no quotes, braces, commas or equals signs in values,
    no label twice, no ``__`` label) is read by a regular expression, as the parser reads it (a test
    holds the two together); anything else goes to the parser."""
    m = _PLAIN_SERIES.fullmatch(series)
    if m is not None:
        pairs = _PLAIN_LABEL.findall(m.group(2))
        labels = dict(pairs)
        if len(labels) == len(pairs):
            return (m.group(1), labels, hash(frozenset(labels.items())))
    return _parsed_series_entry(series)


def _parsed_series_entry(series: str) -> tuple[str, dict[str, str], int] | str | None:
    """:func:`_series_entry` by the exposition parser alone."""
    try:
        families = list(text_string_to_metric_families(series + " 0\n"))
    except Exception as exc:  # anything the parser raises
        return parser_reason(exc)
    samples = [s for f in families for s in f.samples]
    # The series must be exactly name + labels (nothing left over for value/timestamp).
    if len(samples) == 1 and samples[0].value == 0 and samples[0].timestamp is None:
        s0 = samples[0]
        return (s0.name, s0.labels, hash(frozenset(s0.labels.items())))
    return None


_EARLIER_SCRAPE = ("earlier scrape without timestamps: scrapes appended to one file carry no time, so only "
                   "the last is read, at the file's modification time (write one scrape a file, or timestamps)")


class _DcgmPivot:
    """Accumulates samples into one row per (timestamp, host, UUID, GPU_I_ID)."""

    def __init__(self, host: str | None, default_us: int | None, src: str | None):
        self.host = host
        self.default_us = default_us
        self.src = src
        self.rows: dict[tuple, dict] = {}
        self.counters: Counter[str] = Counter()
        self.quarantine: list[QuarantinedLine] = []
        # Scrapes appended to one file: a family typed a second time (in one pass, met a second time)
        # starts the next scrape; in a text without TYPE lines (``typed`` false), so does a series
        # without a timestamp met a second time, or a GPU's metric met again after another family
        # (nothing else tells two scrapes apart there). ``line``: the sample line being read (line
        # path only).
        self.scrape = 0
        self.typed = False
        self._families: set[str] = set()
        self._series: set[tuple[str, int]] = set()
        self._targets: dict[tuple, int] = {}  # (metric, UUID, GPU_I_ID, host) -> its family's number
        self._metric: str | None = None
        self._family_no = 0
        self.line: tuple[int, str] | None = None

    def _family(self, name: str) -> None:
        if name in self._families:
            self._next_scrape()
        self._families.add(name)

    def _next_scrape(self) -> None:
        self.scrape += 1
        self._families = set()
        self._series = set()
        self._targets = {}

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
            if family.type != "unknown":  # declared by a TYPE line
                self.typed = True
            self._family(family.name)
            for sample in family.samples:
                # Counters declared without _total get it appended by the parser: map the family name.
                name = family.name if family.name in _DCGM_METRICS else sample.name
                self.sample(name, sample.labels, None, sample.value, sample.timestamp)

    # -- series-cache path: the parser reads each distinct series once ---------------------------
    def add_lines(self, lines: Iterable[str]) -> None:
        series_cache: dict[str, tuple[str, dict, int] | str | None] = {}
        for ln, raw in enumerate(lines, 1):
            line = raw.strip()
            if isinstance(raw, _Unterminated) and line:
                self.quarantine.append(QuarantinedLine(ln, UNTERMINATED_REASON, raw, self.src))
                continue
            if not line:
                continue
            if line.startswith("#"):
                reason = _comment_error(line)
                words = line.split()
                if reason is None and len(words) >= 3 and words[1] == "TYPE":
                    self.typed = True
                    self._family(words[2])
            else:
                self.line = (ln, raw.rstrip("\r\n"))
                reason = self._add_line(line, series_cache)
            if reason is not None:
                self.quarantine.append(QuarantinedLine(ln, reason, raw.rstrip("\r\n"), self.src))
        self.line = None
        self.quarantine.sort(key=lambda q: q.line_number)  # an earlier scrape's lines are set aside late

    def _add_line(self, line: str, series_cache: dict) -> str | None:
        """Read one sample line; the reason to quarantine it, or None."""
        fast = self._split(line, series_cache)
        if isinstance(fast, str):
            return fast
        try:
            if isinstance(fast, tuple):
                self.sample(*fast)
                return None
            # Any other shape: the parser reads the line as it is.
            try:
                families = list(text_string_to_metric_families(line + "\n"))
            except Exception as exc:  # anything the parser raises
                return parser_reason(exc)
            for family in families:
                for sample in family.samples:
                    self.sample(sample.name, sample.labels, None, sample.value, sample.timestamp)
        except _BadSample as bad:
            return str(bad)
        return None

    @staticmethod
    def _split(line: str, cache: dict) -> tuple | str | None:
        """``(name, labels, signature, value, timestamp)`` for a line ``<series> <value> [<ts>]`` whose
        series the parser accepts on its own; a reason string when it rejects the series; ``None``
        for any other shape (the caller then hands the whole line to the parser)."""
        parts = split_sample_line(line)
        if parts is None:
            return None
        series, value, ts = parts
        entry = cache.get(series, False)
        if entry is False:
            entry = cache[series] = _series_entry(series)
        if entry is None or isinstance(entry, str):
            return entry
        return (*entry, value, ts)

    # -- pivot -----------------------------------------------------------------------------------
    def sample(self, metric: str, labels: dict[str, str], sig: int | None, value: float,
               timestamp: float | None) -> None:
        c = self.counters
        c["samples"] += 1
        untyped = timestamp is None and not self.typed  # scrapes appended without timestamps (see __init__)
        if untyped:
            if sig is None:
                sig = hash(frozenset(labels.items()))
            if metric != self._metric:
                self._metric = metric
                self._family_no += 1
            if (metric, sig) in self._series:  # a series met again
                self._next_scrape()
            self._series.add((metric, sig))
        target = _DCGM_METRICS.get(metric)
        if target is None:
            c["unmapped_samples"] += 1
            return
        uuid, gi, host = _dcgm_row_key(labels, self.host)
        if untyped:
            # a GPU's metric met again after another family: the next scrape, even where its labels
            # changed (a pod's labels once the GPU is allocated); two series of one GPU within a
            # family (two pods time-slicing it) stay one scrape
            seen = self._targets.get((metric, uuid, gi, host))
            if seen is not None and seen < self._family_no:
                self._next_scrape()
                self._series.add((metric, sig))
            self._targets[(metric, uuid, gi, host)] = self._family_no
        if not uuid:
            c["samples_without_uuid"] += 1
            return
        if timestamp is not None:
            seconds = float(timestamp)  # the parser's number: an int of any size, or a float
            if not math.isfinite(seconds) or abs(seconds) >= _MAX_TS_S:
                raise _BadSample(f"timestamp out of range: {timestamp!r}")
            ts_us = round(seconds * 1_000_000)
        elif self.default_us is not None:
            ts_us = self.default_us
            c["samples_default_time"] += 1
        else:
            raise ValueError(
                f"{self.src or 'DCGM text'}: sample {metric} has no timestamp; pass default_time_utc"
            )
        key = (ts_us, host, uuid, gi)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = {"_labels": labels, "_seen": {}, "_scrape": {}, "_line": {}}
        col, scale = target
        if sig is None:
            sig = hash(frozenset(labels.items()))
        seen = row["_seen"].get(col)
        if seen is not None and timestamp is None and row["_scrape"][col] != self.scrape:
            # A later scrape of the series, neither with a time of its own (scrapes appended to one
            # file): the last is the one the file's time (its mtime) belongs to; the earlier one is
            # set aside. In one pass the lines are not known: the line path reads the file.
            if self.line is None:
                raise _BadSample(_EARLIER_SCRAPE)
            ln, raw = row["_line"].get(col) or (None, None)
            if ln is None:  # the earlier sample had the file's time as its own timestamp: kept
                c["duplicate_samples" if seen == sig else "conflicting_samples"] += 1
                return
            self.quarantine.append(QuarantinedLine(ln, _EARLIER_SCRAPE, raw, self.src))
            c["earlier_scrape_samples"] += 1
        elif seen is not None:
            if timestamp is None and self.typed and self.line is None:
                # typed text without timestamps in one pass: a cell met again may be a family typed again
                # (a later scrape), which the parser merges into the one before; the line path sees
                # the TYPE lines and decides
                raise _BadSample(_EARLIER_SCRAPE)
            c["duplicate_samples" if seen == sig else "conflicting_samples"] += 1
            return
        row["_seen"][col] = sig
        row["_scrape"][col] = self.scrape
        if timestamp is None and self.line is not None:
            row["_line"][col] = self.line
        try:
            v = float(value)
        except OverflowError:  # an integer of over 308 digits: infinite, as Arrow's cast reads it
            v = math.inf if value > 0 else -math.inf
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
            ids = _dcgm_row_ids(uuid, gi, row["_labels"])
            if ids is None:
                self.counters["rows_bad_uuid"] += 1
                continue
            out["sample_utc"].append(ts_us)
            out["source"].append("dcgm")
            out["host"].append(host)
            for col, value in ids._asdict().items():
                out[col].append(value)
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
    fast: bool = True,
) -> ParseResult:
    """Parse a dcgm-exporter scrape (Prometheus text exposition; one scrape, or many with ms
    timestamps) into one row per (timestamp, host, GPU, MIG instance). Scrapes without timestamps
    appended to one file (a family's ``# TYPE`` again starts the next) cannot be told apart in
    time: the last is read, at ``default_time_utc``, and the earlier ones' lines are quarantined.

    ``host`` wins over the ``Hostname`` / ``hostname`` label (under Kubernetes that label is the
    exporter pod's name). Samples without their own timestamp get ``default_time_utc`` (e.g. the
    scrape file's mtime); without it such a sample raises ``ValueError``. Only GPUs with at least one
    mapped metric get a row.

    Parsing: ``prometheus_client``'s exposition parser costs ~70 us per sample line, almost all of it
    in label parsing (a day of 30-s scrapes of 8 GPUs is 300k lines). By default the parser therefore
    reads each distinct series (``name{labels}``) once and every sample line ``<series> <value>
    [<timestamp>]`` reuses it, its value and timestamp read with the parser's own number rule; a line
    of any other shape and every ``#`` line go through the parser as they are, and a line it rejects
    is quarantined. The vectorized fast path (module docstring) does the same for a well-formed
    file; ``fast=False`` forces the line-by-line reading. ``whole_file=True`` instead feeds the whole
    file to the parser in one pass; when it raises, the lines it rejects on their own are located,
    quarantined and the rest parsed again. All give the same rows (tested)."""
    default_us = epoch_us(_utc(default_time_utc, "default_time_utc")) if default_time_utc is not None else None
    staged = _try_fast(partial(_DcgmFast.read, path_or_text, host, source_file)) \
        if fast and not whole_file else None
    return _finish_or_slow(staged, partial(_parse_dcgm_lines, path_or_text, host, default_us, source_file,
                                           whole_file))


def _parse_dcgm_lines(path_or_text: str | Path, host: str | None, default_us: int | None,
                      source_file: str | None, whole_file: bool) -> ParseResult:
    """The line-by-line (or, with ``whole_file``, one-pass) dcgm-exporter parser."""
    lines, path = _source_lines(path_or_text)
    src = source_file if source_file is not None else path
    pivot = _DcgmPivot(host, default_us, src)
    if not whole_file:
        pivot.add_lines(lines())
        return _finish(pivot.columns(), pivot.quarantine, pivot.counters, [src] if src else [])
    try:
        return _parse_dcgm_families(lines, pivot, host, default_us, src)
    except _BadSample:  # a line no row can hold: the line parser quarantines it by its number
        return _parse_dcgm_lines(path_or_text, host, default_us, source_file, whole_file=False)


def _parse_dcgm_families(text_lines: Callable[[], Iterator[str]], pivot: _DcgmPivot, host: str | None,
                         default_us: int | None, src: str | None) -> ParseResult:
    quarantine: list[QuarantinedLine] = []
    cut: dict[int, QuarantinedLine] = {}  # the cut last line, noted while the text is read

    def lines() -> Iterator[str]:
        """The text without its cut last line (the only line that can be cut: no later line)."""
        for ln, raw in enumerate(text_lines(), 1):
            if isinstance(raw, _Unterminated):
                if raw.strip():
                    cut[ln] = QuarantinedLine(ln, UNTERMINATED_REASON, str(raw), src)
                return
            yield raw

    try:
        pivot.add_families(lines())
    except _ExpositionError as first:
        bad: set[int] = set()
        for ln, raw in enumerate(lines(), 1):
            text = raw.rstrip("\r\n")
            if text.strip():
                reason = line_error(text.strip())
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
    return _finish(pivot.columns(), [*cut.values(), *quarantine], pivot.counters, [src] if src else [])


# The fast path's sample tokens: a value the exposition parser's number rule reads as Python's
# float() does (no sign: int("-0") is 0, float("-0") is -0.0) and a millisecond timestamp of ASCII
# digits whose float division by 1000 is the same in numpy as in Python (< 2**53).
_PROM_VALUE_PATTERN = r"^(?:[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|NaN)$"
_PROM_MS_DIGITS = 15
# Output columns the DCGM metrics fill, and their positions in the fast path's value matrix.
_DCGM_SLOTS = tuple(dict.fromkeys(col for col, _ in _DCGM_METRICS.values()))


def _take_in_place(array: pa.LargeStringArray, rows: np.ndarray) -> pa.LargeStringArray:
    """The entries ``rows`` (increasing) of ``array`` without copying its character data: the even
    entries of a string array over the same data, whose odd entries are nulls spanning the bytes
    between two of them (hash kernels skip nulls; others may still scan them)."""
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset:][:len(array) + 1]
    spans = np.empty(2 * len(rows) + 1, dtype=np.int64)
    spans[0:-1:2] = offsets[rows]
    spans[1::2] = offsets[rows + 1]
    spans[-1] = spans[-2]
    valid = np.full((2 * len(rows) + 7) // 8, 0b01010101, dtype=np.uint8)  # bit i: entry i (LSB first)
    return pa.LargeStringArray.from_buffers(2 * len(rows), pa.py_buffer(spans), array.buffers()[2],
                                            pa.py_buffer(valid), len(rows))


def _read_dcgm_piece(data: bytes | bytearray | memoryview) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]] | None:
    """One piece of a DCGM text (whole lines) split into lines and tokens: per sample line its
    series' code in the piece's distinct series (listed in order of first appearance), its value
    (float64; the token's shape checked, so that it reads as the line parser reads it) and its time
    (UTC microseconds); None when the piece holds no sample line. Raises ``_NotFast`` where the line
    parser might read a line differently. The lines are split on their bytes
    (:func:`_dcgm_tokens_by_bytes`), or with Arrow kernels (:func:`_dcgm_tokens`) where that cannot
    tell the tokens those kernels would give."""
    if _holds(data, b"\r"):  # a line end to the line parser
        raise _NotFast
    text = pa.LargeStringArray.from_buffers(1, pa.py_buffer(np.array([0, len(data)], dtype=np.int64)),
                                            pa.py_buffer(data))
    text.validate(full=True)  # UTF-8 (the line parser would replace a bad byte)
    tokens = _dcgm_tokens_by_bytes(data, text)
    if tokens is None:
        tokens = _dcgm_tokens(text)
    if tokens is _NO_SAMPLE:
        return None
    series, values, stamps = tokens
    if not _prom_values_readable(values):
        raise _NotFast
    if isinstance(stamps, np.ndarray):  # the millisecond times already read (every one 13 digits)
        ms = stamps
    elif (pc.all(pc.ascii_is_decimal(stamps)).as_py()
          and pc.max(pc.binary_length(stamps)).as_py() <= _PROM_MS_DIGITS):
        ms = pc.cast(stamps, pa.int64()).to_numpy()
    else:
        raise _NotFast
    # round(int(ms) / 1000 * 1_000_000) of the line parser, in float64 as there
    sample_us = np.rint(ms / 1000 * 1_000_000).astype(np.int64)
    series = pc.dictionary_encode(series)
    # the even entries' codes read in place (a fill_null of the odd entries' nulls first cost ~1 ms a piece)
    indices = series.indices
    codes = np.frombuffer(indices.buffers()[1], dtype=np.int32,
                          count=indices.offset + len(indices))[indices.offset::2]
    return codes, pc.cast(values, pa.float64()).to_numpy(), sample_us, series.dictionary.to_pylist()


#: :func:`_dcgm_tokens` of a piece without a sample line
_NO_SAMPLE = object()


def _check_comments(comments: Iterable[str]) -> None:
    """``_NotFast`` when a distinct ``#`` line is one the exposition parser rejects."""
    for line in comments:
        if _comment_error(line.strip()) is not None:
            raise _NotFast


def _dcgm_tokens(text: pa.LargeStringArray) -> tuple[pa.Array, pa.Array, pa.Array] | object:
    """A piece's sample lines split with Arrow kernels: their series (the even entries of a string
    array, :func:`_take_in_place`), value and timestamp tokens, or ``_NO_SAMPLE``. Raises
    ``_NotFast`` for a line of another shape or a ``#`` line the line parser would quarantine."""
    lines = pc.split_pattern(text, "\n").flatten()
    comment = pc.starts_with(lines, "#")
    _check_comments(pc.unique(lines.filter(comment)).to_pylist())
    samples = np.flatnonzero(pc.invert(pc.or_(comment, pc.equal(pc.binary_length(lines), 0)))
                             .to_numpy(zero_copy_only=False))
    if len(samples) == 0:
        return _NO_SAMPLE
    # <series> <value> <timestamp>: the last two tokens split off at (ASCII) white space as
    # str.split() splits them; the series' shape is checked by _fast_series_entry.
    parts = pc.ascii_split_whitespace(lines, max_splits=2, reverse=True)
    starts = parts.offsets.to_numpy()
    if (np.diff(starts)[samples] != 3).any():
        raise _NotFast
    first = starts[samples]
    tokens = parts.values
    return _take_in_place(tokens, first), tokens.take(first + 1), tokens.take(first + 2)


def _dcgm_tokens_by_bytes(
    data: bytes | bytearray | memoryview, text: pa.LargeStringArray,
) -> tuple[pa.Array, pa.Array, pa.Array | np.ndarray] | object | None:
    """What :func:`_dcgm_tokens` gives for a piece without tabs, vertical tabs, form feeds or
    carriage returns, found with numpy on its bytes instead of by copying its lines and then their
    tokens (a 1,000-GPU day: ~2.5 GB of text) through Arrow's split kernels; 13-digit timestamp
    tokens come as their numbers. None when a sample line is not ``<series> <value> <timestamp>`` with
    one space before each of the last two tokens, both non-empty, and a series that starts with no
    space: the kernels split such a piece (and may read it all the same).

    Within that shape the two are the same split: the last space of the line ends the value, and
    the one before it ends the series; a space in a label value stays in the series, as the
    kernels' split from the right (at most two splits) leaves it."""
    buf = np.frombuffer(data, dtype=np.uint8)
    if not len(buf):
        return None
    # the line ends, spaces and other white space found in one pass over the bytes
    blank = np.flatnonzero(buf <= ord(" "))
    char = buf[blank]
    if ((char >= ord("\t")) & (char <= ord("\f")) & (char != ord("\n"))).any():  # a tab, \v or \f
        return None
    spaces = blank[char == ord(" ")]
    # the lines as split at "\n": also the text after the last one (empty when the piece ends in one)
    ends = np.append(blank[char == ord("\n")], len(buf))
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lead = buf[np.minimum(starts, len(buf) - 1)]
    filled = ends > starts
    comment = filled & (lead == ord("#"))
    if comment.any():  # (the distinct ones: a scrape repeats its HELP and TYPE lines)
        _check_comments(pc.unique(_spans(text, starts[comment], ends[comment]).drop_null()).to_pylist())
    samples = filled & ~comment
    if not samples.any():
        return _NO_SAMPLE
    lead, start, end = lead[samples], starts[samples], ends[samples]
    before = np.searchsorted(spaces, end)  # spaces before each line's end
    if (before < 2).any():
        return None
    value_at, stamp_at = spaces[before - 2] + 1, spaces[before - 1] + 1  # the tokens' first bytes
    if not ((value_at - 1 > start) & (lead != ord(" ")) & (buf[value_at - 2] != ord(" "))
            & (stamp_at - 1 > value_at) & (end > stamp_at)).all():
        return None
    series = _spans(text, start, value_at - 1)  # (as _take_in_place gives them)
    values = _gathered(buf, value_at, stamp_at - 1)
    if ((end - stamp_at) != _MS_DIGITS).any():  # (a timestamp of another length: read by Arrow's cast)
        return series, values, _gathered(buf, stamp_at, end)
    stamps = _ms_digits(data, stamp_at)
    if stamps is None:  # not all decimal digits
        raise _NotFast
    return series, values, stamps


def _spans(text: pa.LargeStringArray, starts: np.ndarray, ends: np.ndarray) -> pa.LargeStringArray:
    """The byte ranges [starts, ends) of ``text``'s one string (ascending, apart) as the even entries
    of a string array over its bytes, without a copy; its odd entries nulls spanning the bytes
    between them."""
    spans = np.empty(2 * len(starts) + 1, dtype=np.int64)
    spans[0:-1:2] = starts
    spans[1::2] = ends
    spans[-1] = spans[-2]
    valid = np.full((2 * len(starts) + 7) // 8, 0b01010101, dtype=np.uint8)
    return pa.LargeStringArray.from_buffers(2 * len(starts), pa.py_buffer(spans), text.buffers()[2],
                                            pa.py_buffer(valid), len(starts))


#: Eight ASCII digits' bytes within an unsigned 64-bit word (``_ms_digits``)
_DIGIT_HIGH, _DIGIT_ZERO, _DIGIT_CARRY = 0xF0F0F0F0F0F0F0F0, 0x3030303030303030, 0x0606060606060606


def _ms_digits(data: bytes | bytearray | memoryview, at: np.ndarray) -> np.ndarray | None:
    """The 13 bytes of ``data`` from each offset ``at`` read as a decimal number (int64), or None when
    one is not an ASCII digit: each as two overlapping 8-byte words (digits 1-8 and 6-13), each word's
    digits checked and combined at once (SWAR, as simdjson reads eight digits), instead of a byte at
    a time (:func:`_digits`: ~1.8 ms a 4 MB piece of ~19,000 lines, this ~0.9, mostly the two gathers)."""
    words = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))  # a word at every byte
    numbers = []
    for word in (words[at], words[at + 5]):
        # every byte 0x30-0x39: its high nibble 3, also after adding 6 (no byte carries into the next)
        if (((word & _DIGIT_HIGH) != _DIGIT_ZERO).any()
                or (((word + _DIGIT_CARRY) & _DIGIT_HIGH) != _DIGIT_ZERO).any()):
            return None
        word = ((word & 0x0F0F0F0F0F0F0F0F) * 2561) >> 8  # pairs of digits (the first byte: the first)
        word = ((word & 0x00FF00FF00FF00FF) * 6553601) >> 16  # fours
        numbers.append((((word & 0x0000FFFF0000FFFF) * 42949672960001) >> 32).astype(np.int64))  # eight
    return numbers[0] // 1000 * 100_000_000 + numbers[1]


def _gathered(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.LargeStringArray:
    """The byte ranges [starts, ends) of ``buf`` copied into a string array (ranges of a text already
    checked as UTF-8, cut at spaces and line ends)."""
    lengths = ends - starts
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    at = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return pa.LargeStringArray.from_buffers(len(starts), pa.py_buffer(offsets), pa.py_buffer(buf[at]))


def _prom_values_readable(values: pa.Array) -> bool:
    """Whether every value token has the shape :data:`_PROM_VALUE_PATTERN` allows. Plain digits (most
    of a dcgm-exporter's values: utilization, memory, temperature, energy) are that shape: only the
    others go through the regular expression, which costs ten times the digit check."""
    digits = pc.ascii_is_decimal(values)
    if pc.all(digits).as_py():
        return True
    return pc.all(pc.match_substring_regex(values.filter(pc.invert(digits)), _PROM_VALUE_PATTERN)).as_py()


def _fast_series_entry(series: str) -> tuple[str, dict[str, str]]:
    """Name and labels of the series the fast path split off a line, as the line parser reads that
    line. Its shape (ends in ``}``, or one token without braces) makes the line parser cut the line
    at the same place; anything else, and a series the exposition parser does not read on its own
    as one series, raises ``_NotFast``."""
    if series != series.strip() or not (
        series.endswith("}") or ("}" not in series and len(series.split()) == 1)
    ):
        raise _NotFast
    entry = _series_entry(series)
    if not isinstance(entry, tuple):
        raise _NotFast
    return entry[0], entry[1]


@lru_cache(maxsize=1 << 12)
def _comment_error(line: str) -> str | None:
    """:func:`line_error` of a ``#`` line, remembered for the process (every file of an exporter
    repeats the same HELP and TYPE lines)."""
    return line_error(line)


class _DcgmFast:
    """A dcgm-exporter scrape on the fast path. :meth:`read` splits every line (:func:`_read_dcgm_piece`) into
    ``<series> <value> <ms timestamp>`` (from the right: label values may hold spaces), checks each
    distinct ``#`` line and series with the exposition parser as the line parser does, and reads the
    timestamps; :meth:`finish` reads the values and pivots them with numpy. Both raise ``_NotFast`` for
    anything the line parser might read differently: a line of another shape (a sample without
    timestamp included), a line it would quarantine, a duplicate or conflicting sample."""

    def __init__(self, codes: np.ndarray, entries: list[tuple[str, dict[str, str]]],
                 values: np.ndarray, sample_us: np.ndarray, host: str | None, src: str | None):
        self.codes = codes  # per sample line: its series in ``entries``
        self.entries = entries
        self.values = values  # per sample line: its value
        self.sample_us = sample_us
        self.host = host
        self.src = src

    @classmethod
    def read(cls, path_or_text: str | Path, host: str | None, source_file: str | None) -> _DcgmFast:
        """The text read a piece at a time (:func:`_source_pieces`); each piece's series are
        numbered in the order they first appear in the text, as one pass over the whole would."""
        pieces, path = _source_pieces(path_or_text)
        series_index: dict[str, int] = {}
        entries: list[tuple[str, dict[str, str]]] = []
        codes, values, sample_us = [], [], []
        for data in pieces:
            if path is not None and len(data) and bytes(data[-1:]) not in (b"\n", b"\r"):
                raise _NotFast  # a file cut mid-line (only its last piece can be): the line parser sets it aside
            piece = _read_dcgm_piece(data)
            if piece is None:
                continue
            local_codes, piece_values, piece_us, series = piece
            for text in series:
                if text not in series_index:
                    series_index[text] = len(entries)
                    entries.append(_fast_series_entry(text))
            codes.append(np.array([series_index[text] for text in series], dtype=np.int64)[local_codes])
            values.append(piece_values)
            sample_us.append(piece_us)
        if not codes:
            raise _NotFast
        src = source_file if source_file is not None else path
        return cls(np.concatenate(codes), entries, np.concatenate(values), np.concatenate(sample_us), host, src)

    def finish(self, sort: bool = True) -> ParseResult:
        return self.finish_many([self], sort)

    @classmethod
    def finish_many(cls, staged: Sequence[_DcgmFast], sort: bool = True) -> ParseResult:
        """One result for several files read on the fast path: their rows together in file order
        (sorted unless ``sort`` is false), their counters summed, ``files`` in order -- what each
        finished on its own gives, concatenated. A row never spans two files (its GPU is keyed by file
        too). Raises ``_NotFast`` where any of them would."""
        counters: Counter[str] = Counter()
        offsets = np.cumsum([0] + [len(s.entries) for s in staged])
        codes = np.concatenate([s.codes + offsets[f] for f, s in enumerate(staged)])
        entries = [entry for s in staged for entry in s.entries]
        file_of = np.repeat(np.arange(len(staged)), [len(s.entries) for s in staged])  # per series
        sample_us = np.concatenate([s.sample_us for s in staged])
        srcs = [s.src for s in staged]
        # Per distinct series: value-matrix slot (-1: unmapped metric, -2: no UUID), row GPU, scaling.
        n_series = len(entries)
        slot_of = np.full(n_series, -1, dtype=np.int64)
        gpu_of = np.zeros(n_series, dtype=np.int64)
        scale_of = np.ones(n_series)
        blank_of = np.zeros(n_series)
        gpus: dict[tuple, int] = {}
        keys = [_dcgm_row_key(labels, staged[f].host) for f, (_, labels) in zip(file_of.tolist(), entries, strict=True)]
        for k, ((name, _), key) in enumerate(zip(entries, keys, strict=True)):
            target = _DCGM_METRICS.get(name)
            if target is None:
                continue
            if not key[0]:
                slot_of[k] = -2
                continue
            slot_of[k] = _DCGM_SLOTS.index(target[0])
            scale_of[k] = target[1]
            blank_of[k] = _dcgm_blank_limit(name)
            gpu_of[k] = gpus.setdefault((file_of[k], key), len(gpus))
        slot = slot_of[codes]
        kept = np.flatnonzero(slot >= 0)
        # (the samples are the files' in file order: a file's kept samples are those between its bounds)
        if (np.diff(np.searchsorted(kept, np.cumsum([0] + [len(s.codes) for s in staged]))) == 0).any():
            raise _NotFast  # a file without a sample of a metric the table holds
        counters["samples"] = len(codes)
        _count(counters, unmapped_samples=slot == -1, samples_without_uuid=slot == -2)
        value = np.concatenate([s.values for s in staged]) if len(staged) > 1 else staged[0].values
        k_codes, k_slot, k_us = codes, slot, sample_us
        if len(kept) < len(codes):  # (every sample kept, the usual file: nothing to take)
            k_codes, k_slot, k_us, value = codes[kept], slot[kept], sample_us[kept], value[kept]
        nan = np.isnan(value)
        blank = ~nan & (value >= blank_of[k_codes])
        _count(counters, nan_values=nan, blank_values=blank)
        value = np.where(nan | blank, np.nan, value * scale_of[k_codes])
        # Rows: one per (timestamp, GPU), in the order the line parser creates them (by first
        # sample): a dictionary encoding numbers the distinct keys in the order they first appear.
        lo_us = int(k_us.min())
        if (int(k_us.max()) - lo_us + 1) * len(gpus) < 1 << 62:  # (time, GPU) as one number, one encoding
            row_key = (k_us - lo_us) * len(gpus) + gpu_of[k_codes]
        else:
            time_code = pc.dictionary_encode(pa.array(k_us)).indices.to_numpy().astype(np.int64)
            row_key = time_code * len(gpus) + gpu_of[k_codes]
        row = pc.dictionary_encode(pa.array(row_key)).indices.to_numpy()
        n_rows = int(row.max()) + 1
        first = np.empty(n_rows, dtype=np.int64)
        first[row[::-1]] = np.arange(len(row) - 1, -1, -1)  # the last write is the first sample
        if (first[1:] < first[:-1]).any():  # the encoding numbered them otherwise: the line parser's order
            raise _NotFast
        cell = k_slot * n_rows + row  # the value matrix is held a column (slot) at a time
        seen = np.zeros(len(_DCGM_SLOTS) * n_rows, dtype=bool)
        seen[cell] = True
        if np.count_nonzero(seen) < len(cell):
            raise _NotFast  # a duplicate or conflicting sample
        del seen
        matrix = np.full((len(_DCGM_SLOTS), n_rows), np.nan)
        matrix.reshape(-1)[cell] = value
        # Identity columns per distinct first series of a row (its labels name the row's GPU).
        first_series = k_codes[first]
        present = np.zeros(n_series, dtype=bool)
        present[first_series] = True
        row_series = np.flatnonzero(present)  # in code order, as np.unique gives them
        number = np.zeros(n_series, dtype=np.int64)
        number[row_series] = np.arange(len(row_series))
        row_of_series = number[first_series]
        ids = [_dcgm_row_ids(keys[k][0], keys[k][1], entries[k][1]) for k in row_series.tolist()]
        good = np.array([i is not None for i in ids], dtype=bool)[row_of_series]
        _count(counters, rows_bad_uuid=~good)
        rows = slice(None) if good.all() else good  # every GPU readable (the rule): views, no copies
        pick = pa.array(row_of_series[rows])

        def identity(values: list, type_: pa.DataType) -> pa.Array:
            return pa.array(values, type=type_).take(pick)

        n = len(pick)
        slots = {col: matrix[j][rows] for j, col in enumerate(_DCGM_SLOTS)}
        none = np.full(n, np.nan)
        slots["power_limit_w"] = np.where(np.isnan(slots["power_limit_w"]), slots["_enforced_limit"],
                                          slots["power_limit_w"])
        reserved = np.where(np.isnan(slots["_fb_reserved"]), 0.0, slots["_fb_reserved"])
        slots["mem_total_mib"] = np.where(np.isnan(slots["_fb_total"]),
                                          slots["mem_used_mib"] + slots["_fb_free"] + reserved,
                                          slots["_fb_total"])
        columns: dict[str, pa.Array] = {
            "sample_utc": pa.array(k_us[first][rows], type=pa.int64()).cast(TS),
            "source": pa.repeat("dcgm", n),
            "host": identity([keys[k][2] for k in row_series.tolist()], pa.string()),
            **{col: identity([None if i is None else getattr(i, col) for i in ids],
                             GPU_SAMPLES.schema.field(col).type)
               for col in _DcgmRowIds._fields},
            **{col: pa.array(v, mask=np.isnan(v))
               for col in _FLOAT_COLUMNS for v in [slots.get(col, none)]},
            "source_file": identity([srcs[f] for f in file_of[row_series].tolist()], pa.string()),
        }
        return _result(conform(pa.table(columns), GPU_SAMPLES), [], counters,
                       [src for src in srcs if src], fast_parsed=len(staged), sort=sort)


def _count(counters: Counter[str], **masks: np.ndarray) -> None:
    """Add the number of true entries of each mask to its counter (only when some are true, as the
    line parsers count)."""
    for name, mask in masks.items():
        if n := int(np.count_nonzero(mask)):
            counters[name] = n


# ----------------------------------------------------------------------------------------------
# Directory of telemetry logs (the simulator's layout)
# ----------------------------------------------------------------------------------------------

# Threads that parse telemetry files at once (a file's parse is mostly Arrow kernels, which release the GIL).
_READ_THREADS = min(4, os.cpu_count() or 1)
# Files of one kind finished together (see _NvsmiFast.finish_many, _DcgmFast.finish_many), up to
# this many bytes together (a day of 30-second samples of one host is ~10-20 MB: alone).
_FILES_AT_ONCE = 32
_BYTES_AT_ONCE = 4 << 20
# Units parsed ahead of the one the reader waits for, beyond one per thread (one more costs about a
# unit's working set -- a host's day of 30-second DCGM text held ~50-150 MB before files were read
# in pieces -- and gained no time).
_AHEAD = 0
_FILE_DAY_RE = re.compile(r"(\d{4}-\d{2}-\d{2})")


# A rotated file's suffix after the kind's (``.csv``, ``.prom``): ``.N`` (logrotate's numbers), or
# ``-YYYYMMDD`` / ``-YYYY-MM-DD`` (its ``dateext``: the day of the rotation, not of the samples -- a
# weekly rotation holds the week before it -- so such a file is read as undated).
_ROTATION_NUMBER = re.compile(r"(?:\.[0-9]+|-[0-9]{8}|-[0-9]{4}-[0-9]{2}-[0-9]{2})$")


def _regular_file(path: Path) -> bool:
    """A regular file (through links); False for anything else, or what cannot be looked at (a
    dangling link, a link loop)."""
    try:
        return path.is_file()
    except OSError:  # a link loop (ELOOP) on Python versions that raise it
        return False


def _text_name(path: Path) -> str:
    """A file's name without its codec's suffix (``.gz``, ``.zst``)."""
    return path.name[: -len(path.suffix)] if compression_of(path) else path.name


def _host_files(host_dir: Path, suffix: str, counters: Counter[str]) -> list[Path]:
    """A host folder's files of one kind: ``*<suffix>``, ``*<suffix>.gz`` / ``*<suffix>.zst``
    (compressed by a log rotation), and ``*<suffix>.N`` or ``*<suffix>-YYYYMMDD`` (``.gz``/``.zst``)
    as a rotation names them (read as undated), the suffix in any case, in name order. While a rotation compresses a file,
    the file and its compressed copy may both be there (the copy perhaps unfinished): the file is
    read, the copy skipped and counted (``compressed_twins_skipped``). Any other entry in the folder
    (``.xz``, a note, a dangling link or a link loop, a pipe, a folder) is counted
    (``files_not_recognized``), so that samples do not vanish unseen."""
    everything = list(host_dir.glob("*"))
    entries = sorted(p for p in everything if _regular_file(p))
    found = [p for p in entries if _ROTATION_NUMBER.sub("", _text_name(p)).lower().endswith(suffix)]
    counters["files_not_recognized"] += len(everything) - len(found)
    plain = {p.name for p in found if not compression_of(p)}
    files = []
    for path in found:
        if compression_of(path) and _text_name(path) in plain:
            counters["compressed_twins_skipped"] += 1
            continue
        files.append(path)
    return files


_DAY = dt.timedelta(days=1)
_ROTATION_DAY = re.compile(r"-([0-9]{4})-?([0-9]{2})-?([0-9]{2})$")


def _rotation_day(path: Path) -> dt.date | None:
    """The day in a ``dateext`` rotation's name (``*.csv-YYYYMMDD``, ``-YYYY-MM-DD``), or None."""
    if m := _ROTATION_DAY.search(_text_name(path)):  # (the kind's suffix before it: _host_files took the file)
        try:
            return dt.date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            return None
    return None


def _rotation_spans(files: Sequence[Path]) -> dict[Path, tuple[dt.date | None, dt.date]]:
    """Per file logrotate's ``dateext`` named (``*.csv-YYYYMMDD``), the days its samples may lie in:
    after the previous rotation of the same log (None for its first) through its own day, the
    rotation's. A host folder may hold several logs, each rotated on its own schedule."""
    streams: dict[str, list[tuple[dt.date, Path]]] = {}
    for path in files:
        if (day := _rotation_day(path)) is not None:  # a name's case matters
            streams.setdefault(_ROTATION_DAY.sub("", _text_name(path)), []).append((day, path))
    spans: dict[Path, tuple[dt.date | None, dt.date]] = {}
    for rotated in streams.values():
        days = sorted({day for day, _ in rotated})
        before = dict(zip(days, [None, *days[:-1]], strict=True))
        spans.update((path, (before[day], day)) for day, path in rotated)
    return spans


def _file_day(name: str) -> dt.date | None:
    """The day a file's name is dated with, before the kind's suffix (a rotation's date after it is
    not the samples' day)."""
    m = _FILE_DAY_RE.search(_ROTATION_NUMBER.sub("", _text_name(Path(name))))
    if not m:
        return None
    try:
        return dt.date.fromisoformat(m.group(1))
    except ValueError:
        return None


_MS_DIGITS = 13  # a millisecond epoch timestamp from 2001-09-09 to 2286-11-20
_POW10 = 10 ** np.arange(_MS_DIGITS - 1, -1, -1, dtype=np.int64)


def _lines(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bytes of ``data`` and the start and end offsets of its non-empty lines."""
    buf = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(buf)]))
    lines = ends > starts
    return buf, starts[lines], ends[lines]


def _digits(buf: np.ndarray, at: np.ndarray, n: int) -> np.ndarray | None:
    """The ``n`` bytes from each offset ``at`` as a number, or None when one is not an ASCII digit."""
    digits = buf[at[:, None] + np.arange(n)].astype(np.int64) - ord("0")
    if ((digits < 0) | (digits > 9)).any():
        return None
    return digits @ _POW10[-n:]


def dcgm_sample_times(data: bytes) -> np.ndarray | None:
    """The sample times (UTC microseconds, as the parsers compute them) of a DCGM text, read without
    parsing it: every non-blank line that does not start with ``#`` must end in ``} <value> <13-digit
    millisecond timestamp>`` (one space each side of a non-empty value, the series' labels closed).
    None when a line does not, or the text holds a carriage return (the fast path decides then).

    A well-formed line's last token is its timestamp to both parsers, so for a text the fast path
    reads these are exactly its sample times; a line either parser would quarantine has no sample."""
    if b"\r" in data:
        return None
    buf, starts, ends = _lines(data)
    samples = buf[starts] != ord("#")
    starts, ends = starts[samples], ends[samples]
    if len(starts) == 0 or ((ends - starts) < _MS_DIGITS + 4).any():
        return None
    stamp = ends - _MS_DIGITS  # first digit of each line's timestamp
    ms = _digits(buf, stamp, _MS_DIGITS)
    if ms is None or (buf[stamp - 1] != ord(" ")).any():
        return None
    braces = np.flatnonzero(buf == ord("}"))
    last = np.searchsorted(braces, stamp - 1) - 1  # each line's last "}" before the timestamp's space
    if (last < 0).any():
        return None
    brace = braces[last]
    if (brace < starts).any() or (buf[brace + 1] != ord(" ")).any() or (brace + 2 >= stamp - 1).any():
        return None
    return np.rint(ms / 1000 * 1_000_000).astype(np.int64)  # the parsers' round(int(ms) / 1000 * 1e6)


def nvidia_smi_sample_dates(data: bytes) -> np.ndarray | None:
    """The local dates (``YYYYMMDD`` integers) of the samples of an nvidia-smi CSV log whose first line
    is a header starting with ``timestamp``, read without parsing it: every other non-blank line must
    be such a header again or start with a ``YYYY/MM/DD `` date (its timestamp cell). None otherwise,
    or when the text holds a carriage return. A line either parser would quarantine has no sample."""
    if b"\r" in data or not data.startswith(b"timestamp"):
        return None
    buf, starts, ends = _lines(data)
    word = np.frombuffer(b"timestamp", dtype=np.uint8)
    long_enough = ends - starts >= len(word)
    header = long_enough.copy()
    header[long_enough] = (buf[starts[long_enough, None] + np.arange(len(word))] == word).all(axis=1)
    starts, ends = starts[~header], ends[~header]
    if len(starts) == 0 or ((ends - starts) < 11).any():
        return None
    if ((buf[starts + 4] != ord("/")) | (buf[starts + 7] != ord("/")) | (buf[starts + 10] != ord(" "))).any():
        return None
    parts = [_digits(buf, starts + at, n) for at, n in ((0, 4), (5, 2), (8, 2))]
    if any(p is None for p in parts):
        return None
    year, month, day = parts
    return year * 10_000 + month * 100 + day


def read_telemetry_dir(
    root: str | Path,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    source_tz: str,
    *,
    ambiguous: str = "earlier",
    margin_days: int = 1,
    fast: bool = True,
    nvidia_smi_fields: Sequence[str] | None = None,
) -> ParseResult:
    """Samples in [start_utc, end_utc) from ``root/nvidia-smi/HOST/*.csv`` and
    ``root/dcgm/HOST/*.prom`` (host = directory name), sorted by (sample_utc, host, gpu_id). Either
    kind may also be compressed by a log rotation (``*.csv.gz``, ``*.prom.zst``: gzip or zstd), read
    through the codec as it is read, with the same result as its text (see :func:`_host_files` for a
    file and its compressed copy side by side).

    Files are parsed only when the local date in their name (``...-YYYY-MM-DD``) lies within
    ``margin_days`` of the window's local dates (names without a date are always read: the margin
    covers loggers that roll files at UTC midnight or late). A margin file (named for a date within
    the margin but not one of the window's own local dates) is skipped when its samples all lie
    outside the window, so that no row of it can be in the window. A scan of its bytes reads its
    timestamps (:func:`dcgm_sample_times`, or the local dates of :func:`nvidia_smi_sample_dates`),
    else the fast path does as far as its timestamps. A file neither can read is parsed in full, so
    no in-window sample is ever lost. A dated file's quarantined lines are reported by one window
    only, the one holding its date's local noon (a local-day file is read by two UTC days, a margin
    file by a day beside its own: each line is counted once over consecutive days); an undated
    file's by every window that reads it. Files are parsed on a few threads, the files of the fast
    path finished a few dozen (up to 4 MB) of one kind at a time (:meth:`_NvsmiFast.finish_many`,
    :meth:`_DcgmFast.finish_many`); the result is the same as one file at a time (one 10,000-GPU day,
    2,051 files: 5.3-6.7 -> 3.5-4.4 s on two threads). DCGM samples without a timestamp get the file's mtime.
    ``source_file`` is the path relative to ``root``. A missing ``root`` or source folder yields
    an empty table. ``fast=False`` parses every file line by line and skips no margin file.
    ``nvidia_smi_fields``: the loggers' ``--query-gpu`` list, for header-less (``noheader``) logs
    (a file's header wins; without either, :data:`DEFAULT_QUERY_FIELDS`).

    Counters: ``files_outside_window`` (files not parsed: named for a date beyond the margin, or
    margin files without a timestamp in the window), ``files_read``, ``rows_outside_window`` (rows of
    the parsed files outside the window), and each parser's counters of the parsed files, prefixed
    ``nvidia-smi:`` / ``dcgm:``."""
    reader = TelemetryDir(root, start_utc, end_utc, source_tz, ambiguous=ambiguous, margin_days=margin_days,
                          fast=fast, nvidia_smi_fields=nvidia_smi_fields)
    tables = list(reader.parts())
    table = pa.concat_tables(tables) if tables else GPU_SAMPLES.empty()
    return _result(table, reader.quarantine, reader.counters, reader.files, reader.fast_parsed)


class TelemetryDir:
    """The files of :func:`read_telemetry_dir` for one window, read part by part: :meth:`parts`
    yields the rows of each parsed unit of files (kept to the window, unsorted), in file order;
    ``quarantine``, ``counters``, ``files`` and ``fast_parsed`` are complete once it is exhausted
    (``counters`` then also holds ``rows_out`` and ``quarantined_lines``, as in a
    :class:`ParseResult`). At most a few units are parsed ahead of the consumer, so a caller that
    writes each part away holds a few files' rows, not the day's. ``input_bytes`` is the size of the
    files to parse and ``text_bytes`` the size of their text (a compressed file's estimated), known
    before any is read."""

    def __init__(self, root: str | Path, start_utc: dt.datetime, end_utc: dt.datetime, source_tz: str, *,
                 ambiguous: str = "earlier", margin_days: int = 1, fast: bool = True,
                 nvidia_smi_fields: Sequence[str] | None = None):
        self.root = root = Path(root)
        self.nvidia_smi_fields = tuple(nvidia_smi_fields) if nvidia_smi_fields else None
        self.start_utc, self.end_utc = _utc(start_utc, "start_utc"), _utc(end_utc, "end_utc")
        self.source_tz, self.ambiguous, self.fast = source_tz, ambiguous, fast
        self.zone = ZoneInfo(source_tz)
        _check_ambiguous(ambiguous)
        if self.end_utc <= self.start_utc:
            raise ValueError(f"empty window: end_utc {self.end_utc} <= start_utc {self.start_utc}")
        zone = self.zone
        self.first_day = self.start_utc.astimezone(zone).date()
        self.last_day = (self.end_utc - _US).astimezone(zone).date()
        self._lo_us, self._hi_us = epoch_us(self.start_utc), epoch_us(self.end_utc)
        self._dates = tuple(int(d.strftime("%Y%m%d")) for d in (self.first_day, self.last_day))
        lo = self.first_day - dt.timedelta(days=margin_days)
        hi = self.last_day + dt.timedelta(days=margin_days)
        self.quarantine: list[QuarantinedLine] = []
        self.counters: Counter[str] = Counter()
        self.files: list[str] = []
        self.fast_parsed = 0
        self.tasks: list[tuple[str, str, Path, dt.date | None]] = []
        for kind, suffix in (("nvidia-smi", ".csv"), ("dcgm", ".prom")):
            base = root / kind
            if not base.is_dir():
                continue
            for host_dir in sorted(p for p in base.iterdir() if p.is_dir()):
                files = _host_files(host_dir, suffix, self.counters)
                rotated = _rotation_spans(files)
                for path in files:
                    day = _file_day(path.name)
                    span = rotated.get(path)
                    # a rotation's day is its host's, in whatever zone and with logrotate's options
                    # (dateyesterday): a day's slack beyond the margin
                    if (day is not None and not lo <= day <= hi) or (span is not None and (
                            span[1] < lo - _DAY or (span[0] is not None and span[0] > hi + _DAY))):
                        self.counters["files_outside_window"] += 1
                        continue
                    self.tasks.append((kind, host_dir.name, path, day))
        # A dated file's quarantined lines are this window's only when it holds the file's day's
        # local noon: one window of a run of consecutive days reads them, however many read the
        # file (a local-day file is read by two UTC days; a margin file by the day after).
        # (an undated file, a rotation or the file a logger writes, is read by every window whose days it
        # may hold, and its lines set aside are in each of their quarantines)
        self._quarantine_here = {
            task[2].relative_to(root).as_posix(): task[3] is None or self._lo_us <= epoch_us(
                dt.datetime.combine(task[3], dt.time(12), zone)) < self._hi_us
            for task in self.tasks
        }
        on_disk = [task[2].stat().st_size for task in self.tasks]
        #: per file, its text's size (a compressed file's estimated: :func:`text_bytes_estimate`)
        self.sizes = [text_bytes_estimate(task[2], n) for task, n in zip(self.tasks, on_disk, strict=True)]
        self.text_bytes = sum(self.sizes)
        self.input_bytes = sum(on_disk)

    def _no_sample_in_window(self, kind: str, data: bytes) -> bool:
        """Whether a scan of the text's timestamps shows that no sample lies in the window (False
        when the scan cannot tell). A local date outside the window's local dates is outside the
        window whatever its time of day."""
        if kind == "dcgm":
            times = dcgm_sample_times(data)
            return times is not None and not np.any((times >= self._lo_us) & (times < self._hi_us))
        dates = nvidia_smi_sample_dates(data)
        first_date, last_date = self._dates
        return dates is not None and not np.any((dates >= first_date) & (dates <= last_date))

    def _stage(self, task: tuple[str, str, Path, dt.date | None]) -> tuple[str, _Staged | None, Callable] | None:
        """A file's relative path, fast-path stage (None: the fast path gave up) and line-by-line
        parse, or None for a margin file without a timestamp in the window."""
        kind, host, path, day = task
        rel = path.relative_to(self.root).as_posix()
        margin = day is not None and not self.first_day <= day <= self.last_day
        if margin and self.fast and self._no_sample_in_window(kind, _read_file_bytes(path)):
            return None
        if kind == "nvidia-smi":
            read = partial(_NvsmiFast.read, path, self.zone, host, rel, self.nvidia_smi_fields)
            slow = partial(parse_nvidia_smi_csv, path, self.source_tz, host=host, source_file=rel,
                           fields=self.nvidia_smi_fields, ambiguous=self.ambiguous, fast=False)
        else:
            mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
            read = partial(_DcgmFast.read, path, host, rel)
            slow = partial(parse_dcgm_text, path, host=host, default_time_utc=mtime, source_file=rel, fast=False)
        staged = _try_fast(read) if self.fast else None
        if margin and staged is not None and not np.any((staged.sample_us >= self._lo_us)
                                                         & (staged.sample_us < self._hi_us)):
            return None
        return rel, staged, slow

    def _parse(self, unit: list[tuple[str, str, Path, dt.date | None]]) -> tuple[list[tuple[list[str], ParseResult]], int]:
        """The results of a unit's files in file order, each with the files it holds, and how many
        files were skipped. Files of one kind that all take the fast path are finished as one. The
        fast path's rows are left unsorted: the caller sorts all rows, and a stable sort of a file's
        rows on the same key would change nothing there."""
        staged = [st for st in map(self._stage, unit) if st is not None]
        skipped = len(unit) - len(staged)
        if len(staged) > 1 and all(st is not None for _, st, _ in staged):
            many = _NvsmiFast.finish_many if unit[0][0] == "nvidia-smi" else _DcgmFast.finish_many
            try:
                return [([rel for rel, _, _ in staged], many([st for _, st, _ in staged], sort=False))], skipped
            except (_NotFast, pa.ArrowInvalid):
                pass
        return [([rel], _finish_or_slow(st, slow, sort=False)) for rel, st, slow in staged], skipped

    def _units(self) -> list[list[tuple[str, str, Path, dt.date | None]]]:
        """Small files are taken a few dozen of one kind at a time (a small file's parse is mostly the
        fixed cost of the Arrow and numpy calls); a large one alone, so that the threads share them."""
        units: list[list[tuple[str, str, Path, dt.date | None]]] = []
        unit_bytes = 0
        for task, size in zip(self.tasks, self.sizes, strict=True):
            if (units and task[0] == units[-1][0][0] and len(units[-1]) < _FILES_AT_ONCE
                    and unit_bytes + size <= _BYTES_AT_ONCE):
                units[-1].append(task)
                unit_bytes += size
            else:
                units.append([task])
                unit_bytes = size
        return units

    def parts(self) -> Iterator[pa.Table]:
        """Units are parsed on a few threads (Arrow's kernels run without the GIL), at most
        ``_AHEAD`` units beyond the one the consumer waits for, and taken in order; a file that
        fails stops the read (the units not yet started are not parsed)."""
        lo_s, hi_s = pa.scalar(self.start_utc, type=TS), pa.scalar(self.end_utc, type=TS)
        units = iter(self._units())
        pending: deque[tuple[list, Future]] = deque()
        pool = ThreadPoolExecutor(max_workers=_READ_THREADS)
        rows = 0
        try:
            while True:
                while len(pending) < _READ_THREADS + _AHEAD:
                    unit = next(units, None)
                    if unit is None:
                        break
                    pending.append((unit, pool.submit(self._parse, unit)))
                if not pending:
                    break
                unit, future = pending.popleft()
                parsed, skipped = future.result()
                del future
                if skipped:
                    self.counters["files_outside_window"] += skipped
                kind = unit[0][0]
                for rels, part in parsed:
                    self.files.extend(rels)
                    self.fast_parsed += part.fast_parsed
                    self.counters.update({f"{kind}:{k}": v for k, v in part.counters.items()})
                    self.quarantine.extend(q for q in part.quarantine
                                           if self._quarantine_here.get(q.source_file, True))
                    # kept to the window part by part (a margin file's rows outside it are let go here)
                    ts = part.table.column("sample_utc")
                    inside = pc.and_(pc.greater_equal(ts, lo_s), pc.less(ts, hi_s))
                    kept = part.table if not inside.null_count and pc.all(inside).as_py() else part.table.filter(inside)
                    self.counters["rows_outside_window"] += part.table.num_rows - kept.num_rows
                    if kept.num_rows:
                        rows += kept.num_rows
                        yield kept
                del parsed
        finally:
            for _, future in pending:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            with _ZONE_OFFSETS_LOCK:
                _ZONE_OFFSETS.clear()  # the next day's seconds are others
        self.counters["files_read"] = len(self.files)
        self.counters["rows_out"] = rows
        self.counters["quarantined_lines"] = len(self.quarantine)
