"""Helpers for the tests of the Dagster UI and daemon: a small demo data directory, ``dagster dev`` as
a child process group, GraphQL (runs launched and awaited), and headless Debian chromium driven by
Python playwright.

Facts these helpers rely on (measured with dagster 1.13.27 / playwright 1.65):

* ``dagster dev`` started from a script ignores SIGINT and SIGTERM when SIGINT is inherited as
  ignored (Dagster copies SIGINT's handler onto SIGTERM). It is started in its own session (so its
  process group holds the webserver, the daemon, the code servers and the run workers) with
  SIGINT reset to the default, and stopped by SIGTERM to the group, then SIGKILL after a timeout.
* It is up when ``/server_info`` answers (5-20 s); the backfill daemon ticks every 30 s.
* The UI keeps polling: wait for page text, never for ``networkidle``. A first-visit "Join the
  Dagster community" modal may cover the page; a locator handler clicks its "Skip".
* Chromium is Debian's ``/usr/bin/chromium`` (never ``playwright install``). Playwright refuses a
  ``--user-data-dir`` in ``args``, so a fresh profile goes through ``launch_persistent_context``.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKSPACE = REPO_ROOT / "workspace.yaml"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS_ENV = "GPU_PIPELINE_UI_SCREENSHOTS"

READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
KILL_TIMEOUT_S = 10.0
MATERIALIZE_TIMEOUT_S = 240.0


def missing_chromium() -> str | None:
    """Why the browser test cannot run here, or ``None``."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return (f"{CHROMIUM} not found: install Debian's browser with "
                "`apt-get install -y --no-install-recommends chromium` (never `playwright install`)")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# The demo data directory


@dataclass
class DemoData:
    base: Path
    env: dict[str, str]  #: the variables of ``gpu_pipeline.cli.demo_env`` (DAGSTER_HOME, GPU_PIPELINE_*)
    days: list[str]  #: the simulated local days, oldest first

    @property
    def data_root(self) -> Path:
        return Path(self.env["GPU_PIPELINE_DATA_ROOT"])

    @property
    def timezone(self) -> str:
        return self.env["GPU_PIPELINE_TIMEZONE"]

    def gpu_states_file(self, day: str) -> Path:
        return self.data_root / "metrics" / "gpu_states" / f"date={day}" / "part-0.parquet"

    def heatmap_file(self, day: str) -> Path:
        return self.data_root / "plots" / "gpu_timeline_heatmap" / f"date={day}" / "gpu_timeline_heatmap.png"


def complete_days(n: int, tz: str) -> list[dt.date]:
    """The last ``n`` complete local days in ``tz`` (like ``gpu_pipeline.cli.demo_days``), oldest first."""
    today = dt.datetime.now(ZoneInfo(tz)).date()
    return [today - dt.timedelta(days=n - i) for i in range(n)]


def prepare_demo(base: Path, n_days: int = 4, gpus: int = 16, seed: int = 5) -> DemoData:
    """Simulate a small pool for the last ``n_days`` complete days and write the demo environment.

    Runs nothing: the pipeline is run by :func:`materialize_days` and by the UI."""
    from gpu_pipeline.cli import DEMO_KUEUE_S, DEMO_TZ, demo_env, prepare_dagster_home
    from gpu_pipeline.lib.simulate import SimConfig, simulate

    base = base.resolve()
    days = complete_days(n_days, DEMO_TZ)
    # Kueue scrapes are simulated too: the demo environment names a Kueue directory, and a source
    # that is configured but has no data for a day fails its blocking check.
    simulate(
        base / "sources",
        SimConfig(start=days[0], end=days[-1], gpus=gpus, seed=seed, timezone=DEMO_TZ,
                  telemetry_interval_s=300, kueue_interval_s=DEMO_KUEUE_S),
    )
    env = demo_env(base, days[0])
    # A source directory the demo environment names but this small simulation did not write (the
    # demo command may add sources) is switched off: an unset optional source gives empty tables,
    # while a configured but empty one fails its blocking check.
    env = {k: v for k, v in env.items()
           if not (k.startswith("GPU_PIPELINE_") and k.endswith("_DIR") and not Path(v).exists())}
    prepare_dagster_home(Path(env["DAGSTER_HOME"]))
    return DemoData(base=base, env=env, days=[d.isoformat() for d in days])


