"""GPU telemetry parsers: real captures (conformance), our own fixtures (edge cases), DST, the
directory reader and the simulator's output."""

from __future__ import annotations

import datetime as dt
import gzip
import math
import os
import re
import shutil
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest

from gpu_pipeline.lib.schemas import QUARANTINE
from gpu_pipeline.lib.telemetry import (
    _EARLIER_SCRAPE,
    DEFAULT_QUERY_FIELDS,
    GPU_SAMPLES,
    NO_TIME_REASON,
    UNTERMINATED_REASON,
    parse_dcgm_text,
    parse_nvidia_smi_csv,
    read_telemetry_dir,
    short_gpu_id,
)

UTC = dt.UTC
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "telemetry"
REAL = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "real"
needs_real = pytest.mark.skipif(
    not REAL.is_dir(), reason=f"real captures not found at {REAL} (../shared/fixtures/real beside the repo)"
)
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def rows(result) -> list[dict]:
    return result.table.to_pylist()


def by_gpu(result) -> dict[tuple, dict]:
    return {(r["sample_utc"], r["gpu_id"]): r for r in rows(result)}


# ----------------------------------------------------------------------------------------------
# Helpers for the real captures
# ----------------------------------------------------------------------------------------------

_BANNER = re.compile(r"^#{20,}\s*$", re.MULTILINE)


def capture_sections(text: str) -> list[tuple[list[str], str]]:
    """Split an nvidia_gpu_exporter capture into ``(banner comment lines, body)`` sections.

    A capture is ``####`` / ``# title`` / ``# $ command`` / ``####`` / body, repeated."""
    chunks = _BANNER.split(text)
    return [
        ([ln for ln in chunks[i].splitlines() if ln.startswith("#")], chunks[i + 1])
        for i in range(1, len(chunks) - 1, 2)
    ]


def query_gpu_sections(text: str) -> list[tuple[str, str, str]]:
    """``(title, command, csv body)`` of every ``nvidia-smi --query-gpu=... --format=csv`` section."""
    out = []
    for banner, body in capture_sections(text):
        cmd = next((ln[4:] for ln in banner if ln.startswith("# $ ")), "")
        if "--query-gpu=" in cmd and "--format=csv" in cmd:
            out.append((banner[0][2:], cmd, body))
    return out


def data_lines(body: str) -> list[str]:
    return [ln for ln in body.splitlines() if ln.strip()][1:]


def test_capture_section_helper_finds_the_query_gpu_sections():
    text = (
        "#####################\n# header\n#####################\ncollected_at: x\n\n"
        "#####################\n# idle :: query-gpu (csv)\n# $ nvidia-smi --query-gpu=index,uuid --format=csv\n"
        "#####################\nindex, uuid\n0, GPU-00000000-0000-0000-0000-000000000000\n\n"
        "#####################\n# idle :: pmon\n# $ nvidia-smi pmon -c 1\n#####################\n# gpu pid\n"
    )
    sections = query_gpu_sections(text)
    assert [(t, c) for t, c, _ in sections] == [
        ("idle :: query-gpu (csv)", "nvidia-smi --query-gpu=index,uuid --format=csv")
    ]
    assert data_lines(sections[0][2]) == ["0, GPU-00000000-0000-0000-0000-000000000000"]


# ----------------------------------------------------------------------------------------------
# Conformance: real nvidia-smi captures
# ----------------------------------------------------------------------------------------------

# Values read by eye from the captures: (collected_at, idle row, load row) of the query-gpu sections.
# power_w is power.draw (e.g. H100 idle 69.85 W), not power.draw.instant (69.62 W) printed beside it.
REAL_NVSMI = {
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt": (
        "2026-07-14T08:12:38Z",
        dict(device_name="NVIDIA H100 80GB HBM3", util_pct=0.0, mem_util_pct=0.0, mem_total_mib=81559.0,
             mem_used_mib=0.0, power_w=69.85, power_limit_w=700.0, temp_c=41.0, sm_clock_mhz=345.0),
        dict(util_pct=100.0, mem_util_pct=11.0, mem_used_mib=19818.0, power_w=631.95, temp_c=59.0,
             sm_clock_mhz=1980.0),
    ),
    # MIG mode: the parent GPU's utilization.gpu / utilization.memory read [N/A].
    "linux-x86_64__nvidia-h100-mig__590.48.01.txt": (
        "2026-07-14T09:00:26Z",
        dict(util_pct=None, mem_util_pct=None, mem_used_mib=59.0, mem_total_mib=81559.0, power_w=71.15,
             temp_c=42.0),
        dict(util_pct=None, mem_util_pct=None, mem_used_mib=11125.0, power_w=433.78, temp_c=53.0),
    ),
    "linux-x86_64__nvidia-h200__590.48.01.txt": (
        "2026-07-03T22:10:45Z",
        dict(device_name="NVIDIA H200", mem_total_mib=143771.0, power_w=77.71, temp_c=28.0),
        dict(util_pct=100.0, mem_util_pct=7.0, mem_used_mib=32362.0, power_w=627.40, temp_c=52.0),
    ),
    # The L40S reads 100 % utilization while "idle" (as captured).
    "linux-x86_64__nvidia-l40s__595.80.txt": (
        "2026-07-03T08:33:38Z",
        dict(device_name="NVIDIA L40S", util_pct=100.0, mem_util_pct=9.0, mem_total_mib=46068.0,
             power_w=144.97, power_limit_w=350.0, temp_c=63.0, sm_clock_mhz=2520.0),
        dict(util_pct=9.0, mem_util_pct=2.0, mem_used_mib=1235.0, power_w=110.23, temp_c=54.0),
    ),
}


@needs_real
def test_every_real_nvidia_smi_capture_is_covered():
    names = {p.name for p in (REAL / "nvidia-smi").glob("*.txt")}
    assert names == set(REAL_NVSMI) | {"exporter_testdata_query.txt"}


@needs_real
@pytest.mark.parametrize("name", sorted(REAL_NVSMI))
def test_real_nvidia_smi_query_gpu_sections(name):
    text = (REAL / "nvidia-smi" / name).read_text()
    collected, idle, load = REAL_NVSMI[name]
    sections = query_gpu_sections(text)
    assert [t.split(" :: ")[0] for t, _, _ in sections] == ["idle", "load"]
    for (title, _cmd, body), expected in zip(sections, (idle, load), strict=True):
        header = [ln for ln in body.splitlines() if ln.strip()][0]
        assert len(header.split(", ")) > 200, "the exporter queries every field"
        # The capture machines ran on UTC: the local timestamps are the collection time.
        result = parse_nvidia_smi_csv(body, "UTC", host="capture-host", source_file=f"{name}#{title}")
        assert result.table.schema == GPU_SAMPLES.schema
        assert result.rows == len(data_lines(body)) == 1
        assert result.quarantine == []
        row = rows(result)[0]
        assert row["gpu_uuid"] == "GPU-00000000-0000-0000-0000-000000000000"  # masked in the captures
        assert row["gpu_id"] == "GPU-00000000"
        assert row["gpu_index"] == 0
        assert row["source"] == "nvidia-smi" and row["host"] == "capture-host"
        assert row["power_limit_w"] == (350.0 if "l40s" in name else 700.0)
        for col, value in expected.items():
            assert row[col] == value, (title, col)
        if title.startswith("idle"):
            assert abs(row["sample_utc"] - dt.datetime.fromisoformat(collected)) < dt.timedelta(seconds=2)


