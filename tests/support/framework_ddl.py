"""The documented schemas of frameworks that are not Python (so their own migrations cannot run
here), written as PostgreSQL DDL in this project's own form: the tables, the columns discover
reads and their types as each framework's migration makes them on PostgreSQL, and the indexes
that decide whether a sweep is served.

- GoodJob: its install migration, `lib/generators/good_job/templates/install/migrations/
  create_good_jobs.rb.erb` (github.com/bensheldon/good_job). Rails' `datetime` is
  `timestamp(6) without time zone`, written in UTC.
- Solid Queue: `lib/generators/solid_queue/install/templates/db/queue_schema.rb`
  (github.com/rails/solid_queue); the executions tables reference jobs `ON DELETE CASCADE`.
- Oban: its Postgres migrations V01-V12 (`lib/oban/migrations/postgres/`, hexdocs.pm/oban);
  `utc_datetime_usec` is `timestamp without time zone`, in UTC.
- Laravel: the default application's migrations `0001_01_01_000000_create_users_table.php`
  (sessions), `..._000001_create_cache_table.php` (cache, cache_locks) and
  `..._000002_create_jobs_table.php` (job_batches, failed_jobs) (laravel/laravel, laravel.com/docs).
"""

from __future__ import annotations

GOODJOB = """
CREATE TABLE good_jobs (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  queue_name text, priority integer, serialized_params jsonb,
  scheduled_at timestamp(6), performed_at timestamp(6), finished_at timestamp(6), error text,
  created_at timestamp(6) NOT NULL, updated_at timestamp(6) NOT NULL,
  active_job_id uuid, concurrency_key text, cron_key text, retried_good_job_id uuid,
  cron_at timestamp(6), batch_id uuid, batch_callback_id uuid, is_discrete boolean,
  executions_count integer, job_class text, error_event smallint
);
CREATE INDEX index_good_jobs_on_scheduled_at ON good_jobs (scheduled_at)
  WHERE finished_at IS NULL;
CREATE INDEX index_good_jobs_on_active_job_id_and_created_at
  ON good_jobs (active_job_id, created_at);
CREATE INDEX index_good_jobs_jobs_on_finished_at ON good_jobs (finished_at)
  WHERE retried_good_job_id IS NULL AND finished_at IS NOT NULL;
CREATE TABLE good_job_batches (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  created_at timestamp(6) NOT NULL, updated_at timestamp(6) NOT NULL, description text,
  serialized_properties jsonb, on_finish text, on_success text, on_discard text,
  callback_queue_name text, callback_priority integer, enqueued_at timestamp(6),
  discarded_at timestamp(6), finished_at timestamp(6)
);
CREATE TABLE good_job_executions (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  created_at timestamp(6) NOT NULL, updated_at timestamp(6) NOT NULL,
  active_job_id uuid NOT NULL, job_class text, queue_name text, serialized_params jsonb,
  scheduled_at timestamp(6), finished_at timestamp(6), error text, error_event smallint
);
CREATE INDEX index_good_job_executions_on_active_job_id_and_created_at
  ON good_job_executions (active_job_id, created_at);
"""

