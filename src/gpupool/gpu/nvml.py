"""Real GPUs through NVML (nvidia-ml-py, imported as `pynvml`).

Every per-GPU query that a GPU, driver or container may not support degrades to a default instead of
failing the whole sample; a GPU that has fallen off the bus reports Xid 79 rather than crashing sampling.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gpupool.gpu.catalog import model_from_product_name
from gpupool.gpu.errors import GpuUnavailable
from gpupool.gpu.selector import DEFAULT_SIMULATION
from gpupool.gpu.types import THROTTLE, GpuDevice, GpuSample

log = logging.getLogger(__name__)

T = TypeVar("T")

XID_GPU_FALLEN_OFF_BUS = 79
XID_HISTORY = 64  # most recent Xid codes kept per GPU
_MAX_EVENTS_PER_SAMPLE = 1024  # an event storm must not stall the sampler
_NVSWITCH = "nvswitch"  # every GPU wired to this machine's NVSwitch fabric shares one island

# pynvml constants, with their values as fallbacks for injected modules that do not define them
_DEFAULTS: dict[str, int] = {
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_AGGREGATE_ECC": 1,
    "NVML_FI_DEV_MEMORY_TEMP": 82,
    "NVML_FEATURE_ENABLED": 1,
    "NVML_NVLINK_MAX_LINKS": 18,
    "NVML_NVLINK_DEVICE_TYPE_SWITCH": 2,
    "nvmlEventTypeXidCriticalError": 0x8,
}


def no_driver_message(reason: object) -> str:
    """The one-paragraph explanation shown when NVML cannot start."""
    return (
        f"no NVIDIA driver found: NVML (libnvidia-ml.so) could not start ({reason}). "
        f"Install the NVIDIA driver on this machine, or run with simulated GPUs instead: "
        f"--gpus {DEFAULT_SIMULATION} (any sim:<count>x<model>, e.g. sim:4xA100-80GB)"
    )


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a hard dependency
        raise GpuUnavailable(no_driver_message(f"the nvidia-ml-py package is not installed: {exc}")) from exc
    return pynvml


def _text(value: object) -> str:
    """NVML strings arrive as bytes from older nvidia-ml-py releases and as str from newer ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").strip("\x00 ")
    return str(value).strip()


_BUS_ID = re.compile(r"^(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-7])$")


