"""NVML sampler: GPU telemetry straight from the driver on a GPU node (DESIGN.md 4.3), as
:data:`~gpu_pipeline.lib.schemas.GPU_SAMPLES` rows with ``source = "nvml"``.

The sampler is optional: on a host without an NVIDIA driver, ``nvmlInit`` fails and
:class:`NvmlUnavailable` says so (``main_collect_nvml`` exits with code 3). Usable on its own::

    python -c "from gpu_pipeline.lib.nvml_sampler import sample_once; print(sample_once().to_pylist())"

One sample
    One timestamp (UTC, taken before the first device call) for all rows of a sample. One row per
    GPU (``nvmlDeviceGetCount`` / ``nvmlDeviceGetHandleByIndex``): full UUID, ``gpu_id`` = the
    HTCondor short id, index, name, utilization (gpu / memory %), memory used / total (bytes ->
    MiB, the v2 struct whose ``used`` excludes driver-reserved memory, as nvidia-smi prints it; the
    v1 call on drivers without it or handles that refuse it), power draw and enforced power limit (mW -> W), temperature
    (``nvmlDeviceGetTemperatureV``, else the older ``nvmlDeviceGetTemperature``), SM clock and the
    total energy counter (mJ). A GPU in MIG mode also gets one row per MIG device
    (``nvmlDeviceGetMaxMigDeviceCount`` / ``nvmlDeviceGetMigDeviceHandleByIndex``; an empty slot
    answers NotFound and is skipped): ``gpu_uuid`` = ``gpu_id`` = its ``MIG-...`` UUID,
    ``gpu_index`` the parent's, ``mig_instance_id`` from ``nvmlDeviceGetGpuInstanceId``,
    ``mig_profile`` from the MIG device's name (``"... MIG 1g.10gb"``), ``device_name`` the parent's
    model, memory from the MIG handle, utilization null (NVML does not report it per MIG device).

    A field whose NVML call fails (NotSupported, NoPermission, ...) is null; only that field, and
    the failure is counted per ``field:Error``. Errors that mean the driver itself is gone
    (Uninitialized, DriverNotLoaded, LibraryNotFound, LibRmVersionMismatch), and any error of
    ``nvmlDeviceGetCount``, abort the whole sample instead: a row of nulls would be wrong data.
    A device whose handle or UUID cannot be read is skipped (no ``gpu_id``) and counted
    (``skipped`` / ``devices_skipped``, ``"device handle/UUID:Error"``). A GPU that answers any call
    with GpuIsLost or ResetRequired (fallen off the bus, Xid 79, ...) is skipped for that sample
    with its MIG devices, counted as ``"device:GpuIsLost"`` / ``"device:ResetRequired"``: its row
    would be all nulls, and a row every interval would count as covered telemetry. A row whose
    every measurement (utilization, memory, power, power limit, temperature, SM clock, energy; a
    MIG device's are memory and the rest NVML refuses on MIG handles) failed, for any reason, is
    dropped and counted as ``"device:no_measurement"`` for the same reason.

The sampler process (:func:`run_sampler`)
    Samples every ``interval_s`` (drift-free schedule on a monotonic clock; intervals missed while a
    sample overran are skipped and counted) and keeps one Parquet file per UTC day,
    ``OUT/nvml/HOST/nvml-YYYY-MM-DD.parquet``, with exactly the GPU_SAMPLES schema.

    File safety: rows are accumulated in memory; every ``flush_every`` samples, at a day rollover,
    when NVML starts failing, at exit and on SIGTERM / SIGINT the day's file is rewritten whole
    (all the day's rows so far) to a temporary file in the same folder (``.nvml-....tmp``, not
    matched by ``*.parquet``), fsynced, renamed over the old file with ``os.replace`` and the folder
    fsynced. A reader, or a crash / SIGKILL at any moment, sees either the previous complete file or
    the new one, never a truncated one; at most ``flush_every`` samples are lost. A restarted
    sampler (or a day seen again after the clock stepped back) first reads the day's existing file
    and keeps its rows; a file that cannot be read is renamed aside (``...parquet.corrupt-<time>``),
    never overwritten. One sampler per host folder: an exclusive ``flock`` on ``HOST/.lock`` (freed
    by the kernel when the process dies) makes a second one fail with :class:`SamplerBusy`; the
    lock holder removes temporary files a killed predecessor left behind.

    Rewriting the whole day costs time proportional to the day's rows: at 10 s and 8 GPUs a day
    is ~70k rows (a flush takes a few ms early in the day, tens of ms late); for 1-s sampling raise
    ``flush_every`` accordingly.

    The driver going away mid-run (an NVML call raising) never ends the loop: the attempt is
    logged (at the first failure, on recovery and every 100th failure in between) and counted,
    NVML is shut down, and ``nvmlInit`` is retried at the next interval. A failing write is logged
    and counted too, its rows kept for the next flush.

Signals: SIGTERM / SIGINT set a stop flag; one arriving while the loop sleeps ends the sleep at
once (only the sleep is interrupted, never an NVML call or a write), then the loop writes the
day's file and returns (exit code 0). Handlers are installed only in the main thread and restored
on return.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pynvml

from gpu_pipeline.lib.schemas import GPU_SAMPLES, conform
from gpu_pipeline.lib.store import atomic_file
from gpu_pipeline.lib.telemetry import short_gpu_id
from gpu_pipeline.lib.timeutil import epoch_us

log = logging.getLogger(__name__)

UTC = dt.UTC
SOURCE = "nvml"
SUBDIR = "nvml"
FILE_PREFIX = "nvml-"
LOCK_NAME = ".lock"
MIB = 1024 * 1024

#: Exit codes of :func:`main_collect_nvml`.
EXIT_OK = 0
EXIT_NVML_UNAVAILABLE = 3
EXIT_BUSY = 4
EXIT_NOT_WRITTEN = 5  #: the folder cannot be written, or samples were lost

# NVML errors that mean the library / driver as a whole is unusable: abort the sample, re-init.
_FATAL_CODES = frozenset({
    pynvml.NVML_ERROR_UNINITIALIZED,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
})
# NVML errors that mean one GPU is gone (fallen off the bus, needs a reset): skip that device.
_LOST_CODES = frozenset({
    pynvml.NVML_ERROR_GPU_IS_LOST,
    pynvml.NVML_ERROR_RESET_REQUIRED,
})
_MISSING_FUNCTION_CODES = frozenset({
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
})
_MIG_PROFILE_RE = re.compile(r"\bMIG\s+(\S+)\s*$")
_FLOAT_COLUMNS = ("util_pct", "mem_util_pct", "mem_used_mib", "mem_total_mib", "power_w", "power_limit_w",
                  "temp_c", "sm_clock_mhz", "energy_mj")
_COLUMNS = ("sample_utc", "source", "host", "gpu_uuid", "gpu_id", "gpu_index", "mig_profile",
            "mig_instance_id", "device_name", *_FLOAT_COLUMNS)


class NvmlUnavailable(RuntimeError):
    """NVML cannot be initialized on this host (no driver, no ``libnvidia-ml.so.1``, ...)."""


class SamplerBusy(RuntimeError):
    """Another sampler process holds the host folder's lock."""


