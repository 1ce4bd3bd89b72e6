"""Extraction with the real ``elasticsearch`` client against the local stand-in server."""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import logging
import random
import socket
import time
import urllib.error
import urllib.request

import pytest

from gpu_pipeline.lib.es_source import (
    EsConfig,
    EsSourceError,
    _retry_after_s,
    build_query,
    fetch_jobs,
    make_client,
)
from gpu_pipeline.lib.jobs import jobs_overlapping, normalize_docs
from gpu_pipeline_tests.es_server import EsStandIn

INDEX = "adstash-ospool-job-history"
DAY = 86400
D0 = 1754352000  # 2025-08-05T00:00:00Z
START, END = dt.datetime(2025, 8, 6, tzinfo=dt.UTC), dt.datetime(2025, 8, 7, tzinfo=dt.UTC)
S, E = D0 + DAY, D0 + 2 * DAY
API_KEY = "VnVhQ2ZHY0JDZGJrUW0tZTVhT3g6dWkybHAyYXhUTm1zeWFrdzl0dk5udw=="


def make_docs(n: int = 400, seed: int = 11) -> list[dict]:
    """adstash-like history documents over three days, every shape the query must tell apart."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        q = D0 - DAY // 2 + rng.randrange(3 * DAY)
        d = {"GlobalJobId": f"submit1.chtc.wisc.edu#{4000000 + i}.0#{q}", "ClusterId": 4000000 + i, "ProcId": 0,
             "QDate": q, "Owner": "alice", "MyType": "Job", "RequestGpus": 1}
        kind = rng.random()
        if kind < 0.1:  # removed before it started
            rec = q + rng.randrange(1, 8 * 3600)
            d.update(JobStatus=3, CompletionDate=0, EnteredCurrentStatus=rec, RecordTime=rec)
        else:
            start = q + rng.randrange(0, 6 * 3600)
            end = start + rng.randrange(600, 30 * 3600)
            d.update(JobCurrentStartDate=start, JobStartDate=start, NumJobStarts=1)
            if kind < 0.7:  # completed
                d.update(JobStatus=4, CompletionDate=end, EnteredCurrentStatus=end, RecordTime=end)
            elif kind < 0.9:  # evicted then removed (no CompletionDate at all)
                d.update(JobStatus=3, LastVacateTime=end, EnteredCurrentStatus=end + 60, RecordTime=end + 60)
            else:  # epoch of an evicted run
                d.update(JobStatus=1, CompletionDate=0, LastVacateTime=end, EpochWriteDate=end, RecordTime=end)
        docs.append(d)
    # history that must NOT come back: removed long ago after starting (CompletionDate 0)
    for i in range(20):
        q = D0 - 40 * DAY + i * 3600
        docs.append({"GlobalJobId": f"old.example.org#{i}.0#{q}", "QDate": q, "JobCurrentStartDate": q + 60,
                     "JobStatus": 3, "CompletionDate": 0, "EnteredCurrentStatus": q + 7200, "RecordTime": q + 7200})
    return docs


def expected_ids(docs: list[dict], s: int, e: int) -> set[str]:
    """The documented query, evaluated directly in Python (independently of the stand-in)."""
    out = set()
    for d in docs:
        rt, q = d.get("RecordTime"), d.get("QDate")
        jcs, cd = d.get("JobCurrentStartDate"), d.get("CompletionDate")
        a = rt is not None and s <= rt < e
        b = (jcs is not None and 0 < jcs < e
             and ((cd is not None and cd >= s) or ((cd is None or cd <= 0) and rt is not None and rt >= s)))
        c = q is not None and 0 < q < e and rt is not None and rt >= s
        if a or b or c:
            out.add(d["GlobalJobId"])
    return out


@pytest.fixture
def docs() -> list[dict]:
    return make_docs()


@pytest.fixture
def es(docs):
    srv = EsStandIn({INDEX: docs}).start()
    try:
        yield srv
    finally:
        srv.stop()


class Sleeps(list):
    """Records backoff sleeps (and really sleeps, so Retry-After is observable)."""

    def fn(self, seconds: float) -> None:
        self.append(seconds)
        time.sleep(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def cfg(srv: EsStandIn, **kw) -> EsConfig:
    base = dict(hosts=[srv.url], index=INDEX, page_size=40, max_retries=3, request_timeout=1.0,
                retry_backoff_s=0.01, retry_backoff_max_s=2.0)
    base.update(kw)
    return EsConfig(**base)


def ids(result) -> list[str]:
    return [d["GlobalJobId"] for d in result.docs]


def test_pit_paging_returns_exactly_the_documents_of_the_window(es, docs):
    res = fetch_jobs(cfg(es), START, END)
    want = expected_ids(docs, S, E)
    assert len(want) > 3 * 40  # at least three full pages
    assert sorted(ids(res)) == sorted(want) and len(ids(res)) == len(set(ids(res)))
    assert res.total == len(want) and res.pages >= 3 and res.retries == 0 and res.restarts == 0
    assert not any(i.startswith("old.example.org") for i in ids(res))
    # sorted by RecordTime
    assert [d["RecordTime"] for d in res.docs] == sorted(d["RecordTime"] for d in res.docs)
    # protocol: one PIT, closed with the latest id; search_after on every page but the first;
    # the exact count only on the first page
    searches = es.requests_of("search")
    assert len(searches) == res.pages + (1 if res.total % 40 == 0 else 0)
    assert "search_after" not in searches[0].body and all("search_after" in r.body for r in searches[1:])
    assert searches[0].body["track_total_hits"] is True and all(r.body["track_total_hits"] is False for r in searches[1:])
    assert all(r.body["pit"]["keep_alive"] == "2m" and r.body["size"] == 40 for r in searches)
    assert es.pits_opened == es.pits_closed == 1 and es.open_pits == 0 and es.stale_pit_ids_used == 0
    # no false negatives: every document whose normalized run/queue interval overlaps the window is fetched
    overlapping = jobs_overlapping(normalize_docs(docs, "elasticsearch").table, START, END)
    assert set(overlapping["global_job_id"].to_pylist()) <= set(ids(res))
    # and the documents go through the normalizer cleanly
    norm = normalize_docs(res.docs, "elasticsearch")
    assert norm.quarantine == [] and norm.table.num_rows == res.total


def test_page_size_10000_single_page(es, docs):
    res = fetch_jobs(cfg(es, page_size=10_000), START, END)
    assert res.pages == 1 and sorted(ids(res)) == sorted(expected_ids(docs, S, E))


def test_429_with_retry_after_is_honoured(es, docs, sleeps):
    es.inject("status", status=429, retry_after="1", after=1)  # the second page
    t0 = time.monotonic()
    res = fetch_jobs(cfg(es), START, END, sleep=sleeps.fn)
    assert sorted(ids(res)) == sorted(expected_ids(docs, S, E))
    assert res.retries == 1 and len(sleeps) == 1 and sleeps[0] >= 1.0
    assert time.monotonic() - t0 >= 1.0
    assert [r.status for r in es.requests_of("search")][:3] == [200, 429, 200]


def test_503_and_500_then_success(es, docs, sleeps):
    es.inject("status", status=503, count=2, after=2)
    es.inject("status", status=500, count=1, after=0, on="pit_open")
    res = fetch_jobs(cfg(es), START, END, sleep=sleeps.fn)
    assert sorted(ids(res)) == sorted(expected_ids(docs, S, E))
    assert res.retries == 3 and len(sleeps) == 3
    # exponential backoff with jitter: attempt n sleeps in [b*2^n/2, b*2^n] (b = 0.01 s here)
    assert 0.005 <= sleeps[0] <= 0.01 and 0.005 <= sleeps[1] <= 0.01 and 0.01 <= sleeps[2] <= 0.02


def test_connection_dropped_mid_page_then_success(es, docs, sleeps):
    es.inject("drop", after=1)  # socket closed, no response
    es.inject("truncate", after=2)  # headers and half the body, then closed
    res = fetch_jobs(cfg(es), START, END, sleep=sleeps.fn)
    assert sorted(ids(res)) == sorted(expected_ids(docs, S, E))
    assert res.retries == 2
    assert {r.fault for r in es.requests_of("search")} >= {"drop", "truncate"}


def test_slow_response_times_out_and_is_retried(es, docs, sleeps):
    es.inject("delay", delay=2.0, after=1)
    t0 = time.monotonic()
    res = fetch_jobs(cfg(es, request_timeout=0.5), START, END, sleep=sleeps.fn)
    assert sorted(ids(res)) == sorted(expected_ids(docs, S, E))
    assert res.retries == 1 and time.monotonic() - t0 < 5


def test_expired_pit_restarts_the_extraction_once(es, docs):
    es.inject("expire_pit", after=2)
    res = fetch_jobs(cfg(es), START, END)
    assert sorted(ids(res)) == sorted(expected_ids(docs, S, E)) and len(res.docs) == res.total
    assert res.restarts == 1 and es.pits_opened == 2 and es.open_pits == 0


def test_pit_expiring_twice_is_a_clear_error(es):
    es.inject("expire_pit", after=1, count=2)
    with pytest.raises(EsSourceError, match="expired twice") as err:
        fetch_jobs(cfg(es), START, END)
    assert err.value.status == 404 and "search_context_missing_exception" in str(err.value)


def test_hits_total_mismatch_is_a_clear_error(es):
    es.inject("lie_total", delta=7)
    with pytest.raises(EsSourceError, match=r"fetched \d+ documents but hits.total is \d+") as err:
        fetch_jobs(cfg(es), START, END)
    assert INDEX in str(err.value) and es.url in str(err.value)
    assert es.pits_closed == 1  # closed in the finally


def test_api_key_is_sent_but_never_shown(docs, caplog):
    caplog.set_level(logging.DEBUG)
    with EsStandIn({INDEX: docs}, api_key=API_KEY) as srv:
        c = cfg(srv, api_key=API_KEY, max_retries=1)
        res = fetch_jobs(c, START, END)
        assert res.total == len(expected_ids(docs, S, E))
        assert {r.headers.get("authorization") for r in srv.requests} == {f"ApiKey {API_KEY}"}
        assert API_KEY not in repr(c) and API_KEY not in str(c) and "api_key='***'" in repr(c)

        srv.inject("status", status=503, count=5)
        with pytest.raises(EsSourceError, match="HTTP 503") as err:
            fetch_jobs(c, START, END)
        assert API_KEY not in str(err.value) and API_KEY not in repr(err.value.__dict__)

        with pytest.raises(EsSourceError, match="HTTP 401") as err401:
            fetch_jobs(cfg(srv, api_key="d3Jvbmc6a2V5"), START, END)
        assert "d3Jvbmc6a2V5" not in str(err401.value) and "api_key" in str(err401.value)
    assert "retry 1 of 1" in caplog.text  # the retries were logged...
    assert API_KEY not in caplog.text and "d3Jvbmc6a2V5" not in caplog.text  # ...without the key


def test_basic_auth_and_credentials_in_the_host_url(docs, caplog):
    caplog.set_level(logging.DEBUG)
    with EsStandIn({INDEX: docs}, basic_auth=("reader", "s3cr3t-pw")) as srv:
        host = srv.url.replace("http://", "http://reader:s3cr3t-pw@")
        c = cfg(srv, hosts=[host])
        assert c.hosts == (srv.url,) and c.username == "reader"
        assert "s3cr3t-pw" not in repr(c) and "password='***'" in repr(c)
        assert fetch_jobs(c, START, END).total > 0
        bad = cfg(srv, username="reader", password="wrong-pw")
        with pytest.raises(EsSourceError, match="HTTP 401") as err:
            fetch_jobs(bad, START, END)
        assert "wrong-pw" not in str(err.value)
    assert "s3cr3t-pw" not in caplog.text and "wrong-pw" not in caplog.text


def test_credentials_as_secrets_and_urls_give_them_and_never_show_them(docs, caplog):
    """A key or password read from a secret file ends in a newline (no header may hold one: the
    client's own error quoted the header); a URL's user info is percent-decoded as the client reads
    it; a password with an unencoded '/' (user info that does not parse) is refused with the
    credentials masked; a host without a scheme never gets plain http made up for a password."""
    caplog.set_level(logging.DEBUG)
    with EsStandIn({INDEX: docs}, api_key=API_KEY) as srv:
        assert fetch_jobs(cfg(srv, api_key=API_KEY + "\n"), START, END).total > 0
        assert {r.headers.get("authorization") for r in srv.requests} == {f"ApiKey {API_KEY}"}
        # every search asks for no partial results: a failed shard is an error the retries handle
        assert {r.params.get("allow_partial_search_results") for r in srv.requests_of("search")} == {"false"}
    with EsStandIn({INDEX: docs}, basic_auth=("reader", "p@ss:w/rd")) as srv:
        c = cfg(srv, hosts=[srv.url.replace("http://", "http://reader:p%40ss%3Aw%2Frd@")])
        assert (c.username, c.password, c.hosts) == ("reader", "p@ss:w/rd", (srv.url,))
        assert fetch_jobs(c, START, END).total > 0
        with pytest.raises(ValueError, match=r"user info of http://\*\*\*@") as err:
            cfg(srv, hosts=[srv.url.replace("http://", "http://reader:p@ss/w@")])
        assert "p@ss/w" not in str(err.value)
        # a password of digits and an unencoded '/' reads as a port and a path: the URL was used, and
        # logged, with it; an '@' after a host is refused so (a path's '@' cannot be told from it)
        for leaky in ("http://elastic:2024/Winter@", "http://elastic:2024?Winter@"):
            with pytest.raises(ValueError, match=r"user info of http://\*\*\*@") as err:
                cfg(srv, hosts=[srv.url.replace("http://", leaky)])
            assert "Winter" not in str(err.value)
        with pytest.raises(ValueError, match="user info"):
            cfg(srv, hosts=[srv.url + "/prefix@v1"])
        # a password's spaces are its own
        assert cfg(srv, username="u", password=" pa ss \n").password == " pa ss "
        bare = cfg(srv, hosts=[srv.url.replace("http://", "reader:pw@")])
        assert bare.hosts == (srv.url.removeprefix("http://"),) and bare.password == "pw"
        sent = len(srv.requests)
        with pytest.raises(EsSourceError, match="scheme"):
            fetch_jobs(bare, START, END)
        assert len(srv.requests) == sent  # nothing was sent, in clear or otherwise
    assert API_KEY not in caplog.text and "p@ss" not in caplog.text


def test_verify_certs_off_logs_a_warning(caplog):
    caplog.set_level(logging.WARNING)
    client = make_client(EsConfig(hosts=["https://es.example.org:9200"], verify_certs=False, api_key="k3y"))
    client.close()
    assert any("verification is OFF" in r.getMessage() for r in caplog.records)
    assert "k3y" not in caplog.text


def test_server_down_is_a_quick_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = EsConfig(hosts=[f"http://127.0.0.1:{port}"], max_retries=2, retry_backoff_s=0.01, api_key=API_KEY)
    t0 = time.monotonic()
    with pytest.raises(EsSourceError) as err:
        fetch_jobs(c, START, END)
    assert time.monotonic() - t0 < 5
    msg = str(err.value)
    assert "open point in time" in msg and f"127.0.0.1:{port}" in msg and INDEX in msg
    assert "refused" in msg.lower() and "gave up after 2 retries" in msg
    assert API_KEY not in msg


def test_missing_index_is_not_retried(es):
    with pytest.raises(EsSourceError, match="HTTP 404, index_not_found_exception") as err:
        fetch_jobs(cfg(es, index="adstash-nope"), START, END)
    assert err.value.status == 404 and len(es.requests_of("pit_open")) == 1


def test_gives_up_after_max_retries(es, sleeps):
    es.inject("status", status=503, count=10)
    with pytest.raises(EsSourceError, match="gave up after 3 retries"):
        fetch_jobs(cfg(es), START, END, sleep=sleeps.fn)
    assert len(sleeps) == 3 and es.pits_closed == 1


def test_standin_speaks_the_wire_protocol(es):
    client = make_client(cfg(es))
    try:
        assert client.ping() is True
        info = client.info()
        assert info["tagline"] == "You Know, for Search" and info["version"]["number"].startswith("8.")
        pit = client.open_point_in_time(index="adstash-*", keep_alive="1m")
        page = client.search(pit={"id": pit["id"]}, size=5, sort=[{"RecordTime": "desc"}],
                             query={"term": {"JobStatus": 4}}, track_total_hits=True)
        hits = page["hits"]["hits"]
        assert page["hits"]["total"]["relation"] == "eq" and len(hits) == 5
        assert all(h["_source"]["JobStatus"] == 4 and len(h["sort"]) == 2 for h in hits)  # + implicit _shard_doc
        assert hits[0]["sort"][0] == max(d["RecordTime"] for d in es_docs(es) if d.get("JobStatus") == 4) * 1000
        assert client.close_point_in_time(id=page["pit_id"])["num_freed"] == 1
    finally:
        client.close()
    with urllib.request.urlopen(es.url + "/") as resp:
        assert resp.headers["X-Elastic-Product"] == "Elasticsearch"
        assert resp.headers["Content-Type"] == "application/json"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(es.url + "/nope/_pit?keep_alive=1m", method="POST"))
    body = json.loads(err.value.read())
    assert err.value.code == 404 and err.value.headers["X-Elastic-Product"] == "Elasticsearch"
    assert body["error"]["root_cause"][0]["type"] == "index_not_found_exception" and body["status"] == 404


def _raw_search(srv: EsStandIn, accept: str, content_type: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"{srv.url}/{INDEX}/_search", data=b'{"size": 1}', method="POST",
                                 headers={"Accept": accept, "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize("major", [8, 9])
def test_the_client_reads_elasticsearch_8_and_9(docs, major):
    """adstash pools run Elasticsearch 8 as well as 9. A 9.x client asks for ``compatible-with=9``,
    which an 8.x server refuses on every request (elastic/elasticsearch-py#2923): the pinned client
    is an 8.x one, whose plain JSON both accept. The stand-in checks the media types as each does."""
    with EsStandIn({INDEX: docs}, major=major) as srv:
        res = fetch_jobs(cfg(srv), START, END)
        assert sorted(ids(res)) == sorted(expected_ids(docs, S, E))
        assert srv.requests and all(r.status == 200 for r in srv.requests)
        vendored = [r.headers.get("accept", "") for r in srv.requests if "compatible-with" in r.headers.get("accept", "")]
        assert all(v.endswith(("compatible-with=8", "compatible-with=7")) for v in vendored)
        # the server's own rules, as the real servers answer them
        plain = _raw_search(srv, "application/json", "application/json")
        assert plain[0] == 200
        v8 = "application/vnd.elasticsearch+json; compatible-with=8"
        assert _raw_search(srv, v8, v8)[0] == 200
        v9 = "application/vnd.elasticsearch+json; compatible-with=9"
        status, body = _raw_search(srv, v9, v9)
        if major == 8:
            assert status == 400 and body["error"]["type"] == "media_type_header_exception"
            assert body["error"]["caused_by"]["reason"].startswith(
                "Accept version must be either version 8 or 7, but found 9.")
        else:
            assert status == 200
        status, body = _raw_search(srv, v8, "application/json")  # a version in one header only
        assert status == 400 and "required on both Content-Type and Accept" in body["error"]["caused_by"]["reason"]


def es_docs(srv: EsStandIn) -> list[dict]:
    return [src for _id, src in srv._indices[INDEX]]


def test_retry_after_http_date():
    future = email.utils.format_datetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30), usegmt=True)
    assert 25 <= _retry_after_s({"retry-after": future}) <= 31
    assert _retry_after_s({"retry-after": "2"}) == 2.0 and _retry_after_s({}) is None


def test_config_validation_and_query_shape():
    for bad in (0, 10_001):
        with pytest.raises(ValueError, match="page_size"):
            EsConfig(page_size=bad)
    with pytest.raises(ValueError):
        EsConfig(api_key="k", username="u", password="p")
    assert EsConfig(hosts="http://a:9200, http://b:9200").hosts == ("http://a:9200", "http://b:9200")
    q = build_query(S, E)
    assert q["bool"]["minimum_should_match"] == 1 and len(q["bool"]["should"]) == 3
    assert q["bool"]["should"][0] == {"range": {"RecordTime": {"gte": S, "lt": E, "format": "epoch_second"}}}
    with pytest.raises(ValueError):
        fetch_jobs(EsConfig(), END, START)
    with pytest.raises(ValueError):
        fetch_jobs(EsConfig(), dt.datetime(2025, 8, 6), END)


def test_a_documents_origin_is_its_index_and_id(es, docs):
    """Each raw document names the index and id it came from (with an index pattern, the pattern
    named every one, and a quarantined document could not be looked up)."""
    from gpu_pipeline.lib.job_source import raw_docs_from_es

    raw = raw_docs_from_es(cfg(es, index="adstash-*"), START, END).table
    origins = raw.column("origin").to_pylist()
    assert len(origins) == len(expected_ids(docs, S, E)) == len(set(origins))
    assert all(o.startswith(f"{INDEX}/") for o in origins)
    # the stand-in numbers its documents doc-1, doc-2 ... in the order they were indexed
    for origin, text in zip(origins, raw.column("doc_json").to_pylist(), strict=True):
        n = int(origin.rsplit("/doc-", 1)[1])
        assert json.loads(text)["GlobalJobId"] == docs[n - 1]["GlobalJobId"]
