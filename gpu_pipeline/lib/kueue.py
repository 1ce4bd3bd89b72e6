"""Kubernetes GPU demand from Kueue ``/metrics`` scrapes into one ``kueue_demand`` table
(DESIGN.md 4.4, 5.6).

A scrape is the Prometheus text exposition of the Kueue controller manager, parsed with
``prometheus_client.parser``. Samples carry no timestamps: each scrape gets the time the caller
gives (when it was taken, e.g. the file's mtime). :func:`parse_kueue_scrapes` reads scrapes, in any
order, and returns the table; :func:`parse_kueue_scrape` and :func:`kueue_demand` are its two
halves.

Rows (``kind`` x ``scope``), one per scrape and
    * ``queue``: per queue (and ``status`` for the per-status metrics): ``pending_workloads``
      (``kueue_pending_workloads`` / ``kueue_local_queue_pending_workloads``, status ``active`` =
      in the admission queue, ``inadmissible`` = failed an admission attempt and parked), admitted /
      reserving active workloads, the cumulative admitted / quota-reserved counters, fair-sharing
      values. Metrics without a ``status`` label fill the row with ``status`` null.
    * ``resource``: per queue, ``flavor`` and ``resource`` (``nvidia.com/gpu``, ``cpu`` in cores,
      ``memory`` in bytes): ``resource_usage``, ``resource_reservation``, ``nominal_quota``,
      ``borrowing_limit`` / ``lending_limit`` (Kueue reports ``+Inf`` when unset: stored as null =
      unlimited). ``kueue_cluster_queue_resource_pending`` has no flavor: its rows have ``flavor``
      null (pending workloads are not assigned to a flavor yet).
    * ``admission_wait`` / ``quota_reserved_wait``: the ``kueue_[local_queue_]admission_wait_time_seconds``
      / ``..._quota_reserved_wait_time_seconds`` histograms (see below).
    ``scope`` is ``cluster_queue`` (label ``cluster_queue``), ``local_queue`` (labels ``name``,
    ``namespace``; the ``LocalQueueMetrics`` feature gate) or ``cohort`` (``kueue_cohort_*``).
    :data:`KUEUE_METRICS` is the complete mapping; anything else in a scrape (controller health,
    Go runtime metrics) is counted as ``unmapped_samples``.

Histograms (how the wait columns are computed)
    Kueue's histograms are cumulative since the controller started. ``wait_count_total`` and
    ``wait_sum_total_s`` are the scrape's cumulative ``_count`` / ``_sum``. The interval columns
    describe the workloads admitted *between the previous scrape of the same series and this one*:
    ``wait_count_interval`` = delta of ``_count``, ``wait_mean_s`` = delta ``_sum`` / delta ``_count``
    (null when nothing was admitted), ``wait_p50_s`` / ``wait_p90_s`` = ``histogram_quantile`` over
    the delta of the ``_bucket`` counts (Prometheus' linear interpolation inside the bucket; a rank
    in the ``+Inf`` bucket returns the highest finite bound), ``interval_s`` = seconds since that
    previous scrape. A series' first scrape has null interval columns, and so has a scrape whose
    interval since the series' scrape before is more than :data:`OUTAGE_FACTOR` x the series'
    intervals beside it (a collector outage: the admissions of the whole outage would be credited to the hour
    after it; ``interval_s`` is kept, the rest null, counted as ``intervals_after_gap``). A counter reset (the
    controller restarted: a count, the sum or a bucket went down) or a changed bucket layout takes
    the current cumulative values as the delta (like ``rate()``), counted as ``counter_resets``.
    The wait is "created or requeued until admission" (Kueue's definition), so a requeued workload
    counts again.

Priority classes
    Counters and histograms carry ``priority_class``. By default series are summed over priority
    classes (``priority_class`` null = all; histogram buckets are summed before the quantiles);
    ``by_priority_class=True`` keeps one row per class instead.

HA replicas
    Kueue labels every series with ``replica_role`` (``leader``, ``follower``, ``standalone``).
    Samples of a ``follower`` replica are dropped (counted as ``follower_samples``) so that scraping
    every replica does not count a queue twice. Custom labels (the ``CustomMetricLabels`` gate,
    ``custom_*`` / ``<kind>_custom_*``) split a queue's series by a label's value: the parts are
    summed. Two samples for one cell: the first is kept, the second counted as
    ``duplicate_samples`` (same value) or ``conflicting_samples``.

``cohort`` is the ``cohort`` label where the metric has one, else the ClusterQueue's
``parent_cohort`` from ``kueue_cluster_queue_info`` in the same scrape; ``root_cohort`` (ClusterQueue
rows) that metric's ``root_cohort``: in a tree of cohorts a queue may borrow from any queue under
the same root. ``cluster_queue_status`` (ClusterQueue rows) is the status that
``kueue_cluster_queue_status{cluster_queue, status}`` reports at 1 in the same scrape (``active``,
``pending``: its flavor or admission check missing, ``terminated``: being deleted); a queue that is
not active admits nothing, so the demand counts of its quota only the GPUs it still holds. Null when the scrape
has no status at 1 for the queue (an older Kueue); a second status at 1 is counted as
``conflicting_samples``, the first kept. A LocalQueue row's
``cluster_queue`` is filled when any LocalQueue metric of the scrape carries a ``cluster_queue``
label for it (``kueue_local_queue_admission_fair_sharing_usage``, ...); Kueue's default metrics do
not say which ClusterQueue a LocalQueue points to. NaN reads as null
(``nan_values``). A scrape the exposition parser rejects raises ``ValueError`` naming the file.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from gpu_pipeline.lib.exposition import SeriesParser
from gpu_pipeline.lib.schemas import TS, TableSpec, _f, conform

UTC = dt.UTC

KINDS: tuple[str, ...] = ("queue", "resource", "admission_wait", "quota_reserved_wait")
SCOPES: tuple[str, ...] = ("cluster_queue", "local_queue", "cohort")

KUEUE_DEMAND = TableSpec(
    layer="clean",
    name="kueue_demand",
    version=3,
    description=(
        "Kubernetes demand and capacity from Kueue /metrics scrapes: per scrape, one row per queue "
        "(and status), per queue x flavor x resource, and per queue wait histogram (admission, quota "
        "reservation) with interval mean and quantiles from the delta to the previous scrape."
    ),
    key=("sample_utc", "cluster", "kind", "scope", "cluster_queue", "namespace", "local_queue", "cohort",
         "status", "priority_class", "flavor", "resource"),
    schema=pa.schema(
        [
            _f("sample_utc", TS, "Time the scrape was taken (UTC)", nullable=False),
            _f("cluster", pa.string(), "Kubernetes cluster the Kueue scrape came from (given by the caller)"),
            _f("kind", pa.string(), "Row kind: " + ", ".join(KINDS), nullable=False),
            _f("scope", pa.string(), "What the row describes: " + ", ".join(SCOPES), nullable=False),
            _f("cluster_queue", pa.string(), "ClusterQueue (scope cluster_queue); on local_queue rows the "
               "LocalQueue's ClusterQueue when a metric of the scrape names it (e.g. fair sharing usage)"),
            _f("namespace", pa.string(), "Namespace of the LocalQueue (scope local_queue)"),
            _f("local_queue", pa.string(), "LocalQueue name (scope local_queue)"),
            _f("cohort", pa.string(), "Cohort: the identity for scope cohort; else the metric's cohort "
               "label or the ClusterQueue's parent_cohort from kueue_cluster_queue_info"),
            _f("root_cohort", pa.string(), "The root of the ClusterQueue's cohort tree (root_cohort of "
               "kueue_cluster_queue_info in the same scrape; null without it): quota is lent within it"),
            _f("cluster_queue_status", pa.string(), "The ClusterQueue's status in the same scrape "
               "(kueue_cluster_queue_status at 1: active, pending, terminated; scope cluster_queue; null "
               "without it): a queue that is not active admits nothing: of its quota only what it holds is capacity"),
            _f("status", pa.string(), "Pending status on queue rows of per-status metrics: active (in "
               "the admission queue) or inadmissible (failed an admission attempt); null otherwise"),
            _f("priority_class", pa.string(), "Priority class of counter / histogram rows with "
               "by_priority_class ('' = workloads without one); null = summed over all classes"),
            _f("resource", pa.string(), "Resource name on resource rows, e.g. nvidia.com/gpu, cpu, memory"),
            _f("flavor", pa.string(), "ResourceFlavor on resource rows (null for resource_pending)"),
            _f("pending_workloads", pa.int64(), "Pending workloads (kueue_[local_queue_]pending_workloads)"),
            _f("pending_scheduling_hashes", pa.int64(), "Unique pending scheduling equivalence hashes"),
            _f("admitted_active_workloads", pa.int64(), "Admitted workloads that are active"),
            _f("reserving_active_workloads", pa.int64(), "Workloads reserving quota"),
            _f("admitted_workloads_total", pa.int64(), "Admitted workloads since the controller started "
               "(cumulative counter)"),
            _f("quota_reserved_workloads_total", pa.int64(), "Quota-reserved workloads since the "
               "controller started (cumulative counter)"),
            _f("fair_sharing_usage", pa.float64(), "LocalQueue admission fair sharing usage"),
            _f("weighted_share", pa.float64(), "ClusterQueue / Cohort weighted share (NaN -> null)"),
            _f("resource_pending", pa.float64(), "Pending resource requests (not yet assigned a flavor)"),
            _f("resource_usage", pa.float64(), "Resource usage (units of the resource: GPUs, cores, bytes)"),
            _f("resource_reservation", pa.float64(), "Resource reservation"),
            _f("nominal_quota", pa.float64(), "Nominal quota (scope cohort: aggregated over the subtree)"),
            _f("borrowing_limit", pa.float64(), "Borrowing limit; null = unlimited (Kueue reports +Inf)"),
            _f("lending_limit", pa.float64(), "Lending limit; null = unlimited (Kueue reports +Inf)"),
            _f("wait_count_total", pa.int64(), "Histogram _count: waits observed since the controller "
               "started (cumulative)"),
            _f("wait_sum_total_s", pa.float64(), "Histogram _sum: total wait seconds (cumulative)"),
            _f("interval_s", pa.float64(), "Seconds since the previous scrape of this histogram series"),
            _f("wait_count_interval", pa.int64(), "Waits observed in the interval (delta of _count)"),
            _f("wait_mean_s", pa.float64(), "Mean wait in the interval: delta _sum / delta _count"),
            _f("wait_p50_s", pa.float64(), "Median wait in the interval (histogram_quantile of the "
               "bucket deltas)"),
            _f("wait_p90_s", pa.float64(), "90th percentile wait in the interval"),
            _f("source_file", pa.string(), "Scrape file the row was read from"),
        ]
    ),
)

_INT_COLUMNS = frozenset(f.name for f in KUEUE_DEMAND.schema if f.type == pa.int64())


class KueueMetric(NamedTuple):
    """Where a Kueue metric goes: row ``kind``, ``scope``, value ``column`` (None for histograms)
    and Prometheus type."""

    kind: str
    scope: str
    column: str | None
    type: str


_CQ, _LQ, _CO = "cluster_queue", "local_queue", "cohort"

#: Every Kueue metric the parser reads (names as documented by Kueue's metrics reference).
KUEUE_METRICS: dict[str, KueueMetric] = {
    # pending / active workloads
    "kueue_pending_workloads": KueueMetric("queue", _CQ, "pending_workloads", "gauge"),
    "kueue_local_queue_pending_workloads": KueueMetric("queue", _LQ, "pending_workloads", "gauge"),
    "kueue_pending_scheduling_hashes": KueueMetric("queue", _CQ, "pending_scheduling_hashes", "gauge"),
    "kueue_admitted_active_workloads": KueueMetric("queue", _CQ, "admitted_active_workloads", "gauge"),
    "kueue_local_queue_admitted_active_workloads": KueueMetric("queue", _LQ, "admitted_active_workloads", "gauge"),
    "kueue_reserving_active_workloads": KueueMetric("queue", _CQ, "reserving_active_workloads", "gauge"),
    "kueue_local_queue_reserving_active_workloads": KueueMetric("queue", _LQ, "reserving_active_workloads", "gauge"),
    "kueue_admitted_workloads_total": KueueMetric("queue", _CQ, "admitted_workloads_total", "counter"),
    "kueue_local_queue_admitted_workloads_total": KueueMetric("queue", _LQ, "admitted_workloads_total", "counter"),
    "kueue_quota_reserved_workloads_total": KueueMetric("queue", _CQ, "quota_reserved_workloads_total", "counter"),
    "kueue_local_queue_quota_reserved_workloads_total": KueueMetric(
        "queue", _LQ, "quota_reserved_workloads_total", "counter"),
    "kueue_local_queue_admission_fair_sharing_usage": KueueMetric("queue", _LQ, "fair_sharing_usage", "gauge"),
    "kueue_cluster_queue_weighted_share": KueueMetric("queue", _CQ, "weighted_share", "gauge"),
    "kueue_cohort_weighted_share": KueueMetric("queue", _CO, "weighted_share", "gauge"),
    # resources (usage, quota, limits)
    "kueue_cluster_queue_resource_pending": KueueMetric("resource", _CQ, "resource_pending", "gauge"),
    "kueue_cluster_queue_resource_usage": KueueMetric("resource", _CQ, "resource_usage", "gauge"),
    "kueue_local_queue_resource_usage": KueueMetric("resource", _LQ, "resource_usage", "gauge"),
    "kueue_cluster_queue_resource_reservation": KueueMetric("resource", _CQ, "resource_reservation", "gauge"),
    "kueue_local_queue_resource_reservation": KueueMetric("resource", _LQ, "resource_reservation", "gauge"),
    "kueue_cohort_subtree_resource_reservations": KueueMetric("resource", _CO, "resource_reservation", "gauge"),
    "kueue_cluster_queue_nominal_quota": KueueMetric("resource", _CQ, "nominal_quota", "gauge"),
    "kueue_cohort_subtree_quota": KueueMetric("resource", _CO, "nominal_quota", "gauge"),
    "kueue_cluster_queue_borrowing_limit": KueueMetric("resource", _CQ, "borrowing_limit", "gauge"),
    "kueue_cluster_queue_lending_limit": KueueMetric("resource", _CQ, "lending_limit", "gauge"),
    # waits
    "kueue_admission_wait_time_seconds": KueueMetric("admission_wait", _CQ, None, "histogram"),
    "kueue_local_queue_admission_wait_time_seconds": KueueMetric("admission_wait", _LQ, None, "histogram"),
    "kueue_quota_reserved_wait_time_seconds": KueueMetric("quota_reserved_wait", _CQ, None, "histogram"),
    "kueue_local_queue_quota_reserved_wait_time_seconds": KueueMetric(
        "quota_reserved_wait", _LQ, None, "histogram"),
}
#: Read for the ClusterQueue -> parent cohort join only.
CLUSTER_QUEUE_INFO = "kueue_cluster_queue_info"
#: Read for each ClusterQueue's status (the one at 1), an attribute of its rows (``cluster_queue_status``).
CLUSTER_QUEUE_STATUS = "kueue_cluster_queue_status"
_UNLIMITED_WHEN_INF = frozenset({"borrowing_limit", "lending_limit"})
_HIST_SUFFIXES = ("_bucket", "_sum", "_count")


class RowKey(NamedTuple):
    """Identity of one row within a scrape (``cohort`` of a queue row is an attribute, not here)."""

    kind: str
    scope: str
    cluster_queue: str | None
    namespace: str | None
    local_queue: str | None
    cohort: str | None  # scope cohort only
    status: str | None
    priority_class: str | None
    resource: str | None
    flavor: str | None


@dataclass
class _Hist:
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    sum: float | None = None
    count: float | None = None


@dataclass
class KueueScrape:
    """One parsed scrape: per-row values, histograms and the cohort of each ClusterQueue."""

    sample_utc: dt.datetime
    cluster: str | None
    source_file: str | None
    values: dict[RowKey, dict[str, float | None]] = field(default_factory=dict)
    hists: dict[RowKey, _Hist] = field(default_factory=dict)
    row_cohort: dict[RowKey, str] = field(default_factory=dict)
    cq_cohort: dict[str, str] = field(default_factory=dict)
    cq_root: dict[str, str] = field(default_factory=dict)
    cq_status: dict[str, str] = field(default_factory=dict)  # ClusterQueue -> its status at 1
    lq_cluster_queue: dict[tuple[str, str], str] = field(default_factory=dict)
    counters: Counter[str] = field(default_factory=Counter)


@dataclass
class KueueResult:
    table: pa.Table
    counters: Counter[str] = field(default_factory=Counter)
    files: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.table.num_rows


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile``: ``buckets`` maps upper bound ``le`` (``inf`` included) to
    the cumulative count. ``None`` when there is no observation or no ``+Inf`` bucket."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    les = sorted(buckets)
    if len(les) < 2 or not math.isinf(les[-1]):
        return None
    counts = [buckets[le] for le in les]
    for i in range(1, len(counts)):  # tolerate tiny non-monotonicity, as Prometheus does
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(les) - 1:
        return les[-2]
    upper = les[b]
    if b == 0 and upper <= 0:
        return upper
    lower = 0.0 if b == 0 else les[b - 1]
    prev = 0.0 if b == 0 else counts[b - 1]
    in_bucket = counts[b] - prev
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - prev) / in_bucket


def _text(path_or_text: str | Path) -> tuple[str, str | None]:
    """The scrape's text and the file it was read from: a ``Path`` is read, a ``str`` is the text
    (an empty or one-line scrape is text too: guessing a path from the missing newline read the
    metric line as a file name)."""
    if isinstance(path_or_text, Path):
        return path_or_text.read_text(encoding="utf-8", errors="replace"), str(path_or_text)
    if not isinstance(path_or_text, str):
        raise TypeError(f"expected a path or text, got {type(path_or_text).__name__}")
    return path_or_text, None


def _utc(value: dt.datetime, what: str) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise TypeError(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware (UTC), got naive {value!r}")
    return value.astimezone(UTC)


def _lookup(sample_name: str) -> tuple[str, KueueMetric, str | None] | None:
    """``(metric, mapping, histogram component)`` of a sample, or ``None`` if unmapped."""
    m = KUEUE_METRICS.get(sample_name)
    if m is not None and m.type != "histogram":
        return sample_name, m, None
    for suffix in _HIST_SUFFIXES:
        if sample_name.endswith(suffix):
            base = sample_name[: -len(suffix)]
            m = KUEUE_METRICS.get(base)
            if m is not None and m.type == "histogram":
                return base, m, suffix[1:]
    return None


def _row_key(m: KueueMetric, labels: Mapping[str, str], by_pc: bool) -> RowKey | None:
    if m.scope == _CQ:
        cq = labels.get("cluster_queue")
        if not cq:
            return None
        ns = lq = co = None
    elif m.scope == _LQ:
        ns, lq = labels.get("namespace"), labels.get("name")
        if not ns or not lq:
            return None
        cq = co = None  # a LocalQueue's ClusterQueue is an attribute (KueueScrape.lq_cluster_queue)
    else:
        co = labels.get("cohort")
        if not co:
            return None
        cq = ns = lq = None
    pc = labels.get("priority_class") if by_pc and "priority_class" in labels else None
    status = (labels.get("status") or None) if m.kind == "queue" else None
    resource = (labels.get("resource") or None) if m.kind == "resource" else None
    flavor = (labels.get("flavor") or None) if m.kind == "resource" else None
    if m.kind == "resource" and resource is None:
        return None
    return RowKey(m.kind, m.scope, cq, ns, lq, co, status, pc, resource, flavor)


class _Plan(NamedTuple):
    """What a sample's name and labels decide, whatever its value: ``skip`` names the counter of a
    sample that goes nowhere ("" for none); else the value goes to row ``key``."""

    skip: str | None
    info: tuple[str, str, str | None] | None = None  # (cluster_queue, parent, root cohort) of a ClusterQueue info sample
    cq_status: tuple[str, str] | None = None  # (cluster_queue, status) of a ClusterQueue status sample
    key: RowKey | None = None
    cell: str | None = None
    component: str | None = None  # histogram part: bucket, sum or count
    le: float | None = None
    ident: tuple | None = None  # the series apart from what the row folds away (priority class when summing)
    cohort: str | None = None  # a row's cohort label (rows of ClusterQueues and LocalQueues)
    lq_cluster_queue: tuple[tuple[str, str], str] | None = None


def _custom_labels(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k.startswith("custom_") or "_custom_" in k))


def _plan(name: str, labels: Mapping[str, str], by_priority_class: bool) -> _Plan:
    if labels.get("replica_role") == "follower":
        return _Plan("follower_samples")
    if name == CLUSTER_QUEUE_INFO:
        cq, parent = labels.get("cluster_queue"), labels.get("parent_cohort")
        return _Plan("", info=(cq, parent, labels.get("root_cohort") or None) if cq and parent else None)
    if name == CLUSTER_QUEUE_STATUS:
        cq, status = labels.get("cluster_queue"), labels.get("status")
        if not cq or not status:
            return _Plan("samples_missing_labels")
        return _Plan("", cq_status=(cq, status))
    if name.endswith("_created"):
        return _Plan("created_samples")
    hit = _lookup(name)
    if hit is None:
        return _Plan("unmapped_samples")
    metric, m, component = hit
    key = _row_key(m, labels, by_priority_class)
    if key is None:
        return _Plan("samples_missing_labels")
    cell = component if component is not None else m.column
    le = None
    if component == "bucket":
        try:
            le = float(labels.get("le", ""))
        except ValueError:
            return _Plan("samples_bad_le")
    co = labels.get("cohort")
    lq_cq = None
    if m.scope == _LQ and labels.get("cluster_queue"):
        lq_cq = ((key.namespace, key.local_queue), labels["cluster_queue"])
    return _Plan(None, key=key, cell=cell, component=component, le=le,
                 # custom labels (Kueue's CustomMetricLabels: custom_<name>, or <kind>_custom_<name>
                 # as workload_custom_team) split one queue's series by a label's value: parts, summed
                 ident=(key, metric, cell, le, labels.get("priority_class"), _custom_labels(labels)),
                 cohort=co if co and m.scope != _CO else None, lq_cluster_queue=lq_cq)


# Plans kept per parser (the scrapes of one series repeat the same series): keyed by sample name and
# the identity of its labels (the parser hands out one labels dict per distinct series text; the
# entry holds that dict, so its identity is not reused while the entry lives).
_MAX_PLANS = 100_000


class ScrapeError(ValueError):
    """A scrape the exposition parser cannot read (a ``curl`` killed mid-write leaves a cut line),
    with the number of the first line it rejected."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


