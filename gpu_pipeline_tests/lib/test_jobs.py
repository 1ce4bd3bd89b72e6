"""The job-record normalizer and its offline readers (gpu_pipeline.lib.jobs)."""

from __future__ import annotations

import codecs
import datetime as dt
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_pipeline.lib.jobs import (
    JOBS,
    JobsFileError,
    jobs_overlapping,
    normalize_docs,
    quarantine_table,
    read_condor_history_json,
    read_es_export,
    read_ndjson,
)
from gpu_pipeline.lib.schemas import QUARANTINE, conform

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "jobs"
REAL = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "real"
UTC = dt.UTC
BF = "ap40.uw.osg-htc.org#7001234.0#1754380800"


def t(h: int, m: int = 0, s: int = 0, day: int = 5) -> dt.datetime:
    return dt.datetime(2025, 8, day, h, m, s, tzinfo=UTC)


def rows_by_id(table: pa.Table) -> dict[str, dict]:
    return {r["global_job_id"]: r for r in table.to_pylist()}


def real(*parts: str) -> Path:
    p = REAL.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"real fixture {p} is absent (the shared fixtures folder is not checked out here)")
    return p


# --- adstash NDJSON ------------------------------------------------------------------------------


def test_adstash_casing_is_mapped_case_insensitively():
    res = read_ndjson(FIX / "adstash_jobs.ndjson")
    rows = rows_by_id(res.table)
    primary = rows["submit1.chtc.wisc.edu#5100001.0#1754380800"]
    assert primary["request_gpus"] == 2.0  # RequestGpus (adstash re-capitalized RequestGPUs)
    assert primary["num_vacates"] == 0  # numvacates (lower-cased unknown attribute)
    assert primary["assigned_gpus"] == "GPU-0667ce7c,GPU-b156e653"  # full UUID and GPUs_GPU_ form
    assert (primary["host"], primary["slot"], primary["is_backfill_slot"]) == ("gpu0101.chtc.wisc.edu", "slot1_1", False)
    assert primary["job_status_name"] == "Completed" and primary["source"] == "ndjson"

    bf = rows[BF]
    assert bf["num_vacates"] == 1 and bf["vacate_reason_code"] == 1018  # vacatereasoncode
    assert bf["vacate_reason"] == "Preempted for a higher Ranked job"
    assert bf["is_backfill_slot"] is True

    # only remoteowner (no User): user comes from it; numbers given as strings are coerced
    carol = rows["submit2.chtc.wisc.edu#5100006.0#1754384400"]
    assert carol["user"] == "carol@chtc.wisc.edu"
    assert (carol["cluster_id"], carol["proc_id"], carol["job_status"], carol["num_vacates"]) == (5100006, 0, 3, 1)
    assert carol["request_gpus"] == 1.0 and carol["remote_wall_clock_s"] == 7200.0
    assert carol["vacate_reason_code"] == 1018
    # StartdName/StartdSlot absent: derived from LastRemoteHost
    assert (carol["host"], carol["slot"]) == ("gpu0102.chtc.wisc.edu", "slot1_4")
    # evicted at 12:00 (LastVacateTime), removed at 14:00 (EnteredCurrentStatus): the run ended at the vacate
    assert (carol["run_start_utc"], carol["run_end_utc"]) == (t(10), t(12))
    assert carol["schedd"] == "submit2.chtc.wisc.edu"  # from GlobalJobId


def test_zero_dates_are_null():
    rows = rows_by_id(read_ndjson(FIX / "adstash_jobs.ndjson").table)
    primary = rows["submit1.chtc.wisc.edu#5100001.0#1754380800"]
    assert primary["last_vacate_utc"] is None  # LastVacateTime: 0
    carol = rows["submit2.chtc.wisc.edu#5100006.0#1754384400"]
    assert carol["completion_utc"] is None  # CompletionDate: "0"
    res = normalize_docs([{"GlobalJobId": "s#1.0#1", "QDate": 0, "CompletionDate": -1, "JobStartDate": None}], "ndjson")
    r = res.table.to_pylist()[0]
    assert r["queued_utc"] is None and r["completion_utc"] is None and r["run_start_utc"] is None


def test_broken_line_missing_id_bad_value_and_duplicates():
    res = read_ndjson(FIX / "adstash_jobs.ndjson")
    assert res.docs_in == 8  # 9 lines, one blank
    assert res.duplicates == 1  # line 4 repeats line 1
    by_pos = {q.position: q for q in res.quarantine}
    assert sorted(by_pos) == [3, 5, 6]
    assert by_pos[3].reason.startswith("invalid_json: line 3")
    assert by_pos[3].source.endswith("adstash_jobs.ndjson") and isinstance(by_pos[3].raw, str)
    assert by_pos[5].reason.startswith("missing_global_job_id")
    assert by_pos[6].reason.startswith("bad_value: JobStatus='Completed'")
    assert res.quarantined_by_reason == {"bad_value": 1, "invalid_json": 1, "missing_global_job_id": 1}
    assert res.table.num_rows == 4
    # nothing dropped silently: every non-blank line is a row, a duplicate or quarantined
    assert res.table.num_rows + res.duplicates + len(res.quarantine) == res.docs_in


def test_evicted_then_restarted_job_two_epochs_hand_computed():
    epochs = read_ndjson(FIX / "adstash_epochs.ndjson")
    assert epochs.quarantine == [] and epochs.duplicates == 0
    runs = {r["run_index"]: r for r in epochs.table.to_pylist()}
    assert sorted(runs) == [0, 1] and {r["doc_kind"] for r in runs.values()} == {"epoch"}
    r0, r1 = runs[0], runs[1]
    # run 0: 09:00 -> 11:00 on backfill2_1, evicted (no completion; LastVacateTime ends it)
    assert (r0["run_start_utc"], r0["run_end_utc"], r0["completion_utc"]) == (t(9), t(11), None)
    assert (r0["slot"], r0["assigned_gpus"], r0["last_vacate_utc"]) == ("backfill2_1", "GPU-0667ce7c", t(11))
    assert r0["job_status_name"] == "Idle" and r0["committed_time_s"] == 0.0
    # run 1: 12:00 -> 14:00 on backfill2_3, completed; its LastVacateTime (11:00) is the earlier run's
    assert (r1["run_start_utc"], r1["run_end_utc"], r1["completion_utc"]) == (t(12), t(14), t(14))
    assert (r1["slot"], r1["assigned_gpus"], r1["last_vacate_utc"]) == ("backfill2_3", "GPU-1a2b3c4d", t(11))
    assert r1["remote_wall_clock_s"] == 14400.0 and r1["committed_time_s"] == 7200.0
    assert all(r["queued_utc"] == t(8) and r["is_backfill_slot"] for r in (r0, r1))

    # the final job document describes the last run
    job = rows_by_id(read_ndjson(FIX / "adstash_jobs.ndjson").table)[BF]
    assert (job["doc_kind"], job["run_index"], job["num_job_starts"]) == ("job", 1, 2)
    assert (job["run_start_utc"], job["run_end_utc"]) == (t(12), t(14))

    # both files together: three rows, keys unique
    both = read_ndjson([FIX / "adstash_jobs.ndjson", FIX / "adstash_epochs.ndjson"])
    keys = [(r["global_job_id"], r["run_index"], r["doc_kind"]) for r in both.table.to_pylist()]
    assert len(keys) == len(set(keys)) == 6
    assert keys == sorted(keys)


def test_jobs_overlapping_windows():
    table = read_ndjson([FIX / "adstash_jobs.ndjson", FIX / "adstash_epochs.ndjson"]).table

    def hits(start, end):
        out = jobs_overlapping(table, start, end)
        return sorted((r["global_job_id"].split("#")[1], r["run_index"], r["doc_kind"]) for r in out.to_pylist())

    bf = "7001234.0"
    assert (bf, 0, "epoch") in hits(t(10), t(10, 30))  # during run 0
    assert [h for h in hits(t(13), t(13, 30)) if h[0] == bf] == [(bf, 1, "epoch"), (bf, 1, "job")]
    # queued 08:00 -> first start 09:00: the first run's row carries the queue wait; the later run's rows
    # do not where run 0's is read (a copy in every day of the wait), and do by their JobStartDate
    # (first_start_utc) where it is not (a day with the job ad alone finds the wait)
    assert [h for h in hits(t(8, 15), t(8, 30)) if h[0] == bf] == [(bf, 0, "epoch")]
    later = table.filter(pa.compute.invert(pa.compute.and_(
        pa.compute.equal(table["global_job_id"], table.filter(pa.compute.match_substring(
            table["global_job_id"], f"#{bf}#"))["global_job_id"][0]), pa.compute.equal(table["run_index"], 0))))
    out = jobs_overlapping(later, t(8, 15), t(8, 30))
    assert sorted((r["run_index"], r["doc_kind"]) for r in out.to_pylist() if f"#{bf}#" in r["global_job_id"]) == [
        (1, "epoch"), (1, "job")]
    assert [h for h in hits(t(9), t(9, 30)) if h[0] == bf] == [(bf, 0, "epoch")]  # during run 0 only
    assert [h for h in hits(t(14), t(15)) if h[0] == bf] == []  # completed at 14:00 (end exclusive)
    # evicted at 11:00, run again at 12:00: the second run's rows carry the wait between
    assert [h for h in hits(t(11, 15), t(11, 30)) if h[0] == bf] == [(bf, 1, "epoch"), (bf, 1, "job")]
    # never started, queued 10:00, removed 11:30
    never = "5100007.0"
    assert (never, 0, "job") in hits(t(11), t(11, 10))
    assert all(h[0] != never for h in hits(t(11, 30), t(12)))
    # an open run (still running) overlaps any later window
    running = read_condor_history_json(FIX / "condor_history.json").table
    assert jobs_overlapping(running, dt.datetime(2030, 1, 1, tzinfo=UTC), dt.datetime(2030, 1, 2, tzinfo=UTC)).num_rows == 1
    with pytest.raises(ValueError):
        jobs_overlapping(table, dt.datetime(2025, 8, 5), t(12))


