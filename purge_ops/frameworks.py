"""The tables `pg-purge discover` recognises by their documented schemas, and what each framework
means by an old row.

Pure data: a table is recognised when its name and every column an entry names are in the
catalog (any schema). Where a config preset (purge_config.presets) says the entry, `kind` names
it and discover prints that one line. Each entry says what the framework's own cleanup does, so
the printed config can say which cleanup a sweep replaces and where its boundary differs
(frameworks delete `< cutoff`; this package's expiry is inclusive, `<=`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from purge_config.settings import EpochUnit

#: What discover does with a recognised table: print a target, print its config preset (a
#: `kind` of purge_config.presets whose rule no column of the table alone says, so it is not
#: counted here), print why no target can say it today, or say the framework keeps the table
#: itself and a sweep must leave it.
Treatment = Literal["target", "preset", "not_expressible", "leave"]


@dataclass(frozen=True)
class Preset:
    """One recognised table and the target (or the reason for none) discover prints for it."""

    framework: str
    table: str
    column: str
    """The column the age is read from (for `leave`, the expiry-like column it has)."""
    meaning: str
    """The framework's own retention meaning, in one sentence."""
    cleanup: str
    """The framework's cleanup this replaces (or that keeps the table)."""
    documented: str
    """Where the table's schema is documented or created."""
    max_age: str = "0s"
    unit: EpochUnit | None = None
    """For an integer epoch column: its unit."""
    match: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """A row filter (`match = { column = [values] }`) the framework's cleanup applies."""
    name: str = ""
    """The target name to suggest; the table's name when empty."""
    kind: str = ""
    """The config preset (purge_config.presets) that says this entry in one line, if any."""
    treatment: Treatment = "target"
    needs: str = ""
    """For `not_expressible` and `leave`: why, and what it would need."""
    shape: tuple[str, ...] = ()
    """Other columns the documented table has, read only to recognise it: a table named
    `sessions` or `cache` is the framework's only when its columns say so."""

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column that must exist for the table to be recognised."""
        return (self.column, *(column for column, _ in self.match), *self.shape)


_DJANGO = "https://docs.djangoproject.com/en/5.2/topics/http/sessions/"
_DCR = "django-celery-results' migrations (django_celery_results/models.py)"
_CELERY_SA = "celery.backends.database.models (Celery's SQLAlchemy result backend)"
_GOODJOB = "GoodJob's install migration (create_good_jobs.rb), github.com/bensheldon/good_job"
_SOLID = "Solid Queue's db/queue_schema.rb, github.com/rails/solid_queue"
_OBAN = "Oban's Postgres migrations (lib/oban/migrations/postgres/), hexdocs.pm/oban"
_LARAVEL = "Laravel's default migrations (0001_01_01_*_create_*_table.php), laravel.com/docs"
_PROCRASTINATE = "procrastinate's sql/schema.sql (procrastinate schema --apply)"

PRESETS: tuple[Preset, ...] = (
    Preset(
        "Django sessions",
        "django_session",
        "expire_date",
        meaning="expire_date is the instant the session expires (SESSION_COOKIE_AGE, two "
        "weeks by default, is already added), so it goes at that instant: max_age 0",
        cleanup="`manage.py clearsessions` (expire_date < now)",
        documented=_DJANGO,
        name="django_sessions",
        kind="django_sessions",
    ),
    Preset(
        "django-celery-results",
        "django_celery_results_taskresult",
        "date_done",
        max_age="1d",
        meaning="a task result is kept for result_expires (Celery's default: 1 day) after "
        "date_done",
        cleanup="`celery.backend_cleanup`, which calls TaskResult.objects.delete_expired "
        "(date_done < now - result_expires)",
        documented=_DCR,
        name="celery_results",
        kind="celery_results",
    ),
    Preset(
        "django-celery-results",
        "django_celery_results_groupresult",
        "date_done",
        max_age="1d",
        meaning="a group result is kept for result_expires (Celery's default: 1 day) after "
        "date_done",
        cleanup="`celery.backend_cleanup` (GroupResult.objects.delete_expired)",
        documented=_DCR,
        name="celery_group_results",
        kind="celery_group_results",
    ),
    Preset(
        "Celery SQLAlchemy result backend",
        "celery_taskmeta",
        "date_done",
        max_age="1d",
        meaning="a task result is kept for result_expires (default 1 day) after date_done, "
        "written in UTC into a timestamp column (read here as UTC)",
        cleanup="`celery.backend_cleanup` (DatabaseBackend.cleanup: date_done < now - expires)",
        documented=_CELERY_SA,
        name="celery_taskmeta",
        kind="celery_taskmeta",
    ),
    Preset(
        "Celery SQLAlchemy result backend",
        "celery_tasksetmeta",
        "date_done",
        max_age="1d",
        meaning="a group (taskset) result is kept for result_expires (default 1 day) after "
        "date_done, in UTC",
        cleanup="`celery.backend_cleanup` (DatabaseBackend.cleanup)",
        documented=_CELERY_SA,
        name="celery_tasksetmeta",
        kind="celery_tasksetmeta",
    ),
    Preset(
        "procrastinate",
        "procrastinate_jobs",
        "status",
        # remove_old_jobs' max_hours has no default, nor the preset's max_age: this one is a
        # suggestion the printed comment says to set.
        max_age="3d",
        meaning="a finished job's age is its newest row in procrastinate_events (at): the "
        "jobs table has no finish time; succeeded jobs only, as remove_old_jobs by default "
        "(widen match.status to failed, cancelled, aborted as its remove_* flags do); its "
        "events go with it (ON DELETE CASCADE). procrastinate has no default age (max_hours "
        "is required): 3d here is a suggestion, set your own",
        cleanup="procrastinate's builtin task `remove_old_jobs` (max_hours; succeeded jobs, "
        "failed/cancelled/aborted when asked)",
        documented=_PROCRASTINATE,
        treatment="preset",
        name="procrastinate",
        kind="procrastinate",
    ),
    Preset(
        "procrastinate",
        "procrastinate_events",
        "at",
        meaning="a job's events tell its age",
        cleanup="removed with their job (ON DELETE CASCADE)",
        documented=_PROCRASTINATE,
        treatment="leave",
        needs="sweeping events by their own age would leave jobs with no age at all",
    ),
    Preset(
        "GoodJob",
        "good_jobs",
        "finished_at",
        max_age="14d",
        meaning="a finished job (succeeded, or discarded: cleanup_discarded_jobs is true by "
        "default) is kept for cleanup_preserved_jobs_before_seconds_ago (14 days)",
        cleanup="GoodJob.cleanup_preserved_jobs (finished_at < now - 14 days), run by the "
        "cleanup_interval_jobs/seconds settings or `good_job cleanup_preserved_jobs`",
        documented=_GOODJOB,
    ),
    Preset(
        "GoodJob",
        "good_job_executions",
        "finished_at",
        meaning="an execution belongs to its job",
        cleanup="GoodJob.cleanup_preserved_jobs deletes a job's executions with it (by "
        "active_job_id; there is no foreign key)",
        documented=_GOODJOB,
        treatment="not_expressible",
        needs="removal with its job, which no target kind does today: an execution's own "
        "finished_at would take the earlier attempts of a job still retrying",
    ),
    Preset(
        "GoodJob",
        "good_job_batches",
        "finished_at",
        max_age="14d",
        meaning="a finished batch is kept as long as a finished job (14 days)",
        cleanup="GoodJob.cleanup_preserved_jobs (batches finished_at < now - 14 days)",
        documented=_GOODJOB,
    ),
    Preset(
        "Solid Queue",
        "solid_queue_jobs",
        "finished_at",
        max_age="1d",
        meaning="a finished job is kept for clear_finished_jobs_after (1 day); failed jobs "
        "have no finished_at and stay, and the executions tables go with their job (ON "
        "DELETE CASCADE)",
        cleanup="SolidQueue::Job.clear_finished_in_batches (the clear_solid_queue_finished_jobs "
        "recurring task: finished_at < now - 1 day)",
        documented=_SOLID,
    ),
    Preset(
        "Solid Queue",
        "solid_queue_blocked_executions",
        "expires_at",
        meaning="expires_at is when a blocked job is released to run, not when it may go",
        cleanup="the dispatcher's concurrency maintenance releases these rows",
        documented=_SOLID,
        treatment="leave",
        needs="deleting one would lose a job that is waiting its turn",
    ),
    Preset(
        "Solid Queue",
        "solid_queue_semaphores",
        "expires_at",
        meaning="a concurrency semaphore held until expires_at",
        cleanup="the dispatcher's concurrency maintenance deletes expired semaphores",
        documented=_SOLID,
        treatment="leave",
        needs="Solid Queue already removes them as part of releasing blocked jobs",
    ),
    *(
        Preset(
            "Oban",
            "oban_jobs",
            column,
            name=f"oban_jobs_{state}",
            max_age="60s",
            match=(("state", (state,)),),
            meaning=f"a {state} job is kept for the Pruner's max_age (60 s by default) after "
            f"{column}{extra}",
            cleanup="Oban.Plugins.Pruner (completed, cancelled and discarded jobs older than "
            "max_age)",
            documented=_OBAN,
        )
        for state, column, extra in (
            (
                "completed",
                "completed_at",
                " (the Pruner reads scheduled_at, which is never later, so a job stays here "
                "at least as long)",
            ),
            ("cancelled", "cancelled_at", ""),
            ("discarded", "discarded_at", ""),
        )
    ),
    Preset(
        "Laravel sessions",
        "sessions",
        "last_activity",
        shape=("payload", "user_agent"),
        unit="s",
        max_age="2h",
        meaning="a session goes SESSION_LIFETIME (120 minutes by default) after its "
        "last_activity (epoch seconds)",
        cleanup="the session handler's garbage collection (DatabaseSessionHandler::gc: "
        "last_activity <= now - lifetime, on the session lottery, 2 requests in 100)",
        documented=_LARAVEL,
    ),
    Preset(
        "Laravel queue",
        "failed_jobs",
        "failed_at",
        shape=("uuid", "exception", "payload"),
        max_age="1d",
        meaning="a failed job is kept for `queue:prune-failed`'s --hours (24 by default) after "
        "failed_at, written in the app's time zone (UTC by default) into a timestamp column",
        cleanup="`php artisan queue:prune-failed` (failed_at < now - 24 hours)",
        documented=_LARAVEL,
    ),
    Preset(
        "Laravel queue",
        "job_batches",
        "finished_at",
        shape=("pending_jobs", "failed_job_ids"),
        unit="s",
        max_age="1d",
        meaning="a finished batch is kept for `queue:prune-batches`' --hours (24 by default) "
        "after finished_at (epoch seconds); unfinished ones have none and stay",
        cleanup="`php artisan queue:prune-batches` (finished_at < now - 24 hours)",
        documented=_LARAVEL,
    ),
    Preset(
        "Laravel cache",
        "cache",
        "expiration",
        shape=("key", "value"),
        unit="s",
        meaning="expiration is the entry's expiry (epoch seconds)",
        cleanup="nothing: the database cache store drops an expired entry only when that key "
        "is read again",
        documented=_LARAVEL,
    ),
    Preset(
        "Laravel cache",
        "cache_locks",
        "expiration",
        shape=("key", "owner"),
        unit="s",
        meaning="expiration is the lock's expiry (epoch seconds)",
        cleanup="the lock store's lottery (DatabaseLock, 2 in 100 acquisitions)",
        documented=_LARAVEL,
    ),
)

_OURS = "pg-purge's built-in kinds"
_OUR_SCHEMA = "this package's activities/schema.sql (pg-purge schema --kinds)"

#: This package's own reference tables: an entry of the kind that sweeps each by its own rule
#: (a full token bucket is no column's instant), named as the kind names it.
BUILTIN: tuple[Preset, ...] = (
    Preset(
        _OURS,
        "x_idempotency",
        "expires_at_ms",
        shape=("key",),
        meaning="the idempotency kind's table: a key goes at its expires_at_ms",
        cleanup="",
        documented=_OUR_SCHEMA,
        name="x_idempotency",
        kind="idempotency",
        treatment="preset",
    ),
    Preset(
        _OURS,
        "x_rate_limit",
        "last_ms",
        shape=("key", "tokens", "capacity", "refill_per_ms"),
        meaning="the rate_limit kind's table: a bucket goes once it has refilled to capacity "
        "(tokens + refill_per_ms x the time since last_ms), when it holds what a new one would",
        cleanup="",
        documented=_OUR_SCHEMA,
        name="x_rate_limit",
        kind="rate_limit",
        treatment="preset",
    ),
    Preset(
        _OURS,
        "x_auth_failures",
        "expires_at_ms",
        shape=("key", "at_ms"),
        meaning="the auth kind's failures table: a failure goes at its expires_at_ms, and the "
        "same entry sweeps x_auth_lockouts by until_ms",
        cleanup="",
        documented=_OUR_SCHEMA,
        name="x_auth",
        kind="auth",
        treatment="preset",
    ),
    Preset(
        "pg-purge's auth kind",
        "x_auth_lockouts",
        "until_ms",
        shape=("key",),
        meaning="the auth kind's lockouts table",
        cleanup="the auth entry of x_auth_failures sweeps it",
        documented=_OUR_SCHEMA,
        treatment="leave",
        needs="its lockouts go at until_ms with that entry, not by one of their own",
    ),
)


def presets_of(table: str, columns: frozenset[str]) -> tuple[Preset, ...]:
    """The presets of a table named `table` whose columns include every column they read."""
    return tuple(p for p in (*PRESETS, *BUILTIN) if p.table == table and set(p.columns) <= columns)
