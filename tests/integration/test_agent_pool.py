"""Agents on loopback: joining (or being refused), jobs and gangs across agents, logs per rank, drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support import plain_http
from tests.support.agent import LOSS_LEASE, AgentProcess, Pool, agent_head, join_token, start_pool
from tests.support.process import alive


def _until(what: str, probe: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not probe():
        assert time.time() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.2)


def test_agents_join_run_single_and_gang_jobs_and_ship_every_ranks_log(tmp_path: Path) -> None:
    pool = start_pool(tmp_path, 2, gpus="sim:2xH100")
    server = pool.server
    try:
        nodes = pool.nodes()
        assert {n["backend"] for n in nodes.values()} == {"agent"}
        assert nodes["agent-0"]["gpus_total"] == 2 and nodes["agent-0"]["gpu_models"] == ["H100"]
        assert nodes["agent-0"]["last_heartbeat"] is not None

        single = server.submit({"resources": {"gpu": 1}, "commands": ["echo hello from $GPUPOOL_NODE_RANK"]})
        gang = server.submit(
            {
                "nodes": 2,
                "resources": {"gpu": 2},
                "commands": [
                    "echo rank=$NODE_RANK of $NNODES master=$MASTER_ADDR:$MASTER_PORT"
                    " gpus=$CUDA_VISIBLE_DEVICES"
                ],
            }
        )
        assert server.wait_for(single["id"])["state"] == "succeeded"
        done = server.wait_for(gang["id"])
        assert done["state"] == "succeeded", done
        attempt = done["attempt_list"][0]
        assert sorted(p["node"] for p in attempt["pods"]) == ["agent-0", "agent-1"]
        logs = {}
        for rank in (0, 1):
            result = server.cli("logs", str(gang["id"]), "--rank", str(rank), check=True)
            logs[rank] = result.stdout
        assert "rank=0 of 2 master=127.0.0.1:" in logs[0] and "gpus=0,1" in logs[0]
        assert "rank=1 of 2 master=127.0.0.1:" in logs[1]
        port = logs[0].split("master=127.0.0.1:")[1].split()[0]
        assert f"127.0.0.1:{port}" in logs[1], "every rank must see the same MASTER_PORT"
        rank0 = next(p["node"] for p in attempt["pods"])
        low, high = map(int, pool.agent(rank0).rendezvous_ports.split("-"))
        assert low <= int(port) <= high, "MASTER_PORT comes from rank 0's node's --rendezvous-ports"
        assert "hello from 0" in server.cli("logs", str(single["id"]), check=True).stdout
        missing = server.cli("logs", str(gang["id"]), "--rank", "2")
        assert missing.returncode == 1 and "no rank 2" in missing.stderr
        # a node that cannot start a rank says why in the reason, not only in the log (an "exit code 127")
        nowhere = tmp_path / "not-on-the-nodes"
        unstarted = server.wait_for(server.submit({"commands": ["true"], "workdir": str(nowhere)})["id"])
        assert unstarted["state"] == "failed", unstarted
        assert f"cannot start rank 0: workdir {nowhere} does not exist on this node" in unstarted["reason"]
        nodes_json = server.cli("nodes", "--json", check=True).stdout
        assert '"last_heartbeat"' in nodes_json and '"agent-1"' in nodes_json
    finally:
        pool.stop()


def test_a_failing_rank_stops_the_whole_gang_and_it_is_retried_as_one(tmp_path: Path) -> None:
    """The other ranks are stopped as a cancel stops work: SIGTERM, time to checkpoint, then SIGKILL (they
    were SIGKILLed at once, and a job that saves on SIGTERM lost its work); the attempt ends with the
    failing rank's code, not the others' 143."""
    pool = start_pool(tmp_path, 2)
    server = pool.server
    try:
        marks = tmp_path / "marks"
        marks.mkdir()
        gang = server.submit(
            {
                "nodes": 2,
                "resources": {"gpu": 1},
                "retry": {"max_restarts": 1, "on": ["failure"]},
                "grace_period": "20s",
                "commands": [
                    f"echo $GPUPOOL_ATTEMPT >> {marks}/rank-$NODE_RANK",
                    'if [ "$NODE_RANK" = 1 ]; then sleep 0.5; exit 3; fi',
                    f"trap 'sleep 3; echo saved $GPUPOOL_ATTEMPT >> {marks}/term; exit 143' TERM",
                    "sleep 60 & wait $!",
                ],
            }
        )
        # while rank 0 saves, the gang reads as stopping, with the cause (it read "running, started on ...")
        ending = server.wait_until(gang["id"], lambda w: w["reason_code"] == "stopping", timeout=30.0)
        assert ending["state"] == "running", ending
        assert ending["reason"].startswith("stopping: rank 1 on "), ending["reason"]
        assert "exited with code 3; stopping rank(s) 0 (SIGTERM, SIGKILL after 20s)" in ending["reason"]
        done = server.wait_for(gang["id"], timeout=60)
        assert done["state"] == "failed" and done["exit_code"] == 3, done
        assert done["attempts"] == 2, "the gang is retried as one, per its retry policy"
        failed_rank = [a["reason"] for a in done["attempt_list"]] + [done["reason"]]
        assert all("exit code 3 (rank 1 on " in said for said in failed_rank), failed_rank
        assert (marks / "rank-0").read_text().split() == ["0", "1"]
        assert (marks / "rank-1").read_text().split() == ["0", "1"]
        assert (marks / "term").read_text().splitlines() == ["saved 0", "saved 1"]  # 3 s to save, each time
        shown = server.cli("logs", str(gang["id"]), check=True)  # rank 0's: it says where rank 1's is
        assert f"rank 1 ended the attempt: its output is `gpupool logs {gang['id']} --rank 1`" in shown.stderr
        # Rank 0 (sleep 60) was stopped with the gang: nothing is left running on any agent.
        time.sleep(1.5)
        assert all(n["workloads"] == [] for n in pool.nodes().values())
    finally:
        pool.stop()


def test_heartbeat_answers_carry_the_version_they_were_written_at_so_an_agent_can_order_them(
    tmp_path: Path,
) -> None:
    # An agent has two heartbeats in flight (its long-poll, and a report when a process ends); it applies
    # no answer older than one it has applied, or it would stop a rank started since and start it again.
    # The test is the agent: between its heartbeats it runs the CLI, which took over 3 s on a loaded
    # machine (the node was lost and its job failed before `gpupool cancel`): a lease it cannot miss.
    pool = start_pool(tmp_path, 0, lease="60s")
    server = pool.server
    try:
        info = {"gpus": [["H100", 1]], "cpus": 8, "memory_bytes": 64 << 30}
        with plain_http.client(base_url=server.url, timeout=30) as client:
            joined = client.post(
                "/api/v1/agents/register",
                json={"name": "probe", "join_token": join_token(server), "info": info},
            )
            assert joined.status_code == 200, joined.text
            headers = {"Authorization": f"Bearer {joined.json()['credential']}"}

            def beat(attempts: list[dict[str, Any]], wait: float) -> dict[str, Any]:
                body = {"attempts": attempts, "wait": wait}
                answer = client.post("/api/v1/agents/heartbeat", json=body, headers=headers)
                assert answer.status_code == 200, answer.text
                return dict(answer.json())

            empty = beat([], 0)
            assert empty["attempts"] == [] and isinstance(empty["version"], int)
            job = server.submit({"resources": {"gpu": 1}, "commands": ["sleep 60"]})
            offered = beat([], 1.0)
            deadline = time.time() + 30
            while not offered["attempts"] and time.time() < deadline:
                offered = beat([], 1.0)
            (entry,) = offered["attempts"]
            assert "launch" in entry and offered["version"] > empty["version"], (empty, offered)
            running = [{k: entry[k] for k in ("attempt_id", "rank", "token")} | {"state": "running"}]
            again = beat(running, 0)
            assert again["version"] >= offered["version"] and "launch" not in again["attempts"][0]
            server.cli("cancel", str(job["id"]), check=True)
            stopped = beat(running, 1.0)
            deadline = time.time() + 30
            while stopped["version"] == offered["version"] and time.time() < deadline:
                stopped = beat(running, 1.0)
            assert stopped["version"] > offered["version"], "asking the rank to stop is a newer answer"
    finally:
        pool.stop()


def test_join_tokens_bad_revoked_and_expired_are_refused_with_the_fix(tmp_path: Path) -> None:
    pool = start_pool(tmp_path, 0)
    server = pool.server
    try:
        created = server.cli("node", "join-token", "create", "--ttl", "1h", "--json", check=True)
        import json

        row = json.loads(created.stdout)
        listed = server.cli("node", "join-token", "list", check=True).stdout
        assert row["prefix"] in listed and "valid" in listed and row["token"] not in listed

        bad = AgentProcess(server, "intruder", tmp_path / "intruder", "gpj_not-a-token").start()
        assert bad.proc is not None and bad.proc.wait(timeout=30) == 1
        assert "invalid join token" in bad.log() and "gpupool node join-token create" in bad.log()

        server.cli("node", "join-token", "revoke", str(row["id"]), check=True)
        revoked = AgentProcess(server, "late", tmp_path / "late", row["token"]).start()
        assert revoked.proc is not None and revoked.proc.wait(timeout=30) == 1
        assert "was revoked" in revoked.log()

        short = join_token(server, ttl="1s")
        time.sleep(1.5)
        expired = AgentProcess(server, "later", tmp_path / "later", short).start()
        assert expired.proc is not None and expired.proc.wait(timeout=30) == 1
        assert "expired" in expired.log()
        assert set(pool.nodes()) == set(), "a refused agent leaves no node behind"

        bad_ttl = server.cli("node", "join-token", "create", "--ttl", "soon")
        assert bad_ttl.returncode == 1
        assert bad_ttl.stderr.strip() == (
            "error: --ttl: 'soon' is not a duration: write numbers with units d, h, m or s; "
            "e.g. --ttl 1h, or --ttl never"
        )
    finally:
        pool.stop()


def test_a_node_that_joins_with_fewer_gpus_than_its_join_token_declares_is_taken_out(tmp_path: Path) -> None:
    """As Slurm drains a node whose registered Gres count is below the configured one: the token says each
    node has 4 GPUs; an agent that comes with 2 is unhealthy from its first verdict, saying so."""
    pool = start_pool(tmp_path, 0)
    server = pool.server
    try:
        bad = server.cli("node", "join-token", "create", "--gpus", "-1")
        assert bad.returncode == 1
        assert "gpus must be a whole number of GPUs per node, 0..1024, got -1" in bad.stderr
        import json

        created = server.cli("node", "join-token", "create", "--gpus", "4", "--json", check=True)
        row = json.loads(created.stdout)
        assert row["gpus"] == 4
        listed = server.cli("node", "join-token", "list", check=True).stdout.splitlines()
        assert listed[0].split() == ["ID", "PREFIX", "STATE", "EXPIRES", "USES", "GPUS", "DESCRIPTION"]
        assert listed[-1].split()[5] == "4"  # the pool's own token, made first, declares none
        short = AgentProcess(server, "short", tmp_path / "short", row["token"], gpus="sim:2xH100").start()
        pool.agents.append(short)
        pool.wait_for_nodes(["short"], state="unhealthy")
        node = pool.nodes()["short"]
        assert node["state_reason"] == (
            "health: 2 of 4 expected GPUs answer; 2 never registered (its join token declares 4)"
        )
        shown = server.cli("node", "show", "short", check=True).stdout
        assert "expected GPUs: 4; its join token declares 4" in shown
        assert "  state reason: health: 2 of 4 expected GPUs answer" in shown  # out of service: why
    finally:
        pool.stop()


def test_an_agent_restarted_without_its_join_token_comes_back_with_its_credential(tmp_path: Path) -> None:
    pool = start_pool(tmp_path, 1)
    server = pool.server
    try:
        # The job runs until the test opens the gate, and the agent is killed once it has started the
        # rank (not after a fixed second, and not against a "sleep 4" that a loaded machine could end first).
        gate = tmp_path / "gate"
        job = server.submit(
            {
                "resources": {"gpu": 1},
                "commands": [f"while [ ! -e {gate} ]; do sleep 0.1; done", "echo survived"],
            }
        )
        server.wait_for(job["id"], states=("running",))
        agent = pool.agents[0]
        _until("the agent to start the rank", lambda: "event=rank_started" in agent.log())
        agent.kill9()
        agent.token = None  # the credential in its state dir is enough now
        agent.start()
        _until("the restarted agent to re-adopt the rank", lambda: "event=rank_readopted" in agent.log())
        gate.touch()
        done = server.wait_for(job["id"], timeout=30)
        assert done["state"] == "succeeded" and done["attempts"] == 1, "re-adopted, not restarted"
        assert "event=rank_readopted" in agent.log()
        assert "survived" in server.cli("logs", str(job["id"]), check=True).stdout
    finally:
        pool.stop()


def test_rolling_drain_moves_work_one_node_at_a_time_and_resumes_it(tmp_path: Path) -> None:
    # Two busy nodes and two free ones, each job to a free node; the jobs run until the test opens the gate
    # (with 10 s of steps and one free node, the second job could finish before a loaded machine drained
    # its node, and the drain of the second node waited for the first job to end).
    pool = start_pool(tmp_path, 4)
    server = pool.server
    try:
        work = tmp_path / "work"
        work.mkdir()
        gate = tmp_path / "gate"
        jobs = [
            server.submit(
                {
                    "resources": {"gpu": 1},
                    "grace_period": 5,
                    "checkpoint": {"dir": str(work / f"ckpt-{i}")},
                    "commands": [
                        "n=$(cat $GPUPOOL_CHECKPOINT_DIR/n 2>/dev/null || echo 0)",
                        "trap 'echo $n > $GPUPOOL_CHECKPOINT_DIR/n; exit 143' TERM",
                        f"while [ ! -e {gate} ]; do n=$((n+1)); sleep 0.25; done",
                    ],
                }
            )
            for i in range(2)
        ]
        for job in jobs:
            server.wait_for(job["id"], states=("running",))
        busy = sorted({server.workload(j["id"])["node"] for j in jobs})
        assert len(busy) == 2
        result = subprocess.run(
            [sys.executable, "-m", "gpupool.main", "node", "drain", *busy, "--rolling", "--timeout", "60s"],
            env=server.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert all(f"node {name}: drained" in result.stdout for name in busy)
        nodes = pool.nodes()
        assert all(nodes[name]["state"] == "draining" for name in busy)
        for job in jobs:  # both run again, on the nodes that were free
            again = server.workload(job["id"])
            assert again["state"] == "running" and again["node"] not in busy, again
        gate.touch()
        for job in jobs:
            done = server.wait_for(job["id"], timeout=60)
            assert done["state"] == "succeeded", done
            assert done["attempts"] >= 2 and done["attempt_list"][0]["state"] == "evicted"
            assert " drained by admin; exit code " in done["attempt_list"][0]["reason"]
    finally:
        pool.stop()


def test_heartbeats_with_a_bad_credential_or_body_get_the_api_error_with_the_fix(tmp_path: Path) -> None:
    pool = start_pool(tmp_path, 0)
    server = pool.server
    try:
        token = join_token(server)
        with plain_http.client(base_url=server.url, timeout=30) as client:
            joined = client.post(
                "/api/v1/agents/register",
                json={"name": "probe", "join_token": token, "info": {"gpus": [["H100", 1]], "cpus": 4}},
            )
            assert joined.status_code == 200, joined.text
            good = {"Authorization": f"Bearer {joined.json()['credential']}"}
            for info, field in (
                ({"rendezvous_ports": [30000, 20000]}, "info.rendezvous_ports"),
                ({"devices": [{"index": 0}]}, "info.devices[0]"),
            ):
                refused = client.post(
                    "/api/v1/agents/register", json={"name": "odd", "join_token": token, "info": info}
                )
                assert refused.status_code == 422 and refused.json()["error"]["field"] == field
            assert "odd" not in pool.nodes(), "a refused registration leaves no node behind"
            path = "/api/v1/agents/heartbeat"

            answer = client.post(path, json={"attempts": [], "wait": 0}, headers=good)
            assert answer.status_code == 200 and answer.json()["attempts"] == []

            missing = client.post(path, json={"attempts": []})
            assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
            assert "register with a join token" in missing.json()["error"]["message"]
            wrong = client.post(path, json={}, headers={"Authorization": "Bearer gpn_nope"})
            assert wrong.status_code == 401 and "new --join-token" in wrong.json()["error"]["message"]
            garbled = client.post(path, content=b"{not json", headers=good)
            assert garbled.status_code == 422 and "not JSON" in garbled.json()["error"]["message"]
            listed = client.post(path, json=[1, 2], headers=good)
            assert listed.status_code == 422 and "JSON object" in listed.json()["error"]["message"]
            huge = client.post(path, content=b" " * (2 << 20), headers=good)
            assert huge.status_code == 413 and huge.json()["error"]["code"] == "too_large"
    finally:
        pool.stop()


def test_agent_nodes_keep_their_gpu_uuids_and_nvlink_islands_and_a_job_stays_on_one_island(
    tmp_path: Path,
) -> None:
    # Two NVLink islands of two GPUs each (a simulated machine with two NVLink pairs).
    pool = start_pool(tmp_path, 1, gpus="sim:2xH100,2xH100")
    server = pool.server
    try:
        agent = pool.agents[0]
        gpus = pool.nodes()["agent-0"]["gpus"]
        assert [g["nvlink_island"] for g in gpus] == [0, 0, 1, 1]
        assert all(g["uuid"].startswith("GPU-") for g in gpus) and len({g["uuid"] for g in gpus}) == 4
        deadline = time.time() + 10  # telemetry is labelled with the same UUIDs
        while any(g["sample"] is None for g in gpus) and time.time() < deadline:
            time.sleep(0.5)
            gpus = pool.nodes()["agent-0"]["gpus"]
        assert [g["sample"]["uuid"] for g in gpus] == [g["uuid"] for g in gpus], agent.log()[-2000:]

        holder = server.submit({"resources": {"gpu": 1}, "commands": ["sleep 30"]})
        held = server.wait_for(holder["id"], states=("running",))["attempt_list"][0]["gpu_indices"]
        pair = server.submit({"resources": {"gpu": 2}, "commands": ["echo gpus=$CUDA_VISIBLE_DEVICES"]})
        done = server.wait_for(pair["id"])
        assert done["state"] == "succeeded", done
        indices = done["attempt_list"][0]["gpu_indices"]
        islands = {gpus[i]["nvlink_island"] for i in indices}
        assert len(islands) == 1, f"held {held}, the pair got {indices}: across NVLink islands"
        server.cli("cancel", str(holder["id"]), check=True)
    finally:
        pool.stop()


def test_a_join_token_cannot_take_over_a_running_node_nor_name_one_outside_host_names(tmp_path: Path) -> None:
    """The review's attack: with the reusable join token, register the name of a live node running a job
    that uses a secret. It got a new credential, and its first heartbeat the attempt's fencing token,
    script and secret, while the real agent was refused and exited, its job left running unsupervised."""
    pool = start_pool(tmp_path, 1)
    server = pool.server
    try:
        token = join_token(server)
        with server.http() as admin:
            assert admin.put("/api/v1/secrets/HF_TOKEN", json={"value": "hf-carols"}).status_code == 200
            created = admin.post("/api/v1/join-tokens", json={}).json()  # no ttl: it expires in an hour
            expires = datetime.fromisoformat(created["expires_at"])
            assert 3500 < (expires - datetime.now(UTC)).total_seconds() <= 3600, created
        for args, hour in ((("--json",), True), (("--ttl", "never", "--json"), False)):  # the CLI alike
            made = json.loads(server.cli("node", "join-token", "create", *args, check=True).stdout)
            assert (made["expires_at"] is not None) == hour, made
        job = server.submit({"resources": {"gpu": 1}, "secrets": ["HF_TOKEN"], "commands": ["sleep 60"]})
        server.wait_for(job["id"], states=("running",))
        with plain_http.client(base_url=server.url, timeout=30) as client:
            body = {"name": "agent-0", "join_token": token, "info": {}}
            taken = client.post("/api/v1/agents/register", json=body)
            assert taken.status_code == 409, taken.text
            error = taken.json()["error"]
            assert error["code"] == "node_name_taken" and error["field"] == "name"
            said = error["message"]
            assert "'agent-0' belongs to the agent that joined with that name and is not lost" in said
            assert "credential" not in taken.json() and "hf-carols" not in taken.text
            for name in ("a\x1b[31mred", "..", "$(id)", "x" * 253):
                odd = client.post("/api/v1/agents/register", json={**body, "name": name})
                assert odd.status_code == 422 and odd.json()["error"]["field"] == "name", odd.text
        time.sleep(2)  # heartbeats of the real agent go on with its own credential
        agent = pool.agents[0]
        assert agent.proc is not None and agent.proc.poll() is None, agent.log()
        assert "invalid node credential" not in agent.log()
        assert server.workload(job["id"])["state"] == "running"
        assert set(pool.nodes()) == {"agent-0"}, "a refused name leaves no node behind"
        server.cli("cancel", str(job["id"]), check=True)
    finally:
        pool.stop()


def test_a_reinstalled_machine_joins_again_under_its_name_once_the_old_agent_is_lost(tmp_path: Path) -> None:
    """Its credential went with its disk: the new agent, with a join token, waits (and says why) until the
    head has seen the old one lost, then takes the name; the old credential works no more."""
    pool = start_pool(tmp_path, 1, lease=LOSS_LEASE)
    server = pool.server
    try:
        old = pool.agents[0]
        old.kill9()
        new = AgentProcess(server, "agent-0", tmp_path / "reinstalled", join_token(server)).start()
        pool.agents.append(new)
        _until("the new agent to wait for the name", lambda: "event=node_name_held" in new.log())
        assert "not lost (its last heartbeat was" in new.log()
        _until("the new agent to join", lambda: "event=agent_joined" in new.log(), timeout=40)
        pool.wait_for_nodes(["agent-0"])
        assert new.proc is not None and new.proc.poll() is None
        done = server.wait_for(server.submit({"resources": {"gpu": 1}, "commands": ["echo back"]})["id"])
        assert done["state"] == "succeeded", done
    finally:
        pool.stop()


# What the tester saw on a node whose clock was two hours behind (a sitecustomize shifting time.time).
CLOCK_TWO_HOURS_BEHIND = """\
import time
_time = time.time
time.time = lambda: _time() - 7200
"""
# Seven seconds of a busy CPU (its simulated GPU is as busy as it): longer than the 5 s between the head's
# looks at running attempts' telemetry, so that one sees it running (control/efficiency.py).
BUSY = "import time\nend = time.time() + 7\nwhile time.time() < end:\n    pass\n"


def test_an_agent_whose_clock_is_two_hours_behind_keeps_its_jobs_gpu_telemetry(tmp_path: Path) -> None:
    """Its samples were kept at its own times, two hours before the work they measured on the head's
    clock: `gpupool show` said "no GPU telemetry" for a job that kept its GPU busy. The head now keeps them
    on its own clock, and says which node's clock is off, by how much."""
    behind = tmp_path / "behind"
    behind.mkdir()
    (behind / "sitecustomize.py").write_text(CLOCK_TWO_HOURS_BEHIND)
    (tmp_path / "busy.py").write_text(BUSY)
    server = agent_head(tmp_path / "home").start()
    # The agent's view of the head, with the shifted clock on its PYTHONPATH (the head's own is right).
    shifted = replace(
        server, proc=None, extra_env={"PYTHONPATH": f"{behind}:{os.environ.get('PYTHONPATH', '')}"}
    )
    agent = AgentProcess(shifted, "agent-0", tmp_path / "agents" / "agent-0", join_token(server))
    pool = Pool(server, [agent.start()])
    try:
        pool.wait_for_nodes(["agent-0"])
        job = server.submit(
            {"resources": {"gpu": 1}, "commands": [f"{sys.executable} {tmp_path / 'busy.py'}"]}
        )
        done = server.wait_until(
            job["id"],
            lambda w: (
                w["state"] not in ("pending", "running") and w["attempt_list"][-1]["gpu_seconds_sampled"]
            ),
            timeout=60.0,
        )  # written at the look after the attempt ended (every 5 s)
        attempt = done["attempt_list"][-1]
        assert done["state"] == "succeeded", done
        assert attempt["gpu_utilization_pct"] is not None and attempt["gpu_utilization_pct"] > 5.0, attempt
        assert "event=agent_clock_off node=agent-0 offset=7200" in server.log()
        assert "clock is 7200" in server.log() and "s behind the head's" in server.log()
    finally:
        pool.stop()


