"""condor_collector: startd ads -> exploded rows -> monthly SQLite archive -> condor_archive reader.

Real captures are read from the shared fixtures folder next to the repository; the committed
fixtures under gpu_pipeline_tests/fixtures/condor are hand-written ads modeled on them.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import classad2
import pytest

from gpu_pipeline.lib import condor_collector as cc
from gpu_pipeline.lib.condor_archive import SOURCE_COLUMNS, read_window
from gpu_pipeline_tests.conftest import NEW_COLUMNS, OLD_COLUMNS, slot_row, write_gpu_state_db

UTC = dt.UTC
REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "condor"
REAL_SLOTS = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "real" / "htcondor-slots"
needs_real = pytest.mark.skipif(
    not REAL_SLOTS.is_dir(), reason=f"real HTCondor captures not present at {REAL_SLOTS} (shared fixtures folder)"
)
T0 = dt.datetime(2025, 8, 14, 15, 0, 2, 123456, tzinfo=UTC)


def R(name, gpu, avail, state, device, memory, projects, machine, *, usage=None, owner=None, job=None,
      prevent=None, disk=None, ts=T0):
    return {"Name": name, "AssignedGPUs": gpu, "AvailableGPUs": avail, "State": state,
            "GPUs_DeviceName": device, "GPUs_GlobalMemoryMb": memory, "PrioritizedProjects": projects,
            "GPUsAverageUsage": usage, "Machine": machine, "RemoteOwner": owner, "GlobalJobId": job,
            "PreventJobsReason": prevent, "Disk": disk, "timestamp": ts}


P01, M01, S01 = "gpu-p01.example.edu", "gpu-m01.example.edu", "gpu-s01.example.edu"
A100 = "NVIDIA A100-SXM4-80GB"
MIG = "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
MIG_A, MIG_B = "MIG-7d3e1f20-aa11-5b22-8c33-0d44e55f6677", "MIG-8e4f2031-bb22-5c33-9d44-1e55f6607788"
PP = "BioLab,MedImaging"
EXPECTED = [
    *[R(f"slot1@{P01}", g, "GPU-9c0d1e2f,GPU-3a4b5c6d", "Unclaimed", A100, 81920, PP, P01, disk=412000000)
      for g in ("GPU-1a2b3c4d", "GPU-5e6f7a8b", "GPU-9c0d1e2f", "GPU-3a4b5c6d")],
    R(f"slot1_1@{P01}", "GPU-1a2b3c4d", "GPU-1a2b3c4d", "Claimed", A100, 81920, PP, P01, usage=0.93,
      owner="alice@example.edu", job="ap1.example.edu#4417.0#1754042400", disk=20971520),
    # GPUsAverageUsage = GPUsUsageSum / GPUsUsageSamples: undefined -> NULL
    R(f"slot1_2@{P01}", "GPU-5e6f7a8b", "GPU-5e6f7a8b", "Claimed", A100, 81920, PP, P01,
      owner="bob@example.edu", job="ap2.example.edu#88.3#1754044200", disk=10485760),
    # backfill partitionable slot: AssignedGPUs (2 GPUs) replaced by AvailableGPUs (1 GPU)
    R(f"backfill2@{P01}", "GPU-3a4b5c6d", "GPU-3a4b5c6d", "Unclaimed", A100, 81920, PP, P01, disk=380000000),
    R(f"backfill2_1@{P01}", "GPU-9c0d1e2f", "GPU-9c0d1e2f", "Claimed", A100, 81920, PP, P01, usage=0.5,
      owner="carol@example.org", job="ospool-ap.example.org#903311.12#1754045000", disk=5242880),
    # MIG host: no slot-wide memory, taken from the nested GPUs_MIG_* ads
    R(f"slot1@{M01}", MIG_A, MIG_B, "Unclaimed", MIG, 20086, "", M01, disk=200000000),
    R(f"slot1@{M01}", MIG_B, MIG_B, "Unclaimed", MIG, 20082, "", M01, disk=200000000),
    # AssignedGPUs given as GPUs_MIG_<uuid> is normalized to the MIG id
    R(f"slot1_1@{M01}", MIG_A, MIG_A, "Claimed", MIG, 20086, "", M01, usage=0.41, owner="dave@example.edu",
      job="ap1.example.edu#4420.0#1754046000", disk=4194304),
    # slot2@gpu-m01 is CPU-only: no row
    R(f"slot1@{S01}", "GPU-aa11bb22", "GPU-aa11bb22", "Drained", "NVIDIA L40S", 46068, "", S01,
      prevent="Draining", disk=950000000),
]


def fixture_ads_old():
    return cc.parse_old_ads((FIXTURES / "startd_gpu_slots.long.txt").read_text())


def fixture_ads_json():
    return cc.parse_json_ads((FIXTURES / "startd_gpu_slots.json").read_text())


def old_ad(text: str) -> classad2.ClassAd:
    ads = cc.parse_old_ads(text)
    assert len(ads) == 1
    return ads[0]


# ------------------------------------------------------------------ transformation, own fixtures


def test_old_syntax_fixture_gives_exact_exploded_rows():
    conv = cc.convert_ads(fixture_ads_old(), T0)
    assert conv.rows == EXPECTED
    assert (conv.slots, conv.skipped_ads, conv.slots_without_gpus) == (9, 1, 1)
    assert cc.ads_to_rows(fixture_ads_old(), T0) == EXPECTED


def test_json_array_fixture_gives_the_same_rows_as_ads_and_as_dicts():
    conv = cc.convert_ads(fixture_ads_json(), T0)
    assert conv.rows == EXPECTED
    assert (conv.slots, conv.skipped_ads, conv.slots_without_gpus) == (9, 1, 1)
    # plain dicts from json.loads go through the same /Expr(...)/ conversion
    dicts = json.loads((FIXTURES / "startd_gpu_slots.json").read_text())
    assert any(isinstance(v, str) and v.startswith("/Expr(") for d in dicts for v in d.values())
    assert cc.ads_to_rows(dicts, T0) == EXPECTED


def test_json_parser_of_classad2_cannot_read_the_array_so_we_do():
    text = (FIXTURES / "startd_gpu_slots.json").read_text()
    with pytest.raises(ValueError):
        list(classad2.parseAds(text, classad2.ParserType.JSON))
    assert len(cc.parse_json_ads(text)) == 10
    with pytest.raises(ValueError, match="not valid JSON"):
        cc.parse_json_ads(text[:-5])


def test_malformed_ads_are_skipped_counted_and_do_not_swallow_the_next_ones():
    good = 'Name = "slot1@h"\nState = "Claimed"\nAssignedGPUs = "GPU-0000aaaa"\n'
    text = "\n".join([
        'Name = "slot1@bad1"\nState = "Unclaimed\nAssignedGPUs = "GPU-1"\n',  # unterminated string
        "Foo bar baz\nName = \"slot1@bad2\"\nState = \"Claimed\"\n",  # not an assignment
        'Name = "slot1@bad3"\nState = "Claimed"\nDisk = 5 +\nAssignedGPUs = "GPU-2"\n',  # truncated ad
        good,
    ])
    # classad2 itself does not raise: it returns a truncated or empty ad
    raw = classad2.parseOne('Name = "x"\nState = = "y"\nFoo = 1\n', classad2.ParserType.Old)
    assert dict(raw) == {"Name": "x"}
    ads = cc.parse_old_ads(text)
    assert [len(a) for a in ads[:3]] == [0, 0, 0]
    conv = cc.convert_ads([*ads, {"State": "Unclaimed"}, classad2.ClassAd(), "not an ad"], T0)
    assert [r["Name"] for r in conv.rows] == ["slot1@h"]
    assert conv.skipped_ads == 6 and conv.slots == 1
    assert len(conv.skipped_reasons) == 6


def test_id_normalization_backfill_and_null_rules():
    assert cc.normalize_gpu_id("GPUs_GPU_b156e653") == "GPU-b156e653"
    assert cc.normalize_gpu_id("GPU_b156e653") == "GPU-b156e653"
    assert cc.normalize_gpu_id(" GPUs_MIG_0caf1ce3_fcd4_59da_8564_764000e3ace9") == \
        "MIG-0caf1ce3-fcd4-59da-8564-764000e3ace9"
    assert cc.normalize_gpu_id("GPU-MIG-3167") == "GPU-MIG-3167"
    ad = old_ad(
        'Name = "slot1@h"\nState = "Claimed"\nAssignedGPUs = " GPU-0000aaaa, GPU_0000bbbb,,GPU-0000aaaa "\n'
        "AvailableGPUs = { }\nDisk = 1/0\nGPUs_GlobalMemoryMb = 40536.0\nGPUsAverageUsage = \"high\"\n"
        'RemoteOwner = undefined\nPrioritizedProjects = ""\n'
    )
    rows = cc.ads_to_rows([ad], T0)
    assert [r["AssignedGPUs"] for r in rows] == ["GPU-0000aaaa", "GPU-0000bbbb"]
    assert rows[0]["AvailableGPUs"] == ""
    assert (rows[0]["Disk"], rows[0]["GPUsAverageUsage"], rows[0]["RemoteOwner"]) == (None, None, None)
    assert rows[0]["GPUs_GlobalMemoryMb"] == 40536 and rows[0]["PrioritizedProjects"] == ""
    assert rows[0]["GPUs_DeviceName"] is None and rows[0]["Machine"] is None

    # backfill (any case): AssignedGPUs := AvailableGPUs; empty list -> no row
    bf = 'Name = "Backfill3@h"\nState = "Unclaimed"\nAssignedGPUs = "GPU-0000aaaa,GPU-0000bbbb"\n'
    assert [r["AssignedGPUs"] for r in cc.ads_to_rows([old_ad(bf + "AvailableGPUs = { GPUs_GPU_0000bbbb }\n")], T0)] \
        == ["GPU-0000bbbb"]
    conv = cc.convert_ads([old_ad(bf + "AvailableGPUs = {}\n")], T0)
    assert conv.rows == [] and conv.slots_without_gpus == 1
    # a backfill slot that publishes no AvailableGPUs at all keeps its own AssignedGPUs
    assert len(cc.ads_to_rows([old_ad(bf)], T0)) == 2
    # AvailableGPUs given as a plain string also works
    s = old_ad('Name = "slot1@h"\nState = "Unclaimed"\nAssignedGPUs = "GPU-1"\nAvailableGPUs = "GPUs_GPU_1, GPU-2"\n')
    assert cc.ads_to_rows([s], T0)[0]["AvailableGPUs"] == "GPU-1,GPU-2"


# ------------------------------------------------------------------ real captures


def _excerpt(text: str, label: str) -> str:
    """Attribute lines of one '# --- Excerpt X' section of the public condor_status -long excerpts."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("# --- Excerpt"):
            inside = line.startswith(f"# --- Excerpt {label}")
            continue
        if inside and line.strip() and not line.startswith("#"):
            out.append(line)
    return "\n".join(out) + "\n"


