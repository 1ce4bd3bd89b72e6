"""clean_samples: range quarantine, duplicate keys, output order; and the sort helper it uses."""

import collections
import datetime as dt
import hashlib
import json
import math
import re
import threading
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from gpu_pipeline.lib import samples as samples_module
from gpu_pipeline.lib.coverage import COVERAGE_NOTE
from gpu_pipeline.lib.samples import (
    CLEAN_CHECK_NOTE,
    RANGES,
    RAW_ORDER,
    _out_of_order,
    clean_samples,
    write_clean_samples,
    write_sorted_raw,
)
from gpu_pipeline.lib.schemas import (
    GPU_SAMPLES,
    QUARANTINE_GPU_SAMPLES,
    RAW_GPU_TELEMETRY,
    conform,
    sorted_rows,
)
from gpu_pipeline.lib.spill import TimeSlabSorter
from gpu_pipeline.lib.store import Store, parquet_bytes

T0 = dt.datetime(2025, 8, 4, 12, 0, tzinfo=dt.UTC)


def raw(rows: list[dict]) -> pa.Table:
    base = {"source": "dcgm", "host": "h1", "gpu_id": "GPU-aaaaaaaa", "util_pct": 50.0, "power_w": 100.0,
            "source_file": "dcgm/h1/dcgm-2025-08-04.prom"}
    return conform(pa.Table.from_pylist([{**base, **r} for r in rows]), RAW_GPU_TELEMETRY)


def test_out_of_range_values_are_quarantined_with_the_column_and_the_allowed_range():
    t = raw([
        {"sample_utc": T0, "util_pct": 101.0},
        {"sample_utc": T0 + dt.timedelta(seconds=30), "util_pct": float("nan"), "power_w": -1.0},
        {"sample_utc": T0 + dt.timedelta(seconds=60), "util_pct": None},  # null is no violation
        {"sample_utc": T0 + dt.timedelta(seconds=90), "util_pct": 100.0},  # the bound is inclusive
    ])
    out = clean_samples(t)
    assert out.table.num_rows == 2
    assert out.table["util_pct"].to_pylist() == [None, 100.0]
    assert out.quarantined_by_reason == {"power_w out of range": 1, "util_pct out of range": 2}
    reasons = out.quarantine["reason"].to_pylist()
    assert reasons[0] == "value out of range: util_pct=101.0 (allowed 0..100)"
    assert reasons[1] == "value out of range: util_pct=nan (allowed 0..100), power_w=-1.0 (allowed 0..None)"
    assert out.quarantine["source_file"].to_pylist() == ["dcgm/h1/dcgm-2025-08-04.prom"] * 2
    assert json.loads(out.quarantine["row_json"][0].as_py())["util_pct"] == 101.0


def test_a_repeated_key_keeps_the_row_of_the_first_source_file_nulls_last():
    t = raw([
        {"sample_utc": T0, "util_pct": 3.0, "source_file": None},
        {"sample_utc": T0, "util_pct": 2.0, "source_file": "b.prom"},
        {"sample_utc": T0, "util_pct": 1.0, "source_file": "a.prom"},
        {"sample_utc": T0, "util_pct": 9.0, "source": "nvidia-smi"},  # another source: another key
    ])
    out = clean_samples(t)
    assert out.duplicates_dropped == 2
    assert out.table["source"].to_pylist() == ["dcgm", "nvidia-smi"]
    assert out.table["util_pct"].to_pylist() == [1.0, 9.0]
    assert out.table["source_file"][0].as_py() == "a.prom"


def test_a_quarantined_first_row_still_takes_its_key_and_is_not_counted_as_a_duplicate():
    t = raw([
        {"sample_utc": T0, "util_pct": 500.0, "source_file": "a.prom"},
        {"sample_utc": T0, "util_pct": 5.0, "source_file": "b.prom"},
        {"sample_utc": T0, "util_pct": 700.0, "source_file": "c.prom"},
    ])
    out = clean_samples(t)
    assert out.table.num_rows == 0
    assert out.duplicates_dropped == 1
    assert out.quarantined_by_reason == {"util_pct out of range": 2}


