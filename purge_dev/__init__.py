"""The dev harness: real servers from wheels (embedded PostgreSQL 18, Temporal's dev server), the
demo tables and rows, and `dev` mode. Used by `python worker.py dev`, the tests and bench/; a
production worker never imports it."""
