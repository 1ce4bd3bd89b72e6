"""A REAL PostgreSQL server for tests (the Debian ``postgresql`` package's binaries).

Design:

* Binaries: ``/usr/lib/postgresql/<major>/bin`` (Debian keeps ``initdb``, ``postgres``, ``pg_ctl``
  off PATH; the highest major version wins), else the directory of ``initdb`` or ``pg_ctl`` on PATH.
  :func:`missing_binaries` says why a test must skip.
* PostgreSQL refuses to run as root. Under root every server command runs as the ``postgres``
  system user (created by the package); otherwise as the current user. The server's files live in
  a fresh temporary directory (``tempfile.mkdtemp`` in the system temp dir, not pytest's
  ``tmp_path``, whose root-owned 0700 parents that user cannot traverse), owned by that user:
  ``data/`` (``initdb``), ``sock/`` (the Unix socket, mode 0700) and ``postgres.log``.
* ``postgres`` is started directly (not ``pg_ctl start``) as a child process, so its exit is seen
  at once and it gets SIGINT (fast shutdown) if the test process dies (``PR_SET_PDEATHSIG``). It
  listens ONLY on 127.0.0.1 at a free high port (``-c listen_addresses=127.0.0.1 -p PORT``) and on
  the private socket directory (``-k``); durability is off (``fsync``, ``synchronous_commit``,
  ``full_page_writes``) because the data is thrown away.
* Authentication: the superuser ``postgres`` is trusted on the private Unix socket only (the
  helper uses it to create roles and databases); TCP connections need a password
  (``scram-sha-256``), so clients prove the password they were given.
* Every wait is bounded (``pg_isready`` polled until :data:`READY_TIMEOUT_S`). :meth:`stop` runs
  ``pg_ctl stop -m fast``, then SIGKILL if the server is still there, then removes the directory.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
SUPERUSER = "postgres"
_BINARIES = ("initdb", "postgres", "pg_ctl", "pg_isready")


def find_bindir() -> Path | None:
    """The directory holding ``initdb``, ``postgres``, ``pg_ctl`` and ``pg_isready``, or ``None``."""

    def complete(d: Path) -> bool:
        return all(os.access(d / b, os.X_OK) for b in _BINARIES)

    def major(d: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", Path(d).parent.name)) or (0,)

    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major, reverse=True):
        if complete(Path(d)):
            return Path(d)
    for name in ("initdb", "pg_ctl"):
        found = shutil.which(name)
        if found and complete(Path(found).resolve().parent):
            return Path(found).resolve().parent
    return None


def _run_as() -> tuple[int, int] | None:
    """(uid, gid) to run the server as when we are root; ``None`` when we are not root."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        pw = pwd.getpwnam(SUPERUSER)
    except KeyError:
        return (-1, -1)
    return (pw.pw_uid, pw.pw_gid)


def missing_binaries() -> str | None:
    """Why a real PostgreSQL cannot run here, or ``None``."""
    if find_bindir() is None:
        return ("PostgreSQL server binaries (initdb, postgres, pg_ctl, pg_isready) not found in "
                "/usr/lib/postgresql/*/bin or on PATH (install the Debian package 'postgresql')")
    if _run_as() == (-1, -1):
        return ("running as root and there is no 'postgres' system user to run the server as "
                "(PostgreSQL refuses to run as root; the Debian package 'postgresql' creates the user)")
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[postgres]')"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_setup(ids: tuple[int, int] | None):
    """``preexec_fn``: drop to the server user (when root), then ask for SIGINT on parent death.

    The order matters: a credential change clears the parent-death signal, so it is set last."""

    def setup() -> None:
        if ids is not None:
            uid, gid = ids
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG; SIGINT = fast shutdown
        except (OSError, AttributeError):
            pass

    return setup


@dataclass
class PostgresServer:
    """One ``postgres`` process on 127.0.0.1. Use as a context manager (start / stop)."""

    bindir: Path | None = None
    port: int = 0
    base_dir: Path | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    host = "127.0.0.1"

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base_dir / "sock"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "postgres.log"

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- running commands as the server user ------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C", HOME=str(self.base_dir))
        return env

    def _cmd(self, name: str, *args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [str(self.bindir / name), *args], capture_output=True, text=True, timeout=timeout,
            cwd=self.base_dir, env=self._env(), preexec_fn=_child_setup(_run_as()), check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"{name} {' '.join(args)} failed ({proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()}")
        return proc

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        reason = missing_binaries()
        if reason:
            raise RuntimeError(reason)
        self.bindir = self.bindir or find_bindir()
        ids = _run_as()
        self.base_dir = Path(tempfile.mkdtemp(prefix="gpu-pipeline-pg-"))
        try:
            self.socket_dir.mkdir(mode=0o700)
            if ids is not None:
                for p in (self.base_dir, self.socket_dir):
                    os.chown(p, *ids)
            self._cmd("initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "-E", "UTF8", "--no-locale",
                      "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync", timeout=120)
            last_error = ""
            for _ in range(3):  # a free port can be taken between free_port() and bind()
                self.port = self.port or free_port()
                if self._launch():
                    return
                last_error = self._log_tail()
                self.port = 0
            raise RuntimeError(f"postgres did not start:\n{last_error}")
        except BaseException:
            self.stop()
            raise

    def _launch(self) -> bool:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.process = subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                 "-k", str(self.socket_dir),
                 "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_permissions=0700",
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=100", "-c", "log_min_messages=warning"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.base_dir, env=self._env(), preexec_fn=_child_setup(_run_as()),
            )
        finally:
            log.close()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            ready = self._cmd("pg_isready", "-h", self.host, "-p", str(self.port), "-t", "1",
                              timeout=10, check=False)
            if ready.returncode == 0:
                return True
            time.sleep(0.2)
        self._kill()
        raise RuntimeError(f"postgres not ready on {self.host}:{self.port} after {READY_TIMEOUT_S:.0f} s:\n"
                           f"{self._log_tail()}")

    def _log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass

    def stop(self) -> None:
        """``pg_ctl stop -m fast``, then SIGKILL; then delete the data. Safe to call twice."""
        try:
            if self.process is not None and self.process.poll() is None:
                try:
                    self._cmd("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w",
                              "-t", str(int(STOP_TIMEOUT_S)), timeout=STOP_TIMEOUT_S + 5, check=False)
                    self.process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
                self._kill()
        finally:
            self.process = None
            if self.base_dir is not None:
                shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- administration -----------------------------------------------------------------------

    def admin_connect(self, dbname: str = "postgres"):
        """A psycopg2 connection as the superuser over the private Unix socket (autocommit)."""
        import psycopg2

        con = psycopg2.connect(host=str(self.socket_dir), port=self.port, user=SUPERUSER, dbname=dbname,
                               connect_timeout=10)
        con.autocommit = True
        return con

    def create_role(self, name: str, password: str) -> None:
        from psycopg2 import sql

        con = self.admin_connect()
        try:
            with con.cursor() as cur:
                cur.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(name)),
                            (password,))
        finally:
            con.close()

    def create_database(self, name: str, owner: str) -> None:
        from psycopg2 import sql

        con = self.admin_connect()
        try:
            with con.cursor() as cur:
                cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(owner)))
        finally:
            con.close()

    def connect(self, dbname: str, user: str, password: str):
        """A psycopg2 connection over TCP with a password, like Dagster's."""
        import psycopg2

        return psycopg2.connect(host=self.host, port=self.port, user=user, password=password,
                                dbname=dbname, connect_timeout=10)
