"""Passive and active checks, Xid classes, thresholds and their config file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupool.gpu.simulated import SimulatedProvider
from gpupool.health import checks
from gpupool.health.active import SimulatedRunner
from gpupool.health.checks import Baseline, new_xids
from gpupool.health.thresholds import TABLE, HealthConfigError, load_config, parse_config
from gpupool.health.xid import APPLICATION, HARDWARE, UNKNOWN, classify

CONFIG = parse_config(None)


def node(provider: SimulatedProvider) -> list[dict[str, Any]]:
    return [s.to_dict() for s in provider.sample(1000.0)]


def judge(
    provider: SimulatedProvider,
    baseline: Baseline | None = None,
    *,
    expected: SimulatedProvider | None = None,
) -> checks.Verdict:
    """The passive verdict of the provider's GPUs, expected to be `expected`'s (default: its own)."""
    devices = (expected or provider).devices()
    return checks.passive(
        node(provider),
        expected_gpus=len(devices),
        expected_uuids={d.uuid: d.index for d in devices},
        models={d.index: d.model for d in provider.devices()},
        config=CONFIG,
        baseline=baseline or Baseline(),
    )


@pytest.mark.parametrize("code", [48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140])
def test_hardware_xids_drain_the_node(code: int) -> None:
    assert classify(code).kind == HARDWARE


@pytest.mark.parametrize("code", [13, 31, 43, 45, 68])
def test_a_jobs_own_xids_leave_the_node_in_service(code: int) -> None:
    assert classify(code).kind == APPLICATION


def test_an_unknown_xid_is_a_warning_not_a_drain() -> None:
    gpus = SimulatedProvider("sim:2xH100", seed="t")
    assert classify(9999).kind == UNKNOWN
    gpus.inject_xid(1, 9999)
    assert judge(gpus).health == checks.WARNING


def test_a_healthy_simulated_node_passes_every_passive_check() -> None:
    verdict = judge(SimulatedProvider("sim:8xH100", seed="t"))
    assert verdict.health == checks.HEALTHY and verdict.evidence == "all checks passed"


def test_xid_79_makes_the_node_unhealthy_with_the_gpu_named_in_the_evidence() -> None:
    gpus = SimulatedProvider("sim:8xH100", seed="t")
    gpus.inject_xid(3, 79)
    verdict = judge(gpus)
    assert verdict.health == checks.UNHEALTHY
    assert "GPU 3: Xid 79 (hardware): GPU has fallen off the bus" in verdict.evidence


def test_an_application_xid_is_shown_but_changes_nothing() -> None:
    gpus = SimulatedProvider("sim:2xH100", seed="t")
    gpus.inject_xid(0, 13)
    verdict = judge(gpus)
    assert verdict.health == checks.HEALTHY
    assert [f.check for f in verdict.findings] == ["xid"]


def test_a_gpu_fallen_off_the_bus_fails_the_gpu_count() -> None:
    gpus = SimulatedProvider("sim:8xH100", seed="t")
    gpus.fall_off_bus(5)
    verdict = judge(gpus)
    assert verdict.health == checks.UNHEALTHY
    uuid = gpus.devices()[5].uuid
    assert f"7 of 8 expected GPUs answer; missing: GPU 5 {uuid} (does not answer)" in verdict.evidence
    count_only = checks.passive(node(gpus), expected_gpus=8, models={}, config=CONFIG, baseline=Baseline())
    assert "7 of 8 expected GPUs answer (lost: GPU 5)" in count_only.evidence


def test_a_node_that_comes_back_with_fewer_gpus_than_expected_is_unhealthy_naming_the_missing_one() -> None:
    """After a reboot the driver no longer lists a GPU that fell off the bus: every GPU the node lists
    answers, yet one it is expected to have is missing."""
    before = SimulatedProvider("sim:8xH100", seed="t")
    after = SimulatedProvider("sim:7xH100", seed="t")  # same seed: GPUs 0-6 keep their UUIDs
    verdict = judge(after, expected=before)
    assert verdict.health == checks.UNHEALTHY
    assert [f.check for f in verdict.findings] == ["gpu_count"]
    gone = before.devices()[7].uuid
    assert (
        verdict.evidence == f"7 of 8 expected GPUs answer; missing: GPU 7 {gone} (not listed by the driver)"
    )


def test_a_node_with_more_gpus_than_expected_is_a_warning_until_an_operator_accepts_them() -> None:
    verdict = judge(
        SimulatedProvider("sim:9xH100", seed="t"), expected=SimulatedProvider("sim:8xH100", seed="t")
    )
    assert verdict.health == checks.WARNING
    new = SimulatedProvider("sim:9xH100", seed="t").devices()[8].uuid
    assert verdict.evidence == (
        f"9 GPUs answer, 8 expected (new: GPU 8 {new}); to expect 9: gpupool node accept-gpus"
    )


def test_uncorrectable_ecc_and_a_pending_row_remap_are_unhealthy() -> None:
    gpus = SimulatedProvider("sim:2xA100", seed="t")
    gpus.inject_ecc_errors(1)
    messages = [f.message for f in judge(gpus).findings]
    assert "GPU 1: 1 new uncorrectable ECC error(s)" in messages
    assert "GPU 1: HBM row remap pending (needs a GPU reset)" in messages


def test_thermal_throttling_is_a_warning() -> None:
    gpus = SimulatedProvider("sim:2xH100", seed="t")
    gpus.inject_throttle(0, "thermal")
    verdict = judge(gpus)
    assert verdict.health == checks.WARNING
    assert {f.check for f in verdict.findings} == {"throttle", "temperature"}


def test_acknowledged_faults_no_longer_count_but_new_ones_do() -> None:
    gpus = SimulatedProvider("sim:2xH100", seed="t")
    gpus.inject_xid(0, 79)
    gpus.inject_ecc_errors(0)
    gpus.clear_faults(0)
    seen = Baseline()
    seen.acknowledge(node(gpus))
    assert judge(gpus, seen).health == checks.HEALTHY
    gpus.inject_xid(0, 48)
    assert "Xid 48" in judge(gpus, seen).evidence


def test_new_xids_follow_a_window_that_moved_on() -> None:
    assert new_xids((1, 2, 3), (1, 2, 3, 4)) == (4,)
    assert new_xids((1, 2, 3), (2, 3, 4, 5)) == (4, 5)  # the oldest fell out of the bounded window
    assert new_xids((), (7,)) == (7,)
    assert new_xids((1, 2), (1, 2)) == ()


def test_a_pcie_link_below_its_width_is_a_warning() -> None:
    sample = node(SimulatedProvider("sim:1xH100", seed="t"))[0] | {"pcie_link_width": 8}
    verdict = checks.passive(
        [sample], expected_gpus=1, models={0: "H100"}, config=CONFIG, baseline=Baseline()
    )
    assert verdict.health == checks.WARNING and "PCIe link x8 of x16" in verdict.evidence


def test_nvlink_links_down_are_unhealthy() -> None:
    sample = node(SimulatedProvider("sim:1xH100", seed="t"))[0] | {"nvlink_links_up": 16}
    verdict = checks.passive(
        [sample], expected_gpus=1, models={0: "H100"}, config=CONFIG, baseline=Baseline()
    )
    assert verdict.health == checks.UNHEALTHY and "2 of 18 NVLink links down" in verdict.evidence


def test_active_checks_pass_on_healthy_simulated_gpus_and_fail_a_slow_one() -> None:
    gpus = SimulatedProvider("sim:8xH100", seed="t")
    runner = SimulatedRunner(gpus)
    assert checks.active(runner.run("full"), CONFIG).health == checks.HEALTHY
    gpus.inject_slowdown(2, 0.5)
    verdict = checks.active(runner.run("full"), CONFIG)
    assert verdict.health == checks.UNHEALTHY
    assert "GPU 2: BF16 GEMM 396 TFLOPS < 593 (60% of the 989 TFLOPS H100 peak)" in verdict.evidence
    assert "GPU 2: host-to-device 27.5 GB/s < 48 GB/s" in verdict.evidence
    assert "8-GPU all-reduce busbw 240 GB/s < 460 GB/s" in verdict.evidence


def test_a_lost_gpu_fails_the_active_checks() -> None:
    gpus = SimulatedProvider("sim:2xH100", seed="t")
    gpus.fall_off_bus(1)
    verdict = checks.active(SimulatedRunner(gpus).run("quick"), CONFIG)
    assert "GPU 1: does not answer (fallen off the bus)" in verdict.evidence
    # the passive checks see it too, in the same words: the node's evidence says it once
    both = checks.combine(judge(gpus), verdict)
    assert both.evidence.count("GPU 1: does not answer (fallen off the bus)") == 1, both.evidence


def test_a_mixed_node_reports_the_all_reduce_of_its_slowest_link() -> None:
    """2 H100s and 2 L4s (PCIe): not the 8-H100 NVLink figure, 480 GB/s, of its first GPU."""
    result = SimulatedRunner(SimulatedProvider("sim:2xH100,2xL4", seed="t")).run("full")
    assert result.allreduce_busbw_gbps == 20.0


def test_thresholds_are_azures_published_figures() -> None:
    assert TABLE["A100"].allreduce_min_busbw_gbps == 228.0
    assert TABLE["H100"].allreduce_min_busbw_gbps == 460.0
    assert TABLE["H200"].allreduce_min_busbw_gbps == 431.0
    assert (TABLE["A100"].h2d_min_gbps, TABLE["H100"].h2d_min_gbps, TABLE["H200"].h2d_min_gbps) == (
        21,
        48,
        48,
    )
    assert TABLE["A100"].d2h_min_gbps == 21


def test_a_config_file_overrides_one_model_and_every_model(tmp_path: Path) -> None:
    (tmp_path / "health.yaml").write_text(
        "thresholds:\n  h100: {h2d_min_gbps: 30}\n  '*': {gpu_temp_warn_c: 80}\n"
        "schedule: {recheck_interval: 5}\n"
    )
    config = load_config(tmp_path)
    assert config.for_model("H100").h2d_min_gbps == 30
    assert config.for_model("H100").gpu_temp_warn_c == 80
    assert config.for_model("A100").h2d_min_gbps == 21
    assert config.schedule.recheck_interval == 5
    assert "overridden by" in config.for_model("H100").source


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("thresholds: {H100: {h2d: 3}}", "thresholds.H100.h2d: unknown field"),
        ("thresholds: {H100: {h2d_min_gbps: fast}}", "thresholds.H100.h2d_min_gbps: 'fast' is not a number"),
        ("schedule: {recheck_level: deep}", "schedule.recheck_level: 'deep'; one of quick, full"),
        ("checks: {}", "unknown key 'checks'"),
        # values that broke the cluster: every node failed, check jobs back to back, warnings off
        (
            "thresholds: {H100: {gemm_min_fraction: 1.5}}",
            "gemm_min_fraction: 1.5 is not a number above 0 to 1",
        ),
        ("schedule: {recheck_interval: 0}", "recheck_interval: 0 is not a number at least 1; e.g."),
        ("thresholds: {'*': {gpu_temp_warn_c: .nan}}", "gpu_temp_warn_c: nan is not a number above 0 to 150"),
        ("thresholds: {H100: {allreduce_gpus: 0}}", "allreduce_gpus: 0 is not a number 2 to 1024"),
        (
            "thresholds: {H100: {h2d_min_gbps: -1}}",
            "h2d_min_gbps: -1 is not a number at least 0; e.g. h2d_min",
        ),
    ],
)
def test_a_bad_config_names_the_key_and_the_fix(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "health.yaml").write_text(text)
    with pytest.raises(HealthConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(tmp_path)


def test_docs_telemetry_md_names_every_threshold_and_schedule_field() -> None:
    from dataclasses import fields

    from gpupool.health.thresholds import Schedule, Thresholds

    text = (Path(__file__).resolve().parents[3] / "docs" / "telemetry.md").read_text()
    for f in [*fields(Thresholds), *fields(Schedule)]:
        if f.name != "source":
            assert f"`{f.name}`" in text or f"{f.name}:" in text, f"docs/telemetry.md lacks {f.name}"


def test_gpus_a_join_token_declares_but_the_node_never_registered_fail_the_gpu_count() -> None:
    gpus = SimulatedProvider("sim:4xH100", seed="t")
    short = checks.passive(
        node(gpus), expected_gpus=4, models={}, config=CONFIG, baseline=Baseline(), declared_gpus=8
    )
    assert short.health == checks.UNHEALTHY
    assert short.evidence == "4 of 8 expected GPUs answer; 4 never registered (its join token declares 8)"
    gpus.fall_off_bus(1)  # and one it registered stops answering: both are said
    uuid = gpus.devices()[1].uuid
    both = checks.passive(
        node(gpus), expected_gpus=4, models={}, config=CONFIG, baseline=Baseline(),
        expected_uuids={d.uuid: d.index for d in gpus.devices()}, declared_gpus=8,
    )  # fmt: skip
    assert both.evidence.startswith(
        f"3 of 8 expected GPUs answer; missing: GPU 1 {uuid} (does not answer); 4 never registered (its join "
        "token declares 8); GPU 1: Xid 79"
    )
    enough = SimulatedProvider("sim:8xH100", seed="t")  # a declaration is a floor: as many or more is fine
    for declared in (8, 4, None):
        verdict = checks.passive(
            node(enough), expected_gpus=8, models={}, config=CONFIG, baseline=Baseline(),
            declared_gpus=declared,
        )  # fmt: skip
        assert verdict.health == checks.HEALTHY
