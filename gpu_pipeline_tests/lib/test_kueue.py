"""Kueue /metrics scrapes -> kueue_demand: our fixture scrapes (exact values), edge cases, and the
real metrics reference (every documented pending / usage / quota / admission-wait metric is mapped)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from gpu_pipeline.lib.kueue import (
    KUEUE_DEMAND,
    KUEUE_METRICS,
    histogram_quantile,
    kueue_demand,
    parse_kueue_scrape,
    parse_kueue_scrapes,
)

UTC = dt.UTC
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kueue"
REAL = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "real"
DOCS = REAL / "kueue" / "kueue_metrics_reference_docs.md"
needs_docs = pytest.mark.skipif(
    not DOCS.is_file(), reason=f"Kueue metrics reference not found at {DOCS} (../shared/fixtures/real beside the repo)"
)
T0 = dt.datetime(2026, 1, 10, 12, tzinfo=UTC)
T1 = T0 + dt.timedelta(seconds=60)
S0, S1 = FIXTURES / "kueue-metrics-0.prom", FIXTURES / "kueue-metrics-1.prom"
TiB = 1099511627776


def one(table, **where) -> dict:
    """The single row matching every ``column=value`` (None matches null)."""
    rows = [r for r in table.to_pylist() if all(r[k] == v for k, v in where.items())]
    assert len(rows) == 1, (where, rows)
    return rows[0]


@pytest.fixture(scope="module")
def both():
    # Given out of order on purpose: deltas follow time, not input order.
    return parse_kueue_scrapes([(T1, S1), (T0, S0)], cluster="k8s-a")


def test_schema_rows_and_counters(both) -> None:
    t = both.table
    assert t.schema == KUEUE_DEMAND.schema
    assert both.rows == 2 * 29
    assert sorted(set(t.column("sample_utc").to_pylist())) == [T0, T1]
    assert set(t.column("cluster").to_pylist()) == {"k8s-a"}
    assert both.files == [str(S0), str(S1)]
    c = both.counters
    assert c["scrapes"] == 2 and c["samples"] == 270 and c["unmapped_samples"] == 18  # 6 status samples each are read
    assert c["unlimited_values"] == 4 and c["nan_values"] == 2
    for k in ("follower_samples", "duplicate_samples", "conflicting_samples", "samples_missing_labels",
              "counter_resets", "non_integer_counts", "infinite_values"):
        assert c[k] == 0, k
    keys = [tuple(r[k] for k in KUEUE_DEMAND.key) for r in t.to_pylist()]
    assert len(keys) == len(set(keys))


def test_pending_workloads(both) -> None:
    t = both.table
    q = {"sample_utc": T1, "kind": "queue"}
    r = one(t, **q, scope="cluster_queue", cluster_queue="gpu-a100", status="active")
    assert (r["pending_workloads"], r["pending_scheduling_hashes"], r["cohort"]) == (5, 3, "gpus")
    assert one(t, **q, scope="cluster_queue", cluster_queue="gpu-a100", status="inadmissible")["pending_workloads"] == 0
    assert one(t, **q, scope="cluster_queue", cluster_queue="gpu-h100", status="inadmissible")["pending_workloads"] == 2
    assert one(t, sample_utc=T0, kind="queue", scope="cluster_queue", cluster_queue="gpu-a100",
               status="active")["pending_workloads"] == 3
    r = one(t, **q, scope="cluster_queue", cluster_queue="gpu-a100", status=None)
    assert (r["admitted_active_workloads"], r["reserving_active_workloads"], r["admitted_workloads_total"],
            r["weighted_share"], r["pending_workloads"]) == (7, 7, 21, 125.0, None)
    assert one(t, **q, scope="cluster_queue", cluster_queue="gpu-h100", status=None)["quota_reserved_workloads_total"] == 2
    lq = one(t, **q, scope="local_queue", namespace="team-a", local_queue="team-a-queue", status="active")
    # The LocalQueue's ClusterQueue comes from the fair-sharing metric, its cohort from cluster_queue_info.
    assert (lq["pending_workloads"], lq["cluster_queue"], lq["cohort"]) == (4, "gpu-a100", "gpus")
    assert one(t, **q, scope="local_queue", local_queue="team-a-queue", status=None)["fair_sharing_usage"] == 0.47
    lq_b = one(t, **q, scope="local_queue", local_queue="team-b-queue", status="active")
    assert (lq_b["pending_workloads"], lq_b["cluster_queue"], lq_b["cohort"]) == (1, None, None)
    co = one(t, **q, scope="cohort", cohort="gpus")
    assert co["weighted_share"] is None  # NaN


def test_resources(both) -> None:
    t = both.table
    r = one(t, sample_utc=T1, kind="resource", scope="cluster_queue", cluster_queue="gpu-a100",
            flavor="a100-80gb", resource="nvidia.com/gpu")
    assert (r["resource_usage"], r["resource_reservation"], r["nominal_quota"], r["borrowing_limit"],
            r["lending_limit"], r["cohort"]) == (14.0, 14.0, 16.0, None, 4.0, "gpus")
    h = one(t, sample_utc=T1, kind="resource", cluster_queue="gpu-h100", flavor="h100-80gb", resource="nvidia.com/gpu")
    assert (h["borrowing_limit"], h["lending_limit"], h["resource_usage"]) == (0.0, None, 8.0)
    mem = one(t, sample_utc=T1, kind="resource", cluster_queue="gpu-a100", flavor="a100-80gb", resource="memory")
    assert (mem["nominal_quota"], mem["resource_usage"]) == (2 * TiB, 896 * 2**30)
    p = one(t, sample_utc=T1, kind="resource", cluster_queue="gpu-a100", flavor=None, resource="nvidia.com/gpu")
    assert (p["resource_pending"], p["resource_usage"]) == (12.0, None)
    assert one(t, sample_utc=T0, kind="resource", cluster_queue="gpu-a100", flavor=None,
               resource="cpu")["resource_pending"] == 40.0
    lq = one(t, sample_utc=T1, kind="resource", scope="local_queue", local_queue="team-a-queue")
    assert (lq["resource_usage"], lq["flavor"], lq["namespace"]) == (10.0, "a100-80gb", "team-a")
    co = one(t, sample_utc=T1, kind="resource", scope="cohort", flavor="a100-80gb")
    assert (co["nominal_quota"], co["resource_reservation"], co["cluster_queue"]) == (16.0, 14.0, None)


def test_admission_wait_from_the_histogram_deltas(both) -> None:
    t = both.table
    w = {"kind": "admission_wait", "scope": "cluster_queue", "cluster_queue": "gpu-a100"}
    first = one(t, sample_utc=T0, **w)
    assert (first["wait_count_total"], first["wait_sum_total_s"]) == (13, 160.0)
    assert [first[k] for k in ("interval_s", "wait_count_interval", "wait_mean_s", "wait_p50_s", "wait_p90_s")] == [None] * 5
    r = one(t, sample_utc=T1, **w)
    assert (r["wait_count_total"], r["wait_sum_total_s"], r["interval_s"], r["wait_count_interval"]) == (21, 420.0, 60.0, 8)
    assert r["wait_mean_s"] == 32.5 and r["wait_p50_s"] == 16.0
    assert r["wait_p90_s"] == pytest.approx(76.8, rel=1e-12)
    assert (r["priority_class"], r["cohort"]) == (None, "gpus")
    empty = one(t, sample_utc=T1, kind="admission_wait", cluster_queue="gpu-h100")
    assert (empty["wait_count_interval"], empty["wait_mean_s"], empty["wait_p50_s"]) == (0, None, None)
    lq = one(t, sample_utc=T1, kind="admission_wait", scope="local_queue", local_queue="team-a-queue")
    assert (lq["wait_count_interval"], lq["wait_mean_s"], lq["wait_p50_s"]) == (3, 12.0, 10.0)
    assert lq["wait_p90_s"] == pytest.approx(14.8, rel=1e-12)
    qr = one(t, sample_utc=T1, kind="quota_reserved_wait", cluster_queue="gpu-h100")
    assert (qr["wait_count_interval"], qr["wait_mean_s"], qr["wait_p50_s"], qr["wait_p90_s"]) == (1, 900.0, 512.0, 512.0)


def test_by_priority_class() -> None:
    res = parse_kueue_scrapes([(T0, S0), (T1, S1)], by_priority_class=True)
    t = res.table
    w = {"sample_utc": T1, "kind": "admission_wait", "scope": "cluster_queue", "cluster_queue": "gpu-a100"}
    hi = one(t, **w, priority_class="high")
    assert (hi["wait_count_interval"], hi["wait_p50_s"]) == (6, 12.0)
    assert hi["wait_mean_s"] == pytest.approx(110 / 6)
    none = one(t, **w, priority_class="")
    assert (none["wait_count_interval"], none["wait_mean_s"], none["wait_p50_s"]) == (2, 75.0, 64.0)
    assert none["wait_p90_s"] == pytest.approx(115.2, rel=1e-12)
    assert one(t, sample_utc=T1, kind="queue", cluster_queue="gpu-a100", status=None,
               priority_class="high")["admitted_workloads_total"] == 16
    assert one(t, sample_utc=T1, kind="queue", cluster_queue="gpu-a100", status=None,
               priority_class="")["admitted_workloads_total"] == 5
    # Gauges have no priority class: their rows are the same either way.
    assert one(t, sample_utc=T1, kind="queue", scope="cluster_queue", cluster_queue="gpu-a100",
               status="active", priority_class=None)["pending_workloads"] == 5


HIST = "kueue_admission_wait_time_seconds"


def hist_text(counts: list[int], total: float, role: str = "leader", extra: str = "") -> str:
    les = ["1", "10", "+Inf"]
    lines = [f"# TYPE {HIST} histogram"]
    for le, cnt in zip(les, counts, strict=True):
        lines.append(f'{HIST}_bucket{{cluster_queue="q",le="{le}",priority_class="",replica_role="{role}"{extra}}} {cnt}')
    lines.append(f'{HIST}_sum{{cluster_queue="q",priority_class="",replica_role="{role}"{extra}}} {total}')
    lines.append(f'{HIST}_count{{cluster_queue="q",priority_class="",replica_role="{role}"{extra}}} {counts[-1]}')
    return "\n".join(lines) + "\n"


def test_counter_reset_uses_the_current_values() -> None:
    scrapes = [
        (T0, hist_text([5, 9, 10], 100.0)),
        (T0 + dt.timedelta(seconds=30), hist_text([5, 11, 12], 130.0)),
        (T0 + dt.timedelta(seconds=60), hist_text([1, 2, 2], 8.0)),  # the controller restarted
    ]
    res = parse_kueue_scrapes(scrapes)
    rows = res.table.to_pylist()
    assert [r["wait_count_interval"] for r in rows] == [None, 2, 2]
    assert [r["wait_mean_s"] for r in rows] == [None, 15.0, 4.0]
    assert rows[1]["wait_p50_s"] == 1 + 9 * 0.5  # rank 1 of 2 in (1, 10]
    assert rows[2]["wait_p50_s"] == 1.0  # rank 1 of 2, the first bucket (0, 1]
    assert res.counters["counter_resets"] == 1
    assert [r["source_file"] for r in rows] == [None, None, None]


def test_waits_across_a_collector_outage_are_not_the_next_scrapes() -> None:
    """Scrapes every minute, none for 8 hours, then every minute again: the first scrape after the
    gap would take the whole outage's admissions (and their long waits) as its interval's, crediting
    them to the hour after the outage. Its wait columns are null (``interval_s`` says how long the
    gap was), counted; the next interval is read again."""
    scrapes, count, total = [], 0, 0.0
    for k in range(60 * 12):
        count += 1
        total += 3600.0 if 120 <= k < 600 else 5.0  # long waits during the outage, 5 s otherwise
        if 120 <= k < 600:
            continue  # the collector is down from 02:00 to 10:00
        scrapes.append((T0 + dt.timedelta(minutes=k), hist_text([0, count, count], total)))
    res = parse_kueue_scrapes(scrapes)
    rows = {r["sample_utc"]: r for r in res.table.to_pylist()}
    after = rows[T0 + dt.timedelta(hours=10)]
    assert after["interval_s"] == 8 * 3600 + 60 and after["wait_mean_s"] is None
    assert after["wait_count_interval"] is None and after["wait_p50_s"] is None
    assert rows[T0 + dt.timedelta(hours=10, minutes=1)]["wait_mean_s"] == 5.0
    assert rows[T0 + dt.timedelta(hours=1)]["wait_mean_s"] == 5.0
    assert res.counters["intervals_after_gap"] == 1
    # a collector going from 30-s to 2-minute scrapes has no outage: every interval keeps its waits
    scrapes, count = [], 0
    for k in range(200):
        count += 2
        at = T0 + dt.timedelta(seconds=30 * k if k < 100 else 3000 + 120 * (k - 100))
        scrapes.append((at, hist_text([0, count, count], 5.0 * count)))
    res = parse_kueue_scrapes(scrapes)
    assert [r["wait_mean_s"] for r in res.table.to_pylist()][1:] == [5.0] * 199
    assert "intervals_after_gap" not in res.counters


def test_followers_duplicates_missing_labels_and_untyped() -> None:
    text = (
        hist_text([1, 2, 2], 3.0, role="follower")
        + "# TYPE kueue_pending_workloads gauge\n"
        + 'kueue_pending_workloads{cluster_queue="q",replica_role="follower",status="active"} 9\n'
        + 'kueue_pending_workloads{cluster_queue="q",replica_role="leader",status="active"} 4\n'
        + 'kueue_pending_workloads{cluster_queue="q",replica_role="leader",status="active"} 4\n'
        + 'kueue_pending_workloads{status="active",cluster_queue="q",replica_role="leader"} 5\n'
        + 'kueue_pending_workloads{replica_role="leader",status="active"} 1\n'
        + 'kueue_pending_workloads{cluster_queue="r",status="inadmissible"} 2.5\n'
    )
    s = parse_kueue_scrape(text, T0)
    res = kueue_demand([s])
    assert [(r["cluster_queue"], r["status"], r["pending_workloads"]) for r in res.table.to_pylist()] == [
        ("q", "active", 4), ("r", "inadmissible", None)]
    c = res.counters
    assert c["follower_samples"] == 6 and c["duplicate_samples"] == 1 and c["conflicting_samples"] == 1
    assert c["samples_missing_labels"] == 1 and c["non_integer_counts"] == 1


@pytest.mark.parametrize("label", ["custom_team", "workload_custom_team"])
def test_custom_metric_labels_split_a_queues_series_into_parts_that_add_up(label) -> None:
    """Kueue's CustomMetricLabels add labels read from the queue or from its workloads (named
    custom_<name>, or <kind>_custom_<name>): a queue's pending workloads come as one series per
    value of a workload's label, parts of one count (the second and third were dropped as
    duplicates / conflicts)."""
    text = "# TYPE kueue_pending_workloads gauge\n" + "".join(
        f'kueue_pending_workloads{{cluster_queue="cq",{label}="{team}",replica_role="leader",status="active"}} {n}\n'
        for team, n in (("vision", 2), ("nlp", 2), ("speech", 5)))
    res = kueue_demand([parse_kueue_scrape(text, T0)])
    assert [(r["cluster_queue"], r["pending_workloads"]) for r in res.table.to_pylist()] == [("cq", 9)]
    assert res.counters.get("duplicate_samples", 0) == res.counters.get("conflicting_samples", 0) == 0


def test_scrape_without_type_lines_gives_the_same_rows() -> None:
    strip = [ln for ln in S1.read_text().splitlines() if not ln.startswith("#")]
    untyped = parse_kueue_scrape("\n".join(strip) + "\n", T1, source_file=str(S1))
    typed = parse_kueue_scrape(S1, T1)
    assert kueue_demand([untyped]).table.equals(kueue_demand([typed]).table)


@pytest.mark.parametrize("by_pc", [False, True])
def test_a_shared_parser_gives_each_scrape_what_a_fresh_one_gives(by_pc) -> None:
    """What a parser keeps between the scrapes of a series (parsed series, per-series plans) changes
    nothing: every scrape, cohorts and counters included, equals the scrape parsed alone."""
    from gpu_pipeline.lib.exposition import SeriesParser

    shared = SeriesParser()
    extra = hist_text([1, 2, 2], 3.0, role="follower") + 'kueue_pending_workloads{replica_role="leader",status="active"} 1\n'
    for at, src in [(T0, S0), (T1, S1), (T1, S1), (T0, S0.read_text() + extra)]:
        again = parse_kueue_scrape(src, at, by_priority_class=by_pc, parser=shared)
        alone = parse_kueue_scrape(src, at, by_priority_class=by_pc)
        assert again == alone
        assert again.cq_cohort and again.row_cohort and again.lq_cluster_queue and again.hists
    # the other grouping on the same parser keeps its own plans
    assert parse_kueue_scrape(S1, T1, by_priority_class=not by_pc, parser=shared) == parse_kueue_scrape(
        S1, T1, by_priority_class=not by_pc)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="scrape.prom: invalid Prometheus exposition"):
        parse_kueue_scrape('kueue_pending_workloads{cluster_queue="q" 1\n', T0, source_file="scrape.prom")
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_kueue_scrape(S0, dt.datetime(2026, 1, 1))
    empty = parse_kueue_scrapes([])
    assert empty.rows == 0 and empty.table.schema == KUEUE_DEMAND.schema
    dup = parse_kueue_scrapes([(T0, S0), (T0, S1)])
    assert dup.counters["duplicate_scrapes"] == 1 and dup.rows == 29


def test_histogram_quantile_matches_prometheus_rules() -> None:
    inf = float("inf")
    assert histogram_quantile(0.5, {1.0: 0, 2.0: 2, 4.0: 4, inf: 4}) == 2.0
    assert histogram_quantile(0.25, {1.0: 0, 2.0: 2, 4.0: 4, inf: 4}) == 1.5
    assert histogram_quantile(0.5, {1.0: 2, inf: 2}) == 0.5  # first bucket starts at 0
    assert histogram_quantile(0.99, {1.0: 1, 5.0: 1, inf: 10}) == 5.0  # +Inf bucket -> highest bound
    assert histogram_quantile(0.5, {-1.0: 3, inf: 3}) == -1.0
    assert histogram_quantile(0.5, {1.0: 0, inf: 0}) is None
    assert histogram_quantile(0.5, {1.0: 3, 2.0: 3}) is None  # no +Inf bucket
    with pytest.raises(ValueError):
        histogram_quantile(1.5, {inf: 1})


# ----------------------------------------------------------------------------------------------
# The real metrics reference
# ----------------------------------------------------------------------------------------------

_ROW_RE = re.compile(r"^\| `(?P<name>[a-z_]+)` \| (?P<type>Gauge|Counter|Histogram) \| .* \| (?P<labels>[^|]*) \|\s*$")


def documented() -> dict[str, tuple[str, set[str]]]:
    out = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        m = _ROW_RE.match(line)
        if m:
            out[m["name"]] = (m["type"].lower(), set(re.findall(r"`(\w+)`:", m["labels"])))
    return out


@needs_docs
def test_every_documented_demand_metric_is_mapped() -> None:
    docs = documented()
    assert len(docs) > 50  # the tables were read
    wanted = {n for n in docs if re.search(r"pending|usage|quota|admission_wait", n)}
    assert {"kueue_pending_workloads", "kueue_local_queue_pending_workloads", "kueue_admission_wait_time_seconds",
            "kueue_cluster_queue_resource_usage", "kueue_cluster_queue_nominal_quota"} <= wanted
    assert wanted - KUEUE_METRICS.keys() == set()
    # Nothing invented: every mapped name is documented, with the documented type and the labels
    # the row identity needs.
    for name, m in KUEUE_METRICS.items():
        assert name in docs, name
        doc_type, labels = docs[name]
        assert m.type == doc_type, name
        need = {"cluster_queue": {"cluster_queue"}, "local_queue": {"name", "namespace"},
                "cohort": {"cohort"}}[m.scope]
        if m.kind == "resource":
            need = need | {"resource"} | ({"flavor"} if m.column != "resource_pending" else set())
        if m.column in ("pending_workloads", "pending_scheduling_hashes"):
            need = need | {"status"}
        assert need <= labels, (name, need - labels)


# ----------------------------------------------------------------------------------------------
# ClusterQueue status (kueue_cluster_queue_status): an inactive queue cannot admit
# ----------------------------------------------------------------------------------------------

def _status_text(statuses: dict[str, dict[str, float]], role: str = "leader") -> str:
    """A scrape with each ClusterQueue's quota (8 GPUs) and ``kueue_cluster_queue_status`` samples."""
    lines = ["# TYPE kueue_cluster_queue_nominal_quota gauge"]
    for cq in statuses:
        lines.append(f'kueue_cluster_queue_nominal_quota{{cluster_queue="{cq}",flavor="a100",replica_role="{role}",'
                     f'resource="nvidia.com/gpu"}} 8')
    lines.append("# TYPE kueue_cluster_queue_status gauge")
    for cq, values in statuses.items():
        for status, v in values.items():
            lines.append(f'kueue_cluster_queue_status{{cluster_queue="{cq}",replica_role="{role}",'
                         f'status="{status}"}} {v:g}')
    return "\n".join(lines) + "\n"


