"""Where work ran, as `gpupool ps` and `show` tell it: a gang's every node in NODE (as Slurm's NODELIST
writes it), each rank's node and GPUs in `show`, and finished work's node (sacct's NodeList)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.agent import start_pool


def _cells(table: str) -> dict[str, list[str]]:
    """`gpupool ps`' rows by id, cut into cells (two spaces or more part them: "2x2 [0,1]" is one)."""
    rows = [re.split(r"\s{2,}", line.strip()) for line in table.splitlines()[1:]]
    return {row[0]: row for row in rows}


def test_ps_and_show_name_every_node_a_gang_runs_on_and_where_finished_work_ran(tmp_path: Path) -> None:
    pool = start_pool(tmp_path, 2, gpus="sim:2xH100")
    server = pool.server
    go = tmp_path / "go"
    try:
        gang = server.submit(
            {"nodes": 2, "resources": {"gpu": 2}, "commands": [f"while [ ! -e {go} ]; do sleep 0.1; done"]}
        )
        server.wait_for(gang["id"], ("running",))
        rows = _cells(server.cli("ps", check=True).stdout)
        assert rows[str(gang["id"])][5] == "agent-[0-1]", rows  # rank 0's node alone before
        (listed,) = json.loads(server.cli("ps", "--json", check=True).stdout)
        assert listed["node"] in ("agent-0", "agent-1")  # kept as it was: rank 0's
        assert (
            sorted(listed["node_list"]) == ["agent-0", "agent-1"] and listed["node_list"][0] == listed["node"]
        )
        shown = server.cli("show", str(gang["id"]), check=True).stdout
        first, second = listed["node_list"]
        assert f"attempt 0: running on 2 nodes (rank 0: {first} GPUs 0,1; rank 1: {second} GPUs 0,1)" in shown

        go.touch()
        assert server.wait_for(gang["id"])["state"] == "succeeded"
        single = server.wait_for(server.submit({"resources": {"gpu": 1}, "commands": ["true"]})["id"])
        assert single["state"] == "succeeded"
        rows = _cells(server.cli("ps", "--all", check=True).stdout)
        assert rows[str(gang["id"])][5] == "agent-[0-1]", rows  # "-" for every finished workload before
        ran_on = single["attempt_list"][-1]["node"]
        assert rows[str(single["id"])][5] == ran_on, rows
        ended = {w["id"]: w for w in json.loads(server.cli("ps", "--all", "--json", check=True).stdout)}
        assert ended[single["id"]]["node"] is None and ended[single["id"]]["node_list"] == [ran_on]
    finally:
        go.touch()  # the ranks end, whatever failed (a stopped agent leaves its work running)
        pool.stop()
