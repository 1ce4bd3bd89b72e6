import datetime as dt

import pyarrow as pa

from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, RAW_CONDOR_SLOT_SNAPSHOTS, conform
from gpu_pipeline.lib.slots import clean_slot_rows, normalize_gpu_id

T = dt.datetime(2025, 8, 6, 0, 0, 5, tzinfo=dt.UTC)


def raw(rows):
    base = {"snapshot_utc": T, "timestamp_local": "x", "source_file": "f.db"}
    return conform(pa.Table.from_pylist([{**base, "source_rowid": i, **r} for i, r in enumerate(rows)]),
                   RAW_CONDOR_SLOT_SNAPSHOTS)


def test_normalize_gpu_id_spellings():
    assert normalize_gpu_id("GPU-0667CE7C") == "GPU-0667ce7c"
    assert normalize_gpu_id("GPUs_GPU_b156e653") == "GPU-b156e653"
    assert normalize_gpu_id("GPU-b156e653-784d-a422-e6df-726e913aa35d") == "GPU-b156e653"
    assert normalize_gpu_id(" MIG-4f2b6d2e-1c3a-5e7f-9a0b-123456789abc ") == "MIG-4f2b6d2e-1c3a-5e7f-9a0b-123456789abc"
    assert normalize_gpu_id("GPU-MIG-abc") == "GPU-MIG-abc"
    assert normalize_gpu_id("") is None and normalize_gpu_id(None) is None


def test_tiers_hosts_exclusions_quarantine_and_duplicates():
    rows = [
        {"Name": "slot1_1@gpu01", "AssignedGPUs": "GPU-aaaaaaaa", "State": "Claimed",
         "PrioritizedProjects": "ChemLab", "Machine": "gpu01.example.edu", "GPUsAverageUsage": 0.5},
        {"Name": "backfill2_1@gpu01", "AssignedGPUs": "GPU-aaaaaaaa", "State": "Claimed",
         "PrioritizedProjects": "ChemLab", "Machine": "gpu01.example.edu"},
        {"Name": "slot1_Backfill@gpu02", "AssignedGPUs": "GPU-bbbbbbbb", "State": "Unclaimed",
         "PrioritizedProjects": "", "Machine": None},
        {"Name": "slot1@gpu03", "AssignedGPUs": "GPU-cccccccc", "State": "Unclaimed",
         "PrioritizedProjects": None, "Machine": "gpu03"},
        # exact duplicate of the previous row (snapshot written twice)
        {"Name": "slot1@gpu03", "AssignedGPUs": "GPU-cccccccc", "State": "Unclaimed",
         "PrioritizedProjects": None, "Machine": "gpu03"},
        {"Name": "slot1@login-gpu1", "AssignedGPUs": "GPU-dddddddd", "State": "Unclaimed", "Machine": "login-gpu1"},
        {"Name": "slot1@gpu04", "AssignedGPUs": None, "State": "Unclaimed", "Machine": "gpu04"},
        {"Name": "slot1@gpu05", "AssignedGPUs": "GPU-eeeeeeee", "State": None, "Machine": "gpu05"},
    ]
    res = clean_slot_rows(raw(rows), excluded_hosts=["login-*"])
    t = res.table
    assert t.schema == CLEAN_SLOT_SNAPSHOTS.schema
    got = {(r["slot_name"], r["gpu_id"]): (r["tier"], r["host"]) for r in t.to_pylist()}
    assert got == {
        ("backfill2_1@gpu01", "GPU-aaaaaaaa"): ("backfill", "gpu01.example.edu"),
        ("slot1_1@gpu01", "GPU-aaaaaaaa"): ("priority", "gpu01.example.edu"),
        ("slot1_Backfill@gpu02", "GPU-bbbbbbbb"): ("backfill", "gpu02"),
        ("slot1@gpu03", "GPU-cccccccc"): ("shared", "gpu03"),
    }
    assert t.filter(pa.compute.equal(t.column("slot_name"), "slot1_1@gpu01")).column("gpu_usage_pct").to_pylist() == [50.0]
    assert res.excluded_by_host == {"login-gpu1": 1}
    assert res.duplicates_dropped == 1
    assert res.quarantined_by_reason == {"missing State": 1, "no GPU id in AssignedGPUs": 1}
    q = res.quarantine.to_pylist()
    assert {r["source_row"] for r in q} == {6, 7} and all(r["source_file"] == "f.db" for r in q)
    assert res.rows_in == len(rows)
    # every input row is accounted for
    assert t.num_rows + res.duplicates_dropped + len(q) + 1 == len(rows)
