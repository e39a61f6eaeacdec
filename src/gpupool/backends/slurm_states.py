"""Slurm's states in gpupool's words (backends/slurm.py asks for them): a node's, from `scontrol show node`,
as the inventory's node state and labels; and how one of gpupool's jobs ended once it has left squeue,
from `scontrol show job` and the exit code its batch script recorded.
"""

from __future__ import annotations

from pathlib import Path

from gpupool.backends.base import InventoryNode, Phase, Status, recorded_end, recorded_exit_code
from gpupool.backends.slurm_commands import exit_status, parse_gres, parse_time

HOLDING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING"})
NODE_LOST = frozenset({"DOWN", "FUTURE", "UNKNOWN", "INVAL", "POWERED_DOWN", "POWERING_UP", "POWER_DOWN"})
FINAL_NODE_FAILURE = frozenset({"NODE_FAIL", "BOOT_FAIL"})
# A recorded exit code above 128 is a death by signal: Slurm's own (a node set DOWN, a preemption) ends the
# job with SIGTERM too, so before such a code is trusted Slurm's final state is asked (see slurm.py's
# status()).
SIGNAL_DEATH = 128
DRAIN_PREFIX = "gpupool: "


def inventory_node(record: dict[str, str]) -> InventoryNode:
    """A node as `scontrol show node` describes it, with its state in gpupool's words."""
    name = record.get("NodeName", "")
    flags = record.get("State", "UNKNOWN").replace("*", "+NOT_RESPONDING").split("+")
    reason = record.get("Reason", "").strip()
    said = f"slurm: {'+'.join(flags)}" + (f": {reason}" if reason and reason != "none" else "")
    if flags[0] in NODE_LOST or any(f in NODE_LOST for f in flags[1:]):
        state = "lost"
    elif "DRAIN" in flags or "DRAINING" in flags or "DRAINED" in flags or "FAIL" in flags:
        state = "unhealthy" if reason.startswith(DRAIN_PREFIX) else "cordoned"
    elif "NOT_RESPONDING" in flags:  # slurmd does not answer: no new work; what runs there is left be
        state = "cordoned"
    else:
        state, said = "ready", ""
    partitions = record.get("Partitions", "").strip()
    labels = [("slurm.partitions", partitions)] if partitions else []
    features = record.get("ActiveFeatures", "")
    if features and features != "(null)":
        labels.append(("slurm.features", features))
    memory_mb = record.get("RealMemory", "0")
    return InventoryNode(
        name=name,
        address=record.get("NodeAddr", name) or name,
        state=state,
        state_reason=said,
        cpus=float(record.get("CPUTot", "0") or 0),
        memory_bytes=int(memory_mb) << 20 if memory_mb.isdigit() else 0,
        gpus=parse_gres(record.get("Gres", "")),
        labels=tuple(labels),
    )


def final_status(job_id: str, record: dict[str, str], run_dir: Path) -> Status:
    """The status of our job once it has left squeue, from `scontrol show job`: the exit code the batch
    script recorded (else Slurm's `ExitCode`), unless the job died of a signal because Slurm ended it
    (a node failure, a preemption), and when it ended (the recorded code's time, else Slurm's EndTime)."""
    state = record.get("JobState", "")
    if state in HOLDING or state == "PENDING":
        return Status(Phase.RUNNING, detail=f"slurm job {job_id} {state}")
    code = recorded_exit_code(run_dir)  # written a moment after we last looked
    ended = recorded_end(run_dir) if code is not None else parse_time(record.get("EndTime", ""))
    if code is not None and code <= SIGNAL_DEATH:  # its commands ended by themselves, whatever came after
        return Status(Phase.EXITED, code, detail=f"slurm job {job_id} {state}", ended_at=ended)
    reason = record.get("Reason", "")
    said = f"slurm job {job_id} ended {state}" + (f" ({reason})" if reason and reason != "None" else "")
    if state in FINAL_NODE_FAILURE:
        return Status(Phase.VANISHED, detail=said, cause="node-failure", ended_at=ended)
    if state == "PREEMPTED":
        return Status(Phase.VANISHED, detail=said, cause="preemption", ended_at=ended)
    if code is not None:
        return Status(Phase.EXITED, code, detail=f"slurm job {job_id} {state}", ended_at=ended)
    exited, signalled = exit_status(record.get("ExitCode", "0:0"))
    if signalled:
        return Status(Phase.EXITED, 128 + signalled, detail=said, ended_at=ended)
    if state == "CANCELLED":
        return Status(Phase.EXITED, exited or 143, detail=said, ended_at=ended)
    if state in ("FAILED", "TIMEOUT", "OUT_OF_MEMORY", "DEADLINE"):
        return Status(Phase.EXITED, exited or 1, detail=said, ended_at=ended)
    return Status(Phase.EXITED, exited, detail=said, ended_at=ended)
