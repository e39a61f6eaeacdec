"""The head makes a workload's checkpoint dir only for work it runs on its own machine as its own user
(the local backend): for agents the agent makes it on its node, on Slurm the job's batch script does, so a
spec cannot make the head (root, perhaps) create a directory wherever it names."""

from __future__ import annotations

from pathlib import Path

from gpupool.backends.agent import AgentBackend
from gpupool.backends.base import Backend, Launch
from gpupool.backends.local import LocalBackend
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.store.db import Store
from gpupool.store.models import Workload
from tests.support.store import submit_running


def _launch(store: Store, tmp_path: Path, backend: Backend, checkpoint: Path) -> Launch:
    """What the loop hands `backend` to start the running attempt of a workload checkpointing there."""
    spec = {"commands": ["true"], "resources": {"gpu": 1}, "checkpoint": {"dir": str(checkpoint)}}
    wid = submit_running(store, spec, node="n1", gpu_indices=[0], run_dir=str(tmp_path / "runs" / "1" / "0"))
    reconciler = Reconciler(store, backend, None, ControlSettings(home=tmp_path / "home", node_name="n1"))
    with store.session() as s:
        workload = s.get(Workload, wid)
        assert workload is not None
        return reconciler._launch(workload, workload.attempts[0])


def test_the_head_makes_no_checkpoint_dir_for_work_on_agents(store: Store, tmp_path: Path) -> None:
    wanted = tmp_path / "etc" / "made-by-the-head"
    launch = _launch(store, tmp_path, AgentBackend(lease=10.0), wanted)
    assert launch.env["GPUPOOL_CHECKPOINT_DIR"] == str(wanted)
    assert not wanted.exists() and not wanted.parent.exists()


def test_the_head_makes_the_checkpoint_dir_of_work_it_runs_itself(store: Store, tmp_path: Path) -> None:
    wanted = tmp_path / "ckpt" / "1"
    launch = _launch(store, tmp_path, LocalBackend(), wanted)
    assert launch.env["GPUPOOL_CHECKPOINT_DIR"] == str(wanted) and wanted.is_dir()
