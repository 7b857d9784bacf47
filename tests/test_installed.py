"""The built wheel, installed into a fresh virtual environment beside an application that has its
own `activities` and `workflows`: what it holds, what works, and what the README warns about.

Our top-level names are common ones, and the layout that makes them top-level is fixed, so the
distribution cannot be made safe beside an application's packages of the same names. These tests
show the line the README draws: alone in its environment it works; with an application's
`activities` first on the path the command says so in one line and exits 2; with ours first, the
application's `import activities` silently gets ours.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import REPO, clean_env
from worker import OUR_TOP_LEVEL

#: A wheel build and a virtual environment, about 10 s: made once, on one pytest-xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("installed-wheel")]

README = (REPO / "README.md").read_text(encoding="utf-8")
# What the build needs from the checkout; the build runs on a copy, so it leaves no build/ or
# *.egg-info behind and cannot pick up a stale build/lib.
NOT_BUILT = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    python: Path  # the fresh environment's interpreter
    script: Path  # its `pg-purge`
    site: Path  # its site-packages
    app: Path  # an application with its own `activities` and `workflows`
    cwd: Path  # an empty directory: neither the checkout nor the application is on the path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=NOT_BUILT)
    # Built as `pip wheel .` builds it: in isolation, with the build-system's setuptools from the
    # package index (the test environment's own setuptools may be older than pyproject needs).
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", root / "dist", source)
    (wheel,) = (root / "dist").glob("temporal_pg_purge-*.whl")

    env = root / "env"
    _run(sys.executable, "-m", "venv", "--without-pip", env)
    python = env / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel)
    site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    )
    # The runtime dependencies (temporalio, psycopg) from the test environment, appended after
    # the fresh site-packages. A path line in a .pth does not run that directory's own .pth
    # files, so the checkout's editable install stays out.
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    app = root / "app"
    for package in ("activities", "workflows"):
        (app / package).mkdir(parents=True)
        (app / package / "__init__.py").write_text("APP = True\n")
    (app / "activities" / "charge.py").write_text("def charge() -> None: ...\n")
    cwd = root / "cwd"
    cwd.mkdir()
    return Installed(wheel, python, env / "bin" / "pg-purge", site, app, cwd)


def _run(*argv: object) -> str:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{argv}: {done.stderr[-3000:]}"
    return done.stdout


def _start(
    installed: Installed, *argv: object, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """A process of the fresh environment, from an empty directory, with nothing of the checkout
    on the path; `pythonpath` puts a directory first."""
    env = clean_env()
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "VIRTUAL_ENV"):
        env.pop(name, None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [str(a) for a in argv],
        cwd=installed.cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_wheel_holds_every_package_and_data_file_of_the_checkout(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    wanted = {
        "worker.py",
        "activities/schema.sql",
        "activities/engine/__init__.py",
        "activities/engine/batching.py",
        "purge_config/file.py",
        "purge_dev/servers.py",
        *(f"{package}/py.typed" for package in OUR_TOP_LEVEL if package != "worker"),
    }
    for package in OUR_TOP_LEVEL:
        if package == "worker":
            continue
        for path in (REPO / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                wanted.add(path.relative_to(REPO).as_posix())
    assert wanted <= names, sorted(wanted - names)
    # Nothing else top-level (no tests/, no bench/), and the worker checks exactly these names.
    top = {name.split("/")[0] for name in names if not name.startswith("temporal_pg_purge-")}
    assert top == {"worker.py" if name == "worker" else name for name in OUR_TOP_LEVEL}
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(installed.wheel).read(entry_points).decode()
    assert "pg-purge = worker:cli" in text


def test_alone_in_its_environment_it_works(installed: Installed) -> None:
    done = _start(installed, installed.script, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: pg-purge")

    done = _start(installed, installed.python, "-m", "worker", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: pg-purge")

    code = (
        "import workflows.purge, activities.sweep, activities.engine.batching, purge_dev.servers\n"
        "from activities.schema import reference_ddl\n"
        "from worker import new_worker\n"
        "print(workflows.purge.__file__)\n"
        "print('CREATE TABLE' in reference_ddl())\n"
    )
    done = _start(installed, installed.python, "-c", code)
    assert done.returncode == 0, done.stderr
    where, ddl = done.stdout.split()
    assert Path(where).is_relative_to(installed.site)
    assert ddl == "True"

    # The README's check for the in-process use: this distribution's files, side by side.
    [check] = [ln for ln in README.splitlines() if ln.startswith("python -c 'import activities")]
    done = _start(installed, installed.python, *shlex.split(check)[1:])
    assert done.returncode == 0, done.stderr
    assert {Path(p).parent.parent for p in done.stdout.split()[:2]} == {installed.site}
    assert Path(done.stdout.split()[2]).parent == installed.site


def test_with_the_applications_activities_first_the_command_says_so_and_exits_2(
    installed: Installed,
) -> None:
    """PYTHONPATH=/app, as many application images set it: no traceback, one line that names the
    application's packages and what to do."""
    for argv in [(installed.script, "--help"), (installed.python, "-m", "worker", "sweep")]:
        done = _start(installed, *argv, pythonpath=installed.app)
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""
        assert "Traceback" not in done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("pg-purge: other packages named workflows, activities come first")
        assert str(installed.app / "activities") in line
        assert str(installed.app / "workflows") in line
        assert "run pg-purge in its own virtual environment" in line

    # In-process, the application's import of our worker fails with the same words.
    done = _start(
        installed, installed.python, "-c", "from worker import new_worker", pythonpath=installed.app
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("ImportError: pg-purge: other packages named")


def test_with_ours_first_the_applications_import_activities_gets_ours(installed: Installed) -> None:
    """The application's directory after site-packages (where an editable install of it, or a
    .pth, puts it): pg-purge works, and the application silently loses its own `activities`."""
    code = (
        "import sys\n"
        f"sys.path.append({str(installed.app)!r})\n"
        "import activities\n"
        "print(activities.__file__)\n"
        "print(hasattr(activities, 'APP'))\n"
        "from worker import new_worker\n"
        "print('worker-ok')\n"
        "import activities.charge\n"
    )
    done = _start(installed, installed.python, "-c", code)
    where, app_attr, worker_ok = done.stdout.split()
    assert Path(where) == installed.site / "activities" / "__init__.py"
    assert app_attr == "False"
    assert worker_ok == "worker-ok"
    assert done.returncode == 1
    assert "ModuleNotFoundError: No module named 'activities.charge'" in done.stderr


def test_with_an_applications_worker_module_first_the_command_fails_on_its_import(
    installed: Installed, tmp_path: Path
) -> None:
    """operating.md's one case the start's check cannot catch: a module named `worker` first on
    the path is imported in place of ours (its top-level code runs), and the command fails with
    Python's ImportError, not the one line."""
    (tmp_path / "worker.py").write_text("print('the application worker ran')\n")
    done = _start(installed, installed.script, "--help", pythonpath=tmp_path)
    assert done.returncode == 1
    assert done.stdout == "the application worker ran\n"
    last = done.stderr.splitlines()[-1]
    assert last.startswith("ImportError: cannot import name 'cli' from 'worker'"), last
    assert str(tmp_path / "worker.py") in last
