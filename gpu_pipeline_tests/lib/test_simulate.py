"""Tests of the HTCondor GPU pool simulator (gpu_pipeline.lib.simulate and its sim_* modules)."""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3
from collections import defaultdict
from pathlib import Path
from zoneinfo import ZoneInfo

import pandas as pd
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_pipeline.lib.sim_condor import BASE_COLUMNS, DRIFT_COLUMNS, MIG_COLUMN, month_columns
from gpu_pipeline.lib.sim_engine import VACATE_REASON_CODE
from gpu_pipeline.lib.sim_telemetry import DCGM_FAMILIES, NVIDIA_SMI_HEADER
from gpu_pipeline.lib.simulate import SimConfig, simulate

TZ = "America/Chicago"
# 12 GPUs over a local month end (Jan 31 - Feb 1 2025, no DST). Seed 9 gives both tiers, both
# telemetry kinds, a drain, a dropout, evictions and restarted backfill jobs inside the window
# (asserted in test_small_config_exercises_the_model so the invariant tests are never vacuous).
SMALL = SimConfig(
    start=dt.date(2025, 1, 31),
    end=dt.date(2025, 2, 1),
    gpus=12,
    seed=9,
    timezone=TZ,
    telemetry_interval_s=120,
)
WINDOW_START = dt.datetime(2025, 1, 31, tzinfo=ZoneInfo(TZ)).astimezone(dt.UTC)
WINDOW_END = dt.datetime(2025, 2, 2, tzinfo=ZoneInfo(TZ)).astimezone(dt.UTC)
TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{6}$")
STATES = {"idle_prioritized", "idle_shared", "busy_prioritized", "busy_shared", "busy_backfill", "na"}


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("sim")
    return out, simulate(out, SMALL)


@pytest.fixture(scope="module")
def truth(sim) -> dict:
    out, _ = sim
    return {
        name: pq.read_table(out / "truth" / f"{name}.parquet").to_pandas()
        for name in ("gpu_state_intervals", "availability_periods", "evictions", "jobs", "hosts")
    }


@pytest.fixture(scope="module")
def snapshots(sim) -> list[tuple[str, list[dict]]]:
    """[(timestamp text, rows as dicts)] in file order over both monthly files."""
    out, _ = sim
    result: dict[str, list[dict]] = {}
    for db in sorted((out / "condor").glob("gpu_state_*.db")):
        con = sqlite3.connect(db)
        con.row_factory = sqlite3.Row
        for row in con.execute("SELECT * FROM gpu_state ORDER BY rowid"):
            result.setdefault(row["timestamp"], []).append(dict(row))
        con.close()
    return list(result.items())


def _local_to_utc(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=ZoneInfo(TZ)).astimezone(dt.UTC)


def _nn(value):
    """None for a missing value (pandas reads null strings as NaN)."""
    return None if pd.isna(value) else value


def _intervals_by_gpu(truth) -> dict[str, list[tuple]]:
    by_gpu: dict[str, list[tuple]] = defaultdict(list)
    for r in truth["gpu_state_intervals"].itertuples():
        by_gpu[r.gpu_id].append((r.start_utc, r.end_utc, r.state, _nn(r.global_job_id), _nn(r.na_reason)))
    for ivs in by_gpu.values():
        ivs.sort()
    return by_gpu


def _truth_at(ivs: list[tuple], t) -> tuple:
    hits = [iv for iv in ivs if iv[0] <= t < iv[1]]
    assert len(hits) == 1, (t, hits)
    return hits[0]


# ---------------------------------------------------------------------------------------------
# Configuration coverage, determinism
# ---------------------------------------------------------------------------------------------


