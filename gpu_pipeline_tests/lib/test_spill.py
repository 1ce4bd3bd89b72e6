"""TimeSlabSorter: the rows back in the order of one stable sort, held or spilled in time slabs."""

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from gpu_pipeline.lib.schemas import sorted_rows
from gpu_pipeline.lib.spill import TimeSlabSorter

T0 = dt.datetime(2025, 8, 4, 5, 0, tzinfo=dt.UTC)
START_US = int(T0.timestamp() * 1_000_000)
DAY_US = 86_400 * 1_000_000
KEYS = ("t", "host", "n")
SCHEMA = pa.schema([("t", pa.timestamp("us", tz="UTC")), ("host", pa.string()), ("n", pa.int64()),
                    ("i", pa.int64())])


def rows(seed: int, count: int) -> pa.Table:
    """Times on a coarse grid (many ties), slab edges and times just outside the window included;
    hosts with nulls; ``i`` numbers the input rows, so that the order of ties shows."""
    rng = np.random.default_rng(seed)
    us = START_US + rng.integers(0, 96, count) * (DAY_US // 96)
    us[rng.random(count) < 0.02] = START_US - 1  # before the window: first slab
    us[rng.random(count) < 0.02] = START_US + DAY_US  # at its end: last slab
    hosts = [None if rng.random() < 0.1 else f"h{int(rng.integers(0, 4))}" for _ in range(count)]
    return pa.table({"t": pa.array(us, pa.int64()).cast(pa.timestamp("us", tz="UTC")), "host": hosts,
                     "n": rng.integers(0, 3, count), "i": np.arange(count)}, schema=SCHEMA)


def sort_in(sorter: TimeSlabSorter, table: pa.Table, part_rows: int) -> pa.Table:
    for at in range(0, table.num_rows, part_rows):
        sorter.add(table.slice(at, part_rows))
    return pa.Table.from_batches(list(sorter.sorted_batches()), schema=SCHEMA)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spilled_slabs_give_the_stable_sort_of_all_rows(tmp_path, seed):
    table = rows(seed, 20_000)
    sorter = TimeSlabSorter(SCHEMA, KEYS, START_US, START_US + DAY_US, spill_dir=tmp_path,
                            expected_bytes=table.nbytes, memory_bytes=40_000, slab_bytes=50_000, flush_bytes=30_000)
    got = sort_in(sorter, table, 700)
    assert sorter.slabs > 2 and sorter.spilled_rows == sorter.rows == table.num_rows
    assert got.equals(sorted_rows(table, KEYS))  # the row numbers show the order of ties kept
    assert list(tmp_path.iterdir()) == []  # the spill file is gone


def test_a_day_that_fits_is_held_and_sorted_without_a_spill_file(tmp_path):
    table = rows(3, 5_000)
    sorter = TimeSlabSorter(SCHEMA, KEYS, START_US, START_US + DAY_US, spill_dir=tmp_path)
    got = sort_in(sorter, table, 1_000)
    assert sorter.slabs == 0 and sorter.spilled_rows == 0
    assert got.equals(sorted_rows(table, KEYS))
    assert list(tmp_path.iterdir()) == []


def test_more_slabs_than_times_and_an_expected_size_that_sets_them(tmp_path):
    table = rows(4, 3_000)
    sorter = TimeSlabSorter(SCHEMA, KEYS, START_US, START_US + DAY_US, spill_dir=tmp_path, expected_bytes=10**9,
                            memory_bytes=1, slab_bytes=100_000, flush_bytes=1)
    got = sort_in(sorter, table, 500)
    assert sorter.slabs == 4096  # capped; most slabs empty
    assert got.equals(sorted_rows(table, KEYS))


def test_the_spill_file_goes_when_the_consumer_stops_early(tmp_path):
    sorter = TimeSlabSorter(SCHEMA, KEYS, START_US, START_US + DAY_US, spill_dir=tmp_path,
                            memory_bytes=1_000, slab_bytes=10_000, flush_bytes=1_000)
    with sorter:
        for at in range(0, 10_000, 1_000):
            sorter.add(rows(5, 10_000).slice(at, 1_000))
        assert len(list(tmp_path.iterdir())) == 1
        next(iter(sorter.sorted_batches()))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="after sorted_batches"):
        sorter.add(rows(5, 10))


