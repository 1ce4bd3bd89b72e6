"""HTCondor job records -> the cleaned ``clean/jobs`` table (one row per job run).

Sources (DESIGN.md 4.2), all through one normalizer (:func:`normalize_docs`):

- ``elasticsearch``: ``_source`` documents fetched by :mod:`gpu_pipeline.lib.es_source`;
- ``ndjson``: files of one ``_source`` JSON object per line (what the simulator writes, or an
  export of an adstash index) -- :func:`read_ndjson`;
- ``es_export``: a JSON export of search hits (``{"hits": {"hits": [...]}}``, a bare list of hits,
  or one hit per line as elasticdump writes them) -- :func:`read_es_export`;
- ``condor_history``: ``condor_history -json`` / ``condor_q -json`` output (a JSON array of ads, a
  single ad, or one ad per line) -- :func:`read_condor_history_json`.

Documents come from condor_adstash, which indexes one document per job ad from the schedd history
and optionally one per job *epoch* (run attempt). Normalization rules:

- **Field names are matched case-insensitively.** adstash keeps known attributes' spelling
  (``NumJobStarts``), re-capitalizes pattern attributes (``RequestGPUs`` -> ``RequestGpus``) and
  lower-cases unknown ones (``RemoteOwner`` -> ``remoteowner``, ``NumVacates`` -> ``numvacates``).
  Where one document holds several spellings of an attribute (adstash multi-fields), the exact
  HTCondor spelling is tried first, then the others in document order.
- **Unset values**: JSON ``null``, ``""``, ``"undefined"``, adstash's ``"UNKNOWN"`` placeholders
  (host, slot, schedd), and unevaluated ClassAd expressions -- the ``"/Expr(...)/"`` strings of
  ``condor_q -json`` -- are unset (null). adstash stores an expression it cannot evaluate under
  ``<Attr>_EXPR``, a different field, so the attribute itself is simply absent.
- **Expressions kept as text**: ``RequireGPUs`` and ``Requirements`` (or their ``_EXPR`` fields) are
  the columns ``require_gpus`` and ``requirements``, the expression's text (``"/Expr(X)/"`` read as
  ``X``); the demand reads from them which device a job can use (:mod:`gpu_requirements`).
- **Dates** are epoch seconds (int, float or numeric string); ``0`` or negative means unset
  (``CompletionDate = 0`` for a job that has not completed, ``-1`` for transfers that never ran).
  ISO-8601 strings are accepted too (adstash's date mapping allows them); a naive one is UTC.
- **Numbers** may arrive as strings (``"4"``, ``"4.0"``). Integer columns accept integral floats only.
- A document that is not a JSON object, lacks a ``GlobalJobId`` string, is not a job ad
  (``MyType`` other than ``Job``; a GRACC ``JobUsageRecord``), or has a typed value that cannot be
  coerced (``JobStatus = "running"``, a non-finite float, an out-of-range integer or date) is
  **quarantined** with the reason -- never dropped silently, never a crash.
- **Exact duplicate documents** (the same JSON content, e.g. a file or an index read twice) are
  dropped and counted. Two different documents with the same key (``global_job_id``,
  ``run_index``, ``doc_kind``) -- e.g. the same job recorded twice as it progressed -- keep the one
  with the latest ``record_utc`` (ties: the later one read); the other is quarantined as
  ``duplicate_key``.

Per-row derivations:

- ``doc_kind`` is ``epoch`` when the document has ``EpochWriteDate`` or ``EpochAdType`` (adstash's
  epoch documents), else ``job`` (the final job ad, or a queue snapshot). Epoch-history records
  whose ``EpochAdType`` is not ``EPOCH`` (``SPAWN`` is written when a run starts; ``INPUT`` /
  ``OUTPUT`` / ``CHECKPOINT`` are transfers) do not describe a finished run and are quarantined as
  ``not_a_run_epoch``.
- ``run_index`` is the 0-based run: ``NumJobStarts - 1`` (else ``NumShadowStarts - 1``, else
  ``JobRunCount - 1``), 0 for a job that never started. For a ``job`` document it is the job's last
  run; for an ``epoch`` document the run the epoch describes, numbered by ``NumShadowStarts`` first
  (adstash keys an epoch on it: a shadow start whose executable never started, an input transfer
  failed, leaves ``NumJobStarts`` unchanged, and two epochs would share a run).
- ``run_start_utc`` = ``JobCurrentStartDate``, else ``JobStartDate``.
- ``run_end_utc`` (null when the run has not started):

  1. ``CompletionDate`` when set and not before the run start (the run completed);
  2. else ``LastVacateTime`` when not before the run start (the run was evicted/vacated; it is the
     end of the run even when the job was held or removed later);
  3. else, for a job that is still running (``JobStatus`` 2 Running, 6 Transferring Output,
     7 Suspended) in a ``job`` document: null (open run);
  4. else ``EpochWriteDate`` (epoch documents: written when the run ended);
  5. else ``EnteredCurrentStatus`` when the job has left the running states (held, removed, idle
     again): the time it entered that state;
  6. else null.

  A ``LastVacateTime`` before ``run_start_utc`` belongs to an earlier run and is ignored for
  ``run_end_utc`` (``last_vacate_utc`` still reports it).
- ``record_utc`` = ``RecordTime`` (added by adstash), else ``EpochWriteDate`` (epochs), else
  ``ServerTime`` (when ``condor_q -json`` ran), else ``CompletionDate``, else ``EnteredCurrentStatus``
  (what adstash derives RecordTime from).
- ``user`` = ``User`` (``owner@uid_domain``), else ``RemoteOwner`` -- the spelling slot snapshots
  use; ``owner`` = ``Owner``, else the part of ``user`` before ``@``.
- ``schedd`` = ``ScheddName``, else the part of ``GlobalJobId`` before the first ``#``;
  ``cluster_id``/``proc_id`` fall back to ``GlobalJobId`` (``schedd#cluster.proc#qdate``).
- ``host``/``slot`` = ``StartdName``/``StartdSlot``, else ``RemoteHost`` (a job that is running),
  else ``LastRemoteHost``, split at the last ``@`` (``slot1_3@gpu01`` -> ``slot1_3``, ``gpu01``;
  a glidein's ``slot1_2@glidein_1_2@node`` -> ``slot1_2@glidein_1_2``, ``node``). A document's own
  ``StartdSlot`` is kept as is (adstash writes the part before the *first* ``@`` there).
- ``assigned_gpus``: ``AssignedGPUs`` split on commas (a ClassAd list ``{ ... }`` or JSON list is
  accepted), each id normalized to the HTCondor short id ``GPU-xxxxxxxx`` (full UUIDs and the
  ``GPUs_GPU_xxxxxxxx`` reference form are shortened, MIG ids kept, a MIG reference
  ``GPUs_MIG_...`` read as its ``MIG-...`` id), joined with ``,``.
- ``first_start_utc`` is ``JobStartDate``, when the job's first run started (the end of its first
  queue wait, which the demand reads from a row of a later run where run 0 has none: adstash's job
  ads describe the last run only); ``last_job_status`` is ``LastJobStatus``, the status before the
  current one (a Removed job with ``LastJobStatus`` 5 was held, not idle, up to its removal).
- ``remote_wall_clock_s`` is HTCondor's cumulative ``RemoteWallClockTime`` (all runs so far), also
  on epoch rows; ``committed_time_s`` is ``CommittedTime`` (wall time of runs that were not
  lost to eviction -- compare the two for badput).

The table is sorted by its key, so the same input always gives the same bytes.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import itertools
import json
import math
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.lib.db import connect as db_connect
from gpu_pipeline.lib.gpu_requirements import ADSTASH_CUT, expression_text
from gpu_pipeline.lib.schemas import JOBS, QUARANTINE, TS
from gpu_pipeline.lib.slots import normalize_gpu_id

SOURCES: tuple[str, ...] = ("elasticsearch", "ndjson", "es_export", "condor_history")

#: HTCondor JobStatus codes (``condor_q`` / job ClassAd documentation).
JOB_STATUS_NAMES: dict[int, str] = {
    1: "Idle",
    2: "Running",
    3: "Removed",
    4: "Completed",
    5: "Held",
    6: "Transferring Output",
    7: "Suspended",
}
#: Statuses in which the current run is still going on (its end is unknown).
RUNNING_STATUSES = frozenset({2, 6, 7})



class QuarantinedDoc(NamedTuple):
    """A document set aside: where it came from, why, and the raw document (or line text)."""

    source: str  #: file path, or the source name for in-memory documents
    position: int  #: 1-based line number for line files, else 0-based element index
    reason: str  #: ``code: detail``; the code is what :attr:`NormalizeResult.quarantined_by_reason` counts
    raw: Any


@dataclass
class NormalizeResult:
    table: pa.Table
    quarantine: list[QuarantinedDoc] = field(default_factory=list)
    duplicates: int = 0  #: exact duplicate documents dropped
    docs_in: int = 0  #: documents (or lines) read
    #: documents not normalized because they lie outside the window (``window_s``)
    skipped_outside_window: int = 0

    @property
    def quarantined_by_reason(self) -> dict[str, int]:
        return dict(sorted(Counter(q.reason.split(":", 1)[0] for q in self.quarantine).items()))


class JobsFileError(ValueError):
    """A file that cannot be read at all (not JSON); the message names the file and the problem."""


class _BadValue(Exception):
    pass


class _NotJobAd(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Value coercion


_EXPR_RE = re.compile(r"^/Expr\(.*\)/$", re.DOTALL)
_UNSET_STRINGS = frozenset({"", "undefined", "null", "none"})
_PLACEHOLDERS = frozenset({"unknown", "unknown@unknown"})  # adstash's fill-ins for host/slot/schedd
_HOST_FIELDS = frozenset({"schedd_name", "startd_name", "startd_slot", "remote_host", "last_remote_host"})
_GJID_RE = re.compile(r"^(?P<schedd>[^#]*)#(?P<cluster>\d+)\.(?P<proc>\d+)#(?P<qdate>\d+)$")
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_MAX_EPOCH_S = 253402300799  # 9999-12-31T23:59:59Z


def _is_unset(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, str):
        s = v.strip()
        return s.lower() in _UNSET_STRINGS or (s.startswith("/Expr(") and bool(_EXPR_RE.match(s)))
    return False


def _to_float(v: Any, attr: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise _BadValue(f"{attr}={v!r} is not a number")
    try:
        x = float(v.strip()) if isinstance(v, str) else float(v)
    except (ValueError, OverflowError):
        raise _BadValue(f"{attr}={v!r} is not a number") from None
    if not math.isfinite(x):
        raise _BadValue(f"{attr}={v!r} is not finite")
    return x


def _to_int(v: Any, attr: str, bounds: tuple[int, int] = _INT64) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        n = v
    else:
        if isinstance(v, str):
            try:
                n = int(v.strip())
            except ValueError:
                n = None
        else:
            n = None
        if n is None:
            x = _to_float(v, attr)
            if x != round(x):
                raise _BadValue(f"{attr}={v!r} is not an integer")
            n = int(round(x))
    if not bounds[0] <= n <= bounds[1]:
        raise _BadValue(f"{attr}={v!r} is out of range")
    return n


def _to_epoch_us(v: Any, attr: str) -> int | None:
    """Epoch seconds (or ISO-8601 text) -> epoch microseconds; 0/negative (an ISO date at or before
    1970-01-01, e.g. ``0001-01-01``) -> None."""
    if isinstance(v, str) and not _looks_numeric(v):
        s = v.strip()
        try:
            t = dt.datetime.fromisoformat(s)
        except ValueError:
            raise _BadValue(f"{attr}={v!r} is not a date (epoch seconds or ISO-8601)") from None
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        us = (t - _EPOCH) // dt.timedelta(microseconds=1)
        return us if us > 0 else None  # as epoch seconds: 1970-01-01 or before is unset
    x = _to_float(v, attr)
    if x <= 0:
        return None
    if x > _MAX_EPOCH_S:
        raise _BadValue(f"{attr}={v!r} is not epoch seconds (after year 9999)")
    return int(round(x * 1_000_000))


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NUMERIC_RE = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


def _looks_numeric(s: str) -> bool:
    return bool(_NUMERIC_RE.match(s))


def _checked_text(s: str, attr: str) -> str:
    """``s``, if it can be stored (a lone surrogate, which JSON's ``\\ud800`` escapes can carry, cannot)."""
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise _BadValue(f"{attr}={_short(s)} is not valid Unicode (a lone surrogate)") from None
    return s


def _to_str(v: Any, attr: str) -> str:
    if isinstance(v, str):
        return _checked_text(v.strip(), attr)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    raise _BadValue(f"{attr}={_short(v)} is a {type(v).__name__}, expected a string")


# condor_adstash cuts a string attribute longer than 256 characters to its first 253 and "..."
# (ADSTASH_CUT; eight full GPU UUIDs are 327): the last id named is then a piece of one.


def _to_gpus(v: Any, attr: str) -> str | None:
    """The GPU ids of an AssignedGPUs value, normalized, comma-separated. A value adstash cut
    (ending in ``...``) loses its last, partial id: the ids before it are whole (the run's GPU count
    then comes from RequestGPUs, where larger)."""
    if isinstance(v, list):
        parts = [_to_str(x, attr) for x in v if not _is_unset(x)]
    else:
        s = _to_str(v, attr).strip()
        if s.startswith("{") and s.endswith("}"):
            s = s[1:-1]
        parts = s.split(",")
        if s.endswith(ADSTASH_CUT):
            parts = parts[:-1]
    ids = []
    for p in parts:
        g = normalize_gpu_id(p.strip().strip('"'))
        if g:
            ids.append(g)
    return ",".join(ids) or None


def _short(v: Any, n: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def _to_expr(v: Any, attr: str) -> str | None:
    """A ClassAd expression's text (:func:`gpu_requirements.expression_text`); None for undefined."""
    try:
        text = expression_text(v)
    except ValueError as exc:
        raise _BadValue(f"{attr}={_short(v)}: {exc}") from None
    return None if text is None else _checked_text(text, attr)


_COERCE = {
    "int": _to_int,
    "int32": lambda v, a: _to_int(v, a, _INT32),
    "float": _to_float,
    "date": _to_epoch_us,
    "str": _to_str,
    "gpus": _to_gpus,
    "expr": _to_expr,
}

#: name -> (kind, HTCondor attribute spellings in order of preference)
#: the fields a job document's run is numbered by, in order (the first one set and not 0), and an
#: epoch document's: its shadow start first (adstash's epoch identity: a shadow start whose
#: executable never started -- an input transfer failed -- leaves NumJobStarts as it was)
JOB_STARTS = ("num_job_starts", "num_shadow_starts", "job_run_count")
EPOCH_STARTS = ("num_shadow_starts", "num_job_starts", "job_run_count")
_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "cluster_id": ("int", ("ClusterId",)),
    "proc_id": ("int", ("ProcId",)),
    "owner": ("str", ("Owner",)),
    "user": ("str", ("User", "RemoteOwner")),
    "project": ("str", ("ProjectName",)),
    "acct_group": ("str", ("AcctGroup", "AccountingGroup")),
    "schedd_name": ("str", ("ScheddName",)),
    "job_status": ("int32", ("JobStatus",)),
    "qdate": ("date", ("QDate",)),
    "current_start": ("date", ("JobCurrentStartDate",)),
    "first_start": ("date", ("JobStartDate",)),
    "completion": ("date", ("CompletionDate",)),
    "entered": ("date", ("EnteredCurrentStatus",)),
    "epoch_write": ("date", ("EpochWriteDate",)),
    "record": ("date", ("RecordTime",)),
    "server_time": ("date", ("ServerTime",)),
    "startd_name": ("str", ("StartdName",)),
    "startd_slot": ("str", ("StartdSlot",)),
    "remote_host": ("str", ("RemoteHost",)),
    "last_remote_host": ("str", ("LastRemoteHost",)),
    "assigned_gpus": ("gpus", ("AssignedGPUs",)),
    "request_gpus": ("float", ("RequestGPUs",)),
    "num_job_starts": ("int32", ("NumJobStarts",)),
    "num_shadow_starts": ("int32", ("NumShadowStarts",)),
    "job_run_count": ("int32", ("JobRunCount",)),
    "num_vacates": ("int32", ("NumVacates",)),
    "last_vacate": ("date", ("LastVacateTime",)),
    "vacate_reason_code": ("int32", ("VacateReasonCode",)),
    "vacate_reason": ("str", ("VacateReason",)),
    "remote_wall_clock": ("float", ("RemoteWallClockTime",)),
    "committed_time": ("float", ("CommittedTime",)),
    "my_type": ("str", ("MyType",)),
    "epoch_ad_type": ("str", ("EpochAdType",)),
    "last_job_status": ("int32", ("LastJobStatus",)),
    "last_run_wall_clock": ("float", ("LastRemoteWallClockTime",)),
    "require_gpus": ("expr", ("RequireGPUs", "RequireGPUs_EXPR")),
    "requirements": ("expr", ("Requirements", "Requirements_EXPR")),
}


#: output column -> the field it is copied from (the other columns are derived in :func:`_row`)
COPIED_FIELDS: dict[str, str] = {
    "user": "user", "project": "project", "acct_group": "acct_group", "job_status": "job_status",
    "queued_utc": "qdate", "completion_utc": "completion", "assigned_gpus": "assigned_gpus",
    "request_gpus": "request_gpus", "num_job_starts": "num_job_starts", "num_vacates": "num_vacates",
    "last_vacate_utc": "last_vacate", "vacate_reason_code": "vacate_reason_code",
    "vacate_reason": "vacate_reason", "remote_wall_clock_s": "remote_wall_clock",
    "committed_time_s": "committed_time", "status_entered_utc": "entered",
    "require_gpus": "require_gpus", "requirements": "requirements", "last_job_status": "last_job_status",
    "first_start_utc": "first_start",
}

#: name -> (kind, coerce, ((attr, attr.lower()), ...)), precomputed for speed
_PLAN: dict[str, tuple[str, Any, tuple[tuple[str, str], ...]]] = {
    name: (kind, _COERCE[kind], tuple((a, a.lower()) for a in attrs)) for name, (kind, attrs) in _FIELDS.items()
}
_MIN_INT32, _MAX_INT32 = _INT32
_MIN_INT64, _MAX_INT64 = _INT64
_FLOAT_EXACT = 1 << 53  # an integer float() gives exactly; a larger one takes the coercion's checks


class _Doc:
    """Case-insensitive, multi-spelling view of one document."""

    __slots__ = ("doc", "lower", "multi")

    def __init__(self, doc: dict):
        self.doc = doc
        lower = {k.lower(): k for k in doc if isinstance(k, str)}
        self.lower = lower
        self.multi: dict[str, list[str]] | None = None
        if len(lower) != len(doc):  # several spellings of one attribute (or non-string keys)
            multi: dict[str, list[str]] = {}
            for k in doc:
                if isinstance(k, str):
                    multi.setdefault(k.lower(), []).append(k)
            self.multi = multi

    def has(self, attr: str) -> bool:
        return attr.lower() in self.lower

    def candidates(self, attr: str, attr_lower: str | None = None) -> list[Any]:
        al = attr_lower or attr.lower()
        if self.multi is not None:
            keys = self.multi.get(al)
            if not keys:
                return []
            if len(keys) > 1 and attr in keys:  # the exact HTCondor spelling first
                keys = [attr] + [k for k in keys if k != attr]
            return [self.doc[k] for k in keys]
        key = self.lower.get(al)
        return [] if key is None else [self.doc[key]]

    def get(self, name: str) -> Any:
        kind, coerce, attrs = _PLAN[name]
        for attr, al in attrs:
            if self.multi is None:
                key = self.lower.get(al)
                if key is None:
                    continue
                v = self.doc[key]
                # fast paths for the common, already-typed values
                t = type(v)
                if t is int:
                    if kind == "date":
                        if v <= 0:
                            continue
                        if v <= _MAX_EPOCH_S:
                            return v * 1_000_000
                    elif (kind == "int" and _MIN_INT64 <= v <= _MAX_INT64) or (
                            kind == "int32" and _MIN_INT32 <= v <= _MAX_INT32):
                        return v
                    elif kind == "float" and -_FLOAT_EXACT <= v <= _FLOAT_EXACT:
                        return float(v)
                elif t is str and kind == "str":
                    sv = v.strip()
                    if sv and sv[0] != "/" and sv.lower() not in _UNSET_STRINGS and not (
                        name in _HOST_FIELDS and sv.lower() in _PLACEHOLDERS
                    ):
                        return _checked_text(sv, attr)
                values = [v]
            else:
                values = self.candidates(attr, al)
            # an expression's "/Expr(...)/" is its value; any other attribute's is unset
            values = [x for x in values if (x is not None if kind == "expr" else not _is_unset(x))]
            if not values:
                continue
            errors = []
            for x in values:
                try:
                    out = coerce(x, attr)
                except _BadValue as exc:
                    errors.append(str(exc))
                    continue
                if out is None and kind in ("date", "expr"):
                    continue
                if kind == "str" and (not out or (name in _HOST_FIELDS and out.lower() in _PLACEHOLDERS)):
                    continue
                return out
            if errors:
                raise _BadValue(errors[0])
        return None


# ---------------------------------------------------------------------------------------------
# One document -> one row


def _split_remote(remote: str | None) -> tuple[str | None, str | None]:
    """``slot1_3@host`` -> (``slot1_3``, ``host``), split at the last '@'."""
    if not remote:
        return None, None
    slot, at, host = remote.rpartition("@")
    if not at:
        return None, remote or None
    return slot or None, host or None


def _gracc_like(doc: dict) -> bool:
    return doc.get("type") == "JobUsageRecord" or ("ProbeName" in doc and "RecordId" in doc)


#: The longest run a LastRemoteWallClockTime is read as (ten years): beyond it, a bad value.
MAX_RUN_S = 10 * 366 * 86400


def _run_end(kind: str, status: int | None, start: int | None, completion: int | None,
             last_vacate: int | None, epoch_write: int | None, entered: int | None,
             last_status: int | None = None, last_wall_s: float | None = None) -> int | None:
    if start is None:
        return None
    if completion is not None and completion >= start:
        return completion
    if last_vacate is not None and last_vacate >= start:
        return last_vacate
    if kind == "job" and (status is None or status in RUNNING_STATUSES):
        return None
    if kind == "epoch" and epoch_write is not None and epoch_write >= start:
        return epoch_write
    if status is None or status in RUNNING_STATUSES:
        return None
    # the job left the running states: EnteredCurrentStatus is when, unless it came to its status from
    # another one that is not running (held, then removed or released days later: that is the removal's
    # time), where the last run's wall time (LastRemoteWallClockTime) ends the run
    if last_status is not None and last_status not in RUNNING_STATUSES and last_wall_s is not None \
            and 0 <= last_wall_s <= MAX_RUN_S:
        return start + int(round(last_wall_s * 1_000_000))
    if entered is not None and entered >= start:
        return entered
    return None


def _row(raw: Any, source: str) -> dict:
    """Normalize one document; raises _NotJobAd / _BadValue with the reason."""
    if not isinstance(raw, dict):
        raise _NotJobAd(f"not_an_object: a JSON {type(raw).__name__}, expected an object")
    if _gracc_like(raw):
        raise _NotJobAd("not_a_job_ad: GRACC JobUsageRecord (OSG accounting record), not an HTCondor job ad")
    d = _Doc(raw)
    gj = [v for v in d.candidates("GlobalJobId") if not _is_unset(v)]
    if not gj:
        raise _NotJobAd("missing_global_job_id: no GlobalJobId")
    gjid = gj[0]
    if not isinstance(gjid, str):
        raise _NotJobAd(f"missing_global_job_id: GlobalJobId is a {type(gjid).__name__}, not a string")
    gjid = _checked_text(gjid.strip(), "GlobalJobId")
    try:
        my_type = d.get("my_type")
    except _BadValue:
        my_type = None
    if my_type and my_type.lower() != "job":
        raise _NotJobAd(f"not_a_job_ad: MyType={my_type!r}")
    try:
        epoch_type = d.get("epoch_ad_type")
    except _BadValue:
        epoch_type = "?"
    if epoch_type and epoch_type.upper() != "EPOCH":
        raise _NotJobAd(f"not_a_run_epoch: EpochAdType={epoch_type!r} (a run-start or transfer record, "
                        "not the record of a finished run)")

    v = {name: d.get(name) for name in _FIELDS}

    kind = "epoch" if (d.has("EpochWriteDate") or d.has("EpochAdType")) else "job"
    order = EPOCH_STARTS if kind == "epoch" else JOB_STARTS
    starts = next((n for n in (v[k] for k in order) if n), 0)
    run_index = max(starts - 1, 0)

    m = _GJID_RE.match(gjid)
    cluster_id = v["cluster_id"] if v["cluster_id"] is not None else (int(m["cluster"]) if m else None)
    proc_id = v["proc_id"] if v["proc_id"] is not None else (int(m["proc"]) if m else None)
    schedd = v["schedd_name"] or (gjid.split("#", 1)[0] if "#" in gjid else None) or None

    status = v["job_status"]
    start = v["current_start"] if v["current_start"] is not None else v["first_start"]
    end = _run_end(kind, status, start, v["completion"], v["last_vacate"], v["epoch_write"], v["entered"],
                   v["last_job_status"], v["last_run_wall_clock"])
    record = next(
        (t for t in (v["record"], v["epoch_write"] if kind == "epoch" else None, v["server_time"], v["completion"],
                   v["entered"])
         if t is not None),
        None,
    )

    host, slot = v["startd_name"], v["startd_slot"]
    if host is None or slot is None:
        remote = (v["remote_host"] if status in RUNNING_STATUSES else None) or v["last_remote_host"] or v["remote_host"]
        r_slot, r_host = _split_remote(remote)
        host = host if host is not None else r_host
        slot = slot if slot is not None else r_slot

    return {
        "global_job_id": gjid,
        "run_index": run_index,
        "doc_kind": kind,
        "cluster_id": cluster_id,
        "proc_id": proc_id,
        "owner": v["owner"] or (v["user"].split("@", 1)[0] if v["user"] else None),
        "schedd": schedd,
        "job_status_name": JOB_STATUS_NAMES.get(status) if status is not None else None,
        "run_start_utc": start,
        "run_end_utc": end,
        "record_utc": record,
        "host": host,
        "slot": slot,
        "is_backfill_slot": ("backfill" in slot.lower()) if slot else None,
        "source": source,
        **{col: v[name] for col, name in COPIED_FIELDS.items()},
    }


def canonical_json(doc: Any) -> str:
    """A document as canonical JSON text (sorted keys, no spaces, other values as ``str``): equal
    documents give equal text. The raw job-document table stores this text."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)


def _fingerprint(raw: Any) -> bytes:
    return text_fingerprint(canonical_json(raw))


def text_fingerprint(text: str) -> bytes:
    """The fingerprint of a document given as :func:`canonical_json` text."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


# ---------------------------------------------------------------------------------------------
# The normalizer


class _Item(NamedTuple):
    origin: str
    position: int
    doc: Any
    error: str | None = None  # a parse error found by the reader (quarantined as is)
    #: the document's fingerprint when the reader has it (e.g. from canonical JSON text); all items of
    #: one normalization have it or none do
    fingerprint: bytes | None = None
    #: the document's row in the normalizer's ``fast`` rows (:mod:`gpu_pipeline.lib.jobs_fast`), -1 for
    #: none; ``doc`` is then its JSON text, parsed only if the document is quarantined
    fast_index: int = -1
    #: judged outside the window by the caller (``doc`` is its JSON text, unparsed), with its
    #: ``GlobalJobId`` as the caller read it (None: not read)
    outside: bool = False
    job_id: str | None = None


def _raw_doc(item: _Item) -> Any:
    return json.loads(item.doc) if item.fast_index >= 0 else item.doc


def _outside_window(doc: Any, start_s: int, end_s: int) -> bool:
    """Whether a document's row could not overlap the window [start_s, end_s) (epoch seconds): its
    run and queue wait both start at or after ``end_s``, or its run started and completed before
    ``start_s`` (so did its queue wait). Read from the exact HTCondor attributes
    (``JobCurrentStartDate``, which the normalizer takes as the run start when set, ``QDate``,
    ``CompletionDate``, which it takes as the run end when not before the start) as positive epoch
    seconds; anything else answers False and the document is normalized in full."""
    if not isinstance(doc, dict):
        return False
    started = doc.get("JobCurrentStartDate")
    if type(started) is not int or not 0 < started <= _MAX_EPOCH_S:
        return False
    queued = doc.get("QDate")
    if started >= end_s and type(queued) is int and end_s <= queued <= _MAX_EPOCH_S:
        return True
    done = doc.get("CompletionDate")
    return type(done) is int and started <= done < start_s


def _normalize(items: Iterable[_Item], source: str, window_s: tuple[int, int] | None = None,
               fast: Any = None) -> NormalizeResult:
    """``window_s`` (epoch seconds): skip documents :func:`_outside_window` of it (counted, not
    normalized), and the items the caller judged outside (``_Item.outside``) -- unless a skipped
    document is a later record of a job whose row is kept: then it supersedes that row as it would
    without the window (a running snapshot of a job must not outlive the job's final record because
    that record lies outside the day); an earlier one is left skipped. ``fast``: a
    :class:`jobs_fast.FastRows` holding the rows of the items whose ``fast_index`` points into it
    (each as :func:`_row` gives it)."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; expected one of {SOURCES}")
    quarantine: list[QuarantinedDoc] = []
    seen: set[bytes] = set()
    duplicates = skipped = 0
    n_in = 0
    best: dict[tuple, tuple[tuple, dict | int, _Item]] = {}
    held: list[tuple[int, _Item]] = []  # skipped as outside the window, with their place in the input

    def take(item: _Item, seq: int, outside: bool) -> None:
        """``seq``: the item's place in the input, which breaks a tie of record times (the later
        read wins), the same for a held item as had it not been held."""
        nonlocal duplicates, skipped
        i = item.fast_index
        if outside and i < 0 and isinstance(item.doc, str):
            try:
                item = item._replace(doc=json.loads(item.doc), fingerprint=item.fingerprint or text_fingerprint(item.doc))
            except ValueError:
                return
        fp = item.fingerprint if item.fingerprint is not None else _fingerprint(item.doc)
        if fp in seen:
            if not outside:
                duplicates += 1
            return
        row: dict | int
        if i >= 0:
            row, key, record = i, fast.keys[i], fast.record_us[i]
        else:
            try:
                row = _row(item.doc, source)
            except _NotJobAd as exc:
                if not outside:
                    seen.add(fp)
                    quarantine.append(QuarantinedDoc(item.origin, item.position, str(exc), item.doc))
                return
            except _BadValue as exc:
                if not outside:
                    seen.add(fp)
                    quarantine.append(QuarantinedDoc(item.origin, item.position, f"bad_value: {exc}", item.doc))
                return
            key, record = (row["global_job_id"], row["run_index"], row["doc_kind"]), row["record_utc"]
        rank = (record if record is not None else -(2**63), seq)
        prev = best.get(key)
        if outside and (prev is None or rank <= prev[0]):
            return  # supersedes nothing this window keeps: left skipped
        seen.add(fp)
        if outside:
            skipped -= 1  # its row is kept (and the caller's window filter counts it)
        if prev is None:
            best[key] = (rank, row, item)
            return
        keep, drop = ((rank, row, item), prev) if rank > prev[0] else (prev, (rank, row, item))
        best[key] = keep
        quarantine.append(
            QuarantinedDoc(
                drop[2].origin,
                drop[2].position,
                "duplicate_key: superseded by a later document for the same "
                f"(global_job_id, run_index, doc_kind) = {key!r} from {keep[2].origin} #{keep[2].position}",
                _raw_doc(drop[2]),
            )
        )

    for item in items:
        n_in += 1
        if item.error is not None:
            quarantine.append(QuarantinedDoc(item.origin, item.position, item.error, item.doc))
            continue
        i = item.fast_index
        if item.outside or (window_s is not None
                            and (fast.outside[i] if i >= 0 else _outside_window(item.doc, *window_s))):
            skipped += 1
            held.append((n_in, item))
            continue
        take(item, n_in, outside=False)
    if held and best:
        kept = {key[0] for key in best}
        for seq, item in held:
            if _held_job_id(item, fast) in kept:
                take(item, seq, outside=True)
    rows = [best[k][1] for k in sorted(best)]
    return NormalizeResult(table=_rows_table(rows, fast), quarantine=quarantine, duplicates=duplicates,
                           docs_in=n_in, skipped_outside_window=skipped)


def _held_job_id(item: _Item, fast: Any) -> str | None:
    """The GlobalJobId of a document skipped as outside the window, as cheaply as it is known: its
    column row's key, the caller's read of it, else from the document (parsed if it is text)."""
    if item.fast_index >= 0:
        return fast.keys[item.fast_index][0]
    if item.job_id is not None:
        return item.job_id.strip()
    doc = item.doc
    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except ValueError:
            return None
    if not isinstance(doc, dict):
        return None
    ids = [v for v in _Doc(doc).candidates("GlobalJobId") if not _is_unset(v)]  # as _row reads it
    return ids[0].strip() if ids and isinstance(ids[0], str) else None


def _rows_table(rows: list[dict | int], fast: Any) -> pa.Table:
    """The table of ``rows`` in their order: dicts, or indexes into ``fast.table``."""
    dicts = [r for r in rows if isinstance(r, dict)]
    if len(dicts) == len(rows):
        return _to_table(rows)
    taken = fast.table.take(pa.array([r for r in rows if not isinstance(r, dict)], pa.int64()))
    if not dicts:
        return taken
    in_dicts, in_taken = itertools.count(), itertools.count(len(dicts))  # positions in the concatenation
    order = [next(in_dicts) if isinstance(r, dict) else next(in_taken) for r in rows]
    return pa.concat_tables([_to_table(dicts), taken]).take(pa.array(order, pa.int64()))


def _to_table(rows: list[dict]) -> pa.Table:
    schema = JOBS.schema
    cols = {f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in schema}
    return pa.Table.from_pydict(cols, schema=schema)


def normalize_docs(docs: Iterable[Any], source: str, *, origin: str | None = None) -> NormalizeResult:
    """Normalize job documents (``_source`` dicts or job ads) into the ``clean/jobs`` table.

    ``source`` is one of :data:`SOURCES` and fills the ``source`` column; quarantined documents
    name ``origin`` (default: the source) and their 0-based position in ``docs``.
    """
    where = origin or source
    return _normalize((_Item(where, i, d) for i, d in enumerate(docs)), source)


# ---------------------------------------------------------------------------------------------
# Offline readers


def _paths(path: str | Path | Iterable[str | Path]) -> list[Path]:
    if isinstance(path, (str, Path)):
        return [Path(path)]
    return [Path(p) for p in path]


def _open_text(path: Path, errors: str = "strict"):
    """The file's text (``.gz``: through gzip); a byte-order mark at its start is skipped, as editors
    on Windows write one."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", errors=errors, newline="")
    return open(path, encoding="utf-8-sig", errors=errors, newline="")  # noqa: SIM115


