"""The vectorized fast path of the telemetry parsers gives exactly the line-by-line parsers' result
(table with rows in the same order, counters, quarantine, files), is taken for well-formed files and
gives up on anything else; the directory reader skips margin files without losing a row."""

from __future__ import annotations

import datetime as dt
import random
import re
import shutil
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow.compute as pc
import pytest

from gpu_pipeline.lib import telemetry
from gpu_pipeline.lib.simulate import SimConfig, simulate
from gpu_pipeline.lib.telemetry import (
    DEFAULT_QUERY_FIELDS,
    ParseResult,
    dcgm_sample_times,
    nvidia_smi_sample_dates,
    parse_dcgm_text,
    parse_nvidia_smi_csv,
    read_telemetry_dir,
)
from gpu_pipeline.lib.timeutil import day_window
from gpu_pipeline_tests.lib.test_telemetry import FIXTURES, REAL, data_lines, needs_real, query_gpu_sections

UTC = dt.UTC
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)
SIM_TZ = "America/Chicago"
U0 = "GPU-7c1e2d3f-1a2b-4c3d-8e9f-0a1b2c3d4e5f"
U1 = "GPU-e4d3c2b1-a0f9-4e8d-b7c6-5a4b3c2d1e0f"


def assert_same(fast: ParseResult, slow: ParseResult) -> None:
    assert slow.fast_parsed == 0
    assert fast.table.schema == slow.table.schema
    assert fast.table.equals(slow.table)
    assert fast.table.to_pylist() == slow.table.to_pylist()
    assert dict(fast.counters) == dict(slow.counters)
    assert fast.quarantine == slow.quarantine
    assert fast.files == slow.files


def nvsmi_both(source, tz: str = "UTC", **kwargs) -> ParseResult:
    """The fast result, after checking that it equals the line-by-line parser's."""
    fast = parse_nvidia_smi_csv(source, tz, **kwargs)
    assert_same(fast, parse_nvidia_smi_csv(source, tz, fast=False, **kwargs))
    return fast


def dcgm_both(source, **kwargs) -> ParseResult:
    fast = parse_dcgm_text(source, **kwargs)
    assert_same(fast, parse_dcgm_text(source, fast=False, **kwargs))
    return fast


# ----------------------------------------------------------------------------------------------
# The inputs of test_telemetry.py: fast == slow
# ----------------------------------------------------------------------------------------------

NVSMI_TEXTS = {
    "units_and_header_changes": (
        "timestamp, uuid, memory.used [MiB]\n"
        "2026/01/15 10:00:00.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, 12 GiB\n"
        "2026/01/15 10:00:01.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, 12\n"
        "timestamp, uuid, temperature.gpu, power.limit [W]\n"
        "2026/01/15 10:00:02.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, 40, 300.00 W\n"
        "2026/01/15 10:00:03.000, [N/A], 41, 300.00 W\n"
    ),
    "hostname_field": (
        "timestamp, uuid, hostname\n"
        "2026/01/15 10:00:00.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, node7\n"
    ),
    "spring_forward_gap": (
        "timestamp, uuid\n"
        "2026/03/08 01:59:30.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d\n"
        "2026/03/08 02:30:00.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d\n"
        "2026/03/08 03:00:30.000, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d\n"
    ),
}
CUSTOM_ORDER = "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, 2026/01/15 10:00:00.123, 301.12, 12\n"

DCGM_TEXTS = {
    "default_time": (
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}",hostname="dcgm-exporter-x7k2p"}} 12\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="{U1}",hostname="dcgm-exporter-x7k2p"}} 13 1784049120000\n'
    ),
    "mig_uuid_nan_no_uuid": (
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="{U0}",GPU_I_ID="3",GPU_I_PROFILE="2g.20gb",'
        'mig_uuid="MIG-3b2a1c0d-9e8f-5a6b-8c7d-6e5f4a3b2c1d"} 0.25 1784049120000\n'
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{U0}"}} NaN 1784049120000\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 50 1784049120000\n'
    ),
    "garbage": (
        f'garbage\n# TYPE\n\x00\x00\nDCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}"}} 5 1784049120000\n}}{{\n'
    ),
}


@pytest.mark.parametrize("ambiguous", ["earlier", "order"])
@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("nvidia-smi-*.csv")))
def test_nvidia_smi_fixtures_fast_equals_slow(name, ambiguous):
    for fields in (None, list(DEFAULT_QUERY_FIELDS)):
        nvsmi_both(FIXTURES / name, SIM_TZ, host="h1", fields=fields, ambiguous=ambiguous)
        nvsmi_both(FIXTURES / name, "UTC", source_file="a.csv", ambiguous=ambiguous)


@pytest.mark.parametrize("name", sorted(NVSMI_TEXTS))
def test_nvidia_smi_inline_texts_fast_equals_slow(name):
    for tz in ("UTC", SIM_TZ):
        nvsmi_both(NVSMI_TEXTS[name], tz)
        nvsmi_both(NVSMI_TEXTS[name], tz, host="gpu7.example.edu")


def test_nvidia_smi_custom_field_order_and_wrong_field_list_fast_equals_slow():
    fields = ["uuid", "timestamp", "power.draw.average", "clocks.sm"]
    assert nvsmi_both(CUSTOM_ORDER, fields=fields).fast_parsed
    assert nvsmi_both(CUSTOM_ORDER * 3).fast_parsed == 0  # every line quarantined


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("dcgm-*.prom")))
def test_dcgm_fixtures_fast_equals_slow(name):
    dcgm_both(FIXTURES / name)
    dcgm_both(FIXTURES / name, host="gpu-a100-02", source_file="dcgm/x.prom", default_time_utc=T0)


