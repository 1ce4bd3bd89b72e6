"""Discrete-event simulation of primary jobs, backfill jobs, drains and dropouts.

Hosts are simulated per :class:`~gpu_pipeline.lib.sim_cluster.Group` (the hosts one job queue
feeds), each group with its own random stream, so a pool of any size costs a set of small event
loops. The result is one :class:`HostTimeline` per host, whose ordered *event log*
``(t, code, run)`` is the single source of every output (slot snapshots, ground truth, job
documents, telemetry): writers replay it with :class:`HostState`, so all outputs describe the
same history.

Model (times are integer epoch seconds):

* Primary jobs arrive per group as a non-homogeneous Poisson process with a diurnal,
  weekday-heavy rate (:func:`diurnal_multiplier`) scaled to the group's offered load
  ``Group.load``. They wait in the group's FIFO queue and start, first fit, on a host of the group
  with enough GPUs free of primary jobs (best fit: the host with the fewest sufficient free GPUs),
  preferring GPUs without a backfill job (lowest index first). A GPU running a backfill job is
  taken last, and that backfill job is evicted at the same second.
* On prioritized hosts every GPU that is free of primary and backfill work, not draining and not
  dropped out, is claimed by a backfill job after a random delay (exponential around
  ``Host.backfill_delay_mean_s``; with probability :data:`BACKFILL_SLOW_CLAIM_P` a slow claim of
  hours). An evicted backfill job is re-queued (probability :data:`BACKFILL_RESTART_P`, at most
  :data:`BACKFILL_MAX_RUNS` runs) and restarts from scratch on the next backfill claim in its
  group (same GlobalJobId, next run index); otherwise its owner removes it.
* Drains: no job starts on a draining host; running jobs (primary and backfill) run to completion.
* Dropouts: the startd vanishes from the collector; running jobs continue, nothing new is
  matched on it (the negotiator cannot see it) until it returns.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpu_pipeline.lib.sim_cluster import (
    BACKFILL_SCHEDD,
    BACKFILL_UID_DOMAIN,
    BACKFILL_USERS,
    OPEN_SCHEDD,
    OPEN_USERS,
    PRIMARY_SCHEDDS,
    PROJECTS,
    STREAM_HOST,
    STREAM_IDS,
    UID_DOMAIN,
    Cluster,
    Group,
    Host,
    LocalClock,
    rng_for,
)

# Event codes of the host log.
P_START, P_END, B_START, B_END, DRAIN_ON, DRAIN_OFF, DROP_ON, DROP_OFF = range(8)
_ARRIVE, _CLAIM = 100, 101  # internal only, never logged

PROFILES = ("efficient", "io_bound", "held_idle")
PRIMARY_PROFILE_P = (0.45, 0.35, 0.20)
BACKFILL_PROFILE_P = (0.60, 0.30, 0.10)
_PRIMARY_PROFILE_CUM = np.cumsum(PRIMARY_PROFILE_P)
_BACKFILL_PROFILE_CUM = np.cumsum(BACKFILL_PROFILE_P)

#: Primary durations: mixture of (share, median s, lognormal sigma): short, typical, long.
PRIMARY_DURATION_MIX = ((0.20, 600.0, 0.5), (0.65, 3 * 3600.0, 0.7), (0.15, 20 * 3600.0, 0.3))
PRIMARY_MAX_DURATION_S = 72 * 3600
#: GPUs requested by primary jobs and their probabilities.
REQUEST_GPUS = ((1, 0.80), (2, 0.13), (4, 0.07))

BACKFILL_MEDIAN_S, BACKFILL_SIGMA = 1.5 * 3600, 1.0
BACKFILL_SLOW_CLAIM_P, BACKFILL_SLOW_CLAIM_MEAN_S = 0.15, 3 * 3600.0
BACKFILL_RESTART_P, BACKFILL_MAX_RUNS = 0.85, 6

DRAIN_RATE_PER_HOST_DAY, DRAIN_MIN_S, DRAIN_MAX_S = 1 / 20, 2 * 3600, 6 * 3600
DROPOUT_RATE_PER_HOST_DAY, DROPOUT_MIN_S, DROPOUT_MAX_S = 1 / 12, 10 * 60, 2 * 3600

#: Vacate reason of an evicted backfill job: HTCondor JobReasonCode StartdPreemptingClaimRank.
VACATE_REASON_CODE = 1018
VACATE_REASON = "Preempted for a higher Ranked job"
VACATE_REASON_NAME = "StartdPreemptingClaimRank"


def _mean_primary_gpu_seconds() -> float:
    mean_d = sum(share * med * math.exp(sig * sig / 2) for share, med, sig in PRIMARY_DURATION_MIX)
    mean_g = sum(g * p for g, p in REQUEST_GPUS)
    return mean_d * mean_g


MEAN_PRIMARY_GPU_SECONDS = _mean_primary_gpu_seconds()


def _raw_diurnal(local_s: np.ndarray) -> np.ndarray:
    hour = (local_s % 86400) / 3600.0
    weekday = (local_s // 86400 + 3) % 7  # 1970-01-01 was a Thursday; 0 = Monday
    m = 0.35 + np.exp(-0.5 * ((hour - 14.0) / 3.5) ** 2)
    return np.where(weekday >= 5, 0.55 * m, m)


_DIURNAL_MEAN = float(_raw_diurnal(np.arange(0, 7 * 86400, 300, dtype=np.int64)).mean())
_DIURNAL_MAX = float(_raw_diurnal(np.arange(0, 7 * 86400, 300, dtype=np.int64)).max()) / _DIURNAL_MEAN


def diurnal_multiplier(local_s: np.ndarray) -> np.ndarray:
    """Arrival-rate multiplier (weekly mean 1) at naive local seconds: peak ~14:00, quiet weekends."""
    return _raw_diurnal(np.asarray(local_s, dtype=np.int64)) / _DIURNAL_MEAN


@dataclass(slots=True, eq=False)
class Job:
    """A job (HTCondor proc) with its telemetry profile and all its runs."""

    kind: str  #: "primary" or "backfill"
    group: int  #: index of the group whose queue it was submitted to
    seq: int  #: creation order within the group (deterministic tie-breaker)
    user: str
    project: str
    schedd: str
    uid_domain: str
    qdate: int
    duration_s: int  #: wall time one complete run needs (restarts start from scratch)
    request_gpus: int
    request_cpus: int
    request_memory_mb: int
    request_disk_kb: int
    profile: str  #: one of :data:`PROFILES`
    usage: float  #: mean GPU utilisation 0..1 while running (also ``GPUsAverageUsage``)
    power_frac: float  #: mean board power / power limit while running (0: idle power)
    mem_frac: float  #: framebuffer fraction in use
    mem_util_ratio: float  #: utilization.memory / utilization.gpu
    sm_ratio: float  #: SM_ACTIVE / GR_ENGINE_ACTIVE
    tensor_ratio: float  #: PIPE_TENSOR_ACTIVE / GR_ENGINE_ACTIVE
    runs: list[Run] = field(default_factory=list)
    removed_at: int | None = None  #: removal time of a backfill job given up after eviction
    cluster_id: int = 0
    global_job_id: str = ""

    @property
    def remote_owner(self) -> str:
        return f"{self.user}@{self.uid_domain}"


@dataclass(slots=True, eq=False)
class Run:
    """One run attempt (epoch) of a job on a set of GPUs of one host."""

    job: Job
    index: int  #: 0-based run index (NumJobStarts - 1)
    host: int  #: host index
    gpus: tuple[int, ...]  #: device indices on the host
    slot_id: int  #: N of the dynamic slot ``slot1_N`` / ``backfill2_N``
    start: int
    end: int | None = None
    end_reason: str = "running"  #: "completed", "evicted" or "running"
    evicted_by: Job | None = None

    @property
    def slot_name(self) -> str:
        return f"slot1_{self.slot_id}" if self.job.kind == "primary" else f"backfill2_{self.slot_id}"


@dataclass(slots=True)
class HostTimeline:
    """Everything that happened on one host between the simulation start and end."""

    host: Host
    events: list[tuple[int, int, Run | None]]  #: ``(t, code, run)`` in replay order
    drains: list[tuple[int, int]]
    dropouts: list[tuple[int, int]]


@dataclass(slots=True)
class PoolHistory:
    """Result of :func:`simulate_pool`."""

    timelines: list[HostTimeline]  #: one per host, in host index order
    jobs: list[Job]  #: every job submitted (groups in order, then creation order)


class HostState:
    """Host configuration at a point in time, obtained by replaying a host's event log."""

    __slots__ = ("prim", "bf", "draining", "dropped")

    def __init__(self, n_gpus: int):
        self.prim: list[Run | None] = [None] * n_gpus
        self.bf: list[Run | None] = [None] * n_gpus
        self.draining = False
        self.dropped = False

    def apply(self, code: int, run: Run | None) -> None:
        if code == P_START:
            for g in run.gpus:
                self.prim[g] = run
        elif code == P_END:
            for g in run.gpus:
                self.prim[g] = None
        elif code == B_START:
            self.bf[run.gpus[0]] = run
        elif code == B_END:
            self.bf[run.gpus[0]] = None
        elif code == DRAIN_ON:
            self.draining = True
        elif code == DRAIN_OFF:
            self.draining = False
        elif code == DROP_ON:
            self.dropped = True
        elif code == DROP_OFF:
            self.dropped = False


