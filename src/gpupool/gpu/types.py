"""Plain data that every GPU provider returns: what a device is, and one telemetry reading of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as discovered on this machine; stable for the life of a provider."""

    index: int  # NVML index (the number CUDA_VISIBLE_DEVICES uses when CUDA_DEVICE_ORDER=PCI_BUS_ID)
    uuid: str  # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML and nvidia-smi print it
    model: str  # marketing family the scheduler matches on: "H100", "A100", "L4" (no memory suffix)
    name: str  # full product name as NVML reports it: "NVIDIA H100 80GB HBM3"
    memory_bytes: int  # total framebuffer memory as NVML reports it (H100 SXM: 81559 MiB)
    nvlink_island: int = 0  # GPUs in one NVLink/NVSwitch domain share an id; PCIe-only GPUs get one each
    simulated: bool = False  # True when the device comes from the simulated provider

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict (the shape the agent reports to the head)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuDevice:
        """Inverse of `to_dict`; unknown keys are ignored so newer agents can talk to older heads."""
        return cls(
            index=int(data["index"]),
            uuid=str(data["uuid"]),
            model=str(data["model"]),
            name=str(data["name"]),
            memory_bytes=int(data["memory_bytes"]),
            nvlink_island=int(data.get("nvlink_island", 0)),
            simulated=bool(data.get("simulated", False)),
        )


@dataclass(frozen=True)
class GpuSample:
    """One telemetry reading of one GPU."""

    index: int  # same index as the GpuDevice it describes
    uuid: str
    at: float  # unix time of the reading (or the virtual time the caller passed to sample())
    utilization_pct: float  # 0..100, share of time a kernel was running (NVML "gpu" utilization)
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: float
    power_w: float  # instantaneous board power draw
    energy_j: float  # energy used since the provider was opened; never decreases
    sm_clock_mhz: float
    mem_clock_mhz: float
    ecc_uncorrected: int = 0  # volatile uncorrected ECC errors since the driver loaded
    xid_errors: tuple[int, ...] = ()  # Xid codes seen since the provider was opened, oldest first (bounded)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict; `xid_errors` becomes a list."""
        data = asdict(self)
        data["xid_errors"] = list(self.xid_errors)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuSample:
        """Inverse of `to_dict`; unknown keys are ignored."""
        return cls(
            index=int(data["index"]),
            uuid=str(data["uuid"]),
            at=float(data["at"]),
            utilization_pct=float(data["utilization_pct"]),
            memory_used_bytes=int(data["memory_used_bytes"]),
            memory_total_bytes=int(data["memory_total_bytes"]),
            temperature_c=float(data["temperature_c"]),
            power_w=float(data["power_w"]),
            energy_j=float(data["energy_j"]),
            sm_clock_mhz=float(data["sm_clock_mhz"]),
            mem_clock_mhz=float(data["mem_clock_mhz"]),
            ecc_uncorrected=int(data.get("ecc_uncorrected", 0)),
            xid_errors=tuple(int(x) for x in data.get("xid_errors", ())),
        )