def test_duplicate_key_keeps_latest_record_and_quarantines_the_other():
    base = {"GlobalJobId": "s#1.0#100", "QDate": 100, "JobCurrentStartDate": 200, "NumJobStarts": 1}
    older = {**base, "JobStatus": 2, "RecordTime": 300}
    newer = {**base, "JobStatus": 4, "CompletionDate": 900, "RecordTime": 900}
    res = normalize_docs([newer, older], "elasticsearch")
    assert res.table.num_rows == 1 and res.table.to_pylist()[0]["job_status"] == 4
    assert [q.position for q in res.quarantine] == [1]
    assert res.quarantine[0].reason.startswith("duplicate_key")
    assert res.duplicates == 0


def test_uncoercible_values_are_quarantined_never_raised():
    docs = [
        {"GlobalJobId": "s#1.0#1", "QDate": "yesterday"},
        {"GlobalJobId": "s#2.0#1", "RequestGpus": float("nan")},
        {"GlobalJobId": "s#3.0#1", "NumJobStarts": 2.5},
        {"GlobalJobId": "s#4.0#1", "JobStatus": 2**40},
        {"GlobalJobId": "s#5.0#1", "Owner": {"name": "x"}},
        {"GlobalJobId": "s#6.0#1", "CompletionDate": 1754391900000},  # milliseconds, not seconds
        {"GlobalJobId": ["s#7.0#1"]},
        {"GlobalJobId": "s#8.0#1", "MyType": "Machine"},
        ["not", "a", "dict"],
        {"GlobalJobId": "s#9.0#1", "QDate": "2025-08-05T08:00:00Z", "JobStatus": "4", "RequestGpus": True},
    ]
    docs.append({"GlobalJobId": "s#10.0#1", "EpochAdType": "SPAWN", "EpochWriteDate": 5, "NumJobStarts": 1})
    # integers beyond int64 (a 64-bit column) or beyond any float (10**400): the value, not a crash
    docs += [{"GlobalJobId": "s#11.0#1", "ClusterId": 2**63}, {"GlobalJobId": "s#12.0#1", "ProcId": -(2**63) - 1},
             {"GlobalJobId": "s#13.0#1", "RemoteWallClockTime": 10**400},
             {"GlobalJobId": "s#14.0#1", "RequestGPUs": 10**400}]
    res = normalize_docs(docs, "elasticsearch", origin="test")
    reasons = {q.position: q.reason.split(":")[0] for q in res.quarantine}
    assert reasons == {0: "bad_value", 1: "bad_value", 2: "bad_value", 3: "bad_value", 4: "bad_value",
                       5: "bad_value", 6: "missing_global_job_id", 7: "not_a_job_ad", 8: "not_an_object",
                       9: "bad_value", 10: "not_a_run_epoch", 11: "bad_value", 12: "bad_value", 13: "bad_value",
                       14: "bad_value"}
    assert "ClusterId=9223372036854775808" in res.quarantine[11].reason
    # the largest int64 and a float-typed count beyond 2**53 are values
    big = normalize_docs([{"GlobalJobId": "s#15.0#1", "ClusterId": 2**63 - 1, "RemoteWallClockTime": 2**60}],
                         "ndjson").table.to_pylist()[0]
    assert big["cluster_id"] == 2**63 - 1 and big["remote_wall_clock_s"] == float(2**60)
    assert all(q.source == "test" for q in res.quarantine)
    ok = normalize_docs([{"GlobalJobId": "s#9.0#1", "QDate": "2025-08-05T08:00:00Z", "JobStatus": "4"}], "ndjson")
    r = ok.table.to_pylist()[0]
    assert r["queued_utc"] == t(8) and r["job_status"] == 4 and (r["cluster_id"], r["proc_id"]) == (9, 0)


@pytest.mark.parametrize("qdate", [-86400, 0, "1969-12-31T00:00:00Z", "1970-01-01T00:00:00Z", "0001-01-01T00:00:00Z"])
def test_a_date_at_or_before_1970_is_unset_as_text_too(qdate):
    """HTCondor writes 0 for a date not set; the same instant, or an earlier one, as ISO-8601 text is
    unset too (``0001-01-01`` opened a queue wait from year 1)."""
    doc = {"GlobalJobId": "s#1.0#1", "JobStatus": 4, "JobCurrentStartDate": 1754300000,
           "CompletionDate": 1754303600, "QDate": qdate}
    assert normalize_docs([doc], "ndjson").table.to_pylist()[0]["queued_utc"] is None
    assert normalize_docs([{**doc, "QDate": "1970-01-01T00:00:01Z"}], "ndjson").table.to_pylist()[0][
        "queued_utc"] == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC)


def test_table_has_the_spec_schema_and_is_deterministic(tmp_path):
    paths = [FIX / "adstash_epochs.ndjson", FIX / "adstash_jobs.ndjson"]
    a = read_ndjson(paths).table
    b = read_ndjson(list(reversed(paths))).table
    assert a.schema == JOBS.schema
    assert conform(a, JOBS).equals(a)
    assert a.equals(b)
    assert JOBS.path == "clean/jobs" and JOBS.key == ("global_job_id", "run_index", "doc_kind")
    assert normalize_docs([], "ndjson").table.schema == JOBS.schema
    with pytest.raises(ValueError):
        normalize_docs([], "sqlite")
    # gzip works the same
    gz = tmp_path / "epochs.ndjson.gz"
    gz.write_bytes(gzip.compress((FIX / "adstash_epochs.ndjson").read_bytes()))
    assert read_ndjson(gz).table.equals(read_ndjson(FIX / "adstash_epochs.ndjson").table)


def test_quarantine_table_matches_the_shared_schema():
    res = read_ndjson(FIX / "adstash_jobs.ndjson")
    q = quarantine_table(res.quarantine)
    assert q.schema == QUARANTINE.schema and q.num_rows == 3
    assert set(q["source_table"].to_pylist()) == {"jobs"}
    assert sorted(q["source_row"].to_pylist()) == [3, 5, 6]
    for text in q["row_json"].to_pylist():
        assert text


# --- condor_history / condor_q JSON -------------------------------------------------------------


def test_condor_history_json_array():
    res = read_condor_history_json(FIX / "condor_history.json")
    assert res.quarantine == [] and res.table.num_rows == 2
    rows = rows_by_id(res.table)
    ev = rows["ap21.uc.osg-htc.org#6589423.0#1790949100"]
    assert ev["request_gpus"] is None  # "/Expr(...)/" is an unevaluated expression: unset
    assert (ev["run_index"], ev["num_job_starts"], ev["num_vacates"], ev["vacate_reason_code"]) == (1, 2, 1, 1022)
    # split at the LAST '@' of LastRemoteHost (a glidein slot name holds another '@')
    assert ev["host"] == "gpu-node007.example.org" and ev["slot"] == "slot1_2@glidein_4242_1234567"
    assert ev["schedd"] == "ap21.uc.osg-htc.org" and ev["acct_group"] == "group_opportunistic.ligo.osg-ligo"
    assert ev["run_start_utc"] == dt.datetime.fromtimestamp(1790950295, UTC)
    assert ev["run_end_utc"] == ev["completion_utc"] == dt.datetime.fromtimestamp(1790961097, UTC)
    assert ev["record_utc"] == ev["completion_utc"]  # no RecordTime: derived like adstash
    run = rows["submit2.chtc.wisc.edu#5100010.3#1754406000"]
    assert run["job_status_name"] == "Running" and run["run_end_utc"] is None
    assert (run["host"], run["slot"], run["proc_id"]) == ("gpu0103.chtc.wisc.edu", "slot1_7", 3)
    assert run["record_utc"] == dt.datetime.fromtimestamp(1754413200, UTC)  # ServerTime
    assert run["source"] == "condor_history"


def test_condor_history_one_ad_per_line_and_broken_file(tmp_path):
    ads = json.loads((FIX / "condor_history.json").read_text())
    jsonl = tmp_path / "history.jsonl"
    jsonl.write_text("\n".join(json.dumps(a) for a in ads) + "\n")
    assert read_condor_history_json(jsonl).table.num_rows == 2
    broken = tmp_path / "broken.json"
    broken.write_text((FIX / "condor_history.json").read_text()[:200])
    with pytest.raises(JobsFileError, match=r"broken\.json: invalid JSON at line"):
        read_condor_history_json(broken)


