"""A worker with its metrics port, in this process; requests to that port as probes send them."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from purge_config.file import load_config
from purge_ops.runner import run_worker
from tests.support.procs import clean_env, use_env
from tests.support.servers import RunningTemporal


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: str


async def http(port: int, path: str, method: str = "GET", raw: bytes | None = None) -> Reply:
    """One request to 127.0.0.1:`port`, as a probe sends it (or `raw` bytes as they are)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        request = raw or f"{method} {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe\r\n\r\n"
        writer.write(request.encode() if isinstance(request, str) else request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    return Reply(int(status_line.split()[1]), headers, body.decode())


@contextlib.asynccontextmanager
async def worker(
    config: Path, temporal: RunningTemporal, port: int, **env: str
) -> AsyncIterator[asyncio.Task[None]]:
    """`run_worker` for `config` with its metrics port at 127.0.0.1:`port`, until the block ends;
    `env` adds to the environment it reads (TEMPORAL_NAMESPACE, say)."""
    stop = asyncio.Event()
    with pytest.MonkeyPatch.context() as patch:
        use_env(patch, clean_env(**env))
        task = asyncio.create_task(
            run_worker(
                load_config(config),
                stop=stop,
                temporal_address=temporal.address,
                metrics=f"127.0.0.1:{port}",
            )
        )
        try:
            await until_ready(port, task)
            yield task
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)


async def until_ready(port: int, task: asyncio.Task[None], want: str = "/livez") -> None:
    """Wait for the worker's port to answer `want` with its pollers started."""
    for _ in range(600):
        if task.done():
            task.result()
        with contextlib.suppress(OSError):
            if (await http(port, "/readyz")).body.strip() != "not ready: starting":
                return
        await asyncio.sleep(0.05)
    raise AssertionError("the worker's metrics port never came up")


def samples(page: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A Prometheus text page as {series name: [(labels, value), ...]}."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in page.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        if match:
            labels = dict(
                re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', match[2] or "")
            )
            found.setdefault(match[1], []).append((labels, float(match[3])))
    return found


async def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    reply = await http(port, "/metrics")
    assert reply.status == 200, reply.body
    return samples(reply.body)