@needs_real
@pytest.mark.parametrize("name", ["htcondor_test_cmd_status-af_orig_first_test.ads",
                                  "htcondor_test_cmd_status-af_orig_second_test.ads"])
def test_real_8_9_startd_ads_without_gpus_give_no_rows(name):
    ads = cc.parse_old_ads((REAL_SLOTS / name).read_text())
    assert len(ads) == 8
    assert all(len(a) >= 140 for a in ads)
    conv = cc.convert_ads(ads, T0)
    assert conv.rows == []
    assert (conv.slots, conv.skipped_ads, conv.slots_without_gpus) == (8, 0, 8)


@needs_real
def test_real_gpu_excerpts_set_literal_available_gpus_and_nested_ads():
    text = (REAL_SLOTS / "condor_status_long_gpu_excerpts_public.txt").read_text()
    # As pasted (grep output, no Name/State): one ad that is not a slot ad -> skipped, no crash.
    conv = cc.convert_ads(cc.parse_old_ads(text), T0)
    assert (conv.rows, conv.skipped_ads) == ([], 1)

    b = _excerpt(text, "B")
    assert "AvailableGPUs = { GPUs_GPU_b156e653,GPUs_GPU_b2c83767,GPUs_GPU_c62b119c,GPUs_GPU_e58c2e11 }" in b
    ids = ["GPU-b156e653", "GPU-b2c83767", "GPU-c62b119c", "GPU-e58c2e11"]
    ad = old_ad('Name = "slot1@tstgpu.bi.privat"\nState = "Unclaimed"\n' + b)
    rows = cc.ads_to_rows([ad], T0)
    assert [r["AssignedGPUs"] for r in rows] == ids
    assert {r["AvailableGPUs"] for r in rows} == {",".join(ids)}
    bf = old_ad('Name = "backfill2@tstgpu.bi.privat"\nState = "Unclaimed"\n' + b)
    assert [r["AssignedGPUs"] for r in cc.ads_to_rows([bf], T0)] == ids

    a = _excerpt(text, "A")
    nested_ids = re.findall(r'Id = "(GPU-[0-9a-f]+)"', a)
    assert nested_ids == ["GPU-32235e0a", "GPU-487e38b2", "GPU-ef7999e4"]
    head = f'Name = "slot1@ta-titanv-001.crc.nd.edu"\nState = "Unclaimed"\nAssignedGPUs = "{",".join(nested_ids)}"\n'
    rows = cc.ads_to_rows([old_ad(head + a)], T0)
    assert [(r["AssignedGPUs"], r["GPUs_DeviceName"], r["GPUs_GlobalMemoryMb"], r["Machine"]) for r in rows] == [
        (g, "NVIDIA TITAN V", 12050, "ta-titanv-001.crc.nd.edu") for g in nested_ids]
    # Without the slot-wide attributes the values come from the real nested GPUs_GPU_<id> ads.
    stripped = "\n".join(ln for ln in a.splitlines()
                         if not ln.startswith(("GPUs_DeviceName", "GPUs_GlobalMemoryMb"))) + "\n"
    ad = old_ad(head + stripped)
    assert "GPUs_DeviceName" not in ad and isinstance(ad["GPUs_GPU_487e38b2"], classad2.ClassAd)
    rows = cc.ads_to_rows([ad], T0)
    assert [(r["GPUs_DeviceName"], r["GPUs_GlobalMemoryMb"]) for r in rows] == [("NVIDIA TITAN V", 12050)] * 3


