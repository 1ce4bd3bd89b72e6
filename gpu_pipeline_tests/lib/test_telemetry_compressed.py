"""Telemetry files compressed by a log rotation (``*.csv.gz``, ``*.prom.zst``, ...) read as their
plain text would be: the same rows and quarantined lines on the fast path and line by line, the
raw step's partition the same but for the file names, a rotation's unfinished copy beside its file
skipped, a corrupt file failing with its name, and the memory plan made from the text's size."""

from __future__ import annotations

import datetime as dt
import gzip
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from gpu_pipeline.lib.samples import RawStream, write_raw_samples
from gpu_pipeline.lib.schemas import RAW_GPU_TELEMETRY
from gpu_pipeline.lib.simulate import SimConfig, simulate
from gpu_pipeline.lib.store import Store
from gpu_pipeline.lib.telemetry import (
    COMPRESSED_TEXT_FACTOR,
    TelemetryDir,
    parse_dcgm_text,
    parse_nvidia_smi_csv,
    read_telemetry_dir,
)
from gpu_pipeline.lib.timeutil import day_window

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "telemetry"
TZ = "America/Chicago"
DAY = dt.date(2025, 8, 5)


def _compress(path: Path, codec: str) -> Path:
    """``path`` replaced by its compressed copy ``path.gz`` / ``path.zst``, made by the codec's own
    tool format (gzip's stdlib writer; zstd through pyarrow's stream writer, as ``zstd`` would)."""
    data = path.read_bytes()
    if codec == "gzip":
        out = path.with_name(path.name + ".gz")
        out.write_bytes(gzip.compress(data))
    else:
        out = path.with_name(path.name + ".zst")
        with pa.output_stream(str(out), compression="zstd") as sink:
            sink.write(data)
    path.unlink()
    return out


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("sim")
    simulate(base, SimConfig(start=DAY, end=DAY + dt.timedelta(days=1), gpus=24, seed=11, timezone=TZ,
                             telemetry_interval_s=120))
    return base / "telemetry"


def _compressed_tree(sim: Path, dest: Path, codec_of: dict[str, str]) -> Path:
    """A copy of the simulated telemetry with each kind's files compressed by its codec."""
    shutil.copytree(sim, dest)
    for kind, codec in codec_of.items():
        for path in sorted((dest / kind).glob("*/*")):
            _compress(path, codec)
    return dest


def _without_file_names(table: pa.Table) -> pa.Table:
    return table.drop_columns(["source_file"])


@pytest.mark.parametrize("codecs", [{"nvidia-smi": "gzip", "dcgm": "zstd"}, {"nvidia-smi": "zstd", "dcgm": "gzip"}],
                         ids=["smi-gzip-dcgm-zstd", "smi-zstd-dcgm-gzip"])
def test_a_compressed_day_reads_as_its_text(sim, tmp_path, codecs):
    start, end = day_window(DAY, TZ)
    plain = read_telemetry_dir(sim, start, end, TZ)
    packed = read_telemetry_dir(_compressed_tree(sim, tmp_path / "telemetry", codecs), start, end, TZ)
    assert plain.rows > 0 and not plain.quarantine
    assert _without_file_names(packed.table).equals(_without_file_names(plain.table))
    suffix = {"gzip": ".gz", "zstd": ".zst"}
    assert packed.files == [f + suffix[codecs[f.split("/")[0]]] for f in plain.files]
    assert set(packed.table["source_file"].to_pylist()) <= set(packed.files)
    assert packed.fast_parsed == plain.fast_parsed == len(plain.files)  # no file fell off the fast path
    assert packed.counters["files_outside_window"] == plain.counters["files_outside_window"]


def test_the_line_parsers_read_compressed_files_with_the_same_quarantine(tmp_path):
    for fixture, parse, kw in (
        ("nvidia-smi-a100-header.csv", parse_nvidia_smi_csv, {"source_tz": TZ}),
        ("dcgm-a100-mig-dup-invalid.prom", parse_dcgm_text, {}),
    ):
        plain = tmp_path / fixture
        shutil.copy(FIXTURES / fixture, plain)
        want = parse(plain, **kw)
        assert want.quarantine  # the fixtures hold bad lines: the line-by-line path is exercised
        for codec in ("gzip", "zstd"):
            copy = tmp_path / codec / fixture
            copy.parent.mkdir(exist_ok=True)
            shutil.copy(plain, copy)
            got = parse(_compress(copy, codec), **kw)
            assert _without_file_names(got.table).equals(_without_file_names(want.table))
            assert [q[:3] for q in got.quarantine] == [
                q[:3] for q in want.quarantine]
            assert got.counters == want.counters


