"""Clean raw slot snapshot rows into the typed ``clean/slot_snapshots`` table.

One row per snapshot x slot x GPU. Rules:
- tier: ``backfill`` if the slot name contains "backfill" (case-insensitive), else ``priority`` if
  PrioritizedProjects is non-empty, else ``shared`` (open capacity);
- host: ``Machine``, else the part of ``Name`` after the last '@';
- GPU ids are normalized to the HTCondor short id ``GPU-xxxxxxxx`` (a full UUID or the ClassAd
  reference form ``GPUs_GPU_xxxxxxxx`` is shortened); MIG ids are kept as they are;
- rows of excluded hosts (shell-style patterns) are dropped and counted per host;
- rows with no slot name, no state or no GPU id are quarantined with the reason;
- exact duplicate rows (a snapshot written twice) are dropped and counted.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, QUARANTINE, conform

_SHORT_RE = re.compile(r"^(?:GPUs_)?GPU[-_]([0-9a-fA-F]{8})(?:[-_][0-9a-fA-F-]+)?$")


def normalize_gpu_id(raw: str | None) -> str | None:
    """``GPU-0667ce7c`` from any of its spellings; MIG and other ids unchanged; blank -> None."""
    if raw is None:
        return None
    s = raw.strip().strip("{}").strip()
    if not s:
        return None
    if "MIG" in s.upper():
        return s.removeprefix("GPUs_")
    m = _SHORT_RE.match(s)
    if m:
        return "GPU-" + m.group(1).lower()
    return s


@dataclass
class CleanResult:
    table: pa.Table | None  #: the clean rows; None when they went to ``sink`` instead
    quarantine: pa.Table
    rows_in: int = 0
    rows_out: int = 0
    gpus: int = 0  #: distinct GPU ids among the clean rows
    duplicate_keys: int = 0  #: clean rows beyond the first per (snapshot_utc, slot_name, gpu_id)
    written: object = None  #: what ``sink`` returned
    excluded_by_host: dict[str, int] = field(default_factory=dict)
    duplicates_dropped: int = 0
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    usage_out_of_range_nulled: int = 0  #: GPUsAverageUsage outside 0..1 (kept row, value set null)


def _host(name: str | None, machine: str | None) -> str | None:
    if isinstance(machine, str) and machine.strip():
        return machine.strip()
    return name.rsplit("@", 1)[-1] if name and "@" in name else None


def _excluded(host: str | None, patterns: list[str]) -> bool:
    return bool(host) and any(fnmatch.fnmatchcase(host.lower(), p.lower()) for p in patterns)


def _lookup(con: duckdb.DuckDBPyConnection, name: str, rows: dict[str, list]) -> None:
    con.register(name, pa.table(rows))


_BAD = "\ufffd"


#: The raw columns :func:`clean_slot_rows` reads (the asset reads only these; quarantined rows are
#: re-read whole through ``full_rows``).
CLEAN_INPUT_COLUMNS = [
    "snapshot_utc", "Name", "Machine", "AssignedGPUs", "State", "PrioritizedProjects", "GPUs_DeviceName",
    "GPUs_GlobalMemoryMb", "GPUsAverageUsage", "RemoteOwner", "GlobalJobId", "PreventJobsReason",
]
#: Of those, the repetitive text worth reading dictionary-encoded.
DICTIONARY_COLUMNS = ["Name", "Machine", "AssignedGPUs", "State", "PrioritizedProjects", "GPUs_DeviceName"]


_CLEAN_COLUMNS = """
    snapshot_utc,
    host_n AS host,
    trim("Name") AS slot_name,
    gpu_id_n AS gpu_id,
    CASE WHEN lower("Name") LIKE '%backfill%' THEN 'backfill'
         WHEN coalesce(trim("PrioritizedProjects"), '') <> '' THEN 'priority'
         ELSE 'shared' END AS tier,
    lower("Name") LIKE '%backfill%' AS is_backfill_slot,
    trim("State") AS slot_state,
    nullif(trim("GPUs_DeviceName"), '') AS device_name,
    CAST(round("GPUs_GlobalMemoryMb") AS BIGINT) AS gpu_memory_mib,
    coalesce(trim("PrioritizedProjects"), '') AS prioritized_projects,
    CASE WHEN "GPUsAverageUsage" BETWEEN 0 AND 1 THEN "GPUsAverageUsage" * 100.0 END AS gpu_usage_pct,
    nullif(trim("RemoteOwner"), '') AS remote_owner,
    nullif(trim("GlobalJobId"), '') AS global_job_id,
    nullif(trim("PreventJobsReason"), '') AS prevent_jobs_reason"""
_KEPT = "NOT excluded AND reason IS NULL AND row_i >= $lo AND row_i < $hi"
# Every (snapshot, slot name, GPU) once: no copies to drop, and the order numbers sort like the text.
_CLEAN_UNIQUE_SQL = f"SELECT {_CLEAN_COLUMNS} FROM classified WHERE {_KEPT} ORDER BY snapshot_utc, host_no, name_no, gpu_no"
# Some key repeated: exact copies dropped; rows that differ are all kept (sorted on every column,
# so their order is fixed too).
_CLEAN_DISTINCT_SQL = f"SELECT DISTINCT {_CLEAN_COLUMNS} FROM classified WHERE {_KEPT} ORDER BY ALL"


def _chunks(snapshots: pa.ChunkedArray, rows: int, repeated: set[int]) -> list[tuple[int, int, bool]]:
    """Row ranges ``(lo, hi, exact)`` of about ``rows`` rows that never split a snapshot, when the raw
    rows come in snapshot order (as the archive and the collector write them), else one range of
    everything; ``exact`` when the range holds a snapshot of ``repeated`` (epoch microseconds)."""
    n = len(snapshots)
    if n == 0:
        return []
    if snapshots.null_count:
        return [(0, n, bool(repeated))]
    ts = snapshots.cast(pa.int64()).to_numpy()
    bounds = [0, n]
    if bool(np.all(ts[1:] >= ts[:-1])):
        bounds = [0]
        while bounds[-1] + rows < n:
            # the first row of the snapshot that row ``bounds[-1] + rows`` belongs to
            cut = int(np.searchsorted(ts, ts[bounds[-1] + rows], side="left"))
            if cut <= bounds[-1]:  # one snapshot larger than ``rows``: cut after it
                cut = int(np.searchsorted(ts, ts[bounds[-1] + rows], side="right"))
            bounds.append(cut)
        if bounds[-1] < n:
            bounds.append(n)
    marks = np.array(sorted(repeated), dtype=np.int64)
    return [(lo, hi, bool(np.isin(ts[lo:hi], marks).any())) for lo, hi in zip(bounds[:-1], bounds[1:], strict=False)]


class _CleanOutput:
    """The clean rows, chunk by chunk in table order: each chunk sorted on (snapshot, host, slot name,
    GPU id), so the chunks one after another are the whole table's order. Counts as it goes."""

    def __init__(self, con: duckdb.DuckDBPyConnection, chunks: list[tuple[int, int, bool]], batch_rows: int):
        self.con, self.chunks, self.batch_rows = con, chunks, batch_rows
        self.rows = 0
        self.duplicate_keys = 0

    def batches(self) -> Iterator[pa.RecordBatch]:
        for lo, hi, exact in self.chunks:
            params = {"lo": lo, "hi": hi}
            if exact:
                sql = _CLEAN_DISTINCT_SQL
                [(keys,)] = self.con.sql(
                    f"SELECT count(DISTINCT (snapshot_utc, slot_name, gpu_id)) FROM ({sql})", params=params
                ).fetchall()
            else:
                sql, keys = _CLEAN_UNIQUE_SQL, None
            n = 0
            for batch in self.con.sql(sql, params=params).to_arrow_reader(self.batch_rows):
                n += batch.num_rows
                yield from conform(pa.Table.from_batches([batch]), CLEAN_SLOT_SNAPSHOTS).to_batches()
            self.rows += n
            if keys is not None:
                self.duplicate_keys += n - keys


