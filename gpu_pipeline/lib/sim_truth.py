"""Ground truth of a simulation as Parquet (``truth/*.parquet``), derived from the host event logs.

Per-GPU state at time t (exactly what a slot snapshot taken at t shows, ranked as in the design):

* ``na``                 host dropped out (no rows), or primary slot Drained and no backfill job;
* ``busy_prioritized`` / ``busy_shared``  a primary job holds the GPU (tier of the host);
* ``busy_backfill``      a backfill job runs on it (primary slot unclaimed, possibly Drained);
* ``idle_prioritized`` / ``idle_shared``  otherwise.

Intervals are ``[start_utc, end_utc)``, contiguous per GPU, clipped to the window, and split
whenever the state or the job changes. All timestamps are ``timestamp[us, tz=UTC]``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from gpu_pipeline.lib.sim_cluster import Host
from gpu_pipeline.lib.sim_engine import HostState, HostTimeline, PoolHistory, Run
from gpu_pipeline.lib.sim_jobs import required_device

TS = pa.timestamp("us", tz="UTC")

GPU_STATE_INTERVALS = pa.schema(
    [
        ("gpu_id", pa.string()),
        ("host", pa.string()),
        ("device_name", pa.string()),
        ("tier", pa.string()),
        ("state", pa.string()),
        ("start_utc", TS),
        ("end_utc", TS),
        ("global_job_id", pa.string()),
        ("na_reason", pa.string()),  # "dropout" / "drained" when state == na
    ]
)
AVAILABILITY_PERIODS = pa.schema(
    [
        ("gpu_id", pa.string()),
        ("host", pa.string()),
        ("device_name", pa.string()),
        ("tier", pa.string()),
        ("start_utc", TS),
        ("end_utc", TS),
        ("duration_s", pa.float64()),
        ("end_reason", pa.string()),
        ("backfill_job_id", pa.string()),
        ("starts_before_window", pa.bool_()),
    ]
)
EVICTIONS = pa.schema(
    [
        ("global_job_id", pa.string()),
        ("run_index", pa.int32()),
        ("gpu_id", pa.string()),
        ("host", pa.string()),
        ("device_name", pa.string()),
        ("started_utc", TS),
        ("evicted_utc", TS),
        ("runtime_s", pa.float64()),
        ("evicted_by_job_id", pa.string()),
    ]
)
JOBS = pa.schema(
    [
        ("global_job_id", pa.string()),
        ("run_index", pa.int32()),
        ("owner", pa.string()),
        ("project", pa.string()),
        ("kind", pa.string()),
        ("host", pa.string()),
        ("slot_name", pa.string()),
        ("device_name", pa.string()),
        ("gpu_ids", pa.string()),
        ("request_gpus", pa.int32()),
        ("qdate_utc", TS),
        ("start_utc", TS),
        ("end_utc", TS),
        ("end_reason", pa.string()),
        ("profile", pa.string()),
        ("require_device", pa.string()),
    ]
)
HOSTS = pa.schema(
    [
        ("host", pa.string()),
        ("tier", pa.string()),
        ("prioritized_projects", pa.string()),
        ("device_name", pa.string()),
        ("gpu_memory_mb", pa.int64()),
        ("power_limit_w", pa.float64()),
        ("n_gpus", pa.int32()),
        ("gpu_ids", pa.string()),
        ("gpu_uuids", pa.string()),
        ("telemetry", pa.string()),
    ]
)

STATES = ("idle_prioritized", "idle_shared", "busy_prioritized", "busy_shared", "busy_backfill", "na")


class _Table:
    """Column-wise row buffer flushed to one Parquet file in bounded batches."""

    def __init__(self, path: Path, schema: pa.Schema, batch_rows: int = 200_000):
        self.path, self.schema, self.batch_rows = path, schema, batch_rows
        self.cols: list[list] = [[] for _ in schema]
        self.ts_cols = [i for i, f in enumerate(schema) if f.type == TS]
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0

    def add(self, row: tuple) -> None:
        for col, v in zip(self.cols, row, strict=True):
            col.append(v)
        if len(self.cols[0]) >= self.batch_rows:
            self._flush()

    def _flush(self) -> None:
        arrays = []
        for i, (col, field) in enumerate(zip(self.cols, self.schema, strict=True)):
            if i in self.ts_cols:  # epoch seconds -> us
                arrays.append(
                    pa.array([None if v is None else v * 1_000_000 for v in col], pa.int64()).cast(TS)
                )
            else:
                arrays.append(pa.array(col, field.type))
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, self.schema, compression="zstd")
        self.writer.write_table(table)
        self.rows += table.num_rows
        self.cols = [[] for _ in self.schema]

    def close(self) -> int:
        if self.cols[0] or self.writer is None:
            self._flush()
        self.writer.close()
        return self.rows


def _classify(host: Host, st: HostState, g: int) -> tuple[str, Run | None, str | None]:
    if st.dropped:
        return "na", None, "dropout"
    if st.prim[g] is not None:
        return ("busy_prioritized" if host.prioritized else "busy_shared"), st.prim[g], None
    if st.bf[g] is not None:
        return "busy_backfill", st.bf[g], None
    if st.draining:
        return "na", None, "drained"
    return ("idle_prioritized" if host.prioritized else "idle_shared"), None, None


def gpu_intervals(tl: HostTimeline, window_start: int, window_end: int) -> list[list[tuple]]:
    """Per GPU of the host: ``[(state, start, end, run|None, na_reason, clipped), ...]`` clipped to
    the window; ``clipped`` is True when the interval really began before the window start."""
    host = tl.host
    n = host.n_gpus
    st = HostState(n)
    out: list[list[tuple]] = [[] for _ in range(n)]
    cur = [(*_classify(host, st, g), -(2**62)) for g in range(n)]  # (state, run, na_reason, start)

    def close(g: int, end: int) -> None:
        state, run, reason, start = cur[g]
        s, e = max(start, window_start), min(end, window_end)
        if s < e:
            out[g].append((state, s, e, run, reason, start < window_start))

    ev = tl.events
    i = 0
    while i < len(ev):
        t = ev[i][0]
        if t >= window_end:
            break
        while i < len(ev) and ev[i][0] == t:
            st.apply(ev[i][1], ev[i][2])
            i += 1
        for g in range(n):
            state, run, reason = _classify(host, st, g)
            if state != cur[g][0] or run is not cur[g][1]:
                close(g, t)
                cur[g] = (state, run, reason, t)
    for g in range(n):
        close(g, window_end)
    return out


def write_truth(truth_dir: Path, history: PoolHistory, window_start: int, window_end: int) -> dict[str, int]:
    """Write the five truth tables; returns row counts by file name."""
    truth_dir.mkdir(parents=True, exist_ok=True)
    t_int = _Table(truth_dir / "gpu_state_intervals.parquet", GPU_STATE_INTERVALS)
    t_av = _Table(truth_dir / "availability_periods.parquet", AVAILABILITY_PERIODS)
    t_ev = _Table(truth_dir / "evictions.parquet", EVICTIONS)
    t_jobs = _Table(truth_dir / "jobs.parquet", JOBS)
    t_hosts = _Table(truth_dir / "hosts.parquet", HOSTS)
    hosts = [tl.host for tl in history.timelines]
    for tl in history.timelines:
        host = tl.host
        name, dev, tier = host.name, host.model.name, host.tier
        t_hosts.add(
            (
                name,
                tier,
                host.prioritized_projects,
                dev,
                host.model.memory_mb,
                host.model.power_limit_w,
                host.n_gpus,
                ",".join(g.short_id for g in host.gpus),
                ",".join(g.uuid for g in host.gpus),
                host.telemetry,
            )
        )
        for g, ivs in enumerate(gpu_intervals(tl, window_start, window_end)):
            gid = host.gpus[g].short_id
            for k, (state, s, e, run, reason, clipped) in enumerate(ivs):
                t_int.add((gid, name, dev, tier, state, s, e, run.job.global_job_id if run else None, reason))
                if not state.startswith("idle"):
                    continue
                if k + 1 < len(ivs):
                    nstate, _, _, nrun, nreason, _ = ivs[k + 1]
                    if nstate == "busy_backfill":
                        end_reason, bf_id = "backfill_claimed", nrun.job.global_job_id
                    elif nstate == "na":
                        end_reason, bf_id = nreason, None
                    else:
                        end_reason, bf_id = "primary_claimed", None
                else:
                    end_reason, bf_id = "open", None
                t_av.add((gid, name, dev, tier, s, e, float(e - s), end_reason, bf_id, clipped))

    runs = [r for job in history.jobs for r in job.runs]
    runs.sort(key=lambda r: (r.start, r.job.global_job_id, r.index))
    evicted = sorted(
        (r for r in runs if r.end_reason == "evicted" and window_start <= r.end < window_end),
        key=lambda r: (r.end, r.host, r.gpus),
    )
    for r in evicted:
        host, job = hosts[r.host], r.job
        t_ev.add(
            (
                job.global_job_id,
                r.index,
                host.gpus[r.gpus[0]].short_id,
                host.name,
                host.model.name,
                r.start,
                r.end,
                float(r.end - r.start),
                r.evicted_by.global_job_id,
            )
        )
    for r in runs:
        if r.start < window_end and (r.end is None or r.end > window_start):
            host, job = hosts[r.host], r.job
            t_jobs.add(
                (
                    job.global_job_id,
                    r.index,
                    job.remote_owner,
                    job.project,
                    job.kind,
                    host.name,
                    f"{r.slot_name}@{host.name}",
                    host.model.name,
                    ",".join(host.gpus[g].short_id for g in r.gpus),
                    job.request_gpus,
                    job.qdate,
                    r.start,
                    r.end,
                    r.end_reason,
                    job.profile,
                    required_device(job, hosts),
                )
            )
    queued = sorted(
        (j for j in history.jobs if not j.runs and j.qdate < window_end),
        key=lambda j: (j.qdate, j.global_job_id),
    )
    for job in queued:  # never started before the window end: pure queued demand
        t_jobs.add(
            (
                job.global_job_id,
                0,
                job.remote_owner,
                job.project,
                job.kind,
                None,
                None,
                None,
                None,
                job.request_gpus,
                job.qdate,
                None,
                None,
                "queued",
                job.profile,
                None,
            )
        )
    return {
        "gpu_state_intervals.parquet": t_int.close(),
        "availability_periods.parquet": t_av.close(),
        "evictions.parquet": t_ev.close(),
        "jobs.parquet": t_jobs.close(),
        "hosts.parquet": t_hosts.close(),
    }
