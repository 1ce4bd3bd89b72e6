"""Reader for the monthly HTCondor slot-state archives (DESIGN.md 4.1).

One file per calendar month of the collector's *local* time: ``gpu_state_YYYY-MM.db`` (SQLite,
table ``gpu_state`` written by pandas ``to_sql``; no declared schema, no index) or
``gpu_state_YYYY-MM.parquet`` (same columns). Timestamps are naive local text
``YYYY-MM-DD HH:MM:SS.ffffff``, one value per snapshot.

``read_window`` returns the rows of a UTC window from whichever monthly files overlap it, tolerating
schema drift (missing optional columns become null, unknown columns are dropped and reported),
missing months (reported) and the repeated hour at the end of daylight saving time (resolved from the
order in which snapshots were appended to the file).

SQLite rows come straight into Arrow record batches through the ADBC SQLite driver (Apache Arrow's
database connectivity; no Python object per value), a batch at a time: memory holds the day's kept
rows, not the month. The rare file whose values do not fit their column's type (text in a numeric
column, a number in a text column, non-UTF-8 text) is read row by row with Python's ``sqlite3`` and
per-value rules instead, giving the same table; ``ArchiveRead.read_paths`` says which way each file
was read. Timestamps are localized once per distinct snapshot, not per row.

A large SQLite file gets a time index in memory on first read: per block of rowids, the range of its
text timestamps (one pass over the timestamps). A day then reads only the blocks that can hold its
rows, split between two readers, so a range run reads each month once plus each day's rows instead of
a whole month per day. The index is kept per state of the file (size, modification time, its
write-ahead log's): a file that changed is indexed again.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

import adbc_driver_manager
import adbc_driver_sqlite.dbapi as adbc_sqlite
import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.prefetch import Prefetch
from gpu_pipeline.lib.schemas import QUARANTINE_CONDOR_RAW, RAW_CONDOR_SLOT_SNAPSHOTS
from gpu_pipeline.lib.timeutil import UTC

TABLE = "gpu_state"
REQUIRED_COLUMNS = ("Name", "AssignedGPUs", "State", "timestamp")
SOURCE_COLUMNS = (
    "Name",
    "AssignedGPUs",
    "AvailableGPUs",
    "State",
    "GPUs_DeviceName",
    "GPUs_GlobalMemoryMb",
    "PrioritizedProjects",
    "GPUsAverageUsage",
    "Machine",
    "RemoteOwner",
    "GlobalJobId",
    "PreventJobsReason",
    "Disk",
)
#: Columns only later archives have (DESIGN 4.1): their absence from an older month is no drift.
LATER_COLUMNS = ("PreventJobsReason", "Disk")
_NUMERIC = {"GPUs_GlobalMemoryMb", "GPUsAverageUsage", "Disk"}
_FILE_RE = re.compile(r"^gpu_state_(\d{4})-(\d{2})\.(db|sqlite|parquet)$")
# Reading margin around the local window: covers the DST shift and sub-second rounding.
_MARGIN = dt.timedelta(hours=2)
TS_UTC = pa.timestamp("us", tz="UTC")


class ArchiveError(RuntimeError):
    """An archive file that cannot be read; the message names the file and the problem."""


@dataclass
class ArchiveRead:
    table: pa.Table
    files: list[str] = field(default_factory=list)
    missing_months: list[str] = field(default_factory=list)
    #: files of a month the window reads that another file of the month shadows (a ``.sqlite`` or a
    #: ``.parquet`` beside its ``.db``: :func:`month_files`), not read
    shadowed_files: list[str] = field(default_factory=list)
    extra_columns: dict[str, list[str]] = field(default_factory=dict)
    missing_columns: dict[str, list[str]] = field(default_factory=dict)
    unparseable_timestamps: int = 0
    #: rows set aside: (file, rowid, reason, timestamp text)
    rejected: list[tuple[str, int, str, str]] = field(default_factory=list)
    #: column -> values that were not numbers and became null
    non_numeric: dict[str, int] = field(default_factory=dict)
    #: file -> how it was read: "columnar" (ADBC), "row_by_row" (values the columnar read does not
    #: convert exactly) or "parquet"
    read_paths: dict[str, str] = field(default_factory=dict)

    @property
    def snapshots(self) -> int:
        return pc.count_distinct(self.table.column("snapshot_utc")).as_py() if self.table.num_rows else 0


def months_between(start: dt.datetime, end: dt.datetime) -> list[str]:
    """``YYYY-MM`` of every month touched by the naive interval [start, end]."""
    out = []
    y, m = start.year, start.month
    while (y, m) <= (end.year, end.month):
        out.append(f"{y:04d}-{m:02d}")
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


#: The order in which a month's files are read when it has several: the first one found
_PREFERENCE = {".db": 0, ".sqlite": 1, ".parquet": 2}


def month_files(archive_dir: Path) -> dict[str, list[Path]]:
    """Month -> its archive files, the one read first: the .db, else the .sqlite, else the .parquet;
    the others are shadowed (a conversion left behind) and not read."""
    if not archive_dir.is_dir():
        raise ArchiveError(f"{archive_dir}: slot-state archive directory does not exist")
    found: dict[str, list[Path]] = {}
    for path in archive_dir.iterdir():
        m = _FILE_RE.match(path.name)
        if m:
            found.setdefault(f"{m.group(1)}-{m.group(2)}", []).append(path)
    return {month: sorted(paths, key=lambda p: _PREFERENCE[p.suffix]) for month, paths in sorted(found.items())}


def _sqlite_columns(con: sqlite3.Connection, path: Path) -> tuple[list[str], frozenset[str]]:
    """The table's columns, and those declared with TEXT affinity (SQLite's rules: no "INT", and
    "CHAR", "CLOB" or "TEXT" in the declared type), where a number written is stored as text."""
    rows = con.execute(f"PRAGMA table_info({TABLE})").fetchall()
    if not rows:
        raise ArchiveError(f"{path}: no table '{TABLE}' in the archive")
    declared = {r[1]: str(r[2] or "").upper() for r in rows}
    text = frozenset(c for c, d in declared.items()
                     if "INT" not in d and any(k in d for k in ("CHAR", "CLOB", "TEXT")))
    return list(declared), text


def _decode(raw: bytes) -> str:
    # Text that is not UTF-8 is kept with U+FFFD replacement characters; cleaning quarantines rows
    # whose identity columns contain them (no bytes are silently dropped or guessed).
    return raw.decode("utf-8", errors="replace")


def _roll_back_hot_journal(path: Path, lock_timeout_s: float) -> None:
    """A writer killed mid-transaction leaves a hot journal that a read-only connection cannot roll
    back ("attempt to write a readonly database"); one read-write open rolls it back."""
    con = sqlite3.connect(path, timeout=lock_timeout_s)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchall()
    finally:
        con.close()


def _read_sqlite(path: Path, lo: str, hi: str, consume: _Consume,
                 lock_timeout_s: float = 30.0) -> tuple[_FilePart, list[str]]:
    try:
        return _read_sqlite_once(path, lo, hi, consume, lock_timeout_s)
    except ArchiveError as exc:
        if "readonly" not in str(exc).lower():
            raise
        _roll_back_hot_journal(path, lock_timeout_s)
        return _read_sqlite_once(path, lo, hi, consume, lock_timeout_s)


#: A timestamp text that carries its UTC offset (an archive written from aware times, as pandas
#: ``to_sql`` writes them: ``2025-08-06 00:00:00.000000+00:00``).
_OFFSET_TEXT = re.compile(r"(Z|[+-]\d\d:?\d\d)$")
#: The widest UTC offset a zone has: text with offsets sorts by local wall time, not by the instant.
_MAX_OFFSET = dt.timedelta(hours=14)


def _text_bounds(con: sqlite3.Connection, lo: str, hi: str) -> tuple[str, str]:
    """The text range to read, ``lo``..``hi`` (local wall time with the margin), widened by the
    widest UTC offset when the file's first or last timestamp text carries an offset: its rows are
    then read by their instant (the localizer reads an offset), and text in another offset than the
    source zone's lay outside the local range (a day lost its last hours in America/Chicago)."""
    ends = con.execute(f"SELECT timestamp FROM (SELECT timestamp FROM {TABLE} ORDER BY rowid LIMIT 1) UNION ALL "
                       f"SELECT timestamp FROM (SELECT timestamp FROM {TABLE} ORDER BY rowid DESC LIMIT 1)").fetchall()
    if not any(isinstance(t, str) and _OFFSET_TEXT.search(t.strip()) for (t,) in ends):
        return lo, hi
    return ((dt.datetime.fromisoformat(lo) - _MAX_OFFSET).isoformat(sep=" "),
            (dt.datetime.fromisoformat(hi) + _MAX_OFFSET).isoformat(sep=" "))


