import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_pipeline.lib.coverage import coverage
from gpu_pipeline.lib.coverage_table import COVERAGE, coverage_rows
from gpu_pipeline.lib.schemas import CLEAN_SLOT_SNAPSHOTS, GPU_SAMPLES, GPU_STATES, JOBS, QUARANTINE, conform

UTC = dt.UTC
D0, D1 = dt.datetime(2025, 8, 5, tzinfo=UTC), dt.datetime(2025, 8, 6, tzinfo=UTC)


def test_coverage_counts_gaps_against_the_observed_cadence():
    # one series every 5 minutes, with a 2-hour hole
    times = [D0 + dt.timedelta(minutes=5 * i) for i in range(288) if not 100 <= i < 124]
    cov = coverage(pa.table({"t": pa.array(times, pa.timestamp("us", tz="UTC"))}), "t", [], D0, D1)
    assert cov.cadence_s == 300 and cov.samples == 264 and cov.expected == 288
    assert cov.gaps == 1 and cov.longest_gap_s == 25 * 300
    assert abs(cov.coverage - 264 / 288) < 1e-12


@pytest.mark.parametrize("hours", [range(0, 6), range(18, 24), range(8, 10)])
def test_silence_at_the_edges_of_the_window_is_a_gap(hours):
    """A collector that stopped at 06:00 (or started at 18:00) leaves an 18-hour gap, as a day with no
    sample at all shows the whole window as one: the time from the window's start to a series' first
    sample and from its last sample to the window's end are intervals like those between samples.
    The SQL and the numpy path agree."""
    from gpu_pipeline.lib.coverage import SeriesPoints

    times = [D0 + dt.timedelta(hours=h, minutes=5 * i, seconds=7) for h in hours for i in range(12)]
    table = pa.table({"sample_utc": pa.array(times, pa.timestamp("us", tz="UTC")), "gpu_id": ["g"] * len(times)})
    cov = coverage(table, "sample_utc", ["gpu_id"], D0, D1)
    lead, trail = (times[0] - D0).total_seconds(), (D1 - times[-1]).total_seconds()
    assert cov.cadence_s == 300
    assert cov.gaps == (lead > 900) + (trail > 900) and cov.gaps >= 1
    assert cov.longest_gap_s == max(lead, trail)
    points = SeriesPoints("sample_utc", ["gpu_id"])
    points.add(table)
    assert points.coverage(D0, D1) == cov
    # a sample just after the window's start and just before its end: no gap at the edges
    full = [D0 + dt.timedelta(minutes=5 * i, seconds=7) for i in range(288)]
    whole = coverage(pa.table({"sample_utc": pa.array(full, pa.timestamp("us", tz="UTC"))}), "sample_utc", [], D0, D1)
    assert (whole.gaps, whole.longest_gap_s) == (0, 300)


def _telemetry(rows: list[tuple]) -> pa.Table:
    return pa.table({"t": pa.array([r[0] for r in rows], pa.timestamp("us", tz="UTC")),
                     "source": [r[1] for r in rows], "host": [r[2] for r in rows], "gpu_id": [r[3] for r in rows]})


def _both_paths(table: pa.Table, series: list[str]):
    """coverage() of the table, checked against the numpy path (SeriesPoints) on the same rows."""
    from gpu_pipeline.lib.coverage import SeriesPoints

    cov = coverage(table, "t", series, D0, D1)
    points = SeriesPoints("t", series)
    for batch in table.to_batches(max_chunksize=1000):
        points.add(batch)
    assert points.coverage(D0, D1) == cov
    return cov


