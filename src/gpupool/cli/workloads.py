"""`gpupool ps`, `show`, `why` and `logs`: what work there is, where it stands and why, and its output."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import typer
from rich.markup import escape

from gpupool.cli import refs
from gpupool.cli.app import API_PAGE, app, client, outage_note, stream_log
from gpupool.cli.errors import CliError
from gpupool.cli.render import (
    JSON_HELP,
    console,
    counted,
    efficiency_line,
    ending_line,
    err_console,
    foreign_table,
    gpus,
    human_age,
    member_name,
    print_json,
    ps_table,
    rank_hint,
    styled,
)
from gpupool.cli.render_queues import held_back_note
from gpupool.client.client import ride_out
from gpupool.spec import format_duration, format_figure, format_gpu_indices

T = TypeVar("T")


@app.command()
def ps(
    all: bool = typer.Option(False, "--all", "-a", help="include finished workloads"),
    queue: str | None = typer.Option(None, "--queue", "-q", help="only work in this queue"),
    state: str | None = typer.Option(
        None,
        "--state",
        "-t",
        help="only work in this state: pending, running, succeeded, failed, cancelled; several with commas",
    ),
    user: str | None = typer.Option(None, "--user", "-u", help="only work this user submitted"),
    name: str | None = typer.Option(None, "--name", help="only work of this name (squeue --name)"),
    me: bool = typer.Option(False, "--me", help="only your own work (Slurm's squeue --me)"),
    wide: bool = typer.Option(False, "--wide", "-w", help="show every reason"),
    limit: int = typer.Option(
        1000, "--limit", "-n", min=1, max=API_PAGE, help="at most this many, the newest (up to 100,000)"
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """List workloads: pending and running ones, or all with --all."""
    c = client()
    if me:
        user = c.whoami()["name"]
    asked = min(limit + 1, API_PAGE)  # one more than shown tells whether there are more
    workloads = c.workloads(all=all, state=state, queue=queue, user=user, name=name, limit=asked)
    if not workloads and queue is not None:  # nothing, or a typo: as `--state bogus` is refused, say which
        names = sorted(q["name"] for q in c.queues())
        if queue not in names:
            raise CliError(f"--queue {queue}: no such queue (queues: {', '.join(names) or 'none'})")
    if len(workloads) > limit or len(workloads) == API_PAGE:  # on stderr: pipes and --json read rows alone
        workloads = workloads[len(workloads) - limit :]  # oldest first: the newest `limit`
        more = (
            f"--limit shows more (up to {API_PAGE:,})"
            if limit < API_PAGE
            else "narrow it with --queue or --state"
        )
        err_console.print(f"[yellow]the newest {limit:,} only; {more}[/yellow]")
    narrowed = state is not None or queue is not None or user is not None or name is not None
    foreign = c.foreign_jobs() if all and not narrowed else []
    if as_json:  # the API's fields, as `show --json` gives them, and the age as the table shows it
        rows = [{**w, "age": human_age(w.get("age_seconds", 0.0))} for w in workloads]
        print_json(rows + [{"foreign": True, **job} for job in foreign] if foreign else rows)
        return
    if not workloads:
        console.print(_none_listed(state, queue, user, name, all), highlight=False)
    else:
        console.print(ps_table(workloads, wide=wide))
    if foreign:
        console.print("\nforeign jobs (submitted to the backend outside gpupool; their GPUs are in use):")
        console.print(foreign_table(foreign))


@app.command()
def show(
    workload: str = typer.Argument(..., help=refs.ID_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Everything about one workload: spec, attempts, history, and why it is pending."""
    c = client()
    w = c.workload(refs.workload_id(c, workload, reading=True))
    if as_json:
        print_json(w)
        return
    console.print(
        f"[bold]{w['id']}[/bold] {escape(member_name(w))}  {styled(w['state'])}  kind={w.get('kind', 'job')} "
        f"queue={w['queue']} priority={w['priority']} preemptible={str(w['preemptible']).lower()} "
        f"gpus={w['gpus']}"
        + (f" nodes={w['nodes']} (gpus per node)" if (w.get("nodes") or 1) > 1 else "")
        + (f" restarts={w['restarts']}" if w.get("restarts") else "")
        + (f" node_failures={w['node_failures']}" if w.get("node_failures") else "")
    )
    if w["reason"]:
        label = "why pending" if w["state"] == "pending" else "reason"
        console.print(f"  {label}: {escape(w['reason'])}")
    if w.get("endpoint"):
        ready = (
            "" if w.get("ready") is None else f"  ready: {'yes' if w['ready'] else 'no'} ({w['readiness']})"
        )
        console.print(f"  endpoint: http://{w['endpoint']}  (listens on $GPUPOOL_PORT){ready}")
        who = {
            "public": "anyone, no token",
            "pool": "any token of this head",
        }.get(w["spec"].get("access") or "private", _owner_and_admins(w.get("user")))
        head = c.server.rstrip("/")
        console.print(f"  through the head: {head}/api/v1/workloads/{w['id']}/proxy/  ({who})")
        if w.get("kind") == "service" and w.get("name"):  # the address that outlives a resubmit
            console.print(f"  by name: {head}/api/v1/services/{w['name']}/proxy/", highlight=False)
    scaling = w["spec"].get("scaling")
    if scaling:
        console.print(f"  autoscaling: {_autoscaling(scaling, w.get('autoscaling'))}")
    if len(w.get("replica_list") or []) > 1:
        how = "by load" if scaling else f"gpupool scale {w['id']} N"
        console.print(f"  replicas: {w['replicas']} of service {w['service_id']} ({how})")
        for r in w["replica_list"]:
            where = f" on {r['node']} at {r['endpoint']}" if r.get("endpoint") else ""
            ready = "" if r.get("ready") is None else f" ready={'yes' if r['ready'] else 'no'}"
            this = "  (this one)" if r["id"] == w["id"] else ""
            console.print(f"    replica {r['replica']}: {r['id']} {styled(r['state'])}{where}{ready}{this}")
    if w.get("array_id") is not None:
        counts = w.get("array_tasks") or {}
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if state != "total")
        console.print(
            f"  array: task {w['array_index']} of array {w['array_id']} ({w['spec']['array']}; "
            f"{counted(counts.get('total', 0), 'task')}: {states})"
        )
    if w["spec"].get("after"):
        waits = ", ".join(f"{d['workload']} {d['when']}" for d in w["spec"]["after"])
        console.print(f"  after: {waits}")
    notify = w["spec"].get("notify")
    if notify:
        signed = " (signed)" if notify.get("secret") else ""
        console.print(
            f"  notifies: {escape(notify['url'])} when {', '.join(notify['on'])}{signed}", highlight=False
        )
    if w["spec"].get("secrets"):
        console.print(f"  secrets: {', '.join(w['spec']['secrets'])} (of {w.get('user')})", highlight=False)
    # What users wrote (commands, paths, reasons quoting them) is printed as text: `[i for i in x]` in a
    # command is not Rich markup.
    console.print(f"  commands: {escape('; '.join(w['spec'].get('commands', [])))}", highlight=False)
    console.print(f"  workdir: {escape(w['spec'].get('workdir') or '(server default)')}", highlight=False)
    limit = _time_limit(w)
    if limit:
        console.print(f"  time limit: {limit}")
    for a in w["attempt_list"]:
        line = _attempt_line(a, w["queue"])
        console.print(f"  attempt {a['number']}: {line}\n    log: {escape(a['log_path'])}")
    if w["attempt_list"]:
        last = w["attempt_list"][-1]
        seff = efficiency_line(last, datetime.now(UTC))
        if seff is not None:
            console.print(f"  GPU efficiency (attempt {last['number']}): {seff}")
    console.print("  history:")
    for e in w["events"]:
        said = escape(f"{e['reason']} ({e['actor']})")
        console.print(f"    {e['at']}  {e['from'] or '-'} -> {e['to']}  {said}")


