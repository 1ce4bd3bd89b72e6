"""The coverage asset through Dagster: which sources have a row."""

import json

import dagster as dg
import pyarrow as pa

from gpu_pipeline.defs.metrics.coverage import coverage
from gpu_pipeline.defs.resources import DataStoreResource, KueueResource, TelemetryResource
from gpu_pipeline.lib.coverage_table import COVERAGE
from gpu_pipeline.lib.kueue_source import QUARANTINE_KUEUE_DEMAND
from gpu_pipeline.lib.schemas import conform
from gpu_pipeline.lib.store import Store

DAY = "2025-08-06"


def _run(store: Store, kueue: KueueResource) -> dict[str, dict]:
    with dg.instance_for_test() as instance:
        assert dg.materialize([coverage], resources={"data_store": DataStoreResource(data_root=str(store.root)),
                                                     "kueue": kueue, "telemetry": TelemetryResource()},
                              partition_key=DAY, instance=instance).success
    return {r["source"]: r for r in store.read_table(COVERAGE, DAY).to_pylist()}


def test_a_configured_kueue_source_has_its_row_on_a_day_without_a_readable_scrape(tmp_path):
    """Every scrape of the day cut mid-line: clean/kueue_demand is empty, quarantine/kueue_demand holds
    them. The kueue row was left out with the clean rows, and its quarantine with it."""
    store = Store(tmp_path / "data")
    store.write_partition(QUARANTINE_KUEUE_DEMAND, DAY, conform(pa.Table.from_pylist(
        [{"source_table": "raw/kueue_scrapes", "reason": "unreadable scrape: cut mid-line",
          "source_file": f"kueue-{i}.prom", "row_json": "{}"} for i in range(3)]), QUARANTINE_KUEUE_DEMAND))
    rows = _run(store, KueueResource(scrape_dir=str(tmp_path / "scrapes")))
    kueue = rows["kueue"]
    assert (kueue["coverage_pct"], kueue["samples"], kueue["rows_quarantined"]) == (0.0, 0, 3)
    assert json.loads(kueue["quarantine_reasons"]) == {"unreadable scrape": 3}  # by the reason before its detail
    assert (kueue["gaps"], kueue["longest_gap_s"]) == (1, 86400.0)
    # configured, with nothing at all that day: its row, coverage 0 (not the same as no Kueue)
    empty = Store(tmp_path / "empty")
    assert _run(empty, KueueResource(scrape_dir=str(tmp_path / "scrapes")))["kueue"]["coverage_pct"] == 0.0
    # not configured and nothing in the day: no kueue row
    assert "kueue" not in _run(Store(tmp_path / "none"), KueueResource())


def test_a_render_farms_task_events_set_aside_are_counted(tmp_path):
    """Task events set aside (an unmatched START) were in quarantine/task_runs and counted nowhere in
    metrics/coverage, which the README says counts every quarantined row."""
    from gpu_pipeline.lib.terapixel import QUARANTINE_TASK_RUNS

    store = Store(tmp_path / "data")
    store.write_partition(QUARANTINE_TASK_RUNS, DAY, conform(pa.Table.from_pylist(
        [{"source_table": "clean/task_runs", "reason": "unmatched START", "row_json": "{}"}] * 2),
        QUARANTINE_TASK_RUNS))
    rows = _run(store, KueueResource())
    assert (rows["task_runs"]["rows_quarantined"], rows["task_runs"]["samples"]) == (2, 0)
    assert json.loads(rows["task_runs"]["quarantine_reasons"]) == {"unmatched START": 2}
    assert "task_runs" not in _run(Store(tmp_path / "none"), KueueResource())