class _DeviceLost(Exception):
    """A device call answered GpuIsLost / ResetRequired: the device is left out of the sample."""

    def __init__(self, error: pynvml.NVMLError):
        super().__init__(str(error))
        self.error = error


def _error_name(exc: BaseException) -> str:
    name = type(exc).__name__
    return name.removeprefix("NVMLError_") if isinstance(exc, pynvml.NVMLError) else name


def _is_fatal(exc: pynvml.NVMLError) -> bool:
    return getattr(exc, "value", None) in _FATAL_CODES


def _is_lost(exc: pynvml.NVMLError) -> bool:
    return getattr(exc, "value", None) in _LOST_CODES


def unavailable_message(exc: BaseException) -> str:
    """The actionable explanation of an ``nvmlInit`` failure."""
    code = getattr(exc, "value", None)
    detail = f"(NVML: {_error_name(exc)}: {exc})"
    optional = ("the NVML sampler is optional: run it only on GPU nodes, or use the nvidia-smi / "
                "dcgm-exporter telemetry sources instead")
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return (f"no NVIDIA driver / libnvidia-ml.so.1 found on this host; {optional}. On a GPU node, "
                f"install the NVIDIA driver (nvidia-smi must work) or put the directory holding "
                f"libnvidia-ml.so.1 on LD_LIBRARY_PATH {detail}")
    if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return (f"libnvidia-ml.so.1 is installed but the NVIDIA kernel driver is not loaded on this host; "
                f"{optional}. Check `nvidia-smi` and load the driver (modprobe nvidia) {detail}")
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return (f"NVML is installed but this user may not open the GPU devices (/dev/nvidia*); "
                f"{optional} {detail}")
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return (f"libnvidia-ml.so.1 does not match the loaded NVIDIA kernel driver (driver upgraded "
                f"without reboot?); {optional} {detail}")
    return f"NVML could not be initialized on this host; {optional} {detail}"


