"""The heatmap asset through Dagster: a re-run replaces the day's images, never appends."""

import datetime as dt

import dagster as dg
import pyarrow as pa

from gpu_pipeline.defs.plots.gpu_timeline_heatmap import NAME, gpu_timeline_heatmap
from gpu_pipeline.defs.resources import DataStoreResource
from gpu_pipeline.lib.schemas import GPU_STATES, conform
from gpu_pipeline.lib.store import Store

DAY = "2025-08-05"


def _states(devices: dict[str, str]) -> pa.Table:
    t0 = dt.datetime(2025, 8, 5, tzinfo=dt.UTC)
    rows = [{"bucket_start_utc": t0 + dt.timedelta(minutes=5 * k), "gpu_id": gpu, "host": "h1", "device_name": dev,
             "state": "idle_shared", "n_slot_rows": 1} for k in range(288) for gpu, dev in devices.items()]
    return conform(pa.Table.from_pylist(rows), GPU_STATES)


def test_a_rerun_without_a_device_class_removes_its_image(tmp_path):
    store = Store(tmp_path / "data")
    resources = {"data_store": DataStoreResource(data_root=str(store.root))}
    folder = store.plot_file(NAME, DAY).parent
    with dg.instance_for_test() as instance:
        store.write_partition(GPU_STATES, DAY, _states({"GPU-a": "Tesla V100-SXM2-32GB", "GPU-b": "RTX 2080 Ti"}))
        assert dg.materialize([gpu_timeline_heatmap], resources=resources, partition_key=DAY, instance=instance).success
        first = sorted(p.name for p in folder.glob("*.png"))
        # the V100 host is excluded from then on: the day's states have only the RTX
        store.write_partition(GPU_STATES, DAY, _states({"GPU-b": "RTX 2080 Ti"}))
        assert dg.materialize([gpu_timeline_heatmap], resources=resources, partition_key=DAY, instance=instance).success
        second = sorted(p.name for p in folder.glob("*.png"))
    assert first == [f"{NAME}.png", f"{NAME}__RTX_2080_Ti.png", f"{NAME}__Tesla_V100-SXM2-32GB.png"]
    assert second == [f"{NAME}.png", f"{NAME}__RTX_2080_Ti.png"]