def _owner_and_admins(user: str | None) -> str:
    """Who reaches a private service: "alice and admins"; the admin token's own, "admins"."""
    if user == "admin":
        return "admins"
    return f"{user or 'its owner'} and admins"


def _autoscaling(scaling: dict[str, Any], word: dict[str, Any] | None) -> str:
    """The range, target and delays; then what the autoscaler last measured and wants."""
    unit = "requests/s" if scaling["metric"] == "rps" else "requests in flight"
    said = (
        f"{scaling['min']}..{scaling['max']} replicas, {scaling['target']:g} {unit} each (over "
        f"{scaling['window']:g} s; add after {scaling['scale_up_delay']:g} s, remove after "
        f"{scaling['scale_down_delay']:g} s)"
    )
    if word is None:
        return said + "; not measured yet"
    return f"{said}; now {format_figure(word['load'])} {unit}, wants {word['wanted']}"


def _time_limit(w: Mapping[str, Any]) -> str:
    """`max_duration` for `gpupool show` (Slurm's TimeLimit), with what a running attempt has left of it;
    empty without a limit."""
    limit = w.get("max_duration")
    if limit is None:
        return ""
    said = f"{format_duration(limit)} per attempt (max_duration)"
    running = [a for a in w["attempt_list"] if a["state"] == "running" and a.get("started_at")]
    if running:
        ran = (datetime.now(UTC) - datetime.fromisoformat(running[-1]["started_at"])).total_seconds()
        left = limit - ran
        # whole seconds down: never more left than there is (rounded, the first half second read "4h left")
        said += f"; {format_duration(math.floor(left))} left" if left >= 1 else "; passed: stopping"
    return said