def test_real_clas12_condor_q_ads_with_expressions():
    paths = [real("htcondor-jobs", "clas12_osg_condor_q_json_running_job_3472942.81.json"),
             real("htcondor-jobs", "clas12_osg_condor_q_json_held_job_3472942.89.json")]
    raw = [json.loads(p.read_text()) for p in paths]
    assert any(isinstance(v, str) and v.startswith("/Expr(") for ad in raw for v in ad.values())
    res = read_condor_history_json(paths)
    assert res.quarantine == [] and res.table.num_rows == 2
    rows = rows_by_id(res.table)
    running = rows["scosg16.jlab.org#3472942.81#1616890323"]
    held = rows["scosg16.jlab.org#3472942.89#1616890323"]
    # restarted jobs: NumJobStarts 4 -> run index 3
    assert (running["num_job_starts"], running["run_index"]) == (4, 3)
    assert running["job_status_name"] == "Running" and running["run_end_utc"] is None
    assert running["host"] == "CRUSH-OSG-C7-10-5-219-52"  # from RemoteHost (the current run)
    assert running["last_vacate_utc"] == dt.datetime.fromtimestamp(1616927815, UTC)
    # held: its LastVacateTime (1617115474) precedes this run's start (1617115491) -> it ended when held
    assert held["job_status_name"] == "Held"
    assert held["run_start_utc"] == dt.datetime.fromtimestamp(1617115491, UTC)
    assert held["run_end_utc"] == dt.datetime.fromtimestamp(1617120643, UTC)
    assert held["project"] == "CLAS12" and held["owner"] == "gemc"
    # typed fields holding an expression are unset, not errors
    exprs = [{**ad, "RequestGPUs": ad["MemoryUsage"], "JobStatus": ad["PeriodicRelease"]} for ad in raw]
    res2 = normalize_docs(exprs, "condor_history")
    assert res2.quarantine == []
    assert {r["request_gpus"] for r in res2.table.to_pylist()} == {None}
    assert {r["job_status"] for r in res2.table.to_pylist()} == {None}


# --- Elasticsearch exports ----------------------------------------------------------------------


def test_es_export_response_and_bare_list(tmp_path):
    res = read_es_export(FIX / "es_export_hits.json")
    assert res.docs_in == 3 and res.table.num_rows == 1
    assert res.quarantined_by_reason == {"not_a_hit": 1, "not_a_job_ad": 1}
    row = res.table.to_pylist()[0]
    assert row["source"] == "es_export" and row["run_end_utc"] == dt.datetime.fromtimestamp(1754391900, UTC)
    bare = tmp_path / "hits.json"
    bare.write_text(json.dumps(json.loads((FIX / "es_export_hits.json").read_text())["hits"]["hits"]))
    res2 = read_es_export(bare)
    assert res2.table.equals(res.table) and res2.quarantined_by_reason == res.quarantined_by_reason


def test_real_gracc_export_is_handled_without_crash():
    path = real("elasticsearch", "gracc_2016_es_export_JobUsageRecord_340docs.json")
    res = read_es_export(path)
    # 340 OSG accounting records (one hit per line): none is an HTCondor job ad
    assert res.docs_in == 340
    assert res.table.num_rows == 0 and res.table.schema == JOBS.schema
    assert res.quarantined_by_reason == {"not_a_job_ad": 340}
    assert res.duplicates == 0
    assert {q.position for q in res.quarantine} == set(range(1, 341))  # line numbers


# --- the simulator's documents --------------------------------------------------------------------


def test_simulator_job_documents_match_its_ground_truth(tmp_path):
    simulate_mod = pytest.importorskip("gpu_pipeline.lib.simulate")
    pq = pytest.importorskip("pyarrow.parquet")
    summary = simulate_mod.simulate(
        tmp_path, simulate_mod.SimConfig(start=dt.date(2025, 8, 5), end=dt.date(2025, 8, 5), gpus=16,
                                         seed=3, telemetry_interval_s=0)
    )
    epochs = read_ndjson(sorted((tmp_path / "jobs").glob("epochs-*.ndjson")))
    finals = read_ndjson(sorted((tmp_path / "jobs").glob("jobs-*.ndjson")))
    assert epochs.quarantine == [] and finals.quarantine == []
    assert epochs.table.num_rows == summary["epoch_documents"] > 0
    assert finals.table.num_rows == summary["job_documents"] > 0
    truth = {(r["global_job_id"], r["run_index"]): r for r in pq.read_table(tmp_path / "truth" / "jobs.parquet").to_pylist()}
    checked = 0
    for r in epochs.table.to_pylist():
        tr = truth.get((r["global_job_id"], r["run_index"]))
        if tr is None:
            continue
        checked += 1
        assert (r["run_start_utc"], r["run_end_utc"]) == (tr["start_utc"], tr["end_utc"])
        assert (r["host"], f"{r['slot']}@{r['host']}") == (tr["host"], tr["slot_name"])
        assert r["assigned_gpus"] == tr["gpu_ids"] and r["user"] == tr["owner"]
        assert r["is_backfill_slot"] == (tr["kind"] == "backfill")
    assert checked > 0


def test_documents_outside_the_day_are_skipped_without_changing_the_day(tmp_path, monkeypatch):
    """clean_job_documents skips documents that cannot overlap the window (runs starting after it: the
    look-ahead files; runs completed before it: the day-before file), read for their three dates
    only or after parsing, before normalizing them: the same table, quarantine and counts as
    normalizing all."""
    import datetime as dt

    import numpy as np

    from gpu_pipeline.lib import job_source
    from gpu_pipeline.lib import jobs as jobs_mod
    from gpu_pipeline.lib.job_source import clean_job_documents, raw_docs_from_files
    from gpu_pipeline.lib.jobs_fast import FastRows, outside_window
    from gpu_pipeline.lib.simulate import SimConfig, simulate
    from gpu_pipeline.lib.timeutil import day_window

    simulate(tmp_path, SimConfig(start=dt.date(2025, 8, 4), end=dt.date(2025, 8, 7), gpus=40, seed=4,
                                 timezone="America/Chicago", telemetry_interval_s=0, kueue_interval_s=0))
    s, e = day_window("2025-08-05", "America/Chicago")
    raw = raw_docs_from_files(tmp_path / "jobs", s, e).table
    by_dates = outside_window(raw.column("doc_json"), (int(s.timestamp()), int(e.timestamp())))
    fast = clean_job_documents(raw, s, e)
    # The same documents decided after parsing only ...
    monkeypatch.setattr(job_source, "outside_window_ids",
                        lambda texts, w: (np.zeros(len(texts), bool), pa.nulls(len(texts), pa.string())))
    parsed = clean_job_documents(raw, s, e)
    # ... and nothing skipped at all.
    monkeypatch.setattr(jobs_mod, "_outside_window", lambda doc, *w: False)
    monkeypatch.setattr(job_source, "fast_rows", lambda texts, source, w=None: FastRows.none(len(texts)))
    full = clean_job_documents(raw, s, e)
    assert by_dates.sum() > 100  # documents were skipped from their dates alone
    assert fast.table.num_rows > 100
    for result in (fast, parsed):
        assert result.table.equals(full.table) and result.quarantine.equals(full.quarantine)
        assert (result.outside_window, result.docs_in, result.duplicates) == (
            full.outside_window, full.docs_in, full.duplicates)


@pytest.mark.parametrize("mode", ["by_dates", "parsed", "full"])
def test_a_later_record_outside_the_day_still_supersedes_a_stale_one(tmp_path, monkeypatch, mode):
    """A job's running snapshot (recorded Aug 3 11:00, no end: it would overlap Aug 4) and its final
    record (completed Aug 3 12:00: outside Aug 4) in one file, as periodic ``condor_q -json`` dumps
    and the history give them: the final record wins, as without the window, so the job has no row
    on Aug 4 and the snapshot is quarantined as superseded -- whether the final record is skipped
    from its dates alone, after parsing, or not at all. An earlier record outside the day of a job
    the day keeps (J2's) stays skipped, not quarantined."""
    import datetime as dt

    import numpy as np

    from gpu_pipeline.lib import job_source
    from gpu_pipeline.lib import jobs as jobs_mod
    from gpu_pipeline.lib.job_source import clean_job_documents, raw_docs_from_files
    from gpu_pipeline.lib.jobs_fast import FastRows

    s0 = int(dt.datetime(2025, 8, 3, 10, tzinfo=dt.UTC).timestamp())
    common = {"GlobalJobId": "ap1#7.0#1754200000", "ClusterId": 7, "ProcId": 0, "QDate": s0 - 600,
              "JobCurrentStartDate": s0, "NumJobStarts": 1, "Owner": "alice", "StartdName": "gpu01"}
    running = {**common, "JobStatus": 2, "RecordTime": s0 + 3600}
    final = {**common, "JobStatus": 4, "CompletionDate": s0 + 7200, "RecordTime": s0 + 7200}
    j2 = {"GlobalJobId": "ap1#8.0#1754200000", "ClusterId": 8, "ProcId": 0, "QDate": s0 - 600,
          "JobCurrentStartDate": s0, "NumJobStarts": 1, "Owner": "bob", "StartdName": "gpu02"}
    j2_old = {**j2, "JobStatus": 4, "CompletionDate": s0 + 60, "RecordTime": s0 + 60}  # outside, older
    j2_now = {**j2, "JobStatus": 2, "RecordTime": s0 + 90000}  # still running on Aug 4: kept
    (tmp_path / "jobs_2025-08-03.ndjson").write_text(
        "".join(json.dumps(d) + "\n" for d in (running, final, j2_old, j2_now)))
    start, end = dt.datetime(2025, 8, 4, tzinfo=dt.UTC), dt.datetime(2025, 8, 5, tzinfo=dt.UTC)
    raw = raw_docs_from_files(tmp_path, start, end).table
    if mode != "by_dates":
        monkeypatch.setattr(job_source, "outside_window_ids",
                            lambda texts, w: (np.zeros(len(texts), bool), pa.nulls(len(texts), pa.string())))
    if mode == "full":
        monkeypatch.setattr(jobs_mod, "_outside_window", lambda doc, *w: False)
        monkeypatch.setattr(job_source, "fast_rows", lambda texts, source, w=None: FastRows.none(len(texts)))
    got = clean_job_documents(raw, start, end)
    assert got.table.column("global_job_id").to_pylist() == ["ap1#8.0#1754200000"]
    assert got.quarantined_by_reason == {"duplicate_key": 2 if mode == "full" else 1}
    stale = got.quarantine.filter(pa.compute.starts_with(got.quarantine.column("reason"), "duplicate_key"))
    assert '"JobStatus":2' in stale.column("row_json").to_pylist()[0].replace(" ", "")
    assert (got.docs_in, got.outside_window) == (4, 1 if mode == "full" else 2)


