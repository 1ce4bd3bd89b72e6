"""DCGM history from a REAL Prometheus server (loaded with promtool) through the HTTP API, plus the
retry / redirect paths against small stdlib stand-ins."""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpu_pipeline.lib.prometheus_source import (
    DCGM_METRIC_NAMES,
    PrometheusConfig,
    PrometheusError,
    fetch_dcgm_range,
    plan_chunks,
    promql_string,
    query_range,
)
from gpu_pipeline.lib.telemetry import _DCGM_METRICS, GPU_SAMPLES, parse_dcgm_text
from gpu_pipeline_tests.prometheus_server import (
    ALL_FIELDS,
    ENTITIES,
    DcgmHistory,
    GpuEntity,
    PrometheusServer,
    Series,
    create_blocks,
    missing_binaries,
    write_openmetrics,
)

UTC = dt.UTC
HOURS = 6
STEP = 30
N_STEPS = HOURS * 3600 // STEP
# Test-only credentials of the TLS / basic-auth server (bcrypt cost 4, fast to check).
USER, PASSWORD = "alice", "test-only-password"
BCRYPT = "$2b$04$ipZbFLy9pvmC9rZtYqvOsejvH56aPtBzmnBpQlQjvQ8Ad84Y0pwDe"

needs_prometheus = pytest.mark.skipif(missing_binaries() is not None, reason=str(missing_binaries()))


def utc_s(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, tz=UTC)


