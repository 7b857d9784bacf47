"""The environment a test gives code it runs in its own process (`tests/support/procs.use_env`,
which `run_main` uses): Python's view is set, the C library's is left alone, since setting it
while another thread reads it (Temporal's runtime, libpq) crashed a test worker; and Temporal's
client settings are read from Python's view, so such a test still sets them."""

from __future__ import annotations

import ctypes
import os

import pytest

from purge_ops.connect import temporal_settings
from tests.support.procs import clean_env, use_env

_LIBC = ctypes.CDLL(None)
_LIBC.getenv.restype = ctypes.c_char_p
_LIBC.getenv.argtypes = [ctypes.c_char_p]


def c_getenv(name: str) -> str | None:
    """What the C library's getenv says of `name`: what threads outside Python read."""
    value = _LIBC.getenv(name.encode())
    return value.decode() if value is not None else None


def test_use_env_sets_pythons_view_and_leaves_the_c_librarys() -> None:
    path = c_getenv("PATH")
    with pytest.MonkeyPatch.context() as patch:
        use_env(patch, {"PURGE_ONLY_IN_PYTHON": "1"})

        assert dict(os.environ) == {"PURGE_ONLY_IN_PYTHON": "1"}
        assert c_getenv("PURGE_ONLY_IN_PYTHON") is None
        assert c_getenv("PATH") == path
    assert "PURGE_ONLY_IN_PYTHON" not in os.environ
    assert os.environ.get("PATH") == path


def test_temporal_settings_are_read_from_pythons_view() -> None:
    with pytest.MonkeyPatch.context() as patch:
        use_env(
            patch,
            clean_env(TEMPORAL_ADDRESS="temporal.example:7233", TEMPORAL_NAMESPACE="purge-ns"),
        )
        settings = temporal_settings()

    assert (settings["target_host"], settings["namespace"]) == ("temporal.example:7233", "purge-ns")
