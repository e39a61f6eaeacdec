"""`gpupool nodes` (`node list`) and `gpupool node cordon|uncordon`: the nodes, and whether they take new
work."""

from __future__ import annotations

import typer

from gpupool.cli.app import app, client, listing_aliases, node_app
from gpupool.cli.render import JSON_HELP, console, folding_table, human_bytes, print_json, styled


@app.command()
def nodes(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Nodes, their GPUs and what runs on them."""
    rows = client().nodes()
    if as_json:
        print_json(rows)
        return
    columns = ("NAME", "STATE", "HEALTH", "GPUS", "MODEL", "ALLOCATED", "CPUS", "MEMORY", "UTIL")
    table = folding_table(columns, {"NAME": [n["name"] for n in rows]})
    for n in rows:
        utils = [g["sample"]["utilization_pct"] for g in n["gpus"] if g.get("sample")]
        util = f"{sum(utils) / len(utils):.0f}%" if utils else "-"
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
        )
    console.print(table)


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
