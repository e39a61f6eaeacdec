"""What a healthy GPU of each model must show: one thresholds table, and the config file that overrides it.

Seeded from Azure's published node health checks (github.com/Azure/azurehpc-health-checks, `conf/`):
- ND A100 v4 (`nd96asr_v4.conf`, `nd96amsr_a100_v4.conf`): `check_gpu_bw 21 235` and `21 238` (host<->device
  21 GB/s per GPU, measured by nvbandwidth; the files' earlier `check_cuda_bw 24` was replaced by it),
  `check_nccl_allreduce 228.0` (8-GPU all-reduce bus bandwidth, GB/s).
- ND H100 v5 (`nd96isr_h100_v5.conf`): `check_gpu_bw 48 335` (host<->device 48 GB/s, peer 335 GB/s),
  `check_nccl_allreduce 460.0`.
- ND H200 v5 (`nd96isr_h200_v5.conf`): `check_gpu_bw 48 335`, `check_nccl_allreduce 431.0`.
GEMM: at least 60% of the catalog's dense BF16 peak (gpupool.gpu.catalog). Not the bench's 70% target: the
peak assumes the boost clock, and a healthy H200 measured here (docs/benchmarks.md, "On a GPU") gave 68 to
70% at 16384^3, the size of the full check, held at its 700 W power cap (SM clock a median 1,455 MHz of
1,980); a 70% floor would cordon healthy GPUs by chance. A GPU at half speed (a stuck clock, a failing
part) still falls well below 60%. Temperatures: warnings below NVIDIA's slowdown points (H100/H200 GPU
slowdown near 90 C, HBM3 rated to 95 C). A model with no Azure figure is checked for GEMM, memory and
temperature only.

Override any field, per model or for every model, in a YAML file (`$GPUPOOL_HOME/health.yaml`, or the
path in $GPUPOOL_HEALTH_CONFIG); see docs/telemetry.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from gpupool.gpu.catalog import lookup_model
from gpupool.gpu.errors import UnknownGpuModel

LEVELS = ("quick", "full")
CONFIG_ENV = "GPUPOOL_HEALTH_CONFIG"


class HealthConfigError(ValueError):
    """A health config file that cannot be used; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class Thresholds:
    """Limits for one GPU model; None: not checked for that model."""

    gpu_temp_warn_c: float = 85.0  # warning above this GPU temperature
    memory_temp_warn_c: float = 92.0  # warning above this HBM/GDDR temperature
    gemm_min_fraction: float = 0.6  # active: BF16 GEMM TFLOPS at least this share of the dense peak
    h2d_min_gbps: float | None = None  # active: host-to-device copy GB/s per GPU
    d2h_min_gbps: float | None = None  # active: device-to-host copy GB/s per GPU
    allreduce_min_busbw_gbps: float | None = None  # active, full level, 8 GPUs: all-reduce bus bandwidth
    allreduce_gpus: int = 8  # the GPU count the all-reduce figure is for; other counts are not judged
    # Stored bench results (`gpupool bench ... --record` or --submit; docs/bench.md), judged with the action
    # of the `bench` section. None: the figure above applies, or (no figure above) it is not judged.
    # all_reduce busbw (GB/s) at the run's largest size, judged for runs over allreduce_gpus ranks
    bench_allreduce_min_busbw_gbps: float | None = None  # None: allreduce_min_busbw_gbps
    bench_allreduce_min_bytes: int = 1 << 30  # runs whose largest size is smaller are not judged (latency)
    bench_gemm_min_fraction: float | None = None  # slowest GPU's best TFLOPS / peak; None: gemm_min_fraction
    bench_gemm_min_tflops: float | None = None  # the slowest GPU's best TFLOPS, any dtype (CPUs too)
    bench_gemm_min_size: int = 4096  # runs with no shape this large in every dimension are not judged
    bench_train_min_mfu: float | None = None  # training MFU (no published per-model floor: off by default)
    source: str = "gpupool defaults"


TABLE: dict[str, Thresholds] = {
    "A100": Thresholds(
        h2d_min_gbps=21.0, d2h_min_gbps=21.0, allreduce_min_busbw_gbps=228.0,
        source="Azure HPC health checks, ND A100 v4 (nd96asr_v4.conf)",
    ),
    "H100": Thresholds(
        h2d_min_gbps=48.0, d2h_min_gbps=48.0, allreduce_min_busbw_gbps=460.0,
        source="Azure HPC health checks, ND H100 v5 (nd96isr_h100_v5.conf)",
    ),
    "H200": Thresholds(
        h2d_min_gbps=48.0, d2h_min_gbps=48.0, allreduce_min_busbw_gbps=431.0,
        source="Azure HPC health checks, ND H200 v5 (nd96isr_h200_v5.conf)",
    ),
}  # fmt: skip
DEFAULT = Thresholds()


