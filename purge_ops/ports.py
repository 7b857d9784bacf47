"""Choosing a port for a server about to start on this machine."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

__all__ = ["free_ports"]

#: Where the kernel reads the ports it hands to outgoing connections (Linux).
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Ports below this are left to the services a machine runs by name.
_LOWEST_CHOSEN = 10000


def _unclaimed_ports() -> range | None:
    """Ports outside the kernel's ephemeral range, or None where it cannot be read. A port the
    kernel picked for bind(0) is one it also gives to outgoing connections: a test's database or
    Temporal client took one between our choosing it and a worker binding it (CI's metrics port,
    "Address already in use")."""
    try:
        low, high = map(int, _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return None
    below = range(_LOWEST_CHOSEN, low)
    above = range(high + 1, 65536)
    widest = below if len(below) >= len(above) else above
    return widest if len(widest) >= 1000 else None


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free right now (held together while chosen, so none repeats),
    outside the ephemeral range where there is room, so no client's connection takes one before
    the server it was chosen for binds it."""
    unclaimed = _unclaimed_ports()
    pick = random.SystemRandom()
    with contextlib.ExitStack() as stack:
        chosen: list[int] = []
        tries = count * 50 if unclaimed else 0
        while len(chosen) < count:
            sock = stack.enter_context(socket.socket())
            port = pick.choice(unclaimed) if unclaimed and tries > 0 else 0  # 0: kernel's pick
            tries -= 1
            try:
                sock.bind((host, port))
            except OSError:
                if port == 0:
                    raise
                continue  # taken; a port already chosen is held, so it is refused here too
            chosen.append(sock.getsockname()[1])
        return chosen
