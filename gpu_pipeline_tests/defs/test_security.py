"""Credentials never leak; user-supplied strings never become SQL or paths."""

import datetime as dt
import json

import dagster as dg
import pyarrow as pa
import pytest

from gpu_pipeline.lib.nvml_sampler import run_sampler
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, JOBS, conform
from gpu_pipeline.lib.states import states_from_table
from gpu_pipeline.lib.store import Store
from gpu_pipeline_tests.es_server import EsStandIn

SECRET = "c2VjcmV0LWtleS1pZDpzM2NyM3QtdmFsdWUtOTk5"  # base64 of a fake "id:key"
DAY = "2025-08-05"


def _doc(i: int) -> dict:
    t = int(dt.datetime(2025, 8, 5, 3, tzinfo=dt.UTC).timestamp()) + i * 600
    return {"GlobalJobId": f"s.example.edu#{i}.0#{t - 100}", "JobStatus": 4, "QDate": t - 100,
            "JobCurrentStartDate": t, "CompletionDate": t + 300, "RecordTime": t + 300, "Owner": "bob"}


def _run_job_documents(monkeypatch, tmp_path, es_url: str):
    from gpu_pipeline.defs.clean.jobs import jobs
    from gpu_pipeline.defs.raw.job_documents import job_documents
    from gpu_pipeline.defs.resources import DataStoreResource, JobRecordsResource

    monkeypatch.setenv("GPU_PIPELINE_ES_HOSTS", es_url)
    monkeypatch.setenv("GPU_PIPELINE_ES_API_KEY", SECRET)
    # bound exactly like gpu_pipeline/defs/resources.py does: the secret only through dg.EnvVar
    resources = {
        "data_store": DataStoreResource(data_root=str(tmp_path / "data")),
        "job_records": JobRecordsResource(es_hosts=dg.EnvVar("GPU_PIPELINE_ES_HOSTS"), es_index="jobs-idx",
                                          es_api_key=dg.EnvVar("GPU_PIPELINE_ES_API_KEY"), es_timeout_s="2"),
    }
    with dg.instance_for_test() as instance:
        result = dg.materialize([job_documents, jobs], resources=resources, partition_key=DAY, instance=instance,
                                raise_on_error=False)
        logs = instance.all_logs(result.run_id)
        dump = "\n".join(json.dumps(e.to_dict() if hasattr(e, "to_dict") else str(e), default=str) for e in logs)
        dump += "\n".join(str(e) for e in logs)
        run = instance.get_run_by_id(result.run_id)
        dump += json.dumps(run.run_config, default=str) + json.dumps(run.tags, default=str)
    return result, dump


def test_api_key_never_appears_in_the_event_log_metadata_or_run_config(monkeypatch, tmp_path):
    with EsStandIn({"jobs-idx": [_doc(i) for i in range(30)]}, api_key=SECRET) as es:
        result, dump = _run_job_documents(monkeypatch, tmp_path, es.url)
        sent = [r for r in es.requests
                if {k.lower(): v for k, v in r.headers.items()}.get("authorization") == f"ApiKey {SECRET}"]
    assert result.success
    assert sent, "the API key was not sent to the server"
    assert SECRET not in dump and "s3cr3t" not in dump
    assert Store(tmp_path / "data").read_table(JOBS, DAY).num_rows == 30


def test_rejected_credentials_fail_clearly_without_the_secret(monkeypatch, tmp_path):
    with EsStandIn({"jobs-idx": [_doc(1)]}, api_key="the-right-key") as es:
        result, dump = _run_job_documents(monkeypatch, tmp_path, es.url)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = str(failure.event_specific_data.error)
    assert "401" in message or "security_exception" in message or "authentication" in message.lower()
    assert SECRET not in message and SECRET not in dump


@pytest.mark.parametrize("host", ["gpu'01\"; DROP TABLE gpu_state; --", "h1) OR 1=1 --"])
def test_hostile_host_names_are_data_not_sql(host):
    t0 = dt.datetime(2025, 8, 5, 0, 0, 5, tzinfo=dt.UTC)
    rows = [dict(snapshot_utc=t0, host=host, slot_name=f"slot1@{host}", gpu_id="GPU-aaaaaaaa", tier="shared",
                 is_backfill_slot=False, slot_state="Unclaimed")]
    out = states_from_table(conform(pa.Table.from_pylist(rows), CLEAN_SLOT_SNAPSHOTS),
                            dt.datetime(2025, 8, 5, tzinfo=dt.UTC), dt.datetime(2025, 8, 5, 0, 10, tzinfo=dt.UTC))
    assert set(out.column("host").to_pylist()) == {host}
    assert out.column("state").to_pylist()[0] == "idle_shared"


@pytest.mark.parametrize("name", ["../../etc", "a/b", ".hidden"])
def test_host_and_plot_names_in_paths_cannot_escape(tmp_path, name):
    store = Store(tmp_path / "data")
    p = store.plot_file(name, DAY)
    assert p.resolve().is_relative_to((tmp_path / "data" / "plots").resolve())
    with pytest.raises(ValueError, match="not usable as a folder name"):
        run_sampler(tmp_path / "nv", interval_s=0, iterations=1, host=name, handle_signals=False)