def test_coverage_series_are_a_gpu_of_one_source_and_a_gpu_counts_once(tmp_path):
    """A telemetry series is one GPU of one source, whatever its host is called; a GPU read by
    several sources counts once, measured by its best series. GPU-1: DCGM every 60 s with a 10-minute
    hole, nvidia-smi every 60 s all day (offset 30 s): measured by nvidia-smi, no gap (a series keyed
    by the GPU alone would be one 30-second series and see no hole either, so the sources are also
    checked apart below). GPU-2 has no host; GPU-3 changes its host's spelling at noon."""
    minutes = [D0 + dt.timedelta(minutes=i) for i in range(1440)]
    dcgm_1 = [(t, "dcgm", "h1", "GPU-1") for i, t in enumerate(minutes) if not 600 <= i < 609]
    rows = (dcgm_1 + [(t + dt.timedelta(seconds=30), "nvidia-smi", "h1", "GPU-1") for t in minutes]
            + [(t, "nvml", None, "GPU-2") for t in minutes]
            + [(t, "dcgm", "h3" if i < 720 else "h3.example.org", "GPU-3") for i, t in enumerate(minutes)])
    series = ["source", "gpu_id"]
    cov = _both_paths(_telemetry(rows), series)
    assert (cov.series, cov.samples, cov.cadence_s, cov.expected) == (3, 3 * 1440, 60.0, 3 * 1440)
    assert (cov.coverage, cov.gaps, cov.longest_gap_s) == (1.0, 0, 60)
    # nvidia-smi for the first two hours only: GPU-1 is measured by DCGM (its hole is a gap), and
    # nvidia-smi's 22 hours without a sample are not a gap of the GPU
    rows = dcgm_1 + [(t + dt.timedelta(seconds=30), "nvidia-smi", "h1", "GPU-1") for t in minutes[:120]]
    cov = _both_paths(_telemetry(rows), series)
    assert (cov.series, cov.samples, cov.expected, cov.gaps, cov.longest_gap_s) == (1, 1431, 1440, 1, 600)
    assert cov.coverage == 1431 / 1440
    # the series' host as a key column: each spelling its own series, of half a day (the rule of
    # the table before: GPU-3 read as half covered)
    cov = _both_paths(_telemetry([(t, "dcgm", "h3" if i < 720 else "h3.example.org", "GPU-3")
                                  for i, t in enumerate(minutes)]), ["source", "host", "gpu_id"])
    assert (cov.series, cov.coverage) == (2, 0.5)
    # a repeated timestamp of a series counts once; the Parquet file gives what the table gives
    table = _telemetry(rows)
    file = tmp_path / "samples.parquet"
    pq.write_table(pa.concat_tables([table, table.slice(0, 5)]), file)
    assert coverage(file, "t", series, D0, D1) == coverage(table, "t", series, D0, D1)


def test_coverage_of_files_leaves_nothing_in_the_database(tmp_path):
    # A file is read through a view of the reading connection only: day after day (as a range run
    # calls it), with the other readers' views around, nothing is left in the process's database.
    from gpu_pipeline.lib.coverage_table import coverage_rows
    from gpu_pipeline.lib.db import connect

    times = [D0 + dt.timedelta(minutes=i) for i in range(1440)]
    samples = conform(pa.table({"sample_utc": pa.array(times, pa.timestamp("us", tz="UTC")),
                                "source": ["dcgm"] * 1440, "host": ["h1"] * 1440, "gpu_id": ["GPU-1"] * 1440}),
                      GPU_SAMPLES)
    file = tmp_path / "samples.parquet"
    pq.write_table(samples, file)
    for _ in range(3):
        cov = coverage(file, "sample_utc", ["source", "host", "gpu_id"], D0, D1)
        assert (cov.series, cov.samples, cov.cadence_s) == (1, 1440, 60.0)
        rows = coverage_rows(D0, D1, CLEAN_SLOT_SNAPSHOTS.empty(), GPU_STATES.empty(), file, JOBS.empty(), None, {})
        assert rows.num_rows >= 2
    con = connect()
    try:
        left = con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal "
                       "UNION ALL SELECT table_name FROM duckdb_tables()").fetchall()
    finally:
        con.close()
    assert left == []


