"""Bad slot-archive inputs: each gives a clear error naming the file, or is quarantined and counted."""

import datetime as dt
import sqlite3
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from gpu_pipeline.lib.condor_archive import ArchiveError, read_window, rejected_rows
from gpu_pipeline.lib.plots import gpu_timeline_heatmap
from gpu_pipeline.lib.slots import clean_slot_rows
from gpu_pipeline.lib.states import states_from_table
from gpu_pipeline.lib.timeutil import day_window
from gpu_pipeline_tests.conftest import OLD_COLUMNS, slot_row, write_gpu_state_db

DAY = "2025-08-05"
START, END = day_window(DAY, "UTC")


def good_rows(n=12):
    return [slot_row(f"2025-08-05 {h:02d}:00:01.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed") for h in range(n)]


def archive(tmp_path, rows=None, columns=OLD_COLUMNS):
    write_gpu_state_db(tmp_path / "gpu_state_2025-08.db", good_rows() if rows is None else rows, columns)
    return tmp_path / "gpu_state_2025-08.db"


def test_truncated_sqlite_names_the_file(tmp_path):
    path = archive(tmp_path, good_rows() * 200)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ArchiveError, match=r"gpu_state_2025-08\.db"):
        read_window(tmp_path, START, END)


def test_empty_file_names_the_file_and_the_missing_table(tmp_path):
    (tmp_path / "gpu_state_2025-08.db").write_bytes(b"")
    with pytest.raises(ArchiveError, match=r"gpu_state_2025-08\.db: no table 'gpu_state'"):
        read_window(tmp_path, START, END)