@pytest.fixture(scope="module")
def history() -> DcgmHistory:
    # The recent past: three days ago, on the hour.
    now = int(time.time())
    return DcgmHistory(start_s=(now // 3600) * 3600 - 3 * 86400, n_steps=N_STEPS, step_s=STEP)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory, history: DcgmHistory) -> Iterator[PrometheusServer]:
    if missing_binaries():
        pytest.skip(str(missing_binaries()))
    work = tmp_path_factory.mktemp("prometheus")
    data = history.load(work)
    with PrometheusServer(data_dir=data, workdir=work) as server:
        server.wait_for("count(DCGM_FI_DEV_GPU_UTIL)", history.timestamp(1))
        yield server


def cfg_for(server: PrometheusServer, **kw) -> PrometheusConfig:
    kw.setdefault("trust_env", False)
    return PrometheusConfig(base_url=server.base_url, **kw)


def canonical(uuid: str) -> str:
    return "GPU-" + uuid[4:].lower()


def expected_row(h: DcgmHistory, e: GpuEntity, i: int, base_url: str) -> dict:
    def v(fieldname: str) -> float | None:
        if fieldname not in e.fields:
            return None
        x = h.value(e, fieldname, i)
        if x != x or x in (float("inf"), float("-inf")) or x >= 0x7FFFFFF0:
            return None
        return x * _DCGM_METRICS[fieldname][1]

    used, free = v("DCGM_FI_DEV_FB_USED"), v("DCGM_FI_DEV_FB_FREE")
    uuid = canonical(e.uuid)
    return {
        "sample_utc": utc_s(h.timestamp(i)),
        "source": "prometheus",
        "host": e.host,
        "gpu_uuid": uuid,
        "gpu_id": f"{uuid}/{e.mig_id}" if e.mig_id else "GPU-" + e.uuid[4:12].lower(),
        "gpu_index": int(e.gpu),
        "mig_profile": e.mig_profile,
        "mig_instance_id": int(e.mig_id) if e.mig_id else None,
        "device_name": e.model,
        "util_pct": v("DCGM_FI_DEV_GPU_UTIL"),
        "mem_util_pct": None,
        "mem_used_mib": used,
        "mem_total_mib": used + free if used is not None and free is not None else None,
        "power_w": v("DCGM_FI_DEV_POWER_USAGE"),
        "power_limit_w": None,
        "temp_c": v("DCGM_FI_DEV_GPU_TEMP"),
        "sm_clock_mhz": None,
        "energy_mj": v("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
        "gr_engine_active_pct": v("DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
        "sm_active_pct": v("DCGM_FI_PROF_SM_ACTIVE"),
        "tensor_active_pct": v("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
        "source_file": base_url,
    }


def keyed(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["sample_utc"], r["host"], r["gpu_id"]): r for r in rows}


# ----------------------------------------------------------------------------------------------
# Against the real server
# ----------------------------------------------------------------------------------------------


@needs_prometheus
def test_full_window_reads_back_every_value_exactly(prom: PrometheusServer, history: DcgmHistory) -> None:
    cfg = cfg_for(prom)
    start = utc_s(history.start_s)
    res = fetch_dcgm_range(cfg, start, start + dt.timedelta(hours=HOURS))
    assert res.table.schema == GPU_SAMPLES.schema
    assert res.rows == len(ENTITIES) * N_STEPS == 3600
    got = keyed(res.table.to_pylist())
    assert len(got) == res.rows
    for e in ENTITIES:
        for i in range(N_STEPS):
            exp = expected_row(history, e, i, prom.base_url)
            assert got[(exp["sample_utc"], exp["host"], exp["gpu_id"])] == exp, (e.key, i)
    # Spot checks spelled out.
    r = got[(utc_s(history.timestamp(3)), "h1", "GPU-b156e653")]
    assert r["gpu_uuid"] == "GPU-b156e653-aaaa-bbbb-cccc-ddddeeeeffff"
    assert r["util_pct"] == (3 * 7 + 13) % 101 == 34
    assert r["power_w"] == 60 + (9 + 5) + 0.25
    mig = got[(utc_s(history.timestamp(0)), "h2", "GPU-9a8b7c6d-0000-1111-2222-333344445555/3")]
    assert (mig["mig_profile"], mig["mig_instance_id"], mig["util_pct"]) == ("1g.10gb", 3, None)
    assert mig["gr_engine_active_pct"] == (9 / 100) * 100.0
    assert got[(utc_s(history.timestamp(0)), "h3.example.org", "GPU-deadbeef")]["device_name"] == ENTITIES[0].model
    assert got[(utc_s(history.timestamp(10)), "h1", "GPU-0667ce7c")]["temp_c"] is None  # NaN
    assert got[(utc_s(history.timestamp(11)), "h1", "GPU-0667ce7c")]["power_w"] is None  # +Inf
    assert got[(utc_s(history.timestamp(12)), "h1", "GPU-b156e653")]["util_pct"] is None  # DCGM blank
    c = res.counters
    assert c["chunks"] == 1 and c["queries"] == 2 * len(DCGM_METRIC_NAMES)
    assert c["non_finite_values"] == 2 and c["nan_values"] == 2 and c["blank_values"] == 1
    assert c["series"] == sum(len(e.fields) for e in ENTITIES)
    assert c["points"] == c["series"] * N_STEPS
    assert c["conflicting_samples"] == c["duplicate_samples"] == c["rows_without_host"] == 0
    assert c["retries"] == 0 and c["rows_out"] == 3600


def _text_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@needs_prometheus
def test_same_rows_as_the_text_parser(prom: PrometheusServer, history: DcgmHistory) -> None:
    """The same history as a dcgm-exporter text file (ms timestamps) gives the same rows: one
    mapping for both sources."""
    n = 40
    lines = []
    for s in history.series():
        labels = ",".join(f'{k}="{_text_label(v)}"' for k, v in s.labels.items())
        for ts, v in s.samples[:n]:
            text = "NaN" if v != v else ("+Inf" if v == float("inf") else repr(v))
            lines.append(f"{s.name}{{{labels}}} {text} {int(ts * 1000)}")
    parsed = parse_dcgm_text("\n".join(lines) + "\n")
    assert not parsed.quarantine
    start = utc_s(history.start_s)
    res = fetch_dcgm_range(cfg_for(prom), start, start + dt.timedelta(seconds=n * STEP))
    drop = ["source", "source_file"]
    from_text = keyed(parsed.table.drop_columns(drop).to_pylist())
    from_prom = res.table.drop_columns(drop).to_pylist()
    # The text parser has no `instance` fallback: h3's host is null there.
    from_prom = keyed([dict(r, host=None) if r["host"] == "h3.example.org" else r for r in from_prom])
    assert len(from_prom) == len(ENTITIES) * n
    assert from_text == from_prom


@needs_prometheus
def test_chunking_gives_identical_rows(prom: PrometheusServer, history: DcgmHistory) -> None:
    start = utc_s(history.start_s + 10)  # not on the grid: the first point is start_s + 30
    end = start + dt.timedelta(hours=2)
    one = fetch_dcgm_range(cfg_for(prom), start, end)
    many = fetch_dcgm_range(cfg_for(prom, max_points_per_query=100), start, end)
    assert one.rows == len(ENTITIES) * 240
    assert one.table.column("sample_utc")[0].as_py() == utc_s(history.start_s + 30)
    assert many.counters["chunks"] == 3 and many.counters["queries"] == 2 * 3 * len(DCGM_METRIC_NAMES)
    assert one.counters["chunks"] == 1
    assert many.table.equals(one.table)


@needs_prometheus
def test_selectors_extra_and_escaped(prom: PrometheusServer, history: DcgmHistory) -> None:
    start = utc_s(history.start_s)
    end = start + dt.timedelta(hours=1)
    a = fetch_dcgm_range(cfg_for(prom, extra_selector='{cluster="a"}'), start, end)
    assert {(r["host"], r["gpu_id"]) for r in a.table.to_pylist()} == {
        ("h1", "GPU-0667ce7c"), ("h1", "GPU-b156e653"), ("h3.example.org", "GPU-deadbeef")}
    assert a.rows == 3 * 120
    # A value with a quote and a backslash, escaped by the module: only that GPU.
    odd = fetch_dcgm_range(cfg_for(prom, match_labels={"rack": 'r"7\\x'}, metrics=("DCGM_FI_DEV_GPU_UTIL",)),
                           start, end)
    assert {r["gpu_id"] for r in odd.table.to_pylist()} == {"GPU-2c3d4e5f"} and odd.rows == 120
    assert odd.table.column("util_pct").to_pylist()[:2] == [26.0, 33.0]
    # Another value that would need escaping matches nothing (and is not a syntax error).
    none = fetch_dcgm_range(cfg_for(prom, match_labels={"rack": 'r"7\\x"} or vector(1)'}), start, end)
    assert none.rows == 0 and none.counters["series"] == 0


@needs_prometheus
def test_invalid_promql_is_bad_data(prom: PrometheusServer, history: DcgmHistory) -> None:
    start = utc_s(history.start_s)
    cfg = cfg_for(prom, extra_selector="{cluster=}")
    t0 = time.monotonic()
    with pytest.raises(PrometheusError) as ei:
        fetch_dcgm_range(cfg, start, start + dt.timedelta(hours=1))
    err = ei.value
    assert (err.status, err.error_type, err.attempts) == (400, "bad_data", 1)  # not retried
    assert "parse error" in err.error
    assert "HTTP 400" in str(err) and "errorType=bad_data" in str(err) and prom.base_url in str(err)
    assert "query 'DCGM_FI_DEV_GPU_UTIL{cluster=}'" in str(err)
    assert time.monotonic() - t0 < 2
    with pytest.raises(PrometheusError) as ei:
        query_range(cfg_for(prom), "rate(", history.start_s * 1000, history.start_s * 1000 + 60_000)
    assert ei.value.error_type == "bad_data"


@needs_prometheus
def test_too_many_points_is_refused_by_prometheus(prom: PrometheusServer, history: DcgmHistory) -> None:
    start = utc_s(history.start_s)
    cfg = cfg_for(prom, max_points_per_query=20_000, metrics=("DCGM_FI_DEV_GPU_UTIL",))
    with pytest.raises(PrometheusError) as ei:
        fetch_dcgm_range(cfg, start, start + dt.timedelta(days=4))  # 11,520 points
    assert ei.value.error_type == "bad_data" and "11,000" in ei.value.error
    ok = fetch_dcgm_range(cfg_for(prom, metrics=("DCGM_FI_DEV_GPU_UTIL",)), start, start + dt.timedelta(days=4))
    assert ok.counters["chunks"] == 2 and ok.rows > 0


@needs_prometheus
def test_credentials_never_shown(prom: PrometheusServer, history: DcgmHistory,
                                 caplog: pytest.LogCaptureFixture) -> None:
    url = prom.base_url.replace("http://", "http://alice:s3cr%40t@")
    cfg = PrometheusConfig(base_url=url, trust_env=False, extra_selector="{x=}")
    assert cfg.base_url == prom.base_url and (cfg.username, cfg.password) == ("alice", "s3cr@t")
    assert "s3cr@t" not in repr(cfg) and "***" in repr(cfg)
    tok = PrometheusConfig(base_url=prom.base_url, bearer_token="tok-123456", trust_env=False)
    assert "tok-123456" not in repr(tok)
    with pytest.raises(PrometheusError) as ei:
        fetch_dcgm_range(cfg, utc_s(history.start_s), utc_s(history.start_s + 600))
    assert "s3cr" not in str(ei.value) and "alice:" not in str(ei.value)
    # The server has no auth configured: the credentials are sent and ignored.
    ok = fetch_dcgm_range(PrometheusConfig(base_url=url, trust_env=False), utc_s(history.start_s),
                          utc_s(history.start_s + 600))
    assert ok.rows == len(ENTITIES) * 20
    assert "s3cr" not in caplog.text


@needs_prometheus
def test_stopped_server_fails_fast_and_clearly(tmp_path: Path) -> None:
    with PrometheusServer(data_dir=tmp_path / "data", workdir=tmp_path) as server:
        cfg = cfg_for(server)
        now = dt.datetime.now(UTC).replace(microsecond=0)
        assert fetch_dcgm_range(cfg, now - dt.timedelta(minutes=5), now).rows == 0
    assert server.process is None
    t0 = time.monotonic()
    with pytest.raises(PrometheusError) as ei:
        fetch_dcgm_range(cfg, now - dt.timedelta(minutes=5), now)
    elapsed = time.monotonic() - t0
    err = ei.value
    assert elapsed < 6, elapsed  # 4 retries, 0.25 s doubling backoff
    assert err.error_type == "connection_error" and err.status is None and err.attempts == 5
    assert "connection refused" in str(err) and cfg.base_url in str(err)


def _openssl() -> str | None:
    return shutil.which("openssl")


@needs_prometheus
@pytest.mark.skipif(_openssl() is None, reason="openssl not on PATH (needed to make a test certificate)")
def test_tls_and_basic_auth(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:TRUE"],
        check=True, capture_output=True, timeout=30,
    )
    web = (f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
           f"basic_auth_users:\n  {USER}: {BCRYPT}\n")
    server = PrometheusServer(data_dir=tmp_path / "data", workdir=tmp_path, web_config=web, https=True,
                              username=USER, password=PASSWORD)
    with server:
        now_ms = int(time.time()) * 1000
        good = PrometheusConfig(base_url=server.base_url, username=USER, password=PASSWORD,
                                ca_file=str(cert), trust_env=False)
        out = query_range(good, "vector(7)", now_ms - 60_000, now_ms)
        assert [v for _, v in out[0]["values"]] == ["7", "7", "7"]

        bad = PrometheusConfig(base_url=server.base_url, username=USER, password="wrong",
                               ca_file=str(cert), trust_env=False)
        with pytest.raises(PrometheusError) as ei:
            query_range(bad, "vector(7)", now_ms - 60_000, now_ms)
        assert ei.value.status == 401 and ei.value.attempts == 1 and "wrong" not in str(ei.value)

        untrusted = PrometheusConfig(base_url=server.base_url, username=USER, password=PASSWORD,
                                     trust_env=False)
        with pytest.raises(PrometheusError) as ei:
            query_range(untrusted, "vector(7)", now_ms - 60_000, now_ms)
        assert ei.value.error_type == "tls_error" and ei.value.attempts == 1
        assert "CERTIFICATE_VERIFY_FAILED" in str(ei.value) and "ca_file" in str(ei.value)

        with caplog.at_level(logging.WARNING, logger="gpu_pipeline.lib.prometheus_source"):
            insecure = PrometheusConfig(base_url=server.base_url, username=USER, password=PASSWORD,
                                        verify_tls=False, trust_env=False)
        assert "verification is OFF" in caplog.text
        assert query_range(insecure, "vector(7)", now_ms, now_ms)[0]["values"] == [[now_ms / 1000, "7"]]


# ----------------------------------------------------------------------------------------------
# Retries, redirects, config -- stdlib stand-ins, no Prometheus needed
# ----------------------------------------------------------------------------------------------

MATRIX = {"status": "success", "data": {"resultType": "matrix", "result": [
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-0667ce7c-1a2b-3c4d-5e6f-00112233aabb",
                "gpu": "0", "instance": "[fd00::7]:9400"},
     "values": [[1699999980, "42"], [1700000010, "NaN"]]}]}}


class StandIn:
    """A tiny HTTP server whose answers are scripted per request. The ``timestamp(...)`` query that
    follows each data query (the raw sample times) is answered apart, with no series (every point
    kept), and not counted among ``requests``."""

    def __init__(self, script: Callable[[BaseHTTPRequestHandler, int], None]):
        self.requests: list[dict] = []
        self.timestamp_queries = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if "query=timestamp%28" in self.path:
                    outer.timestamp_queries += 1
                    reply(self, 200, {"status": "success", "data": {"resultType": "matrix", "result": []}})
                    return
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization")})
                script(self, len(outer.requests))

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def reply(h: BaseHTTPRequestHandler, status: int, body: dict | None, headers: dict | None = None) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)


WINDOW = (utc_s(1699999980), utc_s(1700000040))  # 1699999980 = 30 x 56666666
ONE_METRIC = {"metrics": ("DCGM_FI_DEV_GPU_UTIL",), "trust_env": False}


def test_retries_5xx_and_429_then_succeeds() -> None:
    def script(h: BaseHTTPRequestHandler, n: int) -> None:
        if n == 1:
            reply(h, 503, {"status": "error", "errorType": "unavailable", "error": "busy"})
        elif n == 2:
            reply(h, 429, None, {"Retry-After": "3"})
        else:
            reply(h, 200, MATRIX)

    sleeps: list[float] = []
    with StandIn(script) as s:
        res = fetch_dcgm_range(PrometheusConfig(base_url=s.url, **ONE_METRIC), *WINDOW, sleep=sleeps.append)
    assert len(s.requests) == 3 and res.counters["retries"] == 2
    assert sleeps[1] >= 3  # Retry-After honoured
    rows = res.table.to_pylist()
    assert [(r["util_pct"], r["host"], r["gpu_id"]) for r in rows] == [
        (42.0, "fd00::7", "GPU-0667ce7c"), (None, "fd00::7", "GPU-0667ce7c")]
    q = s.requests[0]["path"]
    assert q.startswith("/api/v1/query_range?query=DCGM_FI_DEV_GPU_UTIL&start=1699999980&end=1700000010&step=30&timeout=30")


def test_warnings_of_a_partial_response_are_counted() -> None:
    """A successful response may carry warnings (e.g. a remote store that answered in part): the
    rows are read and the warnings counted in the result, not only logged."""
    def script(h: BaseHTTPRequestHandler, n: int) -> None:
        reply(h, 200, {**MATRIX, "warnings": ["remote store store-2 unavailable: partial result",
                                              "another warning"]})

    with StandIn(script) as s:
        res = fetch_dcgm_range(PrometheusConfig(base_url=s.url, **ONE_METRIC), *WINDOW, sleep=lambda _: None)
    assert res.counters["warnings"] == 2 and res.table.num_rows == 2


def test_gives_up_after_max_retries_with_the_error_body() -> None:
    def script(h: BaseHTTPRequestHandler, n: int) -> None:
        reply(h, 503, {"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"})

    with StandIn(script) as s:
        cfg = PrometheusConfig(base_url=s.url, max_retries=2, **ONE_METRIC)
        with pytest.raises(PrometheusError) as ei:
            fetch_dcgm_range(cfg, *WINDOW, sleep=lambda _: None)
    assert len(s.requests) == 3
    e = ei.value
    assert (e.status, e.error_type, e.attempts) == (503, "timeout", 3)
    assert "query timed out" in str(e) and "after 3 attempts" in str(e)


def test_timeout_is_retried_then_reported() -> None:
    def script(h: BaseHTTPRequestHandler, n: int) -> None:
        time.sleep(1.0)

    with StandIn(script) as s:
        cfg = PrometheusConfig(base_url=s.url, timeout_s=0.3, max_retries=1, **ONE_METRIC)
        t0 = time.monotonic()
        with pytest.raises(PrometheusError) as ei:
            fetch_dcgm_range(cfg, *WINDOW, sleep=lambda _: None)
    assert time.monotonic() - t0 < 3
    assert "timed out after 0.3s" in str(ei.value) and ei.value.attempts == 2


def test_error_status_inside_a_200_and_non_json() -> None:
    bodies = iter([{"status": "error", "errorType": "execution", "error": "too many samples"}])

    def script(h: BaseHTTPRequestHandler, n: int) -> None:
        if n == 1:
            reply(h, 200, next(bodies))
        else:
            data = b"<html>not prometheus</html>"
            h.send_response(200)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)

    with StandIn(script) as s:
        cfg = PrometheusConfig(base_url=s.url, **ONE_METRIC)
        with pytest.raises(PrometheusError, match="errorType=execution, error=too many samples"):
            fetch_dcgm_range(cfg, *WINDOW)
        with pytest.raises(PrometheusError, match="not JSON"):
            fetch_dcgm_range(cfg, *WINDOW)