def _discovery_sections() -> dict[str, list[str]]:
    text = (REAL_SLOTS / "condor_gpu_discovery_real_captures_from_htcondor_source.txt").read_text()
    out = {}
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in block.strip().splitlines()]
        if lines and lines[0]:
            out[lines[0].split()[1] if lines[0].startswith("From") else lines[0].split()[0]] = lines[1:]
    return out


def _slot_from_discovery(lines: list[str], ids: list[str] | None = None) -> classad2.ClassAd:
    """A slot ad as a startd would publish this discovery output: per-GPU properties prefixed with
    ``GPUs_``, the detected devices as AssignedGPUs (quoted: one capture prints them unquoted)."""
    out = ['Name = "slot1@gpu.example.edu"', 'State = "Unclaimed"']
    for ln in lines:
        key, _, value = ln.partition("=")
        key, value = key.strip(), value.strip()
        if key == "DetectedGPUs":
            ids = [s.strip() for s in value.strip('"').split(",")]
        elif key.startswith(("GPU_", "MIG_", "Common")):
            out.append(f"GPUs_{key} = {value}")
        else:
            out.append(f"{key} = {value}")
    out.append(f'AssignedGPUs = "{", ".join(ids or [])}"')
    return old_ad("\n".join(out) + "\n")


@needs_real
def test_real_gpu_discovery_captures_flat_nested_mig_and_legacy_attributes():
    sections = _discovery_sections()
    assert set(sections) == {"Dumbo.", "Igor,", "gpulab2004", "8"}

    def got(ad):
        return [(r["AssignedGPUs"], r["GPUs_DeviceName"], r["GPUs_GlobalMemoryMb"]) for r in cc.ads_to_rows([ad], T0)]

    # Mixed TITAN RTX + V100 host, flat GPU_<id><Property> attributes, ", " separated ids.
    assert got(_slot_from_discovery(sections["Dumbo."])) == [
        ("GPU-c4a646d7", "Tesla V100-PCIE-16GB", 16160), ("GPU-6a96bd13", "TITAN RTX", 24220)]
    # A100 with 7 MIG devices named GPU-MIG-xxxx (flat memory per device, no device name).
    igor = got(_slot_from_discovery(sections["Igor,"]))
    assert igor[0] == ("GPU-cb91fc08", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864)
    assert igor[1:] == [(f"GPU-MIG-{s}", None, m) for s, m in
                        [("3167", 4861), ("5bc6", 4861), ("5daa", 4861), ("9654", 4861), ("987e", 3512),
                         ("c1df", 4861), ("e84b", 4861)]]
    # Legacy CUDA* attributes only; ids from the per-GPU DeviceUuid attribute names.
    legacy = sections["gpulab2004"]
    ids = [f"GPU-{m}" for m in re.findall(r"^GPU_([0-9a-f]{8})DeviceUuid", "\n".join(legacy), re.M)]
    assert got(_slot_from_discovery(legacy, ids)) == [(g, "A100-SXM4-40GB", 40536) for g in ids]
    # AWS 8xA100, nested per-GPU ads with lower-case `id`, two MIG devices with full UUID ids.
    aws = got(_slot_from_discovery(sections["8"]))
    assert len(aws) == 10
    assert aws[:3] == [("GPU-8aa54555", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20096),
                       ("MIG-0caf1ce3-fcd4-59da-8564-764000e3ace9", None, 20086),
                       ("MIG-207f657b-6f50-5c1a-94f0-01d07ff4cdb0", None, 20082)]
    assert aws[3:] == [(g, "NVIDIA A100-SXM4-40GB", 40536) for g in
                       ["GPU-775e454e", "GPU-d79a3765", "GPU-a6e658d5", "GPU-c73e918e", "GPU-e627fc34",
                        "GPU-5368a050", "GPU-5d2744da"]]


# ------------------------------------------------------------------ archive round trip


def read_rows(archive_dir, start, end, tz="UTC"):
    table = read_window(archive_dir, start, end, tz).table
    return [{**{c: r[c] for c in SOURCE_COLUMNS}, "snapshot_utc": r["snapshot_utc"]} for r in table.to_pylist()]


def as_read(rows, when):
    numeric = {"GPUs_GlobalMemoryMb", "GPUsAverageUsage", "Disk"}
    return [{**{c: (float(r[c]) if c in numeric and r[c] is not None else r[c]) for c in SOURCE_COLUMNS},
             "snapshot_utc": when} for r in rows]