def default_host() -> str:
    """This host's name (``socket.gethostname()``)."""
    return socket.gethostname()


def _utcnow() -> dt.datetime:
    return dt.datetime.now(UTC)


def _as_utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is None:
        raise ValueError(f"clock must return timezone-aware datetimes, got naive {value!r}")
    return value.astimezone(UTC)


# ----------------------------------------------------------------------------------------------
# One sample
# ----------------------------------------------------------------------------------------------


class NvmlSession:
    """NVML initialized once and sampled many times.

    ``open()`` runs ``nvmlInit`` (raising :class:`NvmlUnavailable`), ``sample()`` reads every
    device, ``close()`` runs ``nvmlShutdown``. ``field_errors`` counts the per-field failures that
    became nulls (``"power:NotSupported"``), ``skipped`` the devices (and rows) left out, per
    sample: ``"device handle/UUID:Error"``, ``"device:GpuIsLost"``, ``"device:no_measurement"`` ..."""

    def __init__(self) -> None:
        self.ready = False
        self.field_errors: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self._missing: set[str] = set()  # versioned entry points this driver lacks
        self._logged: set[str] = set()

    def open(self) -> None:
        if self.ready:
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(unavailable_message(exc)) from exc
        self.ready = True

    def close(self) -> None:
        if not self.ready:
            return
        self.ready = False
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    def __enter__(self) -> NvmlSession:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- field access --------------------------------------------------------------------------
    def _field(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or ``None`` when NVML refuses this one field (counted); a driver-level
        error propagates and aborts the sample, a lost GPU raises :class:`_DeviceLost`."""
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if _is_fatal(exc):
                raise
            if _is_lost(exc):
                raise _DeviceLost(exc) from exc
            key = f"{name}:{_error_name(exc)}"
            self.field_errors[key] += 1
            if key not in self._logged:
                self._logged.add(key)
                level = logging.DEBUG if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED else logging.WARNING
                log.log(level, "NVML %s: %s; the field is null", name, exc)
            return None

    def _versioned(self, name: str, new: Callable[[], Any], old: Callable[[], Any]) -> Any:
        """The newer entry point, else (driver without it) the older one, remembered per session."""
        if name not in self._missing:
            try:
                return new()
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) not in _MISSING_FUNCTION_CODES:
                    raise
                self._missing.add(name)
                log.info("NVML: %s not available (%s); using the older call", name, exc)
        return old()

    def _memory(self, handle: Any) -> tuple[float | None, float | None]:
        def v2() -> tuple[int, int]:
            m = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            return m.used, m.total

        def v1() -> tuple[int, int]:
            m = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return m.used, m.total

        def v2_else_v1() -> tuple[int, int]:
            try:
                return self._versioned("nvmlDeviceGetMemoryInfo_v2", v2, v1)
            except pynvml.NVMLError as exc:  # e.g. a MIG handle refusing only the v2 struct
                if exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED or "nvmlDeviceGetMemoryInfo_v2" in self._missing:
                    raise
                return v1()

        got = self._field("memory", v2_else_v1)
        if got is None:
            return None, None
        return got[0] / MIB, got[1] / MIB

    def _temperature(self, handle: Any) -> int | None:
        sensor = pynvml.NVML_TEMPERATURE_GPU
        return self._field(
            "temperature", self._versioned, "nvmlDeviceGetTemperatureV",
            lambda: pynvml.nvmlDeviceGetTemperatureV(handle, sensor),
            lambda: pynvml.nvmlDeviceGetTemperature(handle, sensor),
        )

    def _metrics(self, handle: Any, *, mig: bool) -> dict[str, float | None]:
        util = None if mig else self._field("util", pynvml.nvmlDeviceGetUtilizationRates, handle)
        used, total = self._memory(handle)
        power = self._field("power", pynvml.nvmlDeviceGetPowerUsage, handle)
        limit = self._field("power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        temp = self._temperature(handle)
        clock = self._field("sm_clock", pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
        energy = self._field("energy", pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        return {
            "util_pct": float(util.gpu) if util is not None else None,
            "mem_util_pct": float(util.memory) if util is not None else None,
            "mem_used_mib": used,
            "mem_total_mib": total,
            "power_w": power / 1000.0 if power is not None else None,
            "power_limit_w": limit / 1000.0 if limit is not None else None,
            "temp_c": float(temp) if temp is not None else None,
            "sm_clock_mhz": float(clock) if clock is not None else None,
            "energy_mj": float(energy) if energy is not None else None,
        }

    def _skip(self, what: str, exc: pynvml.NVMLError) -> None:
        if _is_fatal(exc):
            raise exc
        key = f"{what}:{_error_name(exc)}"
        self.skipped[key] += 1
        if key not in self._logged:
            self._logged.add(key)
            log.warning("NVML %s failed (%s); that device is left out of the sample", what, exc)

    def _measured(self, row: dict[str, Any]) -> bool:
        """Whether the row has any measurement; a row whose every field failed is counted, not kept."""
        if any(row[c] is not None for c in _FLOAT_COLUMNS):
            return True
        key = "device:no_measurement"
        self.skipped[key] += 1
        if key not in self._logged:
            self._logged.add(key)
            log.warning("NVML: every measurement of %s failed; the row is left out of the sample "
                        "(see the field errors)", row["gpu_uuid"])
        return False

    # -- the sample ----------------------------------------------------------------------------
    def sample_rows(self, host: str, when: dt.datetime) -> list[dict[str, Any]]:
        """One row per GPU and MIG device, all stamped ``when``. Raises ``pynvml.NVMLError`` when
        the sample as a whole fails (device count unreadable, driver gone)."""
        if not self.ready:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        ts = epoch_us(_as_utc(when))
        rows: list[dict[str, Any]] = []
        count = pynvml.nvmlDeviceGetCount()
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = str(pynvml.nvmlDeviceGetUUID(handle)).strip()
                gpu_id = short_gpu_id(uuid)
            except pynvml.NVMLError as exc:
                self._skip("device handle/UUID", exc)
                continue
            except ValueError:
                self.skipped["device:bad_uuid"] += 1
                continue
            try:
                rows.extend(self._device_rows(handle, ts, host, index, uuid, gpu_id))
            except _DeviceLost as lost:  # none of its rows: they would be nulls counted as coverage
                self._skip("device", lost.error)
        return rows

    def _device_rows(self, handle: Any, ts: int, host: str, index: int, uuid: str, gpu_id: str
                     ) -> list[dict[str, Any]]:
        """The GPU's row and its MIG devices' rows (raises :class:`_DeviceLost`)."""
        name = self._field("name", pynvml.nvmlDeviceGetName, handle)
        name = str(name).strip() if name is not None else None
        rows = [{
            "sample_utc": ts, "source": SOURCE, "host": host, "gpu_uuid": uuid, "gpu_id": gpu_id,
            "gpu_index": index, "mig_profile": None, "mig_instance_id": None, "device_name": name,
            **self._metrics(handle, mig=False),
        }]
        mode = self._field("mig_mode", pynvml.nvmlDeviceGetMigMode, handle)
        if mode is not None and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
            rows.extend(self._mig_rows(handle, ts, host, index, name))
        return [r for r in rows if self._measured(r)]

    def _mig_rows(self, parent: Any, ts: int, host: str, index: int, parent_name: str | None) -> list[dict]:
        rows = []
        slots = self._field("mig_count", pynvml.nvmlDeviceGetMaxMigDeviceCount, parent) or 0
        for slot in range(slots):
            try:
                handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                    continue  # an empty MIG slot
                if _is_lost(exc):
                    raise _DeviceLost(exc) from exc
                self._skip("MIG device handle", exc)
                continue
            try:
                uuid = str(pynvml.nvmlDeviceGetUUID(handle)).strip()
            except pynvml.NVMLError as exc:
                if _is_lost(exc):
                    raise _DeviceLost(exc) from exc
                self._skip("MIG device UUID", exc)
                continue
            mig_name = self._field("mig_name", pynvml.nvmlDeviceGetName, handle)
            m = _MIG_PROFILE_RE.search(str(mig_name)) if mig_name is not None else None
            gi = self._field("mig_instance_id", pynvml.nvmlDeviceGetGpuInstanceId, handle)
            rows.append({
                "sample_utc": ts, "source": SOURCE, "host": host, "gpu_uuid": uuid,
                "gpu_id": short_gpu_id(uuid), "gpu_index": index,
                "mig_profile": m.group(1) if m else None, "mig_instance_id": gi,
                "device_name": parent_name, **self._metrics(handle, mig=True),
            })
        return rows

    def sample(self, host: str, when: dt.datetime) -> pa.Table:
        return rows_to_table(self.sample_rows(host, when))


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Sample rows (``sample_utc`` as int64 microseconds) as a :data:`GPU_SAMPLES` table."""
    if not rows:
        return GPU_SAMPLES.empty()
    types = {f.name: f.type for f in GPU_SAMPLES.schema}
    arrays = {}
    for name in _COLUMNS:
        values = [r[name] for r in rows]
        if name == "sample_utc":
            arrays[name] = pa.array(values, type=pa.int64()).cast(types[name])
        else:
            arrays[name] = pa.array(values, type=types[name])
    return conform(pa.table(arrays), GPU_SAMPLES)


def sample_once(host: str | None = None, *, clock: Callable[[], dt.datetime] = _utcnow) -> pa.Table:
    """Initialize NVML, read every GPU (and MIG device) once, shut NVML down.

    Returns a :data:`GPU_SAMPLES` table (``source = "nvml"``, one UTC timestamp for all rows).
    Raises :class:`NvmlUnavailable` when NVML cannot be initialized, ``pynvml.NVMLError`` when the
    device list cannot be read."""
    with NvmlSession() as session:
        return session.sample(host if host is not None else default_host(), clock())


# ----------------------------------------------------------------------------------------------
# Daily files
# ----------------------------------------------------------------------------------------------


def write_parquet_atomic(table: pa.Table, target: Path) -> None:
    """Write ``table`` to ``target`` via a temporary file in the same folder, fsync, ``os.replace``
    and a folder fsync (:func:`~gpu_pipeline.lib.store.atomic_file`): readers (and a crash at any
    point) see the old file or the new one."""
    with atomic_file(target) as fh:
        pq.write_table(table, fh, compression="zstd")


def day_file(out_dir: Path, host: str, day: dt.date) -> Path:
    """``out_dir/nvml/HOST/nvml-YYYY-MM-DD.parquet``."""
    return Path(out_dir) / SUBDIR / host / f"{FILE_PREFIX}{day.isoformat()}.parquet"


class _DayWriter:
    """The rows of the current UTC day and its file."""

    def __init__(self, host_dir: Path, summary: SamplerSummary):
        self.host_dir = host_dir
        self.summary = summary
        self.day: dt.date | None = None
        self.path: Path | None = None
        self.table: pa.Table | None = None  # rows written or to be written
        self.parts: list[pa.Table] = []
        self.pending = 0  # samples not yet in the file

    def add(self, day: dt.date, table: pa.Table) -> None:
        if day != self.day:
            if self.day is not None:
                self.flush()
                if self.pending:
                    log.error("could not write %s; its last %d samples are lost", self.path, self.pending)
                    self.summary.samples_lost += self.pending
            self._start(day)
        self.parts.append(table)
        self.pending += 1

    def _start(self, day: dt.date) -> None:
        self.day = day
        self.path = self.host_dir / f"{FILE_PREFIX}{day.isoformat()}.parquet"
        self.parts, self.pending = [], 0
        self.table = GPU_SAMPLES.empty()
        if self.path.exists():
            try:
                self.table = conform(pq.read_table(self.path), GPU_SAMPLES)
                log.info("continuing %s (%d rows already there)", self.path, self.table.num_rows)
            except Exception as exc:  # unreadable or another schema: keep it, never overwrite it
                stamp = _utcnow().strftime("%Y%m%dT%H%M%S")
                aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
                try:
                    os.replace(self.path, aside)
                except OSError as move_exc:  # cannot move it: write this run's rows beside it
                    log.error("%s is unreadable (%s) and cannot be moved aside (%s)", self.path, exc, move_exc)
                    self.path = self.path.with_name(f"{FILE_PREFIX}{day.isoformat()}.{stamp}.parquet")
                else:
                    log.warning("%s is unreadable (%s); moved aside to %s", self.path, exc, aside.name)
                    self.summary.files_set_aside.append(str(aside))

    def flush(self) -> bool:
        """Rewrite the day's file with all its rows; ``False`` (rows kept) when the write fails."""
        if self.path is None or self.table is None or not self.pending:
            return True
        table = pa.concat_tables([self.table, *self.parts]).combine_chunks()
        try:
            write_parquet_atomic(table, self.path)
        except Exception as exc:
            self.summary.flush_errors += 1
            log.error("writing %s failed (%s); its rows are kept for the next flush", self.path, exc)
            return False
        self.table, self.parts, self.pending = table, [], 0
        self.summary.flushes += 1
        if str(self.path) not in self.summary.files:
            self.summary.files.append(str(self.path))
        return True


# ----------------------------------------------------------------------------------------------
# The sampler loop
# ----------------------------------------------------------------------------------------------


@dataclass
class SamplerSummary:
    """What a :func:`run_sampler` run did."""

    samples: int = 0  # successful samples
    attempts: int = 0  # samples tried (successful + errors)
    rows: int = 0
    errors: int = 0  # failed attempts: nvmlInit or the sample raised
    flushes: int = 0
    flush_errors: int = 0
    samples_lost: int = 0  # samples whose rows could not be written at all
    missed_intervals: int = 0  # intervals skipped because a sample overran
    files: list[str] = field(default_factory=list)
    files_set_aside: list[str] = field(default_factory=list)
    error_counts: Counter[str] = field(default_factory=Counter)
    field_errors: Counter[str] = field(default_factory=Counter)
    devices_skipped: Counter[str] = field(default_factory=Counter)
    stopped_by: str | None = None  # signal name when a signal ended the run

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("error_counts", "field_errors", "devices_skipped"):
            d[k] = dict(getattr(self, k))
        return d


class _Stop(BaseException):
    """Raised by the signal handler, only while the loop sleeps."""


class _SignalState:
    def __init__(self) -> None:
        self.signum: int | None = None
        self.sleeping = False

    def handler(self, signum: int, frame: object) -> None:
        self.signum = signum
        if self.sleeping:
            self.sleeping = False
            raise _Stop


def _safe_host(host: str) -> str:
    if not host or host.startswith(".") or "/" in host or "\\" in host or "\0" in host:
        raise ValueError(f"not usable as a folder name: host {host!r}")
    return host


def _lock(host_dir: Path) -> int:
    fd = os.open(host_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SamplerBusy(f"another NVML sampler is writing {host_dir} (lock {host_dir / LOCK_NAME})") from None
    return fd


def _remove_stale_temp_files(host_dir: Path) -> None:
    for tmp in host_dir.glob(f".{FILE_PREFIX}*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()
            log.info("removed %s left by an interrupted write", tmp.name)


def run_sampler(
    out_dir: Path,
    interval_s: float,
    iterations: int | None = None,
    flush_every: int = 10,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], dt.datetime] = _utcnow,
    *,
    host: str | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    handle_signals: bool = True,
) -> SamplerSummary:
    """Sample every ``interval_s`` seconds into daily files ``out_dir/nvml/HOST/nvml-YYYY-MM-DD.parquet``
    (UTC day), see the module docstring for the file-safety rules.

    ``iterations``: number of sampling attempts (``None``: until SIGTERM / SIGINT). ``sleep``,
    ``clock`` (aware UTC now) and ``monotonic`` are injectable for tests. Raises
    :class:`NvmlUnavailable` when NVML cannot be initialized at start (nothing is written) and
    :class:`SamplerBusy` when another sampler holds the host folder."""
    if not (interval_s >= 0 and math.isfinite(interval_s)):
        raise ValueError(f"interval_s must be a finite number >= 0, got {interval_s!r}")
    if flush_every < 1:
        raise ValueError(f"flush_every must be >= 1, got {flush_every!r}")
    if iterations is not None and iterations < 0:
        raise ValueError(f"iterations must be >= 0 or None, got {iterations!r}")
    host = _safe_host(host if host is not None else default_host())
    summary = SamplerSummary()
    session = NvmlSession()
    session.open()  # NvmlUnavailable before anything is created
    host_dir = Path(out_dir) / SUBDIR / host
    try:
        host_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = _lock(host_dir)
    except BaseException:
        session.close()
        raise
    writer = _DayWriter(host_dir, summary)
    state = _SignalState()
    previous: dict[int, Any] = {}
    failing = 0  # consecutive failed attempts
    try:
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, state.handler)
        _remove_stale_temp_files(host_dir)  # we hold the lock: no other writer is mid-write
        log.info("NVML sampler on %s: every %ss into %s", host, interval_s, host_dir)
        next_due = monotonic()
        while iterations is None or summary.attempts < iterations:
            if state.signum is not None:
                break
            summary.attempts += 1
            try:
                when = _as_utc(clock())
                if not session.ready:
                    session.open()
                table = session.sample(host, when)
            except Exception as exc:
                session.close()
                summary.errors += 1
                cause = exc.__cause__ if isinstance(exc, NvmlUnavailable) and exc.__cause__ else exc
                reason = _error_name(cause)  # e.g. DriverNotLoaded, also when nvmlInit failed again
                summary.error_counts[reason] += 1
                failing += 1
                if failing == 1:
                    log.warning("NVML sample failed (%s: %s); retrying nvmlInit every %ss",
                                reason, exc, interval_s, exc_info=not isinstance(exc, pynvml.NVMLError |
                                                                                 NvmlUnavailable))
                    writer.flush()  # something is wrong on this node: save what we have
                elif failing % 100 == 0:
                    log.warning("NVML still failing after %d attempts (%s: %s)", failing, reason, exc)
            else:
                if failing:
                    log.warning("NVML sampling recovered after %d failed attempts", failing)
                    failing = 0
                summary.samples += 1
                summary.rows += table.num_rows
                writer.add(when.date(), table)
                if writer.pending >= flush_every:
                    writer.flush()
            if state.signum is not None or (iterations is not None and summary.attempts >= iterations):
                break
            next_due += interval_s
            delay = next_due - monotonic()
            if delay < 0 and interval_s > 0:
                missed = math.ceil(-delay / interval_s)
                summary.missed_intervals += missed
                next_due += missed * interval_s
                delay = next_due - monotonic()
            state.sleeping = True
            try:
                sleep(max(0.0, delay))
            finally:
                state.sleeping = False
    except _Stop:
        pass
    finally:
        state.sleeping = False
        try:
            writer.flush()
            if writer.pending:
                summary.samples_lost += writer.pending
                log.error("could not write %s at exit; its last %d samples are lost", writer.path,
                          writer.pending)
        finally:
            session.close()
            for sig, old in previous.items():
                signal.signal(sig, old)
            os.close(lock_fd)  # frees the flock
            summary.field_errors.update(session.field_errors)
            summary.devices_skipped.update(session.skipped)
    if state.signum is not None:
        summary.stopped_by = signal.Signals(state.signum).name
        log.info("NVML sampler stopped by %s", summary.stopped_by)
    return summary