@pytest.mark.parametrize("name", sorted(DCGM_TEXTS))
def test_dcgm_inline_texts_fast_equals_slow(name):
    dcgm_both(DCGM_TEXTS[name], default_time_utc=T0)
    dcgm_both(DCGM_TEXTS[name], host="n1", default_time_utc=T0)


@needs_real
def test_real_nvidia_smi_captures_fast_equals_slow():
    captures = sorted((REAL / "nvidia-smi").glob("*.txt"))
    assert captures
    for path in captures:
        text = path.read_text()
        if path.name == "exporter_testdata_query.txt":
            nvsmi_both(text, default_time_utc=T0)
            continue
        for title, cmd, body in query_gpu_sections(text):
            nvsmi_both(body, host="capture-host", source_file=f"{path.name}#{title}")  # blank lines: slow
            # Every field of nvidia-smi, header with units: the fast path reads them.
            assert nvsmi_both(body.strip() + "\n", host="capture-host").fast_parsed == 1
            fields = re.search(r"--query-gpu=(\S+)", cmd).group(1).split(",")
            assert nvsmi_both("\n".join(data_lines(body)), fields=fields).fast_parsed == 1


@needs_real
def test_real_dcgm_scrapes_fast_equals_slow():
    scrapes = sorted((REAL / "dcgm-exporter").glob("*.prom"))
    assert scrapes
    for path in scrapes:
        dcgm_both(path, default_time_utc=T0)
        dcgm_both(path, host="n1", default_time_utc=T0)


# ----------------------------------------------------------------------------------------------
# Simulator output: the fast path is taken, and equals the line parsers
# ----------------------------------------------------------------------------------------------

# Three local days around the end of daylight saving time in Chicago (1 November 2026).
SIM_DAYS = [dt.date(2026, 10, 31), dt.date(2026, 11, 1), dt.date(2026, 11, 2)]
FALL_BACK = "2026-11-01"


@pytest.fixture(scope="module")
def sim_telemetry(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    simulate(out, SimConfig(start=SIM_DAYS[0], end=SIM_DAYS[-1], gpus=24, seed=5, timezone=SIM_TZ,
                            telemetry_interval_s=300))
    return out / "telemetry"


def sim_files(root: Path, kind: str) -> list[Path]:
    files = sorted((root / kind).glob("*/*.*"))
    assert files
    return files


def test_sim_nvidia_smi_files_fast_path_taken_except_on_the_fall_back_day(sim_telemetry):
    na_rows = 0
    for path in sim_files(sim_telemetry, "nvidia-smi"):
        result = nvsmi_both(path, SIM_TZ, host=path.parent.name, source_file=path.name)
        assert result.rows > 0 and result.quarantine == []
        # The fall-back day repeats 01:00-02:00 local time: the DST policy is the line parser's.
        assert result.fast_parsed == (0 if FALL_BACK in path.name else 1), path
        na_rows += result.table.column("power_w").null_count
        ordered = nvsmi_both(path, SIM_TZ, host=path.parent.name, ambiguous="order")
        assert ordered.fast_parsed == (0 if FALL_BACK in path.name else 1)
    assert na_rows > 0  # power.draw [N/A] (driver hiccups) read as null on the fast path


def test_sim_dcgm_files_fast_path_taken(sim_telemetry):
    for path in sim_files(sim_telemetry, "dcgm"):
        result = dcgm_both(path, host=path.parent.name, source_file=path.name)
        assert result.fast_parsed == 1 and result.rows > 0, path
        assert result.counters["samples"] > result.rows
        assert result.table.column("energy_mj").null_count == 0


# ----------------------------------------------------------------------------------------------
# Input the fast path gives up on (the line parsers read it; same result)
# ----------------------------------------------------------------------------------------------


def _nvsmi_lines(sim_telemetry: Path) -> list[str]:
    path = next(p for p in sim_files(sim_telemetry, "nvidia-smi") if FALL_BACK not in p.name)
    return path.read_text().splitlines(keepends=True)


def inserted(lines: list[str], i: int, *new: str) -> list[str]:
    return [*lines[:i], *new, *lines[i:]]


def replaced(lines: list[str], i: int, new: str) -> list[str]:
    return [*lines[:i], new, *lines[i + 1:]]


NVSMI_EDITS = {
    "bad line": lambda ls: inserted(ls, 5, "Unable to determine the device handle for GPU0000:0F:00.0\n"),
    "blank line": lambda ls: inserted(ls, 5, "\n"),
    "repeated header": lambda ls: inserted(ls, 5, ls[0]),
    "header change": lambda ls: inserted(ls, 5, "timestamp, uuid\n", ls[5].split(", ")[0] + f", {U0}\n"),
    "unreadable number": lambda ls: replaced(ls, 5, ls[5].replace(" %", " percent", 1)),
    "impossible date": lambda ls: replaced(ls, 5, re.sub(r"^[0-9/]+", "2026/02/30", ls[5])),
    "upper-case uuid": lambda ls: replaced(ls, 5, re.sub(r"GPU-[0-9a-f-]+", lambda m: m[0].upper(), ls[5])),
    "CRLF line ends": lambda ls: [ln.replace("\n", "\r\n") for ln in ls],
    "field count": lambda ls: replaced(ls, 5, ls[5].rstrip("\n") + ", extra\n"),
    "NUL byte": lambda ls: replaced(ls, 5, ls[5].replace(", ", ", \x00", 1)),
}


def test_the_blank_line_cr_and_nul_scan_finds_what_searching_the_bytes_finds():
    rng = random.Random(7)
    alphabet = b"ab,\n\n\r\x00\t\x0b "
    for n in [0, 1, 2, 3, 50] * 40:
        data = bytes(rng.choice(alphabet) for _ in range(n))
        expected = any(sep in data for sep in (b"\n\n", b"\r", b"\x00"))
        assert telemetry._blank_line_cr_or_nul(data) == expected, data


def test_the_dcgm_value_check_accepts_what_the_value_pattern_accepts():
    """Digits alone skip the regular expression; every other token is matched by it: the answer is
    the pattern's on every token, on random tokens of the characters a value may hold and more."""
    import pyarrow as pa

    rng = random.Random(11)
    alphabet = "0123456789.eE+-NaIf x"
    pattern = re.compile(telemetry._PROM_VALUE_PATTERN)
    for _ in range(400):
        tokens = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) if rng.random() < 0.3
                  else str(rng.randint(0, 10**6)) for _ in range(rng.randint(1, 5))]
        expected = all(pattern.fullmatch(t) for t in tokens)
        assert telemetry._prom_values_readable(pa.array(tokens)) == expected, tokens


