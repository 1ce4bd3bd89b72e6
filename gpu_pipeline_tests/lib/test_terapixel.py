"""Terapixel-style CSVs: hand-written fixtures with exact expected values, the pairing rules, the time
window, per-task GPU means (hand-computed and against a plain DuckDB interval join) and the sample
generator round-tripping through the parsers."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from gpu_pipeline.lib.schemas import GPU_SAMPLES, QUARANTINE, conform
from gpu_pipeline.lib.telemetry import ParseResult, short_gpu_id
from gpu_pipeline.lib.terapixel import (
    CHECKPOINT_COLUMNS,
    EVENT_NAMES,
    GPU_CSV_COLUMNS,
    TASK_GPU_MEANS,
    TASK_RUNS,
    TASK_XY_COLUMNS,
    parse_gpu_csv,
    parse_task_runs,
    task_gpu_means,
    write_terapixel_sample,
)

UTC = dt.UTC
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "terapixel"
GPU_CSV = FIXTURES / "gpu.csv"
CHECKPOINTS = FIXTURES / "application-checkpoints.csv"
TASK_XY = FIXTURES / "task-x-y.csv"

H1 = "0d56a730076643d585f77e00d2d8521a000001"
H2 = "b9a1fa7ae2f74eb68f25f607980f97d7000002"
U1 = "GPU-5e3c2a17-8b4d-4f0e-9a61-2c7d8e9f0a1b"
U2 = "GPU-a07f9c3e-1d2b-4c5a-b6e7-f8091a2b3c4d"
J = "1024-lvl12-4f1b2c3d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
T1 = "2a4c6e80-1b3d-4f5a-9c7e-0d2f4b6a8c1e"
T2 = "3b5d7f91-2c4e-4a6b-8d0f-1e3a5c7b9d2f"
T4 = "5d7f9b13-4e6a-4c8d-8f2b-3a5c7e9d1f4b"


def ts(h: int, m: int, s: int, ms: int = 0) -> dt.datetime:
    return dt.datetime(2018, 11, 8, h, m, s, ms * 1000, tzinfo=UTC)


def gpu_rows(result: ParseResult) -> list[tuple]:
    cols = ["sample_utc", "host", "gpu_uuid", "gpu_id", "util_pct", "mem_util_pct", "power_w", "temp_c"]
    return [tuple(r[c] for c in cols) for r in result.table.to_pylist()]


# ----------------------------------------------------------------------------------------------
# gpu.csv
# ----------------------------------------------------------------------------------------------

EXPECTED_SAMPLES = [
    (ts(7, 41, 55, 921), H1, U1, "GPU-5e3c2a17", 92.0, 39.0, 131.55, 48.0),  # UUID upper case in the file
    (ts(7, 41, 56, 403), H2, U2, "GPU-a07f9c3e", 0.0, 0.0, 27.48, 36.0),
    (ts(7, 41, 57, 921), H1, U1, "GPU-5e3c2a17", 95.0, 41.0, 140.2, 49.0),
    (ts(7, 41, 58, 403), H2, U2, "GPU-a07f9c3e", 3.0, 1.0, None, 37.0),  # empty power -> null
    (ts(7, 42, 1, 921), H1, U1, "GPU-5e3c2a17", 97.0, 44.0, 150.75, 50.0),
    (ts(7, 42, 3, 921), H1, U1, "GPU-5e3c2a17", 98.0, 45.0, 155.0, 51.0),
]


def test_gpu_csv_exact_values_and_quarantine():
    result = parse_gpu_csv(GPU_CSV)
    assert result.table.schema == GPU_SAMPLES.schema
    assert gpu_rows(result) == EXPECTED_SAMPLES
    assert set(result.table.column("source").to_pylist()) == {"terapixel"}
    assert set(result.table.column("source_file").to_pylist()) == {str(GPU_CSV)}
    for r in result.table.to_pylist():
        assert r["gpu_id"] == short_gpu_id(r["gpu_uuid"])
        assert r["gpu_index"] is None and r["device_name"] is None
    assert [(q.line_number, q.reason) for q in result.quarantine] == [
        (6, "timestamp: not an ISO 8601 time with zone"),
        (7, "powerDrawWatt: not a finite number"),
        (8, "gpuUUID: missing"),
        (11, "expected 8 fields, got 6"),  # lines after it keep their true numbers
        (13, "timestamp: not an ISO 8601 time with zone"),  # no zone
    ]
    lines = GPU_CSV.read_text().splitlines()
    for q in result.quarantine:
        assert q.raw_line == lines[q.line_number - 1]
        assert q.source_file == str(GPU_CSV)
    assert result.counters == {
        "data_lines": 11, "blank_lines": 1, "empty_values": 1, "rows_out": 6, "quarantined_lines": 5,
    }
    assert result.files == [str(GPU_CSV)]
    q = result.quarantine_table()
    assert q.schema == QUARANTINE.schema
    assert q.column("source_row").to_pylist() == [6, 7, 8, 11, 13]
    assert json.loads(q.column("row_json")[0].as_py()) == {"line": lines[5]}


def test_gpu_csv_text_input_and_source_file():
    text = GPU_CSV.read_text()
    result = parse_gpu_csv(text, source_file="s3://bucket/gpu.csv")
    assert gpu_rows(result) == EXPECTED_SAMPLES
    assert set(result.table.column("source_file").to_pylist()) == {"s3://bucket/gpu.csv"}
    assert [q.line_number for q in result.quarantine] == [6, 7, 8, 11, 13]
    crlf = parse_gpu_csv("\ufeff" + text.replace("\n", "\r\n"))  # BOM and CRLF line ends
    assert gpu_rows(crlf) == EXPECTED_SAMPLES
    assert [(q.line_number, q.raw_line) for q in crlf.quarantine] == [
        (q.line_number, q.raw_line) for q in result.quarantine]
    # str path without newline is a file name
    assert gpu_rows(parse_gpu_csv(str(GPU_CSV))) == EXPECTED_SAMPLES
    with pytest.raises(FileNotFoundError):
        parse_gpu_csv(str(FIXTURES / "missing.csv"))


def test_gpu_csv_time_window():
    result = parse_gpu_csv(GPU_CSV, start_utc=ts(7, 41, 56, 403), end_utc=ts(7, 41, 59))
    assert gpu_rows(result) == EXPECTED_SAMPLES[1:4]  # start inclusive
    # rows with a readable time outside the window are counted, even when they are bad (lines 7, 8)
    assert result.counters["outside_window"] == 5
    assert [q.line_number for q in result.quarantine] == [6, 11, 13]  # time unknown: always quarantined
    # end exclusive, open start
    early = parse_gpu_csv(GPU_CSV, end_utc=ts(7, 41, 57, 921))
    assert gpu_rows(early) == EXPECTED_SAMPLES[:2]
    late = parse_gpu_csv(GPU_CSV, start_utc=ts(7, 42, 1, 921))
    assert gpu_rows(late) == EXPECTED_SAMPLES[4:]
    # an offset is honored
    other_tz = dt.datetime(2018, 11, 8, 8, 42, 1, 921000, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert gpu_rows(parse_gpu_csv(GPU_CSV, start_utc=other_tz)) == EXPECTED_SAMPLES[4:]
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_gpu_csv(GPU_CSV, start_utc=dt.datetime(2018, 11, 8))


def test_gpu_csv_edge_cells():
    header = ",".join(GPU_CSV_COLUMNS)
    text = "\n".join([
        header,
        f"2018-11-08T07:00:00Z,{H1},1,{U1},nan,40,50,10",  # NaN is not a number here
        f"2018-11-08 07:00:02.5+01:00,{H1},1,{U1}, 12.5 ,40,50,10",  # space separator, offset, padding
        f" ,{H1},1,{U1},1,2,3,4",
        f"2018-11-08T07:00:04Z, ,1,{U1},1,2,3,4",
        f"2018-11-08T07:00:06Z,{H2},2,GPU-1234,1,2,3,4",
        header,  # repeated header (concatenated files)
        f"2018-11-08T07:00:08Z,{H2},2,{U2},inf,x,3,4",
        "",
    ])
    result = parse_gpu_csv(text)
    assert gpu_rows(result) == [(ts(6, 0, 2, 500), H1, U1, "GPU-5e3c2a17", 50.0, 10.0, 12.5, 40.0)]
    assert [(q.line_number, q.reason) for q in result.quarantine] == [
        (2, "powerDrawWatt: not a finite number"),
        (4, "timestamp: missing"),
        (5, "hostname: missing"),
        (6, "gpuUUID: not a GPU UUID"),
        (8, "powerDrawWatt: not a finite number; gpuTempC: not a finite number"),
    ]
    assert result.counters["repeated_headers"] == 1


def test_gpu_csv_empty_and_wrong_files(tmp_path):
    empty = parse_gpu_csv("\n")
    assert empty.table.schema == GPU_SAMPLES.schema and empty.rows == 0
    header_only = tmp_path / "gpu.csv"
    header_only.write_text(",".join(GPU_CSV_COLUMNS) + "\n")
    result = parse_gpu_csv(header_only)
    assert result.table.schema == GPU_SAMPLES.schema and result.rows == 0 and not result.quarantine
    with pytest.raises(ValueError, match="missing columns"):
        parse_gpu_csv(CHECKPOINTS)


# ----------------------------------------------------------------------------------------------
# application-checkpoints.csv + task-x-y.csv
# ----------------------------------------------------------------------------------------------

# (task, event, run_index, host, start, end, duration_s, start_line, stop_line)
EXPECTED_RUNS = [
    (T1, "TotalRender", 0, H1, ts(7, 41, 55), ts(7, 42, 21), 26.0, 2, 8),
    (T1, "Render", 0, H1, ts(7, 41, 55, 50), ts(7, 42, 20, 500), 25.45, 3, 4),
    (T1, "Saving Config", 0, H1, ts(7, 42, 20, 510), ts(7, 42, 20, 512), 0.002, 6, 7),
    (T2, "TotalRender", 0, H2, ts(7, 42, 30), ts(7, 42, 56), 26.0, 11, 14),
    (T2, "Render", 0, H2, ts(7, 42, 30, 100), ts(7, 42, 55), 24.9, 12, 13),
    (T1, "TotalRender", 1, H1, ts(7, 43, 0), ts(7, 43, 31), 31.0, 15, 18),  # re-executed
    (T1, "Render", 1, H1, ts(7, 43, 0, 40), ts(7, 43, 30), 29.96, 16, 17),
    (T4, "Tiling", 0, H2, ts(7, 43, 50), ts(7, 43, 51, 250), 1.25, 22, 23),
    (T4, "Tiling", 1, H1, ts(7, 44, 10), ts(7, 44, 11), 1.0, 25, 26),  # re-executed on another host
    (T4, "Uploading", 0, H1, ts(7, 44, 20), ts(7, 44, 21), 1.0, 27, 28),
    (T4, "Uploading", 1, H1, ts(7, 44, 21), ts(7, 44, 22), 1.0, 29, 30),  # STOP and START at one instant
]
RUN_COLS = ["task_id", "event_name", "run_index", "host", "start_utc", "end_utc", "duration_s",
            "start_line", "stop_line"]
CHECKPOINT_QUARANTINE = [
    (9, "unmatched START: followed by another START at 2018-11-08T07:42:30.000Z"),
    (10, "unmatched START: followed by another START at 2018-11-08T07:42:30.100Z"),
    (19, "unmatched STOP: no START before it"),
    (20, "eventType: expected START or STOP, got 'BEGIN'"),
    (21, "timestamp: not an ISO 8601 time with zone"),
]


def run_rows(table: pa.Table) -> list[tuple]:
    return [tuple(r[c] for c in RUN_COLS) for r in table.to_pylist()]


def test_task_runs_pairing_duplicates_reexecutions():
    result = parse_task_runs(CHECKPOINTS)
    assert result.table.schema == TASK_RUNS.schema
    assert run_rows(result.table) == EXPECTED_RUNS
    assert set(result.table.column("job_id").to_pylist()) == {J}
    assert [(q.line_number, q.reason) for q in result.quarantine] == CHECKPOINT_QUARANTINE
    lines = CHECKPOINTS.read_text().splitlines()
    assert all(q.raw_line == lines[q.line_number - 1] for q in result.quarantine)
    assert result.counters == {
        "data_lines": 29,
        "duplicate_events": 2,  # lines 5 and 24
        "unmatched_start": 2,
        "unmatched_stop": 1,
        "reexecuted_runs": 4,
        "reexecuted_tasks": 2,  # T1 and T4
        "rows_out": 11,
        "quarantined_lines": 5,
    }
    # without task-x-y and gpu: null tiles and GPUs
    assert set(result.table.column("level").to_pylist()) == {None}
    assert set(result.table.column("gpu_id").to_pylist()) == {None}
    q = result.quarantine_table()
    assert q.schema == QUARANTINE.schema
    assert set(q.column("source_table").to_pylist()) == {"clean/task_runs"}


def test_task_runs_with_tiles_and_gpus():
    result = parse_task_runs(CHECKPOINTS, TASK_XY, GPU_CSV)
    assert run_rows(result.table) == EXPECTED_RUNS
    tiles = {(r["task_id"], r["event_name"], r["run_index"]): (r["x"], r["y"], r["level"])
             for r in result.table.to_pylist()}
    assert tiles[(T1, "Render", 1)] == (10, 20, 12)
    assert tiles[(T2, "Render", 0)] == (11, 20, 12)  # the first listing wins over the conflicting one
    assert tiles[(T4, "Tiling", 0)] == (None, None, None)  # not listed
    gpus = {r["host"]: (r["gpu_uuid"], r["gpu_id"]) for r in result.table.to_pylist()}
    assert gpus == {H1: (U1, "GPU-5e3c2a17"), H2: (U2, "GPU-a07f9c3e")}
    assert result.counters["task_xy_rows"] == 2
    assert result.counters["task_xy_duplicates"] == 1
    assert result.counters["task_xy_conflicts"] == 1
    assert result.counters["runs_without_xy"] == 4
    assert result.counters["runs_without_gpu"] == 0
    assert [(q.source_file, q.line_number, q.reason) for q in result.quarantine[-1:]] == [
        (str(TASK_XY), 6, "x: not an integer")]
    assert result.counters["quarantined_lines"] == 6
    assert result.files == [str(CHECKPOINTS), str(TASK_XY), str(GPU_CSV)]
    # the GPU may come from parsed samples as well
    from_table = parse_task_runs(CHECKPOINTS, TASK_XY, parse_gpu_csv(GPU_CSV))
    assert from_table.table.drop_columns(["source_file"]).equals(result.table.drop_columns(["source_file"]))


def test_task_runs_rules_on_small_cases():
    head = ",".join(CHECKPOINT_COLUMNS)

    def runs(*lines: str):
        return parse_task_runs("\n".join([head, *lines]) + "\n")

    # START START STOP: the first START is unmatched, the second pairs
    r = runs(f"2018-11-08T07:00:00Z,{H1},Render,START,{J},{T1}",
             f"2018-11-08T07:00:05Z,{H1},Render,START,{J},{T1}",
             f"2018-11-08T07:00:09Z,{H1},Render,STOP,{J},{T1}")
    assert [(x["start_utc"], x["end_utc"], x["run_index"]) for x in r.table.to_pylist()] == [
        (ts(7, 0, 5), ts(7, 0, 9), 0)]
    assert [q.line_number for q in r.quarantine] == [2]
    # START STOP STOP, file order differs from time order: sorted by time first
    r = runs(f"2018-11-08T07:00:09Z,{H1},Render,STOP,{J},{T1}",
             f"2018-11-08T07:00:00Z,{H1},Render,START,{J},{T1}",
             f"2018-11-08T07:00:12Z,{H1},Render,STOP,{J},{T1}")
    assert [(x["start_line"], x["stop_line"]) for x in r.table.to_pylist()] == [(3, 2)]
    assert [(q.line_number, q.reason) for q in r.quarantine] == [(4, "unmatched STOP: follows another STOP")]
    # a START and STOP on different hosts never pair; case-insensitive eventType
    r = runs(f"2018-11-08T07:00:00Z,{H1},Render,start,{J},{T1}",
             f"2018-11-08T07:00:09Z,{H2},Render,Stop,{J},{T1}")
    assert r.rows == 0
    assert [q.reason for q in r.quarantine] == ["unmatched START: no STOP follows",
                                                "unmatched STOP: no START before it"]
    # same task id in two jobs: separate runs, each run_index 0
    r = runs(f"2018-11-08T07:00:00Z,{H1},Tiling,START,{J},{T1}",
             f"2018-11-08T07:00:01Z,{H1},Tiling,STOP,{J},{T1}",
             f"2018-11-08T07:00:00Z,{H1},Tiling,START,other-job,{T1}",
             f"2018-11-08T07:00:02Z,{H1},Tiling,STOP,other-job,{T1}")
    assert sorted((x["job_id"], x["run_index"], x["duration_s"]) for x in r.table.to_pylist()) == [
        (J, 0, 1.0), ("other-job", 0, 2.0)]
    assert "reexecuted_tasks" not in r.counters
    # an unknown step name is kept and counted; empty ids are quarantined
    r = runs(f"2018-11-08T07:00:00Z,{H1},Denoise,START,{J},{T1}",
             f"2018-11-08T07:00:01Z,{H1},Denoise,STOP,{J},{T1}",
             f"2018-11-08T07:00:01Z,{H1},Render,STOP,{J},")
    assert r.rows == 1 and r.counters["unknown_event_names"] == 2
    assert [q.reason for q in r.quarantine] == ["taskId: missing"]
    empty = parse_task_runs(head + "\n")
    assert empty.table.schema == TASK_RUNS.schema and empty.rows == 0


def test_task_runs_at_one_instant_start_before_stop_unless_a_run_is_open():
    """A zero-duration step whose STOP line the log wrote before its START line (same millisecond)
    was lost: sorted by (time, line) the STOP came first, unmatched, and the START after it too.
    START goes first at one instant -- but a STOP at the instant a START of an earlier instant is
    open ends that run, and the instant's START opens the next (back-to-back runs, in either line
    order, also chained)."""
    head = ",".join(CHECKPOINT_COLUMNS)

    def runs(*events: tuple[str, str]):
        lines = [f"2018-11-08T07:00:{t}Z,{H1},Tiling,{kind},{J},{T1}" for t, kind in events]
        r = parse_task_runs("\n".join([head, *lines]) + "\n")
        return ([(x["start_utc"], x["end_utc"], x["run_index"], x["start_line"], x["stop_line"])
                 for x in r.table.to_pylist()], [q.line_number for q in r.quarantine])

    # the reviewer's case: STOP line, then START line, same instant
    assert runs(("01.500", "STOP"), ("01.500", "START")) == ([(ts(7, 0, 1, 500), ts(7, 0, 1, 500), 0, 3, 2)], [])
    # file order START, STOP at one instant (unchanged)
    assert runs(("01.500", "START"), ("01.500", "STOP")) == ([(ts(7, 0, 1, 500), ts(7, 0, 1, 500), 0, 2, 3)], [])
    # back to back: the run from 00 ends at 05 where the next starts, START line written first
    assert runs(("00", "START"), ("05", "START"), ("05", "STOP"), ("09", "STOP")) == (
        [(ts(7, 0, 0), ts(7, 0, 5), 0, 2, 4), (ts(7, 0, 5), ts(7, 0, 9), 1, 3, 5)], [])
    # a chain of three back-to-back runs, STOP and START lines in both orders
    assert runs(("00", "START"), ("05", "START"), ("05", "STOP"), ("07", "STOP"), ("07", "START"),
                ("09", "STOP")) == (
        [(ts(7, 0, 0), ts(7, 0, 5), 0, 2, 4), (ts(7, 0, 5), ts(7, 0, 7), 1, 3, 5),
         (ts(7, 0, 7), ts(7, 0, 9), 2, 6, 7)], [])
    # after a closed run, a zero-duration step written STOP first is a run of its own
    assert runs(("00", "START"), ("03", "STOP"), ("05", "STOP"), ("05", "START")) == (
        [(ts(7, 0, 0), ts(7, 0, 3), 0, 2, 3), (ts(7, 0, 5), ts(7, 0, 5), 1, 5, 4)], [])
    # an open START with no STOP at the instant: unmatched as before
    assert runs(("00", "START"), ("05", "START"), ("09", "STOP")) == ([(ts(7, 0, 5), ts(7, 0, 9), 0, 3, 4)], [2])


# ----------------------------------------------------------------------------------------------
# Per-task GPU means
# ----------------------------------------------------------------------------------------------

T0 = dt.datetime(2018, 11, 8, 7, 0, tzinfo=UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def samples_table(rows: list[tuple]) -> pa.Table:
    """rows: (host, gpu_id, seconds, util, power)"""
    return conform(pa.table({
        "sample_utc": pa.array([at(s) for _, _, s, _, _ in rows], pa.timestamp("us", tz="UTC")),
        "source": ["terapixel"] * len(rows),
        "host": [h for h, _, _, _, _ in rows],
        "gpu_id": [g for _, g, _, _, _ in rows],
        "util_pct": pa.array([u for _, _, _, u, _ in rows], pa.float64()),
        "power_w": pa.array([p for _, _, _, _, p in rows], pa.float64()),
    }), GPU_SAMPLES)


def runs_table(rows: list[tuple]) -> pa.Table:
    """rows: (name, host, gpu_id, start s, end s)"""
    return conform(pa.table({
        "job_id": [J] * len(rows),
        "task_id": [n for n, _, _, _, _ in rows],
        "event_name": ["Render"] * len(rows),
        "run_index": pa.array([0] * len(rows), pa.int32()),
        "host": [h for _, h, _, _, _ in rows],
        "gpu_id": pa.array([g for _, _, g, _, _ in rows], pa.string()),
        "start_utc": pa.array([at(s) for _, _, _, s, _ in rows], pa.timestamp("us", tz="UTC")),
        "end_utc": pa.array([at(e) for _, _, _, _, e in rows], pa.timestamp("us", tz="UTC")),
        "duration_s": [float(e - s) for _, _, _, s, e in rows],
        "start_line": pa.array([1] * len(rows), pa.int64()),
        "stop_line": pa.array([2] * len(rows), pa.int64()),
    }), TASK_RUNS)


def test_task_gpu_means_hand_computed():
    samples = samples_table([
        ("h", "GPU-aaaaaaaa", 0, 10.0, 100.0),
        ("h", "GPU-aaaaaaaa", 2, 20.0, 200.0),
        ("h", "GPU-aaaaaaaa", 2, 30.0, None),  # same instant: averaged (util 25, power 200)
        ("h", "GPU-aaaaaaaa", 4, 40.0, None),
        ("h", "GPU-aaaaaaaa", 30, 80.0, None),  # after a 26 s gap: t=4 holds only max_hold_s = 10 s
        ("h2", "GPU-bbbbbbbb", 1, 99.0, 999.0),  # another host's GPU: never mixed in
    ])
    runs = runs_table([
        ("a", "h", "GPU-aaaaaaaa", 1, 5),  # t=2 for 2 s, t=4 for 1 s (cut at end)
        ("b", "h", "GPU-aaaaaaaa", 0, 40),  # 2 + 2 + 10 + 10 s
        ("c", "h", "GPU-aaaaaaaa", 5, 6),  # no sample inside
        ("d", "nohost", None, 0, 40),
        ("e", "h", None, 0, 2),  # GPU resolved: the host's only GPU
        ("f", "h", "GPU-aaaaaaaa", 2, 2),  # zero length
        ("g", "h", "GPU-cccccccc", 0, 40),  # a GPU without samples
    ])
    out = task_gpu_means(runs, samples, max_hold_s=10)
    assert out.schema == TASK_GPU_MEANS.schema
    got = {r["task_id"]: r for r in out.to_pylist()}
    assert [r["task_id"] for r in out.to_pylist()] == list("abcdefg")  # order of task_runs

    def check(name, samples_, covered, util, power, energy):
        r = got[name]
        assert r["samples"] == samples_
        assert r["covered_s"] == pytest.approx(covered)
        for key, want in (("util_pct_mean", util), ("power_w_mean", power), ("energy_j", energy)):
            assert (r[key] is None) if want is None else r[key] == pytest.approx(want), (name, key)
        assert r["temp_c_mean"] is None and r["mem_util_pct_mean"] is None

    check("a", 2, 3.0, (25 * 2 + 40 * 1) / 3, 200.0, 400.0)
    check("b", 4, 24.0, (10 * 2 + 25 * 2 + 40 * 10 + 80 * 10) / 24, (100 * 2 + 200 * 2) / 4, 600.0)
    check("c", 0, 0.0, None, None, None)
    check("d", 0, 0.0, None, None, None)
    check("e", 1, 2.0, 10.0, 100.0, 200.0)
    check("f", 0, 0.0, None, None, None)
    check("g", 0, 0.0, None, None, None)
    # max_hold_s changes the gap's weight: t=4 now holds 26 s until t=30, t=30 holds 10 s (to end 40)
    wide = {r["task_id"]: r for r in task_gpu_means(runs, samples, max_hold_s=60).to_pylist()}
    assert wide["b"]["util_pct_mean"] == pytest.approx((10 * 2 + 25 * 2 + 40 * 26 + 80 * 10) / 40)
    # empty inputs keep the schema
    assert task_gpu_means(runs.slice(0, 0), samples).schema == TASK_GPU_MEANS.schema
    none = task_gpu_means(runs, samples.slice(0, 0))
    assert none.column("samples").to_pylist() == [0] * 7
    with pytest.raises(ValueError):
        task_gpu_means(runs, samples, max_hold_s=0)


def test_task_gpu_means_on_the_fixtures():
    samples = parse_gpu_csv(GPU_CSV)
    runs = parse_task_runs(CHECKPOINTS, gpu=samples)
    got = {(r["task_id"], r["event_name"], r["run_index"]): r for r in task_gpu_means(runs, samples).to_pylist()}
    r = got[(T1, "Render", 0)]  # H1 samples at 55.921, 57.921, 01.921, 03.921 inside [55.050, 20.500)
    assert r["samples"] == 4
    assert r["covered_s"] == pytest.approx(2 + 4 + 2 + 10)
    assert r["util_pct_mean"] == pytest.approx((92 * 2 + 95 * 4 + 97 * 2 + 98 * 10) / 18)
    assert got[(T2, "Render", 0)]["samples"] == 0


# ----------------------------------------------------------------------------------------------
# Generator round trip
# ----------------------------------------------------------------------------------------------

REFERENCE_SQL = """
WITH s AS (
    SELECT host, gpu_id, epoch_us(sample_utc) AS t, avg(util_pct) AS u, avg(power_w) AS p
    FROM samples GROUP BY ALL
), s2 AS (
    SELECT *, lead(t) OVER (PARTITION BY host, gpu_id ORDER BY t) AS t_next FROM s
)
SELECT r.i, count(s2.t) AS n,
    sum((least(coalesce(s2.t_next, s2.t + $hold), s2.t + $hold, epoch_us(r.end_utc)) - s2.t) * s2.u)
      / sum(least(coalesce(s2.t_next, s2.t + $hold), s2.t + $hold, epoch_us(r.end_utc)) - s2.t) AS u,
    sum((least(coalesce(s2.t_next, s2.t + $hold), s2.t + $hold, epoch_us(r.end_utc)) - s2.t) * s2.p) / 1e6 AS e
