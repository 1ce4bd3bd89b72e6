"""Kueue ``/metrics`` scrapes derived from the simulated job history (the Kubernetes demand path).

The simulated pool is an HTCondor pool; to exercise the Kueue source on the same workload, each
project's primary jobs are presented as the workloads of one ClusterQueue (``cq-<project>``):
pending = queued (submitted, not started), usage = GPUs of its running jobs, nominal quota = the
GPUs of the hosts that prioritize the project (the open-capacity pool for ``CHTC_Open``), and the
admission-wait histogram accumulates start - submit of every job admitted so far. Scrapes are
written every ``interval_s`` as ``kueue/kueue-YYYYMMDDTHHMMSSZ.prom`` (UTC time in the name).
"""

from __future__ import annotations

import datetime as dt
import re
from bisect import bisect_right
from pathlib import Path

import pyarrow.parquet as pq

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
OPEN_PROJECT = "CHTC_Open"


def queue_name(project: str) -> str:
    return "cq-" + re.sub(r"[^a-z0-9]+", "-", project.lower()).strip("-")


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def write_kueue_scrapes(out_dir: Path, truth_dir: Path, window_start: int, window_end: int,
                        interval_s: int = 900) -> dict[str, int]:
    """Write the scrapes for [window_start, window_end) (epoch seconds); returns file -> samples."""
    jobs = [r for r in pq.read_table(truth_dir / "jobs.parquet").to_pylist()
            if r["kind"] == "primary" and r["run_index"] == 0 and r["qdate_utc"] is not None]
    hosts = pq.read_table(truth_dir / "hosts.parquet").to_pylist()
    quota: dict[str, int] = {}
    for h in hosts:
        projects = [p.strip() for p in (h["prioritized_projects"] or "").split(",") if p.strip()] or [OPEN_PROJECT]
        for p in projects:
            quota[p] = quota.get(p, 0) + int(h["n_gpus"])
    projects = sorted({j["project"] for j in jobs} | set(quota))

    def ts(x: dt.datetime | None) -> float | None:
        return None if x is None else x.timestamp()

    by_project: dict[str, list[tuple[float, float | None, float | None, int]]] = {p: [] for p in projects}
    for j in jobs:
        by_project[j["project"]].append((ts(j["qdate_utc"]), ts(j["start_utc"]), ts(j["end_utc"]),
                                         int(j["request_gpus"] or 1)))

    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, int] = {}
    t = window_start - window_start % interval_s
    while t < window_end:
        if t >= window_start:
            lines: list[str] = []
            pending, pending_gpus, usage, waits = {}, {}, {}, {}
            for p in projects:
                q = [j for j in by_project[p] if j[0] <= t and (j[1] is None or j[1] > t)]
                pending[p] = len(q)
                pending_gpus[p] = sum(j[3] for j in q)
                usage[p] = sum(j[3] for j in by_project[p]
                               if j[1] is not None and j[1] <= t and (j[2] is None or j[2] > t))
                waits[p] = sorted(j[1] - j[0] for j in by_project[p] if j[1] is not None and j[1] <= t)
            lab = 'replica_role="leader"'
            lines += ["# HELP kueue_pending_workloads Number of pending workloads, per 'cluster_queue' and 'status'.",
                      "# TYPE kueue_pending_workloads gauge"]
            for p in projects:
                for status, n in (("active", pending[p]), ("inadmissible", 0)):
                    lines.append(f'kueue_pending_workloads{{cluster_queue="{queue_name(p)}",{lab},status="{status}"}} {n}')
            for name, values, helptext in (
                ("kueue_cluster_queue_resource_usage", usage, "Total quantity of used quota per resource"),
                ("kueue_cluster_queue_nominal_quota", quota, "Nominal quota per resource"),
            ):
                lines += [f"# HELP {name} {helptext}", f"# TYPE {name} gauge"]
                for p in projects:
                    lines.append(f'{name}{{cluster_queue="{queue_name(p)}",flavor="default",{lab},'
                                 f'resource="nvidia.com/gpu"}} {values.get(p, 0)}')
            lines += ["# HELP kueue_cluster_queue_resource_pending Pending resource requests per resource",
                      "# TYPE kueue_cluster_queue_resource_pending gauge"]
            for p in projects:
                lines.append(f'kueue_cluster_queue_resource_pending{{cluster_queue="{queue_name(p)}",{lab},'
                             f'resource="nvidia.com/gpu"}} {pending_gpus[p]}')
            lines += ["# HELP kueue_admission_wait_time_seconds The time between a workload was created or "
                      "requeued until admission, per 'cluster_queue'",
                      "# TYPE kueue_admission_wait_time_seconds histogram"]
            for p in projects:
                w = waits[p]
                base = f'cluster_queue="{queue_name(p)}",priority_class="",{lab}'
                for b in BUCKETS:
                    lines.append(f'kueue_admission_wait_time_seconds_bucket{{{base},le="{b}"}} {bisect_right(w, b)}')
                lines.append(f'kueue_admission_wait_time_seconds_bucket{{{base},le="+Inf"}} {len(w)}')
                lines.append(f"kueue_admission_wait_time_seconds_sum{{{base}}} {_fmt(sum(w))}")
                lines.append(f"kueue_admission_wait_time_seconds_count{{{base}}} {len(w)}")
            name = f"kueue-{dt.datetime.fromtimestamp(t, dt.UTC):%Y%m%dT%H%M%SZ}.prom"
            (out_dir / name).write_text("\n".join(lines) + "\n")
            written[name] = sum(1 for ln in lines if not ln.startswith("#"))
        t += interval_s
    return written