def normalize_bus_id(raw: object) -> str:
    """One spelling of a PCI address: NVML writes both "00000000:18:00.0" and "0000:18:00.0"."""
    text = _text(raw).lower()
    match = _BUS_ID.match(text)
    if match is None:
        return text
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):08x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def nvlink_islands(bus_ids: Sequence[str], peers: Sequence[Sequence[str]]) -> list[int]:
    """Island id per GPU: GPUs joined (directly or through a switch) by active NVLinks share one.

    `peers[i]` lists what GPU i's active links reach (peer bus ids, or `_NVSWITCH`). Ids count up from 0
    in the order of the lowest GPU index of each island.
    """
    parent: dict[str, str] = {}

    def root(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for own, reached in zip(bus_ids, peers, strict=True):
        for peer in reached:
            parent[root(peer)] = root(own)
    ids: dict[str, int] = {}
    return [ids.setdefault(root(own), len(ids)) for own in bus_ids]


def nvml_available() -> bool:
    """True when an NVIDIA driver answers NVML on this machine."""
    try:
        provider = NvmlProvider()
    except GpuUnavailable:
        return False
    provider.close()
    return True


class NvmlProvider:
    """GpuProvider backed by NVML; thread-safe. `nvml_module` replaces pynvml (tests inject a fake)."""

    kind = "nvml"

    def __init__(self, nvml_module: Any | None = None) -> None:
        nvml = nvml_module if nvml_module is not None else _import_pynvml()
        self._nvml = nvml
        self._error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self._lost_error: type[BaseException] | None = getattr(nvml, "NVMLError_GpuIsLost", None)
        self._not_supported: type[BaseException] | None = getattr(nvml, "NVMLError_NotSupported", None)
        self._lock = threading.Lock()
        self._reported: set[tuple[int, str]] = set()
        self._closed = False
        try:
            nvml.nvmlInit()
        except Exception as exc:
            raise GpuUnavailable(no_driver_message(exc)) from exc
        try:
            count = int(nvml.nvmlDeviceGetCount())
            self._handles: list[Any] = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            self._shutdown()
            reason = f"the driver answered but listing GPUs failed: {exc}"
            raise GpuUnavailable(no_driver_message(reason)) from exc
        if not self._handles:
            self._shutdown()
            raise GpuUnavailable(no_driver_message("the driver is loaded but sees no GPUs"))
        n = len(self._handles)
        self._energy_base_mj: list[float | None] = [None] * n
        self._energy_j: list[float] = [0.0] * n
        self._last_power_w: list[float | None] = [None] * n
        self._last_at: list[float | None] = [None] * n
        self._xids: list[list[int]] = [[] for _ in range(n)]
        self._lost: list[bool] = [False] * n
        self._devices = self._discover()
        for index in range(n):
            self._read_energy_counter(index)  # energy counts from now
        self._events = self._open_xid_events()
        driver = self._try(-1, "driver version", nvml.nvmlSystemGetDriverVersion, default="unknown")
        names = sorted({d.name for d in self._devices})
        self.description = f"nvml: {n} GPU(s) ({', '.join(names)}), driver {_text(driver)}"

    # -- GpuProvider ---------------------------------------------------------------------------------

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def sample(self, now: float | None = None) -> list[GpuSample]:
        at = time.time() if now is None else now
        with self._lock:
            if self._closed:
                raise GpuUnavailable("the NVML provider is closed; open a new one with open_provider('nvml')")
            self._drain_xid_events()
            return [self._sample_one(index, at) for index in range(len(self._devices))]

    def attach(self, index: int, pids: Sequence[int]) -> None:
        """NVML sees the real processes on each GPU, so this only checks the index."""
        if not 0 <= index < len(self._devices):
            last = len(self._devices) - 1
            raise IndexError(f"GPU index {index} does not exist; this machine has GPUs 0..{last}")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._events is not None:
                self._try(-1, "event set free", self._nvml.nvmlEventSetFree, self._events, default=None)
                self._events = None
            self._shutdown()

    # -- internals ------------------------------------------------------------------------------------

    def _const(self, name: str) -> Any:
        return getattr(self._nvml, name, _DEFAULTS[name])

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:  # shutting down must never raise over the real error
            log.debug("event=nvml_shutdown_failed error=%s", exc)

    def _try(self, index: int, what: str, call: Callable[..., T], *args: Any, default: T) -> T:
        """Call NVML; on an NVML error log once per (GPU, query) and return `default`."""
        try:
            return call(*args)
        except self._error as exc:
            if self._lost_error is not None and isinstance(exc, self._lost_error) and index >= 0:
                self._mark_lost(index)
            if (index, what) not in self._reported:
                self._reported.add((index, what))
                unsupported = self._not_supported is not None and isinstance(exc, self._not_supported)
                level = logging.DEBUG if unsupported else logging.WARNING
                log.log(level, "event=nvml_query_failed gpu=%d query=%r error=%r", index, what, str(exc))
            return default

    def _mark_lost(self, index: int) -> None:
        if not self._lost[index]:
            self._lost[index] = True
            self._record_xid(index, XID_GPU_FALLEN_OFF_BUS)

    def _record_xid(self, index: int, code: int) -> None:
        self._xids[index] = [*self._xids[index], code][-XID_HISTORY:]

    def _discover(self) -> list[GpuDevice]:
        nvml = self._nvml
        names: list[str] = []
        uuids: list[str] = []
        totals: list[int] = []
        bus_ids: list[str] = []
        peers: list[list[str]] = []
        for index, handle in enumerate(self._handles):
            name = self._try(index, "name", nvml.nvmlDeviceGetName, handle, default="NVIDIA GPU")
            names.append(_text(name))
            gpu_uuid = self._try(index, "uuid", nvml.nvmlDeviceGetUUID, handle, default=f"GPU-{index}")
            uuids.append(_text(gpu_uuid))
            memory = self._try(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle, default=None)
            totals.append(int(memory.total) if memory is not None else 0)
            pci = self._try(index, "pci info", nvml.nvmlDeviceGetPciInfo, handle, default=None)
            bus_ids.append(normalize_bus_id(pci.busId) if pci is not None else f"gpu-{index}")
            peers.append(self._nvlink_peers(index, handle))
        islands = nvlink_islands(bus_ids, peers)
        return [
            GpuDevice(
                index=index,
                uuid=uuids[index],
                model=model_from_product_name(names[index]),
                name=names[index],
                memory_bytes=totals[index],
                nvlink_island=islands[index],
            )
            for index in range(len(self._handles))
        ]

    def _nvlink_peers(self, index: int, handle: Any) -> list[str]:
        """What the active NVLinks of one GPU reach; empty for PCIe-only GPUs or when NVML cannot tell."""
        nvml = self._nvml
        peers: list[str] = []
        for link in range(int(self._const("NVML_NVLINK_MAX_LINKS"))):
            try:
                if int(nvml.nvmlDeviceGetNvLinkState(handle, link)) != self._const("NVML_FEATURE_ENABLED"):
                    continue
            except self._error as exc:
                if self._not_supported is not None and isinstance(exc, self._not_supported) and link == 0:
                    break  # no NVLink on this GPU at all
                continue  # links past the GPU's last one are invalid arguments
            remote_type = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)  # NVML >= 11.0
            kind = None
            if remote_type is not None:
                kind = self._try(index, "nvlink remote type", remote_type, handle, link, default=None)
            if kind is not None and int(kind) == self._const("NVML_NVLINK_DEVICE_TYPE_SWITCH"):
                peers.append(_NVSWITCH)
                continue
            remote = self._try(
                index, "nvlink remote pci", nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link, default=None
            )
            if remote is not None:
                peers.append(normalize_bus_id(remote.busId))
        return peers

    def _open_xid_events(self) -> Any | None:
        """An event set listening for Xid critical errors on every GPU that supports it, else None."""
        nvml = self._nvml
        events = self._try(-1, "event set", nvml.nvmlEventSetCreate, default=None)
        if events is None:
            return None
        registered = 0
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, self._const("nvmlEventTypeXidCriticalError"), events)
                registered += 1
            except self._error as exc:  # unsupported on some GPUs and in unprivileged containers
                log.debug("event=nvml_xid_events_unavailable gpu=%d error=%r", index, str(exc))
        if registered == 0:
            self._try(-1, "event set free", nvml.nvmlEventSetFree, events, default=None)
            return None
        return events

    def _drain_xid_events(self) -> None:
        if self._events is None:
            return
        nvml = self._nvml
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                data = nvml.nvmlEventSetWait(self._events, 0)
            except self._error:
                return  # NVMLError_Timeout: nothing pending
            index = self._try(-1, "event device index", nvml.nvmlDeviceGetIndex, data.device, default=-1)
            if 0 <= int(index) < len(self._devices):
                self._record_xid(int(index), int(data.eventData))

    def _read_energy_counter(self, index: int) -> float | None:
        """Joules since the provider opened, from NVML's millijoule counter; None when unsupported."""
        raw = self._try(
            index,
            "total energy",
            self._nvml.nvmlDeviceGetTotalEnergyConsumption,
            self._handles[index],
            default=None,
        )
        if raw is None:
            return None
        millijoules = float(raw)
        base = self._energy_base_mj[index]
        if base is None:
            self._energy_base_mj[index] = base = millijoules
        return (millijoules - base) / 1000.0

    def _optional(self, index: int, what: str, name: str, *args: Any, default: T) -> T:
        """Like `_try` for NVML calls that older nvidia-ml-py releases lack: a missing one gives `default`."""
        call = getattr(self._nvml, name, None)
        if call is None:
            return default
        return self._try(index, what, call, *args, default=default)

    def _memory_temperature(self, index: int, handle: Any) -> float | None:
        """HBM temperature through NVML's field values (NVML_FI_DEV_MEMORY_TEMP); None when unsupported."""
        values = self._optional(
            index,
            "memory temperature",
            "nvmlDeviceGetFieldValues",
            handle,
            [self._const("NVML_FI_DEV_MEMORY_TEMP")],
            default=None,
        )
        if not values or getattr(values[0], "nvmlReturn", 1) != 0:
            return None
        value = getattr(values[0], "value", None)
        reading = getattr(value, "uiVal", None) if value is not None else None
        return float(reading) if reading else None

    def _nvlink_state(self, handle: Any) -> tuple[int, int]:
        """(links up, links the GPU has); (0, 0) for PCIe-only GPUs."""
        up = total = 0
        for link in range(int(self._const("NVML_NVLINK_MAX_LINKS"))):
            try:
                state = int(self._nvml.nvmlDeviceGetNvLinkState(handle, link))
            except self._error as exc:
                if self._not_supported is not None and isinstance(exc, self._not_supported) and link == 0:
                    break
                continue  # links past the GPU's last one are invalid arguments
            total += 1
            up += state == self._const("NVML_FEATURE_ENABLED")
        return up, total

    def _health_fields(self, index: int, handle: Any) -> dict[str, Any]:
        """The readings health checks and dcgm-exporter's series need beyond the basic sample."""
        ecc_total = self._nvml.nvmlDeviceGetTotalEccErrors

        def ecc(what: str, error_type: str, counter: str) -> int:
            args = (self._const(error_type), self._const(counter))
            return int(self._try(index, what, ecc_total, handle, *args, default=0))

        mask = int(
            self._optional(
                index, "throttle reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", handle, default=0
            )
        )
        remapped = self._optional(index, "remapped rows", "nvmlDeviceGetRemappedRows", handle, default=None)
        corr_rows, unc_rows, pending, failure = remapped if remapped is not None else (0, 0, 0, 0)
        up, total = self._nvlink_state(handle)
        return {
            "memory_temperature_c": self._memory_temperature(index, handle),
            "throttle_reasons": tuple(name for bit, name in THROTTLE.items() if mask & bit),
            "pcie_replay_errors": int(
                self._optional(index, "pcie replay", "nvmlDeviceGetPcieReplayCounter", handle, default=0)
            ),
            "pcie_link_gen": int(
                self._optional(index, "pcie gen", "nvmlDeviceGetCurrPcieLinkGeneration", handle, default=0)
            ),
            "pcie_link_gen_max": int(
                self._optional(index, "pcie max gen", "nvmlDeviceGetMaxPcieLinkGeneration", handle, default=0)
            ),
            "pcie_link_width": int(
                self._optional(index, "pcie width", "nvmlDeviceGetCurrPcieLinkWidth", handle, default=0)
            ),
            "pcie_link_width_max": int(
                self._optional(index, "pcie max width", "nvmlDeviceGetMaxPcieLinkWidth", handle, default=0)
            ),
            "ecc_corrected": ecc("ecc corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
            "ecc_corrected_aggregate": ecc(
                "ecc corrected aggregate", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"
            ),
            "ecc_uncorrected_aggregate": ecc(
                "ecc uncorrected aggregate", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"
            ),
            "remapped_rows_correctable": int(corr_rows),
            "remapped_rows_uncorrectable": int(unc_rows),
            "remapped_rows_pending": bool(pending),
            "remapped_rows_failure": bool(failure),
            "nvlink_links_up": up,
            "nvlink_links_total": total,
        }

    def _sample_one(self, index: int, at: float) -> GpuSample:
        nvml, handle, device = self._nvml, self._handles[index], self._devices[index]
        rates = self._try(index, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle, default=None)
        memory = self._try(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle, default=None)
        temperature = self._try(
            index,
            "temperature",
            nvml.nvmlDeviceGetTemperature,
            handle,
            self._const("NVML_TEMPERATURE_GPU"),
            default=0,
        )
        power_mw = self._try(index, "power", nvml.nvmlDeviceGetPowerUsage, handle, default=0)
        sm_clock = self._try(
            index, "sm clock", nvml.nvmlDeviceGetClockInfo, handle, self._const("NVML_CLOCK_SM"), default=0
        )
        mem_clock = self._try(
            index,
            "memory clock",
            nvml.nvmlDeviceGetClockInfo,
            handle,
            self._const("NVML_CLOCK_MEM"),
            default=0,
        )
        ecc = self._try(
            index,
            "ecc uncorrected",
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
            self._const("NVML_VOLATILE_ECC"),
            default=0,
        )
        power_w = float(power_mw) / 1000.0
        counted = self._read_energy_counter(index)
        if counted is not None:
            energy = max(self._energy_j[index], counted)
        else:  # no counter (pre-Volta GPUs): integrate the power readings
            last_at, last_power = self._last_at[index], self._last_power_w[index]
            elapsed = 0.0 if last_at is None else max(0.0, at - last_at)
            previous = power_w if last_power is None else last_power
            energy = self._energy_j[index] + 0.5 * (previous + power_w) * elapsed
        self._energy_j[index] = energy
        self._last_power_w[index] = power_w
        self._last_at[index] = at
        return GpuSample(
            index=index,
            uuid=device.uuid,
            at=at,
            utilization_pct=float(rates.gpu) if rates is not None else 0.0,
            memory_used_bytes=int(memory.used) if memory is not None else 0,
            memory_total_bytes=int(memory.total) if memory is not None else device.memory_bytes,
            temperature_c=float(temperature),
            power_w=power_w,
            energy_j=energy,
            sm_clock_mhz=float(sm_clock),
            mem_clock_mhz=float(mem_clock),
            ecc_uncorrected=int(ecc),
            xid_errors=tuple(self._xids[index]),
            memory_copy_util_pct=float(rates.memory) if rates is not None else 0.0,
            lost=self._lost[index],
            **self._health_fields(index, handle),
        )
