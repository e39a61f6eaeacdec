"""`gpupool scheduling`: the scheduling policy the head runs, printed as a scheduling.yaml (to keep, to
change, to replay with `gpupool sim run --policy gpupool,FILE` before the head runs it)."""

from __future__ import annotations

from typing import Any

import typer

from gpupool.cli.app import app, client
from gpupool.cli.render import print_json


@app.command()
def scheduling(as_json: bool = typer.Option(False, "--json", help="the API's answer as it is")) -> None:
    """The scheduling policy the head runs, as a scheduling.yaml: save it, change it, replay it
    (gpupool sim run --policy gpupool,FILE)."""
    c = client()
    shown = c.scheduling()
    if as_json:
        print_json(shown)
        return
    print(policy_yaml(shown, c.server), end="")


def policy_yaml(shown: dict[str, Any], server: str) -> str:
    """`GET /api/v1/scheduling`'s answer as the text of a scheduling.yaml that gives the same policy, what
    it changes of the default and where it came from in comments."""
    from gpupool.spec import format_duration
    from gpupool.spec.scheduling import changed_fields, field_texts, parse_scheduling_spec

    config = parse_scheduling_spec(shown["policy"]).config()
    source = shown.get("source")
    changed = changed_fields(config)
    weight = shown.get("usage_weight") or 0
    history = (
        f"--usage-weight {weight:g}, --usage-half-life {format_duration(shown['usage_half_life_s'])}"
        if weight
        else "off (--usage-weight 0)"
    )
    lines = [
        f"# the scheduling policy of the head at {server}: "
        + (f"its file {source}" if source else "gpupool's default (no scheduling.yaml)"),
        "# changed from the default: " + (", ".join(changed) if changed else "nothing"),
        f"# fair share by history (a flag of gpupool server, not of this file): {history}",
        *(f"{name}: {text}" for name, text in field_texts(config).items()),
    ]
    return "\n".join(lines) + "\n"