def test_small_config_exercises_the_model(sim, truth):
    _, summary = sim
    assert summary["gpus"] == 12
    hosts = truth["hosts"]
    assert set(hosts.tier) == {"prioritized", "shared"}
    assert set(hosts.telemetry) == {"nvidia-smi", "dcgm"}
    assert set(truth["gpu_state_intervals"].na_reason.dropna()) == {"dropout", "drained"}
    assert len(truth["evictions"]) > 0
    assert (truth["jobs"].run_index > 0).any()
    assert summary["files"] == sorted(summary["files"])
    assert (
        "condor/gpu_state_2025-01.db" in summary["files"]
        and "condor/gpu_state_2025-02.db" in summary["files"]
    )


def _all_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_files(sim, tmp_path):
    out, summary = sim
    again = simulate(tmp_path, SMALL)
    assert again == summary
    first, second = _all_bytes(out), _all_bytes(tmp_path)
    assert first.keys() == second.keys()
    for name in first:
        assert first[name] == second[name], name


def test_different_seed_differs(sim, tmp_path):
    out, _ = sim
    cfg = SimConfig(**{**SMALL.__dict__, "seed": SMALL.seed + 1, "telemetry_interval_s": 0})
    simulate(tmp_path, cfg)
    a = pq.read_table(out / "truth" / "gpu_state_intervals.parquet")
    b = pq.read_table(tmp_path / "truth" / "gpu_state_intervals.parquet")
    assert not a.equals(b)
    assert a.column("gpu_id").unique() != b.column("gpu_id").unique()


def test_rerun_replaces_previous_outputs(tmp_path):
    big = SimConfig(
        start=dt.date(2025, 3, 3), end=dt.date(2025, 3, 4), gpus=8, seed=1, telemetry_interval_s=300
    )
    simulate(tmp_path, big)
    small = SimConfig(
        start=dt.date(2025, 3, 3), end=dt.date(2025, 3, 3), gpus=4, seed=2, telemetry_interval_s=300
    )
    summary = simulate(tmp_path, small)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == summary["files"]


def test_config_validation(tmp_path):
    with pytest.raises(ValueError, match="before start"):
        simulate(tmp_path, SimConfig(start=dt.date(2025, 1, 2), end=dt.date(2025, 1, 1)))
    with pytest.raises(ValueError, match="gpus"):
        simulate(tmp_path, SimConfig(start=dt.date(2025, 1, 1), end=dt.date(2025, 1, 1), gpus=0))


# ---------------------------------------------------------------------------------------------
# SQLite slot snapshots
# ---------------------------------------------------------------------------------------------


def _table_info(db: Path) -> list[tuple[str, str]]:
    con = sqlite3.connect(db)
    try:
        return [(r[1], r[2]) for r in con.execute("PRAGMA table_info(gpu_state)")]
    finally:
        con.close()


def test_sqlite_schema_and_drift_across_month_boundary(sim):
    out, _ = sim
    jan, feb = out / "condor" / "gpu_state_2025-01.db", out / "condor" / "gpu_state_2025-02.db"
    assert _table_info(jan) == list(BASE_COLUMNS)
    expected_feb = [c for c in BASE_COLUMNS[:-1]] + list(DRIFT_COLUMNS) + [BASE_COLUMNS[-1]]
    expected_feb.insert(expected_feb.index(("GPUs_DeviceName", "TEXT")) + 1, MIG_COLUMN)
    assert _table_info(feb) == expected_feb
    for db in (jan, feb):
        con = sqlite3.connect(db)
        objects = con.execute("SELECT type, name FROM sqlite_master").fetchall()
        assert objects == [("table", "gpu_state")]  # no index, no primary key (autoindex)
        ddl = con.execute("SELECT sql FROM sqlite_master").fetchone()[0]
        assert ddl.startswith("CREATE TABLE gpu_state (") and '"timestamp" TIMESTAMP' in ddl
        con.close()
    con = sqlite3.connect(feb)
    assert con.execute(
        'SELECT count(*) FROM gpu_state WHERE "GPUs_MIG_0_DeviceName" IS NOT NULL'
    ).fetchone() == (0,)
    reasons = {r[0] for r in con.execute('SELECT DISTINCT "PreventJobsReason" FROM gpu_state')}
    assert reasons <= {None, "Draining"}
    assert con.execute('SELECT count(*) FROM gpu_state WHERE "Disk" IS NULL OR "Disk" < 0').fetchone() == (0,)
    con.close()


