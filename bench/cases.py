"""The cases, and how one form is measured on its own copy of a case's data."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from psycopg import AsyncConnection, errors, sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from bench import data as tables
from bench import noise
from bench.data import DAY_MS, Dataset
from bench.forms import (
    FORMS,
    FormContext,
    FormFn,
    Table,
    TemporalPass,
    ours,
    ours_no_ledger,
    single_delete,
)
from bench.stats import FormResult, median_of, summarize
from bench.writer import WriterConfig, running_writer

log = logging.getLogger("bench")


@dataclass(frozen=True)
class Case:
    """Datasets measured with the same forms; ratios are taken within one dataset."""

    name: str
    title: str
    datasets: tuple[Dataset, ...]
    forms: tuple[str, ...]


def build_cases(rows: int) -> dict[str, Case]:
    """Every size derives from `rows`, so `--rows 200000` scales the whole bench down."""
    small = max(rows // 100, 1)
    return {
        "interleaved": Case(
            "interleaved",
            "idempotency, half expired, interleaved with live rows",
            (Dataset("idempotency", rows, rows // 2, "interleaved"),),
            # Without the ledger too: what its upsert costs each batch, side by side.
            ("delete", "ours", "ours_no_ledger", "key_in"),
        ),
        "clustered": Case(
            "clustered",
            "idempotency, 1% expired, in expiry order, expiry index",
            # Live rows a day out: the pass through Temporal, judged at the workflow's later
            # instant, removes the rows the other forms remove.
            (Dataset("idempotency", rows, small, "ordered", live_after_ms=DAY_MS),),
            # Cold too: the first batch must keep to the batch target with nothing cached.
            # And in a new session: what an hourly pass meets (forms.ours_fresh). And the hand
            # DELETE in the session that made the copy, as the floor was measured before. And
            # through Temporal, end to end, as a user meets it (printed beside, no goal).
            (
                "delete",
                "ours",
                "ours_temporal",
                "key_in",
                "delete_cold",
                "ours_cold",
                "delete_fresh",
                "ours_fresh",
                "delete_maker",
            ),
        ),
        "rate_limit": Case(
            "rate_limit",
            "rate-limit buckets, half full, interleaved (no index on the rule)",
            (Dataset("rate_limit", rows, rows // 2, "interleaved"),),
            ("delete", "ours", "key_in"),
        ),
        "scaling": Case(
            "scaling",
            f"the same {small:,} expired rows (in expiry order, indexed) in ever larger tables",
            tuple(
                Dataset("idempotency", size, small, "ordered")
                for size in sorted({small, rows // 10, rows})
            ),
            ("delete", "ours"),
        ),
    }


@dataclass
class Bench:
    """One run's connections and choices, shared by every case."""

    url: str
    schema: str
    now_ms: int
    conn: AsyncConnection[Any]
    """Autocommit; builds the tables (the copies too) and runs the after-checks."""
    pool: AsyncConnectionPool[Any]
    """The package's own pool (purge_ops.connect.open_pool), for our sweep; its search_path
    finds the bench schema's `purge_progress`, so each batch counts in the ledger, as a user's
    sweeps do."""
    writer_rate: float
    checkpoint: bool
    prewarm: bool
    repeat: int = 1
    """Each form runs this many times, each on a fresh copy; the report shows the median."""
    seed: int = 1
    pool_no_ledger: AsyncConnectionPool[Any] | None = None
    """The same without the bench schema on its search_path: no ledger to be found."""
    temporal: TemporalPass | None = None
    """For the `ours_temporal` form: a client, a worker's task queue and the pass's input."""
    evict: bool = False
    """Every form starts with none of its copy in shared_buffers (pg_buffercache), the OS
    cache as the copy left it: not prewarmed, the same for every form."""
    data_dir: Path | None = None
    """The embedded server's data directory (None with --url): its postmaster's pid, for CPU
    figures, and its files, to drop a table from the OS cache."""
    hand: AsyncConnection[Any] | None = None
    """Autocommit, open from the start and given no copy to make: the hand-typed forms run in
    it, as a DBA's session meets a table it did not just create (see `FormContext.conn`)."""
    all_runs: list[FormResult] = field(default_factory=list)
    """Every run of every form, repeats included, for the JSON."""

    @property
    def ledger_url(self) -> str:
        """`url` with the bench schema on its search_path, as `pool` opens its sessions."""
        return schema_first(self.url, self.schema)


