"""Plain-text tables for a person at a terminal."""

from __future__ import annotations

from collections.abc import Sequence

from activities.clock import iso_ms
from activities.results import PatternLine, PurgeReport, PurgeSweep


def table(
    header: Sequence[str], rows: Sequence[Sequence[object]], right: set[int] | None = None
) -> str:
    """Columns padded to their widest cell; columns in `right` are right-aligned (numbers)."""
    right = right or set()
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        out = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])


def report_table(report: PurgeReport) -> str:
    """A pass's report: one row per target (how it swept, how long any batch held its locks,
    what is left and how old it is, the dead tuples it left), failures named, the total last,
    then any advice. A count that may be short (a lost attempt, no ledger) reads `>=N`, a
    backlog that is an estimate `~N`. When any target took whole partitions out, three more
    columns say how many, their rows and the rows deleted at the edge, and a note names them."""
    verb = "would remove" if report.dry_run else "removed"
    whole = any(partitions_text(s) for s in report.swept)
    extra = 3 if whole else 0
    rows = [_swept_row(s, whole) for s in report.swept]
    for f in report.failed:
        failure = f"FAILED {f.type}: {f.message}"
        rows.append([f.name, "-", "-", "", *[""] * extra, "", "", "", "", "", failure])
    total = f">={report.removed}" if any(s.lower_bound for s in report.swept) else report.removed
    rows.append(["total", total, "", "", *[""] * extra, "", "", "", "", "", _failed(report)])
    head = f"purge pass as of {iso_ms(report.now_ms)}" + (" (dry run)" if report.dry_run else "")
    header = [
        "target", verb, "seconds", "strategy",
        *(["partitions", "their rows", "edge rows"] if whole else []),
        "batches", "p95 ms", "backlog", "oldest expired", "dead", "status",
    ]  # fmt: skip
    right = {1, 2, *range(4 + extra, 9 + extra)}
    if whole:
        right |= {5, 6}
    if any(s.archived for s in report.swept):
        # Only when something moved: a pass without archives reads as it always did.
        archived = [s.archived for s in report.swept] + [""] * len(report.failed)
        for row, count in zip(
            rows, [*archived, sum(s.archived for s in report.swept)], strict=True
        ):
            row.insert(2, count)
        header.insert(2, "archived")
        right = {2} | {c + 1 if c >= 2 else c for c in right}
    lines = [head, *(compact_lines(report) if report.compact else [])]
    return "\n".join([*lines, table(header, rows, right=right), *_notes(report)])


def _swept_row(s: PurgeSweep, whole: bool) -> list[object]:
    batched = bool(s.batches)
    parts: list[object] = (
        [partitions_text(s), s.partition_rows or "", s.edge_removed if s.partition_rows else ""]
        if whole
        else []
    )
    return [
        s.name,
        removed_text(s),
        f"{s.seconds:.3f}",
        s.strategy,
        *parts,
        s.batches if batched else "",
        f"{s.p95_batch_ms:.1f}" if batched else "",
        backlog_text(s) if s.backlog else "",
        oldest_text(s.oldest_expired_age_s),
        dead_text(s) if batched else "",
        _status(s),
    ]


def _notes(report: PurgeReport) -> list[str]:
    """The lines below the table: reasons, partitions taken out, advice, a lower bound."""
    notes = [f"{s.status}: {s.name}: {s.reason}" for s in report.swept if s.reason]
    notes += [partitions_note(s, report.dry_run) for s in report.swept if partitions_text(s)]
    notes += [f"advice: {s.advice}" for s in report.swept if s.advice]
    if any(s.lower_bound for s in report.swept):
        notes.append(LOWER_BOUND_NOTE)
    if any(s.backlog and s.backlog_estimated for s in report.swept):
        notes.append(ESTIMATED_BACKLOG_NOTE)
    if any(s.live_rows_from != "stats" for s in report.swept):
        notes.append(NO_STATISTICS_NOTE)
    return notes


def dead_text(s: PurgeSweep) -> str:
    """The dead tuples' share: `~N%` when the live rows are the planner's estimate, `?` when
    no one knows them (see NO_STATISTICS_NOTE)."""
    if s.dead_tuple_share is None or s.live_rows_from == "unknown":
        return "?"
    return ("~" if s.live_rows_from == "estimate" else "") + f"{s.dead_tuple_share:.0%}"


