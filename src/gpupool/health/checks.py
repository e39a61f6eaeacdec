"""Health checks as pure functions over samples and measurements, and the verdict they add up to.

Passive checks read every telemetry sample (no work on the GPUs); active checks judge what short GPU
workloads measured (health/active.py runs them). Each failed check is a `Finding` with its evidence; the
verdict is the worst finding: `unhealthy` (drain the node), `warning` (schedulable, flagged) or `healthy`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpupool.health.thresholds import HealthConfig
from gpupool.health.xid import APPLICATION, HARDWARE, classify

HEALTHY, WARNING, UNHEALTHY, UNKNOWN = "healthy", "warning", "unhealthy", "unknown"
INFO = "info"  # a finding that changes nothing (an application Xid): shown, never acted on
_RANK = {INFO: 0, HEALTHY: 0, WARNING: 1, UNHEALTHY: 2}
_THERMAL_THROTTLE = ("hw_thermal", "sw_thermal")
_POWER_THROTTLE = ("hw_power_brake", "hw_slowdown")  # sw_power_cap is normal at full load: not a fault


@dataclass(frozen=True)
class Finding:
    check: str  # gpu_count, xid, ecc, remapped_rows, throttle, temperature, pcie, nvlink, gemm, h2d, ...
    severity: str  # INFO | WARNING | UNHEALTHY
    message: str  # one line a person reads: what was seen against what was expected
    gpu: int | None = None  # GPU index; None for node-wide findings

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    health: str  # HEALTHY | WARNING | UNHEALTHY | UNKNOWN
    findings: tuple[Finding, ...] = ()
    checks: tuple[str, ...] = ()  # every check that ran, passed or not

    @property
    def evidence(self) -> str:
        """The findings that set the verdict, as one line; what two checks saw alike is said once (a GPU
        off the bus fails the passive checks and the active ones with the same words)."""
        worst = dict.fromkeys(f.message for f in self.findings if f.severity == self.health)
        return "; ".join(worst) or "all checks passed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "health": self.health,
            "evidence": self.evidence,
            "findings": [f.to_dict() for f in self.findings],
            "checks": list(self.checks),
        }


def verdict(findings: Sequence[Finding], checks: Sequence[str]) -> Verdict:
    worst = max((_RANK[f.severity] for f in findings), default=0)
    health = {0: HEALTHY, 1: WARNING, 2: UNHEALTHY}[worst]
    return Verdict(health, tuple(findings), tuple(checks))


def combine(*verdicts: Verdict) -> Verdict:
    """One verdict of several; a finding or check two of them share is said once (a GPU off the bus is
    seen by the passive checks and the active ones alike)."""
    findings = list(dict.fromkeys(f for v in verdicts for f in v.findings))
    checks = list(dict.fromkeys(c for v in verdicts for c in v.checks))
    return verdict(findings, checks)


@dataclass
class Baseline:
    """What an operator has seen already, per GPU UUID: Xids and uncorrected ECC counts that a node passed
    its active checks with. Only what is new since then counts against the node."""

    xids: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ecc: dict[str, int] = field(default_factory=dict)

    def acknowledge(self, samples: Sequence[Mapping[str, Any]]) -> None:
        for s in samples:
            self.xids[str(s["uuid"])] = tuple(int(x) for x in s.get("xid_errors", ()))
            self.ecc[str(s["uuid"])] = int(s.get("ecc_uncorrected", 0))


def new_xids(seen: tuple[int, ...], now: tuple[int, ...]) -> tuple[int, ...]:
    """The Xids in `now` that came after `seen`; both are the same bounded, oldest-first window, so the
    window may have moved on: the newest part of `seen` that `now` starts with is skipped."""
    for shift in range(len(seen) + 1):
        overlap = seen[shift:]
        if now[: len(overlap)] == overlap:
            return now[len(overlap) :]
    return now


def passive(
    samples: Sequence[Mapping[str, Any]],
    *,
    expected_gpus: int,
    models: Mapping[int, str],
    config: HealthConfig,
    baseline: Baseline,
    expected_uuids: Mapping[str, int] | None = None,
    declared_gpus: int | None = None,
) -> Verdict:
    """Check one node's latest samples (one per GPU). `expected_gpus`: how many GPUs the node is expected
    to have; `expected_uuids`: those GPUs, UUID -> index when they were expected (names the missing ones);
    `declared_gpus`: how many its join token says it has, when that is more (GPUs it never registered)."""
    findings: list[Finding] = []
    checks = ["gpu_count", "xid", "ecc", "remapped_rows", "throttle", "temperature", "pcie", "nvlink"]
    findings.extend(_gpu_count(samples, expected_gpus, expected_uuids or {}, declared_gpus))
    for s in samples:
        index, uuid = int(s["index"]), str(s["uuid"])
        limits = config.for_model(models.get(index, ""))
        for code in new_xids(baseline.xids.get(uuid, ()), tuple(int(x) for x in s.get("xid_errors", ()))):
            info = classify(code)
            severity = {HARDWARE: UNHEALTHY, APPLICATION: INFO}.get(info.kind, WARNING)
            findings.append(
                Finding("xid", severity, f"GPU {index}: Xid {code} ({info.kind}): {info.meaning}", index)
            )
        if s.get("lost"):
            findings.append(
                Finding("gpu_count", UNHEALTHY, f"GPU {index}: does not answer (fallen off the bus)", index)
            )
            continue  # its other readings are stale
        ecc = int(s.get("ecc_uncorrected", 0)) - baseline.ecc.get(uuid, 0)
        if ecc > 0:
            findings.append(
                Finding("ecc", UNHEALTHY, f"GPU {index}: {ecc} new uncorrectable ECC error(s)", index)
            )
        if s.get("remapped_rows_failure"):
            findings.append(
                Finding("remapped_rows", UNHEALTHY, f"GPU {index}: HBM row remapping failed", index)
            )
        elif s.get("remapped_rows_pending"):
            findings.append(
                Finding(
                    "remapped_rows",
                    UNHEALTHY,
                    f"GPU {index}: HBM row remap pending (needs a GPU reset)",
                    index,
                )
            )
        reasons = tuple(s.get("throttle_reasons", ()))
        for kind, names in (("thermal", _THERMAL_THROTTLE), ("power", _POWER_THROTTLE)):
            active = [r for r in reasons if r in names]
            if active:
                findings.append(
                    Finding(
                        "throttle", WARNING, f"GPU {index}: {kind} throttling ({', '.join(active)})", index
                    )
                )
        temperature = float(s.get("temperature_c", 0.0))
        if temperature > limits.gpu_temp_warn_c:
            findings.append(
                Finding(
                    "temperature",
                    WARNING,
                    f"GPU {index}: {temperature:.0f} C > {limits.gpu_temp_warn_c:g} C",
                    index,
                )
            )
        mem_temp = s.get("memory_temperature_c")
        if mem_temp is not None and float(mem_temp) > limits.memory_temp_warn_c:
            findings.append(
                Finding(
                    "temperature", WARNING,
                    f"GPU {index}: memory {float(mem_temp):.0f} C > {limits.memory_temp_warn_c:g} C", index,
                )
            )  # fmt: skip
        width, width_max = int(s.get("pcie_link_width", 0)), int(s.get("pcie_link_width_max", 0))
        gen, gen_max = int(s.get("pcie_link_gen", 0)), int(s.get("pcie_link_gen_max", 0))
        if width and width_max and width < width_max:
            findings.append(
                Finding("pcie", WARNING, f"GPU {index}: PCIe link x{width} of x{width_max}", index)
            )
        # An idle GPU lowers its PCIe generation to save power; only a busy one below its maximum is slow.
        if gen and gen_max and gen < gen_max and float(s.get("utilization_pct", 0.0)) >= 50.0:
            findings.append(
                Finding("pcie", WARNING, f"GPU {index}: PCIe gen {gen} of {gen_max} while busy", index)
            )
        up, total = int(s.get("nvlink_links_up", 0)), int(s.get("nvlink_links_total", 0))
        if total and up < total:
            findings.append(
                Finding("nvlink", UNHEALTHY, f"GPU {index}: {total - up} of {total} NVLink links down", index)
            )
    return verdict(findings, checks)


def _gpu_count(
    samples: Sequence[Mapping[str, Any]],
    expected: int,
    uuids: Mapping[str, int],
    declared: int | None = None,
) -> list[Finding]:
    """Fewer GPUs answer than the node is expected to have (unhealthy), or more (a warning until an operator
    accepts them: `gpupool node accept-gpus`). A join token's declared count, when larger, is expected:
    the difference are GPUs the node never registered (it joined short of them)."""
    answering = {str(s["uuid"]): int(s["index"]) for s in samples if not s.get("lost")}
    lost = {str(s["uuid"]) for s in samples if s.get("lost")}
    never = 0
    if declared is not None and declared > expected:
        never, expected = declared - expected, declared
    if len(answering) < expected:
        what = ""
        if uuids:
            missing = sorted((index, uuid) for uuid, index in uuids.items() if uuid not in answering)
            named = ", ".join(
                f"GPU {index} {uuid} ({'does not answer' if uuid in lost else 'not listed by the driver'})"
                for index, uuid in missing
            )
            what = f"; missing: {named}" if named else ""
        else:
            gone = sorted(int(s["index"]) for s in samples if s.get("lost"))
            what = f" (lost: GPU {', '.join(map(str, gone))})" if gone else ""
        if never:
            what += f"; {never} never registered (its join token declares {declared})"
        return [Finding("gpu_count", UNHEALTHY, f"{len(answering)} of {expected} expected GPUs answer{what}")]
    if uuids and len(answering) > expected:
        new = sorted((index, uuid) for uuid, index in answering.items() if uuid not in uuids)
        named = ", ".join(f"GPU {index} {uuid}" for index, uuid in new)
        return [
            Finding(
                "gpu_count", WARNING,
                f"{len(answering)} GPUs answer, {expected} expected (new: {named}); to expect "
                f"{len(answering)}: gpupool node accept-gpus",
            )
        ]  # fmt: skip
    return []


@dataclass(frozen=True)
class GpuMeasurement:
    """What the active checks measured on one GPU; None: not measured at this level."""

    index: int
    model: str
    peak_tflops: float | None  # dense BF16 peak of the model (catalog), to judge gemm_tflops against
    gemm_tflops: float | None = None
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    memtest_errors: int | None = None
    error: str | None = None  # the GPU could not be tested at all (lost, CUDA error): unhealthy

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ActiveResult:
    level: str
    gpus: tuple[GpuMeasurement, ...]
    allreduce_busbw_gbps: float | None = None  # intra-node all-reduce over every GPU (full level)
    runner: str = ""  # "simulated" or "torch": how the figures were obtained
    notes: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "runner": self.runner,
            "gpus": [g.to_dict() for g in self.gpus],
            "allreduce_busbw_gbps": self.allreduce_busbw_gbps,
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ActiveResult:
        """The inverse of `to_dict` (a node agent's active checks reach the head this way)."""
        return cls(
            str(data["level"]),
            tuple(GpuMeasurement(**g) for g in data.get("gpus") or ()),
            data.get("allreduce_busbw_gbps"),
            runner=str(data.get("runner") or ""),
            notes=tuple(str(n) for n in data.get("notes") or ()),
            seconds=float(data.get("seconds") or 0.0),
        )


def active(result: ActiveResult, config: HealthConfig) -> Verdict:
    """Judge active measurements against the model's thresholds."""
    findings: list[Finding] = []
    checks = ["gemm", "h2d", "d2h", "memtest"] + (["allreduce"] if result.level == "full" else [])
    for g in result.gpus:
        limits = config.for_model(g.model)
        if g.error is not None:
            findings.append(Finding("active", UNHEALTHY, f"GPU {g.index}: {g.error}", g.index))
            continue
        if g.gemm_tflops is not None and g.peak_tflops:
            floor = limits.gemm_min_fraction * g.peak_tflops
            if g.gemm_tflops < floor:
                findings.append(
                    Finding(
                        "gemm", UNHEALTHY,
                        f"GPU {g.index}: BF16 GEMM {g.gemm_tflops:.0f} TFLOPS < {floor:.0f} "
                        f"({limits.gemm_min_fraction:.0%} of the {g.peak_tflops:g} TFLOPS {g.model} peak)",
                        g.index,
                    )
                )  # fmt: skip
        for check, value, least in (
            ("h2d", g.h2d_gbps, limits.h2d_min_gbps),
            ("d2h", g.d2h_gbps, limits.d2h_min_gbps),
        ):
            if value is not None and least is not None and value < least:
                what = "host-to-device" if check == "h2d" else "device-to-host"
                findings.append(
                    Finding(
                        check, UNHEALTHY, f"GPU {g.index}: {what} {value:.1f} GB/s < {least:g} GB/s", g.index
                    )
                )
        if g.memtest_errors:
            findings.append(
                Finding(
                    "memtest",
                    UNHEALTHY,
                    f"GPU {g.index}: memory test found {g.memtest_errors} errors",
                    g.index,
                )
            )
    busbw = result.allreduce_busbw_gbps
    if busbw is not None and result.gpus:
        limits = config.for_model(result.gpus[0].model)
        least = limits.allreduce_min_busbw_gbps
        if least is not None and len(result.gpus) == limits.allreduce_gpus and busbw < least:
            findings.append(
                Finding(
                    "allreduce",
                    UNHEALTHY,
                    f"{len(result.gpus)}-GPU all-reduce busbw {busbw:.0f} GB/s < {least:g} GB/s",
                )
            )
    return verdict(findings, checks)
