"""The demand asset through Dagster: which GPUs its efficiency gap is taken over, and the Kueue setting it reads."""

import datetime as dt

import dagster as dg
import pyarrow as pa

from gpu_pipeline.defs.metrics.demand import demand_capacity
from gpu_pipeline.defs.resources import DataStoreResource, KueueResource
from gpu_pipeline.lib.demand import DEMAND_CAPACITY, DEMAND_TOP_CONTRIBUTORS
from gpu_pipeline.lib.efficiency import GPU_HOURLY_EFFICIENCY
from gpu_pipeline.lib.kueue import KUEUE_DEMAND, parse_kueue_scrapes
from gpu_pipeline.lib.kueue_source import QUARANTINE_KUEUE_DEMAND
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
        assert dg.materialize([demand_capacity], resources={"data_store": DataStoreResource(data_root=str(store.root)),
                                                            "kueue": KueueResource()},
                              partition_key=DAY.isoformat(), instance=instance).success
    rows = store.read_table(DEMAND_CAPACITY, DAY.isoformat()).to_pylist()
    gaps = {(r["device_class"], r["efficiency_gap_pp"]) for r in rows if r["source"] == "htcondor"}
    assert gaps == {("ALL", 20.0), ("NVIDIA A100", 20.0)} and len(rows) == 48


def _kueue_day(store: Store, pending: dict[str, tuple[int, int]]) -> None:
    """A day of Kueue scrapes every 10 minutes without the pending-resources series (an older Kueue,
    or its optional ClusterQueue resource metrics off): per queue (active, inadmissible) pending
    workloads, read by the real parser into ``clean/kueue_demand``."""
    text = "".join(
        "# HELP kueue_pending_workloads The number of pending workloads, per 'cluster_queue' and 'status'.\n"
        "# TYPE kueue_pending_workloads gauge\n"
        + "".join(f'kueue_pending_workloads{{cluster_queue="{cq}",status="{status}"}} {n}\n'
                  for cq, (active, inadmissible) in pending.items()
                  for status, n in (("active", active), ("inadmissible", inadmissible))))
    start = dt.datetime.combine(DAY, dt.time(), UTC)
    scrapes = [(start + dt.timedelta(minutes=10 * k), text) for k in range(144)]
    store.write_partition(KUEUE_DEMAND, DAY.isoformat(), parse_kueue_scrapes(scrapes).table)
    store.write_partition(GPU_STATES, DAY.isoformat(), GPU_STATES.empty())
    store.write_partition(GPU_HOURLY_EFFICIENCY, DAY.isoformat(), GPU_HOURLY_EFFICIENCY.empty())
    store.write_partition(JOBS, DAY.isoformat(), JOBS.empty())


def _materialize(store: Store, kueue: KueueResource) -> dg.ExecuteInProcessResult:
    with dg.instance_for_test() as instance:
        return dg.materialize([demand_capacity], partition_key=DAY.isoformat(), instance=instance,
                              resources={"data_store": DataStoreResource(data_root=str(store.root)), "kueue": kueue},
                              raise_on_error=False)


def test_kueue_gpus_per_workload_turns_pending_workloads_into_demand(tmp_path):
    """``GPU_PIPELINE_KUEUE_GPUS_PER_WORKLOAD`` reaches the demand: scrapes without the pending-resources
    series count pending workloads x GPUs (3 + 2 workloads x 4 GPUs = 20 GPUs every hour, 480 GPU-hours
    over the two queues); without it their demand is unknown."""
    store = Store(tmp_path / "data")
    _kueue_day(store, {"gpu-a100": (2, 1), "gpu-h100": (2, 0)})
    assert _materialize(store, KueueResource(scrape_dir=str(tmp_path), gpus_per_workload="4")).success
    rows = [r for r in store.read_table(DEMAND_CAPACITY, DAY.isoformat()).to_pylist() if r["source"] == "kueue"]
    assert len(rows) == 24 and {r["demand_gpus"] for r in rows} == {20.0}
    top = {r["key"]: r["demand_gpu_hours"] for r in store.read_table(DEMAND_TOP_CONTRIBUTORS, DAY.isoformat())
           .to_pylist() if r["source"] == "kueue"}
    assert top == {"gpu-a100": 12.0 * 24, "gpu-h100": 8.0 * 24}

    assert _materialize(store, KueueResource(scrape_dir=str(tmp_path))).success
    rows = [r for r in store.read_table(DEMAND_CAPACITY, DAY.isoformat()).to_pylist() if r["source"] == "kueue"]
    assert len(rows) == 24 and all(r["demand_gpus"] is None and r["severity"] == "Unknown" for r in rows)