@needs_real
def test_real_capture_parsed_as_noheader_with_the_command_field_list():
    text = (REAL / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt").read_text()
    _title, cmd, body = query_gpu_sections(text)[1]
    fields = re.search(r"--query-gpu=(\S+)", cmd).group(1).split(",")
    assert len(fields) == 212 and "hostname" in fields
    result = parse_nvidia_smi_csv("\n".join(data_lines(body)), "UTC", fields=fields)
    assert result.rows == 1 and result.quarantine == []
    row = rows(result)[0]
    assert (row["power_w"], row["mem_used_mib"], row["util_pct"]) == (627.40, 32362.0, 100.0)
    assert row["host"] is None  # the hostname field reads [N/A] and no host was given


@needs_real
def test_real_exporter_testdata_query_without_timestamp_field():
    text = (REAL / "nvidia-smi" / "exporter_testdata_query.txt").read_text()
    unknown = parse_nvidia_smi_csv(text, "UTC")  # the lines' time is unknown: set aside, counted
    assert unknown.rows == 0 and {q.reason for q in unknown.quarantine} == {NO_TIME_REASON}
    assert len(unknown.quarantine) == 2 and unknown.counters["layouts_without_time"] == 1
    result = parse_nvidia_smi_csv(text, "UTC", default_time_utc=T0)
    assert result.rows == 2 and result.quarantine == []
    got = {r["gpu_index"]: r for r in rows(result)}
    assert got[0]["gpu_id"] == "GPU-df6e7a7c"
    assert got[0]["gpu_uuid"] == "GPU-df6e7a7c-7314-46f8-abc4-b88b36dcf3aa"
    assert got[0]["device_name"] == "NVIDIA GeForce RTX 2080 SUPER"
    assert got[0]["mem_used_mib"] == 575.0
    assert got[1]["gpu_id"] == "GPU-04757e3e" and got[1]["mem_used_mib"] == 1234.0
    assert {r["sample_utc"] for r in got.values()} == {T0}
    assert got[0]["util_pct"] is None  # not queried


# ----------------------------------------------------------------------------------------------
# Conformance: real dcgm-exporter scrapes
# ----------------------------------------------------------------------------------------------


@needs_real
def test_every_real_dcgm_scrape_is_covered():
    names = {p.name for p in (REAL / "dcgm-exporter").glob("*.prom")}
    assert names == {
        "datadog_integrations-core_dcgm_tests_docker_serve_metrics.prom",
        "h100_8gpu_k8s_gpu-operator_sampled.prom",
        "issue_excerpts_real_scrapes.prom",
    }


@needs_real
@pytest.mark.parametrize("whole_file", [False, True])
def test_real_dcgm_datadog_t4_two_exporter_builds(whole_file):
    path = REAL / "dcgm-exporter" / "datadog_integrations-core_dcgm_tests_docker_serve_metrics.prom"
    with pytest.raises(ValueError, match="no timestamp"):
        parse_dcgm_text(path, whole_file=whole_file)
    result = parse_dcgm_text(path, default_time_utc=T0, whole_file=whole_file)
    assert result.table.schema == GPU_SAMPLES.schema
    # empty HELP lines and the '# NOTE' comment are fine; the file, as saved where it came from,
    # ends without the line feed the exposition format requires after the last line: that line
    # is set aside as one cut while it was written (a value "37" cut to "3" would read as 3)
    assert [(q.line_number, q.reason) for q in result.quarantine] == [(70, UNTERMINATED_REASON)]
    assert result.quarantine[0].raw_line.startswith("DCGM_FI_DEV_")
    got = {r["gpu_id"]: r for r in rows(result)}
    assert set(got) == {"GPU-20c56d28", "GPU-9ef1b6d0"}
    a, b = got["GPU-20c56d28"], got["GPU-9ef1b6d0"]
    assert a["host"] == "424773df46e0" and b["host"] == "551bdf382151"
    assert a["gpu_uuid"] == "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"
    assert (a["device_name"], a["gpu_index"], a["sample_utc"]) == ("Tesla T4", 0, T0)
    assert (a["sm_clock_mhz"], a["temp_c"], a["power_w"]) == (300.0, 25.0, 8.969)
    assert a["energy_mj"] == 128996013.0  # a counter without _total
    assert (a["util_pct"], a["mem_util_pct"], a["mem_used_mib"]) == (0.0, 0.0, 0.0)
    assert a["mem_total_mib"] == 15109.0  # FB_USED 0 + FB_FREE 15109
    assert b["power_limit_w"] == 70.0
    assert b["mem_total_mib"] == 15109.0  # DCGM_FI_DEV_FB_TOTAL
    assert b["util_pct"] is None
    assert result.counters["unmapped_samples"] == 11  # 12 with the last line


@needs_real
def test_real_dcgm_h100_gpu_operator_pod_labels_do_not_split_rows():
    path = REAL / "dcgm-exporter" / "h100_8gpu_k8s_gpu-operator_sampled.prom"
    result = parse_dcgm_text(path, default_time_utc=T0)
    assert result.rows == 8 and result.quarantine == []
    got = {r["gpu_index"]: r for r in rows(result)}
    assert {r["host"] for r in got.values()} == {"gpu-node-1"}
    assert got[0]["gpu_id"] == "GPU-c4529c8d"  # the GPU with container/namespace/pod labels
    assert (got[0]["temp_c"], got[0]["power_w"], got[0]["util_pct"]) == (30.0, 113.611, 0.0)
    assert [got[i]["temp_c"] for i in range(8)] == [30, 29, 26, 29, 28, 26, 28, 26]
    assert got[7]["power_w"] == 66.997
    assert got[6]["mem_util_pct"] is None and got[5]["mem_util_pct"] == 0.0  # excerpt stops at gpu 5
    assert result.counters["conflicting_samples"] == 0
    # host given by the caller wins over the label
    assert {r["host"] for r in rows(parse_dcgm_text(path, host="n1", default_time_utc=T0))} == {"n1"}


@needs_real
def test_real_dcgm_issue_excerpts_mig_and_hostname_labels():
    path = REAL / "dcgm-exporter" / "issue_excerpts_real_scrapes.prom"
    result = parse_dcgm_text(path, default_time_utc=T0)
    assert result.quarantine == []
    got = {r["gpu_id"]: r for r in rows(result)}
    assert result.rows == 14
    # H100 MIG (issue 512): GR_ENGINE_ACTIVE per instance, no GPU_UTIL
    for gi in (7, 8, 9):
        r = got[f"GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77/{gi}"]
        assert (r["mig_profile"], r["mig_instance_id"], r["host"]) == ("1g.10gb", gi, "gsrh100-074")
        assert r["gr_engine_active_pct"] == 0.0
        assert r["util_pct"] is None
        assert r["gpu_uuid"] == "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
    # A30 MIG (issue 317): 4 + 2 instances with FB_USED only
    a30 = [r for r in got.values() if r["device_name"] == "NVIDIA A30" and r["host"].startswith("yg-")]
    assert len(a30) == 6 and {r["mem_used_mib"] for r in a30} == {3.0}
    assert {r["mig_profile"] for r in a30} == {"1g.6gb"}
    # V100 (issue 250): Hostname label; gpu 1 has only an unmapped counter -> no row
    v100 = {r["gpu_index"]: r for r in got.values() if r["host"] == "r6i3n0"}
    assert set(v100) == {0, 2, 3}
    assert (v100[2]["power_limit_w"], v100[3]["power_limit_w"], v100[0]["util_pct"]) == (300.0, 300.0, 0.0)
    # PR 736: lower-case 'hostname' label, pci_bus_id tolerated
    ada = got["GPU-fc60126e"]
    assert ada["host"] == "dcgm-exporter-wwwjh" and ada["device_name"] == "NVIDIA RTX 2000 Ada Generation"
    assert ada["mem_used_mib"] is None and ada["mem_total_mib"] is None  # FB_FREE alone gives no total
    mig = got["GPU-63bc0b91-2265-1b94-831c-15c41fe92675/3"]
    assert mig["host"] == "dcgm-exporter-wwwjh" and mig["mig_instance_id"] == 3


@needs_real
def test_real_dcgm_fast_and_whole_file_paths_agree():
    for path in sorted((REAL / "dcgm-exporter").glob("*.prom")):
        fast = parse_dcgm_text(path, default_time_utc=T0)
        whole = parse_dcgm_text(path, default_time_utc=T0, whole_file=True)
        assert fast.table.equals(whole.table), path.name
        assert fast.counters == whole.counters, path.name


# ----------------------------------------------------------------------------------------------
# Our fixtures: nvidia-smi
# ----------------------------------------------------------------------------------------------


def test_nvidia_smi_with_header_units_repeated_header_and_garbage():
    path = FIXTURES / "nvidia-smi-a100-header.csv"
    result = parse_nvidia_smi_csv(path, "America/Chicago", host="gpu-a100-01.example.edu")
    assert result.table.schema == GPU_SAMPLES.schema
    assert result.rows == 6
    assert [(q.line_number, q.source_file) for q in result.quarantine] == [
        (6, str(path)), (9, str(path)), (11, str(path)), (12, str(path))
    ]
    reasons = {q[0]: q[1] for q in result.quarantine}
    assert reasons[6] == "expected 15 fields, got 1"
    assert reasons[9] == "expected 15 fields, got 5"
    assert reasons[11] == "memory.used: not a number: '4O1OO MiB'"
    assert reasons[12].startswith("timestamp: unreadable '2026/07/14 25:16:01.012'")
    assert result.quarantine[0][2].startswith("Unable to determine the device handle")
    assert result.counters["repeated_headers"] == 1
    assert result.counters["blank_lines"] == 1
    assert result.counters["data_lines"] == 10

    got = by_gpu(result)
    # July in Chicago is CDT (UTC-5)
    r = got[(utc(2026, 7, 14, 13, 12, 38, 696000), "GPU-3f2a9c1e")]
    assert r == {
        "sample_utc": utc(2026, 7, 14, 13, 12, 38, 696000), "source": "nvidia-smi",
        "host": "gpu-a100-01.example.edu", "gpu_uuid": "GPU-3f2a9c1e-5b7d-4e21-9a0c-1d2e3f405162",
        "gpu_id": "GPU-3f2a9c1e", "gpu_index": 0, "mig_profile": None, "mig_instance_id": None,
        "device_name": "NVIDIA A100-SXM4-80GB", "util_pct": 38.0, "mem_util_pct": 12.0, "mem_used_mib": 1234.0,
        "mem_total_mib": 81920.0, "power_w": 212.34, "power_limit_w": 400.0, "temp_c": 51.0,
        "sm_clock_mhz": 1410.0, "energy_mj": None, "gr_engine_active_pct": None, "sm_active_pct": None,
        "tensor_active_pct": None, "source_file": str(path),
    }
    # upper-case UUID: canonical lower case, short id from it; power.draw [N/A] -> power.draw.instant
    r = got[(utc(2026, 7, 14, 13, 12, 38, 701000), "GPU-b81c0d4e")]
    assert r["gpu_uuid"] == "GPU-b81c0d4e-77aa-4c3b-8e9f-0a1b2c3d4e5f"
    assert r["power_w"] == 61.50
    # every power field [Not Supported] -> null, the rest of the row intact
    r = got[(utc(2026, 7, 14, 13, 13, 38, 702000), "GPU-3f2a9c1e")]
    assert (r["power_w"], r["power_limit_w"], r["util_pct"], r["mem_used_mib"]) == (None, None, 100.0, 40000.0)
    # [Unknown Error] -> null
    r = got[(utc(2026, 7, 14, 13, 13, 38, 707000), "GPU-b81c0d4e")]
    assert (r["util_pct"], r["mem_util_pct"], r["power_w"]) == (None, None, 60.25)
    assert (utc(2026, 7, 14, 13, 16, 1, 15000), "GPU-b81c0d4e") in got
    # sorted by (sample_utc, host, gpu_id)
    keys = [(r["sample_utc"], r["gpu_id"]) for r in rows(result)]
    assert keys == sorted(keys)


def test_nvidia_smi_nan_reads_null_and_is_counted(tmp_path):
    """nvidia-smi prints ``nan W`` (``-nan W``) for a power it could not read: the value is null
    (not a NaN in the table) and counted as ``nan_values``, as a DCGM NaN is, once a value; the
    fast path, which does not read it, gives way to the line parser for that file."""
    header = ("timestamp, name, index, uuid, utilization.gpu [%], memory.used [MiB], power.draw [W], "
              "power.draw.instant [W], enforced.power.limit [W]\n")
    lines = ["2026/07/14 08:12:38.696, NVIDIA A100-SXM4-80GB, 0, GPU-3f2a9c1e-5b7d-4e21-9a0c-1d2e3f405162, 38 %, "
             "1234 MiB, nan W, nan W, 400.00 W",
             "2026/07/14 08:12:38.701, NVIDIA A100-SXM4-80GB, 1, GPU-b81c0d4e-77aa-4c3b-8e9f-0a1b2c3d4e5f, 0 %, "
             "4 MiB, NaN W, 61.50 W, 400.00 W",
             "2026/07/14 08:12:38.705, NVIDIA A100-SXM4-80GB, 2, GPU-0a1b2c3d-77aa-4c3b-8e9f-0a1b2c3d4e5f, 5 %, "
             "4 MiB, 70.25 W, 70.00 W, 400.00 W",
             "2026/07/14 08:12:38.709, NVIDIA A100-SXM4-80GB, 3, GPU-1a1b2c3d-77aa-4c3b-8e9f-0a1b2c3d4e5f, 7 %, "
             "4 MiB, -nan W, -nan W, 400.00 W"]
    path = tmp_path / "nvidia-smi.csv"
    path.write_text(header + "\n".join(lines) + "\n")
    result = parse_nvidia_smi_csv(path, "UTC", host="h1")
    assert result.rows == 4 and result.quarantine == []
    power = {r["gpu_index"]: r["power_w"] for r in rows(result)}
    assert power == {0: None, 1: 61.50, 2: 70.25, 3: None}
    # the power of GPUs 0 and 3 (glibc's -nan); GPU 1's power.draw NaN is no null: power.draw.instant gave it
    assert result.counters["nan_values"] == 2
    clean = parse_nvidia_smi_csv(FIXTURES / "nvidia-smi-a100-header.csv", "UTC", host="h1")
    assert "nan_values" not in clean.counters


def test_nvidia_smi_quarantine_table_matches_the_project_schema():
    result = parse_nvidia_smi_csv(FIXTURES / "nvidia-smi-a100-header.csv", "UTC", source_file="a.csv")
    q = result.quarantine_table()
    assert q.schema == QUARANTINE.schema
    assert q.column("source_row").to_pylist() == [6, 9, 11, 12]
    assert set(q.column("source_file").to_pylist()) == {"a.csv"}
    assert set(q.column("source_table").to_pylist()) == {"raw/gpu_telemetry"}  # the table the file was read for


def test_nvidia_smi_noheader_nounits_default_fields():
    path = FIXTURES / "nvidia-smi-l40s-noheader-nounits.csv"
    result = parse_nvidia_smi_csv(path, "America/Chicago", host="gpu-l40s-03")
    assert result.counters["assumed_default_fields"] == 1
    assert result.rows == 4 and result.quarantine == []
    explicit = parse_nvidia_smi_csv(path, "America/Chicago", host="gpu-l40s-03", fields=list(DEFAULT_QUERY_FIELDS))
    assert explicit.table.equals(result.table)
    assert "assumed_default_fields" not in explicit.counters
    got = by_gpu(result)
    # January in Chicago is CST (UTC-6)
    r = got[(utc(2026, 1, 15, 16, 0, 0, 123000), "GPU-0a1b2c3d")]
    assert (r["util_pct"], r["mem_util_pct"], r["mem_total_mib"], r["mem_used_mib"]) == (97.0, 40.0, 46068.0, 30211.0)
    assert (r["power_w"], r["power_limit_w"], r["temp_c"], r["device_name"]) == (301.12, 350.0, 71.0, "NVIDIA L40S")
    assert got[(utc(2026, 1, 15, 16, 0, 30, 129000), "GPU-5e6f7a8b")]["power_w"] is None


def test_nvidia_smi_noheader_with_a_custom_field_order_and_wrong_field_list():
    text = "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, 2026/01/15 10:00:00.123, 301.12, 12\n"
    result = parse_nvidia_smi_csv(text, "UTC", fields=["uuid", "timestamp", "power.draw.average", "clocks.sm"])
    r = rows(result)[0]
    assert (r["gpu_id"], r["sample_utc"], r["power_w"], r["sm_clock_mhz"]) == (
        "GPU-0a1b2c3d", utc(2026, 1, 15, 10, 0, 0, 123000), 301.12, 12.0)
    # the default 12-field query against 4-field lines: every line quarantined, nothing half-parsed
    bad = parse_nvidia_smi_csv(text * 3, "UTC")
    assert bad.rows == 0 and [q.reason for q in bad.quarantine] == ["expected 12 fields, got 4"] * 3


@pytest.mark.parametrize("fast", [True, False])
def test_read_telemetry_dir_reads_noheader_logs_by_the_configured_query(tmp_path, fast):
    """A pool whose loggers run ``--query-gpu=timestamp,uuid,utilization.gpu,power.draw,power.limit
    --format=csv,noheader,nounits``: without the setting every line is quarantined (12 fields
    expected); with it, the rows are read, and a 12-field log in another order is read by its own
    order (utilization.memory before utilization.gpu), not DESIGN's. A file with a header keeps it."""
    uuid = "GPU-0a1b2c3d-1111-2222-3333-444455556666"
    one = tmp_path / "nvidia-smi" / "node1"
    one.mkdir(parents=True)
    (one / "nvidia-smi-2025-08-05.csv").write_text(
        "".join(f"2025/08/05 10:{m:02d}:00.000, {uuid}, 87, 310.25, 400.00\n" for m in range(5)))
    window = (utc(2025, 8, 5), utc(2025, 8, 6), "UTC")
    unset = read_telemetry_dir(tmp_path, *window, fast=fast)
    assert unset.rows == 0 and {q.reason for q in unset.quarantine} == {"expected 12 fields, got 5"}
    fields = ("timestamp", "uuid", "utilization.gpu", "power.draw", "power.limit")
    got = read_telemetry_dir(tmp_path, *window, fast=fast, nvidia_smi_fields=fields)
    assert got.quarantine == [] and got.rows == 5
    assert {(r["gpu_id"], r["util_pct"], r["power_w"], r["power_limit_w"]) for r in rows(got)} == {
        ("GPU-0a1b2c3d", 87.0, 310.25, 400.0)}
    assert "nvidia-smi:assumed_default_fields" not in got.counters
    # another pool: DESIGN's twelve fields, utilization.memory first; a second host logs with a header
    shutil.rmtree(one)
    swapped = ("timestamp", "index", "name", "uuid", "serial", "utilization.memory", "utilization.gpu",
               "memory.total", "memory.used", "power.draw", "power.limit", "temperature.gpu")
    (one / "nvidia-smi-2025-08-05.csv").parent.mkdir(parents=True)
    (one / "nvidia-smi-2025-08-05.csv").write_text(
        f"2025/08/05 10:00:00.000, 0, NVIDIA A100-SXM4-40GB, {uuid}, 1234, 3, 95, 40960, 100, 320.00, 400.00, 40\n")
    two = tmp_path / "nvidia-smi" / "node2"
    two.mkdir()
    (two / "nvidia-smi-2025-08-05.csv").write_text(
        "timestamp, uuid, utilization.gpu [%]\n"
        "2025/08/05 10:00:00.000, GPU-9a1b2c3d-1111-2222-3333-444455556666, 12 %\n")
    got = read_telemetry_dir(tmp_path, *window, fast=fast, nvidia_smi_fields=swapped)
    assert sorted((r["host"], r["util_pct"], r["mem_util_pct"]) for r in rows(got)) == [
        ("node1", 95.0, 3.0), ("node2", 12.0, None)]


def test_the_nvidia_smi_field_setting_is_checked():
    from gpu_pipeline.lib.telemetry import query_fields_setting

    assert query_fields_setting("  ", "V") is None
    assert query_fields_setting(" timestamp, gpu_uuid ,power.draw", "V") == ("timestamp", "gpu_uuid", "power.draw")
    for text, said in (("timestamp,,uuid", "bad field ''"), ("timestamp,uuid,power draw", "bad field 'power draw'"),
                       ("timestamp,uuid,UUID", "field 'uuid' named twice"),
                       ("uuid,power.draw", "must name timestamp and uuid"),
                       ("timestamp,index", "must name timestamp and uuid")):
        with pytest.raises(ValueError, match=re.escape(said)) as err:
            query_fields_setting(text, "GPU_PIPELINE_NVIDIA_SMI_FIELDS")
        assert str(err.value).startswith(f"GPU_PIPELINE_NVIDIA_SMI_FIELDS={text!r}")


def test_nvidia_smi_units_and_header_changes():
    text = (
        "timestamp, uuid, memory.used [MiB]\n"
        "2026/01/15 10:00:00.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, 12 GiB\n"  # wrong unit
        "2026/01/15 10:00:01.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, 12\n"  # nounits value
        "timestamp, uuid, temperature.gpu, power.limit [W]\n"  # logger restarted with another query
        "2026/01/15 10:00:02.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, 40, 300.00 W\n"
        "2026/01/15 10:00:03.000, [N/A], 41, 300.00 W\n"
    )
    result = parse_nvidia_smi_csv(text, "UTC")
    assert [(q.line_number, q.reason) for q in result.quarantine] == [
        (2, "memory.used: unit 'GiB' where the header says [MiB]"),
        (6, "no GPU UUID (uuid field absent or null)"),
    ]
    assert result.counters["header_changes"] == 1
    assert [(r["mem_used_mib"], r["temp_c"], r["power_limit_w"]) for r in rows(result)] == [
        (12.0, None, None), (None, 40.0, 300.0)]


def test_nvidia_smi_hostname_field_used_when_no_host_given():
    text = "timestamp, uuid, hostname\n2026/01/15 10:00:00.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, node7\n"
    assert rows(parse_nvidia_smi_csv(text, "UTC"))[0]["host"] == "node7"
    assert rows(parse_nvidia_smi_csv(text, "UTC", host="gpu7.example.edu"))[0]["host"] == "gpu7.example.edu"


def test_nvidia_smi_dst_fall_back_day_in_chicago():
    path = FIXTURES / "nvidia-smi-dst-fallback-chicago.csv"
    result = parse_nvidia_smi_csv(path, "America/Chicago")
    assert result.rows == 18 and result.quarantine == []
    assert result.counters["ambiguous_local_times"] == 12  # 01:00-01:40 twice, two GPUs
    gpu0 = [r for r in rows(result) if r["gpu_index"] == 0]
    by_util = {int(r["util_pct"]): r["sample_utc"] for r in gpu0}
    # fold=0: both passes through 01:xx are read as CDT (UTC-5): the second pass lands on the first
    assert by_util[10] == utc(2026, 11, 1, 5, 40)  # 00:40 CDT
    assert by_util[11] == by_util[14] == utc(2026, 11, 1, 6, 0)  # 01:00 CDT (both passes)
    assert by_util[17] == utc(2026, 11, 1, 8, 0)  # 02:00 CST
    assert by_util[18] == utc(2026, 11, 1, 8, 20)

    ordered = parse_nvidia_smi_csv(path, "America/Chicago", ambiguous="order")
    gpu0 = [r for r in rows(ordered) if r["gpu_index"] == 0]
    by_util = {int(r["util_pct"]): r["sample_utc"] for r in gpu0}
    assert by_util[11] == utc(2026, 11, 1, 6, 0)  # first 01:00 = CDT
    assert by_util[14] == utc(2026, 11, 1, 7, 0)  # second 01:00 = CST
    assert by_util[16] == utc(2026, 11, 1, 7, 40)
    times = [by_util[u] for u in range(10, 19)]
    assert times == sorted(times) and len(set(times)) == 9  # 20-minute steps, no collisions
    gpu1 = {int(r["util_pct"]): r["sample_utc"] for r in rows(ordered) if r["gpu_index"] == 1}
    assert gpu1[54] == utc(2026, 11, 1, 7, 0, 0, 5000)  # +5 ms jitter of GPU 1 stays in the second pass
    with pytest.raises(ValueError, match="ambiguous must be"):
        parse_nvidia_smi_csv(path, "America/Chicago", ambiguous="latest")


def test_nvidia_smi_spring_forward_gap_uses_fold_0():
    text = (
        "timestamp, uuid\n"
        "2026/03/08 01:59:30.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d\n"
        "2026/03/08 02:30:00.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d\n"  # does not exist in Chicago
        "2026/03/08 03:00:30.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d\n"
    )
    result = parse_nvidia_smi_csv(text, "America/Chicago")
    assert result.counters["nonexistent_local_times"] == 1
    # 02:30 is read with the pre-change offset (CST, UTC-6): 08:30 UTC, i.e. after 03:00:30 CDT
    assert [r["sample_utc"] for r in rows(result)] == [
        utc(2026, 3, 8, 7, 59, 30), utc(2026, 3, 8, 8, 0, 30), utc(2026, 3, 8, 8, 30)]


def test_missing_file_is_an_error_not_one_line_of_text(tmp_path):
    with pytest.raises(FileNotFoundError):
        parse_nvidia_smi_csv(str(tmp_path / "nvidia-smi-2026-07-14.csv"), "UTC")
    with pytest.raises(FileNotFoundError):
        parse_dcgm_text(tmp_path / "dcgm-2026-07-14.prom")


def test_unknown_time_zone_is_a_clear_error():
    with pytest.raises(Exception, match="Nowhere/Atlantis"):
        parse_nvidia_smi_csv(FIXTURES / "nvidia-smi-dst-fallback-chicago.csv", "Nowhere/Atlantis")


# ----------------------------------------------------------------------------------------------
# Our fixtures: DCGM
# ----------------------------------------------------------------------------------------------

U0 = "GPU-7c1e2d3f-1a2b-4c3d-8e9f-0a1b2c3d4e5f"
U1 = "GPU-e4d3c2b1-a0f9-4e8d-b7c6-5a4b3c2d1e0f"
DT1, DT2 = utc(2026, 7, 14, 17, 12), utc(2026, 7, 14, 17, 12, 30)


@pytest.mark.parametrize("whole_file", [False, True])
def test_dcgm_pivot_duplicates_conflicts_blanks_mig_and_an_invalid_line(whole_file):
    path = FIXTURES / "dcgm-a100-mig-dup-invalid.prom"
    result = parse_dcgm_text(path, source_file="dcgm/gpu-a100-02/x.prom", whole_file=whole_file)
    assert result.table.schema == GPU_SAMPLES.schema
    assert [(q.line_number, q.raw_line[:31]) for q in result.quarantine] == [(36, 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UU')]
    assert result.quarantine[0].reason.startswith("invalid exposition line: ValueError")
    assert result.quarantine[0].source_file == "dcgm/gpu-a100-02/x.prom"
    c = result.counters
    assert (c["duplicate_samples"], c["conflicting_samples"], c["blank_values"], c["unmapped_samples"]) == (1, 1, 1, 1)
    assert result.rows == 5
    got = by_gpu(result)
    assert set(got) == {(DT1, "GPU-7c1e2d3f"), (DT2, "GPU-7c1e2d3f"), (DT1, "GPU-e4d3c2b1"),
                        (DT1, f"{U1}/1"), (DT1, f"{U1}/2")}
    r = got[(DT1, "GPU-7c1e2d3f")]
    assert r == {
        "sample_utc": DT1, "source": "dcgm", "host": "gpu-a100-02", "gpu_uuid": U0, "gpu_id": "GPU-7c1e2d3f",
        "gpu_index": 0, "mig_profile": None, "mig_instance_id": None, "device_name": "NVIDIA A100-SXM4-80GB",
        "util_pct": 87.0, "mem_util_pct": 35.0, "mem_used_mib": 40000.0,
        "mem_total_mib": 81920.0,  # 40000 used + 41405 free + 515 reserved
        "power_w": 312.456,  # the pod="trainer-0" series (999 W) conflicts and is not used
        "power_limit_w": 400.0, "temp_c": 61.0, "sm_clock_mhz": 1410.0, "energy_mj": 123456789012.0,
        "gr_engine_active_pct": pytest.approx(87.321), "sm_active_pct": pytest.approx(80.1),
        "tensor_active_pct": None,  # DCGM FP64 blank
        "source_file": "dcgm/gpu-a100-02/x.prom",
    }
    r = got[(DT2, "GPU-7c1e2d3f")]
    assert (r["util_pct"], r["mem_used_mib"], r["mem_total_mib"], r["power_w"]) == (91.0, 40100.0, 81920.0, 298.001)
    assert r["energy_mj"] == 123466163012.0
    assert r["temp_c"] is None  # its line was the invalid one
    parent = got[(DT1, "GPU-e4d3c2b1")]
    assert (parent["power_w"], parent["temp_c"], parent["mig_profile"]) == (151.25, 45.0, None)
    m1, m2 = got[(DT1, f"{U1}/1")], got[(DT1, f"{U1}/2")]
    assert (m1["mig_profile"], m1["mig_instance_id"], m1["gpu_uuid"]) == ("3g.40gb", 1, U1)
    assert (m1["util_pct"], m1["gr_engine_active_pct"], m1["tensor_active_pct"]) == (None, 50.0, 25.0)
    assert (m1["mem_used_mib"], m1["mem_total_mib"]) == (20000.0, 40475.0)
    assert (m2["mig_profile"], m2["gr_engine_active_pct"], m2["mem_total_mib"]) == ("1g.10gb", 0.0, None)


def test_dcgm_fast_and_whole_file_paths_agree_on_our_fixture():
    path = FIXTURES / "dcgm-a100-mig-dup-invalid.prom"
    fast, whole = parse_dcgm_text(path), parse_dcgm_text(path, whole_file=True)
    assert fast.table.equals(whole.table)
    assert fast.counters == whole.counters
    assert fast.quarantine == whole.quarantine


@pytest.mark.parametrize("kw", [{}, {"fast": False}, {"whole_file": True}])
def test_a_no_break_space_is_no_separator_on_any_path(kw):
    """The exposition parser splits a line at spaces and tabs only: a value and timestamp joined by
    a no-break space is a bad line on every path (the line path split it and read the value)."""
    text = (f'DCGM_FI_DEV_GPU_UTIL{{UUID="{U0}"}} 38 1752480758696\n'
            f'DCGM_FI_DEV_GPU_TEMP{{UUID="{U0}"}} 40\u00a01752480758696\n')
    r = parse_dcgm_text(text, **kw)
    assert r.table.column("temp_c").to_pylist() == [None]
    assert r.table.column("util_pct").to_pylist() == [38.0]
    assert [q.line_number for q in r.quarantine] == [2]


@pytest.mark.parametrize("fast", [True, False])
def test_a_byte_order_mark_is_not_part_of_the_header(tmp_path, fast):
    """A log written by a Windows tool may begin with a UTF-8 byte-order mark: the header is read
    (with the mark on its first cell, the header was not recognised and every line quarantined)."""
    csv = ("\ufefftimestamp, index, name, uuid, utilization.gpu [%]\n"
           + f"2026/07/14 08:12:38.696, 0, X, {U0}, 5 %\n" * 3)
    prom = f'\ufeff# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\nDCGM_FI_DEV_GPU_UTIL{{UUID="{U0}"}} 38 1752480758696\n'
    (tmp_path / "log.csv").write_text(csv, encoding="utf-8")
    (tmp_path / "scrape.prom").write_text(prom, encoding="utf-8")
    for source in (csv, tmp_path / "log.csv"):
        r = parse_nvidia_smi_csv(source, "UTC", host="h", fast=fast)
        assert (r.rows, r.quarantine) == (3, [])
    for source in (prom, tmp_path / "scrape.prom"):
        r = parse_dcgm_text(source, fast=fast)
        assert (r.table.column("util_pct").to_pylist(), r.quarantine) == ([38.0], [])


@pytest.mark.parametrize("kw", [{}, {"fast": False}, {"whole_file": True}])
def test_scrapes_appended_to_one_file_without_timestamps_keep_the_last(kw):
    """A real dcgm-exporter scrape has no timestamps; appended to one file, every scrape got the
    file's time and the first one's values were kept at the time of the last. The last scrape is
    the one the file's time belongs to: it is read, and the earlier scrapes' lines are set aside
    with the reason. Duplicates within one scrape are still only counted."""
    def scrape(util: int, temp: int, dup: bool = False) -> str:
        text = ("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
                f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}"}} {util}\n'
                "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
                f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{U0}"}} {temp}\n')
        return text + (f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{U0}"}} {temp}\n' if dup else "")

    r = parse_dcgm_text(scrape(0, 30) + scrape(55, 40) + scrape(97, 50, dup=True), default_time_utc=T0, **kw)
    assert r.table.select(["sample_utc", "util_pct", "temp_c"]).to_pylist() == [
        {"sample_utc": T0, "util_pct": 97.0, "temp_c": 50.0}]
    assert [q.line_number for q in r.quarantine] == [3, 6, 9, 12]
    assert {q.reason for q in r.quarantine} == {_EARLIER_SCRAPE}
    assert (r.counters["earlier_scrape_samples"], r.counters["duplicate_samples"]) == (4, 1)


@pytest.mark.parametrize("kw", [{}, {"fast": False}, {"whole_file": True}])
def test_typed_scrapes_of_one_family_appended_keep_the_last(kw):
    """Two typed scrapes of a single family: the exposition parser merges a family typed again into
    the one before, so in one pass the first value was kept; the line path saw the TYPE line and kept
    the last. Every path now gives the line path's rows."""
    def scrape(util: int) -> str:
        return ("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
                f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}"}} {util}\n')

    r = parse_dcgm_text(scrape(10) + scrape(70), default_time_utc=T0, **kw)
    assert r.table.column("util_pct").to_pylist() == [70.0]
    assert [q.line_number for q in r.quarantine] == [3] and r.counters["earlier_scrape_samples"] == 1
    # the second scrape's series relabelled (a pod's label): in one pass it was a conflict, the first kept
    relabelled = scrape(10) + scrape(70).replace(f'UUID="{U0}"}}', f'UUID="{U0}",pod="p1"}}')
    r = parse_dcgm_text(relabelled, default_time_utc=T0, **kw)
    assert r.table.column("util_pct").to_pylist() == [70.0] and r.counters["earlier_scrape_samples"] == 1


@pytest.mark.parametrize("kw", [{}, {"fast": False}, {"whole_file": True}])
def test_scrapes_appended_without_help_and_type_lines_keep_the_last(kw):
    """The same, for scrapes saved without their HELP and TYPE lines (the real H100 capture has none):
    a new scrape was seen only at a TYPE line, so the oldest scrape was kept at the file's time and
    every newer sample dropped as a duplicate, with nothing set aside."""
    def scrape(util: int, power: float) -> str:
        return (f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}"}} {util}\n'
                f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{U0}"}} {power}\n')

    r = parse_dcgm_text(scrape(0, 60.5) + scrape(97, 650.0), default_time_utc=T0, **kw)
    assert r.table.select(["util_pct", "power_w"]).to_pylist() == [{"util_pct": 97.0, "power_w": 650.0}]
    assert [q.line_number for q in r.quarantine] == [1, 2]
    assert {q.reason for q in r.quarantine} == {_EARLIER_SCRAPE}
    assert (r.counters["earlier_scrape_samples"], r.counters["duplicate_samples"]) == (2, 0)
    # a scrape that starts with the family the one before ended with (one family a scrape: `curl |
    # grep DCGM_FI_DEV_GPU_UTIL >> file`), and two in another order: a series met again starts it
    one_family = "".join(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="{u}"}} {v}\n'
                         for v0 in (10, 70) for g, u, v in ((0, U0, v0), (1, U1, v0 + 10)))
    r = parse_dcgm_text(one_family, default_time_utc=T0, **kw)
    assert sorted(r.table.column("util_pct").to_pylist()) == [70.0, 80.0]
    assert [q.line_number for q in r.quarantine] == [1, 2]
    other_order = (f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{U0}"}} 60.5\n'
                   f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}"}} 0\n'
                   f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}"}} 97\n'
                   f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{U0}"}} 650\n')
    r = parse_dcgm_text(other_order, default_time_utc=T0, **kw)
    assert r.table.select(["util_pct", "power_w"]).to_pylist() == [{"util_pct": 97.0, "power_w": 650.0}]
    # labels that change between the scrapes (a pod's, once the GPU is allocated): the GPU's metric met
    # again after another family starts the next scrape; two pods' series of one GPU in one family
    # stay one scrape (a conflict, the first kept)
    relabelled = (f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}"}} 0\n'
                  f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{U0}"}} 60.5\n'
                  f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}",pod="p1"}} 97\n'
                  f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}",pod="p2"}} 50\n'
                  f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{U0}",pod="p1"}} 650\n')
    r = parse_dcgm_text(relabelled, default_time_utc=T0, **kw)
    assert r.table.select(["util_pct", "power_w"]).to_pylist() == [{"util_pct": 97.0, "power_w": 650.0}]
    assert (r.counters["earlier_scrape_samples"], r.counters["conflicting_samples"]) == (2, 1)
    # one scrape with a line that cannot be read inside a family: one scrape still (it was split)
    r = parse_dcgm_text(f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}"}} 10\nDCGM_FI_DEV_GPU_UTIL{{gpu="0" oops\n'
                        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="{U1}"}} 20\n', default_time_utc=T0, **kw)
    assert sorted(r.table.column("util_pct").to_pylist()) == [10.0, 20.0]
    assert r.counters["earlier_scrape_samples"] == 0 and len(r.quarantine) == 1


