"""`gpupool top`, `gpupool node show NAME`, `gpupool node inject-fault`, `gpupool node accept-gpus`,
`gpupool health run|status`."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpupool.cli.app import app, client, node_app
from gpupool.cli.bench_results import result_lines as bench_result_lines
from gpupool.cli.errors import CliError
from gpupool.cli.render import JSON_HELP, console, err_console, human_age, human_bytes, print_json, styled
from gpupool.spec import SpecError, parse_duration

health_app = typer.Typer(
    help="Node health checks: verdicts, evidence, checks on demand.", no_args_is_help=True
)
app.add_typer(health_app, name="health")

HEALTH_STYLE = {"healthy": "green", "warning": "yellow", "unhealthy": "red", "unknown": "dim"}
SPARK = " ▁▂▃▄▅▆▇█"
UNHEALTHY_EXIT = 2  # `health run` exit status when a node is unhealthy (as NHC's checks fail a node)


def health_styled(health: str) -> str:
    style = HEALTH_STYLE.get(health, "")
    return f"[{style}]{health}[/{style}]" if style else health


def sparkline(values: list[float], top: float, width: int = 30) -> str:
    """The last `width` values as block characters, 0..top."""
    if not values:
        return ""
    chosen = values[-width:]
    return "".join(
        SPARK[min(len(SPARK) - 1, round(v / top * (len(SPARK) - 1)))] if top else SPARK[0] for v in chosen
    )


# -- gpupool top -------------------------------------------------------------------------------------------


def cluster_view(nodes: list[dict[str, Any]]) -> Group:
    """The whole cluster as `top` shows it: a summary line and one row per GPU."""
    gpus = [g for n in nodes for g in n["gpus"]]
    samples = [g["sample"] for g in gpus if g.get("sample")]
    allocated = sum(1 for g in gpus if g["workloads"])
    util = sum(s["utilization_pct"] for s in samples) / len(samples) if samples else 0.0
    power = sum(s["power_w"] for s in samples)
    states: dict[str, int] = {}
    for n in nodes:
        states[n["state"]] = states.get(n["state"], 0) + 1
    summary = Text.from_markup(
        f"[bold]gpupool top[/bold]  nodes {len(nodes)} ("
        + ", ".join(f"{count} {styled(state)}" for state, count in sorted(states.items()))
        + f")  GPUs {allocated}/{len(gpus)} allocated  util {util:.0f}%  power {power / 1000:.1f} kW  "
        + time.strftime("%H:%M:%S")
    )
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("NODE", "HEALTH", "GPU", "MODEL", "UTIL", "", "MEMORY", "TEMP", "POWER", "WORKLOAD"):
        table.add_column(column, justify="right" if column in ("GPU", "UTIL", "TEMP", "POWER") else "left")
    for n in nodes:
        for g in n["gpus"]:
            s = g.get("sample") or {}
            pct = float(s.get("utilization_pct", 0.0))
            bar = "█" * int(pct / 10) + "·" * (10 - int(pct / 10))
            holders = s.get("holders") or []
            who = ", ".join(f"{h['workload']} {h['name']} ({h['queue']}/{h['user']})" for h in holders) or (
                ", ".join(map(str, g["workloads"])) or "-"
            )
            lost = bool(s.get("lost"))
            table.add_row(
                n["name"] if g["index"] == n["gpus"][0]["index"] else "",
                health_styled(n.get("health", "unknown")) if g["index"] == n["gpus"][0]["index"] else "",
                str(g["index"]),
                g["model"],
                "[red]lost[/red]" if lost else f"{pct:.0f}%",
                bar,
                f"{human_bytes(s.get('memory_used_bytes', 0))}/{human_bytes(g['memory_bytes'])}",
                f"{s.get('temperature_c', 0):.0f}C" if s else "-",
                f"{s.get('power_w', 0):.0f}W" if s else "-",
                who,
            )
    return Group(summary, table)


@app.command()
def top(
    interval: float = typer.Option(1.0, "--interval", "-n", min=0.2, help="seconds between refreshes"),
    once: bool = typer.Option(False, "--once", help="print one frame and exit (for scripts and logs)"),
) -> None:
    """Live view of every GPU of the cluster: utilization, memory, temperature, power, who holds it."""
    c = client()
    if once:
        console.print(cluster_view(c.nodes()))
        return
    if not console.is_terminal:  # a pipe or a file: a frame each interval, one after another (as top -b)
        try:
            while True:
                console.print(cluster_view(c.nodes()))
                time.sleep(interval)
        except KeyboardInterrupt:
            return
    with Live(cluster_view(c.nodes()), console=console, auto_refresh=False, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(cluster_view(c.nodes()), refresh=True)
        except KeyboardInterrupt:
            pass


# -- gpupool node show / inject-fault ----------------------------------------------------------------------


@node_app.command("show")
def node_show(
    name: str = typer.Argument(..., help="the node's name (see `gpupool nodes`)"),
    history: str = typer.Option("10m", "--history", help="how far back the history goes: 60s, 10m, 2h, 24h"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """A node's GPUs with their latest readings and recent history, its health and its events."""
    try:
        seconds = parse_duration(history, "--history")
    except SpecError as exc:
        raise CliError(f"--history {history}: {exc}; e.g. --history 10m") from exc
    if seconds > 86400:  # the head keeps a GPU's history for a day (api/routes/health.py MAX_HISTORY_S)
        raise CliError(f"--history {history}: a node keeps a day of GPU history; e.g. --history 24h")
    c = client()
    nodes = {n["name"]: n for n in c.nodes()}
    if name not in nodes:
        raise CliError(f"no node named {name!r} (nodes: {', '.join(sorted(nodes)) or 'none'})")
    node = nodes[name]
    health = c.node_health(name)
    telemetry = c.telemetry(name, seconds)
    bench = c.bench_results(node=name, latest=True)  # the newest of each series (docs/bench.md)
    if as_json:
        print_json({"node": node, "health": health, "telemetry": telemetry, "bench": bench})
        return
    console.print(
        f"[bold]{name}[/bold]  {styled(node['state'])}  health {health_styled(health['health'])}  "
        f"{node['gpus_total']}x {','.join(node['gpu_models']) or '-'}  {node['cpus']:g} CPUs  "
        f"{human_bytes(node['memory_bytes'])}  backend {node['backend']}"
    )
    if node.get("state_reason"):  # a ready node's is its last change ("uncordoned by admin"), no problem
        label = "last change" if node["state"] == "ready" else "state reason"
        console.print(f"  {label}: {escape(node['state_reason'])}", highlight=False)
    evidence = health["evidence"].removeprefix("health: ")  # a node's reason says "health: ..." already
    lost = node["state"] == "lost"
    if lost and node.get("last_heartbeat"):  # lost since when
        heard = datetime.fromisoformat(node["last_heartbeat"])
        ago = human_age((datetime.now(UTC) - heard).total_seconds())
        evidence += f"; last heartbeat {heard:%Y-%m-%d %H:%M:%S} UTC ({ago} ago)"
    console.print(f"  health: {escape(evidence)}", highlight=False)
    if health.get("expected_gpus") is not None:
        declared = health.get("declared_gpus")
        said = f"; its join token declares {declared}" if declared is not None else ""
        console.print(
            f"  expected GPUs: {health['expected_gpus']}{said} (`gpupool node accept-gpus` changes it)"
        )
    history_by_gpu = {g["index"]: g["history"] for g in telemetry["gpus"]}
    table = Table(box=None, header_style="bold")
    for column in (
        "GPU",
        "UUID",
        "UTIL",
        "MEM",
        "TEMP",
        "POWER",
        "SM MHZ",
        "XIDS",
        "WORKLOAD",
        f"UTIL, LAST {history}",
    ):
        table.add_column(column)
    for g in node["gpus"]:
        # a lost node's last sample (none after a head restart) is what its GPUs did then, not now
        s = {} if lost else g.get("sample") or {}
        points = history_by_gpu.get(g["index"], {}).get("points", [])
        xids = ",".join(str(x) for x in s.get("xid_errors", [])[-4:]) or "-"
        readings = (
            (
                "[red]lost[/red]" if s.get("lost") else f"{s.get('utilization_pct', 0):.0f}%",
                human_bytes(s.get("memory_used_bytes", 0)),
                f"{s.get('temperature_c', 0):.0f}C",
                f"{s.get('power_w', 0):.0f}W",
                f"{s.get('sm_clock_mhz', 0):.0f}",
            )
            if s
            else ("-",) * 5
        )
        table.add_row(
            str(g["index"]),
            g["uuid"][:12] + "...",
            *readings,
            xids,
            ",".join(map(str, g["workloads"])) or "-",
            sparkline([p[1] for p in points], 100.0),
        )
    console.print(table)
    if health.get("findings"):
        console.print("[bold]findings[/bold]")
        for f in health["findings"]:
            said = escape(f"{f['check']}: {f['message']}")
            console.print(f"  {health_styled(f['severity'])} {said}", highlight=False)
    active = health.get("active")
    if active:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(health["active_at"]))
        job = f", job {active['job']}" if active.get("job") is not None else ""
        console.print(
            f"[bold]active checks[/bold] ({at}{job}): {health_styled(active['health'])} {active['evidence']}"
        )
    if bench:
        console.print("[bold]bench[/bold] (newest of each series; `gpupool bench results NAME --history`)")
        for line in bench_result_lines(bench):
            console.print(line, highlight=False, soft_wrap=True)
    if health.get("events"):
        console.print("[bold]events[/bold]")
        for e in health["events"][-10:]:
            change = f"{e['from']} -> {e['to']}" if e["from"] != e["to"] else e["to"]
            said = escape(f"{e['at'][:19]}  {change:24s} {e['actor']:8s} {e['reason']}")
            console.print(f"  {said}", highlight=False)


@node_app.command("inject-fault")
def node_inject_fault(
    name: str = typer.Argument(..., help="the node (its GPUs must be simulated)"),
    gpu: int = typer.Option(..., "--gpu", min=0, help="GPU index"),
    xid: int | None = typer.Option(
        None, "--xid", help="report this Xid, e.g. 79 (fallen off the bus), 48 (DBE)"
    ),
    ecc: str | None = typer.Option(
        None, "--ecc", help="uncorrectable: one uncorrectable ECC error, row remap pending"
    ),
    throttle: str | None = typer.Option(None, "--throttle", help="thermal or power: clocks throttle"),
    slow: float | None = typer.Option(
        None, "--slow", help="active checks measure this share of the expected (0.5)"
    ),
    fall_off_bus: bool = typer.Option(False, "--fall-off-bus", help="the GPU stops answering (Xid 79)"),
    clear: bool = typer.Option(
        False, "--clear", help="repair the GPU: end throttling, slowness, loss, remaps"
    ),
) -> None:
    """Inject a fault into a simulated GPU (admin only; refused for real GPUs)."""
    chosen = {
        key: value
        for key, value in (
            ("xid", xid), ("ecc", ecc), ("throttle", throttle), ("slow", slow),
            ("fall_off_bus", fall_off_bus or None), ("clear", clear or None),
        )
        if value is not None
    }  # fmt: skip
    if len(chosen) != 1:
        raise CliError(
            "give exactly one of --xid, --ecc, --throttle, --slow, --fall-off-bus, --clear; "
            f"e.g. gpupool node inject-fault {name} --gpu {gpu} --xid 79"
        )
    if slow is not None and not math.isfinite(slow):
        raise CliError(f"--slow: {slow} is not a share of the expected figure; e.g. --slow 0.5")
    done = client().inject_fault(name, gpu, **chosen)
    console.print(f"node {name}: {done['result']}", highlight=False)


