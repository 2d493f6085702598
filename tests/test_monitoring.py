"""The monitoring that ships: Prometheus alert rules checked and unit-tested by
promtool (Debian's ``prometheus`` package), a runbook section for every alert,
and a Grafana dashboard whose every query names metrics the service exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.paths import PROJECT_ROOT
from tests.databases import unavailable

MONITORING = PROJECT_ROOT / "docs" / "monitoring"
RULES = MONITORING / "alerts.yml"
RULE_TESTS = MONITORING / "alerts-test.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
RUNBOOK = PROJECT_ROOT / "docs" / "runbook.md"
METRIC = re.compile(r"\blockkeeper_[a-z_]+\b")


def promtool(*args: str) -> subprocess.CompletedProcess:
    found = shutil.which("promtool")
    if found is None:
        unavailable("promtool is not installed (Debian package prometheus)")
    return subprocess.run(
        [found, *args], capture_output=True, text=True, cwd=MONITORING, timeout=120
    )


def alerts() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


@pytest.fixture
def exported(make_app) -> set[str]:
    """Every sample name the service exports: /metrics after a request, and
    /metrics/fleet."""
    client = make_app(LOCKKEEPER_METRICS_PREFIXES="job:").test_client()
    assert client.get("/healthz").status_code == 200
    names = set()
    for path in ("/metrics", "/metrics/fleet"):
        text = client.get(path).get_data(as_text=True)
        for family in text_string_to_metric_families(text):
            names.update(sample.name for sample in family.samples)
    return names


def test_promtool_checks_the_alert_rules():
    result = promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_the_alert_rules_pass_their_unit_tests():
    result = promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_the_issue_asks_for_ship():
    names = {rule["alert"] for rule in alerts()}
    assert {
        "LockkeeperDatabaseDown",
        "LockkeeperLostLocks",
        "LockkeeperStaleLocksGrowing",
        "LockkeeperWaitingRoomFull",
        "LockkeeperHigh5xxRate",
        "LockkeeperLeaderFlapping",
    } <= names


def test_every_alert_fires_in_a_unit_test_and_has_a_runbook_section():
    tested = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tested
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    quiet = {
        case["alertname"]
        for test in tested
        for case in test["alert_rule_test"]
        if not case.get("exp_alerts")
    }
    sections = set(re.findall(r"^## (\w+)$", RUNBOOK.read_text(), re.M))
    for rule in alerts():
        name = rule["alert"]
        assert name in fired, f"{name}: no unit test where it fires"
        assert name in quiet, f"{name}: no unit test where it stays quiet"
        assert name in sections, f"{name}: no section in docs/runbook.md"
        anchor = rule["annotations"]["runbook_url"]
        assert anchor == f"docs/runbook.md#{name.lower()}", name


def test_every_alert_and_dashboard_query_names_exported_metrics(exported):
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]
    assert len(dashboard["panels"]) >= 10
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
    queries += [(rule["alert"], rule["expr"]) for rule in alerts()]
    for where, expr in queries:
        named = set(METRIC.findall(expr))
        assert named, f"{where}: {expr} names no lockkeeper metric"
        assert named <= exported, f"{where}: {sorted(named - exported)} not exported"
