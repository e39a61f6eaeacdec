"""The one interface to GPUs (`GpuProvider`) and the factory that turns a `--gpus` value into a provider."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from gpupool.gpu.errors import GpuSelectorError, GpuUnavailable
from gpupool.gpu.nvml import NvmlProvider
from gpupool.gpu.selector import DEFAULT_SIMULATION, parse_selector
from gpupool.gpu.simulated import SimulatedProvider
from gpupool.gpu.types import GpuDevice, GpuSample

__all__ = ["GpuProvider", "GpuSelectorError", "GpuUnavailable", "describe", "open_provider"]

log = logging.getLogger(__name__)


class GpuProvider(Protocol):
    """Discovery and telemetry of the GPUs of one machine, real (NVML) or simulated."""

    kind: str  # "nvml" | "sim"
    description: str  # one line for logs: what the provider serves, and why (e.g. an auto fallback)

    def devices(self) -> list[GpuDevice]:
        """Every GPU of the machine, by index; the list does not change while the provider is open."""
        ...

    def sample(self, now: float | None = None) -> list[GpuSample]:
        """One reading per GPU, in index order; `now` defaults to the current unix time."""
        ...

    def attach(self, index: int, pids: Sequence[int]) -> None:
        """Declare the process trees running on GPU `index` (empty: idle); the simulator follows them."""
        ...

    def close(self) -> None:
        """Release the provider (NVML shutdown); calling it twice is harmless."""
        ...


def open_provider(selector: str, *, seed: str | None = None) -> GpuProvider | None:
    """The provider a `--gpus` value asks for; None for "none" (a machine with no local GPUs).

    "nvml" raises GpuUnavailable when no driver answers. "auto" uses NVML when it can and otherwise
    simulates sim:8xH100; its `description` then says so, for the caller to log as a warning.
    `seed` fixes simulated UUIDs (default: the host name).
    """
    parsed = parse_selector(selector)
    if parsed.kind == "none":
        return None
    if parsed.kind == "nvml":
        return NvmlProvider()
    if parsed.kind == "auto":
        try:
            return NvmlProvider()
        except GpuUnavailable as exc:
            log.debug("event=gpu_auto_fallback reason=%r", str(exc))
            fallback = parse_selector(DEFAULT_SIMULATION)
            return SimulatedProvider(
                fallback,
                seed=seed,
                description=f"{fallback.text} (simulated; --gpus auto found no NVIDIA driver)",
            )
    return SimulatedProvider(parsed, seed=seed)


def describe(provider: GpuProvider | None) -> str:
    """One line for a startup log: what GPUs this machine offers."""
    if provider is None:
        return "none (no local GPUs)"
    return provider.description
