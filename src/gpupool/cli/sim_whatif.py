"""`gpupool sim whatif`: replay the live cluster's recent history, read through the API, on a changed
cluster (nodes added or removed, quotas, a policy) and compare the two replays queue by queue."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpupool.cli.render import console, print_warnings
from gpupool.cli.sim import (
    CHECKPOINT_INTERVAL,
    RESTART_OVERHEAD,
    check_outputs,
    seconds,
    sim_app,
    sim_errors,
    wide,
    write_json,
)
from gpupool.sim.errors import SimError

if TYPE_CHECKING:
    from gpupool.sim.policies import Policy

HISTORY_PAGE = 100_000  # the API's largest list


@sim_app.command("whatif")
def whatif(
    add: list[str] = typer.Option([], "--add", help="add nodes, e.g. --add 4x8:H100 (repeatable)"),
    remove: list[str] = typer.Option([], "--remove", help="remove a node by name (repeatable)"),
    quota: list[str] = typer.Option([], "--quota", help="set a queue's GPU quota, e.g. --quota nlp=16"),
    since: str = typer.Option("7d", "--since", help="replay the jobs submitted in this recent period"),
    policy: str = typer.Option(
        "server",
        "--policy",
        help="the policy of both replays: server (the server's own, its scheduling.yaml and --usage-weight), "
        "a policy of sim run, or a scheduling.yaml file",
    ),
    policy_after: str | None = typer.Option(
        None,
        "--policy-after",
        help="the 'after' replay's policy, to see a change of policy (alone, or with a change of cluster): a "
        "scheduling.yaml file (e.g. from `gpupool scheduling > tuned.yaml`), a policy of sim run, or server",
    ),
    restart_overhead: str = RESTART_OVERHEAD,
    checkpoint_interval: str = CHECKPOINT_INTERVAL,
    json_out: Path | None = typer.Option(None, "--json", help="write the comparison as JSON to this file"),
    jobs: str = typer.Option(
        "auto", "--jobs", help="1: the two replays one after the other; 2 or auto: at once, in two processes"
    ),
) -> None:
    """Replay the live cluster's recent jobs on a changed cluster: change in JCT, queueing, utilization."""
    import time

    from gpupool.cli.app import client
    from gpupool.gpu.catalog import families
    from gpupool.sim import experiment as ex
    from gpupool.sim import whatif as wi
    from gpupool.sim.parallel import processes
    from gpupool.sim.policies import server_policy
    from gpupool.sim.queues import quota_warnings
    from gpupool.sim.results import SimOptions
    from gpupool.spec.views import queue_view

    with sim_errors():
        options = SimOptions(
            restart_overhead=seconds(restart_overhead, "--restart-overhead"),
            checkpoint_interval=seconds(checkpoint_interval, "--checkpoint-interval"),
        )
        servers = policy.strip() == "server"  # known once the server is asked
        if not servers:
            chosen = _one_policy(policy, "--policy")
        later = policy_after.strip() if policy_after is not None else None
        if later is not None and later == policy.strip():
            if not (add or remove or quota):
                raise SimError(
                    "--policy-after",
                    f"{later!r} is the --policy too: nothing to compare; give another policy, or a change of "
                    "cluster (--add 4x8:H100, --remove NODE, --quota QUEUE=GPUS)",
                )
            later = None  # the same policy after: a change of cluster alone
        if later is not None and later != "server":
            changed_policy = _one_policy(later, "--policy-after")
        if not (add or remove or quota or later):
            raise SimError(
                "--add",
                "nothing to change; give --add 4x8:H100, --remove NODE, --quota QUEUE=GPUS or --policy-after "
                "tuned.yaml",
            )
        period = _since_seconds(since)
        workers = processes(jobs, 2)
        wi.check_changes(add, quota)
        api = client()
        if servers or later == "server":
            running = server_policy(api.scheduling())
            chosen = running if servers else chosen
            if later == "server":
                changed_policy = running
        if later is None:
            changed_policy = chosen
        now = time.time()
        # One list per state that ran, of the period's submissions only; a list that fills the API's
        # largest page (newest first) has lost its oldest jobs: say so.
        start = datetime.fromtimestamp(now - period, UTC)
        workloads = []
        for state in wi.RAN:
            found = api.workloads(state=state, since=start, limit=HISTORY_PAGE)
            if len(found) >= HISTORY_PAGE:
                console.print(
                    f"[yellow]only the newest {HISTORY_PAGE:,} {state} jobs of the period are replayed; "
                    "a shorter --since takes them all[/yellow]"
                )
            workloads.extend(found)
        listed = api.nodes()
        nodes = wi.cluster_from_nodes(listed)
        wi.check_models(add, nodes, families())
        queues = [queue_view(q) for q in api.queues()]
        history = wi.history_jobs(workloads, now - period, now)
        after = wi.changed(nodes, queues, add, remove, quota)
        wi.check_replays(history, nodes, after[0])
        check_outputs(json_out)
        if quota or remove:  # as `sim run --queues` warns of a file: quotas promising more than the GPUs
            promised = quota_warnings(queues, sum(len(n.gpus) for n in nodes))  # the server's to warn of
            print_warnings(
                {
                    "warnings": [
                        f"{'--quota' if quota else '--remove'}: {said}"
                        for said in quota_warnings(after[1], sum(len(n.gpus) for n in after[0]))
                        if said not in promised
                    ]
                }
            )
        used = chosen.description if chosen.name == "server" else f"policy {chosen.name}"
        if changed_policy is not chosen:
            then = changed_policy.description if changed_policy.name == "server" else changed_policy.name
            used = f"{used} before, {then} after"
        console.print(
            escape(f"replaying {len(history):,} jobs of the last {since} with {used}"), highlight=False
        )
        out = sorted(f"{n['name']} ({n['state']})" for n in listed if n.get("state", "ready") != "ready")
        if out:
            console.print(
                escape(
                    f"counted in service, as the history ran on them: {', '.join(out)}; --remove NODE leaves "
                    "one out"
                ),
                highlight=False,
            )
        measured = wi.measured_jcts(workloads, now - period, now)
        result = wi.compare(
            history, (nodes, queues), after, chosen, options, workers, measured, policy_after=changed_policy
        )
        asked = [
            *add,
            *("-" + r for r in remove),
            *quota,
            *([f"policy {changed_policy.name}"] if later else []),
        ]
        table = Table(title=escape(f"what if: {' '.join(asked)}"))
        for column in (
            "queue",
            "jobs",
            "avg JCT before",
            "after",
            "change",
            "avg queued before",
            "after",
            "change",
        ):
            table.add_column(column, justify="left" if column == "queue" else "right")
        for name, q in result["queues"].items():
            if not q["jobs"]:  # a queue of the server's that ran nothing in the period: no times to tell
                table.add_row(Text(name), "0", *("-",) * 6)
                continue
            table.add_row(Text(name), str(q["jobs"]), *_change(q["avg_jct_s"]), *_change(q["avg_queue_s"]))
        b, a = result["before"], result["after"]
        table.add_row(
            "all", str(result["jobs"]), *_change([b["avg_jct_s"], a["avg_jct_s"]]),
            *_change([b["avg_queue_s"], a["avg_queue_s"]]), end_section=True,
        )  # fmt: skip
        wide().print(table)
        util = f"GPU utilization {b['gpu_util']:.1%} -> {a['gpu_util']:.1%}"
        evicted = f"preemptions {b['preemptions']:,} -> {a['preemptions']:,}"
        lost = f"GPU-hours lost to them {b['lost_gpu_h']:.2f} -> {a['lost_gpu_h']:.2f}"
        console.print(f"GPUs {b['gpus']:g} -> {a['gpus']:g}; {util}; {evicted}; {lost}", highlight=False)
        for when in ("before", "after"):
            if dropped := result[when]["dropped"]:
                console.print(
                    f"[yellow]the {when} replay dropped {ex.counted(dropped, 'job')}: no node has its GPUs, "
                    "CPUs or memory; its figures leave them out[/yellow]"
                )
            if (never := wi.unfinished_note(when, result[when])) is not None:
                console.print(f"[yellow]{escape(never)}[/yellow]", highlight=False)
        _live_note(result["live"], restart_overhead, checkpoint_interval)
        if json_out is not None:
            write_json(json_out, result)
            console.print(escape(f"figures written to {json_out}"), highlight=False)


