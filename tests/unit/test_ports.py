"""purge_ops.ports.free_ports without a server: the port a worker takes for its runtime's own
metrics, and those the dev harness and the tests take for the servers they start. The kernel's
ephemeral range is read from a file of the test's own, so what is chosen does not hang on the
machine's."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from purge_ops import ports
from purge_ops.ports import free_ports


def ephemeral_range(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> None:
    """Make `text` (as /proc/sys/net/ipv4/ip_local_port_range says it) the range free_ports
    reads."""
    source = tmp_path / "ip_local_port_range"
    source.write_text(text)
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", source)


def recorded_binds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The port of every bind free_ports asks for, in order (0: the kernel's pick)."""
    asked: list[int] = []

    class Recording(socket.socket):
        def bind(self, address: Any) -> None:
            asked.append(address[1])
            super().bind(address)

    monkeypatch.setattr(ports, "socket", SimpleNamespace(socket=Recording))
    return asked


@pytest.mark.parametrize(
    ("given", "chosen_from"),
    [
        # Linux's default range shape: more room below it (down to 10000) than above it.
        ("20000\t60999\n", range(10000, 20000)),
        # Less room below than above: the ports above it.
        ("10500 50000\n", range(50001, 65536)),
    ],
    ids=["below", "above"],
)
def test_ports_are_distinct_bindable_and_outside_the_range_outgoing_connections_take(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, given: str, chosen_from: range
) -> None:
    ephemeral_range(monkeypatch, tmp_path, given)
    asked = recorded_binds(monkeypatch)
    chosen = free_ports(20)
    assert 0 not in asked  # each one picked from outside the range, none left to the kernel
    assert len(set(chosen)) == 20
    assert [port for port in chosen if port not in chosen_from] == []
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


@pytest.mark.parametrize(
    "given",
    [
        None,  # no such file: not Linux
        "1024 65535\n",  # no room outside it at all
        "10500 65000\n",  # room outside it, but under 1000 ports on either side
        "nonsense\n",
    ],
    ids=["absent", "everything", "too_little_room", "unreadable"],
)
def test_without_room_outside_the_range_the_kernel_chooses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, given: str | None
) -> None:
    """Every port is asked of the kernel (bind to port 0), none picked by free_ports itself."""
    if given is None:
        monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", tmp_path / "absent" / "port_range")
    else:
        ephemeral_range(monkeypatch, tmp_path, given)
    asked = recorded_binds(monkeypatch)
    chosen = free_ports(3)
    assert asked == [0, 0, 0]
    assert len(set(chosen)) == 3
    assert 0 not in chosen
