import dataclasses
import os

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_pipeline.lib import store as store_mod
from gpu_pipeline.lib.schemas import GPU_STATES, QUARANTINE
from gpu_pipeline.lib.store import Store, create_catalog, safe_name


def q_rows(n: int, reason: str = "r") -> pa.Table:
    return pa.Table.from_pydict(
        {"source_table": ["t"] * n, "reason": [reason] * n, "row_json": ["{}"] * n},
    )


def test_layout_and_rerun_replaces_never_appends(data_root):
    store = Store(data_root)
    first = store.write_partition(QUARANTINE, "2025-08-06", q_rows(3))
    assert first.uri.endswith("/quarantine/slot_snapshots/date=2025-08-06/part-0.parquet")
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(2, "second"))
    table = store.read_table(QUARANTINE, "2025-08-06")
    assert table.num_rows == 2 and set(table.column("reason").to_pylist()) == {"second"}
    # exactly the table's schema, columns added as nulls where the input lacked them
    assert pq.read_schema(store.partition_file(QUARANTINE, "2025-08-06")).names == QUARANTINE.schema.names
    # no temp files are left behind
    leftovers = [p for p in store.partition_file(QUARANTINE, "2025-08-06").parent.iterdir()
                 if p.name not in {"part-0.parquet", ".lock"}]
    assert leftovers == []


def test_same_input_gives_identical_bytes(data_root):
    store = Store(data_root)
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(5))
    a = store.partition_file(QUARANTINE, "2025-08-06").read_bytes()
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(5))
    assert store.partition_file(QUARANTINE, "2025-08-06").read_bytes() == a


def test_failing_write_leaves_the_old_file(data_root, monkeypatch):
    store = Store(data_root)
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(3))
    path = store.partition_file(QUARANTINE, "2025-08-06")
    before = path.read_bytes()

    # 1. bad data is refused before anything is written
    with pytest.raises(ValueError, match="unexpected columns"):
        store.write_partition(QUARANTINE, "2025-08-06", q_rows(1).append_column("bogus", pa.array([1])))
    assert path.read_bytes() == before

    # 2. a crash between writing the temp file and the rename
    def boom(*a, **k):
        raise OSError("disk went away")

    monkeypatch.setattr(store_mod.os, "replace", boom)
    with pytest.raises(OSError, match="disk went away"):
        store.write_partition(QUARANTINE, "2025-08-06", q_rows(9))
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [".lock", "part-0.parquet"]


def test_empty_day_has_full_schema_and_reads_with_other_days(data_root):
    store = Store(data_root)
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(2))
    store.write_partition(QUARANTINE, "2025-08-07", q_rows(0))
    con = duckdb.connect()
    create_catalog(con, store)
    rows = con.sql("SELECT date, count(*) FROM quarantine.slot_snapshots GROUP BY 1 ORDER BY 1").fetchall()
    assert [(str(d), n) for d, n in rows] == [("2025-08-06", 2)]
    assert store.partition_days(QUARANTINE) == ["2025-08-06", "2025-08-07"]
    # a table with no partitions still has a (empty) view with its columns
    cols = [r[0] for r in con.sql("DESCRIBE metrics.gpu_states").fetchall()]
    assert cols[: len(GPU_STATES.schema)] == GPU_STATES.schema.names


def test_relation_sql_skips_missing_days(data_root):
    store = Store(data_root)
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(2))
    sql, params = store.relation_sql(QUARANTINE, ["2025-08-05", "2025-08-06"])
    con = duckdb.connect()
    assert con.sql(f"SELECT count(*) FROM {sql}", params=params).fetchall() == [(2,)]
    sql, params = store.relation_sql(QUARANTINE, ["2025-08-01"])
    assert con.sql(f"SELECT count(*) FROM {sql}", params=params or None).fetchall() == [(0,)]


