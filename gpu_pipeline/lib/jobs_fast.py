"""Job documents normalized over columns: the rows :func:`jobs._row` gives, for documents given as
:func:`jobs.canonical_json` text (what ``raw/job_documents`` holds).

Arrow's JSON reader splits the documents into one column per top-level key; each wanted attribute is
then read by the row rules of :mod:`gpu_pipeline.lib.jobs` -- integers with numpy, text and other
values once per distinct value through the very coercion functions ``_row`` uses. A document is left
to ``_row`` itself (``slow``) whenever it might not take the plain way through those rules: it is not
an ASCII JSON object on one line without ``\\u`` escapes, one of its values would be quarantined or
needs a closer look (a bad number, a value of a type the rules read otherwise, a list), it holds two
spellings of one wanted attribute or an epoch attribute set to null (present, which Arrow cannot
tell from absent), or it is not a plain job ad (GRACC record, ``MyType`` other than ``Job``, a
non-``EPOCH`` epoch ad, no usable ``GlobalJobId``). A set of documents the reader cannot put into
columns at all (a key that holds a number in one document and text in another) is left to ``_row``
whole. So the rows are ``_row``'s, exactly; ``test_jobs_fast.py`` checks it on documents built to
take every turn of the rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from gpu_pipeline.lib.jobs import (
    _COERCE,
    _FIELDS,
    _GJID_RE,
    _HOST_FIELDS,
    _INT32,
    _MAX_EPOCH_S,
    _PLACEHOLDERS,
    COPIED_FIELDS,
    EPOCH_STARTS,
    JOB_STARTS,
    JOB_STATUS_NAMES,
    MAX_RUN_S,
    RUNNING_STATUSES,
    _BadValue,
    _is_unset,
    _split_remote,
)
from gpu_pipeline.lib.schemas import JOBS, conform

_UNSET, _VALUE, _SLOW = 0, 1, 2
_TYPES = {"date": pa.int64(), "int": pa.int64(), "int32": pa.int32(), "float": pa.float64(),
          "str": pa.string(), "gpus": pa.string(), "expr": pa.string()}
# Above this a date read as a float may round differently from the integer seconds it was written as.
_EXACT_FLOAT_DATE_S = 2**53 // 1_000_000
_RUNNING = pa.array(sorted(RUNNING_STATUSES), pa.int32())


def _one_value(v: Any, kind: str, name: str, attr: str) -> tuple[int, Any]:
    """What ``jobs._Doc.get`` takes from ``v``, the attribute's only value: (_VALUE, value),
    (_UNSET, None) when it moves on to the next spelling, (_SLOW, None) when it would raise."""
    if v is None if kind == "expr" else _is_unset(v):
        return _UNSET, None
    try:
        out = _COERCE[kind](v, attr)
    except _BadValue:
        return _SLOW, None
    if out is None and kind in ("date", "expr"):
        return _UNSET, None
    if kind == "str" and (not out or (name in _HOST_FIELDS and out.lower() in _PLACEHOLDERS)):
        return _UNSET, None
    return _VALUE, out


def _one_float(x: float, kind: str, name: str, attr: str) -> tuple[int, Any]:
    """:func:`_one_value` of a value from a float column, which may have been an integer in the text
    (Arrow reads a column of integers and floats as floats): left to ``_row`` where the two differ."""
    if kind in ("str", "gpus", "expr") or (x.is_integer() and abs(x) >= (_EXACT_FLOAT_DATE_S if kind == "date" else 2**53)):
        return _SLOW, None
    return _one_value(x, kind, name, attr)


def _per_distinct(col: pa.Array, fn: Callable[[Any], tuple[int, Any]], type_: pa.DataType
                  ) -> tuple[pa.Array, np.ndarray]:
    """``fn`` of each distinct non-null value of ``col``: (values, states); nulls are _UNSET."""
    encoded = pc.dictionary_encode(col)
    results = [fn(v) for v in encoded.dictionary.to_pylist()]
    states = np.array([s for s, _ in results] + [_UNSET], dtype=np.int8)
    values = pa.array([v if s == _VALUE else None for s, v in results] + [None], type=type_)
    index = encoded.indices.fill_null(len(results)).to_numpy(zero_copy_only=False)
    return values.take(index), states[index]


def _candidate(col: pa.Array, kind: str, name: str, attr: str) -> tuple[pa.Array, np.ndarray]:
    """(values, states) of one spelling's column for field ``name``."""
    n, t, type_ = len(col), col.type, _TYPES[kind]
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_null(t):
        return pa.nulls(n, type_), np.zeros(n, np.int8)
    if pa.types.is_int64(t) and kind in ("date", "int", "int32", "float"):
        v = col.fill_null(0).to_numpy()
        state = np.where(valid, _VALUE, _UNSET).astype(np.int8)
        if kind == "date":  # jobs._Doc.get: v <= 0 is unset, beyond year 9999 a bad value
            state[valid & (v <= 0)] = _UNSET
            state[valid & (v > _MAX_EPOCH_S)] = _SLOW
            v = np.where(state == _VALUE, v, 0) * 1_000_000
        elif kind == "int32":
            state[valid & ((v < _INT32[0]) | (v > _INT32[1]))] = _SLOW
            v = np.where(state == _VALUE, v, 0).astype(np.int32)
        elif kind == "float":
            v = v.astype(np.float64)
        return pa.array(v, type=type_, mask=state != _VALUE), state
    if pa.types.is_floating(t):
        return _per_distinct(col, lambda x: _one_float(x, kind, name, attr), type_)
    if pa.types.is_string(t) or pa.types.is_boolean(t) or pa.types.is_int64(t):
        return _per_distinct(col, lambda x: _one_value(x, kind, name, attr), type_)
    return pa.nulls(n, type_), np.where(valid, _SLOW, _UNSET).astype(np.int8)  # lists and the like


