"""The one way the pipeline opens DuckDB: in memory, UTC session time zone, and the operator's limits.

``GPU_PIPELINE_DUCKDB_MEMORY_LIMIT`` (e.g. ``1GB``) caps each connection's buffer memory; sorts,
joins and aggregates beyond it spill to ``GPU_PIPELINE_DUCKDB_TEMP_DIR`` (default: a folder in the
system temp directory). ``GPU_PIPELINE_DUCKDB_THREADS`` caps its threads. Unset: DuckDB's defaults
(80 % of RAM, all cores).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import duckdb

ENV_MEMORY_LIMIT = "GPU_PIPELINE_DUCKDB_MEMORY_LIMIT"
ENV_THREADS = "GPU_PIPELINE_DUCKDB_THREADS"
ENV_TEMP_DIR = "GPU_PIPELINE_DUCKDB_TEMP_DIR"


def connect(threads: int | None = None, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with UTC session time zone; arguments win over the environment."""
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    threads = threads or int(os.environ.get(ENV_THREADS) or 0) or None
    memory_limit = memory_limit or os.environ.get(ENV_MEMORY_LIMIT) or None
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    if memory_limit:
        spill = Path(os.environ.get(ENV_TEMP_DIR) or Path(tempfile.gettempdir()) / "gpu_pipeline_duckdb")
        spill.mkdir(parents=True, exist_ok=True)
        con.execute("SET memory_limit = ?", [memory_limit])
        con.execute("SET temp_directory = ?", [str(spill)])
    return con
