"""The files an operator drops in (deploy/): the Prometheus rules pass `promtool`'s checks and
their own unit tests, the Grafana dashboard has a panel for each thing it is for and parses as
PromQL, and every metric and label that the rules and the dashboard use is one a real worker
serves, so a renamed metric fails here instead of blanking a panel or an alert."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from temporalio.client import Client

from purge_config.file import load_config
from purge_config.settings import SweepSettings
from purge_config.values import parse_duration
from purge_ops.ports import free_ports
from purge_ops.probes import READY_WITHIN
from purge_ops.runner import GRACEFUL_SHUTDOWN
from tests.support.passes import run_pass
from tests.support.probes import scrape, worker
from tests.support.procs import REPO, worker_config
from tests.support.rows import HOUR, idempotency_rows
from tests.support.servers import RunningTemporal

DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "purge-rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "purge-rules.test.yml"
SCRAPE = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "purge-dashboard.json"
KUBERNETES = DEPLOY / "kubernetes"
OPERATING = REPO / "docs" / "operating.md"
#: Labels Prometheus itself puts on every scraped series; `up` is Prometheus' own metric.
SCRAPE_LABELS = {"instance", "job"}
PROMETHEUS_METRICS = {"up"}


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


def passes_promtool(*args: str, cwd: Path | None = None) -> None:
    """`promtool ARGS` (in `cwd`) passes; its output is the assertion's message."""
    done = subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def check_rules(path: Path) -> None:
    """`promtool check rules PATH` passes."""
    passes_promtool("check", "rules", str(path))


class TestAlertRules:
    def test_rules_are_valid_prometheus_rules(self) -> None:
        check_rules(RULES)

    def test_each_alert_fires_on_its_series_and_stays_quiet_on_near_misses(self) -> None:
        passes_promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)

    def test_every_alert_is_unit_tested_and_carries_a_summary_and_a_runbook(self) -> None:
        """Each alert has a promtool case where it fires (its annotations checked) and one
        where it stays quiet, and a summary and a runbook annotation."""
        rules = RULES.read_text()
        cases = [
            case
            for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
            for case in test.get("alert_rule_test", [])
        ]
        alerts = _alert_names(rules)
        assert len(alerts) >= 6
        for alert in alerts:
            expected = [case["exp_alerts"] for case in cases if case["alertname"] == alert]
            assert [] in expected, f"{alert} has no promtool case where it stays quiet"
            fired = [e for exp in expected for e in exp]
            assert fired, f"{alert} has no promtool case where it fires"
            assert all({"summary", "runbook"} <= set(e["exp_annotations"]) for e in fired), alert
            block = rules.split(f"- alert: {alert}\n", 1)[1].split("- alert:", 1)[0]
            assert "summary:" in block, alert
            assert "runbook:" in block, alert

    def test_the_docs_alert_table_lists_every_alert(self) -> None:
        """docs/operating.md#alerts: one row per alert of the rule file, and no other."""
        section = OPERATING.read_text().split("\n## Alerts\n", 1)[1].split("\n## ", 1)[0]
        listed = re.findall(r"^\| `(\w+)` \|", section, re.M)
        assert sorted(listed) == sorted(_alert_names(RULES.read_text()))

    def test_every_purge_selector_reads_the_pg_purge_job_alone(self) -> None:
        """A second job scraping the same pods (kubernetes-pods, through the Deployment's
        prometheus.io/scrape annotations) must not count a series twice: each purge_* selector
        of the rules and of the dashboard (its target variable too) names job="pg-purge"."""
        assert not unjobbed(rule_expressions() + dashboard_expressions() + dashboard_queries())
        assert unjobbed(['sum(purge_x{job="pg-purge"}) + purge_y + purge_z{target="t"}']) == [
            "purge_y",
            'purge_z{target="t"}',
        ]