def main_collect_nvml(out_dir: Path | str, interval_s: float, iterations: int | None = None, *,
                      flush_every: int = 10, host: str | None = None) -> int:
    """``gpu-pipeline collect nvml --out DIR --interval SECONDS``: run the sampler until SIGTERM /
    SIGINT (or ``iterations`` attempts), print the summary as one JSON line on stdout.

    Exit codes: 0 ok (also after SIGTERM / SIGINT), 3 NVML unavailable at start (the reason on
    stderr, nothing written), 4 another sampler already writes this host's folder, 5 the folder
    cannot be written (at start: the reason on stderr) or samples were lost (``samples_lost`` in the
    summary: a supervisor must not read a full disk as success)."""
    try:
        summary = run_sampler(Path(out_dir), interval_s, iterations, flush_every=flush_every, host=host)
    except NvmlUnavailable as exc:
        print(f"gpu-pipeline collect nvml: {exc}", file=sys.stderr)
        return EXIT_NVML_UNAVAILABLE
    except SamplerBusy as exc:
        print(f"gpu-pipeline collect nvml: {exc}", file=sys.stderr)
        return EXIT_BUSY
    except OSError as exc:  # the folder (or its lock) cannot be made or written
        where = f" {exc.filename}" if exc.filename else ""
        print(f"gpu-pipeline collect nvml: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_NOT_WRITTEN
    print(json.dumps(summary.as_dict(), sort_keys=True))
    if summary.samples_lost:
        print(f"gpu-pipeline collect nvml: {summary.samples_lost} sample(s) could not be written "
              f"({summary.flush_errors} failed flush(es))", file=sys.stderr)
        return EXIT_NOT_WRITTEN
    return EXIT_OK
