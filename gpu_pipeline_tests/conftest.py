"""Shared fixtures: hand-built slot-state archives in the exact original format."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

OLD_COLUMNS = (
    "Name", "AssignedGPUs", "AvailableGPUs", "State", "GPUs_DeviceName", "GPUs_GlobalMemoryMb",
    "PrioritizedProjects", "GPUsAverageUsage", "Machine", "RemoteOwner", "GlobalJobId", "timestamp",
)
NEW_COLUMNS = (
    "Name", "AssignedGPUs", "AvailableGPUs", "State", "GPUs_DeviceName", "GPUs_GlobalMemoryMb",
    "PrioritizedProjects", "GPUsAverageUsage", "Machine", "RemoteOwner", "GlobalJobId",
    "PreventJobsReason", "Disk", "GPUs_MIG_0_DeviceName", "timestamp",
)
_TYPES = {"GPUs_GlobalMemoryMb": "BIGINT", "GPUsAverageUsage": "FLOAT", "Disk": "BIGINT", "timestamp": "TIMESTAMP"}


def write_gpu_state_db(path: Path, rows: Iterable[dict], columns: Sequence[str] = OLD_COLUMNS) -> Path:
    """Append rows to ``path`` the way pandas ``to_sql(index=False)`` lays the table out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    cols = ", ".join(f'"{c}" {_TYPES.get(c, "TEXT")}' for c in columns)
    con.execute(f"CREATE TABLE IF NOT EXISTS gpu_state ({cols})")
    marks = ", ".join("?" for _ in columns)
    con.executemany(
        f"INSERT INTO gpu_state VALUES ({marks})",
        [tuple(r.get(c) for c in columns) for r in rows],
    )
    con.commit()
    con.close()
    return path


def slot_row(ts: str, name: str, gpu: str | None, state: str, host: str = "gpu01.example.edu",
             projects: str = "", job: str | None = None, device: str = "NVIDIA A100-SXM4-80GB",
             available: str | None = None, usage: float | None = None) -> dict:
    return {
        "Name": f"{name}@{host}",
        "AssignedGPUs": gpu,
        "AvailableGPUs": available if available is not None else (gpu or ""),
        "State": state,
        "GPUs_DeviceName": device,
        "GPUs_GlobalMemoryMb": 81920,
        "PrioritizedProjects": projects,
        "GPUsAverageUsage": usage,
        "Machine": host,
        "RemoteOwner": "alice@example.edu" if job else None,
        "GlobalJobId": job,
        "timestamp": ts,
    }


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    return root


_DEFS = None


@pytest.fixture(scope="session", autouse=True)
def loaded_defs():
    """The project's Definitions, loaded once before any test creates a Dagster instance (loading
    definitions after a test instance was closed trips over Dagster's definitions-state storage,
    which keeps a weak reference to that instance)."""
    global _DEFS
    if _DEFS is None:
        from gpu_pipeline.definitions import defs

        _DEFS = defs()
    return _DEFS


@pytest.fixture(autouse=True)
def _close_duckdb_databases():
    """No test leaves a DuckDB database of ``lib.db`` open behind it. Each one, with the block allocator
    on, reserves address space of about 80 % of the RAM (not memory in use), and a process holding
    three of them can no longer fork: the test suite's PostgreSQL helper failed to start ``pg_ctl``
    with ENOMEM at the end of the run, when tests with other DuckDB settings had left theirs open."""
    yield
    from gpu_pipeline.lib.db import close_databases

    close_databases()
