"""adstash-style job documents (NDJSON of Elasticsearch ``_source`` objects).

``jobs/jobs-YYYY-MM-DD.ndjson``: one document per job that left the queue (completed: JobStatus 4,
or removed after an eviction: JobStatus 3) inside the window, filed by the UTC day of RecordTime.
``jobs/epochs-YYYY-MM-DD.ndjson``: one document per run attempt that ended inside the window
(completed or evicted), as adstash indexes job epoch ads. Jobs still running or idle at the window
end have no job document.

Field names follow condor_adstash: attributes adstash knows keep its spelling (matched
case-insensitively, so the job ad's ``RequestGPUs`` becomes ``RequestGpus``), every other attribute
is lower-cased (``RemoteOwner`` -> ``remoteowner``, ``NumVacates`` -> ``numvacates``,
``VacateReasonCode`` -> ``vacatereasoncode``). Dates are integer epoch seconds. adstash adds
RecordTime, ScheddName, StartdName and StartdSlot (LastRemoteHost split at the last ``@``), and the
Status / Universe names of JobStatus / JobUniverse.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from gpu_pipeline.lib.sim_engine import (
    VACATE_REASON,
    VACATE_REASON_CODE,
    VACATE_REASON_NAME,
    Job,
    PoolHistory,
    Run,
)

#: The attributes we emit that adstash's type tables know, in adstash's spelling.
ADSTASH_KNOWN_ATTRS = (
    "AccountingGroup",
    "AcctGroup",
    "AssignedGPUs",
    "ClusterId",
    "CommittedTime",
    "CompletionDate",
    "EnteredCurrentStatus",
    "EpochWriteDate",
    "ExitCode",
    "GlobalJobId",
    "JobCurrentStartDate",
    "JobStartDate",
    "JobStatus",
    "JobUniverse",
    "LastJobStatus",
    "LastRemoteHost",
    "LastVacateTime",
    "MyType",
    "NumJobStarts",
    "Owner",
    "ProcId",
    "ProjectName",
    "QDate",
    "RecordTime",
    "RemoteWallClockTime",
    "RequestCpus",
    "RequestDisk",
    "RequestGpus",
    "RequestMemory",
    "ScheddName",
    "StartdName",
    "StartdSlot",
    "Status",
    "Universe",
    "User",
)
_KNOWN = {a.lower(): a for a in ADSTASH_KNOWN_ATTRS}
_KEY_CACHE: dict[str, str] = {}
STATUS_NAMES = {1: "Idle", 2: "Running", 3: "Removed", 4: "Completed"}


#: Every this many clusters a job names the device model it can use (``require_gpus``) -- when all
#: its runs were on one model: the scheduler does not read the requirement, so only such a job's
#: requirement is true to where it ran.
REQUIRE_DEVICE_EVERY = 3


def required_device(job: Job, hosts: list) -> str | None:
    """The device model ``job``'s ``RequireGPUs`` names (its documents' ``RequireGPUs_EXPR``), or None."""
    if not job.runs or job.cluster_id % REQUIRE_DEVICE_EVERY:
        return None
    models = {hosts[r.host].model.name for r in job.runs}
    return models.pop() if len(models) == 1 else None


def require_gpus_expr(device: str) -> str:
    """``require_gpus = DeviceName == "<device>"`` as the ClassAd expression's text."""
    return f'DeviceName == "{device}"'


def adstash_key(attr: str) -> str:
    """Field name adstash gives ClassAd attribute ``attr``."""
    key = _KEY_CACHE.get(attr)
    if key is None:
        key = _KEY_CACHE[attr] = _KNOWN.get(attr.lower(), attr.lower())
    return key


def _host_doc(ad: dict, record_time: int, host_name: str, run: Run) -> dict:
    """Add adstash's fields and rename every attribute."""
    ad["LastRemoteHost"] = f"{run.slot_name}@{host_name}"
    slot, _, startd = ad["LastRemoteHost"].rpartition("@")
    ad["RecordTime"] = record_time
    ad["ScheddName"] = run.job.schedd
    ad["StartdSlot"] = slot
    ad["StartdName"] = startd
    ad["Status"] = STATUS_NAMES[ad["JobStatus"]]
    ad["Universe"] = "Vanilla"
    return {adstash_key(k): v for k, v in ad.items()}


def _identity(job: Job) -> dict:
    return {
        "MyType": "Job",
        "GlobalJobId": job.global_job_id,
        "ClusterId": job.cluster_id,
        "ProcId": 0,
        "Owner": job.user,
        "User": job.remote_owner,
        "RemoteOwner": job.remote_owner,
        "AcctGroup": job.project,
        "AccountingGroup": f"{job.project}.{job.user}",
        "ProjectName": job.project,
        "JobUniverse": 5,
        "QDate": job.qdate,
        "RequestGPUs": job.request_gpus,
        "RequestCpus": job.request_cpus,
        "RequestMemory": job.request_memory_mb,
        "RequestDisk": job.request_disk_kb,
    }