def test_locked_database_is_a_clear_error_within_the_timeout(tmp_path):
    path = archive(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1], isolation_level=None); "
         "c.execute('BEGIN EXCLUSIVE'); c.execute('DELETE FROM gpu_state'); print('locked', flush=True); "
         "time.sleep(30)", str(path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(ArchiveError, match=r"gpu_state_2025-08\.db: database is locked"):
            read_window(tmp_path, START, END, lock_timeout_s=0.5)
        assert time.monotonic() - t0 < 10
    finally:
        holder.kill()
        holder.wait()
    # the holder never committed: the archive is intact
    assert read_window(tmp_path, START, END).table.num_rows == 12


def test_missing_required_column_names_file_and_column(tmp_path):
    cols = tuple(c for c in OLD_COLUMNS if c != "State")
    archive(tmp_path, columns=cols)
    with pytest.raises(ArchiveError, match=r"gpu_state_2025-08\.db: table 'gpu_state' lacks required columns \['State'\]"):
        read_window(tmp_path, START, END)


def test_renamed_optional_column_is_reported_and_host_comes_from_the_name(tmp_path):
    cols = tuple("MachineName" if c == "Machine" else c for c in OLD_COLUMNS)
    rows = [dict(r, MachineName=r["Machine"]) for r in good_rows()]
    archive(tmp_path, rows, cols)
    read = read_window(tmp_path, START, END)
    assert read.extra_columns[str(tmp_path / "gpu_state_2025-08.db")] == ["MachineName"]
    assert "Machine" in read.missing_columns[str(tmp_path / "gpu_state_2025-08.db")]
    clean = clean_slot_rows(read.table)
    assert set(clean.table.column("host").to_pylist()) == {"gpu01.example.edu"}


def test_all_null_device_column_still_gives_states(tmp_path):
    archive(tmp_path, [dict(r, GPUs_DeviceName=None) for r in good_rows()])
    clean = clean_slot_rows(read_window(tmp_path, START, END).table).table
    states = states_from_table(clean, START, END)
    assert states.num_rows == 288 and set(states.column("device_name").to_pylist()) == {None}


def test_out_of_order_and_repeated_snapshots(tmp_path):
    rows = good_rows()
    archive(tmp_path, list(reversed(rows)) + rows[:3])  # reversed, then three snapshots written again
    read = read_window(tmp_path, START, END)
    clean = clean_slot_rows(read.table)
    assert clean.duplicates_dropped == 3
    times = clean.table.column("snapshot_utc").to_pylist()
    assert times == sorted(times) and len(times) == 12


def test_unparseable_timestamp_is_set_aside_with_its_rowid(tmp_path):
    archive(tmp_path, good_rows() + [slot_row("2025-08-05 25:61:00.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed")])
    read = read_window(tmp_path, START, END)
    assert read.table.num_rows == 12 and read.unparseable_timestamps == 1
    q = rejected_rows(read).to_pylist()
    assert q[0]["source_row"] == 13 and "unparseable timestamp" in q[0]["reason"]
    assert q[0]["source_file"].endswith("gpu_state_2025-08.db")


def test_non_utf8_identity_is_quarantined(tmp_path):
    path = archive(tmp_path)
    con = sqlite3.connect(path)
    con.execute("UPDATE gpu_state SET Name = CAST(X'736c6f7431ff40677075' AS TEXT) WHERE rowid = 1")
    con.commit()
    con.close()
    clean = clean_slot_rows(read_window(tmp_path, START, END).table)
    assert clean.quarantined_by_reason == {"non-UTF-8 bytes in Name": 1}
    assert clean.table.num_rows == 11
    assert clean.quarantine.column("source_row").to_pylist() == [1]


def test_usage_out_of_range_is_nulled_and_counted(tmp_path):
    archive(tmp_path, [dict(r, GPUsAverageUsage=5.0 if i == 0 else 0.5) for i, r in enumerate(good_rows())])
    clean = clean_slot_rows(read_window(tmp_path, START, END).table)
    assert clean.usage_out_of_range_nulled == 1
    assert sorted(v for v in clean.table.column("gpu_usage_pct").to_pylist() if v is not None) == [50.0] * 11


def test_non_numeric_value_is_nulled_and_counted(tmp_path):
    archive(tmp_path, [dict(r, GPUs_GlobalMemoryMb="lots") if i < 2 else r for i, r in enumerate(good_rows())])
    read = read_window(tmp_path, START, END)
    assert read.non_numeric == {"GPUs_GlobalMemoryMb": 2}


def test_zero_gpu_day_gives_empty_states_and_a_no_data_plot(tmp_path):
    archive(tmp_path, [slot_row("2025-08-05 10:00:00.000000", "slot1", None, "Unclaimed")])
    clean = clean_slot_rows(read_window(tmp_path, START, END).table)
    assert clean.table.num_rows == 0 and clean.quarantined_by_reason == {"no GPU id in AssignedGPUs": 1}
    states = states_from_table(clean.table, START, END)
    assert states.num_rows == 0
    assert gpu_timeline_heatmap(states, dt.date(2025, 8, 5)).numbers == {}


def test_timestamps_from_the_future_do_not_leak_into_other_days(tmp_path):
    archive(tmp_path, good_rows() + [slot_row("2025-08-31 23:59:00.000000", "slot1", "GPU-bbbbbbbb", "Claimed")])
    read = read_window(tmp_path, START, END)
    assert set(read.table.column("AssignedGPUs").to_pylist()) == {"GPU-aaaaaaaa"}


def test_cleaning_the_asset_s_column_subset_equals_cleaning_whole_rows(tmp_path):
    """The asset reads only CLEAN_INPUT_COLUMNS (text dictionary-encoded) and re-reads quarantined rows
    whole: same clean table and the same quarantine as cleaning the full raw table."""
    import pyarrow.parquet as pq

    from gpu_pipeline.lib.slots import CLEAN_INPUT_COLUMNS, DICTIONARY_COLUMNS

    rows = good_rows() + [slot_row("2025-08-05 13:00:01.000000", "slot2", None, "Claimed")]
    archive(tmp_path, rows)
    raw = read_window(tmp_path, START, END).table
    pq.write_table(raw, tmp_path / "raw.parquet")
    subset = pq.read_table(tmp_path / "raw.parquet", columns=CLEAN_INPUT_COLUMNS, read_dictionary=DICTIONARY_COLUMNS)
    assert pa.types.is_dictionary(subset.schema.field("Name").type)
    whole = clean_slot_rows(raw)
    part = clean_slot_rows(subset, full_rows=lambda idx: raw.take(idx))
    assert part.table.equals(whole.table)
    assert part.quarantine.equals(whole.quarantine) and whole.quarantine.num_rows == 1


@pytest.mark.parametrize("zone", ["UTC", "America/Chicago"])
def test_a_row_whose_time_cannot_be_read_is_quarantined_by_one_day(tmp_path, zone):
    """Each day reads its archive text with a 2-hour margin either side: a row with an unreadable
    time near midnight was rejected (and counted) by both days it lay between."""
    write_gpu_state_db(tmp_path / "gpu_state_2025-08.db", [
        slot_row("2025-08-06 23:55:00.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed"),
        slot_row("2025-08-06 24:00:00.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed"),  # no such hour
        slot_row("2025-08-07 00:30:00.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed"),
        slot_row("2025-08-07 01:05:xx.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed")])
    days = ["2025-08-05", "2025-08-06", "2025-08-07", "2025-08-08"]
    rejected = {day: [r[1] for r in read_window(tmp_path, *day_window(day, zone), zone).rejected] for day in days}
    assert sorted(rowid for ids in rejected.values() for rowid in ids) == [2, 4]
    assert rejected["2025-08-06"] == [2] and rejected["2025-08-07"] == [4]  # each in its own local day
