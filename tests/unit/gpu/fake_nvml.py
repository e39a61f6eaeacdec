"""A small stand-in for the pynvml module: just enough NVML to test NvmlProvider's conversions."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # pynvml spells its error classes this way
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


SWITCH = "switch"  # an NVLink peer that is an NVSwitch rather than a GPU


@dataclass
class FakeGpu:
    name: str | bytes = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: bytes = b"00000000:18:00.0"
    total: int = 81559 * 1024 * 1024
    used: int = 0
    util: int = 0
    temperature: int = 35
    power_mw: int = 70_000
    energy_mj: int = 0
    sm_clock: int = 345
    mem_clock: int = 2619
    ecc_uncorrected: int = 0
    nvlinks: list[str] = field(default_factory=list)  # peer bus ids (NVML's short spelling) or SWITCH
    unsupported: set[str] = field(default_factory=set)  # names of nvml functions that raise NotSupported
    lost: bool = False  # every query raises GpuIsLost


class FakeNvml:
    """Module-like object; GPUs are indexed by position and handles are plain ints."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, gpus: list[FakeGpu], *, init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0
        self.pending_events: list[tuple[int, int]] = []  # (gpu index, xid)
        self.xid_registered: set[int] = set()

    def _gpu(self, handle: int, call: str) -> FakeGpu:
        gpu = self.gpus[handle]
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        if call in gpu.unsupported:
            raise NVMLError_NotSupported()
        return gpu

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._gpu(handle, "nvmlDeviceGetPciInfo").bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=gpu.total, used=gpu.used, free=gpu.total - gpu.used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._gpu(handle, "nvmlDeviceGetUtilizationRates").util, memory=0)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == 0
        return self._gpu(handle, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        return {1: gpu.sm_clock, 2: gpu.mem_clock}[clock]

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if error_type == 1:  # uncorrected; volatile (0) or aggregate (1), which equal here
            return gpu.ecc_uncorrected
        return 0  # corrected

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNvLinkState")
        if link >= len(gpu.nvlinks):
            raise NVMLError_InvalidArgument()
        return 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        return 2 if self.gpus[handle].nvlinks[link] == SWITCH else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self.gpus[handle].nvlinks[link])

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, event_set: str) -> None:
        self._gpu(handle, "nvmlDeviceRegisterEvents")
        assert event_types == 0x8 and event_set == "event-set"
        self.xid_registered.add(handle)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0, "sampling must never block on events"
        if not self.pending_events:
            raise NVMLError_Timeout()
        index, xid = self.pending_events.pop(0)
        return SimpleNamespace(device=index, eventType=0x8, eventData=xid)

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass
