import datetime as dt

import pyarrow as pa
import pytest

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
    # the ClassAd reference form of a MIG device (AvailableGPUs, copied into backfill rows): its id, as
    # the collector, the job ads and NVML give it (the underscores were kept, so it matched none of them)
    assert normalize_gpu_id("GPUs_MIG_0caf1ce3_fcd4_59da_8564_764000e3ace9") == "MIG-0caf1ce3-fcd4-59da-8564-764000e3ace9"
    assert normalize_gpu_id("{GPUs_GPU_MIG_3167}") == "GPU-MIG-3167"
    from gpu_pipeline.lib.condor_collector import normalize_gpu_id as collector_id

    for ref in ("GPUs_MIG_0caf1ce3_fcd4_59da_8564_764000e3ace9", "GPUs_GPU_MIG_3167", "GPUs_GPU_b156e653"):
        assert normalize_gpu_id(ref) == collector_id(ref)
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


def _many_snapshots(n_snaps=12, hosts=4, slots_per_host=3, seed=7):
    """Raw rows of ``n_snaps`` snapshots in snapshot order, slots shuffled within each snapshot, with
    exact copies of some rows (a snapshot written twice) and, in one snapshot, a second row of the same
    (slot, GPU) that differs (a key repeated with other values)."""
    import random

    rng = random.Random(seed)
    rows, copies = [], 0
    for k in range(n_snaps):
        t = T + dt.timedelta(minutes=5 * k)
        snap = []
        for h in range(hosts):
            for s in range(slots_per_host):
                snap.append({"snapshot_utc": t, "Name": f"slot1_{s}@gpu{h:02d}", "Machine": f"gpu{h:02d}",
                             "AssignedGPUs": f"GPU-{h:02d}{s:02d}abcd", "State": rng.choice(["Claimed", "Unclaimed"]),
                             "PrioritizedProjects": "Lab" if h == 0 else "", "GPUsAverageUsage": rng.random()})
        if k % 4 == 1:  # exact copies
            snap += [dict(r) for r in snap[:2]]
            copies += 2
        rng.shuffle(snap)
        rows += snap
    differing = dict(rows[-1], State="Drained")  # same key as the last row, other state
    rows.append(differing)
    base = {"timestamp_local": "x", "source_file": "f.db"}
    table = conform(pa.Table.from_pylist([{**base, "source_rowid": i, **r} for i, r in enumerate(rows)]),
                    RAW_CONDOR_SLOT_SNAPSHOTS)
    return table, copies


def test_cleaning_in_chunks_streams_the_same_table_as_in_one_piece():
    raw_rows, copies = _many_snapshots()
    whole = clean_slot_rows(raw_rows, batch_rows=10**9)
    batches = []
    streamed = clean_slot_rows(raw_rows, batch_rows=7, sink=lambda it: batches.extend(it) or "done")
    assert streamed.table is None and streamed.written == "done"
    assert len(batches) > 5 and max(b.num_rows for b in batches) <= 7 + 12  # chunks end at a snapshot
    assert pa.Table.from_batches(batches).equals(whole.table)
    t = whole.table.to_pandas()
    # sorted on (snapshot, host, slot name, GPU), exact copies dropped, the differing row kept
    assert t.equals(t.sort_values(["snapshot_utc", "host", "slot_name", "gpu_id"], kind="stable"))
    for res in (whole, streamed):
        assert res.duplicates_dropped == copies
        assert res.rows_out == raw_rows.num_rows - copies == whole.table.num_rows
        assert res.duplicate_keys == 1
        assert res.gpus == 12
    repeated = t[t.duplicated(["snapshot_utc", "slot_name", "gpu_id"], keep=False)]
    assert sorted(repeated["slot_state"]) == sorted(raw_rows.column("State").to_pylist()[-2:])
    assert "Drained" in set(repeated["slot_state"]) and len(repeated) == 2


def test_rows_out_of_snapshot_order_are_cleaned_in_one_piece_with_the_same_result():
    raw_rows, copies = _many_snapshots()
    shuffled = raw_rows.take(pa.array(list(range(raw_rows.num_rows))[::-1]))
    a = clean_slot_rows(raw_rows, batch_rows=7).table
    b = clean_slot_rows(shuffled, batch_rows=7).table
    assert a.equals(b)


