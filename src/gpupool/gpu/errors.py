"""Exceptions raised by gpu/: one base class callers can catch, one subclass per failure."""

from __future__ import annotations


class GpuError(Exception):
    """Base class of every error gpu/ raises on purpose."""


class GpuUnavailable(GpuError, RuntimeError):
    """Real GPUs were asked for but NVML (the NVIDIA driver) cannot serve them."""


class GpuSelectorError(GpuError, ValueError):
    """A `--gpus` value that names no provider; the message names the flag, the value and valid examples."""


class UnknownGpuModel(GpuError, ValueError):
    """A GPU model name that is not in the catalog; the message lists the known models."""