@pytest.mark.parametrize("edit", sorted(NVSMI_EDITS))
def test_nvidia_smi_fast_path_gives_up_and_the_result_is_unchanged(sim_telemetry, edit):
    text = "".join(NVSMI_EDITS[edit](_nvsmi_lines(sim_telemetry)))
    result = nvsmi_both(text, SIM_TZ, host="h1")
    if edit == "upper-case uuid":  # read per distinct value with the line parser's helpers
        assert result.fast_parsed == 1 and result.quarantine == []
    else:
        assert result.fast_parsed == 0


def test_nvidia_smi_dst_fall_back_fixture_is_left_to_the_line_parser():
    path = FIXTURES / "nvidia-smi-dst-fallback-chicago.csv"
    for ambiguous in ("earlier", "order"):
        result = nvsmi_both(path, SIM_TZ, ambiguous=ambiguous)
        assert result.fast_parsed == 0 and result.counters["ambiguous_local_times"] == 12


def test_nvidia_smi_zone_transitions_past_2037_and_within_a_second():
    """Local times are mapped with zoneinfo (Arrow's conversion misses transitions past 2037)."""
    uuid = "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    stamps = ["2026/03/08 01:59:59.999999", "2026/03/08 03:00:00.000001", "2040/07/01 12:00:00.5",
              "2040/12/01 12:00:00", "2099/06/30 23:59:59.25", "2037/11/01 00:59:59", "1999/12/31 23:59:59"]
    text = "timestamp, uuid\n" + "".join(f"{s}, {uuid}\n" for s in stamps)
    for tz in (SIM_TZ, "Europe/Berlin", "Australia/Sydney", "Asia/Kolkata", "UTC"):
        assert nvsmi_both(text, tz).fast_parsed == 1, tz
    times = nvsmi_both(text, SIM_TZ).table.column("sample_utc").to_pylist()
    in_2040 = [t for t in times if t.year == 2040]
    assert [t.hour for t in in_2040] == [17, 18]  # noon CDT in July 2040, CST in December


def test_nvidia_smi_numbers_read_as_python_reads_them():
    rng = random.Random(3)
    uuid = "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    lines = ["timestamp, uuid, power.draw [W], memory.used [MiB], temperature.gpu\n"]
    for i in range(2000):
        power = f"{rng.randint(0, 10**rng.randint(1, 9))}.{rng.randint(0, 10**rng.randint(1, 12)):d}"
        mem = rng.choice(["[N/A]", "N/A", "[Not Supported]", str(rng.randint(0, 99999)) + " MiB", "0", "-0"])
        lines.append(f"2026/01/15 10:{i // 60 % 60:02d}:{i % 60:02d}.{i:06d}, {uuid}, {power} W, {mem}, "
                     f"{rng.choice(['-1.5', '007', '41', '41 C', '40 degC'])}\n")  # no unit: any unit
    assert nvsmi_both("".join(lines)).fast_parsed == 1
    assert nvsmi_both("".join(lines) + lines[1].replace(" W,", " Watt,")).fast_parsed == 0  # another unit


def _dcgm_lines(sim_telemetry: Path) -> list[str]:
    return sim_files(sim_telemetry, "dcgm")[0].read_text().splitlines(keepends=True)


def _sample(lines: list[str], name: str = "DCGM_FI_DEV_POWER_USAGE") -> int:
    return next(i for i, ln in enumerate(lines) if ln.startswith(name + "{"))


def with_value(line: str, value: str) -> str:
    return re.sub(r" \S+ ([0-9]+)$", rf" {value} \1", line)


