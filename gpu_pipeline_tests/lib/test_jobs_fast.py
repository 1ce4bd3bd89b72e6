"""The columnar job-document normalizer (lib/jobs_fast) gives exactly the rows of the row rules
(jobs._row), on documents built to take every turn of those rules; what it cannot read the plain way
it leaves to them."""

from __future__ import annotations

import datetime as dt
import json
import random

import numpy as np
import pyarrow as pa
import pytest

from gpu_pipeline.lib import job_source
from gpu_pipeline.lib.jobs import _BadValue, _NotJobAd, _outside_window, _row, canonical_json
from gpu_pipeline.lib.jobs_fast import FastRows, fast_rows, outside_window

T0 = 1_754_300_000

# attribute -> values of one JSON type each ("type modes"); a batch draws one mode per attribute,
# so that Arrow can read the batch into columns, and each value from it.
_MODES: dict[str, list[list]] = {
    "ClusterId": [[1, 77, 2**40], ["12", " 9 ", "4.0", "x"], [3.0, 2.5]],
    "ProcId": [[0, 1, 5]],
    "Owner": [["alice", " bob ", "", "undefined", "None", "/Expr(x)/", "/home/x", "ünï"], [5, 0]],
    "User": [["alice@wisc.edu", "@d", "carol", "UNKNOWN"]],
    "RemoteOwner": [["dave@x.org", "null"]],
    "ProjectName": [["P1", "P2"], [True, False]],
    "AcctGroup": [["g1", ""]],
    "AccountingGroup": [["g2.alice"]],
    "ScheddName": [["ap1.example.edu", "unknown", " UNKNOWN@UNKNOWN "]],
    "JobStatus": [[1, 2, 3, 4, 5, 6, 7, 2**31], ["2", "running"], [4.0, 2.5]],
    "QDate": [[T0 - 5000, T0 + 200_000, 0, -1], ["2025-08-04T10:00:00", "1754300000", "nope"],
              [T0 + 0.5, float(T0)]],
    "JobCurrentStartDate": [[T0 - 4000, T0 + 300_000, T0 - 90_000, 0, 10**12 + 7, 253402300800]],
    "JobStartDate": [[T0 - 4500, -1]],
    "CompletionDate": [[T0 - 100, T0 + 3600, 0, T0 - 80_000], [T0 + 3600.25, 9.5e9]],
    "EnteredCurrentStatus": [[T0 + 10, T0 - 10]],
    "EpochWriteDate": [[T0 + 20, T0 - 5000]],
    "RecordTime": [[T0 + 30]],
    "ServerTime": [[T0 + 40]],
    "StartdName": [["gpu01.example.edu", "unknown", " gpu02 "]],
    "StartdSlot": [["slot1_1", "backfill2_3", "Backfill1"]],
    "RemoteHost": [["slot1_2@gpu03", "gpu04", "slot1_2@glidein_1@node5", "@gpu06", "slot9@"]],
    "LastRemoteHost": [["backfill1_1@gpu07", "UNKNOWN"]],
    "AssignedGPUs": [["GPU-1a2b3c4d", "GPU-1a2b3c4d,GPU-5e6f7a8b", "{GPU-aaaa1111, GPU-bbbb2222}",
                      "GPU-3f3f3f3f-aaaa-bbbb-cccc-000011112222", "MIG-11111111-2222-3333-4444-555566667777",
                      ""], [["GPU-1a2b3c4d", "GPU-5e6f7a8b"], []]],
    "RequestGPUs": [[1, 2, 0], [0.5, 1.0]],
    "NumJobStarts": [[1, 2, 0, -2**31, 2**31]],
    "NumShadowStarts": [[3, 0]],
    "JobRunCount": [[4]],
    "NumVacates": [[0, 2]],
    "LastVacateTime": [[T0 - 200, T0 + 50]],
    "VacateReasonCode": [[1018, 21]],
    "VacateReason": [["Preempted", "undefined"]],
    "RemoteWallClockTime": [[4858, 0], [4858.5, 1e308]],
    "LastRemoteWallClockTime": [[3600, 0], [1800.5, 1e308, -5.0]],
    "LastJobStatus": [[2, 5, 1]],
    "CommittedTime": [[100], [1.5]],
    "MyType": [["Job", "job", "Machine", ""]],
    "EpochAdType": [["EPOCH", "epoch", "SPAWN"]],
    "RequireGPUs": [['DeviceName == "NVIDIA A100-SXM4-80GB"', '/Expr(Capability >= 8.0)/', "undefined", ""],
                    [True, False], [8]],
    "Requirements": [['/Expr((TARGET.GPUs_DeviceName == "Tesla T4") && (TARGET.Arch == "X86_64"))/',
                      "/Expr(undefined)/"], [False]],
}
# adstash's spellings besides the exact one
_SPELLINGS = {"RequestGPUs": ["RequestGpus"], "NumVacates": ["numvacates"], "RemoteOwner": ["remoteowner"],
              "VacateReason": ["vacatereason"], "VacateReasonCode": ["vacatereasoncode"],
              "RequireGPUs": ["requiregpus_expr", "RequireGPUs_EXPR"], "Requirements": ["requirements_expr"]}


