"""Live HTCondor slot snapshots appended to the monthly ``gpu_state`` archives (DESIGN.md 4.1).

The collector side of :mod:`gpu_pipeline.lib.condor_archive`: query a collector for the startd ads
of GPU slots, turn them into rows exactly the way CHTC's original collector script did, and append
one snapshot to ``gpu_state_YYYY-MM.db`` in the layout that ``condor_archive.read_window`` reads.

Transformation (:func:`ads_to_rows`), as in the original script
    * ``AvailableGPUs`` is a ClassAd list of references (``{ GPUs_GPU_b156e653, GPUs_GPU_c62b119c }``)
      or, in ``condor_status -json``, a list of ``"/Expr(GPUs_GPU_b156e653)/"`` strings. Each element
      is taken *unevaluated* (its text), ``GPUs_`` is stripped and ``_`` becomes ``-``
      (``GPU-b156e653``, ``MIG-0caf1ce3-fcd4-...``, ``GPU-MIG-3167``); the column is the ids joined
      with ``","`` (``""`` when the list is empty, NULL when the slot has no such attribute).
    * Slots whose Name contains "backfill" get ``AssignedGPUs := AvailableGPUs`` (the original
      matched case-sensitively; DESIGN 5.1 classifies tiers case-insensitively, so we do too).
    * ``AssignedGPUs`` (``"GPU-b156e653,GPU-b2c83767"``) is split on ``","`` and exploded: one row
      per (slot, GPU id). Ids get the same normalization (the original replaced ``GPU_`` by
      ``GPU-``). Differences from the original, all for inputs it crashed on or turned into junk
      rows: whitespace around ids is stripped (``DetectedGPUs`` style ``"GPU-a, GPU-b"``), empty
      and repeated ids are dropped, and a slot with no GPU id at all (CPU-only slot, a backfill
      partitionable slot whose AvailableGPUs is empty) gives **no row** instead of a row with an
      empty/NULL AssignedGPUs. A backfill slot without any AvailableGPUs attribute falls back to its
      own AssignedGPUs (the original raised KeyError there).
    * Nested per-GPU ads (``GPUs_GPU_<id> = [ Id = "GPU-..."; DeviceName = ...; GlobalMemoryMb = ... ]``,
      ``GPUs_MIG_<uuid> = [ id = "MIG-..."; ... ]``) are never columns. When the slot has no
      ``GPUs_DeviceName`` / ``GPUs_GlobalMemoryMb`` (hosts with mixed devices publish none), the
      value comes from the GPU's nested ad, else from the flat per-GPU attribute of older discovery
      output (``GPUs_GPU_<id>DeviceName``), else from the legacy ``CUDADeviceName`` /
      ``CUDAGlobalMemoryMb``.
    * Every other column is the evaluated attribute; an undefined or erroneous expression (or a
      missing attribute) is NULL. Partitionable, dynamic and static slots are treated alike.
    * An ad without a string ``Name`` and ``State`` is skipped and counted (``classad2`` turns a
      malformed old-syntax ad into an empty or truncated ad without raising).

Archive format (:func:`append_snapshot`)
    * SQLite file ``gpu_state_YYYY-MM.db`` (an existing ``.sqlite`` file of the month is appended to
      instead), table ``gpu_state`` in the pandas ``to_sql`` layout: no index, columns and declared
      types as :data:`ARCHIVE_COLUMNS`. ``timestamp`` is naive local text
      ``YYYY-MM-DD HH:MM:SS.ffffff`` in the configured *archive time zone* (default ``UTC``; give
      the zone of existing archives to continue them), identical for every row of a snapshot; the
      month of the file is the month of that local time. The reader localizes with the same zone
      (``read_window(..., source_tz=archive_tz)``) and resolves the repeated DST hour by append
      order, which an appending collector preserves.
    * One snapshot is one SQLite transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``), including any
      ``ALTER TABLE ... ADD COLUMN`` that brings an older file up to the known columns (unknown extra
      columns, e.g. the MIG-bug ``GPUs_MIG_*`` ones, are left NULL). A crash never leaves a half
      snapshot. A month's first snapshot is written to a hidden temporary file that is hard-linked
      into place only when complete, so a crash never leaves an empty or table-less monthly file.
      Existing rows are never rewritten, nothing is ever truncated.
    * Journal: SQLite's default rollback journal, not WAL. The file stays self-contained after every
      commit (safe to copy/rsync, works on NFS, readable by read-only users without ``-wal``/``-shm``
      side files). Trade-off: if the writer is killed inside a transaction, the ``-journal`` file it
      leaves is "hot" and read-only openers (the reader uses ``mode=ro``) fail until any read-write
      open rolls it back; the next :func:`append_snapshot` does that, and :func:`recover_archive`
      does it on demand. ``busy_timeout`` lets writer and readers wait for each other's locks.
    * Why not monthly Parquet: a Parquet file cannot be appended in place; every snapshot would
      rewrite the whole month (read, concatenate, atomic rename), which grows with the month and
      races with other writers. SQLite appends a snapshot transactionally in O(snapshot). An existing
      ``gpu_state_YYYY-MM.parquet`` without a SQLite file of that month makes us refuse to write
      (the reader prefers the ``.db`` of a month and would hide the Parquet rows).

Collector (:func:`query_collector`)
    ``htcondor2.Collector(host).query(AdType.Startd, constraint, projection=PROJECTION)``. A down
    collector fails at once; one that accepts and never answers blocks for ``QUERY_TIMEOUT``
    (default 60 s), so the query runs with ``_CONDOR_QUERY_TIMEOUT`` set to ``timeout_s`` (the
    previous value is restored afterwards). The bindings hold the GIL while they wait, so no Python
    thread can cut the wait shorter. HTCondor 25.14.1 connects with a timeout of at least 10 s, so a
    host that silently drops connection attempts fails after ``max(timeout_s, 10)`` s. Failures are
    :class:`CollectorError` naming the collector and the cause (refused, unresolvable, timed out,
    or connected-but-refused, probed with a plain TCP connect after the failure).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import logging
import math
import os
import re
import socket
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import classad2

from gpu_pipeline.lib import condor_archive
from gpu_pipeline.lib.envutil import scoped_env
from gpu_pipeline.lib.store import new_file

log = logging.getLogger(__name__)

TABLE = "gpu_state"
#: Archive columns and the SQL types pandas ``to_sql`` (SQLAlchemy) declares, in file order.
ARCHIVE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Name", "TEXT"),
    ("AssignedGPUs", "TEXT"),
    ("AvailableGPUs", "TEXT"),
    ("State", "TEXT"),
    ("GPUs_DeviceName", "TEXT"),
    ("GPUs_GlobalMemoryMb", "BIGINT"),
    ("PrioritizedProjects", "TEXT"),
    ("GPUsAverageUsage", "FLOAT"),
    ("Machine", "TEXT"),
    ("RemoteOwner", "TEXT"),
    ("GlobalJobId", "TEXT"),
    ("PreventJobsReason", "TEXT"),
    ("Disk", "BIGINT"),
    ("timestamp", "TIMESTAMP"),
)
COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in ARCHIVE_COLUMNS)
#: Columns without which a file is not a slot-state archive (the reader's own list).
REQUIRED_COLUMNS = condor_archive.REQUIRED_COLUMNS
_INT_COLUMNS = {"GPUs_GlobalMemoryMb", "Disk"}
_FLOAT_COLUMNS = {"GPUsAverageUsage"}
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f"

#: Startd attributes fetched from the collector: the archive columns, what identifies GPU slots
#: (GPUs, TotalGPUs, SlotType, PartitionableSlot, DynamicSlot, DetectedGPUs) and the legacy CUDA*
#: device attributes. Nested ``GPUs_GPU_<id>`` ads have per-host names and cannot be listed here;
#: :func:`query_collector` fetches them in a second, targeted query when a slot lacks device info.
PROJECTION: list[str] = [
    *condor_archive.SOURCE_COLUMNS,
    "GPUs",
    "TotalGPUs",
    "SlotType",
    "PartitionableSlot",
    "DynamicSlot",
    "DetectedGPUs",
    "CUDADeviceName",
    "CUDAGlobalMemoryMb",
]
#: Partitionable slots whose GPUs are all handed to dynamic slots have GPUs == 0 but keep TotalGPUs.
DEFAULT_CONSTRAINT = "TotalGPUs > 0 || GPUs >= 1"
DEFAULT_TIMEOUT_S = 20.0
DEFAULT_INTERVAL_S = 300.0
_CONDOR_PORT = 9618
_NESTED_QUERY_CHUNK = 50

# Exit codes for a CLI wrapping collect_once / collect_loop.
EXIT_OK = 0  #: every iteration appended a snapshot
EXIT_PARTIAL = 1  #: some iterations failed, at least one snapshot was appended
EXIT_COLLECTOR_DOWN = 3  #: nothing appended: the collector never answered
EXIT_ARCHIVE_ERROR = 4  #: the archive cannot be written (the loop stops at once) or only failed writes
EXIT_FAILED = 5  #: nothing appended: every iteration failed otherwise (the log has each error)
EXIT_INTERRUPTED = 130  #: stopped by KeyboardInterrupt (SIGINT)


class CollectorError(RuntimeError):
    """The collector could not be queried; the message names the collector and the cause."""


class ArchiveWriteError(RuntimeError):
    """The monthly archive could not be written; the message names the file and the problem.

    ``transient`` is True for conditions a later attempt may not meet (lock contention, I/O error,
    full disk, no free inode) and False for ones that need a person (not a database, missing required columns,
    read-only file, a Parquet archive that a new SQLite file would hide).
    """

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


# --------------------------------------------------------------------------------------------
# Parsing condor_status output
# --------------------------------------------------------------------------------------------

_EXPR_RE = re.compile(r"^/Expr\((.*)\)/$", re.S)
_ASSIGN_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=")
_BLANK_RE = re.compile(r"\n[ \t\r]*\n")


def parse_old_ads(text: str) -> list[classad2.ClassAd]:
    """Ads of ``condor_status -long`` text (old syntax, ads separated by blank lines).

    Each blank-line separated block is parsed on its own with ``ParserType.Old``, so one malformed
    ad cannot swallow the ones after it. A block that classad2 parses only partly (it stops at the
    first bad line and returns what came before, or an empty ad, without raising) is returned as an
    EMPTY ad and logged; :func:`ads_to_rows` skips and counts it.
    """
    ads: list[classad2.ClassAd] = []
    for block in _BLANK_RE.split(text.replace("\r\n", "\n")):
        lines = [ln for ln in block.split("\n") if ln.strip() and not ln.lstrip().startswith(("#", "//"))]
        if not lines:
            continue
        body = "\n".join(lines) + "\n"
        expected = set()
        malformed_line = None
        for ln in lines:
            m = _ASSIGN_RE.match(ln)
            if m:
                expected.add(m.group(1).lower())
            elif malformed_line is None:
                malformed_line = ln
        try:
            ad = classad2.parseOne(body, classad2.ParserType.Old)
        except (ValueError, classad2.ClassAdException) as exc:
            log.warning("unparseable ClassAd block starting %r: %s", lines[0][:80], exc)
            ads.append(classad2.ClassAd())
            continue
        got = {k.lower() for k in ad.keys()}
        if malformed_line is not None or not expected <= got:
            lost = sorted(expected - got)
            detail = f"line {malformed_line[:80]!r} is not an assignment" if malformed_line else (
                f"parsing stopped before {', '.join(lost[:5])}")
            log.warning("malformed ClassAd starting %r (%s); ad skipped", lines[0][:80], detail)
            ads.append(classad2.ClassAd())
            continue
        ads.append(ad)
    return ads


def parse_json_ads(text: str) -> list[classad2.ClassAd]:
    """Ads of ``condor_status -json`` output (a JSON array of objects; one object also accepted).

    ``ParserType.JSON`` cannot read the array, so the text is ``json.loads``-ed and each element
    converted with :func:`to_classad`. An element that is not an object becomes an EMPTY ad
    (skipped and counted by :func:`ads_to_rows`). Invalid JSON raises ``ValueError``.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"condor_status -json output is not valid JSON: {exc}") from exc
    items = doc if isinstance(doc, list) else [doc]
    out = []
    for item in items:
        out.append(to_classad(item) if isinstance(item, Mapping) else classad2.ClassAd())
    return out


