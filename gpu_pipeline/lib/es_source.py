"""Extract HTCondor job documents (condor_adstash) from Elasticsearch with the official client.

:func:`fetch_jobs` returns every document whose job could have a run or a queue wait inside a UTC
window, read with a point in time (PIT) and ``search_after`` paging, and checks that it fetched
exactly ``hits.total`` documents. The documents go to :func:`gpu_pipeline.lib.jobs.normalize_docs`
(source ``"elasticsearch"``), which computes the exact intervals.

The query (:func:`build_query`) -- dates are ``epoch_second`` as adstash maps them
(``"format": "epoch_second||strict_date_optional_time"``) -- is a ``bool`` with
``minimum_should_match: 1`` over three clauses, for the window ``[start, end)``:

A. ``start <= RecordTime < end`` -- documents recorded in the window (the ``time_field``);
B. ``0 < JobCurrentStartDate < end`` AND ( ``CompletionDate >= start`` OR ( ``CompletionDate`` is
   missing or 0 AND ``RecordTime >= start`` ) ) -- the run started before the window ends and
   completed after it starts, or had not completed when it was recorded at or after the window
   start (evicted, held, removed, still running). The ``RecordTime`` bound keeps the
   "never completed" branch from matching every removed job in the index's history on every day;
C. ``0 < QDate < end`` AND ``RecordTime >= start`` -- the job's life ``[QDate, RecordTime]`` (a
   history record is written when the job or run ends) overlaps the window: catches queue waits
   that began before the window and runs that span it.

Sort: ``[{RecordTime: asc, missing _last}, {_shard_doc: asc}]`` -- ``_shard_doc`` is the PIT
tiebreaker Elasticsearch recommends, so ``search_after`` is stable. ``track_total_hits: true`` on
the first page gives the exact total; later pages skip the count.

Failures: the client's own retries are off (``max_retries=0``) because its transport retries a
5xx/429 immediately, without backoff and without reading ``Retry-After``. One loop here retries
each request up to ``max_retries`` times with exponential backoff (jittered, capped at
``retry_backoff_max_s``) on 429 (``Retry-After`` honoured up to that cap), 500/502/503/504, timeouts
and connection errors (refused, reset, dropped mid-response). A PIT that expired
(``search_context_missing_exception``) is reopened and the extraction restarted once. The PIT is
closed in a ``finally``. Anything else raises :class:`EsSourceError` naming the operation, index,
host, HTTP status and Elasticsearch's reason -- never a credential.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import elastic_transport
from elasticsearch import ApiError, Elasticsearch, UnsupportedProductError

from gpu_pipeline.lib.http_util import mask_userinfo, retry_after_seconds, unsplit_userinfo

logger = logging.getLogger(__name__)

DEFAULT_INDEX = "adstash-ospool-job-history"
MAX_PAGE_SIZE = 10_000  # index.max_result_window default; a search page cannot be larger
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_MASK = "***"


class EsSourceError(RuntimeError):
    """Extraction failed; the message names operation, index, host, status and reason (no secrets)."""

    def __init__(self, message: str, *, index: str | None = None, host: str | None = None,
                 status: int | None = None, reason: str | None = None):
        super().__init__(message)
        self.index = index
        self.host = host
        self.status = status
        self.reason = reason


@dataclass(frozen=True, repr=False)
class EsConfig:
    """Where and how to read job documents. ``repr`` masks ``api_key`` and ``password``.

    ``api_key`` is the encoded key (base64 of ``id:key``) or ``"id:key"``. Credentials inside a
    host URL (``https://user:pass@host``) are moved to ``username``/``password`` and removed from
    the URL so that they never reach a log line or an error message.
    """

    hosts: Sequence[str] = ("http://localhost:9200",)
    index: str = DEFAULT_INDEX
    api_key: str | None = None
    username: str | None = None
    password: str | None = None
    verify_certs: bool = True
    ca_certs: str | None = None
    request_timeout: float = 30.0
    page_size: int = 1000
    max_retries: int = 5
    pit_keep_alive: str = "2m"
    time_field: str = "RecordTime"
    time_format: str | None = "epoch_second"  #: ``format`` of the range queries (None: the field's own)
    retry_backoff_s: float = 1.0  #: first backoff; doubles per retry of one request
    retry_backoff_max_s: float = 60.0  #: cap of one backoff, and of an honoured Retry-After

    def __post_init__(self) -> None:
        hosts = [self.hosts] if isinstance(self.hosts, str) else list(self.hosts)
        hosts = [h.strip() for hh in hosts for h in hh.split(",") if h.strip()]
        if not hosts:
            raise ValueError("EsConfig.hosts is empty")
        clean = []
        user, password = self.username, self.password
        for h in hosts:
            h2, u, p = _strip_userinfo(h)
            if u is not None and user is None:
                user, password = u, p
            clean.append(h2)
        object.__setattr__(self, "hosts", tuple(clean))
        # a secret read from a file (a Kubernetes secret made --from-file) ends in a newline, which
        # no HTTP header may hold: the client's error would print the header, key and all
        object.__setattr__(self, "username", user.rstrip("\r\n") if isinstance(user, str) else user)
        object.__setattr__(self, "password", password.rstrip("\r\n") if isinstance(password, str) else password)
        if isinstance(self.api_key, str):  # a key is base64 (or id:key): no white space of its own
            object.__setattr__(self, "api_key", self.api_key.strip() or None)
        if not isinstance(self.page_size, int) or not 1 <= self.page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"EsConfig.page_size must be an integer in 1..{MAX_PAGE_SIZE}, got {self.page_size!r}")
        if self.max_retries < 0:
            raise ValueError(f"EsConfig.max_retries must be >= 0, got {self.max_retries!r}")
        if not self.request_timeout > 0:
            raise ValueError(f"EsConfig.request_timeout must be > 0, got {self.request_timeout!r}")
        if self.retry_backoff_s < 0 or self.retry_backoff_max_s < 0:
            raise ValueError("EsConfig retry backoffs must be >= 0")
        if not self.index:
            raise ValueError("EsConfig.index is empty")
        if self.api_key and self.username:
            raise ValueError("EsConfig: give api_key or username/password, not both")
        if (self.username is None) != (self.password is None):
            raise ValueError("EsConfig: username and password go together")

    def __repr__(self) -> str:
        parts = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name in ("api_key", "password") and value is not None:
                value = _MASK
            parts.append(f"{name}={value!r}")
        return f"EsConfig({', '.join(parts)})"

    __str__ = __repr__

    @property
    def host_label(self) -> str:
        """The hosts as they may appear in messages (no credentials)."""
        return ",".join(self.hosts)

    def secrets(self) -> list[str]:
        """Every string that must never be shown: the key, the password and their header forms."""
        out = []
        if self.api_key:
            out.append(self.api_key)
            if ":" in self.api_key:
                out.append(base64.b64encode(self.api_key.encode()).decode())
                out.append(self.api_key.split(":", 1)[1])
        if self.password:
            out.append(self.password)
            out.append(base64.b64encode(f"{self.username}:{self.password}".encode()).decode())
        return [s for s in out if s]


@dataclass
class FetchResult:
    docs: list[dict]  #: the ``_source`` of every hit, in sort order
    total: int  #: ``hits.total.value`` (exact) -- equals ``len(docs)``
    pages: int  #: non-empty result pages read in the successful pass
    retries: int  #: requests retried (all passes)
    restarts: int = 0  #: extractions restarted after the point in time expired
    query: dict = field(default_factory=dict)  #: the query sent
    origins: list[str] = field(default_factory=list)  #: per document its ``<_index>/<_id>``


class _PitExpired(Exception):
    pass


def _strip_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """The host without its user info, and the user and password it held (percent-decoded, as the
    client reads a URL's). A host without a scheme keeps none (the client then refuses it, as it
    refuses one without credentials: never plain http made up for a password). User info that does
    not parse (a password with an unencoded ``/``, ``?`` or ``#``) is refused, masked."""
    has_scheme = "://" in url
    try:
        parts = urlsplit(url if has_scheme else f"http://{url}")
    except ValueError:
        parts = None
    if parts is None or (parts.username is None and parts.password is None):
        # user info that did not parse: an unencoded '/', '?' or '#' in the password cuts the
        # authority short, to "user:S3cr" whose "port" is no number, or to "user:2024" whose is (the
        # password then in the path, used and logged as it is); an '@' in a host URL's path is refused
        # with it
        if unsplit_userinfo(url):
            raise _unreadable_userinfo(url)
        return url, None, None
    netloc = parts.hostname or ""
    if ":" in netloc:  # IPv6
        netloc = f"[{netloc}]"
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    rest = urlunsplit(("", netloc, parts.path, parts.query, parts.fragment)).removeprefix("//")
    host = f"{parts.scheme}://{rest}" if has_scheme else rest
    if "@" in rest:  # "user:p@ss/w@host": a password with an unencoded '@' and '/' split elsewhere
        raise _unreadable_userinfo(url)
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return host, user, password


def _unreadable_userinfo(url: str) -> ValueError:
    """The error for a host whose user info does not parse, the URL masked up to its last ``@``."""
    return ValueError(f"EsConfig.hosts: cannot read the user info of {mask_userinfo(url, _MASK)} "
                      "(percent-encode '/', '?', '#' and '@' in the password, or give it separately)")


def _redact(text: str, cfg: EsConfig) -> str:
    for s in sorted(cfg.secrets(), key=len, reverse=True):
        text = text.replace(s, _MASK)
    return text


def _epoch_s(t: Any, *, ceil: bool) -> int:
    if isinstance(t, dt.datetime):
        if t.tzinfo is None:
            raise ValueError(f"naive datetime {t!r}: pass a timezone-aware (UTC) time")
        x = t.timestamp()
    elif isinstance(t, (int, float)) and not isinstance(t, bool):
        x = float(t)
    else:
        raise TypeError(f"expected a timezone-aware datetime or epoch seconds, got {type(t).__name__}")
    return math.ceil(x) if ceil else math.floor(x)


def _range(field_name: str, fmt: str | None, **bounds: int) -> dict:
    spec: dict[str, Any] = dict(bounds)
    if fmt:
        spec["format"] = fmt
    return {"range": {field_name: spec}}


def build_query(start_s: int, end_s: int, time_field: str = "RecordTime",
                time_format: str | None = "epoch_second") -> dict:
    """The ``query`` for the window ``[start_s, end_s)`` in epoch seconds (see the module doc)."""
    f = time_format
    recorded_in_window = _range(time_field, f, gte=start_s, lt=end_s)
    not_completed = {
        "bool": {
            "should": [
                {"bool": {"must_not": [{"exists": {"field": "CompletionDate"}}]}},
                _range("CompletionDate", f, lte=0),
            ],
            "minimum_should_match": 1,
        }
    }
    run_overlaps = {
        "bool": {
            "filter": [_range("JobCurrentStartDate", f, gt=0, lt=end_s)],
            "should": [
                _range("CompletionDate", f, gte=start_s),
                {"bool": {"filter": [not_completed, _range(time_field, f, gte=start_s)]}},
            ],
            "minimum_should_match": 1,
        }
    }
    life_overlaps = {"bool": {"filter": [_range("QDate", f, gt=0, lt=end_s), _range(time_field, f, gte=start_s)]}}
    return {"bool": {"should": [recorded_in_window, run_overlaps, life_overlaps], "minimum_should_match": 1}}


def make_client(cfg: EsConfig) -> Elasticsearch:
    """The official client for ``cfg``, with its own retries off (this module retries)."""
    kwargs: dict[str, Any] = {
        "hosts": list(cfg.hosts),
        "request_timeout": cfg.request_timeout,
        "max_retries": 0,
        "retry_on_status": (),
        "retry_on_timeout": False,
        "verify_certs": cfg.verify_certs,
    }
    if cfg.api_key:
        kwargs["api_key"] = tuple(cfg.api_key.split(":", 1)) if ":" in cfg.api_key else cfg.api_key
    elif cfg.username is not None:
        kwargs["basic_auth"] = (cfg.username, cfg.password or "")
    if cfg.ca_certs:
        kwargs["ca_certs"] = cfg.ca_certs
    if not cfg.verify_certs:
        logger.warning(
            "TLS certificate verification is OFF for Elasticsearch at %s (verify_certs=False): "
            "the connection and its credentials can be intercepted; set ca_certs instead",
            cfg.host_label,
        )
        kwargs["ssl_show_warn"] = False
    try:
        return Elasticsearch(**kwargs)
    except Exception as exc:  # bad URL, unreadable CA bundle, ...
        msg = _redact(f"cannot configure the Elasticsearch client for {cfg.host_label}: {exc}", cfg)
        raise EsSourceError(msg, index=cfg.index, host=cfg.host_label, reason=str(exc)) from None


def _error_reason(body: Any) -> tuple[str | None, str]:
    """(error type, reason) from an Elasticsearch error body."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            root = err.get("root_cause") or []
            first = root[0] if root and isinstance(root[0], dict) else err
            etype = first.get("type") or err.get("type")
            reason = first.get("reason") or err.get("reason") or ""
            caused = err.get("caused_by")
            if isinstance(caused, dict) and caused.get("reason") and caused.get("reason") != reason:
                reason = f"{reason} (caused by {caused.get('type')}: {caused['reason']})"
            return etype, str(reason)
        if err is not None:
            return None, str(err)
    if body in (None, ""):
        return None, ""
    return None, str(body)


def _mentions(body: Any, needle: str) -> bool:
    if isinstance(body, dict):
        return any(_mentions(v, needle) for v in body.values())
    if isinstance(body, list):
        return any(_mentions(v, needle) for v in body)
    return isinstance(body, str) and needle in body


def _cause(exc: BaseException) -> str:
    """The innermost useful message of a transport error (e.g. '... Connection refused')."""
    inner: BaseException = exc
    for _ in range(5):
        errors = getattr(inner, "errors", ()) or ()
        nxt = errors[0] if errors else inner.__cause__
        if nxt is None or nxt is inner:
            break
        inner = nxt
    text = str(inner) or type(inner).__name__
    text = re.sub(r"<[\w.]+ object at 0x[0-9a-f]+>: ", "", text)
    return text if inner is exc else f"{type(inner).__name__}: {text}"


def _retry_after_s(headers: Any) -> float | None:
    try:
        value = headers.get("retry-after") if headers is not None else None
    except Exception:
        return None
    return retry_after_seconds(value)


class _Retrier:
    def __init__(self, cfg: EsConfig, sleep: Callable[[float], None]):
        self.cfg = cfg
        self.sleep = sleep
        self.retries = 0
        self.rng = random.Random()

    def _fail(self, op: str, status: int | None, etype: str | None, reason: str, hint: str = "") -> EsSourceError:
        cfg = self.cfg
        what = f"{etype}: {reason}" if etype else reason
        what = what if len(what) <= 500 else what[:497] + "..."
        msg = f"Elasticsearch {op} failed for index {cfg.index!r} on {cfg.host_label}"
        msg += f": HTTP {status}" if status is not None else ""
        msg += f", {what}" if what else ""
        msg += f" ({hint})" if hint else ""
        msg = _redact(msg, cfg)
        return EsSourceError(msg, index=cfg.index, host=cfg.host_label, status=status, reason=_redact(what, cfg))

    def backoff(self, attempt: int) -> float:
        b = min(self.cfg.retry_backoff_max_s, self.cfg.retry_backoff_s * (2**attempt))
        return b * (0.5 + 0.5 * self.rng.random())

    def call(self, op: str, fn: Callable[[], Any]) -> Any:
        cfg = self.cfg
        attempt = 0
        while True:
            retry_after = None
            try:
                return fn()
            except UnsupportedProductError as exc:
                raise self._fail(op, exc.meta.status, None, "the server is not Elasticsearch "
                                 "(no 'X-Elastic-Product: Elasticsearch' header)") from None
            except ApiError as exc:
                status = exc.meta.status
                etype, reason = _error_reason(exc.body)
                if status == 404 and _mentions(exc.body, "search_context_missing_exception"):
                    raise _PitExpired(_redact(reason, cfg)) from None
                if status not in RETRY_STATUSES:
                    hint = {401: "check api_key / username and password",
                            403: "the credentials lack the read privilege on the index"}.get(status, "")
                    raise self._fail(op, status, etype, reason, hint) from None
                if attempt >= cfg.max_retries:
                    raise self._fail(op, status, etype, reason, f"gave up after {attempt} retries") from None
                why = f"HTTP {status} {etype or ''}".strip()
                retry_after = _retry_after_s(exc.meta.headers)
            except elastic_transport.TlsError as exc:
                raise self._fail(op, None, "tls_error", str(exc),
                                 "check ca_certs, or the host name in the certificate") from None
            except (elastic_transport.ConnectionTimeout, elastic_transport.ConnectionError) as exc:
                timeout = isinstance(exc, elastic_transport.ConnectionTimeout)
                why = f"timed out after {cfg.request_timeout:g}s" if timeout else f"connection error: {_cause(exc)}"
                if attempt >= cfg.max_retries:
                    raise self._fail(op, None, "timeout" if timeout else "connection_error",
                                     why if timeout else _cause(exc), f"gave up after {attempt} retries") from None
            except elastic_transport.SerializationError as exc:
                raise self._fail(op, None, "serialization_error", f"unreadable response: {exc}") from None
            except EsSourceError:
                raise
            except Exception as exc:  # noqa: BLE001 - anything else the client raises, e.g. a header
                # it refuses, whose message quotes the header: reported masked, never as is
                raise self._fail(op, None, type(exc).__name__, str(exc)) from None
            delay = self.backoff(attempt)
            if retry_after is not None:
                delay = max(delay, min(retry_after, cfg.retry_backoff_max_s))
            attempt += 1
            self.retries += 1
            logger.warning(
                "%s",
                _redact(
                    f"Elasticsearch {op} on {cfg.host_label} ({cfg.index}): {why}; "
                    f"retry {attempt} of {cfg.max_retries} in {delay:.2f}s",
                    cfg,
                ),
            )
            self.sleep(delay)


def _sort(cfg: EsConfig) -> list:
    return [
        {cfg.time_field: {"order": "asc", "missing": "_last", "unmapped_type": "date"}},
        {"_shard_doc": "asc"},
    ]


def _extract(es: Elasticsearch, cfg: EsConfig, query: dict, r: _Retrier) -> tuple[list[dict], int, int]:
    opened = r.call("open point in time",
                    lambda: es.open_point_in_time(index=cfg.index, keep_alive=cfg.pit_keep_alive))
    pit_id = opened.get("id")
    if not pit_id:
        raise r._fail("open point in time", None, None, "the response has no point-in-time id")
    try:
        docs: list[dict] = []
        origins: list[str] = []
        seen: set[tuple] = set()
        total: int | None = None
        max_pages = 0
        pages = requests = 0
        after: list | None = None
        sort = _sort(cfg)
        while True:
            body: dict[str, Any] = {
                "pit": {"id": pit_id, "keep_alive": cfg.pit_keep_alive},
                "size": cfg.page_size,
                "sort": sort,
                "query": query,
                "track_total_hits": total is None,
            }
            if after is not None:
                body["search_after"] = after
            # a shard that fails (a rejected execution, a point in time lost on a node) makes the
            # search an error the retries and the restart handle, not a partial 200
            resp = r.call("search", lambda b=body: es.search(**b, allow_partial_search_results=False))
            requests += 1
            pit_id = resp.get("pit_id") or pit_id  # always use the latest id
            hits_obj = resp.get("hits") or {}
            hits = hits_obj.get("hits") or []
            if resp.get("timed_out"):
                raise r._fail("search", None, "timed_out", "the search timed out on the server (partial results)")
            shards = resp.get("_shards") or {}
            if shards.get("failed"):
                first = next(iter(shards.get("failures") or []), {})
                etype, reason = _error_reason({"error": first.get("reason")} if isinstance(first, dict) else None)
                raise r._fail("search", None, "shard_failure",
                              f"{shards.get('failed')} shard(s) failed" + (f": {etype}: {reason}" if reason else ""))
            if total is None:
                t = hits_obj.get("total")
                if isinstance(t, dict):
                    value, relation = t.get("value"), t.get("relation", "eq")
                else:
                    value, relation = t, "eq"
                if not isinstance(value, int) or relation != "eq":
                    raise r._fail("search", None, None, f"no exact hits.total in the response ({t!r})")
                total = value
                max_pages = total // cfg.page_size + 2
            if hits:
                pages += 1
            for h in hits:
                key = (h.get("_index"), h.get("_id"))
                if key in seen:
                    raise r._fail("search", None, "paging_error",
                                  f"document {key[1]!r} of index {key[0]!r} returned twice while paging")
                seen.add(key)
                src = h.get("_source")
                if not isinstance(src, dict):
                    raise r._fail("search", None, None, f"hit {key[1]!r} has no _source (is _source disabled?)")
                docs.append(src)
                origins.append(f"{key[0]}/{key[1]}")
            if len(hits) < cfg.page_size:
                break
            after = hits[-1].get("sort")
            if not after:
                raise r._fail("search", None, None, "hits carry no sort values; cannot page with search_after")
            if requests > max_pages:
                raise r._fail("search", None, "paging_error",
                              f"more than {max_pages} pages for hits.total={total}; stopping")
        assert total is not None
        if len(docs) != total:
            raise r._fail(
                "search", None, "count_mismatch",
                f"fetched {len(docs)} documents but hits.total is {total}; the extraction is incomplete "
                "or inconsistent",
            )
        return docs, origins, total, pages
    finally:
        try:
            es.close_point_in_time(id=pit_id)
        except Exception as exc:  # the PIT expires by itself after keep_alive
            logger.info("%s", _redact(f"could not close the point in time on {cfg.host_label}: "
                                      f"{type(exc).__name__}", cfg))


def fetch_jobs(cfg: EsConfig, start_utc: Any, end_utc: Any, *, client: Elasticsearch | None = None,
               sleep: Callable[[float], None] = time.sleep) -> FetchResult:
    """All job documents whose run or queue wait may overlap ``[start_utc, end_utc)``.

    ``start_utc``/``end_utc`` are timezone-aware datetimes (or epoch seconds). ``client`` lets a
    caller reuse a client (it is then not closed here); ``sleep`` is the backoff sleep (tests).
    Raises :class:`EsSourceError` on failure.
    """
    start_s, end_s = _epoch_s(start_utc, ceil=False), _epoch_s(end_utc, ceil=True)
    if end_s <= start_s:
        raise ValueError(f"empty window: end {end_utc!r} is not after start {start_utc!r}")
    query = build_query(start_s, end_s, cfg.time_field, cfg.time_format)
    es = client if client is not None else make_client(cfg)
    r = _Retrier(cfg, sleep)
    restarts = 0
    try:
        while True:
            try:
                docs, origins, total, pages = _extract(es, cfg, query, r)
            except _PitExpired as exc:
                if restarts >= 1:
                    raise r._fail("search", 404, "search_context_missing_exception", str(exc),
                                  "the point in time expired twice; raise pit_keep_alive") from None
                restarts += 1
                logger.warning("Elasticsearch point in time on %s (%s) expired; restarting the extraction once",
                               cfg.host_label, cfg.index)
                continue
            logger.info("fetched %d job documents from %s (%s) in %d pages, %d retries, %d restarts",
                        len(docs), cfg.host_label, cfg.index, pages, r.retries, restarts)
            return FetchResult(docs=docs, total=total, pages=pages, retries=r.retries, restarts=restarts,
                               query=query, origins=origins)
    finally:
        if client is None:
            es.close()