def test_partitions_written_before_a_column_was_added_read_it_as_null(data_root):
    """An upgrade adds a column: the days written before lack it. Read by name, they give null in
    it; by position DuckDB took the first file's columns (an old first day dropped the new column
    from every day) or failed on an old file after a new one."""
    store = Store(data_root)
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(2).append_column("source_row", pa.array([7, 8])))
    old = store.read_table(QUARANTINE, "2025-08-06").drop_columns(["source_row"]).slice(0, 1)
    for day in ("2025-08-05", "2025-08-07"):
        path = store.partition_file(QUARANTINE, day)
        path.parent.mkdir(parents=True)
        pq.write_table(old, path)
    con = duckdb.connect()
    for days in (["2025-08-05", "2025-08-06"], ["2025-08-06", "2025-08-07"], ["2025-08-05", "2025-08-07"],
                 ["2025-08-06"]):
        sql, params = store.relation_sql(QUARANTINE, days)
        rows = con.sql(f"SELECT * FROM {sql}", params=params)
        assert rows.columns == QUARANTINE.schema.names
        assert sorted(r[3] for r in rows.fetchall() if r[3] is not None) == ([7, 8] if "2025-08-06" in days else [])
        assert con.sql(f"SELECT count(*) FROM {sql}", params=params).fetchall() == [(len(days) + ("2025-08-06" in days),)]
    create_catalog(con, store)
    assert con.sql("SELECT CAST(date AS VARCHAR), source_row FROM quarantine.slot_snapshots ORDER BY 1, 2").fetchall() == [
        ("2025-08-05", None), ("2025-08-06", 7), ("2025-08-06", 8), ("2025-08-07", None)]
    t = store.read_table(QUARANTINE, "2025-08-05")
    assert t.column_names == QUARANTINE.schema.names and t["source_row"].to_pylist() == [None]
    assert store.read_table(QUARANTINE, "2025-08-05", ["source_row", "reason"]).to_pylist() == [
        {"source_row": None, "reason": "r"}]
    assert store.read_table(QUARANTINE, "2025-08-05", ["reason"], where=("source_row", "==", 7)).num_rows == 0
    assert store.read_table(QUARANTINE, "2025-08-06", ["reason"], where=("source_row", "==", 7)).num_rows == 1
    # only the new column asked for, filtered on an old one: the matching rows keep their count
    assert store.read_table(QUARANTINE, "2025-08-05", ["source_row"], where=("reason", "==", "r")).to_pylist() == [
        {"source_row": None}]


def test_a_saved_catalog_reads_a_column_that_later_days_add(data_root, tmp_path):
    """``sql --catalog`` saves the views in a DuckDB file. Saved while every day lacked a column, a
    view must still read it from the days written later (a projection fixed at creation read null)."""
    store = Store(data_root)
    old = q_rows(1)  # no source_row: written before the column was added
    path = store.partition_file(QUARANTINE, "2025-08-05")
    path.parent.mkdir(parents=True)
    pq.write_table(old, path)
    catalog = str(tmp_path / "catalog.duckdb")
    con = duckdb.connect(catalog)
    create_catalog(con, store)
    con.close()
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(1).append_column("source_row", pa.array([9])))
    con = duckdb.connect(catalog, read_only=True)
    assert con.sql("SELECT CAST(date AS VARCHAR), source_row FROM quarantine.slot_snapshots ORDER BY 1").fetchall() == [
        ("2025-08-05", None), ("2025-08-06", 9)]
    assert [r[0] for r in con.sql("DESCRIBE quarantine.slot_snapshots").fetchall()] == [*QUARANTINE.schema.names, "date"]
    # the GPU spec reference is read by any client of the file (a view of an Arrow table registered
    # on the writing connection failed in every other one), and writing the catalog again works
    from gpu_pipeline.lib.gpu_specs import spec_table

    assert con.execute("SELECT count(*) FROM reference.gpu_specs").fetchone()[0] == spec_table().num_rows > 0
    con.close()
    con = duckdb.connect(catalog)
    create_catalog(con, store)
    assert con.execute("SELECT count(*) FROM reference.gpu_specs").fetchone()[0] == spec_table().num_rows
    con.close()


