"""Row filters (`match`, `match_null`, `match_not_null`) and archive tables in the config: the
README's forms read as documented, and every bad one is refused with one line naming the file,
the key and the value, before anything connects."""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from pathlib import Path

import pytest

from purge_config.file import load_config
from purge_config.filters import RowFilter
from purge_config.names import TableName
from tests.test_config import assert_one_clear_line, refusal, write

ENV = {"PURGE_DATABASE_URL": "postgresql://purge@db/app"}
JOBS = """
[[targets]]
kind = "expiring"
name = "jobs_done"
table = "jobs"
column = "finished_at"
max_age = "1d"
"""


def jobs(*lines: str) -> str:
    """The `jobs_done` entry with `lines` added."""
    return JOBS + "".join(line + "\n" for line in lines)


def test_the_readme_filters_and_archives_read_as_documented(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        jobs('match = { state = ["completed", "cancelled"] }')
        + """
[[targets]]
kind = "expiring"
name = "jobs_failed"
table = "jobs"
column = "finished_at"
max_age = "30d"
match = { state = "failed", queue = ["mail", "sms"] }
match_null = ["processed_at"]
match_not_null = ["worker"]

[[targets]]
kind = "expiring"
name = "audit"
table = "audit_log"
column = "created_at"
max_age = "90d"
archive_table = "archive.audit_log"

[[targets]]
kind = "idempotency"
archive_table = "archive.x_idempotency"

[[targets]]
kind = "auth"
failures_archive_table = "archive.x_auth_failures"
lockouts_archive_table = "archive.x_auth_lockouts"

[[targets]]
kind = "rate_limit"
""",
    )
    done, failed, audit, idem, auth, rate = load_config(path, env=ENV).targets

    assert done.row_filter == RowFilter(match=(("state", ("completed", "cancelled")),))
    assert failed.row_filter == RowFilter(
        match=(("state", ("failed",)), ("queue", ("mail", "sms"))),
        null=("processed_at",),
        not_null=("worker",),
    )
    assert done.archives == failed.archives == (None,)
    assert audit.row_filter is None
    assert audit.archives == (TableName("audit_log", "archive"),)
    assert idem.archives == (TableName("x_idempotency", "archive"),)
    assert auth.archives == (
        TableName("x_auth_failures", "archive"),
        TableName("x_auth_lockouts", "archive"),
    )
    assert rate.archives == (None,)


def test_every_toml_type_a_column_can_hold_is_kept_as_written(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        jobs(
            "match = { a = true, b = 7, c = 2.5, d = 'x', e = 2026-01-02T03:04:05Z,"
            " f = 2026-01-02, g = 12:30:00, h = [1, 2] }"
        ),
    )
    [spec] = load_config(path, env=ENV).targets

    assert spec.row_filter is not None
    assert dict(spec.row_filter.match) == {
        "a": (True,),
        "b": (7,),
        "c": (2.5,),
        "d": ("x",),
        "e": (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),),
        "f": (date(2026, 1, 2),),
        "g": (time(12, 30),),
        "h": (1, 2),
    }


AT = "[[targets]] #1 (jobs_done)"

