"""A local stand-in for Elasticsearch, spoken to by the real ``elasticsearch`` client in tests.

No Elasticsearch server can be installed here, so :class:`EsStandIn` is a small threaded
``http.server`` on 127.0.0.1 (ephemeral port) that keeps documents in memory and implements the
documented request/response shapes of the few APIs the pipeline uses:

- ``HEAD /``, ``GET /`` -- cluster info;
- ``POST /{index}/_pit?keep_alive=2m`` -- open a point in time (a snapshot of the matching
  indices; documents added later are not visible through it) -> ``{"id": ..., "_shards": ...}``;
  a missing concrete index -> 404 ``index_not_found_exception``;
- ``DELETE /_pit`` with ``{"id": ...}`` -> ``{"succeeded": true, "num_freed": 1}`` (404 with
  ``num_freed: 0`` for an unknown id);
- ``POST /_search`` with ``pit`` (or ``POST /{index}/_search`` without), ``size`` (<= 10000),
  ``from`` (without ``search_after``), ``sort`` (fields from ``_source``, ``missing``, ``_shard_doc``,
  ``_doc``; with a PIT an implicit ``_shard_doc`` tiebreaker is appended, as Elasticsearch does),
  ``search_after``, ``track_total_hits`` (true / false / a number; default 10000), ``_source``
  (bool or includes) and ``query``: ``match_all``, ``bool`` (must / filter / should / must_not /
  minimum_should_match), ``range`` (gt / gte / lt / lte, ``format`` ``epoch_second`` /
  ``epoch_millis``; date fields hold epoch seconds or ISO text), ``term``, ``terms``, ``exists``,
  evaluated for real on the documents; an unknown query is a 400 ``parsing_exception``.
  Every search returns a fresh ``pit_id`` (an alias of the same context) so a client that does
  not use the latest id is noticed (:attr:`EsStandIn.stale_pit_ids_used`).

Date fields (:data:`DATE_FIELDS`, adstash's ``date`` attributes used by the pipeline) sort as
epoch milliseconds, like Elasticsearch returns them in ``sort`` values.

Media types, as a server of major version ``major`` (8 or 9; :class:`EsStandIn`) checks them: an
``Accept`` or ``Content-Type`` of ``application/json`` (or none) is plain; the vendored form
``application/vnd.elasticsearch+json; compatible-with=N`` must name ``major`` or ``major - 1``
("Accept version must be either version 8 or 7, but found 9" from an 8.x server: the 9.x client's
default), and a request that names a version in one of the two headers must name one in both,
else 400 ``media_type_header_exception`` with the server's ``status_exception`` cause.

Every response carries ``X-Elastic-Product: Elasticsearch`` and ``Content-Type: application/json``
(the client rejects a 2xx response without the product header). Errors use Elasticsearch's
body ``{"error": {"root_cause": [...], "type", "reason"}, "status"}``.

Fault injection (:meth:`EsStandIn.inject`), each for ``count`` matching requests after skipping
``after`` of them: ``status`` (e.g. 429 with ``Retry-After``, 500/503 with an error body),
``delay`` (answer late, beyond the client timeout), ``drop`` (close the socket without a
response), ``truncate`` (send headers and half the body, then close), ``expire_pit`` (all PITs
vanish; the search gets 404 ``search_context_missing_exception``) and ``lie_total`` (add
``delta`` to ``hits.total``). Optional authentication: ``api_key`` / ``basic_auth`` -> 401
``security_exception`` otherwise.

Use it as a context manager; :meth:`EsStandIn.stop` shuts the server and its open connections
down, and interrupts delayed responses. Every loop is bounded.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import fnmatch
import functools
import itertools
import json
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

DATE_FIELDS = frozenset(
    {
        "RecordTime", "QDate", "JobStartDate", "JobCurrentStartDate", "CompletionDate",
        "LastVacateTime", "EnteredCurrentStatus", "EpochWriteDate",
    }
)
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
MAX_RESULT_WINDOW = 10_000
MAX_BODY = 64 * 1024 * 1024
_SHARDS = {"total": 1, "successful": 1, "skipped": 0, "failed": 0}


_VENDORED = re.compile(r"application/vnd\.elasticsearch\+[a-z-]+\s*;\s*compatible-with\s*=\s*(\d+)", re.I)


def _media_error(cause: str) -> _EsError:
    return _EsError(400, "media_type_header_exception",
                    "Invalid media-type value on headers [Accept, Content-Type]",
                    caused_by={"type": "status_exception", "reason": cause})


class _EsError(Exception):
    def __init__(self, status: int, etype: str, reason: str, **extra: Any):
        super().__init__(reason)
        self.status, self.etype, self.reason, self.extra = status, etype, reason, extra

    def body(self) -> dict:
        cause = {"type": self.etype, "reason": self.reason, **self.extra}
        return {"error": {"root_cause": [cause], **cause}, "status": self.status}


@dataclass
class Fault:
    kind: str  #: status | delay | drop | truncate | expire_pit | lie_total
    on: str = "search"  #: search | pit_open | pit_close | info | any
    count: int = 1
    after: int = 0
    status: int = 503
    retry_after: str | None = None
    delay: float = 0.0
    delta: int = 0
    error_type: str | None = None
    fired: int = 0


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    kind: str
    fault: str | None = None
    status: int | None = None
    params: dict[str, str] = field(default_factory=dict)  #: the URL's query parameters


@dataclass
class _Pit:
    docs: list[tuple[str, str, dict]]  #: (index, id, source) -- the snapshot; position = _shard_doc
    keep_alive_s: float
    expires: float
    ids: set[str] = field(default_factory=set)
    latest: str = ""


def _parse_duration(text: str | None) -> float:
    if not text:
        raise _EsError(400, "action_request_validation_exception", "Validation Failed: 1: [keep_alive] is missing;")
    m = re.fullmatch(r"(\d+)(nanos|micros|ms|s|m|h|d)", str(text).strip())
    if not m:
        raise _EsError(400, "illegal_argument_exception",
                       f"failed to parse setting [keep_alive] with value [{text}] as a time value")
    n, unit = int(m.group(1)), m.group(2)
    return n * {"nanos": 1e-9, "micros": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def _get_field(src: dict, name: str) -> Any:
    if name in src:
        return src[name]
    cur: Any = src
    for part in name.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _values(src: dict, name: str) -> list:
    v = _get_field(src, name)
    if v is None:
        return []
    return [x for x in v if x is not None] if isinstance(v, list) else [v]


def _to_seconds(v: Any, fmt: str | None) -> float | None:
    """A date value (epoch seconds number, numeric text, ISO text) in epoch seconds."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) / 1000.0 if fmt == "epoch_millis" else float(v)
    if isinstance(v, str):
        s = v.strip()
        try:
            x = float(s)
            return x / 1000.0 if fmt == "epoch_millis" else x
        except ValueError:
            pass
        try:
            t = dt.datetime.fromisoformat(s)
        except ValueError:
            return None
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        return t.timestamp()
    return None


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _as_list(x: Any) -> list:
    if x is None:
        return []
    return x if isinstance(x, list) else [x]


