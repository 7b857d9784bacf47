-- Reference DDL for the built-in targets' tables. The sweep never creates them (nor any table):
-- an application runs this (or its own equivalent) in its migrations. `dev` mode and the
-- tests use it as it is.

CREATE TABLE x_idempotency (
  key           text PRIMARY KEY,
  response      jsonb,
  expires_at_ms bigint NOT NULL
);
CREATE INDEX ON x_idempotency (expires_at_ms);

CREATE TABLE x_rate_limit (
  key           text PRIMARY KEY,
  tokens        double precision NOT NULL,
  capacity      double precision NOT NULL,
  refill_per_ms double precision NOT NULL CHECK (refill_per_ms > 0),
  last_ms       bigint NOT NULL
);
-- No index on the full-again instant: measured here, it turned every bucket update (one per HTTP
-- request) from a HOT update into a full one (WAL per upsert 4.1 KB -> 10.2 KB) and sped the sweep
-- up little. The sweep reads the heap instead.

CREATE TABLE x_auth_failures (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  key           text NOT NULL,
  at_ms         bigint NOT NULL,
  expires_at_ms bigint NOT NULL
);
CREATE INDEX ON x_auth_failures (expires_at_ms);

CREATE TABLE x_auth_lockouts (
  key      text PRIMARY KEY,
  until_ms bigint NOT NULL
);
CREATE INDEX ON x_auth_lockouts (until_ms);

-- The sweep's ledger: rows removed per pass and target, written by the same transaction as each
-- batch's DELETE, so the count stays exact whatever dies (a worker, a connection, the server).
-- A resumed attempt reads it. The sweep removes its own rows 7 days (by the pass's clock) after
-- their pass. Without this table (or INSERT/UPDATE/SELECT/DELETE on it), sweeps still run and
-- count from heartbeats, and say so: after a worker death that count is a lower bound.
CREATE TABLE purge_progress (
  workflow_id text   NOT NULL,
  run_id      text   NOT NULL,
  target      text   NOT NULL,
  now_ms      bigint NOT NULL,
  removed     bigint NOT NULL,
  batches     bigint NOT NULL,
  PRIMARY KEY (workflow_id, run_id, target)
);
-- For removing old passes' rows (once per pass and database) without reading the whole ledger.
CREATE INDEX ON purge_progress (now_ms);

-- The partition advice's memory: per table and pass, the rows the pass removed and the live rows
-- it left, so a table that loses a large share in most of a day's passes is told to partition
-- even when no single pass removed much. One row per table and pass; the sweep removes rows a
-- day (by the pass's clock) after their pass. Without this table (or SELECT/INSERT/UPDATE/DELETE
-- on it), sweeps run as before and that advice is never given.
CREATE TABLE purge_shares (
  target     text   NOT NULL,
  table_name text   NOT NULL,
  now_ms     bigint NOT NULL,
  removed    bigint NOT NULL,
  live       bigint NOT NULL,
  PRIMARY KEY (target, table_name, now_ms)
);
-- For removing old passes' rows (once per pass and database) without reading the whole table.
CREATE INDEX ON purge_shares (now_ms);