@pytest.mark.parametrize("skip", [True, False])
def test_a_tie_of_record_times_is_broken_by_the_input_order_with_the_window_too(tmp_path, monkeypatch, skip):
    """The final record (completed the day before) read first and a running snapshot read second,
    with one record time: the later read wins, with the window as without it (the record kept aside
    took its place after every document in the window, and won)."""
    import datetime as dt

    import numpy as np

    from gpu_pipeline.lib import job_source
    from gpu_pipeline.lib.job_source import clean_job_documents, raw_docs_from_files

    s0 = int(dt.datetime(2025, 8, 3, 10, tzinfo=dt.UTC).timestamp())
    common = {"GlobalJobId": "ap1#7.0#1754200000", "ClusterId": 7, "ProcId": 0, "QDate": s0 - 600,
              "JobCurrentStartDate": s0, "NumJobStarts": 1, "StartdName": "gpu01", "RecordTime": s0 + 7200}
    (tmp_path / "jobs_2025-08-03.ndjson").write_text(
        json.dumps({**common, "JobStatus": 4, "CompletionDate": s0 + 7200}) + "\n"
        + json.dumps({**common, "JobStatus": 2}) + "\n")
    start, end = dt.datetime(2025, 8, 4, tzinfo=dt.UTC), dt.datetime(2025, 8, 5, tzinfo=dt.UTC)
    if not skip:
        monkeypatch.setattr(job_source, "outside_window_ids",
                            lambda texts, w: (np.zeros(len(texts), bool), pa.nulls(len(texts), pa.string())))
    got = clean_job_documents(raw_docs_from_files(tmp_path, start, end).table, start, end)
    assert got.table.column("job_status").to_pylist() == [2]


def test_only_documents_that_cannot_overlap_are_skipped():
    import json

    import pyarrow as pa

    from gpu_pipeline.lib.jobs import _outside_window
    from gpu_pipeline.lib.jobs_fast import outside_window

    start, end = 1_754_300_000, 1_754_400_000
    cases = [
        ({"JobCurrentStartDate": end, "QDate": end + 5}, True),  # starts after the window
        ({"JobCurrentStartDate": 10, "QDate": 5, "CompletionDate": start - 1}, True),  # completed before it
        ({"JobCurrentStartDate": end, "QDate": end - 1}, False),  # queued during the window
        ({"JobCurrentStartDate": end - 1, "QDate": end}, False),
        ({"JobCurrentStartDate": 10, "QDate": 5, "CompletionDate": start}, False),  # ends at the start
        ({"JobCurrentStartDate": start - 1, "QDate": 5, "CompletionDate": start - 5}, False),  # completion < start
        ({"QDate": end + 5}, False),  # no run start: normalized in full
        ({"JobCurrentStartDate": (end + 5) * 1000, "QDate": end + 5}, False),  # ms: in full
        ({"JobCurrentStartDate": end + 5, "QDate": end + 5, "Env": {"QDate": 1}}, True),  # nested: the top level
        ({"JobCurrentStartDate": 10, "QDate": 5, "CompletionDate": 0}, False),  # not completed
        (["not", "a", "doc"], False),
    ]
    docs = [json.dumps(d, sort_keys=True, separators=(",", ":")) for d, _ in cases]
    by_dates = outside_window(pa.array(docs), (start, end)).tolist()
    for (doc, expected), says in zip(cases, by_dates, strict=True):
        assert _outside_window(doc, start, end) is expected and says is expected, doc
    # A date of another type anywhere (text, a float): the rule reads it otherwise than an integer,
    # so the reader decides none of the set and the normalizer decides each document.
    for odd in ({"JobCurrentStartDate": str(end + 5), "QDate": end + 5},
                {"JobCurrentStartDate": float(end + 5), "QDate": end + 5}):
        assert not _outside_window(odd, start, end)
        assert not outside_window(pa.array(docs + [json.dumps(odd)]), (start, end)).any()


def test_a_range_run_reads_each_job_file_once_with_the_same_days(tmp_path):
    """With one FileDocsCache for the days of a range, each file is parsed once; every day's raw table
    is the one a day read alone gets; a file rewritten in between is read again."""
    import datetime as dt
    import os

    from gpu_pipeline.lib.job_source import FileDocsCache, raw_docs_from_files, select_files
    from gpu_pipeline.lib.simulate import SimConfig, simulate
    from gpu_pipeline.lib.timeutil import day_window

    simulate(tmp_path, SimConfig(start=dt.date(2025, 8, 4), end=dt.date(2025, 8, 8), gpus=24, seed=5,
                                 timezone="America/Chicago", telemetry_interval_s=0, kueue_interval_s=0))
    jobs_dir = tmp_path / "jobs"
    cache = FileDocsCache()
    days = ["2025-08-04", "2025-08-05", "2025-08-06", "2025-08-07"]
    wanted = set()
    for day in days:
        s, e = day_window(day, "America/Chicago")
        wanted.update(str(p) for p in select_files(jobs_dir, s, e, 3))
        cached = raw_docs_from_files(jobs_dir, s, e, 3, cache=cache)
        alone = raw_docs_from_files(jobs_dir, s, e, 3)
        assert cached.table.num_rows > 0 and cached.table.equals(alone.table) and cached.files == alone.files
    assert cache.reads == len(wanted) < sum(len(raw_docs_from_files(jobs_dir, *day_window(d, "America/Chicago"),
                                                                  3).files) for d in days)
    # the same day again: nothing re-read; after a file changes, it is read again
    s, e = day_window(days[-1], "America/Chicago")
    before = cache.reads
    raw_docs_from_files(jobs_dir, s, e, 3, cache=cache)
    assert cache.reads == before
    changed = select_files(jobs_dir, s, e, 3)[-1]
    changed.write_text(changed.read_text().splitlines()[0] + "\n")
    os.utime(changed, ns=(1, 1))
    again = raw_docs_from_files(jobs_dir, s, e, 3, cache=cache)
    assert cache.reads == before + 1
    assert again.table.equals(raw_docs_from_files(jobs_dir, s, e, 3).table)


def test_duplicates_found_from_the_raw_text_as_from_the_parsed_documents(tmp_path, monkeypatch):
    """The clean step fingerprints the raw table's canonical JSON text; the result (rows, quarantine,
    duplicates dropped) is the one fingerprinting each parsed document gives, exact duplicates
    included."""
    import datetime as dt

    from gpu_pipeline.lib import job_source
    from gpu_pipeline.lib.job_source import clean_job_documents, raw_docs_from_files
    from gpu_pipeline.lib.simulate import SimConfig, simulate
    from gpu_pipeline.lib.timeutil import day_window

    simulate(tmp_path, SimConfig(start=dt.date(2025, 8, 4), end=dt.date(2025, 8, 5), gpus=24, seed=5,
                                 timezone="America/Chicago", telemetry_interval_s=0, kueue_interval_s=0))
    s, e = day_window("2025-08-05", "America/Chicago")
    raw = raw_docs_from_files(tmp_path / "jobs", s, e, 3).table
    raw = pa.concat_tables([raw, raw.slice(0, 40)])  # exact duplicates (another position, same text)
    by_text = clean_job_documents(raw, s, e)
    monkeypatch.setattr(job_source, "text_fingerprint", lambda text: None)  # fingerprint the parsed documents
    by_doc = clean_job_documents(raw, s, e)
    assert by_text.table.num_rows > 0 and by_text.table.equals(by_doc.table)
    assert by_text.quarantine.equals(by_doc.quarantine)
    assert by_text.duplicates == by_doc.duplicates > 0


def test_ndjson_line_that_is_not_utf8_is_quarantined_and_the_others_read(tmp_path):
    # a Latin-1 byte in one line (an export written in another encoding): that line is quarantined
    # with its line number; the lines around it are read (the bad byte failed the whole file, with a
    # decoder message naming neither the file nor the line)
    good = b'{"GlobalJobId": "s#%d.0#1", "QDate": 1754400000, "JobStatus": 1}\n'
    path = tmp_path / "jobs.ndjson"
    path.write_bytes(good % 1 + b'{"GlobalJobId": "s#2.0#1", "Owner": "caf\xe9"}\n' + good % 3)
    res = read_ndjson(path)
    assert sorted(res.table["global_job_id"].to_pylist()) == ["s#1.0#1", "s#3.0#1"]
    (q,) = res.quarantine
    assert q.position == 2 and q.reason == "invalid_json: line 2: not UTF-8 (byte 0xe9 at column 41)"
    assert q.raw == '{"GlobalJobId": "s#2.0#1", "Owner": "caf\ufffd"}'  # shown as text, the byte replaced
    assert res.quarantined_by_reason == {"invalid_json": 1}
    # UTF-8 beyond ASCII is read as before
    path.write_bytes(good % 1 + '{"GlobalJobId": "s#2.0#1", "Owner": "café"}\n'.encode())
    res = read_ndjson(path)
    assert res.table.num_rows == 2 and not res.quarantine
    assert "café" in res.table["owner"].to_pylist()


