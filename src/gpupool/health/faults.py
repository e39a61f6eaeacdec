"""Fault injection into simulated GPUs (`gpupool node inject-fault`), wherever the GPUs are: the head applies
it to its own GPUs, a node agent to its GPUs when the head asks it to (health/node_tasks.py)."""

from __future__ import annotations

from typing import Any

from gpupool.gpu import GpuProvider, SimulatedProvider

FAULTS = ("xid", "ecc", "throttle", "slow", "fall_off_bus", "clear")


class FaultRefused(ValueError):
    """The fault cannot be injected; `kind` is "invalid" (bad input) or "conflict" (not on these GPUs)."""

    def __init__(self, message: str, *, kind: str = "invalid", field: str | None = None) -> None:
        super().__init__(message)
        self.message, self.kind, self.field = message, kind, field

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "kind": self.kind, "field": self.field}


def inject(gpus: GpuProvider | None, node: str, gpu: int, fault: str, value: Any = None) -> str:
    """Apply one fault to GPU `gpu` of this machine's simulated GPUs; returns what was done, in words."""
    if fault not in FAULTS:
        raise FaultRefused(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}", field="fault")
    if gpus is None:
        raise FaultRefused(f"node {node} has no GPUs to inject faults into", kind="conflict", field="node")
    if not isinstance(gpus, SimulatedProvider):
        raise FaultRefused(
            f"node {node} has real GPUs ({gpus.description}); fault injection works on simulated GPUs only "
            "(start a server or agent with --gpus sim:8xH100 to try it)",
            kind="conflict",
            field="node",
        )
    count = len(gpus.devices())
    if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < count:
        raise FaultRefused(f"gpu {gpu}: node {node} has GPUs 0..{count - 1}", field="gpu")
    try:
        if fault == "xid":
            gpus.inject_xid(gpu, int(value))
            return f"GPU {gpu}: Xid {int(value)} reported"
        if fault == "ecc":
            if value != "uncorrectable":
                raise FaultRefused(f"ecc {value!r}: only 'uncorrectable' can be injected", field="ecc")
            gpus.inject_ecc_errors(gpu, 1)
            return f"GPU {gpu}: 1 uncorrectable ECC error, row remap pending"
        if fault == "throttle":
            gpus.inject_throttle(gpu, str(value))
            return f"GPU {gpu}: {value} throttling"
        if fault == "slow":
            gpus.inject_slowdown(gpu, float(value))
            return f"GPU {gpu}: active checks measure {float(value):g} of the expected figures"
        if fault == "fall_off_bus":
            gpus.fall_off_bus(gpu)
            return f"GPU {gpu}: fallen off the bus (Xid 79)"
        gpus.clear_faults(gpu)
        return f"GPU {gpu}: faults cleared (repaired); the node returns after passing the active checks"
    except (TypeError, ValueError) as exc:
        if isinstance(exc, FaultRefused):
            raise
        raise FaultRefused(str(exc), field=fault) from exc