def test_chunks_never_split_a_snapshot():
    from gpu_pipeline.lib.slots import _chunks

    ts = pa.chunked_array([pa.array([T + dt.timedelta(minutes=m) for m in [0, 0, 0, 1, 1, 2, 2, 2, 2, 3]],
                                    pa.timestamp("us", tz="UTC"))])
    assert [c[:2] for c in _chunks(ts, 4, set())] == [(0, 3), (3, 5), (5, 9), (9, 10)]
    assert [c[:2] for c in _chunks(ts, 100, set())] == [(0, 10)]
    assert [c[:2] for c in _chunks(ts, 1, set())] == [(0, 3), (3, 5), (5, 9), (9, 10)]
    out_of_order = ts.take(pa.array([3, 0, 1, 2, 4, 5, 6, 7, 8, 9]))
    assert [c[:2] for c in _chunks(out_of_order, 4, set())] == [(0, 10)]  # not in order
    assert _chunks(ts.slice(0, 0), 4, set()) == []
    # the chunks holding a snapshot with a repeated key are marked for the exact (DISTINCT) path
    minute2 = int(pa.scalar(T + dt.timedelta(minutes=2), pa.timestamp("us", tz="UTC")).cast(pa.int64()).as_py())
    assert [c[2] for c in _chunks(ts, 4, {minute2})] == [False, False, True, False]
    assert [c[2] for c in _chunks(out_of_order, 4, {minute2})] == [True]
    assert [c[2] for c in _chunks(ts, 4, set())] == [False] * 4


_RESULT_FIELDS = ("rows_in", "rows_out", "gpus", "duplicate_keys", "excluded_by_host", "duplicates_dropped",
                  "quarantined_by_reason", "usage_out_of_range_nulled")


#: GPU ids of the quirky rows that every rule keeps
_PLAIN_IDS = ("GPU-aaaa0001", "GPU-0667CE7C", "GPUs_GPU_b156e653")


def _quirky_rows(seed, n=400, repeat_key=False):
    """Raw rows with every spelling the rules treat differently: names with spaces and odd cases of
    'backfill', no '@', missing Machine, GPU ids in each form, MIG ids, replacement characters,
    blank and null text, memory halves, usage outside 0..1 and NaN, snapshots out of order, one slot
    name on two hosts. Each (snapshot, slot name, GPU) once unless ``repeat_key``."""
    import random

    rng = random.Random(seed)
    names = ["slot1_1@gpu01", " slot1_2@gpu01 ", "backfill1_1@gpu02", "slot1_BackFill@gpu03", "BACKFİLL@gpu04",
             "slot1@gpu05", "noat", "", None, "slot1_1@gpu\ufffd6", "slot1_9@gpu07", "   "]
    machines = {"slot1_9@gpu07": ["gpu07", "gpu07b"]}  # one slot name on two hosts
    gpus = ["GPU-0667CE7C", "GPUs_GPU_b156e653", "GPU-b156e653-784d-a422-e6df-726e913aa35d", "GPU-aaaa0001",
            "MIG-4f2b6d2e-1c3a-5e7f-9a0b-123456789abc", "GPU-MIG-abc", " GPU-cccc0002 ", "", None, "GPU-\ufffd",
            "GPU-aaaa0001,GPU-cccc0002", "GPU-aaaa0001, GPU-cccc0002", "GPU-dddd0003,", ",", "GPU-aaaa0001,,"]
    rows, seen = [], set()
    snaps = [T + dt.timedelta(minutes=5 * k) for k in range(6)]
    while len(rows) < n:
        name, gpu, snap = rng.choice(names), rng.choice(gpus), rng.choice(snaps)
        machine = rng.choice(machines.get(name, [None, "", "gpu09", " gpu10 ", "login-gpu1"]))
        key = (snap, (name or "").strip(" "), normalize_gpu_id(gpu))
        if key in seen:
            continue
        seen.add(key)
        rows.append({
            "snapshot_utc": snap, "Name": name, "Machine": machine, "AssignedGPUs": gpu,
            "State": rng.choice(["Claimed", " Unclaimed ", "", None, "Owner", "Drain\ufffd", "  "]),
            "PrioritizedProjects": rng.choice(["", "  ", None, "ChemLab", " Lab "]),
            "GPUs_DeviceName": rng.choice(["NVIDIA A100", " H100 ", "", None]),
            "GPUs_GlobalMemoryMb": rng.choice([81920.0, 0.5, 2.5, -0.5, -2.5, 1.4999999999999998, None, 0.49999999999999994]),
            "GPUsAverageUsage": rng.choice([0.0, 1.0, 0.25, -0.1, 1.5, None, float("nan"), -0.0]),
            "RemoteOwner": rng.choice(["alice", " bob ", " ", "", None]),
            "GlobalJobId": rng.choice(["sched#1.0#1", " sched#2.0#2", "", None]),
            "PreventJobsReason": rng.choice([None, "", "draining ", "x"]),
        })
    if repeat_key:
        rows.append(dict(next(r for r in rows if r["Name"] == "slot1_1@gpu01" and r["AssignedGPUs"] in _PLAIN_IDS
                               and r["State"] == "Claimed"), State="Owner"))
    base = {"timestamp_local": "x", "source_file": "f.db"}
    return conform(pa.Table.from_pylist([{**base, "source_rowid": i, **r} for i, r in enumerate(rows)]),
                   RAW_CONDOR_SLOT_SNAPSHOTS)