def test_month_columns_rules():
    newer = list(BASE_COLUMNS[:-1]) + list(DRIFT_COLUMNS) + [BASE_COLUMNS[-1]]
    assert month_columns(0, 1, True) == newer  # a single month gets the newer layout
    assert month_columns(0, 3, True) == list(BASE_COLUMNS)
    assert MIG_COLUMN in month_columns(1, 3, True)
    assert month_columns(2, 3, True) == newer
    assert all(month_columns(i, 3, False) == list(BASE_COLUMNS) for i in range(3))


def test_snapshot_timestamps(sim, snapshots):
    _, summary = sim
    assert len(snapshots) == summary["snapshots"] == 2 * 24 * 12
    month_of = {}
    for text, rows in snapshots:
        assert TS_RE.match(text), text
        local = dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f")
        jitter = (local.minute % 5) * 60 + local.second + local.microsecond / 1e6
        assert 0.5 <= jitter < 25.0, text
        month_of[text] = local.strftime("%Y-%m")
        assert {r["timestamp"] for r in rows} == {text}
    texts = [t for t, _ in snapshots]
    assert texts == sorted(texts)
    assert min(texts).startswith("2025-01-31 00:00:") and max(texts).startswith("2025-02-01 23:55:")
    # every row lives in the file of its local month
    out, _ = sim
    for db in (out / "condor").glob("gpu_state_*.db"):
        con = sqlite3.connect(db)
        months = {r[0][:7] for r in con.execute("SELECT DISTINCT timestamp FROM gpu_state")}
        con.close()
        assert months == {db.stem.removeprefix("gpu_state_")}


def test_row_semantics_per_snapshot(snapshots, truth):
    hosts = truth["hosts"].set_index("host")
    host_gpus = {h: r.gpu_ids.split(",") for h, r in hosts.iterrows()}
    seen_backfill_claim = False
    for _, rows in snapshots:
        by_host: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            by_host[r["Machine"]].append(r)
        for host, hrows in by_host.items():
            gpus = host_gpus[host]
            prio = hosts.loc[host, "tier"] == "prioritized"
            assert all(r["Name"].endswith("@" + host) for r in hrows)
            assert {r["PrioritizedProjects"] for r in hrows} == {hosts.loc[host, "prioritized_projects"]}
            assert (hosts.loc[host, "prioritized_projects"] != "") == prio
            pslot = [r for r in hrows if r["Name"] == f"slot1@{host}"]
            # each GPU appears in exactly one primary p-slot row
            assert sorted(r["AssignedGPUs"] for r in pslot) == sorted(gpus)
            assert len({r["AvailableGPUs"] for r in pslot}) == 1
            assert {r["State"] for r in pslot} <= {"Unclaimed", "Drained"} and len(
                {r["State"] for r in pslot}
            ) == 1
            assert all(r["RemoteOwner"] is None and r["GlobalJobId"] is None for r in pslot)
            dslots = [r for r in hrows if r["Name"].startswith("slot1_")]
            in_dslots = [r["AssignedGPUs"] for r in dslots]
            assert len(in_dslots) == len(set(in_dslots))
            for r in dslots:
                assert r["State"] == "Claimed" and r["AssignedGPUs"] in r["AvailableGPUs"].split(",")
                assert re.match(r"^[\w-]+@[\w.-]+$", r["RemoteOwner"])
                assert re.match(r"^[\w.-]+#\d+\.\d+#\d+$", r["GlobalJobId"])
                assert 0.0 <= r["GPUsAverageUsage"] <= 1.0
            avail = pslot[0]["AvailableGPUs"]
            assert set(avail.split(",")) - {""} == set(gpus) - set(in_dslots)
            bf_pslot = [r for r in hrows if r["Name"] == f"backfill2@{host}"]
            bf_dslots = [r for r in hrows if r["Name"].startswith("backfill2_")]
            if not prio:
                assert not bf_pslot and not bf_dslots
                continue
            for r in bf_dslots:  # backfill rows copy AvailableGPUs into AssignedGPUs
                assert r["State"] == "Claimed" and r["AssignedGPUs"] == r["AvailableGPUs"]
                seen_backfill_claim = True
            bf_busy = {r["AssignedGPUs"] for r in bf_dslots}
            assert not bf_busy & set(in_dslots)
            if bf_pslot:
                listed = bf_pslot[0]["AvailableGPUs"].split(",")
                assert sorted(r["AssignedGPUs"] for r in bf_pslot) == sorted(listed)
                assert all(r["AvailableGPUs"] == bf_pslot[0]["AvailableGPUs"] for r in bf_pslot)
            idle_both = set(gpus) - set(in_dslots) - bf_busy
            assert {r["AssignedGPUs"] for r in bf_pslot} == idle_both
    assert seen_backfill_claim