def test_a_catalog_over_a_root_with_glob_characters_and_its_empty_tables(tmp_path):
    """A data root named ``run[1]`` (a glob class to DuckDB) gets working views; the tables with no
    partition yet are named, since their views stay empty in a saved file until it is written again."""
    from gpu_pipeline.lib.store import empty_tables

    store = Store(tmp_path / "run[1]*")
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(2))
    con = duckdb.connect()
    create_catalog(con, store)
    assert con.sql("SELECT count(*) FROM quarantine.slot_snapshots").fetchall() == [(2,)]
    empty = empty_tables(store)
    assert "quarantine.slot_snapshots" not in empty and "clean.jobs" in empty and "reference.gpu_specs" not in empty
    assert con.sql("SELECT count(*) FROM clean.jobs").fetchall() == [(0,)]


def test_object_store_roots_are_refused_clearly():
    with pytest.raises(ValueError, match="only local directories"):
        Store("s3://bucket/prefix")


@pytest.mark.parametrize("name", ["../../etc/passwd", "a/b", "..", "gpu01.example.edu"])
def test_safe_name_never_escapes(name):
    s = safe_name(name)
    assert "/" not in s and ".." not in s and s
    assert os.path.basename(s) == s


def test_streamed_partition_is_byte_identical_to_the_whole_table_write(data_root, monkeypatch):
    """write_partition_batches re-cuts any stream of batches into the same row groups, so the file is
    the one write_partition writes from the whole table (here with 10-row groups)."""
    monkeypatch.setattr(store_mod, "ROW_GROUP_SIZE", 10)
    store = Store(data_root)
    table = store_mod.conform(q_rows(37, "x").append_column("source_row", pa.array(range(37), pa.int64())),
                              QUARANTINE)
    whole = store.write_partition(QUARANTINE, "2025-08-06", table)
    expected = store.partition_file(QUARANTINE, "2025-08-06").read_bytes()
    assert pq.ParquetFile(store.partition_file(QUARANTINE, "2025-08-06")).metadata.num_row_groups == 4
    for sizes in ([37], [3, 3, 3, 20, 8], [10, 10, 10, 7], [1] * 37):
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        batches = [b for o, n in zip(offsets, sizes, strict=True) for b in table.slice(o, n).to_batches()]
        streamed = store.write_partition_batches(QUARANTINE, "2025-08-07", iter(batches))
        assert (streamed.rows, streamed.bytes) == (37, whole.bytes)
        assert store.partition_file(QUARANTINE, "2025-08-07").read_bytes() == expected


def test_a_stream_that_fails_midway_leaves_the_old_partition(data_root):
    store = Store(data_root)
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(3, "old"))
    before = store.partition_file(QUARANTINE, "2025-08-06").read_bytes()

    def broken():
        yield from store_mod.conform(q_rows(5, "new"), QUARANTINE).to_batches()
        raise RuntimeError("source went away")

    with pytest.raises(RuntimeError, match="source went away"):
        store.write_partition_batches(QUARANTINE, "2025-08-06", broken())
    assert store.partition_file(QUARANTINE, "2025-08-06").read_bytes() == before
    assert [p.name for p in store.partition_file(QUARANTINE, "2025-08-06").parent.iterdir()
            if p.name not in {"part-0.parquet", ".lock"}] == []


def test_statistics_are_kept_for_times_numbers_and_flags_not_for_text(data_root):
    """Readers prune on the min/max of times and numbers; text columns carry none (a day's file spans
    every host and GPU, so theirs would rule nothing out)."""
    import datetime as dt

    store = Store(data_root)
    t0 = dt.datetime(2025, 8, 6, tzinfo=dt.UTC)
    rows = {
        "bucket_start_utc": [t0 + dt.timedelta(minutes=5 * i) for i in range(4)],
        "gpu_id": ["GPU-b", "GPU-a", "GPU-c", "GPU-a"], "host": ["h2", "h1", "h3", "h1"],
        "state": ["idle_prioritized"] * 4, "n_slot_rows": [1, 3, 2, 1],
    }
    for write in (lambda t: store.write_partition(GPU_STATES, "2025-08-06", t),
                  lambda t: store.write_partition_batches(GPU_STATES, "2025-08-06",
                                                          iter(store_mod.conform(t, GPU_STATES).to_batches()))):
        write(pa.Table.from_pydict(rows))
        meta = pq.ParquetFile(store.partition_file(GPU_STATES, "2025-08-06")).metadata.row_group(0)
        stats = {meta.column(i).path_in_schema: meta.column(i).statistics for i in range(meta.num_columns)}
        assert stats["bucket_start_utc"].has_min_max
        assert (stats["bucket_start_utc"].min, stats["bucket_start_utc"].max) == (t0, t0 + dt.timedelta(minutes=15))
        assert (stats["n_slot_rows"].min, stats["n_slot_rows"].max) == (1, 3)
        for text in ("gpu_id", "host", "state"):
            assert stats[text] is None or not stats[text].has_min_max, text


