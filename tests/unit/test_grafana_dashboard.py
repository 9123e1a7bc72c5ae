"""The Grafana dashboard and the monitoring stack of docker-compose.yml (examples/monitoring/).

Every query of the dashboard names only metrics and labels the exporter
really exports (taken from celery_dlq.exporter), and parses as PromQL
(``promtool check rules`` on the queries written as recording rules). The
provisioning files, the Prometheus configuration and docker-compose.yml agree
on paths, hosts and the datasource. No Grafana runs here (no Docker, no
Debian package); tests/integration/test_exporter.py runs the real Prometheus.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from celery_dlq.exporter import GAUGES, PREFIX
from celery_dlq.storage.totals import Metric
from tests.services import require_binary

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "examples" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "celery-dlq.json"
PROVISIONING = MONITORING / "grafana" / "provisioning"

#: What the exporter exports: metric name -> its labels (plus the target labels Prometheus adds).
EXPORTED = {PREFIX + name: set(labels) for name, (_, labels) in GAUGES.items()} | \
           {PREFIX + name: set(labels) for name, labels in Metric.LABELS.items()}
TARGET_LABELS = {"job", "instance"}
#: Grafana's variables, as a query would be sent once they are filled in.
VARIABLES = {"$__rate_interval": "1m", "$dlq": ".*", "$queue": ".*"}

SELECTOR = re.compile(r"\b(celery_dlq_[a-z_]+)(?:\{([^}]*)\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
IDENTIFIER = re.compile(r"\b[a-z_][a-z0-9_]*\b")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def targets() -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query of every panel."""
    return [(panel["title"], target["expr"]) for panel in dashboard()["panels"] for target in panel["targets"]]


def filled(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
    return expr


def test_every_query_names_only_exported_metrics_and_their_labels():
    assert targets()
    for title, expr in targets():
        metrics = SELECTOR.findall(expr)
        assert metrics, f"{title}: no celery-dlq metric in {expr!r}"
        labels: set[str] = set(TARGET_LABELS)
        for name, matchers in metrics:
            assert name in EXPORTED, f"{title}: {name} is not exported"
            used = set(MATCHER.findall(matchers))
            assert used <= EXPORTED[name], f"{title}: {name} has no label {used - EXPORTED[name]}"
            labels |= EXPORTED[name]
        for group in GROUPING.findall(expr):
            grouped = {label.strip() for label in group.split(",") if label.strip()}
            assert grouped <= labels, f"{title}: grouping by {grouped - labels}, not labels of its metrics"
        # No other metric: every identifier is a PromQL word or one of the labels above.
        stripped = re.sub(r'"[^"]*"|\[[^]]*\]|\{[^}]*\}', "", filled(expr))
        words = set(IDENTIFIER.findall(stripped)) - {name for name, _ in metrics} - labels
        assert words <= {"sum", "max", "min", "rate", "increase", "by", "without"}, f"{title}: {words}"


def test_every_exported_metric_has_a_panel():
    shown = {name for _, expr in targets() for name, _ in SELECTOR.findall(expr)}
    assert shown == set(EXPORTED)


def test_the_template_variables_read_exported_labels():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert set(variables) == {"datasource", "dlq", "queue"}
    for name in ("dlq", "queue"):
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variables[name]["definition"]).groups()
        assert metric in EXPORTED and label == name and label in EXPORTED[metric]
    assert variables["datasource"]["query"] == "prometheus"


def test_panels_are_well_formed():
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine


def needs_promtool() -> str:
    return require_binary("promtool", "scripts/test.sh installs Debian's prometheus package (apt-get install prometheus)")


def test_every_query_parses_as_promql(tmp_path):
    """``promtool check rules`` parses each query (variables filled in) as a recording rule's expression."""
    rules = [{"record": f"dashboard:query_{i}", "expr": filled(expr)} for i, (_, expr) in enumerate(targets())]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))   # JSON is YAML
    check = subprocess.run([needs_promtool(), "check", "rules", str(path)], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0 and f"SUCCESS: {len(rules)} rules found" in check.stdout, check.stdout + check.stderr


def test_a_query_promtool_rejects_is_caught(tmp_path):
    """The check above can fail: a broken query does not pass it."""
    path = tmp_path / "broken.yml"
    path.write_text(json.dumps({"groups": [{"name": "d", "rules": [
        {"record": "dashboard:broken", "expr": "sum by (dlq (celery_dlq_dead_letters)"}]}]}))
    check = subprocess.run([needs_promtool(), "check", "rules", str(path)], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode != 0


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def mounts(service: str) -> dict[str, str]:
    """``container path -> host path`` (relative to the repository) of a compose service's volumes."""
    out = {}
    for volume in compose()["services"][service]["volumes"]:
        host, container = volume.split(":")[:2]
        out[container] = host.removeprefix("./")
    return out


def test_the_compose_prometheus_loads_the_example_rules_and_scrapes_the_exporter():
    services = compose()["services"]
    prometheus = mounts("prometheus")
    config_path = prometheus["/etc/prometheus/prometheus.yml"]
    config = yaml.safe_load((ROOT / config_path).read_text())
    for rule_file in config["rule_files"]:
        assert (ROOT / prometheus[f"/etc/prometheus/{rule_file}"]) == MONITORING / "celery-dlq.rules.yml"
    (target,) = config["scrape_configs"][0]["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in services and f"--port {port}" in services[host]["command"][-1]
    assert "dlq exporter" in services[host]["command"][-1]
    check = subprocess.run([needs_promtool(), "check", "config", str(ROOT / config_path)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_compose_grafana_provisions_the_datasource_and_the_dashboard():
    grafana = mounts("grafana")
    datasources = yaml.safe_load(
        (ROOT / grafana["/etc/grafana/provisioning/datasources"] / "prometheus.yml").read_text())["datasources"]
    (source,) = datasources
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "prometheus" in compose()["services"]
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == source["uid"]
    providers = yaml.safe_load(
        (ROOT / grafana["/etc/grafana/provisioning/dashboards"] / "celery-dlq.yml").read_text())["providers"]
    (provider,) = providers
    assert provider["type"] == "file"
    assert ROOT / grafana[provider["options"]["path"]] == DASHBOARD.parent
    # Published on the host's loopback only.
    for service in ("grafana", "prometheus", "flower"):
        assert all(port.startswith("127.0.0.1:") for port in compose()["services"][service]["ports"])