def schema_first(url: str, schema: str) -> str:
    """`url` (a URL or a conninfo) whose sessions find `schema` first: a sweep on it counts in
    the bench schema's `purge_progress`, as a user's worker finds theirs."""
    return make_conninfo(url, options=f"-c search_path={schema}")


async def warm_sessions(bench: Bench) -> None:
    """One unmeasured DELETE in the hand session and one sweep on each pool, each on a copy of
    a small table made for it (1,000 idempotency rows in expiry order, half expired). Every
    form then runs in a session that has run one before (the catalog's caches loaded, the
    sweep's statements prepared), as a worker's connection has: without it the first repeat
    of the warm forms timed a session's first statement, which the `_fresh` forms measure
    where it is the point."""
    data = Dataset("idempotency", 1_000, 500, "ordered")
    template, copy = "warm_up_template", "warm_up"
    started = time.perf_counter()
    await tables.build_template(bench.conn, bench.schema, template, data, bench.now_ms)
    context = FormContext(bench.hand or bench.conn, bench.pool, bench.pool_no_ledger)
    runs: list[FormFn] = [single_delete, ours]
    if bench.pool_no_ledger is not None:
        runs.append(ours_no_ledger)
    try:
        for run_form in runs:
            await tables.make_copy(
                bench.conn, bench.schema, template, copy, data, prewarm=bench.prewarm
            )
            try:
                await run_form(context, Table(bench.schema, copy, data, bench.now_ms))
            finally:
                await tables.drop_table(bench.conn, bench.schema, copy)
    finally:
        await tables.drop_table(bench.conn, bench.schema, template)
    log.info("sessions warmed (a DELETE, a sweep) in %.2f s", time.perf_counter() - started)


class Measure(Protocol):
    """How one form is run and measured on a fresh copy of `template`."""

    async def __call__(
        self, bench: Bench, case: Case, data: Dataset, template: str, form: str
    ) -> FormResult: ...


async def run_case(bench: Bench, case: Case, measure: Measure | None = None) -> list[FormResult]:
    """Every form of `case` on every dataset, each on an identical fresh copy (made and
    measured by `measure`, else `measure_form`); each row's ratio is to its dataset's DELETE
    (a cold form's to the cold DELETE)."""
    measure = measure_form if measure is None else measure
    results: list[FormResult] = []
    for n, data in enumerate(case.datasets):
        template = f"tmpl_{case.name}_{n}"
        started = time.perf_counter()
        await tables.build_template(bench.conn, bench.schema, template, data, bench.now_ms)
        log.info(
            "%s: template of %s in %.1f s", case.name, data.label, time.perf_counter() - started
        )
        runs: dict[str, list[FormResult]] = {form: [] for form in case.forms}
        try:
            for repeat in range(bench.repeat):
                # Every other repeat in reverse, so no form always runs first (or last).
                order = case.forms if repeat % 2 == 0 else tuple(reversed(case.forms))
                for form in order:
                    runs[form].append(await measure(bench, case, data, template, form))
        finally:
            await tables.drop_table(bench.conn, bench.schema, template)
        bench.all_runs.extend(r for form in case.forms for r in runs[form])
        measured = [median_of(runs[form]) for form in case.forms]
        bases = {r.form: r for r in measured if r.form.startswith("delete")}
        for result in measured:
            kind = result.form.rpartition("_")[2]
            base = bases.get(f"delete_{kind}" if kind in ("cold", "fresh") else "delete")
            if base is not None and base.seconds > 0:
                result.ratio = result.seconds / base.seconds
        results.extend(measured)
    return results