def test_output_is_sorted_on_time_host_gpu_source_with_null_hosts_one_key_and_last():
    t = raw([
        {"sample_utc": T0 + dt.timedelta(seconds=30), "host": "h0"},
        {"sample_utc": T0, "host": None, "util_pct": 1.0},
        {"sample_utc": T0, "host": "h2"},
        {"sample_utc": T0, "host": None, "util_pct": 2.0, "source_file": "z.prom"},
        {"sample_utc": T0, "host": "h1", "gpu_id": "GPU-bbbbbbbb"},
        {"sample_utc": T0, "host": "h1"},
    ])
    out = clean_samples(t)
    got = [(r["sample_utc"], r["host"], r["gpu_id"]) for r in out.table.select(["sample_utc", "host", "gpu_id"])
           .to_pylist()]
    assert got == [(T0, "h1", "GPU-aaaaaaaa"), (T0, "h1", "GPU-bbbbbbbb"), (T0, "h2", "GPU-aaaaaaaa"),
                   (T0, None, "GPU-aaaaaaaa"), (T0 + dt.timedelta(seconds=30), "h0", "GPU-aaaaaaaa")]
    assert out.duplicates_dropped == 1
    assert out.table.filter(pc.is_null(out.table["host"]))["util_pct"].to_pylist() == [1.0]
    assert out.table.schema == GPU_SAMPLES.schema


# The same rules as one SQL query (a window over the key, ranked by source_file NULLS LAST): the
# formulation the Arrow implementation replaced, kept here as an independent oracle; ties (equal
# source_file) go to the earlier input row, as the stable sort gives them.
def _sql_oracle(t: pa.Table) -> tuple[pa.Table, int, dict[str, int]]:
    checks = []
    for col, (lo, hi) in RANGES.items():
        conds = [f"NOT isfinite({col})"] + ([f"{col} < {lo}"] if lo is not None else []) + (
            [f"{col} > {hi}"] if hi is not None else [])
        checks.append(f"CASE WHEN {col} IS NOT NULL AND ({' OR '.join(conds)}) THEN '{col}' END")
    con = duckdb.connect()
    con.register("t", t.append_column("input_row", pa.array(np.arange(t.num_rows))))
    checked = con.sql(f"""
        SELECT * EXCLUDE (input_row), concat_ws(',', {', '.join(checks)}) AS bad,
               row_number() OVER (PARTITION BY sample_utc, source, host, gpu_id
                                  ORDER BY source_file NULLS LAST, input_row) AS dup
        FROM t""").to_arrow_table()
    bad = np.array([b != "" for b in checked["bad"].to_pylist()])
    dup = np.array(checked["dup"].to_pylist()) > 1
    good = checked.filter(pa.array(~bad & ~dup)).drop_columns(["bad", "dup"])
    good = good.sort_by([(c, "ascending") for c in ("sample_utc", "host", "gpu_id", "source")])
    reasons: dict[str, int] = {}
    for b in checked["bad"].to_pylist():
        for c in filter(None, b.split(",")):
            reasons[f"{c} out of range"] = reasons.get(f"{c} out of range", 0) + 1
    return conform(good, GPU_SAMPLES), int((dup & ~bad).sum()), dict(sorted(reasons.items()))