def to_classad(obj: Mapping) -> classad2.ClassAd:
    """A ClassAd from a JSON-style mapping.

    Strings ``"/Expr(<expr>)/"`` (``condor_status -json``'s encoding of expressions; json.loads has
    already turned ``\\/`` into ``/``) become expressions, nested objects become nested ads, lists
    convert element-wise, ``None`` is undefined. An expression that does not parse is an error value.
    """
    ad = classad2.ClassAd()
    for key, value in obj.items():
        ad[str(key)] = _json_value(value)
    return ad


def _json_value(value):
    if isinstance(value, str):
        m = _EXPR_RE.match(value)
        if not m:
            return value
        try:
            return classad2.ExprTree(m.group(1))
        except (classad2.ClassAdException, ValueError):
            return classad2.Value.Error
    if isinstance(value, Mapping):
        return to_classad(value)
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# Ads -> rows
# --------------------------------------------------------------------------------------------


@dataclass
class AdConversion:
    """Result of :func:`convert_ads`."""

    rows: list[dict] = field(default_factory=list)
    slots: int = 0  #: valid slot ads (Name and State present)
    skipped_ads: int = 0  #: ads skipped as malformed (no Name/State) or unconvertible
    slots_without_gpus: int = 0  #: valid slot ads that named no GPU id (no rows)
    skipped_reasons: list[str] = field(default_factory=list)


