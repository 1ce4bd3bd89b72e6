"""The NVML sampler through the real pynvml against a stand-in libnvidia-ml.so.1 (gpu_pipeline_tests/fake_nvml).

pynvml loads ``libnvidia-ml.so.1`` once per process (the loader reads ``LD_LIBRARY_PATH`` at process
start), so every NVML run happens in a fresh subprocess with ``LD_LIBRARY_PATH`` pointing at the
compiled stand-in (or at an empty folder for the driverless case). Expected values are recomputed
from the formulas documented at the top of fake_nvml.c.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pynvml
import pytest

from gpu_pipeline.lib import nvml_sampler as ns
from gpu_pipeline.lib.schemas import GPU_SAMPLES
from gpu_pipeline_tests import fake_nvml

REPO = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024

_PYCACHE: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _child_bytecode_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Children keep their compiled bytecode in a temp folder (PYTHONPYCACHEPREFIX) so that only the
    first one compiles pyarrow / pandas / pynvml (this machine sets PYTHONDONTWRITEBYTECODE)."""
    _PYCACHE[:] = [tmp_path_factory.mktemp("pycache")]


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if fake_nvml.compiler() is None:
        pytest.skip("gcc is not installed: the stand-in libnvidia-ml.so.1 cannot be built")
    d = tmp_path_factory.mktemp("fake_nvml")
    fake_nvml.build(d)
    return d


def child(code: str, lib_dir: Path, *args: str, timeout: float = 30, **fake_env: object
          ) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python whose libnvidia-ml.so.1 comes from ``lib_dir`` only."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=_env(lib_dir, fake_env),
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)


def _env(lib_dir: Path, fake_env: dict) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_")}
    if _PYCACHE:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(_PYCACHE[0])
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update({f"FAKE_NVML_{k.upper()}": str(v) for k, v in fake_env.items()})
    return env


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def last_json(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(ok(proc).stdout.strip().splitlines()[-1])


# -- expected values of the stand-in (fake_nvml.c) ------------------------------------------------

NAME = "NVIDIA Fake A100-SXM4-80GB"


def gpu_uuid(i: int) -> str:
    return f"GPU-{0x5CA1AB00 + i:08x}-1111-2222-3333-{i:012x}"


def mig_uuid(i: int, slot: int) -> str:
    k = 16 * i + slot
    return f"MIG-{0x0E1E0000 + k:08x}-aaaa-bbbb-cccc-{k:012x}"


def gpu_row(i: int, host: str, k: int = 0, mig: bool = False) -> dict:
    """GPU i at its k-th read of the power / energy counters."""
    return {
        "source": "nvml", "host": host, "gpu_uuid": gpu_uuid(i), "gpu_id": f"GPU-{0x5CA1AB00 + i:08x}",
        "gpu_index": i, "mig_profile": None, "mig_instance_id": None, "device_name": NAME,
        "util_pct": None if mig else 40.0 + i, "mem_util_pct": None if mig else 20.0 + i,
        "mem_used_mib": 1024.0 * (i + 1) + 0.5, "mem_total_mib": 81920.0,
        "power_w": 100.0 + i + 0.5 * k, "power_limit_w": 400.0 + i, "temp_c": 30.0 + i,
        "sm_clock_mhz": 1410.0 + i, "energy_mj": 1_000_000.0 * (i + 1) + 12345.0 * k,
        "gr_engine_active_pct": None, "sm_active_pct": None, "tensor_active_pct": None, "source_file": None,
    }


def mig_row(i: int, slot: int, host: str) -> dict:
    profile, gi, total = {0: ("3g.40gb", 2, 40192.0), 2: ("1g.10gb", 9, 9728.0)}[slot]
    return {
        "source": "nvml", "host": host, "gpu_uuid": mig_uuid(i, slot), "gpu_id": mig_uuid(i, slot),
        "gpu_index": i, "mig_profile": profile, "mig_instance_id": gi, "device_name": NAME,
        "util_pct": None, "mem_util_pct": None, "mem_used_mib": 100.0 * (slot + 1), "mem_total_mib": total,
        "power_w": None, "power_limit_w": None, "temp_c": None, "sm_clock_mhz": None, "energy_mj": None,
        "gr_engine_active_pct": None, "sm_active_pct": None, "tensor_active_pct": None, "source_file": None,
    }


def without_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "sample_utc"} for r in rows]