def parse_kueue_scrape(path_or_text: str | Path, sample_utc: dt.datetime, *, cluster: str | None = None,
                       source_file: str | None = None, by_priority_class: bool = False,
                       parser: SeriesParser | None = None) -> KueueScrape:
    """Parse one Kueue ``/metrics`` scrape taken at ``sample_utc``: a ``Path`` to read, or the text.
    ``parser`` (shared by the scrapes of a series) keeps the parsed series between calls. See the
    module docstring."""
    text, path = _text(path_or_text)
    src = source_file if source_file is not None else path
    scrape = KueueScrape(_utc(sample_utc, "sample_utc"), cluster, src)
    c = scrape.counters
    parser = parser or SeriesParser()
    samples = []
    for ln, item in parser.samples(text):
        if isinstance(item, str):
            raise ScrapeError(f"{src or 'Kueue scrape'}: invalid Prometheus exposition (line {ln}): {item}", ln)
        samples.append(item)
    plans: dict[tuple, tuple[Mapping[str, str], _Plan]] = parser.memo.setdefault(
        ("kueue_plans", by_priority_class), {})
    if len(plans) > _MAX_PLANS:
        plans.clear()
    # Samples summed over priority classes: remember which (row, column, pc, labels) were seen so
    # that a repeated series is a duplicate, not a second class.
    seen: dict[tuple, float] = {}
    if samples:
        c["samples"] += len(samples)
    for sample in samples:
        labels = sample.labels
        memo_key = (sample.name, id(labels))
        entry = plans.get(memo_key)
        if entry is None or entry[0] is not labels:
            entry = plans[memo_key] = (labels, _plan(sample.name, labels, by_priority_class))
        plan = entry[1]
        if plan.skip is not None:
            if plan.skip:
                c[plan.skip] += 1
            elif plan.info is not None:
                cq, parent, root = plan.info
                scrape.cq_cohort.setdefault(cq, parent)
                if root is not None:
                    scrape.cq_root.setdefault(cq, root)
            elif plan.cq_status is not None and float(sample.value) == 1:  # the current status: 1, the others 0
                cq, status = plan.cq_status
                if scrape.cq_status.setdefault(cq, status) != status:
                    c["conflicting_samples"] += 1
            continue
        key, cell, ident = plan.key, plan.cell, plan.ident
        value = float(sample.value)
        if ident in seen:
            same = seen[ident] == value or (math.isnan(seen[ident]) and math.isnan(value))
            c["duplicate_samples" if same else "conflicting_samples"] += 1
            continue
        seen[ident] = value
        if plan.cohort is not None:
            scrape.row_cohort.setdefault(key, plan.cohort)
        if plan.lq_cluster_queue is not None:
            scrape.lq_cluster_queue.setdefault(*plan.lq_cluster_queue)
        if plan.component is not None:
            h = scrape.hists.get(key)
            if h is None:
                h = scrape.hists[key] = _Hist()
            if math.isnan(value):
                c["nan_values"] += 1
                continue
            if plan.component == "bucket":
                h.buckets[plan.le] = h.buckets.get(plan.le, 0.0) + value
            elif plan.component == "sum":
                h.sum = (h.sum or 0.0) + value
            else:
                h.count = (h.count or 0.0) + value
            continue
        row = scrape.values.setdefault(key, {})
        if math.isnan(value):
            c["nan_values"] += 1
            row.setdefault(cell, None)
            continue
        if math.isinf(value):
            c["unlimited_values" if cell in _UNLIMITED_WHEN_INF else "infinite_values"] += 1
            row.setdefault(cell, None)
            continue
        prev = row.get(cell)
        row[cell] = value if prev is None else prev + value  # sums only over priority classes
    return scrape


