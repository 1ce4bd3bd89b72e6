"""A REAL Prometheus server for tests, loaded with history through ``promtool``.

History is written as OpenMetrics text with timestamps in seconds (``# TYPE name gauge``, then
``name{labels} value timestamp`` lines per series in time order, ``# EOF``), turned into TSDB blocks
with ``promtool tsdb create-blocks-from openmetrics FILE DATA_DIR``, and served by
``prometheus --storage.tsdb.path=DATA_DIR`` on 127.0.0.1 and a free high port, with a minimal
configuration that scrapes nothing and ``--storage.tsdb.retention.time=100y`` (backfilled blocks are
never deleted by retention). Blocks are opened at startup, so history is queryable as soon as
``/-/ready`` answers; :meth:`PrometheusServer.wait_for` checks it anyway.

Every wait is bounded; :meth:`PrometheusServer.stop` (SIGTERM, then SIGKILL) runs on context exit.
On Linux the server also gets SIGTERM when the test process dies (``PR_SET_PDEATHSIG``), so an
aborted run does not leave it behind.

:func:`missing_binaries` says why the tests must skip (no ``prometheus`` / ``promtool``; Debian
package ``prometheus``). :class:`DcgmHistory` is simulated dcgm-exporter history with values known
exactly, for tests that read it back.
"""

from __future__ import annotations

import base64
import ctypes
import json
import math
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def missing_binaries() -> str | None:
    """Why a real Prometheus cannot run here, or ``None`` when both binaries are on PATH."""
    missing = [b for b in ("prometheus", "promtool") if shutil.which(b) is None]
    if missing:
        return (f"{' and '.join(missing)} not on PATH (install the Debian package 'prometheus', which "
                "ships both)")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# OpenMetrics history
# ----------------------------------------------------------------------------------------------


@dataclass
class Series:
    name: str
    labels: dict[str, str]
    samples: list[tuple[float, float]]  #: (timestamp seconds, value), increasing timestamps


def _om_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _om_number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def write_openmetrics(path: Path, series: Iterable[Series], kind: str = "gauge") -> Path:
    """Write series as one OpenMetrics exposition with timestamps; the series of one metric are
    grouped under one ``# TYPE`` line (OpenMetrics requires a family to be contiguous)."""
    by_name: dict[str, list[Series]] = {}
    for s in series:
        by_name.setdefault(s.name, []).append(s)
    with path.open("w", encoding="utf-8") as fh:
        for name, group in by_name.items():
            fh.write(f"# TYPE {name} {kind}\n")
            for s in group:
                labels = ",".join(f'{k}="{_om_label_value(v)}"' for k, v in s.labels.items())
                head = f"{name}{{{labels}}}" if labels else name
                for ts, value in s.samples:
                    fh.write(f"{head} {_om_number(value)} {_om_number(ts)}\n")
        fh.write("# EOF\n")
    return path


def create_blocks(openmetrics_file: Path, data_dir: Path, timeout_s: float = 60.0) -> str:
    """``promtool tsdb create-blocks-from openmetrics``; its output. Raises with promtool's message."""
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(openmetrics_file), str(data_dir)],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"promtool create-blocks-from openmetrics failed ({proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


