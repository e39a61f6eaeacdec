"""Dense peak TFLOPS of a GPU, from the one table in the repo: gpupool.gpu.catalog (with its sources)."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.gpu.catalog import GpuModelInfo, model_info_for_product_name

# The catalog's `dense_bf16_tflops` is the dense tensor-core BF16 figure, which on every part it lists is
# also the dense FP16 figure (FP16 with FP32 accumulate on the RTX 4090). T4 and V100 have no BF16 tensor
# cores: their entry is the FP16 figure, and BF16 runs far below it, so no BF16 peak is claimed for them.
_NO_BF16 = frozenset({"T4", "V100"})
TENSOR_DTYPES = ("bf16", "half")


@dataclass(frozen=True)
class Peak:
    tflops: float | None  # None: the table has no peak for this device and dtype
    model: str | None  # the catalog key ("H100", "A100-80GB"); None when the device is not in the catalog
    note: str  # why there is no peak, or where the figure comes from


def peak_for(product_name: str | None, memory_bytes: int | None, dtype: str) -> Peak:
    """The dense peak for a device (its NVML/CUDA name and memory) and a dtype key (bf16, half, float)."""
    if product_name is None:
        return Peak(None, None, "no peak table for CPUs; TFLOPS only")
    info: GpuModelInfo | None = model_info_for_product_name(product_name, memory_bytes)
    if info is None:
        return Peak(None, None, f"{product_name} is not in gpupool.gpu.catalog; TFLOPS only")
    if dtype not in TENSOR_DTYPES:
        return Peak(None, info.key, f"the catalog lists dense BF16/FP16 peaks only, not {dtype}; TFLOPS only")
    if dtype == "bf16" and info.family in _NO_BF16:
        return Peak(None, info.key, f"{info.family} has no BF16 tensor cores; use --dtype half")
    return Peak(info.dense_bf16_tflops, info.key, f"{info.key} dense {dtype} peak (gpupool.gpu.catalog)")
