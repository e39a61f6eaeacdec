"""The NVML provider: a clear error without a driver, and correct conversions on an injected NVML."""

from __future__ import annotations

import logging

import pytest

from gpupool.gpu import GpuUnavailable, NvmlProvider, open_provider
from gpupool.gpu.nvml import XID_GPU_FALLEN_OFF_BUS, normalize_bus_id, nvlink_islands, nvml_available

from .fake_nvml import SWITCH, FakeGpu, FakeNvml, NVMLError_LibraryNotFound

MIB = 1024 * 1024
NO_DRIVER = not nvml_available()


@pytest.mark.skipif(not NO_DRIVER, reason="this machine has an NVIDIA driver")
def test_nvml_without_a_driver_raises_gpu_unavailable_pointing_at_simulated_gpus() -> None:
    with pytest.raises(GpuUnavailable) as caught:
        open_provider("nvml")
    message = str(caught.value)
    assert "no NVIDIA driver" in message
    assert "libnvidia-ml.so" in message
    assert "--gpus sim:8xH100" in message


def test_a_failing_nvml_init_becomes_gpu_unavailable() -> None:
    fake = FakeNvml([FakeGpu()], init_error=NVMLError_LibraryNotFound())
    with pytest.raises(GpuUnavailable, match=r"NVML Shared Library Not Found.*--gpus sim:8xH100"):
        NvmlProvider(nvml_module=fake)


def test_a_driver_that_sees_no_gpus_is_unavailable_and_shut_down() -> None:
    fake = FakeNvml([])
    with pytest.raises(GpuUnavailable, match="sees no GPUs"):
        NvmlProvider(nvml_module=fake)
    assert fake.shutdown_calls == 1


def test_devices_report_nvml_names_memory_in_bytes_and_the_model_family() -> None:
    fake = FakeNvml(
        [
            FakeGpu(
                name=b"NVIDIA A100-SXM4-80GB", uuid="GPU-a", total=81920 * MIB, bus_id=b"00000000:07:00.0"
            ),
            FakeGpu(
                name="NVIDIA H100 80GB HBM3", uuid="GPU-b", total=81559 * MIB, bus_id=b"00000000:0F:00.0"
            ),
        ]
    )
    provider = NvmlProvider(nvml_module=fake)
    a100, h100 = provider.devices()
    assert (a100.index, a100.uuid, a100.model, a100.name) == (0, "GPU-a", "A100", "NVIDIA A100-SXM4-80GB")
    assert a100.memory_bytes == 81920 * MIB
    assert (h100.model, h100.name, h100.memory_bytes) == ("H100", "NVIDIA H100 80GB HBM3", 81559 * MIB)
    assert not a100.simulated
    assert "2 GPU(s)" in provider.description and "550.54.15" in provider.description


def test_samples_convert_milliwatts_to_watts_and_millijoules_to_joules() -> None:
    gpu = FakeGpu(
        uuid="GPU-a",
        util=87,
        used=40 * 1024 * MIB,
        temperature=71,
        power_mw=612_345,
        energy_mj=5_000_000,
        sm_clock=1980,
        mem_clock=2619,
        ecc_uncorrected=2,
    )
    fake = FakeNvml([gpu])
    provider = NvmlProvider(nvml_module=fake)
    gpu.energy_mj += 1_500_000  # 1.5 kJ used since the provider opened
    (reading,) = provider.sample(now=1234.5)
    assert reading.at == 1234.5 and reading.uuid == "GPU-a"
    assert reading.utilization_pct == 87.0
    assert reading.memory_used_bytes == 40 * 1024 * MIB
    assert reading.memory_total_bytes == 81559 * MIB
    assert reading.temperature_c == 71.0
    assert reading.power_w == pytest.approx(612.345)
    assert reading.energy_j == pytest.approx(1500.0)
    assert (reading.sm_clock_mhz, reading.mem_clock_mhz) == (1980.0, 2619.0)
    assert reading.ecc_uncorrected == 2
    assert reading.xid_errors == ()


