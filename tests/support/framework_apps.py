"""Schemas made by the Python frameworks' own migrations, filled through their own APIs.

Run as `python -m tests.support.framework_apps CONNINFO`, in a process of its own: Django's
settings can be configured once per process, and its ORM refuses to run inside an event loop.
It prints one JSON line: what it made, by key, for the test to compare with `discover`.

- Django sessions and django-celery-results: `migrate`, then sessions through `SessionStore`
  and results through the managers `celery.backend_cleanup` uses (`store_result`,
  `store_group_result`); old ones aged through the ORM.
- Celery's SQLAlchemy result backend: its models create their tables on first use
  (`DatabaseBackend.ResultSession`), results stored by `store_result` and `save_group`.
- procrastinate: `apply_schema`, jobs deferred and run by its own worker; the events of some
  jobs aged by an UPDATE (procrastinate's API has no clock to move).
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.conninfo import conninfo_to_dict

#: Rows made by each framework: (old enough to go under the preset's age, live).
OLD, LIVE = 3, 2


def configure_django(conninfo: str, secret: str) -> None:
    """Django's settings for the sessions and django-celery-results apps on `conninfo`, once a
    process (Django allows no second `settings.configure`)."""
    import django
    from django.conf import settings

    params = conninfo_to_dict(conninfo)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params.get("dbname", ""),
                "USER": params.get("user", ""),
                "PASSWORD": params.get("password", ""),
                "HOST": params.get("host", ""),
                "PORT": str(params.get("port", "")),
            }
        },
        INSTALLED_APPS=["django.contrib.sessions", "django_celery_results"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        SECRET_KEY=secret,
    )
    django.setup()


def django_site(conninfo: str) -> dict[str, Any]:
    from django.core.management import call_command

    configure_django(conninfo, "discover-test")
    call_command("migrate", verbosity=0, interactive=False)

    from django.contrib.sessions.backends.db import SessionStore
    from django_celery_results.models import GroupResult, TaskResult

    now = datetime.now(UTC)
    for i in range(OLD + LIVE):
        store = SessionStore()
        store["i"] = i
        # A datetime expiry is stored as expire_date itself.
        store.set_expiry(now - timedelta(hours=1) if i < OLD else now + timedelta(days=14))
        store.create()
    for i in range(OLD + LIVE):
        TaskResult.objects.store_result(
            "application/json", "utf-8", f"task-{i}", json.dumps(i), "SUCCESS"
        )
        GroupResult.objects.store_group_result(
            "application/json", "utf-8", f"group-{i}", json.dumps([i])
        )
    old = [f"task-{i}" for i in range(OLD)]
    TaskResult.objects.filter(task_id__in=old).update(date_done=now - timedelta(days=2))
    GroupResult.objects.filter(group_id__in=[f"group-{i}" for i in range(OLD)]).update(
        date_done=now - timedelta(days=2)
    )
    return {"django_session": OLD + LIVE, "taskresult": OLD + LIVE, "groupresult": OLD + LIVE}


def celery_database_backend(conninfo: str) -> str:
    """Celery's SQLAlchemy result backend URL (`db+postgresql+psycopg://...`) for `conninfo`."""
    from sqlalchemy.engine import URL

    params = conninfo_to_dict(conninfo)
    url = URL.create(
        "postgresql+psycopg",
        username=params.get("user"),
        password=params.get("password"),
        host=params.get("host"),
        port=int(params["port"]) if params.get("port") else None,
        database=params.get("dbname"),
    )
    return "db+" + url.render_as_string(hide_password=False)


def celery_sqlalchemy(conninfo: str) -> dict[str, Any]:
    from celery import Celery
    from celery.backends.database.models import Task, TaskSet

    app = Celery("discover-test", backend=celery_database_backend(conninfo))
    backend = app.backend
    for i in range(OLD + LIVE):
        backend.store_result(f"sa-task-{i}", i, "SUCCESS")
        backend.save_group(f"sa-group-{i}", app.GroupResult(f"sa-group-{i}", []))
    session = backend.ResultSession()
    try:
        # Celery writes date_done as UTC into a timestamp column; aged the same way.
        then = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=2)
        old = [f"sa-task-{i}" for i in range(OLD)]
        session.query(Task).filter(Task.task_id.in_(old)).update({Task.date_done: then})
        groups = [f"sa-group-{i}" for i in range(OLD)]
        session.query(TaskSet).filter(TaskSet.taskset_id.in_(groups)).update(
            {TaskSet.date_done: then}
        )
        session.commit()
    finally:
        session.close()
    return {"celery_taskmeta": OLD + LIVE, "celery_tasksetmeta": OLD + LIVE}


async def procrastinate_queue(conninfo: str) -> dict[str, Any]:
    import procrastinate
    from psycopg import AsyncConnection

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        ids = [await noop.defer_async(i=i) for i in range(OLD + LIVE)]
        await app.run_worker_async(wait=False)
    async with await AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(
            "UPDATE procrastinate_events SET at = at - interval '3 days' WHERE job_id = ANY(%s)",
            (ids[:OLD],),
        )
    return {"procrastinate_jobs": len(ids)}


def main(conninfo: str) -> None:
    made: dict[str, Any] = {}
    made |= django_site(conninfo)
    made |= celery_sqlalchemy(conninfo)
    made |= asyncio.run(procrastinate_queue(conninfo))
    print(json.dumps(made))


if __name__ == "__main__":
    main(sys.argv[1])
