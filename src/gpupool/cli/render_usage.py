"""How the CLI shows usage and cost (`gpupool usage`): a Rich table for people, CSV for spreadsheets."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from typing import Any

from rich.table import Table

from gpupool.cli.render import counted, folding_table, gpus

USAGE_OUTCOMES = ("succeeded", "failed", "cancelled", "evicted", "running")


def _hours(value: float) -> str:
    """GPU-hours as a person reads them: whole above 1,000, two decimals above 1, else three (a trace below
    that shows as <0.001, never in scientific notation)."""
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 1 or value == 0:
        return f"{value:.2f}"
    return f"{value:.3f}" if value >= 0.001 else "<0.001"


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def usage_table(report: Mapping[str, Any], top: int = 0) -> Table:
    """`gpupool usage`: a line per key, the total, and a caption with the window and the pool's use."""
    by, currency = report["by"], report["currency"]
    rows = list(report["rows"])
    shown = rows[:top] if top else rows
    quota = by == "queue"
    columns = [by.upper()]
    if by == "workload":
        columns.append("NAME")
    columns += ["GPU-H", "USED", "UTIL", "SHARE"]
    if currency:
        columns.append(currency)
    columns += ["WORKLOADS", "FAILED", "EVICTED"]
    if quota:
        columns += ["QUOTA", "OF QUOTA"]
    table = folding_table(columns, {columns[0]: [str(r["key"]) for r in shown]})
    for row in [*shown, report["total"]]:
        total = row is report["total"]
        cells = ["TOTAL" if total else str(row["key"])]
        if by == "workload":
            cells.append("" if total else str(row.get("name", "")))
        below = f" (+{_hours(row['gpu_hours_below'])} below)" if row.get("gpu_hours_below") else ""
        cells += [_hours(row["gpu_hours"]) + below, *_used(row), f"{row['share']:.1%}"]
        if currency:
            unpriced = row.get("unpriced_gpu_hours") or 0.0
            cells.append(_money(row["cost"]) + (f" (+{_hours(unpriced)} GPU-h unpriced)" if unpriced else ""))
        outcome = row["by_outcome"]
        cells += [str(row["workloads"]), _hours(outcome.get("failed", 0.0))]
        cells.append(_hours(outcome.get("evicted", 0.0)))
        if quota:
            used = row.get("quota_used")
            cells += ["" if total else _hours(row.get("quota_gpu_hours", 0.0)),
                      "" if total or used is None else f"{used:.0%}"]  # fmt: skip
        last = bool(shown) and row is shown[-1]
        table.add_row(*cells, style="bold" if total else None, end_section=last)
    capacity = report["capacity_gpu_hours"]
    used = report["total"]["gpu_hours"]
    pool = f"{used / capacity:.1%} of " if capacity > 0 else ""
    more = (
        f"; {counted(len(rows) - len(shown), 'more line')} not shown (--top)"
        if len(shown) < len(rows)
        else ""
    )
    table.caption = (
        f"{report['since'][:16].replace('T', ' ')} .. {report['until'][:16].replace('T', ' ')} UTC "
        f"({report['hours']:,.1f} h): {pool}the pool's {gpus(report['capacity_gpus'])} now x the window "
        f"({_hours(capacity)} GPU-h){more}. GPU-H: GPU-hours allocated; UTIL: their mean GPU utilization, "
        "over the attempts with GPU telemetry ((N% measured): the share of GPU-H those attempts hold, where "
        "not all); USED: those attempts' GPU-hours x UTIL"
        + (f"; {currency}: their cost" if currency else " (no prices.yaml: docs/operations.md)")
        + "; FAILED, EVICTED: GPU-hours of attempts that failed or were stopped (preempted, drained, held)"
        + (
            "; QUOTA: the GPU quota now x the window, in GPU-hours; a parent's row is its own work, "
            "(+N below) its queues', and OF QUOTA counts both"
            if quota
            else ""
        )
    )
    table.caption_justify = "left"
    return table


def _used(row: Mapping[str, Any]) -> tuple[str, str]:
    """USED and UTIL of a usage row: "-" and "no telemetry" where no attempt had GPU telemetry (not 0%),
    "-" and "-" where it held no GPUs; a share of the GPU-hours that had telemetry, where only some did."""
    used, pct = row.get("used_gpu_hours"), row.get("gpu_utilization_pct")
    if used is None or pct is None:
        return "-", "no telemetry" if row["gpu_hours"] > 0 else "-"  # no GPU-hours: nothing to measure
    measured, allocated = row.get("measured_gpu_hours") or 0.0, row["gpu_hours"]
    part = f" ({measured / allocated:.0%} measured)" if allocated > 0 and measured < 0.995 * allocated else ""
    return _hours(used), f"{pct:.0f}%{part}"


def write_usage_csv(report: Mapping[str, Any], out: Any) -> None:
    """`gpupool usage --csv`: a line per row, every figure the JSON has, in plain numbers."""
    writer = csv.writer(out, lineterminator="\n")
    header = ["since", "until", report["by"], "name", "gpu_hours", "share", "cost", "currency",
              "unpriced_gpu_hours", "workloads", "attempts", *(f"{o}_gpu_hours" for o in USAGE_OUTCOMES),
              "quota_gpu_hours", "quota_used", "used_gpu_hours", "measured_gpu_hours",
              "gpu_utilization_pct"]  # fmt: skip
    writer.writerow(header)
    for row in report["rows"]:
        outcome = row["by_outcome"]
        writer.writerow([
            report["since"], report["until"], row["key"], row.get("name", ""), row["gpu_hours"], row["share"],
            "" if row["cost"] is None else row["cost"], report["currency"] or "",
            "" if row["unpriced_gpu_hours"] is None else row["unpriced_gpu_hours"], row["workloads"],
            row["attempts"], *(outcome.get(o, 0.0) for o in USAGE_OUTCOMES),
            row.get("quota_gpu_hours", ""), "" if row.get("quota_used") is None else row["quota_used"],
            *("" if row.get(k) is None else row[k]
              for k in ("used_gpu_hours", "measured_gpu_hours", "gpu_utilization_pct")),
        ])  # fmt: skip
