"""The demand asset through Dagster: which GPUs its efficiency gap is taken over."""

import datetime as dt

import dagster as dg
import pyarrow as pa

from gpu_pipeline.defs.metrics.demand import demand_capacity
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.demand import DEMAND_CAPACITY
from gpu_pipeline.lib.efficiency import GPU_HOURLY_EFFICIENCY
from gpu_pipeline.lib.schemas import GPU_STATES, JOBS, conform
from gpu_pipeline.lib.store import Store

UTC = dt.UTC
DAY = dt.date(2025, 8, 6)


def test_the_efficiency_gap_is_the_pools_gpus_not_telemetry_only_hosts(tmp_path):
    """A render-farm GPU outside HTCondor has telemetry, so efficiency rows, but no slot: the
    pool's (ALL) gap of an hour is the mean over the GPUs in the day's states only (it was over
    every efficiency row: 40 pp here instead of the pool GPU's 20)."""
    store = Store(tmp_path / "data")
    start = dt.datetime.combine(DAY, dt.time(), UTC)
    buckets = [start + dt.timedelta(minutes=5 * b) for b in range(288)]
    store.write_partition(GPU_STATES, DAY.isoformat(), conform(pa.Table.from_pylist([
        {"bucket_start_utc": t, "gpu_id": "GPU-pool", "host": "h1", "device_name": "NVIDIA A100",
         "state": "busy_shared", "n_slot_rows": 1} for t in buckets]), GPU_STATES))
    hours = [start + dt.timedelta(hours=h) for h in range(24)]
    store.write_partition(GPU_HOURLY_EFFICIENCY, DAY.isoformat(), conform(pa.Table.from_pylist([
        {"gpu_id": gpu, "device_name": "NVIDIA A100", "hour_start_utc": t, "samples": 60, "coverage_s": 3600.0,
         "max_power_w": 400.0, "max_power_source": "spec", "achievable_tflops": 100.0, "spec_known": True,
         "efficiency_gap_pp": gap} for t in hours for gpu, gap in (("GPU-pool", 20.0), ("GPU-farm", 60.0))]),
        GPU_HOURLY_EFFICIENCY))
    store.write_partition(JOBS, DAY.isoformat(), JOBS.empty())
    with dg.instance_for_test() as instance:
        assert dg.materialize([demand_capacity], resources={"data_store": DataStoreResource(data_root=str(store.root))},
                              partition_key=DAY.isoformat(), instance=instance).success
    rows = store.read_table(DEMAND_CAPACITY, DAY.isoformat()).to_pylist()
    gaps = {(r["device_class"], r["efficiency_gap_pp"]) for r in rows if r["source"] == "htcondor"}
    assert gaps == {("ALL", 20.0), ("NVIDIA A100", 20.0)} and len(rows) == 48
