"""purge_ops.ports.free_ports without a server: the port a worker takes for its runtime's own
metrics, and those the dev harness and the tests take for the servers they start."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from purge_ops import ports
from purge_ops.ports import free_ports


def test_ports_are_distinct_bindable_and_outside_the_range_outgoing_connections_take() -> None:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    chosen = free_ports(20)
    assert len(set(chosen)) == 20
    assert not [port for port in chosen if low <= port <= high]
    for port in chosen:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_something_listens_on_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "_unclaimed_ports", lambda: range(busy, busy + 1))
        assert free_ports(1) != [busy]  # tried, refused, and the kernel's pick taken instead


def test_without_room_outside_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", Path("/nonexistent/port_range"))
    chosen = free_ports(3)
    assert len(set(chosen)) == 3