async def measure_form(
    bench: Bench,
    case: Case,
    data: Dataset,
    template: str,
    form: str,
    forms: Mapping[str, tuple[str, FormFn]] = FORMS,
) -> FormResult:
    """Copy, settle (vacuum, prewarm, checkpoint), then run the form (named in `forms`) beside
    the writer."""
    copy = f"{case.name}_{data.rows}_{form}"
    label, run_form = forms[form]
    started = time.perf_counter()
    cold = form.endswith("_cold")
    await tables.make_copy(
        bench.conn, bench.schema, template, copy, data, prewarm=bench.prewarm and not cold
    )
    try:
        # The ledger as a user's database holds it: empty of this run's passes.
        await bench.conn.execute(
            sql.SQL("TRUNCATE {}").format(sql.Identifier(bench.schema, "purge_progress"))
        )
        if bench.checkpoint:
            # Every form starts right after a checkpoint, so each pays the same full-page
            # images for the first change to every page it touches, as a real sweep would.
            await bench.conn.execute("CHECKPOINT")
        if cold or bench.evict:
            # Cold: from the OS cache too (its files), where the server's files are ours.
            await tables.make_cold(bench.conn, bench.schema, copy, bench.data_dir if cold else None)
        log.info("%s: copy %s ready in %.1f s", case.name, copy, time.perf_counter() - started)
        # The machine's speed just before the form (bench.noise): how far to trust one round.
        probe = noise.probe_ms()
        config = WriterConfig(
            url=bench.url,
            schema=bench.schema,
            table=copy,
            kind=data.kind,
            rows=data.rows,
            expired=data.expired,
            layout=data.layout,
            now_ms=bench.now_ms,
            rate=bench.writer_rate,
            seed=bench.seed,
        )
        async with running_writer(config) as writer:
            lsn_before = await _lsn(bench.conn)
            await writer.go()
            try:
                run = await run_form(
                    FormContext(
                        bench.hand or bench.conn,
                        bench.pool,
                        bench.pool_no_ledger,
                        bench.temporal,
                        url=bench.ledger_url,
                        maker=bench.conn,
                    ),
                    Table(bench.schema, copy, data, bench.now_ms),
                )
            finally:
                writer_run = await writer.stop()
            wal_total = await _wal_since(bench.conn, lsn_before)
        left = await tables.count_expired(bench.conn, bench.schema, copy, data, bench.now_ms)
        lost = await tables.count_missing(bench.conn, bench.schema, copy, writer_run.renewed)
    finally:
        await tables.drop_table(bench.conn, bench.schema, copy)
    result = summarize(
        case.name,
        data.label,
        form,
        data.rows,
        data.expired,
        run,
        writer_run,
        left=left,
        lost=lost,
        wal_total=wal_total,
    )
    result.notes["probe_ms"] = round(probe, 2)
    log.info(
        "%s: %s removed %d in %.3f s (p99 %.1f ms, writer p99 %.1f ms, lost %d)",
        case.name,
        label,
        result.removed,
        result.seconds,
        result.p99_ms or 0.0,
        result.writer_p99_ms or 0.0,
        lost,
    )
    return result


async def _lsn(conn: AsyncConnection[Any]) -> str:
    cur = await conn.execute("SELECT pg_current_wal_lsn()::text")
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def _wal_since(conn: AsyncConnection[Any], lsn: str) -> int:
    cur = await conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (lsn,))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def can_checkpoint(conn: AsyncConnection[Any]) -> bool:
    """CHECKPOINT needs superuser or pg_checkpoint; against a URL the role may have neither."""
    try:
        await conn.execute("CHECKPOINT")
    except errors.InsufficientPrivilege:
        return False
    return True
