"""The shipped Grafana dashboard (docs/grafana/gpupool.json) and alert rules (docs/prometheus/alerts.yml) ask
only for series and labels the head exports, honour the dashboard's $node and $queue, and are valid PromQL;
the utilization-by-queue panel attributes a shared GPU to each of its holders."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.control.health import HealthMonitor
from gpupool.control.metrics import Metrics
from gpupool.control.telemetry import TelemetryCache
from gpupool.gpu.types import GpuSample
from gpupool.health.thresholds import HealthConfig
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Gpu, Node, Workload
from tests.support.prometheus import promtool

DOCS = Path(__file__).resolve().parents[3] / "docs"
DASHBOARD = json.loads((DOCS / "grafana" / "gpupool.json").read_text())
RULES = yaml.safe_load((DOCS / "prometheus" / "alerts.yml").read_text())
NAME = re.compile(r"\b(DCGM_\w+|gpupool_\w+)\b(\{[^}]*\})?")
MATCHER = re.compile(r"(\w+)\s*(=~|!~|!=|=)\s*\"([^\"]*)\"")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
VARIABLES = {"Hostname": "$node", "node": "$node", "queue": "$queue"}  # label -> the variable that filters it


def panel_queries() -> Iterator[tuple[str, str, str]]:
    """(where, expr, legendFormat) of every target of the dashboard."""
    for panel in DASHBOARD["panels"]:
        for target in panel["targets"]:
            where = f"panel {panel['id']} ({panel['title']}) {target['refId']}"
            yield where, target["expr"], target.get("legendFormat", "")


def alerts() -> Iterator[dict[str, Any]]:
    for group in RULES["groups"]:
        yield from group["rules"]


def sample(index: int, utilization: float) -> dict[str, object]:
    return GpuSample(index=index, uuid=f"GPU-{index}", at=0.0, utilization_pct=utilization,
                     memory_used_bytes=1 << 30, memory_total_bytes=80 << 30, temperature_c=60.0,
                     power_w=300.0, energy_j=10.0, sm_clock_mhz=1980.0, mem_clock_mhz=2619.0,
                     memory_temperature_c=50.0).to_dict()  # fmt: skip


def add(s: Any, queue: str, user: str, node: str, indices: list[int], fraction: float = 0.0,
        kind: str = "job", spec: dict[str, Any] | None = None, stopping: bool = False) -> None:  # fmt: skip
    workload = Workload(name=f"{queue}-{user}", kind=kind, queue=queue, user=user, spec=spec or {},
                        state="running", version=1)  # fmt: skip
    s.add(workload)
    s.flush()
    now = datetime.now(UTC)
    stop = {"stop_requested_at": now, "stop_reason": "preempt"} if stopping else {}
    s.add(Attempt(workload_id=workload.id, queue=queue, number=0, state="running", node_name=node,
                  gpu_indices=indices, gpu_fraction=fraction, started_at=now, **stop))  # fmt: skip


@pytest.fixture
def exported(store: Store) -> list[tuple[str, dict[str, str], float]]:
    """Every sample a head exports with node-1's 2 GPUs busy (GPU 0 whole for nlp/alice at 20%, GPU 1 shared
    by nlp/alice and cv/bob at 80%), one GPU held on a node gpupool has no telemetry of (Slurm's), a service,
    pending work and work asked to stop."""
    with store.session() as s:
        for name, gpus in (("node-1", 2), ("slurm-1", 1)):
            node = Node(name=name, state="ready", state_reason="", labels={})
            s.add(node)
            s.flush()
            for index in range(gpus):
                s.add(Gpu(node_id=node.id, index=index, uuid=f"GPU-{index}", model="H100",
                          product_name="NVIDIA H100 80GB HBM3"))  # fmt: skip
        add(s, "nlp", "alice", "node-1", [0])
        add(s, "nlp", "alice", "node-1", [1], fraction=0.5)
        add(s, "cv", "bob", "node-1", [1], fraction=0.5, stopping=True)
        add(s, "nlp", "alice", "slurm-1", [0])
        add(s, "default", "carol", "node-1", [], kind="service", spec={"readiness_probe": "/"})
        s.add(Workload(name="waits", queue="nlp", user="alice", spec={}, gpus="16", version=1))
    telemetry = TelemetryCache()
    telemetry.put("node-1", [sample(0, 20.0), sample(1, 80.0)])
    health = HealthMonitor(store, telemetry, HealthConfig({}), local_node="node-1", local_gpus=None)
    metrics = Metrics(store, telemetry, health, dict)
    metrics.cycle_seconds.observe(0.01)
    return [(s.name, s.labels, s.value) for family in metrics.registry.collect() for s in family.samples]


def label_names(exported: list[tuple[str, dict[str, str], float]]) -> dict[str, set[str]]:
    labels: dict[str, set[str]] = {}
    for name, found, _ in exported:
        labels.setdefault(name, set()).update(found)
    return labels


def listed(text: str, pattern: str) -> set[str]:
    """The labels of every `keyword (a, b)` list in `text` that `pattern` finds."""
    return {label.strip() for group in re.findall(pattern, text) for label in group.split(",")} - {""}


def test_the_dashboard_and_the_alerts_ask_only_for_series_and_labels_the_head_exports(
    exported: list[tuple[str, dict[str, str], float]],
) -> None:
    labels = label_names(exported)
    shown_by_alert = {
        f"alert {r['alert']}": {
            m for text in r.get("annotations", {}).values() for m in re.findall(r"\$labels\.(\w+)", text)
        }
        for r in alerts()
    }
    queries = [*panel_queries(), *((f"alert {r['alert']}", r["expr"], "") for r in alerts())]
    for variable in DASHBOARD["templating"]["list"]:
        if variable["type"] == "query":  # label_values(METRIC, LABEL)
            found = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"])
            assert found, variable["query"]
            metric, label = found.groups()
            queries.append((f"variable {variable['name']}", f'{metric}{{{label}=""}}', ""))
    wrong: list[str] = []
    for where, expr, legend in queries:
        known: set[str] = set(re.findall(r'label_replace\([^,]+,\s*"(\w+)"', expr))  # labels it makes
        for name, selector in NAME.findall(expr):
            if name not in labels:
                wrong.append(f"{where}: {name} is not exported")
                continue
            known |= labels[name]
            wrong += [f"{where}: {name} has no label {label}"
                      for label, _, _ in MATCHER.findall(selector) if label not in labels[name]]  # fmt: skip
        grouped = listed(expr, GROUPING.pattern)
        wrong += [f"{where}: no series of it has label {label}" for label in sorted(grouped - known)]
        by = listed(expr, r"\bby\s*\(([^)]*)\)")
        shown = shown_by_alert.get(where) or set(re.findall(r"\{\{(\w+)\}\}", legend))
        wrong += [f"{where}: shows {label}, which its result lacks"
                  for label in sorted(shown - (by or known))]  # fmt: skip
    assert not wrong, "\n".join(wrong)


def test_every_panel_honours_the_node_and_queue_variables(
    exported: list[tuple[str, dict[str, str], float]],
) -> None:
    labels = label_names(exported)
    ignored = []
    for where, expr, _ in panel_queries():
        for name, selector in NAME.findall(expr):
            matchers = set(MATCHER.findall(selector))
            ignored += [
                f'{where}: {name} without {label}=~"{variable}"'
                for label, variable in VARIABLES.items()
                if label in labels.get(name, ()) and (label, "=~", variable) not in matchers
            ]
    assert not ignored, "\n".join(ignored)


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"panel_{i}", "expr": expr.replace("$node", ".*").replace("$queue", ".*")}
        for i, (_, expr, _) in enumerate(panel_queries())
    ]}]}  # fmt: skip
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_utilization_by_queue_weighs_each_gpu_by_the_part_each_holder_has(
    exported: list[tuple[str, dict[str, str], float]], tmp_path: Path
) -> None:
    """Through Prometheus' own evaluator (`promtool test rules`), over the series exported above: nlp/alice
    holds GPU 0 (20%) and half of GPU 1 (80%), so (20 + 0.5 * 80) / 1.5 = 40%; cv/bob half of GPU 1, 80%;
    the GPU on slurm-1, of which no utilization is known, counts for nobody."""
    (expr,) = [e for where, e, _ in panel_queries() if "utilization by queue and user" in where]
    expr = expr.replace("$node", ".*").replace("$queue", ".*")
    series = [
        {"series": name + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(found.items())) + "}",
         "values": f"{value}x5"}
        for name, found, value in exported
        if name.startswith(("DCGM_", "gpupool_gpu_allocation_"))
    ]  # fmt: skip
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [{"expr": expr, "eval_time": "4m", "exp_samples": [
                {"labels": '{queue="nlp",user="alice"}', "value": 40},
                {"labels": '{queue="cv",user="bob"}', "value": 80},
            ]}],
        }],
    }  # fmt: skip
    path = tmp_path / "dashboard_test.yml"
    path.write_text(yaml.safe_dump(tests))
    ran = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr
