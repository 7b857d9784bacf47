"""The report: one table for a person, one JSON document for a machine."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.forms import LABELS
from bench.orchestration import FORMS as ORCHESTRATION_FORMS
from bench.orchestration import OrchestrationResult
from bench.stats import FormResult

_COLUMNS = (
    ("case", "<"),
    ("table", "<"),
    ("form", "<"),
    ("removed", ">"),
    ("left", ">"),
    ("total s", ">"),
    ("x DELETE", ">"),
    ("stmts", ">"),
    ("p50 ms", ">"),
    ("p99 ms", ">"),
    ("max ms", ">"),
    ("WAL MB", ">"),
    ("writer p99 ms", ">"),
    ("writer p99 due ms", ">"),
    ("writer ops", ">"),
    ("renewed lost", ">"),
    ("notes", "<"),
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _notes(result: FormResult) -> str:
    notes = result.notes
    if result.case == "partitioned":
        parts = []
        if result.form not in ("delete", "hand"):
            parts = [f"strategy={notes.get('strategy')}", f"batches={notes.get('batches')}"]
        if notes.get("partitions"):
            parts.append(f"{notes['partitions']} partitions ({notes.get('partition_rows'):,} rows)")
            done = notes.get("partitions_done_ms")
            if isinstance(done, float):
                parts.append(f"out by {done:.0f} ms")
            parts.append(f"edge {notes.get('edge_removed'):,} rows")
        share = notes.get("wal_share_of_delete")
        if isinstance(share, float) and result.form != "delete":
            parts.append(f"WAL {share:.2%} of (a)")
        x_hand, wal_x_hand = notes.get("x_hand"), notes.get("wal_x_hand")
        if isinstance(x_hand, float) and isinstance(wal_x_hand, float) and result.form != "hand":
            parts.append(f"{x_hand:.2f}x (h), WAL {wal_x_hand:.2f}x (h)")
        if isinstance(notes.get("temporal_ms"), float):
            parts.append(
                f"activity {notes.get('activity_seconds')} s, Temporal's"
                f" {notes['temporal_ms']:.0f} ms"
            )
        parts.append(f"pending {notes.get('pending', 0)}")
        return " ".join(parts)
    if result.case == "archive" and isinstance(notes.get("x_hand"), float):
        # The archive's floor by hand beside the plain DELETE's ratio.
        mine = _notes(replace(result, case=""))
        if result.form in ("delete", "hand_archive"):
            return mine
        return f"{mine}; {notes['x_hand']:.2f}x (h)".lstrip("; ")
    if result.case == "steady":
        per_row = f"{notes.get('us_per_row', 0.0):.2f} us a row (median of rounds); "
        return per_row + _notes(replace(result, case="")).replace("backlog=None", "").strip()
    if result.form == "ours_temporal":
        return (
            f"strategy={notes.get('strategy')} batches={notes.get('batches')}"
            f" p95 batch {notes.get('p95_batch_ms')} ms;"
            f" activity {notes.get('activity_seconds')} s,"
            f" the rest Temporal's ({notes.get('temporal_ms', 0.0):.0f} ms)"
        )
    if result.form.startswith("ours"):
        if not notes.get("per_batch_heartbeats"):
            return "no batch heartbeats: one DELETE per table"
        parts = [f"strategy={notes.get('strategy')}", f"batches={notes.get('batches')}"]
        first = notes.get("first_batch_ms")
        if isinstance(first, float):
            parts.append(f"first batch {first:.1f} ms")
        outside = notes.get("outside_batches_ms")
        if isinstance(outside, float):
            parts.append(f"outside batches {outside:.0f} ms")
        if notes.get("backlog") is not None:
            parts.append(f"backlog={notes['backlog']}")
        if notes.get("advice"):
            parts.append("advice given (see JSON)")
        return " ".join(parts)
    if result.form == "key_in":
        return f"LIMIT {notes.get('limit')}"
    return ""


def _row(result: FormResult) -> list[str]:
    return [
        result.case,
        f"{result.rows:,}/{result.expired:,}",
        LABELS[result.form],
        f"{result.removed:,}",
        f"{result.left:,}",
        f"{result.seconds:.3f}",
        "-" if result.ratio is None else f"{result.ratio:.2f}",
        f"{result.statements:,}",
        _ms(result.p50_ms),
        _ms(result.p99_ms),
        _ms(result.max_ms),
        f"{result.wal_bytes / 1e6:.1f}",
        _ms(result.writer_p99_ms),
        _ms(result.writer_late_p99_ms),
        f"{result.writer_ops:,}",
        f"{result.renewed_lost:,}",
        _notes(result),
    ]


def render_table(header: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> str:
    """A plain aligned text table (markdown-compatible pipes, readable in a terminal)."""
    widths = [len(name) for name, _ in header]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.ljust(w) if align == "<" else cell.rjust(w)
            for cell, w, (_, align) in zip(cells, widths, header, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":" if a == ">" else "-" * (w + 2))
            for w, (_, a) in zip(widths, header, strict=True)
        )
        + "|"
    )
    return "\n".join([line([name for name, _ in header]), rule, *(line(r) for r in rows)])


def forms_table(results: Sequence[FormResult]) -> str:
    return render_table(_COLUMNS, [_row(r) for r in results])


def _scaling_pair(results: Sequence[FormResult]) -> tuple[FormResult, FormResult] | None:
    """Ours on the smallest and on the largest table of the scaling series."""
    ours = sorted(
        (r for r in results if r.case == "scaling" and r.form == "ours"), key=lambda r: r.rows
    )
    if len(ours) < 2 or ours[0].seconds <= 0:
        return None
    return ours[0], ours[-1]


def scaling_line(results: Sequence[FormResult]) -> str | None:
    """Ours on the largest table against ours on the smallest, same expired rows."""
    pair = _scaling_pair(results)
    if pair is None:
        return None
    small, large = pair
    return (
        f"scaling: ours at {large.rows:,} rows {large.seconds:.3f} s vs at {small.rows:,} rows "
        f"{small.seconds:.3f} s: {large.seconds / small.seconds:.2f}x "
        f"(both remove {small.expired:,} expired rows)"
    )


def orchestration_table(result: OrchestrationResult) -> str:
    """Every form's passes, per target, against the sequential pass and the direct floors."""
    header = (
        ("form", "<"),
        ("targets", ">"),
        ("warm-up s", ">"),
        ("runs s", "<"),
        ("median s", ">"),
        ("per target ms", ">"),
        ("x sequential pass", ">"),
        ("x direct", ">"),
        ("x direct 8 at a time", ">"),
        ("CPU s: bench, temporal, postgres", "<"),
    )
    sequential = result.median("sequential")
    floor, floor_8 = result.median("direct"), result.median("direct_8")
    rows = []
    for form, label in ORCHESTRATION_FORMS:
        if form not in result.seconds:
            continue
        median = result.median(form)
        rows.append(
            [
                label,
                str(result.targets),
                f"{result.warmup.get(form, 0.0):.3f}",
                ", ".join(f"{s:.3f}" for s in result.seconds[form]),
                f"{median:.3f}",
                f"{result.per_target_ms(form):.1f}",
                _ratio(median, sequential),
                _ratio(median, floor),
                _ratio(median, floor_8),
                _cpu(result.cpu_median(form)),
            ]
        )
    return render_table(header, rows)


