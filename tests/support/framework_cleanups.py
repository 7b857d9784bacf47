"""The Python frameworks' own cleanups, run on a database `framework_apps` filled, to compare
with what a preset's sweep removes from an identical copy (tests/test_presets.py).

Run as `python -m tests.support.framework_cleanups extra|clean CONNINFO [widen]`, in a process
of its own (Django's settings are configured once per process):
- `extra`: procrastinate jobs in the states its cleanup tells apart, made by its own worker (a
  failing task, a job cancelled before it ran, one waiting in a queue no worker reads), their
  events aged by an UPDATE as framework_apps ages its own.
- `clean`: `clearsessions`, Celery's `backend_cleanup` through each result backend
  (`app.backend.cleanup()`, what the task calls) and procrastinate's `remove_old_jobs` (its job
  manager's delete_old_jobs, what the builtin task calls) with max_hours 48; `widen` adds
  remove_failed, remove_cancelled and remove_aborted.
"""

from __future__ import annotations

import asyncio
import sys

from tests.support.framework_apps import celery_database_backend, configure_django

#: procrastinate's max_hours in `clean`: a preset's max_age of "2d".
MAX_HOURS = 48


async def extra_jobs(conninfo: str) -> None:
    import procrastinate
    from psycopg import AsyncConnection

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="boom", queue="extra")
    async def boom() -> None:
        raise ValueError("fails, as some jobs do")

    @app.task(name="wait", queue="unread")
    async def wait() -> None:
        return None

    async with app.open_async():
        failed = [await boom.defer_async() for _ in range(2)]
        waiting = await wait.defer_async()
        cancelled = await wait.defer_async()
        await app.job_manager.cancel_job_by_id_async(cancelled)
        await app.run_worker_async(queues=["extra"], wait=False)
    async with await AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(
            "UPDATE procrastinate_events SET at = at - interval '3 days' WHERE job_id = ANY(%s)",
            ([*failed[:1], waiting, cancelled],),
        )


def clean(conninfo: str, widen: bool) -> None:
    from celery import Celery
    from django.core.management import call_command

    configure_django(conninfo, "preset-test")
    call_command("clearsessions", verbosity=0)
    Celery("preset-test", backend="django-db").backend.cleanup()
    Celery("preset-test", backend=celery_database_backend(conninfo)).backend.cleanup()
    asyncio.run(_remove_old_jobs(conninfo, widen))


async def _remove_old_jobs(conninfo: str, widen: bool) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    async with app.open_async():
        await app.job_manager.delete_old_jobs(
            nb_hours=MAX_HOURS,
            include_failed=widen,
            include_cancelled=widen,
            include_aborted=widen,
        )


if __name__ == "__main__":
    if sys.argv[1] == "extra":
        asyncio.run(extra_jobs(sys.argv[2]))
    else:
        clean(sys.argv[2], widen=sys.argv[3:] == ["widen"])
