"""Historical dcgm-exporter metrics from the Prometheus HTTP API into ``gpu_samples`` (DESIGN.md 4.3).

:func:`fetch_dcgm_range` reads a UTC window ``[start, end)`` with ``GET /api/v1/query_range``, one
metric at a time (``PrometheusConfig.metrics``, by default every DCGM field the text parser maps,
:data:`gpu_pipeline.lib.telemetry._DCGM_METRICS`), and returns a
:class:`~gpu_pipeline.lib.telemetry.ParseResult` whose table has the :data:`GPU_SAMPLES` schema with
``source = "prometheus"``.

Sample times
    ``query_range`` evaluates the selector at ``t0, t0 + step, ...``; each point is the newest raw
    sample at or before ``t`` within Prometheus' lookback delta (5 min by default). The grid is
    aligned to multiples of ``step_s`` since the epoch (``t0`` = the first multiple >= start) so
    that windows computed separately (days) meet without overlap or gap; the last point is the last
    multiple < end. A point is kept only when its raw sample is new: with each data query the
    same selector's ``timestamp(...)`` is queried over the same grid (the time of the raw sample
    each point took), and a point whose sample is at or before the previous grid time (``t -
    step``) -- which that point took too, in this window or the day before's -- is dropped
    (``repeated_points``). So exporters scraped every 60 s, read with a 30-s step, give each raw
    sample once, at the first grid time at or after it; before, every sample came twice, and the
    energy counter's flat half-steps made the day's energy 1.5 times the truth. Where
    ``timestamp(...)`` gives a series no value at a point, the point is kept. A series that ends
    without a staleness marker (data backfilled with promtool, an exporter that vanished without a
    final scrape) thus gives its last sample once, not for the whole lookback delta.

    Each point takes only the *newest* raw sample at or before it, so two raw samples in one step
    ``(t - step, t]`` give one point and the older sample is never read. **Use a step of at most
    half the scrape interval** (``step_s`` 30 for exporters scraped every 60 s; 15 for every
    30 s): then two samples share a step only where their scrape times jitter by more than a
    quarter of the interval. A step equal to the scrape interval loses a sample wherever a late
    scrape is followed by an early one -- with scrape times jittering around the grid, about a
    quarter of the raw samples (the point that would have read it repeats the sample before it and
    is dropped). A step longer than the scrape interval keeps at most one raw sample a step
    (downsampling). The interval of the raw samples kept is counted (``raw_interval_ms``, the
    median gap between consecutive kept samples of a series); where ``step_s`` is above ~half of it
    (55 %), ``step_too_coarse`` is 1 and a warning says how many points were kept of how many were
    asked for. The kept samples are never closer than the step, so at a step above the scrape
    interval that median is the step's, not the scrape interval: halve the step until the warning
    stops.

Chunking
    Prometheus refuses a query whose ``(end - start) / step`` exceeds 11,000 points per series.
    The grid is split into consecutive chunks of at most ``max_points_per_query`` points (inclusive
    ends, no point queried twice), one request each. A query over many series can also exceed the
    server's ``--query.max-samples`` (HTTP 422, ``errorType=execution``, "query processing would
    load too many samples into memory"): that chunk's points are halved and each half read on its
    own, recursively, and the chunks after it (of this metric and the next) are read at the size
    that worked (``max_samples_splits`` counts the halvings, ``refused_queries`` the refusals). The
    halves split the chunk's grid (no point is read twice or lost at their boundary) and a point's
    repeat test needs no other point, so the rows are those of an unsplit read. A single grid point
    still refused raises :class:`PrometheusError` naming the metric, the time, the window and
    Prometheus' message.

Mapping
    Rows are built by the dcgm-exporter text parser's own pivot (``telemetry._DcgmPivot``), so label
    handling is identical: ``UUID`` -> ``gpu_uuid`` and the HTCondor short ``gpu_id``, ``gpu`` ->
    ``gpu_index``, ``modelName``, MIG ``GPU_I_PROFILE`` / ``GPU_I_ID``, DCGM blank sentinels -> null,
    DCP ratios x 100, ``mem_total_mib`` from FB_TOTAL or USED + FREE (+ RESERVED), one row per
    (timestamp, host, GPU, MIG instance), series that differ only in other labels fill the same row
    (a second value for one cell is counted as ``duplicate_samples`` / ``conflicting_samples``).
    The host is the first non-empty label of ``PrometheusConfig.host_labels`` (default ``Hostname``,
    ``hostname``, then ``instance`` with its ``:port`` removed). ``NaN`` and ``+/-Inf`` values read as
    null (counted). ``source_file`` holds the base URL (no credentials).

Failures
    Every request is retried up to ``max_retries`` times with exponential backoff (jittered, capped
    at ``retry_backoff_max_s``) on HTTP 429 and 5xx (``Retry-After`` honoured up to that cap), timeouts
    and connection errors (refused, reset, a truncated response). The default backoff (0.25 s,
    doubling) gives up on a server that is down after about 4 s. Anything else -- and the last
    failed attempt -- raises :class:`PrometheusError` with the URL (never a credential), the HTTP
    status and Prometheus' ``errorType`` / ``error`` (e.g. ``bad_data`` for invalid PromQL or too
    many points; ``execution`` for a query that hit ``--query.max-samples`` is split instead, see
    Chunking).

Query strings are built with :func:`urllib.parse.urlencode`. ``extra_selector`` (e.g.
``{cluster="a"}``) is operator configuration and inserted as written; values this module inserts
itself (``match_labels``) are escaped with :func:`promql_string`.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import http.client
import json
import logging
import math
import random
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit, urlunsplit

import numpy as np

from gpu_pipeline.lib.http_util import mask_userinfo, retry_after_seconds, unsplit_userinfo
from gpu_pipeline.lib.telemetry import (
    _DCGM_METRICS,
    ParseResult,
    _DcgmPivot,
    _finish,
)

logger = logging.getLogger(__name__)

#: Prometheus' hard limit on points per series of one range query.
PROMETHEUS_MAX_POINTS = 11_000
#: The DCGM fields the dcgm-exporter text parser maps (same mapping, same order).
DCGM_METRIC_NAMES: tuple[str, ...] = tuple(_DCGM_METRICS)
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_MASK = "***"
_METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_PORT_RE = re.compile(r"^(.*):(\d+)$")


class PrometheusError(RuntimeError):
    """A Prometheus API request failed. The message names the URL (without credentials), the HTTP
    status and Prometheus' ``errorType`` and ``error``; the same are attributes."""

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None,
                 error_type: str | None = None, error: str | None = None, attempts: int = 1):
        super().__init__(message)
        self.url = url
        self.status = status
        self.error_type = error_type
        self.error = error
        self.attempts = attempts


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal (backslash, quote and control characters
    escaped with the escapes the PromQL lexer accepts)."""
    out = ['"']
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _strip_userinfo(url: str) -> tuple[str, str | None, str | None]:
    if unsplit_userinfo(url):  # a password urllib would leave in the URL (see http_util)
        raise ValueError(f"PrometheusConfig.base_url: cannot read the user info of {mask_userinfo(url, _MASK)} "
                         "(percent-encode '/', '?', '#' and '@' in the password, or give it separately)")
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    netloc = parts.hostname or ""
    if ":" in netloc:  # IPv6
        netloc = f"[{netloc}]"
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return clean, user, password


@dataclass(frozen=True, repr=False)
class PrometheusConfig:
    """Where and how to read DCGM history from Prometheus. ``repr`` masks ``bearer_token`` and
    ``password``; credentials inside ``base_url`` (``https://user:pass@host``) are moved to
    ``username`` / ``password`` and removed from the URL, so they never reach a log line or an
    error message. ``verify_tls=False`` logs a warning.

    ``base_url`` is the server root, may include a path prefix (``--web.route-prefix`` or a
    reverse proxy: ``https://host/prometheus``). ``extra_selector``: label matchers added to every
    selector, written as PromQL (``{cluster="a",job="dcgm"}`` or without braces). ``match_labels``:
    exact-match matchers whose values this module escapes. ``trust_env``: use the ``*_proxy``
    environment variables (``False``: connect directly)."""

    base_url: str = "http://localhost:9090"
    bearer_token: str | None = None
    username: str | None = None
    password: str | None = None
    verify_tls: bool = True
    ca_file: str | None = None
    timeout_s: float = 30.0
    step_s: float = 30.0
    max_points_per_query: int = PROMETHEUS_MAX_POINTS
    max_retries: int = 4
    metrics: Sequence[str] = DCGM_METRIC_NAMES
    extra_selector: str = ""
    match_labels: Mapping[str, str] = field(default_factory=dict)
    host_labels: Sequence[str] = ("Hostname", "hostname", "instance")
    retry_backoff_s: float = 0.25  #: first backoff; doubles per retry of one request
    retry_backoff_max_s: float = 8.0  #: cap of one backoff and of an honoured Retry-After
    trust_env: bool = True

    def __post_init__(self) -> None:
        url = (self.base_url or "").strip()
        if not url:
            raise ValueError("PrometheusConfig.base_url is empty")
        if "://" not in url:
            url = f"http://{url}"
        url, user, password = _strip_userinfo(url)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"PrometheusConfig.base_url must be an http(s) URL, got {url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"PrometheusConfig.base_url must not have a query or fragment: {url!r}")
        object.__setattr__(self, "base_url", url.rstrip("/"))
        if user is not None and self.username is None:
            object.__setattr__(self, "username", user)
            object.__setattr__(self, "password", password or "")
        if self.bearer_token and self.username is not None:
            raise ValueError("PrometheusConfig: give bearer_token or username/password, not both")
        if (self.username is None) != (self.password is None):
            raise ValueError("PrometheusConfig: username and password go together")
        metrics = (self.metrics,) if isinstance(self.metrics, str) else tuple(self.metrics)
        if not metrics:
            raise ValueError("PrometheusConfig.metrics is empty")
        for m in metrics:
            if not _METRIC_NAME_RE.match(m):
                raise ValueError(f"PrometheusConfig.metrics: not a metric name: {m!r}")
            if m not in _DCGM_METRICS:
                raise ValueError(
                    f"PrometheusConfig.metrics: {m!r} is not a DCGM field the gpu_samples mapping knows "
                    f"(known: {', '.join(DCGM_METRIC_NAMES)})"
                )
        object.__setattr__(self, "metrics", metrics)
        for name in self.match_labels:
            if not _LABEL_NAME_RE.match(name):
                raise ValueError(f"PrometheusConfig.match_labels: not a label name: {name!r}")
        object.__setattr__(self, "match_labels", dict(self.match_labels))
        hosts = (self.host_labels,) if isinstance(self.host_labels, str) else tuple(self.host_labels)
        object.__setattr__(self, "host_labels", hosts)
        object.__setattr__(self, "extra_selector", _selector_inner(self.extra_selector))
        if not self.step_s > 0 or round(self.step_s * 1000) < 1:
            raise ValueError(f"PrometheusConfig.step_s must be >= 0.001, got {self.step_s!r}")
        if not isinstance(self.max_points_per_query, int) or self.max_points_per_query < 1:
            raise ValueError(
                f"PrometheusConfig.max_points_per_query must be a positive integer, got {self.max_points_per_query!r}"
            )
        if self.max_retries < 0:
            raise ValueError(f"PrometheusConfig.max_retries must be >= 0, got {self.max_retries!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"PrometheusConfig.timeout_s must be > 0, got {self.timeout_s!r}")
        if self.retry_backoff_s < 0 or self.retry_backoff_max_s < 0:
            raise ValueError("PrometheusConfig retry backoffs must be >= 0")
        if not self.verify_tls:
            logger.warning(
                "TLS certificate verification is OFF for Prometheus at %s (verify_tls=False); "
                "the connection can be intercepted. Prefer ca_file.", self.base_url,
            )

    def __repr__(self) -> str:
        parts = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name in ("bearer_token", "password") and value is not None:
                value = _MASK
            parts.append(f"{name}={value!r}")
        return f"PrometheusConfig({', '.join(parts)})"

    __str__ = __repr__

    def secrets(self) -> list[str]:
        """Every string that must never be shown: the token, the password and the header forms."""
        out = []
        if self.bearer_token:
            out.append(self.bearer_token)
        if self.password:
            out.append(self.password)
            out.append(base64.b64encode(f"{self.username}:{self.password}".encode()).decode())
        return [s for s in out if s]

    def selector(self, metric: str) -> str:
        """The PromQL series selector of one metric: ``name{match_labels..., extra_selector}``."""
        if not _METRIC_NAME_RE.match(metric):
            raise ValueError(f"not a metric name: {metric!r}")
        matchers = [f"{k}={promql_string(v)}" for k, v in self.match_labels.items()]
        if self.extra_selector:
            matchers.append(self.extra_selector)
        return f"{metric}{{{','.join(matchers)}}}" if matchers else metric


def _selector_inner(text: str) -> str:
    s = (text or "").strip()
    if s.startswith("{"):
        if not s.endswith("}"):
            raise ValueError(f"PrometheusConfig.extra_selector: unbalanced braces in {text!r}")
        s = s[1:-1].strip()
    return s.rstrip(",").strip()


def _redact(text: str, cfg: PrometheusConfig) -> str:
    for s in sorted(cfg.secrets(), key=len, reverse=True):
        text = text.replace(s, _MASK)
    return text


# ----------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------


class _SameOriginAuthRedirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never send the Authorization header to another origin."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            a, b = urlsplit(req.full_url), urlsplit(new.full_url)
            if (a.scheme, a.hostname, a.port) != (b.scheme, b.hostname, b.port):
                new.remove_header("Authorization")
        return new


def _ssl_context(cfg: PrometheusConfig) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=cfg.ca_file)
    if not cfg.verify_tls:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _opener(cfg: PrometheusConfig) -> urllib.request.OpenerDirector:
    handlers: list[Any] = [_SameOriginAuthRedirect()]
    if urlsplit(cfg.base_url).scheme == "https":
        handlers.append(urllib.request.HTTPSHandler(context=_ssl_context(cfg)))
    if not cfg.trust_env:
        handlers.append(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(*handlers)


def _headers(cfg: PrometheusConfig) -> dict[str, str]:
    h = {"Accept": "application/json", "Accept-Encoding": "gzip", "User-Agent": "gpu-pipeline"}
    if cfg.bearer_token:
        h["Authorization"] = f"Bearer {cfg.bearer_token}"
    elif cfg.username is not None:
        token = base64.b64encode(f"{cfg.username}:{cfg.password}".encode()).decode()
        h["Authorization"] = f"Basic {token}"
    return h


def _retry_after_s(headers: Any) -> float | None:
    return retry_after_seconds(headers.get("Retry-After") if headers is not None else None)


def _decode(body: bytes, headers: Any) -> bytes:
    if headers is not None and (headers.get("Content-Encoding") or "").lower() == "gzip":
        return gzip.decompress(body)
    return body


def _error_fields(body: bytes) -> tuple[str | None, str | None]:
    """``(errorType, error)`` of a Prometheus error body; ``(None, text)`` for anything else."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        text = body[:300].decode("utf-8", "replace").strip()
        return None, text or None
    if isinstance(doc, dict):
        return doc.get("errorType"), doc.get("error")
    return None, None


def _inner(exc: BaseException) -> BaseException:
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException):
        return exc.reason
    return exc


def _reason(exc: BaseException, timeout_s: float) -> str:
    """The innermost useful message of a urllib / socket error, e.g. 'connection refused'."""
    inner = _inner(exc)
    if isinstance(inner, ConnectionRefusedError):
        return "connection refused (is Prometheus running and listening there?)"
    if isinstance(inner, TimeoutError):
        return f"timed out after {timeout_s:g}s"
    text = str(inner)
    return f"{type(inner).__name__}: {text}" if text else type(inner).__name__


def _fatal_tls(exc: BaseException) -> ssl.SSLError | None:
    """A TLS error that a retry cannot fix (certificate, protocol); ``None`` for anything else
    (a TLS connection cut short is retried like any dropped connection)."""
    inner = _inner(exc)
    if isinstance(inner, ssl.SSLError) and not isinstance(inner, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return inner
    return None


class _Client:
    """One opener, the retry loop and counters for a sequence of API calls."""

    def __init__(self, cfg: PrometheusConfig, sleep: Callable[[float], None] = time.sleep):
        self.cfg = cfg
        self.opener = _opener(cfg)
        self.headers = _headers(cfg)
        self.sleep = sleep
        self.rng = random.Random()
        self.retries = 0
        self.requests = 0
        self.warnings = 0  #: warnings of successful responses (e.g. partial data from a remote store)

    def _fail(self, url: str, status: int | None, etype: str | None, error: str | None, attempts: int,
              hint: str = "", query: str | None = None) -> PrometheusError:
        cfg = self.cfg
        err = error if error is None or len(error) <= 500 else error[:497] + "..."
        msg = f"Prometheus request failed: GET {url}"
        msg += f" (query {query!r})" if query else ""
        msg += f": HTTP {status}" if status is not None else ""
        msg += f", errorType={etype}" if etype else ""
        msg += f", error={err}" if err else ""
        if attempts > 1:
            msg += f" (after {attempts} attempts)"
        msg += f" -- {hint}" if hint else ""
        return PrometheusError(_redact(msg, cfg), url=url, status=status, error_type=etype,
                               error=_redact(err, cfg) if err else err, attempts=attempts)

    def backoff(self, attempt: int) -> float:
        b = min(self.cfg.retry_backoff_max_s, self.cfg.retry_backoff_s * (2**attempt))
        return b * (0.75 + 0.25 * self.rng.random())

    def get(self, path: str, params: Sequence[tuple[str, str]]) -> dict:
        """``GET base_url + path?params``; the decoded JSON document of a success
        (``{"status": "success", "data": ...}``)."""
        cfg = self.cfg
        url = f"{cfg.base_url}{path}?{urlencode(params)}"
        query = dict(params).get("query")
        attempt = 0
        while True:
            retry_after = None
            status: int | None = None
            self.requests += 1
            try:
                req = urllib.request.Request(url, headers=self.headers, method="GET")
                with self.opener.open(req, timeout=cfg.timeout_s) as resp:
                    status = resp.status
                    body = _decode(resp.read(), resp.headers)
                return self._success(url, status, body, attempt + 1, query)
            except urllib.error.HTTPError as exc:
                status = exc.code
                try:
                    body = _decode(exc.read(), exc.headers)
                except (OSError, http.client.HTTPException, EOFError):
                    body = b""
                etype, error = _error_fields(body)
                if error is None:
                    error = exc.reason if isinstance(exc.reason, str) else None
                if status not in RETRY_STATUSES:
                    hint = {401: "check bearer_token / username and password",
                            403: "the credentials are not allowed to query",
                            404: "check base_url (and any path prefix)"}.get(status, "")
                    raise self._fail(url, status, etype, error, attempt + 1, hint, query=query) from None
                if attempt >= cfg.max_retries:
                    raise self._fail(url, status, etype, error, attempt + 1, query=query) from None
                why = f"HTTP {status}" + (f" {etype}" if etype else "")
                retry_after = _retry_after_s(exc.headers)
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException,
                    EOFError, OSError) as exc:
                tls = _fatal_tls(exc)
                if tls is not None:
                    raise self._fail(url, None, "tls_error", f"{type(tls).__name__}: {tls}", attempt + 1,
                                     "check ca_file, or the host name in the server's certificate",
                                     query=query) from None
                if isinstance(_inner(exc), socket.gaierror):
                    raise self._fail(url, None, "connection_error", f"cannot resolve host: {_inner(exc)}",
                                     attempt + 1, "check base_url", query=query) from None
                why = _reason(exc, cfg.timeout_s)
                if attempt >= cfg.max_retries:
                    raise self._fail(url, None, "connection_error", why, attempt + 1, query=query) from None
            delay = self.backoff(attempt)
            if retry_after is not None:
                delay = max(delay, min(retry_after, cfg.retry_backoff_max_s))
            attempt += 1
            self.retries += 1
            logger.warning("%s", _redact(
                f"Prometheus GET {url}: {why}; retry {attempt} of {cfg.max_retries} in {delay:.2f}s", cfg))
            self.sleep(delay)

    def _success(self, url: str, status: int, body: bytes, attempts: int, query: str | None) -> dict:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise self._fail(url, status, None, "the response is not JSON (is base_url a Prometheus "
                             "server?)", attempts, query=query) from None
        if not isinstance(doc, dict) or "status" not in doc:
            raise self._fail(url, status, None, "the response is not a Prometheus API envelope", attempts,
                             query=query)
        if doc.get("status") != "success":
            raise self._fail(url, status, doc.get("errorType"), doc.get("error"), attempts, query=query)
        for w in doc.get("warnings") or ():
            self.warnings += 1
            logger.warning("Prometheus warning for GET %s: %s", url, w)
        return doc


# ----------------------------------------------------------------------------------------------
# Range queries
# ----------------------------------------------------------------------------------------------


def _epoch_ms(t: dt.datetime, what: str) -> int:
    if not isinstance(t, dt.datetime):
        raise TypeError(f"{what} must be a datetime, got {type(t).__name__}")
    if t.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware (UTC), got naive {t!r}")
    return (t - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)


def plan_chunks(start_utc: dt.datetime, end_utc: dt.datetime, step_s: float,
                max_points: int) -> list[tuple[int, int]]:
    """The evaluation grid of ``[start, end)`` -- multiples of ``step_s`` since the epoch -- split into
    ``(first_ms, last_ms)`` chunks (both inclusive, epoch milliseconds) of at most ``max_points``
    points each. Empty when no grid point lies in the window."""
    start_ms, end_ms = _epoch_ms(start_utc, "start_utc"), _epoch_ms(end_utc, "end_utc")
    if end_ms <= start_ms:
        raise ValueError(f"empty window: end_utc {end_utc} <= start_utc {start_utc}")
    step = round(step_s * 1000)
    if step < 1 or max_points < 1:
        raise ValueError("step_s must be >= 0.001 and max_points >= 1")
    first = -(-start_ms // step) * step
    if first >= end_ms:
        return []
    last = first + ((end_ms - 1 - first) // step) * step
    chunks = []
    cs = first
    while cs <= last:
        ce = min(cs + (max_points - 1) * step, last)
        chunks.append((cs, ce))
        cs = ce + step
    return chunks


def _ms_param(ms: int) -> str:
    s, r = divmod(ms, 1000)
    return str(s) if r == 0 else f"{s}.{r:03d}"


def query_range(cfg: PrometheusConfig, query: str, start_ms: int, end_ms: int,
                client: _Client | None = None) -> list[dict]:
    """One ``/api/v1/query_range`` call (no chunking) with ``cfg.step_s``; the ``result`` list of a
    ``matrix`` response: ``[{"metric": {labels}, "values": [[ts, "v"], ...]}, ...]``."""
    c = client or _Client(cfg)
    params = [
        ("query", query),
        ("start", _ms_param(start_ms)),
        ("end", _ms_param(end_ms)),
        ("step", _ms_param(round(cfg.step_s * 1000))),
        ("timeout", f"{cfg.timeout_s:g}"),
    ]
    doc = c.get("/api/v1/query_range", params)
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise PrometheusError(
            f"Prometheus query_range on {cfg.base_url} returned resultType {got!r}, expected 'matrix' "
            f"(query {query!r})", url=cfg.base_url,
        )
    return data["result"]


def _host_from(labels: Mapping[str, str], host_labels: Sequence[str]) -> str | None:
    for name in host_labels:
        value = labels.get(name)
        if value:
            if name == "instance":
                m = _PORT_RE.match(value)
                if m:
                    value = m.group(1)
                    if value.startswith("[") and value.endswith("]"):
                        value = value[1:-1]
            return value
    return None


def _series_key(series: Mapping[str, Any]) -> frozenset:
    return frozenset((k, v) for k, v in (series.get("metric") or {}).items() if k != "__name__")


def _repeated_points(sample_times: Sequence, step_ms: int) -> tuple[set[int], list[int]]:
    """The grid times (ms) whose raw sample (``timestamp()``'s value there) is at or before the
    grid time before them, so an earlier point took it already; and the raw sample times (ms) of
    the other points, in order."""
    out = set()
    kept = []
    for ts, text in sample_times:
        t_ms = round(float(ts) * 1000)
        try:
            sample_ms = round(float(text) * 1000)
        except ValueError:
            continue
        if sample_ms <= t_ms - step_ms:
            out.add(t_ms)
        else:
            kept.append(sample_ms)
    return out, kept


def _too_many_samples(exc: PrometheusError) -> bool:
    """Prometheus' answer to a query over ``--query.max-samples``."""
    return exc.status == 422 and exc.error_type == "execution" and "too many samples" in (exc.error or "")


def _iso_ms(ms: int) -> str:
    t = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)
    return t.isoformat(timespec="milliseconds" if ms % 1000 else "seconds").replace("+00:00", "Z")


def _raw_interval_ms(gaps: Sequence[tuple[float, int]]) -> int | None:
    """The median gap between consecutive raw samples kept, from (median, number of gaps) of each
    series and chunk (weighted by the number of gaps)."""
    if not gaps:
        return None
    ordered = sorted(gaps)
    half, seen = sum(n for _, n in ordered) / 2, 0
    for median, n in ordered:
        seen += n
        if seen >= half:
            return round(median)
    return round(ordered[-1][0])


def fetch_dcgm_range(cfg: PrometheusConfig, start_utc: dt.datetime, end_utc: dt.datetime, *,
                     sleep: Callable[[float], None] = time.sleep) -> ParseResult:
    """DCGM samples in ``[start_utc, end_utc)`` from Prometheus as ``gpu_samples`` rows (``source =
    "prometheus"``), sorted by (sample_utc, host, gpu_id). See the module docstring.

    Counters: ``queries`` (HTTP range queries answered, two a metric and chunk: the values and
    their raw sample times), ``chunks`` (per metric, as planned), ``max_samples_splits`` (chunks
    halved because Prometheus refused them for ``--query.max-samples``) and ``refused_queries``,
    ``series``, ``points``, ``repeated_points`` (a raw sample an earlier grid time took: dropped),
    ``raw_interval_ms`` (median gap between the raw samples kept) and ``step_too_coarse`` (1 where
    ``step_s`` is above ~half of it: raw samples may be lost, a warning is logged),
    ``non_finite_values`` (NaN / +-Inf read as null), ``retries``, ``warnings`` (of responses
    that succeeded, e.g. partial data), ``rows_without_host``, plus the text parser's pivot
    counters (``samples``, ``duplicate_samples``, ``conflicting_samples``,
    ``samples_without_uuid``, ``blank_values``, ``nan_values`` ...)."""
    chunks = plan_chunks(start_utc, end_utc, cfg.step_s, cfg.max_points_per_query)
    start_us = _epoch_ms(start_utc, "start_utc") * 1000
    end_us = _epoch_ms(end_utc, "end_utc") * 1000
    client = _Client(cfg, sleep=sleep)
    pivot = _DcgmPivot(None, None, cfg.base_url)
    extra: Counter[str] = Counter()
    extra["chunks"] = len(chunks)
    host_keys = ("Hostname", "hostname")
    step_ms = round(cfg.step_s * 1000)
    limit = cfg.max_points_per_query  # points a chunk; lowered where --query.max-samples refuses one
    gaps: list[tuple[float, int]] = []  # (median gap between kept raw samples, gaps) per series and chunk
    for metric in cfg.metrics:
        selector = cfg.selector(metric)
        todo = chunks[::-1]  # a stack: the next chunk last
        while todo:
            cs, ce = todo.pop()
            n_points = (ce - cs) // step_ms + 1
            if n_points > limit:
                cut = cs + (limit - 1) * step_ms
                todo += [(cut + step_ms, ce), (cs, cut)]
                continue
            try:
                result = query_range(cfg, selector, cs, ce, client)
                # the raw sample time behind each point, per series (timestamp() drops the metric name)
                taken = {_series_key(series): series.get("values") or ()
                         for series in query_range(cfg, f"timestamp({selector})", cs, ce, client)}
            except PrometheusError as exc:
                if not _too_many_samples(exc):
                    raise
                extra["refused_queries"] += 1
                if n_points == 1:
                    raise PrometheusError(
                        f"Prometheus refuses to read {metric} even one grid point at a time: the point at "
                        f"{_iso_ms(cs)} (step {cfg.step_s:g} s) of the window {_iso_ms(start_us // 1000)} .. "
                        f"{_iso_ms(end_us // 1000)} would load more samples than its --query.max-samples "
                        f"allows; raise --query.max-samples or select fewer series (extra_selector / "
                        f"match_labels). {exc}",
                        url=exc.url, status=exc.status, error_type=exc.error_type, error=exc.error,
                        attempts=exc.attempts) from None
                limit = min(limit, (n_points + 1) // 2)  # the chunk again: split in halves at the top
                extra["max_samples_splits"] += 1
                logger.info("Prometheus refused %s over %s .. %s (%d points a series) for --query.max-samples; "
                            "reading it in halves", metric, _iso_ms(cs), _iso_ms(ce), n_points)
                todo.append((cs, ce))
                continue
            extra["queries"] += 2
            for series in result:
                extra["series"] += 1
                repeats, kept = _repeated_points(taken.get(_series_key(series), ()), step_ms)
                if len(kept) > 1:
                    diffs = np.diff(np.unique(np.asarray(kept, dtype=np.int64)))
                    if len(diffs):
                        gaps.append((float(np.median(diffs)), len(diffs)))
                labels = {k: v for k, v in (series.get("metric") or {}).items() if k != "__name__"}
                host = _host_from(labels, cfg.host_labels)
                for k in host_keys:
                    labels.pop(k, None)
                if host is not None:
                    labels["Hostname"] = host
                sig = hash(frozenset(labels.items()))
                for ts, text in series.get("values") or ():
                    extra["points"] += 1
                    t = float(ts)
                    if repeats and round(t * 1000) in repeats:
                        extra["repeated_points"] += 1
                        continue
                    t_us = round(t * 1_000_000)
                    if not start_us <= t_us < end_us:  # never expected: the grid is inside the window
                        extra["points_outside_window"] += 1
                        continue
                    value = float(text)
                    if not math.isfinite(value):
                        extra["non_finite_values"] += 1
                        value = math.nan
                    pivot.sample(metric, labels, sig, value, t)
    _check_step(cfg, extra, _raw_interval_ms(gaps), start_utc, end_utc)
    columns = pivot.columns()
    n = len(columns["sample_utc"])
    columns["source"] = ["prometheus"] * n
    extra["rows_without_host"] = sum(1 for h in columns["host"] if h is None)
    extra["retries"] = client.retries
    extra["warnings"] = client.warnings  # a response may be partial: counted, not only logged
    counters = pivot.counters
    counters.update(extra)
    return _finish(columns, [], counters, [cfg.base_url])


def _check_step(cfg: PrometheusConfig, extra: Counter[str], raw_interval_ms: int | None,
                start_utc: dt.datetime, end_utc: dt.datetime) -> None:
    """Count the raw samples' interval and warn where the step is above ~half of it: two raw samples
    in one step give one point (see the module docstring)."""
    if raw_interval_ms is None or raw_interval_ms <= 0:
        return
    extra["raw_interval_ms"] = raw_interval_ms
    if round(cfg.step_s * 1000) <= 0.55 * raw_interval_ms:
        return
    extra["step_too_coarse"] = 1
    kept = extra["points"] - extra["repeated_points"]
    logger.warning(
        "Prometheus %s .. %s: step_s=%g is more than half the interval of the raw samples kept "
        "(median %g s): kept %d of the %d points asked for. Two raw samples in one step give one "
        "point: samples are lost where scrape times jitter (about a quarter of them at a step equal "
        "to the scrape interval), and skipped at a longer step. The kept samples are never closer "
        "than the step, so the scrape interval may be shorter than their interval: use step_s <= half "
        "the scrape interval, halving the step until this warning stops, to read every raw sample.",
        start_utc.isoformat(), end_utc.isoformat(), cfg.step_s, raw_interval_ms / 1000, kept, extra["points"])


__all__ = [
    "DCGM_METRIC_NAMES",
    "PROMETHEUS_MAX_POINTS",
    "PrometheusConfig",
    "PrometheusError",
    "fetch_dcgm_range",
    "plan_chunks",
    "promql_string",
    "query_range",
]
