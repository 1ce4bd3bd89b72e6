"""The storage contract: one pyarrow schema per output table.

Every partition of a table is written with exactly its schema (same columns, types and order, an
empty day included), so ``read_parquet('<table>/*/*.parquet')`` works over any range in DuckDB,
pandas, polars or Spark. Units are part of column names (``_pct``, ``_w``, ``_mib``, ``_s``,
``_utc``). Timestamps are ``timestamp[us, tz=UTC]``.

A schema change bumps ``TableSpec.version`` and is listed in ``SCHEMA_CHANGES`` below.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

# State codes of the per-GPU 5-minute state table (DESIGN.md 5.1), in display order.
STATES: tuple[str, ...] = (
    "idle_prioritized",
    "idle_shared",
    "idle_backfill",
    "busy_prioritized",
    "busy_shared",
    "busy_backfill",
    "na",
)
TIERS: tuple[str, ...] = ("priority", "shared", "backfill")


def _f(name: str, type_: pa.DataType, description: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"description": description})


@dataclass(frozen=True)
class TableSpec:
    layer: str
    name: str
    schema: pa.Schema
    description: str
    key: tuple[str, ...] = ()
    version: int = 1

    @property
    def path(self) -> str:
        """Relative location under the data root: ``<layer>/<table>``."""
        return f"{self.layer}/{self.name}"

    def column_descriptions(self) -> dict[str, str]:
        return {
            f.name: (f.metadata or {}).get(b"description", b"").decode() for f in self.schema
        }

    def empty(self) -> pa.Table:
        return self.schema.empty_table()


RAW_CONDOR_SLOT_SNAPSHOTS = TableSpec(
    layer="raw",
    name="condor_slot_snapshots",
    description=(
        "HTCondor slot-state snapshot rows exactly as collected (one row per slot x GPU per snapshot), "
        "extracted for one day from the monthly gpu_state archives. Known columns are kept with their "
        "original names; the naive local timestamp is kept as text and localized to UTC."
    ),
    schema=pa.schema(
        [
            _f("snapshot_utc", TS, "Snapshot time, localized from the source time zone to UTC"),
            _f("timestamp_local", pa.string(), "Original naive local timestamp text"),
            _f("Name", pa.string(), "Slot name, e.g. slot1_3@host or backfill2_1@host"),
            _f("AssignedGPUs", pa.string(), "GPU id of this row (exploded AssignedGPUs)"),
            _f("AvailableGPUs", pa.string(), "Comma list of GPUs available in the slot"),
            _f("State", pa.string(), "Slot state: Claimed, Unclaimed, Drained, Owner, ..."),
            _f("GPUs_DeviceName", pa.string(), "GPU model name"),
            _f("GPUs_GlobalMemoryMb", pa.float64(), "GPU memory in MB as advertised"),
            _f("PrioritizedProjects", pa.string(), "Projects with priority on the host ('' = open capacity)"),
            _f("GPUsAverageUsage", pa.float64(), "Average GPU usage of the slot, 0-1"),
            _f("Machine", pa.string(), "Host name"),
            _f("RemoteOwner", pa.string(), "Owner of the running job"),
            _f("GlobalJobId", pa.string(), "HTCondor GlobalJobId of the running job"),
            _f("PreventJobsReason", pa.string(), "Why the slot takes no jobs (later archives only)"),
            _f("Disk", pa.float64(), "Slot disk in KiB (later archives only)"),
            _f("source_file", pa.string(), "Archive file the row was read from"),
            _f("source_rowid", pa.int64(), "Row id inside the archive file"),
        ]
    ),
)

CLEAN_SLOT_SNAPSHOTS = TableSpec(
    layer="clean",
    name="slot_snapshots",
    description=(
        "Typed, UTC slot snapshots: one row per snapshot x slot x GPU, with the slot's tier "
        "(priority / shared / backfill). Excluded hosts and malformed rows are removed and counted."
    ),
    key=("snapshot_utc", "slot_name", "gpu_id"),
    schema=pa.schema(
        [
            _f("snapshot_utc", TS, "Snapshot time (UTC)", nullable=False),
            _f("host", pa.string(), "Host name (Machine, else the part of Name after '@')", nullable=False),
            _f("slot_name", pa.string(), "Slot name", nullable=False),
            _f("gpu_id", pa.string(), "HTCondor short GPU id (GPU-xxxxxxxx) or MIG id", nullable=False),
            _f("tier", pa.string(), "backfill if the slot name contains 'backfill', else priority if "
               "PrioritizedProjects is non-empty, else shared", nullable=False),
            _f("is_backfill_slot", pa.bool_(), "Slot name contains 'backfill'", nullable=False),
            _f("slot_state", pa.string(), "HTCondor slot State", nullable=False),
            _f("device_name", pa.string(), "GPU model name"),
            _f("gpu_memory_mib", pa.int64(), "GPU memory (MiB)"),
            _f("prioritized_projects", pa.string(), "Prioritized projects of the host ('' = open capacity)"),
            _f("gpu_usage_pct", pa.float64(), "Slot's GPUsAverageUsage in percent (0-100)"),
            _f("remote_owner", pa.string(), "Owner of the job in the slot"),
            _f("global_job_id", pa.string(), "GlobalJobId of the job in the slot"),
            _f("prevent_jobs_reason", pa.string(), "PreventJobsReason where the archive has it"),
        ]
    ),
)

GPU_STATES = TableSpec(
    layer="metrics",
    name="gpu_states",
    description=(
        "Per-GPU state per 5-minute bucket (DESIGN.md 5.1). Every GPU seen during the day has one row "
        "per bucket of the day; a GPU with no row in the bucket's snapshot is 'na' (dropout)."
    ),
    key=("bucket_start_utc", "gpu_id"),
    schema=pa.schema(
        [
            _f("bucket_start_utc", TS, "Start of the 5-minute bucket (UTC)", nullable=False),
            _f("gpu_id", pa.string(), "HTCondor short GPU id", nullable=False),
            _f("host", pa.string(), "Host of the GPU", nullable=False),
            _f("device_name", pa.string(), "GPU model name"),
            _f("state", pa.string(), "One of " + ", ".join(STATES), nullable=False),
            _f("tier", pa.string(), "Tier of the winning slot row (null when na)"),
            _f("slot_name", pa.string(), "Slot of the winning row (null when no row)"),
            _f("slot_state", pa.string(), "HTCondor State of the winning row (null when no row)"),
            _f("global_job_id", pa.string(), "Job on the GPU when busy"),
            _f("remote_owner", pa.string(), "Owner of that job"),
            _f("gpu_usage_pct", pa.float64(), "GPUsAverageUsage of the winning slot (0-100)"),
            _f("snapshot_utc", TS, "Snapshot the state was taken from (null when no snapshot)"),
            _f("n_slot_rows", pa.int32(), "Slot rows naming this GPU in the bucket's snapshots", nullable=False),
            _f("na_reason", pa.string(), "Why na: dropout (GPU absent from the snapshot), no_snapshot "
               "(no snapshot covers the bucket), or the slot state (Drained, Owner, ...)"),
        ]
    ),
)

QUARANTINE = TableSpec(
    layer="quarantine",
    name="slot_snapshots",
    description="Slot snapshot rows set aside by cleaning, with the reason; nothing is dropped silently.",
    schema=pa.schema(
        [
            _f("source_table", pa.string(), "Table the row came from", nullable=False),
            _f("reason", pa.string(), "Why the row was set aside", nullable=False),
            _f("source_file", pa.string(), "Raw file the row was read from"),
            _f("source_row", pa.int64(), "Row number / rowid inside that file"),
            _f("record_utc", TS, "Timestamp of the record when known"),
            _f("row_json", pa.string(), "The row as JSON", nullable=False),
        ]
    ),
)

TABLES: dict[str, TableSpec] = {
    spec.path: spec
    for spec in (RAW_CONDOR_SLOT_SNAPSHOTS, CLEAN_SLOT_SNAPSHOTS, QUARANTINE, GPU_STATES)
}

# Versioned schema history: (table path, version, change).
SCHEMA_CHANGES: list[tuple[str, int, str]] = [
    (spec.path, 1, "initial schema") for spec in TABLES.values()
]


def conform(table: pa.Table, spec: TableSpec) -> pa.Table:
    """Return ``table`` with exactly ``spec.schema``: columns reordered, missing nullable columns
    added as nulls, types cast safely. Extra columns or a failing cast raise ``ValueError``."""
    extra = [c for c in table.column_names if c not in spec.schema.names]
    if extra:
        raise ValueError(f"{spec.path}: unexpected columns {extra}")
    cols = []
    for field in spec.schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            if col.type != field.type:
                try:
                    col = col.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ValueError(
                        f"{spec.path}: column {field.name!r} has type {col.type}, expected {field.type}: {exc}"
                    ) from exc
            if not field.nullable and col.null_count:
                raise ValueError(f"{spec.path}: column {field.name!r} has {col.null_count} nulls")
        else:
            if not field.nullable:
                raise ValueError(f"{spec.path}: missing required column {field.name!r}")
            col = pa.nulls(table.num_rows, field.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=spec.schema)