def test_dcgm_host_argument_wins_and_default_time_applies_only_without_timestamps():
    text = (
        '# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}",hostname="dcgm-exporter-x7k2p"}} 12\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="{U1}",hostname="dcgm-exporter-x7k2p"}} 13 1784049120000\n'
    )
    with pytest.raises(ValueError, match="pass default_time_utc"):
        parse_dcgm_text(text)
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_dcgm_text(text, default_time_utc=dt.datetime(2026, 7, 14))
    result = parse_dcgm_text(text, default_time_utc=utc(2026, 7, 14, 17, 0))
    assert [(r["sample_utc"], r["gpu_index"], r["host"]) for r in rows(result)] == [
        (utc(2026, 7, 14, 17, 0), 0, "dcgm-exporter-x7k2p"), (DT1, 1, "dcgm-exporter-x7k2p")]
    assert result.counters["samples_default_time"] == 1
    assert {r["host"] for r in rows(parse_dcgm_text(text, host="gpu-a100-02", default_time_utc=T0))} == {
        "gpu-a100-02"}


def test_dcgm_mig_uuid_label_nan_and_series_without_uuid():
    mig = "MIG-3b2a1c0d-9e8f-5a6b-8c7d-6e5f4a3b2c1d"
    text = (
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="{U0}",GPU_I_ID="3",GPU_I_PROFILE="2g.20gb",'
        f'mig_uuid="{mig}"}} 0.25 1784049120000\n'
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{U0}"}} NaN 1784049120000\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 50 1784049120000\n'
    )
    result = parse_dcgm_text(text)
    got = {r["gpu_id"]: r for r in rows(result)}
    assert got[mig]["gpu_uuid"] == mig and got[mig]["gr_engine_active_pct"] == 25.0
    assert got["GPU-7c1e2d3f"]["temp_c"] is None
    assert (result.counters["nan_values"], result.counters["samples_without_uuid"]) == (1, 1)


