"""The GPU model catalog: lookups by the names people type and by the names NVML reports."""

from __future__ import annotations

import pytest

from gpupool.gpu import UnknownGpuModel, lookup_model, model_from_product_name
from gpupool.gpu.catalog import CATALOG, MIB, known_models, model_info_for_product_name


@pytest.mark.parametrize(
    ("text", "key", "family"),
    [
        ("H100", "H100", "H100"),
        ("h100", "H100", "H100"),
        ("h100-sxm", "H100", "H100"),
        ("H100-PCIe", "H100-PCIE", "H100"),
        ("H200", "H200", "H200"),
        ("a100-80gb", "A100-80GB", "A100"),
        ("A100_40GB", "A100-40GB", "A100"),
        ("A100", "A100-80GB", "A100"),
        ("l4", "L4", "L4"),
        ("L40S", "L40S", "L40S"),
        ("a10", "A10", "A10"),
        ("T4", "T4", "T4"),
        ("V100", "V100", "V100"),
        ("B200", "B200", "B200"),
        ("rtx-4090", "RTX4090", "RTX4090"),
    ],
)
def test_lookup_model_ignores_case_and_separators(text: str, key: str, family: str) -> None:
    info = lookup_model(text)
    assert info.key == key
    assert info.family == family


def test_lookup_of_an_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(UnknownGpuModel) as caught:
        lookup_model("K80")
    assert "'K80'" in str(caught.value)
    assert all(key in str(caught.value) for key in known_models())


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H100 NVL", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10G"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("", "UNKNOWN"),
    ],
)
def test_model_from_product_name_gives_the_marketing_family(name: str, family: str) -> None:
    assert model_from_product_name(name) == family


def test_every_catalog_product_name_maps_back_to_its_family_and_entry() -> None:
    for info in CATALOG:
        assert model_from_product_name(info.product_name) == info.family
        assert model_info_for_product_name(info.product_name) == info


def test_unknown_product_names_resolve_by_family_and_nearest_memory() -> None:
    a100_40 = model_info_for_product_name("NVIDIA A100-PCIE-40GB", memory_bytes=40536 * MIB)
    assert a100_40 is not None and a100_40.key == "A100-40GB"
    assert model_info_for_product_name("NVIDIA Quantum Widget") is None


def test_catalog_specs_are_realistic() -> None:
    h100 = lookup_model("H100")
    assert h100.product_name == "NVIDIA H100 80GB HBM3"
    assert h100.memory_mib == 81559
    assert h100.dense_bf16_tflops == 989.0 and h100.tdp_w == 700.0 and h100.nvlink
    assert lookup_model("A100").dense_bf16_tflops == 312.0
    assert lookup_model("L4").dense_bf16_tflops == 121.0 and not lookup_model("L4").nvlink
    assert lookup_model("H200").memory_bytes > 140 * 1000**3
    for info in CATALOG:
        assert 0 < info.idle_w < info.tdp_w
        assert 0 < info.idle_sm_clock_mhz < info.max_sm_clock_mhz
        assert 0 < info.idle_mem_clock_mhz <= info.max_mem_clock_mhz
        assert 14_000 < info.memory_mib < 200_000
    assert len({info.key for info in CATALOG}) == len(CATALOG)