def child_env(extra: dict[str, str], pycache: Path | None = None) -> dict[str, str]:
    """This process's environment without any GPU_PIPELINE_* / DAGSTER_* variable, plus ``extra``.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (and the venv holds no bytecode), every Dagster step
    subprocess would compile dagster and its dependencies from source again (5-10 s each on two
    cores); the children then cache bytecode under ``pycache`` instead (``PYTHONPYCACHEPREFIX``,
    never inside the checkout or the venv)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_PIPELINE_", "DAGSTER_"))}
    if pycache is not None and env.pop("PYTHONDONTWRITEBYTECODE", None):
        pycache.mkdir(parents=True, exist_ok=True)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env.update(extra)
    return env


def materialize_days(demo: DemoData, start: str, end: str, env: dict[str, str], log: Path) -> None:
    """``gpu_pipeline.cli.run_pipeline(start, end)`` in a subprocess with the demo environment."""
    code = (
        "import datetime as dt, sys\n"
        "from gpu_pipeline.cli import run_pipeline\n"
        f"ok = run_pipeline(dt.date.fromisoformat({start!r}), dt.date.fromisoformat({end!r}))\n"
        "sys.exit(0 if ok else 1)\n"
    )
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=demo.base, stdout=out,
                              stderr=subprocess.STDOUT, timeout=MATERIALIZE_TIMEOUT_S)
    if proc.returncode != 0:
        raise AssertionError(f"run_pipeline({start}, {end}) failed (exit {proc.returncode}); "
                             f"log {log}:\n{tail(log)}")


def tail(path: Path, n: int = 60) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(lines[-n:])


# ----------------------------------------------------------------------------------------------
# dagster dev


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, session id) of a live process, or ``None``."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    if fields[0] == "Z":  # a zombie has exited; its parent just has not reaped it
        return None
    return int(fields[1]), int(fields[3])


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def processes_of(root: int) -> dict[int, str]:
    """Live processes in ``root``'s session or descended from ``root``: pid -> command line."""
    stats = {pid: st for pid in _all_pids() if (st := _proc_stat(pid)) is not None}
    found = {pid for pid, (_, sid) in stats.items() if sid == root}
    if root in stats:
        found.add(root)
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _) in stats.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    return {pid: _cmdline(pid) for pid in sorted(found)}


def _child_setup() -> None:
    """``preexec_fn``: SIGINT back to the default (so SIGTERM stops Dagster), and SIGTERM when the
    test process dies (``PR_SET_PDEATHSIG``) so an aborted test run leaves no server behind."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


@dataclass
class DagsterDev:
    """``dagster dev -w workspace.yaml -h 127.0.0.1 -p PORT`` in its own session."""

    env: dict[str, str]
    cwd: Path
    log_path: Path
    port: int = 0
    process: subprocess.Popen | None = field(default=None, repr=False)
    survivors: dict[int, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = self.port or free_port()
        dagster = Path(sys.executable).with_name("dagster")
        argv = [str(dagster), "dev", "-w", str(WORKSPACE), "-h", "127.0.0.1", "-p", str(self.port)]
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(argv, env=self.env, cwd=self.cwd, stdout=self._log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, preexec_fn=_child_setup)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Poll ``/server_info`` until it answers; the seconds it took."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"dagster dev exited with {self.process.returncode} before serving; "
                                     f"log {self.log_path}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/server_info", timeout=5) as resp:
                    info = json.load(resp)
                if "dagster_webserver_version" in info:
                    return time.monotonic() - t0
            except (OSError, ValueError) as exc:
                last = repr(exc)
            time.sleep(1.0)
        raise AssertionError(f"dagster dev did not answer {self.url}/server_info within {timeout_s:.0f} s "
                             f"(last error {last}); log {self.log_path}:\n{self.log_tail()}")

    def graphql(self, query: str, variables: dict | None = None, timeout_s: float = 30.0) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.url}/graphql", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            doc = json.load(resp)
        if doc.get("errors"):
            raise AssertionError(f"GraphQL errors: {doc['errors']}")
        return doc["data"]

    def log_tail(self, n: int = 60) -> str:
        return tail(self.log_path, n)

    def stop(self) -> dict[int, str]:
        """SIGTERM the process group, SIGKILL it after a timeout; the processes still alive after
        that (also kept in :attr:`survivors`), which should be none."""
        if self.process is None:
            return {}
        pid = self.process.pid
        before = processes_of(pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and any(_proc_stat(p) for p in before):
            time.sleep(0.5)
        if any(_proc_stat(p) for p in before) or self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            for p in before:
                if _proc_stat(p):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=KILL_TIMEOUT_S)
            deadline = time.monotonic() + KILL_TIMEOUT_S
            while time.monotonic() < deadline and any(_proc_stat(p) for p in before):
                time.sleep(0.2)
        # dagster dev may restart its code server while it shuts down (a new process that missed the
        # signals above): kill whatever of the tree is still there, a few rounds.
        for _ in range(5):
            stragglers = processes_of(pid)
            stragglers.update({p: c for p, c in before.items() if _proc_stat(p)})
            if not stragglers:
                break
            for p in stragglers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            time.sleep(1.0)
        self._log.close()
        after = processes_of(pid)
        after.update({p: cmd for p, cmd in before.items() if _proc_stat(p)})
        self.survivors = after
        self.process = None
        return after


@contextlib.contextmanager
def dagster_dev(env: dict[str, str], cwd: Path, log_path: Path) -> Iterator[DagsterDev]:
    server = DagsterDev(env=env, cwd=cwd, log_path=log_path)
    server.start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


# ----------------------------------------------------------------------------------------------
# The webserver's GraphQL API (what the UI sends), for the daemon's tests

RUN_WAIT_S = 300.0  # the daemon's ticks and two runs on a busy 2-core machine

REPOS = """
{ repositoriesOrError { __typename
    ... on RepositoryConnection { nodes { name location { name } sensors { name } } }
    ... on PythonError { message } } }