# ---------------------------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------------------------


def test_truth_intervals_cover_window_exactly(truth):
    iv = truth["gpu_state_intervals"]
    hosts = truth["hosts"]
    all_gpus = {g for ids in hosts.gpu_ids for g in ids.split(",")}
    assert set(iv.gpu_id) == all_gpus and len(all_gpus) == 12
    assert set(iv.state) <= STATES
    for gpu, ivs in _intervals_by_gpu(truth).items():
        assert ivs[0][0] == WINDOW_START and ivs[-1][1] == WINDOW_END, gpu
        for (_, e0, *_), (s1, *_) in zip(ivs, ivs[1:], strict=False):
            assert e0 == s1, gpu
        for s, e, state, job, reason in ivs:
            assert s < e
            assert (job is not None) == state.startswith("busy"), (gpu, s, state, job)
            assert (reason is not None) == (state == "na")
    for row in iv.itertuples():
        tier = (
            "prioritized"
            if row.state.endswith("prioritized")
            else "shared"
            if row.state.endswith("shared")
            else None
        )
        if tier:
            assert row.tier == tier
        if row.state == "busy_backfill":
            assert row.tier == "prioritized"


def _implied_state(rows: list[dict], tier: str) -> tuple[str, str | None]:
    """The design's ranking: claimed primary > claimed backfill > unclaimed primary > other primary."""
    primary = [r for r in rows if "backfill" not in r["Name"].lower()]
    backfill = [r for r in rows if "backfill" in r["Name"].lower()]
    for r in primary:
        if r["State"] == "Claimed":
            return f"busy_{tier}", r["GlobalJobId"]
    for r in backfill:
        if r["State"] == "Claimed":
            return "busy_backfill", r["GlobalJobId"]
    if any(r["State"] == "Unclaimed" for r in primary):
        return f"idle_{tier}", None
    return "na", None


def test_truth_matches_every_snapshot(snapshots, truth):
    by_gpu = _intervals_by_gpu(truth)
    tier_of = {}
    for h in truth["hosts"].itertuples():
        for g in h.gpu_ids.split(","):
            tier_of[g] = h.tier
    checked = defaultdict(int)
    for text, rows in snapshots:
        t = _local_to_utc(text)
        rows_of: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            rows_of[r["AssignedGPUs"]].append(r)
        for gpu, ivs in by_gpu.items():
            _, _, state, job, _ = _truth_at(ivs, t)
            if gpu not in rows_of:
                expected = ("na", None)
            else:
                expected = _implied_state(rows_of[gpu], tier_of[gpu])
            assert (state, job) == expected, (text, gpu)
            checked[state] += 1
    assert checked.keys() == STATES - ({"idle_shared"} if not checked["idle_shared"] else set())


