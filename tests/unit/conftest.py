"""Tests of pure code: no server. Asking for one here fails the test instead of starting it."""

from __future__ import annotations

import pytest


def _no_server() -> None:
    pytest.fail("tests under tests/unit run without a server; move this test out of tests/unit")


@pytest.fixture(scope="session")
def pg_server() -> None:
    _no_server()


@pytest.fixture(scope="session")
def temporal_server() -> None:
    _no_server()


@pytest.fixture(scope="session")
def time_skipping() -> None:
    _no_server()