SOLID_QUEUE = """
CREATE TABLE solid_queue_jobs (
  id bigserial PRIMARY KEY, queue_name varchar NOT NULL, class_name varchar NOT NULL,
  arguments text, priority integer NOT NULL DEFAULT 0, active_job_id varchar,
  scheduled_at timestamp(6), finished_at timestamp(6), concurrency_key varchar,
  created_at timestamp(6) NOT NULL, updated_at timestamp(6) NOT NULL
);
CREATE INDEX index_solid_queue_jobs_on_finished_at ON solid_queue_jobs (finished_at);
CREATE INDEX index_solid_queue_jobs_for_filtering ON solid_queue_jobs (queue_name, finished_at);
CREATE TABLE solid_queue_failed_executions (
  id bigserial PRIMARY KEY,
  job_id bigint NOT NULL REFERENCES solid_queue_jobs ON DELETE CASCADE,
  error text, created_at timestamp(6) NOT NULL
);
CREATE TABLE solid_queue_blocked_executions (
  id bigserial PRIMARY KEY,
  job_id bigint NOT NULL REFERENCES solid_queue_jobs ON DELETE CASCADE,
  queue_name varchar NOT NULL, priority integer NOT NULL DEFAULT 0,
  concurrency_key varchar NOT NULL, expires_at timestamp(6) NOT NULL,
  created_at timestamp(6) NOT NULL
);
CREATE INDEX index_solid_queue_blocked_executions_for_maintenance
  ON solid_queue_blocked_executions (expires_at, concurrency_key);
CREATE TABLE solid_queue_semaphores (
  id bigserial PRIMARY KEY, key varchar NOT NULL, value integer NOT NULL DEFAULT 1,
  expires_at timestamp(6) NOT NULL,
  created_at timestamp(6) NOT NULL, updated_at timestamp(6) NOT NULL
);
CREATE INDEX index_solid_queue_semaphores_on_expires_at ON solid_queue_semaphores (expires_at);
"""

OBAN = """
CREATE TYPE oban_job_state AS ENUM
  ('available', 'scheduled', 'executing', 'retryable', 'completed', 'discarded', 'cancelled');
CREATE TABLE oban_jobs (
  id bigserial PRIMARY KEY,
  state oban_job_state NOT NULL DEFAULT 'available',
  queue text NOT NULL DEFAULT 'default', worker text NOT NULL,
  args jsonb NOT NULL DEFAULT '{}', errors jsonb[] NOT NULL DEFAULT ARRAY[]::jsonb[],
  attempt integer NOT NULL DEFAULT 0, max_attempts integer NOT NULL DEFAULT 20,
  inserted_at timestamp NOT NULL DEFAULT timezone('UTC', now()),
  scheduled_at timestamp NOT NULL DEFAULT timezone('UTC', now()),
  attempted_at timestamp, completed_at timestamp, attempted_by text[],
  discarded_at timestamp, priority integer NOT NULL DEFAULT 0,
  tags text[] DEFAULT ARRAY[]::text[], meta jsonb DEFAULT '{}', cancelled_at timestamp
);
CREATE INDEX oban_jobs_state_queue_priority_scheduled_at_id_index
  ON oban_jobs (state, queue, priority, scheduled_at, id);
CREATE INDEX oban_jobs_args_index ON oban_jobs USING gin (args);
CREATE INDEX oban_jobs_meta_index ON oban_jobs USING gin (meta);
"""

LARAVEL = """
CREATE TABLE sessions (
  id varchar(255) PRIMARY KEY, user_id bigint, ip_address varchar(45), user_agent text,
  payload text NOT NULL, last_activity integer NOT NULL
);
CREATE INDEX sessions_user_id_index ON sessions (user_id);
CREATE INDEX sessions_last_activity_index ON sessions (last_activity);
CREATE TABLE failed_jobs (
  id bigserial PRIMARY KEY, uuid varchar(255) NOT NULL UNIQUE, connection text NOT NULL,
  queue text NOT NULL, payload text NOT NULL, exception text NOT NULL,
  failed_at timestamp(0) NOT NULL DEFAULT CURRENT_TIMESTAMP
);
CREATE TABLE job_batches (
  id varchar(255) PRIMARY KEY, name varchar(255) NOT NULL, total_jobs integer NOT NULL,
  pending_jobs integer NOT NULL, failed_jobs integer NOT NULL, failed_job_ids text NOT NULL,
  options text, cancelled_at integer, created_at integer NOT NULL, finished_at integer
);
CREATE TABLE cache (key varchar(255) PRIMARY KEY, value text NOT NULL, expiration integer NOT NULL);
CREATE TABLE cache_locks (
  key varchar(255) PRIMARY KEY, owner varchar(255) NOT NULL, expiration integer NOT NULL
);
"""

#: Every published schema above, in one script.
ALL = GOODJOB + SOLID_QUEUE + OBAN + LARAVEL
