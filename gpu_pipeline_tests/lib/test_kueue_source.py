"""Kueue source end to end on the simulator: scrape files -> raw day -> kueue_demand, against truth."""

import datetime as dt

import duckdb
import pytest

from gpu_pipeline.lib.kueue import KUEUE_DEMAND
from gpu_pipeline.lib.kueue_source import clean_scrapes, raw_scrapes, scrape_time
from gpu_pipeline.lib.simulate import SimConfig, simulate

UTC = dt.UTC


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("kueue_sim")
    simulate(out, SimConfig(start=dt.date(2025, 8, 4), end=dt.date(2025, 8, 5), gpus=30, seed=5,
                            telemetry_interval_s=0, kueue_interval_s=900))
    return out


def test_day_of_scrapes_has_a_baseline_and_pending_matches_truth(sim):
    start, end = dt.datetime(2025, 8, 5, tzinfo=UTC), dt.datetime(2025, 8, 6, tzinfo=UTC)
    raw = raw_scrapes(sim / "kueue", start, end)
    inside = [r for r in raw.to_pylist() if r["in_window"]]
    assert len(inside) == 96 and sum(not r["in_window"] for r in raw.to_pylist()) == 5  # BASELINE_SCRAPES
    table, counters, _ = clean_scrapes(raw)
    assert table.schema == KUEUE_DEMAND.schema
    # every row names the file of its own scrape
    files = {r["scrape_utc"]: r["source_file"] for r in inside}
    assert table["source_file"].null_count == 0
    assert table["source_file"].to_pylist() == [files[t] for t in table["sample_utc"].to_pylist()]
    assert len(set(table["source_file"].to_pylist())) == 96
    # rows_out is the rows kept, not with the baseline scrapes' (it said 175 rows more in a sim day)
    assert counters["rows_out"] == table.num_rows
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("kd", table)
    got = dict(con.sql("""SELECT sample_utc, sum(pending_workloads) FROM kd
                          WHERE kind = 'queue' AND status = 'active' GROUP BY 1""").fetchall())
    want = dict(con.sql(
        """SELECT s.t, count(j.global_job_id)
           FROM (SELECT DISTINCT sample_utc AS t FROM kd) s
           LEFT JOIN read_parquet(?) j ON j.kind = 'primary' AND j.run_index = 0
                AND j.qdate_utc <= s.t AND (j.start_utc IS NULL OR j.start_utc > s.t)
           GROUP BY 1""", params=[str(sim / "truth" / "jobs.parquet")]).fetchall())
    assert got == want and len(got) == 96
    assert sum(want.values()) > 0  # the day had queued demand
    # admission waits: the interval mean is finite wherever jobs were admitted in the interval
    waits = con.sql("SELECT count(*) FROM kd WHERE kind = 'admission_wait' AND wait_count_interval > 0 "
                    "AND wait_mean_s IS NULL").fetchall()[0][0]
    assert waits == 0


def test_scrape_time_from_name_else_mtime(tmp_path):
    p = tmp_path / "kueue-20250805T101500Z.prom"
    p.write_text("")
    assert scrape_time(p) == dt.datetime(2025, 8, 5, 10, 15, tzinfo=UTC)
    q = tmp_path / "scrape.prom"
    q.write_text("")
    assert abs((scrape_time(q) - dt.datetime.now(UTC)).total_seconds()) < 60


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="Kueue scrape directory"):
        raw_scrapes(tmp_path / "nope", dt.datetime(2025, 8, 5, tzinfo=UTC), dt.datetime(2025, 8, 6, tzinfo=UTC))


def test_a_scrape_name_that_is_no_readable_file_is_an_error_naming_it(tmp_path):
    """A dangling link named like a scrape was skipped unseen (an hour's demand gone without a word)."""
    (tmp_path / "kueue-20250805T100000Z.prom").write_text(_scrape("leader", 3))
    (tmp_path / "kueue-20230101T000000Z.prom").symlink_to(tmp_path / "gone-long-ago.prom")  # no day's: skipped
    assert raw_scrapes(tmp_path, dt.datetime(2025, 8, 5, tzinfo=UTC), dt.datetime(2025, 8, 6, tzinfo=UTC)).num_rows == 1
    (tmp_path / "kueue-20250805T101500Z.prom").symlink_to(tmp_path / "gone.prom")
    with pytest.raises(FileNotFoundError, match=r"kueue-20250805T101500Z\.prom: a Kueue scrape file name, but not"):
        raw_scrapes(tmp_path, dt.datetime(2025, 8, 5, tzinfo=UTC), dt.datetime(2025, 8, 6, tzinfo=UTC))