def _has(texts: pa.Array, pattern: str) -> pa.Array:
    """Whether each text holds ``pattern`` (a regular expression: Arrow's regex search finds a
    literal several times faster than its plain substring search)."""
    return pc.match_substring_regex(texts, pattern)


def _map(col: pa.Array, fn: Callable[[Any], Any], type_: pa.DataType) -> pa.Array:
    """``fn`` of each distinct non-null value (nulls stay null)."""
    return _per_distinct(col, lambda v: (_VALUE, fn(v)), type_)[0]


def _np_int(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    return col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), \
        col.is_valid().to_numpy(zero_copy_only=False)


def _run_end(epoch: np.ndarray, status: pa.Array, start: pa.Array, completion: pa.Array,
             last_vacate: pa.Array, epoch_write: pa.Array, entered: pa.Array, last_status: pa.Array,
             last_wall: pa.Array) -> pa.Array:
    """``jobs._run_end`` over columns."""
    (s, s_ok), (c, c_ok), (lv, lv_ok), (ew, ew_ok), (en, en_ok) = (
        _np_int(a) for a in (start, completion, last_vacate, epoch_write, entered))
    st_ok = status.is_valid().to_numpy(zero_copy_only=False)
    running = pc.fill_null(pc.is_in(status, value_set=_RUNNING), False).to_numpy(zero_copy_only=False)
    # held, then removed or released: the last run's wall time ends the run (see jobs._run_end)
    ls_left = (last_status.is_valid().to_numpy(zero_copy_only=False)
               & ~pc.fill_null(pc.is_in(last_status, value_set=_RUNNING), False).to_numpy(zero_copy_only=False))
    lw = last_wall.fill_null(-1.0).to_numpy(zero_copy_only=False)
    by_wall = ls_left & (lw >= 0) & (lw <= MAX_RUN_S)
    wall_end = s + np.rint(np.where(by_wall, lw, 0.0) * 1_000_000).astype(np.int64)
    out, done = np.zeros(len(s), np.int64), ~s_ok  # no start: null
    ok = np.zeros(len(s), bool)
    for cond, value in (
        (c_ok & (c >= s), c),
        (lv_ok & (lv >= s), lv),
        (~epoch & (~st_ok | running), None),
        (epoch & ew_ok & (ew >= s), ew),
        (~st_ok | running, None),
        (by_wall, wall_end),
        (en_ok & (en >= s), en),
    ):
        take = ~done & cond
        if value is not None:
            out[take], ok[take] = value[take], True
        done |= take
    return pa.array(out, pa.int64(), mask=~ok)


