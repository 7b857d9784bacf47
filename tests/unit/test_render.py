"""purge_ops/render.py without a server: the tables a person reads at a terminal.

Columns that only some passes have are tested with the feature that adds them: a short count and
a backlog (tests/test_leftovers.py), archives (tests/test_archive.py), partitions
(tests/test_partitions.py).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from activities.results import FailedTarget, PurgeReport, PurgeSweep
from purge_ops.passes import PassSummary, latest_table
from purge_ops.render import NAMES_SHOWN, human_duration, oldest_text, report_table, table

NOW = 1_700_000_000_000


def row_of(text: str, name: str) -> str:
    [line] = [line for line in text.splitlines() if line.startswith(name + " ")]
    return line


class TestTable:
    def test_columns_are_padded_to_their_widest_cell_and_numbers_right_aligned(self) -> None:
        text = table(["name", "n"], [["a", 1], ["longer", 100]], right={1})

        assert text.splitlines() == [
            "name      n",
            "------  ---",
            "a         1",
            "longer  100",
        ]

    def test_no_line_ends_in_spaces(self) -> None:
        text = table(["a", "b"], [["x", ""], ["", "y"]])

        assert all(line == line.rstrip() for line in text.splitlines())


class TestHumanDuration:
    @pytest.mark.parametrize(
        ("ms", "text"),
        [
            (0, "0 ms"),
            (999.4, "999 ms"),
            (1000, "1 s"),
            (90_000, "1 min 30 s"),
            (3 * 3_600_000 + 2 * 60_000 + 5_000, "3 h 2 min"),  # the two largest units
            (3 * 3_600_000 + 5_000, "3 h 5 s"),  # a unit that is zero is left out
            (2 * 86_400_000 + 3_600_000, "2 d 1 h"),
            (-90_000, "1 min 30 s"),  # a clock behind reads as the same span
        ],
    )
    def test_the_two_largest_units(self, ms: float, text: str) -> None:
        assert human_duration(ms) == text

    def test_oldest_expired_is_blank_for_none_left_and_a_question_mark_when_unknown(self) -> None:
        assert (oldest_text(0.0), oldest_text(None), oldest_text(5400.0)) == ("", "?", "1 h 30 min")


class TestReportTable:
    def test_busy_and_skipped_targets_say_so_with_their_reason_and_are_not_failures(
        self,
    ) -> None:
        report = PurgeReport(
            swept=[
                PurgeSweep(name="a", removed=3, batches=1),
                PurgeSweep(name="b", removed=0, status="busy", reason="another sweep held b"),
                PurgeSweep(name="c", removed=0, status="skipped", reason="the pass's budget"),
            ],
            removed=3,
            now_ms=NOW,
        )

        text = report_table(report)

        assert row_of(text, "a").endswith(" ok")
        assert row_of(text, "b").endswith(" busy")
        assert row_of(text, "c").endswith(" skipped")
        assert "busy: b: another sweep held b" in text.splitlines()
        assert "skipped: c: the pass's budget" in text.splitlines()
        assert re.fullmatch(r"total\s+3", row_of(text, "total"))

    def test_failed_targets_get_a_row_each_and_the_total_counts_them(self) -> None:
        report = PurgeReport(
            swept=[PurgeSweep(name="a", removed=2)],
            removed=2,
            failed=[
                FailedTarget("b", "BadPurgeTarget", "no column x in b"),
                FailedTarget("c", "UnknownPurgeTarget", "no target c"),
            ],
        )

        text = report_table(report)

        assert row_of(text, "b").endswith("FAILED BadPurgeTarget: no column x in b")
        assert re.match(r"c\s+-\s+-\s", row_of(text, "c"))
        assert row_of(text, "total").endswith("2 failed")

    def test_a_dry_run_says_so_in_its_heading_and_header(self) -> None:
        report = PurgeReport(swept=[PurgeSweep(name="a", removed=2)], now_ms=NOW, dry_run=True)

        heading, header = report_table(report).splitlines()[:2]

        assert heading.endswith("(dry run)")
        assert header.startswith("target  would remove")

    @pytest.mark.parametrize("dry_run", [False, True])
    def test_a_dry_runs_partitions_column_says_what_it_would_do(self, dry_run: bool) -> None:
        """A dry run dropped nothing: its table says `would drop 7`, a sweep's `7 dropped`."""
        sweep = PurgeSweep(
            name="logs",
            removed=3_360,
            dry_run=dry_run,
            partitions_dropped=7,
            partition_names=[f"logs_{i}" for i in range(7)],
            partition_rows=3_180,
            edge_removed=180,
        )

        text = report_table(PurgeReport(swept=[sweep], removed=sweep.removed, dry_run=dry_run))

        cells = row_of(text, "logs").split()
        assert ("would drop 7" in " ".join(cells)) == dry_run
        assert ("7 dropped" in " ".join(cells)) == (not dry_run)

    def test_a_partition_note_names_at_most_ten_and_counts_the_rest(self) -> None:
        names = [f"app.p_{i:02}" for i in range(NAMES_SHOWN + 3)]
        sweep = PurgeSweep(
            name="events",
            removed=1_234_567,
            partitions_detached=len(names),
            partition_names=names,
            partition_rows=1_234_000,
            edge_removed=567,
        )

        text = report_table(PurgeReport(swept=[sweep], removed=sweep.removed))

        listed = ", ".join(names[:NAMES_SHOWN])
        assert (
            f"partitions: events: detached {listed} and 3 more (1,234,000 rows); "
            "567 rows deleted at the edge"
        ) in text.splitlines()
        assert "app.p_10" not in text


class TestLastSweeps:
    def test_an_own_targets_last_sweep_shows_its_count_and_nothing_it_did_not_measure(
        self,
    ) -> None:
        """`report`'s last-sweep table, as `sweep`'s: an application's own target (strategy
        custom) returned its count and nothing else was read, so its backlog, oldest expired
        and dead cells stay blank and its count is its own, not one the package calls exact;
        a built-in target's zeros beside it are readings and shown."""
        own = PurgeSweep(name="tmp_uploads", removed=500, strategy="custom")
        built_in = PurgeSweep(name="sessions", removed=25, strategy="index", batches=1)
        done = PassSummary(
            "p", datetime.now(UTC), 1.0, "completed", PurgeReport(swept=[own, built_in], now_ms=NOW)
        )

        text = latest_table([done], ["tmp_uploads", "sessions"])

        assert re.fullmatch(r"tmp_uploads\s+500\s+custom\s+its own", row_of(text, "tmp_uploads"))
        assert re.fullmatch(r"sessions\s+25\s+index\s+0\s+0\s+0%\s+exact", row_of(text, "sessions"))