def _vacates(ad: dict, runs: list[Run]) -> None:
    evicted = [r for r in runs if r.end_reason == "evicted"]
    ad["NumVacates"] = len(evicted)
    if evicted:
        ad["LastVacateTime"] = evicted[-1].end
        ad["VacateReasonCode"] = VACATE_REASON_CODE
        ad["VacateReasonSubCode"] = 0
        ad["VacateReason"] = VACATE_REASON
        ad["NumVacatesByReason"] = {VACATE_REASON_NAME: len(evicted)}


def job_document(job: Job, host_name: str, record_time: int, ids: list[str]) -> dict:
    """History document of a job that left the queue at ``record_time``."""
    runs = job.runs
    last = runs[-1]
    completed = last.end_reason == "completed"
    ad = _identity(job)
    ad.update(
        JobStatus=4 if completed else 3,
        LastJobStatus=2 if completed else 1,
        JobStartDate=runs[0].start,
        JobCurrentStartDate=last.start,
        CompletionDate=last.end if completed else 0,
        EnteredCurrentStatus=record_time,
        NumJobStarts=len(runs),
        RemoteWallClockTime=sum(r.end - r.start for r in runs),
        CommittedTime=(last.end - last.start) if completed else 0,
        LastRemoteWallClockTime=last.end - last.start,
        AssignedGPUs=",".join(ids[g] for g in last.gpus),
    )
    if completed:
        ad["ExitCode"] = 0
    _vacates(ad, runs)
    return _host_doc(ad, record_time, host_name, last)


def epoch_document(run: Run, host_name: str, ids: list[str]) -> dict:
    """Epoch (run attempt) document of a run that ended."""
    job = run.job
    runs = job.runs[: run.index + 1]
    completed = run.end_reason == "completed"
    ad = _identity(job)
    ad.update(
        JobStatus=4 if completed else 1,  # an evicted job goes back to Idle
        LastJobStatus=2,
        JobStartDate=runs[0].start,
        JobCurrentStartDate=run.start,
        CompletionDate=run.end if completed else 0,
        EnteredCurrentStatus=run.end,
        EpochWriteDate=run.end,
        NumJobStarts=run.index + 1,
        RemoteWallClockTime=sum(r.end - r.start for r in runs),
        CommittedTime=(run.end - run.start) if completed else 0,
        LastRemoteWallClockTime=run.end - run.start,
        AssignedGPUs=",".join(ids[g] for g in run.gpus),
    )
    _vacates(ad, runs)
    return _host_doc(ad, run.end, host_name, run)


def _utc_day(t: int) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d")


def _write_days(
    jobs_dir: Path, prefix: str, items: list[tuple[int, str, int, object]], render
) -> dict[str, int]:
    items.sort(key=lambda x: (x[0], x[1], x[2]))
    counts: dict[str, int] = {}
    fh = None
    day = None
    for t, _, _, obj in items:
        d = _utc_day(t)
        if d != day:
            if fh is not None:
                fh.close()
            day = d
            name = f"{prefix}-{d}.ndjson"
            fh = open(jobs_dir / name, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
            counts[name] = 0
        fh.write(json.dumps(render(obj), sort_keys=True, separators=(",", ":")))
        fh.write("\n")
        counts[name] += 1
    if fh is not None:
        fh.close()
    return counts


def write_job_documents(
    jobs_dir: Path, history: PoolHistory, window_start: int, window_end: int
) -> dict[str, int]:
    """Write job and epoch NDJSON files; returns document counts by file name."""
    jobs_dir.mkdir(parents=True, exist_ok=True)
    hosts = [tl.host for tl in history.timelines]
    ids = [[g.short_id for g in host.gpus] for host in hosts]
    finals: list[tuple[int, str, int, object]] = []
    epochs: list[tuple[int, str, int, object]] = []
    for job in history.jobs:
        if not job.runs:
            continue
        record = _record_time(job)
        if record is not None and window_start <= record < window_end:
            finals.append((record, job.global_job_id, 0, job))
        for r in job.runs:
            if r.end is not None and window_start <= r.end < window_end:
                epochs.append((r.end, job.global_job_id, r.index, r))

    def required(doc: dict, job: Job) -> dict:
        # adstash keeps an expression it cannot evaluate (DeviceName is a GPU's, not the job's) as text
        # under <Attr>_EXPR
        if (device := required_device(job, hosts)) is not None:
            doc[adstash_key("RequireGPUs_EXPR")] = require_gpus_expr(device)
        return doc

    def render_job(job: Job) -> dict:
        last = job.runs[-1]
        return required(job_document(job, hosts[last.host].name, _record_time(job), ids[last.host]), job)

    def render_epoch(run: Run) -> dict:
        return required(epoch_document(run, hosts[run.host].name, ids[run.host]), run.job)

    counts = _write_days(jobs_dir, "jobs", finals, render_job)
    counts.update(_write_days(jobs_dir, "epochs", epochs, render_epoch))
    return counts


def _record_time(job: Job) -> int | None:
    """When the job left the queue: completion, or removal after an eviction; None if still queued."""
    last = job.runs[-1] if job.runs else None
    if last is not None and last.end_reason == "completed":
        return last.end
    return job.removed_at