def _intervals(
    rng: np.random.Generator, start: int, end: int, rate_per_day: float, min_s: int, max_s: int, log: bool
) -> list[tuple[int, int]]:
    """Non-overlapping random intervals (Poisson starts) in ``[start, end)``."""
    out: list[tuple[int, int]] = []
    t = start + int(rng.exponential(86400 / rate_per_day))
    while t < end:
        if log:
            d = int(math.exp(rng.uniform(math.log(min_s), math.log(max_s))))
        else:
            d = int(rng.uniform(min_s, max_s))
        out.append((t, t + d))
        t += d + 1 + int(rng.exponential(86400 / rate_per_day))
    return out


def _lowest_free(used: set[int]) -> int:
    n = 1
    while n in used:
        n += 1
    return n


class _HostSlots:
    """Mutable per-host state of a running group simulation."""

    __slots__ = (
        "host",
        "prim",
        "bf",
        "token",
        "draining",
        "dropped",
        "p_slots",
        "b_slots",
        "events",
        "bucket",
    )

    def __init__(self, host: Host):
        n = host.n_gpus
        self.host = host
        self.prim: list[Run | None] = [None] * n
        self.bf: list[Run | None] = [None] * n
        self.token = [0] * n
        self.draining = False
        self.dropped = False
        self.p_slots: set[int] = set()
        self.b_slots: set[int] = set()
        self.events: list[tuple[int, int, Run | None]] = []
        self.bucket = 0  #: free primary GPUs it is filed under in ``_GroupSim.by_free`` (0: none)

    def schedulable_free(self) -> int:
        if self.draining or self.dropped:
            return 0
        return sum(1 for r in self.prim if r is None)