def _read_text(path: Path) -> str:
    try:
        with _open_text(path) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise JobsFileError(f"{path}: cannot read: {exc}") from exc


def _iter_ndjson(path: Path, unwrap_hits: bool) -> Iterator[_Item]:
    """The documents of a file of one JSON value a line. A line that is not JSON, or whose bytes are
    not UTF-8 (JSON text is UTF-8), is quarantined with its line number and the other lines are
    read; a file that cannot be read to its end (a truncated ``.gz``, an I/O error) raises
    :class:`JobsFileError` naming it and the last line read whole."""
    lineno = 0
    try:
        with _open_text(path, errors="surrogateescape") as fh:  # a bad byte stays in its line
            for lineno, line in enumerate(fh, start=1):
                text = line.strip()
                if not text:
                    continue
                if not text.isascii() and (bad := _first_undecodable(text)) is not None:
                    shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                    yield _Item(str(path), lineno, shown,
                                f"invalid_json: line {lineno}: not UTF-8 (byte {bad[1]:#04x} at column {bad[0]})")
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    yield _Item(str(path), lineno, text, f"invalid_json: line {lineno}: {exc.msg} (column {exc.colno})")
                    continue
                if unwrap_hits or (isinstance(obj, dict) and "_source" in obj and "_index" in obj):
                    yield from _hits(obj, str(path), lineno)
                else:
                    yield _Item(str(path), lineno, obj)
    except (OSError, EOFError, zlib.error) as exc:
        where = f" past line {lineno}" if lineno else ""
        raise JobsFileError(f"{path}: cannot read{where}: {exc}") from exc