def test_redirect_to_another_origin_drops_the_token() -> None:
    with StandIn(lambda h, n: reply(h, 200, MATRIX)) as target:
        def script(h: BaseHTTPRequestHandler, n: int) -> None:
            h.send_response(302)
            h.send_header("Location", target.url + h.path)
            h.send_header("Content-Length", "0")
            h.end_headers()

        with StandIn(script) as first:
            cfg = PrometheusConfig(base_url=first.url, bearer_token="tok-secret", **ONE_METRIC)
            res = fetch_dcgm_range(cfg, *WINDOW)
    assert res.rows == 2
    assert first.requests[0]["auth"] == "Bearer tok-secret"
    assert target.requests[0]["auth"] is None


def test_plan_chunks() -> None:
    t0 = utc_s(1699999980)  # on the 30-s grid
    day = dt.timedelta(days=1)
    assert plan_chunks(t0, t0 + day, 30, 11_000) == [(1699999980_000, 1700086350_000)]
    chunks = plan_chunks(t0, t0 + day, 1, 11_000)
    assert len(chunks) == 8
    assert chunks[0] == (1699999980_000, 1700010979_000)
    assert all(b[0] == a[1] + 1000 for a, b in zip(chunks, chunks[1:], strict=False))
    assert chunks[-1][1] == 1700086379_000
    assert sum((e - s) // 1000 + 1 for s, e in chunks) == 86400
    # Off-grid start / end; a window without a grid point; sub-second steps.
    assert plan_chunks(utc_s(1699999981), utc_s(1700000041), 30, 100) == [(1700000010_000, 1700000040_000)]
    assert plan_chunks(utc_s(1699999981), utc_s(1700000010), 30, 100) == []
    assert plan_chunks(t0, t0 + dt.timedelta(seconds=1), 0.25, 3) == [
        (1699999980_000, 1699999980_500), (1699999980_750, 1699999980_750)]
    with pytest.raises(ValueError, match="empty window"):
        plan_chunks(t0, t0, 30, 10)
    with pytest.raises(ValueError, match="timezone-aware"):
        plan_chunks(dt.datetime(2025, 1, 1), dt.datetime(2025, 1, 2), 30, 10)


def test_promql_string_and_selectors() -> None:
    assert promql_string('a"b\\c\nd\te') == '"a\\"b\\\\c\\nd\\te"'
    assert promql_string("\x01") == '"\\x01"'
    cfg = PrometheusConfig(extra_selector='{cluster="a", job="dcgm"}', match_labels={"rack": 'r"1'})
    assert cfg.selector("DCGM_FI_DEV_GPU_UTIL") == 'DCGM_FI_DEV_GPU_UTIL{rack="r\\"1",cluster="a", job="dcgm"}'
    assert PrometheusConfig(extra_selector='cluster="a"').selector("X") == 'X{cluster="a"}'
    assert PrometheusConfig().selector("X") == "X"
    assert PrometheusConfig().metrics == tuple(_DCGM_METRICS) == DCGM_METRIC_NAMES
    assert set(ALL_FIELDS) <= set(DCGM_METRIC_NAMES)


@pytest.mark.parametrize("kw, match", [
    ({"metrics": ("NOT_A_DCGM_FIELD",)}, "not a DCGM field"),
    ({"metrics": ("bad name",)}, "not a metric name"),
    ({"match_labels": {"bad-label": "x"}}, "not a label name"),
    ({"bearer_token": "t", "username": "u", "password": "p"}, "not both"),
    ({"username": "u"}, "go together"),
    ({"base_url": "ftp://x"}, "http"),
    ({"base_url": "http://x/?a=b"}, "query"),
    ({"extra_selector": "{a=\"b\""}, "unbalanced"),
    ({"max_points_per_query": 0}, "positive"),
    ({"step_s": 0}, "step_s"),
])
def test_config_validation(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PrometheusConfig(**kw)


@pytest.mark.parametrize("url", ["http://alice:2024/Winter@prom:9090", "http://alice:2024?Winter@prom:9090"])
def test_a_password_urllib_cannot_split_is_refused_masked(url: str) -> None:
    """A password of digits and an unencoded '/' or '?' reads as a port and a path: the URL was kept
    as it is, the password in every error and log line."""
    with pytest.raises(ValueError, match=r"user info of http://\*\*\*@prom:9090") as err:
        PrometheusConfig(base_url=url)
    assert "Winter" not in str(err.value)


@needs_prometheus
def test_a_step_shorter_than_the_scrape_interval_gives_each_raw_sample_once(tmp_path: Path) -> None:
    """Exporters scraped every 60 s (Prometheus' default) read with the default 30-s step: each
    grid time takes the newest raw sample, so every sample came twice, and the energy counter's
    flat half-steps (the trapezoid) plus its double steps (the counter) made the energy 1.5 times
    the truth (0.45 kWh an hour of a constant 300 W). Now each raw sample is one row, at the first
    grid time at or after it, in exactly one of two adjacent windows, and the energy is exact."""
    from gpu_pipeline.lib.efficiency import compute_efficiency
    from gpu_pipeline.lib.store import connect

    t0 = 1_709_596_800  # 2024-03-05 00:00 UTC
    labels = {"gpu": "0", "UUID": "GPU-0667ce7c-1a2b-3c4d-5e6f-00112233aabb", "device": "nvidia0",
              "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "h1"}
    scrapes = [t0 - 3600 + 60 * i + 7 for i in range(6 * 60)]  # every 60 s at :07, 23:00 to 05:00
    watts = 300.0
    om = write_openmetrics(tmp_path / "h.om", [
        Series("DCGM_FI_DEV_POWER_USAGE", labels, [(t, watts) for t in scrapes]),
        Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, 90.0) for t in scrapes]),
        Series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", labels,
               [(t, 1e9 + watts * 1000 * (t - scrapes[0])) for t in scrapes]),
    ])
    create_blocks(om, tmp_path / "data")
    metrics = ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    windows = [(utc_s(t0), utc_s(t0 + 7200)), (utc_s(t0 + 7200), utc_s(t0 + 4 * 3600))]
    with PrometheusServer(data_dir=tmp_path / "data", workdir=tmp_path / "srv") as server:
        server.wait_for("count(DCGM_FI_DEV_GPU_UTIL)", t0)
        cfg = cfg_for(server, metrics=metrics, step_s=30)
        results = [fetch_dcgm_range(cfg, s, e) for s, e in windows]
    for (s, e), res in zip(windows, results, strict=True):
        raw = [t for t in scrapes if s.timestamp() - 30 < t <= e.timestamp() - 30]  # a grid time >= it in [s, e)
        rows = res.table.to_pylist()
        assert [r["sample_utc"] for r in rows] == [utc_s(t + 23) for t in raw]  # the next multiple of 30 s
        assert {r["power_w"] for r in rows} == {watts}
        assert res.counters["repeated_points"] == res.counters["points"] - 3 * len(rows)
    assert not {r["sample_utc"] for r in results[0].table.to_pylist()} & {
        r["sample_utc"] for r in results[1].table.to_pylist()}
    con = connect()
    try:
        con.register("s_in", results[0].table)
        hourly = compute_efficiency(con, "s_in", [], *windows[0]).hourly.to_pylist()
    finally:
        con.close()
    # 300 W for each hour's 3,570 s between its samples (the window's first sample is at 00:00:30
    # and its last at 01:59:30; the counter's step at 01:00:30 is split at the hour)
    assert [(h["energy_kwh"], h["energy_source"]) for h in hourly] == [(pytest.approx(0.3 * 3570 / 3600), "counter")] * 2


