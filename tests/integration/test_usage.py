"""GPU-hours and cost (`gpupool usage`, GET /api/v1/usage) on a real server running real processes: the
report adds up to what the attempts held, prices them by the model each ran on, and refuses bad input."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import ServerProcess


def _held_hours(w: dict[str, Any]) -> float:
    """GPU-hours by the workload's own attempts, as the API reports them."""
    hours = 0.0
    for attempt in w["attempt_list"]:
        start = datetime.fromisoformat(attempt["started_at"])
        end = datetime.fromisoformat(attempt["finished_at"])
        gpus = sum(len(p["gpu_indices"]) * p["gpu_fraction"] for p in attempt["pods"])
        hours += gpus * (end - start).total_seconds() / 3600
    return hours


def _report(server: ServerProcess, *args: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(server.cli("usage", *args, "--json", check=True).stdout)
    return report


def test_usage_adds_up_what_the_attempts_held_and_prices_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "prices.yaml").write_text("currency: EUR\ngpu_hour: {H100: 3.0}\n")
    server = ServerProcess(home=home, gpus="sim:8xH100").start()
    try:
        server.cli("queue", "create", "nlp", "--gpu-quota", "4", check=True)
        trained = server.submit(
            {"name": "train", "queue": "nlp", "resources": {"gpu": 2}, "commands": ["sleep 2"]}
        )
        broken = server.submit(
            {"name": "broken", "resources": {"gpu": 0.5}, "commands": ["sleep 1; exit 3"],
             "retry": {"max_restarts": 0}}
        )  # fmt: skip
        done = server.wait_for(trained["id"], states=("succeeded",))
        failed = server.wait_for(broken["id"], states=("failed",))
        assert done["attempt_list"][0]["pods"][0]["model"] == "H100"  # recorded when it started
        nlp, default = _held_hours(done), _held_hours(failed)
        assert nlp > 2 * 2 / 3600 * 0.9 and default > 0.5 * 1 / 3600 * 0.9

        report = _report(server)
        rows = {row["key"]: row for row in report["rows"]}
        assert rows["nlp"]["gpu_hours"] == pytest.approx(nlp, abs=1e-6)
        assert rows["default"]["gpu_hours"] == pytest.approx(default, abs=1e-6)
        assert rows["nlp"]["cost"] == pytest.approx(3.0 * nlp, abs=1e-5) and report["currency"] == "EUR"
        assert rows["nlp"]["quota_gpu_hours"] == pytest.approx(4 * 7 * 24, rel=1e-3)
        assert report["total"]["by_outcome"] == {
            "succeeded": pytest.approx(nlp, abs=1e-6), "failed": pytest.approx(default, abs=1e-6)
        }  # fmt: skip
        assert report["capacity_gpus"] == 8

        table = server.cli("usage", check=True).stdout
        assert "EUR" in table and "OF QUOTA" in table, table
        lines = {line.split()[0]: line.split() for line in table.splitlines() if line.strip()}
        assert "nlp" in lines and "TOTAL" in lines, table
        by_model = server.cli("usage", "--by", "model", "--csv", check=True).stdout
        (row,) = csv.DictReader(io.StringIO(by_model))
        assert row["model"] == "H100" and float(row["gpu_hours"]) == pytest.approx(nlp + default, abs=1e-6)
        assert float(row["failed_gpu_hours"]) == pytest.approx(default, abs=1e-6) and row["currency"] == "EUR"

        workloads = _report(server, "--by", "workload", "--queue", "nlp")
        assert [(r["key"], r["name"]) for r in workloads["rows"]] == [(str(trained["id"]), "train")]
        swept = server.submit(
            {"name": "sweep", "array": "0-1", "resources": {"gpu": 1}, "commands": ["sleep 1"]}
        )
        for task in swept["array_ids"]:
            server.wait_for(task, states=("succeeded",))
        named = {r["key"]: r["name"] for r in _report(server, "--by", "workload")["rows"]}
        assert [named[str(task)] for task in swept["array_ids"]] == [
            "sweep[0]",
            "sweep[1]",
        ]  # as ps names them
        # a window that ended before anything ran counts nothing
        assert _report(server, "--since", "2d", "--until", "1d")["total"]["gpu_hours"] == 0.0
    finally:
        server.stop()


def test_bad_usage_requests_name_the_field_and_the_fix(server: ServerProcess) -> None:
    with server.http() as client:
        for params, field in (
            ({"by": "team"}, "by"),
            ({"since": "last week"}, "since"),
            ({"since": "2d", "until": "2099-01-01T00:00:00"}, None),  # until is cut to now: fine
            ({"since": "2099-01-01"}, "since"),
            ({"until": "yesterday"}, "until"),
            ({"queue": "nope"}, "queue"),
        ):
            response = client.get("/api/v1/usage", params=params)
            if field is None:
                assert response.status_code == 200, response.text
                continue
            assert response.status_code == 422, (params, response.text)
            error = response.json()["error"]
            assert error["field"] == field and field in error["message"], error
    refused = server.cli("usage", "--by", "team")
    assert refused.returncode != 0 and "--by team: not one of queue" in refused.stderr


def test_a_report_of_one_user_counts_only_their_work_and_an_unknown_parameter_is_refused(
    server: ServerProcess,
) -> None:
    made = json.loads(server.cli("token", "create", "alice", "--json", check=True).stdout)
    with server.http(str(made["token"])) as client:
        response = client.post("/api/v1/workloads", json={"resources": {"gpu": 1}, "commands": ["sleep 1"]})
        assert response.status_code == 201, response.text
        hers = response.json()
    mine = server.submit({"resources": {"gpu": 1}, "commands": ["sleep 1"]})  # the admin's
    for w in (hers, mine):
        server.wait_for(w["id"], states=("succeeded",))
    with server.http() as client:
        answer = client.get("/api/v1/usage", params={"since": "1d", "by": "workload", "user": "alice"})
        assert answer.status_code == 200, answer.text
        report = answer.json()
        assert [r["key"] for r in report["rows"]] == [str(hers["id"])] and report["users"] == ["alice"]
        both = client.get("/api/v1/usage", params={"by": "user", "user": "alice,admin"}).json()
        assert sorted(r["key"] for r in both["rows"]) == ["admin", "alice"]
        for params, field in (
            ({"by": "workload", "users": "alice"}, "users"),  # a misspelling is not everyone's report
            ({"since": "1d", "bogus": "1"}, "bogus"),
            ({"user": "alcie"}, "user"),
            ({"user": "alice,"}, "user"),
        ):
            response = client.get("/api/v1/usage", params=params)
            assert response.status_code == 422, (params, response.text)
            error = response.json()["error"]
            assert error["field"] == field and error["message"].startswith(f"{field}: "), error

    only_hers = _report(server, "--by", "workload", "--user", "alice")
    assert [r["key"] for r in only_hers["rows"]] == [str(hers["id"])]
    mine_only = _report(server, "--by", "workload", "--me")
    assert [r["key"] for r in mine_only["rows"]] == [str(mine["id"])]
    repeated = _report(server, "--by", "user", "-u", "alice", "-u", "admin")
    assert repeated["users"] == ["admin", "alice"]
    table = server.cli("usage", "--by", "outcome", "--user", "alice", check=True).stdout
    assert "so the lines can add up to more than TOTAL" in " ".join(table.split()), table
    assert "Only the work of alice" in " ".join(table.split()), table
    refused = server.cli("usage", "--user", "alice,,admin")
    assert refused.returncode != 0 and "--user 'alice,,admin': an empty name" in refused.stderr
