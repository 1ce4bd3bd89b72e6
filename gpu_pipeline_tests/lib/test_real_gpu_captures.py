"""Real output of nvidia-smi and of our NVML sampler on one NVIDIA H200 and on one NVIDIA H100,
idle, then under load, then (the H100) idle again. ``fixtures/telemetry/h200/README.md`` and
``fixtures/telemetry/h100/README.md`` say how each was captured. The parsers read them without a
quarantined line. The two sources agree with each other and with the physics of the energy counter.
The pipeline's raw sample reader takes both from one telemetry folder. On the H100 the sampler also
skipped an interval it missed, was stopped by SIGTERM, and was restarted on the same day."""

from __future__ import annotations

import datetime as dt
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpu_pipeline.lib.samples import raw_samples, read_nvml_dir
from gpu_pipeline.lib.schemas import GPU_SAMPLES
from gpu_pipeline.lib.telemetry import DEFAULT_QUERY_FIELDS, parse_nvidia_smi_csv

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "telemetry"


@dataclass(frozen=True)
class Capture:
    model: str
    host: str
    uuid: str
    device_name: str
    day: dt.date
    smi_rows: int
    nvml_rows: int
    mem_total_mib: float
    busy_mem_used_mib: float  # what the matrix-product process held, as nvidia-smi prints it

    @property
    def folder(self) -> Path:
        return FIXTURES / self.model

    @property
    def header_csv(self) -> Path:
        return self.folder / f"nvidia-smi-{self.model}-header.csv"

    @property
    def noheader_csv(self) -> Path:
        return self.folder / f"nvidia-smi-{self.model}-noheader-nounits.csv"

    @property
    def nvml(self) -> Path:
        return self.folder / f"nvml-{self.day.isoformat()}.parquet"

    @property
    def start(self) -> dt.datetime:
        return dt.datetime.combine(self.day, dt.time(), dt.UTC)


H200 = Capture("h200", "gpu-node-01", "GPU-80103a21-eda2-1761-c556-b18507ab102c", "NVIDIA H200",
               dt.date(2026, 11, 26), smi_rows=14, nvml_rows=14, mem_total_mib=143771.0,
               busy_mem_used_mib=1011.0)
H100 = Capture("h100", "gpu-node-02", "GPU-22154b80-6d7b-e244-c629-789c1c63008c", "NVIDIA H100 80GB HBM3",
               dt.date(2026, 11, 27), smi_rows=28, nvml_rows=24, mem_total_mib=81559.0,
               busy_mem_used_mib=883.0)
CAPTURES = [pytest.param(H200, id="h200"), pytest.param(H100, id="h100")]
POWER_LIMIT_W = 700.0  # both cards


def _smi(cap: Capture) -> list[dict]:
    parsed = parse_nvidia_smi_csv(cap.header_csv, source_tz="UTC", host=cap.host)
    assert parsed.counters["quarantined_lines"] == 0
    return parsed.table.to_pylist()


def _busy(rows: list[dict]) -> list[dict]:
    """The samples of the steady matrix-product load: the GPU busy and near its power limit."""
    return [r for r in rows if r["util_pct"] is not None and r["util_pct"] >= 95 and r["power_w"] > 600]


def _idle_at_first(rows: list[dict]) -> list[dict]:
    """The leading samples before any process held GPU memory."""
    out = []
    for r in rows:
        if r["util_pct"] != 0 or r["mem_used_mib"] >= 1:
            break
        out.append(r)
    return out


@pytest.mark.parametrize("cap", CAPTURES)
def test_nvidia_smi_rows_are_the_gpus_one_a_second(cap):
    smi = _smi(cap)
    assert len(smi) == cap.smi_rows
    assert {(r["gpu_uuid"], r["gpu_id"], r["gpu_index"], r["device_name"]) for r in smi} == {
        (cap.uuid, cap.uuid[:12], 0, cap.device_name)}
    assert {(r["mem_total_mib"], r["power_limit_w"]) for r in smi} == {(cap.mem_total_mib, POWER_LIMIT_W)}
    gaps = [(b["sample_utc"] - a["sample_utc"]).total_seconds() for a, b in zip(smi, smi[1:], strict=False)]
    assert all(0.9 < g < 1.1 for g in gaps)
    idle, busy = _idle_at_first(smi), _busy(smi)
    assert len(idle) >= 7 and len(busy) >= 5
    assert all(60 < r["power_w"] < 90 for r in idle)
    # the card may read a watt over its limit for a moment; never more than 1 %
    assert all(r["power_w"] <= 1.01 * POWER_LIMIT_W and r["mem_used_mib"] == cap.busy_mem_used_mib for r in busy)