def test_coverage_rows_silent_zero_telemetry_and_quarantine_reasons(tmp_path):
    snaps = [D0 + dt.timedelta(minutes=5 * i) for i in range(288)]
    slots = conform(pa.Table.from_pylist(
        [dict(snapshot_utc=t, host="h", slot_name="s@h", gpu_id=g, tier="shared", is_backfill_slot=False,
              slot_state="Claimed") for t in snaps for g in ("GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e")]),
        CLEAN_SLOT_SNAPSHOTS)
    states = conform(pa.Table.from_pylist(
        [dict(bucket_start_utc=t, gpu_id=g, host="h", state="busy_shared", n_slot_rows=1)
         for t in snaps for g in ("GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e")]), GPU_STATES)
    # GPU-a reports real values, GPU-b reports 0 util and 0 W all day while busy, GPU-c has no
    # telemetry, GPU-d's readings are all null ([Unknown Error]): no zero, so not silent-zero; GPU-e
    # reads 0 % with its power never read ([N/A]): a job that holds the GPU idle, perhaps, not a
    # broken exporter
    samples = conform(pa.Table.from_pylist(
        [dict(sample_utc=t, source="dcgm", host="h", gpu_id=g, util_pct=u, power_w=p)
         for t in snaps for g, u, p in (("GPU-a", 90.0, 300.0), ("GPU-b", 0.0, 0.0), ("GPU-d", None, None),
                                        ("GPU-e", 0.0, None))]),
        GPU_SAMPLES)
    q = conform(pa.Table.from_pylist([{"source_table": "x", "reason": "missing State", "row_json": "{}"}] * 2
                                     + [{"source_table": "x", "reason": "non-UTF-8 bytes in Name", "row_json": "{}"}]),
                QUARANTINE)
    table = coverage_rows(D0, D1, slots, states, samples, JOBS.empty(), None, {"slot_snapshots": [q]})
    # the day's samples given as their Parquet file (as the asset does) give the same rows
    file = tmp_path / "samples.parquet"
    pq.write_table(samples, file)
    assert coverage_rows(D0, D1, slots, states, file, JOBS.empty(), None, {"slot_snapshots": [q]}).equals(table)
    out = {r["source"]: r for r in table.to_pylist()}
    assert set(out) == {"slot_snapshots", "gpu_telemetry", "job_records"}
    tel = out["gpu_telemetry"]
    assert (tel["gpus_in_snapshots"], tel["gpus_with_telemetry"]) == (5, 4)
    assert abs(tel["gpus_with_telemetry_pct"] - 80.0) < 1e-9
    assert tel["silent_zero_series"] == 1 and tel["coverage_pct"] == 100.0
    assert out["slot_snapshots"]["rows_quarantined"] == 3
    assert json.loads(out["slot_snapshots"]["quarantine_reasons"]) == {"missing State": 2, "non-UTF-8 bytes in Name": 1}


def test_empty_day_has_rows_with_full_schema():
    out = coverage_rows(D0, D1, CLEAN_SLOT_SNAPSHOTS.empty(), GPU_STATES.empty(), GPU_SAMPLES.empty(),
                        JOBS.empty(), None, {})
    assert out.schema == COVERAGE.schema and out.num_rows == 3
    assert out.column("coverage_pct").to_pylist()[:2] == [0.0, 0.0]
    # a dead source's day is one gap, the whole day: no fewer gaps than a source that sent two samples
    assert out.column("gaps").to_pylist()[:2] == [1, 1]
    assert out.column("longest_gap_s").to_pylist()[:2] == [86400.0, 86400.0]
    one = conform(pa.Table.from_pylist([dict(snapshot_utc=D0, host="h", slot_name="s@h", gpu_id="GPU-a",
                                             tier="shared", is_backfill_slot=False, slot_state="Claimed")]),
                  CLEAN_SLOT_SNAPSHOTS)
    (snap, *_) = coverage_rows(D0, D1, one, GPU_STATES.empty(), GPU_SAMPLES.empty(), JOBS.empty(), None,
                               {}).to_pylist()
    assert (snap["gaps"], snap["longest_gap_s"], snap["coverage_pct"]) == (1, 86400.0, 0.0)


def _telemetry_day(hole: range = range(0)) -> pa.Table:
    times = [D0 + dt.timedelta(minutes=i) for i in range(1440) if i not in hole]
    n = len(times)
    return conform(pa.table({"sample_utc": pa.array(times, pa.timestamp("us", tz="UTC")), "source": ["dcgm"] * n,
                             "host": ["h1"] * n, "gpu_id": ["GPU-1"] * n}), GPU_SAMPLES)


def test_a_files_coverage_is_measured_once_per_bytes_and_found_again_under_the_copy(tmp_path, monkeypatch):
    from gpu_pipeline.lib import coverage as coverage_module
    from gpu_pipeline.lib.coverage import COVERAGE_NOTE, partition_coverage
    from gpu_pipeline.lib.schemas import RAW_GPU_TELEMETRY
    from gpu_pipeline.lib.store import Store

    measured = []
    real = coverage_module.coverage
    monkeypatch.setattr(coverage_module, "coverage", lambda *a, **k: measured.append(a[0]) or real(*a, **k))
    store, day, series = Store(tmp_path), "2025-08-05", ["source", "host", "gpu_id"]
    store.write_partition(RAW_GPU_TELEMETRY, day, _telemetry_day(range(100, 130)))
    raw = partition_coverage(store, RAW_GPU_TELEMETRY, day, "sample_utc", series, D0, D1)
    assert raw == real(store.partition_file(RAW_GPU_TELEMETRY, day), "sample_utc", series, D0, D1)
    assert (raw.gaps, raw.longest_gap_s, raw.samples) == (1, 31 * 60, 1410)
    with store.partition_file(RAW_GPU_TELEMETRY, day).open("rb") as fh:
        store.write_partition_copy(GPU_SAMPLES, day, fh)  # the clean file: the raw bytes
    assert partition_coverage(store, GPU_SAMPLES, day, "sample_utc", series, D0, D1,
                              also=(RAW_GPU_TELEMETRY,)) == raw
    assert len(measured) == 1  # found in the raw partition's note
    # other arguments, or other bytes: measured again
    other = partition_coverage(store, GPU_SAMPLES, day, "sample_utc", series, D0, D1, gap_factor=40.0,
                               also=(RAW_GPU_TELEMETRY,))
    assert len(measured) == 2 and other.gaps == 0
    store.write_partition(GPU_SAMPLES, day, _telemetry_day())
    clean = partition_coverage(store, GPU_SAMPLES, day, "sample_utc", series, D0, D1, also=(RAW_GPU_TELEMETRY,))
    assert len(measured) == 3 and (clean.gaps, clean.samples) == (0, 1440)
    assert partition_coverage(store, GPU_SAMPLES, day, "sample_utc", series, D0, D1) == clean
    assert len(measured) == 3
    assert store.read_partition_note(GPU_SAMPLES, day, COVERAGE_NOTE)["result"]["samples"] == 1440


def test_a_file_replaced_while_its_coverage_is_measured_gets_no_note(tmp_path, monkeypatch):
    from gpu_pipeline.lib import coverage as coverage_module
    from gpu_pipeline.lib.coverage import COVERAGE_NOTE, partition_coverage
    from gpu_pipeline.lib.store import Store

    store, day = Store(tmp_path), "2025-08-05"
    store.write_partition(GPU_SAMPLES, day, _telemetry_day(range(100, 130)))
    real = coverage_module.coverage

    def measured_then_replaced(*a, **k):
        cov = real(*a, **k)
        store.write_partition(GPU_SAMPLES, day, _telemetry_day())  # another run's write, meanwhile
        return cov

    monkeypatch.setattr(coverage_module, "coverage", measured_then_replaced)
    partition_coverage(store, GPU_SAMPLES, day, "sample_utc", ["source", "host", "gpu_id"], D0, D1)
    assert store.read_partition_note(GPU_SAMPLES, day, COVERAGE_NOTE) is None


def _random_points(rng, sorted_times: bool) -> pa.Table:
    """Samples of a few series (nulls in every key column, repeated times, one-sample series)."""
    n = int(rng.integers(0, 400))
    step = int(rng.choice([1, 1000, 1_000_000]))
    spread = int(rng.choice([86400, 50, 3]))  # few distinct times: repeated points, whole series of one time
    t = rng.integers(0, spread, n) * step + int(D0.timestamp() * 1_000_000)
    if sorted_times:
        t = np.sort(t)
    gpus = [f"GPU-{i}" for i in range(int(rng.integers(1, 8)))] + [None]
    return pa.table({"sample_utc": pa.array(t, pa.timestamp("us", tz="UTC")),
                     "source": pa.array(rng.choice(["dcgm", "nvidia-smi", None], n).tolist(), pa.string()),
                     "host": pa.array(rng.choice(["h1", "h2", None], n).tolist(), pa.string()),
                     "gpu_id": pa.array(rng.choice(gpus, n).tolist(), pa.string())})


@pytest.mark.parametrize("sorted_times", [True, False])
def test_points_seen_batch_by_batch_give_the_sql_coverage(sorted_times):
    """SeriesPoints + coverage_of_points against coverage()'s SQL: series numbered across batches,
    nulls in the key, repeated times, series of one sample, medians of even and odd counts; in time
    order (the writer's rows: one radix sort) and not (lexsort)."""
    from gpu_pipeline.lib.coverage import SeriesPoints

    rng = np.random.default_rng(7 if sorted_times else 8)
    series = ["source", "host", "gpu_id"]
    for _ in range(150):
        t = _random_points(rng, sorted_times)
        gap_factor = float(rng.choice([3.0, 1.5, 2.7]))
        points = SeriesPoints("sample_utc", series)
        for batch in t.to_batches(max_chunksize=int(rng.integers(1, 100))):
            points.add(batch)
        assert points.coverage(D0, D1, gap_factor) == coverage(t, "sample_utc", series, D0, D1, gap_factor)


def test_points_of_more_series_than_a_16_bit_number_give_the_sql_coverage():
    """Beyond 65,536 series the points are ordered by lexsort instead of the radix sort."""
    from gpu_pipeline.lib.coverage import SeriesPoints

    rng = np.random.default_rng(5)
    n = 200_000
    t = pa.table({"sample_utc": pa.array(np.sort(rng.integers(0, 600, n)) * 1_000_000 + int(D0.timestamp() * 1e6),
                                         pa.timestamp("us", tz="UTC")),
                  "gpu_id": pa.array([f"GPU-{i}" for i in rng.integers(0, 70_000, n)])})
    points = SeriesPoints("sample_utc", ["gpu_id"])
    for batch in t.to_batches(max_chunksize=65_536):
        points.add(batch)
    got = points.coverage(D0, D1)
    assert got.series > 1 << 16
    assert got == coverage(t, "sample_utc", ["gpu_id"], D0, D1)


def test_points_that_cannot_be_read_exactly_give_no_coverage():
    """Times in another unit than microseconds, or a missing time: no figures (the file is measured)."""
    from gpu_pipeline.lib.coverage import SeriesPoints

    points = SeriesPoints("sample_utc", ["gpu_id"])
    points.add(pa.table({"sample_utc": pa.array([D0], pa.timestamp("ms", tz="UTC")), "gpu_id": ["a"]}))
    assert points.coverage(D0, D1) is None


def test_points_with_a_missing_time_give_no_coverage():
    from gpu_pipeline.lib.coverage import SeriesPoints

    points = SeriesPoints("sample_utc", ["gpu_id"])
    points.add(pa.table({"sample_utc": pa.array([D0, None], pa.timestamp("us", tz="UTC")), "gpu_id": ["a", "a"]}))
    points.add(pa.table({"sample_utc": pa.array([D0], pa.timestamp("us", tz="UTC")), "gpu_id": ["a"]}))
    assert points.coverage(D0, D1) is None
    assert SeriesPoints("sample_utc", ["gpu_id"]).coverage(D0, D1) == coverage(
        _telemetry_day().slice(0, 0), "sample_utc", ["gpu_id"], D0, D1)


def test_the_raw_step_keeps_the_coverage_of_the_rows_it_wrote(tmp_path, monkeypatch):
    """The raw writer measures coverage on the rows as it writes them; the asset's partition_coverage
    then finds the note for those bytes and reads nothing, and the figures are the file's."""
    from gpu_pipeline.lib import coverage as coverage_module
    from gpu_pipeline.lib.coverage import COVERAGE_NOTE, partition_coverage
    from gpu_pipeline.lib.coverage_table import TELEMETRY_SERIES
    from gpu_pipeline.lib.samples import write_sorted_raw
    from gpu_pipeline.lib.schemas import RAW_GPU_TELEMETRY
    from gpu_pipeline.lib.store import Store

    rng = np.random.default_rng(3)
    t = conform(pa.concat_tables([_telemetry_day(range(100, 130)).drop_columns(["source", "host", "gpu_id"])
                                  .append_column("source", pa.array(["dcgm"] * 1410))
                                  .append_column("host", pa.array([h] * 1410))
                                  .append_column("gpu_id", pa.array([g] * 1410))
                                  for h, g in (("h1", "GPU-1"), ("h2", "GPU-2"))]), RAW_GPU_TELEMETRY)
    t = t.take(rng.permutation(t.num_rows))  # parts come in any order
    store, day, series = Store(tmp_path), "2025-08-05", list(TELEMETRY_SERIES)
    written = write_sorted_raw(store, day, [t.slice(0, 1000), t.slice(1000)], D0, D1,
                               memory_bytes=20_000, slab_bytes=10_000, flush_bytes=15_000)
    note = store.read_partition_note(RAW_GPU_TELEMETRY, day, COVERAGE_NOTE)
    assert note["sha256"] == written.sha256
    measured = []
    real = coverage_module.coverage
    monkeypatch.setattr(coverage_module, "coverage", lambda *a, **k: measured.append(a[0]) or real(*a, **k))
    found = partition_coverage(store, RAW_GPU_TELEMETRY, day, "sample_utc", series, D0, D1)
    assert not measured
    assert found == real(store.partition_file(RAW_GPU_TELEMETRY, day), "sample_utc", series, D0, D1)
    assert (found.series, found.samples, found.gaps, found.longest_gap_s) == (2, 2820, 2, 31 * 60)


def test_each_source_is_measured_against_its_own_cadence():
    """Eight GPUs logged every 60 s went silent at noon; two exporter series sample every 2 s all
    day. With one cadence over all series (the median, 60 s) the fast series' 43,200 samples each
    filled the slow ones' expected count: coverage 100 % and the outage invisible to the check.
    Per source: the slow GPUs are half covered and each has a 12-hour gap; every series weighs
    the same in the day's figure. A GPU that sent two samples all day is measured against its
    source's cadence, not read as a fully covered series of a 12-hour cadence."""
    from gpu_pipeline.lib.coverage import SeriesPoints

    rows = {"sample_utc": [], "source": [], "host": [], "gpu_id": []}

    def add(source, gpu, seconds):
        for s in seconds:
            rows["sample_utc"].append(D0 + dt.timedelta(seconds=int(s)))
            rows["source"].append(source)
            rows["host"].append("h1")
            rows["gpu_id"].append(gpu)

    for g in range(8):
        add("nvidia-smi", f"GPU-{g}", range(0, 43200, 60))
    for g in range(2):
        add("terapixel", f"GPU-t{g}", range(0, 86400, 2))
    add("nvidia-smi", "GPU-sparse", [0, 43200])
    t = pa.table({"sample_utc": pa.array(rows["sample_utc"], pa.timestamp("us", tz="UTC")),
                  "source": rows["source"], "host": rows["host"], "gpu_id": rows["gpu_id"]})
    series = ["source", "host", "gpu_id"]
    cov = coverage(t, "sample_utc", series, D0, D1)
    assert cov.series == 11
    assert cov.coverage == pytest.approx((8 * 0.5 + 2 * 1.0 + 2 / 1440) / 11)
    assert cov.expected == pytest.approx(9 * 1440 + 2 * 43200)
    assert cov.gaps == 8 + 2  # each silent GPU's last 12 h; the sparse GPU's two halves of the day
    points = SeriesPoints("sample_utc", series)
    for batch in t.to_batches(max_chunksize=5000):
        points.add(batch)
    assert points.coverage(D0, D1) == cov