def test_measurements_marked_plain_are_written_without_a_dictionary(data_root):
    """Columns the schema marks NO_DICTIONARY (power, memory used, energy: values that rarely repeat)
    skip dictionary encoding; the others keep it, and the values read back the same."""
    import datetime as dt

    from gpu_pipeline.lib.schemas import GPU_SAMPLES, NO_DICTIONARY

    plain = {f.name for f in GPU_SAMPLES.schema
             if (f.metadata or {}).get(b"parquet_dictionary") == NO_DICTIONARY["parquet_dictionary"].encode()}
    assert {"power_w", "mem_used_mib", "energy_mj"} <= plain and "util_pct" not in plain
    t0 = dt.datetime(2025, 8, 6, tzinfo=dt.UTC)
    n = 500
    table = pa.Table.from_pydict({
        "sample_utc": [t0 + dt.timedelta(seconds=30 * i) for i in range(n)], "source": ["dcgm"] * n,
        "gpu_id": ["GPU-aaaaaaaa"] * n, "util_pct": [float(i % 7) for i in range(n)],
        "power_w": [100.0 + i / 7 for i in range(n)], "energy_mj": [1e6 + 3.3 * i for i in range(n)],
    })
    store = Store(data_root)
    store.write_partition(GPU_SAMPLES, "2025-08-06", table)
    path = store.partition_file(GPU_SAMPLES, "2025-08-06")
    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunks = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    for name in ("power_w", "energy_mj"):
        assert not chunks[name].has_dictionary_page, name
    for name in ("util_pct", "gpu_id", "sample_utc"):
        assert chunks[name].has_dictionary_page, name
    back = store.read_table(GPU_SAMPLES, "2025-08-06")
    assert back.column("power_w").to_pylist() == table.column("power_w").to_pylist()


def test_read_where_reads_only_matching_rows_of_each_row_group(data_root, monkeypatch):
    import datetime as dt

    import pyarrow.compute as pc

    from gpu_pipeline.lib.schemas import GPU_SAMPLES

    spec = dataclasses.replace(GPU_SAMPLES, row_group_rows=7)
    store = Store(data_root)
    t0 = dt.datetime(2025, 8, 4, tzinfo=dt.UTC)
    sources = ["dcgm"] * 20 + ["terapixel"] * 3 + ["dcgm"] * 9 + ["terapixel"]
    rows = [{"sample_utc": t0 + dt.timedelta(seconds=i), "source": s, "gpu_id": f"GPU-{i:08x}", "util_pct": float(i)}
            for i, s in enumerate(sources)]
    table = pa.Table.from_pylist(rows, schema=pa.schema([spec.schema.field(c) for c in rows[0]]))
    store.write_partition(spec, "2025-08-04", table)
    assert pq.ParquetFile(store.partition_file(spec, "2025-08-04")).num_row_groups == 5
    whole = store.read_table(spec, "2025-08-04")
    got = store.read_table(spec, "2025-08-04", where=("source", "==", "terapixel"))
    assert got.equals(whole.filter(pc.equal(whole["source"], "terapixel")))
    assert got["util_pct"].to_pylist() == [20.0, 21.0, 22.0, 32.0]
    assert got.schema.equals(spec.schema, check_metadata=True)
    cols = store.read_table(spec, "2025-08-04", ["gpu_id"], where=("util_pct", ">=", 31.0))
    assert cols.column_names == ["gpu_id"] and cols["gpu_id"].to_pylist() == ["GPU-0000001f", "GPU-00000020"]
    assert store.read_table(spec, "2025-08-04", where=("source", "==", "nvml")).num_rows == 0


