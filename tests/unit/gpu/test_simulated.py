"""Simulated GPUs: realistic devices, and telemetry that follows the real processes attached to them."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.gpu import GpuDevice, GpuSample, SimulatedProvider
from gpupool.gpu.simulated import CUDA_CONTEXT_BYTES

UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUSY_LOOP = "while True: pass"
# A GPU with a busy loop attached reads as busy as the CPU share the loop really got (about 100% on an idle
# core, less when other work shares the cores), within this many points; idle GPUs read 0.
TRACKS = 40.0


def start(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: takes its children too
    proc.wait(timeout=5)


@pytest.fixture
def busy_process() -> Iterator[subprocess.Popen[bytes]]:
    proc = start(BUSY_LOOP)
    yield proc
    stop(proc)


def sample_for(provider: SimulatedProvider, seconds: float, step: float = 0.1) -> list[GpuSample]:
    deadline = time.monotonic() + seconds
    readings = provider.sample()
    while time.monotonic() < deadline:
        time.sleep(step)
        readings = provider.sample()
    return readings


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and its descendants so far."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in (root, *root.children(recursive=True)):
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def busy_reading(provider: SimulatedProvider, pid: int, seconds: float) -> tuple[list[GpuSample], float]:
    """Samples after `seconds`, and the CPU share (in %) the process tree got over the last second of it,
    the window the reading averages over."""
    sample_for(provider, seconds - 1.0)
    before, started = cpu_seconds(pid), time.monotonic()
    readings = sample_for(provider, 1.0)
    return readings, 100.0 * (cpu_seconds(pid) - before) / (time.monotonic() - started)


def test_sim_8xh100_gives_eight_h100_with_80gb_class_memory_in_one_nvlink_island() -> None:
    devices = SimulatedProvider("sim:8xH100", seed="node-a").devices()
    assert [d.index for d in devices] == list(range(8))
    assert {d.model for d in devices} == {"H100"}
    assert {d.name for d in devices} == {"NVIDIA H100 80GB HBM3"}
    assert all(80 * 1000**3 < d.memory_bytes < 80 * 1024**3 for d in devices)
    assert {d.nvlink_island for d in devices} == {0}
    assert all(d.simulated for d in devices)


def test_pcie_gpus_each_get_their_own_island() -> None:
    devices = SimulatedProvider("sim:2xL4", seed="node-a").devices()
    assert [d.nvlink_island for d in devices] == [0, 1]
    assert {d.model for d in devices} == {"L4"}


def test_mixed_machines_keep_nvlink_groups_together_and_pcie_gpus_apart() -> None:
    devices = SimulatedProvider("sim:4xH100,2xL4,2xA100-40GB", seed="node-a").devices()
    assert [d.nvlink_island for d in devices] == [0, 0, 0, 0, 1, 2, 3, 3]
    assert [d.model for d in devices] == ["H100"] * 4 + ["L4"] * 2 + ["A100"] * 2


def test_uuids_look_real_and_are_deterministic_per_seed() -> None:
    first = SimulatedProvider("sim:8xH100", seed="node-a").devices()
    again = SimulatedProvider("8xH100", seed="node-a").devices()
    other = SimulatedProvider("sim:8xH100", seed="node-b").devices()
    assert all(UUID.match(d.uuid) for d in first)
    assert len({d.uuid for d in first}) == 8
    assert [d.uuid for d in first] == [d.uuid for d in again]
    assert not {d.uuid for d in first} & {d.uuid for d in other}


def test_idle_gpus_read_zero_utilization_and_no_memory_used() -> None:
    provider = SimulatedProvider("sim:2xH100", seed="t")
    for reading in sample_for(provider, 0.3):
        assert reading.utilization_pct == 0.0
        assert reading.memory_used_bytes == 0
        assert reading.power_w == pytest.approx(70.0)
        assert reading.sm_clock_mhz == 345.0
        assert 29.0 <= reading.temperature_c <= 35.0


def test_utilization_and_memory_follow_an_attached_busy_process(
    busy_process: subprocess.Popen[bytes],
) -> None:
    provider = SimulatedProvider("sim:2xH100", seed="t")
    provider.attach(0, [busy_process.pid])
    (gpu0, gpu1), share = busy_reading(provider, busy_process.pid, 1.5)
    assert gpu0.utilization_pct > 5.0 and abs(gpu0.utilization_pct - share) < TRACKS
    assert CUDA_CONTEXT_BYTES < gpu0.memory_used_bytes < gpu0.memory_total_bytes
    assert gpu0.power_w > gpu1.power_w
    assert gpu0.sm_clock_mhz == 1980.0
    assert gpu1.utilization_pct == 0.0 and gpu1.memory_used_bytes == 0

    provider.attach(0, [])
    gpu0, _ = sample_for(provider, 0.8)
    assert gpu0.utilization_pct < 5.0
    assert gpu0.memory_used_bytes == 0


def test_telemetry_counts_the_children_of_an_attached_process() -> None:
    parent = start(f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BUSY_LOOP!r}])")
    try:
        provider = SimulatedProvider("sim:1xA100-80GB", seed="t")
        provider.attach(0, [parent.pid])
        (gpu0,), share = busy_reading(provider, parent.pid, 1.5)
        assert gpu0.utilization_pct > 5.0 and abs(gpu0.utilization_pct - share) < TRACKS
    finally:
        stop(parent)


def test_gpu_seconds_read_add_up_to_the_cpu_seconds_of_commands_that_start_and_end_between_looks() -> None:
    """A job script runs its commands one after another (the local executor's bash): each is born after
    one look and ends before another. Its whole CPU time shows on the GPU: none of a command's first moments
    (psutil dates a process by the boot time, a whole second, so it can seem born before the look) and none
    of its last ones (ended and reaped by the shell, they are in the shell's children's time)."""
    # Each command spins until it has had 0.7 s of CPU, however busy the box (a wall-clock loop gets less
    # under load: 0.63 s for both at CI's -n 4).
    busy = "import time\nwhile time.process_time() < 0.7: pass"
    script = f"{sys.executable} -c '{busy}'; {sys.executable} -c '{busy}'; sleep 1.5"
    provider = SimulatedProvider("sim:1xH100", seed="t")
    looks = [provider.sample()[0]]
    proc = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)
    provider.attach(0, [proc.pid])
    while True:
        time.sleep(0.5)
        looks.append(provider.sample()[0])
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)  # the whole tree's CPU once it has ended
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
    # A reading's `at` is taken inside sample, by the look: a test preempted between looks skews nothing.
    seen = sum(r.utilization_pct / 100 * (r.at - before.at) for before, r in itertools.pairwise(looks))
    used = rusage.ru_utime + rusage.ru_stime
    assert used >= 1.4
    assert abs(seen - used) < 0.25, (seen, used, [round(r.utilization_pct) for r in looks])


def test_a_killed_process_is_ignored_and_the_gpu_falls_back_to_idle(
    busy_process: subprocess.Popen[bytes],
) -> None:
    provider = SimulatedProvider("sim:1xH100", seed="t")
    provider.attach(0, [busy_process.pid, 999_999_999])  # the second pid never existed
    (gpu0,), share = busy_reading(provider, busy_process.pid, 1.5)
    assert gpu0.utilization_pct > 5.0 and abs(gpu0.utilization_pct - share) < TRACKS
    stop(busy_process)
    (gpu0,) = sample_for(provider, 0.8)
    assert gpu0.utilization_pct < 5.0
    assert gpu0.memory_used_bytes == 0


def test_temperature_lags_towards_the_load_and_stays_realistic(busy_process: subprocess.Popen[bytes]) -> None:
    provider = SimulatedProvider("sim:2xH100", seed="t")
    provider.attach(0, [busy_process.pid])
    virtual = 1_000.0
    temperatures = []
    for _ in range(12):
        time.sleep(0.1)
        virtual += 30.0  # 30 virtual seconds between readings: long enough to heat up
        gpu0, gpu1 = provider.sample(now=virtual)
        temperatures.append(gpu0.temperature_c)
        assert 25.0 <= gpu1.temperature_c <= 35.0
    assert temperatures[1] < 70.0  # 30 s into the load the heatsink is still warming up
    assert temperatures[-1] > gpu1.temperature_c + 5.0  # the loaded GPU runs above the idle one
    assert all(25.0 <= t <= 80.0 for t in temperatures)  # no overshoot past the full-load temperature


def test_energy_integrates_power_over_the_sample_clock() -> None:
    provider = SimulatedProvider("sim:1xH100", seed="t")
    provider.sample(now=100.0)
    (reading,) = provider.sample(now=200.0)
    assert reading.energy_j == pytest.approx(70.0 * 100.0)  # idle H100 draws 70 W


@settings(max_examples=50, deadline=None)
@given(steps=st.lists(st.floats(min_value=-50.0, max_value=500.0), min_size=1, max_size=20))
def test_energy_never_decreases_and_temperatures_stay_realistic(steps: list[float]) -> None:
    provider = SimulatedProvider("sim:2xL4", seed="t")
    now, previous = 1_000.0, [0.0, 0.0]
    for step in steps:
        now += step  # including clocks that go backwards
        readings = provider.sample(now=now)
        for reading in readings:
            assert reading.energy_j >= previous[reading.index]
            assert 25.0 <= reading.temperature_c <= 90.0
            previous[reading.index] = reading.energy_j


def test_injected_faults_show_up_in_samples() -> None:
    provider = SimulatedProvider("sim:2xH100", seed="t")
    provider.inject_xid(1, 79)
    provider.inject_ecc_errors(1, 3)
    provider.force_temperature(1, 95.0)
    healthy, faulty = provider.sample()
    assert (healthy.xid_errors, healthy.ecc_uncorrected) == ((), 0)
    assert faulty.xid_errors == (79,)
    assert faulty.ecc_uncorrected == 3
    assert faulty.temperature_c == 95.0
    provider.force_temperature(1, None)
    assert provider.sample()[1].temperature_c < 40.0


def test_attach_to_a_missing_gpu_names_the_valid_range() -> None:
    provider = SimulatedProvider("sim:2xL4", seed="t")
    with pytest.raises(IndexError, match=r"GPU index 5 does not exist.*0\.\.1"):
        provider.attach(5, [os.getpid()])


def test_attach_rejects_pids_that_are_not_positive() -> None:
    provider = SimulatedProvider("sim:1xL4", seed="t")
    with pytest.raises(ValueError, match=r"positive.*\[0\]"):
        provider.attach(0, [0])


def test_sampling_and_attaching_from_many_threads_is_safe() -> None:
    provider = SimulatedProvider("sim:8xH100", seed="t")
    errors: list[BaseException] = []

    def hammer(index: int) -> None:
        try:
            for i in range(50):
                provider.attach(index, [os.getpid()] if i % 2 else [])
                assert len(provider.sample()) == 8
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_devices_and_samples_round_trip_through_dicts() -> None:
    provider = SimulatedProvider("sim:1xH200", seed="t")
    provider.inject_xid(0, 48)
    (device,) = provider.devices()
    (reading,) = provider.sample()
    assert GpuDevice.from_dict(device.to_dict()) == device
    as_dict = reading.to_dict()
    assert as_dict["xid_errors"] == [48]
    assert GpuSample.from_dict(as_dict) == reading