def test_two_snapshots_round_trip_through_read_window(tmp_path):
    t1, t2 = T0, T0 + dt.timedelta(minutes=5, microseconds=7)
    rows1 = cc.ads_to_rows(fixture_ads_old(), t1)
    rows2 = cc.ads_to_rows(fixture_ads_json(), t2)[:5]
    p1 = cc.append_snapshot(tmp_path, rows1, t1)
    p2 = cc.append_snapshot(tmp_path, rows2, t2)
    assert p1 == p2 == tmp_path / "gpu_state_2025-08.db"
    assert sorted(os.listdir(tmp_path)) == ["gpu_state_2025-08.db"]

    got = read_rows(tmp_path, dt.datetime(2025, 8, 14, tzinfo=UTC), dt.datetime(2025, 8, 15, tzinfo=UTC))
    assert got == as_read(rows1, t1) + as_read(rows2, t2)

    con = sqlite3.connect(p1)
    info = [(r[1], r[2]) for r in con.execute("PRAGMA table_info(gpu_state)")]
    stamps = [r[0] for r in con.execute('SELECT DISTINCT "timestamp" FROM gpu_state ORDER BY rowid')]
    indexes = con.execute("SELECT name FROM sqlite_master WHERE type = 'index'").fetchall()
    mode = con.execute("PRAGMA journal_mode").fetchone()[0]
    con.close()
    assert info == list(cc.ARCHIVE_COLUMNS)
    assert stamps == ["2025-08-14 15:00:02.123456", "2025-08-14 15:05:02.123463"]
    assert indexes == [] and mode == "delete"


def test_archive_time_zone_month_and_dst_fall_back(tmp_path):
    tz = "America/Chicago"
    row = [R("slot1@h", "GPU-1", "GPU-1", "Unclaimed", A100, 81920, "", "h", ts=None)]
    # 2025-09-01 03:00Z is 2025-08-31 22:00 CDT: the local month decides the file.
    p = cc.append_snapshot(tmp_path, row, dt.datetime(2025, 9, 1, 3, tzinfo=UTC), tz)
    assert p.name == "gpu_state_2025-08.db"
    # 01:30 CDT, then 01:10 CST an hour later (the repeated hour): the reader's append order rule.
    a, b = dt.datetime(2025, 11, 2, 6, 30, tzinfo=UTC), dt.datetime(2025, 11, 2, 7, 10, tzinfo=UTC)
    cc.append_snapshot(tmp_path, row, a, tz)
    cc.append_snapshot(tmp_path, row, b, tz)
    assert cc.local_timestamp(b, tz) == "2025-11-02 01:10:00.000000"
    got = read_rows(tmp_path, dt.datetime(2025, 11, 2, 5, tzinfo=UTC), dt.datetime(2025, 11, 2, 9, tzinfo=UTC), tz)
    assert [g["snapshot_utc"] for g in got] == [a, b]


def test_month_rollover_creates_a_new_file(tmp_path):
    a = dt.datetime(2025, 8, 31, 23, 59, 59, 500000, tzinfo=UTC)
    b = dt.datetime(2025, 9, 1, 0, 0, 0, 100000, tzinfo=UTC)
    pa_ = cc.append_snapshot(tmp_path, cc.ads_to_rows(fixture_ads_old(), a)[:2], a)
    pb = cc.append_snapshot(tmp_path, cc.ads_to_rows(fixture_ads_old(), b)[:2], b)
    assert (pa_.name, pb.name) == ("gpu_state_2025-08.db", "gpu_state_2025-09.db")
    assert sorted(os.listdir(tmp_path)) == ["gpu_state_2025-08.db", "gpu_state_2025-09.db"]
    read = read_window(tmp_path, dt.datetime(2025, 8, 31, 12, tzinfo=UTC), dt.datetime(2025, 9, 1, 12, tzinfo=UTC))
    assert read.table.column("snapshot_utc").to_pylist() == [a, a, b, b]
    assert read.missing_months == []


@pytest.mark.parametrize("columns", [OLD_COLUMNS, NEW_COLUMNS], ids=["old", "mig-bug"])
def test_older_schema_file_is_altered_in_place_and_still_reads(tmp_path, columns):
    path = tmp_path / "gpu_state_2025-08.db"
    old = slot_row("2025-08-14 14:55:01.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed")
    write_gpu_state_db(path, [old], columns)
    rows = cc.ads_to_rows(fixture_ads_old(), T0)[-1:]  # the draining host: PreventJobsReason, Disk set
    assert cc.append_snapshot(tmp_path, rows, T0) == path

    con = sqlite3.connect(path)
    cols = [r[1] for r in con.execute("PRAGMA table_info(gpu_state)")]
    count = con.execute("SELECT count(*) FROM gpu_state").fetchone()[0]
    con.close()
    assert cols[:len(columns)] == list(columns)  # existing layout untouched, additions at the end
    assert set(cols) == set(columns) | set(cc.COLUMN_NAMES)
    assert count == 2
    got = read_rows(tmp_path, dt.datetime(2025, 8, 14, tzinfo=UTC), dt.datetime(2025, 8, 15, tzinfo=UTC))
    assert got[1] == as_read(rows, T0)[0]
    assert got[0]["Name"] == "slot1@gpu01.example.edu" and got[0]["Disk"] is None


def test_existing_sqlite_named_month_file_is_appended_to(tmp_path):
    legacy = write_gpu_state_db(tmp_path / "gpu_state_2025-08.sqlite",
                                [slot_row("2025-08-14 14:55:01.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed")])
    assert cc.append_snapshot(tmp_path, cc.ads_to_rows(fixture_ads_old(), T0), T0) == legacy
    assert sorted(os.listdir(tmp_path)) == ["gpu_state_2025-08.sqlite"]
    assert len(read_rows(tmp_path, dt.datetime(2025, 8, 14, tzinfo=UTC), T0 + dt.timedelta(hours=1))) == 13


def test_file_without_required_columns_or_shadowed_parquet_is_refused_untouched(tmp_path):
    path = tmp_path / "gpu_state_2025-08.db"
    con = sqlite3.connect(path)
    con.execute('CREATE TABLE gpu_state ("Name" TEXT, "State" TEXT)')
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(cc.ArchiveWriteError, match=r"gpu_state_2025-08\.db.*lacks required columns") as err:
        cc.append_snapshot(tmp_path, cc.ads_to_rows(fixture_ads_old(), T0), T0)
    assert not err.value.transient and path.read_bytes() == before

    other = tmp_path / "p"
    other.mkdir()
    (other / "gpu_state_2025-08.parquet").write_bytes(b"PAR1")
    with pytest.raises(cc.ArchiveWriteError, match="would hide its rows"):
        cc.append_snapshot(other, [], T0)
    assert sorted(os.listdir(other)) == ["gpu_state_2025-08.parquet"]

    with pytest.raises(ValueError, match="timezone-aware"):
        cc.append_snapshot(tmp_path, [], T0.replace(tzinfo=None))
    with pytest.raises(ValueError, match="unknown archive time zone"):
        cc.append_snapshot(tmp_path, [], T0, "Mars/Olympus")
    with pytest.raises(ValueError, match="not the snapshot's"):
        cc.append_snapshot(tmp_path, cc.ads_to_rows(fixture_ads_old(), T0), T0 + dt.timedelta(seconds=1))