def _jittered_day(tmp_path: Path, n_gpus: int = 6) -> tuple[int, dict[str, list[tuple[float, float]]], Path]:
    """``n_gpus`` GPUs scraped every 60 s around a day, scrape times jittering around the minute
    (some exactly on it), GPU_UTIL and POWER_USAGE, a distinct value per scrape. The day's start,
    each GPU's (time, util) samples, and the TSDB folder."""
    t0 = 1_752_537_600  # 2025-07-15 00:00 UTC
    jitter = (-0.4, 0.0, 0.25, -0.1, 0.5, 0.0, -0.35)
    samples, series = {}, []
    for g in range(n_gpus):
        uuid = f"GPU-{g:08x}-1111-2222-3333-444444444444"
        labels = {"gpu": str(g), "UUID": uuid, "Hostname": "h1"}
        times = [t0 - 600 + 60 * i + jitter[(i + g) % len(jitter)] for i in range(24 * 60 + 20)]
        samples[f"GPU-{g:08x}"] = [(t, float(i % 97 + g)) for i, t in enumerate(times)]
        series.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, samples[f"GPU-{g:08x}"]))
    for g in range(n_gpus):  # a second metric: the chunk size learned on the first carries over
        labels = {"gpu": str(g), "UUID": f"GPU-{g:08x}-1111-2222-3333-444444444444", "Hostname": "h1"}
        series.append(Series("DCGM_FI_DEV_POWER_USAGE", labels, [(t, 100.0 + v) for t, v in samples[f"GPU-{g:08x}"]]))
    data = tmp_path / "data"
    create_blocks(write_openmetrics(tmp_path / "h.om", series), data)
    return t0, samples, data