#: A scrape interval more than this many times both intervals beside it is an outage (a collector
#: down for hours; a baseline scrape days old). Against its neighbours, not the day's median: a
#: collector that goes from 30-s to 2-minute scrapes has no outage. The demand's hold rule
#: (``demand.KUEUE_HOLD_GAP_FACTOR``) is the same factor.
OUTAGE_FACTOR = 3


def _after_outage(times: dict[tuple, list[dt.datetime]]) -> set[tuple]:
    """(series key, time) of the scrapes whose interval since the series' scrape before is an
    outage: longer than :data:`OUTAGE_FACTOR` x the series' interval before it and x its interval
    after it (x the one there is, at either end; a series with one interval has none)."""
    out = set()
    for key, t in times.items():
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(t)]
        for i, gap in enumerate(gaps):
            beside = [g for g in (gaps[i - 1] if i else None, gaps[i + 1] if i + 1 < len(gaps) else None)
                      if g is not None]
            if beside and all(gap > OUTAGE_FACTOR * g for g in beside):
                out.add((key, t[i + 1]))
    return out


class _Prev(NamedTuple):
    at: dt.datetime
    hist: _Hist


def _count(value: float | None, counters: Counter[str]) -> int | None:
    if value is None:
        return None
    if not math.isfinite(value) or value != int(value):
        counters["non_integer_counts"] += 1
        return None
    return int(value)