def test_the_first_key_must_be_a_time_and_the_window_not_empty():
    with pytest.raises(ValueError, match="timestamp"):
        TimeSlabSorter(SCHEMA, ("n", "t"), START_US, START_US + DAY_US)
    with pytest.raises(ValueError, match="empty window"):
        TimeSlabSorter(SCHEMA, KEYS, START_US, START_US)


def test_the_spill_file_goes_in_duckdbs_temp_dir_when_none_is_given(tmp_path, monkeypatch):
    where = tmp_path / "spill" / "here"
    monkeypatch.setenv("GPU_PIPELINE_DUCKDB_TEMP_DIR", str(where))
    sorter = TimeSlabSorter(SCHEMA, KEYS, START_US, START_US + DAY_US, memory_bytes=1_000, slab_bytes=10_000,
                            flush_bytes=1_000)
    table = rows(6, 5_000)
    for at in range(0, 5_000, 1_000):
        sorter.add(table.slice(at, 1_000))
    assert [p.name.startswith("gpu_pipeline_spill_") for p in where.iterdir()] == [True]
    got = pa.Table.from_batches(list(sorter.sorted_batches()), schema=SCHEMA)
    assert got.equals(sorted_rows(table, KEYS))
    assert list(where.iterdir()) == []


@pytest.mark.parametrize("seed", [6, 7])
def test_parts_of_time_ordered_runs_are_sliced_into_slabs_and_give_the_same_stable_sort(tmp_path, seed):
    """Parts as the telemetry reader gives them: several files' rows, each file's in time order (ties,
    times outside the window and files of a few rows included). They are cut by slicing, not sorted,
    and the rows come back in the order of one stable sort of all."""
    rng = np.random.default_rng(seed)
    files = []
    for f in range(40):
        count = int(rng.choice([1, 3, 200, 900]))
        # a coarse grid (ties within a file and across files), and times just outside the window
        us = START_US + rng.integers(0, 96, count) * (DAY_US // 96)
        us[rng.random(count) < 0.03] = START_US - 1
        us[rng.random(count) < 0.03] = START_US + DAY_US
        us = np.sort(us)
        files.append(pa.table({"t": pa.array(us, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                               "host": [f"h{f % 7}"] * count, "n": rng.integers(0, 2, count),
                               "i": np.arange(count) + 10_000 * f}, schema=SCHEMA))
    parts = [pa.concat_tables(files[at:at + 5]) for at in range(0, len(files), 5)]
    table = pa.concat_tables(parts)
    sorter = TimeSlabSorter(SCHEMA, KEYS, START_US, START_US + DAY_US, spill_dir=tmp_path,
                            expected_bytes=table.nbytes, memory_bytes=20_000, slab_bytes=30_000, flush_bytes=20_000)
    for part in parts:
        sorter.add(part)
    got = pa.Table.from_batches(list(sorter.sorted_batches()), schema=SCHEMA)
    assert sorter.slabs > 2 and sorter.spilled_rows == table.num_rows
    assert sorter.parts_sorted == 0  # every part cut by slicing
    times = table["t"].cast(pa.int64()).to_numpy()
    assert (times < START_US).any() and (times >= START_US + DAY_US).any()
    assert len(np.unique(times)) < len(times) / 5  # many ties: their order shows in ``i``
    assert got.equals(sorted_rows(table, KEYS))


def test_a_row_without_a_time_is_refused_with_the_column_named(tmp_path):
    sorter = TimeSlabSorter(SCHEMA, KEYS, START_US, START_US + DAY_US, spill_dir=tmp_path)
    table = rows(9, 10)
    t = table["t"].to_pylist()
    t[3] = None
    with pytest.raises(ValueError, match="1 row.* without a t"):
        sorter.add(table.set_column(0, "t", pa.array(t, SCHEMA.field("t").type)))


def test_a_part_in_no_useful_order_is_cut_by_a_sort(tmp_path):
    table = rows(8, 5_000)  # random times: thousands of falls back in time
    sorter = TimeSlabSorter(SCHEMA, KEYS, START_US, START_US + DAY_US, spill_dir=tmp_path,
                            expected_bytes=table.nbytes, memory_bytes=1, slab_bytes=20_000, flush_bytes=1)
    got = sort_in(sorter, table, 2_500)
    assert sorter.parts_sorted == 2
    assert got.equals(sorted_rows(table, KEYS))