def _dictionary_read(table):
    """The raw rows as the asset reads them: the repetitive text dictionary-encoded, in several chunks."""
    from gpu_pipeline.lib.slots import DICTIONARY_COLUMNS

    cut = table.num_rows // 3
    table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    for c in DICTIONARY_COLUMNS:
        i = table.schema.get_field_index(c)
        table = table.set_column(i, c, pa.chunked_array([pa.compute.dictionary_encode(ch) for ch in table.column(c).chunks]))
    return table


def test_columnar_cleaning_gives_the_sql_path_s_table_and_counts():
    from gpu_pipeline.lib.slots import _columnar

    for seed in range(6):
        raw_rows = _quirky_rows(seed)
        for table in (raw_rows, _dictionary_read(raw_rows)):
            assert _columnar(table, ["login-*"]) is not None  # the columnar path decides these
            a = clean_slot_rows(table, excluded_hosts=["login-*"], batch_rows=50)
            b = clean_slot_rows(table, excluded_hosts=["login-*"], batch_rows=50, columnar=False)
            assert a.table.equals(b.table), seed
            assert a.quarantine.equals(b.quarantine), seed
            for f in _RESULT_FIELDS:
                assert getattr(a, f) == getattr(b, f), (seed, f)
            assert a.rows_out > 50 and a.quarantine.num_rows > 10 and a.excluded_by_host
            assert a.usage_out_of_range_nulled > 0 and "non-UTF-8 bytes in Name" in a.quarantined_by_reason
            assert {"several GPU ids in AssignedGPUs (a row is one slot and one GPU)", "missing State",
                    "missing slot Name"} <= set(a.quarantined_by_reason)
            assert not {"", None} & set(a.table.column("slot_state").to_pylist())
            mem = a.table.column("gpu_memory_mib").to_pylist()
            assert {1, 3, -1, -3, 0}.issuperset({m for m in mem if m is not None and abs(m) < 10})
            assert {1, 3, -3}.issubset(set(mem))  # halves away from zero


