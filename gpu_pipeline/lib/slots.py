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
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

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
    table: pa.Table
    quarantine: pa.Table
    rows_in: int = 0
    excluded_by_host: dict[str, int] = field(default_factory=dict)
    duplicates_dropped: int = 0
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    usage_out_of_range_nulled: int = 0  #: GPUsAverageUsage outside 0..1 (kept row, value set null)


def _excluded(host: str | None, patterns: list[str]) -> bool:
    return bool(host) and any(fnmatch.fnmatchcase(host.lower(), p.lower()) for p in patterns)


def clean_slot_rows(raw: pa.Table, excluded_hosts: list[str] | None = None) -> CleanResult:
    """Turn raw snapshot rows (``raw/condor_slot_snapshots`` schema) into the clean table."""
    patterns = [p.strip() for p in (excluded_hosts or []) if p.strip()]
    names = raw.column("Name").to_pylist()
    machines = raw.column("Machine").to_pylist()
    hosts = [
        (m.strip() if isinstance(m, str) and m.strip() else (n.rsplit("@", 1)[-1] if n and "@" in n else None))
        for n, m in zip(names, machines, strict=True)
    ]
    gpu_ids = [normalize_gpu_id(g) for g in raw.column("AssignedGPUs").to_pylist()]
    states = raw.column("State").to_pylist()

    keep, q_idx, q_reason = [], [], []
    excluded: Counter[str] = Counter()
    for i, (name, host, gpu, state) in enumerate(zip(names, hosts, gpu_ids, states, strict=True)):
        if _excluded(host, patterns):
            excluded[host] += 1
            continue
        reason = None
        bad_text = [c for c, v in (("Name", name), ("Machine", host), ("AssignedGPUs", gpu), ("State", state))
                    if isinstance(v, str) and "\ufffd" in v]
        if bad_text:
            reason = f"non-UTF-8 bytes in {', '.join(bad_text)}"
        elif not name:
            reason = "missing slot Name"
        elif not host:
            reason = "no host (Machine empty and Name has no '@')"
        elif not state:
            reason = "missing State"
        elif gpu is None:
            reason = "no GPU id in AssignedGPUs"
        if reason:
            q_idx.append(i)
            q_reason.append(reason)
        else:
            keep.append(i)

    kept = raw.take(pa.array(keep, type=pa.int64())).append_column(
        "host_n", pa.array([hosts[i] for i in keep], type=pa.string())
    ).append_column("gpu_id_n", pa.array([gpu_ids[i] for i in keep], type=pa.string()))

    con = duckdb.connect()
    try:
        con.register("raw_rows", kept)
        table = con.sql(
            """
            WITH typed AS (
                SELECT DISTINCT
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
                    CASE WHEN "GPUsAverageUsage" BETWEEN 0 AND 1 THEN "GPUsAverageUsage" * 100.0 END
                        AS gpu_usage_pct,
                    nullif(trim("RemoteOwner"), '') AS remote_owner,
                    nullif(trim("GlobalJobId"), '') AS global_job_id,
                    nullif(trim("PreventJobsReason"), '') AS prevent_jobs_reason
                FROM raw_rows
            )
            SELECT * FROM typed
            ORDER BY snapshot_utc, host, slot_name, gpu_id
            """
        ).to_arrow_table()
    finally:
        con.close()
    duplicates = kept.num_rows - table.num_rows
    usage = kept.column("GPUsAverageUsage")
    usage_out_of_range = int(
        pa.compute.sum(pa.compute.or_(pa.compute.less(usage, 0), pa.compute.greater(usage, 1))).as_py() or 0
    )

    quarantine = quarantine_rows(raw, q_idx, q_reason, "raw/condor_slot_snapshots")
    return CleanResult(
        table=conform(table, CLEAN_SLOT_SNAPSHOTS),
        quarantine=quarantine,
        rows_in=raw.num_rows,
        excluded_by_host=dict(sorted(excluded.items())),
        duplicates_dropped=duplicates,
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