def faulty_rows(seed: int, n: int = 4000) -> pa.Table:
    """Shuffled rows with repeated keys (across source files, null files included), null hosts and
    out-of-range values."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        rows.append({
            "sample_utc": T0 + dt.timedelta(seconds=30 * int(rng.integers(0, 40))),
            "host": None if rng.random() < 0.05 else f"h{rng.integers(0, 5)}",
            "gpu_id": f"GPU-{rng.integers(0, 4):08x}",
            "source": ["dcgm", "nvidia-smi"][int(rng.integers(0, 2))],
            "util_pct": [float(rng.uniform(0, 100)), 150.0, float("nan"), None][int(rng.choice(4, p=[.9, .04, .03, .03]))],
            "power_w": [float(rng.uniform(-5, 300)), float("inf"), float("-inf")][
                int(rng.choice(3, p=[.96, .02, .02]))],
            "source_file": None if rng.random() < 0.2 else f"f{rng.integers(0, 50)}.prom",
        })
    return raw(rows)


def test_an_infinite_value_is_quarantined_where_its_range_is_open():
    # nvidia-smi prints "inf W" for a value it cannot represent; power has no upper bound, and an
    # infinite power read as a value made the hour's power, PIF and energy infinite downstream
    t = raw([
        {"sample_utc": T0, "host": "h1", "power_w": float("inf"), "energy_mj": 1e9},
        {"sample_utc": T0, "host": "h2", "power_w": 250.0, "energy_mj": float("inf")},
        {"sample_utc": T0, "host": "h3", "power_w": 250.0, "energy_mj": 1e9},
    ])
    out = clean_samples(t)
    assert out.table["host"].to_pylist() == ["h3"]
    assert out.quarantined_by_reason == {"energy_mj out of range": 1, "power_w out of range": 1}


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_the_sql_formulation_on_shuffled_rows_with_faults(seed):
    t = faulty_rows(seed)
    out = clean_samples(t)
    table, dups, reasons = _sql_oracle(t)
    assert out.table.equals(table)
    assert out.duplicates_dropped == dups > 0
    assert out.quarantined_by_reason == reasons
    assert out.quarantine.num_rows == sum(1 for r in t.to_pylist()
                                          if any(r[c] is not None and not (
                                              math.isfinite(r[c])
                                              and (RANGES[c][0] is None or r[c] >= RANGES[c][0])
                                              and (RANGES[c][1] is None or r[c] <= RANGES[c][1]))
                                                 for c in RANGES))


def test_sorted_rows_returns_the_same_table_when_in_order_and_sorts_like_sort_by_otherwise():
    t = pa.table({"a": [1, 1, None, 2, 1], "b": ["y", "x", "x", None, "x"], "i": [0, 1, 2, 3, 4]})
    expected = t.sort_by([("a", "ascending"), ("b", "ascending")])
    got = sorted_rows(t, ["a", "b"])
    assert got.equals(expected)
    assert got["i"].to_pylist() == [1, 4, 0, 3, 2]  # stable among equal keys, nulls last
    assert sorted_rows(got, ["a", "b"]) is got


DAY = "2025-08-04"
SMALL = {"memory_bytes": 20_000, "slab_bytes": 10_000, "flush_bytes": 15_000}


@pytest.mark.parametrize("seed", [0, 1])
def test_streamed_partitions_spilled_in_slabs_match_the_in_memory_ones_and_the_sql_oracle(tmp_path, monkeypatch,
                                                                                          seed):
    t = faulty_rows(seed)
    flushes = []
    flush = TimeSlabSorter._flush
    monkeypatch.setattr(TimeSlabSorter, "_flush", lambda self: (flushes.append(self.slabs), flush(self)))
    store, held = Store(tmp_path / "streamed"), Store(tmp_path / "held")
    parts = [t.slice(at, 300) for at in range(0, t.num_rows, 300)]
    written = write_sorted_raw(store, DAY, parts, T0, T0 + dt.timedelta(hours=1), **SMALL)
    assert len(flushes) > 1 and min(flushes) > 1  # spilled, in several slabs
    # the file the in-memory sort writes, byte for byte
    held.write_partition(RAW_GPU_TELEMETRY, DAY, sorted_rows(t, RAW_ORDER))
    assert written.rows == t.num_rows
    assert (Path(written.path).read_bytes()
            == held.partition_file(RAW_GPU_TELEMETRY, DAY).read_bytes())

    cleaned = write_clean_samples(store, DAY, batch_rows=97)  # repeated keys across the cuts
    table, dups, reasons = _sql_oracle(t)
    assert store.read_table(GPU_SAMPLES, DAY).equals(table)
    assert cleaned.sorted_raw and cleaned.repeated_keys == 0
    assert cleaned.rows_in == t.num_rows and cleaned.duplicates_dropped == dups > 0
    assert cleaned.quarantined_by_reason == reasons
    assert cleaned.gpus == len(set(table["gpu_id"].to_pylist()))
    in_memory = clean_samples(t)
    assert store.read_table(QUARANTINE_GPU_SAMPLES, DAY).equals(in_memory.quarantine)
    assert cleaned.result.bytes == len(parquet_bytes(in_memory.table, GPU_SAMPLES.row_group_rows))


def test_a_raw_partition_out_of_cleaning_order_is_sorted_first_with_the_same_result(tmp_path):
    t = faulty_rows(2)
    store = Store(tmp_path)
    store.write_partition(RAW_GPU_TELEMETRY, DAY, t)  # as read, unsorted (an earlier version's order)
    cleaned = write_clean_samples(store, DAY, spill_dir=tmp_path, batch_rows=500, **SMALL)
    table, dups, _ = _sql_oracle(t)
    assert not cleaned.sorted_raw
    assert store.read_table(GPU_SAMPLES, DAY).equals(table)
    assert cleaned.duplicates_dropped == dups
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("gpu_pipeline_spill_")]


@pytest.mark.parametrize("seed", range(6))
def test_out_of_order_is_true_exactly_when_the_stable_sort_moves_a_row(seed):
    rng = np.random.default_rng(seed)
    t = faulty_rows(seed, 300)
    ordered = sorted_rows(t, RAW_ORDER)
    assert not _out_of_order(ordered, RAW_ORDER)
    i = int(rng.integers(0, ordered.num_rows - 1))
    swapped = pa.concat_tables([ordered.slice(0, i), ordered.slice(i + 1, 1), ordered.slice(i, 1),
                                ordered.slice(i + 2)])
    assert _out_of_order(swapped, RAW_ORDER) == (sorted_rows(swapped, RAW_ORDER) is not swapped)
    assert _out_of_order(t, RAW_ORDER)


def test_a_day_with_nothing_to_clean_is_the_raw_file_copied_byte_for_byte_what_the_writer_writes(tmp_path,
                                                                                                   monkeypatch):
    """Three ways to the same clean file: the raw step's note vouches for the raw file (copied with no
    read pass), no note (the read-only pass, then the copy), an old layout (written anew)."""
    # faultless rows: in order, no repeated key, every value in range
    t = faulty_rows(3)
    t = sorted_rows(clean_samples(t).table, RAW_ORDER)
    vouched, passed, written = Store(tmp_path / "vouched"), Store(tmp_path / "passed"), Store(tmp_path / "written")
    for store in (vouched, passed, written):
        write_sorted_raw(store, DAY, [t], T0, T0 + dt.timedelta(hours=1))
    passed.note_file(RAW_GPU_TELEMETRY, DAY, CLEAN_CHECK_NOTE).unlink()
    copies, passes = [], []
    copy, piece = Store.write_partition_copy, samples_module._Cleaner.piece
    monkeypatch.setattr(Store, "write_partition_copy", lambda self, *a, **k: copies.append(k) or copy(self, *a, **k))
    monkeypatch.setattr(samples_module._Cleaner, "piece", lambda self, *a: passes.append(1) or piece(self, *a))
    a = write_clean_samples(vouched, DAY, batch_rows=97)
    assert a.checked_when_written and len(copies) == 1 and copies[0]["sha256"] and not passes
    b = write_clean_samples(passed, DAY, batch_rows=97)
    assert not b.checked_when_written and len(copies) == 2 and "sha256" not in copies[1] and passes
    monkeypatch.setattr(samples_module, "_same_layout", lambda raw: False)  # the writer, as for an old file
    c = write_clean_samples(written, DAY, batch_rows=97)
    assert len(copies) == 2 and not c.checked_when_written
    assert (Path(a.result.path).read_bytes() == Path(b.result.path).read_bytes() == Path(c.result.path).read_bytes()
            == vouched.partition_file(RAW_GPU_TELEMETRY, DAY).read_bytes())
    assert (a.rows_in, a.result.rows, a.gpus, a.repeated_keys, a.duplicates_dropped, a.quarantined_by_reason) == \
           (b.rows_in, b.result.rows, b.gpus, b.repeated_keys, b.duplicates_dropped, b.quarantined_by_reason) == \
           (c.rows_in, c.result.rows, c.gpus, c.repeated_keys, c.duplicates_dropped, c.quarantined_by_reason) == \
           (t.num_rows, t.num_rows, len(set(t["gpu_id"].to_pylist())), 0, 0, {})
    for store in (vouched, passed, written):
        assert store.read_table(QUARANTINE_GPU_SAMPLES, DAY).num_rows == 0


def test_the_raw_steps_note_says_what_the_clean_step_would_find_in_the_bytes_it_wrote(tmp_path):
    store = Store(tmp_path)
    faultless = sorted_rows(clean_samples(faulty_rows(6)).table, RAW_ORDER)
    written = write_sorted_raw(store, DAY, [faultless.slice(0, 1000), faultless.slice(1000)], T0,
                               T0 + dt.timedelta(hours=1), **SMALL)
    note = store.read_partition_note(RAW_GPU_TELEMETRY, DAY, CLEAN_CHECK_NOTE)
    raw_bytes = store.partition_file(RAW_GPU_TELEMETRY, DAY).read_bytes()
    assert note["sha256"] == written.sha256 == hashlib.sha256(raw_bytes).hexdigest()
    assert (note["clean"], note["rows"], note["gpus"]) == (True, faultless.num_rows,
                                                           len(set(faultless["gpu_id"].to_pylist())))
    for seed in (0, 4):  # repeated keys and out-of-range values: the note says so, and the day is cleaned
        write_sorted_raw(store, DAY, [faulty_rows(seed)], T0, T0 + dt.timedelta(hours=1), **SMALL)
        note = store.read_partition_note(RAW_GPU_TELEMETRY, DAY, CLEAN_CHECK_NOTE)
        assert note["clean"] is False and note["gpus"] is None
        cleaned = write_clean_samples(store, DAY, batch_rows=97)
        assert not cleaned.checked_when_written
        assert store.read_table(GPU_SAMPLES, DAY).equals(_sql_oracle(faulty_rows(seed))[0])


def test_a_note_is_not_taken_for_another_raw_file_or_under_other_rules(tmp_path, monkeypatch):
    """The raw file replaced behind the note's back (the same row count, one value out of range): the
    copy's bytes are not the note's, so nothing is copied and the day is checked and cleaned. A note
    made under other rules is not used either."""
    t = sorted_rows(clean_samples(faulty_rows(7)).table, RAW_ORDER)
    store = Store(tmp_path)
    write_sorted_raw(store, DAY, [t], T0, T0 + dt.timedelta(hours=1))
    note = store.read_partition_note(RAW_GPU_TELEMETRY, DAY, CLEAN_CHECK_NOTE)
    power = t["power_w"].to_pylist()
    power[17] = -5.0
    edited = t.set_column(t.schema.get_field_index("power_w"), "power_w", pa.array(power, pa.float64()))
    store.write_partition(RAW_GPU_TELEMETRY, DAY, edited)  # a file of the same layout and rows, no new note
    assert store.read_partition_note(RAW_GPU_TELEMETRY, DAY, CLEAN_CHECK_NOTE) == note
    cleaned = write_clean_samples(store, DAY, batch_rows=97)
    assert not cleaned.checked_when_written
    assert cleaned.quarantined_by_reason == {"power_w out of range": 1}
    assert store.read_table(GPU_SAMPLES, DAY).equals(pa.concat_tables([t.slice(0, 17), t.slice(18)]).combine_chunks())
    assert sorted(p.name for p in store.partition_file(GPU_SAMPLES, DAY).parent.iterdir()) == [".lock", "part-0.parquet"]

    # replaced by a file with nothing to clean either: the copy of other bytes is dropped, and the
    # read-only pass copies the file again
    power[17] = 55.0
    store.write_partition(RAW_GPU_TELEMETRY, DAY, t.set_column(t.schema.get_field_index("power_w"), "power_w",
                                                               pa.array(power, pa.float64())))
    cleaned = write_clean_samples(store, DAY, batch_rows=97)
    assert not cleaned.checked_when_written and cleaned.quarantined_by_reason == {}
    assert (store.partition_file(GPU_SAMPLES, DAY).read_bytes()
            == store.partition_file(RAW_GPU_TELEMETRY, DAY).read_bytes())
    assert store.read_table(GPU_SAMPLES, DAY)["power_w"][17].as_py() == 55.0

    write_sorted_raw(store, DAY, [t], T0, T0 + dt.timedelta(hours=1))
    monkeypatch.setattr(samples_module, "_RULES", "other-rules")
    cleaned = write_clean_samples(store, DAY, batch_rows=97)
    assert not cleaned.checked_when_written and cleaned.result.rows == t.num_rows


def test_a_day_with_something_to_clean_is_written_not_copied(tmp_path, monkeypatch):
    t = faulty_rows(4)  # repeated keys and out-of-range values
    store = Store(tmp_path)
    write_sorted_raw(store, DAY, [t], T0, T0 + dt.timedelta(hours=1))
    monkeypatch.setattr(Store, "write_partition_copy", lambda *a: pytest.fail("copied a day that needed cleaning"))
    cleaned = write_clean_samples(store, DAY, batch_rows=97)
    table, dups, reasons = _sql_oracle(t)
    assert store.read_table(GPU_SAMPLES, DAY).equals(table)
    assert cleaned.duplicates_dropped == dups > 0 and cleaned.quarantined_by_reason == reasons


def test_a_day_whose_last_batch_is_dropped_whole_is_written_not_copied(tmp_path, monkeypatch):
    # the read-only pass yields nothing for a batch it drops whole: the day must still be written
    t = sorted_rows(clean_samples(faulty_rows(5)).table, RAW_ORDER)
    dup = t.slice(t.num_rows - 1).set_column(t.schema.get_field_index("source_file"), "source_file",
                                              pa.array(["zz-later-file"]))
    store = Store(tmp_path)
    write_sorted_raw(store, DAY, [t, dup], T0, T0 + dt.timedelta(hours=1))
    monkeypatch.setattr(Store, "write_partition_copy", lambda *a: pytest.fail("copied a day that needed cleaning"))
    cleaned = write_clean_samples(store, DAY, batch_rows=t.num_rows)  # the duplicate is the last batch, alone
    assert cleaned.duplicates_dropped == 1
    assert store.read_table(GPU_SAMPLES, DAY).equals(t)


# -- the NVML sampler's files in the raw stream --------------------------------------------------


def _sampler_file(root: Path, host: str, day: dt.date, hours: range) -> pa.Table:
    """A sampler day file of ``host`` with two GPUs sampled every 10 minutes in ``hours`` (UTC)."""
    from gpu_pipeline.lib.nvml_sampler import day_file, write_parquet_atomic

    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    rows = [{"sample_utc": start + dt.timedelta(hours=h, minutes=m), "source": "nvml", "host": host,
             "gpu_id": f"GPU-{host[-1] * 7}{g}", "util_pct": float(h), "power_w": 60.0 + g}
            for h in hours for m in range(0, 60, 10) for g in range(2)]
    table = conform(pa.Table.from_pylist(rows), GPU_SAMPLES)
    path = day_file(root, host, day)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(table, path)
    return table


def test_the_sampler_files_are_read_one_at_a_time_and_sized_from_their_footers(tmp_path):
    """A day of a large pool's sampler files is never one table: each file is its own part, and the
    sorter is told their rows' size up front (the footers' byte sizes are of dictionary-encoded text,
    several times smaller than the rows in memory), so a day too large to hold spills in slabs."""
    from gpu_pipeline.lib.samples import _ROW_BYTES, RawStream, read_nvml_dir, write_raw_samples

    start = dt.datetime(2025, 8, 4, 5, 0, tzinfo=dt.UTC)  # a local day of America/Chicago
    end = start + dt.timedelta(days=1)
    tables = [_sampler_file(tmp_path, host, day, range(24)) for host in ("a1", "b2")
              for day in (dt.date(2025, 8, 4), dt.date(2025, 8, 5))]
    _sampler_file(tmp_path, "a1", dt.date(2025, 8, 7), range(24))  # outside the window: not read
    stream = RawStream(tmp_path, start, end, "America/Chicago")
    in_window = sum(t.filter(pc.and_(pc.greater_equal(t["sample_utc"], pa.scalar(start)),
                                     pc.less(t["sample_utc"], pa.scalar(end)))).num_rows for t in tables)
    assert in_window == 2 * 24 * 6 * 2  # two hosts, the window's 24 hours, two GPUs
    # 19 of the 24 hours of each 4 August file and 5 of each 5 August file lie in the window
    assert stream.expected_bytes == sum(int(t.num_rows * _ROW_BYTES * share)
                                        for t, share in zip(tables, [19 / 24, 5 / 24] * 2, strict=True))
    parts = list(stream.parts())
    assert [p.num_rows for p in parts] == [19 * 12, 5 * 12, 19 * 12, 5 * 12]
    assert len(stream.files) == 4 and all("2025-08-07" not in f for f in stream.files)
    whole, files = read_nvml_dir(tmp_path, start, end)
    assert files == stream.files
    assert pa.concat_tables(parts).equals(whole)
    # the partition written from the stream is the rows sorted
    written = write_raw_samples(Store(tmp_path / "store"), "2025-08-04", RawStream(tmp_path, start, end, "America/Chicago"),
                                spill_dir=tmp_path / "spill")
    assert written.rows == in_window
    got = Store(tmp_path / "store").read_table(RAW_GPU_TELEMETRY, "2025-08-04")
    assert got.equals(sorted_rows(whole, RAW_ORDER))


def test_the_sampler_files_rows_name_the_file_they_came_from(tmp_path):
    """Every other source's rows carry the file they were read from (the telemetry folder's files
    relative to it); the sampler's rows had a null source_file."""
    from gpu_pipeline.lib.samples import RawStream, nvml_file_samples, raw_samples, read_nvml_dir

    start = dt.datetime(2025, 8, 4, 12, 0, tzinfo=dt.UTC)
    end = start + dt.timedelta(days=1)
    for host in ("a1", "b2"):
        for day in (dt.date(2025, 8, 4), dt.date(2025, 8, 5)):
            _sampler_file(tmp_path, host, day, range(24))
    # 12 hours of each file, six samples an hour, two GPUs
    expected = {f"nvml/{h}/nvml-{d}.parquet": 12 * 6 * 2 for h in ("a1", "b2") for d in ("2025-08-04", "2025-08-05")}

    def per_file(t: pa.Table) -> dict:
        return dict(collections.Counter(t["source_file"].to_pylist()))

    assert per_file(pa.concat_tables(RawStream(tmp_path, start, end, "UTC").parts())) == expected
    assert per_file(read_nvml_dir(tmp_path, start, end)[0]) == expected
    assert per_file(raw_samples(tmp_path, start, end, "UTC").table) == expected
    path = tmp_path / "nvml" / "a1" / "nvml-2025-08-04.parquet"
    assert per_file(nvml_file_samples(path, start, end)) == {str(path): 144}