DCGM_EDITS = {
    "bad line": lambda ls, i: inserted(ls, i, 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="x" 62 1784049150000\n'),
    "duplicate sample": lambda ls, i: inserted(ls, i, ls[i]),
    "conflicting sample": lambda ls, i: inserted(ls, i + 1, ls[i].replace("}", ',pod="p"}', 1)),
    "no timestamp": lambda ls, i: replaced(ls, i, ls[i].rsplit(" ", 1)[0] + "\n"),
    "blank sentinel": lambda ls, i: replaced(ls, i, with_value(ls[i], "2147483632")),
    "signed value": lambda ls, i: replaced(ls, i, with_value(ls[i], "-0")),
    "bad comment": lambda ls, i: inserted(ls, i, "# TYPE\n"),
    "blank and indented lines": lambda ls, i: replaced(inserted(ls, i, "\n"), i + 1, "  " + ls[i]),
}


@pytest.mark.parametrize("edit", sorted(DCGM_EDITS))
def test_dcgm_fast_path_gives_up_and_the_result_is_unchanged(sim_telemetry, edit):
    lines = _dcgm_lines(sim_telemetry)
    text = "".join(DCGM_EDITS[edit](lines, _sample(lines)))
    result = dcgm_both(text, host="h1", default_time_utc=T0)
    # A blank sentinel is a value like any other to the fast path; everything else makes it give up.
    assert result.fast_parsed == (edit == "blank sentinel")
    if edit == "blank sentinel":
        assert result.counters["blank_values"] == 1


def test_dcgm_fast_path_reads_nan_unmapped_and_uuid_less_samples(sim_telemetry):
    lines = _dcgm_lines(sim_telemetry)
    i = _sample(lines)
    lines = [
        *replaced(lines, i + 1, with_value(lines[i + 1], "NaN")),
        lines[i].replace("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),  # unmapped
        re.sub(r'UUID="[^"]*",', "", lines[i]).replace("POWER_USAGE", "SM_CLOCK"),  # no UUID
    ]
    result = dcgm_both("".join(lines), default_time_utc=T0)
    assert result.fast_parsed == 1
    c = result.counters
    assert (c["nan_values"], c["unmapped_samples"], c["samples_without_uuid"]) == (1, 1, 1)


def test_dcgm_fast_path_drops_the_rows_of_a_gpu_whose_uuid_is_not_one(sim_telemetry):
    # One GPU's UUID label made unreadable in every line: its rows are dropped and counted, the
    # other GPUs' rows kept, as the line parser does, without giving up the fast path.
    lines = _dcgm_lines(sim_telemetry)
    uuid = re.search(r'UUID="([^"]*)"', lines[_sample(lines)]).group(1)
    lines = [ln.replace(f'UUID="{uuid}"', 'UUID="not-a-gpu"') for ln in lines]
    result = dcgm_both("".join(lines), host="h1", default_time_utc=T0)
    assert result.fast_parsed == 1
    assert result.counters["rows_bad_uuid"] > 0
    assert result.table.num_rows > 0
    assert uuid not in set(result.table["gpu_uuid"].to_pylist())


def test_dcgm_rows_of_times_too_far_apart_for_one_packed_key_are_still_the_line_parser_s(monkeypatch):
    # 20 GPUs with samples at the epoch and at the last millisecond of year 9999: the span in
    # microseconds times the GPUs passes 2**62, so the (time, GPU) key cannot be packed into one
    # number and each part is encoded on its own; the rows are the same either way.
    packed = []
    real = telemetry.pc.dictionary_encode
    monkeypatch.setattr(telemetry.pc, "dictionary_encode", lambda a, *k, **kw: packed.append(len(a)) or real(a, *k, **kw))
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"]
    for ms in (253402300799999, 0, 86_400_000):
        for g in range(20):
            uuid = f"GPU-{g:08x}-0000-4000-8000-000000000000"
            lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="{uuid}",modelName="NVIDIA A100"}} {g} {ms}\n')
    result = dcgm_both("".join(lines), host="h1", default_time_utc=T0)
    assert result.fast_parsed == 1 and result.table.num_rows == 60
    assert packed.count(60) >= 2  # the times, then the (time code, GPU) key: two encodings, not one


@pytest.mark.parametrize("piece_bytes", [64, 700, 4096])
def test_dcgm_text_read_in_pieces_gives_the_whole_text_s_result(sim_telemetry, monkeypatch, piece_bytes):
    # A file is read a piece at a time (pieces end at a line end): the result is the one of the whole
    # text, and the line parser's, wherever the pieces end -- series first seen in a later piece, a
    # piece of comments only, a last line without its newline, a bad line in a later piece.
    path = sim_files(sim_telemetry, "dcgm")[0]
    whole = dcgm_both(path, host="h1", source_file="f.prom")
    assert whole.fast_parsed == 1
    lines = path.read_text().splitlines(keepends=True)
    monkeypatch.setattr(telemetry, "_PIECE_BYTES", piece_bytes)
    pieces = parse_dcgm_text(path, host="h1", source_file="f.prom")
    assert pieces.fast_parsed == 1 and pieces.table.to_pylist() == whole.table.to_pylist()
    assert (pieces.counters, pieces.quarantine, pieces.files) == (whole.counters, whole.quarantine, whole.files)
    unterminated = dcgm_both("".join(lines).rstrip("\n"), host="h1", source_file="f.prom")
    assert unterminated.fast_parsed == 1 and unterminated.table.equals(whole.table)
    late_bad = dcgm_both("".join(inserted(lines, len(lines) - 3, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\" 1 2\n")),
                         host="h1", default_time_utc=T0)
    assert late_bad.fast_parsed == 0 and len(late_bad.quarantine) == 1


# ----------------------------------------------------------------------------------------------
# Directory reader: same rows and quarantine for every day; margin files skipped, never a row lost
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window_tz", ["UTC", SIM_TZ])
def test_read_telemetry_dir_fast_equals_slow_for_each_day(sim_telemetry, window_tz):
    skipped = 0
    for day in [SIM_DAYS[0] - dt.timedelta(days=1), *SIM_DAYS, SIM_DAYS[-1] + dt.timedelta(days=1)]:
        start, end = day_window(day, window_tz)
        fast = read_telemetry_dir(sim_telemetry, start, end, SIM_TZ)
        slow = read_telemetry_dir(sim_telemetry, start, end, SIM_TZ, fast=False)
        assert fast.table.equals(slow.table), day
        assert fast.quarantine == slow.quarantine == []
        if fast.rows:
            assert fast.fast_parsed > 0
        assert set(fast.files) <= set(slow.files)
        # A file is either parsed or counted outside the window, by both readers.
        fc, sc = fast.counters, slow.counters
        assert fc["files_read"] + fc["files_outside_window"] == sc["files_read"] + sc["files_outside_window"]
        assert fc["files_read"] == len(fast.files) and fc["rows_out"] == fast.rows
        skipped += sc["files_read"] - fc["files_read"]
    assert skipped > 0  # margin files without a sample in the window were not parsed


def test_the_remembered_utc_offsets_serve_the_day_s_files_and_are_dropped_after_the_read(sim_telemetry, monkeypatch):
    # The nvidia-smi files of a day share their local seconds: the zone is asked about each
    # second once, the later files served from what the first ones found; once the directory is
    # read, the offsets are let go. The rows are the line parser's (above).
    asked = []
    real = telemetry._fast_utc_us

    def counting(naive_us, zone):
        asked.append(len(telemetry._ZONE_OFFSETS))
        return real(naive_us, zone)

    monkeypatch.setattr(telemetry, "_fast_utc_us", counting)
    telemetry._ZONE_OFFSETS.clear()  # what single files parsed earlier in this process left
    start, end = day_window(SIM_DAYS[1], SIM_TZ)
    result = read_telemetry_dir(sim_telemetry, start, end, SIM_TZ)
    assert result.fast_parsed > 1 and len(asked) > 1
    assert asked[0] == 0 and max(asked) > 0  # the second file found the first one's seconds
    assert telemetry._ZONE_OFFSETS == {}


def test_read_telemetry_dir_on_several_threads_equals_one_thread(sim_telemetry, monkeypatch):
    """Files parsed on several threads come back in the one-thread order: the same rows, quarantine,
    counters and file list."""
    from gpu_pipeline.lib import telemetry

    start, end = day_window(SIM_DAYS[1], SIM_TZ)
    results = []
    for threads in (1, 4):
        monkeypatch.setattr(telemetry, "_READ_THREADS", threads)
        results.append(read_telemetry_dir(sim_telemetry, start, end, SIM_TZ, margin_days=1))
    assert results[0].rows > 0 and results[0].counters["files_read"] > 2
    assert results[0] == results[1] and results[0].files == results[1].files


def test_files_finished_together_give_what_each_gives_alone(sim_telemetry, monkeypatch):
    """The directory reader finishes the nvidia-smi files and the DCGM files of the fast path a few
    dozen of one kind at a time: the same rows, counters, file list and fast-path count as one file
    at a time."""
    from gpu_pipeline.lib import telemetry

    together: dict[str, list[int]] = {"nvidia-smi": [], "dcgm": []}
    for kind, cls_ in (("nvidia-smi", telemetry._NvsmiFast), ("dcgm", telemetry._DcgmFast)):
        def spy(cls, staged, sort=True, kind=kind, real=cls_.finish_many.__func__):
            together[kind].append(len(staged))
            return real(cls, staged, sort)

        monkeypatch.setattr(cls_, "finish_many", classmethod(spy))
    for day in SIM_DAYS:
        start, end = day_window(day, SIM_TZ)
        monkeypatch.setattr(telemetry, "_FILES_AT_ONCE", 32)
        monkeypatch.setattr(telemetry, "_BYTES_AT_ONCE", 1 << 40)  # the test's files together, whatever their size
        batched = read_telemetry_dir(sim_telemetry, start, end, SIM_TZ, margin_days=1)
        monkeypatch.setattr(telemetry, "_FILES_AT_ONCE", 1)
        alone = read_telemetry_dir(sim_telemetry, start, end, SIM_TZ, margin_days=1)
        assert batched.table.equals(alone.table) and batched.rows > 0
        assert dict(batched.counters) == dict(alone.counters)
        assert batched.files == alone.files and batched.fast_parsed == alone.fast_parsed
    assert max(together["nvidia-smi"]) > 1 and max(together["dcgm"]) > 1
    # A unit holds at most _BYTES_AT_ONCE of files: larger files are taken one by one.
    monkeypatch.setattr(telemetry, "_FILES_AT_ONCE", 32)
    monkeypatch.setattr(telemetry, "_BYTES_AT_ONCE", 1)
    for kind in together:
        together[kind].clear()
    one_by_one = read_telemetry_dir(sim_telemetry, start, end, SIM_TZ, margin_days=1)
    assert one_by_one.table.equals(batched.table) and dict(one_by_one.counters) == dict(batched.counters)
    assert together["nvidia-smi"] == [] and set(together["dcgm"]) == {1}


def test_dcgm_files_finished_together_keep_each_file_s_rows_apart(sim_telemetry):
    """Two files of one host with the same samples give two rows per (time, GPU), as when each is
    finished alone; a file without a sample of a mapped metric makes the whole group give up (then
    each file is finished on its own)."""
    import pyarrow as pa

    from gpu_pipeline.lib import telemetry

    path = next(p for p in sim_files(sim_telemetry, "dcgm") if SIM_DAYS[1].isoformat() in p.name)
    host = path.parent.name
    a = telemetry._DcgmFast.read(path, host, "a.prom")
    b = telemetry._DcgmFast.read(path, host, "b.prom")
    together = telemetry._DcgmFast.finish_many([a, b], sort=False)
    alone = [s.finish(sort=False) for s in (a, b)]
    assert together.table.equals(pa.concat_tables([r.table for r in alone]))
    assert together.table.num_rows == 2 * alone[0].table.num_rows > 0
    assert dict(together.counters) == {k: alone[0].counters[k] + alone[1].counters[k]
                                       for k in together.counters}
    assert together.files == ["a.prom", "b.prom"] and together.fast_parsed == 2
    unmapped = telemetry._DcgmFast.read('DCGM_FI_DEV_UNKNOWN{gpu="0",UUID="GPU-1"} 1 1700000000000\n', host, "c")
    with pytest.raises(telemetry._NotFast):
        telemetry._DcgmFast.finish_many([a, unmapped])