class _Query:
    """Evaluate the query subset on one ``_source``."""

    def __init__(self, date_fields: frozenset[str]):
        self.date_fields = date_fields

    def match(self, q: Any, src: dict) -> bool:
        if q is None:
            return True
        if not isinstance(q, dict) or len(q) != 1:
            raise _EsError(400, "parsing_exception", "[_na] query malformed, must start with start_object")
        (kind, spec), = q.items()
        fn = getattr(self, f"_q_{kind}", None)
        if fn is None:
            raise _EsError(400, "parsing_exception", f"unknown query [{kind}]", line=1, col=1)
        return fn(spec, src)

    def _q_match_all(self, spec: Any, src: dict) -> bool:
        return True

    def _q_match_none(self, spec: Any, src: dict) -> bool:
        return False

    def _q_bool(self, spec: dict, src: dict) -> bool:
        if not isinstance(spec, dict):
            raise _EsError(400, "parsing_exception", "[bool] query malformed")
        unknown = set(spec) - {"must", "filter", "should", "must_not", "minimum_should_match", "boost", "_name"}
        if unknown:
            raise _EsError(400, "parsing_exception", f"[bool] query does not support [{sorted(unknown)[0]}]")
        for q in _as_list(spec.get("must")) + _as_list(spec.get("filter")):
            if not self.match(q, src):
                return False
        for q in _as_list(spec.get("must_not")):
            if self.match(q, src):
                return False
        should = _as_list(spec.get("should"))
        if not should:
            return True
        msm = spec.get("minimum_should_match")
        if msm is None:
            msm = 0 if (spec.get("must") or spec.get("filter")) else 1
        msm = int(str(msm))
        if msm <= 0:
            return True
        hits = 0
        for q in should:
            if self.match(q, src):
                hits += 1
                if hits >= msm:
                    return True
        return False

    def _field_spec(self, kind: str, spec: Any) -> tuple[str, Any]:
        if not isinstance(spec, dict):
            raise _EsError(400, "parsing_exception", f"[{kind}] query malformed")
        keys = [k for k in spec if k not in ("boost", "_name")]
        if len(keys) != 1:
            raise _EsError(400, "parsing_exception", f"[{kind}] query doesn't support multiple fields")
        return keys[0], spec[keys[0]]

    def _q_range(self, spec: Any, src: dict) -> bool:
        name, bounds = self._field_spec("range", spec)
        if not isinstance(bounds, dict):
            raise _EsError(400, "parsing_exception", "[range] query malformed, no start_object after query name")
        fmt = bounds.get("format")
        is_date = name in self.date_fields
        if fmt and not is_date:
            raise _EsError(400, "query_shard_exception", f"failed to create query: field [{name}] of type [long] "
                           "does not support custom formats")
        conv = (lambda v: _to_seconds(v, fmt)) if is_date else _num
        ops = {}
        for op in ("gt", "gte", "lt", "lte"):
            if bounds.get(op) is not None:
                b = conv(bounds[op])
                if b is None:
                    raise _EsError(400, "parse_exception", f"failed to parse [{bounds[op]}] for field [{name}]")
                ops[op] = b
        doc_conv = (lambda v: _to_seconds(v, None)) if is_date else _num
        for v in _values(src, name):
            x = doc_conv(v)
            if x is None:
                continue
            if ("gt" in ops and not x > ops["gt"]) or ("gte" in ops and not x >= ops["gte"]):
                continue
            if ("lt" in ops and not x < ops["lt"]) or ("lte" in ops and not x <= ops["lte"]):
                continue
            return True
        return False

    def _eq(self, name: str, a: Any, b: Any) -> bool:
        if name in self.date_fields:
            x, y = _to_seconds(a, None), _to_seconds(b, None)
            return x is not None and x == y
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return _num(b) == float(a)
        return a == b

    def _q_term(self, spec: Any, src: dict) -> bool:
        name, value = self._field_spec("term", spec)
        if isinstance(value, dict):
            value = value.get("value")
        return any(self._eq(name, v, value) for v in _values(src, name))

    def _q_terms(self, spec: Any, src: dict) -> bool:
        name, wanted = self._field_spec("terms", spec)
        return any(self._eq(name, v, w) for v in _values(src, name) for w in _as_list(wanted))

    def _q_exists(self, spec: Any, src: dict) -> bool:
        if not isinstance(spec, dict) or "field" not in spec:
            raise _EsError(400, "parsing_exception", "[exists] must be provided with a [field]")
        return bool(_values(src, spec["field"]))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    standin: EsStandIn


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "EsStandIn/1"
    timeout = 10  # an idle keep-alive connection is closed after this
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.server.standin._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.standin._track(self.connection, False)

    def do_HEAD(self) -> None:
        self.server.standin._handle(self, "HEAD")

    def do_GET(self) -> None:
        self.server.standin._handle(self, "GET")

    def do_POST(self) -> None:
        self.server.standin._handle(self, "POST")

    def do_PUT(self) -> None:
        self.server.standin._handle(self, "PUT")

    def do_DELETE(self) -> None:
        self.server.standin._handle(self, "DELETE")


