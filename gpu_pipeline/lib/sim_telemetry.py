"""GPU telemetry consistent with the simulated states: nvidia-smi CSV logs and dcgm-exporter text.

Even-indexed hosts log ``nvidia-smi --query-gpu=... --format=csv -l N`` into
``telemetry/nvidia-smi/HOST/nvidia-smi-YYYY-MM-DD.csv``; odd-indexed hosts keep dcgm-exporter
scrapes in ``telemetry/dcgm/HOST/dcgm-YYYY-MM-DD.prom`` (Prometheus text, one HELP/TYPE block per
metric family and file, every sample with its millisecond timestamp). Files are per *local* day.
No sample is written while the host is dropped out.

Values follow the GPU's job: an idle GPU (or one whose job is ``held_idle``) draws idle power
(8-15 % of the power limit) at 0 % utilisation; ``efficient`` jobs run at 85-100 % utilisation and
75-95 % of the power limit, ``io_bound`` jobs at 30-60 % and 35-55 %. Lines are formatted with
Arrow compute kernels so a large pool costs seconds, not minutes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.lib.sim_cluster import STREAM_TELEMETRY, Host, LocalClock, rng_for
from gpu_pipeline.lib.sim_engine import HostState, HostTimeline

NVIDIA_SMI_QUERY = (
    "timestamp,index,name,uuid,serial,utilization.gpu,utilization.memory,memory.total,memory.used,"
    "power.draw,power.limit,temperature.gpu"
)
NVIDIA_SMI_HEADER = (
    "timestamp, index, name, uuid, serial, utilization.gpu [%], utilization.memory [%], memory.total [MiB], "
    "memory.used [MiB], power.draw [W], power.limit [W], temperature.gpu"
)
#: Share of nvidia-smi rows whose power.draw reads ``[N/A]`` (driver hiccups).
NA_PROB = 0.0005

#: dcgm-exporter families written, in file order: (name, type, help).
DCGM_FAMILIES = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
)
#: Profiling (DCP) families are not available on GeForce boards: omitted for those hosts.
DCGM_PROF_PREFIX = "DCGM_FI_PROF_"

# Per-job parameter vector layout used for the activity tables below.
_BUSY, _USAGE, _POWER, _MEM, _MEMUTIL, _SM, _TENSOR = range(7)


def _activity(tl: HostTimeline) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per GPU: change times (s) and the job-parameter rows in force from each change on."""
    n = tl.host.n_gpus
    st = HostState(n)
    idle = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    times: list[list[int]] = [[-(2**62)] for _ in range(n)]
    params: list[list[tuple]] = [[idle] for _ in range(n)]
    current = [None] * n
    ev = tl.events
    i = 0
    while i < len(ev):
        t = ev[i][0]
        touched = set()
        while i < len(ev) and ev[i][0] == t:
            _, code, run = ev[i]
            st.apply(code, run)
            if run is not None:
                touched.update(run.gpus)
            i += 1
        for g in touched:
            run = st.prim[g] or st.bf[g]
            job = run.job if run is not None else None
            if job is current[g]:
                continue
            current[g] = job
            times[g].append(t)
            if job is None:
                params[g].append(idle)
            else:
                params[g].append(
                    (
                        1.0,
                        job.usage,
                        job.power_frac,
                        job.mem_frac,
                        job.mem_util_ratio,
                        job.sm_ratio,
                        job.tensor_ratio,
                    )
                )
    return [(np.array(times[g], dtype=np.int64), np.array(params[g], dtype=np.float64)) for g in range(n)]


def _str(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values, pa.int64()), pa.string())


