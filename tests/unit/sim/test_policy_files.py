"""A policy from an operator's own scheduling.yaml (`--policy FILE`) and the server's (`sim whatif`): read by
the server's parser, run as the server would run it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.scheduler import QueueView, Share
from gpupool.sim.cluster import load_cluster
from gpupool.sim.engine import Simulation
from gpupool.sim.errors import SimError
from gpupool.sim.metrics import summarize
from gpupool.sim.policies import BY_NAME, Policy, file_policy, resolve_policies, server_policy
from gpupool.sim.results import SimOptions
from gpupool.sim.trace import TraceJob
from gpupool.spec.scheduling import DEFAULT_POLICY, scheduling_fields

QUEUES = (
    QueueView("q0", gpu=Share(quota=8.0)),
    QueueView("q1", gpu=Share(quota=8.0, weight=2.0)),
    QueueView("q2", gpu=Share(quota=16.0)),
)
JOBS = [
    TraceJob(i, float(i * 53 % 1920), float(30 + (i * 7919) % 9000), [1, 1, 2, 4, 8, 16][i % 6], f"q{i % 3}")
    for i in range(90)
]


def replay(policy: Policy, jobs: list[TraceJob] = JOBS, cluster: str = "4x8") -> list[tuple[object, ...]]:
    result = Simulation(jobs, 0.0, load_cluster(cluster), QUEUES, policy, SimOptions()).run()
    assert summarize(result)["finished"] == len(jobs)
    return [(j.id, j.start, j.finish, j.preemptions) for j in result.jobs]


def write(tmp_path: Path, text: str, name: str = "scheduling.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_an_empty_scheduling_yaml_replays_job_for_job_as_gpupool(tmp_path: Path) -> None:
    (policy,) = resolve_policies(write(tmp_path, "# nothing changed\n"))
    assert policy.config == DEFAULT_POLICY
    assert policy.description.endswith("the default policy's settings (as gpupool)")
    assert replay(policy) == replay(BY_NAME["gpupool"])


def test_a_policy_file_changes_what_it_says_and_is_named_as_given(tmp_path: Path) -> None:
    """`las_preempt: false`: new work in a queue waits for the older work there instead of preempting it."""
    jobs = [TraceJob(0, 0.0, 10_000.0, 8, "q0"), TraceJob(1, 300.0, 100.0, 8, "q0")]
    off = write(tmp_path, "las_preempt: false\nmax_stopping_gpus: 8\n", "off.yml")
    policies = resolve_policies(f"gpupool,{off},gpupool,{off}")
    assert [p.name for p in policies] == ["gpupool", off]
    assert policies[1].description == f"the scheduling.yaml {off}: las_preempt false, max_stopping_gpus 8"
    banded = {j: (start, preempted) for j, start, _, preempted in replay(BY_NAME["gpupool"], jobs, "1x8")}
    waited = {j: (start, preempted) for j, start, _, preempted in replay(policies[1], jobs, "1x8")}
    assert banded[1] == (300.0, 0) and banded[0][1] == 1  # the long job made room at once
    assert waited[1] == (10_000.0, 0) and waited[0][1] == 0  # it waited for the long one


@pytest.mark.parametrize(
    "text",
    [
        "ordering: fifo\nlas_preempt: false\n",
        "ordering: attained\nlas_preempt: false\nyoung_weights: []\n",
        "ordering: estimate\n",
        "blocking: strict\nordering: fifo\n",
        "placement: spread\n",
        "placement: fragmentation\nlas_thresholds: [1m, 1h, 16h]\n",
        "max_stopping_gpus: 4\n",
    ],
)
def test_every_setting_of_the_file_runs_every_job(tmp_path: Path, text: str) -> None:
    policy = file_policy(write(tmp_path, text))
    assert policy.estimate == ("learned" if "estimate" in text else "none")
    replay(policy)  # every job finishes


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("placement: sprad\n", "placement: 'sprad' is not one of 'binpack', 'spread', 'fragmentation'"),
        ("las_thresholds: [16h, 2m]\n", "las_thresholds[1]: '2m' is not above the threshold before it"),
        ("max_stopping_gpus: 0\n", "max_stopping_gpus: 0 must be greater than 0; e.g. 64 (or null"),
        ("blocking: [\n", "is not valid YAML"),
    ],
)
def test_a_bad_file_is_refused_with_its_path_and_field(tmp_path: Path, text: str, said: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SimError) as refused:
        resolve_policies(f"gpupool,{path}")
    assert refused.value.flag == "--policy" and str(refused.value).startswith(f"--policy: {path}: ")
    assert said in str(refused.value)


def test_a_missing_file_or_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SimError, match=r"missing\.yaml: no such file; give a scheduling\.yaml"):
        resolve_policies(str(tmp_path / "missing.yaml"))
    with pytest.raises(SimError, match=r"--policy: cannot read .*: Is a directory"):
        resolve_policies(f"{tmp_path}/")
    with pytest.raises(SimError, match=r"unknown policy 'tuned'; .*, or a scheduling.yaml file"):
        resolve_policies("tuned")


def test_the_server_s_policy_is_built_from_what_its_api_shows() -> None:
    config = replace(DEFAULT_POLICY, placement="spread", max_stopping_gpus=16.0, usage_weight=1.0)
    body = {
        "source": "/etc/gpupool/scheduling.yaml",
        "policy": scheduling_fields(config),
        "usage_weight": 1.0,
        "usage_half_life_s": 86400.0,
    }
    policy = server_policy(body)
    assert (policy.name, policy.config, policy.usage_half_life) == ("server", config, 86400.0)
    assert policy.description == (
        "the server's scheduling.yaml (/etc/gpupool/scheduling.yaml): placement spread, "
        "max_stopping_gpus 16, usage_weight 1 (half-life 1d)"
    )
    default = server_policy({"source": None, "policy": scheduling_fields(DEFAULT_POLICY), "usage_weight": 0})
    assert default.config == DEFAULT_POLICY
    assert default.description == "the server's policy: the default policy's settings (as gpupool)"