def test_a_source_of_only_sparse_series_takes_the_cadence_of_all_series():
    """The only nvidia-smi GPU sent a sample at 00:00 and 12:00, then stopped: a cadence from one
    interval is no cadence (its source's 12 hours read it as fully covered, no gap). Its source
    has no series of three intervals or more, so it is measured against the median of all."""
    from gpu_pipeline.lib.coverage import SeriesPoints

    times, sources, gpus = [], [], []
    for g in range(8):
        for s in range(0, 86400, 60):
            times.append(D0 + dt.timedelta(seconds=s))
            sources.append("dcgm")
            gpus.append(f"GPU-{g}")
    for s in (0, 43200):
        times.append(D0 + dt.timedelta(seconds=s))
        sources.append("nvidia-smi")
        gpus.append("GPU-smi")
    t = pa.table({"sample_utc": pa.array(times, pa.timestamp("us", tz="UTC")), "source": sources,
                  "host": ["h1"] * len(times), "gpu_id": gpus})
    series = ["source", "host", "gpu_id"]
    cov = coverage(t, "sample_utc", series, D0, D1)
    assert cov.coverage == pytest.approx((8 + 2 / 1440) / 9) and cov.gaps == 2
    points = SeriesPoints("sample_utc", series)
    points.add(t)
    assert points.coverage(D0, D1) == cov


def test_a_window_where_no_series_has_two_samples_has_no_coverage():
    """Three GPUs with one sample each all day (a collector that sent one scrape and stopped): no
    cadence, so no expected samples -- coverage 0 as for a window without samples, in the SQL and
    the batch-by-batch figures alike (each series counted against its own single sample made it
    100 %, and the blocking coverage check of the raw telemetry passed the day)."""
    from gpu_pipeline.lib.coverage import SeriesPoints

    t = pa.table({"sample_utc": pa.array([D0 + dt.timedelta(minutes=1)] * 3, pa.timestamp("us", tz="UTC")),
                  "gpu_id": pa.array(["GPU-1", "GPU-2", "GPU-3"])})
    got = coverage(t, "sample_utc", ["gpu_id"], D0, D1)
    assert (got.series, got.samples, got.cadence_s, got.expected, got.coverage) == (3, 3, None, 0.0, 0.0)
    assert got.longest_gap_s == (D1 - D0).total_seconds() - 60
    points = SeriesPoints("sample_utc", ["gpu_id"])
    points.add(t.to_batches()[0])
    assert points.coverage(D0, D1) == got
    # a second sample of one series gives the cadence every series is measured against
    two = pa.concat_tables([t, pa.table({"sample_utc": pa.array([D0 + dt.timedelta(minutes=2)],
                                                                pa.timestamp("us", tz="UTC")),
                                         "gpu_id": pa.array(["GPU-1"])})])
    got = coverage(two, "sample_utc", ["gpu_id"], D0, D1)
    assert got.cadence_s == 60.0 and got.coverage == pytest.approx((2 + 1 + 1) / 1440 / 3)