def normalize_gpu_id(text: str) -> str:
    """``GPUs_GPU_b156e653`` -> ``GPU-b156e653``; ``GPUs_MIG_0caf_...`` -> ``MIG-0caf-...``."""
    s = text.strip().strip('"').strip()
    if s.startswith("GPUs_"):
        s = s[len("GPUs_"):]
    return s.replace("_", "-")


def _element_text(elem) -> str | None:
    if isinstance(elem, str):
        return elem
    if isinstance(elem, classad2.ExprTree):
        return str(elem).strip()
    if isinstance(elem, classad2.ClassAd):
        gid = _nested_id(elem)
        return gid
    if elem is None or isinstance(elem, classad2.Value):
        return None
    return str(elem)


def _gpu_ids(value) -> list[str]:
    """Normalized, de-duplicated GPU ids of an AssignedGPUs / AvailableGPUs value."""
    if value is None or isinstance(value, classad2.Value):
        return []
    if isinstance(value, str):
        parts: list[str | None] = list(value.split(","))
    elif isinstance(value, list | tuple):
        parts = [_element_text(e) for e in value]
    else:
        parts = [_element_text(value)]
    out: list[str] = []
    for p in parts:
        if p is None:
            continue
        gid = normalize_gpu_id(p)
        if gid and gid not in out:
            out.append(gid)
    return out


def _raw(ad: classad2.ClassAd, attr: str):
    """The attribute unevaluated where it is a list, evaluated otherwise; None when absent/undefined."""
    if attr not in ad:
        return None
    try:
        value = ad[attr]
        if isinstance(value, classad2.ExprTree):
            value = ad.eval(attr)
    except Exception:  # an attribute the bindings cannot convert is NULL
        return None
    if isinstance(value, classad2.Value):
        return None
    return value


def _scalar(ad: classad2.ClassAd, attr: str):
    value = _raw(ad, attr)
    if isinstance(value, classad2.ExprTree):
        return None
    return value


def _text(value) -> str | None:
    if value is None or isinstance(value, classad2.Value | classad2.ClassAd):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        parts = [_element_text(v) for v in value]
        return ",".join(p for p in parts if p is not None)
    return str(value)


_INT64 = (-(1 << 63), (1 << 63) - 1)  # what a SQLite INTEGER holds


def _int(value) -> int | None:
    """An integer column's value; None for a value that is not a number, not finite, or beyond what
    a SQLite INTEGER holds (``Disk = 1.0e20`` in one ad must not lose the snapshot's other rows)."""
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, int):
        try:
            f = float(value)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(f):
            return None
        value = int(round(f))
    return value if _INT64[0] <= value <= _INT64[1] else None