def _fixed(values: np.ndarray, decimals: int) -> pa.Array:
    """Non-negative floats as fixed-point text (``212.34``), vectorised."""
    scale = 10**decimals
    scaled = np.rint(np.asarray(values, dtype=np.float64) * scale).astype(np.int64)
    frac = pc.utf8_lpad(_str(scaled % scale), decimals, "0")
    return pc.binary_join_element_wise(_str(scaled // scale), frac, ".")


def _as_bytes(lines: pa.Array) -> memoryview:
    """Concatenated text of a string array whose elements already end in a newline."""
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset : lines.offset + len(lines) + 1]
    return memoryview(lines.buffers()[2])[offsets[0] : offsets[-1]]


class _HostTelemetry:
    """Sample generator for one host; call :meth:`day` for consecutive local days."""

    def __init__(
        self,
        tl: HostTimeline,
        interval_s: int,
        window_start: int,
        window_end: int,
        seed: int,
        clock: LocalClock,
    ):
        host = self.host = tl.host
        self.rng = rng_for(seed, STREAM_TELEMETRY, host.index)
        self.clock = clock
        self.activity = _activity(tl)
        n = host.n_gpus
        self.idle_frac = self.rng.uniform(0.08, 0.15, size=n)
        self.base_temp = self.rng.uniform(24.0, 34.0, size=n)
        self.idle_fb = self.rng.choice(np.array([0, 1, 4]), size=n)
        self.energy_mj = self.rng.uniform(5e9, 5e11, size=n)
        self.last_ms: int | None = None
        # The logger's sampling grid: a host-specific phase, a few ms of drift per sample.
        step = interval_s * 1000
        phase = int(self.rng.integers(0, step))
        grid = np.arange(window_start * 1000 + phase, window_end * 1000, step, dtype=np.int64)
        grid += self.rng.integers(0, 40, size=len(grid))
        grid = grid[grid < window_end * 1000]
        keep = np.ones(len(grid), dtype=bool)
        for s, e in tl.dropouts:
            keep &= ~((grid >= s * 1000) & (grid < e * 1000))
        self.grid = grid[keep]

    def day(self, day_start: int, day_end: int) -> dict[str, np.ndarray] | None:
        """Samples in ``[day_start, day_end)`` as (S, G) arrays, or None when there are none."""
        lo, hi = np.searchsorted(self.grid, [day_start * 1000, day_end * 1000])
        t_ms = self.grid[lo:hi]
        if len(t_ms) == 0:
            return None
        rng, host = self.rng, self.host
        n, s = host.n_gpus, len(t_ms)
        limit = host.model.power_limit_w
        t_s = t_ms // 1000
        par = np.empty((s, n, 7))
        for g, (times, prm) in enumerate(self.activity):
            par[:, g, :] = prm[np.searchsorted(times, t_s, side="right") - 1]
        busy = par[:, :, _BUSY] > 0
        usage = par[:, :, _USAGE]
        sd = np.where(usage > 0.8, 3.0, np.where(usage > 0.1, 8.0, 1.0))
        util = np.where(busy, np.clip(np.rint(usage * 100 + rng.normal(0, 1, (s, n)) * sd), 0, 100), 0)
        held = busy & (par[:, :, _POWER] == 0)
        pfrac = np.where(
            busy & ~held,
            par[:, :, _POWER] + rng.normal(0, 0.03, (s, n)),
            self.idle_frac + np.where(held, 0.01, 0.0) + rng.normal(0, 0.004, (s, n)),
        )
        power = np.clip(pfrac, 0.04, 1.02) * limit
        mem_util = np.where(
            busy, np.clip(np.rint(util * par[:, :, _MEMUTIL] + rng.normal(0, 2, (s, n))), 0, 100), 0
        )
        total = host.model.memory_mb
        fb = np.where(
            busy,
            np.clip(np.rint(par[:, :, _MEM] * total * (1 + rng.normal(0, 0.01, (s, n)))), 300, total - 512),
            self.idle_fb,
        ).astype(np.int64)
        temp = np.rint(self.base_temp + 50 * power / limit + rng.normal(0, 0.7, (s, n))).astype(np.int64)
        gr = np.where(busy, np.clip(util / 100 * rng.uniform(0.9, 1.0, (s, n)), 0, 1), 0.0)
        sm = gr * par[:, :, _SM]
        tensor = gr * par[:, :, _TENSOR]
        prev = np.concatenate([[self.last_ms if self.last_ms is not None else t_ms[0]], t_ms[:-1]])
        dt_ms = (t_ms - prev).astype(np.float64)
        energy = self.energy_mj + np.cumsum(power * dt_ms[:, None], axis=0)
        self.energy_mj = energy[-1]
        self.last_ms = int(t_ms[-1])
        return {
            "t_ms": t_ms,
            "util": util.astype(np.int64),
            "mem_util": mem_util.astype(np.int64),
            "fb": fb,
            "power": power,
            "temp": temp,
            "gr": gr,
            "sm": sm,
            "tensor": tensor,
            "energy": np.floor(energy).astype(np.int64),
        }


def _nvidia_smi_text(
    host: Host, sm: dict[str, np.ndarray], clock: LocalClock, rng: np.random.Generator
) -> list:
    s, n = sm["util"].shape
    local_ms = sm["t_ms"] + clock.offset_s(sm["t_ms"] // 1000) * 1000
    ts = pc.strftime(pa.array(local_ms, pa.timestamp("ms")), format="%Y/%m/%d %H:%M:%S")
    rows = pa.array(np.repeat(np.arange(s), n))
    cols = pa.array(np.tile(np.arange(n), s))
    gpus = host.gpus
    power = _fixed(sm["power"].ravel(), 2)
    na = rng.random(s * n) < NA_PROB
    if na.any():
        power = pc.if_else(pa.array(na), "[N/A]", pc.binary_join_element_wise(power, " W", ""))
    else:
        power = pc.binary_join_element_wise(power, " W", "")
    lines = pc.binary_join_element_wise(
        ts.take(rows),
        pa.array([str(g.index) for g in gpus]).take(cols),
        host.model.name,
        pa.array([g.uuid for g in gpus]).take(cols),
        pa.array([g.serial for g in gpus]).take(cols),
        pc.binary_join_element_wise(_str(sm["util"].ravel()), " %", ""),
        pc.binary_join_element_wise(_str(sm["mem_util"].ravel()), " %", ""),
        f"{host.model.memory_mb} MiB",
        pc.binary_join_element_wise(_str(sm["fb"].ravel()), " MiB", ""),
        power,
        f"{host.model.power_limit_w:.2f} W",
        pc.binary_join_element_wise(_str(sm["temp"].ravel()), "\n", ""),
        ", ",
    )
    return [(NVIDIA_SMI_HEADER + "\n").encode(), _as_bytes(lines)]


def _dcgm_text(host: Host, sm: dict[str, np.ndarray]) -> list:
    s, n = sm["util"].shape
    cols = pa.array(np.tile(np.arange(n), s))
    ts = pc.binary_join_element_wise(_str(np.repeat(sm["t_ms"], n)), "\n", "")
    total = host.model.memory_mb
    values = {
        "DCGM_FI_DEV_GPU_UTIL": _str(sm["util"].ravel()),
        "DCGM_FI_DEV_POWER_USAGE": _fixed(sm["power"].ravel(), 3),
        "DCGM_FI_DEV_FB_USED": _str(sm["fb"].ravel()),
        "DCGM_FI_DEV_FB_FREE": _str((total - sm["fb"]).ravel()),
        "DCGM_FI_DEV_GPU_TEMP": _str(sm["temp"].ravel()),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _str(sm["energy"].ravel()),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _fixed(sm["gr"].ravel(), 6),
        "DCGM_FI_PROF_SM_ACTIVE": _fixed(sm["sm"].ravel(), 6),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _fixed(sm["tensor"].ravel(), 6),
    }
    labels = [
        f'{{gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="{g.pci_bus_id}",device="nvidia{g.index}",'
        f'modelName="{host.model.name}",Hostname="{host.short_name}"}}'
        for g in host.gpus
    ]
    out: list = []
    for name, typ, help_text in DCGM_FAMILIES:
        if name.startswith(DCGM_PROF_PREFIX) and not host.model.datacenter:
            continue
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {typ}\n".encode())
        prefix = pa.array([name + lab for lab in labels]).take(cols)
        out.append(_as_bytes(pc.binary_join_element_wise(prefix, values[name], ts, " ")))
    return out


def write_telemetry(
    tel_dir: Path,
    timelines: list[HostTimeline],
    days: list[tuple[str, int, int]],
    interval_s: int,
    window_start: int,
    window_end: int,
    seed: int,
    clock: LocalClock,
) -> dict[str, int]:
    """Write every host's telemetry day files; returns sample lines (per GPU) by relative path.

    ``days`` are ``(YYYY-MM-DD, start_s, end_s)`` local days of the window.
    """
    counts: dict[str, int] = {}
    for tl in timelines:
        host = tl.host
        gen = _HostTelemetry(tl, interval_s, window_start, window_end, seed, clock)
        kind = host.telemetry
        folder = tel_dir / kind / host.name
        folder.mkdir(parents=True, exist_ok=True)
        for date, d0, d1 in days:
            sm = gen.day(d0, d1)
            if sm is None:
                continue
            if kind == "nvidia-smi":
                name = f"nvidia-smi-{date}.csv"
                chunks = _nvidia_smi_text(host, sm, clock, gen.rng)
            else:
                name = f"dcgm-{date}.prom"
                chunks = _dcgm_text(host, sm)
            with open(folder / name, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
            counts[f"{kind}/{host.name}/{name}"] = int(sm["util"].size)
    return counts