@pytest.mark.parametrize("cap", CAPTURES)
def test_the_noheader_nounits_form_gives_the_same_readings(cap):
    with_header = parse_nvidia_smi_csv(cap.header_csv, source_tz="UTC", host=cap.host).table
    bare = parse_nvidia_smi_csv(cap.noheader_csv, source_tz="UTC", host=cap.host, fields=DEFAULT_QUERY_FIELDS)
    assert bare.counters["quarantined_lines"] == 0
    # two nvidia-smi processes read the same second a few ms apart; the readings are the same
    cols = [c for c in with_header.column_names if c not in ("sample_utc", "source_file")]
    assert bare.table.select(cols).equals(with_header.select(cols))


@pytest.mark.parametrize("cap", CAPTURES)
def test_nvml_sampler_file_has_the_schema_and_the_same_gpu(cap):
    smi, nvml = _smi(cap), pq.read_table(cap.nvml).to_pylist()
    assert pq.read_schema(cap.nvml).remove_metadata() == GPU_SAMPLES.schema.remove_metadata()
    assert len(nvml) == cap.nvml_rows
    assert {(r["source"], r["host"], r["gpu_uuid"], r["gpu_id"], r["device_name"]) for r in nvml} == {
        ("nvml", cap.host, cap.uuid, cap.uuid[:12], cap.device_name)}
    assert {r["mem_total_mib"] for r in nvml} == {cap.mem_total_mib}
    assert {r["power_limit_w"] for r in nvml} == {POWER_LIMIT_W}
    # NVML's used memory in bytes -> MiB; nvidia-smi prints the same figure rounded
    assert {round(r["mem_used_mib"]) for r in _busy(nvml)} == {cap.busy_mem_used_mib}
    # both idle at first: the same power within a watt
    idle_nvml, idle_smi = _idle_at_first(nvml), _idle_at_first(smi)
    assert len(idle_nvml) >= 5
    mean = lambda rows: sum(r["power_w"] for r in rows) / len(rows)  # noqa: E731
    assert abs(mean(idle_nvml) - mean(idle_smi)) < 1.0
    assert all(r["sm_clock_mhz"] and r["temp_c"] for r in nvml)


@pytest.mark.parametrize("cap", CAPTURES)
def test_energy_counter_agrees_with_the_power_readings(cap):
    """The total-energy counter (mJ) grows by power x time: where the power is steady across an
    interval and no process came or went (the memory in use unchanged), the counter's rise over it
    gives that power within 3 %. The counter integrates what two point readings miss: on the H100
    the second before PyTorch's first allocation drew 77 W by the counter, readings of 70 W on
    either side."""
    nvml = pq.read_table(cap.nvml).to_pylist()
    steady = 0
    for a, b in zip(nvml, nvml[1:], strict=False):
        seconds = (b["sample_utc"] - a["sample_utc"]).total_seconds()
        rise_w = (b["energy_mj"] - a["energy_mj"]) / 1000 / seconds
        assert rise_w > 0
        if abs(a["power_w"] - b["power_w"]) < 0.02 * a["power_w"] and a["mem_used_mib"] == b["mem_used_mib"]:
            steady += 1
            assert rise_w == pytest.approx((a["power_w"] + b["power_w"]) / 2, rel=0.03)
    assert steady >= 10  # idle and loaded intervals both