SAMPLE_ONCE = """
    import json, sys, pyarrow.parquet as pq, pynvml
    from gpu_pipeline.lib.nvml_sampler import sample_once
    called = []
    real = pynvml._nvmlGetFunctionPointer
    def recording(name):
        called.append(name)
        return real(name)
    pynvml._nvmlGetFunctionPointer = recording
    table = sample_once(host=sys.argv[2])
    pq.write_table(table, sys.argv[1])
    print(json.dumps(sorted(set(called))))
"""

# Every entry point the sampler reaches on a healthy driver with a MIG GPU.
NVML_SYMBOLS = sorted([
    "nvmlInitWithFlags", "nvmlShutdown", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetClockInfo", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
])


# -- one sample -----------------------------------------------------------------------------------


def test_sample_once_values_and_mig_rows(fake_lib: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    before = dt.datetime.now(dt.UTC)
    proc = ok(child(SAMPLE_ONCE, fake_lib, str(out), "node7", gpus=3, mig=1))
    after = dt.datetime.now(dt.UTC)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == NVML_SYMBOLS
    table = pq.read_table(out)
    assert table.schema.equals(GPU_SAMPLES.schema)
    rows = table.to_pylist()
    # GPU 1 is in MIG mode: its own row (utilization not supported) plus its MIG devices in slots 0
    # and 2 (slot 1 is empty); one timestamp, UTC, for the whole sample.
    assert without_time(rows) == [
        gpu_row(0, "node7"),
        {**gpu_row(1, "node7"), "util_pct": None, "mem_util_pct": None},
        mig_row(1, 0, "node7"),
        mig_row(1, 2, "node7"),
        gpu_row(2, "node7"),
    ]
    stamps = {r["sample_utc"] for r in rows}
    assert len(stamps) == 1
    (stamp,) = stamps
    assert stamp.utcoffset() == dt.timedelta(0)
    assert before - dt.timedelta(seconds=1) <= stamp <= after


def test_unsupported_fields_are_null_and_old_drivers_fall_back(fake_lib: Path) -> None:
    code = """
        import datetime as dt, json
        from gpu_pipeline.lib.nvml_sampler import NvmlSession
        with NvmlSession() as s:
            rows = s.sample("h", dt.datetime(2026, 7, 14, 8, 0, tzinfo=dt.UTC)).to_pylist()
            rows += s.sample("h", dt.datetime(2026, 7, 14, 8, 1, tzinfo=dt.UTC)).to_pylist()
        print(json.dumps({"rows": rows, "field_errors": s.field_errors}, default=str))
    """
    got = last_json(child(code, fake_lib, gpus=2, not_supported="energy,power_limit,util",
                          missing="memory_v2,temperature_v"))
    rows = got["rows"]
    assert len(rows) == 4
    for n, r in enumerate(rows):
        i, k = n % 2, n // 2
        assert r["sample_utc"] == f"2026-07-14 08:0{k}:00+00:00"
        # Only the refused fields are null.
        assert (r["energy_mj"], r["power_limit_w"], r["util_pct"], r["mem_util_pct"]) == (None,) * 4
        assert r["power_w"] == 100.0 + i + 0.5 * k
        assert r["temp_c"] == 30.0 + i  # nvmlDeviceGetTemperature when ...TemperatureV is missing
        # nvmlDeviceGetMemoryInfo (v1) when the v2 call is missing: used includes the 512 MiB reserved.
        assert r["mem_used_mib"] == 1024.0 * (i + 1) + 0.5 + 512
        assert r["mem_total_mib"] == 81920.0
        assert r["device_name"] == NAME and r["gpu_uuid"] == gpu_uuid(i)
    assert got["field_errors"] == {"energy:NotSupported": 4, "power_limit:NotSupported": 4,
                                   "util:NotSupported": 4}


SESSION_TWO_SAMPLES = """
    import datetime as dt, json
    from gpu_pipeline.lib.nvml_sampler import NvmlSession
    with NvmlSession() as s:
        rows = s.sample("h", dt.datetime(2026, 7, 14, 8, 0, tzinfo=dt.UTC)).to_pylist()
        rows += s.sample("h", dt.datetime(2026, 7, 14, 8, 1, tzinfo=dt.UTC)).to_pylist()
    print(json.dumps({"rows": rows, "field_errors": s.field_errors, "skipped": s.skipped}, default=str))
"""


@pytest.mark.parametrize(("code", "name"), [(15, "GpuIsLost"), (16, "ResetRequired")])
def test_a_lost_gpu_is_left_out_of_the_sample_not_a_row_of_nulls(fake_lib: Path, code: int, name: str) -> None:
    """GPU 1 (in MIG mode) has fallen off the bus: its UUID still reads, every other call answers
    GpuIsLost / ResetRequired. Its rows (and its MIG devices') would be all nulls every interval,
    counted as covered telemetry: the device is skipped and counted instead."""
    got = last_json(child(SESSION_TWO_SAMPLES, fake_lib, gpus=3, mig=1, lost=1, lost_code=code))
    assert without_time(got["rows"]) == [gpu_row(0, "h", 0), gpu_row(2, "h", 0),
                                         gpu_row(0, "h", 1), gpu_row(2, "h", 1)]
    assert got["skipped"] == {f"device:{name}": 2}
    assert got["field_errors"] == {}


def test_a_row_whose_every_measurement_failed_is_dropped_and_counted(fake_lib: Path) -> None:
    """Memory is the only field NVML reports for a MIG device: when it fails too, the MIG rows have no
    measurement left and are dropped (counted); the GPUs' rows keep their other fields."""
    got = last_json(child(SESSION_TWO_SAMPLES, fake_lib, gpus=2, mig=1, not_supported="memory"))
    no_memory = {"mem_used_mib": None, "mem_total_mib": None}
    assert without_time(got["rows"]) == [
        {**gpu_row(0, "h", 0), **no_memory}, {**gpu_row(1, "h", 0), **no_memory, "util_pct": None, "mem_util_pct": None},
        {**gpu_row(0, "h", 1), **no_memory}, {**gpu_row(1, "h", 1), **no_memory, "util_pct": None, "mem_util_pct": None},
    ]
    assert got["skipped"] == {"device:no_measurement": 4}  # two MIG devices, two samples
    # every field of every device refused: no row at all
    got = last_json(child(SESSION_TWO_SAMPLES, fake_lib, gpus=2,
                          not_supported="util,memory,power,power_limit,temperature,clock,energy"))
    assert got["rows"] == []
    assert got["skipped"] == {"device:no_measurement": 4}
    assert got["field_errors"]["power:NotSupported"] == 4


# -- the sampler loop -----------------------------------------------------------------------------

LOOP = """
    import datetime as dt, json, sys
    from pathlib import Path
    from gpu_pipeline.lib.nvml_sampler import run_sampler
    start = dt.datetime.fromisoformat(sys.argv[2])
    t = [start]
    def clock():
        v = t[0]
        t[0] += dt.timedelta(seconds=10)
        return v
    sleeps, mono = [], [0.0]
    def sleep(seconds):
        sleeps.append(seconds)
        mono[0] += seconds
    s = run_sampler(Path(sys.argv[1]), 10.0, iterations=int(sys.argv[3]), flush_every=int(sys.argv[4]),
                    sleep=sleep, clock=clock, host="nodeA", monotonic=lambda: mono[0])
    print(json.dumps({"summary": s.as_dict(), "sleeps": sleeps}))
"""


def read_day(out: Path, host: str, day: str) -> list[dict]:
    path = out / "nvml" / host / f"nvml-{day}.parquet"
    table = pq.read_table(path)
    assert table.schema.equals(GPU_SAMPLES.schema)
    return table.to_pylist()


def test_daily_files_rollover_and_restart(fake_lib: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    got = last_json(child(LOOP, fake_lib, str(out), "2026-03-01T23:59:40+00:00", "5", "2", gpus=2))
    s = got["summary"]
    host_dir = out / "nvml" / "nodeA"
    day1, day2 = host_dir / "nvml-2026-03-01.parquet", host_dir / "nvml-2026-03-02.parquet"
    assert s["samples"] == 5 and s["attempts"] == 5 and s["errors"] == 0 and s["rows"] == 10
    # day 1 flushed at 2 samples; day 2 at 2 samples and at exit (1 more).
    assert s["flushes"] == 3 and s["files"] == [str(day1), str(day2)]
    assert got["sleeps"] == [10.0] * 4
    assert sorted(p.name for p in host_dir.iterdir()) == [".lock", day1.name, day2.name]  # no temp files
    rows1, rows2 = read_day(out, "nodeA", "2026-03-01"), read_day(out, "nodeA", "2026-03-02")
    assert [r["sample_utc"].strftime("%H:%M:%S") for r in rows1[::2]] == ["23:59:40", "23:59:50"]
    assert [r["sample_utc"].strftime("%H:%M:%S") for r in rows2[::2]] == ["00:00:00", "00:00:10", "00:00:20"]
    for k, (a, b) in enumerate(zip(rows1[::2] + rows2[::2], rows1[1::2] + rows2[1::2], strict=True)):
        assert without_time([a, b]) == [gpu_row(0, "nodeA", k), gpu_row(1, "nodeA", k)]

    # A restarted sampler keeps the rows already in the day's file.
    got = last_json(child(LOOP, fake_lib, str(out), "2026-03-02T00:00:30+00:00", "2", "10", gpus=2))
    assert got["summary"]["flushes"] == 1 and got["summary"]["files"] == [str(day2)]
    rows2b = read_day(out, "nodeA", "2026-03-02")
    assert rows2b[:6] == rows2
    assert [r["sample_utc"].strftime("%H:%M:%S") for r in rows2b[::2]] == [
        "00:00:00", "00:00:10", "00:00:20", "00:00:30", "00:00:40"]
    assert read_day(out, "nodeA", "2026-03-01") == rows1


@pytest.mark.parametrize(("code", "name"), [(9, "DriverNotLoaded"), (15, "GpuIsLost")])
def test_driver_vanishing_mid_run_is_counted_and_recovers(fake_lib: Path, tmp_path: Path, code: int,
                                                          name: str) -> None:
    out = tmp_path / "out"
    # Attempts 1-3 work, 4-7 fail (the device count, then nvmlInit, raise), 8-10 work again.
    got = last_json(child(LOOP, fake_lib, str(out), "2026-03-01T12:00:00+00:00", "10", "100", gpus=2,
                          fail_after=3, fail_count=4, fail_code=code))
    s = got["summary"]
    assert (s["attempts"], s["samples"], s["errors"], s["rows"]) == (10, 6, 4, 12)
    assert s["error_counts"] == {name: 4}
    assert s["flushes"] == 2  # at the first failure and at exit (flush_every=100)
    assert got["sleeps"] == [10.0] * 9
    rows = read_day(out, "nodeA", "2026-03-01")
    assert [r["sample_utc"].strftime("%H:%M:%S") for r in rows[::2]] == [
        "12:00:00", "12:00:10", "12:00:20", "12:01:10", "12:01:20", "12:01:30"]
    # The fake's counters kept running across the re-initialization: power readings are consecutive.
    assert [r["power_w"] for r in rows[::2]] == [100.0 + 0.5 * k for k in range(6)]


def test_the_sampler_writes_no_rows_for_a_lost_gpu(fake_lib: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    got = last_json(child(LOOP, fake_lib, str(out), "2026-03-01T12:00:00+00:00", "3", "100", gpus=2, lost=0))
    s = got["summary"]
    assert (s["samples"], s["errors"], s["rows"]) == (3, 0, 3)
    assert s["devices_skipped"] == {"device:GpuIsLost": 3}
    rows = read_day(out, "nodeA", "2026-03-01")
    assert [r["gpu_index"] for r in rows] == [1, 1, 1]
    assert without_time(rows) == [gpu_row(1, "nodeA", k) for k in range(3)]


def test_sigterm_and_sigint_write_the_file_and_exit_0(fake_lib: Path, tmp_path: Path) -> None:
    code = """
        import sys
        from gpu_pipeline.lib.nvml_sampler import main_collect_nvml
        sys.exit(main_collect_nvml(sys.argv[1], 0.05, flush_every=3, host="nodeS"))
    """
    for sig in (signal.SIGTERM, signal.SIGINT):
        out = tmp_path / sig.name
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(out)],
                                env=_env(fake_lib, {"GPUS": 2}), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            # The first file appears after 3 samples; signal a little later, between flushes.
            wait_for(lambda out=out: any((out / "nvml" / "nodeS").glob("*.parquet")), proc)
            time.sleep(0.12)
            proc.send_signal(sig)
            stdout, stderr = proc.communicate(timeout=15)
        finally:
            proc.kill()
        assert proc.returncode == 0, stderr
        s = json.loads(stdout.strip().splitlines()[-1])
        assert s["stopped_by"] == sig.name and s["errors"] == 0 and s["samples"] >= 3
        rows = [r for f in s["files"] for r in pq.read_table(f).to_pylist()]
        assert len(rows) == s["rows"] == 2 * s["samples"]


def wait_for(pred, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"sampler exited early: rc={proc.returncode} {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the sampler")
        time.sleep(0.02)


def test_file_intact_after_sigkill_mid_write(fake_lib: Path, tmp_path: Path) -> None:
    """flush_every=1 and no pause: the sampler rewrites its day file continuously, so SIGKILLs land
    during writes; every time, the file is whole and readable, and the next sampler continues it."""
    out = tmp_path / "out"
    host_dir = out / "nvml" / "nodeK"
    code = """
        import sys
        from pathlib import Path
        from gpu_pipeline.lib.nvml_sampler import run_sampler
        run_sampler(Path(sys.argv[1]), 0.0, flush_every=1, host="nodeK")
    """
    previous: list[dict] = []
    for round_, delay in enumerate((0.25, 0.4, 0.55)):
        if round_ == 1:
            # A temporary file a killed writer could leave behind is removed by the next sampler.
            (host_dir / ".nvml-2000-01-01.parquet.abc123.tmp").write_bytes(b"PAR1 half a file")
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(out)],
                                env=_env(fake_lib, {"GPUS": 2, "MIG": 1}), cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            n_before = len(previous)

            def grew(n_before: int = n_before) -> bool:
                files = list(host_dir.glob("nvml-*.parquet"))
                return bool(files) and pq.read_metadata(files[0]).num_rows > n_before

            wait_for(grew, proc)
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=15)
        assert proc.returncode == -signal.SIGKILL
        assert not (host_dir / ".nvml-2000-01-01.parquet.abc123.tmp").exists()
        files = sorted(host_dir.glob("nvml-*.parquet"))
        assert len(files) in (1, 2)  # 2 only if the run crossed midnight UTC
        rows = [r for f in files for r in pq.read_table(f).to_pylist()]
        assert pq.read_table(files[0]).schema.equals(GPU_SAMPLES.schema)
        # Whole samples only (4 rows each: 2 GPUs + 2 MIG devices), no duplicates, earlier rows kept.
        assert len(rows) % 4 == 0 and len(rows) > len(previous)
        assert len({(r["sample_utc"], r["gpu_id"]) for r in rows}) == len(rows)
        assert rows[: len(previous)] == previous
        previous = rows


