"""Static model of the simulated HTCondor GPU pool: GPU catalog, hosts, users, clock.

Everything here is drawn once per simulation from the seed; the dynamic part (jobs,
claims, drains, dropouts) lives in :mod:`gpu_pipeline.lib.sim_engine`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import numpy as np

#: Stream ids mixed into the seed so that independent parts of the simulation never share
#: random numbers (adding a consumer to one stream cannot shift another).
STREAM_CLUSTER = 1
STREAM_HOST = 2
STREAM_IDS = 3
STREAM_SNAPSHOTS = 4
STREAM_TELEMETRY = 5
STREAM_JOBDOCS = 6


def rng_for(seed: int, *stream: int) -> np.random.Generator:
    """Independent, reproducible generator for ``(seed, *stream)``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFF, *stream])))


# ----------------------------------------------------------------------------------------------
# GPU catalog
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    """One GPU model as HTCondor and nvidia-smi name it."""

    name: str  #: exact ``GPUs_DeviceName`` / nvidia-smi ``name``
    memory_mb: int  #: ``GPUs_GlobalMemoryMb`` == nvidia-smi ``memory.total [MiB]``
    power_limit_w: float  #: default board power limit (nvidia-smi ``power.limit``)
    tag: str  #: short tag used in host names (``gpu-a100-07``)
    host_sizes: tuple[int, ...]  #: GPUs per host this model usually comes in
    weight: float  #: share of hosts with this model
    datacenter: bool = True  #: False for GeForce: no board serial, no DCGM profiling metrics


GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel("NVIDIA A100-SXM4-80GB", 81920, 400.0, "a100", (4, 8), 0.19),
    GpuModel("NVIDIA A100-SXM4-40GB", 40960, 400.0, "a100", (4, 8), 0.12),
    GpuModel("NVIDIA H100 80GB HBM3", 81559, 700.0, "h100", (4, 8), 0.15),
    GpuModel("NVIDIA H200", 143771, 700.0, "h200", (4, 8), 0.05),
    GpuModel("NVIDIA L40S", 46068, 350.0, "l40s", (2, 4, 8), 0.10),
    GpuModel("NVIDIA A40", 46068, 300.0, "a40", (2, 4, 8), 0.09),
    GpuModel("NVIDIA GeForce RTX 2080 Ti", 11019, 250.0, "rtx", (1, 2, 4, 8), 0.11, datacenter=False),
    GpuModel("Tesla V100-SXM2-32GB", 32510, 300.0, "v100", (2, 4), 0.08),
    GpuModel("NVIDIA A10", 23028, 150.0, "a10", (1, 2, 4), 0.11),
)
MODEL_BY_NAME = {m.name: m for m in GPU_MODELS}

#: PCI bus ids of an 8-GPU HGX-style board, by device index.
PCI_BUS_IDS = (
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
)

#: Share of the pool's GPUs that sit on prioritized (owner) hosts.
PRIORITIZED_GPU_SHARE = 0.6

# ----------------------------------------------------------------------------------------------
# Users, projects, schedds
# ----------------------------------------------------------------------------------------------

UID_DOMAIN = "chtc.wisc.edu"
BACKFILL_UID_DOMAIN = "osg-htc.org"

#: Owner projects (PrioritizedProjects entries) and their members.
PROJECTS: dict[str, tuple[str, ...]] = {
    "ChemLab": ("jsmith", "lwang", "pkumar"),
    "BioNLP": ("mgarcia", "tnguyen"),
    "AstroML": ("rchen", "kpatel", "dlee"),
    "Genomics": ("aokafor", "sbrown"),
    "PhysicsSim": ("jmuller", "yzhang"),
    "VisionGroup": ("ebaker", "hsato"),
    "ClimateAI": ("fsilva", "nrossi"),
    "RoboticsLab": ("ckim", "mjones"),
    "NeuroCompute": ("apatel", "lmartin"),
    "MatSciML": ("tanaka", "rossi2"),
    "QuantumChem": ("hoffmann", "ivanova"),
    "SpeechLab": ("obrien", "nakamura"),
    "EpiModels": ("dubois", "kowalski"),
    "HEPGroup": ("schmidt", "larsen"),
}
PROJECT_NAMES = tuple(PROJECTS)
#: Prioritized hosts per owner group (a group is the set of hosts with one PrioritizedProjects
#: value); the number of groups grows with the pool up to one per project.
HOSTS_PER_OWNER_GROUP = 3
#: Share of owner groups whose hosts are co-owned by two projects ("ChemLab, BioNLP").
CO_OWNED_GROUP_P = 0.25

