"""Stand-ins for Slurm's client commands (sbatch, squeue, scontrol, scancel): shell scripts that answer
from files in one directory and log how they were called, so that the slurm backend's own code (the
commands run as subprocesses, their output parsed) is exercised without a Slurm cluster."""

from __future__ import annotations

import os
from pathlib import Path

from gpupool.backends.base import Launch, Pod
from gpupool.backends.slurm import SlurmBackend
from gpupool.backends.slurm_commands import SlurmCommands

SCRIPTS = {
    # sbatch.mode: "" answers job id 42; "unreachable" as with slurmctld down; "hang" never answers
    "sbatch": """#!/bin/sh
printf '%s\\n' "$@" > "$STUB/sbatch.args"
case "$(cat "$STUB/sbatch.mode" 2>/dev/null)" in
  unreachable)
    echo "sbatch: error: Batch job submission failed:" \
      "Unable to contact slurm controller (connect failure)" >&2
    exit 1 ;;
  hang) exec sleep 30 ;;
  refused)
    echo "sbatch: error: Batch job submission failed: Requested node configuration is not available" >&2
    exit 1 ;;
esac
echo 42
""",
    # squeue.out: the job list; with -n NAME, the ids in named.NAME
    "squeue": """#!/bin/sh
printf '%s\\n' "$*" >> "$STUB/squeue.log"
while [ $# -gt 0 ]; do
  if [ "$1" = -n ]; then cat "$STUB/named.$2" 2>/dev/null; exit 0; fi
  shift
done
cat "$STUB/squeue.out" 2>/dev/null
exit 0
""",
    # nodes.out: `scontrol show node -o`; job.ID: `scontrol show job -o ID`; ping.mode "hang": never answers;
    # partition.out: `scontrol show partition -o`; update.mode: how `scontrol update` fails ("" succeeds)
    "scontrol": """#!/bin/sh
printf '%s\\n' "$*" >> "$STUB/scontrol.log"
case "$1" in
  ping)
    if [ "$(cat "$STUB/ping.mode" 2>/dev/null)" = hang ]; then
      echo "scontrol: error: munge_encode: Failed to connect to munged, retrying" >&2
      exec sleep 30
    fi
    echo "Slurmctld(primary) at ctl is UP" ;;
  show)
    case "$2" in
      node) cat "$STUB/nodes.out" 2>/dev/null ;;
      partition)
        if [ -f "$STUB/partition.out" ]; then cat "$STUB/partition.out"
        else echo "PartitionName=gpu Default=YES MaxTime=UNLIMITED Nodes=n1 State=UP"; fi ;;
      job)
        for id; do :; done
        if [ -f "$STUB/job.$id" ]; then cat "$STUB/job.$id"
        else echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; fi ;;
    esac ;;
  update)
    case "$(cat "$STUB/update.mode" 2>/dev/null)" in
      denied) echo "Access/permission denied for job 42" >&2; exit 1 ;;
      ended) echo "Job has already finished for job 42" >&2; exit 1 ;;
      unreachable)
        echo "slurm_update error: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
    esac ;;
esac
exit 0
""",
    # scancel.fails: exists = slurmctld cannot be reached
    "scancel": """#!/bin/sh
printf '%s\\n' "$*" >> "$STUB/scancel.log"
if [ -e "$STUB/scancel.fails" ]; then
  echo "scancel: error: Unable to contact slurm controller (connect failure)" >&2; exit 1
fi
exit 0
""",
}

NODE = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=8 Gres=gpu:8 NodeAddr=10.0.0.1 "
    "NodeHostName=n1 Version=22.05.8 OS=Linux 6.1 #1 SMP RealMemory=64000 State={state} Partitions=gpu "
    "BootTime=2026-12-07T13:28:00 CfgTRES=cpu=8,mem=64000M,billing=8 AllocTRES= {reason}"
)

# `scontrol show job -o` of Slurm 22.05, as it prints it (the job's fields follow its Reason)
JOB = (
    "JobId={id} JobName=gpupool-3.0.0123abcd UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 Nice=0 "
    "Account=(null) QOS=(null) JobState={state} Reason={reason} Dependency=(null) Requeue=0 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode={exit} RunTime=00:00:40 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-12-07T14:09:12 EligibleTime=2026-12-07T14:09:12 AccrueTime=2026-12-07T14:09:12 "
    "StartTime=2026-12-07T14:09:15 EndTime={end} Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "Partition=gpu NodeList=n1 BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
    "TRES=cpu=1,node=1,billing=1 Command=/runs/3/0/job.sh WorkDir=/tmp StdOut=/logs/3.log "
    "TresPerNode=gres:gpu:1"
)


class Stub:
    """The stand-in commands' directory: write answers with `answer`, read calls with `calls`."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "stub"
        self.bin = base / "bin"
        self.dir.mkdir(parents=True)
        self.bin.mkdir(parents=True)
        for name, text in SCRIPTS.items():
            path = self.bin / name
            path.write_text(text)
            path.chmod(0o755)
        self.env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "STUB": str(self.dir),
            "GPUPOOL_SLURM_LIBRARY": "none",
        }
        self.answer("nodes.out", NODE.format(state="IDLE", reason=""))

    def answer(self, name: str, text: str) -> None:
        (self.dir / name).write_text(text + "\n")

    def job(self, job_id: str, state: str, *, reason: str = "None", exit: str = "0:0", end: str) -> None:
        self.answer(f"job.{job_id}", JOB.format(id=job_id, state=state, reason=reason, exit=exit, end=end))

    def calls(self, command: str) -> list[str]:
        path = self.dir / f"{command}.log"
        return path.read_text().splitlines() if path.exists() else []

    def backend(self, timeout: float = 30.0) -> SlurmBackend:
        return SlurmBackend(partition="gpu", commands=SlurmCommands(self.env, timeout=timeout))

    def launch(self, base: Path, *, token: str = "0123abcdef456789", pods: int = 1) -> Launch:
        return Launch(
            attempt_id=1, workload_id=3, attempt_number=0, script="echo hi\n", env=dict(self.env),
            workdir=base, run_dir=base / "runs" / "3" / "0", log_path=base / "logs" / "3.log",
            pods=tuple(Pod(f"n{i + 1}", (0,)) for i in range(pods)), fencing_token=token,
        )  # fmt: skip


def set_mtime(path: Path, when: float) -> None:
    os.utime(path, (when, when))
