"""GPU discovery and telemetry: one interface (`GpuProvider`), an NVML provider and a simulated one."""

from gpupool.gpu.catalog import GpuModelInfo, lookup_model, model_from_product_name
from gpupool.gpu.errors import GpuError, GpuSelectorError, GpuUnavailable, UnknownGpuModel
from gpupool.gpu.nvml import NvmlProvider
from gpupool.gpu.provider import GpuProvider, describe, open_provider
from gpupool.gpu.selector import GpuSelector, parse_selector
from gpupool.gpu.simulated import SimulatedProvider
from gpupool.gpu.types import GpuDevice, GpuSample

__all__ = [
    "GpuDevice",
    "GpuError",
    "GpuModelInfo",
    "GpuProvider",
    "GpuSample",
    "GpuSelector",
    "GpuSelectorError",
    "GpuUnavailable",
    "NvmlProvider",
    "SimulatedProvider",
    "UnknownGpuModel",
    "describe",
    "lookup_model",
    "model_from_product_name",
    "open_provider",
    "parse_selector",
]
