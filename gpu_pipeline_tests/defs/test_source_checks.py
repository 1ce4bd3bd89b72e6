"""Source assets through Dagster: each asset check with a passing and a failing input."""

import datetime as dt
import json
import os

import dagster as dg
import pyarrow as pa
import pytest

from gpu_pipeline.defs.clean.gpu_samples import gpu_samples
from gpu_pipeline.defs.clean.jobs import jobs
from gpu_pipeline.defs.clean.slot_snapshots import slot_snapshots
from gpu_pipeline.defs.raw.condor_slot_snapshots import KEY as RAW_KEY
from gpu_pipeline.defs.raw.condor_slot_snapshots import condor_slot_snapshots
from gpu_pipeline.defs.raw.gpu_telemetry import gpu_telemetry
from gpu_pipeline.defs.raw.job_documents import job_documents
from gpu_pipeline.defs.resources import (
    CondorArchiveResource,
    DataStoreResource,
    JobRecordsResource,
    TelemetryResource,
)
from gpu_pipeline.lib.schemas import JOBS, QUARANTINE_GPU_SAMPLES, QUARANTINE_JOBS
from gpu_pipeline.lib.store import Store
from gpu_pipeline_tests.conftest import NEW_COLUMNS, OLD_COLUMNS, slot_row, write_gpu_state_db

DAY = "2025-08-05"


def run(assets, resources, partition_key=DAY, raise_errors=False):
    with dg.instance_for_test() as instance:
        result = dg.materialize(assets, resources=resources, partition_key=partition_key,
                                instance=instance, raise_on_error=raise_errors)
        checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        materialized = {m.asset_key.to_user_string() for m in result.get_asset_materialization_events()
                        for m in [m.event_specific_data.materialization]}
    return result, checks, materialized


def _evaluations(assets, resources, partition_key=DAY) -> tuple[dg.ExecuteInProcessResult, dict]:
    """The run of ``assets`` for the day (failures kept) and its check evaluations by name."""
    with dg.instance_for_test() as instance:
        result = dg.materialize(assets, resources=resources, partition_key=partition_key, instance=instance,
                                raise_on_error=False)
    return result, {e.check_name: e for e in result.get_asset_check_evaluations()}


def job_doc(gid: str, start: int, end: int, **extra) -> dict:
    return {"GlobalJobId": gid, "ClusterId": 1, "ProcId": 0, "Owner": "alice", "JobStatus": 4,
            "QDate": start - 60, "JobStartDate": start, "JobCurrentStartDate": start, "CompletionDate": end,
            "EnteredCurrentStatus": end, "RecordTime": end, "NumJobStarts": 1, "RequestGpus": 1,
            "StartdName": "gpu01.example.edu", "StartdSlot": "slot1_1", "AssignedGPUs": "GPU-aaaaaaaa", **extra}


def epoch(t: str) -> int:
    return int(dt.datetime.fromisoformat(t).replace(tzinfo=dt.UTC).timestamp())


@pytest.fixture
def store_res(tmp_path):
    return DataStoreResource(data_root=str(tmp_path / "data"))


def test_job_documents_pass_and_broken_line_is_quarantined(tmp_path, store_res):
    d = tmp_path / "jobs"
    d.mkdir()
    lines = [json.dumps(job_doc("s#1.0#1", epoch("2025-08-05T01:00:00"), epoch("2025-08-05T03:00:00"))),
             "{not json",
             json.dumps(job_doc("s#2.0#1", epoch("2025-08-05T10:00:00"), epoch("2025-08-06T02:00:00")))]
    (d / "jobs-2025-08-05.ndjson").write_text("\n".join(lines) + "\n")
    res = {"data_store": store_res, "job_records": JobRecordsResource(files_dir=str(d))}
    result, checks, mats = run([job_documents, jobs], res)
    assert result.success
    assert checks == {"has_documents": True, "unique_run_key": True, "run_intervals_ordered": True,
                      "documents_give_job_runs": True}
    store = Store(tmp_path / "data")
    clean = store.read_table(JOBS, DAY)
    assert sorted(clean["global_job_id"].to_pylist()) == ["s#1.0#1", "s#2.0#1"]
    q = store.read_table(QUARANTINE_JOBS, DAY).to_pylist()
    assert len(q) == 1 and q[0]["reason"].startswith("invalid_json") and q[0]["source_row"] == 2
    assert q[0]["source_file"].endswith("jobs-2025-08-05.ndjson")


def test_configured_job_source_with_no_documents_blocks_downstream(tmp_path, store_res):
    d = tmp_path / "jobs"
    d.mkdir()
    (d / "jobs-2025-07-01.ndjson").write_text(json.dumps(job_doc("s#1.0#1", 1, 2)) + "\n")
    res = {"data_store": store_res, "job_records": JobRecordsResource(files_dir=str(d))}
    result, checks, mats = run([job_documents, jobs], res)
    assert checks["has_documents"] is False
    assert "raw/job_documents" in mats and "clean/jobs" not in mats  # blocking check stopped it


def test_job_source_off_writes_empty_partitions_and_passes(tmp_path, store_res):
    res = {"data_store": store_res, "job_records": JobRecordsResource()}
    result, checks, mats = run([job_documents, jobs], res)
    assert result.success and checks["has_documents"] is True
    assert Store(tmp_path / "data").read_table(JOBS, DAY).num_rows == 0


