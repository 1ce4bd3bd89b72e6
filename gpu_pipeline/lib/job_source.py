"""One day of HTCondor job records: fetch the raw documents, then clean them.

Raw: every document whose run or queue wait may overlap the day, kept verbatim as JSON text
(``raw/job_documents``), from Elasticsearch (point-in-time paging, see ``es_source``) or from offline
files. Clean: the documents normalized (``jobs.normalize_items``, over columns where they allow it:
``jobs_fast``) into ``clean/jobs``, keeping the
runs that overlap the day; malformed documents go to ``quarantine/jobs`` with the reason.

Offline files are chosen by the date in their name (``...YYYY-MM-DD...``): from the day before the
window to ``lookahead_days`` after it, because a job's record is written when it leaves the queue,
days after a run that overlaps the window (files without a date are always read). A name that
carries two dates (``..._2025-08-01_2025-08-07...``, or two ``YYYYMMDD`` as in
``history-20250801-20250807.json``) names the days of a range, an export covering them: every day
of the range reads it (with the same look-around) and counts its documents as its own. Two dates
name a range only when a range separator joins them (``_``, ``-``, ``.``, ``--``, ``__``, ``..``,
``_to_``, ``-to-``, `` to ``); a name with two dates apart (``jobs_2025-08-05_exported_2025-09-30``,
or two ``YYYYMMDD`` apart) is named for its first.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.lib.es_source import EsConfig, fetch_jobs
from gpu_pipeline.lib.jobs import (
    canonical_json,
    close_superseded_runs,
    file_items,
    jobs_overlapping,
    normalize_docs,
    normalize_items,
    quarantine_table,
    text_fingerprint,
)
from gpu_pipeline.lib.jobs_fast import FastRows, fast_rows, outside_window_ids
from gpu_pipeline.lib.schemas import JOBS, QUARANTINE_JOBS, RAW_JOB_DOCUMENTS, conform

_DATE_RE = re.compile(r"(\d{4}-\d{2}-\d{2})")
# two dates joined by a range separator: ISO, or YYYYMMDD of 1900-2099 (a lone one is no date)
_SEP = r"(?:[_-]to[_-]| to |--|__|\.\.|[_.-])"
_RANGE_RE = re.compile(rf"(?<!\d)(\d{{4}}-\d{{2}}-\d{{2}}){_SEP}(\d{{4}}-\d{{2}}-\d{{2}})(?!\d)")
_COMPACT_DATE_RE = re.compile(r"(?<!\d)((?:19|20)\d{6})(?!\d)")
_COMPACT_RANGE_RE = re.compile(rf"(?<!\d)((?:19|20)\d{{6}}){_SEP}((?:19|20)\d{{6}})(?!\d)")
_JOB_SUFFIXES = (".ndjson", ".jsonl", ".json")


@dataclass
class RawDocs:
    table: pa.Table
    files: list[str] = field(default_factory=list)
    es_total: int | None = None
    es_pages: int | None = None
    es_retries: int | None = None


def _raw_table(rows: list[tuple[str, str, int, str, str | None]]) -> pa.Table:
    names = RAW_JOB_DOCUMENTS.schema.names
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
    return pa.Table.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(cols, RAW_JOB_DOCUMENTS.schema, strict=True)],
        schema=RAW_JOB_DOCUMENTS.schema,
    )


def select_files(files_dir: Path, start_utc: dt.datetime, end_utc: dt.datetime, lookahead_days: int) -> list[Path]:
    """The job-record files a window reads: those named for a day from the day before it to
    ``lookahead_days`` after it (a range-named file: one of its days), and those named for no date.
    (A run a range-named file shows open, a ``condor_q`` snapshot's, is closed by the later records
    the day reads; one whose snapshot is older than those files is no row of the day,
    :func:`_drop_stale_open_runs`: reading every file since a range's first day made a yearly
    export's last day read, store and parse the year.)"""
    if not files_dir.is_dir():
        raise FileNotFoundError(f"{files_dir}: job-record directory does not exist")
    lo = start_utc.date() - dt.timedelta(days=1)
    hi = end_utc.date() + dt.timedelta(days=lookahead_days)
    picked = []
    for p in sorted(files_dir.rglob("*")):
        if not p.name.lower().removesuffix(".gz").endswith(_JOB_SUFFIXES) or p.is_dir():
            continue
        days = _named_days(p)
        if days is not None and not (days[0] <= hi and lo <= days[1]):
            continue
        if not p.is_file():  # a dangling link, a link loop, a pipe the day would read: not skipped unseen
            raise FileNotFoundError(f"{p}: a job-record file name, but not a readable file "
                                    "(a dangling link, a link loop or a pipe)")
        picked.append(p)
    return picked


def _named_days(path: Path) -> tuple[dt.date, dt.date] | None:
    """The days a job-record file is named for, (first, last), or None. Two dates joined by a range
    separator (``..._2025-08-01_2025-08-07...``, ``history-20250801-20250807.json``: ``_``, ``-``,
    ``.``, ``--``, ``__``, ``..``, ``_to_`` / ``-to-`` / `` to ``; ``YYYYMMDD`` of 1900-2099) are a
    range, from the earlier to the later; else the first ISO date (``...YYYY-MM-DD...``) is the day,
    and so is the first of two ``YYYYMMDD`` apart (a second date apart from it, an export's date,
    names nothing); a lone ``YYYYMMDD`` is no date (it may be anything), nor is a number that is no
    date."""
    for pattern, fmt in ((_RANGE_RE, "%Y-%m-%d"), (_COMPACT_RANGE_RE, "%Y%m%d")):
        for m in pattern.finditer(path.name):
            a, b = _date(m.group(1), fmt), _date(m.group(2), fmt)
            if a is not None and b is not None:
                return min(a, b), max(a, b)
    days = [d for d in (_date(m, "%Y-%m-%d") for m in _DATE_RE.findall(path.name)) if d is not None]
    if not days:  # two YYYYMMDD apart (an export's date): the first, as for ISO dates
        compact = [d for d in (_date(m, "%Y%m%d") for m in _COMPACT_DATE_RE.findall(path.name)) if d is not None]
        days = compact if len(compact) >= 2 else []
    return (days[0], days[0]) if days else None


def _date(text: str, fmt: str) -> dt.date | None:
    try:
        return dt.datetime.strptime(text, fmt).date()
    except ValueError:
        return None


def _file_table(path: Path) -> pa.Table:
    """The raw-document rows of one job-record file."""
    rows: list[tuple[str, str, int, str, str | None]] = []
    source, items = file_items(path)
    for it in items:
        text = it.doc if isinstance(it.doc, str) and it.error else canonical_json(it.doc)
        rows.append((source, it.origin, it.position, text, it.error))
    return _raw_table(rows)


class FileDocsCache:
    """The rows of job-record files already read in this process, by path, size and modification
    time (a file rewritten in between is read again). Every day reads the files from the day before
    to ``lookahead_days`` after it, so a range run with one cache reads each file once instead of
    up to ``lookahead_days + 2`` times (a range-named file's more). Only the files of the latest day
    are kept."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, int, int], pa.Table] = {}
        self.reads = 0  #: files parsed (not taken from the cache)

    def table(self, path: Path) -> pa.Table:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = _file_table(path)
            self.reads += 1
        return table

    def keep_only(self, paths: list[Path]) -> None:
        names = {str(p) for p in paths}
        self._tables = {k: t for k, t in self._tables.items() if k[0] in names}


def raw_docs_from_files(
    files_dir: str | Path, start_utc: dt.datetime, end_utc: dt.datetime, lookahead_days: int = 7,
    cache: FileDocsCache | None = None,
) -> RawDocs:
    files = select_files(Path(files_dir), start_utc, end_utc, lookahead_days)
    cache = cache if cache is not None else FileDocsCache()
    tables = [cache.table(path) for path in files]
    cache.keep_only(files)
    table = pa.concat_tables(tables).combine_chunks() if tables else _raw_table([])
    return RawDocs(table=table, files=[str(p) for p in files])


def raw_docs_from_es(cfg: EsConfig, start_utc: dt.datetime, end_utc: dt.datetime) -> RawDocs:
    result = fetch_jobs(cfg, start_utc, end_utc)
    # each document's origin is its own index and id (a quarantined one can be looked up), not the pattern
    origins = result.origins or [cfg.index] * len(result.docs)
    rows = [("elasticsearch", origin, i, canonical_json(doc), None)
            for i, (origin, doc) in enumerate(zip(origins, result.docs, strict=True))]
    return RawDocs(
        table=_raw_table(rows), es_total=result.total, es_pages=result.pages, es_retries=result.retries
    )


@dataclass
class CleanJobs:
    table: pa.Table
    quarantine: pa.Table
    docs_in: int = 0
    duplicates: int = 0
    outside_window: int = 0
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    #: open runs a later record of the job showed over (:func:`~gpu_pipeline.lib.jobs.close_superseded_runs`)
    runs_closed_by_later_record: int = 0
    #: open runs known only from a record older than the day's first file date (:func:`_drop_stale_open_runs`)
    stale_open_runs_dropped: int = 0


def _readable(raw: pa.Table) -> pa.ChunkedArray:
    """The document texts, null where the reader could not parse the line (copied only then)."""
    if raw.column("parse_error").null_count == raw.num_rows:
        return raw.column("doc_json")
    return pc.if_else(pc.is_null(raw.column("parse_error")), raw.column("doc_json"), None)


def documents_of_the_day(raw: pa.Table, day: dt.date) -> int:
    """The raw documents that are the partition day's own: every one from Elasticsearch (its query asks
    for the documents of runs overlapping the day) and, from files, those of the files named for the
    day (its date as the partition names it; a range-named file: one of its days) or for no date.
    The files of the days before and after it, which a day reads for the later records of its runs
    (and, where the partition's zone is not UTC, for the hours of its window on another date), hold
    none of its own: with the day's file gone (rotated away) they alone are no day."""
    if not raw.num_rows:
        return 0
    return sum(count for origin, source, count in _origin_counts(raw) if _own(origin, source, day))


def _own(origin: str, source: str, day: dt.date) -> bool:
    """Whether a document of ``origin`` (a file, an index) is the day's own (:func:`documents_of_the_day`)."""
    if source == "elasticsearch":
        return True
    named = _named_days(Path(origin))
    return named is None or named[0] <= day <= named[1]


def own_documents_set_aside(raw: pa.Table, quarantine: pa.Table, day: dt.date) -> tuple[int, int]:
    """The day's own documents (:func:`documents_of_the_day`), and how many of them the cleaning set
    aside for what they are (not JSON, not a job ad, no GlobalJobId...; a record another one of the same
    run superseded, ``duplicate_key``, is no such document)."""
    if not raw.num_rows:
        return 0, 0
    counts = _origin_counts(raw)  # (each origin's name read once)
    own_origins = {origin for origin, source, _ in counts if _own(origin, source, day)}
    own = sum(count for origin, _, count in counts if origin in own_origins)
    if not own or not quarantine.num_rows:
        return own, 0
    aside = pc.and_(pc.is_in(quarantine["source_file"], value_set=pa.array(sorted(own_origins), pa.string())),
                    pc.invert(pc.fill_null(pc.starts_with(quarantine["reason"], "duplicate_key"), False)))
    return own, int(pc.sum(aside).as_py() or 0)


def _origin_counts(raw: pa.Table) -> list[tuple[str, str, int]]:
    grouped = raw.group_by(["origin", "source"]).aggregate([("position", "count")])
    return list(zip(grouped["origin"].to_pylist(), grouped["source"].to_pylist(),
                    grouped["position_count"].to_pylist(), strict=True))


def _close_open_runs(table: pa.Table, candidates: pa.Table) -> tuple[pa.Table, int]:
    """:func:`~gpu_pipeline.lib.jobs.close_superseded_runs` of the day's rows, with every document of
    the same jobs the day read (``candidates``: the raw documents with their job where read plainly)
    as the later records that may close an open run -- those outside the day too: a job's history
    record of the 5th closes its ``condor_q`` snapshot's run in the partition of the 7th, and a
    record of the same run from another source (an epoch document, an export's final ad) closes it
    on the day after it ended, which reads the day's files. Those records' rows are not kept; a
    record the day does not read (a file named beyond its look-ahead) closes nothing here."""
    open_run = pc.and_(pc.is_null(table["run_end_utc"]), pc.is_valid(table["run_start_utc"])) if table.num_rows else None
    if open_run is None or not pc.any(open_run).as_py():
        return table, 0
    open_ids = pc.unique(table["global_job_id"].filter(open_run))
    ids = set(open_ids.to_pylist())
    job = candidates["_job_id"]
    candidates = candidates.filter(pc.or_(pc.is_null(job), pc.fill_null(pc.is_in(job, value_set=open_ids), False)))
    closers = []
    by_source: dict[str, list] = {}
    for r in candidates.select(["source", "doc_json", "_job_id"]).to_pylist():
        try:
            doc = json.loads(r["doc_json"])
        except (TypeError, ValueError):
            continue
        if isinstance(doc, dict) and (r["_job_id"] is not None or str(doc.get("GlobalJobId", "")).strip() in ids):
            by_source.setdefault(r["source"], []).append(doc)
    for source, docs in sorted(by_source.items()):
        closers.append(normalize_docs(docs, source).table)
    both = pa.concat_tables([table, *closers]) if closers else table
    # (the count is the day's rows closed: the closers' own open rows are closed too, and dropped)
    closed_table = close_superseded_runs(both)[0].slice(0, table.num_rows)
    closed = int(pc.sum(pc.and_(open_run, pc.is_valid(closed_table["run_end_utc"]))).as_py() or 0)
    return closed_table, closed


def _text_job_id(text: str | None) -> str | None:
    """A document's GlobalJobId read from its text (a document the columnar reader did not read plainly)."""
    try:
        doc = json.loads(text) if text else None
    except (TypeError, ValueError):
        return None
    return (str(doc.get("GlobalJobId", "")).strip() or None) if isinstance(doc, dict) else None


def _drop_stale_open_runs(table: pa.Table, start_utc: dt.datetime, candidates: pa.Table) -> tuple[pa.Table, int]:
    """The rows without those of a run still open (no end) in a record taken before the first day whose
    files the day reads (the day before its window's first date, 00:00 UTC: :func:`select_files`): a
    ``condor_q`` snapshot in a file named for a range of days, or for none, that a day long after reads.
    The records that would close it (a later snapshot, the job's history ad) lie in the files between,
    which the day does not read: carried, the run ran on every later day of the range. A snapshot of
    the day before, or of the day, is kept: it says the job runs. A record without the time it was
    taken (a dump without ServerTime: its record time is the job's EnteredCurrentStatus, when the run
    began) is kept where a document of the job comes from Elasticsearch or from a file named for one
    day the day reads (``candidates``: the raw documents with their origin and job), else it is as
    old as its record time. Returns the table and the rows left out."""
    if not table.num_rows:
        return table, 0
    first_day = start_utc.astimezone(dt.UTC).date() - dt.timedelta(days=1)
    cut = pa.scalar(dt.datetime.combine(first_day, dt.time(), tzinfo=dt.UTC), type=table.schema.field("record_utc").type)
    old_open = pc.fill_null(pc.and_(pc.and_(pc.is_null(table["run_end_utc"]), pc.is_valid(table["run_start_utc"])),
                                    pc.less(table["record_utc"], cut)), False)
    if not pc.any(old_open).as_py():
        return table, 0
    # the jobs a fresh document names -- from Elasticsearch, or a file named for one day from the first
    # on -- among the old open runs' jobs: freshness once per origin, the documents of those jobs only
    # (and those whose job was not read plainly, their id from the text)
    old_ids = pc.unique(table["global_job_id"].filter(old_open))
    origins = candidates["origin"]
    fresh_origin = {o: s == "elasticsearch" or ((d := _named_days(Path(o))) is not None and d[0] == d[1] >= first_day)
                    for o, s, _ in _origin_counts(candidates)}
    from_fresh = pc.is_in(origins, value_set=pa.array([o for o, f in fresh_origin.items() if f], pa.string()))
    job = candidates["_job_id"]
    picked = candidates.filter(pc.and_(from_fresh, pc.or_(pc.is_null(job), pc.fill_null(
        pc.is_in(job, value_set=old_ids), False))))
    fresh = set()
    for job_id, text in zip(picked["_job_id"].to_pylist(), picked["doc_json"].to_pylist(), strict=True):
        if job_id is None:  # a document not read plainly (rare)
            job_id = _text_job_id(text)
        if job_id is not None:
            fresh.add(job_id)
    unobserved = pc.fill_null(pc.equal(table["record_utc"], table["status_entered_utc"]), False)
    kept_fresh = pc.and_(unobserved, pc.is_in(table["global_job_id"], value_set=pa.array(sorted(fresh), pa.string())))
    stale = pc.and_(old_open, pc.invert(kept_fresh))
    n = int(pc.sum(stale).as_py() or 0)
    return (table.filter(pc.invert(stale)), n) if n else (table, 0)


def clean_job_documents(raw: pa.Table, start_utc: dt.datetime, end_utc: dt.datetime) -> CleanJobs:
    """Normalize the raw documents of a day; keep the runs overlapping [start_utc, end_utc).

    Documents of runs that start after the day (the look-ahead files are mostly those) cannot overlap
    it, nor can those of runs that started and completed before it (the files of the day before): they
    are counted as outside the window without being normalized -- recognised from the three dates the
    rule needs, read by Arrow's JSON reader with their GlobalJobId (``jobs_fast.outside_window_ids``),
    else after parsing (``jobs._outside_window``). The others are normalized over columns where they take the plain way
    through the row rules (``jobs_fast.fast_rows``), else one by one; the rows are the same."""
    window_s = (math.floor(start_utc.timestamp()), math.ceil(end_utc.timestamp()))
    # each document's place in the input: the items are normalized in it (a tie of record times is
    # broken by it: the later read wins, as without the window)
    raw = raw.append_column("_row", pa.array(range(raw.num_rows), pa.int64()))
    outside, job_ids = outside_window_ids(_readable(raw), window_s)
    # every document's job (null where not read plainly), for the records that may close an open run
    candidates = raw.append_column("_job_id", job_ids)
    skipped_early = int(outside.sum())
    early = raw.slice(0, 0).append_column("_job_id", pa.array([], pa.string()))
    if skipped_early:
        # Those of a job that also has a document in the window are kept aside, unparsed: one may be a
        # later record of a row the day keeps (the normalizer reads them only for a job it keeps).
        inside_ids = job_ids.filter(pa.array(~outside))
        early = raw.filter(pa.array(outside)).append_column("_job_id", job_ids.filter(pa.array(outside)))
        if not inside_ids.null_count:  # else an id was not read: every one is kept aside
            early = early.filter(pc.or_(pc.is_in(early.column("_job_id"), value_set=inside_ids),
                                        pc.is_null(early.column("_job_id"))))
        raw = raw.filter(pa.array(~outside))
    # The raw text is the document's ``canonical_json`` (what the raw asset writes), so the duplicate
    # check fingerprints the text instead of serializing each parsed document again, and the documents
    # that take the plain way through the row rules are normalized over columns (``jobs_fast``).
    by_source: dict[str, tuple[list[tuple], FastRows]] = {}
    sources = raw.column("source")
    names = sorted(set(sources.unique().to_pylist()) | set(early.column("source").unique().to_pylist()))
    for source in names:
        part = raw.filter(pc.equal(sources, source)) if len(names) > 1 else raw
        fast = fast_rows(_readable(part), source, window_s)
        items: list[tuple] = []
        rows: list[int] = []
        for i, r in enumerate(part.select(["origin", "position", "doc_json", "parse_error", "_row"]).to_pylist()):
            rows.append(r["_row"])
            doc: object = r["doc_json"]
            error, fingerprint, j = r["parse_error"], None, int(fast.index[i])
            if error is None:
                try:
                    if j < 0:
                        doc = json.loads(r["doc_json"])
                    fingerprint = text_fingerprint(r["doc_json"])
                except json.JSONDecodeError as exc:
                    error = f"invalid_json: {exc.msg} (column {exc.colno})"
            items.append((r["origin"], r["position"], doc, error, fingerprint, j))
        aside = early.filter(pc.equal(early.column("source"), source))
        for r in aside.select(["origin", "position", "doc_json", "_job_id", "_row"]).to_pylist():
            rows.append(r["_row"])
            items.append((r["origin"], r["position"], r["doc_json"], None, None, -1, True, r["_job_id"]))
        if aside.num_rows:
            items = [item for _, item in sorted(zip(rows, items, strict=True), key=lambda pair: pair[0])]
        by_source[source] = (items, fast)

    tables, quarantined, reasons = [], [], Counter()
    docs_in = skipped = skipped_early - early.num_rows  # outside the window, of no job the window has
    duplicates = 0
    for source in sorted(by_source):
        items, fast = by_source[source]
        result = normalize_items(items, source, window_s, fast)
        tables.append(result.table)
        quarantined.extend(result.quarantine)
        reasons.update(result.quarantined_by_reason)
        docs_in += result.docs_in
        duplicates += result.duplicates
        skipped += result.skipped_outside_window
    table = pa.concat_tables(tables) if tables else JOBS.empty()
    table, closed = _close_open_runs(table, candidates)
    table, stale = _drop_stale_open_runs(table, start_utc, candidates)
    kept = jobs_overlapping(table, start_utc, end_utc)
    kept = kept.sort_by([("global_job_id", "ascending"), ("run_index", "ascending"), ("doc_kind", "ascending"),
                         ("source", "ascending")])
    q = conform(quarantine_table(quarantined, source_table="raw/job_documents"), QUARANTINE_JOBS)
    return CleanJobs(
        table=conform(kept, JOBS),
        quarantine=q,
        docs_in=docs_in,
        duplicates=duplicates,
        outside_window=table.num_rows - kept.num_rows + skipped,
        quarantined_by_reason=dict(sorted(reasons.items())),
        runs_closed_by_later_record=closed,
        stale_open_runs_dropped=stale,
    )