def test_dcgm_garbage_everywhere_never_crashes():
    text = f'garbage\n# TYPE\n\x00\x00\nDCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}"}} 5 1784049120000\n}}{{\n'
    for whole in (False, True):
        result = parse_dcgm_text(text, whole_file=whole)
        assert result.rows == 1 and rows(result)[0]["util_pct"] == 5.0
        assert [q.line_number for q in result.quarantine] == [1, 2, 3, 5]


# ----------------------------------------------------------------------------------------------
# short ids
# ----------------------------------------------------------------------------------------------


def test_short_gpu_id():
    assert short_gpu_id("GPU-DF6E7A7C-7314-46f8-abc4-b88b36dcf3aa") == "GPU-df6e7a7c"
    assert short_gpu_id("GPU-0667ce7c") == "GPU-0667ce7c"
    assert short_gpu_id("GPUs_GPU_b156e653") == "GPU-b156e653"
    assert short_gpu_id("MIG-3b2a1c0d-9e8f-5a6b-8c7d-6e5f4a3b2c1d") == "MIG-3b2a1c0d-9e8f-5a6b-8c7d-6e5f4a3b2c1d"
    with pytest.raises(ValueError):
        short_gpu_id("GPU-xyz")


def test_schema_is_the_contract():
    assert GPU_SAMPLES.path == "clean/gpu_samples"
    assert GPU_SAMPLES.key == ("sample_utc", "source", "host", "gpu_id")
    assert GPU_SAMPLES.schema.names == [
        "sample_utc", "source", "host", "gpu_uuid", "gpu_id", "gpu_index", "mig_profile", "mig_instance_id",
        "device_name", "util_pct", "mem_util_pct", "mem_used_mib", "mem_total_mib", "power_w", "power_limit_w",
        "temp_c", "sm_clock_mhz", "energy_mj", "gr_engine_active_pct", "sm_active_pct", "tensor_active_pct",
        "source_file",
    ]
    types = {f.name: f.type for f in GPU_SAMPLES.schema}
    assert types["gpu_index"] == types["mig_instance_id"] == pa.int32()
    assert {types[n] for n in GPU_SAMPLES.schema.names[9:21]} == {pa.float64()}
    assert [f.name for f in GPU_SAMPLES.schema if not f.nullable] == ["sample_utc", "source", "gpu_id"]
    assert GPU_SAMPLES.schema.field("sample_utc").type == pa.timestamp("us", tz="UTC")
    assert all(f.metadata[b"description"] for f in GPU_SAMPLES.schema)


