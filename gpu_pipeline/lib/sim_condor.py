"""Monthly ``gpu_state_YYYY-MM.db`` slot snapshots in the format of CHTC's collector script.

The collector queried the startd ads of GPU slots with the projection :data:`PROJECTION`,
set ``AssignedGPUs := AvailableGPUs`` for every slot whose Name contains "backfill", turned
``AvailableGPUs = { GPUs_GPU_b156e653, ... }`` into ``"GPU-b156e653,..."``, exploded AssignedGPUs on
"," (one row per slot and GPU), added a naive local ``timestamp`` and appended the frame with
pandas ``to_sql`` to the SQLite file of the month. Rows written per host and snapshot (a host
that is dropped out writes none):

=====================  ==========  ==========================  ========================================
Name                   State       AssignedGPUs                AvailableGPUs
=====================  ==========  ==========================  ========================================
``slot1@HOST``         Unclaimed   each GPU of the host        GPUs not used by primary dynamic slots
                       / Drained   (one row per GPU)           (``""`` when all are used)
``slot1_N@HOST``       Claimed     each GPU of the job         the job's GPUs
``backfill2@HOST``     Unclaimed   each GPU idle in primary    same list for every row; no row at all
                       / Drained   *and* backfill              when the list is empty
``backfill2_N@HOST``   Claimed     the backfill job's GPU      the same GPU
=====================  ==========  ==========================  ========================================

Backfill slots exist only on prioritized hosts. RemoteOwner / GlobalJobId / GPUsAverageUsage are
set on Claimed rows only. ``PreventJobsReason`` is ``"Draining"`` on the partitionable-slot rows of
a draining host; ``Disk`` is the slot's disk in KiB.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpu_pipeline.lib.sim_cluster import STREAM_SNAPSHOTS, Host, LocalClock, rng_for
from gpu_pipeline.lib.sim_engine import HostState, HostTimeline

TABLE = "gpu_state"

#: Attributes the collector projected from the startd ads, in column order.
PROJECTION = (
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
)
#: SQL types as pandas ``to_sql`` (SQLAlchemy engine) declares them.
BASE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Name", "TEXT"),
    ("AssignedGPUs", "TEXT"),
    ("AvailableGPUs", "TEXT"),
    ("State", "TEXT"),
    ("GPUs_DeviceName", "TEXT"),
    ("GPUs_GlobalMemoryMb", "BIGINT"),
    ("PrioritizedProjects", "TEXT"),
    ("GPUsAverageUsage", "FLOAT"),
    ("Machine", "TEXT"),
    ("RemoteOwner", "TEXT"),
    ("GlobalJobId", "TEXT"),
    ("timestamp", "TIMESTAMP"),
)
#: Columns later collector versions added after GlobalJobId.
DRIFT_COLUMNS: tuple[tuple[str, str], ...] = (("PreventJobsReason", "TEXT"), ("Disk", "BIGINT"))
#: Stray column of the MIG bug (always NULL), inserted after GPUs_DeviceName in the 2nd month.
MIG_COLUMN = ("GPUs_MIG_0_DeviceName", "TEXT")

#: Probability that a collector run is lost entirely. Real archives miss about 1 in 500
#: snapshots; kept at 0 so snapshots and ground truth line up one to one.
MISSING_SNAPSHOT_PROB = 0.0
#: Positive delay of a snapshot after its grid time (the collector's run time), microseconds.
JITTER_US = (500_000, 25_000_000)
_CHUNK_ROWS = 100_000


def month_columns(month_index: int, n_months: int, schema_drift: bool) -> list[tuple[str, str]]:
    """Columns (name, SQL type) of the ``month_index``-th monthly file of a simulation.

    Without drift every month has :data:`BASE_COLUMNS`. With drift the first month has the base
    columns, later months add :data:`DRIFT_COLUMNS` after GlobalJobId, and the second month also
    has :data:`MIG_COLUMN`; a single-month simulation gets the newer layout.
    """
    if not schema_drift or (month_index == 0 and n_months > 1):
        return list(BASE_COLUMNS)
    cols = list(BASE_COLUMNS[:-1]) + list(DRIFT_COLUMNS) + [BASE_COLUMNS[-1]]
    if month_index == 1:
        cols.insert(cols.index(("GPUs_DeviceName", "TEXT")) + 1, MIG_COLUMN)
    return cols


def create_table_sql(columns: list[tuple[str, str]]) -> str:
    """``CREATE TABLE`` text in the layout SQLAlchemy emits for ``DataFrame.to_sql``."""
    body = ", \n\t".join(f'"{name}" {typ}' for name, typ in columns)
    return f"CREATE TABLE {TABLE} (\n\t{body}\n)"


@dataclass(frozen=True)
class Snapshot:
    """One collector run."""

    t_us: int  #: epoch microseconds (UTC) of the collector run
    local_text: str  #: naive local ``YYYY-MM-DD HH:MM:SS.ffffff``
    month: str  #: ``YYYY-MM`` of the local timestamp


def snapshot_schedule(
    window_start: int, window_end: int, cadence_minutes: float, clock: LocalClock, seed: int
) -> list[Snapshot]:
    """Collector runs: grid every ``cadence_minutes`` from local midnight of the first day (the
    local clock grid; absolute spacing is constant, so DST days have 23 or 25 hours of
    snapshots), each delayed by a random :data:`JITTER_US`."""
    step_us = int(round(cadence_minutes * 60_000_000))
    if step_us <= 0:
        raise ValueError(f"cadence_minutes must be > 0, got {cadence_minutes}")
    start_us, end_us = window_start * 1_000_000, window_end * 1_000_000
    grid = np.arange(start_us, end_us, step_us, dtype=np.int64)
    rng = rng_for(seed, STREAM_SNAPSHOTS)
    t_us = grid + rng.integers(JITTER_US[0], JITTER_US[1], size=len(grid))
    keep = rng.random(len(grid)) >= MISSING_SNAPSHOT_PROB
    local_us = t_us + clock.offset_s(t_us // 1_000_000) * 1_000_000
    epoch = dt.datetime(1970, 1, 1)
    out = []
    for t, loc, k in zip(t_us.tolist(), local_us.tolist(), keep.tolist(), strict=True):
        if not k:
            continue
        wall = epoch + dt.timedelta(microseconds=loc)
        out.append(Snapshot(t, wall.strftime("%Y-%m-%d %H:%M:%S.%f"), wall.strftime("%Y-%m")))
    return out


def render_host_rows(host: Host, st: HostState, drift: bool) -> list[tuple]:
    """Rows of one host for a snapshot, without the trailing timestamp.

    Columns are :data:`PROJECTION` plus, when ``drift``, PreventJobsReason and Disk.
    """
    ids = [g.short_id for g in host.gpus]
    machine = host.name
    constant = (host.model.name, host.model.memory_mb, host.prioritized_projects)

    def row(name, gpu, available, state, usage=None, owner=None, job_id=None, prevent=None, disk=None):
        return (name, gpu, available, state, *constant, usage, machine, owner, job_id, prevent, disk)

    def claimed(name, gpu, available, job):
        return row(
            name,
            gpu,
            available,
            "Claimed",
            job.usage,
            job.remote_owner,
            job.global_job_id,
            disk=job.request_disk_kb,
        )

    pstate = "Drained" if st.draining else "Unclaimed"
    prevent = "Draining" if st.draining else None
    runs = sorted({id(r): r for r in st.prim if r is not None}.values(), key=lambda r: r.slot_id)
    disk_left = host.disk_kb - sum(r.job.request_disk_kb for r in runs)

    # Primary partitionable slot: one row per GPU of the host.
    avail = ",".join(ids[g] for g in range(len(ids)) if st.prim[g] is None)
    rows = [
        row(f"slot1@{machine}", gid, avail, pstate, prevent=prevent, disk=max(disk_left, 0)) for gid in ids
    ]
    # Primary dynamic slots: one row per GPU of the job.
    for r in runs:
        job, gpus = r.job, ",".join(ids[g] for g in r.gpus)
        rows.extend(claimed(f"slot1_{r.slot_id}@{machine}", ids[g], gpus, job) for g in r.gpus)
    if host.prioritized:
        bruns = sorted((r for r in st.bf if r is not None), key=lambda r: r.slot_id)
        disk_left -= sum(r.job.request_disk_kb for r in bruns)
        # Backfill partitionable slot: GPUs idle in primary and backfill (AssignedGPUs := AvailableGPUs).
        idle = [ids[g] for g in range(len(ids)) if st.prim[g] is None and st.bf[g] is None]
        avail = ",".join(idle)
        rows.extend(
            row(f"backfill2@{machine}", gid, avail, pstate, prevent=prevent, disk=max(disk_left, 0))
            for gid in idle
        )
        # Backfill dynamic slots: one GPU each.
        for r in bruns:
            job, gid = r.job, ids[r.gpus[0]]
            rows.append(claimed(f"backfill2_{r.slot_id}@{machine}", gid, gid, job))
    if not drift:
        rows = [r[: len(PROJECTION)] for r in rows]
    return rows


class _MonthDb:
    """One monthly SQLite file, written to a temporary name and renamed when complete.

    The rows every host currently shows live in an in-memory temp table (``current_rows``) that is
    updated only when a host changes; each snapshot is then one ``INSERT ... SELECT`` that copies
    them with the snapshot's timestamp inside SQLite. The result is exactly what appending the
    exploded frame with ``to_sql`` produces, at a fraction of the cost of binding every row.
    """

    def __init__(self, path: Path, columns: list[tuple[str, str]], month: str):
        self.path = path
        self.month = month
        self.tmp = path.with_name(path.name + ".partial")
        for p in (self.tmp, path):
            if p.exists():
                p.unlink()
        con = self.con = sqlite3.connect(self.tmp, isolation_level=None)
        con.execute("PRAGMA journal_mode=MEMORY")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("PRAGMA temp_store=MEMORY")
        con.execute(create_table_sql(columns))
        self.drift = "Disk" in [n for n, _ in columns]
        data_cols = list(PROJECTION) + ([c for c, _ in DRIFT_COLUMNS] if self.drift else [])
        cols_sql = ", ".join(f'"{c}"' for c in data_cols)
        con.execute(
            f"CREATE TEMP TABLE current_rows (h INTEGER, k INTEGER, {cols_sql}, PRIMARY KEY (h, k)) WITHOUT ROWID"
        )
        self.sql_put = f"INSERT INTO temp.current_rows VALUES ({', '.join('?' * (len(data_cols) + 2))})"
        self.sql_snapshot = f'INSERT INTO {TABLE} ({cols_sql}, "timestamp") SELECT {cols_sql}, ? FROM temp.current_rows ORDER BY h, k'
        self.rows = 0
        self.snapshots = 0
        self._pending = 0
        con.execute("BEGIN")

    def set_host(self, h: int, rows: list[tuple]) -> None:
        """Replace the rows host ``h`` shows (an empty list removes the host)."""
        self.con.execute("DELETE FROM temp.current_rows WHERE h = ?", (h,))
        if rows:
            self.con.executemany(self.sql_put, [(h, k, *r) for k, r in enumerate(rows)])

    def snapshot(self, local_text: str) -> None:
        """Append every current row with this timestamp; commit in chunks of about _CHUNK_ROWS."""
        n = self.con.execute(self.sql_snapshot, (local_text,)).rowcount
        self.rows += n
        self.snapshots += 1
        self._pending += n
        if self._pending >= _CHUNK_ROWS:
            self.con.execute("COMMIT")
            self.con.execute("BEGIN")
            self._pending = 0

    def close(self) -> None:
        self.con.execute("COMMIT")
        self.con.close()
        os.replace(self.tmp, self.path)


def write_slot_snapshots(
    condor_dir: Path, timelines: list[HostTimeline], snapshots: list[Snapshot], schema_drift: bool
) -> dict[str, dict[str, int]]:
    """Replay every host up to every snapshot and append its rows to the month's SQLite file.

    Hosts are replayed incrementally and re-rendered only when their state changed, so the cost
    grows with the number of events plus the rows written, and memory stays at one row set per
    host. Returns ``{file name: {"snapshots", "rows"}}``.
    """
    condor_dir.mkdir(parents=True, exist_ok=True)
    months = sorted({s.month for s in snapshots})
    n_hosts = len(timelines)
    states = [HostState(tl.host.n_gpus) for tl in timelines]
    ptr = [0] * n_hosts
    dirty = [True] * n_hosts  # host rows must be (re)written before the next snapshot
    shown = [False] * n_hosts  # host currently has rows in current_rows
    stats: dict[str, dict[str, int]] = {}
    db: _MonthDb | None = None
    for snap in snapshots:
        if db is None or snap.month != db.month:
            if db is not None:
                db.close()
                stats[db.path.name] = {"snapshots": db.snapshots, "rows": db.rows}
            columns = month_columns(months.index(snap.month), len(months), schema_drift)
            db = _MonthDb(condor_dir / f"gpu_state_{snap.month}.db", columns, snap.month)
            dirty = [True] * n_hosts
            shown = [False] * n_hosts
        t_s = snap.t_us // 1_000_000  # an event at second t is visible to snapshots at >= t
        for h, tl in enumerate(timelines):
            ev, i = tl.events, ptr[h]
            st = states[h]
            if i < len(ev) and ev[i][0] <= t_s:
                while i < len(ev) and ev[i][0] <= t_s:
                    st.apply(ev[i][1], ev[i][2])
                    i += 1
                ptr[h] = i
                dirty[h] = True
            if not dirty[h]:
                continue
            if st.dropped:
                if shown[h]:
                    db.set_host(h, [])
                    shown[h] = False
            else:
                db.set_host(h, render_host_rows(tl.host, st, db.drift))
                shown[h] = True
                dirty[h] = False
        db.snapshot(snap.local_text)
    if db is not None:
        db.close()
        stats[db.path.name] = {"snapshots": db.snapshots, "rows": db.rows}
    return stats