class EsStandIn:
    """In-memory Elasticsearch stand-in; see the module docstring."""

    def __init__(self, docs: dict[str, list[dict]] | None = None, *, api_key: str | None = None,
                 basic_auth: tuple[str, str] | None = None, date_fields: frozenset[str] = DATE_FIELDS,
                 rotate_pit_ids: bool = True, major: int = 8):
        if major not in (8, 9):
            raise ValueError(f"major: 8 or 9, not {major!r}")
        self.major = major
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._indices: dict[str, list[tuple[str, dict]]] = {}
        self._ids = itertools.count(1)
        self._pits: dict[str, _Pit] = {}
        self._faults: list[Fault] = []
        self._conns: set[socket.socket] = set()
        self._query = _Query(date_fields)
        self.date_fields = date_fields
        self.rotate_pit_ids = rotate_pit_ids
        self.requests: list[Recorded] = []
        self.pits_opened = 0
        self.pits_closed = 0
        self.stale_pit_ids_used = 0
        self._auth: set[str] = set()
        if api_key:
            self._auth.add(f"ApiKey {api_key}")
        if basic_auth:
            token = base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode()).decode()
            self._auth.add(f"Basic {token}")
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        for index, items in (docs or {}).items():
            self.add_docs(index, items)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> EsStandIn:
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.standin = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="es-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> EsStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    # -- data and faults -------------------------------------------------------------------

    def add_docs(self, index: str, docs: list[dict], ids: list[str] | None = None) -> None:
        with self._lock:
            bucket = self._indices.setdefault(index, [])
            for i, d in enumerate(docs):
                doc_id = ids[i] if ids else f"doc-{next(self._ids)}"
                bucket.append((doc_id, copy.deepcopy(d)))

    def inject(self, kind: str, *, count: int = 1, after: int = 0, on: str = "search", **params: Any) -> Fault:
        if kind not in ("status", "delay", "drop", "truncate", "expire_pit", "lie_total"):
            raise ValueError(f"unknown fault {kind!r}")
        f = Fault(kind=kind, on=on, count=count, after=after, **params)
        with self._lock:
            self._faults.append(f)
        return f

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def requests_of(self, kind: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.kind == kind]

    @property
    def open_pits(self) -> int:
        with self._lock:
            return len(self._pits)

    def _take_fault(self, kind: str) -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.on not in (kind, "any") or f.fired >= f.count:
                    continue
                if f.after > 0:
                    f.after -= 1
                    continue
                f.fired += 1
                return f
        return None

    # -- HTTP ------------------------------------------------------------------------------

    @staticmethod
    def _kind(method: str, path: str) -> str:
        parts = [p for p in path.split("/") if p]
        if not parts:
            return "info"
        if parts[-1] == "_pit":
            return "pit_close" if method == "DELETE" and len(parts) == 1 else "pit_open"
        if parts[-1] == "_search":
            return "search"
        return "other"

    def _read_body(self, h: _Handler) -> bytes:
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks, size = [], 0
            for _ in range(1_000_000):  # bounded
                n = int(h.rfile.readline().strip() or b"0", 16)
                if n == 0:
                    h.rfile.readline()
                    break
                size += n
                if size > MAX_BODY:
                    raise _EsError(413, "content_too_long_exception", "request body too large")
                chunks.append(h.rfile.read(n))
                h.rfile.readline()
            return b"".join(chunks)
        n = int(h.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise _EsError(413, "content_too_long_exception", "request body too large")
        return h.rfile.read(n) if n else b""

    def _send(self, h: _Handler, status: int, body: Any, extra_headers: dict[str, str] | None = None,
              truncate: bool = False) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("X-Elastic-Product", "Elasticsearch")
        for k, v in (extra_headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD" and data:
            if truncate:
                h.wfile.write(data[: max(1, len(data) // 2)])
                h.wfile.flush()
                self._drop(h)
                return
            h.wfile.write(data)

    @staticmethod
    def _drop(h: _Handler) -> None:
        h.close_connection = True
        try:
            h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _handle(self, h: _Handler, method: str) -> None:
        split = urlsplit(h.path)
        path, params = unquote(split.path), {k: v[-1] for k, v in parse_qs(split.query).items()}
        kind = self._kind(method, path)
        rec = Recorded(method, path, {k.lower(): v for k, v in h.headers.items()}, None, kind, params=params)
        try:
            raw = self._read_body(h)
            try:
                rec.body = json.loads(raw) if raw else None
            except ValueError:
                raise _EsError(400, "x_content_parse_exception", "request body is not JSON") from None
        except _EsError as exc:
            rec.status = exc.status
            with self._lock:
                self.requests.append(rec)
            self._send(h, exc.status, exc.body())
            return
        with self._lock:
            self.requests.append(rec)
        if (bad := self._media_type_error(rec.headers, raw)) is not None:
            rec.status = 400
            self._send(h, 400, bad.body())
            return
        fault = self._take_fault(kind)
        if fault is not None:
            rec.fault = fault.kind
        if fault is not None and fault.kind == "drop":
            self._drop(h)
            return
        if fault is not None and fault.kind == "delay":
            if self._stop.wait(min(fault.delay, 30.0)):
                self._drop(h)
                return
        if fault is not None and fault.kind == "status":
            self._send_fault_status(h, fault, rec)
            return
        if fault is not None and fault.kind == "expire_pit":
            with self._lock:
                self._pits.clear()
        status, body, headers = 200, None, {}
        try:
            if not self._authorized(h):
                raise _EsError(401, "security_exception",
                               "unable to authenticate with provided credentials and anonymous access is not "
                               "allowed for this request",
                               header={"WWW-Authenticate": ['ApiKey', 'Basic realm="security", charset="UTF-8"']})
            status, body = self._route(method, path, params, rec.body, kind)
            if fault is not None and fault.kind == "lie_total" and isinstance(body, dict):
                total = body.get("hits", {}).get("total")
                if isinstance(total, dict):
                    total["value"] += fault.delta
        except _EsError as exc:
            status, body = exc.status, exc.body()
            if exc.status == 401:
                headers["WWW-Authenticate"] = "ApiKey"
        rec.status = status
        try:
            self._send(h, status, body, headers, truncate=fault is not None and fault.kind == "truncate")
        except OSError:  # the client went away (e.g. it timed out first)
            self._drop(h)

    def _media_type_error(self, headers: dict[str, str], body: bytes) -> _EsError | None:
        """The 400 a server of :attr:`major` answers to the request's media types, or None."""
        versions = {}
        for name in ("accept", "content-type"):
            value = headers.get(name, "")
            if name == "content-type" and not body:
                continue
            m = _VENDORED.search(value)
            if m is not None:
                versions[name] = int(m.group(1))
                if versions[name] not in (self.major, self.major - 1):
                    label = "Accept" if name == "accept" else "Content-Type"
                    return _media_error(f"{label} version must be either version {self.major} or "
                                        f"{self.major - 1}, but found {versions[name]}. {label}={value}")
        if len(versions) == 1 and body:
            return _media_error("A compatible version is required on both Content-Type and Accept headers if "
                                "either one has requested a compatible version. "
                                f"Accept={headers.get('accept')}, Content-Type={headers.get('content-type')}")
        return None

    def _send_fault_status(self, h: _Handler, f: Fault, rec: Recorded) -> None:
        types = {429: "es_rejected_execution_exception", 500: "search_phase_execution_exception",
                 502: "bad_gateway", 503: "search_phase_execution_exception", 504: "gateway_timeout"}
        etype = f.error_type or types.get(f.status, "exception")
        reason = {
            429: "rejected execution of search on EsThreadPoolExecutor[name = search, queue capacity = 1000]",
            503: "all shards failed",
            500: "all shards failed",
        }.get(f.status, f"injected HTTP {f.status}")
        body = _EsError(f.status, etype, reason).body()
        if f.status in (500, 503):
            body["error"]["root_cause"] = [{"type": "no_shard_available_action_exception",
                                            "reason": "No shard available"}]
        headers = {"Retry-After": f.retry_after} if f.retry_after is not None else {}
        rec.status = f.status
        self._send(h, f.status, body, headers)

    def _authorized(self, h: _Handler) -> bool:
        if not self._auth:
            return True
        return (h.headers.get("Authorization") or "") in self._auth

    def _route(self, method: str, path: str, params: dict, body: Any, kind: str) -> tuple[int, Any]:
        if kind == "info" and method in ("GET", "HEAD"):
            return 200, None if method == "HEAD" else self._info()
        if kind == "pit_open" and method == "POST":
            index = path.strip("/").rsplit("/_pit", 1)[0]
            return self._open_pit(index, params.get("keep_alive"))
        if kind == "pit_close":
            return self._close_pit(body)
        if kind == "search" and method in ("GET", "POST"):
            index = path.strip("/").rsplit("_search", 1)[0].strip("/") or None
            return 200, self._search(index, body or {}, params)
        raise _EsError(405 if kind != "other" else 400, "illegal_argument_exception",
                       f"no handler found for uri [{path}] and method [{method}]")

    def _info(self) -> dict:
        return {
            "name": "es-standin",
            "cluster_name": "gpu-pipeline-tests",
            "cluster_uuid": "standin-cluster-uuid",
            "version": {"number": "9.1.0", "build_flavor": "default", "build_type": "docker",
                        "lucene_version": "10.2.2", "minimum_wire_compatibility_version": "8.19.0",
                        "minimum_index_compatibility_version": "8.0.0"} if self.major == 9 else
                       {"number": "8.19.3", "build_flavor": "default", "build_type": "docker",
                        "lucene_version": "9.12.2", "minimum_wire_compatibility_version": "7.17.0",
                        "minimum_index_compatibility_version": "7.0.0"},
            "tagline": "You Know, for Search",
        }

    # -- APIs ------------------------------------------------------------------------------

    def _resolve(self, pattern: str) -> list[str]:
        names: list[str] = []
        with self._lock:
            known = sorted(self._indices)
        for part in pattern.split(","):
            part = part.strip()
            if not part:
                continue
            if part in ("_all", "*"):
                names.extend(known)
            elif any(c in part for c in "*?"):
                names.extend(n for n in known if fnmatch.fnmatchcase(n, part))
            elif part in known:
                names.append(part)
            else:
                raise _EsError(404, "index_not_found_exception", f"no such index [{part}]",
                               **{"resource.type": "index_or_alias", "resource.id": part, "index": part})
        return list(dict.fromkeys(names))

    def _snapshot(self, names: list[str]) -> list[tuple[str, str, dict]]:
        with self._lock:
            return [(n, doc_id, copy.deepcopy(src)) for n in names for doc_id, src in self._indices[n]]

    def _new_pit_id(self) -> str:
        return base64.urlsafe_b64encode(secrets.token_bytes(24)).decode().rstrip("=")

    def _open_pit(self, index: str, keep_alive: str | None) -> tuple[int, dict]:
        ka = _parse_duration(keep_alive)
        docs = self._snapshot(self._resolve(index))
        pit_id = self._new_pit_id()
        pit = _Pit(docs=docs, keep_alive_s=ka, expires=time.monotonic() + ka, ids={pit_id}, latest=pit_id)
        with self._lock:
            self._pits[pit_id] = pit
            self.pits_opened += 1
        return 200, {"id": pit_id, "_shards": dict(_SHARDS)}

    def _find_pit(self, pit_id: str) -> _Pit | None:
        with self._lock:
            pit = self._pits.get(pit_id)
            if pit is not None and time.monotonic() > pit.expires:
                for i in pit.ids:
                    self._pits.pop(i, None)
                return None
            return pit

    def _close_pit(self, body: Any) -> tuple[int, dict]:
        pit_id = (body or {}).get("id") if isinstance(body, dict) else None
        if not pit_id:
            raise _EsError(400, "action_request_validation_exception", "Validation Failed: 1: no pit ids specified;")
        pit = self._find_pit(pit_id)
        if pit is None:
            return 404, {"succeeded": True, "num_freed": 0}
        with self._lock:
            for i in pit.ids:
                self._pits.pop(i, None)
            self.pits_closed += 1
            if pit_id != pit.latest:
                self.stale_pit_ids_used += 1
        return 200, {"succeeded": True, "num_freed": 1}

    def _sort_key(self, sort: list, src: dict, pos: int) -> list:
        out = []
        for spec in sort:
            name, order, missing = self._sort_spec(spec)
            if name in ("_shard_doc", "_doc"):
                out.append(pos)
                continue
            vals = _values(src, name)
            if not vals:
                default_last = LONG_MAX if order == "asc" else LONG_MIN
                if missing in (None, "_last"):
                    out.append(default_last)
                elif missing == "_first":
                    out.append(LONG_MIN if order == "asc" else LONG_MAX)
                else:
                    out.append(missing)
                continue
            v = min(vals, key=self._cmp_value) if order == "asc" else max(vals, key=self._cmp_value)
            if name in self.date_fields:
                s = _to_seconds(v, None)
                v = int(round(s * 1000)) if s is not None else v
            out.append(v)
        return out

    @staticmethod
    def _sort_spec(spec: Any) -> tuple[str, str, Any]:
        if isinstance(spec, str):
            return spec, ("desc" if spec == "_score" else "asc"), None
        if isinstance(spec, dict) and len(spec) == 1:
            (name, opts), = spec.items()
            if isinstance(opts, str):
                return name, opts, None
            if isinstance(opts, dict):
                return name, opts.get("order", "asc"), opts.get("missing")
        raise _EsError(400, "parsing_exception", f"malformed sort [{spec!r}]")

    @staticmethod
    def _cmp_value(v: Any) -> tuple:
        if isinstance(v, bool):
            return (1, int(v), "")
        if isinstance(v, (int, float)):
            return (1, float(v), "")
        return (2, 0.0, str(v))

    def _cmp(self, a: list, b: list, orders: list[str]) -> int:
        for x, y, order in zip(a, b, orders, strict=True):
            kx, ky = self._cmp_value(x), self._cmp_value(y)
            if kx != ky:
                c = -1 if kx < ky else 1
                return c if order == "asc" else -c
        return 0

    def _search(self, index: str | None, body: dict, params: dict) -> dict:
        t0 = time.monotonic()
        if not isinstance(body, dict):
            raise _EsError(400, "parsing_exception", "request body must be an object")
        pit_spec = body.get("pit")
        pit: _Pit | None = None
        if pit_spec is not None:
            if index:
                raise _EsError(400, "action_request_validation_exception",
                               "Validation Failed: 1: [indices] cannot be used with point in time. Do not "
                               "specify any index with point in time.;")
            pit_id = pit_spec.get("id") if isinstance(pit_spec, dict) else None
            pit = self._find_pit(pit_id) if pit_id else None
            if pit is None:
                raise _EsError(404, "search_phase_execution_exception", "all shards failed", phase="query",
                               grouped=True, failed_shards=[{"shard": -1, "index": None, "reason": {
                                   "type": "search_context_missing_exception",
                                   "reason": f"No search context found for id [{pit_id}]"}}])
            with self._lock:
                if pit_id != pit.latest:
                    self.stale_pit_ids_used += 1
                if pit_spec.get("keep_alive"):
                    pit.keep_alive_s = _parse_duration(pit_spec["keep_alive"])
                pit.expires = time.monotonic() + pit.keep_alive_s
            docs = pit.docs
        else:
            docs = self._snapshot(self._resolve(index or "_all"))

        size = int(body.get("size", params.get("size", 10)))
        frm = int(body.get("from", params.get("from", 0)))
        if size < 0 or frm < 0:
            raise _EsError(400, "illegal_argument_exception", "[size] and [from] must be >= 0")
        if frm + size > MAX_RESULT_WINDOW:
            raise _EsError(400, "illegal_argument_exception",
                           f"Result window is too large, from + size must be less than or equal to: "
                           f"[{MAX_RESULT_WINDOW}] but was [{frm + size}].")
        sort = list(_as_list(body.get("sort")))
        if pit is not None and not any(self._sort_spec(s)[0] == "_shard_doc" for s in sort):
            sort.append({"_shard_doc": "asc"})  # the implicit PIT tiebreaker
        search_after = body.get("search_after")
        if search_after is not None:
            if not sort:
                raise _EsError(400, "illegal_argument_exception", "Sort must contain at least one field.")
            if len(search_after) != len(sort):
                raise _EsError(400, "illegal_argument_exception",
                               f"search_after has {len(search_after)} value(s) but sort has {len(sort)}.")
            if frm:
                raise _EsError(400, "illegal_argument_exception",
                               "[from] parameter must be set to 0 when [search_after] is used.")

        query = body.get("query")
        matched = []
        for pos, (idx, doc_id, src) in enumerate(docs):
            if self._query.match(query, src):
                matched.append((pos, idx, doc_id, src))
        orders = [self._sort_spec(s)[1] for s in sort]
        keyed = [(self._sort_key(sort, src, pos), pos, idx, doc_id, src) for pos, idx, doc_id, src in matched]
        if sort:
            keyed.sort(key=functools.cmp_to_key(lambda a, b: self._cmp(a[0], b[0], orders)))
        if search_after is not None:
            keyed = [k for k in keyed if self._cmp(k[0], list(search_after), orders) > 0]
            page = keyed[:size]
        else:
            page = keyed[frm: frm + size]

        source_spec = body.get("_source", True)
        hits = []
        for key, _pos, idx, doc_id, src in page:
            hit: dict[str, Any] = {"_index": idx, "_id": doc_id, "_score": None if sort else 1.0}
            if source_spec is not False:
                hit["_source"] = self._filter_source(src, source_spec)
            if sort:
                hit["sort"] = key
            hits.append(hit)

        hits_obj: dict[str, Any] = {}
        tth = body.get("track_total_hits", params.get("track_total_hits", MAX_RESULT_WINDOW))
        n = len(matched)
        if tth is True or tth == "true":
            hits_obj["total"] = {"value": n, "relation": "eq"}
        elif tth is not False and tth != "false":
            limit = int(tth)
            hits_obj["total"] = {"value": min(n, limit), "relation": "eq" if n <= limit else "gte"}
        hits_obj["max_score"] = None if sort else (1.0 if hits else None)
        hits_obj["hits"] = hits
        resp: dict[str, Any] = {
            "took": max(0, int((time.monotonic() - t0) * 1000)),
            "timed_out": False,
            "_shards": dict(_SHARDS),
            "hits": hits_obj,
        }
        if pit is not None:
            if self.rotate_pit_ids:
                new_id = self._new_pit_id()
                with self._lock:
                    pit.ids.add(new_id)
                    pit.latest = new_id
                    self._pits[new_id] = pit
            resp["pit_id"] = pit.latest
        return resp

    @staticmethod
    def _filter_source(src: dict, spec: Any) -> dict:
        if spec is True or spec is None:
            return src
        includes = spec if isinstance(spec, list) else (spec.get("includes") if isinstance(spec, dict) else [spec])
        if not includes:
            return src
        return {k: v for k, v in src.items() if any(fnmatch.fnmatchcase(k, p) for p in includes)}


def es_error_body(status: int, etype: str, reason: str) -> dict:
    """The Elasticsearch error body shape (for tests that build their own)."""
    return _EsError(status, etype, reason).body()


__all__ = ["DATE_FIELDS", "EsStandIn", "Fault", "Recorded", "es_error_body"]

