"""The storage contract: one pyarrow schema per output table.

Every partition of a table is written with exactly its schema (same columns, types and order, an
empty day included), so ``read_parquet('<table>/*/*.parquet')`` works over any range in DuckDB,
pandas, polars or Spark. Units are part of column names (``_pct``, ``_w``, ``_mib``, ``_s``,
``_utc``). Timestamps are ``timestamp[us, tz=UTC]``.

A schema change bumps ``TableSpec.version`` and is listed in ``SCHEMA_CHANGES`` below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


#: Field metadata that keeps a column out of Parquet dictionary encoding: for measurements that
#: rarely repeat (power, memory used, energy counters), where the writer builds a dictionary only to
#: give it up (a quarter of the telemetry tables' write time).
NO_DICTIONARY = {"parquet_dictionary": "false"}


def dictionary_encoded(field: pa.Field) -> bool:
    """Whether the column is written with a Parquet dictionary (all but those marked NO_DICTIONARY)."""
    key, value = next(iter(NO_DICTIONARY.items()))
    return (field.metadata or {}).get(key.encode()) != value.encode()


def _f(name: str, type_: pa.DataType, description: str, nullable: bool = True, plain: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable,
                    metadata={"description": description, **(NO_DICTIONARY if plain else {})})


@dataclass(frozen=True)
class TableSpec:
    layer: str
    name: str
    schema: pa.Schema
    description: str
    key: tuple[str, ...] = ()
    version: int = 1
    #: Rows per Parquet row group (None: the store's default); smaller for wide, long tables, so
    #: that a streamed write holds less (a writer holds one row group).
    row_group_rows: int | None = None

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
            _f("snapshot_utc", TS, "Snapshot the state was taken from: the winning slot row's (null when the "
               "GPU has no row in the bucket: no snapshot, or a dropout from the bucket's snapshot)"),
            _f("n_slot_rows", pa.int32(), "Slot rows naming this GPU in the bucket's snapshots", nullable=False),
            _f("na_reason", pa.string(), "Why na: dropout (GPU absent from the snapshot), no_snapshot "
               "(no snapshot covers the bucket), or the slot state (Drained, Owner, ...)"),
        ]
    ),
)

TELEMETRY_SOURCES: tuple[str, ...] = ("nvidia-smi", "dcgm", "nvml", "prometheus", "terapixel")

GPU_SAMPLES = TableSpec(
    layer="clean",
    name="gpu_samples",
    description=(
        "GPU telemetry samples from every source (nvidia-smi logs, dcgm-exporter scrapes, NVML sampler, "
        "Prometheus, Terapixel CSV) normalized to one row per sample x GPU (or MIG instance), in UTC. "
        "gpu_id is the HTCondor short id so samples join slot snapshots."
    ),
    key=("sample_utc", "source", "host", "gpu_id"),
    # ~280 bytes a row in Arrow: a million-row group was 0.28 GB held by the writer (a 1,000-GPU
    # day at 30-second telemetry is 2.9 million rows)
    row_group_rows=1 << 18,
    schema=pa.schema(
        [
            _f("sample_utc", TS, "Sample time (UTC); local source timestamps localized with the source "
               "time zone", nullable=False),
            _f("source", pa.string(), "One of " + ", ".join(TELEMETRY_SOURCES), nullable=False),
            _f("host", pa.string(), "Host the GPU is in"),
            _f("gpu_uuid", pa.string(), "Full GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), or the "
               "MIG UUID of a MIG instance when the source gives it (else the parent GPU's UUID)"),
            _f("gpu_id", pa.string(), "HTCondor short id GPU-xxxxxxxx (first 8 hex of the UUID, lower "
               "case); a MIG instance: its MIG UUID, or '<parent UUID>/<GPU_I_ID>' from DCGM",
               nullable=False),
            _f("gpu_index", pa.int32(), "Device index on the host (nvidia-smi index, DCGM gpu label)"),
            _f("mig_profile", pa.string(), "MIG GPU-instance profile, e.g. 1g.10gb (null: not MIG)"),
            _f("mig_instance_id", pa.int32(), "MIG GPU-instance id GPU_I_ID (null: not MIG)"),
            _f("device_name", pa.string(), "GPU model name"),
            _f("util_pct", pa.float64(), "GPU utilization (%); null on MIG instances"),
            _f("mem_util_pct", pa.float64(), "Memory controller utilization / copy utilization (%)"),
            _f("mem_used_mib", pa.float64(), "Framebuffer memory used (MiB)", plain=True),
            _f("mem_total_mib", pa.float64(), "Framebuffer memory total (MiB); DCGM: FB_TOTAL, else "
               "FB_USED + FB_FREE (+ FB_RESERVED)"),
            _f("power_w", pa.float64(), "Power draw (W)", plain=True),
            _f("power_limit_w", pa.float64(), "Power limit (W)"),
            _f("temp_c", pa.float64(), "GPU temperature (C)"),
            _f("sm_clock_mhz", pa.float64(), "SM clock (MHz)"),
            _f("energy_mj", pa.float64(), "Total energy consumed since boot (mJ, cumulative counter)", plain=True),
            _f("gr_engine_active_pct", pa.float64(), "DCGM PROF graphics engine active (%, ratio x 100)", plain=True),
            _f("sm_active_pct", pa.float64(), "DCGM PROF SM active (%, ratio x 100)", plain=True),
            _f("tensor_active_pct", pa.float64(), "DCGM PROF tensor pipe active (%, ratio x 100)", plain=True),
            _f("source_file", pa.string(), "File the sample was read from"),
        ]
    ),
)

JOBS = TableSpec(
    layer="clean",
    name="jobs",
    description=(
        "HTCondor job records (condor_adstash job and epoch documents, condor_history/condor_q "
        "ads), one row per job run: doc_kind 'job' rows are final job ads (their last run), "
        "'epoch' rows one run attempt each. Typed, UTC; field names matched case-insensitively; "
        "0/absent dates and unevaluated /Expr()/ values are null. Malformed documents are "
        "quarantined with the reason, exact duplicates dropped and counted."
    ),
    key=("global_job_id", "run_index", "doc_kind"),
    version=4,
    schema=pa.schema(
        [
            _f("global_job_id", pa.string(), "HTCondor GlobalJobId (schedd#cluster.proc#qdate)", nullable=False),
            _f("run_index", pa.int32(), "0-based run (epoch) index: NumJobStarts - 1 (an epoch document: "
               "NumShadowStarts - 1); 0 if never started",
               nullable=False),
            _f("doc_kind", pa.string(), "'job' (job ad) or 'epoch' (one run attempt)", nullable=False),
            _f("cluster_id", pa.int64(), "ClusterId"),
            _f("proc_id", pa.int64(), "ProcId"),
            _f("owner", pa.string(), "Owner (submitter's local user name), else the user part of 'user'"),
            _f("user", pa.string(), "User (owner@uid_domain), else RemoteOwner; as RemoteOwner in slot snapshots"),
            _f("project", pa.string(), "ProjectName"),
            _f("acct_group", pa.string(), "AcctGroup, else AccountingGroup"),
            _f("schedd", pa.string(), "ScheddName, else the part of GlobalJobId before '#'"),
            _f("job_status", pa.int32(), "JobStatus code when the document was written"),
            _f("job_status_name", pa.string(), "1 Idle, 2 Running, 3 Removed, 4 Completed, 5 Held, "
               "6 Transferring Output, 7 Suspended"),
            _f("last_job_status", pa.int32(), "LastJobStatus: the JobStatus code before the current one (5: "
               "a removed job was held before the removal)"),
            _f("queued_utc", TS, "QDate: when the job was submitted"),
            _f("run_start_utc", TS, "Start of the run: JobCurrentStartDate, else JobStartDate"),
            _f("first_start_utc", TS, "JobStartDate: when the job's first run started (the end of its first "
               "queue wait, where run 0 has no row)"),
            _f("run_end_utc", TS, "End of the run: CompletionDate, else LastVacateTime (evicted), else "
               "EpochWriteDate (epochs) or EnteredCurrentStatus (left the running states; a job held, then "
               "removed or released: the start plus LastRemoteWallClockTime); null while running"),
            _f("completion_utc", TS, "CompletionDate (null unless completed)"),
            _f("record_utc", TS, "RecordTime (adstash), else EpochWriteDate / ServerTime / CompletionDate / "
               "EnteredCurrentStatus"),
            _f("status_entered_utc", TS, "EnteredCurrentStatus: when the job entered its JobStatus (a hold's, a "
               "removal's start)"),
            _f("host", pa.string(), "Execute host: StartdName, else RemoteHost/LastRemoteHost after the last '@'"),
            _f("slot", pa.string(), "Slot: StartdSlot, else RemoteHost/LastRemoteHost before the last '@'"),
            _f("is_backfill_slot", pa.bool_(), "Slot name contains 'backfill' (null when no slot)"),
            _f("assigned_gpus", pa.string(), "Comma list of HTCondor short GPU ids (GPU-xxxxxxxx) or MIG ids"),
            _f("request_gpus", pa.float64(), "RequestGPUs"),
            _f("num_job_starts", pa.int32(), "NumJobStarts"),
            _f("num_vacates", pa.int32(), "NumVacates"),
            _f("last_vacate_utc", TS, "LastVacateTime (may belong to an earlier run)"),
            _f("vacate_reason_code", pa.int32(), "VacateReasonCode"),
            _f("vacate_reason", pa.string(), "VacateReason"),
            _f("remote_wall_clock_s", pa.float64(), "RemoteWallClockTime: cumulative wall time of all runs (s)"),
            _f("committed_time_s", pa.float64(), "CommittedTime: wall time not lost to evictions (s)"),
            _f("require_gpus", pa.string(), "RequireGPUs (require_gpus: the constraint on each GPU's properties), "
               "the ClassAd expression's text"),
            _f("requirements", pa.string(), "Requirements, the ClassAd expression's text (the demand reads a "
               "device test on GPUs_DeviceName or CUDADeviceName from it)"),
            _f("source", pa.string(), "elasticsearch, ndjson, es_export or condor_history", nullable=False),
        ]
    ),
)

RAW_JOB_DOCUMENTS = TableSpec(
    layer="raw",
    name="job_documents",
    description=(
        "HTCondor job documents as fetched for the day (Elasticsearch condor_adstash index, or offline "
        "NDJSON / Elasticsearch export / condor_history -json files): every job or epoch document whose "
        "run or queue wait may overlap the day, unmodified, as JSON text."
    ),
    schema=pa.schema(
        [
            _f("source", pa.string(), "elasticsearch, ndjson, es_export or condor_history", nullable=False),
            _f("origin", pa.string(), "Index (Elasticsearch) or file the document came from", nullable=False),
            _f("position", pa.int64(), "Line number (line files), element index, or hit number", nullable=False),
            _f("doc_json", pa.string(), "The document (_source) as JSON, or the raw line when it is not JSON",
               nullable=False),
            _f("parse_error", pa.string(), "Why the line is not a document (null when it is)"),
        ]
    ),
)

QUARANTINE = TableSpec(
    layer="quarantine",
    name="slot_snapshots",
    description="Slot snapshot rows set aside by cleaning, with the reason; nothing is dropped silently.",
    schema=pa.schema(
        [
            _f("source_table", pa.string(), "Table the row came from; for a source file's row (source_file), "
               "the raw table it was read for", nullable=False),
            _f("reason", pa.string(), "Why the row was set aside", nullable=False),
            _f("source_file", pa.string(), "Raw file the row was read from"),
            _f("source_row", pa.int64(), "Row number / rowid inside that file"),
            _f("record_utc", TS, "Timestamp of the record when known"),
            _f("row_json", pa.string(), "The row as JSON", nullable=False),
        ]
    ),
)


def quarantine_spec(table: str) -> TableSpec:
    """The quarantine table of one cleaned table (same schema for every source)."""
    return dataclasses.replace(
        QUARANTINE, name=table, description=f"Rows of {table} set aside by cleaning, with the reason."
    )


QUARANTINE_JOBS = quarantine_spec("jobs")
QUARANTINE_CONDOR_RAW = quarantine_spec("condor_slot_snapshots")
QUARANTINE_GPU_SAMPLES = quarantine_spec("gpu_samples")
QUARANTINE_GPU_TELEMETRY = quarantine_spec("gpu_telemetry")

RAW_GPU_TELEMETRY = dataclasses.replace(
    GPU_SAMPLES,
    layer="raw",
    name="gpu_telemetry",
    key=(),
    description=(
        "GPU telemetry samples of the day as parsed from every configured source (nvidia-smi CSV logs, "
        "dcgm-exporter scrapes, NVML sampler files), before validation."
    ),
)

TABLES: dict[str, TableSpec] = {
    spec.path: spec
    for spec in (
        RAW_CONDOR_SLOT_SNAPSHOTS,
        RAW_JOB_DOCUMENTS,
        RAW_GPU_TELEMETRY,
        CLEAN_SLOT_SNAPSHOTS,
        JOBS,
        GPU_SAMPLES,
        QUARANTINE,
        QUARANTINE_JOBS,
        QUARANTINE_CONDOR_RAW,
        QUARANTINE_GPU_SAMPLES,
        QUARANTINE_GPU_TELEMETRY,
        GPU_STATES,
    )
}

# Modules that define the specs of the tables they compute (metrics, reference, extra sources).
# Their specs are part of the contract through ``all_tables()``; they are defined beside their SQL
# so each table's columns and the code filling them are read together.
SPEC_MODULES = (
    "gpu_pipeline.lib.kueue",
    "gpu_pipeline.lib.kueue_source",
    "gpu_pipeline.lib.terapixel",
    "gpu_pipeline.lib.coverage_table",
    "gpu_pipeline.lib.allocation",
    "gpu_pipeline.lib.availability",
    "gpu_pipeline.lib.evictions",
    "gpu_pipeline.lib.efficiency",
    "gpu_pipeline.lib.demand",
    "gpu_pipeline.lib.gpu_specs",
)


def all_tables() -> dict[str, TableSpec]:
    """Every table of the storage contract, by ``<layer>/<name>``: the tables above plus the specs
    defined in :data:`SPEC_MODULES` (imported here lazily: those modules import this one)."""
    import importlib

    tables = dict(TABLES)
    for name in SPEC_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        for value in vars(module).values():
            if isinstance(value, TableSpec):
                tables.setdefault(value.path, value)
    return dict(sorted(tables.items()))


# Versioned schema history: (table path, version, change). Every other table is at version 1.
SCHEMA_CHANGES: list[tuple[str, int, str]] = [
    ("*", 1, "initial schemas"),
    ("clean/kueue_demand", 2, "root_cohort added (days written before read it as null)"),
    ("clean/kueue_demand", 3, "cluster_queue_status added (kueue_cluster_queue_status): the demand leaves a "
     "ClusterQueue that is not active out of the capacity (days written before read it as null: every "
     "queue's quota counts, as before)"),
    ("clean/jobs", 2, "status_entered_utc added: the demand ends a held or removed job's wait at it (days "
     "written before read it as null and end the wait at record_utc)"),
    ("clean/jobs", 3, "require_gpus and requirements added (RequireGPUs, Requirements as text): the demand "
     "reads the device class a job can use from them (days written before read them as null: class ANY)"),
    ("clean/jobs", 4, "last_job_status (LastJobStatus) and first_start_utc (JobStartDate) added: the demand "
     "counts no wait after the last run of a job held, then removed, and counts the first queue wait "
     "(QDate -> JobStartDate) of a job whose run 0 has no row (days written before read them as null: "
     "there, as before, such a job's wait after its run counts and such a first wait does not)"),
    ("metrics/demand_capacity", 2, "capacity_coverage added: the capacity is a mean over the hour's buckets a "
     "slot snapshot covered (days written before read it as null)"),
    ("metrics/gpu_hourly_efficiency", 2, "util_coverage_s and power_coverage_s added: the daily and fleet "
     "means weigh an hour by the time its reading was known (days written before read them as null and "
     "are weighed by coverage_s)"),
    ("metrics/eviction_rates", 2, "device_name and tier 'unknown' where no GPU state or primary slot row names "
     "them (days written before have null there)"),
]


def sorted_rows(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``table`` sorted ascending on ``keys`` (nulls last, stable), as ``Table.sort_by``; the table
    itself, without a copy, when it is already in that order."""
    if table.num_rows < 2:
        return table
    order = pc.sort_indices(table, sort_keys=[(k, "ascending", "at_end") for k in keys])
    if np.array_equal(order.to_numpy(), np.arange(table.num_rows)):
        return table
    return table.take(order)


def conform(table: pa.Table, spec: TableSpec) -> pa.Table:
    """Return ``table`` with exactly ``spec.schema``: columns reordered, missing nullable columns
    added as nulls, types cast safely. Extra columns or a failing cast raise ``ValueError``."""
    names = table.column_names
    wanted = set(spec.schema.names)
    extra = [c for c in names if c not in wanted]
    if extra:
        raise ValueError(f"{spec.path}: unexpected columns {extra}")
    present = set(names)
    cols = []
    for field in spec.schema:
        if field.name in present:
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
