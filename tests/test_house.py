"""The rooms keep to themselves: configuration needs neither driver nor Temporal, and a
production worker never loads the dev harness. (That the connection-string reader agrees with
libpq is tests/unit/test_dsn.py.)"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

from tests.support.procs import REPO


def _modules_loaded_by(statement: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after `statement`."""
    done = subprocess.run(
        [sys.executable, "-c", f"{statement}\nimport sys\nprint(' '.join(sys.modules))"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return {name.split(".")[0] for name in done.stdout.split()}


def test_configuration_imports_neither_psycopg_nor_temporalio() -> None:
    loaded = _modules_loaded_by(
        "import purge_config, purge_config.file, purge_config.specs, purge_config.kinds"
    )

    assert "purge_config" in loaded
    assert not loaded & {"psycopg", "psycopg_pool", "temporalio"}


def test_the_engine_imports_no_temporalio() -> None:
    """The engine raises its own errors; only the activity, at its edge, speaks Temporal."""
    loaded = _modules_loaded_by(
        "import pkgutil, importlib, activities.engine\n"
        "for m in pkgutil.iter_modules(activities.engine.__path__, 'activities.engine.'):\n"
        "    importlib.import_module(m.name)"
    )

    assert {"activities", "psycopg"} <= loaded
    assert "temporalio" not in loaded


def _home(package: str, name: str, value: object) -> str:
    """The module a front door's `name` comes from: a class's or function's own module, else
    the first module of `package` that holds the very object under that name ('' if none)."""
    if inspect.isclass(value) or inspect.isfunction(value):
        return str(value.__module__)
    front = importlib.import_module(package)
    for room in pkgutil.iter_modules(front.__path__, f"{package}."):
        if vars(importlib.import_module(room.name)).get(name) is value:
            return room.name
    return ""


@pytest.mark.parametrize("package", ["activities", "activities.engine"])
def test_a_front_door_names_only_what_its_package_holds(package: str) -> None:
    """Every name in `__all__` is served (a lazy door imports it when asked) and comes from a
    module of the package itself, never from a dependency; and every class or function of the
    package the door holds is named in `__all__`."""
    front = importlib.import_module(package)
    served = {name: getattr(front, name) for name in front.__all__}
    lazy = getattr(front, "_HOME", None)
    if lazy is not None:
        # A lazy door holds nothing until asked: what it holds is what its `_HOME` maps, each
        # name to a module of the package that defines it.
        held = set(lazy)
        assert all(
            name in vars(importlib.import_module(f"{package}.{lazy[name]}")) for name in held
        )
    else:
        held = {
            name
            for name, value in vars(front).items()
            if not name.startswith("_")
            and (inspect.isclass(value) or inspect.isfunction(value))
            and value.__module__.startswith(f"{package}.")
        }

    assert held  # a door that holds nothing would pass the rest by default
    assert len(served) == len(front.__all__)  # no name twice
    homes = {name: _home(package, name, value) for name, value in served.items()}
    assert all(home.startswith(f"{package}.") for home in homes.values()), homes
    assert held <= set(served)
    if lazy is not None:
        assert set(served) == held  # nothing in `__all__` that the door cannot find


def test_the_activities_front_door_loads_nothing_until_asked() -> None:
    loaded = _modules_loaded_by("import activities")

    assert not loaded & {"psycopg", "temporalio"}


def test_a_production_worker_never_loads_the_dev_harness() -> None:
    loaded = _modules_loaded_by("import worker, purge_ops.runner, purge_ops.passes")

    assert "purge_ops" in loaded
    assert "purge_dev" not in loaded