def _float(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _nested_id(sub: classad2.ClassAd) -> str | None:
    value = _scalar(sub, "Id")  # ClassAd attribute names are case-insensitive: Id / id
    return normalize_gpu_id(value) if isinstance(value, str) and value.strip() else None


def _nested_gpu_ads(ad: classad2.ClassAd) -> dict[str, classad2.ClassAd]:
    """GPU id -> nested per-GPU ad (``GPUs_GPU_<id>``, ``GPUs_MIG_<uuid>``)."""
    found: dict[str, classad2.ClassAd] = {}
    for key in ad.keys():
        if not key.lower().startswith("gpus_"):
            continue
        try:
            value = ad[key]
        except Exception:
            continue
        if not isinstance(value, classad2.ClassAd):
            continue
        for gid in (_nested_id(value), normalize_gpu_id(key)):
            if gid and gid not in found:
                found[gid] = value
    return found


def _device_attr_names(gpu_id: str) -> tuple[str, str, str]:
    """Slot attribute names that may carry one GPU's properties: nested ad, flat name, flat memory."""
    base = "GPUs_" + gpu_id.replace("-", "_")
    return base, base + "DeviceName", base + "GlobalMemoryMb"


class _DeviceInfo:
    """Per-GPU device name / memory when the slot-wide attributes are missing."""

    def __init__(self, ad: classad2.ClassAd):
        self.ad = ad
        self.slot_name = _text(_scalar(ad, "GPUs_DeviceName")) or None
        self.slot_memory = _int(_scalar(ad, "GPUs_GlobalMemoryMb"))
        self._nested: dict[str, classad2.ClassAd] | None = None

    def _nested_for(self, gpu_id: str) -> classad2.ClassAd | None:
        if self._nested is None:
            self._nested = _nested_gpu_ads(self.ad)
        return self._nested.get(gpu_id)

    def lookup(self, gpu_id: str) -> tuple[str | None, int | None]:
        name, memory = self.slot_name, self.slot_memory
        if name is not None and memory is not None:
            return name, memory
        nested = self._nested_for(gpu_id)
        _, flat_name, flat_mem = _device_attr_names(gpu_id)
        if name is None:
            candidates = [_scalar(nested, "DeviceName") if nested is not None else None,
                          _scalar(self.ad, flat_name), _scalar(self.ad, "CUDADeviceName")]
            name = next((_text(c) for c in candidates if _text(c)), None)
        if memory is None:
            candidates = [_scalar(nested, "GlobalMemoryMb") if nested is not None else None,
                          _scalar(self.ad, flat_mem), _scalar(self.ad, "CUDAGlobalMemoryMb")]
            memory = next((_int(c) for c in candidates if _int(c) is not None), None)
        return name, memory


def _slot_gpu_ids(ad: classad2.ClassAd, name: str) -> tuple[list[str], str | None]:
    """(exploded GPU ids, AvailableGPUs column text) of one slot."""
    available_raw = _raw(ad, "AvailableGPUs")
    has_available = "AvailableGPUs" in ad and available_raw is not None
    available = _gpu_ids(available_raw) if has_available else []
    available_text = ",".join(available) if has_available else None
    if "backfill" in name.lower() and has_available:
        return available, available_text
    return _gpu_ids(_raw(ad, "AssignedGPUs")), available_text


def convert_ads(
    ads: Iterable[classad2.ClassAd | Mapping], snapshot_time: dt.datetime
) -> AdConversion:
    """:func:`ads_to_rows` with counts of slots, skipped ads and GPU-less slots."""
    result = AdConversion()
    for index, raw_ad in enumerate(ads):
        try:
            ad = raw_ad if isinstance(raw_ad, classad2.ClassAd) else to_classad(raw_ad)
            name, state = _scalar(ad, "Name"), _scalar(ad, "State")
            if not isinstance(name, str) or not name or not isinstance(state, str) or not state:
                result.skipped_ads += 1
                result.skipped_reasons.append(f"ad #{index}: no Name/State (malformed or not a slot ad)")
                continue
            rows = _slot_rows(ad, name, state, snapshot_time)
        except Exception as exc:  # one odd ad must not lose the snapshot
            result.skipped_ads += 1
            result.skipped_reasons.append(f"ad #{index}: {type(exc).__name__}: {exc}")
            log.warning("skipping ad #%d: %s", index, exc)
            continue
        result.slots += 1
        if not rows:
            result.slots_without_gpus += 1
        result.rows.extend(rows)
    return result


def _slot_rows(ad: classad2.ClassAd, name: str, state: str, snapshot_time: dt.datetime) -> list[dict]:
    gpu_ids, available_text = _slot_gpu_ids(ad, name)
    if not gpu_ids:
        return []
    devices = _DeviceInfo(ad)
    base = {
        "Name": name,
        "AvailableGPUs": available_text,
        "State": state,
        "PrioritizedProjects": _text(_scalar(ad, "PrioritizedProjects")),
        "GPUsAverageUsage": _float(_scalar(ad, "GPUsAverageUsage")),
        "Machine": _text(_scalar(ad, "Machine")),
        "RemoteOwner": _text(_scalar(ad, "RemoteOwner")),
        "GlobalJobId": _text(_scalar(ad, "GlobalJobId")),
        "PreventJobsReason": _text(_scalar(ad, "PreventJobsReason")),
        "Disk": _int(_scalar(ad, "Disk")),
        "timestamp": snapshot_time,
    }
    rows = []
    for gid in gpu_ids:
        device_name, memory = devices.lookup(gid)
        row = {c: None for c in COLUMN_NAMES}
        row.update(base)
        row.update(AssignedGPUs=gid, GPUs_DeviceName=device_name, GPUs_GlobalMemoryMb=memory)
        rows.append(row)
    return rows


def ads_to_rows(ads: Iterable[classad2.ClassAd | Mapping], snapshot_time: dt.datetime) -> list[dict]:
    """Archive rows (one per slot and GPU) of startd ads, with ``timestamp = snapshot_time``.

    Keys are :data:`COLUMN_NAMES`. Accepts ``classad2.ClassAd`` objects (from the collector or
    :func:`parse_old_ads`) and mappings (``condor_status -json`` elements; see :func:`to_classad`).
    Ads without Name/State are skipped; use :func:`convert_ads` to get the counts.
    """
    return convert_ads(ads, snapshot_time).rows


# --------------------------------------------------------------------------------------------
# Collector query
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _query_timeout(htcondor2, timeout_s: float) -> Iterator[None]:
    """Run with ``QUERY_TIMEOUT = ceil(timeout_s)``; restore the previous setting afterwards."""
    try:
        with scoped_env("_CONDOR_QUERY_TIMEOUT", str(max(1, math.ceil(timeout_s)))):
            htcondor2.reload_config()
            yield
    finally:
        htcondor2.reload_config()


def _split_host(host: str) -> tuple[str, int] | None:
    """(hostname, port) of ``host[:port]`` or a sinful string ``<ip:port?...>``; None if unparseable."""
    h = host.strip()
    if h.startswith("<"):
        h = h[1:].split(">", 1)[0].split("?", 1)[0]
    if h.startswith("["):  # [v6]:port
        addr, _, rest = h[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif h.count(":") == 1:
        addr, port = h.split(":")
    else:
        addr, port = h, ""
    if not addr:
        return None
    try:
        return addr, int(port) if port else _CONDOR_PORT
    except ValueError:
        return None


def _probe(host: str, timeout_s: float) -> str:
    """Why a TCP connection to the collector fails (or that it does not)."""
    target = _split_host(host)
    if target is None:
        return f"'{host}' is not a host[:port] address"
    addr, port = target
    try:
        with socket.create_connection((addr, port), timeout=timeout_s):
            return (f"{addr}:{port} accepts TCP connections but the query failed "
                    "(not a collector, wrong port, or authorization/security refused)")
    except socket.gaierror as exc:
        return f"host name '{addr}' does not resolve ({exc.strerror or exc})"
    except ConnectionRefusedError:
        return f"connection refused by {addr}:{port} (nothing listening)"
    except TimeoutError:
        return f"no TCP connection to {addr}:{port} within {timeout_s:g} s"
    except OSError as exc:
        return f"cannot connect to {addr}:{port}: {exc.strerror or exc}"


def query_collector(
    host: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    constraint: str = DEFAULT_CONSTRAINT,
    *,
    projection: Sequence[str] = PROJECTION,
    fetch_nested: bool = True,
) -> list[classad2.ClassAd]:
    """Startd ads of GPU slots from the collector at ``host`` (``host[:port]`` or sinful string).

    Raises :class:`CollectorError` on any failure, within about ``timeout_s`` (see module doc).
    With ``fetch_nested``, slots that lack ``GPUs_DeviceName`` / ``GPUs_GlobalMemoryMb`` get their
    nested per-GPU ads in one more targeted query (failure there is logged, not raised).
    """
    if not host or not host.strip():
        raise CollectorError("no collector address given")
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    try:
        import htcondor2
    except ImportError as exc:  # pragma: no cover - the package is a dependency
        raise CollectorError(f"HTCondor collector {host}: htcondor2 bindings unavailable: {exc}") from exc

    started = time.monotonic()
    with _query_timeout(htcondor2, timeout_s):
        try:
            collector = htcondor2.Collector(host)
            ads = collector.query(htcondor2.AdType.Startd, constraint=constraint, projection=list(projection))
        except (htcondor2.HTCondorException, RuntimeError, ValueError, TypeError, OSError) as exc:
            elapsed = time.monotonic() - started
            if elapsed >= 0.9 * max(1.0, math.ceil(timeout_s)):
                cause = f"no answer within {elapsed:.1f} s (timeout {timeout_s:g} s)"
            else:
                cause = _probe(host, min(2.0, timeout_s))
            raise CollectorError(
                f"HTCondor collector {host}: startd query failed: {cause} [{type(exc).__name__}: {exc}]"
            ) from exc
        if fetch_nested:
            try:
                _fetch_nested_device_ads(htcondor2, collector, ads)
            except Exception as exc:  # device names are optional detail
                log.warning("collector %s: could not fetch nested GPU ads: %s", host, exc)
    return list(ads)


def nested_attrs_needed(ad: classad2.ClassAd) -> list[str]:
    """Per-GPU attribute names to fetch for a slot that lacks slot-wide device name or memory."""
    name = _scalar(ad, "Name")
    if not isinstance(name, str):
        return []
    if _scalar(ad, "GPUs_DeviceName") is not None and _scalar(ad, "GPUs_GlobalMemoryMb") is not None:
        return []
    ids, _ = _slot_gpu_ids(ad, name)
    out = []
    for gid in ids:
        out.extend(a for a in _device_attr_names(gid) if a not in ad and a not in out)
    return out


def _fetch_nested_device_ads(htcondor2, collector, ads: list[classad2.ClassAd]) -> None:
    wanted: dict[str, tuple[classad2.ClassAd, list[str]]] = {}
    for ad in ads:
        attrs = nested_attrs_needed(ad)
        if attrs:
            wanted[ad["Name"]] = (ad, attrs)
    names = list(wanted)
    for i in range(0, len(names), _NESTED_QUERY_CHUNK):
        chunk = names[i:i + _NESTED_QUERY_CHUNK]
        attrs = sorted({a for n in chunk for a in wanted[n][1]})
        constraint = " || ".join(f"Name == {classad2.quote(n)}" for n in chunk)
        for extra in collector.query(htcondor2.AdType.Startd, constraint=constraint, projection=["Name", *attrs]):
            target = wanted.get(_scalar(extra, "Name"))
            if target is None:
                continue
            ad = target[0]
            for key in extra.keys():
                if key not in ad:
                    ad[key] = extra.lookup(key)


# --------------------------------------------------------------------------------------------
# Archive writing
# --------------------------------------------------------------------------------------------


def _zone(archive_tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(archive_tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown archive time zone {archive_tz!r}") from exc


def local_timestamp(snapshot_time: dt.datetime, archive_tz: str = "UTC") -> str:
    """Naive local ``YYYY-MM-DD HH:MM:SS.ffffff`` of an aware instant in ``archive_tz``."""
    if snapshot_time.tzinfo is None or snapshot_time.utcoffset() is None:
        raise ValueError("snapshot_time must be timezone-aware (e.g. datetime.now(UTC))")
    return snapshot_time.astimezone(_zone(archive_tz)).strftime(TIMESTAMP_FORMAT)


def _exists(path: Path) -> bool:
    """``path.exists()``, a file-system refusal (a folder the collector may not enter: EACCES is no
    "does not exist" to ``Path.exists``) as an :class:`ArchiveWriteError` naming the path."""
    try:
        return path.exists()
    except OSError as exc:
        transient = exc.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT)
        raise ArchiveWriteError(f"{path}: cannot look at the archive: {exc.strerror or exc}",
                                transient=transient) from exc


def archive_path(archive_dir: Path, snapshot_time: dt.datetime, archive_tz: str = "UTC") -> Path:
    """The monthly SQLite file a snapshot goes to (an existing ``.sqlite`` of the month is kept)."""
    month = local_timestamp(snapshot_time, archive_tz)[:7]
    db = Path(archive_dir) / f"gpu_state_{month}.db"
    legacy = db.with_suffix(".sqlite")
    if not _exists(db) and _exists(legacy):
        return legacy
    return db


def create_table_sql() -> str:
    """``CREATE TABLE`` text in the layout SQLAlchemy emits for ``DataFrame.to_sql(index=False)``."""
    body = ", \n\t".join(f'"{name}" {typ}' for name, typ in ARCHIVE_COLUMNS)
    return f"CREATE TABLE {TABLE} (\n\t{body}\n)"


def _coerce(column: str, value):
    if column in _INT_COLUMNS:
        return _int(value)
    if column in _FLOAT_COLUMNS:
        return _float(value)
    return _text(value)


def _iter_params(rows: Sequence[Mapping], ts_text: str) -> Iterator[tuple]:
    """Insert parameters, in :data:`COLUMN_NAMES` order, one tuple per row."""
    data_cols = COLUMN_NAMES[:-1]
    for row in rows:
        yield (*(_coerce(c, row.get(c)) for c in data_cols), ts_text)


def _check_rows(rows: Sequence[Mapping], snapshot_time: dt.datetime) -> None:
    known = set(COLUMN_NAMES)
    for i, row in enumerate(rows):
        unknown = set(row) - known
        if unknown:
            raise ValueError(f"row {i} has columns the archive does not know: {sorted(unknown)}")
        ts = row.get("timestamp")
        if ts is not None and ts != snapshot_time:
            raise ValueError(f"row {i} has timestamp {ts!r}, not the snapshot's {snapshot_time!r}")


def _classify(path: Path, exc: sqlite3.Error) -> ArchiveWriteError:
    """Whether a failed append is worth retrying: a lock, a busy file, an I/O error or a full disk
    is; SQLite's "unable to open database file" (it could not create the journal) is when the
    folder's file system has no free inode or block left (the journal's ``open`` then failed with
    ENOSPC or a quota's EDQUOT, which SQLite does not pass on), else not (a read-only or forbidden
    folder)."""
    msg = str(exc)
    transient = any(s in msg.lower() for s in ("locked", "busy", "disk i/o", "full")) or (
        "unable to open" in msg.lower() and _no_room(path.parent))
    return ArchiveWriteError(f"{path}: cannot append to the slot-state archive: {msg}", transient=transient)


def _no_room(folder: Path) -> bool:
    """The folder's file system has no inode or no block left for this user (``statvfs``). One that
    keeps no count (btrfs, vfat, FUSE, a tmpfs without an inode limit report 0 of 0) has room as far
    as can be told: a refusal there is not a full disk."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return (st.f_files > 0 and st.f_favail == 0) or (st.f_blocks > 0 and st.f_bavail == 0)


def _fsync(path: Path) -> None:
    flags = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if path.is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_transaction(con: sqlite3.Connection, path: Path, rows: Sequence[Mapping], ts_text: str) -> None:
    """Schema check/upgrade and the inserts of one snapshot, in one transaction."""
    con.execute("BEGIN IMMEDIATE")
    try:
        info = con.execute(f"PRAGMA table_info({TABLE})").fetchall()
        if not info:
            con.execute(create_table_sql())
        else:
            present = {r[1].lower() for r in info}
            missing_required = [c for c in REQUIRED_COLUMNS if c.lower() not in present]
            if missing_required:
                raise ArchiveWriteError(
                    f"{path}: table '{TABLE}' lacks required columns {missing_required}; "
                    "not a slot-state archive, refusing to write"
                )
            for name, typ in ARCHIVE_COLUMNS:
                if name.lower() not in present:
                    con.execute(f'ALTER TABLE {TABLE} ADD COLUMN "{name}" {typ}')
                    log.info("%s: added column %s %s", path, name, typ)
        cols = ", ".join(f'"{c}"' for c in COLUMN_NAMES)
        marks = ", ".join("?" for _ in COLUMN_NAMES)
        con.executemany(f"INSERT INTO {TABLE} ({cols}) VALUES ({marks})", _iter_params(rows, ts_text))
        con.execute("COMMIT")
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise


def _connect(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    con = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    con.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    return con


def _append_existing(path: Path, rows: Sequence[Mapping], ts_text: str, busy_timeout_s: float) -> None:
    try:
        con = _connect(path, busy_timeout_s)
    except sqlite3.Error as exc:
        raise _classify(path, exc) from exc
    try:
        _write_transaction(con, path, rows, ts_text)
    except sqlite3.Error as exc:
        raise _classify(path, exc) from exc
    finally:
        con.close()


def _create_new(path: Path, rows: Sequence[Mapping], ts_text: str, busy_timeout_s: float) -> None:
    """First snapshot of a month: build the file aside, then link it into place when complete. A
    folder that cannot be written is an :class:`ArchiveWriteError` (transient only when full or
    failing: a read-only or forbidden folder needs a person)."""
    try:
        _create_new_file(path, rows, ts_text, busy_timeout_s)
    except OSError as exc:
        if exc.errno is None:  # not the file system's answer
            raise
        transient = exc.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT)
        raise ArchiveWriteError(f"{path}: cannot create the month's archive in {path.parent}: "
                                f"{exc.strerror or exc}", transient=transient) from exc


def _create_new_file(path: Path, rows: Sequence[Mapping], ts_text: str, busy_timeout_s: float) -> None:
    # a name of its own (two writers of one PID, e.g. containers sharing a volume, must not share
    # it); SQLite takes the empty file for an empty database
    fd, tmp = new_file(path.parent, f".{path.name}.partial-")
    os.close(fd)
    try:
        con = _connect(tmp, busy_timeout_s)
        try:
            _write_transaction(con, tmp, rows, ts_text)
        finally:
            con.close()
    except sqlite3.Error as exc:
        tmp.unlink(missing_ok=True)
        raise _classify(path, exc) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync(tmp)
    try:
        os.link(tmp, path)  # fails if another writer created the month meanwhile: never clobber
    except FileExistsError:
        tmp.unlink(missing_ok=True)
        _append_existing(path, rows, ts_text, busy_timeout_s)
        return
    except OSError:  # no hard links on this file system
        if path.exists():
            tmp.unlink(missing_ok=True)
            _append_existing(path, rows, ts_text, busy_timeout_s)
            return
        os.replace(tmp, path)
    else:
        tmp.unlink(missing_ok=True)
    _fsync(path.parent)


def append_snapshot(
    archive_dir: Path,
    rows: list[dict],
    snapshot_time: dt.datetime,
    archive_tz: str = "UTC",
    *,
    busy_timeout_s: float = 30.0,
) -> Path:
    """Append one snapshot's rows to the monthly archive in one transaction; returns the file.

    Every row gets ``timestamp`` = ``snapshot_time`` as naive local text in ``archive_tz`` (rows may
    carry the same instant under ``timestamp``, or none). Creates the directory, file and table when
    needed; adds missing known columns to older files. With no rows the file and table still exist
    afterwards (an empty snapshot leaves no other trace: the format has no snapshot table).
    """
    archive_dir = Path(archive_dir)
    ts_text = local_timestamp(snapshot_time, archive_tz)
    _check_rows(rows, snapshot_time)
    path = archive_path(archive_dir, snapshot_time, archive_tz)
    parquet = archive_dir / f"gpu_state_{ts_text[:7]}.parquet"
    if not _exists(path) and _exists(parquet):
        raise ArchiveWriteError(
            f"{parquet} exists: a new {path.name} would hide its rows from the reader (which prefers "
            "the SQLite file of a month); move the Parquet archive away or collect into another directory"
        )
    try:
        archive_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArchiveWriteError(f"{archive_dir}: cannot create the archive directory: {exc}") from exc
    if _exists(path):
        _append_existing(path, rows, ts_text, busy_timeout_s)
    else:
        _create_new(path, rows, ts_text, busy_timeout_s)
    return path


def recover_archive(path: Path, busy_timeout_s: float = 30.0) -> bool:
    """Roll back the hot journal a killed writer left next to ``path``; True if there was one.

    A writer killed after its transaction spilled pages into the database file leaves a "hot"
    ``-journal``; read-only openers cannot roll it back (SQLite answers "attempt to write a readonly
    database"), any read-write open does, as the next :func:`append_snapshot` would. A writer killed
    earlier leaves at most a journal with a zeroed header, which readers ignore (returns False).
    """
    journal = Path(f"{path}-journal")
    try:
        with journal.open("rb") as fh:
            hot = fh.read(8) == _JOURNAL_MAGIC
    except FileNotFoundError:
        return False
    if not hot:
        return False
    con = _connect(Path(path), busy_timeout_s)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchall()
    finally:
        con.close()
    return not journal.exists()


_JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")


# --------------------------------------------------------------------------------------------
# Collection runs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CollectResult:
    rows: int  #: rows appended
    slots: int  #: valid slot ads received
    skipped_ads: int  #: malformed ads skipped
    path: Path  #: the monthly archive written
    snapshot_time: dt.datetime  #: UTC instant of the snapshot
    slots_without_gpus: int = 0


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


QueryFn = Callable[..., list]


def collect_once(
    collector: str,
    archive_dir: str | Path,
    archive_tz: str = "UTC",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    constraint: str = DEFAULT_CONSTRAINT,
    query: QueryFn | None = None,
    now: Callable[[], dt.datetime] | None = None,
) -> CollectResult:
    """Query the collector once and append the snapshot.

    The snapshot time is taken when the query has returned (as the original script did).
    ``query`` (default :func:`query_collector`) and ``now`` are injectable for tests.
    Raises :class:`CollectorError` / :class:`ArchiveWriteError`.
    """
    _zone(archive_tz)  # a configuration error surfaces before the collector is contacted
    ads = (query or query_collector)(collector, timeout_s=timeout_s, constraint=constraint)
    snapshot_time = (now or _utcnow)()
    conv = convert_ads(ads, snapshot_time)
    path = append_snapshot(Path(archive_dir), conv.rows, snapshot_time, archive_tz)
    if conv.skipped_ads:
        log.warning("collector %s: skipped %d malformed ads: %s", collector, conv.skipped_ads,
                    "; ".join(conv.skipped_reasons[:5]))
    log.info("collector %s: %d slots -> %d rows appended to %s at %s", collector, conv.slots,
             len(conv.rows), path, snapshot_time.isoformat())
    return CollectResult(
        rows=len(conv.rows), slots=conv.slots, skipped_ads=conv.skipped_ads, path=path,
        snapshot_time=snapshot_time, slots_without_gpus=conv.slots_without_gpus,
    )


def exit_code_for(exc: BaseException) -> int:
    """Exit code for a failed :func:`collect_once` (``--once``)."""
    if isinstance(exc, CollectorError):
        return EXIT_COLLECTOR_DOWN
    if isinstance(exc, ArchiveWriteError):
        return EXIT_ARCHIVE_ERROR
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_PARTIAL


@dataclass
class LoopResult:
    iterations: int = 0
    successes: int = 0
    failures: int = 0
    collector_failures: int = 0
    archive_failures: int = 0
    consecutive_failures: int = 0
    last_result: CollectResult | None = None
    errors: deque = field(default_factory=lambda: deque(maxlen=100))  #: latest error messages
    stopped_reason: str | None = None  #: set when a permanent archive error ended the loop
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.stopped_reason is not None:
            return EXIT_ARCHIVE_ERROR
        if self.failures == 0:
            return EXIT_OK
        if self.successes:
            return EXIT_PARTIAL
        if self.collector_failures == self.failures:
            return EXIT_COLLECTOR_DOWN
        if self.archive_failures:
            return EXIT_ARCHIVE_ERROR
        return EXIT_FAILED  # nothing written: not the "some written" of EXIT_PARTIAL


def _ads_time(ads: list) -> dt.datetime | None:
    """When the collector answered the dump's query: the latest ``LastHeardFrom`` of its ads (the
    collector's clock), else the latest ``MyCurrentTime`` (each startd's own), or None."""
    for attr in ("LastHeardFrom", "MyCurrentTime"):
        times = [float(v) for ad in ads if isinstance(ad, classad2.ClassAd)
                 for v in [_scalar(ad, attr)] if isinstance(v, int | float) and not isinstance(v, bool) and v > 0]
        if times:
            return dt.datetime.fromtimestamp(max(times), tz=dt.UTC)
    return None


def _holds_snapshot(path: Path, ts_text: str) -> bool:
    """Whether the month file ``path`` holds rows stamped ``ts_text`` (one indexed-free query of the
    timestamp text; no file: False). An unreadable file raises :class:`ArchiveWriteError`."""
    if not _exists(path):
        return False
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            return con.execute("SELECT 1 FROM gpu_state WHERE timestamp = ? LIMIT 1", (ts_text,)).fetchone() is not None
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise ArchiveWriteError(f"{path}: cannot read the archive to check for the snapshot: {exc}") from exc


def import_dump(
    path: str | Path,
    archive_dir: str | Path,
    archive_tz: str = "UTC",
    snapshot_time: dt.datetime | None = None,
) -> CollectResult:
    """Append a saved ``condor_status -long`` (old ClassAd syntax) or ``condor_status -json`` dump as
    one snapshot of the monthly archive, as :func:`collect_once` appends a live query: the way to
    bring dumps taken before the collector ran into the archive. ``snapshot_time`` (aware) is when
    the dump was taken; None: the ads' own time (the latest ``LastHeardFrom``, the collector's clock,
    else ``MyCurrentTime``; ``condor_status -long`` prints both), else the file's modification time,
    with a warning (a copy's is the copy's). The format is told by the text (a JSON array or object, else old syntax).
    A snapshot time the archive already holds is refused (the dump imported twice). Raises
    ValueError naming the file for an unreadable dump, a naive time or a repeated snapshot."""
    path = Path(path)
    _zone(archive_tz)
    if snapshot_time is not None and snapshot_time.tzinfo is None:
        raise ValueError(f"{path}: snapshot time {snapshot_time.isoformat()} has no time zone")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        ads = parse_json_ads(text) if text.lstrip().startswith(("[", "{")) else parse_old_ads(text)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if snapshot_time is None:
        mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, tz=dt.UTC)
        snapshot_time = _ads_time(ads)
        if snapshot_time is None:
            snapshot_time = mtime
            log.warning("%s: no LastHeardFrom / MyCurrentTime in the ads: the snapshot is taken at the file's "
                        "modification time, %s (a copy's time, if the file was copied without it)",
                        path, snapshot_time.isoformat())
        elif snapshot_time > mtime + dt.timedelta(hours=1):
            log.warning("%s: the ads' time %s is after the file was last written (%s): a clock ahead? give "
                        "--snapshot-time", path, snapshot_time.isoformat(), mtime.isoformat())
    conv = convert_ads(ads, snapshot_time)
    if not conv.slots:
        raise ValueError(f"{path}: no slot ad (an ad with Name and State) in the dump"
                         + (f"; skipped: {'; '.join(conv.skipped_reasons[:3])}" if conv.skipped_reasons else ""))
    if _holds_snapshot(archive_path(Path(archive_dir), snapshot_time, archive_tz),
                       local_timestamp(snapshot_time, archive_tz)):
        raise ValueError(f"{path}: the archive already holds a snapshot at {snapshot_time.isoformat()} (this dump "
                         "imported before, or another taken within one collector update: give --snapshot-time); "
                         "nothing appended")
    archive = append_snapshot(Path(archive_dir), conv.rows, snapshot_time, archive_tz)
    if conv.skipped_ads:
        log.warning("%s: skipped %d malformed ads: %s", path, conv.skipped_ads, "; ".join(conv.skipped_reasons[:5]))
    log.info("%s: %d slots -> %d rows appended to %s at %s", path, conv.slots, len(conv.rows), archive,
             snapshot_time.isoformat())
    return CollectResult(rows=len(conv.rows), slots=conv.slots, skipped_ads=conv.skipped_ads, path=archive,
                         snapshot_time=snapshot_time, slots_without_gpus=conv.slots_without_gpus)


def collect_loop(
    collector: str,
    archive_dir: str | Path,
    archive_tz: str = "UTC",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    iterations: int | None = None,
    sleep: Callable[[float], object] = time.sleep,
    *,
    constraint: str = DEFAULT_CONSTRAINT,
    query: QueryFn | None = None,
    now: Callable[[], dt.datetime] | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> LoopResult:
    """Collect every ``interval_s`` seconds (start to start), ``iterations`` times or forever.

    A failing collector is logged and counted and the next interval retries; so are transient
    archive errors and unexpected exceptions. A permanent :class:`ArchiveWriteError` stops the loop
    (retrying cannot help). KeyboardInterrupt ends it (``interrupted``). See
    :attr:`LoopResult.exit_code` for the process exit code.
    """
    _zone(archive_tz)
    if interval_s < 0:
        raise ValueError(f"interval_s must be >= 0, got {interval_s!r}")
    if iterations is not None and iterations < 0:
        raise ValueError(f"iterations must be >= 0, got {iterations!r}")
    result = LoopResult()
    try:
        while iterations is None or result.iterations < iterations:
            started = monotonic()
            result.iterations += 1
            try:
                res = collect_once(collector, archive_dir, archive_tz, timeout_s,
                                   constraint=constraint, query=query, now=now)
            except CollectorError as exc:
                result.collector_failures += 1
                _failed(result, exc, interval_s)
            except ArchiveWriteError as exc:
                result.archive_failures += 1
                _failed(result, exc, interval_s)
                if not exc.transient:
                    result.stopped_reason = str(exc)
                    log.error("stopping: the archive cannot be written: %s", exc)
                    break
            except Exception as exc:  # keep the service alive, but say so loudly
                log.exception("unexpected error in collection run %d", result.iterations)
                _failed(result, exc, interval_s)
            else:
                result.successes += 1
                result.consecutive_failures = 0
                result.last_result = res
            if iterations is not None and result.iterations >= iterations:
                break
            sleep(max(0.0, interval_s - (monotonic() - started)))
    except KeyboardInterrupt:
        result.interrupted = True
        log.info("collection loop interrupted after %d runs", result.iterations)
    return result


def _failed(result: LoopResult, exc: BaseException, interval_s: float) -> None:
    result.failures += 1
    result.consecutive_failures += 1
    result.errors.append(str(exc))
    log.error("collection run %d failed (%d failures, %d in a row; next try in %g s): %s",
              result.iterations, result.failures, result.consecutive_failures, interval_s, exc)