def unjobbed(exprs: list[str]) -> list[str]:
    """The purge_* selectors of `exprs` that do not read job="pg-purge"."""
    found: list[str] = []
    for expr in exprs:
        for name, matchers in re.findall(r"\b(purge_\w+)\b(\{[^}]*\})?", expr):
            if not re.search(r'\bjob\s*=\s*"pg-purge"', matchers):
                found.append(name + matchers)
    return found


def _alert_names(rules: str) -> list[str]:
    return [
        line.split(":", 1)[1].strip()
        for line in rules.splitlines()
        if line.strip().startswith("- alert:")
    ]


# -- the names the rules and the dashboard use, against a real worker's /metrics --------------


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def recorded_names() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def dashboard_queries() -> list[str]:
    """The queries of the dashboard's query variables (`label_values(...)`)."""
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    found: list[str] = []
    for variable in variables:
        if variable["type"] == "query":
            query = variable["query"]
            found.append(query["query"] if isinstance(query, dict) else query)
            found.append(variable.get("definition", ""))
    return found


class Uses:
    """What one PromQL expression reads: metric names, label names, and `label="value"` pairs."""

    KEYWORDS = frozenset({"and", "or", "unless", "offset", "bool"})

    def __init__(self, expr: str) -> None:
        text = expr.replace("$__rate_interval", "5m").replace("$period", "3600")
        self.equal = set(re.findall(r'(\w+)\s*=\s*"([^"$]*)"', text))
        self.labels = set(re.findall(r'(\w+)\s*(?:=~|!~|!=|=)\s*"', text))
        for clause in re.findall(
            r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text
        ):
            self.labels |= {name.strip() for name in clause.split(",") if name.strip()}
        text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
        text = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]|\boffset\s+\w+', " ", text)
        self.metrics = {
            name
            for name in re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*)\b(?!\s*\()", text)
            if name not in self.KEYWORDS
        }


def test_the_expression_reader_finds_what_the_files_use() -> None:
    """Not vacuous: the rules and the dashboard read the metrics the docs list."""
    uses = [Uses(e) for e in rule_expressions() + dashboard_expressions()]
    metrics = set().union(*(u.metrics for u in uses))
    labels = set().union(*(u.labels for u in uses))
    assert {
        "purge_rows_removed",
        "purge_target_failures",
        "purge_backlog_rows",
        "purge_oldest_expired_age_seconds",
        "purge_passes_completed",
        "purge_pass_seconds_bucket",
        "purge_target_seconds_bucket",
        "purge_target_last_sweep_timestamp_seconds",
        "up",
    } <= metrics
    assert {"target", "task_queue", "le", "instance", "workflow_type"} <= labels
    assert Uses('sum by (target, le) (rate(x_bucket{a="b"}[5m])) offset 1h').metrics == {"x_bucket"}


#: What the dashboard is for (issue 21), each as the metric one of its panels must read.
DASHBOARD_SHOWS = {
    "rows removed per target": "purge_rows_removed",
    "backlog": "purge_backlog_rows",
    "oldest expired age": "purge_oldest_expired_age_seconds",
    "batch p95": "purge_batch_p95_seconds",
    "pass duration": "purge_pass_seconds_bucket",
    "failures": "purge_target_failures",
}