def test_unsupported_queries_degrade_to_defaults_without_breaking_the_sample(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unsupported = {
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceRegisterEvents",
        "nvmlDeviceGetPciInfo",
    }
    fake = FakeNvml([FakeGpu(power_mw=100_000, unsupported=unsupported)])
    caplog.set_level(logging.DEBUG, logger="gpupool.gpu.nvml")
    provider = NvmlProvider(nvml_module=fake)
    first = provider.sample(now=10.0)[0]
    second = provider.sample(now=20.0)[0]
    assert (second.utilization_pct, second.temperature_c, second.sm_clock_mhz, second.ecc_uncorrected) == (
        0.0,
        0.0,
        0.0,
        0,
    )
    assert second.power_w == 100.0
    assert first.energy_j == 0.0
    assert second.energy_j == pytest.approx(1000.0)  # no energy counter: 100 W integrated over 10 s
    assert provider.devices()[0].nvlink_island == 0
    not_supported_logs = [r for r in caplog.records if "nvml_query_failed" in r.getMessage()]
    assert all(r.levelno == logging.DEBUG for r in not_supported_logs)
    assert len({r.getMessage() for r in not_supported_logs}) == len(not_supported_logs)  # once per query


def test_a_gpu_that_fell_off_the_bus_reports_xid_79_and_the_others_keep_sampling() -> None:
    healthy, lost = FakeGpu(uuid="GPU-a", util=50), FakeGpu(uuid="GPU-b", bus_id=b"00000000:0F:00.0")
    fake = FakeNvml([healthy, lost])
    provider = NvmlProvider(nvml_module=fake)
    lost.lost = True
    for _ in range(3):
        first, second = provider.sample()
    assert first.utilization_pct == 50.0 and first.xid_errors == ()
    assert second.xid_errors == (XID_GPU_FALLEN_OFF_BUS,)  # reported once, not once per sample
    assert second.memory_total_bytes == provider.devices()[1].memory_bytes


def test_xid_events_appear_in_samples_without_blocking() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", bus_id=b"00000000:0F:00.0")])
    provider = NvmlProvider(nvml_module=fake)
    assert fake.xid_registered == {0, 1}
    fake.pending_events += [(1, 48), (1, 63)]
    first, second = provider.sample()
    assert first.xid_errors == ()
    assert second.xid_errors == (48, 63)
    assert provider.sample()[1].xid_errors == (48, 63)  # history since the provider opened


def test_nvlink_islands_follow_switches_and_direct_links() -> None:
    fake = FakeNvml(
        [
            FakeGpu(uuid="GPU-0", bus_id=b"00000000:07:00.0", nvlinks=[SWITCH, SWITCH]),
            FakeGpu(uuid="GPU-1", bus_id=b"00000000:0F:00.0", nvlinks=[SWITCH, SWITCH]),
            FakeGpu(uuid="GPU-2", bus_id=b"00000000:47:00.0", nvlinks=["0000:4E:00.0"]),  # NVLink bridge pair
            FakeGpu(uuid="GPU-3", bus_id=b"00000000:4E:00.0", nvlinks=["0000:47:00.0"]),
            FakeGpu(uuid="GPU-4", bus_id=b"00000000:87:00.0", unsupported={"nvmlDeviceGetNvLinkState"}),
        ]
    )
    provider = NvmlProvider(nvml_module=fake)
    assert [d.nvlink_island for d in provider.devices()] == [0, 0, 1, 1, 2]


def test_nvlink_islands_are_numbered_by_lowest_gpu_index() -> None:
    assert nvlink_islands(["a", "b", "c"], [[], [], []]) == [0, 1, 2]
    assert nvlink_islands(["a", "b", "c"], [["c"], [], ["a"]]) == [0, 1, 0]


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (b"00000000:18:00.0", "00000000:18:00.0"),
        ("0000:18:00.0", "00000000:18:00.0"),
        ("0000:4E:00.0", "00000000:4e:00.0"),
        (b"18:00.0\x00", "00000000:18:00.0"),
        ("not-a-bus", "not-a-bus"),
    ],
)
def test_pci_bus_ids_are_normalized(raw: object, normal: str) -> None:
    assert normalize_bus_id(raw) == normal


def test_close_shuts_nvml_down_once_and_later_samples_fail_clearly() -> None:
    fake = FakeNvml([FakeGpu()])
    provider = NvmlProvider(nvml_module=fake)
    provider.attach(0, [1234])  # accepted and ignored: NVML sees real processes
    with pytest.raises(IndexError):
        provider.attach(3, [])
    provider.close()
    provider.close()
    assert fake.shutdown_calls == 1
    with pytest.raises(GpuUnavailable, match="closed"):
        provider.sample()


@pytest.mark.skipif(NO_DRIVER, reason="needs an NVIDIA driver and GPU")
def test_real_gpus_report_sane_telemetry() -> None:
    provider = open_provider("nvml")
    assert provider is not None and provider.kind == "nvml"
    try:
        devices = provider.devices()
        assert devices and all(d.uuid.startswith("GPU-") and d.memory_bytes > 0 for d in devices)
        first = provider.sample()
        second = provider.sample()
        for before, after in zip(first, second, strict=True):
            assert after.memory_total_bytes == devices[after.index].memory_bytes
            assert 0 < after.temperature_c < 110 and after.power_w > 0
            assert after.energy_j >= before.energy_j >= 0
    finally:
        provider.close()