class _GroupSim:
    """Event loop of one group of hosts (internal; use :func:`simulate_pool`)."""

    def __init__(
        self,
        group: Group,
        hosts: tuple[Host, ...],
        sim_start: int,
        sim_end: int,
        clock: LocalClock,
        seed: int,
    ):
        self.group = group
        self.start, self.end = sim_start, sim_end
        self.clock = clock
        self.rng = rng_for(seed, STREAM_HOST, group.index)
        self.slots = {i: _HostSlots(hosts[i]) for i in group.hosts}
        self.max_gpus = max(hosts[i].n_gpus for i in group.hosts)
        self.by_free: list[set[int]] = [set() for _ in range(self.max_gpus + 1)]
        self.queue: list[Job] = []
        self.restart: deque[Job] = deque()
        self.heap: list[tuple[int, int, int, int, object]] = []
        self.seq = 0
        self.jobs: list[Job] = []

    # -- helpers ---------------------------------------------------------------------------
    def _push(self, t: int, prio: int, code: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, prio, self.seq, code, payload))

    def _rebucket(self, h: int) -> None:
        hs = self.slots[h]
        k = hs.schedulable_free()
        if k != hs.bucket:
            if hs.bucket:
                self.by_free[hs.bucket].discard(h)
            if k:
                self.by_free[k].add(h)
            hs.bucket = k

    def _max_free(self) -> int:
        for k in range(self.max_gpus, 0, -1):
            if self.by_free[k]:
                return k
        return 0

    def _new_job(
        self,
        kind: str,
        user: str,
        project: str,
        schedd: str,
        domain: str,
        qdate: int,
        duration_s: int,
        request_gpus: int,
    ) -> Job:
        u = self.rng.random(10)
        cum = _PRIMARY_PROFILE_CUM if kind == "primary" else _BACKFILL_PROFILE_CUM
        profile = PROFILES[int(np.searchsorted(cum, u[9] * cum[-1], side="right"))]
        if profile == "efficient":
            usage, power, mem = 0.85 + 0.14 * u[0], 0.75 + 0.20 * u[1], 0.5 + 0.45 * u[2]
            mem_util, sm, tensor = 0.35 + 0.4 * u[3], 0.75 + 0.2 * u[4], 0.3 + 0.4 * u[5]
        elif profile == "io_bound":
            usage, power, mem = 0.30 + 0.30 * u[0], 0.35 + 0.20 * u[1], 0.2 + 0.4 * u[2]
            mem_util, sm, tensor = 0.2 + 0.3 * u[3], 0.5 + 0.3 * u[4], 0.02 + 0.13 * u[5]
        else:  # held_idle: a claimed GPU doing (almost) nothing, at idle power
            usage, power, mem = 0.03 * u[0], 0.0, 0.02 + 0.28 * u[2]
            mem_util, sm, tensor = 0.2 * u[3], 0.3 + 0.3 * u[4], 0.0
        job = Job(
            kind=kind,
            group=self.group.index,
            seq=len(self.jobs),
            user=user,
            project=project,
            schedd=schedd,
            uid_domain=domain,
            qdate=qdate,
            duration_s=duration_s,
            request_gpus=request_gpus,
            request_cpus=(1, 2, 4, 8, 16)[int(u[6] * 5)] * request_gpus,
            request_memory_mb=(4096, 8192, 16384, 32768, 65536)[int(u[7] * 5)] * request_gpus,
            request_disk_kb=(5 + int(u[8] * 195)) * 1024 * 1024,
            profile=profile,
            usage=round(float(usage), 4),
            power_frac=float(power),
            mem_frac=float(mem),
            mem_util_ratio=float(mem_util),
            sm_ratio=float(sm),
            tensor_ratio=float(tensor),
        )
        self.jobs.append(job)
        return job

    def _primary_arrivals(self) -> list[Job]:
        group, rng = self.group, self.rng
        n_gpus = sum(hs.host.n_gpus for hs in self.slots.values())
        base = group.load * n_gpus / MEAN_PRIMARY_GPU_SECONDS  # arrivals per second
        n_cand = int(rng.poisson(base * _DIURNAL_MAX * (self.end - self.start)))
        cand = np.sort(rng.integers(self.start, self.end, size=n_cand))
        times = cand[rng.random(n_cand) * _DIURNAL_MAX < diurnal_multiplier(self.clock.local_s(cand))]
        n = len(times)
        mix = np.array([m[0] for m in PRIMARY_DURATION_MIX])
        kind = rng.choice(len(PRIMARY_DURATION_MIX), size=n, p=mix / mix.sum())
        med = np.array([m[1] for m in PRIMARY_DURATION_MIX])[kind]
        sig = np.array([m[2] for m in PRIMARY_DURATION_MIX])[kind]
        dur = np.clip(med * np.exp(sig * rng.standard_normal(n)), 120, PRIMARY_MAX_DURATION_S).astype(
            np.int64
        )
        req_p = np.array([p for _, p in REQUEST_GPUS])
        req = np.array([g for g, _ in REQUEST_GPUS])[
            rng.choice(len(REQUEST_GPUS), size=n, p=req_p / req_p.sum())
        ]
        who = rng.random(n)
        jobs = []
        for i in range(n):
            r = int(req[i])
            while r > self.max_gpus:
                r //= 2
            if group.prioritized:
                project = group.projects[int(who[i] * len(group.projects))]
                members = PROJECTS[project]
                user = members[int(who[i] * 997) % len(members)]
                schedd = PRIMARY_SCHEDDS[sum(map(ord, user)) % len(PRIMARY_SCHEDDS)]
            else:
                user, project = OPEN_USERS[int(who[i] * len(OPEN_USERS))]
                schedd = OPEN_SCHEDD
            jobs.append(
                self._new_job("primary", user, project, schedd, UID_DOMAIN, int(times[i]), int(dur[i]), r)
            )
        return jobs

    def _new_backfill_job(self, t: int) -> Job:
        rng = self.rng
        user, project = BACKFILL_USERS[int(rng.integers(len(BACKFILL_USERS)))]
        dur = int(
            np.clip(BACKFILL_MEDIAN_S * math.exp(BACKFILL_SIGMA * rng.standard_normal()), 300, 48 * 3600)
        )
        qdate = t - int(rng.integers(60, 6 * 3600))
        return self._new_job("backfill", user, project, BACKFILL_SCHEDD, BACKFILL_UID_DOMAIN, qdate, dur, 1)

    def _schedule_claim(self, h: int, g: int, t: int) -> None:
        hs = self.slots[h]
        if not hs.host.prioritized or hs.prim[g] or hs.bf[g] or hs.draining or hs.dropped:
            return
        hs.token[g] += 1
        if self.rng.random() < BACKFILL_SLOW_CLAIM_P:
            delay = self.rng.exponential(BACKFILL_SLOW_CLAIM_MEAN_S)
        else:
            delay = self.rng.exponential(hs.host.backfill_delay_mean_s)
        self._push(t + max(30, int(delay)), 3, _CLAIM, (h, g, hs.token[g]))

    # -- transitions ---------------------------------------------------------------------------
    def _try_start(self, t: int) -> None:
        if not self.queue:
            return
        top = self._max_free()
        if top == 0:
            return
        waiting: list[Job] = []
        for i, job in enumerate(self.queue):
            if top == 0:
                waiting.extend(self.queue[i:])
                break
            r = job.request_gpus
            if r > top:
                waiting.append(job)
                continue
            k = next(k for k in range(r, top + 1) if self.by_free[k])
            h = min(self.by_free[k])
            self._start_primary(job, h, t)
            top = self._max_free()
        self.queue = waiting

    def _start_primary(self, job: Job, h: int, t: int) -> None:
        hs = self.slots[h]
        free = [g for g in range(hs.host.n_gpus) if hs.prim[g] is None]
        free.sort(key=lambda g: (hs.bf[g] is not None, g))
        gpus = tuple(sorted(free[: job.request_gpus]))
        for g in gpus:
            victim = hs.bf[g]
            if victim is not None:
                self._evict(hs, victim, t, job)
            hs.token[g] += 1
        run = Run(job, len(job.runs), h, gpus, _lowest_free(hs.p_slots), t)
        hs.p_slots.add(run.slot_id)
        job.runs.append(run)
        for g in gpus:
            hs.prim[g] = run
        hs.events.append((t, P_START, run))
        self._rebucket(h)
        self._push(t + job.duration_s, 0, P_END, run)

    def _evict(self, hs: _HostSlots, run: Run, t: int, by: Job) -> None:
        run.end, run.end_reason, run.evicted_by = t, "evicted", by
        hs.bf[run.gpus[0]] = None
        hs.b_slots.discard(run.slot_id)
        hs.events.append((t, B_END, run))
        job = run.job
        if len(job.runs) < BACKFILL_MAX_RUNS and self.rng.random() < BACKFILL_RESTART_P:
            self.restart.append(job)
        else:
            job.removed_at = t + int(self.rng.integers(60, 1800))

    def _start_backfill(self, h: int, g: int, t: int) -> None:
        hs = self.slots[h]
        job = self.restart.popleft() if self.restart else self._new_backfill_job(t)
        run = Run(job, len(job.runs), h, (g,), _lowest_free(hs.b_slots), t)
        hs.b_slots.add(run.slot_id)
        job.runs.append(run)
        hs.bf[g] = run
        hs.events.append((t, B_START, run))
        self._push(t + job.duration_s, 0, B_END, run)

    def _end_primary(self, run: Run, t: int) -> None:
        hs = self.slots[run.host]
        run.end, run.end_reason = t, "completed"
        for g in run.gpus:
            hs.prim[g] = None
        hs.p_slots.discard(run.slot_id)
        hs.events.append((t, P_END, run))
        self._rebucket(run.host)
        self._try_start(t)
        for g in run.gpus:
            self._schedule_claim(run.host, g, t)

    def _end_backfill(self, run: Run, t: int) -> None:
        if run.end is not None:  # evicted meanwhile
            return
        hs = self.slots[run.host]
        run.end, run.end_reason = t, "completed"
        hs.bf[run.gpus[0]] = None
        hs.b_slots.discard(run.slot_id)
        hs.events.append((t, B_END, run))
        self._schedule_claim(run.host, run.gpus[0], t)

    def _toggle(self, h: int, code: int, t: int) -> None:
        hs = self.slots[h]
        if code in (DRAIN_ON, DRAIN_OFF):
            hs.draining = code == DRAIN_ON
        else:
            hs.dropped = code == DROP_ON
        hs.events.append((t, code, None))
        self._rebucket(h)
        if code in (DRAIN_OFF, DROP_OFF):
            self._try_start(t)
            for g in range(hs.host.n_gpus):
                self._schedule_claim(h, g, t)

    def run(self) -> tuple[dict[int, HostTimeline], list[Job]]:
        rng = self.rng
        intervals = {}
        for h, hs in self.slots.items():
            drains = _intervals(
                rng, self.start, self.end, DRAIN_RATE_PER_HOST_DAY, DRAIN_MIN_S, DRAIN_MAX_S, False
            )
            dropouts = _intervals(
                rng, self.start, self.end, DROPOUT_RATE_PER_HOST_DAY, DROPOUT_MIN_S, DROPOUT_MAX_S, True
            )
            intervals[h] = (drains, dropouts)
            for s, e in drains:
                self._push(s, 1, DRAIN_ON, h)
                self._push(e, 1, DRAIN_OFF, h)
            for s, e in dropouts:
                self._push(s, 1, DROP_ON, h)
                self._push(e, 1, DROP_OFF, h)
            self._rebucket(h)
            for g in range(hs.host.n_gpus):
                self._schedule_claim(h, g, self.start)
        for job in self._primary_arrivals():
            self._push(job.qdate, 2, _ARRIVE, job)

        while self.heap:
            t, _, _, code, obj = heapq.heappop(self.heap)
            if t >= self.end:
                break
            if code == P_END:
                self._end_primary(obj, t)
            elif code == B_END:
                self._end_backfill(obj, t)
            elif code == _ARRIVE:
                self.queue.append(obj)
                self._try_start(t)
            elif code == _CLAIM:
                h, g, token = obj
                hs = self.slots[h]
                if (
                    token == hs.token[g]
                    and hs.prim[g] is None
                    and hs.bf[g] is None
                    and not (hs.draining or hs.dropped)
                ):
                    self._start_backfill(h, g, t)
            else:
                self._toggle(obj, code, t)
        timelines = {h: HostTimeline(hs.host, hs.events, *intervals[h]) for h, hs in self.slots.items()}
        return timelines, self.jobs


