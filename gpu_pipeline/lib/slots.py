"""Clean raw slot snapshot rows into the typed ``clean/slot_snapshots`` table.

One row per snapshot x slot x GPU. Rules:
- tier: ``backfill`` if the slot name contains "backfill" (case-insensitive), else ``priority`` if
  PrioritizedProjects is non-empty, else ``shared`` (open capacity);
- host: ``Machine``, else the part of ``Name`` after the last '@';
- GPU ids are normalized to the HTCondor short id ``GPU-xxxxxxxx`` (a full UUID or the ClassAd
  reference form ``GPUs_GPU_xxxxxxxx`` is shortened); MIG ids are kept as they are, but for the
  reference form (``GPUs_MIG_0caf1ce3_fcd4_...`` -> ``MIG-0caf1ce3-fcd4-...``, as the collector names it);
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
import pyarrow.compute as pc

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.prefetch import Prefetch
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, QUARANTINE, conform

_SHORT_RE = re.compile(r"^(?:GPUs_)?GPU[-_]([0-9a-fA-F]{8})(?:[-_][0-9a-fA-F-]+)?$")


def normalize_gpu_id(raw: str | None) -> str | None:
    """``GPU-0667ce7c`` from any of its spellings; a ClassAd reference (``GPUs_MIG_0caf1ce3_fcd4_...``,
    ``GPUs_GPU_MIG_3167``) as its device's id (``MIG-0caf1ce3-fcd4-...``, ``GPU-MIG-3167``, as the
    collector, the job ads and NVML name it); other MIG and other ids unchanged; blank -> None, and so is
    a list of several ids (``GPU-aaaaaaaa,GPU-bbbbbbbb``: a row is one slot and one GPU); blank parts
    between commas (``GPU-aaaaaaaa,``, ``{GPU-aaaaaaaa}, ,``) are dropped."""
    parts = _id_parts(raw)
    return _normalize_part(parts[0]) if len(parts) == 1 else None  # none, or several: one slot, one GPU


def _normalize_part(s: str) -> str:
    """:func:`normalize_gpu_id` of one id (no comma, braces or spaces around it)."""
    if "MIG" in s.upper():
        return s[len("GPUs_"):].replace("_", "-") if s.startswith("GPUs_") else s
    m = _SHORT_RE.match(s)
    if m:
        return "GPU-" + m.group(1).lower()
    return s


def _id_parts(raw: str | None) -> list[str]:
    """The non-blank parts of an AssignedGPUs text between commas, each without braces and spaces."""
    if raw is None:
        return []
    return [part for part in (p.strip().strip("{}").strip() for p in raw.split(",")) if part]


def _read_ids(values: list[str | None]) -> tuple[list[str | None], list[bool]]:
    """Per AssignedGPUs text (the distinct values, for both cleaning paths): its GPU id
    (:func:`normalize_gpu_id`), and whether it names several GPUs (a list a collector did not explode),
    each text split once."""
    ids, several = [], []
    for raw in values:
        parts = _id_parts(raw)
        ids.append(_normalize_part(parts[0]) if len(parts) == 1 else None)
        several.append(len(parts) > 1)
    return ids, several


def _distinct_hosts(names: list[str]) -> set[str]:
    """Host names that are different machines: compared in any case, a short name and the full name it
    begins (``gpu01`` and ``gpu01.example.org``) being one; an IP address and other full names whole."""
    lower = {n.lower() for n in names if n}
    return {h for h in lower if not any(g != h and g.startswith(h + ".") for g in lower)}


def gpu_id_collisions(con: duckdb.DuckDBPyConnection, from_sql: str, params: list | None = None,
                      limit: int = 20) -> tuple[int, dict[str, dict]]:
    """GPU ids that slots of two or more hosts name in one snapshot, from the clean slot rows
    ``from_sql``: two boards whose HTCondor short ids (``GPU-`` and 8 hex digits of the UUID) are the
    same, HTCondor 9.1's 4-hex MIG ids, or one board that two hosts advertise (a GPU shared by
    time-slicing), which the states and every table keyed by ``gpu_id`` read as one GPU. Hosts are
    compared in any case, a short name and the full name it begins being one host
    (:func:`_distinct_hosts`). A GPU moved between hosts in the day is no collision: each snapshot
    names it on one host. Returns how many ids collide and ``{gpu_id: {"hosts": [...],
    "snapshots": n}}`` for at most ``limit`` of them (by id). The first pass groups the day by GPU
    only; the ids on several hosts are then read per snapshot."""
    moved = [r[0] for r in con.execute(
        f"SELECT gpu_id FROM {from_sql} GROUP BY gpu_id HAVING count(DISTINCT lower(host)) > 1",
        params or []).fetchall()]
    if not moved:
        return 0, {}
    found: dict[str, dict] = {}
    for gpu, hosts in con.execute(
            f"""SELECT gpu_id, list(DISTINCT lower(host)) FROM {from_sql} WHERE list_contains(?, gpu_id)
                GROUP BY snapshot_utc, gpu_id HAVING count(DISTINCT lower(host)) > 1""",
            [*(params or []), moved]).fetchall():
        machines = _distinct_hosts(hosts)
        if len(machines) > 1:
            entry = found.setdefault(gpu, {"hosts": set(), "snapshots": 0})
            entry["hosts"] |= machines
            entry["snapshots"] += 1
    return len(found), {g: {"hosts": sorted(found[g]["hosts"]), "snapshots": found[g]["snapshots"]}
                        for g in sorted(found)[:limit]}


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

# Why a row is quarantined, in the order the rules are checked (both paths give these texts; a
# replacement character in any identity column comes first, as "non-UTF-8 bytes in <columns>").
_MISSING_NAME = "missing slot Name"
_NO_HOST = "no host (Machine empty and Name has no '@')"
_MISSING_STATE = "missing State"
_NO_GPU = "no GPU id in AssignedGPUs"
_SEVERAL_GPUS = "several GPU ids in AssignedGPUs (a row is one slot and one GPU)"
_NON_UTF8 = "non-UTF-8 bytes in "


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


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


def _codes(column: pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """The distinct values of ``column`` (a string array whose last entry is null) and each row's
    index into them (of the dictionary's index type, int32 as read)."""
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    column = column.unify_dictionaries()
    if column.num_chunks == 0:
        return pa.array([None], pa.string()), np.zeros(0, dtype=np.int32)
    values = column.chunk(0).dictionary.cast(pa.string())
    null = pa.scalar(len(values), column.type.index_type)
    codes = np.concatenate([pc.fill_null(c.indices, null).to_numpy() for c in column.chunks])
    return pa.concat_arrays([values, pa.array([None], pa.string())]), codes


def _per_value(con: duckdb.DuckDBPyConnection, values: pa.Array, select: str) -> dict[str, np.ndarray | pa.Array]:
    """``select`` (SQL over the column ``v``) evaluated once per entry of ``values``, in their order:
    numeric and boolean results as numpy arrays, text as Arrow arrays."""
    con.register("per_value", pa.table({"i": pa.array(np.arange(len(values))), "v": values}))
    out = con.sql(f"SELECT {select} FROM per_value ORDER BY i").to_arrow_table()
    con.unregister("per_value")
    return {name: (col.combine_chunks() if pa.types.is_string(col.type) else col.to_numpy())
            for name, col in zip(out.column_names, out.columns, strict=True)}


def _round_half_away(values: np.ndarray) -> np.ndarray:
    """SQL ``round(x)`` of doubles: the nearest integer, halves away from zero (exactly: the fraction
    is taken, not added to)."""
    whole = np.trunc(values)
    return whole + np.where(np.abs(values - whole) >= 0.5, np.sign(values), 0.0)


# Raw text columns read as nullif(trim(...), '') into the clean column named.
_FREE_TEXT = {"RemoteOwner": "remote_owner", "GlobalJobId": "global_job_id", "PreventJobsReason": "prevent_jobs_reason"}

_MEMORY_LIMIT = 2.0 ** 63  # CAST(... AS BIGINT) fails at and beyond this; the SQL path raises then


@dataclass
class _Columnar:
    """The clean table of a day planned with numpy over the raw rows' dictionary codes (see
    :func:`_columnar`): ``order`` is the raw rows of the clean table in its order, the other arrays
    how each clean column is made of the raw rows (taken a batch at a time)."""

    order: np.ndarray
    columns: dict[str, Callable[[np.ndarray], pa.Array]]  #: each clean column of the raw rows given
    excluded_by_host: dict[str, int]
    q_idx: list[int]
    q_reason: list[str]
    usage_out_of_range: int
    gpus: int

    def batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        for lo in range(0, len(self.order), batch_rows):
            rows = self.order[lo:lo + batch_rows]
            out = {name: column(rows) for name, column in self.columns.items()}
            yield from conform(pa.table(out), CLEAN_SLOT_SNAPSHOTS).to_batches()


def _columnar(raw: pa.Table, patterns: list[str]) -> _Columnar | None:
    """The clean table planned without moving the rows through SQL: every rule of a text column is
    evaluated once per distinct value (in DuckDB, with the SQL path's own expressions; host and GPU id
    by the Python rules), the rows carry only integer codes, and the output order is a numpy sort of
    those codes. None where the SQL path must decide: a repeated (snapshot, slot name, GPU) among
    the clean rows (copies to drop, different rows to keep), a null snapshot time, or a memory
    value that does not cast to an integer (the SQL path raises its error)."""
    n = raw.num_rows
    if n == 0 or raw.column("snapshot_utc").null_count:
        return None
    con = db_connect()
    try:
        names, name_code = _codes(raw.column("Name"))
        machines, machine_code = _codes(raw.column("Machine"))
        assigned, assigned_code = _codes(raw.column("AssignedGPUs"))
        states, state_code = _codes(raw.column("State"))
        projects, project_code = _codes(raw.column("PrioritizedProjects"))
        # hosts: per distinct (Name, Machine)
        pair_dict = pc.dictionary_encode(pa.array(name_code.astype(np.int64) * len(machines) + machine_code))
        pairs, pair_code = pair_dict.dictionary.to_numpy(), pair_dict.indices.to_numpy()
        name_list, machine_list = names.to_pylist(), machines.to_pylist()
        hosts = [_host(name_list[k // len(machines)], machine_list[k % len(machines)]) for k in pairs.tolist()]
        host_excluded = np.array([_excluded(h, patterns) for h in hosts], dtype=bool)
        host = _per_value(con, pa.array(hosts, pa.string()), f"""
            v AS host, coalesce(v, '') = '' AS missing, contains(coalesce(v, ''), '{_BAD}') AS bad,
            dense_rank() OVER (ORDER BY v) AS no""")
        name = _per_value(con, names, f"""
            trim(v) AS slot_name, coalesce(lower(v) LIKE '%backfill%', false) AS backfill,
            coalesce(trim(v), '') = '' AS missing, contains(coalesce(v, ''), '{_BAD}') AS bad,
            dense_rank() OVER (ORDER BY trim(v)) AS no""")
        assigned_list = assigned.to_pylist()
        ids, several_list = _read_ids(assigned_list)
        gpu_ids = pa.array(ids, pa.string())
        several = np.array(several_list, dtype=bool)
        gpu = _per_value(con, gpu_ids, f"""
            v AS gpu_id, v IS NULL AS missing, contains(coalesce(v, ''), '{_BAD}') AS bad,
            dense_rank() OVER (ORDER BY v) AS no""")
        state = _per_value(con, states, f"""
            trim(v) AS slot_state, coalesce(trim(v), '') = '' AS missing, contains(coalesce(v, ''), '{_BAD}') AS bad""")
        project = _per_value(con, projects, """
            coalesce(trim(v), '') AS prioritized_projects, coalesce(trim(v), '') <> '' AS prioritized""")
        # the device name and the free text: nullif(trim(...), ''), once per distinct value
        blank_to_null = {}
        for col in ("GPUs_DeviceName", *_FREE_TEXT):
            values, codes = _codes(raw.column(col))
            blank_to_null[col] = (_per_value(con, values, "nullif(trim(v), '') AS v")["v"], codes)
    finally:
        con.close()

    row_host = pair_code
    bad = {"Name": name["bad"][name_code], "Machine": host["bad"][row_host],
           "AssignedGPUs": gpu["bad"][assigned_code], "State": state["bad"][state_code]}
    any_bad = bad["Name"] | bad["Machine"] | bad["AssignedGPUs"] | bad["State"]
    missing = [(_MISSING_NAME, name["missing"][name_code]), (_NO_HOST, host["missing"][row_host]),
               (_MISSING_STATE, state["missing"][state_code]), (_SEVERAL_GPUS, several[assigned_code]),
               (_NO_GPU, gpu["missing"][assigned_code])]
    flagged = any_bad.copy()
    for _, mask in missing:
        flagged |= mask
    excluded = host_excluded[row_host]
    q_idx = np.flatnonzero(flagged & ~excluded)
    q_reason = []
    for i in q_idx.tolist():
        if any_bad[i]:
            q_reason.append(_NON_UTF8 + ", ".join(c for c, mask in bad.items() if mask[i]))
        else:
            q_reason.append(next(reason for reason, mask in missing if mask[i]))
    kept = np.flatnonzero(~flagged & ~excluded)

    # The clean rows' order, (snapshot, host, slot name, GPU id), as one integer key of their ranks.
    snap_us = raw.column("snapshot_utc").cast(pa.int64()).to_numpy()[kept]
    step = np.diff(snap_us)
    if (step >= 0).all():  # in snapshot order, as the archive and the collector write them
        snap_no = np.concatenate(([0], np.cumsum(step > 0)))[:len(snap_us)]
    else:
        snap_no = np.unique(snap_us, return_inverse=True)[1]
    ranks = [(snap_no, int(snap_no.max(initial=0)) + 1), (host["no"][row_host[kept]], len(hosts) + 1),
             (name["no"][name_code[kept]], len(names) + 1), (gpu["no"][assigned_code[kept]], len(gpu_ids) + 1)]
    span = 1
    for _, size in ranks:
        span *= size
    if span >= 2 ** 63:
        return None  # too many distinct values for one 64-bit key (far beyond any pool)
    key = np.zeros(len(kept), dtype=np.int64)
    for values, size in ranks:
        key = key * size + values
    by_key = np.argsort(key, kind="stable")
    key = key[by_key]
    # A repeated (snapshot, slot name, GPU id): rows next to each other with the same key where no
    # slot name has two hosts, else rows with the same key once the host is taken out of it.
    pair_name_no = name["no"][pairs // len(machines)]
    name_host = np.unique(pair_name_no * (len(hosts) + 1) + host["no"])
    if len(name_host) == len(np.unique(pair_name_no)):
        repeated = bool((np.diff(key) == 0).any())
    else:
        snap, _, name_no, gpu_no = (values for values, _ in ranks)
        without_host = np.sort((snap * (len(names) + 1) + name_no) * (len(gpu_ids) + 1) + gpu_no)
        repeated = bool((np.diff(without_host) == 0).any())
    if repeated:
        return None
    order = kept[by_key]
    memory_col = raw.column("GPUs_GlobalMemoryMb")
    kept_memory = memory_col.take(pa.array(kept)).drop_null().to_numpy()
    if not (np.isfinite(kept_memory) & (np.abs(kept_memory) < _MEMORY_LIMIT)).all():
        return None

    usage_col = raw.column("GPUsAverageUsage")
    usage_valid = ~pc.is_null(usage_col).to_numpy(zero_copy_only=False)
    usage = usage_col.to_numpy()  # nulls read as NaN; a NaN value counts as out of range (above 1 in SQL)
    with np.errstate(invalid="ignore"):
        out_of_range = usage_valid & ~((usage >= 0) & (usage <= 1))
    tier_code = np.where(name["backfill"][name_code], 0, np.where(project["prioritized"][project_code], 1, 2))

    def by_code(values: pa.Array, codes: np.ndarray) -> Callable[[np.ndarray], pa.Array]:
        return lambda rows: values.take(pa.array(codes[rows]))

    def memory_mib(rows: np.ndarray) -> pa.Array:
        taken = memory_col.take(pa.array(rows))
        return pa.array(_round_half_away(np.nan_to_num(taken.to_numpy())).astype(np.int64),
                        mask=pc.is_null(taken).to_numpy(zero_copy_only=False))

    def usage_pct(rows: np.ndarray) -> pa.Array:
        values = usage_col.take(pa.array(rows)).to_numpy()
        with np.errstate(invalid="ignore"):
            in_range = (values >= 0) & (values <= 1)
        return pa.array(np.where(in_range, values * 100.0, 0.0), mask=~in_range)

    snapshot = raw.column("snapshot_utc")
    columns: dict[str, Callable[[np.ndarray], pa.Array]] = {
        "snapshot_utc": lambda rows: snapshot.take(pa.array(rows)),
        "host": by_code(host["host"], row_host),
        "slot_name": by_code(name["slot_name"], name_code),
        "gpu_id": by_code(gpu["gpu_id"], assigned_code),
        "tier": by_code(pa.array(["backfill", "priority", "shared"]), tier_code),
        "is_backfill_slot": by_code(pa.array(name["backfill"]), name_code),
        "slot_state": by_code(state["slot_state"], state_code),
        "device_name": by_code(*blank_to_null["GPUs_DeviceName"]),
        "gpu_memory_mib": memory_mib,
        "prioritized_projects": by_code(project["prioritized_projects"], project_code),
        "gpu_usage_pct": usage_pct,
        **{name: by_code(*blank_to_null[col]) for col, name in _FREE_TEXT.items()},
    }
    excluded_rows: Counter[str] = Counter()
    for k, count in enumerate(np.bincount(row_host[excluded], minlength=len(hosts)).tolist()):
        if count:
            excluded_rows[hosts[k]] += count
    return _Columnar(
        order=order, columns=columns,
        excluded_by_host=dict(sorted(excluded_rows.items())),
        q_idx=q_idx.tolist(), q_reason=q_reason,
        usage_out_of_range=int(np.count_nonzero(out_of_range[kept])),
        gpus=int(np.count_nonzero(np.bincount(ranks[3][0]))),
    )


def clean_slot_rows(
    raw: pa.Table,
    excluded_hosts: list[str] | None = None,
    full_rows: Callable[[list[int]], pa.Table] | None = None,
    sink: Callable[[Iterator[pa.RecordBatch]], object] | None = None,
    batch_rows: int = 1_000_000,
    columnar: bool = True,
) -> CleanResult:
    """Turn raw snapshot rows (``raw/condor_slot_snapshots`` schema, or at least
    :data:`CLEAN_INPUT_COLUMNS`, string columns possibly dictionary-encoded) into the clean table.

    The Python rules (host, GPU id spelling, host exclusion) run once per distinct value. A day in
    which every (snapshot, slot name, GPU) comes once -- the common case -- is cleaned columnar
    (:func:`_columnar`): the SQL rules too run once per distinct value, the rows carry integer codes
    and the clean columns are taken from them a batch at a time (one 1,000-GPU day 0.7 -> 0.2 s,
    10,000 GPUs 10.2 -> 5.8 s with the Parquet write, peak RSS 1.85 -> 1.64-1.70 GB). Other days, and
    ``columnar=False``, go through SQL: the rows are classified, typed, de-duplicated and sorted in
    DuckDB (which spills to disk under its memory limit). Both give the same table and counts
    (tested). ``full_rows(indices)`` gives the complete raw rows for the quarantine (default:
    ``raw.take``).

    With ``sink``, the clean rows are not gathered into one table: ``sink`` receives an iterator of
    record batches (``batch_rows`` each, the clean schema, in table order) and what it returns is
    kept in ``written`` (e.g. ``Store.write_partition_batches``); ``table`` is then None. Memory
    stays at a few batches however large the day is (on the columnar path the next batch is taken
    on another thread while the sink writes one)."""
    patterns = [p.strip() for p in (excluded_hosts or []) if p.strip()]
    plan = _columnar(raw, patterns) if columnar else None
    if plan is not None:
        quarantine = _quarantine(raw, full_rows, plan.q_idx, plan.q_reason)
        table, written = None, None
        if sink is None:
            table = pa.Table.from_batches(list(plan.batches(batch_rows)), schema=CLEAN_SLOT_SNAPSHOTS.schema)
        else:
            # the next batch's columns taken on a thread of their own while the sink writes this one
            with Prefetch(plan.batches(batch_rows), depth=1, name="slot-clean") as batches:
                written = sink(iter(batches))
        return CleanResult(
            table=table, quarantine=quarantine, rows_in=raw.num_rows, rows_out=len(plan.order), gpus=plan.gpus,
            written=written, excluded_by_host=plan.excluded_by_host,
            quarantined_by_reason=dict(sorted(Counter(plan.q_reason).items())),
            usage_out_of_range_nulled=plan.usage_out_of_range,
        )
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
        ids, several = _read_ids(assigned)
        _lookup(con, "gpu_map", {"assigned": pa.array(assigned, pa.string()), "gpu_id": pa.array(ids, pa.string()),
                                 "several": pa.array(several, pa.bool_())})
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
                     THEN {_sql_text(_NON_UTF8)} || concat_ws(', ',
                         CASE WHEN contains(r."Name", '{_BAD}') THEN 'Name' END,
                         CASE WHEN contains(h.host, '{_BAD}') THEN 'Machine' END,
                         CASE WHEN contains(g.gpu_id, '{_BAD}') THEN 'AssignedGPUs' END,
                         CASE WHEN contains(r."State", '{_BAD}') THEN 'State' END)
                     WHEN coalesce(trim(r."Name"), '') = '' THEN {_sql_text(_MISSING_NAME)}
                     WHEN coalesce(h.host, '') = '' THEN {_sql_text(_NO_HOST)}
                     WHEN coalesce(trim(r."State"), '') = '' THEN {_sql_text(_MISSING_STATE)}
                     WHEN g.gpu_id IS NULL AND g.several THEN {_sql_text(_SEVERAL_GPUS)}
                     WHEN g.gpu_id IS NULL THEN {_sql_text(_NO_GPU)}
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
        quarantine = _quarantine(raw, full_rows, q_idx, q_reason)
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


def _quarantine(raw: pa.Table, full_rows: Callable[[list[int]], pa.Table] | None, idx: list[int],
                reasons: list[str]) -> pa.Table:
    """The quarantine rows of raw rows ``idx``, whole: through ``full_rows`` when given (the caller
    read only some columns), else from ``raw``."""
    if idx and full_rows is not None:
        return quarantine_rows(full_rows(idx), list(range(len(idx))), reasons, "raw/condor_slot_snapshots")
    return quarantine_rows(raw, idx, reasons, "raw/condor_slot_snapshots")


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
