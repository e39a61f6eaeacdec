"""`gpupool nodes` (`node list`), `gpupool node cordon|uncordon` and `gpupool node delete`: the nodes, whether
they take new work, and taking a retired one out of the pool."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from typing import Any

import typer
from rich.markup import escape

from gpupool.cli.app import app, client, listing_aliases, node_app
from gpupool.cli.render import (
    JSON_HELP,
    console,
    folding_table,
    human_age,
    human_bytes,
    print_json,
    print_warnings,
    styled,
)

REASON_WIDTH = 48  # characters of a state reason the table shows (`node show` and --json have all of it)


@app.command()
def nodes(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Nodes, their GPUs and what runs on them; why a node takes no work, and when its agent was last
    heard from."""
    rows = client().nodes()
    if as_json:
        print_json(rows)
        return
    columns = (
        "NAME", "STATE", "HEALTH", "GPUS", "MODEL", "ALLOCATED", "CPUS", "MEMORY", "UTIL", "LAST SEEN",
        "REASON",
    )  # fmt: skip
    table = folding_table(columns, {"NAME": [n["name"] for n in rows]})
    now = datetime.now(UTC)
    for n in rows:
        # a lost node's last samples are what its GPUs did then, not now
        utils = [g["sample"]["utilization_pct"] for g in n["gpus"] if g.get("sample")]
        util = f"{sum(utils) / len(utils):.0f}%" if utils and n["state"] != "lost" else "-"
        table.add_row(
            n["name"],
            styled("drained") if n.get("drained") else styled(n["state"]),
            styled(n.get("health", "unknown")),
            str(n["gpus_total"]),
            ",".join(n["gpu_models"]) or "-",
            f"{n['gpus_allocated']}/{n['gpus_total']}",
            f"{n['cpus']:g}",
            human_bytes(n["memory_bytes"]),
            util,
            last_seen(n, now),
            escape(short_reason(n)),
        )
    console.print(table)


def last_seen(node: dict[str, Any], now: datetime) -> str:
    """How long ago an agent node's last heartbeat was (the head stores it every 5 s); "-" for other nodes,
    whose backend answers for them."""
    at = node.get("last_heartbeat")
    if node.get("backend") != "agent" or not at:
        return "-"
    return human_age((now - datetime.fromisoformat(at)).total_seconds())


def short_reason(node: dict[str, Any]) -> str:
    """Why a node takes no new work, as Slurm's `sinfo -R` says it: its state reason's first clause,
    shortened; "-" for a ready node (whose reason is only its last change)."""
    reason = node.get("state_reason") or ""
    if node["state"] == "ready" or not reason:
        return "-"
    return textwrap.shorten(reason.split("; ")[0], REASON_WIDTH, placeholder="...")


listing_aliases(node_app, nodes, "Every node, as `gpupool nodes` lists them (also `gpupool node ls`).")


@node_app.command("cordon")
def node_cordon(
    name: str,
    reason: str | None = typer.Option(None, "--reason", help="why, shown in nodes and to waiting work"),
) -> None:
    """Stop placing new work on NAME; running work continues."""
    n = client().cordon(name, reason)
    console.print(f"node {n['name']}: {styled(n['state'])}")


@node_app.command("uncordon")
def node_uncordon(name: str) -> None:
    """Return NAME to service."""
    n = client().uncordon(name)
    console.print(f"node {n['name']}: {styled(n['state'])}")


@node_app.command("delete")
def node_delete(name: str = typer.Argument(..., help="the node's name (see `gpupool nodes`)")) -> None:
    """Remove a retired node that runs nothing (lost, or drained first), with its GPUs and its agent's
    credential: that agent is refused and must join again with a join token (admin)."""
    n = client().delete_node(name)
    print_warnings(n)
    rejoin = "; its agent must join again with a join token" if n["backend"] == "agent" else ""
    console.print(f"node {n['name']} deleted{rejoin}", highlight=False)