def test_the_raw_step_writes_the_same_partition_from_compressed_files(sim, tmp_path):
    start, end = day_window(DAY, TZ)
    packed = _compressed_tree(sim, tmp_path / "telemetry", {"nvidia-smi": "gzip", "dcgm": "zstd"})
    tables = {}
    for name, root in (("plain", sim), ("packed", packed)):
        store = Store(tmp_path / f"store-{name}")
        written = write_raw_samples(store, DAY.isoformat(), RawStream(root, start, end, TZ, 0))
        assert written.rows > 0
        tables[name] = pq.read_table(store.partition_file(RAW_GPU_TELEMETRY, DAY.isoformat()))
    files = tables["packed"]["source_file"]
    assert pc.all(pc.or_(pc.ends_with(files, ".gz"), pc.ends_with(files, ".zst"))).as_py()
    assert _without_file_names(tables["packed"]).equals(_without_file_names(tables["plain"]))


def test_a_file_being_compressed_by_its_rotation_is_read_once(sim, tmp_path):
    """logrotate writes ``file.gz`` and then removes ``file``: a run in between sees both, the copy
    perhaps unfinished. The file is read; the copy is skipped and counted."""
    start, end = day_window(DAY, TZ)
    tree = tmp_path / "telemetry"
    shutil.copytree(sim, tree)
    plain = read_telemetry_dir(tree, start, end, TZ)
    victim = sorted((tree / "nvidia-smi").glob(f"*/nvidia-smi-{DAY.isoformat()}.csv"))[0]
    half = gzip.compress(victim.read_bytes())[:200]  # a copy cut off mid-write
    victim.with_name(victim.name + ".gz").write_bytes(half)
    both = read_telemetry_dir(tree, start, end, TZ)
    assert both.counters["compressed_twins_skipped"] == 1
    assert both.files == plain.files
    assert both.table.equals(plain.table)


def test_a_corrupt_compressed_file_fails_naming_the_file_and_codec(tmp_path):
    host = tmp_path / "telemetry" / "dcgm" / "gpu-01"
    host.mkdir(parents=True)
    good = gzip.compress((FIXTURES / "dcgm-a100-mig-dup-invalid.prom").read_bytes())
    bad = host / "dcgm-2026-07-14.prom.gz"
    bad.write_bytes(good[: len(good) // 2])  # truncated
    start = dt.datetime(2026, 7, 14, tzinfo=dt.UTC)
    with pytest.raises(ValueError, match=r"dcgm-2026-07-14\.prom\.gz: cannot read the gzip-compressed text"):
        read_telemetry_dir(tmp_path / "telemetry", start, start + dt.timedelta(days=1), "UTC")


def test_memory_is_planned_from_the_text_not_the_compressed_size(sim, tmp_path):
    """The spill's slabs are sized from the text a day holds before it is read: a compressed file
    counts as many times its size, so a compressed day is not planned as a twentieth of itself."""
    start, end = day_window(DAY, TZ)
    packed = _compressed_tree(sim, tmp_path / "telemetry", {"nvidia-smi": "gzip", "dcgm": "zstd"})
    plain_dir, packed_dir = TelemetryDir(sim, start, end, TZ, margin_days=0), TelemetryDir(packed, start, end, TZ, margin_days=0)
    assert packed_dir.input_bytes < plain_dir.input_bytes / 5  # what is on disk
    assert packed_dir.text_bytes == COMPRESSED_TEXT_FACTOR * packed_dir.input_bytes
    assert packed_dir.text_bytes >= plain_dir.text_bytes == plain_dir.input_bytes  # never planned smaller
    assert RawStream(packed, start, end, TZ, 0).expected_bytes == packed_dir.text_bytes // 2