def test_cluster_queue_status_is_read_onto_the_queues_rows(both) -> None:
    """The fixture's queues are both active: every ClusterQueue row says so (the status samples are
    read, no longer unmapped); LocalQueue and cohort rows have none."""
    t = both.table
    cq_rows = [r for r in t.to_pylist() if r["scope"] == "cluster_queue"]
    assert cq_rows and {r["cluster_queue_status"] for r in cq_rows} == {"active"}
    assert {r["cluster_queue_status"] for r in t.to_pylist() if r["scope"] != "cluster_queue"} == {None}
    text = _status_text({"cq-a": {"active": 1, "pending": 0, "terminated": 0},
                         "cq-b": {"active": 0, "pending": 1, "terminated": 0},
                         "cq-c": {"active": 0, "pending": 0, "terminated": 1},
                         "cq-d": {"active": 0, "pending": 0, "terminated": 0}})  # none at 1: unknown
    res = parse_kueue_scrapes([(T0, text)], cluster="k8s")
    got = {r["cluster_queue"]: r["cluster_queue_status"] for r in res.table.to_pylist()}
    assert got == {"cq-a": "active", "cq-b": "pending", "cq-c": "terminated", "cq-d": None}
    assert res.counters["unmapped_samples"] == 0 and res.counters["conflicting_samples"] == 0
    # a queue with two statuses at 1 (a broken exporter): the first is kept, the second counted
    two = parse_kueue_scrapes([(T0, _status_text({"q": {"pending": 1, "active": 1}}))])
    assert one(two.table, cluster_queue="q")["cluster_queue_status"] == "pending"
    assert two.counters["conflicting_samples"] == 1
    # a follower replica's status is dropped with its other samples
    follower = parse_kueue_scrapes([(T0, _status_text({"q": {"pending": 1}}, role="follower"))])
    assert follower.rows == 0 and follower.counters["follower_samples"] == 2


@needs_docs
def test_cluster_queue_status_is_the_documented_metric() -> None:
    from gpu_pipeline.lib.kueue import CLUSTER_QUEUE_STATUS
    doc_type, labels = documented()[CLUSTER_QUEUE_STATUS]
    assert doc_type == "gauge" and {"cluster_queue", "status"} <= labels
