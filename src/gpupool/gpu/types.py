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


# Clock throttle reasons as NVML's bit mask names them (nvmlClocksThrottleReason*), in gpupool's spelling.
THROTTLE: dict[int, str] = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


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
    # The fields below default to "nothing to report", so samples from older agents still parse.
    memory_copy_util_pct: float = 0.0  # 0..100, share of time device memory was read or written
    memory_temperature_c: float | None = None  # HBM temperature; None where NVML does not report it
    throttle_reasons: tuple[
        str, ...
    ] = ()  # active clock throttle reasons, e.g. ("hw_thermal",); see THROTTLE
    pcie_replay_errors: int = 0  # PCIe replay counter (link-level retransmissions) since the driver loaded
    pcie_link_gen: int = 0  # current PCIe generation (0: unknown)
    pcie_link_gen_max: int = 0
    pcie_link_width: int = 0  # current lanes (0: unknown)
    pcie_link_width_max: int = 0
    ecc_corrected: int = 0  # volatile corrected ECC errors
    ecc_corrected_aggregate: int = 0  # lifetime counts, kept across driver reloads
    ecc_uncorrected_aggregate: int = 0
    remapped_rows_correctable: int = 0  # HBM rows remapped after correctable / uncorrectable errors
    remapped_rows_uncorrectable: int = 0
    remapped_rows_pending: bool = False  # a remap waits for a GPU reset
    remapped_rows_failure: bool = False  # a remap failed: the GPU needs service
    nvlink_links_up: int = 0  # NVLink links in the active state
    nvlink_links_total: int = 0  # links the GPU has (0: PCIe only, or NVML cannot tell)
    lost: bool = False  # the GPU stopped answering (fallen off the bus); the other fields are stale

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict; tuples become lists."""
        data = asdict(self)
        data["xid_errors"] = list(self.xid_errors)
        data["throttle_reasons"] = list(self.throttle_reasons)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuSample:
        """Inverse of `to_dict`; unknown keys are ignored, missing newer ones take their defaults."""
        mem_temp = data.get("memory_temperature_c")
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
            memory_copy_util_pct=float(data.get("memory_copy_util_pct", 0.0)),
            memory_temperature_c=None if mem_temp is None else float(mem_temp),
            throttle_reasons=tuple(str(x) for x in data.get("throttle_reasons", ())),
            pcie_replay_errors=int(data.get("pcie_replay_errors", 0)),
            pcie_link_gen=int(data.get("pcie_link_gen", 0)),
            pcie_link_gen_max=int(data.get("pcie_link_gen_max", 0)),
            pcie_link_width=int(data.get("pcie_link_width", 0)),
            pcie_link_width_max=int(data.get("pcie_link_width_max", 0)),
            ecc_corrected=int(data.get("ecc_corrected", 0)),
            ecc_corrected_aggregate=int(data.get("ecc_corrected_aggregate", 0)),
            ecc_uncorrected_aggregate=int(data.get("ecc_uncorrected_aggregate", 0)),
            remapped_rows_correctable=int(data.get("remapped_rows_correctable", 0)),
            remapped_rows_uncorrectable=int(data.get("remapped_rows_uncorrectable", 0)),
            remapped_rows_pending=bool(data.get("remapped_rows_pending", False)),
            remapped_rows_failure=bool(data.get("remapped_rows_failure", False)),
            nvlink_links_up=int(data.get("nvlink_links_up", 0)),
            nvlink_links_total=int(data.get("nvlink_links_total", 0)),
            lost=bool(data.get("lost", False)),
        )