def read_only_uri(path: Path | str) -> str:
    """The SQLite URI that opens ``path`` read-only: the path percent-encoded (``Path.as_uri``), so a
    folder named with ``#``, ``?`` or ``%`` is that folder (written as is, ``#`` began the URI's
    fragment, and SQLite opened -- and created -- another file, read-write)."""
    return Path(path).resolve().as_uri() + "?mode=ro"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _read_sqlite_once(path: Path, lo: str, hi: str, consume: _Consume,
                      lock_timeout_s: float) -> tuple[_FilePart, list[str]]:
    try:
        con = sqlite3.connect(read_only_uri(path), uri=True, timeout=lock_timeout_s)
    except sqlite3.Error as exc:
        raise ArchiveError(f"{path}: cannot open SQLite archive: {exc}") from exc
    try:
        cols, text_columns = _sqlite_columns(con, path)
        missing_req = [c for c in REQUIRED_COLUMNS if c not in cols]
        if missing_req:
            raise ArchiveError(f"{path}: table '{TABLE}' lacks required columns {missing_req}")
        wanted = [c for c in SOURCE_COLUMNS if c in cols]
        lo, hi = _text_bounds(con, lo, hi)
        try:
            ranges = _reader_ranges(con, path, lo, hi)
            # The first reader stays a few batches ahead; the second reads its whole range meanwhile
            # (see _AHEAD).
            for masked in (False, True):
                readers = [Prefetch(_sqlite_batches(path, wanted, lo, hi, rows, masked, text_columns),
                                    depth=2 if i == 0 else _AHEAD, name="archive-read")
                           for i, rows in enumerate(ranges)]
                try:
                    part = consume(_in_order(readers))
                    part.read_path = "columnar_masked" if masked else "columnar"
                    break
                except _NotColumnar:
                    if masked:
                        raise
        except _NotColumnar:
            part = consume(iter([_sqlite_rows(con, wanted, lo, hi)]))
            part.read_path = "row_by_row"
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc).lower():
            raise ArchiveError(
                f"{path}: database is locked by another process for more than {lock_timeout_s:g} s "
                "(a collector writing?); re-run the day later"
            ) from exc
        raise ArchiveError(f"{path}: unreadable SQLite archive: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        raise ArchiveError(f"{path}: unreadable SQLite archive: {exc}") from exc
    finally:
        con.close()
    return part, cols


# Rows per record batch of the columnar read (the driver's default, 1,024, makes the per-batch work
# dominate); also the rows whose values fix each column's type.
_BATCH_ROWS = 65_536
# Batches the second reader may hold before the caller takes them. Every row read lies in the window
# (the ranges come from the time index) and the caller keeps it in the day's table, so a batch that
# waits costs no more memory than once taken. A bound of 8 (0.5 M rows) stopped the second reader
# a tenth of the way into a 10,000-GPU day's half: read 11.9 -> 8.6 s, peak RSS 1.81 -> 1.82 GB.
_AHEAD = 1024


class _NotColumnar(Exception):
    """The columnar read met something it does not convert exactly; the row-by-row read takes over."""


def _read_types(wanted: list[str]) -> pa.Schema:
    names = ["source_rowid", "timestamp_local", *wanted]
    return pa.schema([
        (n, pa.int64() if n == "source_rowid" else pa.float64() if n in _NUMERIC else pa.string()) for n in names
    ])


def _sqlite_batches(path: Path, wanted: list[str], lo: str, hi: str,
                    rowids: list[tuple[int, int]] | None = None, masked: bool = False,
                    text_columns: frozenset[str] = frozenset()) -> Iterator[pa.RecordBatch]:
    """The window's rows (of the rowid ranges ``rowids``, inclusive and ascending, when given) as
    Arrow record batches, straight from SQLite through the ADBC SQLite driver (no Python object per
    value).

    The driver fixes each result column's type from the values of its first batch (integers and
    reals together: real; text among them: text) and stops at a later value of another type (text
    in a numeric column, a real after integers); it writes a number in a text column as SQLite's
    text for it (not always Python's) and a blob as its bytes. The plain query reads numeric columns
    as they are (a batch of integers is cast to reals in Arrow) and text columns as they are where
    the column has TEXT affinity (``text_columns``: no number can be stored there; a blob's bytes
    are what the row-by-row read decodes), else with anything but text or NULL turned into invalid
    UTF-8. A column whose first batch is all NULL is typed wrongly, and the driver then stops at its
    first value. The ``masked`` query returns no NULLs (a bit mask column says which values were
    NULL) and turns a value of the wrong storage class into a wrong type or invalid UTF-8, so that
    only odd values stop it. Raises :class:`_NotColumnar` when the driver stops or returns a wrong
    type, when the file is locked or damaged, or when a text is not valid UTF-8; the caller then
    tries the next way (masked, then row by row with the per-value rules: the same table)."""
    schema = _read_types(wanted)
    sources = ["timestamp", *wanted]
    exprs = []
    for c in sources:
        q = _q(c)
        if c in _NUMERIC:
            exprs.append(q if not masked else
                         f"CASE typeof({q}) WHEN 'real' THEN {q} WHEN 'integer' THEN {q} * 1.0 "
                         f"WHEN 'null' THEN 0.0 ELSE 'not a number' END")
        elif not masked:
            exprs.append(q if c in text_columns else f"CASE typeof({q}) WHEN 'text' THEN {q} "
                                                     f"WHEN 'null' THEN NULL ELSE X'FF' END")
        else:
            exprs.append(f"CASE typeof({q}) WHEN 'text' THEN {q} WHEN 'null' THEN '' ELSE X'FF' END")
    if masked:
        exprs.insert(0, " | ".join(f"(({_q(c)} IS NULL) << {i})" for i, c in enumerate(sources)))
    query = (f"SELECT rowid, {', '.join(exprs)} FROM {TABLE} "
             f"WHERE {_q('timestamp')} >= ? AND {_q('timestamp')} < ?")
    queries = ([(query + " ORDER BY rowid", (lo, hi))] if rowids is None else
               [(query + " AND rowid >= ? AND rowid <= ? ORDER BY rowid", (lo, hi, int(a), int(b))) for a, b in rowids])
    try:
        con = adbc_sqlite.connect(read_only_uri(path))
    except adbc_driver_manager.Error as exc:
        raise _NotColumnar(str(exc)) from exc
    try:
        for sql, params in queries:
            yield from _converted(con, sql, params, schema, masked)
    except (adbc_driver_manager.Error, pa.ArrowException, OSError) as exc:
        raise _NotColumnar(str(exc)) from exc
    finally:
        con.close()


def _converted(con: adbc_sqlite.Connection, sql: str, params: tuple, schema: pa.Schema,
               masked: bool) -> Iterator[pa.RecordBatch]:
    """The batches of one query of :func:`_sqlite_batches` in ``schema`` (NULLs restored from the
    bit mask of the masked query)."""
    cur = con.cursor()
    try:
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(_BATCH_ROWS)})
        cur.execute(sql, params)
        for batch in cur.fetch_record_batch():
            if not batch.num_rows:  # an empty result's column types say nothing
                continue
            skip = 2 if masked else 1
            columns = [batch.column(0)]
            for i, field in enumerate(schema):
                if i == 0:
                    continue
                col = batch.column(i - 1 + skip)
                if col.type == pa.int64() and field.type == pa.float64() and not masked:
                    col = col.cast(pa.float64(), safe=False)  # rounded beyond 2**53, as SQLite's `* 1.0`
                if col.type != field.type:
                    if masked or col.null_count != len(col):
                        raise _NotColumnar(f"{field.name}: read as {col.type}")
                    col = pa.nulls(len(col), field.type)  # all NULL so far: typed by guess
                if masked:
                    is_null = pc.not_equal(pc.bit_wise_and(batch.column(1), 1 << (i - 1)), 0)
                    col = pc.if_else(is_null, pa.scalar(None, field.type), col)
                columns.append(col)
            out = pa.RecordBatch.from_arrays(columns, schema=schema)
            out.validate(full=True)  # UTF-8 of every text
            yield out
    finally:
        cur.close()