@dataclass(frozen=True)
class Schedule:
    """When the head checks nodes by itself."""

    recheck_interval: float = 60.0  # seconds between active checks of an unhealthy node
    recheck_max_interval: float = 3600.0  # each failed recheck doubles the interval, up to this
    recheck_level: str = "quick"  # level of those checks
    idle_interval: float = 86400.0  # seconds between active checks of an idle node (0: never)
    idle_level: str = "quick"
    # An agent node back from `lost` takes no new work (state cordoned) until it passes these checks;
    # false: it returns to service at once, as before.
    after_lost: bool = True
    after_lost_level: str = "quick"


BENCH_ACTIONS = ("warning", "unhealthy")


@dataclass(frozen=True)
class BenchPolicy:
    """What a bench result below its threshold does to the node."""

    action: str = "warning"  # warning: flagged, schedulable; unhealthy: drained until a newer result passes
    max_age: float = 30 * 86400.0  # seconds; older results are not judged (0: judge them whatever their age)


@dataclass(frozen=True)
class CheckJobRetention:
    """How long finished check jobs (workloads of queue gpupool-system) stay in the store, with their
    attempts, events and logs; the head deletes the others (control/health_jobs.py, `CheckJobs.prune`)."""

    keep_per_node: int = 10  # the newest finished check jobs of each node, kept whatever their age (>= 1)
    max_age: float = 7 * 86400.0  # seconds after it finished that any other is deleted (0: kept forever)


@dataclass(frozen=True)
class HealthConfig:
    overrides: dict[str, dict[str, Any]]  # model family (or "*") -> fields
    schedule: Schedule = Schedule()
    path: str | None = None
    bench: BenchPolicy = BenchPolicy()
    check_jobs: CheckJobRetention = CheckJobRetention()

    def for_model(self, model: str) -> Thresholds:
        family = model.upper()
        base = TABLE.get(family, DEFAULT)
        merged = {**self.overrides.get("*", {}), **self.overrides.get(family, {})}
        if not merged:
            return base
        return replace(base, source=f"{base.source}, overridden by {self.path}", **merged)


_THRESHOLD_FIELDS = {f.name: f for f in fields(Thresholds) if f.name != "source"}
_SCHEDULE_FIELDS = {f.name for f in fields(Schedule)}
_BENCH_FIELDS = {f.name for f in fields(BenchPolicy)}
_RETENTION_FIELDS = {f.name for f in fields(CheckJobRetention)}
SECTIONS = ("thresholds", "schedule", "bench", "check_jobs")


# What each number may be, where more than a finite number >= 0: (lowest, highest, whether the lowest
# itself is refused, an example). A share above 1 failed every node; a recheck every 0 s ran check jobs
# back to back forever; NaN turned a temperature warning off.
_RANGES: dict[str, tuple[float, float, bool, str]] = {
    "gemm_min_fraction": (0.0, 1.0, True, "0.6"),
    "bench_gemm_min_fraction": (0.0, 1.0, True, "0.6"),
    "bench_train_min_mfu": (0.0, 1.0, True, "0.4"),
    "gpu_temp_warn_c": (0.0, 150.0, True, "85"),
    "memory_temp_warn_c": (0.0, 150.0, True, "92"),
    "allreduce_gpus": (2.0, 1024.0, False, "8"),
    "recheck_interval": (1.0, math.inf, False, "60"),
    "recheck_max_interval": (1.0, math.inf, False, "3600"),
}
_EXAMPLES = {
    "h2d_min_gbps": "48", "d2h_min_gbps": "48", "allreduce_min_busbw_gbps": "460",
    "bench_allreduce_min_busbw_gbps": "460", "bench_allreduce_min_bytes": "1073741824",
    "bench_gemm_min_tflops": "500", "bench_gemm_min_size": "4096", "idle_interval": "86400",
    "max_age": "604800",
}  # fmt: skip


def _number(where: str, key: str, value: Any, *, allow_none: bool) -> float | int | None:
    if value is None and allow_none:
        return None
    low, high, above, example = _RANGES.get(key, (0.0, math.inf, False, _EXAMPLES.get(key, "10")))
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not number or value < low or value > high or (above and value == low):
        if high < math.inf:
            span = f"{'above ' if above else ''}{low:g} to {high:g}"
        else:
            span = f"{'above' if above else 'at least'} {low:g}"
        raise HealthConfigError(f"{where}.{key}: {value!r} is not a number {span}; e.g. {key}: {example}")
    number_value: float | int = value
    return number_value


