"""The pure scheduling core: `decide(snapshot, now) -> Decisions`.

The modules below may run compiled: `tools/build_native.py` (run by `make`) compiles this same source with
mypyc into `_native/`. They are imported from there only while every compiled source is byte for byte the
file next to this one and the ABI is this interpreter's; else, or with GPUPOOL_PURE_PYTHON=1 set, the source
runs as it is. `NATIVE` says which. Reading the manifest at import is the only file access here; `decide`
itself does none.
"""

# ruff: noqa: E402  (the submodules are imported only once `__path__` says where they come from)

import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path


def _native_dir() -> str | None:
    """The folder of compiled modules when they may be used, else None."""
    if os.environ.get("GPUPOOL_PURE_PYTHON"):
        return None
    here = Path(__file__).parent
    native = here / "_native"
    try:
        manifest = json.loads((native / "manifest.json").read_text())
        if manifest.get("abi") != sysconfig.get_config_var("EXT_SUFFIX"):
            return None
        for name, expected in manifest["sources"].items():
            if hashlib.sha256((here / name).read_bytes()).hexdigest() != expected:
                return None  # a source changed since the build: run the source
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return str(native)


_NATIVE_DIR = _native_dir()
NATIVE = _NATIVE_DIR is not None
if _NATIVE_DIR is not None:
    __path__.insert(0, _NATIVE_DIR)  # submodules resolve to the compiled ones first
    sys.path.append(_NATIVE_DIR)  # where they find their shared runtime (gpupool_scheduler__mypyc)

from gpupool.scheduler.core import Scheduler, decide
from gpupool.scheduler.prepare import ConfigError
from gpupool.scheduler.snapshot import (
    Bind,
    Decisions,
    Eviction,
    Explanation,
    GpuDemand,
    GpuView,
    NodeView,
    PodPlacement,
    QueueView,
    SchedulerConfig,
    Share,
    Snapshot,
    WorkloadView,
)

__all__ = [
    "NATIVE",
    "Bind",
    "ConfigError",
    "Decisions",
    "Eviction",
    "Explanation",
    "GpuDemand",
    "GpuView",
    "NodeView",
    "PodPlacement",
    "QueueView",
    "Scheduler",
    "SchedulerConfig",
    "Share",
    "Snapshot",
    "WorkloadView",
    "decide",
]
