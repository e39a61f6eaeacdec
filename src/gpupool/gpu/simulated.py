"""Simulated GPUs whose telemetry follows the real processes running "on" them.

A machine without GPUs (CI, a laptop, a demo) still runs real work: the executor tells the provider which
process trees it started on which GPU (`attach`), and the simulated GPU's utilization follows the CPU use
of those trees, its memory their resident memory plus a CUDA context, its temperature and power the
utilization. Nothing here is random: UUIDs and per-GPU quirks derive from a seed (the host name by default).
"""

from __future__ import annotations

import math
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psutil

from gpupool.gpu.catalog import MIB, GpuModelInfo
from gpupool.gpu.errors import GpuSelectorError
from gpupool.gpu.selector import DEFAULT_SIMULATION, GpuSelector, parse_selector
from gpupool.gpu.types import GpuDevice, GpuSample

CUDA_CONTEXT_BYTES = 512 * MIB  # what a PyTorch process holds on a GPU before allocating anything
IDLE_TEMPERATURE_C = 32.0
FULL_LOAD_TEMPERATURE_C = 78.0
THERMAL_TIME_CONSTANT_S = 30.0  # a heatsink warms over tens of seconds, not instantly
UTILIZATION_TIME_CONSTANT_S = 0.15  # NVML averages utilization over a 1/6 s .. 1 s window
XID_HISTORY = 64  # most recent Xid codes kept per GPU
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "sim.gpupool")

ProcessKey = tuple[int, float]  # (pid, create_time): a pid alone can be reused by a new process


@dataclass(frozen=True)
class ProcessTreeUsage:
    """CPU seconds and resident memory of every live process in some process trees."""

    cpu_seconds: dict[ProcessKey, float] = field(default_factory=dict)
    rss_bytes: int = 0

    @property
    def alive(self) -> bool:
        return bool(self.cpu_seconds)


def measure_process_trees(pids: Sequence[int]) -> ProcessTreeUsage:
    """Usage of the trees rooted at `pids`; dead, zombie and inaccessible processes are skipped silently."""
    cpu: dict[ProcessKey, float] = {}
    rss = 0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in tree:
            try:
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue
                    key = (proc.pid, proc.create_time())
                    if key in cpu:
                        continue  # the same process reached through two attached pids
                    times = proc.cpu_times()
                    resident = proc.memory_info().rss
            except psutil.Error:
                continue
            cpu[key] = times.user + times.system
            rss += resident
    return ProcessTreeUsage(cpu, rss)


@dataclass
class _SimulatedGpu:
    """Mutable state of one simulated GPU; only touched under the provider's lock."""

    device: GpuDevice
    info: GpuModelInfo
    temperature_offset_c: float  # a fixed per-GPU quirk so eight GPUs do not read identically
    pids: tuple[int, ...] = ()
    cpu_seen: dict[ProcessKey, float] = field(default_factory=dict)
    last_monotonic: float | None = None
    last_wall: float = 0.0  # real unix time of the last look at the processes
    utilization_pct: float = 0.0
    memory_used_bytes: int = 0
    temperature_c: float = IDLE_TEMPERATURE_C
    forced_temperature_c: float | None = None
    last_at: float | None = None
    power_w: float = 0.0
    energy_j: float = 0.0
    ecc_uncorrected: int = 0
    xids: list[int] = field(default_factory=list)

    def observe_processes(self, now_monotonic: float) -> None:
        """Update utilization and memory from the attached process trees."""
        usage = measure_process_trees(self.pids) if self.pids else ProcessTreeUsage()
        raw_pct = 0.0
        elapsed = None if self.last_monotonic is None else now_monotonic - self.last_monotonic
        if elapsed is not None and elapsed > 0:
            busy = 0.0
            for key, seconds in usage.cpu_seconds.items():
                previous = self.cpu_seen.get(key)
                if previous is not None:
                    busy += max(0.0, seconds - previous)
                elif key[1] > self.last_wall:
                    busy += seconds  # born since the last look: all its CPU time is new
            raw_pct = min(100.0, 100.0 * busy / elapsed)
        if elapsed is None:
            self.utilization_pct = raw_pct
        elif elapsed > 0:
            weight = 1.0 - math.exp(-elapsed / UTILIZATION_TIME_CONSTANT_S)
            self.utilization_pct += weight * (raw_pct - self.utilization_pct)
        if self.utilization_pct < 0.05:
            self.utilization_pct = 0.0
        self.cpu_seen = dict(usage.cpu_seconds)
        self.last_monotonic = now_monotonic
        self.last_wall = time.time()
        total = self.device.memory_bytes
        self.memory_used_bytes = min(total, CUDA_CONTEXT_BYTES + usage.rss_bytes) if usage.alive else 0

    def advance_physics(self, at: float) -> None:
        """Move temperature, power and energy forward to time `at` (a clock going backwards counts as 0 s)."""
        load = self.utilization_pct / 100.0
        idle_c = IDLE_TEMPERATURE_C + self.temperature_offset_c
        target_c = idle_c + (FULL_LOAD_TEMPERATURE_C - IDLE_TEMPERATURE_C) * load
        power_w = self.info.idle_w + (self.info.tdp_w - self.info.idle_w) * load
        if self.last_at is None:
            self.temperature_c = idle_c
        else:
            elapsed = max(0.0, at - self.last_at)
            self.temperature_c += (1.0 - math.exp(-elapsed / THERMAL_TIME_CONSTANT_S)) * (
                target_c - self.temperature_c
            )
            self.energy_j += 0.5 * (self.power_w + power_w) * elapsed
        self.power_w = power_w
        self.last_at = at if self.last_at is None else max(at, self.last_at)

    def reading(self, at: float) -> GpuSample:
        busy = self.utilization_pct >= 1.0
        info = self.info
        forced = self.forced_temperature_c
        temperature = forced if forced is not None else self.temperature_c
        return GpuSample(
            index=self.device.index,
            uuid=self.device.uuid,
            at=at,
            utilization_pct=round(self.utilization_pct, 2),
            memory_used_bytes=self.memory_used_bytes,
            memory_total_bytes=self.device.memory_bytes,
            temperature_c=round(temperature, 2),
            power_w=round(self.power_w, 3),
            energy_j=self.energy_j,
            sm_clock_mhz=info.max_sm_clock_mhz if busy else info.idle_sm_clock_mhz,
            mem_clock_mhz=info.max_mem_clock_mhz if busy else info.idle_mem_clock_mhz,
            ecc_uncorrected=self.ecc_uncorrected,
            xid_errors=tuple(self.xids),
        )


