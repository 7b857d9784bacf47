"""The files an operator drops in (deploy/): the Prometheus rules pass `promtool`'s checks and
their own unit tests."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.support.procs import REPO

DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "purge-rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "purge-rules.test.yml"


def promtool() -> str:
    """The promtool executable; skips, saying how to get it, where it is not installed (.ci/run
    installs it as root and sets PURGE_REQUIRE_PROMTOOL=1, which turns the skip into a failure)."""
    found = shutil.which("promtool")
    if found:
        return found
    message = (
        "promtool is not installed, so the alert rules are NOT checked here: "
        "`apt-get install prometheus` (Debian's package; it starts no server) or run .ci/run"
    )
    if os.environ.get("PURGE_REQUIRE_PROMTOOL") == "1":
        pytest.fail(message)
    pytest.skip(message)


class TestAlertRules:
    def test_rules_are_valid_prometheus_rules(self) -> None:
        done = subprocess.run(
            [promtool(), "check", "rules", str(RULES)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def test_each_alert_fires_on_its_series_and_stays_quiet_on_near_misses(self) -> None:
        done = subprocess.run(
            [promtool(), "test", "rules", RULE_TESTS.name],
            cwd=RULE_TESTS.parent,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def test_every_alert_is_unit_tested_and_carries_a_summary_and_a_runbook(self) -> None:
        rules, tests = RULES.read_text(), RULE_TESTS.read_text()
        alerts = _alert_names(rules)
        assert len(alerts) >= 6
        for alert in alerts:
            assert f"alertname: {alert}\n" in tests, f"{alert} has no promtool test"
            block = rules.split(f"- alert: {alert}\n", 1)[1].split("- alert:", 1)[0]
            assert "summary:" in block, alert
            assert "runbook:" in block, alert


def _alert_names(rules: str) -> list[str]:
    return [
        line.split(":", 1)[1].strip()
        for line in rules.splitlines()
        if line.strip().startswith("- alert:")
    ]