def _in_order(readers: list[Prefetch]) -> Iterator[pa.RecordBatch]:
    """The readers' batches one reader after the other (so in rowid order), all of them reading at once."""
    try:
        for reader in readers:
            yield from reader
    finally:
        for reader in readers:
            reader.close()


# Rowids per block of the time index (``_build_index``): about 10 ms of SQLite scan per block, and the
# precision with which a day's rows are located (a 1,000-GPU day is about 160 k rows).
_BLOCK_SHIFT = 14
_BLOCK_CACHE_FILES = 8


@dataclass(frozen=True)
class _Block:
    """One block of rowids: the first and last rowid present, and bounds of the text timestamps in it
    (UTF-8 bytes): ``ts_min`` is the smallest (b"" when not known), ``ts_max`` the largest (None when
    not known)."""

    first: int
    last: int
    ts_min: bytes
    ts_max: bytes | None
    nontext: bool = False  #: a timestamp in it is NULL, a number or a blob


_blocks_lock = threading.Lock()
_blocks_cache: dict[tuple, list[_Block]] = {}


def _file_key(path: Path) -> tuple | None:
    """What identifies one state of a SQLite file: its size and modification time, and its
    write-ahead log's (committed rows may sit there). None when the file cannot be stat'ed."""
    try:
        st = path.stat()
    except OSError:
        return None
    key: tuple = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    try:
        wal = Path(f"{path}-wal").stat()
        key += (wal.st_size, wal.st_mtime_ns)
    except OSError:
        pass
    return key