@pytest.mark.parametrize("cap", CAPTURES)
def test_the_raw_sample_reader_takes_both_sources_from_one_folder(cap, tmp_path):
    root = tmp_path / "telemetry"
    (root / "nvidia-smi" / cap.host).mkdir(parents=True)
    (root / "nvml" / cap.host).mkdir(parents=True)
    shutil.copy(cap.header_csv, root / "nvidia-smi" / cap.host / f"nvidia-smi-{cap.day.isoformat()}.csv")
    shutil.copy(cap.nvml, root / "nvml" / cap.host / cap.nvml.name)
    day_end = cap.start + dt.timedelta(days=1)
    nvml_only, files = read_nvml_dir(root, cap.start, day_end)
    assert nvml_only.num_rows == cap.nvml_rows and files == [str(root / "nvml" / cap.host / cap.nvml.name)]
    rows = raw_samples(root, cap.start, day_end, source_tz="UTC").table.to_pylist()
    assert sorted({(r["source"], r["host"], r["gpu_id"]) for r in rows}) == [
        ("nvidia-smi", cap.host, cap.uuid[:12]), ("nvml", cap.host, cap.uuid[:12])]
    assert len(rows) == cap.smi_rows + cap.nvml_rows
    # the day before holds none of them
    assert raw_samples(root, cap.start - dt.timedelta(days=1), cap.start, source_tz="UTC").table.num_rows == 0


def _fraction_us(row: dict) -> int:
    return row["sample_utc"].microsecond


def test_h100_sampler_skipped_the_interval_it_missed_and_kept_its_schedule():
    """The first sample overran (PyTorch was starting beside it): the next interval was skipped, not
    crammed in late, and every sample stayed on the schedule's fraction of a second."""
    nvml = pq.read_table(H100.nvml).to_pylist()
    gaps = [(b["sample_utc"] - a["sample_utc"]).total_seconds() for a, b in zip(nvml, nvml[1:], strict=False)]
    assert [round(g) for g in gaps] == [2] + [1] * (len(gaps) - 1)
    assert max(_fraction_us(r) for r in nvml) - min(_fraction_us(r) for r in nvml) < 1000  # within 1 ms
    # 24 samples over 25 s: the attempts the summary counted
    assert (nvml[-1]["sample_utc"] - nvml[0]["sample_utc"]).total_seconds() == pytest.approx(24, abs=0.01)


def test_h100_sampler_stopped_by_sigterm_then_restarted_kept_every_row(tmp_path):
    """The 4 samples taken before SIGTERM were written at the signal; the restart on the same day read
    that file and appended its 3 samples after them, on its own schedule."""
    path = H100.folder / "restart" / H100.nvml.name
    assert pq.read_schema(path).remove_metadata() == GPU_SAMPLES.schema.remove_metadata()
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == 7
    first, second = rows[:4], rows[4:]
    times = [r["sample_utc"] for r in rows]
    assert times == sorted(times) and len(set(times)) == 7
    for run in (first, second):
        assert max(_fraction_us(r) for r in run) - min(_fraction_us(r) for r in run) < 1000
        assert [round((b["sample_utc"] - a["sample_utc"]).total_seconds()) for a, b in zip(run, run[1:], strict=False)] == [1] * (len(run) - 1)
    assert abs(_fraction_us(first[0]) - _fraction_us(second[0])) > 1000  # two schedules
    assert all(b["energy_mj"] > a["energy_mj"] for a, b in zip(rows, rows[1:], strict=False))
    # the reader takes the restarted file like any other day's file
    folder = tmp_path / "nvml" / H100.host
    folder.mkdir(parents=True)
    shutil.copy(path, folder / path.name)
    got, _ = read_nvml_dir(tmp_path, H100.start, H100.start + dt.timedelta(days=1))
    assert got.num_rows == 7


@pytest.mark.parametrize("cap", CAPTURES)
def test_the_cards_real_name_finds_its_spec_and_the_spec_matches_the_card(cap):
    """Efficiency's spec lookup knows the name the driver reports, and the spec agrees with the
    card: its TDP is the enforced power limit, its idle power the idle readings within 5 %."""
    from gpu_pipeline.lib.gpu_specs import lookup

    spec = lookup(cap.device_name)
    assert spec.spec_known
    assert spec.tdp_w == POWER_LIMIT_W
    idle = _idle_at_first(pq.read_table(cap.nvml).to_pylist())
    measured = sum(r["power_w"] for r in idle) / len(idle)
    assert spec.idle_power_w == pytest.approx(measured, rel=0.05)