def _gjid_parts(gjid: str) -> tuple[int, Any]:
    """(state, (stripped id, cluster from it, proc from it, schedd from it)) as ``_row`` reads them."""
    if not isinstance(gjid, str) or _is_unset(gjid):
        return _SLOW, None  # quarantined (missing_global_job_id)
    g = gjid.strip()
    m = _GJID_RE.match(g)
    cluster, proc = (int(m["cluster"]), int(m["proc"])) if m else (None, None)
    if m and max(cluster, proc) >= 2**63:
        return _SLOW, None
    return _VALUE, (g, cluster, proc, (g.split("#", 1)[0] if "#" in g else None) or None)


class FastRows(NamedTuple):
    """The rows ``jobs._row`` gives for the documents read here (``table``, in text order), with
    what ``jobs._normalize`` needs of each: its key, its ``record_utc`` (epoch microseconds) and
    whether ``jobs._outside_window`` skips it; ``index``: each text's row, -1 where left to ``_row``."""

    table: pa.Table
    index: np.ndarray
    keys: list[tuple]
    record_us: list[int | None]
    outside: np.ndarray

    @classmethod
    def none(cls, n: int) -> FastRows:
        return cls(JOBS.empty(), np.full(n, -1, np.int64), [], [], np.zeros(0, bool))


def fast_rows(texts: pa.Array | pa.ChunkedArray, source: str,
              window_s: tuple[int, int] | None = None) -> FastRows:
    """``jobs._row(json.loads(text), source)`` of the texts that take the plain way through it (see
    the module docstring); null texts are left to ``_row``."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    n = len(texts)
    if n == 0:
        return FastRows.none(0)
    # ASCII objects without \\u escapes: every key and text value is then spelled out in the text as
    # the rules read it, which the text checks below rely on (and no lone surrogate can reach the reader).
    use = _lines(texts) & pc.fill_null(pc.and_(pc.string_is_ascii(texts), pc.invert(
        pc.match_substring_regex(texts, r"\\u"))), False).to_numpy(zero_copy_only=False)
    # Every document is typed together (the reader unifies its blocks: ints and floats are floats); a
    # key holding numbers in one document and text in another makes it refuse the set.
    read = _read(texts, use)
    if read is None:
        return FastRows.none(n)
    picked, docs = read
    m = docs.num_rows
    slow = np.zeros(m, bool)
    spellings: dict[str, list[str]] = {}
    for col_name in docs.column_names:
        spellings.setdefault(col_name.lower(), []).append(col_name)

    def spelled(attr: str) -> list[pa.Array]:
        cols = [docs.column(c).combine_chunks() for c in spellings.get(attr.lower(), [])]
        if len(cols) > 1:  # several spellings in one document: _row tries the exact one first
            slow[sum(c.is_valid().to_numpy(zero_copy_only=False).astype(int) for c in cols) > 1] = True
        return cols

    v: dict[str, pa.Array] = {}
    for name, (kind, attrs) in _FIELDS.items():
        value, chosen = pa.nulls(m, _TYPES[kind]), np.zeros(m, bool)
        for attr in attrs:
            for col in spelled(attr):
                got, state = _candidate(col, kind, name, attr)
                slow |= state == _SLOW
                take = ~chosen & (state == _VALUE)
                if take.any():
                    value = pc.if_else(pa.array(take), got, value)
                chosen |= take
        v[name] = value

    # Not a plain job ad: GRACC records, MyType other than Job, epoch ads other than EPOCH.
    if "type" in docs.column_names and pa.types.is_string(docs.column("type").type):
        slow |= pc.fill_null(pc.equal(docs.column("type"), "JobUsageRecord"), False).to_numpy(zero_copy_only=False)
    gracc = pc.and_(_has(picked, '"ProbeName":'), _has(picked, '"RecordId":'))
    slow |= gracc.to_numpy(zero_copy_only=False)
    slow |= ~pc.fill_null(pc.equal(_map(v["my_type"], lambda s: s.lower() == "job", pa.bool_()), True),
                          True).to_numpy(zero_copy_only=False)
    slow |= ~pc.fill_null(pc.equal(_map(v["epoch_ad_type"], lambda s: s.upper() == "EPOCH", pa.bool_()), True),
                          True).to_numpy(zero_copy_only=False)

    gj_cols = spelled("GlobalJobId")
    if not gj_cols:
        return FastRows.none(n)
    gj_state = np.full(m, _SLOW, np.int8)
    gj_parts = pa.nulls(m, pa.struct([("g", pa.string()), ("c", pa.int64()), ("p", pa.int64()),
                                      ("s", pa.string())]))
    for col in gj_cols:
        if not pa.types.is_string(col.type):
            continue  # absent, or of another type: quarantined by _row (slow stays set)
        parts, state = _per_distinct(col, _gjid_parts, gj_parts.type)
        have = state == _VALUE
        gj_parts = pc.if_else(pa.array(have), parts, gj_parts)
        gj_state[have] = _VALUE
    slow |= gj_state != _VALUE
    gjid = pc.struct_field(gj_parts, "g")

    # jobs._Doc.has: a top-level key in any spelling, even with a null value (which Arrow reads as
    # absent: such a document is left to _row).
    epoch = np.zeros(m, bool)
    for attr in ("EpochWriteDate", "EpochAdType"):
        for col in spelled(attr):
            epoch |= col.is_valid().to_numpy(zero_copy_only=False)
        slow |= _has(picked, f'(?i)"{attr}":null').to_numpy(zero_copy_only=False)
    def first_start(order: tuple[str, ...]) -> pa.Array:
        return pc.coalesce(*(pc.if_else(pc.not_equal(v[k], 0), v[k], None) for k in order), pa.scalar(0, pa.int32()))

    # an epoch's run by its shadow start first (jobs._row)
    starts = pc.if_else(pa.array(epoch), first_start(EPOCH_STARTS), first_start(JOB_STARTS))
    run_index = pc.max_element_wise(pc.subtract(pc.cast(starts, pa.int64()), 1), 0)
    status = v["job_status"]
    start = pc.coalesce(v["current_start"], v["first_start"])
    end = _run_end(epoch, status, start, v["completion"], v["last_vacate"], v["epoch_write"], v["entered"],
                   v["last_job_status"], v["last_run_wall_clock"])
    record = pc.coalesce(v["record"], pc.if_else(pa.array(epoch), v["epoch_write"], None), v["server_time"],
                         v["completion"], v["entered"])
    running = pc.fill_null(pc.is_in(status, value_set=_RUNNING), False)
    remote = pc.coalesce(pc.if_else(running, v["remote_host"], None), v["last_remote_host"], v["remote_host"])
    r_slot = _map(remote, lambda r: _split_remote(r)[0], pa.string())
    r_host = _map(remote, lambda r: _split_remote(r)[1], pa.string())
    host = pc.coalesce(v["startd_name"], r_host)
    slot = pc.coalesce(v["startd_slot"], r_slot)
    user = v["user"]

    columns = {
        "global_job_id": gjid,
        "run_index": run_index,
        "doc_kind": pa.array(np.where(epoch, "epoch", "job"), pa.string()),
        "cluster_id": pc.coalesce(v["cluster_id"], pc.struct_field(gj_parts, "c")),
        "proc_id": pc.coalesce(v["proc_id"], pc.struct_field(gj_parts, "p")),
        "owner": pc.coalesce(v["owner"], _map(user, lambda u: u.split("@", 1)[0], pa.string())),
        "schedd": pc.coalesce(v["schedd_name"], pc.struct_field(gj_parts, "s")),
        "job_status_name": _map(status, JOB_STATUS_NAMES.get, pa.string()),
        "run_start_utc": start,
        "run_end_utc": end,
        "record_utc": record,
        "host": host,
        "slot": slot,
        "is_backfill_slot": _map(slot, lambda s: "backfill" in s.lower(), pa.bool_()),
        "source": pa.repeat(pa.scalar(source, pa.string()), m),
        **{col: v[name] for col, name in COPIED_FIELDS.items()},
    }
    outside, undecided = _outside(docs, window_s)
    keep = ~(slow | undecided)
    table = conform(pa.table(columns).filter(pa.array(keep)), JOBS)
    index = np.full(n, -1, np.int64)
    index[np.flatnonzero(use)[keep]] = np.arange(int(keep.sum()))
    keys = list(zip(*(table.column(k).to_pylist() for k in ("global_job_id", "run_index", "doc_kind")),
                    strict=True))
    record = pc.cast(table.column("record_utc"), pa.int64()).to_pylist()
    return FastRows(table, index, keys, record, outside[keep])


_WINDOW_KEYS = pa.schema([("CompletionDate", pa.int64()), ("JobCurrentStartDate", pa.int64()),
                          ("QDate", pa.int64()), ("GlobalJobId", pa.string())])


def _outside_ints(window_s: tuple[int, int], started: tuple[np.ndarray, np.ndarray],
                  queued: tuple[np.ndarray, np.ndarray], done: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """``jobs._outside_window`` of (values, present) integer columns."""
    start_s, end_s = window_s
    (s, s_ok), (q, q_ok), (d, d_ok) = started, queued, done
    s_ok = s_ok & (s > 0) & (s <= _MAX_EPOCH_S)
    after = s_ok & (s >= end_s) & q_ok & (q >= end_s) & (q <= _MAX_EPOCH_S)
    before = s_ok & d_ok & (s <= d) & (d < start_s)
    return after | before


def _ndjson(texts: pa.Array) -> pa.BufferReader:
    """The texts as lines of one buffer, built by Arrow (no Python string per text)."""
    joined = pc.binary_join_element_wise(texts, "", "\n")  # each text and a line break
    offset_type = np.int64 if pa.types.is_large_string(joined.type) else np.int32
    offsets = np.frombuffer(joined.buffers()[1], dtype=offset_type)[joined.offset:joined.offset + len(joined) + 1]
    lo, hi = int(offsets[0]), int(offsets[-1])
    return pa.BufferReader(joined.buffers()[2].slice(lo, hi - lo))


def _read(texts: pa.Array, use: np.ndarray, parse_options: pajson.ParseOptions | None = None
          ) -> tuple[pa.Array, pa.Table] | None:
    """The texts where ``use`` and Arrow's reading of them, one row each (on one thread); None when
    there are none or the reader refuses them."""
    if not use.any():
        return None
    picked = texts.filter(pa.array(use))
    try:
        table = pajson.read_json(_ndjson(picked), read_options=pajson.ReadOptions(use_threads=False),
                                 parse_options=parse_options)
    except pa.ArrowInvalid:
        return None
    return (picked, table) if table.num_rows == len(picked) else None


def _lines(texts: pa.Array) -> np.ndarray:
    """Texts that may be one JSON object each for Arrow's line-delimited reader. One holding a line
    break cannot be: it would read as two or more lines, the first and the last each a whole object
    (two rows) or not (an error), so the reader's row count or error tells."""
    return pc.fill_null(pc.and_(pc.starts_with(texts, "{"), pc.ends_with(texts, "}")), False).to_numpy(
        zero_copy_only=False)


