"""Deterministic, seeded simulator of a shared HTCondor GPU pool, written in the real raw formats.

``simulate(out_dir, SimConfig(...))`` writes::

    out_dir/
      condor/gpu_state_YYYY-MM.db                  slot snapshots, one SQLite file per local month
      jobs/jobs-YYYY-MM-DD.ndjson                  adstash job documents (UTC day of RecordTime)
      jobs/epochs-YYYY-MM-DD.ndjson                adstash epoch (run attempt) documents
      telemetry/nvidia-smi/HOST/nvidia-smi-YYYY-MM-DD.csv   (local day; even-indexed hosts)
      telemetry/dcgm/HOST/dcgm-YYYY-MM-DD.prom              (local day; odd-indexed hosts)
      truth/gpu_state_intervals.parquet            ground truth, timestamp[us, tz=UTC]
      truth/availability_periods.parquet
      truth/evictions.parquet
      truth/jobs.parquet
      truth/hosts.parquet

The window is ``[start 00:00, end+1 00:00)`` local time in ``cfg.timezone``. Hosts are simulated
from one day before the window (warm-up, so the pool is in steady state at the window start);
only what falls inside the window is written. The same seed and config give byte-identical
files: every random draw comes from a generator keyed on (seed, purpose, group or host), nothing
reads the wall clock, and all outputs are written in a fixed order.

How the parts fit: :mod:`~gpu_pipeline.lib.sim_cluster` draws the hosts and their groups,
:mod:`~gpu_pipeline.lib.sim_engine` runs one small event loop per group and returns each host's
event log, and the writers (:mod:`~gpu_pipeline.lib.sim_condor`, :mod:`~gpu_pipeline.lib.sim_truth`,
:mod:`~gpu_pipeline.lib.sim_jobs`, :mod:`~gpu_pipeline.lib.sim_telemetry`) replay those logs,
streaming rows to disk in bounded chunks.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

from gpu_pipeline.lib.sim_cluster import LocalClock, build_cluster, local_midnight_utc
from gpu_pipeline.lib.sim_condor import snapshot_schedule, write_slot_snapshots
from gpu_pipeline.lib.sim_engine import simulate_pool
from gpu_pipeline.lib.sim_jobs import write_job_documents
from gpu_pipeline.lib.sim_kueue import write_kueue_scrapes
from gpu_pipeline.lib.sim_telemetry import write_telemetry
from gpu_pipeline.lib.sim_truth import write_truth

__all__ = ["OUTPUT_DIRS", "WARMUP_S", "SimConfig", "simulate"]

#: Simulated time before the window so that jobs are already running at the window start.
WARMUP_S = 86400
#: Sub-directories of ``out_dir`` owned by the simulator (replaced on every run).
OUTPUT_DIRS = ("condor", "jobs", "telemetry", "truth", "kueue")


@dataclass(frozen=True)
class SimConfig:
    """What to simulate."""

    start: dt.date  #: first simulated local calendar day
    end: dt.date  #: last simulated local day, inclusive
    gpus: int = 80  #: total GPUs (hosts of 1-8 GPUs until the total is reached exactly)
    seed: int = 0
    cadence_minutes: float = 5.0  #: slot-snapshot cadence
    timezone: str = "America/Chicago"  #: the collector's zone; naive timestamps are in it
    telemetry_interval_s: int = 30  #: GPU telemetry sample interval; 0 disables telemetry
    schema_drift: bool = True  #: vary the SQLite columns across months like the real archive
    kueue_interval_s: int = 0  #: write Kueue /metrics scrapes of the same workload every N s; 0: none

    def validate(self) -> None:
        if self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")
        if self.gpus < 1:
            raise ValueError(f"gpus must be >= 1, got {self.gpus}")
        if self.cadence_minutes <= 0:
            raise ValueError(f"cadence_minutes must be > 0, got {self.cadence_minutes}")
        if self.telemetry_interval_s < 0:
            raise ValueError(f"telemetry_interval_s must be >= 0, got {self.telemetry_interval_s}")
        ZoneInfo(self.timezone)  # raises ZoneInfoNotFoundError for an unknown zone


def _iso(t: int) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


def simulate(out_dir: Path, cfg: SimConfig) -> dict:
    """Simulate the pool described by ``cfg`` and write all outputs under ``out_dir``.

    The sub-directories in :data:`OUTPUT_DIRS` are deleted first (so a re-run never mixes with an
    older one); anything else in ``out_dir`` is left alone. Returns a JSON-serialisable summary:
    the config, the window in UTC, counts per output and the sorted list of files written
    (relative to ``out_dir``).
    """
    cfg.validate()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for sub in OUTPUT_DIRS:
        if (out_dir / sub).exists():
            shutil.rmtree(out_dir / sub)

    tz = cfg.timezone
    window_start = local_midnight_utc(cfg.start, tz)
    window_end = local_midnight_utc(cfg.end + dt.timedelta(days=1), tz)
    sim_start = window_start - WARMUP_S
    clock = LocalClock(tz, sim_start - 86400, window_end + 86400)

    cluster = build_cluster(cfg.gpus, cfg.seed)
    hosts = cluster.hosts
    history = simulate_pool(cluster, sim_start, window_end, clock, cfg.seed)
    timelines = history.timelines

    snapshots = snapshot_schedule(window_start, window_end, cfg.cadence_minutes, clock, cfg.seed)
    condor = write_slot_snapshots(out_dir / "condor", timelines, snapshots, cfg.schema_drift)
    truth = write_truth(out_dir / "truth", history, window_start, window_end)
    jobs = write_job_documents(out_dir / "jobs", history, window_start, window_end)
    kueue = (
        write_kueue_scrapes(out_dir / "kueue", out_dir / "truth", window_start, window_end, cfg.kueue_interval_s)
        if cfg.kueue_interval_s > 0
        else {}
    )

    telemetry: dict[str, int] = {}
    if cfg.telemetry_interval_s > 0:
        days = []
        d = cfg.start
        while d <= cfg.end:
            days.append(
                (d.isoformat(), local_midnight_utc(d, tz), local_midnight_utc(d + dt.timedelta(days=1), tz))
            )
            d += dt.timedelta(days=1)
        telemetry = write_telemetry(
            out_dir / "telemetry",
            timelines,
            days,
            cfg.telemetry_interval_s,
            window_start,
            window_end,
            cfg.seed,
            clock,
        )

    files = sorted(
        [f"condor/{name}" for name in condor]
        + [f"truth/{name}" for name in truth]
        + [f"jobs/{name}" for name in jobs]
        + [f"telemetry/{name}" for name in telemetry]
        + [f"kueue/{name}" for name in kueue]
        + ["truth/summary.json"]
    )
    config = asdict(cfg)
    config["start"], config["end"] = cfg.start.isoformat(), cfg.end.isoformat()
    summary = {
        "config": config,
        "window_start_utc": _iso(window_start),
        "window_end_utc": _iso(window_end),
        "hosts": len(hosts),
        "gpus": sum(h.n_gpus for h in hosts),
        "prioritized_gpus": sum(h.n_gpus for h in hosts if h.prioritized),
        "groups": len(cluster.groups),
        "snapshots": sum(v["snapshots"] for v in condor.values()),
        "slot_rows": sum(v["rows"] for v in condor.values()),
        "condor": condor,
        "truth": truth,
        "job_documents": sum(v for k, v in jobs.items() if k.startswith("jobs-")),
        "epoch_documents": sum(v for k, v in jobs.items() if k.startswith("epochs-")),
        "telemetry_files": len(telemetry),
        "telemetry_samples": sum(telemetry.values()),
        "telemetry_samples_by_file": dict(sorted(telemetry.items())),
        "kueue_scrapes": len(kueue),
        "files": files,
    }
    # The counts are ground truth too: tests compare the pipeline's row counts with them.
    (out_dir / "truth" / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary
