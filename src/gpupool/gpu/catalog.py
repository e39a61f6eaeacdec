"""Real GPU models and their specs: what `sim:8xH100` simulates and what a real NVML name maps to.

Sources (dense = without structured sparsity; NVIDIA datasheets quote the sparse figure, twice as large):
- H100 / H200: "NVIDIA H100 Tensor Core GPU" datasheet (SXM: 989 BF16 TFLOPS dense, 700 W; PCIe: 756, 350 W),
  "NVIDIA H200 Tensor Core GPU" datasheet (SXM: 989 BF16 TFLOPS dense, 141 GB HBM3e, 700 W).
- A100: "NVIDIA A100 Tensor Core GPU" datasheet (312 BF16 TFLOPS dense, SXM 400 W, 40 GB and 80 GB).
- B200: "NVIDIA DGX B200" / HGX B200 datasheet (4.5 PFLOPS FP16/BF16 sparse per GPU -> 2250 dense, 1000 W).
- L4: "NVIDIA L4 Tensor Core GPU" datasheet (242 FP16 TFLOPS sparse -> 121 dense, 72 W).
- L40S: "NVIDIA L40S" datasheet (362.05 BF16 TFLOPS dense, 350 W).
- A10: "NVIDIA A10 Tensor Core GPU" datasheet (125 BF16 TFLOPS dense, 150 W).
- T4: "NVIDIA T4 Tensor Core GPU" datasheet (65 FP16 TFLOPS mixed precision, 70 W; no BF16).
- V100: "NVIDIA Tesla V100 GPU Accelerator" datasheet (SXM2: 125 FP16 tensor TFLOPS, 300 W; no BF16).
- RTX 4090: "NVIDIA Ada GPU Architecture" whitepaper, appendix (165.2 FP16 tensor TFLOPS dense with FP32
  accumulate, 450 W).
Memory is what NVML/nvidia-smi reports as total (slightly less than the marketing GB), idle power and
clocks are typical `nvidia-smi -q` readings of an idle, persistence-mode GPU; max clocks are the boost
clocks `nvidia-smi -q -d CLOCK` lists under "Max Clocks".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpupool.gpu.errors import UnknownGpuModel

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuModelInfo:
    """Specs of one GPU model (one SKU: memory size and form factor fixed)."""

    key: str  # catalog key used in `--gpus sim:<n>x<key>`: "H100", "A100-80GB"
    family: str  # GpuDevice.model: the marketing family the scheduler matches on ("A100" for "A100-80GB")
    product_name: str  # NVML's nvmlDeviceGetName for this SKU
    memory_mib: int  # total memory as NVML reports it
    tdp_w: float  # board power limit (default enforced power limit)
    idle_w: float  # typical draw of an idle GPU
    max_sm_clock_mhz: float
    idle_sm_clock_mhz: float
    max_mem_clock_mhz: float
    idle_mem_clock_mhz: float  # HBM parts keep their memory clock up when idle; GDDR parts drop it
    dense_bf16_tflops: float  # dense tensor-core BF16 (FP16 on T4 and V100, which lack BF16)
    nvlink: bool  # True when the SKU ships with NVLink/NVSwitch between the GPUs of one machine

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


CATALOG: tuple[GpuModelInfo, ...] = (
    GpuModelInfo(
        "B200", "B200", "NVIDIA B200", 183359, 1000.0, 140.0, 1965.0, 120.0, 3996.0, 3996.0, 2250.0, True
    ),
    GpuModelInfo(
        "H200", "H200", "NVIDIA H200", 143771, 700.0, 75.0, 1980.0, 345.0, 3201.0, 3201.0, 989.0, True
    ),
    GpuModelInfo(
        "H100",
        "H100",
        "NVIDIA H100 80GB HBM3",
        81559,
        700.0,
        70.0,
        1980.0,
        345.0,
        2619.0,
        2619.0,
        989.0,
        True,
    ),
    GpuModelInfo(
        "H100-PCIE",
        "H100",
        "NVIDIA H100 PCIe",
        81559,
        350.0,
        45.0,
        1755.0,
        345.0,
        1593.0,
        1593.0,
        756.0,
        False,
    ),
    GpuModelInfo(
        "A100-80GB",
        "A100",
        "NVIDIA A100-SXM4-80GB",
        81920,
        400.0,
        60.0,
        1410.0,
        210.0,
        1593.0,
        1593.0,
        312.0,
        True,
    ),
    GpuModelInfo(
        "A100-40GB",
        "A100",
        "NVIDIA A100-SXM4-40GB",
        40960,
        400.0,
        55.0,
        1410.0,
        210.0,
        1215.0,
        1215.0,
        312.0,
        True,
    ),
    GpuModelInfo(
        "L40S", "L40S", "NVIDIA L40S", 46068, 350.0, 35.0, 2520.0, 210.0, 9001.0, 405.0, 362.05, False
    ),
    GpuModelInfo("L4", "L4", "NVIDIA L4", 23034, 72.0, 16.0, 2040.0, 210.0, 6251.0, 405.0, 121.0, False),
    GpuModelInfo("A10", "A10", "NVIDIA A10", 23028, 150.0, 20.0, 1695.0, 210.0, 6251.0, 405.0, 125.0, False),
    GpuModelInfo("T4", "T4", "Tesla T4", 15360, 70.0, 10.0, 1590.0, 300.0, 5001.0, 405.0, 65.0, False),
    GpuModelInfo(
        "V100", "V100", "Tesla V100-SXM2-16GB", 16160, 300.0, 40.0, 1530.0, 135.0, 877.0, 877.0, 125.0, True
    ),
    GpuModelInfo(
        "RTX4090",
        "RTX4090",
        "NVIDIA GeForce RTX 4090",
        24564,
        450.0,
        20.0,
        2520.0,
        210.0,
        10501.0,
        405.0,
        165.2,
        False,
    ),
)

# Other spellings people type; a bare family name picks its largest SKU.
_ALIASES: dict[str, str] = {
    "A100": "A100-80GB",
    "H100-SXM": "H100",
    "H100-SXM5": "H100",
    "H100-80GB": "H100",
    "H200-141GB": "H200",
    "A100-SXM4-80GB": "A100-80GB",
    "A100-SXM4-40GB": "A100-40GB",
    "V100-16GB": "V100",
}

_VENDOR_WORDS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})


def _squash(text: str) -> str:
    """Case- and separator-insensitive form: "a100 80gb", "A100_80GB" and "A100-80GB" all squash alike."""
    return re.sub(r"[\s\-_]+", "", text).upper()


_BY_SQUASHED: dict[str, GpuModelInfo] = {_squash(m.key): m for m in CATALOG}
_BY_SQUASHED.update({_squash(alias): _BY_SQUASHED[_squash(key)] for alias, key in _ALIASES.items()})


def known_models() -> list[str]:
    """Catalog keys in the order people scan them (newest first)."""
    return [m.key for m in CATALOG]


def families() -> list[str]:
    """Every GPU family the catalog knows ("H100", "A100", ...): what a request's model names match."""
    return sorted({info.family for info in CATALOG})


def lookup_model(text: str) -> GpuModelInfo:
    """The catalog entry for a model name, ignoring case and separators ("h100", "a100-80gb", "A100_40GB")."""
    found = _BY_SQUASHED.get(_squash(text))
    if found is None:
        raise UnknownGpuModel(f"unknown GPU model {text!r}; known models: {', '.join(known_models())}")
    return found


def model_from_product_name(name: str) -> str:
    """The family of an NVML product name: "NVIDIA A100-SXM4-80GB" -> "A100", "Tesla T4" -> "T4"."""
    words = [w for w in re.split(r"[\s\-_]+", name.strip()) if w]
    while words and words[0].upper() in _VENDOR_WORDS:
        words.pop(0)
    if not words:
        return "UNKNOWN"
    first = words[0].upper()
    if first == "RTX" and len(words) > 1:
        return "RTX" + words[1].upper()  # "GeForce RTX 4090" -> "RTX4090", "RTX A6000" -> "RTXA6000"
    return first


def model_info_for_product_name(name: str, memory_bytes: int | None = None) -> GpuModelInfo | None:
    """The catalog entry for a real GPU, by exact NVML name, else by family and nearest memory size."""
    wanted = name.strip().lower()
    for info in CATALOG:
        if info.product_name.lower() == wanted:
            return info
    family = model_from_product_name(name)
    candidates = [m for m in CATALOG if m.family == family]
    if not candidates:
        return None
    if memory_bytes is None:
        return candidates[0]
    return min(candidates, key=lambda m: abs(m.memory_bytes - memory_bytes))