def compact_lines(report: PurgeReport) -> list[str]:
    """What a pass spread over children adds above its table: the count of targets by how they
    ended, a line per pattern, and which sweeps the table below shows."""
    statuses = ", ".join(f"{n} {status}" for status, n in sorted(report.statuses.items()))
    failed = f", {report.failed_total} failed" if report.failed_total else ""
    lines = [
        f"{report.targets} targets in {len(report.children)} child workflows: "
        f"{statuses or 'none swept'}{failed}"
    ]
    if report.patterns:
        lines.append(patterns_table(report.patterns))
    shown = f"the {len(report.swept)} largest sweeps"
    if report.failed_total > len(report.failed):
        shown += f" and the first {len(report.failed)} of {report.failed_total} failures"
    lines.append(f"{shown} (each table's own record: pg-purge report --tables NAME):")
    return lines


def patterns_table(lines: list[PatternLine]) -> str:
    """One row per pattern target: its tables and how they fared."""
    header = [
        "pattern",
        "tables",
        "removed",
        "failed",
        "busy",
        "gone",
        "skipped",
        "largest backlog",
    ]
    rows: list[list[object]] = [
        [p.name, p.tables, p.removed, p.failed, p.busy, p.gone, p.skipped, p.largest_backlog]
        for p in lines
    ]
    return table(header, rows, right=set(range(1, 8)))


def partitions_text(sweep: PurgeSweep) -> str:
    """`10 dropped`, `2 detached` (in a dry run `would drop 10`, `would detach 2`), or empty
    when no partition left whole."""
    if sweep.partitions_dropped:
        n, done, would = sweep.partitions_dropped, "dropped", "would drop"
    elif sweep.partitions_detached:
        n, done, would = sweep.partitions_detached, "detached", "would detach"
    else:
        return ""
    return f"{would} {n}" if sweep.dry_run else f"{n} {done}"


#: At most this many partition names in a note; the JSON report has them all.
NAMES_SHOWN = 10


def partitions_note(sweep: PurgeSweep, dry_run: bool) -> str:
    """One line naming the partitions a target dropped or detached (or would)."""
    action = "dropped" if sweep.partitions_dropped else "detached"
    if dry_run:
        action = "would drop" if action == "dropped" else "would detach"
    names = sweep.partition_names[:NAMES_SHOWN]
    more = len(sweep.partition_names) - len(names)
    listed = ", ".join(names) + (f" and {more} more" if more > 0 else "")
    return (
        f"partitions: {sweep.name}: {action} {listed} ({sweep.partition_rows:,} rows); "
        f"{sweep.edge_removed:,} rows {'would be ' if dry_run else ''}deleted at the edge"
    )


def _status(sweep: PurgeSweep) -> str:
    if sweep.status != "ok":
        return sweep.status  # skipped (the pass's budget) or busy (another sweep's table)
    return "out of time" if sweep.backlog else "ok"


#: Said under any table holding a `>=N` count.
LOWER_BOUND_NOTE = (
    ">=N: a lower bound: a worker died mid-sweep and the target's database has no "
    "purge_progress ledger (activities/schema.sql) to count every batch from"
)


#: Said under any table whose dead share is an estimate (`~N%`) or not given (`?`): the live
#: rows did not come from the statistics views.
NO_STATISTICS_NOTE = (
    "dead ~N% or ?: PostgreSQL's statistics views held no count of the table (a database made "
    "from a template or restored, after crash recovery, a promoted standby or pg_stat_reset()); "
    "~ is the planner's estimate, ? means no share of the table is given, nor advice from one"
)
#: Said under any table holding a `~N` backlog.
ESTIMATED_BACKLOG_NOTE = (
    "~N: an estimated backlog: a walked table's, from the expired rows in the pages it walked, "
    "or one whose count ran out of time, from the planner's estimate; any other backlog is "
    "counted (up to 1,000,000)"
)


def backlog_text(sweep: PurgeSweep) -> str:
    """Expired rows left, as `~N` when that is an estimate rather than a count."""
    return f"~{sweep.backlog}" if sweep.backlog_estimated else str(sweep.backlog)


def removed_text(sweep: PurgeSweep) -> str:
    """Rows removed, as `>=N` when the count may be short."""
    return f">={sweep.removed}" if sweep.lower_bound else str(sweep.removed)


def oldest_text(age_s: float | None) -> str:
    """How long the oldest expired row left has waited: blank for none, `?` when unknown."""
    if age_s is None:
        return "?"
    return human_duration(age_s * 1000) if age_s > 0 else ""


def _failed(report: PurgeReport) -> str:
    count = max(len(report.failed), report.failed_total)
    return f"{count} failed" if count else ""


def human_duration(ms: float) -> str:
    """`3 h 2 min`, `42 s`, `120 ms`: the two largest units, for reading at a glance."""
    ms = abs(ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    units = [("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)]
    parts: list[str] = []
    rest = int(ms)
    for unit, size in units:
        if rest >= size:
            parts.append(f"{rest // size} {unit}")
            rest %= size
        if len(parts) == 2:
            break
    return " ".join(parts)
