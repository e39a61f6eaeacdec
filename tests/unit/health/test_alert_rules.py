"""The shipped Prometheus alert rules (docs/prometheus/alerts.yml) are valid, fire on what the issue names
(a GPU too hot, a hardware Xid, a node lost, a queue starved below its quota) and not on what is normal,
checked by Prometheus' own rule tester (`promtool test rules`) over series named as gpupool exports them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from gpupool.health.xid import HARDWARE, XIDS
from tests.support.prometheus import promtool

RULES = Path(__file__).resolve().parents[3] / "docs" / "prometheus" / "alerts.yml"
LABELS = {"Hostname": "node-1", "gpu": "0", "UUID": "GPU-0", "modelName": "NVIDIA H100 80GB HBM3"}
GPU = ",".join(f'{key}="{value}"' for key, value in LABELS.items())  # a GPU series' labels, as exported


def fires(alert: str, labels: dict[str, str], value: str) -> list[dict[str, dict[str, str]]]:
    """The one alert expected, its annotations as the rules file renders them for these labels and value."""
    rules = yaml.safe_load(RULES.read_text())
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert]

    def render(text: str) -> str:
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        return text.replace("{{ $value }}", value)

    annotations = {k: render(v) for k, v in (rule.get("annotations") or {}).items()}
    return [{"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}]


RESTARTING = "restart-backoff"
CRASH_LOOP = 'gpupool_pending_workloads{queue="serve",reason="restart-backoff"}'
RECOVERED = 'gpupool_pending_workloads{queue="batch",reason="restart-backoff"}'
NOT_READY_LABELS = {"workload": "7", "name": "llm", "queue": "serve"}
NOT_READY = 'gpupool_service_ready{workload="7",name="llm",queue="serve"}'
SLOW_READY = 'gpupool_service_ready{workload="8",name="loads-slowly",queue="serve"}'

TESTS = {
    "rule_files": [str(RULES)],
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                {"series": f"DCGM_FI_DEV_GPU_TEMP{{{GPU}}}", "values": "70 90x10"},
                {"series": f"DCGM_FI_DEV_XID_ERRORS{{{GPU}}}", "values": "0 13 79x4"},
                # unhealthy from the Xid 79 on, until its active checks pass at 4m (the Xid stays exported)
                {"series": 'gpupool_node_health{node="node-1",health="unhealthy"}', "values": "0 0 1 1 0 0"},
                {"series": 'gpupool_node_state{node="node-2",state="lost"}', "values": "0 1x5"},
                {"series": 'gpupool_queue_quota_gpus{queue="nlp"}', "values": "8x20"},
                {"series": 'gpupool_queue_allocated_gpus{queue="nlp"}', "values": "2x20"},
                {"series": 'gpupool_queue_pending_gpus{queue="nlp"}', "values": "4x20"},
                {"series": 'gpupool_queue_held_back_gpus{queue="nlp"}', "values": "1x20"},
                # below its quota, but all its pending work is held back before the scheduler (a hold, a
                # dependency, a backoff): reclaim has nothing to do, and nobody is paged
                {"series": 'gpupool_queue_quota_gpus{queue="cv"}', "values": "8x20"},
                {"series": 'gpupool_queue_allocated_gpus{queue="cv"}', "values": "0x20"},
                {"series": 'gpupool_queue_pending_gpus{queue="cv"}', "values": "16x20"},
                {"series": 'gpupool_queue_held_back_gpus{queue="cv"}', "values": "16x20"},
                # gpupool's own queue: quota 0, so its pending check jobs never look starved
                {"series": 'gpupool_queue_quota_gpus{queue="gpupool-system"}', "values": "0x20"},
                {"series": 'gpupool_queue_allocated_gpus{queue="gpupool-system"}', "values": "0x20"},
                {"series": 'gpupool_queue_pending_gpus{queue="gpupool-system"}', "values": "8x20"},
                {"series": 'gpupool_queue_held_back_gpus{queue="gpupool-system"}', "values": "0x20"},
                # a service that never passes its readiness probe, and one that passes it after 10 minutes
                {"series": NOT_READY, "values": "0x40"},
                {"series": SLOW_READY, "values": "0x10 1x30"},
                # a crash loop: waiting out its backoff, with short runs in between (0 at those scrapes)
                {"series": CRASH_LOOP, "values": "1 1 0 1 1 1 0 1 1 1 0 1 1 1 0 1 1 1 0 1x30"},
                # one that stopped crashing 15 minutes before the end
                {"series": RECOVERED, "values": "1 0 1 0 1x20 0x30"},
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "WorkCrashLooping", "exp_alerts": []},  # not yet 30 minutes
                {
                    "eval_time": "45m",
                    "alertname": "WorkCrashLooping",
                    "exp_alerts": fires("WorkCrashLooping", {"queue": "serve", "reason": RESTARTING}, "1"),
                },
                {"eval_time": "15m", "alertname": "ServiceNotReady", "exp_alerts": []},  # not yet 20 minutes
                {
                    "eval_time": "30m",
                    "alertname": "ServiceNotReady",
                    "exp_alerts": fires("ServiceNotReady", NOT_READY_LABELS, "0"),
                },
                {"eval_time": "3m", "alertname": "GpuTooHot", "exp_alerts": []},  # not yet 5 minutes
                {"eval_time": "8m", "alertname": "GpuTooHot", "exp_alerts": fires("GpuTooHot", LABELS, "90")},
                {"eval_time": "1m", "alertname": "GpuHardwareXid", "exp_alerts": []},  # Xid 13: the job's
                {
                    "eval_time": "2m",
                    "alertname": "GpuHardwareXid",
                    "exp_alerts": fires("GpuHardwareXid", LABELS, "79"),
                },
                {"eval_time": "5m", "alertname": "GpuHardwareXid", "exp_alerts": []},  # repaired
                {"eval_time": "1m", "alertname": "NodeLost", "exp_alerts": []},
                {
                    "eval_time": "3m",
                    "alertname": "NodeLost",
                    "exp_alerts": fires("NodeLost", {"node": "node-2", "state": "lost"}, "1"),
                },
                {
                    "eval_time": "15m",
                    "alertname": "QueueStarvedBelowQuota",
                    "exp_alerts": fires("QueueStarvedBelowQuota", {"queue": "nlp"}, "2"),
                },
            ],
        }
    ],
}


def test_the_alert_rules_are_valid() -> None:
    checked = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_alert_rules_fire_on_what_the_issue_names_and_not_on_a_jobs_own_xid(tmp_path: Path) -> None:
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(yaml.safe_dump(TESTS))
    ran = subprocess.run(
        [promtool(), "test", "rules", str(tests)], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_the_hardware_xid_alert_names_every_xid_that_drains_a_node() -> None:
    rules = yaml.safe_load(RULES.read_text())
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GpuHardwareXid"]
    expr = rule["expr"]
    codes = {int(c) for c in re.findall(r"== (\d+)", expr)}
    for low, high in re.findall(r">= (\d+) and DCGM_FI_DEV_XID_ERRORS <= (\d+)", expr):
        codes |= set(range(int(low), int(high) + 1))
    assert codes == {code for code, info in XIDS.items() if info.kind == HARDWARE}