def test_the_directory_reader_sorts_the_rows_of_all_files_once(sim_telemetry, monkeypatch):
    """The fast path's rows of each file come unsorted to the directory reader, which sorts all rows
    together (a stable sort on the same key: the same table as sorting each file first); finished on
    its own, a file's rows are sorted."""
    from gpu_pipeline.lib import telemetry

    asked: list[tuple[str, bool]] = []
    real_dcgm, real_nvsmi = telemetry._DcgmFast.finish_many.__func__, telemetry._NvsmiFast._finish

    def dcgm(cls, staged, sort=True):
        asked.append(("dcgm", sort))
        return real_dcgm(cls, staged, sort)

    def nvsmi(self, files, sort=True):
        asked.append(("nvidia-smi", sort))
        return real_nvsmi(self, files, sort)

    start, end = day_window(SIM_DAYS[2], SIM_TZ)
    monkeypatch.setattr(telemetry._DcgmFast, "finish_many", classmethod(dcgm))
    monkeypatch.setattr(telemetry._NvsmiFast, "_finish", nvsmi)
    read = read_telemetry_dir(sim_telemetry, start, end, SIM_TZ)
    assert {kind for kind, _ in asked} == {"dcgm", "nvidia-smi"}
    assert not any(sort for _, sort in asked)  # no fast-path result sorted on its own
    monkeypatch.undo()
    keys = ["sample_utc", "host", "gpu_id"]
    assert read.table.equals(read.table.sort_by([(k, "ascending") for k in keys]))
    path = next(p for p in sim_files(sim_telemetry, "dcgm") if SIM_DAYS[2].isoformat() in p.name)
    staged = telemetry._DcgmFast.read(path, path.parent.name, None)
    unsorted, ordered = staged.finish(sort=False).table, staged.finish().table
    assert not unsorted.equals(ordered)  # the sort was left out, and it would have changed the order
    assert unsorted.sort_by([(k, "ascending") for k in keys]).equals(ordered)


def test_nvidia_smi_files_of_different_layouts_are_finished_one_by_one(sim_telemetry, tmp_path, monkeypatch):
    from gpu_pipeline.lib import telemetry

    root = tmp_path / "telemetry"
    shutil.copytree(sim_telemetry, root)
    day = SIM_DAYS[2]
    files = [p for p in sim_files(root, "nvidia-smi") if day.isoformat() in p.name]
    assert len(files) > 2
    # One logger queries one field less: its header and every line lose the last column.
    files[1].write_text("".join(line.rsplit(", ", 1)[0] + "\n" for line in files[1].read_text().splitlines()))
    start, end = day_window(day, SIM_TZ)
    fast = read_telemetry_dir(root, start, end, SIM_TZ)
    assert fast.table.equals(read_telemetry_dir(root, start, end, SIM_TZ, fast=False).table)
    monkeypatch.setattr(telemetry, "_FILES_AT_ONCE", 1)
    alone = read_telemetry_dir(root, start, end, SIM_TZ)
    assert dict(fast.counters) == dict(alone.counters) and fast.files == alone.files
    assert fast.fast_parsed == alone.fast_parsed == len(fast.files)
    assert fast.table.filter(pc.equal(fast.table["source_file"], files[1].relative_to(root).as_posix())).num_rows > 0


SERIES_CASES = [
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",modelName="NVIDIA A100 80GB",Hostname="h-1.example.edu"}',
    'a:b{x=""}', 'a{_x="1"}', 'a{x="é ü",y="-1.5e3"}', 'a{le="+Inf"}',
    'a{__name__="x"}', 'a{x="1",x="2"}', 'a{x="1",}', 'a{x="a\\"b"}', 'a{x="a\\nb"}', 'a{x="}"}',
    'a{x="1,y=2"}', 'a {x="1"}', 'a{x="1"} ', 'a', 'a{}', '1a{x="1"}', 'a{1x="1"}', 'a{x=1}', 'a{x="1"',
]


def test_plain_series_are_read_as_the_exposition_parser_reads_them(sim_telemetry):
    """The regular expression that reads plain DCGM series gives the exposition parser's name,
    labels and signature (or leaves the series to it): every series of the simulator's files, the
    real exporter's (when the fixtures are there) and odd ones."""
    from gpu_pipeline.lib import telemetry

    series = set(SERIES_CASES)
    for path in sim_files(sim_telemetry, "dcgm"):
        series.update(line.rsplit(" ", 2)[0] for line in path.read_text().splitlines() if line and line[0] != "#")
    real = REAL / "dcgm-exporter"
    for path in real.glob("*.prom") if real.is_dir() else []:
        series.update(line.rsplit(" ", 1)[0] for line in path.read_text().splitlines()
                      if line.strip() and not line.startswith("#"))
    plain = 0
    for s in series:
        telemetry._series_entry.cache_clear()
        assert telemetry._series_entry(s) == telemetry._parsed_series_entry(s), s
        plain += telemetry._PLAIN_SERIES.fullmatch(s) is not None
    assert plain > len(series) / 2  # the simulator's series take the plain way


def test_read_telemetry_dir_parses_a_margin_file_holding_an_in_window_sample(sim_telemetry, tmp_path):
    root = tmp_path / "telemetry"
    shutil.copytree(sim_telemetry, root)
    # The UTC day 2 November covers the local dates 1-2 November: the 31 October files are margin
    # files. Loggers that rolled late wrote one sample of the window into them.
    start, end = day_window("2026-11-02", "UTC")
    late = dt.datetime(2026, 11, 2, 18, 0, tzinfo=UTC)  # noon CST
    nvsmi = next(p for p in sim_files(root, "nvidia-smi") if p.name.endswith("2026-10-31.csv"))
    last = nvsmi.read_text().splitlines()[-1]
    nvsmi.write_text(nvsmi.read_text() + re.sub(r"^[0-9/]+ [0-9:]+", "2026/11/02 12:00:00", last) + "\n")
    dcgm = next(p for p in sim_files(root, "dcgm") if p.name.endswith("2026-10-31.prom"))
    last = dcgm.read_text().splitlines()[-1]
    dcgm.write_text(dcgm.read_text() + re.sub(r"[0-9]+$", str(int(late.timestamp() * 1000)), last) + "\n")

    fast = read_telemetry_dir(root, start, end, SIM_TZ)
    assert_same_rows = read_telemetry_dir(root, start, end, SIM_TZ, fast=False)
    assert fast.table.equals(assert_same_rows.table)
    assert {nvsmi.relative_to(root).as_posix(), dcgm.relative_to(root).as_posix()} <= set(fast.files)
    unchanged = read_telemetry_dir(sim_telemetry, start, end, SIM_TZ)
    assert fast.rows == unchanged.rows + 2
    assert unchanged.counters["files_outside_window"] > fast.counters["files_outside_window"]


def test_timestamp_scans_give_the_parsers_sample_times(sim_telemetry):
    """The scans that decide whether a margin file can hold a sample of the window read the same
    times as the line parsers (DCGM: UTC instants; nvidia-smi: local dates, across the DST change)."""
    for path in sim_files(sim_telemetry, "dcgm"):
        times = dcgm_sample_times(path.read_bytes())
        parsed = parse_dcgm_text(path, fast=False).table.column("sample_utc").cast("int64").to_pylist()
        assert times is not None and set(times.tolist()) == set(parsed), path
    zone = ZoneInfo(SIM_TZ)
    for path in sim_files(sim_telemetry, "nvidia-smi"):
        dates = nvidia_smi_sample_dates(path.read_bytes())
        parsed = parse_nvidia_smi_csv(path, SIM_TZ, fast=False).table.column("sample_utc").to_pylist()
        local = {int(t.astimezone(zone).strftime("%Y%m%d")) for t in parsed}
        assert dates is not None and set(dates.tolist()) == local, path


DCGM_LINE = "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"" + U0 + "\",Hostname=\"h\"} 7 1754370031697\n"
NVSMI_TEXT = ("timestamp, index, uuid, utilization.gpu [%]\n"
              f"2025/08/05 00:28:05.657, 0, {U0}, 22 %\n")


@pytest.mark.parametrize("text", [
    DCGM_LINE.replace(" 7 ", " "),  # no timestamp: the 13 digits are the value
    DCGM_LINE.replace("1754370031697", "1754370031"),  # seconds, not milliseconds
    DCGM_LINE.replace("} 7 ", "}  "),  # no value
    DCGM_LINE.replace("\n", "\r\n"),
    DCGM_LINE.replace("\n", " \n"),  # trailing white space
    'DCGM_FI_DEV_GPU_UTIL 7 1754370031697\n',  # no labels
])
def test_dcgm_scan_declines_a_line_it_cannot_read_for_sure(text):
    assert dcgm_sample_times(DCGM_LINE.encode()).tolist() == [1754370031697000]
    assert dcgm_sample_times(("# HELP x y\n" + DCGM_LINE).encode()).tolist() == [1754370031697000]
    assert dcgm_sample_times(b"# HELP x y\n") is None  # no sample
    assert dcgm_sample_times((DCGM_LINE + text).encode()) is None


@pytest.mark.parametrize("text", [
    NVSMI_TEXT.split("\n", 1)[1],  # no header
    NVSMI_TEXT.replace("timestamp, index", "index, timestamp"),
    NVSMI_TEXT + "2025-08-05 00:28:05.657, 0, x, 1 %\n",
    NVSMI_TEXT + "garbage\n",
    NVSMI_TEXT.replace("\n", "\r\n"),
])
def test_nvidia_smi_scan_declines_a_line_it_cannot_read_for_sure(text):
    assert nvidia_smi_sample_dates(NVSMI_TEXT.encode()).tolist() == [20250805]
    assert nvidia_smi_sample_dates((NVSMI_TEXT + NVSMI_TEXT.split("\n", 1)[0] + "\n").encode()).tolist() == [20250805]
    assert nvidia_smi_sample_dates(text.encode()) is None


def test_read_telemetry_dir_does_not_parse_margin_files_without_a_window_sample(sim_telemetry, monkeypatch):
    """Margin files are ruled out by a scan of their timestamps; only the day's own files are parsed."""
    from gpu_pipeline.lib import telemetry

    parsed: list[str] = []
    for cls in (telemetry._DcgmFast, telemetry._NvsmiFast):
        real = cls.read.__func__

        def counting(klass, path, *args, _real=real, **kwargs):
            parsed.append(Path(path).name)
            return _real(klass, path, *args, **kwargs)

        monkeypatch.setattr(cls, "read", classmethod(counting))
    day = SIM_DAYS[2]
    start, end = day_window(day, SIM_TZ)
    result = read_telemetry_dir(sim_telemetry, start, end, SIM_TZ, margin_days=1)
    assert result.rows > 0 and parsed
    assert {re.search(r"\d{4}-\d{2}-\d{2}", name).group() for name in parsed} == {day.isoformat()}
    assert result.counters["files_outside_window"] >= len(parsed)  # the day before's files


def test_read_telemetry_dir_checks_the_dst_policy_argument(sim_telemetry):
    start, end = day_window(SIM_DAYS[0], SIM_TZ)
    with pytest.raises(ValueError, match="ambiguous must be"):
        read_telemetry_dir(sim_telemetry, start, end, SIM_TZ, ambiguous="latest")


def test_file_pieces_cover_the_file_and_end_at_line_ends(tmp_path, monkeypatch):
    # A plain file is read with pread from where the last piece ended (each piece a view of one
    # read); a compressed file and text in memory after the last piece's unfinished line. Either
    # way the pieces are the file's bytes in order, each but the last ends at a newline, and a line
    # longer than a piece comes whole -- also when a read returns fewer bytes than asked for.
    import gzip
    import io

    rng = random.Random(7)
    lines = [b"x" * rng.choice([0, 1, 5, 40, 90, 300]) + b"\n" for _ in range(400)]
    lines.insert(200, b"y" * 1000 + b"\n")  # longer than the pieces below
    text = b"".join(lines) + b"last line without a newline"
    plain, packed = tmp_path / "a.prom", tmp_path / "a.prom.gz"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    monkeypatch.setattr(telemetry, "_PIECE_BYTES", 256)
    real_pread = telemetry.os.pread
    for short in (False, True):
        if short:  # at most 37 bytes a read
            monkeypatch.setattr(telemetry.os, "pread", lambda fd, n, at: real_pread(fd, min(n, 37), at))
        for source in (plain, packed, io.BytesIO(text)):
            if isinstance(source, io.BytesIO):
                source.seek(0)
            pieces = [bytes(piece) for piece in telemetry._file_pieces(source)]
            assert b"".join(pieces) == text, source
            assert all(piece.endswith(b"\n") for piece in pieces[:-1]) and all(pieces), source
            assert any(b"y" * 1000 + b"\n" in piece for piece in pieces), source
        views = list(telemetry._file_pieces(plain))
        assert any(isinstance(piece, memoryview) for piece in views)


def test_a_piece_is_searched_only_within_its_bytes():
    # A view of the start of a read: a CR in the unfinished line after it is the next piece's.
    data = b"a b 1\nc d 2\r\nunfinished\r"
    assert not telemetry._holds(memoryview(data)[:6], b"\r")
    assert telemetry._holds(memoryview(data)[:13], b"\r")
    assert telemetry._holds(data, b"\r") and not telemetry._holds(bytearray(b"a\n"), b"\r")


# ----------------------------------------------------------------------------------------------
# Values the exposition parser reads and no row can hold: the line, never the file
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stamp", ["NaN", "+Inf", "1e400", "99999999999999999", "-99999999999999999"])
def test_a_dcgm_timestamp_no_row_can_hold_quarantines_its_line(stamp):
    """A timestamp the exposition parser accepts but that is no time within int64 microseconds: that
    line is quarantined with its number, the file's other lines are read, on every path."""
    good = f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}",Hostname="n"}} 37 1752480000000\n'
    text = good + f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="{U1}",Hostname="n"}} 5 {stamp}\n' + good.replace("37 ", "38 ").replace("1752480000000", "1752480030000")
    for whole_file in (False, True):
        result = dcgm_both(text, whole_file=whole_file)
        assert result.table.column("util_pct").to_pylist() == [37.0, 38.0]
        assert [(q.line_number, q.reason.split(":")[0]) for q in result.quarantine] == [(2, "timestamp out of range")]


def test_a_dcgm_value_of_more_digits_than_a_float_holds_is_infinite_and_blank():
    """A value of 310 digits: Arrow's cast and the line parser both read it as infinite, which the
    blank rule nulls (it was an OverflowError for the line parser and the whole file failed)."""
    series = f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}",Hostname="n"}}'
    result = dcgm_both(f"{series} 37 1752480000000\n{series} {'9' * 310} 1752480030000\n")
    assert result.fast_parsed == 1
    assert result.table.column("util_pct").to_pylist() == [37.0, None] and result.counters["blank_values"] == 1


@pytest.mark.parametrize("label", ['gpu="99999999999"', 'gpu="\u00b2"', 'gpu="0",GPU_I_ID="99999999999"',
                                   'gpu="0",GPU_I_ID="\u00b2"', 'gpu="-1"'])
def test_a_dcgm_gpu_index_or_instance_that_is_no_int32_count_is_null(label):
    """A GPU index or MIG instance label of digits beyond int32, or of a digit ``int`` does not read
    (``"²"``): null, the row kept (the file failed with an Arrow or int() error)."""
    result = dcgm_both(f'DCGM_FI_DEV_GPU_UTIL{{{label},UUID="{U0}",Hostname="n"}} 37 1752480000000\n')
    (row,) = result.table.to_pylist()
    assert row["util_pct"] == 37.0 and row["mig_instance_id"] is None
    assert row["gpu_index"] == (0 if label.startswith('gpu="0"') else None)


def test_an_nvidia_smi_index_beyond_int32_quarantines_its_line():
    text = ("timestamp, index, uuid, utilization.gpu [%]\n"
            f"2026/01/15 10:00:00.000, 0, {U0}, 5 %\n"
            f"2026/01/15 10:00:00.000, 99999999999, {U1}, 6 %\n")
    result = nvsmi_both(text)
    assert result.table.column("gpu_index").to_pylist() == [0]
    assert [(q.line_number, q.reason) for q in result.quarantine] == [(3, "index: out of range: '99999999999'")]