#: Open-capacity users (any project may use open capacity).
OPEN_USERS: tuple[tuple[str, str], ...] = (
    ("acooper", "CHTC_Open"),
    ("bdavis", "EconModels"),
    ("cevans", "NeuroImaging"),
    ("dfoster", "CHTC_Open"),
    ("egreen", "MaterialsLab"),
    ("fharris", "NeuroImaging"),
    ("gjames", "LinguisticsNLP"),
    ("hking", "CHTC_Open"),
)

#: Backfill (OSPool-style) users: (user, project).
BACKFILL_USERS: tuple[tuple[str, str], ...] = (
    ("osg-ligo", "LIGO"),
    ("osg-icecube", "IceCube"),
    ("osg-chem", "OSG-Chem"),
    ("osg-bio", "OSG-Bio"),
)

PRIMARY_SCHEDDS = ("submit1.chtc.wisc.edu", "submit2.chtc.wisc.edu")
OPEN_SCHEDD = "ap2002.chtc.wisc.edu"
BACKFILL_SCHEDD = "ap40.uw.osg-htc.org"


# ----------------------------------------------------------------------------------------------
# Hosts
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One physical GPU."""

    index: int  #: device index on its host (nvidia-smi ``index``, DCGM ``gpu``)
    short_id: str  #: HTCondor id ``GPU-xxxxxxxx``
    uuid: str  #: full ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``; starts with ``short_id``
    serial: str  #: board serial, ``[N/A]`` on GeForce
    pci_bus_id: str


@dataclass(frozen=True)
class Host:
    """One execute host (startd) with its GPUs, all of one model."""

    index: int
    name: str  #: FQDN, also the HTCondor ``Machine``
    model: GpuModel
    gpus: tuple[Gpu, ...]
    prioritized: bool
    projects: tuple[str, ...]  #: owner projects, empty on open-capacity hosts
    disk_kb: int  #: ``Disk`` of the primary partitionable slot when empty (KiB)
    telemetry: str  #: "nvidia-smi" or "dcgm"
    group: int  #: index of the :class:`Group` whose job queue feeds this host
    backfill_delay_mean_s: float  #: mean delay before an idle GPU is claimed by backfill

    @property
    def tier(self) -> str:
        return "prioritized" if self.prioritized else "shared"

    @property
    def prioritized_projects(self) -> str:
        """``PrioritizedProjects`` as the startd advertises it (``""`` for open capacity)."""
        return ", ".join(self.projects)

    @property
    def short_name(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True)
class Group:
    """Hosts fed by one job queue: an owner group (one PrioritizedProjects value) or open capacity."""

    index: int
    prioritized: bool
    projects: tuple[str, ...]  #: owner projects; empty for the open-capacity group
    hosts: tuple[int, ...]  #: host indices
    load: float  #: mean offered primary load as a fraction of the group's GPUs


@dataclass(frozen=True)
class Cluster:
    """The simulated pool: hosts in index order and the groups that partition them."""

    hosts: tuple[Host, ...]
    groups: tuple[Group, ...]


def _hex(rng: np.random.Generator, n: int) -> str:
    return "".join("0123456789abcdef"[i] for i in rng.integers(0, 16, size=n))


def build_cluster(total_gpus: int, seed: int) -> Cluster:
    """Draw hosts (1-8 GPUs each, one model per host) until ``total_gpus`` is reached exactly.

    About :data:`PRIORITIZED_GPU_SHARE` of the GPUs land on prioritized hosts (with two or more
    hosts there is always at least one host of each tier). Prioritized hosts are split into owner
    groups of about :data:`HOSTS_PER_OWNER_GROUP` hosts, each with its own PrioritizedProjects;
    open-capacity hosts form one group. Host telemetry alternates by index: even hosts log
    nvidia-smi, odd hosts run dcgm-exporter.
    """
    if total_gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {total_gpus}")
    rng = rng_for(seed, STREAM_CLUSTER)
    weights = np.array([m.weight for m in GPU_MODELS])
    weights /= weights.sum()

    sizes: list[tuple[GpuModel, int]] = []
    remaining = total_gpus
    while remaining > 0:
        model = GPU_MODELS[int(rng.choice(len(GPU_MODELS), p=weights))]
        n = min(int(rng.choice(model.host_sizes)), remaining)
        sizes.append((model, n))
        remaining -= n

    # Tier: walk the hosts in random order and fill the prioritized share first.
    target = round(PRIORITIZED_GPU_SHARE * total_gpus)
    prioritized = [False] * len(sizes)
    acc = 0
    order = [int(i) for i in rng.permutation(len(sizes))]
    for i in order:
        if acc < target:
            prioritized[i] = True
            acc += sizes[i][1]
    if len(sizes) >= 2 and all(prioritized):
        prioritized[order[-1]] = False
    if len(sizes) >= 2 and not any(prioritized):
        prioritized[order[0]] = True

    # Owner groups: consecutive prioritized hosts of the random order share a PrioritizedProjects.
    prio_hosts = [i for i in order if prioritized[i]]
    n_groups = (
        max(1, min(len(PROJECT_NAMES), round(len(prio_hosts) / HOSTS_PER_OWNER_GROUP))) if prio_hosts else 0
    )
    names = [str(p) for p in rng.permutation(PROJECT_NAMES)]
    group_projects: list[tuple[str, ...]] = []
    for k in range(n_groups):
        projects = {names[k]}
        if rng.random() < CO_OWNED_GROUP_P:  # co-owner: a project that owns no group of its own if any
            projects.add(names[(k + n_groups) % len(names)])
        group_projects.append(tuple(sorted(projects)))
    host_group = [0] * len(sizes)
    members: list[list[int]] = [[] for _ in range(n_groups + 1)]
    for j, i in enumerate(prio_hosts):
        host_group[i] = j * n_groups // len(prio_hosts)
    for i in range(len(sizes)):
        if not prioritized[i]:
            host_group[i] = n_groups  # the open-capacity group comes last
        members[host_group[i]].append(i)

    used_ids: set[str] = set()
    per_tag: dict[str, int] = {}
    hosts: list[Host] = []
    chtc_number = 2000
    for idx, (model, n) in enumerate(sizes):
        if rng.random() < 0.5:
            chtc_number += 1
            name = f"gpu{chtc_number}.chtc.wisc.edu"
        else:
            per_tag[model.tag] = per_tag.get(model.tag, 0) + 1
            name = f"gpu-{model.tag}-{per_tag[model.tag]:02d}.example.edu"
        gpus = []
        for g in range(n):
            short = _hex(rng, 8)
            while short in used_ids:
                short = _hex(rng, 8)
            used_ids.add(short)
            uuid = f"GPU-{short}-{_hex(rng, 4)}-{_hex(rng, 4)}-{_hex(rng, 4)}-{_hex(rng, 12)}"
            serial = (
                str(int(rng.integers(1_320_000_000_000, 1_799_999_999_999))) if model.datacenter else "[N/A]"
            )
            gpus.append(Gpu(g, f"GPU-{short}", uuid, serial, PCI_BUS_IDS[g % len(PCI_BUS_IDS)]))
        hosts.append(
            Host(
                index=idx,
                name=name,
                model=model,
                gpus=tuple(gpus),
                prioritized=prioritized[idx],
                projects=group_projects[host_group[idx]] if prioritized[idx] else (),
                disk_kb=int(rng.integers(900, 3800)) * 1024 * 1024,
                telemetry="nvidia-smi" if idx % 2 == 0 else "dcgm",
                group=host_group[idx],
                backfill_delay_mean_s=float(rng.uniform(20 * 60, 40 * 60)),
            )
        )
    groups = []
    for k, idxs in enumerate(members):
        if not idxs:
            continue
        prio = k < n_groups
        load = float(rng.uniform(0.45, 0.9)) if prio else float(rng.uniform(0.7, 0.9))
        groups.append(Group(k, prio, group_projects[k] if prio else (), tuple(idxs), load))
    return Cluster(tuple(hosts), tuple(groups))


# ----------------------------------------------------------------------------------------------
# Clock
# ----------------------------------------------------------------------------------------------


class LocalClock:
    """Vectorised UTC -> local-time offsets for one IANA zone over a bounded range of epochs.

    Offsets are tabulated every 15 minutes (every real DST transition falls on a quarter hour),
    so converting millions of sample times costs one numpy gather.
    """

    BUCKET_S = 900

    def __init__(self, tz: str, start_s: int, end_s: int):
        self.zone = ZoneInfo(tz)
        self.t0 = start_s - start_s % self.BUCKET_S - self.BUCKET_S
        n = (end_s - self.t0) // self.BUCKET_S + 2
        self._offsets = np.array(
            [
                int(
                    dt.datetime.fromtimestamp(self.t0 + i * self.BUCKET_S, self.zone)
                    .utcoffset()
                    .total_seconds()
                )
                for i in range(n)
            ],
            dtype=np.int64,
        )

    def offset_s(self, t_s):
        """UTC offset (seconds) at epoch second(s) ``t_s`` (int or int64 array)."""
        return self._offsets[(np.asarray(t_s, dtype=np.int64) - self.t0) // self.BUCKET_S]

    def local_s(self, t_s):
        """Naive local wall-clock seconds (as if local time were UTC) for epoch second(s)."""
        t = np.asarray(t_s, dtype=np.int64)
        return t + self.offset_s(t)


def local_midnight_utc(day: dt.date, tz: str) -> int:
    """Epoch seconds of local 00:00 on ``day`` in zone ``tz`` (first instant of that local day)."""
    return int(dt.datetime.combine(day, dt.time(0), tzinfo=ZoneInfo(tz)).timestamp())