def kueue_demand(scrapes: Iterable[KueueScrape]) -> KueueResult:
    """The ``kueue_demand`` table of parsed scrapes (any order; deltas follow time per cluster).
    Two scrapes of one cluster at one time (e.g. the leader and a follower replica scraped in the
    same second): the one with the most series is read, the other skipped (``duplicate_scrapes``)."""
    ordered = sorted(scrapes, key=lambda s: (s.cluster or "", s.sample_utc, -(len(s.values) + len(s.hists))))
    counters: Counter[str] = Counter()
    files: list[str] = []
    cols: dict[str, list] = {f.name: [] for f in KUEUE_DEMAND.schema}
    prev: dict[tuple, _Prev] = {}
    # the scrapes read: the first of a cluster's at each time (the one with the most series)
    seen_times: set[tuple] = set()
    read: list[KueueScrape] = []
    for s in ordered:
        if (s.cluster, s.sample_utc) in seen_times:
            counters["duplicate_scrapes"] += 1
            continue
        seen_times.add((s.cluster, s.sample_utc))
        read.append(s)
    # each histogram series' scrape times, for its outages
    series_times: dict[tuple, list[dt.datetime]] = {}
    for s in read:
        for key in s.hists:
            series_times.setdefault((s.cluster, key), []).append(s.sample_utc)
    after_outage = _after_outage(series_times)

    def emit(s: KueueScrape, key: RowKey, values: Mapping[str, object]) -> None:
        cq = key.cluster_queue
        if key.scope == _LQ:
            cq = s.lq_cluster_queue.get((key.namespace, key.local_queue))
        cohort = key.cohort
        if cohort is None:
            cohort = s.row_cohort.get(key) or (s.cq_cohort.get(cq) if cq else None)
        base = {
            "sample_utc": s.sample_utc, "cluster": s.cluster, "kind": key.kind, "scope": key.scope,
            "cluster_queue": cq, "namespace": key.namespace, "local_queue": key.local_queue,
            "cohort": cohort, "root_cohort": s.cq_root.get(cq) if cq and key.scope != _LQ else None,
            "cluster_queue_status": s.cq_status.get(cq) if cq and key.scope == _CQ else None,
            "status": key.status, "priority_class": key.priority_class,
            "resource": key.resource, "flavor": key.flavor, "source_file": s.source_file,
        }
        for name, out in cols.items():
            if name in base:
                out.append(base[name])
            else:
                v = values.get(name)
                out.append(_count(v, counters) if name in _INT_COLUMNS and v is not None else v)

    for s in read:
        counters["scrapes"] += 1
        counters.update(s.counters)
        if s.source_file:
            files.append(s.source_file)
        for key, values in s.values.items():
            emit(s, key, values)
        for key, h in s.hists.items():
            values: dict[str, object] = {"wait_count_total": h.count, "wait_sum_total_s": h.sum}
            pk = (s.cluster, key)
            before = prev.get(pk)
            prev[pk] = _Prev(s.sample_utc, h)
            if before is not None:
                if (pk, s.sample_utc) in after_outage:
                    counters["intervals_after_gap"] += 1
                    values["interval_s"] = (s.sample_utc - before.at).total_seconds()
                else:
                    values.update(_interval(before, s.sample_utc, h, counters))
            emit(s, key, values)
    table = conform(pa.table({k: pa.array(v, type=KUEUE_DEMAND.schema.field(k).type) for k, v in cols.items()}),
                    KUEUE_DEMAND) if cols["sample_utc"] else KUEUE_DEMAND.empty()
    if table.num_rows > 1:
        table = table.sort_by([(k, "ascending") for k in KUEUE_DEMAND.key])
    counters["rows_out"] = table.num_rows
    return KueueResult(table=table, counters=counters, files=files)