def test_the_kueue_gpus_per_workload_variable_reaches_the_demand(tmp_path, monkeypatch):
    """The resources as the code location binds them (``GPU_PIPELINE_*`` variables, resolved when the
    run starts): the variable set, the workloads become demand; unset, none."""
    from gpu_pipeline.defs.resources import resources

    store = Store(tmp_path / "data")
    _kueue_day(store, {"gpu-a100": (2, 1), "gpu-h100": (2, 0)})
    monkeypatch.setenv("GPU_PIPELINE_DATA_ROOT", str(store.root))
    monkeypatch.setenv("GPU_PIPELINE_CONDOR_ARCHIVE", str(tmp_path / "archive"))
    for value, want in (("4", {20.0}), (None, {None})):
        if value is None:
            monkeypatch.delenv("GPU_PIPELINE_KUEUE_GPUS_PER_WORKLOAD")
        else:
            monkeypatch.setenv("GPU_PIPELINE_KUEUE_GPUS_PER_WORKLOAD", value)
        with dg.instance_for_test() as instance:
            assert dg.materialize([demand_capacity], partition_key=DAY.isoformat(), instance=instance,
                                  resources=resources().resources).success
        rows = store.read_table(DEMAND_CAPACITY, DAY.isoformat()).to_pylist()
        assert {r["demand_gpus"] for r in rows if r["source"] == "kueue"} == want, value


def test_a_kueue_gpus_per_workload_that_is_not_a_positive_number_fails_naming_the_variable(tmp_path):
    store = Store(tmp_path / "data")
    _kueue_day(store, {"gpu-a100": (1, 0)})
    for bad in ("four", "0", "-2", "nan"):
        result = _materialize(store, KueueResource(scrape_dir=str(tmp_path), gpus_per_workload=bad))
        assert not result.success
        (failure,) = [e for e in result.all_events if e.is_step_failure]
        assert "GPU_PIPELINE_KUEUE_GPUS_PER_WORKLOAD" in str(failure.step_failure_data.error), bad
    assert not store.has_partition(DEMAND_CAPACITY, DAY.isoformat())


def test_the_kueue_gpu_resources_setting_reaches_the_demand(tmp_path):
    """A cluster of ``amd.com/gpu``: with the default resource name its capacity and demand are
    unknown; with ``gpu_resources="amd.com/gpu"`` (``GPU_PIPELINE_KUEUE_GPU_RESOURCES``) they count."""
    store = Store(tmp_path / "data")
    labels = 'cluster_queue="cq",cohort="team",flavor="mi300",resource="amd.com/gpu"'
    text = (f"kueue_cluster_queue_nominal_quota{{{labels}}} 8\n"
            f"kueue_cluster_queue_resource_usage{{{labels}}} 5\n"
            'kueue_cluster_queue_resource_pending{cluster_queue="cq",resource="amd.com/gpu"} 6\n'
            'kueue_pending_workloads{cluster_queue="cq",status="active"} 2\n')
    start = dt.datetime.combine(DAY, dt.time(), UTC)
    _kueue_day(store, {})
    store.write_partition(KUEUE_DEMAND, DAY.isoformat(), parse_kueue_scrapes(
        [(start + dt.timedelta(minutes=10 * k), text) for k in range(144)]).table)
    for setting, want in (("", {(None, None, "Unknown")}), ("amd.com/gpu", {(6.0, 3.0, "Warning")})):
        assert _materialize(store, KueueResource(scrape_dir=str(tmp_path), gpu_resources=setting)).success
        rows = [r for r in store.read_table(DEMAND_CAPACITY, DAY.isoformat()).to_pylist() if r["source"] == "kueue"]
        assert len(rows) == 24 and {(r["demand_gpus"], r["idle_gpus"], r["severity"]) for r in rows} == want


