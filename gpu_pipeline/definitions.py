"""Dagster entry point: every definition under ``gpu_pipeline/defs`` plus the executor.

The executor is structural, so it is read when the definitions load: ``GPU_PIPELINE_EXECUTOR`` =
``in_process`` (default: one process per run; DuckDB parallelizes inside each step, and a range
run pays one process start-up) or ``multiprocess`` (one process per step, at most
``GPU_PIPELINE_MAX_CONCURRENT`` at once, default 2; 0: one per core).
"""

import os
from pathlib import Path

import dagster as dg

from gpu_pipeline.lib.envutil import whole_number_env


def _executor() -> dg.ExecutorDefinition:
    kind = os.environ.get("GPU_PIPELINE_EXECUTOR", "in_process").strip().lower()
    if kind == "multiprocess":
        limit = whole_number_env("GPU_PIPELINE_MAX_CONCURRENT", 2, "steps at once", "one per core")
        return dg.multiprocess_executor.configured({"max_concurrent": limit})
    if kind in ("in_process", "inprocess", ""):
        return dg.in_process_executor
    raise ValueError(f"GPU_PIPELINE_EXECUTOR={kind!r}: expected in_process or multiprocess")


@dg.definitions
def defs() -> dg.Definitions:
    loaded = dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent)
    return dg.Definitions.merge(loaded, dg.Definitions(executor=_executor()))