def nvsmi_log(path, start: dt.datetime, minutes: int, step_s: int = 30, util=lambda i: 50, skip=lambda i: False):
    lines = ["timestamp, index, name, uuid, serial, utilization.gpu [%], utilization.memory [%], "
             "memory.total [MiB], memory.used [MiB], power.draw [W], power.limit [W], temperature.gpu"]
    for i in range(minutes * 60 // step_s):
        if skip(i):
            continue
        t = start + dt.timedelta(seconds=i * step_s)
        lines.append(f"{t:%Y/%m/%d %H:%M:%S}.000, 0, NVIDIA A100-SXM4-80GB, "
                     f"GPU-aaaaaaaa-1111-2222-3333-444444444444, 1650000000001, {util(i)} %, 10 %, "
                     f"81920 MiB, 2000 MiB, 250.00 W, 400.00 W, 50")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_telemetry_full_day_passes_coverage_and_range(tmp_path, store_res):
    nvsmi_log(tmp_path / "tel" / "nvidia-smi" / "gpu01" / "nvidia-smi-2025-08-05.csv",
              dt.datetime(2025, 8, 5), 24 * 60)
    res = {"data_store": store_res, "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "tel"))}
    result, checks, _ = run([gpu_telemetry, gpu_samples], res)
    assert result.success
    assert checks == {"has_samples": True, "coverage": True, "values_in_range": True, "unique_sample_key": True}


def test_a_telemetry_file_the_reader_cannot_take_is_named_in_the_metadata(tmp_path, store_res):
    host = tmp_path / "tel" / "nvidia-smi" / "gpu01"
    nvsmi_log(host / "nvidia-smi-2025-08-05.csv", dt.datetime(2025, 8, 5), 24 * 60)
    (host / "nvidia-smi-2025-08-04.csv.xz").write_bytes(b"\xfd7zXZ\x00")
    res = {"data_store": store_res, "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "tel"))}
    with dg.instance_for_test() as instance:
        result = dg.materialize([gpu_telemetry], resources=res, partition_key=DAY, instance=instance)
    (mat,) = [e.materialization for e in result.get_asset_materialization_events()]
    assert mat.metadata["files_not_recognized"].value == 1
    assert mat.metadata["samples"].value == 24 * 60 * 2  # every 30 s
    assert (mat.metadata["nan_values"].value, mat.metadata["blank_values"].value) == (0, 0)


def test_values_read_as_null_are_counted_in_the_metadata(tmp_path, store_res):
    """nvidia-smi's ``nan W`` (the power of 10 samples) is null in the day's rows and counted."""
    path = tmp_path / "tel" / "nvidia-smi" / "gpu01" / "nvidia-smi-2025-08-05.csv"
    nvsmi_log(path, dt.datetime(2025, 8, 5), 24 * 60)
    lines = path.read_text().splitlines()
    for i in range(1, 11):
        lines[i] = lines[i].replace("250.00 W", "nan W")
    path.write_text("\n".join(lines) + "\n")
    res = {"data_store": store_res, "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "tel"))}
    with dg.instance_for_test() as instance:
        result = dg.materialize([gpu_telemetry], resources=res, partition_key=DAY, instance=instance)
    (mat,) = [e.materialization for e in result.get_asset_materialization_events()]
    assert (mat.metadata["nan_values"].value, mat.metadata["samples"].value) == (10, 24 * 60 * 2)


def test_samples_read_and_not_kept_are_counted_in_the_metadata(tmp_path, store_res):
    """A GPU two pods' series name with different values (the first kept) and a series without a
    UUID label: the reader counted the samples it did not keep, and the asset's metadata showed
    none of it -- two thirds of the samples gone without a trace."""
    uuid = 'UUID="GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",gpu="0",modelName="NVIDIA H100 80GB HBM3"'
    start = int(dt.datetime(2025, 8, 5, tzinfo=dt.UTC).timestamp() * 1000)
    lines = []
    for k in range(2880):
        t = start + k * 30_000
        lines += [f'DCGM_FI_DEV_GPU_UTIL{{{uuid},pod="a"}} 10 {t}', f'DCGM_FI_DEV_GPU_UTIL{{{uuid},pod="b"}} 90 {t}',
                  f'DCGM_FI_DEV_POWER_USAGE{{gpu="1",modelName="NVIDIA H100 80GB HBM3"}} 300 {t}']
    path = tmp_path / "tel" / "dcgm" / "nodeA" / "dcgm-2025-08-05.prom"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    # and an inventory query's output (no timestamp field) in an nvidia-smi host folder
    inventory = tmp_path / "tel" / "nvidia-smi" / "nodeA" / "inventory-2025-08-05.csv"
    inventory.parent.mkdir(parents=True)
    inventory.write_text("name, uuid\nNVIDIA H100 80GB HBM3, GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005\n")
    res = {"data_store": store_res, "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "tel"))}
    with dg.instance_for_test() as instance:
        result = dg.materialize([gpu_telemetry], resources=res, partition_key=DAY, instance=instance)
    (mat,) = [e.materialization for e in result.get_asset_materialization_events()]
    md = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    assert md["samples"] == 2880
    assert (md["conflicting_samples"], md["samples_without_uuid"], md["duplicate_samples"]) == (2880, 2880, 0)
    assert (md["layouts_without_time"], md["lines_quarantined"]) == (1, 1)


def test_telemetry_gap_fails_coverage_and_blocks(tmp_path, store_res):
    # samples only for the first 6 hours of the day: coverage 25 % < 80 %
    nvsmi_log(tmp_path / "tel" / "nvidia-smi" / "gpu01" / "nvidia-smi-2025-08-05.csv",
              dt.datetime(2025, 8, 5), 24 * 60, skip=lambda i: i >= 720)
    res = {"data_store": store_res, "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "tel"))}
    result, checks, mats = run([gpu_telemetry, gpu_samples], res)
    assert checks["coverage"] is False and checks["has_samples"] is True
    assert "clean/gpu_samples" not in mats


def test_the_telemetry_coverage_threshold_is_a_setting(tmp_path, store_res):
    """Sparse telemetry (spot captures, a sampler every hour) can never reach 80 % of its own cadence over
    a day: the operator lowers the threshold (GPU_PIPELINE_TELEMETRY_MIN_COVERAGE_PCT, 0 = off). The
    6 hours of the test above (25 %) pass at 20 %, go downstream, and fail at 30 %; a setting that is no
    percentage fails the step naming it."""
    nvsmi_log(tmp_path / "tel" / "nvidia-smi" / "gpu01" / "nvidia-smi-2025-08-05.csv",
              dt.datetime(2025, 8, 5), 24 * 60, skip=lambda i: i >= 720)
    for pct, passed in (("20", True), ("0", True), ("30", False)):
        res = {"data_store": store_res,
               "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "tel"), min_coverage_pct=pct)}
        result, evaluations = _evaluations([gpu_telemetry, gpu_samples], res)
        ev = evaluations["coverage"]
        assert ev.passed is passed, pct
        assert ev.metadata["min_coverage_pct"].value == float(pct)
        assert ev.metadata["coverage_by_day"].value == {DAY: pytest.approx(0.25, abs=0.01)}
        assert ("clean/gpu_samples" in {m.asset_key.to_user_string()
                                        for m in result.get_asset_materialization_events()
                                        for m in [m.event_specific_data.materialization]}) is passed
    for bad in ("120", "80%"):
        res = {"data_store": store_res,
               "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "tel"), min_coverage_pct=bad)}
        with pytest.raises(ValueError, match=f"GPU_PIPELINE_TELEMETRY_MIN_COVERAGE_PCT='{bad}': expected"):
            run([gpu_telemetry], res, raise_errors=True)
    # an installation without telemetry does not read it
    off = {"data_store": store_res, "telemetry": TelemetryResource(min_coverage_pct="80%")}
    assert run([gpu_telemetry], off)[0].success


def test_out_of_range_values_are_quarantined_and_fail_the_range_check(tmp_path, store_res):
    # 5 % of samples report 150 % utilization
    nvsmi_log(tmp_path / "tel" / "nvidia-smi" / "gpu01" / "nvidia-smi-2025-08-05.csv",
              dt.datetime(2025, 8, 5), 24 * 60, util=lambda i: 150 if i % 20 == 0 else 40)
    res = {"data_store": store_res, "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "tel"))}
    result, checks, _ = run([gpu_telemetry, gpu_samples], res)
    assert checks["values_in_range"] is False
    q = Store(tmp_path / "data").read_table(QUARANTINE_GPU_SAMPLES, DAY).to_pylist()
    assert len(q) == 2880 // 20 and "util_pct=150.0" in q[0]["reason"]


def test_slot_snapshot_key_collision_fails_uniqueness(tmp_path, store_res):
    ts = "2025-08-05 10:00:01.000000"
    rows = [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Unclaimed"), slot_row(ts, "slot1", "GPU-aaaaaaaa", "Drained")]
    write_gpu_state_db(tmp_path / "arch" / "gpu_state_2025-08.db", rows)
    res = {"data_store": store_res, "condor_archive": CondorArchiveResource(archive_dir=str(tmp_path / "arch"))}
    result, checks, _ = run([condor_slot_snapshots, slot_snapshots], res)
    assert checks["has_snapshots"] is True and checks["unique_snapshot_slot_gpu"] is False


def test_schema_drift_names_the_archive_and_its_absent_columns(tmp_path, store_res):
    """DESIGN 6: a schema-drift check. An old month without PreventJobsReason / Disk (only later
    files have them) passes, with a stray MIG-bug column listed as dropped; a month without
    PrioritizedProjects (read as null: every GPU open capacity) fails, as a warning naming the file
    and the column, and the day is still written."""
    ts = "2025-08-05 10:00:01.000000"
    rows = [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Unclaimed", projects="Lab")]
    for name, columns, passed in (("old", OLD_COLUMNS, True), ("new", NEW_COLUMNS, True),
                                  ("drifted", tuple(c for c in OLD_COLUMNS if c != "PrioritizedProjects"), False)):
        db = write_gpu_state_db(tmp_path / name / "gpu_state_2025-08.db", rows, columns)
        res = {"data_store": store_res, "condor_archive": CondorArchiveResource(archive_dir=str(db.parent))}
        with dg.instance_for_test() as instance:
            result = dg.materialize([condor_slot_snapshots], resources=res, partition_key=DAY, instance=instance,
                                    raise_on_error=False)
            assert result.success
            ev = {e.check_name: e for e in result.get_asset_check_evaluations()}["schema_drift"]
        assert ev.passed is passed and ev.severity == dg.AssetCheckSeverity.WARN
        absent, dropped = ev.metadata["columns_absent"].value, ev.metadata["columns_dropped"].value
        assert absent == ({} if passed else {str(db): ["PrioritizedProjects"]})
        assert dropped == ({str(db): ["GPUs_MIG_0_DeviceName"]} if name == "new" else {})


def test_day_without_snapshots_fails_the_blocking_check(tmp_path, store_res):
    write_gpu_state_db(tmp_path / "arch" / "gpu_state_2025-08.db",
                       [slot_row("2025-08-20 10:00:01.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed")])
    res = {"data_store": store_res, "condor_archive": CondorArchiveResource(archive_dir=str(tmp_path / "arch"))}
    result, checks, mats = run([condor_slot_snapshots, slot_snapshots], res)
    assert checks["has_snapshots"] is False and "clean/slot_snapshots" not in mats


def test_an_empty_optional_source_stops_only_what_reads_it(tmp_path, store_res, loaded_defs):
    """Kueue and telemetry configured but empty for the day (both blocking checks fail, as in a
    nightly one-day run): their tables and plots stop, the rest goes on. The plots were one step,
    which Dagster skips whole when any input is skipped, so the allocation, availability and
    eviction plots were lost too; the task runs shared a step with their telemetry means."""
    from gpu_pipeline.defs.resources import KueueResource
    from gpu_pipeline_tests.defs.test_definitions import _hand_archive

    _hand_archive(tmp_path / "archive", [DAY])
    for empty in ("kueue", "telemetry"):
        (tmp_path / empty).mkdir()
    resources = {
        "data_store": store_res,
        "condor_archive": CondorArchiveResource(archive_dir=str(tmp_path / "archive")),
        "job_records": JobRecordsResource(),
        "kueue": KueueResource(scrape_dir=str(tmp_path / "kueue")),
        "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "telemetry")),
    }
    result, checks, mats = run(list(loaded_defs.assets), resources)
    assert checks["has_scrapes"] is False and checks["has_samples"] is False
    assert {"plots/allocation_over_day", "plots/daily_dashboard", "plots/availability_durations",
            "plots/evictions_by_hour", "clean/task_runs", "metrics/allocation_daily"} <= mats
    assert not mats & {"plots/demand_capacity_panels", "plots/efficiency_scatter", "metrics/task_gpu_means",
                       "clean/kueue_demand", "clean/gpu_samples"}


def _kept_day(result, key: str) -> tuple[list, dict]:
    """The failed blocking check's kept days, and the day's materialization metadata."""
    (ev,) = [e for e in result.get_asset_check_evaluations()
             if e.asset_key.to_user_string() == key and e.check_name.startswith("has_")]
    (mat,) = [m.event_specific_data.materialization for m in result.get_asset_materialization_events()
              if m.event_specific_data.materialization.asset_key.to_user_string() == key]
    assert ev.passed is False
    return ev.metadata["days_kept_as_written_before"].value, mat.metadata


@pytest.mark.parametrize("source", ["slots", "telemetry", "jobs", "kueue"])
def test_a_re_run_whose_source_gives_nothing_keeps_the_day_written_before(tmp_path, store_res, source):
    """A month archive rotated away, telemetry pruned on the nodes, job records expired, a scrape
    folder emptied: re-running the day fails its blocking check, and the raw partition an earlier run
    wrote (and its quarantine) stays as it was instead of being emptied under the tables downstream,
    which the check stops. Without an earlier partition, the empty day is written as before."""
    from gpu_pipeline.defs.clean.kueue_demand import kueue_demand
    from gpu_pipeline.defs.raw.kueue_scrapes import kueue_scrapes
    from gpu_pipeline.defs.resources import KueueResource
    from gpu_pipeline.lib.kueue_source import RAW_KUEUE_SCRAPES
    from gpu_pipeline.lib.schemas import (
        QUARANTINE_CONDOR_RAW,
        QUARANTINE_GPU_TELEMETRY,
        RAW_CONDOR_SLOT_SNAPSHOTS,
        RAW_GPU_TELEMETRY,
        RAW_JOB_DOCUMENTS,
    )

    src = tmp_path / "src"
    src.mkdir()
    if source == "slots":
        write_gpu_state_db(src / "gpu_state_2025-08.db",
                           [slot_row("2025-08-05 10:00:01.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed"),
                            slot_row("2025-08-05 10:05:01.000000", "slot1", "GPU-aaaaaaaa", "Claimed")])
        assets, spec, quarantine, key = [condor_slot_snapshots, slot_snapshots], RAW_CONDOR_SLOT_SNAPSHOTS, \
            QUARANTINE_CONDOR_RAW, "raw/condor_slot_snapshots"
        res = {"condor_archive": CondorArchiveResource(archive_dir=str(src))}
    elif source == "telemetry":
        nvsmi_log(src / "nvidia-smi" / "gpu01" / "nvidia-smi-2025-08-05.csv", dt.datetime(2025, 8, 5), 24 * 60)
        with (src / "nvidia-smi" / "gpu01" / "nvidia-smi-2025-08-05.csv").open("a") as fh:
            fh.write("2025/08/05 07:30:00.000, 0, broken\n")  # a quarantined line
        assets, spec, quarantine, key = [gpu_telemetry, gpu_samples], RAW_GPU_TELEMETRY, QUARANTINE_GPU_TELEMETRY, \
            "raw/gpu_telemetry"
        res = {"telemetry": TelemetryResource(telemetry_dir=str(src))}
    elif source == "jobs":
        (src / "jobs-2025-08-05.ndjson").write_text(
            json.dumps(job_doc("s#1.0#1", epoch("2025-08-05T10:00:00"), epoch("2025-08-05T12:00:00"))) + "\n")
        assets, spec, quarantine, key = [job_documents, jobs], RAW_JOB_DOCUMENTS, None, "raw/job_documents"
        res = {"job_records": JobRecordsResource(files_dir=str(src))}
    else:
        for hhmm in ("1000", "1015"):
            (src / f"kueue-20250805T{hhmm}00Z.prom").write_text(
                'kueue_pending_workloads{cluster_queue="cq-a",status="active"} 2\n')
        assets, spec, quarantine, key = [kueue_scrapes, kueue_demand], RAW_KUEUE_SCRAPES, None, "raw/kueue_scrapes"
        res = {"kueue": KueueResource(scrape_dir=str(src))}
    res["data_store"] = store_res
    store = Store(tmp_path / "data")
    result, checks, _ = run(assets, res)
    assert result.success
    written = store.partition_file(spec, DAY).read_bytes()
    rows = store.read_table(spec, DAY).num_rows
    assert rows > 0
    if quarantine is not None:
        quarantined = store.read_table(quarantine, DAY).num_rows
        assert quarantined == (1 if source == "telemetry" else 0)

    for f in src.rglob("*"):  # the source gives nothing for the day now
        if f.is_file():
            f.unlink()
    result, checks, mats = run(assets, res)
    kept, md = _kept_day(result, key)
    assert kept == [DAY] and md["kept_previous_partition"].value == {"rows": rows}
    assert md["dagster/row_count"].value == rows
    assert store.partition_file(spec, DAY).read_bytes() == written  # untouched
    if quarantine is not None:
        assert store.read_table(quarantine, DAY).num_rows == quarantined
    assert len(mats) == 1  # the blocking check stopped the table downstream

    store.partition_file(spec, DAY).unlink()  # no earlier partition: the empty day is written
    result, checks, _ = run(assets, res)
    assert store.read_table(spec, DAY).num_rows == 0
    (ev,) = [e for e in result.get_asset_check_evaluations()
             if e.asset_key.to_user_string() == key and e.check_name.startswith("has_")]
    assert ev.passed is False and ev.metadata["days_kept_as_written_before"].value == []


def test_a_day_whose_own_job_file_expired_keeps_its_documents(tmp_path, store_res):
    """Files mode reads the day's file and the next days' (records of runs that started in the day):
    the day's own file gone, the later one still there, the day has no document of its own. It is
    not overwritten with the later day's records (its job was lost from clean/jobs), and its check
    fails."""
    d = tmp_path / "jobs"
    d.mkdir()
    (d / "jobs-2025-08-05.ndjson").write_text(
        json.dumps(job_doc("s#1.0#1", epoch("2025-08-05T10:00:00"), epoch("2025-08-05T12:00:00"))) + "\n")
    # the next day's file: a run of that day, and one that crossed midnight into it (also the day's)
    (d / "jobs-2025-08-06.ndjson").write_text(
        json.dumps(job_doc("s#2.0#1", epoch("2025-08-06T10:00:00"), epoch("2025-08-06T12:00:00"))) + "\n"
        + json.dumps(job_doc("s#3.0#1", epoch("2025-08-05T22:00:00"), epoch("2025-08-06T02:00:00"))) + "\n")
    res = {"data_store": store_res, "job_records": JobRecordsResource(files_dir=str(d))}
    store = Store(tmp_path / "data")
    result, checks, _ = run([job_documents, jobs], res)
    day_jobs = ["s#1.0#1", "s#3.0#1"]
    assert checks["has_documents"] is True and sorted(store.read_table(JOBS, DAY)["global_job_id"].to_pylist()) == day_jobs
    (d / "jobs-2025-08-05.ndjson").unlink()
    result, checks, mats = run([job_documents, jobs], res)
    kept, md = _kept_day(result, "raw/job_documents")
    assert kept == [DAY] and (md["documents"].value, md["documents_of_the_day"].value) == (2, 0)
    assert sorted(store.read_table(JOBS, DAY)["global_job_id"].to_pylist()) == day_jobs


def test_a_telemetry_source_of_unreadable_lines_is_not_nothing(tmp_path, store_res):
    """Lines that are all set aside (a wrong field list, a format change) are written to the
    quarantine, which says why the day has no sample: only a source that gives nothing keeps the day."""
    from gpu_pipeline.lib.schemas import QUARANTINE_GPU_TELEMETRY, RAW_GPU_TELEMETRY

    log = tmp_path / "tel" / "nvidia-smi" / "gpu01" / "nvidia-smi-2025-08-05.csv"
    nvsmi_log(log, dt.datetime(2025, 8, 5), 24 * 60)
    res = {"data_store": store_res, "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "tel"))}
    store = Store(tmp_path / "data")
    assert run([gpu_telemetry], res)[0].success
    log.write_text("timestamp, index, uuid\n" + "".join(f"2025/08/05 10:00:{s:02d}.000, 0, broken\n"
                                                          for s in range(5)))
    result, checks, _ = run([gpu_telemetry], res)
    assert checks["has_samples"] is False
    assert store.read_table(RAW_GPU_TELEMETRY, DAY).num_rows == 0
    assert store.read_table(QUARANTINE_GPU_TELEMETRY, DAY).num_rows == 5


def test_a_partition_that_cannot_be_read_whole_is_not_kept(tmp_path):
    from gpu_pipeline.lib.schemas import RAW_JOB_DOCUMENTS

    store = Store(tmp_path / "data")
    table = pa.table({"source": ["files"] * 3000, "origin": ["f"] * 3000, "position": list(range(3000)),
                      "doc_json": [json.dumps({"GlobalJobId": f"s#{i}.0#1", "pad": "x" * 50}) for i in range(3000)],
                      "parse_error": [None] * 3000})
    store.write_partition(RAW_JOB_DOCUMENTS, DAY, table)
    kept = store.kept_partition(RAW_JOB_DOCUMENTS, DAY)
    assert kept is not None and kept.kept and kept.rows == 3000
    path = store.partition_file(RAW_JOB_DOCUMENTS, DAY)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)  # a data page damaged, the footer intact
    path.write_bytes(bytes(data))
    assert store.kept_partition(RAW_JOB_DOCUMENTS, DAY) is None


def test_a_condor_q_run_closed_by_another_sources_record_is_closed_on_every_day(tmp_path, store_res):
    """Files mode, two sources: a ``condor_q -json`` snapshot of a job running since 11:00 on the 5th
    (condor_history file) and the adstash epoch document of that run, completed at 15:00 (NDJSON).
    The two rows have other keys (source, doc_kind): the snapshot's open row stayed open on the 5th
    and, alone, on the 6th (which reads the 5th's files); the efficiency of the 7th, reading the 6th's
    records as its look-around, then had the job run on its GPU all day. Closed at 15:00, the 6th has
    no row of the job and no later day counts it."""
    from gpu_pipeline.defs.metrics.efficiency import efficiency
    from gpu_pipeline.lib.efficiency import JOB_EFFICIENCY
    from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_SAMPLES, GPU_STATES, conform

    d = tmp_path / "jobs"
    d.mkdir()
    gj = "ap1#10.0#1754380800"
    snap = {"GlobalJobId": gj, "JobStatus": 2, "NumJobStarts": 1, "NumShadowStarts": 1, "Owner": "alice",
            "QDate": epoch("2025-08-05T10:00:00"), "JobCurrentStartDate": epoch("2025-08-05T11:00:00"),
            "ServerTime": epoch("2025-08-05T12:00:00"), "RemoteHost": "slot1_1@gpu01", "RequestGPUs": 1,
            "AssignedGPUs": "GPU-aaaaaaaa"}
    ended = dict(snap, JobStatus=4, EpochAdType="EPOCH", EpochWriteDate=epoch("2025-08-05T15:00:00"),
                 CompletionDate=epoch("2025-08-05T15:00:00"))
    del ended["ServerTime"]
    (d / "condor_q-2025-08-05.json").write_text(json.dumps([snap]))
    (d / "epochs-2025-08-05.ndjson").write_text(json.dumps(ended) + "\n")
    for day in ("05", "06", "07", "08"):  # another job each day: every day has documents of its own
        (d / f"jobs-2025-08-{day}.ndjson").write_text(json.dumps(job_doc(
            f"s#{day}.0#1", epoch(f"2025-08-{day}T01:00:00"), epoch(f"2025-08-{day}T02:00:00"))) + "\n")
    res = {"data_store": store_res, "job_records": JobRecordsResource(files_dir=str(d))}
    store = Store(tmp_path / "data")
    days = ["2025-08-05", "2025-08-06", "2025-08-07", "2025-08-08"]
    closed = {}
    for day in days:
        result, checks, _ = run([job_documents, jobs], res, partition_key=day)
        assert result.success and all(checks.values()), day
        (md,) = [m.event_specific_data.materialization.metadata for m in result.get_asset_materialization_events()
                 if m.asset_key.to_user_string() == "clean/jobs"]
        closed[day] = md["runs_closed_by_later_record"].value
    # the efficiency of the 7th (it reads the job records of the 6th to the 8th): the GPU was idle and
    # unclaimed after 15:00 on the 5th; no run of the job
    for day in days:
        lo = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)
        ts = [lo + dt.timedelta(minutes=m) for m in range(0, 1440, 5)]
        gpu = {"gpu_id": "GPU-aaaaaaaa", "host": "gpu01"}
        store.write_partition(GPU_SAMPLES, day, conform(pa.Table.from_pylist([
            {**gpu, "sample_utc": t, "source": "nvidia-smi", "device_name": "NVIDIA A100-SXM4-40GB", "util_pct": 0.0,
             "power_w": 55.0, "power_limit_w": 400.0} for t in ts]), GPU_SAMPLES))
        store.write_partition(GPU_STATES, day, conform(pa.Table.from_pylist([
            {**gpu, "bucket_start_utc": t, "state": "idle_shared", "n_slot_rows": 1} for t in ts]), GPU_STATES))
        store.write_partition(CLEAN_SLOT_SNAPSHOTS, day, conform(pa.Table.from_pylist([
            {**gpu, "snapshot_utc": t, "slot_name": "slot1_1@gpu01", "tier": "shared", "is_backfill_slot": False,
             "slot_state": "Unclaimed"} for t in ts]), CLEAN_SLOT_SNAPSHOTS))
    with dg.instance_for_test() as instance:
        assert dg.materialize([efficiency], resources={"data_store": store_res}, partition_key="2025-08-07",
                              instance=instance).success
    assert [r["global_job_id"] for r in store.read_table(JOB_EFFICIENCY, "2025-08-07").to_pylist()
            if r["global_job_id"] == gj] == []
    rows = {day: sorted((r["source"], r["doc_kind"], r["run_end_utc"]) for r in store.read_table(JOBS, day).to_pylist()
                        if r["global_job_id"] == gj) for day in days}
    end = dt.datetime(2025, 8, 5, 15, tzinfo=dt.UTC)
    assert rows == {"2025-08-05": [("condor_history", "job", end), ("ndjson", "epoch", end)],
                    "2025-08-06": [], "2025-08-07": [], "2025-08-08": []}
    # the 6th reads the 5th's files: the snapshot's run closed there too, then outside the day
    assert closed == {"2025-08-05": 1, "2025-08-06": 1, "2025-08-07": 0, "2025-08-08": 0}


def _five_minute_rows(day_start: dt.datetime, hours: float) -> list[dict]:
    """A GPU's slot row every 5 minutes for ``hours`` from ``day_start`` (naive local time text)."""
    return [slot_row((day_start + dt.timedelta(minutes=5 * k)).strftime("%Y-%m-%d %H:%M:%S.000000"), "slot1",
                     "GPU-aaaaaaaa", "Unclaimed") for k in range(int(hours * 12))]


def test_a_rotated_month_archive_keeps_the_whole_day_and_fails_coverage(tmp_path, store_res):
    """A UTC day of an archive kept in local time (Chicago, UTC-5 in November) reads its first 5 hours
    from the October file. Run once with both months: 288 snapshots, coverage passes. Then the October
    file is rotated away and the day re-run: the partition an earlier run wrote is kept (it was replaced
    by the 228 snapshots of November alone), and the coverage check fails naming the missing month. A
    first run without the October file writes what there is and fails coverage (228 of 288: 79 %)."""
    arch = tmp_path / "arch"
    write_gpu_state_db(arch / "gpu_state_2025-10.db", _five_minute_rows(dt.datetime(2025, 10, 31, 19), 5))
    write_gpu_state_db(arch / "gpu_state_2025-11.db", _five_minute_rows(dt.datetime(2025, 11, 1), 19))
    res = {"data_store": store_res,
           "condor_archive": CondorArchiveResource(archive_dir=str(arch), source_timezone="America/Chicago")}
    store = Store(store_res.data_root)
    from gpu_pipeline.lib.schemas import RAW_CONDOR_SLOT_SNAPSHOTS

    def snapshots() -> int:
        return len(set(store.read_table(RAW_CONDOR_SLOT_SNAPSHOTS, "2025-11-01", ["snapshot_utc"])
                       .column("snapshot_utc").to_pylist()))

    def evaluation(result):
        return {e.check_name: e for e in result.get_asset_check_evaluations()}["coverage"]

    def day_figures(instance) -> tuple[int, int | None]:
        md = instance.get_latest_materialization_event(RAW_KEY).asset_materialization.metadata
        return md["snapshots"].value, md["snapshots_kept"].value if "snapshots_kept" in md else None

    with dg.instance_for_test() as instance:
        def materialize():
            return dg.materialize([condor_slot_snapshots], resources=res, partition_key="2025-11-01",
                                  instance=instance, raise_on_error=False)
        first = materialize()
        assert first.success and evaluation(first).passed and snapshots() == 288
        (arch / "gpu_state_2025-10.db").rename(tmp_path / "rotated.db")
        again = materialize()
        ev = evaluation(again)
        assert again.success and snapshots() == 288  # kept: not replaced by November's 228
        assert ev.passed is False and ev.severity == dg.AssetCheckSeverity.WARN
        assert ev.metadata["missing_months_by_day"].value == {"2025-11-01": ["2025-10"]}
        assert ev.metadata["days_kept_as_written_before"].value == ["2025-11-01"]
        assert day_figures(instance) == (228, 288)  # what the source gives now; what the partition holds
        # both months gone: the archive gives nothing, the day is kept and measured on what it keeps
        (arch / "gpu_state_2025-11.db").rename(tmp_path / "rotated-11.db")
        gone = materialize()
        ev = evaluation(gone)
        assert snapshots() == 288 and ev.metadata["days_kept_as_written_before"].value == ["2025-11-01"]
        assert ev.metadata["coverage_by_day"].value == {"2025-11-01": 1.0}
        assert ev.metadata["missing_months_by_day"].value == {"2025-11-01": ["2025-10", "2025-11"]}
        assert day_figures(instance) == (0, 288)
        (tmp_path / "rotated-11.db").rename(arch / "gpu_state_2025-11.db")
    store_res2 = DataStoreResource(data_root=str(tmp_path / "fresh"))
    store = Store(store_res2.data_root)
    res["data_store"] = store_res2
    with dg.instance_for_test() as instance:
        fresh = dg.materialize([condor_slot_snapshots], resources=res, partition_key="2025-11-01",
                               instance=instance, raise_on_error=False)
        ev = evaluation(fresh)
        assert day_figures(instance) == (228, None)
    assert fresh.success and snapshots() == 228
    assert ev.passed is False and ev.metadata["below_threshold"].value == {"2025-11-01": pytest.approx(228 / 288, abs=1e-4)}


def test_gpu_hours_conserved_fails_for_one_gpus_bucket_twice_and_anothers_missing(tmp_path, store_res, monkeypatch):
    """The check holds every GPU to one row per bucket: a table where one GPU has a bucket twice and
    another lacks one has the right total (GPUs x buckets) and must still fail, naming a GPU."""
    import gpu_pipeline.defs.metrics.gpu_states as asset_module
    from gpu_pipeline.lib.schemas import GPU_STATES

    real = asset_module.states_for_day

    def broken(store, day, start, end):
        t = real(store, day, start, end).sort_by([("gpu_id", "ascending"), ("bucket_start_utc", "ascending")])
        rows = t.to_pylist()
        a = [r for r in rows if r["gpu_id"] == "GPU-aaaaaaaa"]
        b = [r for r in rows if r["gpu_id"] == "GPU-bbbbbbbb"]
        return pa.Table.from_pylist(a + [a[0]] + b[1:], schema=GPU_STATES.schema)

    ts = "2025-08-05 10:00:01.000000"
    write_gpu_state_db(tmp_path / "arch" / "gpu_state_2025-08.db",
                       [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Unclaimed"), slot_row(ts, "slot1", "GPU-bbbbbbbb", "Claimed")])
    res = {"data_store": store_res, "condor_archive": CondorArchiveResource(archive_dir=str(tmp_path / "arch"))}
    from gpu_pipeline.defs.metrics.gpu_states import gpu_states

    _, checks, _ = run([condor_slot_snapshots, slot_snapshots, gpu_states], res)
    assert checks["gpu_hours_conserved"] is True
    monkeypatch.setattr(asset_module, "states_for_day", broken)
    ev = _evaluations([condor_slot_snapshots, slot_snapshots, gpu_states], res)[1]["gpu_hours_conserved"]
    assert ev.passed is False
    assert "2 of 2 GPUs" in ev.metadata["violations"].value[DAY]


def test_a_tier_without_capacity_has_no_allocation_kpi_not_zero(tmp_path, store_res):
    """Every priority GPU Drained all day: the priority tier had no capacity, its allocation is null in
    the table, and the day's materialization shows no priority KPI (a 0 % there read as nothing
    allocated); the shared tier's is 100 %."""
    ts = "2025-08-05 10:00:01.000000"
    write_gpu_state_db(tmp_path / "arch" / "gpu_state_2025-08.db", [
        slot_row(ts, "slot1", "GPU-aaaaaaaa", "Drained", host="p01", projects="Lab"),
        slot_row(ts, "slot1_1", "GPU-bbbbbbbb", "Claimed", host="s01", job="s#1.0#1")])
    res = {"data_store": store_res, "condor_archive": CondorArchiveResource(archive_dir=str(tmp_path / "arch"))}
    from gpu_pipeline.defs.metrics.allocation import allocation
    from gpu_pipeline.defs.metrics.gpu_states import gpu_states

    with dg.instance_for_test() as instance:
        result = dg.materialize([condor_slot_snapshots, slot_snapshots, gpu_states, allocation], resources=res,
                                partition_key=DAY, instance=instance, raise_on_error=False)
        (md,) = [m.event_specific_data.materialization.metadata for m in result.get_asset_materialization_events()
                 if m.event_specific_data.materialization.asset_key.to_user_string() == "metrics/allocation_daily"]
    assert result.success
    from gpu_pipeline.lib.allocation import ALLOCATION_DAILY

    daily = {r["tier"]: r for r in Store(store_res.data_root).read_table(ALLOCATION_DAILY, DAY).to_pylist()
             if r["device_name"] == "ALL"}
    assert daily["priority"]["allocation_pct"] is None
    assert "priority_allocation_pct" not in md
    assert md["shared_allocation_pct"].value == 100.0


def test_a_gpu_id_two_hosts_name_in_one_snapshot_is_warned_about(tmp_path, store_res):
    """Two boards whose HTCondor short ids are the same (8 hex digits of the UUID; HTCondor 9.1's MIG
    ids have 4) are one GPU in the states: the clean step warns, naming the id and its hosts. A GPU
    moved from one host to another in the day is no collision."""
    rows = []
    for k in range(3):
        ts = f"2025-08-05 10:{5 * k:02d}:01.000000"
        rows += [slot_row(ts, "slot1", "GPU-00000000", "Unclaimed", host="h100-a"),
                 slot_row(ts, "slot1", "GPU-00000000", "Claimed", host="h100-b", job="s#1.0#1"),
                 slot_row(ts, "slot1", "GPU-bbbbbbbb", "Unclaimed", host="moved-from" if k < 2 else "moved-to")]
    write_gpu_state_db(tmp_path / "arch" / "gpu_state_2025-08.db", rows)
    res = {"data_store": store_res, "condor_archive": CondorArchiveResource(archive_dir=str(tmp_path / "arch"))}
    result, evs = _evaluations([condor_slot_snapshots, slot_snapshots], res)
    ev = evs["gpu_id_on_one_host"]
    assert result.success and ev.passed is False and ev.severity == dg.AssetCheckSeverity.WARN
    assert ev.metadata["gpu_ids_on_several_hosts_by_day"].value == {
        DAY: {"gpu_ids": 1, "examples": {"GPU-00000000": {"hosts": ["h100-a", "h100-b"], "snapshots": 3}}}}
    # one host spelled two ways (its Machine in capitals, or a short name beside the full one) is one host
    from gpu_pipeline.lib.db import connect
    from gpu_pipeline.lib.slots import gpu_id_collisions

    con = connect()
    con.register("t", pa.table({"snapshot_utc": [1, 1, 1, 1], "gpu_id": ["GPU-a", "GPU-a", "GPU-b", "GPU-b"],
                                "host": ["GPU01.example.org", "gpu01.example.org", "gpu02", "gpu02.example.org"]}))
    assert gpu_id_collisions(con, "t") == (0, {})
    # machines named by IP address, or sharing their first label at two sites, are different hosts
    con.register("v", pa.table({"snapshot_utc": [1] * 4, "gpu_id": ["GPU-a", "GPU-a", "GPU-b", "GPU-b"],
                                "host": ["10.0.3.17", "10.0.5.42", "node001.site-a.edu", "node001.site-b.edu"]}))
    assert gpu_id_collisions(con, "v")[0] == 2
    con.register("u", pa.table({"snapshot_utc": [1] * 6, "gpu_id": ["GPU-a", "GPU-a", "GPU-b", "GPU-b", "GPU-c", "GPU-c"],
                                "host": ["h1", "h2", "h1", "h2", "h1", "h2"]}))
    total, examples = gpu_id_collisions(con, "u", limit=2)
    assert total == 3 and list(examples) == ["GPU-a", "GPU-b"]


def _telemetry_day(res: dict, logged: str) -> tuple[dict, list[str]]:
    """The raw telemetry day's metadata, and the run's log lines holding ``logged``."""
    with dg.instance_for_test() as instance:
        result = dg.materialize([gpu_telemetry], resources=res, partition_key=DAY, instance=instance,
                                raise_on_error=False)
        (mat,) = [e.materialization for e in result.get_asset_materialization_events()]
        logs = [r.user_message for r in instance.all_logs(result.run_id) if logged in r.user_message]
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}, logs


def test_a_scrape_file_copied_without_its_time_is_counted_and_warned_about(tmp_path, store_res):
    """dcgm-exporter writes no timestamps by default: a scrape file's samples take its modification
    time. Copied without it (cp without -p), the day's file reads as the copy's day: its rows fell
    outside the day with nothing in the metadata or the log; both counters are there now, with a
    warning saying what to do."""
    uuid = 'UUID="GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",gpu="0",modelName="NVIDIA H100 80GB HBM3"'
    path = tmp_path / "tel" / "dcgm" / "nodeA" / "dcgm-2025-08-05.prom"
    path.parent.mkdir(parents=True)
    path.write_text(f"DCGM_FI_DEV_GPU_UTIL{{{uuid}}} 10\nDCGM_FI_DEV_POWER_USAGE{{{uuid}}} 300\n")
    copied = dt.datetime(2026, 11, 28, 12, tzinfo=dt.UTC).timestamp()  # the copy's time, not the scrape's
    os.utime(path, (copied, copied))
    res = {"data_store": store_res, "telemetry": TelemetryResource(telemetry_dir=str(tmp_path / "tel"))}
    md, logs = _telemetry_day(res, "modification time")
    assert md["samples"] == 0
    assert md["samples_default_time"] == 2 and md["rows_outside_window"] == 1  # two sample lines, one row
    assert len(logs) == 1 and "cp -p" in logs[0]
    # a healthy day: the file keeps its time; the next day's file (a margin file, read in case it holds
    # the day's samples) falls outside it -- counted, no warning
    scraped = dt.datetime(2025, 8, 5, 12, tzinfo=dt.UTC).timestamp()
    os.utime(path, (scraped, scraped))
    other = path.with_name("dcgm-2025-08-06.prom")
    other.write_text(path.read_text())
    nxt = dt.datetime(2025, 8, 6, 12, tzinfo=dt.UTC).timestamp()
    os.utime(other, (nxt, nxt))
    res["telemetry"] = TelemetryResource(telemetry_dir=str(tmp_path / "tel"), file_margin_days="1")
    md, logs = _telemetry_day(res, "modification time")
    assert md["samples"] == 1 and logs == []


def test_a_day_whose_documents_are_all_set_aside_is_warned_about(tmp_path, store_res):
    """An undated export of accounting records (no GlobalJobId: not job ads) in the job-record folder:
    it is every day's own documents, so has_documents passes, and every one was set aside -- the day
    had no job run and nothing said so."""
    d = tmp_path / "jobs"
    d.mkdir()
    (d / "accounting.ndjson").write_text("\n".join(json.dumps({"RecordId": f"r{i}", "WallDuration": 60})
                                                   for i in range(3)) + "\n")
    res = {"data_store": store_res, "job_records": JobRecordsResource(files_dir=str(d))}
    result, evs = _evaluations([job_documents, jobs], res)
    assert result.success and evs["has_documents"].passed
    ev = evs["documents_give_job_runs"]
    assert ev.passed is False and ev.severity == dg.AssetCheckSeverity.WARN
    (reasons,) = ev.metadata["days_all_set_aside"].value.values()
    assert sum(reasons.values()) == 3
    # a quiet day: its file holds a record of a run of the day before (outside the day) and the next
    # day's file a line still being written: no such day
    (d / "accounting.ndjson").unlink()
    (d / "jobs-2025-08-05.ndjson").write_text(json.dumps(job_doc("s#1.0#1", epoch("2025-08-04T01:00:00"),
                                                                 epoch("2025-08-04T03:00:00"))) + "\n")
    (d / "jobs-2025-08-06.ndjson").write_text('{"GlobalJobId": "s#2.0#1", "QDa')
    result, evs = _evaluations([job_documents, jobs], res)
    assert evs["documents_give_job_runs"].passed
    # the day's own file all set aside (a format change: no GlobalJobId) while the day before's file
    # gives a run outside the day: still the day's documents all set aside
    (d / "jobs-2025-08-06.ndjson").unlink()
    (d / "jobs-2025-08-04.ndjson").write_text((d / "jobs-2025-08-05.ndjson").read_text())
    (d / "jobs-2025-08-05.ndjson").write_text(json.dumps({"Owner": "alice", "JobStatus": 4}) + "\n")
    result, evs = _evaluations([job_documents, jobs], res)
    assert evs["documents_give_job_runs"].passed is False