# ----------------------------------------------------------------------------------------------
# Directory reader
# ----------------------------------------------------------------------------------------------


def _tree(root: Path) -> Path:
    tel = root / "telemetry"
    a = tel / "nvidia-smi" / "gpu-a100-01.example.edu"
    b = tel / "dcgm" / "gpu-a100-02.example.edu"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    shutil.copy(FIXTURES / "nvidia-smi-a100-header.csv", a / "nvidia-smi-2026-07-14.csv")
    shutil.copy(FIXTURES / "dcgm-a100-mig-dup-invalid.prom", b / "dcgm-2026-07-14.prom")
    # Outside the window (+-1 day): never opened, so its garbage cannot matter
    (a / "nvidia-smi-2026-07-20.csv").write_text("timestamp, uuid\n\x00garbage\n")
    (a / "notes.txt").write_text("not telemetry\n")
    return tel


def test_read_telemetry_dir_window_hosts_and_order(tmp_path):
    tel = _tree(tmp_path)
    start, end = utc(2026, 7, 14, 13, 13), utc(2026, 7, 14, 17, 12, 30)
    result = read_telemetry_dir(tel, start, end, "America/Chicago")
    assert result.table.schema == GPU_SAMPLES.schema
    assert result.files == ["nvidia-smi/gpu-a100-01.example.edu/nvidia-smi-2026-07-14.csv",
                            "dcgm/gpu-a100-02.example.edu/dcgm-2026-07-14.prom"]
    assert result.counters["files_outside_window"] == 1
    assert result.counters["files_not_recognized"] == 1  # notes.txt
    got = [(r["sample_utc"], r["host"], r["gpu_id"]) for r in rows(result)]
    assert got == sorted(got)
    nvsmi = [g for g in got if g[1] == "gpu-a100-01.example.edu"]
    assert [g[0] for g in nvsmi] == [utc(2026, 7, 14, 13, 13, 38, 702000), utc(2026, 7, 14, 13, 13, 38, 707000),
                                     utc(2026, 7, 14, 13, 15, 1, 3000), utc(2026, 7, 14, 13, 16, 1, 15000)]
    dcgm = [g for g in got if g[1] == "gpu-a100-02.example.edu"]  # host = directory, not the label
    assert len(dcgm) == 4 and {g[0] for g in dcgm} == {DT1}  # DT2 == end is excluded
    assert result.counters["rows_outside_window"] == 2 + 1
    assert {q.source_file for q in result.quarantine} == {
        "nvidia-smi/gpu-a100-01.example.edu/nvidia-smi-2026-07-14.csv",
        "dcgm/gpu-a100-02.example.edu/dcgm-2026-07-14.prom"}
    assert len(result.quarantine) == 5
    assert set(result.table.column("source_file").to_pylist()) == set(result.files)


@pytest.mark.parametrize("fast", [True, False])
def test_a_files_quarantined_lines_are_reported_by_one_day_of_those_that_read_it(tmp_path, fast):
    """A local-day nvidia-smi file (America/Chicago) is read by two UTC days, and a file rolled late
    is read as a margin file by the day after its own: each quarantined line is in one day's result
    (it was in both, so a week's sum counted it twice)."""
    uuid = "GPU-0667ce7c-1111-2222-3333-444455556666"
    host = tmp_path / "nvidia-smi" / "n1"
    host.mkdir(parents=True)
    (host / "nvidia-smi-2025-07-14.csv").write_text(
        "timestamp, index, name, uuid, utilization.gpu [%]\n"
        f"2025/07/14 10:00:00.000, 0, X, {uuid}, 5 %\n"  # 15:00 UTC on the 14th
        f"2025/07/14 12:00:00.000, 0, X, {uuid}, garbage\n"
        f"2025/07/14 22:00:00.000, 0, X, {uuid}, 7 %\n")  # 03:00 UTC on the 15th

    def lines(day: int, zone: str) -> list[tuple[int, int]]:
        r = read_telemetry_dir(tmp_path, utc(2025, 7, day), utc(2025, 7, day + 1), zone, fast=fast)
        return [(r.rows, q.line_number) for q in r.quarantine] or [(r.rows, None)]

    assert [lines(d, "America/Chicago") for d in (13, 14, 15)] == [[(0, None)], [(1, 3)], [(1, None)]]
    (host / "nvidia-smi-2025-07-14.csv").write_text(
        "timestamp, index, name, uuid, utilization.gpu [%]\n"
        f"2025/07/14 10:00:00.000, 0, X, {uuid}, 5 %\n"
        f"2025/07/14 12:00:00.000, 0, X, {uuid}, garbage\n"
        f"2025/07/15 00:00:10.000, 0, X, {uuid}, 7 %\n")  # after midnight: the 15th reads the file
    assert [lines(d, "UTC") for d in (14, 15)] == [[(1, 3)], [(1, None)]]