# ----------------------------------------------------------------------------------------------
# The server
# ----------------------------------------------------------------------------------------------


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class PrometheusServer:
    """One ``prometheus`` process on 127.0.0.1. Use as a context manager (start / stop)."""

    data_dir: Path
    workdir: Path
    web_config: str | None = None  #: YAML of ``--web.config.file`` (TLS, basic auth)
    https: bool = False
    username: str | None = None  #: for the helper's own readiness / query requests
    password: str | None = None
    port: int = 0
    extra_flags: Sequence[str] = ()  #: more command-line flags, e.g. ``--query.max-samples=5000``
    process: subprocess.Popen | None = field(default=None, repr=False)
    log_path: Path | None = None

    @property
    def base_url(self) -> str:
        return f"{'https' if self.https else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _flags(self) -> list[str]:
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1m\n  evaluation_interval: 1m\nscrape_configs: []\n")
        flags = [
            "prometheus",
            f"--config.file={cfg}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=100y",
            "--log.level=info",
        ]
        if self.web_config is not None:
            web = self.workdir / "web.yml"
            web.write_text(self.web_config)
            flags.append(f"--web.config.file={web}")
        return flags + list(self.extra_flags)

    def start(self, ready_timeout_s: float = READY_TIMEOUT_S, attempts: int = 3) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "prometheus.log"
        last = ""
        for _ in range(attempts):
            self.port = free_port()
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    self._flags(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=self.workdir, preexec_fn=_set_pdeathsig if sys.platform == "linux" else None,
                )
            try:
                if self._wait_ready(ready_timeout_s):
                    return
            except BaseException:
                self.stop()
                raise
            last = self.log_tail()
            self.stop()
            if "address already in use" not in last:
                break
        raise RuntimeError(f"prometheus did not become ready on 127.0.0.1:{self.port}; log tail:\n{last}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            try:
                status, _ = self.request("/-/ready", timeout_s=2.0)
                if status == 200:
                    return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)

    def log_tail(self, n: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    # -- the helper's own requests (readiness, checks) -------------------------------------------
    def request(self, path: str, params: Mapping[str, str] | None = None,
                timeout_s: float = 10.0) -> tuple[int, bytes]:
        url = self.base_url + path + (f"?{urlencode(params)}" if params else "")
        headers = {}
        if self.username is not None:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        ctx = None
        if self.https:  # our own server: the helper does not verify its certificate
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=ctx))
        try:
            with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_for(self, query: str, at_s: float, timeout_s: float = 15.0) -> list:
        """Poll an instant query at ``at_s`` until it returns a non-empty result; that result."""
        deadline = time.monotonic() + timeout_s
        body = b""
        while time.monotonic() < deadline:
            status, body = self.request("/api/v1/query", {"query": query, "time": str(at_s)})
            if status == 200:
                result = json.loads(body)["data"]["result"]
                if result:
                    return result
            time.sleep(0.2)
        raise RuntimeError(f"no data for {query!r} at {at_s} after {timeout_s}s: {body[:300]!r}\n"
                           f"{self.log_tail()}")


# ----------------------------------------------------------------------------------------------
# Simulated dcgm-exporter history, every value known
# ----------------------------------------------------------------------------------------------

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
ALL_FIELDS = (
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
)
MIG_FIELDS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE")
DCGM_INT32_BLANK = 2147483632.0  # 0x7ffffff0


@dataclass(frozen=True)
class GpuEntity:
    """One exported device: a GPU, or a MIG instance (``mig_id`` set)."""

    key: str
    host: str  #: the host the pipeline must report
    uuid: str  #: as exported (any case)
    gpu: str
    model: str
    labels: tuple[tuple[str, str], ...]  #: every label of its series except the metric name
    fields: tuple[str, ...] = ALL_FIELDS
    mig_id: str | None = None
    mig_profile: str | None = None


