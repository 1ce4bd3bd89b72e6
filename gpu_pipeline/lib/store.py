"""The only module that touches table paths.

Layout: ``<root>/<layer>/<table>/date=YYYY-MM-DD/part-0.parquet`` (hive style, zstd) and
``<root>/plots/<name>/date=YYYY-MM-DD/<name>.png``. A partition may keep small JSON notes beside its
file (``_<name>.json``: what its writer found, for the next step to use), bound to the file's bytes by
their SHA-256 so that a note never speaks for another file.

A partition is replaced atomically: the new file is written to a temporary name in the same
directory, fsynced and renamed over the old one, so a reader (or a run killed mid-write) sees either
the old or the new file, never a mix. Re-materializing a day replaces it, never appends. Writers of
one partition are serialized with an exclusive lock file, so two runs of the same day cannot
interleave.

Only local directories are implemented. An object-store root (``s3://...``) would implement the
same four operations (write whole object once, read, list, exists) through ``pyarrow.fs``; nothing
outside this module builds a path.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import io
import json
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpu_pipeline.lib.db import connect  # noqa: F401 - re-exported: callers open DuckDB through the store
from gpu_pipeline.lib.schemas import TableSpec, all_tables, conform, dictionary_encoded

PART_FILE = "part-0.parquet"
ROW_GROUP_SIZE = 1_000_000
_DAY_RE = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")


@dataclass(frozen=True)
class WriteResult:
    path: str
    rows: int
    bytes: int
    sha256: str | None = None  #: the file's SHA-256 (hex), where the writer was asked for it
    #: the partition written before, kept as it was: the source gave nothing for the day
    #: (:meth:`Store.kept_partition`)
    kept: bool = False

    @property
    def uri(self) -> str:
        return "file://" + self.path


class ContentMismatch(ValueError):
    """A copy whose bytes are not the ones expected (nothing was replaced)."""


# The SHA-256 of partition files this process wrote or copied knowing their bytes' digest, by path,
# with the file's identity then (inode, modification time, size): asked again for the same unchanged
# file, :meth:`Store.partition_sha256` answers without reading it (the raw telemetry step's coverage
# note, and the coverage metric's for the clean copy, hashed 65 MB a 1,000-GPU day that the writer
# had just hashed). A replaced file has another identity and is hashed.
_KNOWN_DIGESTS: dict[str, tuple[tuple[int, int, int], str]] = {}
_KNOWN_DIGESTS_MAX = 4096


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_size


def _remember_digest(path: Path, identity: tuple[int, int, int], sha256: str) -> None:
    if len(_KNOWN_DIGESTS) >= _KNOWN_DIGESTS_MAX:
        _KNOWN_DIGESTS.clear()
    _KNOWN_DIGESTS[str(path)] = (identity, sha256)


_KNOWN_COLUMNS: dict[str, tuple[tuple[int, int, int], tuple[str, ...]]] = {}


def _file_columns(path: Path) -> tuple[str, ...]:
    """The column names of a Parquet file, from its footer (remembered per file identity)."""
    identity = _identity(path)
    known = _KNOWN_COLUMNS.get(str(path))
    if known is not None and known[0] == identity:
        return known[1]
    names = tuple(pq.read_schema(path).names)
    if len(_KNOWN_COLUMNS) >= _KNOWN_DIGESTS_MAX:
        _KNOWN_COLUMNS.clear()
    _KNOWN_COLUMNS[str(path)] = (identity, names)
    return names


def _projection(spec: TableSpec, present: Iterable[str]) -> str:
    """The table's columns in its order and types, over files of different versions: a column no
    file has (added after they were written) reads NULL, one the table no longer has is left out."""
    have = set(present)
    return ", ".join(
        f"CAST({_q(f.name) if f.name in have else 'NULL'} AS {_duck_type(f.type)}) AS {_q(f.name)}"
        for f in spec.schema
    )


def _as_day(day: dt.date | str) -> str:
    if isinstance(day, str):
        return dt.date.fromisoformat(day).isoformat()
    return day.isoformat()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_file(folder: Path, prefix: str, suffix: str = "") -> tuple[int, Path]:
    """A new file of a name of its own in ``folder`` (``<prefix><random><suffix>``), open for writing,
    with the mode the umask gives a new file, as ``open`` makes one (``tempfile.mkstemp`` makes it
    0600, which kept other users, the analysts, out of the store)."""
    for _ in range(100):
        path = folder / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"{folder}: no free name for a new {prefix}*{suffix} file")


@contextlib.contextmanager
def atomic_file(target: Path) -> Iterator[io.BufferedWriter]:
    """A temp file in ``target``'s directory to write into (:func:`new_file`); when the block ends
    without error it is flushed, fsynced and renamed over ``target`` (and the directory fsynced),
    otherwise removed, leaving ``target`` as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_file(target.parent, f".{target.name}.", ".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)


def atomic_write_bytes(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` via temp file + fsync + rename in the same directory."""
    with atomic_file(target) as fh:
        fh.write(data)


def _parquet_options(schema: pa.Schema) -> dict[str, object]:
    """zstd; min/max statistics for the columns of times, numbers and flags, where a reader prunes
    row groups on them (a range of days, a threshold), not for text: a day's file holds every host
    and GPU, so a text column's min and max rule out nothing, and computing them was a fifth of the
    writer's time (the slot tables and GPU states of a 1,000-GPU day: 0.21 -> 0.15 s and similar).
    Dictionary encoding for every column but those the schema marks
    :data:`~gpu_pipeline.lib.schemas.NO_DICTIONARY`."""
    stats = [f.name for f in schema
             if pa.types.is_temporal(f.type) or pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
             or pa.types.is_boolean(f.type)]
    dictionary = [f.name for f in schema if dictionary_encoded(f)]
    return {"compression": "zstd", "write_statistics": stats or False, "use_dictionary": dictionary or False,
            "store_schema": True}


def parquet_bytes(table: pa.Table, row_group_rows: int | None = None) -> bytes:
    """Serialize deterministically: the same table gives the same bytes."""
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_rows or ROW_GROUP_SIZE, **_parquet_options(table.schema))
    return sink.getvalue()


def _row_groups(batches: Iterable[pa.RecordBatch], schema: pa.Schema, size: int) -> Iterator[pa.Table]:
    """Re-cut a stream of batches into tables of exactly ``size`` rows (the last one shorter), so a
    streamed file has the row groups -- and the bytes -- of ``parquet_bytes`` on the whole table."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        while batch.num_rows:
            take = min(batch.num_rows, size - rows)
            pending.append(batch.slice(0, take))
            batch = batch.slice(take)
            rows += take
            if rows == size:
                yield pa.Table.from_batches(pending, schema=schema)
                pending, rows = [], 0
    if pending:
        yield pa.Table.from_batches(pending, schema=schema)


class _Digesting:
    """A file to write into that hashes every byte on its way (the Parquet writer only appends)."""

    def __init__(self, fh: io.BufferedWriter):
        self.fh, self.hash = fh, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return self.fh.write(data)

    def tell(self) -> int:
        return self.fh.tell()

    def flush(self) -> None:
        self.fh.flush()

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self.fh.closed

    def close(self) -> None:  # the file is the atomic writer's to close
        pass


def atomic_write_parquet(target: Path, batches: Iterable[pa.RecordBatch], schema: pa.Schema,
                         row_group_rows: int | None = None, digest: bool = False) -> tuple[int, int, str | None]:
    """Stream ``batches`` into a Parquet file at ``target`` (temp file + fsync + rename, as
    :func:`atomic_write_bytes`); returns (rows, bytes, the file's SHA-256 when ``digest``, taken
    from the bytes as they are written). Holds one row group at a time."""
    rows = 0
    size = row_group_rows or ROW_GROUP_SIZE
    with atomic_file(target) as fh:
        sink = _Digesting(fh) if digest else fh
        with pq.ParquetWriter(sink, schema, **_parquet_options(schema)) as writer:
            for group in _row_groups(batches, schema, size):
                writer.write_table(group, row_group_size=size)
                rows += group.num_rows
    return rows, target.stat().st_size, sink.hash.hexdigest() if isinstance(sink, _Digesting) else None


_COPY_CHUNK = 1 << 20


def _chunks(source: BinaryIO) -> Iterator[memoryview | bytes]:
    """The rest of ``source``, a chunk at a time; where the file can ``readinto``, every chunk is read
    into the same buffer (a chunk is valid until the next is asked for). A chunk small enough to stay
    in the CPU's cache while it is hashed and written, and no new memory for each: 16 MB chunks, each
    a new ``bytes``, cost about a quarter more CPU on the clean step's copy of a 1,000-GPU day's file."""
    readinto = getattr(source, "readinto", None)
    if readinto is None:
        while chunk := source.read(_COPY_CHUNK):
            yield chunk
        return
    buffer = bytearray(_COPY_CHUNK)
    view = memoryview(buffer)
    while n := readinto(buffer):
        yield view[:n]


class Store:
    """Partitioned Parquet tables and plots under one local data root."""

    def __init__(self, root: str | os.PathLike[str]):
        root_str = os.fspath(root)
        if "://" in root_str and not root_str.startswith("file://"):
            raise ValueError(
                f"data root {root_str!r}: only local directories are supported in this version "
                "(object stores are planned behind this same Store interface)"
            )
        self.root = Path(root_str.removeprefix("file://")).expanduser().resolve()

    # -- paths -------------------------------------------------------------------------------
    def table_dir(self, spec: TableSpec) -> Path:
        return self.root / spec.layer / spec.name

    def partition_file(self, spec: TableSpec, day: dt.date | str) -> Path:
        return self.table_dir(spec) / f"date={_as_day(day)}" / PART_FILE

    def plot_file(self, name: str, day: dt.date | str, variant: str | None = None) -> Path:
        """``plots/<name>/date=DAY/<name>.png``, or ``<name>__<variant>.png`` (e.g. one per device)."""
        safe = safe_name(name)
        stem = safe if variant is None else f"{safe}__{safe_name(variant)}"
        return self.root / "plots" / safe / f"date={_as_day(day)}" / f"{stem}.png"

    # -- writing -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _partition_lock(self, directory: Path) -> Iterator[None]:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            # every write into the folder holds this lock: a temp file found here is a killed
            # writer's, never to be renamed (atomic_file's ".<name>.<random>.tmp")
            for orphan in directory.glob(".*.tmp"):
                orphan.unlink(missing_ok=True)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def write_partition(self, spec: TableSpec, day: dt.date | str, table: pa.Table) -> WriteResult:
        """Replace one day of ``spec`` with ``table`` (conformed to the table's schema)."""
        data = parquet_bytes(conform(table, spec), spec.row_group_rows)
        target = self.partition_file(spec, day)
        with self._partition_lock(target.parent):
            atomic_write_bytes(target, data)
        return WriteResult(path=str(target), rows=table.num_rows, bytes=len(data))

    def write_partition_batches(
        self, spec: TableSpec, day: dt.date | str, batches: Iterable[pa.RecordBatch], digest: bool = False
    ) -> WriteResult:
        """Replace one day of ``spec`` with a stream of record batches of exactly its schema, without
        holding the table in memory; the file is the one :meth:`write_partition` would write
        (``digest``: its SHA-256 in the result, hashed as it is written)."""
        target = self.partition_file(spec, day)
        with self._partition_lock(target.parent):
            rows, size, sha256 = atomic_write_parquet(target, batches, spec.schema, spec.row_group_rows, digest)
            if sha256 is not None:
                _remember_digest(target, _identity(target), sha256)
        return WriteResult(path=str(target), rows=rows, bytes=size, sha256=sha256)

    def write_partition_copy(self, spec: TableSpec, day: dt.date | str, source: BinaryIO,
                             sha256: str | None = None) -> WriteResult:
        """Replace one day of ``spec`` with a copy of an open Parquet file of the same schema (read from
        its start), atomically as every write. With ``sha256``, the bytes copied are hashed on the
        way and must have that digest: else :class:`ContentMismatch` is raised and nothing replaced."""
        target = self.partition_file(spec, day)
        source.seek(0)
        rows = pq.ParquetFile(source).metadata.num_rows
        source.seek(0)
        digest = hashlib.sha256() if sha256 is not None else None
        with self._partition_lock(target.parent), atomic_file(target) as out:
            for chunk in _chunks(source):
                if digest is not None:
                    digest.update(chunk)
                out.write(chunk)
            if digest is not None and digest.hexdigest() != sha256:
                raise ContentMismatch(f"{getattr(source, 'name', source)}: the bytes copied to {target} are not "
                                      f"the ones expected (SHA-256 {digest.hexdigest()}, expected {sha256})")
        if sha256 is not None:
            _remember_digest(target, _identity(target), sha256)
        return WriteResult(path=str(target), rows=rows, bytes=target.stat().st_size, sha256=sha256)

    def note_file(self, spec: TableSpec, day: dt.date | str, name: str) -> Path:
        """``<table>/date=DAY/_<name>.json``: a small JSON document kept beside a partition's file.
        The leading ``_`` makes directory readers (pandas and pyarrow datasets, Spark) skip it, as
        they skip ``_SUCCESS``: ``pd.read_parquet('<root>/raw/gpu_telemetry')`` failed on a note."""
        return self.partition_file(spec, day).parent / f"_{safe_name(name)}.json"

    def _legacy_note_file(self, spec: TableSpec, day: dt.date | str, name: str) -> Path:
        """Where an earlier version kept the note (``<name>.json``)."""
        return self.partition_file(spec, day).parent / f"{safe_name(name)}.json"

    def write_partition_note(self, spec: TableSpec, day: dt.date | str, name: str, note: dict) -> Path:
        """Replace the partition's note ``name`` (atomically, under the partition's lock); a note of
        an earlier version's name is removed."""
        target = self.note_file(spec, day, name)
        with self._partition_lock(target.parent):
            atomic_write_bytes(target, json.dumps(note, sort_keys=True, indent=1).encode() + b"\n")
            self._legacy_note_file(spec, day, name).unlink(missing_ok=True)
        return target

    def read_partition_note(self, spec: TableSpec, day: dt.date | str, name: str) -> dict | None:
        """The partition's note ``name`` (under an earlier version's name if it has no other), or
        None when there is none or it is not a JSON object."""
        for path in (self.note_file(spec, day, name), self._legacy_note_file(spec, day, name)):
            try:
                note = json.loads(path.read_bytes())
            except FileNotFoundError:
                continue
            except ValueError:
                return None
            return note if isinstance(note, dict) else None
        return None

    def write_plot(self, name: str, day: dt.date | str, png: bytes, variant: str | None = None) -> WriteResult:
        target = self.plot_file(name, day, variant)
        with self._partition_lock(target.parent):
            atomic_write_bytes(target, png)
        return WriteResult(path=str(target), rows=0, bytes=len(png))

    def drop_other_plot_variants(self, name: str, day: dt.date | str, variants: Iterable[str]) -> None:
        """Remove the day's ``<name>__<variant>.png`` images other than ``variants`` (those a re-run
        wrote): a device class gone from the day must not leave its image of an earlier run behind."""
        keep = {self.plot_file(name, day, v).name for v in variants}
        folder = self.plot_file(name, day).parent
        if folder.is_dir():
            with self._partition_lock(folder):
                for path in folder.glob(f"{safe_name(name)}__*.png"):
                    if path.name not in keep:
                        path.unlink(missing_ok=True)

    # -- reading -------------------------------------------------------------------------------
    def has_partition(self, spec: TableSpec, day: dt.date | str) -> bool:
        return self.partition_file(spec, day).is_file()

    def kept_partition(self, spec: TableSpec, day: dt.date | str) -> WriteResult | None:
        """The day's partition as it is (``kept``), where it holds rows; else None. A raw day whose
        configured source now gives nothing (a month archive rotated away, telemetry files pruned on
        the nodes, job records expired from the index, a mount missing) keeps what an earlier run
        wrote instead of replacing it with an empty file: the data is not lost, and the tables
        downstream, which the day's failed check stops or which read the kept rows again, stay
        consistent with it. A file that cannot be read whole is not kept (every page is decoded: a rare
        path, a day whose source gives nothing)."""
        path = self.partition_file(spec, day)
        try:
            with pq.ParquetFile(path) as f:
                rows = f.metadata.num_rows
                read = sum(batch.num_rows for batch in f.iter_batches(batch_size=1 << 16))
            size = path.stat().st_size
        except (OSError, pa.ArrowException):
            return None
        if read != rows:
            return None
        return WriteResult(path=str(path), rows=rows, bytes=size, kept=True) if rows else None

    def partition_days(self, spec: TableSpec) -> list[str]:
        base = self.table_dir(spec)
        if not base.is_dir():
            return []
        days = []
        for child in base.iterdir():
            m = _DAY_RE.match(child.name)
            if m and (child / PART_FILE).is_file():
                days.append(m.group(1))
        return sorted(days)

    def files(self, spec: TableSpec, days: Iterable[dt.date | str]) -> list[str]:
        """Existing partition files for ``days`` (missing days are skipped)."""
        out = []
        for day in days:
            path = self.partition_file(spec, day)
            if path.is_file():
                out.append(str(path))
        return out

    def read_table(self, spec: TableSpec, day: dt.date | str, columns: Sequence[str] | None = None,
                   dictionary: Sequence[str] | None = None, where: tuple[str, str, object] | None = None) -> pa.Table:
        """The day's partition (only ``columns`` when given; the ``dictionary`` columns dictionary-encoded,
        which saves memory on repetitive text; only the rows matching ``where``, ``(column, op, value)``
        with op one of == != < <= > >=: the filter column is read first, row group by row group, and
        the other columns only of the row groups with a match)."""
        path = self.partition_file(spec, day)
        names = list(columns) if columns is not None else spec.schema.names
        have = _file_columns(path)
        if not set(names) <= set(have) or (where is not None and where[0] not in have):
            # written by an earlier version, before a column was added: that column reads null
            # (and a filter on it matches nothing)
            # at least one column is read, for the row count (a table of no columns loses it)
            present = [n for n in names if n in have] or [where[0] if where is not None and where[0] in have
                                                          else have[0]]
            dict_present = [d for d in dictionary or () if d in have]
            if where is not None and where[0] not in have:
                table = self.read_table(spec, day, present, dict_present).slice(0, 0)
            else:
                table = self.read_table(spec, day, present, dict_present, where)
            fields = [spec.schema.field(n).with_type(table[n].type) if n in have else spec.schema.field(n)
                      for n in names]  # the table's fields, as a file of this version gives them
            return pa.Table.from_arrays(
                [table[n] if n in have else pa.nulls(table.num_rows, f.type) for n, f in zip(names, fields, strict=True)],
                schema=pa.schema(fields, metadata=spec.schema.metadata if columns is None else None))
        if where is not None:
            return _read_where(path, spec, columns, where)
        if dictionary:
            return pq.read_table(path, columns=list(columns) if columns is not None else None,
                                 read_dictionary=list(dictionary))
        return pq.read_table(path, schema=spec.schema, columns=list(columns) if columns is not None else None)

    def partition_sha256(self, spec: TableSpec, day: dt.date | str) -> str:
        """The SHA-256 (hex) of the day's partition file, as the writers give it (``digest=True``):
        remembered from this process's write or copy of the same unchanged file, else read."""
        path = self.partition_file(spec, day)
        identity = _identity(path)
        known = _KNOWN_DIGESTS.get(str(path))
        if known is not None and known[0] == identity:
            return known[1]
        with path.open("rb") as fh:
            sha256 = hashlib.file_digest(fh, "sha256").hexdigest()
        if _identity(path) == identity:  # not replaced while it was read
            _remember_digest(path, identity, sha256)
        return sha256

    def partition_identity(self, spec: TableSpec, day: dt.date | str) -> tuple[int, int, int]:
        """What changes when the day's partition is replaced (a new file renamed over it) or written
        in place: its inode, modification time and size."""
        return _identity(self.partition_file(spec, day))

    def row_count(self, spec: TableSpec, day: dt.date | str) -> int:
        """Rows of the day's partition, from the Parquet footer (0 when the partition is absent)."""
        path = self.partition_file(spec, day)
        return pq.ParquetFile(path).metadata.num_rows if path.is_file() else 0

    def relation_sql(self, spec: TableSpec, days: Iterable[dt.date | str]) -> tuple[str, list[str]]:
        """A DuckDB FROM-clause reading the given days, and its parameter list.

        Use as ``con.execute(f"SELECT ... FROM {sql}", params)``. With no file present the
        relation is empty but still has the table's columns. Files written by an earlier version
        of the table (a column added since) are read by column name, the missing column null.
        """
        files = self.files(spec, days)
        if not files:
            return f"(SELECT {_projection(spec, ())} LIMIT 0)", []
        # exactly the table's columns: no ``date`` column guessed from the date=... folders
        if not self.older_files(spec, files):
            return "read_parquet(?, union_by_name=false, hive_partitioning=false)", [files]
        every = set().union(*(_file_columns(Path(f)) for f in files))
        return (f"(SELECT {_projection(spec, every)} FROM read_parquet(?, union_by_name=true, hive_partitioning=false))",
                [files])

    @staticmethod
    def older_files(spec: TableSpec, files: Sequence[str]) -> bool:
        """Whether any of the partition ``files`` has other columns than the table (written by an
        earlier version): a reader must then read them by name (:meth:`relation_sql` does), not
        by position as ``read_parquet(..., union_by_name=false)`` does."""
        names = tuple(spec.schema.names)
        return any(_file_columns(Path(f)) != names for f in files)


_WHERE_OPS = {"==": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
              ">=": pc.greater_equal}


def _read_where(path: Path, spec: TableSpec, columns: Sequence[str] | None, where: tuple[str, str, object]) -> pa.Table:
    """The rows of ``path`` matching ``where``, a row group at a time: the filter column first, the
    other columns only of row groups with a match."""
    column, op, value = where
    test = _WHERE_OPS[op]
    names = list(columns) if columns is not None else spec.schema.names
    pf = pq.ParquetFile(path)
    parts = []
    for i in range(pf.num_row_groups):
        mask = pc.fill_null(test(pf.read_row_group(i, columns=[column])[column], value), False)
        if pc.any(mask).as_py():
            parts.append(pf.read_row_group(i, columns=names).filter(mask))
    schema = pa.schema([spec.schema.field(n) for n in names], metadata=spec.schema.metadata)
    return pa.concat_tables([p.select(names).cast(schema) for p in parts]) if parts else schema.empty_table()


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _duck_type(t: pa.DataType) -> str:
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "VARCHAR"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_int32(t):
        return "INTEGER"
    if pa.types.is_integer(t):
        return "BIGINT"
    if pa.types.is_floating(t):
        return "DOUBLE"
    if pa.types.is_date(t):
        return "DATE"
    raise TypeError(f"no DuckDB type for {t}")


_SAFE_RE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(name: str) -> str:
    """A file-name-safe version of a host/device/plot name (no separators, no '..')."""
    cleaned = _SAFE_RE.sub("_", name).strip("._") or "_"
    return cleaned.replace("..", "_")


def glob_escape(path: str) -> str:
    """``path`` as a literal in a DuckDB glob pattern: ``[``, ``*`` and ``?`` each in a character
    class of its own (a data root named ``run[1]`` matched no file)."""
    return re.sub(r"([\[*?])", r"[\1]", path)


def create_catalog(con: duckdb.DuckDBPyConnection, store: Store) -> list[str]:
    """Create one view per table (``<layer>.<table>``) over every partition in the store.

    Returns the view names. A table with no partition yet gets an empty view with its schema (DuckDB
    binds a view when it is created, and a pattern that matches no file is an error then): such a
    view stays empty in a catalog file until the file is written again (:func:`empty_tables` names
    them)."""
    names = []
    for spec in all_tables().values():
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {_q(spec.layer)}")
        view = f"{_q(spec.layer)}.{_q(spec.name)}"
        if spec.path == "reference/gpu_specs":
            from gpu_pipeline.lib.gpu_specs import spec_table

            # a table, not a view of the registered Arrow table: a catalog file's view of it was
            # broken in every other client (the registration lives in this connection only)
            con.register("_gpu_specs_table", spec_table())
            kind = con.execute("SELECT table_type FROM information_schema.tables WHERE table_schema = ? "
                               "AND table_name = ?", [spec.layer, spec.name]).fetchall()
            if kind and kind[0][0] == "VIEW":  # a catalog written by an earlier version
                con.execute(f"DROP VIEW {view}")
            con.execute(f"CREATE OR REPLACE TABLE {view} AS SELECT * FROM _gpu_specs_table")
            con.unregister("_gpu_specs_table")
        elif store.partition_days(spec):
            pattern = (glob_escape(str(store.table_dir(spec))) + f"/date=*/{PART_FILE}").replace("'", "''")
            # DDL cannot take parameters; the pattern comes from our own root path (quoted above).
            # By name over every file: partitions written before a column was added read it null
            # (by position, the first file's columns would silently win, or a later file fail).
            # The table's columns come from an empty typed row set, so a view saved in a catalog
            # file before any partition had a new column still reads it once later days do.
            scan = f"read_parquet('{pattern}', hive_partitioning=true, union_by_name=true)"
            cols = ", ".join(_q(f.name) for f in spec.schema)
            con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT {cols}, CAST(date AS DATE) AS date FROM ("
                        f"SELECT {_projection(spec, ())}, CAST(NULL AS DATE) AS date WHERE false "
                        f"UNION ALL BY NAME SELECT * FROM {scan})")
        else:
            con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT {_projection(spec, ())}, CAST(NULL AS DATE) AS date "
                        "LIMIT 0")
        names.append(f"{spec.layer}.{spec.name}")
    from gpu_pipeline.lib.availability import stitched_periods_sql

    # DESIGN 5.3: a view joins the days' pieces of an availability period into the whole period
    con.execute(f"CREATE OR REPLACE VIEW metrics.{STITCHED_PERIODS_VIEW} AS "
                + stitched_periods_sql("metrics.availability_periods"))
    names.append(f"metrics.{STITCHED_PERIODS_VIEW}")
    return names


#: The view of whole availability periods, their pieces of several days joined (:func:`create_catalog`).
STITCHED_PERIODS_VIEW = "availability_periods_stitched"


def empty_tables(store: Store) -> list[str]:
    """The tables (``<layer>.<table>``) with no partition in the store: their catalog views are
    empty placeholders."""
    return [f"{spec.layer}.{spec.name}" for spec in all_tables().values()
            if spec.path != "reference/gpu_specs" and not store.partition_days(spec)]