def test_dated_rotations_are_read_as_undated_files(tmp_path):
    """logrotate's ``dateext`` names a rotated file ``nvidia-smi.csv-20250715`` (``.gz``): it was counted
    as not recognized and never read. Its date is the rotation's, not the samples' (a daily rotation
    after midnight holds the day before), so it is read as undated: every window keeps its own rows."""
    uuid = "GPU-0667ce7c-1111-2222-3333-444455556666"
    host = tmp_path / "nvidia-smi" / "n1"
    host.mkdir(parents=True)

    def log(day: int) -> str:
        return ("timestamp, index, name, uuid, utilization.gpu [%]\n"
                + "".join(f"2025/07/{day} {h:02d}:00:00.000, 0, X, {uuid}, {day} %\n" for h in range(24)))

    (host / "nvidia-smi.csv").write_text(log(16))
    (host / "nvidia-smi.csv-20250716.gz").write_bytes(gzip.compress(log(15).encode()))
    (host / "nvidia-smi.csv-2025-07-15").write_text(log(14))
    for day in (14, 15):
        r = read_telemetry_dir(tmp_path, utc(2025, 7, day), utc(2025, 7, day + 1), "UTC")
        assert r.rows == 24 and {row["util_pct"] for row in rows(r)} == {float(day)}
        assert r.counters["files_not_recognized"] == 0 and r.counters.get("files_outside_window", 0) == 0


def test_dated_rotations_far_from_the_window_are_not_read(tmp_path):
    """A month of daily ``dateext`` rotations of two logs: a file rotated on day D holds the samples
    after the previous rotation of its log, through D. A window reads only those whose span meets it
    (its margin and a day's slack: a rotation's day is its host's, dateyesterday shifts it), not all
    sixty, and each log by its own rotations (a first version took the other log's file of the same
    day for the previous rotation, and lost a day of samples)."""
    uuids = {"a": "GPU-0667ce7c-1111-2222-3333-444455556666", "b": "GPU-0777ce7c-1111-2222-3333-444455556666"}
    host = tmp_path / "nvidia-smi" / "n1"
    host.mkdir(parents=True)
    for log, uuid in uuids.items():
        for day in range(1, 31):  # rotated just after midnight of the 2nd ... 31st: each holds the day before
            text = ("timestamp, index, name, uuid, utilization.gpu [%]\n"
                    + "".join(f"2025/07/{day:02d} {h:02d}:00:00.000, 0, X, {uuid}, {day} %\n" for h in range(24)))
            (host / f"{log}.csv-202507{day + 1:02d}").write_text(text)
    for margin, read in ((0, 8), (1, 12)):
        r = read_telemetry_dir(tmp_path, utc(2025, 7, 14), utc(2025, 7, 15), "UTC", margin_days=margin)
        assert r.rows == 48 and {row["util_pct"] for row in rows(r)} == {14.0}
        assert {row["gpu_id"] for row in rows(r)} == {"GPU-0667ce7c", "GPU-0777ce7c"}
        # margin 0: the rotations of the 13th to the 16th of each log, which hold the 12th to the 15th
        assert r.counters["files_read"] == read and r.counters["files_outside_window"] == 60 - read


def test_logs_whose_names_differ_in_case_are_rotated_apart(tmp_path):
    """``NV.csv`` rotated weekly and ``nv.csv`` daily are two logs: one sequence gave the weekly file
    of the 17th the span of the 16th to the 17th, and the 13th lost its sample."""
    host = tmp_path / "nvidia-smi" / "n1"
    host.mkdir(parents=True)
    head = "timestamp, index, name, uuid, utilization.gpu [%]\n"
    weekly, daily = "GPU-0667ce7c-1111-2222-3333-444455556666", "GPU-0777ce7c-1111-2222-3333-444455556666"
    (host / "NV.csv-20250717").write_text(
        head + "".join(f"2025/07/{d} 12:00:00.000, 0, X, {weekly}, {d} %\n" for d in range(10, 17)))
    for d in range(11, 17):
        (host / f"nv.csv-202507{d:02d}").write_text(head + f"2025/07/{d - 1} 12:00:00.000, 1, X, {daily}, {d - 1} %\n")
    r = read_telemetry_dir(tmp_path, utc(2025, 7, 13), utc(2025, 7, 14), "UTC")
    assert sorted((row["gpu_id"], row["util_pct"]) for row in rows(r)) == [("GPU-0667ce7c", 13.0),
                                                                          ("GPU-0777ce7c", 13.0)]


def test_an_undated_files_lines_set_aside_are_in_each_reading_days_quarantine(tmp_path):
    """The file a logger writes has no date: every day reads it, and its line set aside is in each of
    their quarantines (a window would otherwise lose it, or count it on a day that never reads it)."""
    uuid = "GPU-0667ce7c-1111-2222-3333-444455556666"
    host = tmp_path / "nvidia-smi" / "n1"
    host.mkdir(parents=True)
    (host / "nvidia-smi.csv").write_text(
        "timestamp, index, name, uuid, utilization.gpu [%]\n" + "garbage\n"
        + "".join(f"2025/07/{d} 12:00:00.000, 0, X, {uuid}, {d} %\n" for d in range(13, 17)))
    for day in range(13, 17):
        r = read_telemetry_dir(tmp_path, utc(2025, 7, day), utc(2025, 7, day + 1), "UTC")
        assert r.rows == 1 and [(q.source_file, q.line_number) for q in r.quarantine] == [
            ("nvidia-smi/n1/nvidia-smi.csv", 2)]


def test_numbered_rotations_are_read_and_unknown_files_counted(tmp_path):
    """logrotate without dates names its files ``.1``, ``.2.gz``: they are read (their names carry
    no date, so every window reads them and keeps its own rows); a file the reader cannot take
    (``.xz``) is counted, not skipped unseen."""
    uuid = "GPU-0667ce7c-1111-2222-3333-444455556666"
    host = tmp_path / "nvidia-smi" / "n1"
    host.mkdir(parents=True)

    def log(minute: int) -> str:
        return (f"timestamp, index, name, uuid, utilization.gpu [%]\n"
                f"2025/07/14 10:{minute:02d}:00.000, 0, X, {uuid}, {minute} %\n")

    (host / "nvidia-smi.csv").write_text(log(3))
    (host / "nvidia-smi.csv.1").write_text(log(2))
    (host / "nvidia-smi.csv.2.gz").write_bytes(gzip.compress(log(1).encode()))
    (host / "NVIDIA-SMI-OLD.CSV").write_text(log(0))
    (host / "nvidia-smi.csv.3.xz").write_bytes(b"\xfd7zXZ\x00")
    r = read_telemetry_dir(tmp_path, utc(2025, 7, 14), utc(2025, 7, 15), "UTC")
    assert [row["util_pct"] for row in rows(r)] == [0.0, 1.0, 2.0, 3.0]
    assert sorted(r.files) == ["nvidia-smi/n1/NVIDIA-SMI-OLD.CSV", "nvidia-smi/n1/nvidia-smi.csv",
                               "nvidia-smi/n1/nvidia-smi.csv.1", "nvidia-smi/n1/nvidia-smi.csv.2.gz"]
    assert r.counters["files_not_recognized"] == 1
    # what is no regular file in the folder is counted too (it was skipped unseen): a dangling
    # link, a link loop, a pipe, a folder
    (host / "nvidia-smi-gone.csv").symlink_to(tmp_path / "nowhere.csv")
    (host / "loop.csv").symlink_to(host / "loop.csv")
    os.mkfifo(host / "nvidia-smi-fifo.csv")
    (host / "old.csv").mkdir()
    r = read_telemetry_dir(tmp_path, utc(2025, 7, 14), utc(2025, 7, 15), "UTC")
    assert [row["util_pct"] for row in rows(r)] == [0.0, 1.0, 2.0, 3.0]
    assert r.counters["files_not_recognized"] == 5


