"""Simulated GPUs whose telemetry follows the real processes running "on" them.

A machine without GPUs (CI, a laptop, a demo) still runs real work: the executor tells the provider which
process trees it started on which GPU (`attach`), and the simulated GPU's utilization follows the CPU use
of those trees, its memory their resident memory plus a CUDA context, its temperature and power the
utilization. Nothing here is random: UUIDs and per-GPU quirks derive from a seed (the host name by default).

Each look counts the CPU seconds the trees used since the look before: of processes seen then, the
difference; of processes born since, all of it; of those that ended and were reaped by a process still in
the trees, what their parent's children's time gained beyond what was seen of them. Only the CPU of a tree
whose last process ended since the last look is lost (nothing is left to ask): up to one sample period.
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

from gpupool import process_start
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
XID_FALLEN_OFF_BUS = 79
THROTTLE_FAULTS: dict[str, tuple[str, ...]] = {  # `inject-fault --throttle KIND` -> NVML reasons it raises
    "thermal": ("hw_thermal", "sw_thermal"),
    "power": ("sw_power_cap", "hw_power_brake"),
}
THROTTLED_TEMPERATURE_C = 92.0  # where a thermally throttling H100 sits (its slowdown starts near 90 C)
THROTTLED_CLOCK_SHARE = 0.6  # share of the max SM clock a throttled GPU still runs at
NVLINK_LINKS = {"B200": 18, "H200": 18, "H100": 18, "A100": 12, "V100": 6}  # links per SXM GPU
PCIE_GEN = {"B200": 5, "H200": 5, "H100": 5, "L40S": 4, "L4": 4, "A100": 4, "A10": 4, "RTX4090": 4}
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "sim.gpupool")

ProcessKey = tuple[int, float]  # (pid, process_start.started): a pid alone can be reused by a new process


@dataclass(frozen=True)
class ProcessTreeUsage:
    """CPU seconds and resident memory of every process in some process trees.

    A process's CPU seconds include those of the children it has reaped (the kernel adds them to its own
    `cutime` and `cstime` when it waits for them), so the CPU of a command that ended between two looks is
    not lost: it moves into its parent's figure. `parents` names the parent of each process whose parent
    is in the trees too. Zombies (ended, not yet reaped) keep their final CPU seconds and hold no memory.
    """

    cpu_seconds: dict[ProcessKey, float] = field(default_factory=dict)
    rss_bytes: int = 0
    parents: dict[ProcessKey, ProcessKey] = field(default_factory=dict)
    alive: bool = False  # some process in the trees still runs


def measure_process_trees(pids: Sequence[int]) -> ProcessTreeUsage:
    """Usage of the trees rooted at `pids`; dead and inaccessible processes are skipped silently."""
    cpu: dict[ProcessKey, float] = {}
    keys: dict[ProcessKey, int] = {}  # key -> parent pid
    rss = 0
    alive = False
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in tree:
            try:
                with proc.oneshot():
                    start = process_start.started(proc.pid)
                    if start is None:
                        continue  # ended since it was listed
                    key = (proc.pid, start.seconds)
                    if key in cpu:
                        continue  # the same process reached through two attached pids
                    zombie = proc.status() == psutil.STATUS_ZOMBIE
                    times = proc.cpu_times()
                    parent = proc.ppid()
                    resident = 0 if zombie else proc.memory_info().rss
            except psutil.Error:
                continue
            cpu[key] = times.user + times.system + times.children_user + times.children_system
            keys[key] = parent
            rss += resident
            alive = alive or not zombie
    by_pid = {key[0]: key for key in cpu}
    parents = {key: by_pid[ppid] for key, ppid in keys.items() if ppid in by_pid}
    return ProcessTreeUsage(cpu, rss, parents, alive)


@dataclass
class _SimulatedGpu:
    """Mutable state of one simulated GPU; only touched under the provider's lock."""

    device: GpuDevice
    info: GpuModelInfo
    temperature_offset_c: float  # a fixed per-GPU quirk so eight GPUs do not read identically
    pids: tuple[int, ...] = ()
    cpu_seen: dict[ProcessKey, float] = field(default_factory=dict)
    parents_seen: dict[ProcessKey, ProcessKey] = field(default_factory=dict)
    newly_attached: bool = False  # count the whole CPU time of processes first seen at the next look
    last_monotonic: float | None = None
    last_look: float = 0.0  # process_start.clock() at the last look at the processes
    utilization_pct: float = 0.0
    memory_used_bytes: int = 0
    temperature_c: float = IDLE_TEMPERATURE_C
    forced_temperature_c: float | None = None
    last_at: float | None = None
    power_w: float = 0.0
    energy_j: float = 0.0
    ecc_uncorrected: int = 0
    xids: list[int] = field(default_factory=list)
    # Fault injection (`gpupool node inject-fault`): what the next readings and active checks show.
    remapped_rows_uncorrectable: int = 0
    remapped_rows_pending: bool = False
    throttle: tuple[str, ...] = ()
    slow_factor: float = 1.0  # active checks measure this share of the expected figures
    lost: bool = False

    def observe_processes(self, now_monotonic: float) -> None:
        """Update utilization and memory from the attached process trees."""
        usage = measure_process_trees(self.pids) if self.pids else ProcessTreeUsage()
        raw_pct = 0.0
        elapsed = None if self.last_monotonic is None else now_monotonic - self.last_monotonic
        if elapsed is not None and elapsed > 0:
            raw_pct = min(100.0, 100.0 * self._busy_seconds(usage) / elapsed)
        if elapsed is None:
            self.utilization_pct = raw_pct
        elif elapsed > 0:
            weight = 1.0 - math.exp(-elapsed / UTILIZATION_TIME_CONSTANT_S)
            self.utilization_pct += weight * (raw_pct - self.utilization_pct)
        if self.utilization_pct < 0.05:
            self.utilization_pct = 0.0
        self.cpu_seen = dict(usage.cpu_seconds)
        self.parents_seen = dict(usage.parents)
        self.newly_attached = False
        self.last_monotonic = now_monotonic
        self.last_look = process_start.clock()
        total = self.device.memory_bytes
        self.memory_used_bytes = min(total, CUDA_CONTEXT_BYTES + usage.rss_bytes) if usage.alive else 0

    def _busy_seconds(self, usage: ProcessTreeUsage) -> float:
        """CPU seconds the trees used since the last look."""
        busy = 0.0
        for key, seconds in usage.cpu_seconds.items():
            previous = self.cpu_seen.get(key)
            if previous is not None:
                busy += max(0.0, seconds - previous)
            elif key[1] > self.last_look or self.newly_attached:
                busy += seconds  # born since the last look (or just attached): all its CPU time is new
        for key, previous in self.cpu_seen.items():
            if key not in usage.cpu_seconds and self._reaped_within(key, usage):
                busy -= previous  # its whole CPU time now sits in an ancestor's figure: count it once
        return max(0.0, busy)

    def _reaped_within(self, key: ProcessKey, usage: ProcessTreeUsage) -> bool:
        """Whether a process gone since the last look has an ancestor still in the trees, whose reaped
        children's time now holds its own (through any parents that ended with it)."""
        parent = self.parents_seen.get(key)
        for _ in range(len(self.parents_seen)):  # a chain, never longer than the tree (no loop on bad data)
            if parent is None:
                return False
            if parent in usage.cpu_seconds:
                return True
            parent = self.parents_seen.get(parent)
        return False

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
        if "hw_thermal" in self.throttle:
            temperature = max(temperature, THROTTLED_TEMPERATURE_C)
        sm_clock = info.max_sm_clock_mhz if busy else info.idle_sm_clock_mhz
        if self.throttle:
            sm_clock = min(sm_clock, info.max_sm_clock_mhz * THROTTLED_CLOCK_SHARE)
        links = NVLINK_LINKS.get(info.family, 0) if info.nvlink else 0
        gen = PCIE_GEN.get(info.family, 3)
        if self.lost:  # NVML answers nothing for a GPU that fell off the bus
            return GpuSample(
                index=self.device.index, uuid=self.device.uuid, at=at, utilization_pct=0.0,
                memory_used_bytes=0, memory_total_bytes=self.device.memory_bytes, temperature_c=0.0,
                power_w=0.0, energy_j=self.energy_j, sm_clock_mhz=0.0, mem_clock_mhz=0.0,
                ecc_uncorrected=self.ecc_uncorrected, xid_errors=tuple(self.xids), lost=True,
            )  # fmt: skip
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
            sm_clock_mhz=sm_clock,
            mem_clock_mhz=info.max_mem_clock_mhz if busy else info.idle_mem_clock_mhz,
            ecc_uncorrected=self.ecc_uncorrected,
            xid_errors=tuple(self.xids),
            memory_copy_util_pct=round(self.utilization_pct * 0.4, 2),
            memory_temperature_c=round(temperature + 4.0, 2),
            throttle_reasons=self.throttle,
            pcie_link_gen=gen,
            pcie_link_gen_max=gen,
            pcie_link_width=16,
            pcie_link_width_max=16,
            ecc_uncorrected_aggregate=self.ecc_uncorrected,
            remapped_rows_uncorrectable=self.remapped_rows_uncorrectable,
            remapped_rows_pending=self.remapped_rows_pending,
            nvlink_links_up=links,
            nvlink_links_total=links,
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
            gpu = self._gpu(index)
            gpu.newly_attached = gpu.newly_attached or bool(set(chosen) - set(gpu.pids))
            gpu.pids = chosen

    def inject_xid(self, index: int, code: int) -> None:
        """Fault injection: GPU `index` reports Xid `code` (e.g. 79, fallen off the bus) from now on."""
        with self._lock:
            gpu = self._gpu(index)
            gpu.xids = [*gpu.xids, int(code)][-XID_HISTORY:]

    def inject_ecc_errors(self, index: int, count: int = 1) -> None:
        """Fault injection: add `count` uncorrected ECC errors to GPU `index`; HBM then has a row remap
        pending (what an A100/H100 does after an uncorrectable error) until the faults are cleared."""
        with self._lock:
            gpu = self._gpu(index)
            gpu.ecc_uncorrected += int(count)
            gpu.remapped_rows_uncorrectable += int(count)
            gpu.remapped_rows_pending = True

    def inject_throttle(self, index: int, kind: str) -> None:
        """Fault injection: GPU `index` throttles its clocks for `kind` ("thermal" or "power")."""
        if kind not in THROTTLE_FAULTS:
            raise ValueError(f"--throttle {kind}: unknown kind; one of {', '.join(THROTTLE_FAULTS)}")
        with self._lock:
            self._gpu(index).throttle = THROTTLE_FAULTS[kind]

    def inject_slowdown(self, index: int, factor: float) -> None:
        """Fault injection: active checks on GPU `index` measure `factor` (0..1] of the expected figures."""
        if not 0.0 < factor <= 1.0:
            raise ValueError(f"--slow {factor:g}: must be more than 0 and at most 1 (0.5 halves the GPU)")
        with self._lock:
            self._gpu(index).slow_factor = float(factor)

    def fall_off_bus(self, index: int) -> None:
        """Fault injection: GPU `index` stops answering and reports Xid 79, as a GPU fallen off the bus."""
        with self._lock:
            gpu = self._gpu(index)
            if not gpu.lost:
                gpu.lost = True
                gpu.xids = [*gpu.xids, XID_FALLEN_OFF_BUS][-XID_HISTORY:]

    def clear_faults(self, index: int) -> None:
        """The GPU is repaired (reset or replaced): throttling, slowness, loss and pending remaps end.
        Counters (Xids seen, ECC errors) stay, as they do on a real GPU until the driver reloads."""
        with self._lock:
            gpu = self._gpu(index)
            gpu.throttle, gpu.slow_factor, gpu.lost = (), 1.0, False
            gpu.remapped_rows_pending = False
            gpu.forced_temperature_c = None

    def condition(self, index: int) -> tuple[GpuModelInfo, float, bool]:
        """For simulated active checks: GPU `index`'s model, slowdown factor and whether it is lost."""
        with self._lock:
            gpu = self._gpu(index)
            return gpu.info, gpu.slow_factor, gpu.lost

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
