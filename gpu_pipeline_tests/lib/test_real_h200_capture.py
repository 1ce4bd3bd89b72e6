"""Real output of nvidia-smi and of our NVML sampler on one NVIDIA H200, idle and then under load
(``fixtures/telemetry/h200/README.md`` says how it was captured): the parsers read it without a
quarantined line, the two sources agree with each other and with the physics of the energy
counter, and the pipeline's raw sample reader takes both from one telemetry folder."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpu_pipeline.lib.samples import raw_samples, read_nvml_dir
from gpu_pipeline.lib.schemas import GPU_SAMPLES
from gpu_pipeline.lib.telemetry import DEFAULT_QUERY_FIELDS, parse_nvidia_smi_csv

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "telemetry" / "h200"
HEADER = FIX / "nvidia-smi-h200-header.csv"
NOHEADER = FIX / "nvidia-smi-h200-noheader-nounits.csv"
NVML = FIX / "nvml-2026-11-26.parquet"
HOST = "gpu-node-01"
UUID = "GPU-80103a21-eda2-1761-c556-b18507ab102c"
DAY = dt.datetime(2026, 11, 26, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def smi():
    parsed = parse_nvidia_smi_csv(HEADER, source_tz="UTC", host=HOST)
    assert parsed.counters["quarantined_lines"] == 0
    return parsed.table.to_pylist()


@pytest.fixture(scope="module")
def nvml():
    return pq.read_table(NVML).to_pylist()


def test_nvidia_smi_rows_are_the_h200s_one_a_second(smi):
    assert len(smi) == 14
    assert {(r["gpu_uuid"], r["gpu_id"], r["gpu_index"], r["device_name"]) for r in smi} == {
        (UUID, "GPU-80103a21", 0, "NVIDIA H200")}
    assert {(r["mem_total_mib"], r["power_limit_w"]) for r in smi} == {(143771.0, 700.0)}
    gaps = [(b["sample_utc"] - a["sample_utc"]).total_seconds() for a, b in zip(smi, smi[1:], strict=False)]
    assert all(0.9 < g < 1.1 for g in gaps)
    idle, busy = smi[:7], smi[-5:]
    assert all(r["util_pct"] == 0 and 70 < r["power_w"] < 90 and r["mem_used_mib"] == 0 for r in idle)
    assert all(r["util_pct"] == 100 and 600 < r["power_w"] <= 700 and r["mem_used_mib"] > 0 for r in busy)


def test_the_noheader_nounits_form_gives_the_same_readings():
    with_header = parse_nvidia_smi_csv(HEADER, source_tz="UTC", host=HOST).table
    bare = parse_nvidia_smi_csv(NOHEADER, source_tz="UTC", host=HOST, fields=DEFAULT_QUERY_FIELDS)
    assert bare.counters["quarantined_lines"] == 0
    # two nvidia-smi processes read the same second a few ms apart; the readings are the same
    cols = [c for c in with_header.column_names if c not in ("sample_utc", "source_file")]
    assert bare.table.select(cols).equals(with_header.select(cols))


def test_nvml_sampler_file_has_the_schema_and_the_same_gpu(nvml, smi):
    assert pq.read_schema(NVML).remove_metadata() == GPU_SAMPLES.schema.remove_metadata()
    assert len(nvml) == 14
    assert {(r["source"], r["host"], r["gpu_uuid"], r["gpu_id"], r["device_name"]) for r in nvml} == {
        ("nvml", HOST, UUID, "GPU-80103a21", "NVIDIA H200")}
    assert {r["mem_total_mib"] for r in nvml} == {smi[0]["mem_total_mib"]}
    assert {r["power_limit_w"] for r in nvml} == {smi[0]["power_limit_w"]}
    # NVML's used memory in bytes -> MiB; nvidia-smi prints the same figure rounded
    busy_nvml = {round(r["mem_used_mib"]) for r in nvml if r["util_pct"] == 100}
    busy_smi = {r["mem_used_mib"] for r in smi if r["util_pct"] == 100}
    assert busy_nvml == busy_smi == {1011.0}
    # both idle at first: the same power within a watt
    assert abs(sum(r["power_w"] for r in nvml[:7]) / 7 - sum(r["power_w"] for r in smi[:7]) / 7) < 1.0
    assert all(r["sm_clock_mhz"] and r["temp_c"] for r in nvml)


def test_energy_counter_agrees_with_the_power_readings(nvml):
    """The total-energy counter (mJ) grows by power x time: where the power is steady across an
    interval, the counter's rise over it gives that power within 3 %."""
    steady = 0
    for a, b in zip(nvml, nvml[1:], strict=False):
        seconds = (b["sample_utc"] - a["sample_utc"]).total_seconds()
        rise_w = (b["energy_mj"] - a["energy_mj"]) / 1000 / seconds
        assert rise_w > 0
        if abs(a["power_w"] - b["power_w"]) < 0.02 * a["power_w"]:
            steady += 1
            assert rise_w == pytest.approx((a["power_w"] + b["power_w"]) / 2, rel=0.03)
    assert steady >= 10  # idle and loaded intervals both


def test_the_raw_sample_reader_takes_both_sources_from_one_folder(tmp_path):
    root = tmp_path / "telemetry"
    (root / "nvidia-smi" / HOST).mkdir(parents=True)
    (root / "nvml" / HOST).mkdir(parents=True)
    shutil.copy(HEADER, root / "nvidia-smi" / HOST / "nvidia-smi-2026-11-26.csv")
    shutil.copy(NVML, root / "nvml" / HOST / NVML.name)
    nvml_only, files = read_nvml_dir(root, DAY, DAY + dt.timedelta(days=1))
    assert nvml_only.num_rows == 14 and files == [str(root / "nvml" / HOST / NVML.name)]
    got = raw_samples(root, DAY, DAY + dt.timedelta(days=1), source_tz="UTC")
    rows = got.table.to_pylist()
    assert sorted({(r["source"], r["host"], r["gpu_id"]) for r in rows}) == [
        ("nvidia-smi", HOST, "GPU-80103a21"), ("nvml", HOST, "GPU-80103a21")]
    assert len(rows) == 28
    # the day before holds none of them
    before = raw_samples(root, DAY - dt.timedelta(days=1), DAY, source_tz="UTC")
    assert before.table.num_rows == 0