class TestDashboard:
    def test_a_panel_shows_each_thing_the_dashboard_is_for(self) -> None:
        """Per target where a target has it; the pass duration beside the schedule's period."""
        panels = json.loads(DASHBOARD.read_text())["panels"]
        reads = [[Uses(t["expr"]) for t in panel["targets"]] for panel in panels]
        for what, metric in DASHBOARD_SHOWS.items():
            showing = [uses for uses in reads if any(metric in u.metrics for u in uses)]
            assert showing, f"no panel shows {what}"
            if what != "pass duration":
                assert any("target" in u.labels for u in showing[0]), f"{what}: not per target"
        [durations] = [
            p for p in panels if any("purge_pass_seconds_bucket" in t["expr"] for t in p["targets"])
        ]
        assert "$period" in [t["expr"].strip() for t in durations["targets"]]

    @pytest.mark.parametrize(
        "metric",
        [
            "purge_rows_removed",
            "purge_target_failures",
            "purge_paused_seconds",
            "purge_partitions_removed",
        ],
    )
    def test_a_counter_s_panel_counts_a_new_series_first_value(
        self, tmp_path: Path, metric: str
    ) -> None:
        """A worker's series first scraped at its first value (its sweep added within one
        scrape of the 0 it shows at the sweep's start, or a worker started a moment before):
        the panel's hour counts that value, where `increase()` alone would say 0; a series
        older than the hour counts only what it gained in it. Evaluated by promtool."""
        [expr] = [e for e in dashboard_expressions() if f"({metric}{{" in e]
        series = f'{metric}{{job="pg-purge",instance="w",task_queue="q"'
        tests = {
            "rule_files": [],
            "evaluation_interval": "1m",
            "tests": [
                {
                    "interval": "1m",
                    "input_series": [
                        # New: first scraped at 5 after 70 minutes, then unchanged.
                        {"series": series + ',target="new"}', "values": "_x70 5x50"},
                        # Old: 7 for over an hour, then unchanged.
                        {"series": series + ',target="old"}', "values": "7x120"},
                    ],
                    "promql_expr_test": [
                        {
                            "expr": expr.replace("$target", ".*"),
                            "eval_time": "90m",
                            "exp_samples": [
                                {"labels": '{target="new"}', "value": 5},
                                {"labels": '{target="old"}', "value": 0},
                            ],
                        }
                    ],
                }
            ],
        }
        path = tmp_path / "panel-test.yml"
        path.write_text(yaml.safe_dump(tests))
        passes_promtool("test", "rules", path.name, cwd=tmp_path)

    def test_every_panel_expression_is_valid_promql(self, tmp_path: Path) -> None:
        """Each panel's query, Grafana's variables filled in, as promtool parses a rule's."""
        exprs = [
            expr.replace("$target", ".*").replace("$period", "3600")
            for expr in dashboard_expressions()
        ]
        rules = {
            "groups": [
                {
                    "name": "dashboard",
                    "rules": [
                        {"record": f"dashboard:panel_{i}", "expr": expr}
                        for i, expr in enumerate(exprs)
                    ],
                }
            ]
        }
        path = tmp_path / "dashboard-rules.yml"
        path.write_text(yaml.safe_dump(rules))
        check_rules(path)


async def test_every_metric_and_label_the_rules_and_dashboard_use_is_served(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    client: Client,
    schema_url: str,
    task_queue: str,
    db: psycopg.Connection[Any],
    real_now: int,
) -> None:
    """A worker after one ordinary pass (nothing failed, nothing paused) serves every series."""
    idempotency_rows(db, {"a": real_now - HOUR})
    [port] = free_ports(1)
    targets = '[[targets]]\nkind = "idempotency"\n\n[[targets]]\nkind = "auth"\n'
    config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, targets)
    async with worker(config, temporal_server, port):
        await run_pass(client, task_queue, {"targets": ["x_idempotency", "x_auth"]})
        page = await scrape(port)

    recorded = recorded_names()
    missing: list[str] = []
    for where, exprs in (("rules", rule_expressions()), ("dashboard", dashboard_expressions())):
        for expr in exprs:
            uses = Uses(expr)
            served = [m for m in uses.metrics if m not in PROMETHEUS_METRICS | recorded]
            for metric in served:
                if metric not in page:
                    missing.append(f"{where}: metric {metric} in {expr!r}")
            have = SCRAPE_LABELS.union(*(labels for m in served for labels, _ in page.get(m, [])))
            if uses.metrics & recorded:
                have |= {"target"}  # what the recording rules keep (checked at their source)
            for label in uses.labels - have:
                missing.append(f"{where}: label {label} in {expr!r}")
            for label, wanted in uses.equal:
                values = {labels.get(label) for m in served for labels, _ in page.get(m, [])}
                if label not in SCRAPE_LABELS and served and wanted not in values:
                    missing.append(f"{where}: {label}={wanted!r} matches nothing in {expr!r}")
    assert not missing, "\n".join(missing)