def parse_config(data: Any, path: str = "health config") -> HealthConfig:
    """Validate a health config document (parsed YAML) into a HealthConfig."""
    if data is None:
        return HealthConfig({}, Schedule(), path)
    if not isinstance(data, dict):
        raise HealthConfigError(f"{path}: expected a mapping with any of {', '.join(SECTIONS)}")
    unknown = set(data) - set(SECTIONS)
    if unknown:
        named = ", ".join(repr(s) for s in SECTIONS[:-1]) + f" or {SECTIONS[-1]!r}"
        raise HealthConfigError(f"{path}: unknown key {sorted(unknown)[0]!r}; use {named}")
    overrides: dict[str, dict[str, Any]] = {}
    for model, values in (data.get("thresholds") or {}).items():
        where = f"{path}: thresholds.{model}"
        family = "*" if model == "*" else _family(str(model), where)
        if not isinstance(values, dict):
            raise HealthConfigError(f"{where}: expected a mapping of fields, e.g. h2d_min_gbps: 40")
        for key, value in values.items():
            if key not in _THRESHOLD_FIELDS:
                raise HealthConfigError(
                    f"{where}.{key}: unknown field; fields: {', '.join(sorted(_THRESHOLD_FIELDS))}"
                )
            allow_none = "None" in str(_THRESHOLD_FIELDS[key].type)
            overrides.setdefault(family, {})[key] = _number(where, key, value, allow_none=allow_none)
    schedule_data = data.get("schedule") or {}
    if not isinstance(schedule_data, dict):
        raise HealthConfigError(f"{path}: schedule: expected a mapping, e.g. recheck_interval: 60")
    schedule = Schedule()
    for key, value in schedule_data.items():
        if key not in _SCHEDULE_FIELDS:
            raise HealthConfigError(
                f"{path}: schedule.{key}: unknown field; fields: {', '.join(sorted(_SCHEDULE_FIELDS))}"
            )
        if key.endswith("_level"):
            if value not in LEVELS:
                raise HealthConfigError(f"{path}: schedule.{key}: {value!r}; one of {', '.join(LEVELS)}")
        elif key == "after_lost":
            if not isinstance(value, bool):
                raise HealthConfigError(
                    f"{path}: schedule.after_lost: {value!r} is not true or false; e.g. after_lost: true"
                )
        else:
            _number(f"{path}: schedule", key, value, allow_none=False)
        schedule = replace(schedule, **{key: value})
    return HealthConfig(
        overrides,
        schedule,
        path,
        _bench_policy(data.get("bench"), path),
        _retention(data.get("check_jobs"), path),
    )


def _bench_policy(data: Any, path: str) -> BenchPolicy:
    if data is None:
        return BenchPolicy()
    if not isinstance(data, dict):
        raise HealthConfigError(f"{path}: bench: expected a mapping, e.g. action: unhealthy")
    policy = BenchPolicy()
    for key, value in data.items():
        if key not in _BENCH_FIELDS:
            raise HealthConfigError(
                f"{path}: bench.{key}: unknown field; fields: {', '.join(sorted(_BENCH_FIELDS))}"
            )
        if key == "action":
            if value not in BENCH_ACTIONS:
                raise HealthConfigError(
                    f"{path}: bench.action: {value!r}; one of {', '.join(BENCH_ACTIONS)} "
                    "(warning flags the node, unhealthy drains it)"
                )
        else:
            _number(f"{path}: bench", key, value, allow_none=False)
        policy = replace(policy, **{key: value})
    return policy


def _retention(data: Any, path: str) -> CheckJobRetention:
    if data is None:
        return CheckJobRetention()
    if not isinstance(data, dict):
        raise HealthConfigError(f"{path}: check_jobs: expected a mapping, e.g. max_age: 604800")
    retention = CheckJobRetention()
    for key, value in data.items():
        if key not in _RETENTION_FIELDS:
            raise HealthConfigError(
                f"{path}: check_jobs.{key}: unknown field; fields: {', '.join(sorted(_RETENTION_FIELDS))}"
            )
        if key == "keep_per_node" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise HealthConfigError(
                f"{path}: check_jobs.keep_per_node: {value!r} is not a whole number >= 1 (a node's "
                "newest check job is always kept); e.g. keep_per_node: 10"
            )
        _number(f"{path}: check_jobs", key, value, allow_none=False)
        retention = replace(retention, **{key: value})
    return retention


def _family(model: str, where: str) -> str:
    try:
        return lookup_model(model).family.upper()
    except UnknownGpuModel:
        return model.upper()  # a model gpupool's catalog lacks can still get thresholds


def load_config(home: Path) -> HealthConfig:
    """$GPUPOOL_HEALTH_CONFIG (it must exist), else $GPUPOOL_HOME/health.yaml if there, else defaults."""
    named = os.environ.get(CONFIG_ENV)
    path = Path(named).expanduser() if named else home / "health.yaml"
    if not path.exists():
        if named:
            raise HealthConfigError(f"${CONFIG_ENV}={named}: no such file; create it or unset the variable")
        return HealthConfig({}, Schedule(), None)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise HealthConfigError(f"{path}: cannot read it as YAML ({exc})") from exc
    return parse_config(data, str(path))