def _fail_halfway(monkeypatch):
    real = cc._iter_params

    def broken(rows, ts_text):
        for i, params in enumerate(real(rows, ts_text)):
            if i == len(rows) // 2:
                raise OSError("simulated crash in the middle of the insert")
            yield params

    monkeypatch.setattr(cc, "_iter_params", broken)


def test_failure_in_the_middle_of_an_insert_leaves_only_complete_snapshots(tmp_path, monkeypatch):
    rows = cc.ads_to_rows(fixture_ads_old(), T0)
    cc.append_snapshot(tmp_path, rows, T0)
    t2 = T0 + dt.timedelta(minutes=5)
    with monkeypatch.context() as m:
        _fail_halfway(m)
        with pytest.raises(OSError, match="simulated crash"):
            cc.append_snapshot(tmp_path, cc.ads_to_rows(fixture_ads_old(), t2), t2)
        # first snapshot of a new month: no monthly file appears at all
        sept = dt.datetime(2025, 9, 1, 0, 5, tzinfo=UTC)
        with pytest.raises(OSError, match="simulated crash"):
            cc.append_snapshot(tmp_path, cc.ads_to_rows(fixture_ads_old(), sept), sept)
    assert sorted(os.listdir(tmp_path)) == ["gpu_state_2025-08.db"]
    got = read_rows(tmp_path, dt.datetime(2025, 8, 14, tzinfo=UTC), dt.datetime(2025, 9, 2, tzinfo=UTC))
    assert got == as_read(rows, T0)
    # and the file is still appendable
    cc.append_snapshot(tmp_path, cc.ads_to_rows(fixture_ads_old(), t2), t2)
    assert len(read_rows(tmp_path, T0, t2 + dt.timedelta(seconds=1))) == 2 * len(rows)


_KILL_SCRIPT = """
import datetime as dt, sys, time
from pathlib import Path
from gpu_pipeline.lib import condor_collector as cc
real = cc._iter_params
def slow(rows, ts_text):
    for i, params in enumerate(real(rows, ts_text)):
        if i == len(rows) // 2:
            print("HALF", flush=True)
            time.sleep(60)
        yield params
cc._iter_params = slow
real_connect = cc._connect
def small_cache(path, busy_timeout_s):
    con = real_connect(path, busy_timeout_s)
    con.execute("PRAGMA cache_size = 4")  # spill: the killed transaction has written into the file
    return con
cc._connect = small_cache
t = dt.datetime.fromisoformat(sys.argv[2])
row = dict(Name="slot1@h", AssignedGPUs="GPU-1", State="Claimed", timestamp=t)
cc.append_snapshot(Path(sys.argv[1]), [row] * 2000, t)
"""


def test_killed_writer_leaves_only_complete_snapshots(tmp_path):
    rows = cc.ads_to_rows(fixture_ads_old(), T0)
    path = cc.append_snapshot(tmp_path, rows, T0)
    size_before = path.stat().st_size
    t2 = T0 + dt.timedelta(minutes=5)
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(tmp_path), t2.isoformat()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().strip() == "HALF", proc.stderr.read()
        proc.kill()
    finally:
        proc.wait(timeout=10)
    assert proc.returncode != 0
    journal = Path(f"{path}-journal")
    assert journal.read_bytes()[:8] == bytes.fromhex("d9d505f920a163d7")  # hot journal left behind
    assert path.stat().st_size > size_before  # the killed transaction had written into the file
    # recover_archive rolls back a copy of the crashed state ...
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(path, copy / path.name)
    shutil.copy(journal, copy / journal.name)
    assert cc.recover_archive(copy / path.name) is True and not (copy / journal.name).exists()
    assert read_rows(copy, dt.datetime(2025, 8, 14, tzinfo=UTC), dt.datetime(2025, 8, 15, tzinfo=UTC)) == as_read(rows, T0)
    # ... and the pipeline's reader rolls the hot journal back itself and sees only complete snapshots
    got = read_rows(tmp_path, dt.datetime(2025, 8, 14, tzinfo=UTC), dt.datetime(2025, 8, 15, tzinfo=UTC))
    assert got == as_read(rows, T0)
    assert not journal.exists()
    assert cc.recover_archive(path) is False  # nothing left to recover
    cc.append_snapshot(tmp_path, cc.ads_to_rows(fixture_ads_old(), t2), t2)
    assert len(read_rows(tmp_path, T0, t2 + dt.timedelta(seconds=1))) == 2 * len(rows)


def test_writer_waits_for_a_reader_lock(tmp_path):
    rows = cc.ads_to_rows(fixture_ads_old(), T0)
    path = cc.append_snapshot(tmp_path, rows, T0)
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM gpu_state").fetchall()  # holds a SHARED lock
    timer = threading.Timer(0.5, lambda: (reader.execute("COMMIT"), reader.close()))
    timer.start()
    try:
        started = time.monotonic()
        t2 = T0 + dt.timedelta(minutes=5)
        cc.append_snapshot(tmp_path, cc.ads_to_rows(fixture_ads_old(), t2), t2, busy_timeout_s=10)
        assert time.monotonic() - started >= 0.3
    finally:
        timer.join()
    assert len(read_rows(tmp_path, T0, T0 + dt.timedelta(hours=1))) == 2 * len(rows)


# ------------------------------------------------------------------ collector


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hanging_collector():
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop, conns = threading.Event(), []

    def accept():
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except (TimeoutError, OSError):
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}", conns
    finally:
        stop.set()
        thread.join(timeout=5)
        for c in conns:
            c.close()
        srv.close()


def test_down_collector_raises_collector_error_at_once():
    host = f"127.0.0.1:{free_port()}"
    env_before = os.environ.get("_CONDOR_QUERY_TIMEOUT")
    started = time.monotonic()
    with pytest.raises(cc.CollectorError) as err:
        cc.query_collector(host, timeout_s=5)
    assert time.monotonic() - started < 4
    assert host in str(err.value) and "refused" in str(err.value)
    assert os.environ.get("_CONDOR_QUERY_TIMEOUT") == env_before
    with pytest.raises(cc.CollectorError, match="does not resolve"):
        cc.query_collector("no-such-collector.invalid", timeout_s=5)