"""

LAUNCH = """
mutation($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message } ... on InvalidSubsetError { message } ... on InvalidStepError { invalidStepKey }
    ... on RunConfigValidationInvalid { errors { message } } ... on UnauthorizedError { message } } }
"""

RUN = """
query($id: ID!) { runOrError(runId: $id) { __typename
    ... on Run { runId status tags { key value } assetSelection { path } }
    ... on RunNotFoundError { message } ... on PythonError { message } } }
"""

TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}


def wait_for(what: str, probe, server, timeout_s: float = RUN_WAIT_S):
    """What ``probe()`` gives once it is truthy (tried every 2 s), else an error with the server's log."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(2.0)
    raise AssertionError(f"{what} within {timeout_s:.0f} s; last {last!r}; dagster dev log:\n{server.log_tail(40)}")


def finished_run(server, run_id: str) -> dict | None:
    """The run once it has ended, else None."""
    run = server.graphql(RUN, {"id": run_id})["runOrError"]
    assert run["__typename"] == "Run", run
    return run if run["status"] in TERMINAL else None


# ----------------------------------------------------------------------------------------------
# The browser


@contextlib.contextmanager
def browser_context(profile_dir: Path) -> Iterator:
    """A fresh headless chromium profile (UTC, en-US, 1600x1000) as a playwright BrowserContext."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile_dir),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1600, "height": 1000},
            timezone_id="UTC",
            locale="en-US",
        )
        try:
            yield ctx
        finally:
            ctx.close()


def dismiss_community_modal(page) -> None:  # noqa: ANN001
    """Click "Skip" on the first-visit "Join the Dagster community" modal whenever it covers the page."""
    page.add_locator_handler(page.get_by_role("button", name="Skip", exact=True),
                             lambda skip: skip.click(), no_wait_after=False)


class Screenshots:
    """Saves page screenshots under the test's tmp dir and copies them to $GPU_PIPELINE_UI_SCREENSHOTS."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        target = os.environ.get(SCREENSHOTS_ENV, "").strip()
        self.copy_to = Path(target) if target else None
        self.saved: list[Path] = []

    def take(self, page, name: str) -> Path:  # noqa: ANN001
        path = self.directory / f"{name}.png"
        page.screenshot(path=str(path), animations="disabled")  # no half-faded dialogs
        self.saved.append(path)
        if self.copy_to is not None:
            self.copy_to.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, self.copy_to / path.name)
        return path

    def failure(self, page, name: str) -> str:  # noqa: ANN001
        """Best-effort screenshot for an assertion message."""
        try:
            return str(self.take(page, f"FAILED-{name}"))
        except Exception as exc:  # noqa: BLE001 - a failure report must not raise
            return f"<no screenshot: {exc}>"


START_SENSOR = """
mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename
    ... on Sensor { sensorState { status } }
    ... on PythonError { message } ... on UnauthorizedError { message } ... on SensorNotFoundError { message } } }
"""

TICKS = """
query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { __typename
    ... on Sensor { sensorState { status ticks(limit: 20) { status cursor skipReason runIds error { message } } } }
    ... on PythonError { message } } }
"""


def start_sensor(server, name: str):  # noqa: ANN201 - (the repository selector, a function listing the ticks)
    """Switch the sensor ``name`` on through the webserver's GraphQL (as the UI's toggle does); returns
    the selector of its code location's repository and a function that lists its latest ticks."""
    repos = server.graphql(REPOS)["repositoriesOrError"]
    assert repos["__typename"] == "RepositoryConnection", repos
    (repo,) = [r for r in repos["nodes"] if name in {s["name"] for s in r["sensors"]}]
    where = {"repositoryLocationName": repo["location"]["name"], "repositoryName": repo["name"]}
    sensor = {**where, "sensorName": name}
    started = server.graphql(START_SENSOR, {"s": sensor})["startSensor"]
    assert started["__typename"] == "Sensor" and started["sensorState"]["status"] == "RUNNING", started

    def ticks() -> list[dict]:
        got = server.graphql(TICKS, {"s": sensor})["sensorOrError"]
        assert got["__typename"] == "Sensor", got
        return got["sensorState"]["ticks"]

    return where, ticks