def simulated_devices(selector: GpuSelector, seed: str) -> list[tuple[GpuDevice, GpuModelInfo]]:
    """Devices for a "sim:" selector: each NVLink group shares an island, each PCIe GPU gets its own."""
    devices: list[tuple[GpuDevice, GpuModelInfo]] = []
    island = 0
    for count, info in selector.groups:
        for position in range(count):
            index = len(devices)
            if not info.nvlink and position > 0:
                island += 1
            gpu_uuid = uuid.uuid5(_UUID_NAMESPACE, f"{seed}/{index}/{info.key}")
            device = GpuDevice(
                index=index,
                uuid=f"GPU-{gpu_uuid}",
                model=info.family,
                name=info.product_name,
                memory_bytes=info.memory_bytes,
                nvlink_island=island,
                simulated=True,
            )
            devices.append((device, info))
        island += 1
    return devices


class SimulatedProvider:
    """GpuProvider for machines without GPUs; thread-safe."""

    kind = "sim"

    def __init__(
        self,
        spec: str | GpuSelector = DEFAULT_SIMULATION,
        *,
        seed: str | None = None,
        description: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(spec, GpuSelector):
            selector = spec
        else:
            text = spec.strip()
            selector = parse_selector(text if text.lower().startswith("sim:") else f"sim:{text}")
        if selector.kind != "sim":
            raise GpuSelectorError(f"--gpus: simulated GPUs need a sim:<count>x<model> value, got {spec!r}")
        self.selector = selector
        self.seed = seed if seed is not None else socket.gethostname()
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._gpus: list[_SimulatedGpu] = []
        for device, info in simulated_devices(selector, self.seed):
            quirk = int(device.uuid[4:8], 16) / 0xFFFF * 3.0 - 1.5  # -1.5 .. +1.5 C, fixed per UUID
            self._gpus.append(
                _SimulatedGpu(
                    device=device,
                    info=info,
                    temperature_offset_c=quirk,
                    temperature_c=IDLE_TEMPERATURE_C + quirk,
                    power_w=info.idle_w,
                )
            )
        groups = ", ".join(f"{count}x {info.product_name}" for count, info in selector.groups)
        self.description = description or f"{selector.text} (simulated: {groups})"

    def devices(self) -> list[GpuDevice]:
        return [gpu.device for gpu in self._gpus]

    def sample(self, now: float | None = None) -> list[GpuSample]:
        """One reading per GPU; `now` (unix or virtual seconds) drives temperature and energy."""
        at = time.time() if now is None else now
        with self._lock:
            readings = []
            for gpu in self._gpus:
                gpu.observe_processes(self._monotonic())
                gpu.advance_physics(at)
                readings.append(gpu.reading(at))
            return readings

    def attach(self, index: int, pids: Sequence[int]) -> None:
        """Run these process trees on GPU `index` from now on (empty: the GPU is idle)."""
        chosen = tuple(int(pid) for pid in pids)
        bad = [pid for pid in chosen if pid < 1]  # pid 0 would stand for every process on the host
        if bad:
            raise ValueError(f"attach: process ids must be positive, got {bad} for GPU {index}")
        with self._lock:
            self._gpu(index).pids = chosen

    def inject_xid(self, index: int, code: int) -> None:
        """Fault injection: GPU `index` reports Xid `code` (e.g. 79, fallen off the bus) from now on."""
        with self._lock:
            gpu = self._gpu(index)
            gpu.xids = [*gpu.xids, int(code)][-XID_HISTORY:]

    def inject_ecc_errors(self, index: int, count: int = 1) -> None:
        """Fault injection: add `count` uncorrected ECC errors to GPU `index`."""
        with self._lock:
            self._gpu(index).ecc_uncorrected += int(count)

    def force_temperature(self, index: int, celsius: float | None) -> None:
        """Fault injection: pin GPU `index` at `celsius` (None: back to the thermal model)."""
        with self._lock:
            self._gpu(index).forced_temperature_c = celsius

    def close(self) -> None:
        with self._lock:
            for gpu in self._gpus:
                gpu.pids = ()

    def _gpu(self, index: int) -> _SimulatedGpu:
        if not 0 <= index < len(self._gpus):
            last = len(self._gpus) - 1
            raise IndexError(f"GPU index {index} does not exist; this machine has GPUs 0..{last}")
        return self._gpus[index]