@needs_prometheus
def test_a_day_over_max_samples_is_read_in_halves_with_the_rows_of_an_unsplit_read(tmp_path: Path) -> None:
    """A whole day of one metric over many series exceeds Prometheus' --query.max-samples (HTTP 422,
    errorType=execution), which failed the raw telemetry day. The chunk is halved until Prometheus
    answers; the rows are exactly each raw sample once, at the first 30-s grid time at or after it,
    as an unsplit read from a server without the limit gives them: nothing lost or doubled where
    the halves meet."""
    t0, samples, data = _jittered_day(tmp_path)
    shutil.copytree(data, tmp_path / "data2")
    start, end = utc_s(t0), utc_s(t0 + 86400)
    metrics = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE")
    with PrometheusServer(data_dir=data, workdir=tmp_path / "limited",
                          extra_flags=["--query.max-samples=5000"]) as limited:
        limited.wait_for("count(DCGM_FI_DEV_GPU_UTIL)", t0)
        # the limit is real: the day of one metric in one query is refused
        with pytest.raises(PrometheusError) as ei:
            query_range(cfg_for(limited, step_s=30), "DCGM_FI_DEV_GPU_UTIL", t0 * 1000, (t0 + 86400 - 30) * 1000)
        assert (ei.value.status, ei.value.error_type) == (422, "execution")
        assert "too many samples" in ei.value.error
        split = fetch_dcgm_range(cfg_for(limited, step_s=30, metrics=metrics, max_retries=0), start, end)
    with PrometheusServer(data_dir=tmp_path / "data2", workdir=tmp_path / "unlimited") as unlimited:
        unlimited.wait_for("count(DCGM_FI_DEV_GPU_UTIL)", t0)
        whole = fetch_dcgm_range(cfg_for(unlimited, step_s=30, metrics=metrics), start, end)
    c = split.counters
    assert c["chunks"] == 1 and c["max_samples_splits"] >= 2 and c["refused_queries"] == c["max_samples_splits"]
    assert "max_samples_splits" not in whole.counters and whole.counters["queries"] == 2 * len(metrics)
    # every raw sample once, at the first multiple of 30 s at or after it, within the day
    expected = sorted(
        (utc_s(-(-round(t * 1000) // 30_000) * 30), gpu, v, 100.0 + v)
        for gpu, rows in samples.items() for t, v in rows
        if t0 * 1000 <= -(-round(t * 1000) // 30_000) * 30_000 < (t0 + 86400) * 1000)
    assert len(expected) == 6 * 1440
    for res in (split, whole):
        got = sorted((r["sample_utc"], r["gpu_id"], r["util_pct"], r["power_w"]) for r in res.table.to_pylist())
        assert got == expected
    assert split.table.drop_columns(["source_file"]).equals(whole.table.drop_columns(["source_file"]))
    assert split.counters["repeated_points"] == whole.counters["repeated_points"]


@needs_prometheus
def test_one_grid_point_over_max_samples_is_a_clear_error(tmp_path: Path) -> None:
    t0, _, data = _jittered_day(tmp_path)
    with PrometheusServer(data_dir=data, workdir=tmp_path / "srv", extra_flags=["--query.max-samples=3"]) as srv:
        srv.wait_for('DCGM_FI_DEV_GPU_UTIL{gpu="0"}', t0)  # one series: under the limit
        cfg = cfg_for(srv, step_s=30, metrics=("DCGM_FI_DEV_GPU_UTIL",), max_retries=0)
        with pytest.raises(PrometheusError) as ei:
            fetch_dcgm_range(cfg, utc_s(t0), utc_s(t0 + 3600))
    msg = str(ei.value)
    assert "DCGM_FI_DEV_GPU_UTIL even one grid point" in msg
    assert "2025-07-15T00:00:00Z .. 2025-07-15T01:00:00Z" in msg and "the point at 2025-07-15T00:00:00Z" in msg
    assert "too many samples" in msg and "--query.max-samples" in msg
    assert (ei.value.status, ei.value.error_type) == (422, "execution")


@needs_prometheus
def test_a_step_equal_to_the_scrape_interval_loses_jittered_samples_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Each point takes the newest raw sample: where a late scrape is followed by an early one, two
    samples share a step and the first is never read. The docs claimed a step >= the scrape interval
    keeps one raw sample a step; at a step equal to it, samples are lost with nothing said. Half the
    scrape interval reads every one; the coarse step is counted and warned about."""
    t0, samples, data = _jittered_day(tmp_path, n_gpus=1)
    raw = [t for t, _ in samples["GPU-00000000"]]
    start, end = utc_s(t0), utc_s(t0 + 86400)
    with PrometheusServer(data_dir=data, workdir=tmp_path / "srv") as srv:
        srv.wait_for("count(DCGM_FI_DEV_GPU_UTIL)", t0)
        caplog.set_level(logging.WARNING, logger="gpu_pipeline.lib.prometheus_source")
        coarse = fetch_dcgm_range(cfg_for(srv, step_s=60, metrics=("DCGM_FI_DEV_GPU_UTIL",)), start, end)
        coarse_log = caplog.text
        caplog.clear()
        fine = fetch_dcgm_range(cfg_for(srv, step_s=30, metrics=("DCGM_FI_DEV_GPU_UTIL",)), start, end)
    in_day = [t for t in raw if t0 * 1000 <= -(-round(t * 1000) // 30_000) * 30_000 < (t0 + 86400) * 1000]
    assert fine.rows == len(in_day) == 1440
    assert "step_too_coarse" not in fine.counters and 59_000 <= fine.counters["raw_interval_ms"] <= 61_000
    assert "step_s" not in caplog.text
    # at step 60, a sample late by 0.25 or 0.5 s followed by one early or on time is lost: 2 of each 7
    assert coarse.rows < 1440 * 6 / 7
    assert coarse.counters["step_too_coarse"] == 1
    assert 59_000 <= coarse.counters["raw_interval_ms"] <= 61_000
    kept = coarse.counters["points"] - coarse.counters["repeated_points"]
    assert kept == coarse.rows
    assert "step_s=60 is more than half the interval of the raw samples kept" in coarse_log
    assert f"kept {kept} of the {coarse.counters['points']} points asked for" in coarse_log


def test_the_raw_telemetry_asset_puts_a_too_coarse_step_in_the_days_metadata_and_log(tmp_path: Path) -> None:
    """The reader's counters of a step too coarse for the scrape interval reached neither the day's
    metadata nor Dagster's log (the reader warns through Python's logging, which a run does not show)."""
    import dagster as dg

    from gpu_pipeline.defs.raw.gpu_telemetry import gpu_telemetry
    from gpu_pipeline.defs.resources import DataStoreResource, TelemetryResource

    t0, _, data = _jittered_day(tmp_path, n_gpus=1)
    day = utc_s(t0).date().isoformat()
    with PrometheusServer(data_dir=data, workdir=tmp_path / "srv") as srv:
        srv.wait_for("count(DCGM_FI_DEV_GPU_UTIL)", t0)
        for step, coarse in (("60", 1), ("30", 0)):
            res = {"data_store": DataStoreResource(data_root=str(tmp_path / f"data{step}")),
                   "telemetry": TelemetryResource(prometheus_url=srv.base_url, prometheus_step_s=step)}
            with dg.instance_for_test() as instance:
                result = dg.materialize([gpu_telemetry], resources=res, partition_key=day, instance=instance,
                                        raise_on_error=False)
                (mat,) = result.get_asset_materialization_events()
                md = mat.event_specific_data.materialization.metadata
                logs = [r.user_message for r in instance.all_logs(result.run_id) if "too coarse" in r.user_message]
            assert md["step_too_coarse"].value == coarse, step
            assert bool(logs) is bool(coarse), (step, logs)