@pytest.mark.parametrize("seed", range(4))
def test_a_sampler_files_rows_of_the_window_are_those_a_filter_keeps(seed):
    """In time order (as the sampler writes) the window is cut as a slice; out of order it is
    filtered: either way the rows of [start, end), boundaries included and excluded as they should."""
    rng = np.random.default_rng(seed)
    times = sorted(T0 + dt.timedelta(minutes=int(m)) for m in rng.integers(0, 600, 300))
    t = raw([{"sample_utc": s, "util_pct": float(i)} for i, s in enumerate(times)])
    start, end = times[40], times[250]  # rows at exactly the window's ends (and repeats of them)
    for table in (t, t.take(rng.permutation(t.num_rows))):
        expected = table.filter(pc.and_(pc.greater_equal(table["sample_utc"], pa.scalar(start, table["sample_utc"].type)),
                                        pc.less(table["sample_utc"], pa.scalar(end, table["sample_utc"].type))))
        got = samples_module._rows_within(table, start, end)
        assert got.equals(expected) and 0 < got.num_rows < table.num_rows
    assert samples_module._rows_within(t, T0 - dt.timedelta(days=2), T0 - dt.timedelta(days=1)).num_rows == 0
    assert samples_module._rows_within(t, T0 - dt.timedelta(days=1), T0 + dt.timedelta(days=1)).equals(t)


