"""How a health check job reaches simulated GPUs: their owner publishes their condition, the job reads it.

Simulated GPUs live in the memory of the process that owns them (the head for its own node, a node agent
for its node), and fault injection changes them there. A check job is another process, a descendant of the
owner (the owner's backend started it). So the owner writes its GPUs' condition (model, peak, PCIe
generation, injected slowdown, lost) to `<tmp>/gpupool-simulated-gpus-<uid>/<owner pid>/<node>.json` at
start and after every injected fault, and the job looks for that file under each of its ancestors' pids
(checking the owner's start time, so a reused pid is never mistaken for the owner). Real GPUs need none of
this: the job measures them with torch (health/active_torch.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import psutil

from gpupool import process_start
from gpupool.gpu.simulated import PCIE_GEN, SimulatedProvider

STATE_DIR = "gpupool-simulated-gpus"

_cleanup_lock = threading.Lock()
_cleanup_registered: set[Path] = set()


class SimulatedStateMissing(RuntimeError):
    """No ancestor of this process published the node's simulated GPUs; the message says where it looked."""


def root() -> Path:
    return Path(tempfile.gettempdir()) / f"{STATE_DIR}-{os.getuid()}"


def _file_name(node: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in node) + ".json"


def conditions(provider: SimulatedProvider) -> list[dict[str, Any]]:
    """Each GPU's condition as the active checks need it (SimulatedProvider.condition)."""
    rows = []
    for device in provider.devices():
        info, slow, lost = provider.condition(device.index)
        rows.append(
            {
                "index": device.index,
                "uuid": device.uuid,
                "model": info.family,
                "peak_tflops": info.dense_bf16_tflops,
                "pcie_gen": PCIE_GEN.get(info.family, 3),
                "slow": slow,
                "lost": lost,
            }
        )
    return rows


def publish(provider: SimulatedProvider, node: str) -> Path:
    """Write the condition of `node`'s simulated GPUs where this process's check jobs find it."""
    me = psutil.Process()
    directory = root() / str(me.pid)
    first = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    if first:
        _prune_dead(directory.parent)
    with _cleanup_lock:
        if directory not in _cleanup_registered:
            _cleanup_registered.add(directory)
            import atexit

            atexit.register(shutil.rmtree, directory, True)
    path = directory / _file_name(node)
    start = process_start.started(me.pid)
    assert start is not None  # this very process
    data = {
        "pid": me.pid,
        "started": start.seconds,
        "boot": start.boot,
        "node": node,
        "gpus": conditions(provider),
    }
    tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
    return path


def _prune_dead(parent: Path) -> None:
    """Remove what owners that have ended left behind (a kill -9 skips their atexit cleanup)."""
    for entry in parent.iterdir():
        if entry.name.isdigit() and not psutil.pid_exists(int(entry.name)):
            shutil.rmtree(entry, ignore_errors=True)


def find(node: str) -> dict[str, Any]:
    """The condition of `node`'s simulated GPUs as the nearest ancestor that owns them published it."""
    looked = []
    for ancestor in psutil.Process().parents():
        path = root() / str(ancestor.pid) / _file_name(node)
        looked.append(str(ancestor.pid))
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            data = json.loads(path.read_text())
            owner = process_start.ProcessStart(float(data["started"]), str(data.get("boot", "")))
            if owner.matches(ancestor.pid):
                return dict(data)
    raise SimulatedStateMissing(
        f"no process above this one (pids {', '.join(looked) or 'none'}) published simulated GPUs of node "
        f"{node} under {root()}; a check job of simulated GPUs runs under the head or agent that owns them"
    )
