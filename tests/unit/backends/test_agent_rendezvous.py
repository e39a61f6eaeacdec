"""The agent backend hands each attempt a rendezvous port (MASTER_PORT) from rank 0's node's own range."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool.backends.agent import AgentBackend
from gpupool.backends.agent_records import BadRegistration
from gpupool.backends.base import Handle, Launch, LaunchError, Pod


def _launch(tmp_path: Path, attempt_id: int, nodes: tuple[str, ...], service_port: int = 0) -> Launch:
    run_dir = tmp_path / "runs" / str(attempt_id)
    return Launch(
        attempt_id=attempt_id,
        workload_id=attempt_id,
        attempt_number=0,
        script="true\n",
        env={"MASTER_PORT": "1"},  # the head's own choice, which a node cannot honour
        workdir=tmp_path,
        run_dir=run_dir,
        log_path=run_dir / "attempt-0.log",
        pods=tuple(Pod(node, (0,), 1.0) for node in nodes),
        fencing_token=f"token-{attempt_id}",
        service_port=service_port,
    )


def _record(tmp_path: Path, attempt_id: int) -> dict[str, Any]:
    return dict(json.loads((tmp_path / "runs" / str(attempt_id) / "launch.json").read_text()))


def test_every_rank_gets_a_port_of_rank_0s_range_in_turn_skipping_held_ones(tmp_path: Path) -> None:
    backend = AgentBackend()
    backend.register("a", {"gpus": [["H100", 1]], "rendezvous_ports": [40000, 40002]}, "10.0.0.1")
    backend.register("b", {"gpus": [["H100", 1]]}, "10.0.0.2")  # an older agent: the default range

    backend.start(_launch(tmp_path, 1, ("a", "b")))
    record = _record(tmp_path, 1)
    assert record["master_port"] == 40000  # a restarted head knows which ports are held
    assert [r["env"]["MASTER_PORT"] for r in record["launches"]] == ["40000", "40000"]
    assert [r["env"]["GPUPOOL_MASTER_PORT"] for r in record["launches"]] == ["40000", "40000"]

    backend.start(_launch(tmp_path, 2, ("a",)))
    backend.cleanup(Handle(1, 0.0))
    backend.start(_launch(tmp_path, 3, ("a",)))
    backend.start(_launch(tmp_path, 4, ("a",)))  # 40000 is free again; 40001 is still held
    ports = [
        json.loads((tmp_path / "runs" / str(i) / "launch.json").read_text())["master_port"] for i in (2, 3, 4)
    ]
    assert ports == [40001, 40002, 40000]

    with pytest.raises(LaunchError, match="wider --rendezvous-ports"):
        backend.start(_launch(tmp_path, 5, ("a",)))
    backend.start(_launch(tmp_path, 6, ("b", "a")))
    assert _record(tmp_path, 6)["master_port"] == 29500


def test_a_restarted_head_keeps_the_ports_of_the_attempts_it_adopts(tmp_path: Path) -> None:
    before = AgentBackend()
    before.register("a", {"rendezvous_ports": [40000, 40001]}, "10.0.0.1")
    before.start(_launch(tmp_path, 1, ("a",)))

    after = AgentBackend()
    after.register("a", {"rendezvous_ports": [40000, 40001]}, "10.0.0.1")
    after.status(Handle(1, 0.0), tmp_path / "runs" / "1")  # re-adopted from its run dir, as recover() does
    after.start(_launch(tmp_path, 2, ("a",)))
    assert _record(tmp_path, 2)["master_port"] == 40001


def test_a_service_listens_on_a_port_of_its_own_from_the_range_and_its_endpoint_names_it(
    tmp_path: Path,
) -> None:
    backend = AgentBackend()
    backend.register("a", {"rendezvous_ports": [40000, 40003]}, "10.0.0.1")
    # the head's choice of GPUPOOL_PORT (1) is one a node cannot honour: rank 0's range decides
    handle = backend.start(_launch(tmp_path, 1, ("a",), service_port=1))
    record = _record(tmp_path, 1)
    assert (record["master_port"], record["service_port"]) == (40000, 40001)
    assert record["launches"][0]["env"]["GPUPOOL_PORT"] == "40001"
    assert handle.endpoint == "10.0.0.1:40001"

    job = backend.start(_launch(tmp_path, 2, ("a",)))
    assert job.endpoint == "" and "GPUPOOL_PORT" not in _record(tmp_path, 2)["launches"][0]["env"]
    assert _record(tmp_path, 2)["master_port"] == 40002

    # a restarted head holds the service's port too
    after = AgentBackend()
    after.register("a", {"rendezvous_ports": [40000, 40003]}, "10.0.0.1")
    after.status(Handle(1, 0.0), tmp_path / "runs" / "1")
    after.status(Handle(2, 0.0), tmp_path / "runs" / "2")
    after.start(_launch(tmp_path, 3, ("a",)))
    assert _record(tmp_path, 3)["master_port"] == 40003
    with pytest.raises(LaunchError, match="wider --rendezvous-ports"):
        after.start(_launch(tmp_path, 4, ("a",)))


@pytest.mark.parametrize(
    ("info", "field"),
    [
        ({"rendezvous_ports": "29500-29999"}, "info.rendezvous_ports"),
        ({"rendezvous_ports": [30000, 20000]}, "info.rendezvous_ports"),
        ({"devices": [{"index": 0}]}, "info.devices[0]"),
        ({"devices": [{"index": 0, "uuid": "x"}, {"index": 0, "uuid": "y"}]}, "info.devices"),
    ],
)
def test_a_registration_the_head_cannot_use_names_the_field(info: dict[str, object], field: str) -> None:
    with pytest.raises(BadRegistration) as caught:
        AgentBackend().register("a", info, "10.0.0.1")
    assert caught.value.field == field