def outside_window(texts: pa.Array | pa.ChunkedArray, window_s: tuple[int, int]) -> np.ndarray:
    """``jobs._outside_window`` of each JSON text (see :func:`outside_window_ids`)."""
    return outside_window_ids(texts, window_s)[0]


def outside_window_ids(texts: pa.Array | pa.ChunkedArray, window_s: tuple[int, int]
                       ) -> tuple[np.ndarray, pa.Array]:
    """``jobs._outside_window`` of each JSON text, without parsing whole documents, and each text's
    top-level ``GlobalJobId`` (None where absent or not read): Arrow's reader takes only the three
    integer keys the rule reads and the id, a batch of texts at a time. It refuses a batch in which
    one of them holds anything else (a float, a number for the id, twice in one document ...), for
    which the rule may answer otherwise: then no text is decided here (all False), and the
    normalizer decides each one."""
    parts, ids = [], []
    for chunk in texts.chunks if isinstance(texts, pa.ChunkedArray) else [texts]:
        for i in range(0, len(chunk), _WINDOW_BATCH):
            part = _outside_batch(chunk.slice(i, _WINDOW_BATCH), window_s)
            if part is None:
                return np.zeros(len(texts), bool), pa.nulls(len(texts), pa.string())
            parts.append(part[0])
            ids.append(part[1])
    if not parts:
        return np.zeros(0, bool), pa.array([], pa.string())
    return np.concatenate(parts), pa.concat_arrays(ids)