FROM runs r LEFT JOIN s2 ON s2.host = r.host AND s2.gpu_id = r.gpu_id
    AND s2.t >= epoch_us(r.start_utc) AND s2.t < epoch_us(r.end_utc)
GROUP BY r.i ORDER BY r.i
"""


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return write_terapixel_sample(tmp_path_factory.mktemp("terapixel"), dt.datetime(2018, 11, 8, 7, 0, 0, 123456,
                                                                                      tzinfo=UTC))


def test_generator_writes_the_dataset_format(sample):
    assert sample.start_utc == dt.datetime(2018, 11, 8, 7, 0, 0, 123000, tzinfo=UTC)
    assert sample.end_utc == sample.start_utc + dt.timedelta(hours=2)
    files = {sample.gpu_csv: GPU_CSV_COLUMNS, sample.checkpoints_csv: CHECKPOINT_COLUMNS,
             sample.task_xy_csv: TASK_XY_COLUMNS}
    for path, header in files.items():
        lines = path.read_text().splitlines()
        assert lines[0] == ",".join(header)
        assert '"' not in path.read_text()
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    host = r"[0-9a-f]{32}\d{6}"
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    gpu_line = re.compile(rf"^{iso},{host},\d{{12}},GPU-{uuid},\d+(\.\d+)?,\d+,\d+,\d+$")
    cp_line = re.compile(rf"^{iso},{host},({'|'.join(EVENT_NAMES)}),(START|STOP),1024-lvl(4|8|12)-{uuid},{uuid}$")
    xy_line = re.compile(rf"^{uuid},1024-lvl(4|8|12)-{uuid},\d+,\d+,(4|8|12)$")
    for path, pattern in ((sample.gpu_csv, gpu_line), (sample.checkpoints_csv, cp_line),
                          (sample.task_xy_csv, xy_line)):
        bad = [x for x in path.read_text().splitlines()[1:] if not pattern.match(x)]
        assert not bad, (path.name, bad[:3])
    assert len(sample.hosts) == 4 and len(set(sample.gpu_uuids.values())) == 4


def test_generator_is_deterministic(sample, tmp_path):
    again = write_terapixel_sample(tmp_path, dt.datetime(2018, 11, 8, 7, 0, 0, 123456, tzinfo=UTC))
    for a, b in ((sample.gpu_csv, again.gpu_csv), (sample.checkpoints_csv, again.checkpoints_csv),
                 (sample.task_xy_csv, again.task_xy_csv)):
        assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    other = write_terapixel_sample(tmp_path / "other", sample.start_utc, seed=1)
    assert other.gpu_csv.read_bytes() != sample.gpu_csv.read_bytes()


def test_generator_round_trips_with_the_counts_it_claims(sample):
    gpu = parse_gpu_csv(sample.gpu_csv)
    assert gpu.rows == sample.gpu_rows and not gpu.quarantine
    assert gpu.counters == {"data_lines": sample.gpu_rows, "rows_out": sample.gpu_rows, "quarantined_lines": 0}
    times = gpu.table.column("sample_utc").to_pylist()
    assert sample.start_utc <= min(times) and max(times) < sample.end_utc
    assert {r["host"]: r["gpu_uuid"] for r in gpu.table.select(["host", "gpu_uuid"]).to_pylist()} == sample.gpu_uuids

    runs = parse_task_runs(sample.checkpoints_csv, sample.task_xy_csv, sample.gpu_csv)
    assert not runs.quarantine
    assert runs.rows == sample.task_runs
    assert runs.counters["data_lines"] == sample.checkpoint_rows
    assert runs.counters["duplicate_events"] == sample.duplicate_rows == 3
    assert runs.counters["reexecuted_tasks"] == sample.reexecuted_tasks == 1
    assert runs.counters["reexecuted_runs"] == len(EVENT_NAMES)
    assert runs.counters["task_xy_rows"] == sample.tasks
    assert "runs_without_xy" not in runs.counters and "runs_without_gpu" not in runs.counters
    again = [r for r in runs.table.to_pylist() if r["run_index"] == 1]
    assert {(r["job_id"], r["task_id"]) for r in again} == {sample.reexecuted_task}
    assert sorted(r["event_name"] for r in again) == sorted(EVENT_NAMES)
    first = {r["event_name"]: r for r in runs.table.to_pylist()
             if (r["job_id"], r["task_id"]) == sample.reexecuted_task and r["run_index"] == 0}
    assert all(first[r["event_name"]]["end_utc"] < r["start_utc"] for r in again)
    assert all(r["gpu_uuid"] == sample.gpu_uuids[r["host"]] for r in runs.table.to_pylist())
    assert set(runs.table.column("level").to_pylist()) <= {4, 8, 12}
    per_task = {}
    for r in runs.table.to_pylist():
        per_task.setdefault((r["job_id"], r["task_id"], r["run_index"]), {})[r["event_name"]] = r
    for steps in per_task.values():  # TotalRender spans the other steps
        total = steps["TotalRender"]
        assert all(total["start_utc"] <= s["start_utc"] <= s["end_utc"] <= total["end_utc"] for s in steps.values())

    # per-task means: Render keeps the GPU busy; matches a plain DuckDB interval join
    means = task_gpu_means(runs, gpu)
    assert means.num_rows == runs.rows
    render = [r for r in means.to_pylist() if r["event_name"] == "Render"]
    assert all(r["samples"] > 0 and r["util_pct_mean"] >= 75 for r in render)
    con = duckdb.connect()
    con.register("samples", gpu.table)
    con.register("runs", runs.table.append_column("i", pa.array(range(runs.rows))))
    ref = con.sql(REFERENCE_SQL, params={"hold": 10_000_000}).fetchall()
    for (_, n, util, energy), got in zip(ref, means.to_pylist(), strict=True):
        assert got["samples"] == n
        if n:
            assert got["util_pct_mean"] == pytest.approx(util, rel=1e-9)
            assert got["energy_j"] == pytest.approx(energy, rel=1e-9)
        else:
            assert got["util_pct_mean"] is None


def test_window_on_generated_day(sample):
    full = parse_gpu_csv(sample.gpu_csv)
    lo, hi = sample.start_utc + dt.timedelta(minutes=30), sample.start_utc + dt.timedelta(minutes=45)
    part = parse_gpu_csv(sample.gpu_csv, start_utc=lo, end_utc=hi)
    times = full.table.column("sample_utc").to_pylist()
    inside = sum(lo <= t < hi for t in times)
    assert part.rows == inside > 0
    assert part.counters["outside_window"] == full.rows - inside
    assert all(lo <= t < hi for t in part.table.column("sample_utc").to_pylist())


def test_many_batches_keep_line_numbers(tmp_path):
    """A file larger than one read block, with bad lines far apart: numbers stay exact."""
    src = tmp_path / "gpu.csv"
    shutil.copy(write_terapixel_sample(tmp_path / "s", T0, hosts=16, hours=3).gpu_csv, src)
    lines = src.read_text().splitlines()
    n = len(lines)
    assert src.stat().st_size > 3 << 20
    bad = {1000: "x,y", n - 5: lines[n - 5].replace("Z,", ",", 1)}
    for i, text in bad.items():
        lines[i] = text
    text = "\n".join(lines) + "\n"
    from gpu_pipeline.lib import terapixel

    old = terapixel._BLOCK
    terapixel._BLOCK = 1 << 20
    try:
        result = parse_gpu_csv(text)
    finally:
        terapixel._BLOCK = old
    assert [(q.line_number, q.raw_line) for q in result.quarantine] == [(i + 1, bad[i]) for i in sorted(bad)]
    assert result.rows == n - 1 - len(bad)
    assert result.counters["data_lines"] == n - 1


def test_a_task_event_set_aside_carries_its_time():
    """An unmatched START or STOP, whose time was read, carries it (``record_utc``), so the day it
    falls in reports it; a line whose time cannot be read carries none. Before, none did, and every
    line went to the file's first day of runs."""
    head = ",".join(CHECKPOINT_COLUMNS)
    r = parse_task_runs("\n".join([head, f"2018-11-08T07:00:00Z,{H1},Render,START,{J},{T1}",
                                   f"2018-11-09T08:00:00Z,{H1},Render,STOP,{J},{T2}",
                                   f"yesterday,{H1},Render,STOP,{J},{T2}"]) + "\n")
    assert [(q.line_number, q.reason.split(":")[0], q.record_utc) for q in r.quarantine] == [
        (2, "unmatched START", ts(7, 0, 0)), (3, "unmatched STOP", dt.datetime(2018, 11, 9, 8, tzinfo=UTC)),
        (4, "timestamp", None)]
    assert r.quarantine_table()["record_utc"].to_pylist() == [q.record_utc for q in r.quarantine]


def test_the_means_name_the_gpu_they_came_from_also_after_a_gpu_was_replaced():
    """A run without a GPU of its own took the host's only GPU, and left its gpu_id / gpu_uuid null;
    a host whose GPU was replaced in the day (two GPUs in the samples) gave its runs no means at all.
    Each run now takes the host's GPU with the most samples during it, and names it."""
    samples = samples_table([("h", "GPU-aaaaaaaa", s, 50.0, 100.0) for s in range(0, 10, 2)]
                            + [("h", "GPU-bbbbbbbb", s, 90.0, 300.0) for s in range(20, 30, 2)]
                            + [("h2", "GPU-cccccccc", s, 10.0, 50.0) for s in range(0, 30, 2)])
    samples = samples.set_column(samples.column_names.index("gpu_uuid"), "gpu_uuid", pa.array(
        [f"{g.lower()[:12]}-0000-0000-0000-000000000000" for g in samples["gpu_id"].to_pylist()]))
    runs = runs_table([("a", "h", None, 0, 8), ("b", "h", None, 20, 28), ("c", "h2", None, 0, 10),
                       ("d", "h", "GPU-aaaaaaaa", 20, 28)])
    got = {r["task_id"]: r for r in task_gpu_means(runs, samples).to_pylist()}
    assert [(t, got[t]["gpu_id"], got[t]["gpu_uuid"], got[t]["samples"], got[t]["util_pct_mean"]) for t in "abcd"] == [
        ("a", "GPU-aaaaaaaa", "gpu-aaaaaaaa-0000-0000-0000-000000000000", 4, 50.0),
        ("b", "GPU-bbbbbbbb", "gpu-bbbbbbbb-0000-0000-0000-000000000000", 4, 90.0),
        ("c", "GPU-cccccccc", "gpu-cccccccc-0000-0000-0000-000000000000", 5, 10.0),
        ("d", "GPU-aaaaaaaa", None, 0, None),  # its own GPU, no sample of it then: as it was
    ]


