"""A service that follows its load: requests through the head's proxy make the autoscaler add replicas up to
the spec's max, and once they stop it removes them down to the min; by requests per second and by requests
in flight. A real server, a real HTTP service in real processes, real requests."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from tests.support.process import kill_attempts_under
from tests.support.server import ServerProcess
from tests.support.services import answer_of, echo_service, proxy_path, wait_until

SCALING = {"window": "3s", "scale_up_delay": "0s", "scale_down_delay": "3s"}


def _kept(w: dict[str, object]) -> int:
    return int(w["replicas"])  # type: ignore[call-overload]


def _hammer(server: ServerProcess, sid: int, stop: threading.Event) -> None:
    """Requests one after another through the proxy until `stop` (tens a second)."""
    with server.http() as client:
        while not stop.is_set():
            response = client.get(proxy_path(sid, "load"))
            assert response.status_code in (200, 502, 503), response.text


def test_requests_per_second_add_replicas_up_to_max_and_quiet_removes_them_to_min(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "0"]).start()
    stop = threading.Event()
    try:
        sid = echo_service(
            server, tmp_path, replicas="1..3", scaling={"metric": "rps", "target": 5, **SCALING}
        )
        shown = wait_until(
            server, sid, lambda w: w["state"] == "running" and w.get("autoscaling") is not None
        )
        assert _kept(shown) == 1 and shown["spec"]["scaling"]["max"] == 3
        assert shown["autoscaling"]["wanted"] == 1 and shown["autoscaling"]["metric"] == "rps"
        with server.http() as client:
            answer_of(client, proxy_path(sid, "up"), "0")

        # by hand: refused, the autoscaler owns the count
        refused = server.cli("scale", str(sid), "2")
        assert refused.returncode != 0
        assert "scales itself between 1 and 3 replicas by rps" in refused.stderr + refused.stdout
        assert _kept(server.workload(sid)) == 1

        loaders = [threading.Thread(target=_hammer, args=(server, sid, stop)) for _ in range(2)]
        for loader in loaders:
            loader.start()
        grown = wait_until(
            server,
            sid,
            lambda w: [r["state"] for r in w["replica_list"]].count("running") == 3,
            timeout=60,
        )
        assert _kept(grown) == 3 and grown["autoscaling"]["load"] > 10  # two clients: far above 2 x 5/s
        added = [e for e in server.workload(grown["replica_list"][2]["id"])["events"] if e["to"] == "pending"]
        assert "by the autoscaler" in added[0]["reason"] and "requests/s over 3 s" in added[0]["reason"]
        assert added[0]["actor"] == "autoscaler"
        with server.http() as client:
            scraped = client.get("/metrics").text
        echo = f'name="echo",queue="default",workload="{sid}"'
        assert f'gpupool_service_replicas{{kind="wanted",{echo}}} 3.0' in scraped
        assert f'gpupool_service_replicas{{kind="max",{echo}}} 3.0' in scraped
        assert f'gpupool_service_load{{metric="rps",{echo}}}' in scraped
        shown_text = server.cli("show", str(sid), check=True).stdout
        assert "autoscaling: 1..3 replicas, 5 requests/s each" in shown_text and "wants 3" in shown_text

        stop.set()
        for loader in loaders:
            loader.join(timeout=30)
        # quiet: down to the min once the window has emptied and the down delay has passed; replica 0 stays
        shrunk = wait_until(server, sid, lambda w: _kept(w) == 1, timeout=60)
        assert shrunk["autoscaling"]["load"] < 5
        left = [r for r in shrunk["replica_list"] if r["state"] in ("pending", "running")]
        assert left[0]["replica"] == 0 and left[0]["id"] == sid
        # the service's own history (replica 0's) says each change the autoscaler made
        said = [e["reason"] for e in server.workload(sid)["events"] if e["actor"] == "autoscaler"]
        assert any(r.startswith("scaled to 3 replicas by the autoscaler") for r in said), said
        assert any(r.startswith("scaled to 1 replica by the autoscaler") for r in said), said
        # the load fades over the window, so it may go 3 -> 2 -> 1 or 3 -> 1; replica 1 goes last either way
        for number, said in (
            (2, "stopping: scaled to "),
            (1, "stopping: scaled to 1 replica by the autoscaler"),
        ):
            ended = wait_until(
                server, grown["replica_list"][number]["id"], lambda w: w["state"] == "cancelled"
            )
            events = ended["events"]
            assert any(said in e["reason"] and e["actor"] == "autoscaler" for e in events), events
        with server.http() as client:
            assert client.get(proxy_path(sid, "after")).json()["replica"] == "0"
    finally:
        stop.set()
        server.stop()
        kill_attempts_under(tmp_path)


def test_requests_in_flight_add_replicas_and_their_end_removes_them(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "0"]).start()
    streams: list[threading.Thread] = []
    try:
        sid = echo_service(
            server, tmp_path, replicas="1..2", scaling={"metric": "concurrency", "target": 1, **SCALING}
        )
        wait_until(server, sid, lambda w: w["state"] == "running")
        with server.http() as client:
            answer_of(client, proxy_path(sid, "up"), "0")

        def stream() -> None:  # held open by the service until the file "gate" exists
            with server.http() as client, client.stream("GET", proxy_path(sid, "events"), timeout=60) as r:
                assert r.status_code == 200
                for _ in r.iter_bytes():
                    pass

        streams = [threading.Thread(target=stream) for _ in range(3)]
        for s in streams:
            s.start()
        grown = wait_until(server, sid, lambda w: _kept(w) == 2, timeout=30)
        assert grown["autoscaling"]["metric"] == "concurrency" and grown["autoscaling"]["load"] > 1
        (tmp_path / "gate").write_text("")
        for s in streams:
            s.join(timeout=30)
        assert not any(s.is_alive() for s in streams)
        shrunk = wait_until(server, sid, lambda w: _kept(w) == 1, timeout=60)
        assert shrunk["autoscaling"]["load"] < 1
    finally:
        (tmp_path / "gate").write_text("")
        server.stop()
        kill_attempts_under(tmp_path)


def test_an_autoscaled_service_is_shown_before_it_is_measured_and_its_bad_specs_are_refused(
    tmp_path: Path,
) -> None:
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        with server.http() as client:
            bad = client.post(
                "/api/v1/workloads",
                json={"kind": "service", "commands": ["x"], "replicas": "1..4"},
            )
            assert bad.status_code == 422 and bad.json()["error"]["field"] == "scaling", bad.text
            bad = client.post(
                "/api/v1/workloads",
                json={"kind": "job", "commands": ["x"], "scaling": {"min": 1, "max": 2, "target": 1}},
            )
            assert bad.status_code == 422 and bad.json()["error"]["field"] == "scaling", bad.text
        cli = server.cli("run", "--service", "--replicas", "1..4", "--scale", "rps", "--", "true")
        assert cli.returncode != 0 and "--scale rps: give METRIC:TARGET" in cli.stderr + cli.stdout
        cli = server.cli("run", "--service", "--replicas", "1..4", "--scale", "qps:3", "--", "true")
        assert cli.returncode != 0 and "scaling.metric" in cli.stderr + cli.stdout
        made = server.cli(
            "run", "--service", "--gpus", "0", "--replicas", "2..4", "--scale", "concurrency:8", "--json",
            "--", "sleep", "600",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        w = server.workload(int(json.loads(made.stdout)["id"]))
        assert w["spec"]["replicas"] == 2 and w["spec"]["scaling"]["metric"] == "concurrency"
        assert w["spec"]["scaling"]["target"] == 8 and w["replicas"] == 2
        text = server.cli("show", str(w["id"]), check=True).stdout
        assert "autoscaling: 2..4 replicas, 8 requests in flight each" in text

        # a new range: the count is brought into it at once, and the history says why
        moved = server.cli("scale", str(w["id"]), "3..5", check=True).stdout
        assert "3 replicas, scaling itself within 3..5" in moved
        w = server.workload(w["id"])
        assert (w["spec"]["scaling"]["min"], w["spec"]["scaling"]["max"], w["replicas"]) == (3, 5, 3)
        assert any(e["reason"] == "scaling range set to 3..5 by admin" for e in w["events"])
        added = server.workload(w["replica_list"][-1]["id"])["events"][0]
        assert added["reason"].startswith("scaled to 3 replicas: scaling range set to 3..5 by admin")
        with server.http() as client:
            for body, words in (
                ({"replicas": "0..5"}, "1 <= MIN <= MAX <= 64"),
                ({"replicas": "5..3"}, "1 <= MIN <= MAX <= 64"),
                ({"replicas": 4}, "gpupool scale"),  # a number: the autoscaler owns the count
                ({"replicas": "lots"}, "not a whole number or a range MIN..MAX"),
            ):
                answer = client.post(f"/api/v1/workloads/{w['id']}/scale", json=body)
                assert answer.status_code in (409, 422), answer.text
                assert answer.json()["error"]["field"] == "replicas" and words in answer.text, answer.text
            fixed = server.submit({"kind": "service", "commands": ["sleep 600"], "resources": {"gpu": 0}})
            answer = client.post(f"/api/v1/workloads/{fixed['id']}/scale", json={"replicas": "1..3"})
            assert answer.status_code == 409 and "runs a fixed number of replicas" in answer.text, answer.text
        assert server.workload(w["id"])["spec"]["scaling"]["max"] == 5  # refusals changed nothing
    finally:
        server.stop()
        kill_attempts_under(tmp_path)


def test_requests_refused_because_no_replica_takes_them_add_no_replicas(tmp_path: Path) -> None:
    """A crash-looping service refuses every request (503): that is no load, and it gains no replicas."""
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "2"]).start()
    stop = threading.Event()
    try:
        created = server.submit(
            {"kind": "service", "name": "crashes", "commands": ["exit 1"], "replicas": "1..4",
             "scaling": {"metric": "rps", "target": 1, **SCALING}}
        )  # fmt: skip
        sid = int(created["id"])
        loaders = [threading.Thread(target=_hammer, args=(server, sid, stop)) for _ in range(2)]
        for loader in loaders:
            loader.start()
        wait_until(server, sid, lambda w: w["attempts"] >= 3, timeout=60)
        shown = server.workload(sid)
        assert _kept(shown) == 1 and shown["autoscaling"]["load"] < 1, shown["autoscaling"]
    finally:
        stop.set()
        server.stop()