#: (the lines added to a valid `expiring` entry, the key the refusal names, the value it shows)
BAD_FILTERS: dict[str, tuple[str, str, str]] = {
    "match-not-a-table": ('match = "state"', f"{AT}: match", "'state'"),
    "match-empty-table": ("match = {}", f"{AT}: match", "{}"),
    "match-nul": ('match = { state = "x\\u0000y" }', f"{AT}: match.state", "cannot hold a NUL"),
    "match-key-dash": ('match = { "job-state" = "x" }', f"{AT}: match.job-state", "'job-state'"),
    "match-key-quote": ('match = { \'st"ate\' = "x" }', f"{AT}: match", "'st\"ate'"),
    "match-key-dotted": ('match = { "a.b" = "x" }', f"{AT}: match.a.b", "'a.b'"),
    "match-key-newline": ('match = { "a\\nb" = "x" }', f"{AT}: match", "'a\\nb'"),
    "match-empty-list": ("match = { state = [] }", f"{AT}: match.state", "empty list"),
    "match-table-value": ("match = { state = { a = 1 } }", f"{AT}: match.state", "{'a': 1}"),
    "match-table-in-list": ('match = { state = ["a", { b = 1 }] }', f"{AT}: match.state", "{'b'"),
    "match-nested-list": ("match = { state = [[1], [2]] }", f"{AT}: match.state", "[1]"),
    "match-local-date-time": (
        "match = { at = 2026-01-02T03:04:05 }",
        f"{AT}: match.at",
        "2026-01-02T03:04:05",
    ),
    "match-mixed-types": ('match = { state = ["a", 1] }', f"{AT}: match.state", "['a', 1]"),
    "match-int-and-bool": ("match = { n = [1, true] }", f"{AT}: match.n", "[1, True]"),
    "match_null-string": ('match_null = "processed_at"', f"{AT}: match_null", "'processed_at'"),
    "match_null-empty": ("match_null = []", f"{AT}: match_null", "[]"),
    "match_null-bad-name": ('match_null = ["a b"]', f"{AT}: match_null", "'a b'"),
    "match_null-twice": ('match_null = ["a", "a"]', f"{AT}: match_null", "'a' appears twice"),
    "match_not_null-int": ("match_not_null = [1]", f"{AT}: match_not_null", "got 1"),
    "null-and-not-null": (
        'match_null = ["a"]\nmatch_not_null = ["b", "a"]',
        f"{AT}: match_not_null",
        "'a' is also in match_null",
    ),
    "match-and-null": (
        'match = { a = "x" }\nmatch_null = ["a"]',
        f"{AT}: match_null",
        "'a' is also in match",
    ),
    "null-expiry-column": (
        'match_null = ["finished_at"]',
        f"{AT}: match_null",
        "'finished_at' is the target's column",
    ),
    "match-with-partitions-drop": (
        'match = { state = "failed" }\npartitions = "drop"',
        f"{AT}: partitions",
        "'drop' takes a partition out whole",
    ),
    "match_null-with-partitions-detach": (
        'match_null = ["processed_at"]\npartitions = "detach"\ndetached_schema = "old"',
        f"{AT}: partitions",
        "'detach' takes a partition out whole",
    ),
    "archive-not-a-name": ('archive_table = "arc.audit log"', f"{AT}: archive_table", "'arc."),
    "archive-three-parts": ('archive_table = "a.b.c"', f"{AT}: archive_table", "'a.b.c'"),
    "archive-empty": ('archive_table = ""', f"{AT}: archive_table", "got ''"),
    "archive-int": ("archive_table = 1", f"{AT}: archive_table", "got 1"),
    "archive-is-the-table": ('archive_table = "jobs"', f"{AT}: archive_table", "'jobs'"),
}


@pytest.mark.parametrize("bad", BAD_FILTERS.values(), ids=BAD_FILTERS.keys())
def test_bad_filter_or_archive_is_refused_with_one_line(
    tmp_path: Path, bad: tuple[str, str, str]
) -> None:
    lines, key, shown = bad
    path = write(tmp_path, jobs(lines))

    assert_one_clear_line(refusal(path, ENV), path, key, shown)


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ('kind = "idempotency"\nmatch = { key = "a" }', "match"),
        ('kind = "idempotency"\nfailures_archive_table = "a.b"', "failures_archive_table"),
        ('kind = "auth"\narchive_table = "a.b"', "archive_table"),
        ('kind = "rate_limit"\nmatch_null = ["key"]', "match_null"),
    ],
)
def test_filter_and_archive_keys_a_kind_does_not_take_are_unknown(
    tmp_path: Path, entry: str, key: str
) -> None:
    path = write(tmp_path, f"[[targets]]\n{entry}\n")

    message = refusal(path, ENV)

    assert f"#1: {key}: unknown key" in message