def test_read_telemetry_dir_empty_and_bad_window(tmp_path):
    empty = read_telemetry_dir(tmp_path / "nothing", utc(2026, 7, 14), utc(2026, 7, 15), "UTC")
    assert empty.rows == 0 and empty.table.schema == GPU_SAMPLES.schema
    with pytest.raises(ValueError, match="empty window"):
        read_telemetry_dir(tmp_path, utc(2026, 7, 15), utc(2026, 7, 14), "UTC")
    with pytest.raises(ValueError, match="timezone-aware"):
        read_telemetry_dir(tmp_path, dt.datetime(2026, 7, 14), utc(2026, 7, 15), "UTC")


def test_read_telemetry_dir_on_the_simulator_output(tmp_path):
    simulate_mod = pytest.importorskip("gpu_pipeline.lib.simulate")
    from gpu_pipeline.lib.timeutil import day_window

    day = dt.date(2026, 3, 8)  # spring-forward day in Chicago: 23 hours
    cfg = simulate_mod.SimConfig(start=day, end=day, gpus=16, seed=7, timezone="America/Chicago",
                                 telemetry_interval_s=120)
    summary = simulate_mod.simulate(tmp_path, cfg)
    start, end = day_window(day, "America/Chicago")
    result = read_telemetry_dir(tmp_path / "telemetry", start, end, "America/Chicago")
    assert result.quarantine == []
    assert result.rows == summary["telemetry_samples"] > 0
    assert set(result.table.column("source").to_pylist()) == {"nvidia-smi", "dcgm"}
    t = result.table.to_pylist()
    assert all(start <= r["sample_utc"] < end for r in t)
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}", r["gpu_id"]) for r in t)
    assert all(r["gpu_uuid"].startswith(r["gpu_id"]) for r in t)
    assert all(0 <= r["util_pct"] <= 100 for r in t)
    assert all(r["mem_total_mib"] > 0 for r in t)
    dcgm = [r for r in t if r["source"] == "dcgm"]
    assert dcgm and all(r["energy_mj"] > 0 and not math.isnan(r["energy_mj"]) for r in dcgm)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or not Path("/proc/self/fd").is_dir(),
                    reason="needs posix_fadvise and /proc/self/fd (Linux)")
def test_every_telemetry_file_read_is_dropped_from_the_page_cache_after_it(tmp_path, monkeypatch):
    """A file is read once a run: after its parse the kernel is told its pages will not be read
    again (POSIX_FADV_DONTNEED on its whole length), for the DCGM texts read in pieces and the
    nvidia-smi logs read whole alike."""
    from gpu_pipeline.lib import telemetry as telemetry_module
    from gpu_pipeline.lib.samples import RawStream
    from gpu_pipeline.lib.simulate import SimConfig, simulate
    from gpu_pipeline.lib.timeutil import day_window

    day = dt.date(2025, 8, 5)
    simulate(tmp_path, SimConfig(start=day, end=day, gpus=6, seed=2, timezone="America/Chicago",
                                 telemetry_interval_s=600))
    advised: list[tuple[str, int, int, int]] = []

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length, advice))

    monkeypatch.setattr(telemetry_module.os, "posix_fadvise", record)
    start, end = day_window(day, "America/Chicago")
    stream = RawStream(tmp_path / "telemetry", start, end, "America/Chicago")
    assert sum(part.num_rows for part in stream.parts()) > 0
    kinds = {Path(f).parts[-3] for f in stream.files}
    assert kinds == {"dcgm", "nvidia-smi"}
    assert sorted(a[0] for a in advised) == sorted(str((tmp_path / "telemetry" / f).resolve()) for f in stream.files)
    assert {a[1:] for a in advised} == {(0, 0, os.POSIX_FADV_DONTNEED)}


def test_the_raw_step_reads_the_repeated_hour_of_a_fall_back_day_in_log_order(tmp_path):
    """The pipeline's raw stream resolves the repeated 01:xx of a fall-back day by the log's
    order: the second pass is the second hour (CST). With the library's "earlier" both passes
    landed in 06:00-07:00 UTC, 07:00-08:00 UTC had no sample, and samples of the two passes
    with the same key were dropped as duplicates."""

    from gpu_pipeline.lib.samples import RawStream

    host = tmp_path / "telemetry" / "nvidia-smi" / "gpu1"
    host.mkdir(parents=True)
    shutil.copyfile(FIXTURES / "nvidia-smi-dst-fallback-chicago.csv", host / "nvidia-smi-2026-11-01.csv")
    zone = ZoneInfo("America/Chicago")
    start = dt.datetime(2026, 11, 1, tzinfo=zone).astimezone(dt.UTC)
    end = dt.datetime(2026, 11, 2, tzinfo=zone).astimezone(dt.UTC)
    stream = RawStream(tmp_path / "telemetry", start, end, "America/Chicago")
    table = pa.concat_tables(list(stream.parts()))
    gpu0 = sorted((r["sample_utc"], int(r["util_pct"])) for r in table.to_pylist() if r["gpu_index"] == 0)
    assert [u for _, u in gpu0] == list(range(10, 19))  # the log's order is the time order
    assert dict((u, t) for t, u in gpu0)[14] == utc(2026, 11, 1, 7, 0)  # second 01:00 = CST
    assert len({t for t, _ in gpu0}) == 9


@pytest.mark.parametrize("fast", [True, False])
def test_a_log_cut_mid_line_sets_its_last_line_aside(tmp_path, fast):
    """A logger killed while it wrote a line leaves it cut: nvidia-smi's temperature 65 cut after
    its 6, a DCGM power 312.5 cut to 312. Both read as valid samples (and a DCGM line cut in its
    timestamp took the file's time, hours after the exporter stopped). The last line of a file that
    ends without a line end is now set aside, on every path; the same text given in memory is whole."""
    uuid = "GPU-0667ce7c-1111-2222-3333-444455556666"
    smi = tmp_path / "nvidia-smi.csv"
    smi.write_text("timestamp, uuid, temperature.gpu\n"
                   f"2025/07/14 10:00:00.000, {uuid}, 65\n2025/07/14 10:00:30.000, {uuid}, 6")
    r = parse_nvidia_smi_csv(smi, "UTC", fast=fast)
    assert [row["temp_c"] for row in rows(r)] == [65.0]
    assert [(q.line_number, q.reason, q.raw_line) for q in r.quarantine] == [
        (3, UNTERMINATED_REASON, f"2025/07/14 10:00:30.000, {uuid}, 6")]
    assert [row["temp_c"] for row in rows(parse_nvidia_smi_csv(smi.read_text(), "UTC", fast=fast))] == [65.0, 6.0]

    labels = f'gpu="0",UUID="{uuid}",Hostname="n1"'
    dcgm = tmp_path / "dcgm.prom"
    for cut in (f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 312", f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 312.5 17525"):
        dcgm.write_text(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 300.5 1752487200000\n" + cut)
        for whole_file in (False, True):
            r = parse_dcgm_text(dcgm, default_time_utc=utc(2025, 7, 14, 13), fast=fast, whole_file=whole_file)
            assert [(row["sample_utc"], row["power_w"]) for row in rows(r)] == [(utc(2025, 7, 14, 10), 300.5)]
            assert [(q.line_number, q.reason) for q in r.quarantine] == [(2, UNTERMINATED_REASON)]


@pytest.mark.parametrize("fast", [True, False])
def test_an_nvidia_smi_query_without_timestamp_sets_its_lines_aside_and_the_day_is_read(tmp_path, fast):
    """An inventory query's output (no timestamp field) beside a day's log, and a log whose layout
    changes mid-file to a query without it: their lines' time is unknown, so they are set aside and
    counted. The file failed the whole day before, its good files with it."""
    uuid = "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
    host = tmp_path / "nvidia-smi" / "n1"
    host.mkdir(parents=True)
    (host / "nvidia-smi-2025-08-05.csv").write_text(
        "timestamp, index, name, uuid, utilization.gpu [%]\n"
        + "".join(f"2025/08/05 {h:02d}:00:00.000, 0, NVIDIA H100, {uuid}, 50 %\n" for h in range(24))
        + "name, uuid, utilization.gpu [%]\n" + f"NVIDIA H100, {uuid}, 7 %\n")
    (host / "inventory-2025-08-05.csv").write_text(f"name, uuid, memory.total [MiB]\nNVIDIA H100, {uuid}, 81559 MiB\n")
    got = read_telemetry_dir(tmp_path, utc(2025, 8, 5), utc(2025, 8, 6), "UTC", fast=fast)
    assert got.rows == 24 and {r["util_pct"] for r in rows(got)} == {50.0}
    assert [q.reason for q in got.quarantine] == ["no timestamp field in the query: the line's time is unknown"] * 2
    assert got.counters["nvidia-smi:layouts_without_time"] == 2