def orchestration_history_table(result: OrchestrationResult) -> str:
    """Where a pass's time went, from its history: the activities against the pass."""
    header = (
        ("pass (last measured)", "<"),
        ("activities", ">"),
        ("workflow ms", ">"),
        ("workflow tasks", ">"),
        ("activity ms p50", ">"),
        ("activity ms sum", ">"),
        ("schedule-to-start ms p50", ">"),
    )
    labels = dict(ORCHESTRATION_FORMS)
    rows = [
        [
            labels[form],
            str(h.activities),
            f"{h.workflow_ms:.0f}",
            str(h.workflow_tasks),
            f"{h.activity_ms_median:.1f}",
            f"{h.activity_ms_sum:.0f}",
            f"{h.schedule_to_start_ms_median:.1f}",
        ]
        for form, h in result.histories.items()
    ]
    return render_table(header, rows)


def orchestration_targets(result: OrchestrationResult) -> list[str]:
    """Issue 11's goal for the concurrent pass: at most 15 ms a target, end to end."""
    lines = []
    for form, label in ORCHESTRATION_FORMS:
        if form.startswith("concurrent") and form in result.seconds:
            value = result.per_target_ms(form)
            verdict = "met" if value <= 15 else "NOT met"
            lines.append(f"{verdict:7} orchestration, {label}: {value:.1f} ms a target (<= 15 ms)")
    return lines


def _cpu(seconds: dict[str, float]) -> str:
    return ", ".join(
        f"{seconds[name]:.2f}" if name in seconds else "-"
        for name in ("bench", "temporal", "postgres")
    )


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base > 0 else "-"


def _find(results: Sequence[FormResult], case: str, form: str) -> FormResult | None:
    found = [r for r in results if r.case == case and r.form == form]
    return max(found, key=lambda r: r.rows) if found else None


def issue_targets(results: Sequence[FormResult]) -> list[str]:
    """The issue's "Targets to reach", each with the figure this run measured."""
    lines: list[str] = []

    def check(what: str, value: float | None, limit: float, unit: str) -> None:
        if value is None:
            return
        verdict = "met" if value <= limit else "NOT met"
        lines.append(f"{verdict:7} {what}: {value:.2f}{unit} (target <= {limit:g}{unit})")

    for case, ratio_limit in (("interleaved", 1.15), ("clustered", 2.0)):
        ours = _find(results, case, "ours")
        if ours is not None:
            check(f"{case}: ours vs single DELETE", ours.ratio, ratio_limit, "x")
            check(f"{case}: ours p99 statement", ours.p99_ms, 25, " ms")
        through = _find(results, case, "ours_temporal")
        if through is not None:
            lines.append(
                f"info    {case}: ours through Temporal vs single DELETE, end to end:"
                f" {through.ratio:.2f}x"
            )
        maker = _find(results, case, "delete_maker")
        if ours is not None and maker is not None and maker.seconds > 0:
            lines.append(
                f"info    {case}: ours vs the DELETE in the session that made the copy:"
                f" {ours.seconds / maker.seconds:.2f}x"
            )
    through = _find(results, "backlog", "ours_temporal")
    if through is not None:
        check("backlog: ours through Temporal vs single DELETE", through.ratio, 1.15, "x")
    alone = _find(results, "backlog", "ours")
    if alone is not None:
        lines.append(f"info    backlog: the activity alone vs single DELETE: {alone.ratio:.2f}x")
    for r in results:
        first = r.notes.get("first_batch_ms") if r.form.startswith("ours") else None
        if isinstance(first, float):
            # The first batch keeps to the batch target (15 ms): "near" it, within 25 ms.
            check(f"{r.case}: {LABELS[r.form]}, first batch", first, 25, " ms")
    ledger = _find(results, "interleaved", "ours")
    bare = _find(results, "interleaved", "ours_no_ledger")
    if ledger is not None and bare is not None and ledger.statements:
        extra = ledger.seconds - bare.seconds
        lines.append(
            f"info    interleaved: the ledger costs {extra:+.3f} s over {ledger.statements} "
            f"batches ({1000 * extra / ledger.statements:+.2f} ms a batch; with it "
            f"{ledger.seconds:.3f} s, without {bare.seconds:.3f} s)"
        )
    for r in results:
        if r.form == "ours" and r.case != "scaling":
            check(
                f"{r.case}: writer p99 during ours ({r.writer_ops} upserts)",
                r.writer_p99_ms,
                10,
                " ms",
            )
    pair = _scaling_pair(results)
    if pair is not None:
        small, large = pair
        check("scaling: ours largest vs smallest table", large.seconds / small.seconds, 3, "x")
    for form in ("drop", "whole"):
        drop = _find(results, "partitioned", form)
        if drop is None:
            continue
        # Against (a) the mechanism's ratios are information: issue 37's goals are against
        # the hand-typed floor (h), printed by `partitioned.partitioned_lines`.
        check(
            f"partitioned: writer p99 during {LABELS[form]} ({drop.writer_ops} inserts)",
            drop.writer_p99_ms,
            10,
            " ms",
        )
    if _find(results, "partitioned", "drop") is not None:
        for r in (x for x in results if x.case == "partitioned"):
            bad = r.renewed_lost + r.left + int(str(r.notes.get("pending", 0)))
            lines.append(
                f"{'met' if not bad else 'NOT met':7} partitioned: {LABELS[r.form]}: "
                f"{r.renewed_lost} live rows lost, {r.left} expired left, "
                f"{r.notes.get('pending', 0)} pending"
            )
    lost = [r for r in results if r.form == "ours" and r.renewed_lost]
    lines.append(
        "met     ours lost no renewed row"
        if not lost
        else "NOT met ours lost renewed rows: "
        + ", ".join(f"{r.case}={r.renewed_lost}" for r in lost)
    )
    return lines


def write_json(
    path: Path,
    environment: dict[str, Any],
    results: Sequence[FormResult],
    runs: Sequence[FormResult],
    orchestration: OrchestrationResult | None,
    fleet: Any = None,
    tenants: Any = None,
    steady: Any = None,
) -> None:
    document = {
        "environment": environment,
        "forms": [asdict(r) for r in results],
        "runs": [asdict(r) for r in runs],
        "orchestration": None
        if orchestration is None
        else {
            **asdict(orchestration),
            "per_target_ms": {
                form: orchestration.per_target_ms(form) for form in orchestration.seconds
            },
        },
        "fleet": None if fleet is None else {**asdict(fleet), "ratios": fleet.ratios},
        "steady_profiles": None if steady is None else [asdict(p) for p in steady.profiles],
        "tenants": None
        if tenants is None
        else {
            **asdict(tenants),
            "per_target_ms": {form: tenants.per_target_ms(form) for form in tenants.forms},
        },
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