def test_dropped_host_has_no_rows_and_drained_rows_are_marked(snapshots, truth):
    iv = truth["gpu_state_intervals"]
    times = [(_local_to_utc(text), rows) for text, rows in snapshots]
    for reason in ("dropout", "drained"):
        sel = iv[iv.na_reason == reason]
        assert len(sel)
        for r in sel.itertuples():
            for t, rows in times:
                if r.start_utc <= t < r.end_utc:
                    host_rows = [x for x in rows if x["Machine"] == r.host]
                    if reason == "dropout":
                        assert host_rows == []
                    else:
                        pslot = [x for x in host_rows if x["Name"] == f"slot1@{r.host}"]
                        assert pslot and all(x["State"] == "Drained" for x in pslot)
                        if "PreventJobsReason" in pslot[0]:
                            assert all(x["PreventJobsReason"] == "Draining" for x in pslot)


def test_evictions_coincide_with_primary_starts(truth):
    ev, jobs = truth["evictions"], truth["jobs"]
    by_gpu = _intervals_by_gpu(truth)
    assert len(ev)
    for e in ev.itertuples():
        assert (
            e.started_utc < e.evicted_utc and e.runtime_s == (e.evicted_utc - e.started_utc).total_seconds()
        )
        primary = jobs[(jobs.global_job_id == e.evicted_by_job_id) & (jobs.kind == "primary")]
        assert len(primary) == 1
        p = primary.iloc[0]
        assert p.start_utc == e.evicted_utc and e.gpu_id in p.gpu_ids.split(",") and p.host == e.host
        victim = jobs[(jobs.global_job_id == e.global_job_id) & (jobs.run_index == e.run_index)]
        assert len(victim) == 1
        v = victim.iloc[0]
        assert v.kind == "backfill" and v.end_reason == "evicted" and v.end_utc == e.evicted_utc
        assert v.start_utc == e.started_utc and v.gpu_ids == e.gpu_id
        # the truth interval flips from this backfill job to the primary job at that instant
        _, _, before, job_before, _ = _truth_at(
            by_gpu[e.gpu_id], e.evicted_utc - dt.timedelta(microseconds=1)
        )
        _, _, after, job_after, _ = _truth_at(by_gpu[e.gpu_id], e.evicted_utc)
        assert before == "busy_backfill" and job_before == e.global_job_id
        assert after == "busy_prioritized" and job_after == e.evicted_by_job_id
    # restarted backfill jobs keep their GlobalJobId and count their runs
    bf = jobs[jobs.kind == "backfill"]
    for gjid, runs in bf.groupby("global_job_id"):
        idx = sorted(runs.run_index)
        assert idx == list(range(idx[0], idx[0] + len(idx))), gjid
        ordered = runs.sort_values("run_index")
        assert (ordered.end_reason.iloc[:-1] == "evicted").all()


def test_availability_periods_match_idle_intervals(truth):
    av, iv = truth["availability_periods"], truth["gpu_state_intervals"]
    idle = iv[iv.state.str.startswith("idle")]
    assert len(av) == len(idle)
    key = ["gpu_id", "start_utc", "end_utc"]
    assert sorted(map(tuple, av[key].values.tolist())) == sorted(map(tuple, idle[key].values.tolist()))
    by_gpu = _intervals_by_gpu(truth)
    reasons = set()
    for p in av.itertuples():
        assert p.duration_s == (p.end_utc - p.start_utc).total_seconds() > 0
        reasons.add(p.end_reason)
        if p.end_utc == WINDOW_END:
            assert p.end_reason == "open"
            continue
        _, _, nxt, job, na_reason = _truth_at(by_gpu[p.gpu_id], p.end_utc)
        expected = {
            "busy_backfill": "backfill_claimed",
            "busy_prioritized": "primary_claimed",
            "busy_shared": "primary_claimed",
        }.get(nxt, na_reason)
        assert p.end_reason == expected
        assert _nn(p.backfill_job_id) == (job if nxt == "busy_backfill" else None)
        assert p.tier == ("prioritized" if p.gpu_id in set(iv[iv.tier == "prioritized"].gpu_id) else "shared")
    assert {"backfill_claimed", "primary_claimed", "open"} <= reasons


