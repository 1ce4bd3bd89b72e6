"""A small simulated cluster run through the library chain (no Dagster), for metric tests.

``build_sim_dataset`` simulates a pool, then for each day runs exactly the library calls the raw and
clean assets make (archive read -> clean slots -> 5-minute states; job documents -> clean jobs;
telemetry files -> clean samples) and writes them to a ``Store`` in the storage contract. Partition
days are UTC days (the default partition time zone); the simulator's local zone is America/Chicago.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from gpu_pipeline.lib.condor_archive import read_window
from gpu_pipeline.lib.job_source import clean_job_documents, raw_docs_from_files
from gpu_pipeline.lib.samples import clean_samples, raw_samples
from gpu_pipeline.lib.schemas import (
    CLEAN_SLOT_SNAPSHOTS,
    GPU_SAMPLES,
    GPU_STATES,
    JOBS,
    RAW_CONDOR_SLOT_SNAPSHOTS,
)
from gpu_pipeline.lib.simulate import SimConfig, simulate
from gpu_pipeline.lib.slots import clean_slot_rows
from gpu_pipeline.lib.states import states_for_day
from gpu_pipeline.lib.store import Store
from gpu_pipeline.lib.timeutil import day_window

SIM_TZ = "America/Chicago"


@dataclass(frozen=True)
class SimDataset:
    sources: Path  # simulator output (condor/, jobs/, telemetry/, truth/)
    store: Store  # data root with raw/clean/metrics tables for ``days``
    days: list[str]  # UTC partition days that are fully inside the simulated window
    partition_tz: str  # "UTC"

    @property
    def truth(self) -> Path:
        return self.sources / "truth"

    def window(self, day: str) -> tuple[dt.datetime, dt.datetime]:
        return day_window(day, self.partition_tz)


def build_sim_dataset(
    base: Path, gpus: int = 40, sim_days: int = 3, seed: int = 3, start: dt.date = dt.date(2025, 8, 4),
    telemetry_interval_s: int = 60,
) -> SimDataset:
    sources, root = base / "sources", base / "data"
    end = start + dt.timedelta(days=sim_days - 1)
    simulate(sources, SimConfig(start=start, end=end, gpus=gpus, seed=seed, timezone=SIM_TZ,
                                telemetry_interval_s=telemetry_interval_s))
    store = Store(root)
    # UTC days fully inside the local (UTC-5/-6) window: skip the first local day's partial UTC day.
    days = [(start + dt.timedelta(days=i)).isoformat() for i in range(1, sim_days)]
    for day in days:
        s, e = day_window(day, "UTC")
        raw = read_window(sources / "condor", s, e, SIM_TZ)
        store.write_partition(RAW_CONDOR_SLOT_SNAPSHOTS, day, raw.table)
        clean = clean_slot_rows(raw.table)
        store.write_partition(CLEAN_SLOT_SNAPSHOTS, day, clean.table)
        store.write_partition(GPU_STATES, day, states_for_day(store, day, s, e))
        docs = raw_docs_from_files(sources / "jobs", s, e)
        store.write_partition(JOBS, day, clean_job_documents(docs.table, s, e).table)
        samples = raw_samples(sources / "telemetry", s, e, SIM_TZ, margin_days=1)
        store.write_partition(GPU_SAMPLES, day, clean_samples(samples.table).table)
    return SimDataset(sources=sources, store=store, days=days, partition_tz="UTC")