def test_a_raw_write_failing_while_its_slabs_are_sorted_keeps_the_days_file_and_note(tmp_path, monkeypatch):
    """The slabs are read back and sorted on a thread of their own while the writer encodes: an error
    there reaches the caller, and the day's earlier file and note stay as they were."""
    t = faulty_rows(0)
    store = Store(tmp_path / "store")
    parts = [t.slice(at, 300) for at in range(0, t.num_rows, 300)]
    first = write_sorted_raw(store, DAY, parts, T0, T0 + dt.timedelta(hours=1), **SMALL)
    before = Path(first.path).read_bytes()
    note = store.read_partition_note(RAW_GPU_TELEMETRY, DAY, CLEAN_CHECK_NOTE)
    coverage_note = store.read_partition_note(RAW_GPU_TELEMETRY, DAY, COVERAGE_NOTE)
    assert coverage_note["sha256"] == first.sha256
    sorted_in: list[str] = []
    sort = samples_module.TimeSlabSorter.sorted_batches

    def failing(self):
        for i, batch in enumerate(sort(self)):
            sorted_in.append(threading.current_thread().name)
            if i == 3:
                raise OSError("disk gone while reading slab back")
            yield batch

    monkeypatch.setattr(samples_module.TimeSlabSorter, "sorted_batches", failing)
    spill = tmp_path / "spill"
    with pytest.raises(OSError, match="disk gone"):
        write_sorted_raw(store, DAY, [t.slice(0, 2000)] * 2, T0, T0 + dt.timedelta(hours=1),
                         spill_dir=spill, **SMALL)
    assert set(sorted_in) == {"raw-sort"}  # not the writer's thread
    assert Path(first.path).read_bytes() == before
    assert store.read_partition_note(RAW_GPU_TELEMETRY, DAY, CLEAN_CHECK_NOTE) == note
    assert store.read_partition_note(RAW_GPU_TELEMETRY, DAY, COVERAGE_NOTE) == coverage_note
    assert sorted(p.name for p in Path(first.path).parent.iterdir()) == sorted(
        [".lock", Path(first.path).name, f"_{CLEAN_CHECK_NOTE}.json", f"_{COVERAGE_NOTE}.json"])  # no temp file left
    assert list(spill.iterdir()) == []  # the spill file removed


@pytest.mark.parametrize("damage", ["footer cut", "empty", "no sample_utc"])
def test_a_damaged_sampler_file_fails_the_raw_day_naming_it(tmp_path, damage):
    """The raw step sizes the day from the files' footers before it reads them: a file with its
    footer cut, or empty, failed there with Arrow's message alone (no file named); one without a
    sample_utc column failed with a KeyError, on both paths."""
    from gpu_pipeline.lib.samples import RawStream, raw_samples, write_raw_samples

    start = dt.datetime(2025, 8, 4, tzinfo=dt.UTC)
    _sampler_file(tmp_path, "a1", dt.date(2025, 8, 4), range(24))
    path = next(tmp_path.glob("nvml/*/nvml-2025-08-04*.parquet"))
    if damage == "footer cut":
        path.write_bytes(path.read_bytes()[:-10])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        t = pq.read_table(path)
        pq.write_table(t.drop_columns(["sample_utc"]), path)
    end = start + dt.timedelta(days=1)
    with pytest.raises(ValueError, match=re.escape(f"{path}: unreadable NVML sampler file")):
        write_raw_samples(Store(tmp_path / "store"), "2025-08-04", RawStream(tmp_path, start, end, "UTC"),
                          spill_dir=tmp_path / "spill")
    with pytest.raises(ValueError, match=re.escape(f"{path}: unreadable NVML sampler file")):
        raw_samples(tmp_path, start, end, "UTC")
    assert not Store(tmp_path / "store").has_partition(RAW_GPU_TELEMETRY, "2025-08-04")