def clean_slot_rows(
    raw: pa.Table,
    excluded_hosts: list[str] | None = None,
    full_rows: Callable[[list[int]], pa.Table] | None = None,
    sink: Callable[[Iterator[pa.RecordBatch]], object] | None = None,
    batch_rows: int = 1_000_000,
) -> CleanResult:
    """Turn raw snapshot rows (``raw/condor_slot_snapshots`` schema, or at least
    :data:`CLEAN_INPUT_COLUMNS`, string columns possibly dictionary-encoded) into the clean table.

    The Python rules (host, GPU id spelling, host exclusion) run once per distinct value; the rows
    themselves are classified, typed, de-duplicated and sorted in DuckDB (which spills to disk
    under its memory limit). ``full_rows(indices)`` gives the complete raw rows for the quarantine
    (default: ``raw.take``).

    With ``sink``, the clean rows are not gathered into one table: ``sink`` receives an iterator of
    record batches (``batch_rows`` each, the clean schema, in table order) and what it returns is
    kept in ``written`` (e.g. ``Store.write_partition_batches``); ``table`` is then None. Memory
    stays at about one batch however large the day is."""
    patterns = [p.strip() for p in (excluded_hosts or []) if p.strip()]
    con = db_connect()
    try:
        con.register("raw_rows", raw.append_column("row_i", pa.array(np.arange(raw.num_rows, dtype=np.int64))))
        pairs = con.sql('SELECT DISTINCT "Name"::VARCHAR, "Machine"::VARCHAR FROM raw_rows').fetchall()
        names, machines = [p[0] for p in pairs], [p[1] for p in pairs]
        hosts = [_host(n, m) for n, m in pairs]
        assigned = [r[0] for r in con.sql('SELECT DISTINCT "AssignedGPUs"::VARCHAR FROM raw_rows').fetchall()]
        _lookup(con, "host_map", {
            "name": pa.array(names, pa.string()), "machine": pa.array(machines, pa.string()),
            "host": pa.array(hosts, pa.string()),
            "excluded": pa.array([_excluded(h, patterns) for h in hosts], pa.bool_()),
        })
        _lookup(con, "gpu_map", {"assigned": pa.array(assigned, pa.string()),
                                 "gpu_id": pa.array([normalize_gpu_id(g) for g in assigned], pa.string())})
        # Order numbers of host, slot name and GPU id (DuckDB's own order of the strings), so the
        # clean rows sort on integers.
        con.execute("""CREATE TEMP TABLE host_no AS SELECT name, machine, host, excluded,
                           dense_rank() OVER (ORDER BY host) AS host_no,
                           dense_rank() OVER (ORDER BY trim(name)) AS name_no FROM host_map""")
        con.execute("CREATE TEMP TABLE gpu_no AS SELECT *, dense_rank() OVER (ORDER BY gpu_id) AS gpu_no FROM gpu_map")
        # The rows classified as a view over the raw Arrow table, not a copy: the queries below and the
        # output each join the raw rows to the small maps again, which costs about what copying them
        # did at 1,000 GPUs, while a copy of a 10,000-GPU day (5.5 M rows with their text) filled
        # DuckDB's memory and spilled (peak RSS of cleaning alone 2.36 -> 1.85 GB).
        con.execute(
            f"""
            CREATE TEMP VIEW classified AS
            SELECT r.row_i, r.snapshot_utc, r."Name", r."State", r."PrioritizedProjects", r."GPUs_DeviceName",
                   r."GPUs_GlobalMemoryMb", r."GPUsAverageUsage", r."RemoteOwner", r."GlobalJobId",
                   r."PreventJobsReason", h.host AS host_n, g.gpu_id AS gpu_id_n, h.excluded,
                   h.host_no, h.name_no, g.gpu_no,
                   CASE
                     WHEN contains(coalesce(r."Name", ''), '{_BAD}') OR contains(coalesce(h.host, ''), '{_BAD}')
                       OR contains(coalesce(g.gpu_id, ''), '{_BAD}') OR contains(coalesce(r."State", ''), '{_BAD}')
                     THEN 'non-UTF-8 bytes in ' || concat_ws(', ',
                         CASE WHEN contains(r."Name", '{_BAD}') THEN 'Name' END,
                         CASE WHEN contains(h.host, '{_BAD}') THEN 'Machine' END,
                         CASE WHEN contains(g.gpu_id, '{_BAD}') THEN 'AssignedGPUs' END,
                         CASE WHEN contains(r."State", '{_BAD}') THEN 'State' END)
                     WHEN coalesce(r."Name", '') = '' THEN 'missing slot Name'
                     WHEN coalesce(h.host, '') = '' THEN 'no host (Machine empty and Name has no ''@'')'
                     WHEN coalesce(r."State", '') = '' THEN 'missing State'
                     WHEN g.gpu_id IS NULL THEN 'no GPU id in AssignedGPUs'
                   END AS reason
            FROM raw_rows r
            LEFT JOIN host_no h ON r."Name" IS NOT DISTINCT FROM h.name AND r."Machine" IS NOT DISTINCT FROM h.machine
            LEFT JOIN gpu_no g ON r."AssignedGPUs" IS NOT DISTINCT FROM g.assigned
            """
        )
        excluded = dict(con.sql(
            "SELECT host_n, count(*) FROM classified WHERE excluded GROUP BY host_n ORDER BY host_n"
        ).fetchall()) if patterns else {}
        q_idx, q_reason = [], []
        for i, reason in con.sql(
            "SELECT row_i, reason FROM classified WHERE NOT excluded AND reason IS NOT NULL ORDER BY row_i"
        ).fetchall():
            q_idx.append(i)
            q_reason.append(reason)
        [(kept_rows, usage_out_of_range, gpus)] = con.sql(
            """SELECT count(*), count(*) FILTER (WHERE "GPUsAverageUsage" < 0 OR "GPUsAverageUsage" > 1),
                      count(DISTINCT gpu_no)
               FROM classified WHERE NOT excluded AND reason IS NULL"""
        ).fetchall()
        # Snapshots in which one (slot name, GPU) has several rows: exact copies are dropped there
        # (DISTINCT), and different rows are kept and counted as duplicate keys.
        # (grouped on a hash of the key: a collision only sends a snapshot to the exact DISTINCT path)
        repeated: set[int] = set()
        for lo, hi in con.sql(
            """SELECT min(epoch_us(snapshot_utc)), max(epoch_us(snapshot_utc)) FROM classified
               WHERE NOT excluded AND reason IS NULL
               GROUP BY hash(snapshot_utc, name_no, gpu_no) HAVING count(*) > 1"""
        ).fetchall():
            repeated.update((lo, hi))
        rows_in = raw.num_rows
        if q_idx and full_rows is not None:
            quarantine = quarantine_rows(full_rows(q_idx), list(range(len(q_idx))), q_reason, "raw/condor_slot_snapshots")
        else:
            quarantine = quarantine_rows(raw, q_idx, q_reason, "raw/condor_slot_snapshots")
        out = _CleanOutput(con, _chunks(raw.column("snapshot_utc"), batch_rows, repeated), batch_rows)
        table, written = None, None
        if sink is None:
            table = pa.Table.from_batches(list(out.batches()), schema=CLEAN_SLOT_SNAPSHOTS.schema)
        else:
            written = sink(out.batches())
    finally:
        con.close()

    return CleanResult(
        table=table,
        quarantine=quarantine,
        rows_in=rows_in,
        rows_out=out.rows,
        gpus=gpus,
        duplicate_keys=out.duplicate_keys,
        written=written,
        excluded_by_host=excluded,
        duplicates_dropped=kept_rows - out.rows,
        quarantined_by_reason=dict(sorted(Counter(q_reason).items())),
        usage_out_of_range_nulled=usage_out_of_range,
    )


def quarantine_rows(raw: pa.Table, idx: list[int], reasons: list[str], source_table: str) -> pa.Table:
    """Rows set aside with the reason, as JSON text, in the ``quarantine`` schema."""
    import json

    if not idx:
        return QUARANTINE.empty()
    picked = raw.take(pa.array(idx, type=pa.int64())).to_pylist()
    files = [r.get("source_file") for r in picked]
    rowids = [r.get("source_rowid") for r in picked]
    snap = [r.get("snapshot_utc") for r in picked]
    payload = [json.dumps(r, default=str, sort_keys=True) for r in picked]
    return pa.Table.from_pydict(
        {
            "source_table": [source_table] * len(idx),
            "reason": reasons,
            "source_file": files,
            "source_row": rowids,
            "record_utc": snap,
            "row_json": payload,
        },
        schema=QUARANTINE.schema,
    )