def _batch(rng: random.Random, n: int, *, one_mode: bool = True) -> list[str]:
    modes = {attr: rng.randrange(len(m)) for attr, m in _MODES.items()}
    docs = []
    for _ in range(n):
        cluster = rng.randrange(1, 10**6)
        doc: dict = {"GlobalJobId": rng.choice([f"ap1#{cluster}.0#{T0}", f" ap2#{cluster}.1#{T0} ",
                                                f"weird-{cluster}", f"ap1#{cluster}.0#{T0}"])}
        for attr, options in _MODES.items():
            if rng.random() < 0.35:
                continue
            mode = options[modes[attr]] if one_mode else rng.choice(options)
            value = rng.choice(mode + [None]) if rng.random() < 0.1 else rng.choice(mode)
            key = rng.choice([attr] + _SPELLINGS.get(attr, [])) if rng.random() < 0.5 else attr
            doc[key] = value
        turn = rng.random()
        if turn < 0.03:
            doc["globaljobid"] = doc.pop("GlobalJobId")  # another spelling
        elif turn < 0.05:
            doc.pop("GlobalJobId")
        elif turn < 0.07:
            doc["GlobalJobId"] = "undefined"
        elif turn < 0.09 and "NumVacates" in doc:
            doc["numvacates"] = doc["NumVacates"]  # two spellings of one attribute
        elif turn < 0.11:
            doc["NumVacatesByReason"] = {"Preempted": 2, "QDate": T0 + 999_999}  # nested object
        elif turn < 0.12:
            doc.update(ProbeName="condor:x", RecordId="r1")  # a GRACC accounting record
        elif turn < 0.13:
            doc["type"] = "JobUsageRecord"
        elif turn < 0.15:
            doc["EpochWriteDate"] = None  # present but null: still an epoch document
        elif turn < 0.16:
            doc["VacateReason"] = "caf\u00e9"
        elif turn < 0.17:
            doc["VacateReason"] = "\ud800"  # lone surrogate
        docs.append(canonical_json(doc))
    return docs


def _python(text: str, source: str = "ndjson"):
    try:
        return _row(json.loads(text), source)
    except (_NotJobAd, _BadValue):
        return None