def test_hanging_collector_times_out_within_the_configured_timeout(hanging_collector):
    host, conns = hanging_collector
    env_before = os.environ.get("_CONDOR_QUERY_TIMEOUT")
    started = time.monotonic()
    with pytest.raises(cc.CollectorError, match=r"no answer within") as err:
        cc.query_collector(host, timeout_s=2)
    elapsed = time.monotonic() - started
    assert 1.5 <= elapsed < 6, elapsed
    assert host in str(err.value)
    assert os.environ.get("_CONDOR_QUERY_TIMEOUT") == env_before
    # The bindings hold the GIL while waiting, so the accept thread may only run now.
    deadline = time.monotonic() + 2
    while not conns and time.monotonic() < deadline:
        time.sleep(0.05)
    assert conns, "the query never reached the hanging server"


def test_collect_loop_against_a_down_collector_counts_failures_and_writes_nothing(tmp_path):
    sleeps = []
    out = tmp_path / "archive"
    result = cc.collect_loop(f"127.0.0.1:{free_port()}", out, timeout_s=2, interval_s=300, iterations=3,
                             sleep=sleeps.append)
    assert (result.iterations, result.successes, result.failures) == (3, 0, 3)
    assert result.collector_failures == 3 and result.consecutive_failures == 3
    assert result.exit_code == cc.EXIT_COLLECTOR_DOWN
    assert len(sleeps) == 2 and all(0 < s <= 300 for s in sleeps)
    assert not out.exists()
    assert all("refused" in e for e in result.errors)


def test_collect_once_and_loop_with_an_injected_query(tmp_path):
    answers = [cc.CollectorError("collector c: boom"), fixture_ads_old(), fixture_ads_json()]
    clock = iter([T0, T0 + dt.timedelta(minutes=5)])

    def query(host, timeout_s, constraint):
        assert (host, timeout_s, constraint) == ("cm.example.edu", 20, cc.DEFAULT_CONSTRAINT)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    result = cc.collect_loop("cm.example.edu", tmp_path, iterations=3, interval_s=60, sleep=lambda s: None,
                             query=query, now=lambda: next(clock))
    assert (result.successes, result.failures, result.exit_code) == (2, 1, cc.EXIT_PARTIAL)
    last = result.last_result
    assert (last.rows, last.slots, last.skipped_ads, last.slots_without_gpus) == (12, 9, 1, 1)
    assert last.path == tmp_path / "gpu_state_2025-08.db" and last.snapshot_time == T0 + dt.timedelta(minutes=5)
    got = read_rows(tmp_path, T0, T0 + dt.timedelta(hours=1))
    assert got == as_read(EXPECTED, T0) + as_read(EXPECTED, T0 + dt.timedelta(minutes=5))

    once = cc.collect_once("cm.example.edu", tmp_path / "x", "Europe/Berlin",
                           query=lambda h, timeout_s, constraint: fixture_ads_old(), now=lambda: T0)
    assert once.rows == 12 and once.path.name == "gpu_state_2025-08.db"
    assert cc.exit_code_for(cc.CollectorError("x")) == cc.EXIT_COLLECTOR_DOWN
    assert cc.exit_code_for(cc.ArchiveWriteError("x")) == cc.EXIT_ARCHIVE_ERROR


def test_a_number_beyond_a_sqlite_integer_is_null_and_the_snapshot_is_kept(tmp_path):
    """One ad's ``Disk = 1.0e20`` (a real the ClassAd parser accepts) or a memory of -1e30: that
    value is null, the ad's row and the other ads' rows are appended, and the loop succeeds."""
    ads = [{"Name": "slot1_1@gpu01", "State": "Claimed", "AssignedGPUs": "GPU-aaaa1111", "Machine": "gpu01",
            "Disk": 1000, "GPUs_DeviceName": "H100", "GPUs_GlobalMemoryMb": 81559},
           {"Name": "slot1_1@gpu02", "State": "Unclaimed", "AssignedGPUs": "GPU-bbbb2222", "Machine": "gpu02",
            "Disk": 1.0e20, "GPUs_DeviceName": "H100", "GPUs_GlobalMemoryMb": -1e30}]
    result = cc.collect_loop("cm", tmp_path, iterations=2, sleep=lambda s: None,
                             query=lambda *a, **k: ads, now=lambda: T0)
    assert (result.successes, result.failures, result.exit_code) == (2, 0, 0)
    with sqlite3.connect(tmp_path / "gpu_state_2025-08.db") as con:
        got = con.execute("SELECT Name, Disk, GPUs_GlobalMemoryMb FROM gpu_state ORDER BY Name").fetchall()
    assert got == [("slot1_1@gpu01", 1000, 81559)] * 2 + [("slot1_1@gpu02", None, None)] * 2
    assert (cc._int(2**63 - 1), cc._int(-(2**63)), cc._int(2**63), cc._int(-1e19)) == (2**63 - 1, -(2**63), None, None)