def _scan_blocks(con: sqlite3.Connection, path: Path | None = None) -> list[_Block]:
    """The time index of the table: one SQLite pass over the timestamps, a block of rowids at a time
    (a rowid range is a B-tree seek: no sort, nothing decoded but the timestamp).

    Only text timestamps can satisfy the window's text comparison. SQLite orders NULL < numbers <
    text < blobs, so a block's ``min`` is its smallest text unless a number is there (then the lower
    bound is unknown), its ``max`` the largest text unless a blob is there (then the upper bound is
    unknown); a block whose ``max`` is a number or NULL has no text and is left out."""
    (first,) = con.execute(f"SELECT min(rowid) FROM {TABLE}").fetchone()
    (last,) = con.execute(f"SELECT max(rowid) FROM {TABLE}").fetchone()
    if first is None:
        return []
    step = 1 << _BLOCK_SHIFT
    if path is None or last - first < 8 * step:
        return _scan_range(con, first, None)
    # Two halves at once, the second on its own connection in a thread (SQLite runs a query without
    # the GIL): the scan is one core's work otherwise. The halves' blocks together cover every rowid,
    # as one pass's do (a block may be cut at the middle).
    mid = first + ((last - first) // 2 // step) * step
    with ThreadPoolExecutor(max_workers=1) as pool:
        tail = pool.submit(_scan_file_range, path, mid, None)
        head = _scan_range(con, first, mid)
        return head + tail.result()


def _scan_file_range(path: Path, start: int, stop: int | None) -> list[_Block]:
    con = sqlite3.connect(read_only_uri(path), uri=True)
    try:
        return _scan_range(con, start, stop)
    finally:
        con.close()


def _scan_range(con: sqlite3.Connection, start: int, stop: int | None) -> list[_Block]:
    """The blocks of rowids in ``[start, stop)`` (``stop`` None: to the end), ``start`` onwards."""
    ts = '"timestamp"'
    step = 1 << _BLOCK_SHIFT
    blocks: list[_Block] = []
    (cursor,) = con.execute(f"SELECT min(rowid) FROM {TABLE} WHERE rowid >= ?", (start,)).fetchone()
    while cursor is not None and (stop is None or cursor < stop):
        end = cursor + step if stop is None else min(cursor + step, stop)
        first, last, min_type, ts_min, max_type, ts_max, nulls = con.execute(
            f"SELECT min(rowid), max(rowid), typeof(min({ts})), CAST(min({ts}) AS BLOB), "
            f"typeof(max({ts})), CAST(max({ts}) AS BLOB), count(*) - count({ts}) "
            f"FROM {TABLE} WHERE rowid >= ? AND rowid < ?",
            (cursor, end)).fetchone()
        if max_type in ("text", "blob"):
            blocks.append(_Block(first, last, ts_min if min_type == "text" else b"",
                                 ts_max if max_type == "text" else None,
                                 nontext=bool(nulls) or min_type != "text" or max_type != "text"))
        (cursor,) = con.execute(f"SELECT min(rowid) FROM {TABLE} WHERE rowid >= ?", (end,)).fetchone()
    return blocks


def _cached_index(path: Path) -> list[_Block] | None:
    """The time index built for the file's present state in this process, if any."""
    key = _file_key(path)
    if key is None:
        return None
    with _blocks_lock:
        return _blocks_cache.get(key)


def _build_index(con: sqlite3.Connection, path: Path) -> list[_Block] | None:
    """The file's time index, kept for its present state (a range run reads every day of a month out
    of one scan), or None where it cannot be trusted: a database not in UTF-8, or a timestamp column
    declared with a collation (the window's comparison would then not be a byte comparison)."""
    key = _file_key(path)
    (encoding,) = con.execute("PRAGMA encoding").fetchone()
    ddl = con.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    if key is None or str(encoding).upper() != "UTF-8" or ddl is None or "COLLATE" in str(ddl[0]).upper():
        return None
    blocks = _scan_blocks(con, path)
    with _blocks_lock:
        while len(_blocks_cache) >= _BLOCK_CACHE_FILES:
            _blocks_cache.pop(next(iter(_blocks_cache)))
        _blocks_cache[key] = blocks
    return blocks


def forget_time_indexes() -> None:
    """Drop the time indexes built in this process (the next read of each file builds its own)."""
    with _blocks_lock:
        _blocks_cache.clear()


def _split_rows(ranges: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The rowid ranges cut into two consecutive halves of about equal rowid count (one part when
    there is too little for a second reader to pay off)."""
    total = sum(b - a + 1 for a, b in ranges)
    if total < 2 * _BATCH_ROWS:
        return [ranges]
    half, seen = total // 2, 0
    for i, (a, b) in enumerate(ranges):
        if seen + (b - a + 1) > half:
            cut = a + (half - seen)
            head = [*ranges[:i], (a, cut - 1)] if cut > a else ranges[:i]
            return [head, [(cut, b), *ranges[i + 1:]]]
        seen += b - a + 1
    return [ranges]


_PROBES = 32


def _mostly_inside(con: sqlite3.Connection, first: int, last: int, lo: str, hi: str) -> bool:
    """Whether most of the table looks to lie in the window, by the timestamps at a few evenly spaced
    rowids (a seek each): then reading it all costs less than indexing it (a file of about one day).
    A file already indexed in this process uses its index whatever this says."""
    inside = 0
    for k in range(_PROBES):
        row = con.execute(f'SELECT "timestamp" FROM {TABLE} WHERE rowid >= ? ORDER BY rowid LIMIT 1',
                          (first + (last - first) * k // (_PROBES - 1),)).fetchone()
        inside += row is not None and isinstance(row[0], str) and lo <= row[0] < hi
    return inside * 2 > _PROBES


def _reader_ranges(con: sqlite3.Connection, path: Path, lo: str, hi: str) -> list[list[tuple[int, int]] | None]:
    """The rowid ranges each reader reads: the blocks whose timestamps can fall in ``[lo, hi)`` by
    the time index, merged and split between two readers; the whole table split in two where it
    lies mostly in the window (no index is built then) or its index cannot be trusted. Every row the
    window's query matches lies in them, whatever order rows were appended in. ``[None]`` (one
    reader of the whole table) for a small table or anything unexpected."""
    try:
        (first,) = con.execute(f"SELECT min(rowid) FROM {TABLE}").fetchone()
        (last,) = con.execute(f"SELECT max(rowid) FROM {TABLE}").fetchone()
        if first is None or last - first < 2 * _BATCH_ROWS:
            return [None]
        blocks = _cached_index(path)
        if blocks is None and not _mostly_inside(con, first, last, lo, hi):
            blocks = _build_index(con, path)
    except (sqlite3.Error, ValueError, TypeError):
        return [None]
    if blocks is None:
        return _split_rows([(first, last)])
    lo_b, hi_b = lo.encode(), hi.encode()
    ranges: list[tuple[int, int]] = []
    for block in blocks:
        if block.ts_min >= hi_b or (block.ts_max is not None and block.ts_max < lo_b):
            continue
        if ranges and ranges[-1][1] + 1 >= block.first:
            ranges[-1] = (ranges[-1][0], block.last)
        else:
            ranges.append((block.first, block.last))
    return _split_rows(ranges)


def _sqlite_rows(con: sqlite3.Connection, wanted: list[str], lo: str, hi: str) -> pa.Table:
    """Row-by-row read: any storage class, text that is not UTF-8 kept with U+FFFD."""
    con.text_factory = _decode
    select = ", ".join(_q(c) for c in wanted)
    # Text comparison is exact for the fixed-width timestamp format.
    rows = con.execute(
        f'SELECT rowid, "timestamp", {select} FROM {TABLE} '
        f'WHERE "timestamp" >= ? AND "timestamp" < ? ORDER BY rowid',
        (lo, hi),
    ).fetchall()
    names = ["source_rowid", "timestamp_local", *wanted]
    return _table_from_values({n: [r[i] for r in rows] for i, n in enumerate(names)})


def _table_from_values(data: dict[str, list]) -> pa.Table:
    """Python values of one file as Arrow: numeric columns as float64 (a value that is not a number
    becomes null; ``__lost_<column>`` marks it), text columns as strings (other values via ``str``)."""
    arrays: dict[str, pa.Array] = {}
    for name, values in data.items():
        if name == "source_rowid":
            arrays[name] = pa.array(values, type=pa.int64())
        elif name in _NUMERIC:
            floats = [_to_float(v) for v in values]
            arrays[name] = pa.array(floats, type=pa.float64())
            arrays[f"__lost_{name}"] = pa.array(
                [f is None and v not in (None, "") for v, f in zip(values, floats, strict=True)], type=pa.bool_()
            )
        else:
            arrays[name] = pa.array(
                [None if v is None else _decode(v) if isinstance(v, bytes) else str(v) for v in values],
                type=pa.string(),
            )
    return pa.table(arrays)


def _read_parquet(path: Path, lo: str, hi: str, source_tz: str) -> tuple[pa.Table, list[str]]:
    """The rows of a monthly Parquet archive whose local time lies in [lo, hi). A ``timestamp`` of
    local times is read as the SQLite files' text is (text compared as text: an unreadable value in
    the window is quarantined with its row, not failing the month); a time-zone-aware one (what
    pandas writes for an aware column) names its instant, kept as UTC text with its offset."""
    con = db_connect()
    try:
        types = {name: kind for name, kind, *_ in
                 con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(path)]).fetchall()}
        cols = list(types)
        missing_req = [c for c in REQUIRED_COLUMNS if c not in cols]
        if missing_req:
            raise ArchiveError(f"{path}: archive lacks required columns {missing_req}")
        wanted = [c for c in SOURCE_COLUMNS if c in cols]
        select = ", ".join(_q(c) for c in wanted)
        kind = types["timestamp"]
        # (local time to compare with the window's bounds, its text, the bound, the local's parameters)
        if "WITH TIME ZONE" in kind or kind.startswith("TIMESTAMPTZ"):  # microseconds, or pandas' nanoseconds
            local, text, bound, zone = ('timezone(?, "timestamp")',
                                        "strftime(timezone('UTC', \"timestamp\"), '%Y-%m-%d %H:%M:%S.%f') || '+00:00'",
                                        "CAST(? AS TIMESTAMP)", [source_tz])
        elif kind == "VARCHAR":  # text, compared and read as the SQLite files' text is
            local, text, bound, zone = '"timestamp"', '"timestamp"', "?", []
        else:
            local = 'CAST("timestamp" AS TIMESTAMP)'
            text, bound, zone = f"strftime({local}, '%Y-%m-%d %H:%M:%S.%f')", "CAST(? AS TIMESTAMP)", []
        tbl = con.sql(
            f"""SELECT file_row_number AS source_rowid, {text} AS timestamp_local, {select}
                FROM read_parquet(?, file_row_number=true)
                WHERE {local} >= {bound} AND {local} < {bound}
                ORDER BY file_row_number""",
            params=[str(path), *zone, lo, *zone, hi],
        ).to_arrow_table()
    except duckdb.Error as exc:
        raise ArchiveError(f"{path}: unreadable Parquet archive: {exc}") from exc
    finally:
        con.close()
    typed = all(
        tbl.schema.field(c).type in ((pa.float64(), pa.float32(), pa.int64(), pa.int32()) if c in _NUMERIC
                                     else (pa.string(), pa.large_string()))
        for c in wanted
    )
    if not typed:  # drifted column types: the per-value rules (numbers from text, text from numbers)
        return _table_from_values({n: tbl.column(n).to_pylist() for n in tbl.column_names}), cols
    return tbl.cast(pa.schema([
        pa.field(n, pa.int64() if n == "source_rowid" else pa.float64() if n in _NUMERIC else pa.string())
        for n in tbl.column_names
    ])), cols


#: What a snapshot time's text starts with (``YYYY-MM-DD `` and a time): other text
#: (``2025-03-10T12:10:00``) is not read as a time, and is set aside by the day whose own local text
#: range holds it. The days that open a month file read its rows in their text range; what none of
#: them reads is set aside once (:func:`_owned_strays`): a row whose time lies after the last day
#: that opens the file (text after its range, ``garbage`` among them, or a time after its window),
#: by that day; before the first, by the first; a row whose timestamp is NULL, a number or bytes, by
#: the day that read the row appended before it (the collector appends in time order), the first day
#: where there is none. So each row is read, or set aside, by one day.
_SHAPED = re.compile(r"\d{4}-\d\d-\d\d ")
_NO_TEXT_REASON = ("no timestamp text (NULL, a number or bytes: no day reads it; set aside by the day of the "
                   "row appended before it)")
_OUTSIDE_REASON = ("timestamp outside the days that read the file (after the last, or before the first, day "
                   "whose window opens this month's file; set aside by that day)")


def _stray_ranges(path: Path, after: str | None, before: str | None) -> list[tuple[int, int]] | None:
    """The rowid ranges that can hold a stray (:func:`_strays`), by the file's time index: the rowids
    outside its blocks that hold only text in ``[before, after)`` (a bound None: open); None
    without an index."""
    blocks = _cached_index(path)
    if blocks is None:
        return None
    lo_b = before.encode() if before is not None else b""
    hi_b = after.encode() if after is not None else None
    ranges, end = [], -(2**63)
    for b in blocks:
        if b.nontext or b.ts_min < lo_b or (hi_b is not None and (b.ts_max is None or b.ts_max >= hi_b)):
            continue  # the block may hold one
        if b.first > end:
            ranges.append((end, b.first - 1))
        end = b.last + 1
    ranges.append((end, 2**63 - 1))
    return ranges


_SQLITE_PREV = (f'SELECT "timestamp" FROM {TABLE} WHERE rowid < ? AND typeof("timestamp") = \'text\' '
                'ORDER BY rowid DESC LIMIT 1')


def _strays(path: Path, lo: str, hi: str, first: bool, last: bool,
            source_tz: str = "UTC") -> list[tuple[int, str, str | None, str | None]]:
    """The rows of a month file no day reads that a day reading ``[lo, hi)`` of it may own: a NULL,
    numeric or bytes timestamp, and, where it is the ``last`` (``first``) day that opens the file,
    text at or after ``hi`` (before ``lo``); as (row, reason, the value as text, the text of the
    nearest row before it with text, or None). ``lo``/``hi`` are widened as the read widens them
    (offset text). Where the file has a time index only the rowids outside its blocks that cannot
    hold one are looked at (none, for a clean file in the middle of its month); else one scan."""
    found: list[tuple[int, object, object]] = []
    after, before = (hi if last else None), (lo if first else None)
    if path.suffix == ".parquet":
        con = db_connect()
        try:
            kind = dict((n, k) for n, k, *_ in con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(path)]).fetchall())
            ts_kind = kind.get("timestamp", "")
            text = ts_kind == "VARCHAR"
            aware = "WITH TIME ZONE" in ts_kind or ts_kind.startswith("TIMESTAMPTZ")
            odd = ['"timestamp" IS NULL']
            # the time compared as the window's read compares it (_read_parquet)
            local = ('"timestamp"' if text else 'timezone($tz, "timestamp")' if aware
                     else 'CAST("timestamp" AS TIMESTAMP)')
            bound = "{}" if text else "CAST({} AS TIMESTAMP)"
            if after is not None:
                odd.append(f"{local} >= {bound.format('$after')}")
            if before is not None:
                odd.append(f"{local} < {bound.format('$before')}")
            odd_sql = " OR ".join(odd)
            # the row before as the window reads it (_read_parquet): an aware time as UTC text with its offset
            shown = ('"timestamp"' if text else
                     """strftime(timezone('UTC', "timestamp"), '%Y-%m-%d %H:%M:%S.%f') || '+00:00'""" if aware else
                     """strftime("timestamp", '%Y-%m-%d %H:%M:%S.%f')""")
            q = {"f": str(path)}
            if "$tz" in odd_sql:
                q["tz"] = source_tz
            if "$after" in odd_sql:
                q["after"] = after
            if "$before" in odd_sql:
                q["before"] = before
            if con.execute(f"SELECT count(*) FROM read_parquet($f) WHERE {odd_sql}", q).fetchone()[0]:
                found = con.execute(
                    f"""SELECT file_row_number, "timestamp", prev FROM (
                            SELECT file_row_number, "timestamp", ({odd_sql}) AS odd,
                                   last_value({shown} IGNORE NULLS) OVER (
                                       ORDER BY file_row_number ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
                            FROM read_parquet($f, file_row_number=true))
                        WHERE odd ORDER BY 1""", q).fetchall()
        except duckdb.Error as exc:
            raise ArchiveError(f"{path}: unreadable Parquet archive: {exc}") from exc
        finally:
            con.close()
    else:
        try:
            con = sqlite3.connect(read_only_uri(path), uri=True)
        except sqlite3.Error as exc:
            raise ArchiveError(f"{path}: cannot open SQLite archive: {exc}") from exc
        try:
            con.text_factory = _decode
            lo_w, hi_w = _text_bounds(con, lo, hi)
            after, before = (hi_w if last else None), (lo_w if first else None)
            odd = ['typeof("timestamp") != \'text\'']
            args: list[str] = []
            if after is not None:
                odd.append('"timestamp" >= ?')
                args.append(after)
            if before is not None:
                odd.append('"timestamp" < ?')
                args.append(before)
            odd_sql = " OR ".join(odd)
            ranges = _stray_ranges(path, after, before)
            rows = (con.execute(f'SELECT rowid, "timestamp" FROM {TABLE} WHERE {odd_sql} ORDER BY rowid', args).fetchall()
                    if ranges is None else
                    [row for a, b in ranges for row in con.execute(
                        f'SELECT rowid, "timestamp" FROM {TABLE} WHERE rowid >= ? AND rowid <= ? AND ({odd_sql}) '
                        'ORDER BY rowid', (a, b, *args)).fetchall()])
            last_row, prev = None, None
            for rowid, value in rows:
                if isinstance(value, str):  # text outside: owned by the first / last day, no row before needed
                    found.append((rowid, value, None))
                elif last_row is not None and rowid == last_row + 1:  # a run shares the row before it
                    before_value = found[-1][1]
                    prev = before_value if isinstance(before_value, str) else prev
                    found.append((rowid, value, prev))
                else:
                    got = con.execute(_SQLITE_PREV, (rowid,)).fetchone()
                    prev = got[0] if got else None
                    found.append((rowid, value, prev))
                last_row = rowid
        except sqlite3.Error as exc:
            raise ArchiveError(f"{path}: unreadable SQLite archive: {exc}") from exc
        finally:
            con.close()
    out = []
    for rowid, value, prev in found:
        prev_text = None if prev is None else _decode(prev) if isinstance(prev, bytes) else str(prev)
        if isinstance(value, str):
            out.append((int(rowid), _OUTSIDE_REASON, value, prev_text))
        elif isinstance(value, dt.datetime):  # a typed Parquet time outside what the days read
            out.append((int(rowid), _OUTSIDE_REASON, value.isoformat(sep=" "), prev_text))
        else:  # NULL, a number or a blob
            shown = None if value is None else _decode(value) if isinstance(value, bytes) else str(value)
            out.append((int(rowid), _NO_TEXT_REASON, shown, prev_text))
    return out


def _opens(lo_local: dt.datetime, hi_local: dt.datetime, month: str) -> bool:
    """Whether a day reading the local range ``[lo_local, hi_local]`` opens the file of ``month``."""
    return month in months_between(lo_local, hi_local)


@dataclass(frozen=True)
class _Ownership:
    """Which rows of a month file a window ``[start, end)`` answers for: those in it, and, where it
    is the ``first`` (``last``) day that opens the file, those before (after) it, which no day reads.
    A time by its instant; text that cannot be read by the window's own local text range
    ``[own_lo, own_hi)``."""

    start: dt.datetime
    end: dt.datetime
    own_lo: str
    own_hi: str
    first: bool
    last: bool

    def time(self, at: dt.datetime) -> bool:
        return self.start <= at < self.end or (self.last and at >= self.end) or (self.first and at < self.start)

    def text(self, text: str) -> bool:
        return self.own_lo <= text < self.own_hi or (self.last and text >= self.own_hi) or (
            self.first and text < self.own_lo)


def _owned_strays(path: Path, lo: str, hi: str, source_tz: str,
                  owns: _Ownership) -> list[tuple[str, int, str, str | None]]:
    """The rows of a month file that no day reads and the window of ``owns`` sets aside, as
    quarantine entries (see :data:`_SHAPED`): text after (before) what it reads when it is the last
    (first) day that opens the file; a NULL, numeric or bytes timestamp when it answers for the row
    before, or when there is none and it is the first."""
    localize = _Localizer(source_tz)
    out = []
    for rowid, reason, text, prev in _strays(path, lo, hi, owns.first, owns.last, source_tz):
        if reason == _OUTSIDE_REASON:
            ours = True  # asked for by first / last only
        elif prev is None:
            ours = owns.first
        else:
            at = localize._one(prev)
            ours = owns.time(at) if at is not None else owns.text(prev)
        if ours:
            out.append((str(path), rowid, reason, text))
    return out


#: how far back a local time must step to be the repeated hour's second pass (not two writers' commits
#: out of order)
_STEP_BACK = dt.timedelta(minutes=1)


def _repeated_hour(naive: dt.datetime, zone: ZoneInfo) -> tuple | None:
    """The repeated local period (a DST fall-back's) that ``naive`` lies in, as (date, first offset,
    second offset), or None when it names one instant (a time skipped by a spring-forward is not
    repeated: its two readings do not come back to it)."""
    first, second = naive.replace(tzinfo=zone, fold=0), naive.replace(tzinfo=zone, fold=1)
    if first.utcoffset() == second.utcoffset():
        return None
    for aware in (first, second):
        if aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != naive:
            return None
    return naive.date(), first.utcoffset(), second.utcoffset()


class _Localizer:
    """Maps each distinct local timestamp text of one file to UTC, in the order the rows come.

    Snapshots are appended in time order, so in the repeated hour after a DST fall-back the local
    times go back once: from the first local time more than a minute earlier than one already seen
    (two collectors' snapshots a second apart may commit out of order), every time
    of that repeated hour is its second occurrence (fold=1), also one later than the last of the
    first pass (a snapshot's seconds of jitter, or a collector that missed the end of the first
    pass). A repeated hour without a step back (the collector down across the change) reads as the
    first occurrence: nothing in the file tells them apart. The same text twice is one instant,
    except in a repeated hour: there a text is localized row by row, so the same text before and
    after the step back (a collector stamping its snapshots on the minute) is two instants.
    """

    def __init__(self, tz: str):
        self.zone = ZoneInfo(tz)
        self.known: dict[str, dt.datetime | None] = {}
        self.repeated: set[str] = set()  # texts of a repeated hour: localized row by row
        self.max_seen: dt.datetime | None = None
        self.second_pass: set[tuple] = set()  # the repeated hours whose times went back

    def _one(self, text: str) -> dt.datetime | None:
        if not _SHAPED.match(str(text)):  # not read as a time: set aside (see _SHAPED)
            return None
        try:
            naive = dt.datetime.fromisoformat(str(text).strip())
        except ValueError:
            return None
        if naive.tzinfo is not None:
            return naive.astimezone(UTC)
        fold = 0
        hour = _repeated_hour(naive, self.zone)
        if hour is not None:
            self.repeated.add(text)
            if hour in self.second_pass:
                fold = 1
            elif self.max_seen is not None and naive < self.max_seen - _STEP_BACK:
                fold = 1
                self.second_pass.add(hour)
        if self.max_seen is None or naive > self.max_seen:
            self.max_seen = naive
        return naive.replace(tzinfo=self.zone, fold=fold).astimezone(UTC)

    def column(self, local: pa.Array | pa.ChunkedArray) -> pa.Array:
        """UTC time of every row (null where unreadable); each distinct text is localized once, in
        order of first appearance (``pc.unique`` keeps it); a batch with a text of a repeated hour
        row by row, in the rows' order."""
        distinct = pc.unique(local).to_pylist()
        if self.repeated.intersection(distinct):
            return self._by_row(local, {})
        for text in distinct:
            if text is not None and text not in self.known:
                utc = self._one(text)
                if text in self.repeated:  # its fold depends on the rows around it
                    return self._by_row(local, {text: utc})
                self.known[text] = utc
        utc = pa.array([self.known.get(t) if t is not None else None for t in distinct], type=TS_UTC)
        return pc.take(utc, pc.index_in(local, value_set=pa.array(distinct, type=pa.string())))

    def _by_row(self, local: pa.Array | pa.ChunkedArray, first: dict[str, dt.datetime | None]) -> pa.Array:
        """Every row in order: a text of a repeated hour anew each time (its fold by the times
        before it), others once. ``first``: a text ``column`` localized already, for its first row
        (no time was seen between)."""
        out: list[dt.datetime | None] = []
        for text in local.to_pylist():
            if text is None:
                out.append(None)
            elif text in first:
                out.append(first.pop(text))
            elif text in self.known:
                out.append(self.known[text])
            else:
                utc = self._one(text)
                if text not in self.repeated:
                    self.known[text] = utc
                out.append(utc)
        return pa.array(out, type=TS_UTC)


@dataclass
class _FilePart:
    """What one archive file contributes to the window (built anew if the file is re-read)."""

    tables: list[pa.Table] = field(default_factory=list)
    rejected: list[tuple[str, int, str, str]] = field(default_factory=list)
    lost: dict[str, int] = field(default_factory=dict)
    read_path: str = ""


_Consume = Callable[[Iterator[pa.RecordBatch | pa.Table]], _FilePart]


def read_window(
    archive_dir: str | Path,
    start_utc: dt.datetime,
    end_utc: dt.datetime,
    source_tz: str = "UTC",
    lock_timeout_s: float = 30.0,
) -> ArchiveRead:
    """Rows with snapshot time in [start_utc, end_utc), conformed to the raw table schema."""
    archive_dir = Path(archive_dir)
    zone = ZoneInfo(source_tz)
    lo_local = start_utc.astimezone(zone).replace(tzinfo=None) - _MARGIN
    hi_local = end_utc.astimezone(zone).replace(tzinfo=None) + _MARGIN
    lo, hi = lo_local.isoformat(sep=" "), hi_local.isoformat(sep=" ")
    # a row whose time cannot be read is this window's when its text lies in the window's own local
    # range (the margin's rows are a neighbouring day's: each is rejected by one day, not two)
    own_lo_local = start_utc.astimezone(zone).replace(tzinfo=None)
    own_hi_local = end_utc.astimezone(zone).replace(tzinfo=None)
    own_lo, own_hi = own_lo_local.isoformat(sep=" "), own_hi_local.isoformat(sep=" ")
    files_of = month_files(archive_dir)
    result = ArchiveRead(table=RAW_CONDOR_SLOT_SNAPSHOTS.empty())
    schema = RAW_CONDOR_SLOT_SNAPSHOTS.schema
    lo_s, hi_s = pa.scalar(start_utc, type=TS_UTC), pa.scalar(end_utc, type=TS_UTC)

    def consumer(path: Path, owns: _Ownership) -> _Consume:
        """``owns``: the rows the window answers for; where no day before (after) it opens the file,
        its rows read here with a time before (after) the window are set aside here (no day reads them)."""
        first, last = owns.first, owns.last
        def consume(batches: Iterator[pa.RecordBatch | pa.Table]) -> _FilePart:
            part, localize = _FilePart(), _Localizer(source_tz)
            made: dict[str, pa.Array] = {}

            def filled(f: pa.Field, n: int) -> pa.Array:
                """The file's name (``source_file``) or nulls, n rows: slices of one array per file
                (a 5 M-row day would otherwise hold 5 M copies of the path)."""
                have = made.get(f.name)
                if have is None or len(have) < n:
                    value = pa.scalar(str(path) if f.name == "source_file" else None, f.type)
                    have = made[f.name] = pa.repeat(value, max(n, _BATCH_ROWS))
                return have.slice(0, n)

            for data in batches:
                if not data.num_rows:
                    continue
                utc = localize.column(data.column("timestamp_local"))
                bad = pc.is_null(utc)
                if pc.any(bad).as_py():
                    for rowid, text in zip(data.column("source_rowid").filter(bad).to_pylist(),
                                           data.column("timestamp_local").filter(bad).to_pylist(), strict=True):
                        if text is not None and owns.text(str(text)):
                            part.rejected.append((str(path), rowid, "unparseable timestamp "
                                                  "(expected YYYY-MM-DD HH:MM:SS.ffffff)", str(text)))
                if first or last:  # a time no day that opens the file holds
                    outside = pc.or_(pc.and_(pa.scalar(last), pc.greater_equal(utc, hi_s)),
                                     pc.and_(pa.scalar(first), pc.less(utc, lo_s)))
                    if pc.any(outside).as_py():
                        for rowid, text in zip(data.column("source_rowid").filter(outside).to_pylist(),
                                               data.column("timestamp_local").filter(outside).to_pylist(),
                                               strict=True):
                            part.rejected.append((str(path), rowid, _OUTSIDE_REASON, str(text)))
                kept = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
                kept = kept.append_column("snapshot_utc", utc)
                inside = pc.and_(pc.greater_equal(utc, lo_s), pc.less(utc, hi_s))
                # most batches lie wholly inside the day: no copy (an unreadable time is null: dropped)
                if inside.null_count or not pc.all(inside).as_py():
                    kept = kept.filter(inside)
                for name in _NUMERIC:
                    flag = f"__lost_{name}"
                    if flag in kept.column_names:
                        n_lost = int(pc.sum(kept.column(flag)).as_py() or 0)
                        if n_lost:
                            part.lost[name] = part.lost.get(name, 0) + n_lost
                    if name in kept.column_names and pa.types.is_floating(kept.schema.field(name).type):
                        # a non-finite real (SQLite keeps 1e999 as Infinity) is no number: nulled, counted
                        odd = pc.invert(pc.is_finite(kept.column(name)))
                        n_odd = int(pc.sum(odd).as_py() or 0)
                        if n_odd:
                            part.lost[name] = part.lost.get(name, 0) + n_odd
                            at = kept.column_names.index(name)
                            kept = kept.set_column(at, name, pc.if_else(odd, None, kept.column(name)))
                n = kept.num_rows
                if n:
                    part.tables.append(pa.Table.from_arrays(
                        [
                            kept.column(f.name) if f.name in kept.column_names
                            else filled(f, n)
                            for f in schema
                        ],
                        schema=schema,
                    ))
            return part
        return consume

    parts: list[pa.Table] = []
    lost: dict[str, int] = {}
    # the months the window's own hours touch: a month only the reading margin reaches (the archive's
    # first month's 1st, the month before rotated away) is no missing part of the day
    own_months = set(months_between(own_lo_local, own_hi_local - dt.timedelta(microseconds=1)))
    for month in months_between(lo_local, hi_local):
        path, *shadowed = files_of.get(month) or [None]
        result.shadowed_files += [str(p) for p in sorted(shadowed)]
        if path is None:
            if month in own_months:
                result.missing_months.append(month)
            continue
        # the days either side (adjacent windows) read from ``own_lo + margin`` back and from
        # ``own_hi - margin`` on: whether they open this month's file
        owns = _Ownership(start_utc, end_utc, own_lo, own_hi,
                          first=not _opens(lo_local - (hi_local - lo_local), own_lo_local + _MARGIN, month),
                          last=not _opens(own_hi_local - _MARGIN, hi_local + (hi_local - lo_local), month))
        if path.suffix == ".parquet":
            table, cols = _read_parquet(path, lo, hi, source_tz)
            part = consumer(path, owns)(iter([table]))
            part.read_path = "parquet"
        else:
            part, cols = _read_sqlite(path, lo, hi, consumer(path, owns), lock_timeout_s)
        result.files.append(str(path))
        result.read_paths[str(path)] = part.read_path
        known = {"timestamp", *SOURCE_COLUMNS}
        extra = [c for c in cols if c not in known and c != "index"]
        if extra:
            result.extra_columns[str(path)] = extra
        absent = [c for c in SOURCE_COLUMNS if c not in cols]
        if absent:
            result.missing_columns[str(path)] = absent
        parts.extend(part.tables)
        result.rejected.extend(part.rejected)
        result.rejected.extend(_owned_strays(path, lo, hi, source_tz, owns))
        for name, n in part.lost.items():
            lost[name] = lost.get(name, 0) + n
    result.unparseable_timestamps = len(result.rejected)
    result.non_numeric = {c: lost[c] for c in SOURCE_COLUMNS if c in lost}
    if parts:
        result.table = pa.concat_tables(parts)
    return result


def _to_float(v: object) -> float | None:
    if v is None or v == "":
        return None
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def rejected_rows(read: ArchiveRead) -> pa.Table:
    """The rows ``read_window`` set aside, in the quarantine schema."""
    if not read.rejected:
        return QUARANTINE_CONDOR_RAW.empty()
    return pa.Table.from_pylist(
        [
            {"source_table": RAW_CONDOR_SLOT_SNAPSHOTS.path, "reason": reason, "source_file": f, "source_row": rowid,
             "record_utc": None, "row_json": json.dumps({"timestamp": text})}
            for f, rowid, reason, text in read.rejected
        ],
        schema=QUARANTINE_CONDOR_RAW.schema,
    )