@pytest.mark.parametrize("seed", range(6))
def test_fast_rows_are_the_row_rules(seed):
    rng = random.Random(seed)
    texts = _batch(rng, 1500)
    fast = fast_rows(pa.array(texts), "ndjson")
    rows = fast.table.to_pylist()
    read = 0
    for text, i in zip(texts, fast.index, strict=True):
        if i < 0:
            continue
        read += 1
        want = _python(text)
        assert want is not None, text  # a document the rules quarantine is never read here
        got = dict(rows[i])
        for k in ("queued_utc", "run_start_utc", "run_end_utc", "completion_utc", "record_utc", "last_vacate_utc",
                  "status_entered_utc", "first_start_utc"):
            got[k] = None if got[k] is None else (got[k] - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(
                microseconds=1)
        assert got == want, text
        assert fast.keys[i] == (want["global_job_id"], want["run_index"], want["doc_kind"])
        assert fast.record_us[i] == want["record_utc"]
    # Some documents take the plain way; the rest (each with some odd turn) are left to the rules.
    assert 0 < read < sum(_python(t) is not None for t in texts)


def test_every_simulated_document_takes_the_plain_way(tmp_path):
    """adstash-shaped documents (the simulator's: adstash spellings, nested vacate counts) are all
    read over columns, as the rules read them."""
    from gpu_pipeline.lib.job_source import raw_docs_from_files
    from gpu_pipeline.lib.simulate import SimConfig, simulate
    from gpu_pipeline.lib.timeutil import day_window

    simulate(tmp_path, SimConfig(start=dt.date(2025, 8, 4), end=dt.date(2025, 8, 5), gpus=40, seed=4,
                                 timezone="America/Chicago", telemetry_interval_s=0, kueue_interval_s=0))
    s, e = day_window("2025-08-04", "America/Chicago")
    texts = raw_docs_from_files(tmp_path / "jobs", s, e).table.column("doc_json")
    fast = fast_rows(texts, "ndjson")
    assert len(texts) > 200 and (fast.index >= 0).all()
    assert any("NumVacatesByReason" in t or "numvacatesbyreason" in t for t in texts.to_pylist())
    rows = fast.table.to_pylist()
    for text, i in zip(texts.to_pylist(), fast.index, strict=True):
        want = _python(text)
        assert (rows[i]["global_job_id"], rows[i]["run_index"], rows[i]["assigned_gpus"], fast.record_us[i]) == (
            want["global_job_id"], want["run_index"], want["assigned_gpus"], want["record_utc"])


@pytest.mark.parametrize("cluster", [2**53 - 1, 2**53, 2**53 + 1, 2**60 + 1])
def test_an_integer_in_a_column_read_as_floats_is_the_rules_integer(cluster):
    """Arrow reads a key holding integers and floats as float64, where 2**53 + 1 is 2**53: such a
    value is read as the rules read the text, or left to them, never rounded."""
    texts = [canonical_json({"GlobalJobId": "ap1#1.0#1754300000", "ClusterId": cluster, "QDate": 1754300000}),
             canonical_json({"GlobalJobId": "ap1#2.0#1754300000", "ClusterId": 3.0, "QDate": 1754300000})]
    fast = fast_rows(pa.array(texts), "ndjson")
    rows = fast.table.to_pylist()
    for text, i in zip(texts, fast.index, strict=True):
        if i >= 0:
            assert rows[i]["cluster_id"] == _python(text)["cluster_id"], text
    assert _python(texts[0])["cluster_id"] == cluster


def test_a_batch_arrow_cannot_type_is_left_whole_to_the_rules():
    texts = _batch(random.Random(1), 200, one_mode=False)  # a key holding numbers and text
    fast = fast_rows(pa.array(texts), "ndjson")
    assert (fast.index == -1).all() and fast.table.num_rows == 0


def test_outside_window_is_the_rule():
    rng = random.Random(7)
    window = (T0, T0 + 86_400)
    texts = _batch(rng, 3000)
    texts = [t for t in texts if "\\ud800" not in t]  # the reader refuses a lone surrogate
    got = outside_window(pa.array(texts), window)
    want = [_outside_window(json.loads(t), *window) for t in texts]
    assert got.tolist() == want and 0 < sum(want) < len(want)
    # A float date anywhere: the reader refuses the set, so none is decided here.
    mixed = texts + [canonical_json({"GlobalJobId": "a#1.0#1", "JobCurrentStartDate": float(T0 + 90_000),
                                     "QDate": T0 + 90_000})]
    assert not outside_window(pa.array(mixed), window).any()


@pytest.mark.parametrize("seed", range(3))
def test_clean_job_documents_is_the_same_with_and_without_columns(seed, monkeypatch):
    """The whole day (window skip, duplicates, duplicate keys, quarantine and counters) is what the
    row rules give document by document."""
    rng = random.Random(100 + seed)
    texts = _batch(rng, 1200)
    texts += texts[:50]  # exact duplicates
    texts += [canonical_json({**json.loads(t), "RecordTime": T0 + 777}) for t in texts[50:80]]  # same keys
    texts += ["{not json", "[1, 2]"]
    n = len(texts)
    raw = pa.table({
        "source": ["ndjson"] * n, "origin": ["f.ndjson"] * n, "position": list(range(n)), "doc_json": texts,
        "parse_error": [None] * (n - 1) + ["bad_line: cut"],
    }, schema=job_source.RAW_JOB_DOCUMENTS.schema)
    start = dt.datetime.fromtimestamp(T0, dt.UTC)
    end = start + dt.timedelta(days=1)
    fast = job_source.clean_job_documents(raw, start, end)
    monkeypatch.setattr(job_source, "fast_rows", lambda texts, source, w=None: FastRows.none(len(texts)))
    monkeypatch.setattr(job_source, "outside_window_ids",
                        lambda texts, w: (np.zeros(len(texts), bool), pa.nulls(len(texts), pa.string())))
    rules = job_source.clean_job_documents(raw, start, end)
    assert (fast_rows(pa.array(texts), "ndjson").index >= 0).sum() > 30  # columns were used
    assert fast.table.num_rows > 50
    assert fast.table.equals(rules.table)
    assert fast.quarantine.equals(rules.quarantine)
    assert fast.quarantine.num_rows > 20
    assert (fast.docs_in, fast.duplicates, fast.outside_window, fast.quarantined_by_reason) == (
        rules.docs_in, rules.duplicates, rules.outside_window, rules.quarantined_by_reason)
    assert fast.duplicates > 10 and "duplicate_key" in fast.quarantined_by_reason
    assert "bad_value" in fast.quarantined_by_reason  # the lone surrogate among them


def test_text_the_checks_cannot_read_plainly_is_left_to_the_rules():
    """Texts not in canonical form: keys spelled with escapes (a null epoch key, GRACC keys), and an
    escaped value. Each comes out as the rules read it (here: left to them)."""
    base = '"GlobalJobId":"ap1#5.0#1754300000","JobStatus":4,"MyType":"Job","QDate":1754300000'
    texts = [
        '{"Epoch\\u0057riteDate":null,' + base + '}',  # present (null): an epoch document
        '{"Probe\\u004eame":"x","RecordId":"r",' + base + '}',  # a GRACC record
        '{"Owner":"caf\\u00e9",' + base + '}',
        '{' + base + '}',  # plain
    ]
    fast = fast_rows(pa.array(texts), "ndjson")
    assert fast.index.tolist()[:3] == [-1, -1, -1] and fast.index[3] >= 0
    assert _python(texts[0])["doc_kind"] == "epoch" and _python(texts[1]) is None
    assert fast.table.to_pylist()[0]["global_job_id"] == "ap1#5.0#1754300000"
