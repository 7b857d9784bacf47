"""A log of the DELETEs a test's sweeps run, as the database saw them: when each began and
ended, for tests of how many sweeps run at once (`tests/test_small_local.py`,
`tests/test_small_together.py`)."""

from __future__ import annotations

from typing import Any

import psycopg


def log_each_delete(conn: psycopg.Connection[Any], prefix: str, tables: list[str]) -> str:
    """Every DELETE statement on these tables (schema-qualified) writes when it began and
    ended to the table returned (`public.PREFIX_log`), in its own transaction (so only
    committed sweeps show), and takes 150 ms: two sweeps run at once overlap there.
    `meet_first` makes the first few meet there. Dropped with `drop_log`."""
    log = f"public.{prefix}_log"
    conn.execute(
        f"CREATE TABLE {log} (pid int NOT NULL, at timestamptz NOT NULL, edge text NOT NULL);"
        f"CREATE SEQUENCE public.{prefix}_arrivals"
    )
    meet_first(conn, prefix, 0)
    for table in tables:
        for edge in ("BEFORE", "AFTER"):
            conn.execute(
                f"CREATE TRIGGER log_{edge.lower()} {edge} DELETE ON {table}"
                f" FOR EACH STATEMENT EXECUTE FUNCTION public.{prefix}_logged()"
            )
    return log


def meet_first(
    conn: psycopg.Connection[Any], prefix: str, meet: int, within_s: float = 0.0
) -> None:
    """From now, the first `meet` DELETEs (counted afresh) each wait, once their start is
    logged, until all `meet` have started (a sequence counts them: it is read across sessions
    at once, not at commit), up to `within_s` (MEETING_S when not given): sweeps run at once
    then overlap in the log however slowly each starts, and sweeps run one after another do
    not meet, waiting out the bound. `meet` 0: none waits."""
    conn.execute(
        f"CREATE OR REPLACE FUNCTION public.{prefix}_logged() RETURNS trigger LANGUAGE plpgsql"
        " AS $$DECLARE arrived bigint; until timestamptz; BEGIN"
        f" INSERT INTO public.{prefix}_log VALUES (pg_backend_pid(), clock_timestamp(), TG_WHEN);"
        " IF TG_WHEN = 'BEFORE' THEN"
        f"  arrived := nextval('public.{prefix}_arrivals');"
        f"  until := clock_timestamp() + interval '{within_s or MEETING_S} s';"
        f"  WHILE arrived <= {meet} AND clock_timestamp() < until"
        f"   AND (SELECT last_value FROM public.{prefix}_arrivals) < {meet} LOOP"
        "   PERFORM pg_sleep(0.01);"
        "  END LOOP;"
        "  PERFORM pg_sleep(0.15);"
        " END IF; RETURN NULL; END$$;"
        f"ALTER SEQUENCE public.{prefix}_arrivals RESTART"
    )


#: How long the first DELETEs wait to meet (seconds): only the end of a run whose sweeps never
#: run at once (its test's sweeps get a statement timeout twice that).
MEETING_S = 60


def took_to_meet(conn: psycopg.Connection[Any], log: str) -> float:
    """Seconds from the first DELETE's start in `log` to the second's: in a run made to meet
    (`meet_first` of 2), how long this machine, as loaded now, took to start a second sweep
    beside the first."""
    [(seconds,)] = conn.execute(
        f"SELECT extract(epoch FROM max(at) - min(at))::float8 FROM (SELECT at FROM {log}"
        " WHERE edge = 'BEFORE' ORDER BY at LIMIT 2) first_two"
    ).fetchall()
    assert seconds is not None, "no DELETE was logged"
    return float(seconds)


def a_second_sweep_s_chance(control_s: float) -> float:
    """How long a first DELETE waits for a second where the sweeps should run one after
    another: ten times what a control run beside a worker without the bound took to start its
    second (`took_to_meet`), and at least a second. A bound that broke lets the second start
    well within it on a machine of any speed; a bound that holds costs the test that long."""
    return min(MEETING_S, max(1.0, 10 * control_s))


def one_at_a_time(log: list[tuple[int, str]]) -> bool:
    """Whether each DELETE's BEFORE in `log` (pid, edge; in time order) is followed by its own
    AFTER, never by another's BEFORE."""
    if len(log) % 2:
        return False
    return all(
        (begin[1], end) == ("BEFORE", (begin[0], "AFTER"))
        for begin, end in zip(log[::2], log[1::2], strict=True)
    )


def drop_log(conn: psycopg.Connection[Any], prefix: str) -> None:
    """What `log_each_delete` made outside the tenants' schemas (their triggers go with them)."""
    conn.execute(
        f"DROP TABLE public.{prefix}_log; DROP FUNCTION public.{prefix}_logged CASCADE;"
        f"DROP SEQUENCE public.{prefix}_arrivals"
    )


def most_at_once(log: list[tuple[int, str]]) -> int:
    """The most DELETEs under way at one moment in `log` (pid, edge; in time order)."""
    running = most = 0
    for _, edge in log:
        running += 1 if edge == "BEFORE" else -1
        most = max(most, running)
    return most