def _scrape(role: str, pending: int) -> str:
    return (f'# TYPE kueue_pending_workloads gauge\n'
            f'kueue_pending_workloads{{cluster_queue="cq",status="active",replica_role="{role}"}} {pending}\n')


def test_an_empty_or_one_line_scrape_is_text_not_a_path(tmp_path):
    """A 0-byte scrape (a failed ``curl -s ... > file``) reads as a scrape without series, and a
    one-line scrape without its last newline is text, set aside as a scrape cut mid-line (a text
    without a newline was taken for a file path: IsADirectoryError / FileNotFoundError naming the
    metric line)."""
    day = dt.datetime(2025, 8, 6, tzinfo=dt.UTC)
    (tmp_path / "kueue-20250806T095900Z.prom").write_text(_scrape("leader", 1))
    (tmp_path / "kueue-20250806T100000Z.prom").write_text("")
    (tmp_path / "kueue-20250806T100100Z.prom").write_text(
        'kueue_pending_workloads{cluster_queue="cq",status="active"} 3')
    table, counters, quarantine = clean_scrapes(raw_scrapes(tmp_path, day, day + dt.timedelta(days=1)), "k8s")
    assert (counters["scrapes"], counters["scrapes_unreadable"]) == (2, 1)
    assert [(r["sample_utc"].minute, r["pending_workloads"], r["source_file"].rsplit("/", 1)[1])
            for r in table.to_pylist()] == [(59, 1, "kueue-20250806T095900Z.prom")]
    assert [(q["source_file"].rsplit("/", 1)[1], q["source_row"]) for q in quarantine.to_pylist()] == [
        ("kueue-20250806T100100Z.prom", 1)]


def test_the_leader_and_a_follower_scraped_in_the_same_second(tmp_path):
    """Every replica scraped into its own file, two of them in the same second: the leader's series
    are read (the follower's scrape, whose samples are all dropped, came first and the leader's was
    skipped as the time's duplicate), and each row names the file it came from."""
    day = dt.datetime(2025, 8, 6, tzinfo=dt.UTC)
    (tmp_path / "kueue-a-follower-20250806T100000Z.prom").write_text(_scrape("follower", 4))
    (tmp_path / "kueue-b-leader-20250806T100000Z.prom").write_text(_scrape("leader", 5))
    table, counters, _ = clean_scrapes(raw_scrapes(tmp_path, day, day + dt.timedelta(days=1)), "k8s")
    assert [(r["pending_workloads"], r["source_file"].rsplit("/", 1)[1]) for r in table.to_pylist()] == [
        (5, "kueue-b-leader-20250806T100000Z.prom")]
    assert counters["duplicate_scrapes"] == 1


def _wait_histogram(role: str, count: int, total_s: float) -> str:
    labels = f'cluster_queue="cq",priority_class="",replica_role="{role}"'
    return ("# TYPE kueue_admission_wait_time_seconds histogram\n"
            f'kueue_admission_wait_time_seconds_bucket{{{labels},le="60"}} {count}\n'
            f'kueue_admission_wait_time_seconds_bucket{{{labels},le="+Inf"}} {count}\n'
            f"kueue_admission_wait_time_seconds_sum{{{labels}}} {total_s}\n"
            f"kueue_admission_wait_time_seconds_count{{{labels}}} {count}\n")


@pytest.mark.parametrize("last_before_midnight", ["follower", "empty", "truncated"])
def test_the_days_baseline_is_the_last_readable_leader_scrape(tmp_path, last_before_midnight):
    """The last file before midnight may be another replica's (one file per replica), a failed
    ``curl``'s empty file or a truncated one: the day's first admission-wait interval still has the
    leader's scrape before it as its baseline (it had none: its 30 admissions were lost), and a
    truncated file of the day before does not fail this day (it failed both days)."""
    day = dt.datetime(2026, 8, 6, tzinfo=UTC)
    (tmp_path / "kueue-20260805T235900Z.prom").write_text(_wait_histogram("leader", 100, 1000))
    last = {"follower": _wait_histogram("follower", 0, 0), "empty": "",
            "truncated": 'kueue_admission_wait_time_seconds_count{cluster_queue="cq",replica_role'}
    (tmp_path / "kueue-20260805T235930Z.prom").write_text(last[last_before_midnight])
    (tmp_path / "kueue-20260806T001400Z.prom").write_text(_wait_histogram("leader", 130, 1600))
    (tmp_path / "kueue-20260231T000000Z.prom").write_text("")  # a stamp that is no time: its mtime
    table, counters, _ = clean_scrapes(raw_scrapes(tmp_path, day, day + dt.timedelta(days=1)), "k8s")
    (row,) = [r for r in table.to_pylist() if r["kind"] == "admission_wait"]
    assert (row["wait_count_interval"], row["wait_mean_s"]) == (30, 20.0)
    assert counters.get("baseline_scrapes_unreadable", 0) == (last_before_midnight == "truncated")