def _first_undecodable(text: str) -> tuple[int, int] | None:
    """(1-based column, byte) of the first byte of ``text`` (read with ``surrogateescape``) that was
    not UTF-8, or None when it all was."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start + 1, ord(text[exc.start]) - 0xDC00
    return None


def read_ndjson(path: str | Path | Iterable[str | Path], source: str = "ndjson") -> NormalizeResult:
    """Read NDJSON files (one ``_source`` object per line; ``.gz`` allowed) through the normalizer.

    Several paths are normalized together (exact duplicates across files are dropped). A line that
    is not JSON is quarantined with its line number; a line holding a search hit
    (``{"_index", "_id", "_source"}``) is unwrapped.
    """
    paths = _paths(path)

    def items() -> Iterator[_Item]:
        for p in paths:
            yield from _iter_ndjson(p, unwrap_hits=False)

    return _normalize(items(), source)


def _hits(obj: Any, origin: str, position: int) -> Iterator[_Item]:
    """Documents of one export element: a search response, a hit, or a list of either."""
    if isinstance(obj, list):
        for i, el in enumerate(obj):
            yield from _hits(el, origin, i if position < 0 else position)
        return
    if isinstance(obj, dict):
        hits = obj.get("hits")
        if isinstance(hits, dict) and isinstance(hits.get("hits"), list):
            for i, h in enumerate(hits["hits"]):
                yield from _hits(h, origin, i if position < 0 else position)
            return
        if "_source" in obj:
            yield _Item(origin, position, obj["_source"])
            return
        if "_id" in obj or "_index" in obj:
            yield _Item(origin, position, obj, "not_a_hit: search hit without _source")
            return
    yield _Item(origin, position, obj, f"not_a_hit: a JSON {type(obj).__name__} that is not a search hit")


def _parse_json_values(text: str, path: Path) -> list[Any]:
    """All top-level JSON values of ``text`` (one value, or several concatenated / one per line)."""
    dec = json.JSONDecoder()
    values = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            return values
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise JobsFileError(
                f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from exc
        values.append(obj)


def _one_value_per_line(text: str) -> bool:
    """True for NDJSON: more than one non-blank line and the first one is a JSON value by itself."""
    lines = (ln for ln in text.splitlines() if ln.strip())
    first = next(lines, None)
    if first is None or next(lines, None) is None:
        return False
    try:
        json.loads(first)
    except json.JSONDecodeError:
        return False
    return True


def _export_items(p: Path) -> Iterator[_Item]:
    text = _read_text(p)
    if _one_value_per_line(text):
        yield from _iter_ndjson(p, unwrap_hits=True)
        return
    for obj in _parse_json_values(text, p):
        yield from _hits(obj, str(p), -1)


def _history_items(p: Path) -> Iterator[_Item]:
    pos = 0
    for obj in _parse_json_values(_read_text(p), p):
        for ad in obj if isinstance(obj, list) else [obj]:
            yield _Item(str(p), pos, ad)
            pos += 1


def file_items(path: str | Path) -> tuple[str, Iterator[_Item]]:
    """(source, documents) of one offline file, by its name: ``*.ndjson`` / ``*.jsonl`` (adstash
    ``_source`` lines), ``*.es.json`` (Elasticsearch export of hits), other ``*.json``
    (``condor_history -json``); each may be gzipped."""
    p = Path(path)
    name = p.name.lower().removesuffix(".gz")
    if name.endswith((".ndjson", ".jsonl")):
        return "ndjson", _iter_ndjson(p, unwrap_hits=False)
    if name.endswith(".es.json"):
        return "es_export", _export_items(p)
    if name.endswith(".json"):
        return "condor_history", _history_items(p)
    raise JobsFileError(f"{p}: not a job-record file (expected .ndjson, .jsonl, .es.json or .json)")


def normalize_items(items: Iterable[tuple], source: str,
                    window_s: tuple[int, int] | None = None, fast: Any = None) -> NormalizeResult:
    """Normalize (origin, position, document, parse_error[, fingerprint[, fast_index]]) tuples, e.g.
    rows of the raw table; ``window_s`` and ``fast``: see :func:`_normalize`; the rest: :class:`_Item`."""
    return _normalize((_Item(*it) for it in items), source, window_s, fast)


def read_es_export(path: str | Path | Iterable[str | Path]) -> NormalizeResult:
    """Read Elasticsearch exports of search hits through the normalizer (source ``es_export``).

    Accepted layouts: a search response ``{"hits": {"hits": [...]}}``, a bare JSON list of hits (or
    of responses), or one hit per line (elasticdump). Positions are hit indexes, or line numbers for
    one-hit-per-line files (where a broken line is quarantined with its line number). Hits of
    non-job records (e.g. GRACC ``JobUsageRecord`` accounting documents) are quarantined with the
    reason. A JSON document that does not parse raises :class:`JobsFileError`.
    """
    paths = _paths(path)
    return _normalize((it for p in paths for it in _export_items(p)), "es_export")


def read_condor_history_json(path: str | Path | Iterable[str | Path]) -> NormalizeResult:
    """Read ``condor_history -json`` / ``condor_q -json`` output (source ``condor_history``).

    The file is a JSON array of job ads; a single ad, several arrays, or one ad per line
    (``-jsonl``) are accepted too. ``"/Expr(...)/"`` values are unevaluated expressions (unset).
    Positions are 0-based ad indexes in the file. A file that is not JSON raises
    :class:`JobsFileError`.
    """
    paths = _paths(path)
    return _normalize((it for p in paths for it in _history_items(p)), "condor_history")


# ---------------------------------------------------------------------------------------------
# Helpers for the assets


def _ts_scalar(t: Any) -> pa.Scalar:
    if isinstance(t, dt.datetime):
        if t.tzinfo is None:
            raise ValueError(f"naive datetime {t!r}: pass a timezone-aware (UTC) time")
        return pa.scalar(t.astimezone(dt.UTC), type=TS)
    if isinstance(t, (int, float)):
        return pa.scalar(int(round(t * 1_000_000)), type=TS)
    raise TypeError(f"expected a timezone-aware datetime or epoch seconds, got {type(t).__name__}")


def close_superseded_runs(table: pa.Table) -> tuple[pa.Table, int]:
    """A run still open in its record (a ``condor_q`` snapshot of the job running: ``run_end_utc``
    null) that a later record of the job shows to be over. A later record (``record_utc`` after the
    open row's) of the same run that ends it -- an adstash epoch document of the run, the job's
    final history ad from another source: another key, so neither superseded the other -- ends it
    at that record's end (the latest such record's). The same run is the one that started at the
    open run's start with the same ``run_index`` or, across doc kinds, the same ``num_job_starts``
    (an epoch is numbered by its shadow start, which may be ahead of the job starts). Else, when
    the job's latest record is of a later run, the open run ends at that record's
    ``LastVacateTime`` when it lies within the open run (from its start to the later run's start),
    else at the later run's start. Left open, the run ran on every day after (the open end overlaps
    them) and was never an eviction. Returns the table and how many runs it closed."""
    if table.num_rows < 2 or not pc.any(pc.is_null(table["run_end_utc"])).as_py():
        return table, 0
    con = db_connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("_runs", table.append_column("_i", pa.array(range(table.num_rows), pa.int64())))
        # every row's end, in the table's order (a closed run's from the later record)
        out = con.sql("""
            WITH latest AS (
                SELECT global_job_id, arg_max(run_index, record_utc) AS k, arg_max(run_start_utc, record_utc) AS k_start,
                       arg_max(last_vacate_utc, record_utc) AS k_vacate, max(record_utc) AS k_record
                FROM _runs WHERE record_utc IS NOT NULL GROUP BY global_job_id
            ),
            same_run AS (
                SELECT o._i, arg_max(c.run_end_utc, (c.record_utc, c.run_end_utc)) AS s_end
                FROM _runs o JOIN _runs c
                  ON c.global_job_id = o.global_job_id AND c.run_start_utc = o.run_start_utc
                 AND (c.run_index = o.run_index OR c.num_job_starts = o.num_job_starts)
                WHERE o.run_end_utc IS NULL AND o.run_start_utc IS NOT NULL AND c.run_end_utc IS NOT NULL
                  AND c.record_utc IS NOT NULL AND (o.record_utc IS NULL OR c.record_utc > o.record_utc)
                GROUP BY o._i
            )
            SELECT CASE WHEN r.run_end_utc IS NOT NULL OR r.run_start_utc IS NULL THEN r.run_end_utc
                        WHEN s.s_end IS NOT NULL THEN s.s_end
                        WHEN r.run_index < l.k AND l.k_start > r.run_start_utc
                             AND (r.record_utc IS NULL OR r.record_utc < l.k_record)
                        THEN CASE WHEN l.k_vacate >= r.run_start_utc AND l.k_vacate <= l.k_start THEN l.k_vacate
                                  ELSE l.k_start END
                        END AS run_end
            FROM _runs r LEFT JOIN latest l USING (global_job_id) LEFT JOIN same_run s ON s._i = r._i
            ORDER BY r._i
        """).to_arrow_table()
    finally:
        con.close()
    ends = out["run_end"].cast(TS)
    closed = int(pc.sum(pc.and_(pc.is_null(table["run_end_utc"]), pc.is_valid(ends))).as_py() or 0)
    if not closed:
        return table, 0
    return table.set_column(table.schema.get_field_index("run_end_utc"), "run_end_utc", ends), closed


def jobs_overlapping(table: pa.Table, start_utc: Any, end_utc: Any) -> pa.Table:
    """Rows of a ``clean/jobs`` table whose run or queued interval overlaps ``[start_utc, end_utc)``.

    Run interval: ``[run_start_utc, run_end_utc)``, open-ended (``+inf``) while ``run_end_utc`` is
    null. Queued interval (first runs -- ``run_index`` 0 -- and jobs that never started):
    ``[queued_utc, run_start_utc)``; for a job that never started it ends at ``record_utc`` when the
    job has left the queue (Removed / Completed), else it is open-ended. A later run's wait after
    an eviction, ``[last_vacate_utc, run_start_utc)``, the first queue wait read from a later run's
    row, ``[queued_utc, first_start_utc)`` (``run_index`` > 0: a job ad describes the last run only),
    and the wait of a job removed or held after a run that did not complete, ``[run_end_utc,
    record_utc)``, count too: the demand of the days between reads them from there (a job evicted on
    the 1st and run again on the 6th was idle on the 4th, whose partitions held neither run).
    """
    s, e = _ts_scalar(start_utc), _ts_scalar(end_utc)
    if table.num_rows == 0:
        return table
    run_start = table["run_start_utc"]
    run_end = table["run_end_utc"]
    run_hit = pc.and_kleene(
        pc.and_kleene(pc.is_valid(run_start), pc.less(run_start, e)),
        pc.or_kleene(pc.is_null(run_end), pc.greater(run_end, s)),
    )
    queued = table["queued_utc"]
    left_queue = pc.is_in(table["job_status"], value_set=pa.array([3, 4], type=pa.int32()))
    queue_end = pc.if_else(
        pc.is_valid(run_start),
        run_start,
        pc.if_else(pc.fill_null(left_queue, False), table["record_utc"], pa.scalar(None, type=TS)),
    )
    first = pc.or_(pc.equal(table["run_index"], 0), pc.is_null(run_start))
    queue_hit = pc.and_kleene(
        pc.and_kleene(first, pc.and_kleene(pc.is_valid(queued), pc.less(queued, e))),
        pc.or_kleene(pc.is_null(queue_end), pc.greater(queue_end, s)),
    )
    # a later run's row carries the first wait (JobStartDate) for a job of which no row of run 0 is
    # among those read (adstash's job ads describe the last run); where run 0's row is read, it
    # carries the wait itself (each later run's row in every day of the wait was copies for nothing,
    # and a later run's row without the runs between reads as their waits' end)
    first_start = table["first_start_utc"]
    with_run0 = pc.unique(table["global_job_id"].filter(
        pc.and_(pc.equal(table["run_index"], 0), pc.is_valid(run_start))))
    first_wait_hit = pc.and_kleene(
        pc.and_kleene(pc.and_kleene(pc.greater(table["run_index"], 0),
                                    pc.invert(pc.is_in(table["global_job_id"], value_set=with_run0))),
                      pc.less(queued, first_start)),
        pc.and_kleene(pc.less(queued, e), pc.greater(first_start, s)),
    )
    queue_hit = pc.or_kleene(queue_hit, first_wait_hit)
    vacated = table["last_vacate_utc"]
    requeue_hit = pc.and_kleene(
        pc.and_kleene(pc.greater(table["run_index"], 0), pc.less(vacated, run_start)),
        pc.and_kleene(pc.less(vacated, e), pc.greater(run_start, s)),
    )
    gone = pc.and_kleene(pc.is_null(table["completion_utc"]),
                         pc.is_in(table["job_status"], value_set=pa.array([3, 5], type=pa.int32())))
    record = table["record_utc"]
    left_hit = pc.and_kleene(
        pc.and_kleene(gone, pc.less(run_end, record)),
        pc.and_kleene(pc.less(run_end, e), pc.greater(record, s)),
    )
    mask = pc.fill_null(pc.or_kleene(pc.or_kleene(run_hit, queue_hit), pc.or_kleene(requeue_hit, left_hit)), False)
    return table.filter(mask)


def quarantine_table(entries: Iterable[QuarantinedDoc], source_table: str = "jobs") -> pa.Table:
    """Quarantined documents in the shared ``quarantine`` schema (row as JSON, or the raw line)."""
    entries = list(entries)
    return pa.Table.from_pydict(
        {
            "source_table": [source_table] * len(entries),
            "reason": [q.reason for q in entries],
            "source_file": [q.source for q in entries],
            "source_row": [q.position for q in entries],
            "record_utc": [None] * len(entries),
            "row_json": [
                q.raw if isinstance(q.raw, str) else json.dumps(q.raw, sort_keys=True, default=str)
                for q in entries
            ],
        },
        schema=QUARANTINE.schema,
    )