def test_columnar_cleaning_streams_its_batches_from_a_thread_of_their_own_into_the_sink(monkeypatch):
    """The sink writes one batch while the next one's columns are taken on another thread: the same
    table as in one piece, in order; an error there reaches the caller."""
    import threading

    from gpu_pipeline.lib import slots

    raw_rows = _quirky_rows(1)
    whole = clean_slot_rows(raw_rows, excluded_hosts=["login-*"], batch_rows=10**9)
    made_in: list[str] = []
    batches_of = slots._Columnar.batches

    def recording(self, batch_rows):
        for batch in batches_of(self, batch_rows):
            made_in.append(threading.current_thread().name)
            yield batch

    monkeypatch.setattr(slots._Columnar, "batches", recording)
    got: list[pa.RecordBatch] = []
    streamed = clean_slot_rows(raw_rows, excluded_hosts=["login-*"], batch_rows=20,
                               sink=lambda it: got.extend(it) or "written")
    assert streamed.written == "written" and len(got) > 3
    assert pa.Table.from_batches(got).equals(whole.table)
    assert set(made_in) == {"slot-clean"}

    def failing(self, batch_rows):
        yield from batches_of(self, batch_rows)
        raise OSError("disk gone")

    monkeypatch.setattr(slots._Columnar, "batches", failing)
    with pytest.raises(OSError, match="disk gone"):
        clean_slot_rows(raw_rows, excluded_hosts=["login-*"], batch_rows=20, sink=lambda it: list(it))


def test_what_the_columnar_path_leaves_to_sql_gives_the_same_result():
    from gpu_pipeline.lib.slots import _columnar

    repeated = _quirky_rows(1, repeat_key=True)  # a key repeated with another State: both rows kept
    assert _columnar(repeated, []) is None
    res = clean_slot_rows(repeated)
    assert res.duplicate_keys == 1 and res.rows_out == clean_slot_rows(_quirky_rows(1)).rows_out + 1
    not_castable = _quirky_rows(2)
    i = next(i for i, r in enumerate(not_castable.to_pylist()) if r["Name"] == "slot1_1@gpu01" and r["State"] == "Claimed"
             and r["AssignedGPUs"] in _PLAIN_IDS)
    memory = not_castable.column("GPUs_GlobalMemoryMb").to_pylist()
    memory[i] = float("inf")
    not_castable = not_castable.set_column(not_castable.schema.get_field_index("GPUs_GlobalMemoryMb"),
                                           "GPUs_GlobalMemoryMb", pa.array(memory, pa.float64()))
    assert _columnar(not_castable, []) is None  # SQL's CAST decides (it raises, naming the value)
    import duckdb
    import pytest

    with pytest.raises(duckdb.Error):
        clean_slot_rows(not_castable)


def test_a_row_naming_several_gpus_or_a_blank_state_is_quarantined_not_a_phantom_gpu():
    """A row whose AssignedGPUs is a list (a collector that did not explode it) was a GPU named
    ``GPU-aaaaaaaa,GPU-bbbbbbbb``; a State of spaces was a slot in state ''. Both are set aside with
    their reason, on both cleaning paths."""
    rows = [{"snapshot_utc": T, "Name": "slot1_1@gpu01", "Machine": "gpu01", "AssignedGPUs": gpus, "State": state,
             "PrioritizedProjects": "", "GPUs_DeviceName": "NVIDIA A100", "timestamp_local": "x",
             "source_file": "f.db", "source_rowid": i}
            for i, (gpus, state) in enumerate([("GPU-aaaaaaaa", "Claimed"), ("GPU-aaaaaaaa,GPU-bbbbbbbb", "Claimed"),
                                               ("GPU-cccccccc", "   ")])]
    raw = conform(pa.Table.from_pylist(rows), RAW_CONDOR_SLOT_SNAPSHOTS)
    for columnar in (True, False):
        r = clean_slot_rows(raw, columnar=columnar)
        assert r.table.column("gpu_id").to_pylist() == ["GPU-aaaaaaaa"], columnar
        assert r.gpus == 1
        assert r.quarantined_by_reason == {"several GPU ids in AssignedGPUs (a row is one slot and one GPU)": 1,
                                           "missing State": 1}, columnar
    assert normalize_gpu_id("GPU-aaaaaaaa, GPU-bbbbbbbb") is None
    assert normalize_gpu_id("GPU-AAAAAAAA,") == normalize_gpu_id(" ,GPU-aaaaaaaa ") == "GPU-aaaaaaaa"
    assert normalize_gpu_id("{GPU-aaaaaaaa},") == normalize_gpu_id("GPU-aaaaaaaa, ,") == "GPU-aaaaaaaa"
    assert normalize_gpu_id("{ GPUs_GPU_aaaaaaaa, GPUs_GPU_bbbbbbbb }") is None
    assert normalize_gpu_id(" , ") is None