def test_second_sampler_on_the_same_host_folder_is_refused(fake_lib: Path, tmp_path: Path) -> None:
    host_dir = tmp_path / "out" / "nvml" / "nodeL"
    host_dir.mkdir(parents=True)
    code = """
        import sys
        from gpu_pipeline.lib.nvml_sampler import main_collect_nvml
        sys.exit(main_collect_nvml(sys.argv[1], 1.0, iterations=1, host="nodeL"))
    """
    with open(host_dir / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = child(code, fake_lib, str(tmp_path / "out"))
    assert proc.returncode == ns.EXIT_BUSY
    assert "another NVML sampler is writing" in proc.stderr
    assert list(host_dir.glob("*.parquet")) == []


# -- no driver ------------------------------------------------------------------------------------

NO_DRIVER = """
    import sys
    from gpu_pipeline.lib.nvml_sampler import NvmlUnavailable, main_collect_nvml, sample_once
    try:
        sample_once()
    except NvmlUnavailable as exc:
        print("sample_once:", exc)
    else:
        sys.exit("sample_once did not raise")
    sys.exit(main_collect_nvml(sys.argv[1], 1.0, iterations=3))
"""


def test_without_the_library_nvml_is_unavailable_exit_3(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    probe = child("import ctypes; ctypes.CDLL('libnvidia-ml.so.1')", empty)
    if probe.returncode == 0:
        pytest.skip("a real libnvidia-ml.so.1 is installed on this machine: cannot simulate a driverless host")
    out = tmp_path / "out"
    proc = child(NO_DRIVER, empty, str(out))
    assert proc.returncode == ns.EXIT_NVML_UNAVAILABLE == 3, proc.stderr
    message = ("no NVIDIA driver / libnvidia-ml.so.1 found on this host; the NVML sampler is optional")
    assert message in proc.stdout  # NvmlUnavailable from sample_once
    assert proc.stderr.startswith("gpu-pipeline collect nvml: " + message)
    assert "LibraryNotFound" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()  # nothing written


def test_driver_not_loaded_at_start_exit_3(fake_lib: Path, tmp_path: Path) -> None:
    proc = child(NO_DRIVER, fake_lib, str(tmp_path / "out"), init_fail=9)
    assert proc.returncode == 3, proc.stderr
    assert "NVIDIA kernel driver is not loaded" in proc.stderr
    assert "the NVML sampler is optional" in proc.stderr
    assert not (tmp_path / "out").exists()


# -- pieces that need no NVML ---------------------------------------------------------------------


def _table(n: int) -> pa.Table:
    rows = [{"sample_utc": 1_700_000_000_000_000 + i, "source": "nvml", "host": "h",
             "gpu_uuid": gpu_uuid(0), "gpu_id": "GPU-5ca1ab00", "gpu_index": 0, "mig_profile": None,
             "mig_instance_id": None, "device_name": NAME, "util_pct": 1.0, "mem_util_pct": None,
             "mem_used_mib": 1.0, "mem_total_mib": 2.0, "power_w": 3.0, "power_limit_w": 4.0,
             "temp_c": 5.0, "sm_clock_mhz": 6.0, "energy_mj": 7.0} for i in range(n)]
    return ns.rows_to_table(rows)


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "nvml-2026-01-01.parquet"
    ns.write_parquet_atomic(_table(3), target)
    real = pq.write_table

    def half_then_fail(table, where, **kw):
        where.write(b"PAR1 partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr(ns.pq, "write_table", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        ns.write_parquet_atomic(_table(5), target)
    monkeypatch.setattr(ns.pq, "write_table", real)
    assert pq.read_table(target).num_rows == 3
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    assert ns.rows_to_table([]).schema.equals(GPU_SAMPLES.schema)


def test_unreadable_day_file_is_moved_aside_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "nvml-2026-01-01.parquet"
    path.write_bytes(b"not parquet")
    summary = ns.SamplerSummary()
    writer = ns._DayWriter(tmp_path, summary)
    writer.add(dt.date(2026, 1, 1), _table(2))
    assert writer.flush()
    assert pq.read_table(path).num_rows == 2
    (aside,) = summary.files_set_aside
    assert Path(aside).read_bytes() == b"not parquet" and Path(aside).name.startswith(path.name + ".corrupt-")


def test_rows_written_beside_a_file_that_cannot_be_moved_aside_are_read(tmp_path: Path, monkeypatch) -> None:
    """A day's file the sampler can neither read nor move aside (an immutable file, a sticky folder):
    its rows go to ``nvml-<day>.<stamp>.parquet`` beside it, which the raw step reads; while the
    corrupt file is there the day fails naming it."""
    from gpu_pipeline.lib.samples import nvml_file_samples, nvml_files

    host = tmp_path / "nvml" / "h"
    host.mkdir(parents=True)
    corrupt = host / "nvml-2023-11-14.parquet"
    corrupt.write_bytes(b"not parquet")

    def refuse(src, dst):
        raise PermissionError(1, "Operation not permitted", str(src))

    monkeypatch.setattr(ns.os, "replace", refuse)
    writer = ns._DayWriter(host, ns.SamplerSummary())
    writer.add(dt.date(2023, 11, 14), _table(2))
    monkeypatch.undo()
    assert writer.flush() and writer.path != corrupt and corrupt.read_bytes() == b"not parquet"
    start = dt.datetime(2023, 11, 14, tzinfo=dt.UTC)
    end = start + dt.timedelta(days=1)
    assert nvml_files(tmp_path, start, end) == sorted([corrupt, writer.path])
    with pytest.raises(ValueError, match=f"{corrupt}: unreadable NVML sampler file"):
        nvml_file_samples(corrupt, start, end)
    corrupt.unlink()
    (left,) = nvml_files(tmp_path, start, end)
    assert nvml_file_samples(left, start, end).num_rows == 2


def test_unavailable_messages_are_actionable() -> None:
    msg = ns.unavailable_message(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert msg.startswith("no NVIDIA driver / libnvidia-ml.so.1 found on this host; the NVML sampler is optional")
    assert "driver is not loaded" in ns.unavailable_message(pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert "/dev/nvidia" in ns.unavailable_message(pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION))


# -- a folder that cannot take the samples --------------------------------------------------------


def test_a_folder_that_cannot_be_made_is_one_line_and_exit_5(fake_lib: Path, tmp_path: Path) -> None:
    """The output folder cannot be made (here a file is in its way; read-only or forbidden alike):
    one line naming it and exit 5, no traceback (an OSError traceback and exit 1 before)."""
    (tmp_path / "out").write_text("a file, not a folder")
    code = """
        import sys
        from gpu_pipeline.lib.nvml_sampler import main_collect_nvml
        sys.exit(main_collect_nvml(sys.argv[1], 0.01, iterations=1, host="nodeR"))
    """
    proc = child(code, fake_lib, str(tmp_path / "out"))
    assert proc.returncode == ns.EXIT_NOT_WRITTEN == 5, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpu-pipeline collect nvml: cannot write") and str(tmp_path / "out") in line


def test_lost_samples_are_not_success(fake_lib: Path, tmp_path: Path) -> None:
    """Every flush fails (a full disk): the summary counts the samples lost and the exit code is 5,
    so that systemd or cron sees the loss (it exited 0)."""
    code = """
        import errno, json, sys
        from gpu_pipeline.lib import nvml_sampler as ns
        def full(table, target):
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        ns.write_parquet_atomic = full
        sys.exit(ns.main_collect_nvml(sys.argv[1], 0.01, iterations=4, flush_every=2, host="nodeF"))
    """
    proc = child(code, fake_lib, str(tmp_path / "out"))
    assert proc.returncode == ns.EXIT_NOT_WRITTEN, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["samples_lost"] > 0 and summary["flush_errors"] > 0
    assert "sample(s) could not be written" in proc.stderr