def _interval(before: _Prev, at: dt.datetime, h: _Hist, counters: Counter[str]) -> dict[str, object]:
    b = before.hist
    reset = (
        set(b.buckets) != set(h.buckets)
        or (h.count or 0.0) < (b.count or 0.0)
        or (h.sum or 0.0) < (b.sum or 0.0)
        or any(h.buckets[le] < b.buckets[le] for le in h.buckets if le in b.buckets)
    )
    if reset:
        counters["counter_resets"] += 1
        d_buckets = dict(h.buckets)
        d_sum, d_count = h.sum, h.count
    else:
        d_buckets = {le: h.buckets[le] - b.buckets[le] for le in h.buckets}
        d_sum = None if h.sum is None or b.sum is None else h.sum - b.sum
        d_count = None if h.count is None or b.count is None else h.count - b.count
    out: dict[str, object] = {"interval_s": (at - before.at).total_seconds(), "wait_count_interval": d_count}
    if d_count and d_sum is not None:
        out["wait_mean_s"] = d_sum / d_count
    out["wait_p50_s"] = histogram_quantile(0.5, d_buckets)
    out["wait_p90_s"] = histogram_quantile(0.9, d_buckets)
    return out


def parse_kueue_scrapes(items: Iterable[tuple], *, cluster: str | None = None,
                        by_priority_class: bool = False) -> KueueResult:
    """``kueue_demand`` rows of ``(sample_utc, path or text[, source file])`` scrapes of one cluster."""
    parser = SeriesParser()
    return kueue_demand(
        parse_kueue_scrape(src, at, cluster=cluster, source_file=next(iter(rest), None),
                           by_priority_class=by_priority_class, parser=parser)
        for at, src, *rest in items
    )


__all__ = [
    "CLUSTER_QUEUE_INFO",
    "CLUSTER_QUEUE_STATUS",
    "KUEUE_DEMAND",
    "KUEUE_METRICS",
    "KueueMetric",
    "KueueResult",
    "KueueScrape",
    "histogram_quantile",
    "kueue_demand",
    "parse_kueue_scrape",
    "parse_kueue_scrapes",
]
