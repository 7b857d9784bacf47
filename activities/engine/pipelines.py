"""`settled_pipeline`: psycopg's `conn.pipeline()`, with the connection left fit for the next
statement when a statement in it fails.

A batch that runs past its statement_timeout is rolled back whole and its caller goes on (a
narrower span, the boundary read). That holds only if the connection is back out of pipeline
mode with nothing owed when the error reaches the caller. Once in CI (psycopg 3.3.9, libpq 18,
a loaded machine) psycopg's pipeline exit failed with `OperationalError: cannot exit pipeline
mode while busy` in place of the statement's own error, the connection left in pipeline mode
with replies still owed: the caller's fallback then fails too, or, worse, a later pipeline
reads an old statement's replies as its own. As far as psycopg's code shows, its exit reads
the owed replies only until a read finds none waiting, so a reply that arrives after that read
is left; the exact interleaving was not reproduced, and tests make it happen by making that
read find nothing (tests/support/late_results.py).

`settled_pipeline` reads what is still owed up to the Sync's result, leaves pipeline mode, and
raises the statement's own error (so `except QueryCanceled` still catches it). The statements
psycopg meant to prepare in that pipeline may never have reached the server while its cache
counts them prepared: `DEALLOCATE ALL` empties both (psycopg clears its cache when it sees that
command), and they are prepared again at their next use. Where the connection cannot be
settled in time, the exit's error is raised: the attempt fails, and the pool discards the
connection, as before.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection, DatabaseError, Error, OperationalError, generators, pq
from psycopg.abc import PQGen

log = logging.getLogger(__name__)

SETTLE_SECONDS = 10.0
"""How long the results a failed pipeline still owes may take to arrive: past a batch's
statement_timeout the server has nothing left to do but send them."""

_OFF = pq.PipelineStatus.OFF
_SYNC = pq.ExecStatus.PIPELINE_SYNC


@asynccontextmanager
async def settled_pipeline(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """`conn.pipeline()`; when a statement in it fails and psycopg leaves the connection in
    pipeline mode, the connection settled (see the module's docstring) and the statement's own
    error raised. A pipeline inside another is left to the outer one."""
    outermost = conn.pgconn.pipeline_status == _OFF
    try:
        async with conn.pipeline():
            yield
    except Error as exc:
        if not outermost or conn.pgconn.pipeline_status == _OFF or conn.closed:
            raise
        own = _statement_error(exc)
        try:
            await conn.wait(_to_sync(conn.pgconn), timeout=SETTLE_SECONDS)
        except Error as unsettled:  # psycopg's wait timeout is one too
            log.warning("a failed pipeline's connection could not be settled: %s", unsettled)
            raise exc from None
        log.warning(
            "a failed pipeline was left owing results (%s): read them, settled the connection",
            exc,
        )
        # Unprepared on the server those statements psycopg meant to prepare in the failed
        # pipeline may be; psycopg drops its own record of every one on seeing this command.
        await conn.execute("DEALLOCATE ALL")
        raise own from None


def _statement_error(exc: Error) -> Error:
    """The server's error behind `exc`: `exc` itself, or the one psycopg's failed pipeline exit
    replaced (its context)."""
    if exc.sqlstate is not None:
        return exc
    cause = exc.__context__
    if isinstance(cause, DatabaseError) and cause.sqlstate is not None:
        return cause
    return exc


def _to_sync(pgconn: pq.abc.PGconn) -> PQGen[None]:
    """Read and drop what the server still owes an aborted pipeline, up to its last Sync's
    result, then leave pipeline mode."""
    while pgconn.pipeline_status != _OFF:
        results = yield from generators.fetch_many(pgconn)
        if results and not any(r.status == _SYNC for r in results):
            continue  # a statement's replies (or its PIPELINE_ABORTED): dropped
        if not results and pgconn.is_busy():
            continue  # the end of one statement's replies; the next are awaited
        try:
            pgconn.exit_pipeline_mode()
        except OperationalError:
            if not results:
                # Nothing came, nothing is awaited, yet libpq will not leave: not a state
                # this can read its way out of (and reading on would never wait).
                raise
            # A Sync's result with more owed behind it (a transaction's own Sync): read on.
