"""A bench command as a gpupool job: the spec whose command is the same bench with --json into the workdir.

One node: the bench starts its own processes (one per GPU of the job). Several nodes: torchrun on each
node starts one rank per GPU and joins the others at the job contract's MASTER_ADDR:MASTER_PORT; the bench
sees torchrun's RANK/WORLD_SIZE and runs as that rank. The job runs `python -m gpupool.main` with this
interpreter's path, which holds on the head's own machine (local backend) and on nodes that install
gpupool at the same path.

`--emit-result` makes the bench print its report as one marked line in the job's log; when the job ends,
the head reads it there and records it for the nodes the job ran on (gpupool.control.bench).
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

from gpupool.bench.errors import BenchError

KINDS = ("collective", "gemm", "train")


def json_name(kind: str, distributed: bool) -> str:
    """The results file in the job's workdir (the shell expands the variables); one per node when every
    node runs the bench on its own, one for the gang when rank 0 reports for all."""
    suffix = "" if distributed else "-node${GPUPOOL_NODE_RANK}"
    return f"gpupool-bench-{kind}-job${{GPUPOOL_JOB_ID}}{suffix}.json"


def results_path(kind: str, distributed: bool, job_id: int, nodes: int) -> str:
    """The results file(s) of a submitted job as a person reads them: the name, or with several nodes that
    each write their own, a pattern with `<rank>` that says so."""
    name = json_name(kind, distributed).replace("${GPUPOOL_JOB_ID}", str(job_id))
    if distributed:
        return name
    if nodes == 1:
        return name.replace("${GPUPOOL_NODE_RANK}", "0")
    return name.replace("${GPUPOOL_NODE_RANK}", "<rank>") + f" (one per node, <rank> 0..{nodes - 1})"


def job_spec(
    kind: str,
    forward: list[str],
    *,
    distributed: bool,
    nodes: int,
    gpus: str | None,
    queue: str,
    name: str | None,
    workdir: str,
    python: str | None = None,
    node_names: list[str] | None = None,
) -> dict[str, Any]:
    """The workload spec (as `gpupool submit` takes it) for `gpupool bench KIND FORWARD...` as a job;
    `node_names` pins it to those nodes (placement.nodes)."""
    if kind not in KINDS:
        raise BenchError(f"--submit works for {', '.join(KINDS)}, not {kind}")
    if not gpus:
        raise BenchError("--submit needs --gpus: GPUs per node for the job, e.g. --gpus 8 or --gpus H100:8")
    if nodes < 1:
        raise BenchError(f"--nodes must be at least 1 (got {nodes})")
    exe = shlex.quote(python or sys.executable)
    args = " ".join(shlex.quote(a) for a in forward)
    out = json_name(kind, distributed)
    if distributed and nodes > 1:
        launch = (
            f"{exe} -m torch.distributed.run --nnodes=$NNODES --node-rank=$NODE_RANK "
            "--nproc-per-node=$GPUPOOL_GPUS_PER_NODE --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT "
            f"-m gpupool.main bench {kind} {args}"
        )
    elif distributed:
        launch = f"{exe} -m gpupool.main bench {kind} {args} --nproc $GPUPOOL_GPUS_PER_NODE"
    else:
        launch = f"{exe} -m gpupool.main bench {kind} {args}"
    spec: dict[str, Any] = {
        "kind": "job",
        "name": name or f"bench-{kind}",
        "queue": queue,
        "nodes": nodes,
        "resources": {"gpu": gpus},
        "commands": [f'{launch} --json "{out}" --emit-result'],
        "workdir": workdir,
    }
    if node_names:
        spec["placement"] = {"nodes": list(node_names)}
    return spec
