"""One day of Kueue ``/metrics`` scrapes: pick the scrape files, keep their text (raw), derive the
``kueue_demand`` rows (clean).

Scrape files (``*.prom`` / ``*.txt`` / ``*.metrics``, e.g. written every minute by
``curl -s kueue-controller:8080/metrics > kueue-$(date -u +%Y%m%dT%H%M%SZ).prom``) are timed by the
UTC timestamp in their name (``YYYYMMDDTHHMMSSZ``; a stamp that is no real time, e.g. February
31st, falls back to the modification time), else by their modification time. The day's raw table
holds the scrapes inside the window plus the last few before it (:data:`BASELINE_SCRAPES`), so that
the first histogram interval of the day has a baseline even when the very last file before
midnight is an empty one (a failed ``curl``) or another replica's; the clean rows are those of the
scrapes inside the window. A scrape the exposition parser cannot read (a ``curl`` killed mid-write
leaves a cut last line) is set aside whole, as a row of ``quarantine/kueue_demand`` naming the file
and the line, and counted (``scrapes_unreadable``; a baseline one ``baseline_scrapes_unreadable``,
without a row: it is the day before's): half a scrape would read as queues without workloads. The
day's other scrapes are kept, and the one before it stands for the time (as across any missed
scrape).

``inactive_cluster_queues`` counts the day's ClusterQueues that a scrape of the day reports not
active (``kueue_cluster_queue_status``: pending, terminated): the demand counts of their quota only
the GPUs they still hold.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from gpu_pipeline.lib.exposition import SeriesParser
from gpu_pipeline.lib.kueue import KUEUE_DEMAND, ScrapeError, kueue_demand, parse_kueue_scrape
from gpu_pipeline.lib.schemas import TS, TableSpec, _f, conform, quarantine_spec
from gpu_pipeline.lib.telemetry import QuarantinedLine, quarantine_lines_table

#: Scrapes of the day set aside whole: unreadable.
QUARANTINE_KUEUE_DEMAND = quarantine_spec("kueue_demand")

RAW_KUEUE_SCRAPES = TableSpec(
    layer="raw",
    name="kueue_scrapes",
    description=(
        "Kueue controller /metrics scrapes of the day (and the last one before it), verbatim, with the "
        "time each was taken."
    ),
    schema=pa.schema(
        [
            _f("scrape_utc", TS, "When the scrape was taken (file name timestamp, else mtime)", nullable=False),
            _f("source_file", pa.string(), "Scrape file", nullable=False),
            _f("in_window", pa.bool_(), "False for the baseline scrape taken before the day", nullable=False),
            _f("text", pa.string(), "The exposition text", nullable=False),
        ]
    ),
)

_STAMP_RE = re.compile(r"(\d{8}T\d{6}Z)")
_SUFFIXES = (".prom", ".txt", ".metrics")
#: scrapes before the window kept as candidates for the day's baseline
BASELINE_SCRAPES = 5


def scrape_time(path: Path) -> dt.datetime:
    m = _STAMP_RE.search(path.name)
    if m:
        try:
            return dt.datetime.strptime(m.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        except ValueError:  # digits of the shape but no time (month 13, February 31st)
            pass
    return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)


def raw_scrapes(scrape_dir: str | Path, start_utc: dt.datetime, end_utc: dt.datetime) -> pa.Table:
    root = Path(scrape_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: Kueue scrape directory does not exist")
    named = [p for p in root.rglob("*") if p.suffix.lower() in _SUFFIXES and not p.is_dir()]
    for p in named:
        if not p.is_file():  # a dangling link, a link loop, a pipe the day would read: not skipped unseen
            try:
                at = scrape_time(p)  # from its name (a dangling link has no modification time)
            except OSError:
                at = None
            # the day's, or the day before's (the baseline scrapes before the window)
            if at is None or start_utc - dt.timedelta(days=1) <= at < end_utc:
                raise FileNotFoundError(f"{p}: a Kueue scrape file name, but not a readable file "
                                        "(a dangling link, a link loop or a pipe)")
    named = [p for p in named if p.is_file()]
    timed = sorted((scrape_time(p), p) for p in named)
    inside = [(t, p) for t, p in timed if start_utc <= t < end_utc]
    before = [(t, p) for t, p in timed if t < start_utc][-BASELINE_SCRAPES:]
    rows = [
        {"scrape_utc": t, "source_file": str(p), "in_window": t >= start_utc,
         "text": p.read_text(encoding="utf-8", errors="replace")}
        for t, p in before + inside
    ]
    return pa.Table.from_pylist(rows, schema=RAW_KUEUE_SCRAPES.schema) if rows else RAW_KUEUE_SCRAPES.empty()


def clean_scrapes(raw: pa.Table, cluster: str | None = None) -> tuple[pa.Table, dict[str, int], pa.Table]:
    """``kueue_demand`` rows of the in-window scrapes (the baseline only feeds the first deltas), the
    counters, and the in-window scrapes set aside as unreadable (``quarantine/kueue_demand`` rows)."""
    if raw.num_rows == 0:
        return KUEUE_DEMAND.empty(), {}, QUARANTINE_KUEUE_DEMAND.empty()
    rows = raw.sort_by("scrape_utc").to_pylist()
    counters: dict[str, int] = {}
    parser, scrapes, read, unreadable = SeriesParser(), [], [], []
    for r in rows:
        try:
            text = r["text"] or ""
            if text and not text.endswith(("\n", "\r")):  # the format ends every line with a line feed
                raise ScrapeError("the scrape ends mid-line (cut while it was written: a value 37 cut to 3 "
                                  "would read as 3)", len(text.splitlines()))
            scrapes.append(parse_kueue_scrape(text, r["scrape_utc"], cluster=cluster,
                                              source_file=r["source_file"], parser=parser))
        except ScrapeError as exc:
            key = "scrapes_unreadable" if r["in_window"] else "baseline_scrapes_unreadable"
            counters[key] = counters.get(key, 0) + 1
            if r["in_window"]:
                lines = (r["text"] or "").splitlines()
                line = lines[exc.line - 1] if exc.line and 0 < exc.line <= len(lines) else None
                unreadable.append(QuarantinedLine(exc.line, f"unreadable scrape: {exc}", line, r["source_file"],
                                                  r["scrape_utc"]))
            continue
        read.append(r)
    rows = read
    # the day's ClusterQueues that were not active in a scrape (pending, terminated): of their quota the
    # demand counts only what they still hold
    inactive = {(s.cluster, cq) for s, r in zip(scrapes, rows, strict=True) if r["in_window"]
                for cq, status in s.cq_status.items() if status != "active"}
    if inactive:
        counters["inactive_cluster_queues"] = len(inactive)
    result = kueue_demand(scrapes)
    first = min(r["scrape_utc"] for r in rows if r["in_window"]) if any(r["in_window"] for r in rows) else None
    table = result.table
    if first is None:
        table = table.slice(0, 0)
    else:
        table = table.filter(pc.greater_equal(table["sample_utc"], pa.scalar(first, table["sample_utc"].type)))
    quarantine = conform(quarantine_lines_table(unreadable, RAW_KUEUE_SCRAPES.path), QUARANTINE_KUEUE_DEMAND)
    # the baseline scrapes' rows (the day before's, for the first intervals) are not the day's
    return conform(table, KUEUE_DEMAND), {**result.counters, **counters, "rows_out": table.num_rows}, quarantine