def test_an_unreadable_scrape_of_the_day_is_set_aside_and_the_others_kept(tmp_path):
    """A scrape cut mid-line (a ``curl`` killed while writing) failed the whole day: it is set aside
    whole (quarantine row: the file, the line, the reason), counted, and the day's other scrapes
    give their rows; the scrape before it stands for the time."""
    day = dt.datetime(2025, 8, 4, tzinfo=UTC)
    for minute, pending in ((0, 1), (1, 2), (2, 4)):
        (tmp_path / f"kueue-20250804T10{minute:02d}00Z.prom").write_text(_scrape("leader", pending))
    cut = _scrape("leader", 9)
    (tmp_path / "kueue-20250804T100300Z.prom").write_text(cut[:cut.rindex("{") + 20])
    table, counters, quarantine = clean_scrapes(raw_scrapes(tmp_path, day, day + dt.timedelta(days=1)), "k8s")
    assert counters["scrapes_unreadable"] == 1
    assert sorted({(r["sample_utc"].minute, r["pending_workloads"]) for r in table.to_pylist()}) == [(0, 1), (1, 2), (2, 4)]
    (q,) = quarantine.to_pylist()
    assert q["source_file"].endswith("kueue-20250804T100300Z.prom") and q["reason"].startswith("unreadable scrape: ")
    assert q["source_row"] == cut[:cut.rindex("{")].count("\n") + 1
    assert q["record_utc"] == dt.datetime(2025, 8, 4, 10, 3, tzinfo=UTC)


def test_a_scrape_cut_in_its_last_value_is_set_aside_whole(tmp_path):
    """A curl killed after the "3" of "37": the cut line is well formed, so the scrape read as 3
    pending workloads. The format ends every line with a line feed: a scrape without its last one
    is set aside whole, as a cut that leaves an unreadable line is."""
    day = dt.datetime(2025, 8, 4, tzinfo=UTC)
    (tmp_path / "kueue-20250804T100000Z.prom").write_text(_scrape("leader", 2))
    (tmp_path / "kueue-20250804T100100Z.prom").write_text(_scrape("leader", 37)[:-2])  # "... 3"
    table, counters, quarantine = clean_scrapes(raw_scrapes(tmp_path, day, day + dt.timedelta(days=1)), "k8s")
    assert counters["scrapes_unreadable"] == 1
    assert {(r["sample_utc"].minute, r["pending_workloads"]) for r in table.to_pylist()} == {(0, 2)}
    (q,) = quarantine.to_pylist()
    assert q["source_file"].endswith("kueue-20250804T100100Z.prom") and "ends mid-line" in q["reason"]
    assert q["source_row"] == 2


def _status_scrape(statuses: dict[str, str]) -> str:
    return "# TYPE kueue_cluster_queue_status gauge\n" + "".join(
        f'kueue_cluster_queue_status{{cluster_queue="{cq}",replica_role="leader",status="{s}"}} {int(s == status)}\n'
        for cq, status in statuses.items() for s in ("pending", "active", "terminated"))


def test_the_days_inactive_cluster_queues_are_counted(tmp_path):
    """cq-b is pending in two of the day's scrapes and cq-c terminated in one (their quota is no
    capacity): the day counts 2 inactive queues; a queue inactive only in the baseline scrape of the
    day before is not the day's."""
    day = dt.datetime(2025, 8, 4, tzinfo=UTC)
    (tmp_path / "kueue-20250803T235900Z.prom").write_text(_status_scrape({"cq-a": "active", "cq-d": "pending"}))
    (tmp_path / "kueue-20250804T100000Z.prom").write_text(_status_scrape({"cq-a": "active", "cq-b": "pending"}))
    (tmp_path / "kueue-20250804T100100Z.prom").write_text(
        _status_scrape({"cq-a": "active", "cq-b": "pending", "cq-c": "terminated"}))
    _, counters, _ = clean_scrapes(raw_scrapes(tmp_path, day, day + dt.timedelta(days=1)), "k8s")
    assert counters["inactive_cluster_queues"] == 2