@pytest.mark.parametrize("bad", ["quote", "latin1", "binary"])
def test_a_stray_quote_or_bytes_that_are_not_utf8(bad):
    """The dataset has no quoting: a '"' opening a cell made Arrow read the rest of the file as one
    cell (999 rows lost without a count). Bytes that are not UTF-8 fail the file naming it (pyarrow
    stopped with a message that named neither the file nor the line)."""
    lines = [",".join(GPU_CSV_COLUMNS)] + [
        f"2018-11-08T07:{m:02d}:00.000Z,{H1},0325018004239,{U1},100.0,40,50,10" for m in range(20)]
    if bad == "quote":
        lines[5] = lines[5].replace(H1, '"' + H1)
        r = parse_gpu_csv("\n".join(lines) + "\n")
        assert r.rows == 20 and not r.quarantine
        assert sorted(set(r.table["host"].to_pylist())) == ['"' + H1, H1]
        return
    data = ("\n".join(lines) + "\n").encode()
    data = data.replace(b"0325018004239", b"03250\xe9004239", 1) if bad == "latin1" else data + b"\x00\x01\x80\xff\n"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "gpu.csv"
        path.write_bytes(data)
        with pytest.raises(ValueError, match=r"gpu\.csv: unreadable Terapixel"):
            parse_gpu_csv(path)