def test_jobs_truth_and_hosts(truth):
    jobs, hosts = truth["jobs"], truth["hosts"]
    assert set(jobs.end_reason) <= {"completed", "evicted", "running", "queued"}
    assert set(jobs.profile) <= {"efficient", "io_bound", "held_idle"}
    started = jobs[jobs.end_reason != "queued"]
    assert (started.start_utc >= started.qdate_utc).all()
    assert started[started.end_reason == "running"].end_utc.isna().all()
    assert (started.dropna(subset=["end_utc"]).end_utc > WINDOW_START).all()
    assert (started.start_utc < WINDOW_END).all()
    assert (started.gpu_ids.str.split(",").str.len() == started.request_gpus).all()
    assert started.slot_name.str.match(r"^(slot1|backfill2)_\d+@").all()
    for h in hosts.itertuples():
        ids, uuids = h.gpu_ids.split(","), h.gpu_uuids.split(",")
        assert len(ids) == len(uuids) == h.n_gpus
        for short, uuid in zip(ids, uuids, strict=True):
            assert re.match(r"^GPU-[0-9a-f]{8}$", short)
            assert re.match(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", uuid)
            assert uuid.startswith(short)
        assert re.match(r"^[a-z0-9-]+\.[a-z0-9.-]+$", h.host)


# ---------------------------------------------------------------------------------------------
# adstash job documents
# ---------------------------------------------------------------------------------------------


def _docs(out: Path, prefix: str) -> list[tuple[str, dict]]:
    docs = []
    for f in sorted((out / "jobs").glob(f"{prefix}-*.ndjson")):
        for line in f.read_text().splitlines():
            docs.append((f.name, json.loads(line)))
    return docs


def test_job_documents_use_adstash_names_and_epoch_seconds(sim, truth):
    out, _ = sim
    docs = _docs(out, "jobs")
    assert docs
    lo, hi = WINDOW_START.timestamp(), WINDOW_END.timestamp()
    for name, d in docs:
        assert "RequestGpus" in d and "RequestGPUs" not in d
        assert "remoteowner" in d and "RemoteOwner" not in d and "numvacates" in d
        for key in (
            "RecordTime",
            "QDate",
            "JobStartDate",
            "JobCurrentStartDate",
            "CompletionDate",
            "EnteredCurrentStatus",
        ):
            assert type(d[key]) is int, key
        assert lo <= d["RecordTime"] < hi
        assert name == f"jobs-{dt.datetime.fromtimestamp(d['RecordTime'], dt.UTC):%Y-%m-%d}.ndjson"
        assert d["JobStatus"] in (3, 4)
        slot, _, startd = d["LastRemoteHost"].rpartition("@")
        assert (d["StartdSlot"], d["StartdName"]) == (slot, startd)
        assert d["GlobalJobId"].split("#")[1] == f"{d['ClusterId']}.{d['ProcId']}"
        assert d["QDate"] <= d["JobStartDate"] <= d["JobCurrentStartDate"]
        if d["JobStatus"] == 4:
            assert d["CompletionDate"] == d["RecordTime"] and d["CommittedTime"] > 0
        if d["numvacates"]:
            assert d["vacatereasoncode"] == VACATE_REASON_CODE and type(d["LastVacateTime"]) is int
            assert d["RemoteWallClockTime"] > d["CommittedTime"]
    assert any(d["NumJobStarts"] > 1 for _, d in docs)
    # every completed run in the window has an epoch document; evicted runs come back as Idle
    epochs = _docs(out, "epochs")
    ended = truth["jobs"].dropna(subset=["end_utc"])
    ended = ended[ended.end_utc < WINDOW_END]
    assert len(epochs) == len(ended)
    evicted = [d for _, d in epochs if d["JobStatus"] == 1]
    assert len(evicted) == len(truth["evictions"])
    assert all(
        d["LastVacateTime"] == d["RecordTime"] and d["vacatereasoncode"] == VACATE_REASON_CODE
        for d in evicted
    )
    assert {(d["GlobalJobId"], d["NumJobStarts"] - 1) for d in evicted} == set(
        zip(truth["evictions"].global_job_id, truth["evictions"].run_index, strict=True)
    )


# ---------------------------------------------------------------------------------------------
# Telemetry
# ---------------------------------------------------------------------------------------------


def test_nvidia_smi_csv_format_and_consistency(sim, truth):
    out, _ = sim
    files = sorted((out / "telemetry" / "nvidia-smi").glob("*/nvidia-smi-*.csv"))
    assert files
    hosts = truth["hosts"].set_index("host")
    by_gpu = _intervals_by_gpu(truth)
    profile = dict(zip(truth["jobs"].global_job_id, truth["jobs"].profile, strict=False))
    checked = defaultdict(int)
    for f in files:
        lines = f.read_text().splitlines()
        assert lines[0] == NVIDIA_SMI_HEADER
        host = f.parent.name
        limit = float(hosts.loc[host, "power_limit_w"])
        uuids = hosts.loc[host, "gpu_uuids"].split(",")
        for line in lines[1:]:
            ts, idx, name, uuid, serial, util, memutil, total, used, power, plimit, temp = line.split(", ")
            assert re.match(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{3}$", ts)
            assert ts[:10].replace("/", "-") == f.stem.removeprefix("nvidia-smi-")
            assert name == hosts.loc[host, "device_name"] and uuid == uuids[int(idx)]
            assert util.endswith(" %") and memutil.endswith(" %") and used.endswith(" MiB")
            assert total == f"{hosts.loc[host, 'gpu_memory_mb']} MiB" and plimit == f"{limit:.2f} W"
            assert re.match(r"^\d+\.\d{2} W$", power) or power == "[N/A]"
            assert temp.isdigit() and (serial.isdigit() or serial == "[N/A]")
            t = (
                dt.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f")
                .replace(tzinfo=ZoneInfo(TZ))
                .astimezone(dt.UTC)
            )
            _, _, state, job, _ = _truth_at(by_gpu[uuid[:12]], t)
            u = int(util[:-2])
            if state.startswith("idle") or state == "na":  # na here = drained (no samples in dropouts)
                assert u == 0
                if power != "[N/A]":
                    assert float(power[:-2]) < 0.2 * limit
                checked["idle"] += 1
            elif profile[job] == "efficient":
                assert u >= 60
                checked["efficient"] += 1
            elif profile[job] == "held_idle":
                assert u <= 6
                if power != "[N/A]":
                    assert float(power[:-2]) < 0.2 * limit
                checked["held_idle"] += 1
    assert checked["idle"] and checked["efficient"]


def test_no_telemetry_while_dropped_out(sim, truth):
    out, _ = sim
    iv = truth["gpu_state_intervals"]
    drop = iv[iv.na_reason == "dropout"]
    assert len(drop)
    uuid_of = {}
    for h in truth["hosts"].itertuples():
        uuid_of.update(dict(zip(h.gpu_ids.split(","), h.gpu_uuids.split(","), strict=True)))
    for r in drop.itertuples():
        host_dir = next((out / "telemetry").glob(f"*/{r.host}"))
        lo, hi = r.start_utc.timestamp(), r.end_utc.timestamp()
        text = "\n".join(p.read_text() for p in host_dir.iterdir())
        if host_dir.parent.name == "dcgm":
            stamps = [
                int(line.rsplit(" ", 1)[1]) / 1000
                for line in text.splitlines()
                if uuid_of[r.gpu_id] in line and line.startswith("DCGM_FI_DEV_GPU_UTIL")
            ]
        else:
            stamps = [
                dt.datetime.strptime(line.split(", ")[0], "%Y/%m/%d %H:%M:%S.%f")
                .replace(tzinfo=ZoneInfo(TZ))
                .timestamp()
                for line in text.splitlines()
                if uuid_of[r.gpu_id] in line
            ]
        assert stamps
        assert not [s for s in stamps if lo <= s < hi]


def test_dcgm_text_parses_with_prometheus_client(sim, truth):
    out, _ = sim
    files = sorted((out / "telemetry" / "dcgm").glob("*/dcgm-*.prom"))
    assert files
    hosts = truth["hosts"].set_index("host")
    for f in files:
        host = f.parent.name
        families = list(text_string_to_metric_families(f.read_text()))
        names = [fam.name for fam in families]
        expected = [n for n, _, _ in DCGM_FAMILIES]
        if "GeForce" in hosts.loc[host, "device_name"]:
            expected = [n for n in expected if not n.startswith("DCGM_FI_PROF_")]
        assert names == expected
        uuids = set(hosts.loc[host, "gpu_uuids"].split(","))
        for fam in families:
            assert fam.samples
            energy: dict[str, float] = {}
            for s in fam.samples:
                assert s.timestamp is not None
                assert set(s.labels) == {"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"}
                assert s.labels["UUID"] in uuids and s.labels["modelName"] == hosts.loc[host, "device_name"]
                assert s.labels["device"] == f"nvidia{s.labels['gpu']}"
                if fam.type == "counter":
                    assert s.value >= energy.get(s.labels["UUID"], 0)
                    energy[s.labels["UUID"]] = s.value
                elif fam.name.startswith("DCGM_FI_PROF_"):
                    assert 0.0 <= s.value <= 1.0
                elif fam.name == "DCGM_FI_DEV_GPU_UTIL":
                    assert 0 <= s.value <= 100


# ---------------------------------------------------------------------------------------------
# Time zones and scale
# ---------------------------------------------------------------------------------------------


def test_dst_fall_back_day_has_25_hours(tmp_path):
    cfg = SimConfig(
        start=dt.date(2025, 11, 2),
        end=dt.date(2025, 11, 2),
        gpus=4,
        seed=5,
        timezone=TZ,
        telemetry_interval_s=0,
    )
    summary = simulate(tmp_path, cfg)
    assert summary["snapshots"] == 25 * 12
    assert summary["window_end_utc"] == "2025-11-03T06:00:00+00:00"
    iv = pq.read_table(tmp_path / "truth" / "gpu_state_intervals.parquet").to_pandas()
    per_gpu = (iv.end_utc - iv.start_utc).dt.total_seconds().groupby(iv.gpu_id).sum()
    assert (per_gpu == 25 * 3600).all()
    assert not list((tmp_path / "telemetry").glob("**/*.csv"))


def test_thousand_gpus_one_day(tmp_path):
    cfg = SimConfig(
        start=dt.date(2025, 6, 2), end=dt.date(2025, 6, 2), gpus=1000, seed=7, telemetry_interval_s=0
    )
    summary = simulate(tmp_path, cfg)
    assert summary["gpus"] == 1000 and summary["hosts"] > 100
    assert 0.5 < summary["prioritized_gpus"] / 1000 < 0.7
    assert summary["snapshots"] == 288
    # every snapshot lists each GPU at least in its primary p-slot unless its host dropped out
    assert 288 * 1000 * 0.95 < summary["slot_rows"]
    con = sqlite3.connect(tmp_path / "condor" / "gpu_state_2025-06.db")
    n = con.execute("SELECT count(*) FROM gpu_state WHERE Name LIKE 'slot1@%'").fetchone()[0]
    con.close()
    assert 288 * 1000 * 0.98 < n <= 288 * 1000
    assert summary["truth"]["evictions.parquet"] > 0