def test_a_streamed_write_gives_the_sha256_of_the_bytes_it_wrote(data_root):
    import hashlib

    store = Store(data_root)
    batches = store_mod.conform(q_rows(25, "x"), QUARANTINE).to_batches(max_chunksize=7)
    written = store.write_partition_batches(QUARANTINE, "2025-08-06", iter(batches), digest=True)
    on_disk = store.partition_file(QUARANTINE, "2025-08-06").read_bytes()
    assert written.sha256 == hashlib.sha256(on_disk).hexdigest()
    assert store.write_partition_batches(QUARANTINE, "2025-08-07", iter(batches)).sha256 is None
    assert store.partition_file(QUARANTINE, "2025-08-07").read_bytes() == on_disk  # the same file either way


def test_a_digest_known_from_the_write_or_copy_is_not_read_again_until_the_file_changes(data_root, monkeypatch):
    import hashlib

    store = Store(data_root)
    reads = []
    file_digest = hashlib.file_digest
    monkeypatch.setattr(store_mod.hashlib, "file_digest", lambda fh, name: reads.append(name) or file_digest(fh, name))
    batches = store_mod.conform(q_rows(25, "x"), QUARANTINE).to_batches(max_chunksize=7)
    written = store.write_partition_batches(QUARANTINE, "2025-08-06", iter(batches), digest=True)
    assert store.partition_sha256(QUARANTINE, "2025-08-06") == written.sha256 and reads == []
    with store.partition_file(QUARANTINE, "2025-08-06").open("rb") as fh:
        store.write_partition_copy(QUARANTINE, "2025-08-07", fh, sha256=written.sha256)
    assert store.partition_sha256(QUARANTINE, "2025-08-07") == written.sha256 and reads == []
    # replaced by a writer that did not hash it: read, then remembered
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(3, "other"))
    on_disk = hashlib.sha256(store.partition_file(QUARANTINE, "2025-08-06").read_bytes()).hexdigest()
    assert store.partition_sha256(QUARANTINE, "2025-08-06") == on_disk != written.sha256
    assert store.partition_sha256(QUARANTINE, "2025-08-06") == on_disk and reads == ["sha256"]


def test_a_copy_checked_against_another_digest_replaces_nothing(data_root):
    import hashlib

    store = Store(data_root)
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(4, "source"))
    store.write_partition(QUARANTINE, "2025-08-07", q_rows(2, "old"))
    source = store.partition_file(QUARANTINE, "2025-08-06")
    target = store.partition_file(QUARANTINE, "2025-08-07")
    before = target.read_bytes()
    with source.open("rb") as fh, pytest.raises(store_mod.ContentMismatch, match="not the ones expected"):
        store.write_partition_copy(QUARANTINE, "2025-08-07", fh, sha256=hashlib.sha256(b"another file").hexdigest())
    assert target.read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == [".lock", "part-0.parquet"]  # no temp file left
    with source.open("rb") as fh:
        copied = store.write_partition_copy(QUARANTINE, "2025-08-07", fh,
                                            sha256=hashlib.sha256(source.read_bytes()).hexdigest())
    assert target.read_bytes() == source.read_bytes() and copied.rows == 4


def test_a_note_of_an_earlier_versions_name_is_read_and_then_replaced(data_root):
    store = Store(data_root)
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(1, "x"))
    legacy = store.partition_file(QUARANTINE, "2025-08-06").parent / "check.json"
    legacy.write_text('{"clean": true}')
    assert store.read_partition_note(QUARANTINE, "2025-08-06", "check") == {"clean": True}
    store.write_partition_note(QUARANTINE, "2025-08-06", "check", {"clean": False})
    assert not legacy.exists()
    assert store.read_partition_note(QUARANTINE, "2025-08-06", "check") == {"clean": False}