def test_a_job_that_names_its_device_is_that_devices_demand_and_unreadable_ones_are_counted(tmp_path):
    """clean/jobs rows with RequireGPUs text: through the asset, the T4 job's two queued GPUs are the
    T4 row's demand, and a requirement the ClassAd parser cannot read is counted in the day's
    metadata (its job counts in ALL only)."""
    store = Store(tmp_path / "data")
    start = dt.datetime.combine(DAY, dt.time(), UTC)
    buckets = [start + dt.timedelta(minutes=5 * b) for b in range(288)]
    store.write_partition(GPU_STATES, DAY.isoformat(), conform(pa.Table.from_pylist([
        {"bucket_start_utc": t, "gpu_id": gpu, "host": "h1", "device_name": dev, "state": "idle_shared",
         "n_slot_rows": 1} for t in buckets for gpu, dev in (("GPU-a", "NVIDIA A100"), ("GPU-t", "Tesla T4"))]),
        GPU_STATES))
    store.write_partition(GPU_HOURLY_EFFICIENCY, DAY.isoformat(), GPU_HOURLY_EFFICIENCY.empty())

    def queued(n: int, require: str, gpus: float) -> dict:
        return {"global_job_id": f"ap#{n}.0#1", "run_index": 0, "doc_kind": "job", "job_status": 4,
                "queued_utc": start + dt.timedelta(hours=10), "run_start_utc": start + dt.timedelta(hours=11),
                "run_end_utc": start + dt.timedelta(hours=12), "completion_utc": start + dt.timedelta(hours=12),
                "record_utc": start + dt.timedelta(hours=12), "request_gpus": gpus, "source": "ndjson",
                "require_gpus": require}

    store.write_partition(JOBS, DAY.isoformat(), conform(pa.Table.from_pylist(
        [queued(1, 'DeviceName == "Tesla T4"', 2.0), queued(2, 'DeviceName == "Tesla', 1.0)]), JOBS))
    with dg.instance_for_test() as instance:
        result = dg.materialize([demand_capacity], resources={"data_store": DataStoreResource(data_root=str(store.root)),
                                                              "kueue": KueueResource()},
                                partition_key=DAY.isoformat(), instance=instance)
        assert result.success
        (mat,) = [e.materialization for e in result.get_asset_materialization_events()
                  if e.materialization.asset_key == dg.AssetKey(["metrics", "demand_capacity"])]
    assert mat.metadata["unreadable_requirements"].value == 1
    # hours, not rows: the day's 24 hours of the whole pool (ALL rows), per source. Hour 10: 3 GPUs
    # queued against 2 idle, DCR 1.5 > 1: Warning (CIS 0.5 x 1.5/4 + 0.2 x (0.6 x 1 + 0.4 x 1/4) =
    # 0.3275); the other 23 hours have no demand: Healthy. Counting rows (ALL, A100, T4) read 72 hours.
    kpis = {k: v.value for k, v in mat.metadata.items() if k.startswith("hours_")}
    assert kpis == {"hours_healthy_htcondor": 23.0, "hours_moderate_htcondor": 0.0, "hours_warning_htcondor": 1.0,
                    "hours_critical_htcondor": 0.0, "hours_unknown_htcondor": 0.0}
    rows = {(r["device_class"], r["hour_start_utc"].hour): r
            for r in store.read_table(DEMAND_CAPACITY, DAY.isoformat()).to_pylist() if r["source"] == "htcondor"}
    assert rows[("Tesla T4", 10)]["demand_gpus"] == 2.0 and rows[("Tesla T4", 10)]["idle_gpus"] == 1.0
    assert rows[("NVIDIA A100", 10)]["demand_gpus"] == 0.0
    assert rows[("ALL", 10)]["demand_gpus"] == 3.0