def simulate_pool(
    cluster: Cluster, sim_start: int, sim_end: int, clock: LocalClock, seed: int
) -> PoolHistory:
    """Run every group's event loop over ``[sim_start, sim_end)`` (epoch seconds) and assign job ids."""
    timelines: dict[int, HostTimeline] = {}
    jobs: list[Job] = []
    for group in cluster.groups:
        tls, group_jobs = _GroupSim(group, cluster.hosts, sim_start, sim_end, clock, seed).run()
        timelines.update(tls)
        jobs.extend(group_jobs)
    assign_job_ids(jobs, seed)
    return PoolHistory([timelines[h.index] for h in cluster.hosts], jobs)


def assign_job_ids(jobs: list[Job], seed: int) -> None:
    """Give every job a ClusterId and GlobalJobId ``<schedd>#<cluster>.0#<qdate>``.

    Cluster ids grow with QDate per schedd (with gaps for other users' submissions), as a real
    schedd hands them out.
    """
    rng = rng_for(seed, STREAM_IDS)
    by_schedd: dict[str, list[Job]] = {}
    for job in jobs:
        by_schedd.setdefault(job.schedd, []).append(job)
    for schedd in sorted(by_schedd):
        ordered = sorted(by_schedd[schedd], key=lambda j: (j.qdate, j.group, j.seq))
        cluster = int(rng.integers(100_000, 9_000_000))
        gaps = rng.poisson(2.0, size=len(ordered)) + 1
        for job, gap in zip(ordered, gaps, strict=True):
            cluster += int(gap)
            job.cluster_id = cluster
            job.global_job_id = f"{schedd}#{cluster}.0#{job.qdate}"