def _labels(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(kw.items())


ENTITIES: tuple[GpuEntity, ...] = (
    GpuEntity("h1/0", "h1", "GPU-0667ce7c-1a2b-3c4d-5e6f-00112233aabb", "0", A100, _labels(
        gpu="0", UUID="GPU-0667ce7c-1a2b-3c4d-5e6f-00112233aabb", device="nvidia0", modelName=A100,
        Hostname="h1", pci_bus_id="00000000:07:00.0", cluster="a", instance="10.0.0.1:9400", job="dcgm")),
    GpuEntity("h1/1", "h1", "GPU-B156E653-AAAA-BBBB-CCCC-DDDDEEEEFFFF", "1", A100, _labels(
        gpu="1", UUID="GPU-B156E653-AAAA-BBBB-CCCC-DDDDEEEEFFFF", device="nvidia1", modelName=A100,
        Hostname="h1", pci_bus_id="00000000:0F:00.0", cluster="a", instance="10.0.0.1:9400", job="dcgm")),
    # An odd label value (quote, backslash) for the escaping test.
    GpuEntity("h2/0", "h2", "GPU-2c3d4e5f-0000-1111-2222-333344445555", "0", H100, _labels(
        gpu="0", UUID="GPU-2c3d4e5f-0000-1111-2222-333344445555", device="nvidia0", modelName=H100,
        hostname="h2", pci_bus_id="00000000:18:00.0", cluster="b", rack='r"7\\x', instance="10.0.0.2:9400",
        job="dcgm")),
    # A MIG instance: parent UUID + GPU_I_ID, no GPU_UTIL.
    GpuEntity("h2/1/mig3", "h2", "GPU-9a8b7c6d-0000-1111-2222-333344445555", "1", H100, _labels(
        gpu="1", UUID="GPU-9a8b7c6d-0000-1111-2222-333344445555", device="nvidia1", modelName=H100,
        Hostname="h2", GPU_I_PROFILE="1g.10gb", GPU_I_ID="3", cluster="b", instance="10.0.0.2:9400",
        job="dcgm"), fields=MIG_FIELDS, mig_id="3", mig_profile="1g.10gb"),
    # No Hostname label at all: the host comes from `instance` (port removed).
    GpuEntity("h3/0", "h3.example.org", "GPU-deadbeef-0000-1111-2222-333344445555", "0", A100, _labels(
        gpu="0", UUID="GPU-deadbeef-0000-1111-2222-333344445555", device="nvidia0", modelName=A100,
        cluster="a", instance="h3.example.org:9400", job="dcgm")),
)

#: Special values: (entity key, step index, field) -> value (read back as null).
SPECIAL: dict[tuple[str, int, str], float] = {
    ("h1/0", 10, "DCGM_FI_DEV_GPU_TEMP"): math.nan,
    ("h1/0", 11, "DCGM_FI_DEV_POWER_USAGE"): math.inf,
    ("h1/1", 12, "DCGM_FI_DEV_GPU_UTIL"): DCGM_INT32_BLANK,
}


@dataclass
class DcgmHistory:
    """``n_steps`` samples every ``step_s`` seconds from ``start_s`` for every entity and field."""

    start_s: int
    n_steps: int
    step_s: int = 30
    entities: Sequence[GpuEntity] = ENTITIES

    @staticmethod
    def value(entity: GpuEntity, fieldname: str, i: int) -> float:
        special = SPECIAL.get((entity.key, i, fieldname))
        if special is not None:
            return special
        g = ENTITIES.index(entity)
        if fieldname == "DCGM_FI_DEV_GPU_UTIL":
            return float((i * 7 + g * 13) % 101)
        if fieldname == "DCGM_FI_DEV_POWER_USAGE":
            return 60.0 + (i * 3 + g * 5) % 300 + 0.25
        if fieldname == "DCGM_FI_DEV_FB_USED":
            return float(1000 + (i % 100) * 10 + g)
        if fieldname == "DCGM_FI_DEV_FB_FREE":
            return float(80000 - (1000 + (i % 100) * 10 + g))
        if fieldname == "DCGM_FI_DEV_GPU_TEMP":
            return float(30 + (i + g) % 50)
        if fieldname == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
            return float(10_000_000 * (g + 1) + i * 4500)
        if fieldname == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
            return ((i + 3 * g) % 100) / 100
        if fieldname == "DCGM_FI_PROF_SM_ACTIVE":
            return ((i + 5 * g) % 97) / 97
        if fieldname == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE":
            return ((2 * i + g) % 89) / 89
        raise KeyError(fieldname)

    def timestamp(self, i: int) -> int:
        return self.start_s + i * self.step_s

    def series(self) -> list[Series]:
        out = []
        for fieldname in ALL_FIELDS:
            for e in self.entities:
                if fieldname in e.fields:
                    out.append(Series(fieldname, dict(e.labels),
                                      [(self.timestamp(i), self.value(e, fieldname, i)) for i in range(self.n_steps)]))
        return out

    def load(self, workdir: Path) -> Path:
        """Write the OpenMetrics file and create the TSDB blocks; the data directory."""
        om = write_openmetrics(workdir / "dcgm-history.om.txt", self.series())
        data = workdir / "data"
        create_blocks(om, data)
        return data