_WINDOW_BATCH = 8192  # texts read at once (a day's look-ahead files hold tens of thousands)


def _outside_batch(texts: pa.Array, window_s: tuple[int, int]) -> tuple[np.ndarray, pa.Array] | None:
    out = np.zeros(len(texts), bool)
    use = _lines(texts)
    if not use.any():
        return out, pa.nulls(len(texts), pa.string())
    read = _read(texts, use, pajson.ParseOptions(explicit_schema=_WINDOW_KEYS, unexpected_field_behavior="ignore"))
    if read is None:
        return None
    keys = read[1]
    cols = {k: _np_int(keys.column(k).combine_chunks()) for k in ("JobCurrentStartDate", "QDate", "CompletionDate")}
    out[use] = _outside_ints(window_s, cols["JobCurrentStartDate"], cols["QDate"], cols["CompletionDate"])
    read_ids = keys.column("GlobalJobId").combine_chunks()
    if use.all():
        return out, read_ids
    at = pa.array(np.cumsum(use) - 1, mask=~use)  # each text's row in the read ones, null for the others
    return out, read_ids.take(at)


def _outside(docs: pa.Table, window_s: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray]:
    """``jobs._outside_window`` of each document of the reader's table, and the documents it cannot be
    told for: a value in a column of floats may have been an integer in the text."""
    m = docs.num_rows
    undecided = np.zeros(m, bool)
    if window_s is None:
        return np.zeros(m, bool), undecided

    def ints(key: str) -> tuple[np.ndarray, np.ndarray]:
        col = docs.column(key).combine_chunks() if key in docs.column_names else pa.nulls(m, pa.int64())
        if pa.types.is_floating(col.type):
            undecided[col.is_valid().to_numpy(zero_copy_only=False)] = True
        if not pa.types.is_int64(col.type):
            return np.zeros(m, np.int64), np.zeros(m, bool)
        return _np_int(col)

    return _outside_ints(window_s, ints("JobCurrentStartDate"), ints("QDate"), ints("CompletionDate")), undecided


__all__ = ["FastRows", "fast_rows", "outside_window", "outside_window_ids"]
