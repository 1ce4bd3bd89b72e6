import datetime as dt
import json
import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest

from gpu_pipeline.lib.condor_archive import ArchiveError, read_window
from gpu_pipeline.lib.schemas import RAW_CONDOR_SLOT_SNAPSHOTS
from gpu_pipeline.lib.timeutil import day_window
from gpu_pipeline_tests.conftest import NEW_COLUMNS, OLD_COLUMNS, slot_row, write_gpu_state_db

UTC = dt.UTC


def test_reads_one_utc_day_across_a_month_boundary_with_schema_drift(tmp_path):
    # Local time UTC-5 (CDT in July/August): UTC day 2025-08-01 = local 07-31 19:00 .. 08-01 19:00.
    july = [slot_row("2025-07-31 18:55:01.000001", "slot1", "GPU-aaaaaaaa", "Unclaimed"),
            slot_row("2025-07-31 19:00:02.500000", "slot1", "GPU-aaaaaaaa", "Unclaimed"),
            slot_row("2025-07-31 23:59:59.999999", "slot1", "GPU-aaaaaaaa", "Claimed", job="s#1.0#1")]
    aug = [dict(slot_row("2025-08-01 00:00:03.000000", "slot1", "GPU-aaaaaaaa", "Claimed", job="s#1.0#1"),
                PreventJobsReason=None, Disk=1000, GPUs_MIG_0_DeviceName=None),
           dict(slot_row("2025-08-01 18:59:59.000000", "slot1", "GPU-aaaaaaaa", "Drained"),
                PreventJobsReason="Draining", Disk=1000),
           slot_row("2025-08-01 19:00:00.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed")]
    write_gpu_state_db(tmp_path / "gpu_state_2025-07.db", july, OLD_COLUMNS)
    write_gpu_state_db(tmp_path / "gpu_state_2025-08.db", aug, NEW_COLUMNS)

    start, end = day_window("2025-08-01", "UTC")
    read = read_window(tmp_path, start, end, "America/Chicago")

    assert read.table.schema == RAW_CONDOR_SLOT_SNAPSHOTS.schema
    assert read.table.column("timestamp_local").to_pylist() == [
        "2025-07-31 19:00:02.500000",
        "2025-07-31 23:59:59.999999",
        "2025-08-01 00:00:03.000000",
        "2025-08-01 18:59:59.000000",
    ]
    assert read.table.column("snapshot_utc").to_pylist()[0] == dt.datetime(2025, 8, 1, 0, 0, 2, 500000, tzinfo=UTC)
    assert read.table.column("PreventJobsReason").to_pylist() == [None, None, None, "Draining"]
    assert [f.rsplit("/", 1)[-1] for f in read.files] == ["gpu_state_2025-07.db", "gpu_state_2025-08.db"]
    assert read.extra_columns == {str(tmp_path / "gpu_state_2025-08.db"): ["GPUs_MIG_0_DeviceName"]}
    assert read.missing_columns[str(tmp_path / "gpu_state_2025-07.db")] == ["PreventJobsReason", "Disk"]
    assert read.missing_months == []
    assert read.snapshots == 4


def test_missing_month_is_reported_and_other_months_still_read(tmp_path):
    """A month the window's own hours need is missing when absent; one only the reading margin (two
    hours either side) reaches is not: a local day on the 1st reads July's last hours for the margin
    alone (the archive's first month, or July rotated away: the day is whole)."""
    write_gpu_state_db(tmp_path / "gpu_state_2025-08.db",
                       [slot_row("2025-08-01 00:10:00.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed")])
    start, end = day_window("2025-08-01", "America/Chicago")
    read = read_window(tmp_path, start, end, "America/Chicago")
    assert read.missing_months == []
    assert read.table.num_rows == 1
    # a UTC day of a Chicago archive: its first five hours are July 31st's, local
    start, end = day_window("2025-08-01", "UTC")
    read = read_window(tmp_path, start, end, "America/Chicago")
    assert read.missing_months == ["2025-07"]
    assert read.table.num_rows == 1


def test_empty_window_gives_empty_table_with_full_schema(tmp_path):
    write_gpu_state_db(tmp_path / "gpu_state_2025-08.db",
                       [slot_row("2025-08-20 00:10:00.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed")])
    start, end = day_window("2025-08-01", "UTC")
    read = read_window(tmp_path, start, end, "UTC")
    assert read.table.num_rows == 0
    assert read.table.schema == RAW_CONDOR_SLOT_SNAPSHOTS.schema