# -- the Kubernetes manifests ----------------------------------------------------------------


#: Past a stopping worker's last statement: its leftover read, the lock let go, and the
#: report to Temporal (a few seconds on a busy node).
REPORT_S = 10.0


def manifest(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((KUBERNETES / name).read_text())
    return loaded


def within(shown: object, real: object) -> bool:
    """Whether `shown` is part of `real`: a mapping's keys with their values (recursively),
    each item of a list somewhere in the real list, any other value equal."""
    if isinstance(shown, dict):
        return isinstance(real, dict) and all(
            key in real and within(value, real[key]) for key, value in shown.items()
        )
    if isinstance(shown, list):
        return isinstance(real, list) and all(any(within(s, r) for r in real) for s in shown)
    return shown == real


def docs_excerpts() -> dict[str, Any]:
    """The YAML blocks of docs/operating.md#kubernetes, by their first line (a comment)."""
    section = OPERATING.read_text().split("\n## Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```yaml\n(.*?)^```", section, re.M | re.S)
    return {block.split("\n", 1)[0]: yaml.safe_load(block) for block in blocks}


class TestScrapeConfig:
    """deploy/prometheus/prometheus.yml: the job the rules and the dashboard read, scraping the
    Deployment's pods on their metrics port, the workers' labels kept as served."""

    def job(self) -> dict[str, Any]:
        [job] = yaml.safe_load(SCRAPE.read_text())["scrape_configs"]
        return dict(job)

    def test_it_scrapes_the_deployment_s_pods_as_the_job_the_rules_read(self) -> None:
        job = self.job()
        assert job["job_name"] == "pg-purge"
        assert job["honor_labels"] is True  # Temporal's `namespace` kept, not renamed
        pod = manifest("deployment.yaml")["spec"]["template"]
        [container] = pod["spec"]["containers"]
        kept = {
            r["source_labels"][0]: r["regex"]
            for r in job["relabel_configs"]
            if r.get("action") == "keep"
        }
        name = pod["metadata"]["labels"]["app.kubernetes.io/name"]
        assert re.fullmatch(kept["__meta_kubernetes_pod_label_app_kubernetes_io_name"], name)
        ports = [port["name"] for port in container["ports"]]
        assert [
            p for p in ports if re.fullmatch(kept["__meta_kubernetes_pod_container_port_name"], p)
        ]
        assert {r.get("target_label") for r in job["relabel_configs"]}.isdisjoint(
            {"namespace", "task_queue", "target", "worker", "job", "instance"}
        )

    def test_promtool_checks_it_with_its_rules(self, tmp_path: Path) -> None:
        """On a copy whose pods are listed by hand: Debian's promtool is built without
        Kubernetes discovery (it refuses `kubernetes_sd_configs`); the rest, the relabelling
        and the rule file it loads, as Prometheus reads them."""
        config = yaml.safe_load(SCRAPE.read_text())
        [job] = config["scrape_configs"]
        del job["kubernetes_sd_configs"]
        job["static_configs"] = [{"targets": ["10.0.0.1:9464"]}]
        config["rule_files"] = [str(RULES)]
        path = tmp_path / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        passes_promtool("check", "config", str(path))
        assert yaml.safe_load(SCRAPE.read_text())["rule_files"] == [RULES.name]


class TestKubernetes:
    @pytest.mark.parametrize("name", sorted(p.name for p in KUBERNETES.glob("*.yaml")))
    def test_manifest_is_valid_against_the_kubernetes_schemas(self, name: str) -> None:
        """Strict: a misspelt or misplaced field fails too (schemas from the wheel, offline)."""
        import kubernetes_validate

        kubernetes_validate.validate(
            manifest(name), kubernetes_validate.latest_version(), strict=True
        )

    def test_probes_are_on_the_worker_s_metrics_port(self) -> None:
        [container] = manifest("deployment.yaml")["spec"]["template"]["spec"]["containers"]
        config = manifest("configmap.yaml")["data"]["purge.toml"]
        port = re.search(r'^metrics = "0\.0\.0\.0:(\d+)"', config, re.M)
        assert port, config
        assert container["ports"] == [{"name": "metrics", "containerPort": int(port[1])}]
        for probe, path in (
            ("livenessProbe", "/livez"),
            ("readinessProbe", "/readyz"),
            ("startupProbe", "/livez"),
        ):
            assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}, probe
        # The kubelet waits longer than a readiness check, so a slow database is named, not
        # reported as the probe's own timeout.
        assert container["readinessProbe"]["timeoutSeconds"] > READY_WITHIN

    def test_the_pods_grace_covers_a_stopping_worker_s_longest(self) -> None:
        """After SIGTERM a worker gives a child's small tables and a pattern's pages its
        graceful shutdown, then their statement in flight (the config's statement_timeout)
        and a report: the kubelet's SIGKILL must come after all of it, or a deploy cuts a
        batch off mid-statement."""
        spec = manifest("deployment.yaml")["spec"]["template"]["spec"]
        config = manifest("configmap.yaml")["data"]["purge.toml"]
        # Any the config sets ([sweep] or a target's own), else the default.
        given = re.findall(r'^statement_timeout = "([^"]+)"', config, re.M)
        statement_ms = max(
            [parse_duration(text) for text in given] or [SweepSettings().statement_timeout_ms]
        )
        longest = GRACEFUL_SHUTDOWN.total_seconds() + statement_ms / 1000 + REPORT_S
        assert spec["terminationGracePeriodSeconds"] >= longest

    def test_config_loads_with_database_urls_from_the_secret(self, tmp_path: Path) -> None:
        """Each url_env of the ConfigMap's config is set from the Secret, and nothing else is."""
        [container] = manifest("deployment.yaml")["spec"]["template"]["spec"]["containers"]
        config = manifest("configmap.yaml")["data"]["purge.toml"]
        from_secrets = {
            env["name"]: env["valueFrom"]["secretKeyRef"]
            for env in container["env"]
            if "valueFrom" in env
        }
        url_envs = set(re.findall(r'^url_env = "(\w+)"', config, re.M))
        assert url_envs
        assert url_envs == set(from_secrets)
        secret = manifest("secret.example.yaml")
        for ref in from_secrets.values():
            assert ref["name"] == secret["metadata"]["name"]
            assert ref["key"] in secret["stringData"]
        assert "postgresql://" not in config  # no URL, so no password, in the ConfigMap

        path = tmp_path / "purge.toml"
        path.write_text(config)
        loaded = load_config(path, env={k: "postgresql://purge@db.internal/app" for k in url_envs})
        assert loaded.metrics == f"0.0.0.0:{container['ports'][0]['containerPort']}"
        assert set(loaded.databases) == {"app"}
        assert container["args"][-2:] == ["--config", "/etc/pg-purge/purge.toml"]
        [mount] = [m for m in container["volumeMounts"] if m["name"] == "config"]
        assert mount["mountPath"] == "/etc/pg-purge"

    def test_the_docs_show_the_manifests_as_they_are(self) -> None:
        """The deploying docs' excerpts: the config with its url_env, and the container with
        that variable from the Secret, its config mount and its three probes, each key and
        value as the manifests have it."""
        excerpts = docs_excerpts()
        [container] = manifest("deployment.yaml")["spec"]["template"]["spec"]["containers"]
        shown = excerpts["# deployment.yaml, the worker's container (abridged)"]
        assert {"env", "volumeMounts", "startupProbe", "livenessProbe", "readinessProbe"} <= set(
            shown
        )
        assert within(shown, container), shown
        config = tomllib.loads(manifest("configmap.yaml")["data"]["purge.toml"])
        shown_config = tomllib.loads(excerpts["# configmap.yaml (abridged)"]["data"]["purge.toml"])
        assert shown_config["databases"]["app"]["url_env"] == shown["env"][0]["name"]
        assert within(shown_config, config), shown_config
