"""Parsing of the `--gpus` value: "sim:8xH100", "sim:4xH100,4xL4", "nvml", "auto", "none"."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gpupool.gpu.catalog import GpuModelInfo, known_models, lookup_model
from gpupool.gpu.errors import GpuSelectorError, UnknownGpuModel

SelectorKind = Literal["sim", "nvml", "auto", "none"]

MAX_SIMULATED_GPUS = 64  # per machine; real machines top out at 8-16, this leaves room for odd tests
EXAMPLES = ("sim:8xH100", "sim:4xA100-80GB", "sim:4xH100,4xL4", "nvml", "auto", "none")
DEFAULT_SIMULATION = "sim:8xH100"

_GROUP = re.compile(r"^(?P<count>[+-]?\d+)\s*[xX]\s*(?P<model>\S.*)$")


@dataclass(frozen=True)
class GpuSelector:
    """A parsed `--gpus` value."""

    kind: SelectorKind
    groups: tuple[tuple[int, GpuModelInfo], ...] = ()  # for "sim": (count, model) in index order

    @property
    def gpu_count(self) -> int:
        return sum(count for count, _ in self.groups)

    @property
    def text(self) -> str:
        """Canonical spelling: "sim:8xH100", "nvml", ..."""
        if self.kind != "sim":
            return self.kind
        return "sim:" + ",".join(f"{count}x{model.key}" for count, model in self.groups)


def _bad(value: str, problem: str) -> GpuSelectorError:
    return GpuSelectorError(f"--gpus: {problem} in {value!r}; valid examples: {', '.join(EXAMPLES)}")


def parse_selector(value: str) -> GpuSelector:
    """Parse a `--gpus` value; raise GpuSelectorError (a ValueError) with one readable line if it is bad."""
    text = value.strip()
    lowered = text.lower()
    if lowered in ("nvml", "auto", "none"):
        kind: SelectorKind = "nvml" if lowered == "nvml" else "auto" if lowered == "auto" else "none"
        return GpuSelector(kind)
    if not text:
        raise _bad(value, "empty value")
    prefix, colon, body = text.partition(":")
    if prefix.lower() != "sim" or not colon:
        expected = "expected sim:<count>x<model>, nvml, auto or none"
        raise _bad(value, f"unknown GPU provider {prefix!r} ({expected})")
    if not body.strip():
        raise _bad(value, "no GPUs after 'sim:' (write sim:<count>x<model>)")
    groups: list[tuple[int, GpuModelInfo]] = []
    for raw in body.split(","):
        part = raw.strip()
        if not part:
            raise _bad(value, "empty GPU group (a stray comma)")
        match = _GROUP.match(part)
        if match is None:
            raise _bad(value, f"GPU group {part!r} is not <count>x<model> (e.g. 8xH100)")
        count = int(match["count"])
        if count < 1:
            raise _bad(value, f"GPU count must be at least 1, got {count}")
        try:
            model = lookup_model(match["model"].strip())
        except UnknownGpuModel:
            raise GpuSelectorError(
                f"--gpus: unknown GPU model {match['model'].strip()!r} in {value!r}; "
                f"known models: {', '.join(known_models())}"
            ) from None
        groups.append((count, model))
    selector = GpuSelector("sim", tuple(groups))
    if selector.gpu_count > MAX_SIMULATED_GPUS:
        too_many = f"{selector.gpu_count} GPUs is more than one machine holds (at most {MAX_SIMULATED_GPUS})"
        raise _bad(value, too_many)
    return selector
