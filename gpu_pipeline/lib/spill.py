"""Sort a day of rows that may not fit in memory, by keys whose first is a time column.

:class:`TimeSlabSorter` takes the rows part by part (:meth:`~TimeSlabSorter.add`) and gives them
back sorted (:meth:`~TimeSlabSorter.sorted_batches`) -- the same rows in the same order as
:func:`~gpu_pipeline.lib.schemas.sorted_rows` on all parts concatenated (a stable sort, nulls last).

While the parts held stay under ``memory_bytes`` they are only held, and sorted together at the end,
as before. Past it, rows are written to a spill file (Arrow IPC) cut by time into slabs: equal
slices of the window ``[start_utc, end_utc)``, as many as make a slab about ``slab_bytes``
(from ``expected_bytes``, the caller's estimate of the whole). At the end each slab is read back on
its own, sorted, and given out; a slab holds every row of its time range, and the first key is the
time, so the slabs in turn are the whole sorted. Within a slab the rows are in the order they came,
so the stable sort of each slab is the stable sort of all. A part is cut into slabs by slicing
where its rows come in runs of time order (a few files' rows, each file's in time order), by a
stable sort on the slab where they do not. Memory: about one buffer of parts
(``flush_bytes``) while adding, one slab and its sorted copy while giving out.

A telemetry day at 30-second samples is about 0.8 GB of Arrow at 1,000 GPUs and 8 GB at 10,000:
held whole, with its sorted copy, it cannot stay within the pipeline's memory budget.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.lib.db import ENV_TEMP_DIR
from gpu_pipeline.lib.schemas import sorted_rows

__all__ = ["MEMORY_BYTES", "SLAB_BYTES", "TimeSlabSorter"]

#: Parts held in memory and sorted together, up to this many bytes; past it, rows are spilled.
MEMORY_BYTES = 64 << 20
#: About this many bytes of rows per slab of the spill file (a slab is sorted in memory on its own:
#: read, sorted and written out, a slab is held about three times).
SLAB_BYTES = 48 << 20
#: Parts gathered before they are cut into slabs and written (fewer, larger spill batches).
FLUSH_BYTES = 32 << 20
MAX_SLABS = 4096
#: A part whose rows fall back in time this often or more is cut into slabs by a sort, not by slices.
MAX_RUNS = 256
ROWS_PER_BATCH = 1 << 16


class TimeSlabSorter:
    """Rows of ``schema`` with ``keys[0]`` a timestamp column, all within [start_us, end_us)
    (microseconds since the epoch; a row outside goes to the first or last slab, still sorted).
    The spill file goes in ``spill_dir``, else ``GPU_PIPELINE_DUCKDB_TEMP_DIR``, else the system's
    temp directory."""

    def __init__(self, schema: pa.Schema, keys: Sequence[str], start_us: int, end_us: int, *,
                 expected_bytes: int = 0, spill_dir: str | Path | None = None,
                 memory_bytes: int = MEMORY_BYTES, slab_bytes: int = SLAB_BYTES, flush_bytes: int = FLUSH_BYTES):
        if not keys or not pa.types.is_timestamp(schema.field(keys[0]).type):
            raise ValueError(f"the first sort key must be a timestamp column of the schema, got {keys!r}")
        if end_us <= start_us:
            raise ValueError(f"empty window: {start_us} .. {end_us}")
        self.schema, self.keys = schema, tuple(keys)
        self.start_us, self.end_us = int(start_us), int(end_us)
        self.expected_bytes, self.spill_dir = expected_bytes, spill_dir
        self.memory_bytes, self.slab_bytes, self.flush_bytes = memory_bytes, slab_bytes, flush_bytes
        self.rows = 0
        self.spilled_rows = 0
        self.slabs = 0  #: 0 while nothing is spilled
        self.parts_sorted = 0  #: spilled parts cut into slabs by a sort (not in runs of time order)
        self._held: list[pa.Table] = []
        self._held_bytes = 0
        self._dir: Path | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._batches: list[list[int]] = []  # per slab: the spill file's batch numbers, in order
        self._written = 0
        self._done = False

    # -- adding --------------------------------------------------------------------------------
    def add(self, table: pa.Table) -> None:
        if self._done:
            raise RuntimeError("rows added after sorted_batches()")
        if not table.num_rows:
            return
        table = table.select(self.schema.names).cast(self.schema)
        if table[self.keys[0]].null_count:
            raise ValueError(f"{table[self.keys[0]].null_count} row(s) without a {self.keys[0]}: "
                             "a row needs its time to be given a slab")
        self.rows += table.num_rows
        self._held.append(table)
        self._held_bytes += table.nbytes
        if self.slabs:
            if self._held_bytes >= self.flush_bytes:
                self._flush()
        elif self._held_bytes > self.memory_bytes:
            self._start_spill()
            self._flush()

    def _start_spill(self) -> None:
        whole = max(self.expected_bytes, self._held_bytes)
        self.slabs = min(MAX_SLABS, max(2, math.ceil(whole / self.slab_bytes)))
        self._batches = [[] for _ in range(self.slabs)]
        where = self.spill_dir or os.environ.get(ENV_TEMP_DIR) or None  # DuckDB's spill folder, else the system's
        if where is not None:
            Path(where).mkdir(parents=True, exist_ok=True)
        self._dir = Path(tempfile.mkdtemp(prefix="gpu_pipeline_spill_", dir=where))
        self._writer = pa.ipc.new_file(str(self._dir / "rows.arrow"), self.schema)

    def _slab_of(self, times: pa.ChunkedArray) -> np.ndarray:
        us = pc.cast(times, pa.int64()).to_numpy()
        width = -(-(self.end_us - self.start_us) // self.slabs)
        return np.clip((us - self.start_us) // width, 0, self.slabs - 1)

    def _flush(self) -> None:
        held, self._held, self._held_bytes = self._held, [], 0
        pieces: dict[int, list[pa.Table]] = {}  # per slab: its rows of the held parts, in arrival order
        for table in held:
            slab = self._slab_of(table[self.keys[0]])
            falls = np.flatnonzero(slab[1:] < slab[:-1]) + 1
            if len(falls) < MAX_RUNS:
                # a part is a few files' rows, each file's in time order: each run in slab order is
                # cut into slabs by slicing, without a copy or a sort
                edges = np.concatenate(([0], falls, [len(slab)]))
                for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
                    cuts = a + np.searchsorted(slab[a:b], np.arange(self.slabs + 1))
                    for s in np.flatnonzero(np.diff(cuts)).tolist():
                        pieces.setdefault(s, []).append(table.slice(int(cuts[s]), int(cuts[s + 1] - cuts[s])))
                continue
            # rows in no useful order: sorted by slab (stable), each slab's rows taken
            self.parts_sorted += 1
            table = table.combine_chunks()  # takes from a table of many chunks cost several times more
            order = np.argsort(slab, kind="stable")
            bounds = np.searchsorted(slab[order], np.arange(self.slabs + 1))
            for s in np.flatnonzero(np.diff(bounds)).tolist():
                pieces.setdefault(s, []).append(table.take(pa.array(order[bounds[s]:bounds[s + 1]])))
        assert self._writer is not None
        for s in sorted(pieces):  # each slab's pieces copied together once, written as one batch
            for batch in pa.concat_tables(pieces[s]).combine_chunks().to_batches():
                self._writer.write_batch(batch)
                self._batches[s].append(self._written)
                self._written += 1
            self.spilled_rows += sum(piece.num_rows for piece in pieces[s])

    # -- giving out ----------------------------------------------------------------------------
    def sorted_batches(self) -> Iterator[pa.RecordBatch]:
        """All rows added, sorted; once."""
        if self._done:
            raise RuntimeError("sorted_batches() called twice")
        self._done = True
        try:
            if not self.slabs:
                held = pa.concat_tables(self._held) if self._held else self.schema.empty_table()
                self._held = []
                yield from sorted_rows(held, self.keys).to_batches(ROWS_PER_BATCH)
                return
            if self._held:
                self._flush()
            assert self._writer is not None and self._dir is not None
            self._writer.close()
            self._writer = None
            with pa.OSFile(str(self._dir / "rows.arrow")) as source:
                reader = pa.ipc.open_file(source)
                for numbers in self._batches:
                    if not numbers:
                        continue
                    slab = pa.Table.from_batches([reader.get_batch(i) for i in numbers], schema=self.schema)
                    yield from sorted_rows(slab, self.keys).to_batches(ROWS_PER_BATCH)
                    del slab
        finally:
            self.close()

    def close(self) -> None:
        """Drop the held rows and the spill file (also on error)."""
        self._held = []
        if self._writer is not None:
            try:
                self._writer.close()
            except (OSError, pa.ArrowException):
                pass
            self._writer = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> TimeSlabSorter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
