"""Table patterns in a config, and the compact report of a spread pass: pure code, no server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from activities.input_checks import parse_input
from activities.results import FailedTarget, PurgeSweep
from activities.spread_steps import FAILED_CAP, LARGEST_CAP, ChunkReport
from purge_config.errors import ConfigError
from purge_config.file import parse_config
from purge_config.names import TableName
from purge_config.patterns import TablePattern, parse_table
from purge_ops.checks import check_passes
from tests.support.procs import run_main
from workflows.spread import spreads


def expiring(table: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "expiring", "name": "sessions", "table": table, "column": "expires_at", **extra}


def refused(*targets: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config({"targets": list(targets)}, Path("purge.toml"))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("purge.toml: [[targets]] #")
    return message


class TestPatternConfig:
    @pytest.mark.parametrize("wildcard", ["tenant_?.sessions", "tenant_[0-9].sessions", "t%.s"])
    def test_other_wildcards_are_refused_by_name(self, wildcard: str) -> None:
        message = refused(expiring(wildcard))
        assert "only '*'" in message
        assert wildcard in message

    def test_two_stars_in_one_part_are_refused(self) -> None:
        assert "at most one '*'" in refused(expiring("t_*_*.sessions"))

    @pytest.mark.parametrize("table", ["*.*", "*"])
    def test_a_pattern_matching_everything_needs_allow_any(self, table: str) -> None:
        assert "allow_any = true" in refused(expiring(table))
        config = parse_config({"targets": [expiring(table, allow_any=True)]})
        assert config.targets[0].allow_any is True

    def test_allow_any_without_a_pattern_is_refused(self) -> None:
        assert "only for a table pattern" in refused(expiring("app.sessions", allow_any=True))

    def test_an_archive_star_needs_a_star_in_the_same_part_of_the_pattern(self) -> None:
        message = refused(expiring("app.sessions_*", archive_table="arch_*.sessions"))
        assert "schema part" in message
        # Filled from the match's schema, the same part: accepted.
        parse_config({"targets": [expiring("t_*.sessions", archive_table="t_*.archive")]})

    def test_auth_tables_are_matched_by_the_same_schema(self) -> None:
        entry = {"kind": "auth", "failures_table": "t_*.x_auth_failures"}
        assert "each other table of the target must be one too" in refused(entry)
        config = parse_config({"targets": [{**entry, "lockouts_table": "t_*.x_auth_lockouts"}]})
        spec = config.targets[0].matched("x_auth@t_acme")
        assert spec is not None
        assert spec.tables == (
            TableName("x_auth_failures", "t_acme"),
            TableName("x_auth_lockouts", "t_acme"),
        )

    def test_an_explicit_name_a_match_could_take_is_refused(self) -> None:
        message = refused(
            expiring("tenant_*.sessions"),
            {**expiring("tenant_7.sessions"), "name": "sessions@tenant_7"},
        )
        assert "sessions@tenant_7" in message
        assert "rename one" in message

    def test_the_pass_input_names_the_patterns(self) -> None:
        config = parse_config({"targets": [expiring("tenant_*.sessions"), {"kind": "idempotency"}]})
        request = config.pass_input()
        assert request["targets"] == ["sessions", "x_idempotency"]
        assert request["patterns"] == ["sessions"]
        assert spreads(parse_input(request))


class TestTablePattern:
    def test_a_schema_star_names_the_match_by_its_schema(self) -> None:
        pattern = TablePattern(parse_table("tenant_*.sessions"))
        match = pattern.match("tenant_0042", "sessions")
        assert match is not None
        assert pattern.suffix(match) == "tenant_0042"
        assert pattern.from_suffix("tenant_0042") == match

    def test_two_stars_name_the_match_by_schema_and_table(self) -> None:
        pattern = TablePattern(parse_table("t_*.s_*"))
        match = pattern.match("t_1", "s_a")
        assert match is not None
        assert pattern.suffix(match) == "t_1.s_a"
        assert pattern.from_suffix("t_1.s_a") == match
        assert pattern.from_suffix("t_1") is None

    @pytest.mark.parametrize(
        ("schema", "table"),
        [
            ("pg_catalog", "sessions"),
            ("pg_toast", "sessions"),
            ("pg_temp_3", "sessions"),
            ("information_schema", "sessions"),
            ("tenant_", "sessions"),  # a star matches at least one character
            ("tenant_1", "sessions_old"),
            ("Tenant_1", "sessions"),  # names are exact, case kept
        ],
    )
    def test_what_a_pattern_never_matches(self, schema: str, table: str) -> None:
        assert TablePattern(parse_table("*.sessions")).match(schema, "x") is None
        if not schema.startswith(("pg_", "information")):
            assert TablePattern(parse_table("tenant_*.sessions")).match(schema, table) is None
        else:
            assert TablePattern(parse_table("*.sessions")).match(schema, table) is None

    def test_a_crafted_step_name_builds_no_target_outside_the_pattern(self) -> None:
        config = parse_config({"targets": [expiring("tenant_*.sessions")]})
        spec = config.targets[0]
        assert spec.matched("sessions@tenant_1") is not None
        for name in ("sessions@pg_catalog", "sessions@tenant_1.pg_class", "other@tenant_1"):
            assert spec.matched(name) is None


def sweep(name: str, removed: int, status: str = "ok") -> PurgeSweep:
    return PurgeSweep(name=name, removed=removed, status=status)


class TestChunkReport:
    def test_merging_in_any_order_gives_one_report(self) -> None:
        """Children finish in any order; the pass's report must not depend on it."""
        parts = []
        for child in range(3):
            part = ChunkReport()
            for i in range(50):
                position = child * 50 + i
                name = f"sessions@t_{position}"
                if position % 7 == 0:
                    part.add(position, FailedTarget(name, "BadPurgeTarget", "x"), {"sessions"})
                else:
                    part.add(position, sweep(name, position % 11), {"sessions"})
            parts.append(part)
        one, other = ChunkReport(), ChunkReport()
        for part in parts:
            one.merge(part)
        for part in reversed(parts):
            other.merge(part)
        assert one == other
        assert one.targets == 150
        assert one.failed_total == 22
        assert one.patterns["sessions"].tables == 150
        assert one.patterns["sessions"].failed == 22
        everything = sorted(((-(p % 11), p) for p in range(150) if p % 7), key=lambda k: k)[
            :LARGEST_CAP
        ]
        assert [(-s.sweep.removed, s.position) for s in one.largest] == everything

    def test_failures_beyond_the_cap_are_counted_not_named(self) -> None:
        report = ChunkReport()
        for i in range(FAILED_CAP + 5):
            report.add(i, FailedTarget(f"t{i}", "BadPurgeTarget", "x"), set())
        assert report.failed_total == FAILED_CAP + 5
        assert [f.failure.name for f in report.failures] == [f"t{i}" for i in range(FAILED_CAP)]


class TestPassCheck:
    def test_a_pass_too_large_for_one_input_is_refused_at_start(self) -> None:
        targets = [
            {**expiring(f"t_{i}.sessions"), "name": f"sessions_{i:05d}"} for i in range(15_001)
        ]
        config = parse_config({"targets": targets}, Path("big.toml"))
        with pytest.raises(ConfigError) as err:
            check_passes(config)
        assert str(err.value).startswith("big.toml: every pass of this config would be refused")
        assert "pattern" in str(err.value)

    def test_thousands_of_listed_targets_fit_one_input(self) -> None:
        """10,000 tables listed one by one on two databases: the input names each once and
        stays under Temporal's 512 KB warning."""
        targets = [
            {**expiring(f"t_{i}.sessions"), "name": f"s_{i:05d}", "database": f"db{i // 5000}"}
            for i in range(10_000)
        ]
        config = parse_config(
            {
                "databases": {"db0": {"url": "postgresql:///a"}, "db1": {"url": "postgresql:///b"}},
                "targets": targets,
            }
        )
        check_passes(config)
        request = config.pass_input()
        assert len(json.dumps(request)) < 512 * 1024
        assert request["database_ranges"] == [["db0", 0, 5000], ["db1", 5000, 10_000]]
        order = parse_input(request)
        assert order.database_of("s_04999") == "db0"
        assert order.database_of("s_05000") == "db1"

    def test_a_budget_the_workflow_refuses_is_refused_by_the_command(self, tmp_path: Path) -> None:
        path = tmp_path / "purge.toml"
        path.write_text(
            'database_url = "postgresql:///x"\n[schedule]\ncron = "0 0 * * 0"\n'
            '[pass]\nbudget = "3d"\n[[targets]]\nkind = "idempotency"\n'
        )
        for command in ("schedule", "check"):
            done = run_main(command, "--config", str(path))
            assert done.returncode == 2, command
            [line] = done.stderr.strip().splitlines()
            # Refused as the config is read, by `check` too (which passed it before).
            assert line.endswith("pass.budget: at most 1d, got '3d'"), line