def test_two_writers_of_one_pid_creating_the_month_keep_both_snapshots(tmp_path, monkeypatch):
    """Two writers with one PID (threads, or containers whose collector is PID 1 on a shared volume)
    create the month's file at once: each builds its own temp file (a name with the PID was shared:
    one removed the other's, and the archive held B's row twice and A's not at all)."""
    t0 = dt.datetime(2025, 12, 1, 0, 0, 1, tzinfo=UTC)
    a_written, b_written, a_linked = threading.Event(), threading.Event(), threading.Event()
    real_fsync = cc._fsync

    def fsync(path):  # A and B both build their file, then A links, then B
        who = threading.current_thread().name
        if who == "A" and path.name.startswith("."):
            a_written.set()
            b_written.wait(5)
        elif who == "A":
            a_linked.set()
        elif who == "B" and path.name.startswith("."):
            b_written.set()
            a_linked.wait(5)
        real_fsync(path)

    monkeypatch.setattr(cc, "_fsync", fsync)

    def write(who, at):
        if who == "B":
            a_written.wait(5)
        cc.append_snapshot(tmp_path, [{"Name": f"slot_{who}@h", "State": "Claimed", "AssignedGPUs": "GPU-aaaa1111"}], at)

    threads = [threading.Thread(target=write, args=(w, t0 + dt.timedelta(seconds=i)), name=w)
               for i, w in enumerate("AB")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with sqlite3.connect(tmp_path / "gpu_state_2025-12.db") as con:
        assert sorted(n for (n,) in con.execute("SELECT Name FROM gpu_state")) == ["slot_A@h", "slot_B@h"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("err", [errno.EROFS, errno.ENOSPC])
def test_a_folder_that_cannot_take_the_months_file_is_an_archive_error(tmp_path, monkeypatch, err):
    """The month's first snapshot in a read-only folder is an archive error that stops the loop
    (exit 4), not an OSError retried every cycle; a full disk is one a later cycle may get past."""
    def refuse(*args, **kwargs):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(cc, "new_file", refuse)
    with pytest.raises(cc.ArchiveWriteError, match="cannot create the month's archive") as exc:
        cc.append_snapshot(tmp_path, [{"Name": "slot1@h", "State": "Claimed", "AssignedGPUs": "GPU-aaaa1111"}], T0)
    assert exc.value.transient is (err == errno.ENOSPC)
    assert cc.exit_code_for(exc.value) == cc.EXIT_ARCHIVE_ERROR


def test_collect_loop_stops_on_a_permanent_archive_error(tmp_path):
    (tmp_path / "gpu_state_2025-08.parquet").write_bytes(b"PAR1")
    result = cc.collect_loop("cm", tmp_path, iterations=5, sleep=lambda s: None,
                             query=lambda h, timeout_s, constraint: fixture_ads_old(), now=lambda: T0)
    assert (result.iterations, result.failures, result.exit_code) == (1, 1, cc.EXIT_ARCHIVE_ERROR)
    assert "would hide its rows" in result.stopped_reason


def test_query_collector_projection_and_nested_device_follow_up(monkeypatch):
    import htcondor2

    slot = old_ad('Name = "slot1@mixed.example.edu"\nState = "Unclaimed"\n'
                  'AssignedGPUs = "GPU-c4a646d7,GPU-6a96bd13"\nAvailableGPUs = { GPUs_GPU_6a96bd13 }\n')
    nested = old_ad('Name = "slot1@mixed.example.edu"\n'
                    'GPUs_GPU_c4a646d7 = [ Id = "GPU-c4a646d7"; DeviceName = "Tesla V100-PCIE-16GB"; GlobalMemoryMb = 16160 ]\n'
                    'GPUs_GPU_6a96bd13 = [ Id = "GPU-6a96bd13"; DeviceName = "TITAN RTX"; GlobalMemoryMb = 24220 ]\n')
    calls = []

    class FakeCollector:
        def __init__(self, host):
            calls.append(("init", host, os.environ.get("_CONDOR_QUERY_TIMEOUT")))

        def query(self, ad_type, constraint=None, projection=None):
            calls.append((ad_type, constraint, projection))
            return [slot] if len(calls) == 2 else [nested]

    monkeypatch.setattr(htcondor2, "Collector", FakeCollector)
    ads = cc.query_collector("cm.example.edu:9618", timeout_s=7.5)
    assert calls[0] == ("init", "cm.example.edu:9618", "8")
    assert calls[1] == (htcondor2.AdType.Startd, "TotalGPUs > 0 || GPUs >= 1", cc.PROJECTION)
    assert calls[2][1] == 'Name == "slot1@mixed.example.edu"'
    assert set(calls[2][2]) >= {"Name", "GPUs_GPU_c4a646d7", "GPUs_GPU_6a96bd13"}
    rows = cc.ads_to_rows(ads, T0)
    assert [(r["AssignedGPUs"], r["GPUs_DeviceName"], r["GPUs_GlobalMemoryMb"]) for r in rows] == [
        ("GPU-c4a646d7", "Tesla V100-PCIE-16GB", 16160), ("GPU-6a96bd13", "TITAN RTX", 24220)]
    assert {"Name", "AssignedGPUs", "AvailableGPUs", "State", "Disk", "PreventJobsReason", "GPUs", "TotalGPUs",
            "SlotType", "PartitionableSlot", "DetectedGPUs"} <= set(cc.PROJECTION)


def test_an_archive_folder_the_file_system_refuses_to_look_at_stops_the_loop(tmp_path):
    """``Path.exists`` raises for a folder the collector may not enter (EACCES) or a name the file
    system refuses (here ENAMETOOLONG, which root meets too): that is an archive that cannot be
    written -- exit 4, the loop stopped at once -- not an unexpected error retried for ever with
    exit 1 ("some snapshot written") though nothing was."""
    out = tmp_path / ("x" * 300) / "archive"
    result = cc.collect_loop("cm.example.edu", out, iterations=3, interval_s=60, sleep=lambda s: None,
                             query=lambda host, timeout_s, constraint: fixture_ads_old(), now=lambda: T0)
    assert (result.successes, result.failures, result.iterations) == (0, 1, 1)
    assert result.exit_code == cc.EXIT_ARCHIVE_ERROR and "cannot look at the archive" in result.stopped_reason
    # an error of another kind in every iteration, nothing written: exit 5, not 1
    def broken(host, timeout_s, constraint):
        raise RuntimeError("a bug")

    result = cc.collect_loop("cm.example.edu", tmp_path / "ok", iterations=2, interval_s=60, sleep=lambda s: None,
                             query=broken, now=lambda: T0)
    assert (result.successes, result.failures, result.exit_code) == (0, 2, cc.EXIT_FAILED)


@pytest.mark.parametrize("room", [True, False])
def test_sqlite_unable_to_open_its_journal_on_a_full_file_system_is_retried(tmp_path, monkeypatch, room):
    """SQLite reports a journal it could not create as "unable to open database file": on a file
    system with no free inode (or an inode quota), where the journal's open failed with ENOSPC, that
    stopped the loop for good (exit 4 after one try) although a later cycle gets through; with room
    left it is a folder that refuses files, and stops the loop."""
    cc.append_snapshot(tmp_path, [{"Name": "slot1@h", "State": "Claimed", "AssignedGPUs": "GPU-aaaa1111"}], T0)
    real_connect, real_statvfs = sqlite3.connect, os.statvfs

    def connect(*args, **kwargs):
        con = real_connect(*args, **kwargs)

        class Refusing:  # the journal cannot be made: every write transaction fails as SQLite says then
            def execute(self, sql, *rest):
                if sql.strip().upper().startswith("BEGIN"):
                    raise sqlite3.OperationalError("unable to open database file")
                return con.execute(sql, *rest)

            def __getattr__(self, name):
                return getattr(con, name)

        return Refusing()

    class NoInodes:  # f_files inodes, none free
        def __init__(self, st, files):
            self.f_blocks, self.f_bavail, self.f_files, self.f_favail = st.f_blocks, st.f_bavail, files, 0

    monkeypatch.setattr(cc.sqlite3, "connect", connect)
    if not room:
        monkeypatch.setattr(os, "statvfs", lambda p: NoInodes(real_statvfs(p), 1000))
    else:  # a file system that keeps no inode count (btrfs, vfat, FUSE: 0 of 0) has room
        monkeypatch.setattr(os, "statvfs", lambda p: NoInodes(real_statvfs(p), 0))
    result = cc.collect_loop("cm", tmp_path, iterations=3, sleep=lambda s: None,
                             query=lambda h, timeout_s, constraint: fixture_ads_old(),
                             now=lambda: T0 + dt.timedelta(minutes=5))
    if room:
        assert (result.iterations, result.failures) == (1, 1) and "unable to open" in result.stopped_reason
    else:
        assert (result.iterations, result.failures, result.stopped_reason) == (3, 3, None)
    assert result.exit_code == cc.EXIT_ARCHIVE_ERROR


# ------------------------------------------------------------------ saved dumps into the archive


@pytest.mark.parametrize("name", ["startd_gpu_slots.long.txt", "startd_gpu_slots.json"])
def test_a_saved_condor_status_dump_is_appended_as_one_snapshot_through_the_cli(tmp_path, name):
    """An operator's dumps taken before the collector ran (`condor_status -long` / `-json`) go into the
    monthly archive with `collect condor --from-file`, at their modification time or the time given,
    and read back as the live collector's snapshot of the same ads does."""
    import os

    from gpu_pipeline import cli

    dump = tmp_path / name
    dump.write_bytes((FIXTURES / name).read_bytes())
    t_mtime = dt.datetime(2025, 8, 5, 10, 0, 7, tzinfo=UTC)
    os.utime(dump, (t_mtime.timestamp(), t_mtime.timestamp()))
    archive = tmp_path / "archive"
    assert cli.main(["collect", "condor", "--from-file", str(dump), "--out", str(archive),
                     "--archive-tz", "America/Chicago"]) == 0
    at = dt.datetime(2025, 8, 5, 10, 5, 7, tzinfo=UTC)
    assert cli.main(["collect", "condor", "--from-file", str(dump), "--out", str(archive), "--archive-tz",
                     "America/Chicago", "--snapshot-time", at.isoformat()]) == 0
    read = read_window(archive, dt.datetime(2025, 8, 5, tzinfo=UTC), dt.datetime(2025, 8, 6, tzinfo=UTC),
                       "America/Chicago")
    times = sorted(set(read.table.column("snapshot_utc").to_pylist()))
    assert times == [t_mtime, at]
    first = [r for r in read.table.to_pylist() if r["snapshot_utc"] == t_mtime]
    assert sorted((r["Name"], r["AssignedGPUs"], r["State"]) for r in first) == sorted(
        (r["Name"], r["AssignedGPUs"], r["State"]) for r in EXPECTED)
    # a file that holds no slot ad, a naive time: refused, naming the file or the option; nothing appended
    junk = tmp_path / "notes.txt"
    junk.write_text("MyType = \"Machine\"\n")
    assert cli.main(["collect", "condor", "--from-file", str(junk), "--out", str(archive), "--archive-tz", "UTC"]) == 1
    assert cli.main(["collect", "condor", "--from-file", str(dump), "--out", str(archive), "--archive-tz", "UTC",
                     "--snapshot-time", "2025-08-05T10:10:00"]) == 2
    assert cli.main(["collect", "condor", "--out", str(archive), "--archive-tz", "UTC"]) == 2
    assert cli.main(["collect", "condor", "--collector", "cm", "--from-file", str(dump), "--out", str(archive)]) == 2
    # the same dump again (twice in one call, or a second run): refused, the archive holds that snapshot
    assert cli.main(["collect", "condor", "--from-file", str(dump), "--from-file", str(dump), "--out", str(archive),
                     "--archive-tz", "America/Chicago"]) == 1
    read = read_window(archive, dt.datetime(2025, 8, 5, tzinfo=UTC), dt.datetime(2025, 8, 6, tzinfo=UTC),
                       "America/Chicago")
    assert len(set(read.table.column("snapshot_utc").to_pylist())) == 2
    assert read.table.num_rows == 2 * len(EXPECTED)


def test_a_dump_is_taken_at_its_ads_time_not_its_copys(tmp_path):
    """`condor_status -long` prints each ad's LastHeardFrom / MyCurrentTime: a dump copied without its
    modification time (a copy's is today) is still the snapshot of when the collector answered."""
    from gpu_pipeline.lib.condor_collector import import_dump

    taken = dt.datetime(2025, 8, 5, 10, 0, 7, tzinfo=UTC)
    text = (FIXTURES / "startd_gpu_slots.long.txt").read_text()
    blocks = [b for b in re.split(r"\n\s*\n", text) if b.strip()]
    dump = tmp_path / "status.txt"
    dump.write_text("\n\n".join(f"{b}\nLastHeardFrom = {int(taken.timestamp()) - i}\n"
                                  f"MyCurrentTime = {int(taken.timestamp()) - i}" for i, b in enumerate(blocks)) + "\n")
    r = import_dump(dump, tmp_path / "archive", "UTC")
    assert r.snapshot_time == taken and r.path.name == "gpu_state_2025-08.db"
    # LastHeardFrom is the collector's clock: a startd's MyCurrentTime a year ahead does not move it
    skewed = tmp_path / "skewed.txt"
    later = dt.datetime(2025, 8, 5, 10, 5, 7, tzinfo=UTC)
    skewed.write_text("\n\n".join(f"{b}\nLastHeardFrom = {int(later.timestamp())}\n"
                                    f"MyCurrentTime = {int(later.timestamp()) + 365 * 86400 * (i == 0)}"
                                    for i, b in enumerate(blocks)) + "\n")
    assert import_dump(skewed, tmp_path / "archive", "UTC").snapshot_time == later
    # an archive file that is no database: an error naming it, exit 4 from the CLI (was a traceback)
    from gpu_pipeline import cli

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "gpu_state_2025-08.db").write_bytes(b"not a database" * 100)
    assert cli.main(["collect", "condor", "--from-file", str(dump), "--out", str(bad), "--archive-tz", "UTC"]) == 4