@node_app.command("accept-gpus")
def node_accept_gpus(
    name: str = typer.Argument(..., help="the node, with the GPUs it has registered now"),
) -> None:
    """Expect the node to have the GPUs it has now (admin): after a GPU is gone for good, or one is added."""
    done = client().accept_gpus(name)
    console.print(f"node {name}: {done['result']}", highlight=False)


# -- gpupool health ----------------------------------------------------------------------------------------


@health_app.command("run")
def health_run(
    node: str | None = typer.Option(None, "--node", help="the node to check (default: every node that can)"),
    level: str = typer.Option("quick", "--level", help="quick (GEMM, copies, memory) or full (+ all-reduce)"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Run the passive and active checks now; an unhealthy node is drained, a passing one returns to service.

    The active checks run as a job on the node holding all its GPUs (queue gpupool-system), so a node that
    runs other work is refused (--node) or skipped. Exit status 2 when a node is unhealthy."""
    if level not in ("quick", "full"):
        raise CliError(f"--level {level}: one of quick, full")
    with err_console.status(f"running the {level} health checks on {node or 'every node'}..."):
        reports = client().run_health_checks(node, level)
    if as_json:
        print_json(reports)
    else:
        for r in reports:
            console.print(
                f"[bold]{r['node']}[/bold] {health_styled(r['health'])} ({styled(r['state'])}): "
                f"{r['evidence']}",
                highlight=False,
            )
            if r.get("skipped"):
                console.print(f"  not checked now: {r['skipped']}", highlight=False)
            job = (r.get("active") or {}).get("job")
            if job is not None:
                console.print(f"  check job {job} (`gpupool logs {job}`)", highlight=False)
            result = (r.get("active") or {}).get("result")
            if result:
                table = Table(box=None, header_style="bold")
                for column in ("GPU", "MODEL", "GEMM TFLOPS", "H2D GB/s", "D2H GB/s", "MEMTEST", "ERROR"):
                    table.add_column(column)
                for g in result["gpus"]:
                    table.add_row(
                        str(g["index"]), g["model"], _num(g["gemm_tflops"]), _num(g["h2d_gbps"]),
                        _num(g["d2h_gbps"]), _num(g["memtest_errors"]), g["error"] or "",
                    )  # fmt: skip
                console.print(table)
                if result.get("allreduce_busbw_gbps") is not None:
                    console.print(f"  all-reduce busbw {result['allreduce_busbw_gbps']:.1f} GB/s")
                for note in result.get("notes", []):
                    console.print(f"  note: {note}", highlight=False)
    if any(r["health"] == "unhealthy" for r in reports):
        raise typer.Exit(UNHEALTHY_EXIT)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@health_app.command("status")
def health_status(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Every node's health verdict with its evidence."""
    rows = client().node_health()
    if as_json:
        print_json(rows)
        return
    table = Table(box=None, header_style="bold")
    for column in ("NODE", "HEALTH", "EVIDENCE"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r["node"], health_styled(r["health"]), r["evidence"])
    console.print(table)