def _one_policy(value: str, flag: str) -> Policy:
    """The one policy `value` names, refused under `flag`."""
    from gpupool.sim.policies import resolve_policies

    (chosen,) = resolve_policies(value, one=True, flag=flag)
    return chosen


def _since_seconds(value: str) -> float:
    """`--since`: a bare number would be seconds, almost surely meant as days: a unit is asked for."""
    period = seconds(value, "--since")
    try:
        float(value)
    except ValueError:
        return period
    raise SimError(
        "--since", f"{value!r} has no unit; give one, e.g. {value.strip()}d (days) or {value.strip()}h"
    )


def _live_note(live: dict[str, Any], restart_overhead: str, checkpoint_interval: str) -> None:
    """How near the replay of the cluster as it is comes to what the live cluster gave the same jobs; where
    it is far off, what to set (the replays' costs of an eviction are a model's, not measured)."""
    real, replayed = live["avg_jct_s"], live["replayed_avg_jct_s"]
    if real is None or replayed is None:
        return
    console.print(
        f"measured on the live cluster: avg JCT {_duration(real)} over {live['jobs']:,} jobs that ended; the "
        f"'before' replay gives them {_duration(replayed)}",
        highlight=False,
    )
    if abs(replayed - real) > 0.25 * real and abs(replayed - real) >= 1.0:
        console.print(
            f"[yellow]the replays count {escape(restart_overhead)} for each restart after an eviction and "
            f"lose the work since a checkpoint every {escape(checkpoint_interval)}: set --restart-overhead "
            "and --checkpoint-interval to what your jobs pay, so that 'before' comes near what was "
            "measured[/yellow]"
        )


def _change(pair: list[float | None]) -> tuple[str, str, str]:
    """Before, after, and the change in percent where the two read differently (0.4 s to 0 s is no news);
    "-" for a figure of no jobs."""
    before, after = pair
    shown = _duration(before), _duration(after)
    if before is None or after is None or before <= 0 or shown[0] == shown[1]:
        return *shown, ""
    return *shown, f"{(after - before) / before:+.0%}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.2f}h"