def test_a_partitions_note_is_kept_beside_its_file_and_read_back(data_root):
    store = Store(data_root)
    assert store.read_partition_note(QUARANTINE, "2025-08-06", "check") is None
    store.write_partition(QUARANTINE, "2025-08-06", q_rows(1, "x"))
    path = store.write_partition_note(QUARANTINE, "2025-08-06", "check", {"clean": True, "rows": 1})
    assert path.parent == store.partition_file(QUARANTINE, "2025-08-06").parent and path.name == "_check.json"
    assert store.read_partition_note(QUARANTINE, "2025-08-06", "check") == {"clean": True, "rows": 1}
    assert store.partition_days(QUARANTINE) == ["2025-08-06"]  # a note is not a partition
    # a directory reader (pandas, a pyarrow dataset) skips the note as it skips _SUCCESS
    table_dir = store.partition_file(QUARANTINE, "2025-08-06").parent.parent
    assert len(pd.read_parquet(table_dir)) == 1 and pq.ParquetDataset(table_dir).read().num_rows == 1
    path.write_text("[1, 2")  # torn or edited by hand: no note, never an error
    assert store.read_partition_note(QUARANTINE, "2025-08-06", "check") is None
    path.write_text("[1, 2]")
    assert store.read_partition_note(QUARANTINE, "2025-08-06", "check") is None


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_partition_files_and_plots_get_the_mode_the_umask_gives(tmp_path, umask):
    """Analysts read the store as other users: a partition file, a plot and an NVML sampler file get
    the mode a new file gets under the process's umask (the temp file behind the atomic write was
    0600 whatever the umask)."""
    import subprocess
    import sys

    code = f"""
import os, stat, sys
os.umask({umask})
from pathlib import Path
import pyarrow as pa
from gpu_pipeline.lib.nvml_sampler import write_parquet_atomic
from gpu_pipeline.lib.schemas import GPU_SAMPLES
from gpu_pipeline.lib.store import Store
store = Store(sys.argv[1])
store.write_partition(GPU_SAMPLES, "2025-08-05", GPU_SAMPLES.empty())
store.write_plot("heat", "2025-08-05", b"png")
write_parquet_atomic(GPU_SAMPLES.empty(), Path(sys.argv[1]) / "nvml.parquet")
for path in (store.partition_file(GPU_SAMPLES, "2025-08-05"), store.plot_file("heat", "2025-08-05"),
             Path(sys.argv[1]) / "nvml.parquet"):
    print(oct(stat.S_IMODE(path.stat().st_mode)))
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [oct(0o666 & ~umask)] * 3


def test_the_catalog_has_the_whole_availability_periods(data_root, tmp_path):
    """DESIGN 5.3: a view stitches a period's pieces of several days back together. The catalog had
    only the per-day pieces; the view is in a saved catalog file too."""
    import datetime as dt

    from gpu_pipeline.lib.availability import AVAILABILITY_PERIODS
    from gpu_pipeline.lib.schemas import conform

    store = Store(data_root)
    utc = dt.UTC
    first = dict(gpu_id="GPU-1", host="h1", device_name="NVIDIA A100", tier="backfill",
                 start_utc=dt.datetime(2025, 8, 5, 22, tzinfo=utc), end_utc=dt.datetime(2025, 8, 6, tzinfo=utc),
                 duration_s=7200.0, end_reason="open", resolution_s=300.0, starts_before_day=False,
                 continues_after_day=True)
    second = dict(first, start_utc=dt.datetime(2025, 8, 6, tzinfo=utc), end_utc=dt.datetime(2025, 8, 6, 1, tzinfo=utc),
                  duration_s=3600.0, end_reason="backfill_claimed", backfill_job_id="bf#1.0#1",
                  starts_before_day=True, continues_after_day=False)
    store.write_partition(AVAILABILITY_PERIODS, "2025-08-05", conform(pa.Table.from_pylist([first]), AVAILABILITY_PERIODS))
    store.write_partition(AVAILABILITY_PERIODS, "2025-08-06", conform(pa.Table.from_pylist([second]),
                                                                      AVAILABILITY_PERIODS))
    catalog = str(tmp_path / "catalog.duckdb")
    con = duckdb.connect(catalog)
    assert "metrics.availability_periods_stitched" in create_catalog(con, store)
    con.close()
    con = duckdb.connect(catalog, read_only=True)
    rows = con.sql("SELECT start_utc, end_utc, duration_s, end_reason, n_pieces "
                   "FROM metrics.availability_periods_stitched").fetchall()
    assert [(s.astimezone(utc).hour, e.astimezone(utc).hour, d, r, n) for s, e, d, r, n in rows] == [
        (22, 1, 10800.0, "backfill_claimed", 2)]