def _attempt_line(a: Mapping[str, Any], queue: str) -> str:
    """One attempt for `gpupool show`: its state, where, which GPUs (indices, not a count; a gang's each
    rank's node and GPUs), the queue it ran in where the work has moved since (`queue`: the work's now),
    how it runs, and how it ended (the exit code once, where the reason does not already say it)."""
    pods = a.get("pods") or []
    if len(pods) > 1:  # a gang: where each rank ran ("evicted on node-1 ..." named rank 0's node alone)
        ranks = "; ".join(f"rank {r}: {p['node']} {_pod_gpus(p)}" for r, p in enumerate(pods))
        parts = [f"{styled(a['state'])} on {len(pods)} nodes ({escape(ranks)})"]
    else:
        parts = [f"{styled(a['state'])} on {escape(str(a['node']))}", _pod_gpus(a)]
    if a.get("queue") and a["queue"] != queue:
        parts.append(f"in queue {a['queue']}")
    if a.get("slurm_job_id"):
        parts.append(f"slurm job {a['slurm_job_id']}")
    elif a.get("pid") is not None:
        parts.append(f"pid={a['pid']}")
    reason = a.get("reason") or ""
    code = a.get("exit_code")
    if code is not None and f"exit code {code}" not in reason:
        parts.append(f"exit code {code}")
    if reason:
        parts.append(escape(reason))
    return " ".join(parts)


def _pod_gpus(pod: Mapping[str, Any]) -> str:
    """Which GPUs of its node a pod (or an attempt's one) holds: "GPUs 0,1", "0.5 of GPU 3"."""
    held = format_gpu_indices(pod.get("gpu_indices") or [])
    fraction = pod.get("gpu_fraction")
    if fraction and fraction < 1 and pod.get("gpu_indices"):
        held = f"{fraction:g} of {held}"  # a share of one GPU (resources.gpu: 0.5)
    return held