def test_dst_fall_back_hour_is_resolved_by_append_order(tmp_path):
    # 2025-11-02 01:30 happens twice in America/Chicago (CDT then CST).
    rows = [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Unclaimed") for ts in (
        "2025-11-02 01:25:00.000000", "2025-11-02 01:30:00.000000", "2025-11-02 01:55:00.000000",
        "2025-11-02 01:05:00.000000", "2025-11-02 01:30:00.000001", "2025-11-02 02:00:00.000000")]
    write_gpu_state_db(tmp_path / "gpu_state_2025-11.db", rows)
    start, end = day_window("2025-11-02", "America/Chicago")
    assert end - start == dt.timedelta(hours=25)
    read = read_window(tmp_path, start, end, "America/Chicago")
    utc = read.table.column("snapshot_utc").to_pylist()
    assert utc == sorted(utc)
    assert utc[0] == dt.datetime(2025, 11, 2, 6, 25, tzinfo=UTC)  # CDT, UTC-5
    assert utc[3] == dt.datetime(2025, 11, 2, 7, 5, tzinfo=UTC)  # second 01:05, CST, UTC-6
    assert utc[5] == dt.datetime(2025, 11, 2, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize("outage", [False, True])
def test_every_time_of_the_second_pass_of_the_repeated_hour_is_its_second_occurrence(tmp_path, outage):
    """Snapshots every 5 minutes with seconds of jitter across the fall-back: the second pass's 01:55
    can be later than the first pass's last time (01:55:01 CDT, then 01:55:03 CST), and a collector
    that missed the first pass's last 15 minutes steps back from 01:40 to 01:00 and then passes
    01:45 again. Every snapshot reads back at the instant it was taken."""
    from zoneinfo import ZoneInfo

    zone = ZoneInfo("America/Chicago")
    taken = [dt.datetime(2025, 11, 2, 5, 0, tzinfo=UTC) + dt.timedelta(minutes=5 * k, seconds=1 + k // 12)
             for k in range(12 * 4)]  # 00:00 CDT .. 02:55 CST
    if outage:
        taken = [t for t in taken if not dt.datetime(2025, 11, 2, 6, 45, tzinfo=UTC) <= t < dt.datetime(2025, 11, 2, 7, tzinfo=UTC)]
    else:  # and a second collector's snapshot half a second later, committed first (01:10 CDT)
        at = taken.index(dt.datetime(2025, 11, 2, 6, 10, 2, tzinfo=UTC))
        taken.insert(at, taken[at] + dt.timedelta(milliseconds=500))
    local = [t.astimezone(zone).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds") for t in taken]
    assert "2025-11-02 01:55:03.000000" in local and len(set(local)) == len(local)  # CST, after 01:55:02 CDT
    assert ("2025-11-02 01:55:02.000000" in local) is not outage
    write_gpu_state_db(tmp_path / "gpu_state_2025-11.db",
                       [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Unclaimed") for ts in local])
    start, end = day_window("2025-11-02", "America/Chicago")
    assert sorted(read_window(tmp_path, start, end, "America/Chicago").table.column("snapshot_utc").to_pylist()) == sorted(taken)


@pytest.mark.parametrize("kind", ["sqlite", "sqlite batches of 3 rows", "parquet"])
def test_the_same_text_before_and_after_the_fall_back_is_two_instants(tmp_path, kind, monkeypatch):
    """A collector stamping its snapshots on the minute writes the repeated hour's texts twice,
    exactly: 01:05:00 CDT, then 01:05:00 CST. Each text was localized once, so the second pass's
    snapshots all read as the first pass's instants (that hour's states, busy from 01:00 CST, were
    put an hour early, and the true hour had no snapshot). Two slot rows a snapshot, and the 01:00
    CST snapshot in a read batch of its own, change nothing."""
    from zoneinfo import ZoneInfo

    import pandas as pd

    from gpu_pipeline.lib import condor_archive

    zone = ZoneInfo("America/Chicago")
    taken = [dt.datetime(2025, 11, 2, 5, 0, tzinfo=UTC) + dt.timedelta(minutes=5 * k) for k in range(48)]
    rows = [slot_row(t.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S.%f"), slot, gpu,
                     "Claimed" if t.hour >= 7 else "Unclaimed", job="s#1.0#1" if t.hour >= 7 else None)
            for t in taken for slot, gpu in (("slot1", "GPU-aaaaaaaa"), ("slot2", "GPU-bbbbbbbb"))]
    assert len({r["timestamp"] for r in rows}) == 36  # 12 texts twice
    if kind.startswith("sqlite"):
        write_gpu_state_db(tmp_path / "gpu_state_2025-11.db", rows)
        if kind.endswith("3 rows"):
            monkeypatch.setattr(condor_archive, "_BATCH_ROWS", 3)
    else:
        pd.DataFrame(rows).to_parquet(tmp_path / "gpu_state_2025-11.parquet", index=False)
    start, end = day_window("2025-11-02", "America/Chicago")
    got = read_window(tmp_path, start, end, "America/Chicago").table
    assert sorted(got.column("snapshot_utc").to_pylist()) == sorted(taken * 2)
    claimed = {r["snapshot_utc"] for r in got.to_pylist() if r["State"] == "Claimed"}
    assert min(claimed) == dt.datetime(2025, 11, 2, 7, 0, tzinfo=UTC)  # 01:00 CST


def test_parquet_monthly_archive_is_read_like_sqlite(tmp_path):
    import pandas as pd

    rows = [slot_row("2025-08-01 00:10:00.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed"),
            slot_row("2025-08-02 00:10:00.000000", "slot1", "GPU-aaaaaaaa", "Claimed", job="s#2.0#2")]
    df = pd.DataFrame(rows)
    df["timestamp"] = pd.to_datetime(df["timestamp"])
    df.to_parquet(tmp_path / "gpu_state_2025-08.parquet")
    start, end = day_window("2025-08-02", "UTC")
    read = read_window(tmp_path, start, end, "UTC")
    assert read.table.column("State").to_pylist() == ["Claimed"]
    assert read.table.column("snapshot_utc").to_pylist() == [dt.datetime(2025, 8, 2, 0, 10, tzinfo=UTC)]


def test_a_month_file_another_file_of_the_month_shadows_is_named_not_read_unseen(tmp_path):
    """A month's .db beside a .parquet and a .sqlite of the same month (a conversion left behind):
    the .db is read, and the other two were skipped with nothing said; they are named now."""
    import pandas as pd

    write_gpu_state_db(tmp_path / "gpu_state_2025-08.db",
                       [slot_row("2025-08-02 00:10:00.000000", "slot1", "GPU-aaaaaaaa", "Claimed", job="s#2.0#2")])
    write_gpu_state_db(tmp_path / "gpu_state_2025-08.sqlite",
                       [slot_row("2025-08-02 00:10:00.000000", "slot1", "GPU-bbbbbbbb", "Unclaimed")])
    pd.DataFrame([slot_row("2025-08-02 00:10:00.000000", "slot1", "GPU-cccccccc", "Unclaimed")]).to_parquet(
        tmp_path / "gpu_state_2025-08.parquet")
    write_gpu_state_db(tmp_path / "gpu_state_2025-09.sqlite",  # another month: not this day's
                       [slot_row("2025-09-02 00:10:00.000000", "slot1", "GPU-aaaaaaaa", "Claimed")])
    start, end = day_window("2025-08-02", "UTC")
    read = read_window(tmp_path, start, end, "UTC")
    assert read.table.column("AssignedGPUs").to_pylist() == ["GPU-aaaaaaaa"]
    assert [Path(f).name for f in read.shadowed_files] == ["gpu_state_2025-08.parquet", "gpu_state_2025-08.sqlite"]


@pytest.mark.parametrize("unit", ["us", "ns"])  # pandas 2 writes an aware column in nanoseconds
def test_a_time_zone_aware_parquet_timestamp_is_its_instant(tmp_path, unit):
    """pandas writes an aware column as ``timestamp[us, tz=UTC]``: those are instants, not local
    times to localize again (read as Chicago local time they came out 5 hours late). A day's window
    in the archive's zone takes the rows of that local day."""
    import pyarrow.parquet as pq

    instants = [dt.datetime(2025, 8, 5, h, 0, 1, tzinfo=UTC) for h in (4, 6, 12, 18)]  # 04:00Z: Aug 4 CDT
    rows = {"Name": ["slot1@h"] * 4, "AssignedGPUs": ["GPU-aaaaaaaa"] * 4, "State": ["Unclaimed"] * 4,
            "Machine": ["h"] * 4, "timestamp": pa.array(instants, pa.timestamp(unit, tz="UTC"))}
    pq.write_table(pa.table(rows), tmp_path / "gpu_state_2025-08.parquet")
    start, end = day_window("2025-08-05", "America/Chicago")
    read = read_window(tmp_path, start, end, "America/Chicago")
    assert read.table.column("snapshot_utc").to_pylist() == instants[1:]
    assert read.table.column("timestamp_local").to_pylist()[0] == "2025-08-05 06:00:01.000000+00:00"


def test_a_parquet_archive_of_text_timestamps_reads_as_the_sqlite_text(tmp_path):
    """Text timestamps are compared and read as a SQLite file's: one unreadable value no longer fails
    every day of the month (a cast in the filter did), and an offset in the text is honoured."""
    import pyarrow.parquet as pq

    def write(stamps):
        n = len(stamps)
        pq.write_table(pa.table({"Name": ["slot1@h"] * n, "AssignedGPUs": ["GPU-aaaaaaaa"] * n,
                                 "State": ["Unclaimed"] * n, "Machine": ["h"] * n, "timestamp": stamps}),
                       tmp_path / "gpu_state_2025-08.parquet")

    start, end = day_window("2025-08-05", "UTC")
    write(["2025-08-05 06:00:01.000000", "garbage", "2025-08-05 2x:00", "2025-08-05 07:00:01.000000"])
    read = read_window(tmp_path, start, end, "UTC")
    assert read.table.column("snapshot_utc").to_pylist() == [dt.datetime(2025, 8, 5, h, 0, 1, tzinfo=UTC) for h in (6, 7)]
    # the unreadable time within the day's text range, by its row ("garbage", after every date, is
    # the last day's that opens the file: 1 September's)
    assert [r[1] for r in read.rejected] == [2]
    write(["2025-08-05 01:00:01.000000-05:00", "2025-08-05 12:00:01.000000-05:00"])
    read = read_window(tmp_path, start, end, "America/Chicago")
    assert read.table.column("snapshot_utc").to_pylist() == [dt.datetime(2025, 8, 5, h, 0, 1, tzinfo=UTC) for h in (6, 17)]


def test_missing_table_names_the_file(tmp_path):
    path = tmp_path / "gpu_state_2025-08.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE other (x)")
    con.close()
    start, end = day_window("2025-08-01", "UTC")
    with pytest.raises(ArchiveError, match=r"gpu_state_2025-08\.db: no table 'gpu_state'"):
        read_window(tmp_path, start, end, "UTC")


def test_corrupt_file_names_the_file(tmp_path):
    (tmp_path / "gpu_state_2025-08.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 3000)
    start, end = day_window("2025-08-01", "UTC")
    with pytest.raises(ArchiveError, match=r"gpu_state_2025-08\.db"):
        read_window(tmp_path, start, end, "UTC")


def test_missing_directory_is_a_clear_error(tmp_path):
    start, end = day_window("2025-08-01", "UTC")
    with pytest.raises(ArchiveError, match="does not exist"):
        read_window(tmp_path / "nope", start, end, "UTC")


def _both_readers(monkeypatch, archive_dir, start, end, tz):
    """(columnar read, row-by-row read) of the same window."""
    from gpu_pipeline.lib import condor_archive

    fast = read_window(archive_dir, start, end, tz)

    def refuse(*args):
        raise condor_archive._NotColumnar("forced")
        yield  # a generator, like the real reader

    monkeypatch.setattr(condor_archive, "_sqlite_batches", refuse)
    slow = read_window(archive_dir, start, end, tz)
    monkeypatch.undo()
    assert set(slow.read_paths.values()) == {"row_by_row"}
    return fast, slow


def test_columnar_sqlite_read_equals_the_row_by_row_read_on_a_simulated_month(tmp_path, monkeypatch):
    from gpu_pipeline.lib.simulate import SimConfig, simulate

    simulate(tmp_path, SimConfig(start=dt.date(2025, 8, 4), end=dt.date(2025, 8, 5), gpus=24, seed=5,
                                 timezone="America/Chicago", telemetry_interval_s=0, kueue_interval_s=0))
    start, end = day_window("2025-08-05", "America/Chicago")
    fast, slow = _both_readers(monkeypatch, tmp_path / "condor", start, end, "America/Chicago")
    assert fast.table.num_rows > 10_000 and set(fast.read_paths.values()) == {"columnar"}
    assert fast.table.equals(slow.table)
    assert (fast.non_numeric, fast.rejected, fast.files) == (slow.non_numeric, slow.rejected, slow.files)


def test_columnar_read_hands_odd_values_to_the_row_by_row_rules(tmp_path, monkeypatch):
    rows = [slot_row(f"2025-08-05 {h:02d}:00:01.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed") for h in range(6)]
    rows[1]["GPUs_GlobalMemoryMb"] = "lots"  # text in a numeric column
    rows[2]["Name"] = 42  # a number in a text column
    path = write_gpu_state_db(tmp_path / "gpu_state_2025-08.db", rows, OLD_COLUMNS)
    con = sqlite3.connect(path)
    con.execute("UPDATE gpu_state SET State = CAST(X'436c61696d6564ff' AS TEXT) WHERE rowid = 4")  # not UTF-8
    con.commit()
    con.close()
    start, end = day_window("2025-08-05", "UTC")
    fast, slow = _both_readers(monkeypatch, tmp_path, start, end, "UTC")
    assert set(fast.read_paths.values()) == {"row_by_row"} and fast.table.equals(slow.table)
    assert fast.non_numeric == {"GPUs_GlobalMemoryMb": 1}
    assert fast.table.column("Name").to_pylist()[2] == "42"
    assert fast.table.column("State").to_pylist()[3] == "Claimed\ufffd"


def test_a_non_finite_number_is_nulled_and_counted_by_both_readers(tmp_path, monkeypatch):
    """SQLite keeps 1e999 as an infinite REAL: a memory of Infinity is no number (nulled, counted in
    non_numeric), on the columnar and the row-by-row read alike, and the day's slots clean (the
    cleaner's cast to BIGINT failed the day)."""
    from gpu_pipeline.lib.slots import clean_slot_rows

    rows = [slot_row(f"2025-08-05 {h:02d}:00:01.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed") for h in range(4)]
    rows[1]["GPUs_GlobalMemoryMb"] = float("inf")
    rows[2]["GPUs_GlobalMemoryMb"] = float("-inf")
    write_gpu_state_db(tmp_path / "gpu_state_2025-08.db", rows, OLD_COLUMNS)
    start, end = day_window("2025-08-05", "UTC")
    fast, slow = _both_readers(monkeypatch, tmp_path, start, end, "UTC")
    assert fast.table.equals(slow.table) and fast.non_numeric == slow.non_numeric == {"GPUs_GlobalMemoryMb": 2}
    assert fast.table.column("GPUs_GlobalMemoryMb").to_pylist() == [81920.0, None, None, 81920.0]
    assert clean_slot_rows(fast.table).rows_out == 4


def test_plain_columnar_read_then_masked_then_row_by_row(tmp_path, monkeypatch):
    """The plain columnar query reads what it can exactly (integers and reals mixed in a numeric
    column, a blob of UTF-8 text in a text column, a column NULL throughout, text in a column
    declared without a type); a column whose first batch is all NULL is re-read with the masked
    query; an invalid-UTF-8 blob, or a number in a text column without TEXT affinity, goes row by
    row. Each gives the row-by-row table."""
    from gpu_pipeline.lib import condor_archive

    rows = [dict(slot_row(f"2025-08-05 {h:02d}:00:01.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed"),
                 GPUsAverageUsage=None) for h in range(10)]
    rows[1]["GPUs_GlobalMemoryMb"] = 40960.5  # a real among integers
    start, end = day_window("2025-08-05", "UTC")

    def case(name, edit, read_path):
        path = write_gpu_state_db(tmp_path / name / "gpu_state_2025-08.db", rows, OLD_COLUMNS)
        con = sqlite3.connect(path)
        for sql in edit:
            con.execute(sql)
        con.commit()
        con.close()
        monkeypatch.setattr(condor_archive, "_BATCH_ROWS", 3)  # (_both_readers undoes it)
        fast, slow = _both_readers(monkeypatch, tmp_path / name, start, end, "UTC")
        assert set(fast.read_paths.values()) == {read_path}, name
        assert fast.table.equals(slow.table), name
        return fast.table

    plain = case("plain", ["UPDATE gpu_state SET State = CAST('Claimed' AS BLOB) WHERE rowid = 5"], "columnar")
    assert plain.column("State").to_pylist()[4] == "Claimed"
    assert plain.column("GPUs_GlobalMemoryMb").to_pylist()[:2] == [81920.0, 40960.5]
    assert plain.column("GPUsAverageUsage").null_count == 10
    late = case("late", ["UPDATE gpu_state SET GlobalJobId = NULL", "UPDATE gpu_state SET GlobalJobId = 's#1.0#1' "
                         "WHERE rowid = 4"], "columnar_masked")  # after a first batch (rows 1-3) of NULLs
    assert late.column("GlobalJobId").to_pylist()[2:5] == [None, "s#1.0#1", None]
    # integers only in a reader's first batch (rows 1-3 of rows 1-5; the second reader reads rows
    # 6-10), a real in its next one (row 5): the driver stops there
    ints_then_real = case("ints_then_real", ["UPDATE gpu_state SET GPUs_GlobalMemoryMb = 40960 WHERE rowid = 2",
                                             "UPDATE gpu_state SET GPUs_GlobalMemoryMb = 20480.25 WHERE rowid = 5"],
                          "columnar_masked")
    assert ints_then_real.column("GPUs_GlobalMemoryMb").to_pylist()[:6] == [81920.0, 40960.0, 81920.0, 81920.0,
                                                                             20480.25, 81920.0]
    ints = case("ints", ["UPDATE gpu_state SET GPUs_GlobalMemoryMb = 40960 WHERE rowid = 2",
                         "UPDATE gpu_state SET GPUs_GlobalMemoryMb = 9007199254740993 WHERE rowid = 3"], "columnar")
    assert ints.column("GPUs_GlobalMemoryMb").type == pa.float64()
    assert ints.column("GPUs_GlobalMemoryMb").to_pylist()[:3] == [81920.0, 40960.0, 9007199254740992.0]
    case("odd", ["UPDATE gpu_state SET State = X'436c61696d6564ff' WHERE rowid = 5"], "row_by_row")
    # a text column declared without a type keeps numbers as numbers: SQLite's text for 1e20 is not Python's
    untyped = ["ALTER TABLE gpu_state ADD COLUMN PreventJobsReason", "UPDATE gpu_state SET PreventJobsReason = 'x'"]
    assert case("untyped", untyped, "columnar").column("PreventJobsReason").to_pylist() == ["x"] * 10
    number = case("number", [*untyped, "UPDATE gpu_state SET PreventJobsReason = 1e20 WHERE rowid = 2"], "row_by_row")
    assert number.column("PreventJobsReason").to_pylist()[:2] == ["x", "1e+20"]


def _one_range(monkeypatch, archive_dir, start, end, tz):
    """The columnar read with the file read as one rowid range (no second reader)."""
    from gpu_pipeline.lib import condor_archive

    with monkeypatch.context() as m:
        m.setattr(condor_archive, "_reader_ranges", lambda con, path, lo, hi: [None])
        return read_window(archive_dir, start, end, tz)


def test_two_readers_of_indexed_rowid_ranges_give_the_one_reader_table(tmp_path, monkeypatch):
    """A file is read through its time index: only the rowid blocks that can hold the window, split
    between two readers. The same table, rowid order kept, as one reader of the whole table and as
    the row-by-row read."""
    from gpu_pipeline.lib import condor_archive
    from gpu_pipeline.lib.simulate import SimConfig, simulate

    monkeypatch.setattr(condor_archive, "_BATCH_ROWS", 700)  # many batches, and files "large" enough to split
    monkeypatch.setattr(condor_archive, "_BLOCK_SHIFT", 9)  # blocks of 512 rowids
    simulate(tmp_path, SimConfig(start=dt.date(2025, 8, 3), end=dt.date(2025, 8, 7), gpus=16, seed=3,
                                 timezone="America/Chicago", telemetry_interval_s=0, kueue_interval_s=0))
    path = tmp_path / "condor" / "gpu_state_2025-08.db"
    start, end = day_window("2025-08-05", "America/Chicago")
    con = sqlite3.connect(path)
    lo, hi = "2025-08-04 22:00:00", "2025-08-06 02:00:00"
    readers = condor_archive._reader_ranges(con, path, lo, hi)
    (first, last), = con.execute("SELECT min(rowid), max(rowid) FROM gpu_state").fetchall()
    in_window = [r for r, in con.execute('SELECT rowid FROM gpu_state WHERE "timestamp" >= ? AND "timestamp" < ? '
                                         "ORDER BY rowid", (lo, hi))]
    con.close()
    assert len(readers) == 2
    ranges = [r for reader in readers for r in reader]
    assert all(a <= b for a, b in ranges) and all(x[1] < y[0] for x, y in zip(ranges, ranges[1:], strict=False))
    covered = sum(b - a + 1 for a, b in ranges)
    assert covered < (last - first + 1) / 2  # most of the 5-day file is never read for this day
    assert all(any(a <= r <= b for a, b in ranges) for r in in_window)  # every row of the window is
    split = read_window(tmp_path / "condor", start, end, "America/Chicago")
    whole = _one_range(monkeypatch, tmp_path / "condor", start, end, "America/Chicago")
    assert split.table.num_rows > 5_000 and split.table.equals(whole.table)
    rowids = split.table.column("source_rowid").to_pylist()
    assert rowids == sorted(rowids)
    assert readers[0][0][0] <= rowids[0] <= readers[0][-1][1] < rowids[-1] <= readers[1][-1][1]  # both contributed
    fast, slow = _both_readers(monkeypatch, tmp_path / "condor", start, end, "America/Chicago")
    assert fast.table.equals(slow.table)


def test_time_index_is_rebuilt_when_the_file_changes(tmp_path, monkeypatch):
    """The index is kept per state of the file: rows appended later (here, into a block the index
    had seen without any row of the window) are read on the next call."""
    from gpu_pipeline.lib import condor_archive

    monkeypatch.setattr(condor_archive, "_BATCH_ROWS", 2)
    monkeypatch.setattr(condor_archive, "_BLOCK_SHIFT", 1)
    stamps = [f"2025-08-{d:02d} {h:02d}:00:01.000000" for d in (4, 5, 6) for h in range(0, 24, 4)]
    path = write_gpu_state_db(tmp_path / "gpu_state_2025-08.db",
                              [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Claimed") for ts in stamps])
    start, end = day_window("2025-08-05", "UTC")
    assert read_window(tmp_path, start, end, "UTC").table.num_rows == 6
    scans = []
    real_scan = condor_archive._scan_blocks
    monkeypatch.setattr(condor_archive, "_scan_blocks", lambda con, path=None: scans.append(1) or real_scan(con, path))
    assert read_window(tmp_path, start, end, "UTC").table.num_rows == 6
    assert scans == []  # the file did not change: the index was not rebuilt
    con = sqlite3.connect(path)
    con.execute('INSERT INTO gpu_state SELECT * FROM gpu_state WHERE rowid = 1')  # a day-4 row ...
    con.execute('UPDATE gpu_state SET "timestamp" = ? WHERE rowid = (SELECT max(rowid) FROM gpu_state)',
                ("2025-08-05 23:30:00.000000",))  # ... rewritten into the window, appended last
    con.commit()
    con.close()
    again = read_window(tmp_path, start, end, "UTC")
    assert scans == [1]
    assert again.table.num_rows == 7
    assert again.table.column("timestamp_local").to_pylist()[-1] == "2025-08-05 23:30:00.000000"


def test_a_file_mostly_inside_the_window_is_read_whole_without_an_index(tmp_path, monkeypatch):
    from gpu_pipeline.lib import condor_archive

    monkeypatch.setattr(condor_archive, "_BATCH_ROWS", 2)
    monkeypatch.setattr(condor_archive, "_BLOCK_SHIFT", 1)
    stamps = [f"2025-08-05 {h:02d}:00:01.000000" for h in range(0, 24, 2)] + ["2025-08-06 12:00:00.000000"]
    path = write_gpu_state_db(tmp_path / "gpu_state_2025-08.db",
                              [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Claimed") for ts in stamps])
    monkeypatch.setattr(condor_archive, "_scan_blocks", lambda con, path=None: pytest.fail("indexed a one-day file"))
    con = sqlite3.connect(path)
    assert condor_archive._reader_ranges(con, path, "2025-08-04 22:00:00", "2025-08-06 02:00:00") == [
        [(1, 6)], [(7, 13)]]
    con.close()
    start, end = day_window("2025-08-05", "UTC")
    read = read_window(tmp_path, start, end, "UTC")
    assert read.table.column("source_rowid").to_pylist() == list(range(1, 13))


def test_time_index_ignores_non_text_timestamps_like_the_window_query(tmp_path, monkeypatch):
    """A block whose only timestamps are numbers, blobs or NULL holds no row of the window; a text
    timestamp that is not a time but sorts inside the window is still read (and quarantined)."""
    from gpu_pipeline.lib import condor_archive

    monkeypatch.setattr(condor_archive, "_BATCH_ROWS", 2)
    monkeypatch.setattr(condor_archive, "_BLOCK_SHIFT", 1)
    monkeypatch.setattr(condor_archive, "_mostly_inside", lambda *a: False)  # index even a one-day file
    stamps = [f"2025-08-05 {h:02d}:00:01.000000" for h in range(0, 24, 2)]
    path = write_gpu_state_db(tmp_path / "gpu_state_2025-08.db",
                              [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Claimed") for ts in stamps])
    con = sqlite3.connect(path)
    con.execute('UPDATE gpu_state SET "timestamp" = 20250805 WHERE rowid IN (3, 7, 8)')
    con.execute('UPDATE gpu_state SET "timestamp" = NULL WHERE rowid = 5')
    con.execute('UPDATE gpu_state SET "timestamp" = X\'00\' WHERE rowid = 6')
    con.execute('UPDATE gpu_state SET "timestamp" = \'2025-08-05 garbage\' WHERE rowid = 10')
    con.commit()
    blocks = condor_archive._scan_blocks(con)
    con.close()
    # blocks of two rowids; (7, 8) holds only numbers and is not indexed
    assert [(b.first, b.last) for b in blocks] == [(1, 2), (3, 4), (5, 6), (9, 10), (11, 12)]
    assert blocks[1].ts_min == b"" and blocks[1].ts_max == stamps[3].encode()  # a number below the text
    assert blocks[2].ts_min == b"" and blocks[2].ts_max is None  # NULL and a blob: no bound known
    assert blocks[3].ts_max == b"2025-08-05 garbage"
    start, end = day_window("2025-08-05", "UTC")
    indexed = read_window(tmp_path, start, end, "UTC")
    whole = _one_range(monkeypatch, tmp_path, start, end, "UTC")
    assert indexed.table.equals(whole.table)
    assert indexed.table.column("source_rowid").to_pylist() == [1, 2, 4, 9, 11, 12]
    # the unreadable text in the day's range, then the rows with no text (numbers, NULL, a blob), which
    # no day reads: this day's, as the rows appended before them are
    assert indexed.rejected == whole.rejected and [r[1] for r in indexed.rejected] == [10, 3, 5, 6, 7, 8]


def test_the_time_index_scanned_in_two_halves_is_the_one_pass_index(tmp_path, monkeypatch):
    """A large file's index is scanned in two halves at once (the second on its own connection): the
    same blocks as one pass; with rowids missing (deleted rows), blocks that still cover every row
    once, and the same rows read for every day."""
    from gpu_pipeline.lib import condor_archive

    monkeypatch.setattr(condor_archive, "_BATCH_ROWS", 2)
    monkeypatch.setattr(condor_archive, "_BLOCK_SHIFT", 1)
    monkeypatch.setattr(condor_archive, "_mostly_inside", lambda *a: False)
    stamps = [f"2025-08-{d:02d} {h:02d}:30:01.000000" for d in (4, 5, 6) for h in range(0, 24, 2)]
    path = write_gpu_state_db(tmp_path / "gpu_state_2025-08.db",
                              [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Claimed") for ts in stamps])
    con = sqlite3.connect(path)
    one_pass = condor_archive._scan_blocks(con)
    halves = condor_archive._scan_blocks(con, path)
    assert len(one_pass) == 18 and halves == one_pass
    con.execute("DELETE FROM gpu_state WHERE rowid IN (4, 5, 6, 7, 17, 19, 20)")
    con.commit()
    halves = condor_archive._scan_blocks(con, path)
    rowids = [r for (r,) in con.execute("SELECT rowid FROM gpu_state ORDER BY rowid")]
    con.close()
    covered = sorted(r for b in halves for r in rowids if b.first <= r <= b.last)
    assert covered == rowids  # every row in exactly one block
    for day in ("2025-08-04", "2025-08-05", "2025-08-06"):
        start, end = day_window(day, "UTC")
        condor_archive.forget_time_indexes()
        indexed = read_window(tmp_path, start, end, "UTC")
        assert indexed.table.equals(_one_range(monkeypatch, tmp_path, start, end, "UTC").table)
        assert indexed.table.num_rows > 0


def test_rows_appended_out_of_time_order_are_read_whichever_range_holds_them(tmp_path, monkeypatch):
    from gpu_pipeline.lib import condor_archive

    monkeypatch.setattr(condor_archive, "_BATCH_ROWS", 2)
    stamps = [f"2025-08-05 {h:02d}:00:01.000000" for h in range(0, 24, 2)]
    # a late-written row of the window's first hour at the end, and a next-day row in the middle
    stamps = stamps[:6] + ["2025-08-06 12:00:00.000000"] + stamps[6:] + ["2025-08-05 00:30:00.000000"]
    write_gpu_state_db(tmp_path / "gpu_state_2025-08.db",
                       [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Claimed") for ts in stamps])
    start, end = day_window("2025-08-05", "UTC")
    split = read_window(tmp_path, start, end, "UTC")
    assert split.table.equals(_one_range(monkeypatch, tmp_path, start, end, "UTC").table)
    assert split.table.num_rows == 13
    assert split.table.column("timestamp_local").to_pylist()[-1] == "2025-08-05 00:30:00.000000"


def test_dst_hour_and_odd_values_across_two_readers(tmp_path, monkeypatch):
    """The fall-back hour is still resolved by append order when its rows are split between the two
    readers; an odd value met by the second reader sends the file to the row-by-row read."""
    from gpu_pipeline.lib import condor_archive

    monkeypatch.setattr(condor_archive, "_BATCH_ROWS", 1)
    rows = [slot_row(ts, "slot1", "GPU-aaaaaaaa", "Unclaimed") for ts in (
        "2025-11-02 01:25:00.000000", "2025-11-02 01:30:00.000000", "2025-11-02 01:55:00.000000",
        "2025-11-02 01:05:00.000000", "2025-11-02 01:30:00.000001", "2025-11-02 02:00:00.000000")]
    write_gpu_state_db(tmp_path / "gpu_state_2025-11.db", rows)
    start, end = day_window("2025-11-02", "America/Chicago")
    split = read_window(tmp_path, start, end, "America/Chicago")
    assert split.table.equals(_one_range(monkeypatch, tmp_path, start, end, "America/Chicago").table)
    assert split.table.column("snapshot_utc").to_pylist()[3] == dt.datetime(2025, 11, 2, 7, 5, tzinfo=UTC)

    rows = [slot_row(f"2025-08-05 {h:02d}:00:01.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed") for h in range(8)]
    rows[7]["GPUs_GlobalMemoryMb"] = "lots"  # in the second range only
    write_gpu_state_db(tmp_path / "odd" / "gpu_state_2025-08.db", rows, OLD_COLUMNS)
    start, end = day_window("2025-08-05", "UTC")
    fast, slow = _both_readers(monkeypatch, tmp_path / "odd", start, end, "UTC")
    assert set(fast.read_paths.values()) == {"row_by_row"} and fast.table.equals(slow.table)
    assert fast.non_numeric == {"GPUs_GlobalMemoryMb": 1}


@pytest.mark.parametrize("zone", ["America/Chicago", "Asia/Tokyo"])
def test_timestamp_text_with_an_offset_is_read_by_its_instant(tmp_path, zone):
    """An archive written from aware times (pandas ``to_sql`` writes ``...+00:00``): each row is its
    instant whatever the source zone, and the day's rows are all read (the text was compared with
    the zone's local window and a day lost up to 3 hours at either end), each on one day only."""
    rows = [slot_row(f"2025-08-06 {h:02d}:00:00.000000+00:00", "slot1", "GPU-aaaaaaaa", "Unclaimed")
            for h in range(24)]
    write_gpu_state_db(tmp_path / "gpu_state_2025-08.db", rows)
    per_day = {day: read_window(tmp_path, *day_window(day, "UTC"), zone).table.column("snapshot_utc").to_pylist()
               for day in ("2025-08-05", "2025-08-06", "2025-08-07")}
    assert per_day["2025-08-06"] == [dt.datetime(2025, 8, 6, h, tzinfo=dt.UTC) for h in range(24)]
    assert per_day["2025-08-05"] == per_day["2025-08-07"] == []


@pytest.mark.parametrize("kind", ["sqlite", "sqlite with a time index", "parquet"])
def test_a_row_whose_time_no_day_reads_is_set_aside_once(tmp_path, kind, monkeypatch):
    """A timestamp that is NULL or a number, or text outside what the days that open the file read
    (``garbage`` sorts after every date, ``10/03/2025 ...`` before, ``2025-05-20`` in the March
    file), lies in no day's text range: no day read it, and none set it aside (rows lost without a
    count). Text after (before) the range of the last (first) day that opens the file -- here the
    UTC days 1 April (its local range to 19:00 on 1 April CDT) and 1 March -- is set aside by that
    day; a row without text by the day that read the row appended before it (the collector appends
    in time order; a nightly run of that day meets it), the first day when none is before it. Text
    in a day's own local range that is not a time of the archive's form is that day's, also when
    Python could read it (``2025-03-10T12:10:00``, 17:10 UTC on the 10th, lies in the text range of
    the UTC day 2025-03-11: read by no day before). Every row is read or set aside exactly once
    over the days that open the file."""
    import pandas as pd

    from gpu_pipeline.lib.condor_archive import rejected_rows

    texts = [None, "2025-03-10 12:00:00.000000", "2025-03-10 12:05:00.000000x", None, "garbage",
             "2025-03-10T12:10:00", "10/03/2025 12:15:00", "2025-05-20 10:00:00.000000"]
    rows = [slot_row(t, "slot1", "GPU-aaaaaaaa", "Unclaimed") for t in texts]
    if kind.startswith("sqlite"):
        rows.append(slot_row("2025-03-10 12:20:00.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed"))
        path = write_gpu_state_db(tmp_path / "gpu_state_2025-03.db", rows)
        con = sqlite3.connect(path)
        con.execute('UPDATE gpu_state SET "timestamp" = 20250310 WHERE rowid = 9')  # a number
        con.commit()
        con.close()
        texts.append("20250310")
        if kind.endswith("index"):  # blocks of 2 rowids; the strays are looked for outside the clean ones
            from gpu_pipeline.lib import condor_archive

            monkeypatch.setattr(condor_archive, "_BATCH_ROWS", 2)
            monkeypatch.setattr(condor_archive, "_BLOCK_SHIFT", 1)
            monkeypatch.setattr(condor_archive, "_mostly_inside", lambda *a: False)
            real, looked = condor_archive._stray_ranges, []
            monkeypatch.setattr(condor_archive, "_stray_ranges", lambda *a: looked.append(real(*a)) or looked[-1])
    else:
        pd.DataFrame(rows).astype({"timestamp": "string"}).to_parquet(tmp_path / "gpu_state_2025-03.parquet",
                                                                      index=False)
    first = 0 if kind == "parquet" else 1  # Parquet rows are numbered from 0, SQLite's rowids from 1
    read_rows: list[int] = []
    set_aside: dict[str, list] = {}
    for day in range(0, 33):
        s = dt.datetime(2025, 3, 1, tzinfo=UTC) + dt.timedelta(days=day - 1)
        got = read_window(tmp_path, s, s + dt.timedelta(days=1), "America/Chicago")
        read_rows += [r - first for r in got.table["source_rowid"].to_pylist()]
        q = rejected_rows(got)
        assert got.unparseable_timestamps == q.num_rows
        if q.num_rows:
            set_aside[s.date().isoformat()] = [
                (r["source_row"] - first, r["reason"].split(" (")[0], json.loads(r["row_json"])["timestamp"])
                for r in q.to_pylist()]
            assert {r["source_table"] for r in q.to_pylist()} == {"raw/condor_slot_snapshots"}
            assert {r["source_file"] for r in q.to_pylist()} == {str(next(tmp_path.iterdir()))}
    no_text, far = "no timestamp text", "timestamp outside the days that read the file"
    assert read_rows == [1]
    assert set_aside == {
        "2025-03-01": [(0, no_text, None), (6, far, texts[6])],  # no row before it; before every day's range
        "2025-03-10": [(2, "unparseable timestamp", texts[2]), (3, no_text, None)],
        "2025-03-11": [(5, "unparseable timestamp", texts[5])],
        "2025-04-01": [(4, far, "garbage"), (7, far, texts[7])]
        + ([] if kind == "parquet" else [(8, no_text, "20250310")]),  # the row before it: 20 May
    }
    if kind.endswith("index"):  # the strays were looked for through the index, on every day
        assert len(looked) == 32 and None not in looked  # 1 March to 1 April (UTC) open the March file


def test_strays_are_looked_for_outside_the_clean_blocks_of_the_time_index(monkeypatch):
    """A block of the time index whose times are all text of the month (and its slack) holds no
    stray: only the rowids outside such blocks are looked at."""
    from gpu_pipeline.lib import condor_archive as ca

    def clean(first: int, last: int, since: bytes = b"2025-03-02 00:00:00") -> object:
        return ca._Block(first, last, since, b"2025-03-30 00:00:00")

    blocks = [clean(1, 2), ca._Block(3, 4, b"", None, nontext=True), clean(5, 6),
              ca._Block(7, 8, b"2025-03-02 00:00:00", b"garbage"), clean(9, 10),
              clean(13, 14, b"2025-03-10 00:00:00")]
    monkeypatch.setattr(ca, "_cached_index", lambda path: blocks)
    # a day in the middle of the month: only the blocks with a timestamp that is not text
    assert ca._stray_ranges(Path("x"), None, None) == [(-(2**63), 0), (3, 4), (11, 12), (15, 2**63 - 1)]
    # the last day that opens the file: also the blocks with text at or after its range's end
    assert ca._stray_ranges(Path("x"), "2025-04-01 21:00:00", None) == [(-(2**63), 0), (3, 4), (7, 8), (11, 12),
                                                                         (15, 2**63 - 1)]
    # the first: also the blocks with text before its range's start
    assert ca._stray_ranges(Path("x"), None, "2025-03-05 00:00:00") == [(-(2**63), 12), (15, 2**63 - 1)]
    monkeypatch.setattr(ca, "_cached_index", lambda path: None)
    assert ca._stray_ranges(Path("x"), None, None) is None


@pytest.mark.parametrize("folder", ["with #hash", "what?", "with %41pct", "plain"])
def test_an_archive_folder_named_with_uri_characters_is_read(tmp_path, folder):
    """The read-only SQLite URI was ``file:{path}?mode=ro`` as written: ``#`` began its fragment and
    ``?`` its query, so SQLite opened another path read-write (creating an empty file beside the
    folder: "no table 'gpu_state'"), and ``%41`` was read as ``A``."""
    where = tmp_path / folder
    rows = [slot_row(f"2025-08-05 {h:02d}:00:01.000000", "slot1", "GPU-aaaaaaaa", "Claimed") for h in range(24)]
    write_gpu_state_db(where / "gpu_state_2025-08.db", rows)
    start, end = day_window("2025-08-05", "UTC")
    got = read_window(where, start, end, "UTC")
    assert got.table.num_rows == 24 and got.read_paths == {str(where / "gpu_state_2025-08.db"): "columnar"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder]  # nothing created beside it


def test_a_stray_in_a_parquet_archive_of_aware_times_goes_to_the_day_of_the_row_before(tmp_path):
    """An aware ``timestamp`` column (what pandas writes for aware times): the row before a NULL
    was shown as UTC text without its offset and read as local time, so the stray went to the next
    day; it now goes to the day that read that row."""
    import pyarrow.parquet as pq

    base = slot_row("2025-03-14 22:00:00.000000", "slot1", "GPU-aaaaaaaa", "Unclaimed")
    ts = [dt.datetime(2025, 3, 15, 3, 0, tzinfo=UTC), None, dt.datetime(2025, 3, 15, 3, 5, tzinfo=UTC)]
    cols = {k: [base[k]] * 3 for k in base}
    cols["timestamp"] = pa.array(ts, pa.timestamp("us", tz="UTC"))
    pq.write_table(pa.table(cols), tmp_path / "gpu_state_2025-03.parquet")
    got = {}
    for day in ("2025-03-14", "2025-03-15"):
        r = read_window(tmp_path, *day_window(day, "America/Chicago"), "America/Chicago")
        got[day] = (r.table.num_rows, [x[1] for x in r.rejected])
    assert got == {"2025-03-14": (2, [1]), "2025-03-15": (0, [])}  # 21:00 and 21:05 CDT on the 14th