def test_an_agent_stopped_by_sigterm_says_its_ranks_run_on_and_keeps_its_state_its_own(
    tmp_path: Path,
) -> None:
    """It said nothing and left its state dir 0755 with each rank's fencing token 0644; nor did it say that
    its orphan grace was shorter than the head's node lease."""
    pool = start_pool(tmp_path, 1, orphan_grace="5s")  # the head's node lease: 10 s
    server = pool.server
    agent = pool.agents[0]
    pid_file = tmp_path / "pid"
    try:
        assert "--orphan-grace 5s is shorter than the head's node lease of 10s: " in agent.log()
        job = server.submit({"resources": {"gpu": 1}, "commands": [f"echo $$ > {pid_file}", "sleep 60"]})
        server.wait_for(job["id"], states=("running",))
        _until("the job to start", lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        pid = int(pid_file.read_text())
        assert agent.state_dir.stat().st_mode & 0o777 == 0o700
        (rank,) = (agent.state_dir / "attempts").glob("*/rank.json")
        assert rank.stat().st_mode & 0o777 == 0o600
        agent.signal(signal.SIGTERM)
        assert agent.proc is not None and agent.proc.wait(timeout=15) == 0
        assert "event=agent_stopping node=agent-0 by=SIGTERM running_ranks=1: they run on" in agent.log()
        assert alive(pid), "an agent's ranks outlive it"
        agent.start()  # re-adopts the rank; the head stops it on cancel
        server.cli("cancel", str(job["id"]), check=True)
        assert server.wait_for(job["id"])["state"] == "cancelled"
        _until("the rank to be stopped", lambda: not alive(pid))
    finally:
        pool.stop()
