"""`gpupool node show` of a lost node: no live readings, and a health line that says it is lost and since
when, also after a head restart. A real head and agents, the real CLI."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.support.agent import LOSS_LEASE, start_pool


def _gpu_row(shown: str) -> str:
    return next(line for line in shown.splitlines() if re.match(r"^ *0 +GPU-", line))


def test_a_lost_node_shows_no_live_readings_and_since_when_it_is_lost(tmp_path: Path) -> None:
    pool = start_pool(tmp_path, 2, lease=LOSS_LEASE)
    server = pool.server
    try:
        pool.agent("agent-1").kill9()
        pool.wait_for_nodes(["agent-1"], state="lost")
        since = r"; last heartbeat \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+s ago\)"
        judged = r"  health: node lost: no telemetry for \d+s \(last judged .*\)" + since
        deadline = time.monotonic() + 15  # the health loop judges the node lost at its next pass (1 s)
        while True:
            shown = server.cli("node", "show", "agent-1", check=True).stdout
            if re.search(judged, shown) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert re.search(r"GPU-\S+ +- +- +- +- +- +- ", _gpu_row(shown)), shown  # not `0C 0W 345`
        assert re.search(judged, shown), shown

        server.stop()
        server.start()
        shown = server.cli("node", "show", "agent-1", check=True).stdout
        assert re.search(r"GPU-\S+ +- +- +- +- +- +- ", _gpu_row(shown)), shown
        assert re.search(r"  health: node lost: no telemetry since the head started" + since, shown), shown
        live_row = r"GPU-\S+ +\d+% +\S+ +\d+C +\d+W +\d+ "
        deadline = time.monotonic() + 30  # the live node's first samples since the restart: a heartbeat away
        while True:
            live = server.cli("node", "show", "agent-0", check=True).stdout
            if re.search(live_row, _gpu_row(live)) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert re.search(live_row, _gpu_row(live)), live
    finally:
        pool.stop()