def test_a_configured_kueue_day_of_empty_scrape_files_has_24_unknown_kueue_hours(tmp_path):
    """Raw, clean and demand of a day whose every Kueue scrape file is empty (each ``curl`` failed):
    the raw check passes on the files, clean/kueue_demand is empty, and metrics/demand_capacity has
    the day's 24 Kueue hours as Unknown, coverage 0 (it had no Kueue row). Not configured (and no
    Kueue data that day), the day has no Kueue row."""
    from gpu_pipeline.defs.clean.kueue_demand import kueue_demand
    from gpu_pipeline.defs.raw.kueue_scrapes import kueue_scrapes

    scrapes = tmp_path / "scrapes"
    scrapes.mkdir()
    for h in range(24):
        (scrapes / f"kueue-{DAY:%Y%m%d}T{h:02d}0000Z.prom").write_text("")
    store = Store(tmp_path / "data")
    store.write_partition(GPU_STATES, DAY.isoformat(), GPU_STATES.empty())
    store.write_partition(GPU_HOURLY_EFFICIENCY, DAY.isoformat(), GPU_HOURLY_EFFICIENCY.empty())
    store.write_partition(JOBS, DAY.isoformat(), JOBS.empty())
    resources = {"data_store": DataStoreResource(data_root=str(store.root)),
                 "kueue": KueueResource(scrape_dir=str(scrapes), cluster="k8s")}
    with dg.instance_for_test() as instance:
        result = dg.materialize([kueue_scrapes, kueue_demand, demand_capacity], partition_key=DAY.isoformat(),
                                instance=instance, resources=resources)
        assert result.success
        (mat,) = [e.materialization for e in result.get_asset_materialization_events()
                  if e.materialization.asset_key == dg.AssetKey(["metrics", "demand_capacity"])]
    # the hours per source: Kueue's 24 unknown; HTCondor (no slot state, no job: no row) has no key
    assert {k: v.value for k, v in mat.metadata.items() if k.startswith("hours_")} == {
        "hours_healthy_kueue": 0.0, "hours_moderate_kueue": 0.0, "hours_warning_kueue": 0.0,
        "hours_critical_kueue": 0.0, "hours_unknown_kueue": 24.0}
    assert store.read_table(KUEUE_DEMAND, DAY.isoformat()).num_rows == 0
    rows = [r for r in store.read_table(DEMAND_CAPACITY, DAY.isoformat()).to_pylist() if r["source"] == "kueue"]
    assert len(rows) == 24
    assert {(r["severity"], r["capacity_coverage"], r["demand_gpus"], r["idle_gpus"]) for r in rows} == {
        ("Unknown", 0.0, None, None)}
    assert _materialize(Store(tmp_path / "data"), KueueResource()).success
    assert [r for r in store.read_table(DEMAND_CAPACITY, DAY.isoformat()).to_pylist() if r["source"] == "kueue"] == []
    # not configured now, but the day's scrapes set aside as unreadable say it had a Kueue source
    store.write_partition(QUARANTINE_KUEUE_DEMAND, DAY.isoformat(), conform(pa.Table.from_pylist(
        [{"source_table": "raw/kueue_scrapes", "reason": "unreadable scrape: cut mid-line",
          "source_file": "kueue-0.prom", "row_json": "{}"}]), QUARANTINE_KUEUE_DEMAND))
    assert _materialize(Store(tmp_path / "data"), KueueResource()).success
    rows = [r for r in store.read_table(DEMAND_CAPACITY, DAY.isoformat()).to_pylist() if r["source"] == "kueue"]
    assert len(rows) == 24 and {r["severity"] for r in rows} == {"Unknown"}