@app.command()
def why(
    workload: str = typer.Argument(..., help=refs.ID_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Why a workload is where it is: the scheduler's reason, and its queue's share of the pool."""
    c = client()
    w = c.workload(refs.workload_id(c, workload, reading=True))
    queue = c.queue(w["queue"])
    fair = queue["fair_share"].get("gpu", 0.0)
    if as_json:
        print_json(
            {
                "id": w["id"],
                "state": w["state"],
                "reason_code": w["reason_code"],
                "reason": w["reason"],
                "reclaim_blockers": w.get("reclaim_blockers") or [],
                "queue": queue,
            }
        )
        return
    code = escape(f" [{w['reason_code']}]") if w["reason_code"] else ""
    ended = w["state"] in ("succeeded", "failed", "cancelled")  # "2 (eval) failed", "3 (train) is pending"
    console.print(f"{w['id']} ({escape(member_name(w))}) {'' if ended else 'is '}{styled(w['state'])}{code}")
    if w["reason"]:
        console.print(f"  {escape(w['reason'])}")
    if w["state"] == "failed" and w.get("attempts"):  # "exit code 2" alone: the why is in its output
        said = rank_hint(w["id"], w["reason"] or "") or f"its output: `gpupool logs {w['id']}`"
        console.print(f"  {escape(said)}", highlight=False)
    console.print(
        f"  queue {queue['name']}: fair share {gpus(fair, '.3g')}, allocated {queue['gpus_allocated']:g}, "
        f"pending demand {gpus(queue['gpus_pending'])}{held_back_note(queue)}, "
        f"quota {queue['resources']['gpu'].get('quota', 0):g}"
    )
    beyond = _beyond_reclaim(w, queue, fair)
    if beyond:
        console.print(f"  {escape(beyond)}", highlight=False)
    blockers = w.get("reclaim_blockers") or []
    if blockers:
        console.print("  what reclaim may not take (other queues' work above their quotas):", highlight=False)
        for said in blockers:
            console.print(f"    {escape(said)}", highlight=False)


def _none_listed(state: str | None, queue: str | None, user: str | None, name: str | None, all: bool) -> str:
    """What `ps` says when nothing matched: "no pending or running workloads in queue research of alice"."""
    if state is not None:
        states = [part.strip() for part in state.split(",") if part.strip()]
        said = f"no {' or '.join(states)} workloads"
    else:
        said = "no workloads" if all else "no pending or running workloads"
    said += f" named {name}" if name else ""
    said += f" in queue {queue}" if queue else ""
    said += f" of user {user}" if user else ""
    return said + (" (see --all)" if state is None and not all else "")


def _beyond_reclaim(w: Mapping[str, Any], queue: Mapping[str, Any], fair: float) -> str:
    """Why reclaim does not act for work that waits for GPUs although its queue holds less than its quota
    (an operator expects it to): started, the queue would pass its fair share, and reclaim never gives a
    queue more than its fair share (docs/scheduler.md); where that share is below the quota, why."""
    if w["state"] != "pending" or w["reason_code"] not in ("no-capacity", "fragmented"):
        return ""
    from gpupool.spec.quantities import parse_gpu_request

    per_node, nodes = parse_gpu_request(w["gpus"]).count, int(w.get("nodes") or 1)
    wants = per_node * nodes
    quota = float(queue["resources"]["gpu"].get("quota") or 0.0)
    would = float(queue["gpus_allocated"]) + wants
    if wants <= 0 or would <= fair + 1e-9:
        return ""
    comes = (
        f"it starts when {nodes} schedulable nodes have {gpus(per_node)} free each"
        if nodes > 1
        else f"it starts when {gpus(wants)} {'comes' if wants == 1 else 'come'} free"
    )
    said = (
        f"reclaim takes no GPUs from other queues for it: with its {gpus(wants)} queue {queue['name']} would "
        f"hold {would:g}, "
    )
    if would > quota + 1e-9:
        return said + (
            f"above both its quota ({quota:g}) and its fair share ({format_figure(fair)}), the most reclaim "
            f"gives a queue; {comes}"
        )
    return said + (
        f"above its fair share ({format_figure(fair)}), the most reclaim gives a queue, although within its "
        f"quota ({quota:g}): the quotas it shares GPUs under promise more than there are (nodes out of "
        f"service, or a parent queue's smaller share), so each queue's guarantee shrinks in proportion "
        f"(`gpupool queues`: FAIR SHARE); {comes}"
    )


@app.command()
def logs(
    workload: str = typer.Argument(..., help=refs.ID_HELP),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the workload ends"),
    attempt: int | None = typer.Option(None, "--attempt", min=0, help="attempt number (default: latest)"),
    rank: int = typer.Option(0, "--rank", min=0, help="rank of a multi-node gang (NODE_RANK); default 0"),
) -> None:
    """Print a workload's output (stdout and stderr of its latest attempt)."""
    c = client()
    note = outage_note(c.server)

    def ask(call: Callable[[], T]) -> T:  # a follower rides out a restart of the head from its first look
        return ride_out(call, on_outage=note) if follow else call()

    found = ask(lambda: refs.workload_id(c, workload, reading=True))
    if "[" not in workload:  # a job array by its id or name stands for it whole: its first task's output
        w = ask(lambda: c.workload(found))
        tasks = w.get("task_list") or ()
        if w.get("array_id") == found and len(tasks) > 1:
            err_console.print(
                escape(
                    f"{workload} is a job array of {len(tasks)} tasks: this is task {w['array_index']}'s "
                    f"output; `gpupool logs '{w['name']}[N]'` gives task N's"
                ),
                highlight=False,
            )
    stream_log(c, found, attempt=attempt, rank=rank, follow=follow, say_unstarted=True)
    if follow:  # it ended: how, on stderr (the output alone on stdout); `gpupool wait` exits with its code
        err_console.print(ending_line(ask(lambda: c.workload(found))), highlight=False)