def test_ndjson_with_a_byte_order_mark_reads_its_first_line(tmp_path):
    line = '{"GlobalJobId": "s#1.0#1", "QDate": 1754400000, "JobStatus": 1}\n'
    path = tmp_path / "jobs.ndjson"
    path.write_bytes(codecs.BOM_UTF8 + (line * 2).encode())
    res = read_ndjson(path)
    assert res.docs_in == 2 and res.duplicates == 1 and not res.quarantine
    assert res.table["global_job_id"].to_pylist() == ["s#1.0#1"]


def test_truncated_ndjson_gz_fails_naming_the_file(tmp_path):
    lines = "".join(f'{{"GlobalJobId": "s#{i}.0#1", "QDate": 1754400000, "JobStatus": 1}}\n' for i in range(5000))
    whole = gzip.compress(lines.encode())
    path = tmp_path / "jobs-2025-08-06.ndjson.gz"
    path.write_bytes(whole[: len(whole) // 2])  # a copy cut short
    with pytest.raises(JobsFileError, match=r"jobs-2025-08-06\.ndjson\.gz: cannot read past line \d+: "):
        read_ndjson(path)
    path.write_bytes(whole)
    assert read_ndjson(path).table.num_rows == 5000


def test_an_epoch_is_numbered_by_its_shadow_start():
    """adstash keys an epoch document on NumShadowStarts. A shadow start whose executable never ran
    (its input transfer failed) leaves NumJobStarts as it was (the real clas12 ad: NumJobStarts 4,
    NumShadowStarts 5): two epochs numbered by NumJobStarts were one run, and the later one, which
    never ran, replaced the evicted backfill run as a duplicate key."""
    import datetime as dt

    from gpu_pipeline.lib.evictions import evictions_from_tables

    t0 = 1754384400  # 2025-08-05 09:00 UTC
    base = {"GlobalJobId": "ap1#8.0#1754380800", "QDate": t0 - 3600, "EpochAdType": "EPOCH", "NumJobStarts": 1,
            "AssignedGPUs": "GPU-aaaaaaaa", "JobStartDate": t0, "LastVacateTime": t0 + 7200}
    evicted = dict(base, NumShadowStarts=1, JobStatus=1, JobCurrentStartDate=t0, EpochWriteDate=t0 + 7200,
                   RecordTime=t0 + 7200, numvacates="1", vacatereasoncode="1018",
                   StartdSlot="backfill2_1", StartdName="gpu01")
    never_ran = dict(base, NumShadowStarts=2, JobStatus=5, JobCurrentStartDate=t0 + 10800,
                     EpochWriteDate=t0 + 11100, RecordTime=t0 + 11100, StartdSlot="slot1_1", StartdName="gpu02")
    r = normalize_docs([evicted, never_ran], "ndjson")
    assert r.quarantined_by_reason == {}
    assert sorted((x["run_index"], x["slot"]) for x in r.table.to_pylist()) == [(0, "backfill2_1"), (1, "slot1_1")]
    from gpu_pipeline.lib.jobs_fast import fast_rows  # the columnar reader of document lines: the same runs

    fast = fast_rows(pa.array([json.dumps(evicted), json.dumps(never_ran)]), "ndjson")
    assert sorted(fast.table["run_index"].to_pylist()) == [0, 1] and list(fast.index) == [0, 1]
    day = dt.datetime(2025, 8, 5, tzinfo=dt.UTC)
    ev = evictions_from_tables(day, day + dt.timedelta(days=1), jobs=r.table).to_pylist()
    assert [(e["run_index"], e["evicted_utc"]) for e in ev] == [(0, day + dt.timedelta(hours=11))]
    # a job document keeps NumJobStarts (its last run)
    job_doc = {k: v for k, v in never_ran.items() if k not in ("EpochAdType", "EpochWriteDate")}
    assert normalize_docs([job_doc], "ndjson").table["run_index"].to_pylist() == [0]


def test_an_assigned_gpus_value_adstash_cut_keeps_its_whole_ids():
    """adstash cuts strings over 256 characters to 253 and "...": eight MIG UUIDs (327 characters)
    end in a piece of the seventh. The piece is not an id; the run's GPU count is RequestGPUs."""
    import datetime as dt

    from gpu_pipeline.lib.evictions import evictions_from_tables

    ids = [f"MIG-{i:08d}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]
    full = ",".join(ids)
    cut = full[:253] + "..."
    t0 = 1754384400  # 2025-08-05 09:00 UTC
    doc = {"GlobalJobId": "ap1#9.0#1754380800", "QDate": t0 - 60, "JobStatus": 1, "NumJobStarts": 1,
           "JobCurrentStartDate": t0, "LastVacateTime": t0 + 3600, "RecordTime": t0 + 3600, "numvacates": "1",
           "StartdSlot": "backfill2_1", "StartdName": "gpu01", "RequestGpus": 8, "AssignedGPUs": cut}
    for row in (normalize_docs([doc], "ndjson").table.to_pylist()[0],):
        assert row["assigned_gpus"] == ",".join(ids[:6])
    from gpu_pipeline.lib.jobs_fast import fast_rows

    assert fast_rows(pa.array([json.dumps(doc)]), "ndjson").table["assigned_gpus"].to_pylist() == [",".join(ids[:6])]
    day = dt.datetime(2025, 8, 5, tzinfo=dt.UTC)
    ev = evictions_from_tables(day, day + dt.timedelta(days=1), jobs=normalize_docs([doc], "ndjson").table)
    assert ev["n_gpus"].to_pylist() == [8] and ev["lost_gpu_hours"].to_pylist() == [8.0]
    # an uncut value keeps every id
    assert normalize_docs([dict(doc, AssignedGPUs=full)], "ndjson").table["assigned_gpus"].to_pylist() == [full]


@pytest.mark.parametrize("mode", ["by_dates", "full"])
def test_a_later_record_of_a_later_run_closes_a_stale_open_run(monkeypatch, mode):
    """A ``condor_q -json`` snapshot of run 0 running on a backfill slot, then the job's history
    record: run 1 (NumJobStarts 2) started at 14:00 after a vacate at 13:00 and completed. The keys
    differ (run 0, run 1), so the snapshot was not superseded: run 0 stayed open, ran on every later
    day and was no eviction. It ends at the vacate -- on its own day and on later days, whose
    partitions read the history record only aside (it lies before them)."""
    import datetime as dt

    import numpy as np

    from gpu_pipeline.lib import job_source
    from gpu_pipeline.lib.evictions import evictions_from_tables
    from gpu_pipeline.lib.job_source import clean_job_documents
    from gpu_pipeline.lib.jobs import canonical_json

    def t(h: float) -> int:
        return int((dt.datetime(2025, 8, 5, tzinfo=dt.UTC) + dt.timedelta(hours=h)).timestamp())

    gj = "schedd1#10.0#1754400000"
    snap = {"GlobalJobId": gj, "JobStatus": 2, "NumJobStarts": 1, "QDate": t(10), "JobCurrentStartDate": t(11),
            "RemoteHost": "backfill2_1@gpu01", "ServerTime": t(12), "AssignedGPUs": "GPU-aaaaaaaa"}
    final = {"GlobalJobId": gj, "JobStatus": 4, "NumJobStarts": 2, "QDate": t(10), "JobStartDate": t(11),
             "JobCurrentStartDate": t(14), "LastVacateTime": t(13), "CompletionDate": t(16), "RecordTime": t(16),
             "LastRemoteHost": "slot1_1@gpu02", "AssignedGPUs": "GPU-bbbbbbbb", "EnteredCurrentStatus": t(16)}
    # both documents as a later day's read gives them too (a source that returns every document of
    # a job with a run open on the day)
    raw = job_source._raw_table([("condor_history", "f", i, canonical_json(d), None) for i, d in enumerate([snap, final])])
    if mode == "full":  # nothing skipped from its dates: the history record is normalized with the rest
        monkeypatch.setattr(job_source, "outside_window_ids",
                            lambda texts, w: (np.zeros(len(texts), bool), pa.nulls(len(texts), pa.string())))
    for day, runs in (("2025-08-05", [(0, t(13)), (1, t(16))]), ("2025-08-07", [])):
        start = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)
        end = start + dt.timedelta(days=1)
        got = clean_job_documents(raw, start, end)
        assert [(r["run_index"], int(r["run_end_utc"].timestamp())) for r in got.table.to_pylist()] == runs, day
        if day == "2025-08-05":
            assert got.runs_closed_by_later_record == 1
            ev = evictions_from_tables(start, end, jobs=got.table).to_pylist()
            assert [(e["run_index"], int(e["evicted_utc"].timestamp())) for e in ev] == [(0, t(13))]


def test_a_job_file_name_that_is_no_readable_file_is_an_error_naming_it(tmp_path):
    """A dangling link (or a link loop) named like a job-record file was skipped unseen: the day's
    runs in it were missing without a word. A folder of that name is a folder, and is looked into."""
    import datetime as dt

    from gpu_pipeline.lib.job_source import select_files

    (tmp_path / "epochs-2025-08-05.ndjson").write_text("{}\n")
    (tmp_path / "old.ndjson").mkdir()
    (tmp_path / "old.ndjson" / "jobs-2025-08-05.ndjson").write_text("{}\n")
    s = dt.datetime(2025, 8, 5, tzinfo=dt.UTC)
    assert [p.name for p in select_files(tmp_path, s, s + dt.timedelta(days=1), 3)] == [
        "epochs-2025-08-05.ndjson", "jobs-2025-08-05.ndjson"]
    (tmp_path / "jobs-2023-01-01.ndjson").symlink_to(tmp_path / "gone-long-ago.ndjson")  # no day's: skipped
    assert len(select_files(tmp_path, s, s + dt.timedelta(days=1), 3)) == 2
    (tmp_path / "jobs-2025-08-06.ndjson").symlink_to(tmp_path / "gone.ndjson")
    with pytest.raises(FileNotFoundError, match=r"jobs-2025-08-06\.ndjson: a job-record file name, but not"):
        select_files(tmp_path, s, s + dt.timedelta(days=1), 3)


def test_the_days_own_job_documents_are_those_of_its_file_undated_files_and_elasticsearch():
    import pyarrow as pa

    from gpu_pipeline.lib.job_source import documents_of_the_day

    def raw(rows):
        return pa.table({"source": [s for s, _ in rows], "origin": [o for _, o in rows],
                         "position": list(range(len(rows)))})

    day = dt.date(2025, 3, 10)
    # a zone west of UTC: the window also touches 03-11, whose file alone is not the day's
    assert documents_of_the_day(raw([("ndjson", "/j/jobs-2025-03-11.ndjson")] * 3), day) == 0
    assert documents_of_the_day(raw([("ndjson", "/j/jobs-2025-03-09.ndjson.gz")]), day) == 0
    rows = [("ndjson", "/j/jobs-2025-03-10.ndjson")] * 2 + [("ndjson", "/j/history.ndjson"),
                                                             ("elasticsearch", "adstash-2025.03")]
    assert documents_of_the_day(raw(rows), day) == 4


def _day(day: str) -> tuple[dt.datetime, dt.datetime]:
    start = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=1)


def _at(day: int, h: float) -> int:
    return int((dt.datetime(2025, 8, day, tzinfo=dt.UTC) + dt.timedelta(hours=h)).timestamp())


@pytest.mark.parametrize("name", ["condor_history-2025-08-01_2025-08-07.json", "history-20250801-20250807.json"])
def test_a_job_file_named_for_a_date_range_is_read_by_every_day_of_the_range(tmp_path, name):
    """An export covering a week, named for its first and last day: every day of the range reads it
    (with the look-around: from the look-ahead before its first day to the day after its last)
    and counts its documents as its own; other days do not. The ISO range was read only around its
    first date (the jobs of the 3rd to the 7th were missing, those days had no document of their
    own); the compact one was an undated file, every day's own documents, the 20th's too."""
    from gpu_pipeline.lib.job_source import clean_job_documents, documents_of_the_day, raw_docs_from_files

    ads = [{"GlobalJobId": f"s#{i}.0#1", "JobStatus": 4, "NumJobStarts": 1, "QDate": _at(i, 9),
            "JobCurrentStartDate": _at(i, 10), "CompletionDate": _at(i, 12), "RequestGPUs": 1} for i in range(1, 8)]
    (tmp_path / name).write_text(json.dumps(ads))
    (tmp_path / "jobs-2025-08-20.ndjson").write_text(json.dumps(dict(
        ads[0], GlobalJobId="s#20.0#1", QDate=_at(20, 9), JobCurrentStartDate=_at(20, 10), CompletionDate=_at(20, 12))) + "\n")
    # (a UTC day's window ends at the next midnight: its look-ahead reaches lookahead_days after that)
    for day, read, own, jobs in (("2025-07-23", False, 0, []), ("2025-07-24", True, 0, []),
                                 ("2025-08-01", True, 7, ["s#1.0#1"]), ("2025-08-05", True, 7, ["s#5.0#1"]),
                                 ("2025-08-07", True, 7, ["s#7.0#1"]), ("2025-08-08", True, 0, []),
                                 ("2025-08-09", False, 0, []), ("2025-08-20", False, 1, ["s#20.0#1"])):
        s, e = _day(day)
        raw = raw_docs_from_files(tmp_path, s, e, 7)
        assert (name in [Path(f).name for f in raw.files]) is read, day
        assert documents_of_the_day(raw.table, s.date()) == own, day
        assert clean_job_documents(raw.table, s, e).table["global_job_id"].to_pylist() == jobs, day
    # single dates as before: the day before to the look-ahead, the day's own on its day
    from gpu_pipeline.lib.job_source import select_files

    s, e = _day("2025-08-21")
    assert [p.name for p in select_files(tmp_path, s, e, 7)] == ["jobs-2025-08-20.ndjson"]
    assert select_files(tmp_path, *_day("2025-08-22"), 7) == []


def test_a_range_file_reads_no_more_than_the_days_look_around_and_two_dates_apart_are_no_range(tmp_path):
    """A month's export beside the month's daily files: every day of the month reads the export and
    the files of its own look-around only. (A first version read every file since the range's first
    day, so the month's last day read, stored and parsed the whole month.) Two dates joined by a
    range separator are a range; two apart in the name (an export's date) are the first date."""
    from gpu_pipeline.lib.job_source import _named_days, raw_docs_from_files, select_files

    ad = {"GlobalJobId": "s#1.0#1", "JobStatus": 4, "NumJobStarts": 1, "QDate": _at(1, 9),
          "JobCurrentStartDate": _at(1, 10), "CompletionDate": _at(1, 12), "RequestGPUs": 1}
    for d in range(1, 32):
        (tmp_path / f"history-2025-08-{d:02d}.ndjson").write_text(json.dumps(ad) + "\n")
    (tmp_path / "history-20250801-20250831.json").write_text(json.dumps([ad]))
    for day in ("2025-08-15", "2025-08-31"):
        s, e = _day(day)
        d = s.date()
        expected = sorted([f"history-{(d + dt.timedelta(days=k)).isoformat()}.ndjson" for k in range(-1, 9)
                           if (d + dt.timedelta(days=k)).month == 8] + ["history-20250801-20250831.json"])
        assert sorted(p.name for p in select_files(tmp_path, s, e, 7)) == expected, day
        assert raw_docs_from_files(tmp_path, s, e, 7).table.num_rows == len(expected), day
    one = dt.date(2025, 8, 5)
    for name, days in (("jobs_2025-08-05_exported_2025-09-30.ndjson", (one, one)),
                       ("jobs_2025-08-05_to_2025-08-09.ndjson", (one, dt.date(2025, 8, 9))),
                       ("jobs-2025-08-05-2025-08-09.json", (one, dt.date(2025, 8, 9))),
                       ("jobs-2025-08-05..2025-08-09.json", (one, dt.date(2025, 8, 9))),
                       ("jobs-20250805-export-20250930.json", (one, one)), ("jobs-20250805.json", None),
                       ("jobs_2025-08-05--2025-08-09.json", (one, dt.date(2025, 8, 9))),
                       ("jobs_20250805__20250809.json", (one, dt.date(2025, 8, 9))),
                       ("jobs 2025-08-05 to 2025-08-09.json", (one, dt.date(2025, 8, 9))),
                       ("jobs-2025-08-05-to-2025-08-09.json", (one, dt.date(2025, 8, 9))),
                       ("jobs-2025-02-30.json", None)):
        assert _named_days(Path(name)) == days, name


def test_a_range_files_snapshot_older_than_the_days_files_is_no_open_run_there(tmp_path):
    """A week of ``condor_q -json`` snapshots in one file (its range), the job's final record in the
    file of the 4th, when its run ended. The 3rd reads both: the run ends on the 4th. The 6th and 7th
    read the week's file but not the 4th's (outside their look-around): the snapshot of the 3rd is
    older than every file they read, so its run is no row there (it ran open on the 6th and 7th);
    a snapshot of the day before is kept (the job runs)."""
    from gpu_pipeline.lib.job_source import clean_job_documents, raw_docs_from_files

    gj = "ap1#3.0#1754000000"
    snap = {"GlobalJobId": gj, "JobStatus": 2, "NumJobStarts": 1, "QDate": _at(2, 9), "JobCurrentStartDate": _at(2, 10),
            "ServerTime": _at(3, 12), "RemoteHost": "slot1_1@gpu01", "RequestGPUs": 1}
    final = {k: v for k, v in snap.items() if k not in ("ServerTime", "RemoteHost")}
    final.update(JobStatus=4, CompletionDate=_at(4, 6), RecordTime=_at(4, 6), LastRemoteHost="slot1_1@gpu01")
    running = dict(snap, GlobalJobId="ap1#4.0#1754000000", ServerTime=_at(5, 12))  # still running on the 5th
    (tmp_path / "condor_q-2025-08-01_2025-08-07.json").write_text(json.dumps([snap, running]))
    (tmp_path / "history-2025-08-04.ndjson").write_text(json.dumps(final) + "\n")
    for day, rows, stale in (("2025-08-03", [(gj, _at(4, 6)), ("ap1#4.0#1754000000", None)], 0),
                             ("2025-08-06", [("ap1#4.0#1754000000", None)], 1),
                             ("2025-08-07", [], 2)):
        s, e = _day(day)
        got = clean_job_documents(raw_docs_from_files(tmp_path, s, e, 7).table, s, e)
        ends = [(r["global_job_id"], r["run_end_utc"] and int(r["run_end_utc"].timestamp()))
                for r in got.table.to_pylist() if r["doc_kind"] == "job"]
        assert sorted(set(ends)) == rows, day
        assert got.stale_open_runs_dropped == stale, day


def test_a_daily_dump_without_server_time_keeps_a_job_running_since_days_before(tmp_path):
    """A dump of the queue without ServerTime (Python bindings, a projection): its record time is the
    job's EnteredCurrentStatus, when its run began, three days before the day -- not when it was seen
    running. The stale rule dropped it from the day of its own file; it is kept."""
    from gpu_pipeline.lib.job_source import clean_job_documents, raw_docs_from_files

    ad = {"GlobalJobId": "ap1#5.0#1754000000", "JobStatus": 2, "NumJobStarts": 1, "QDate": _at(7, 9),
          "JobCurrentStartDate": _at(7, 10), "EnteredCurrentStatus": _at(7, 10), "RemoteHost": "slot1_1@gpu01",
          "RequestGPUs": 1}
    (tmp_path / "condor_q_2025-08-10.json").write_text(json.dumps([ad]))
    s, e = _day("2025-08-10")
    got = clean_job_documents(raw_docs_from_files(tmp_path, s, e, 7).table, s, e)
    assert got.table["global_job_id"].to_pylist() == ["ap1#5.0#1754000000"] and got.stale_open_runs_dropped == 0
    # seen running three days before (ServerTime), in a file the day reads (undated): stale
    (tmp_path / "condor_q_2025-08-10.json").unlink()
    (tmp_path / "condor_q_export.json").write_text(json.dumps([dict(ad, ServerTime=_at(7, 12))]))
    got = clean_job_documents(raw_docs_from_files(tmp_path, s, e, 7).table, s, e)
    assert got.table.num_rows == 0 and got.stale_open_runs_dropped == 1
    # without ServerTime in an undated (or range-named) file: no sign it is fresh, as old as its record
    (tmp_path / "condor_q_export.json").write_text(json.dumps([ad]))
    got = clean_job_documents(raw_docs_from_files(tmp_path, s, e, 7).table, s, e)
    assert got.table.num_rows == 0 and got.stale_open_runs_dropped == 1


def _snapshot_and_closer(closer_kind: str) -> tuple[dict, dict, str]:
    """A ``condor_q -json`` ad of run 0 running since 11:00 (on the 5th, ServerTime 12:00), and the
    record of that same run from another source that ends it: an adstash epoch document (it
    completed at 15:00), or the job's final history ad (CompletionDate) or a vacated run's
    (LastVacateTime, back to idle)."""
    gj = "ap1#10.0#1754380800"
    snap = {"GlobalJobId": gj, "ClusterId": 10, "ProcId": 0, "JobStatus": 2, "NumJobStarts": 1, "NumShadowStarts": 1,
            "QDate": _at(5, 10), "JobStartDate": _at(5, 11), "JobCurrentStartDate": _at(5, 11), "ServerTime": _at(5, 12),
            "CompletionDate": 0, "RemoteHost": "slot1_1@gpu01", "RequestGPUs": 1, "AssignedGPUs": "GPU-aaaaaaaa"}
    same = {k: snap[k] for k in ("GlobalJobId", "ClusterId", "ProcId", "QDate", "JobStartDate", "JobCurrentStartDate",
                                 "NumJobStarts", "NumShadowStarts", "RequestGPUs", "AssignedGPUs")}
    if closer_kind == "epoch":
        return snap, dict(same, EpochAdType="EPOCH", EpochWriteDate=_at(5, 15), JobStatus=4, CompletionDate=_at(5, 15),
                          StartdName="gpu01", StartdSlot="slot1_1"), "ndjson"
    if closer_kind == "completed":
        return snap, dict(same, JobStatus=4, CompletionDate=_at(5, 15), RecordTime=_at(5, 15),
                          EnteredCurrentStatus=_at(5, 15), LastRemoteHost="slot1_1@gpu01"), "elasticsearch"
    return snap, dict(same, JobStatus=1, LastVacateTime=_at(5, 15), RecordTime=_at(5, 15), CompletionDate=0,
                      EnteredCurrentStatus=_at(5, 15), LastRemoteHost="slot1_1@gpu01"), "es_export"


@pytest.mark.parametrize("mode", ["by_dates", "full"])
@pytest.mark.parametrize("closer_kind", ["epoch", "completed", "vacated"])
def test_a_later_record_of_the_same_run_from_another_source_closes_the_open_run(monkeypatch, mode, closer_kind):
    """The snapshot's run is ended by a later record of the same run from another source (another
    key: source or doc_kind differ, so neither superseded the other). The open row stayed open: on
    its day beside the closed one, and on the next day alone (its open end overlaps it), where the
    job ran all day for a reader of that partition. It ends at the record's end, on both days."""
    import numpy as np

    from gpu_pipeline.lib import job_source
    from gpu_pipeline.lib.job_source import clean_job_documents
    from gpu_pipeline.lib.jobs import canonical_json

    snap, closer, source = _snapshot_and_closer(closer_kind)
    raw = job_source._raw_table([("condor_history", "q", 0, canonical_json(snap), None),
                                 (source, "h", 0, canonical_json(closer), None)])
    if mode == "full":
        monkeypatch.setattr(job_source, "outside_window_ids",
                            lambda texts, w: (np.zeros(len(texts), bool), pa.nulls(len(texts), pa.string())))
    kind = "epoch" if closer_kind == "epoch" else "job"
    got = clean_job_documents(raw, *_day("2025-08-05"))
    assert sorted((r["source"], r["doc_kind"], r["run_index"], int(r["run_end_utc"].timestamp()))
                  for r in got.table.to_pylist()) == sorted([("condor_history", "job", 0, _at(5, 15)),
                                                            (source, kind, 0, _at(5, 15))])
    assert got.runs_closed_by_later_record == 1
    nxt = clean_job_documents(raw, *_day("2025-08-06"))
    assert nxt.table.num_rows == 0 and nxt.runs_closed_by_later_record == 1  # closed, then outside the day
    # the closing record alone: as before
    alone = clean_job_documents(raw.slice(1), *_day("2025-08-05"))
    assert alone.table["run_end_utc"].to_pylist() == got.table.filter(pa.compute.equal(got.table["source"], source))[
        "run_end_utc"].to_pylist()


def test_only_a_later_ended_record_of_the_same_run_closes_an_open_one():
    """A record of the same run closes it only when it is later than the snapshot and ends the run.
    The run is the one that started at the snapshot's start: an epoch is numbered by its shadow
    start (one whose executable never started leaves NumJobStarts as it was), so its run_index may
    be another than the job ad's of the same run -- the same start and NumJobStarts say it is the
    same run; the epoch of another run (another start) ends nothing here."""
    from gpu_pipeline.lib.jobs import close_superseded_runs

    snap, epoch, _ = _snapshot_and_closer("epoch")

    def ends(*docs_by_source):
        rows = pa.concat_tables([normalize_docs([d], s).table for s, d in docs_by_source])
        closed, n = close_superseded_runs(rows)
        return [None if t is None else int(t.timestamp()) for t in closed["run_end_utc"].to_pylist()], n

    assert ends(("condor_history", snap), ("ndjson", epoch)) == ([_at(5, 15)] * 2, 1)
    # a later snapshot of the same run, still running: nothing ends it
    later_snap = dict(snap, ServerTime=_at(5, 14))
    assert ends(("condor_history", snap), ("ndjson", later_snap)) == ([None, None], 0)
    # the record is earlier than the snapshot (the snapshot says it ran on after it): left open
    early = dict(epoch, EpochWriteDate=_at(5, 11.5), CompletionDate=_at(5, 11.5))
    assert ends(("condor_history", snap), ("ndjson", early)) == ([None, _at(5, 11.5)], 0)
    # run 0 numbered by its shadow start 2 as an epoch (a shadow start that never ran before it):
    # the same run (start, NumJobStarts)
    shadowed = dict(epoch, NumShadowStarts=2)
    assert ends(("condor_history", dict(snap, NumShadowStarts=2)), ("ndjson", shadowed)) == ([_at(5, 15)] * 2, 1)
    # that failed shadow start's own epoch (index 0 too, another start, no run end of the snapshot's run)
    failed = dict(epoch, NumShadowStarts=1, JobCurrentStartDate=_at(5, 10.5), EpochWriteDate=_at(5, 12.5),
                  CompletionDate=0, JobStatus=1, NumJobStarts=0)
    assert ends(("condor_history", snap), ("ndjson", failed)) == ([None, _at(5, 12.5)], 0)


def test_requirement_expressions_are_kept_as_text():
    """RequireGPUs and Requirements are kept as the expression's text, however they were written:
    condor_q/condor_history's "/Expr(...)/", adstash's <Attr>_EXPR text, a literal; the Python rules
    and the column reading give the same rows; a structure is a bad value, quarantined."""
    from gpu_pipeline.lib.job_source import clean_job_documents
    from gpu_pipeline.lib.jobs import canonical_json
    from gpu_pipeline.lib.jobs_fast import fast_rows
    from gpu_pipeline.lib.schemas import RAW_JOB_DOCUMENTS

    base = {"QDate": 1754380800, "JobStatus": 1, "RequestGPUs": 1, "RecordTime": 1754384400}
    docs = [
        {"GlobalJobId": "s#1.0#1", "RequireGPUs": '/Expr(DeviceName == "Tesla T4")/',
         "Requirements": '/Expr((TARGET.Arch == "X86_64") && (TARGET.GPUs >= RequestGPUs))/'},
        {"GlobalJobId": "s#2.0#1", "requiregpus_expr": 'regexp("A100", DeviceName)', "requirements": True},
        {"GlobalJobId": "s#3.0#1", "RequireGPUs": "/Expr(undefined)/", "Requirements": "undefined"},
        {"GlobalJobId": "s#4.0#1"},
        {"GlobalJobId": "s#5.0#1", "RequireGPUs": {"DeviceName": "Tesla T4"}},
    ]
    docs = [{**base, **d} for d in docs]
    res = normalize_docs(docs, "ndjson")
    got = {r["global_job_id"]: (r["require_gpus"], r["requirements"]) for r in res.table.to_pylist()}
    assert got == {
        "s#1.0#1": ('DeviceName == "Tesla T4"', '(TARGET.Arch == "X86_64") && (TARGET.GPUs >= RequestGPUs)'),
        "s#2.0#1": ('regexp("A100", DeviceName)', "true"),
        "s#3.0#1": (None, None),
        "s#4.0#1": (None, None),
    }
    (bad,) = res.quarantine
    assert bad.reason.startswith("bad_value") and "RequireGPUs" in bad.reason and bad.position == 4
    # the day's cleaning, which reads plain documents over columns, gives the same rows (the
    # structure, which no column type holds beside text, left out: it sends the batch to the rules)
    texts = [canonical_json(d) for d in docs[:4]]
    assert (fast_rows(pa.array(texts), "ndjson").index >= 0).all()
    raw = pa.table({"source": ["ndjson"] * len(texts), "origin": ["f.ndjson"] * len(texts),
                    "position": list(range(len(texts))), "doc_json": texts, "parse_error": [None] * len(texts)},
                   schema=RAW_JOB_DOCUMENTS.schema)
    start = dt.datetime(2025, 8, 5, tzinfo=UTC)
    day = clean_job_documents(raw, start, start + dt.timedelta(days=1))
    assert {r["global_job_id"]: (r["require_gpus"], r["requirements"]) for r in day.table.to_pylist()} == got


def test_a_job_held_then_removed_or_released_ends_its_run_by_its_wall_time():
    """A job held at the end of its run (LastJobStatus 2 -> JobStatus 5: EnteredCurrentStatus is the
    run's end) and removed or released days later (5 -> 3 or 1): EnteredCurrentStatus is then the
    removal's or release's time, and the run was read as lasting the days between. The last run's
    wall time (LastRemoteWallClockTime) ends it; without one, EnteredCurrentStatus as before. The
    Python rules and the column reading agree."""
    from gpu_pipeline.lib.job_source import clean_job_documents
    from gpu_pipeline.lib.jobs import canonical_json
    from gpu_pipeline.lib.jobs_fast import fast_rows
    from gpu_pipeline.lib.schemas import RAW_JOB_DOCUMENTS

    start = 1754380800  # 2025-08-05T08:00Z
    base = {"QDate": start - 600, "JobCurrentStartDate": start, "RequestGPUs": 1, "LastRemoteWallClockTime": 5152}
    docs = [
        {"GlobalJobId": "s#1.0#1", "JobStatus": 5, "LastJobStatus": 2, "EnteredCurrentStatus": start + 5152},
        {"GlobalJobId": "s#2.0#1", "JobStatus": 3, "LastJobStatus": 5, "EnteredCurrentStatus": start + 3 * 86400},
        {"GlobalJobId": "s#3.0#1", "JobStatus": 1, "LastJobStatus": 5, "EnteredCurrentStatus": start + 2 * 86400},
        {"GlobalJobId": "s#4.0#1", "JobStatus": 3, "LastJobStatus": 2, "EnteredCurrentStatus": start + 7200},
    ]
    docs = [{**base, **d} for d in docs]
    docs.append({**docs[1], "GlobalJobId": "s#5.0#1", "LastRemoteWallClockTime": None})
    ends = {r["global_job_id"]: r["run_end_utc"] for r in normalize_docs(docs, "ndjson").table.to_pylist()}
    t0 = dt.datetime.fromtimestamp(start, UTC)
    assert ends == {"s#1.0#1": t0 + dt.timedelta(seconds=5152), "s#2.0#1": t0 + dt.timedelta(seconds=5152),
                    "s#3.0#1": t0 + dt.timedelta(seconds=5152), "s#4.0#1": t0 + dt.timedelta(hours=2),
                    "s#5.0#1": t0 + dt.timedelta(days=3)}
    texts = [canonical_json(d) for d in docs]
    assert (fast_rows(pa.array(texts), "ndjson").index >= 0).all()
    raw = pa.table({"source": ["ndjson"] * len(texts), "origin": ["f.ndjson"] * len(texts),
                    "position": list(range(len(texts))), "doc_json": texts, "parse_error": [None] * len(texts)},
                   schema=RAW_JOB_DOCUMENTS.schema)
    day = clean_job_documents(raw, t0 - dt.timedelta(hours=8), t0 + dt.timedelta(hours=16)).table
    assert {r["global_job_id"]: r["run_end_utc"] for r in day.to_pylist()} == ends


def test_last_job_status_and_the_first_start_are_kept():
    """LastJobStatus (the status before the current one) and JobStartDate (the first run's start) are
    columns of clean/jobs, read alike by the rules and over columns, whatever the spelling: a removed
    job held before (5), a job ad of run 1 whose first run started at 09:00 while its last started at
    12:00, and a document without either (null)."""
    from gpu_pipeline.lib.job_source import clean_job_documents
    from gpu_pipeline.lib.jobs import canonical_json
    from gpu_pipeline.lib.jobs_fast import fast_rows
    from gpu_pipeline.lib.schemas import RAW_JOB_DOCUMENTS

    docs = [
        {"GlobalJobId": "s#1.0#1", "QDate": int(t(8).timestamp()), "JobStartDate": int(t(9).timestamp()),
         "JobCurrentStartDate": int(t(9).timestamp()), "NumJobStarts": 1, "JobStatus": 3, "LastJobStatus": 5,
         "EnteredCurrentStatus": int(t(20).timestamp())},
        {"GlobalJobId": "s#2.0#1", "QDate": int(t(8).timestamp()), "JobStartDate": int(t(9).timestamp()),
         "JobCurrentStartDate": int(t(12).timestamp()), "NumJobStarts": 2, "JobStatus": 4,
         "CompletionDate": int(t(13).timestamp()), "lastjobstatus": 2},
        {"GlobalJobId": "s#3.0#1", "QDate": int(t(8).timestamp()), "JobStatus": 1},
    ]
    want = {"s#1.0#1": (5, t(9), t(9)), "s#2.0#1": (2, t(9), t(12)), "s#3.0#1": (None, None, None)}

    def got(table: pa.Table) -> dict:
        return {r["global_job_id"]: (r["last_job_status"], r["first_start_utc"], r["run_start_utc"])
                for r in table.to_pylist()}

    assert got(normalize_docs(docs, "ndjson").table) == want
    texts = [canonical_json(d) for d in docs]
    assert (fast_rows(pa.array(texts), "ndjson").index >= 0).all()  # all read over columns
    raw = pa.table({"source": ["ndjson"] * 3, "origin": ["f.ndjson"] * 3, "position": [0, 1, 2], "doc_json": texts,
                    "parse_error": [None] * 3}, schema=RAW_JOB_DOCUMENTS.schema)
    assert got(clean_job_documents(raw, t(0), t(0) + dt.timedelta(days=1)).table) == want


def test_a_day_written_before_version_4_reads_the_new_columns_as_null(tmp_path):
    """clean/jobs version 4 added last_job_status and first_start_utc. A day written before (without
    them, its columns in the old order) read with a new day, in either order, gives null there and
    its other columns by name."""
    from gpu_pipeline.lib.schemas import JOBS
    from gpu_pipeline.lib.store import Store, connect

    store = Store(tmp_path)
    new = conform(pa.Table.from_pylist([{"global_job_id": "s#2.0#1", "run_index": 1, "doc_kind": "job",
                                         "job_status": 3, "last_job_status": 5, "queued_utc": t(8),
                                         "first_start_utc": t(9), "source": "ndjson"}]), JOBS)
    old = conform(pa.Table.from_pylist([{"global_job_id": "s#1.0#1", "run_index": 0, "doc_kind": "job",
                                         "job_status": 4, "queued_utc": t(7), "source": "ndjson"}]), JOBS)
    old = old.drop_columns(["last_job_status", "first_start_utc"])
    for old_day, new_day in (("2025-08-04", "2025-08-05"), ("2025-08-06", "2025-08-05")):
        store.write_partition(JOBS, new_day, new)
        path = store.partition_file(JOBS, old_day)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(old, path)
        sql, params = store.relation_sql(JOBS, sorted([old_day, new_day]))
        con = connect()
        try:
            rows = con.execute(f"SELECT global_job_id, job_status, last_job_status, queued_utc, first_start_utc "
                               f"FROM {sql} ORDER BY global_job_id", params).fetchall()
        finally:
            con.close()
        assert rows == [("s#1.0#1", 4, None, t(7), None), ("s#2.0#1", 3, 5, t(8), t(9))]
        assert store.read_table(JOBS, old_day).select(["job_status", "last_job_status"]).to_pylist() == [
            {"job_status": 4, "last_job_status": None}]
        path.unlink()
