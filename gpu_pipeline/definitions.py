"""Dagster entry point: every definition under ``gpu_pipeline/defs`` plus the executor."""

from __future__ import annotations

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    loaded = dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent)
    return dg.Definitions.merge(
        loaded,
        dg.Definitions(executor=dg.multiprocess_executor.configured({"max_concurrent": 2})),
    )
