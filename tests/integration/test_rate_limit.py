"""The API's rate limit on a real server: a token over its limit gets 429 with Retry-After and a message
that says what to do, the refused call changed nothing, other tokens go on, the CLI waits and succeeds,
and Prometheus' counter says who was limited."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpupool.api.ratelimit import FAILED_AUTH_BURST
from tests.support.server import ServerProcess


def test_a_token_over_its_limit_waits_and_others_go_on(tmp_path: Path) -> None:
    server = ServerProcess(
        home=tmp_path / "home", extra_args=["--rate-limit", "1", "--rate-burst", "3"]
    ).start()
    try:
        made = json.loads(server.cli("token", "create", "alice", "--json", check=True).stdout)
        alice = str(made["token"])
        with server.http(alice) as client:
            time.sleep(3.5)  # a full bucket: the server may have been asked already
            codes = [client.get("/api/v1/workloads").status_code for _ in range(3)]
            assert codes == [200, 200, 200]
            refused = client.post("/api/v1/workloads", json={"name": "late", "commands": ["true"]})
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "rate_limited"
            assert "the token 'alice' made more than 3 requests at once" in error["message"]
            assert "--rate-limit" in error["message"]  # the fix, for whoever reads it

        with server.http() as admin:  # another token has its own bucket
            assert admin.get("/api/v1/workloads?all=true").json() == []  # the refused submit made nothing
            metrics = admin.get("/metrics").text
            assert 'gpupool_api_rate_limited_total{token="alice"} 1.0' in metrics, metrics

        # without a token, asking the proxy about ids the head has not seen costs a store read each: counted
        # under the caller's address (its own: what it says in X-Forwarded-For is not believed); an id just
        # found missing is not read again (401 from memory)
        with server.http(None) as anonymous:
            codes = [
                anonymous.get(
                    f"/api/v1/workloads/{900 + i}/proxy/", headers={"X-Forwarded-For": f"10.0.0.{i}"}
                ).status_code
                for i in range(4)
            ]
            assert codes == [401, 401, 401, 429], codes
            refused = anonymous.get("/api/v1/workloads/905/proxy/", headers={"Forwarded": "for=10.0.0.9"})
            assert refused.status_code == 429 and "without a token from 127.0.0.1" in refused.text
            assert refused.headers["retry-after"] == "1"
            assert [anonymous.get("/api/v1/workloads/900/proxy/").status_code for _ in range(5)] == [401] * 5
        with server.http(alice) as client:  # a token's proxy calls are not counted under the address
            assert client.get("/api/v1/workloads/906/proxy/").status_code == 404

        # the CLI, as alice, waits out the limit and gets its answers
        server.extra_env["GPUPOOL_TOKEN"] = alice
        try:
            began = time.monotonic()
            for _ in range(5):
                server.cli("ps", "--json", check=True)
            assert time.monotonic() - began >= 1.5  # five calls at 1/s after an empty bucket
        finally:
            del server.extra_env["GPUPOOL_TOKEN"]
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--rate-limit", "-1"], "--rate-limit -1: must be 0 (no limit) to 1000000"),
        (["--rate-burst", "0"], "--rate-burst 0: must be 1 to 1000000"),
        (["--forwarded-allow-ips", "proxy.example"], "'proxy.example' is not an IP address or network"),
    ],
)
def test_a_bad_rate_limit_is_refused_with_the_fix(tmp_path: Path, args: list[str], said: str) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=args)
    with pytest.raises(RuntimeError) as failed:
        server.start(timeout=20)
    assert said in str(failed.value)
    assert not (tmp_path / "home" / "credentials").exists()  # refused before anything was made


def test_a_client_sending_tokens_that_match_nothing_is_slowed_and_good_tokens_go_on(
    server: ServerProcess,
) -> None:
    with server.http() as admin:  # seen before the flood: a good token goes on from the same address
        assert admin.get("/api/v1/workloads").status_code == 200
    codes = []
    for i in range(FAILED_AUTH_BURST + 5):  # each new bad token costs the head a store read
        with server.http(f"gpp_guess-{i}") as client:
            codes.append(client.get("/api/v1/workloads").status_code)
    assert codes == [401] * FAILED_AUTH_BURST + [429] * 5, codes
    with server.http("gpp_guess-again") as client:
        refused = client.get("/api/v1/workloads")
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    said = refused.json()["error"]["message"]
    assert (
        f"more than {FAILED_AUTH_BURST} tokens that match no token of this server came from 127.0.0.1" in said
    )
    with server.http() as admin:
        assert admin.get("/api/v1/workloads").status_code == 200
        assert 'gpupool_api_rate_limited_total{token="(invalid tokens)"}' in admin.get("/metrics").text
    time.sleep(1.1)  # the bucket refills: a client that stopped guessing is heard again
    with server.http("gpp_guess-last") as client:
        assert client.get("/api/v1/workloads").status_code == 401


def test_a_trusted_reverse_proxy_names_the_client(tmp_path: Path) -> None:
    server = ServerProcess(
        home=tmp_path / "home",
        extra_args=["--rate-limit", "1", "--rate-burst", "3", "--forwarded-allow-ips", "127.0.0.1"],
    ).start()
    try:
        with server.http(None) as anonymous:
            forwarded = {"X-Forwarded-For": "10.9.8.7"}
            codes = [
                anonymous.get(f"/api/v1/workloads/{900 + i}/proxy/", headers=forwarded) for i in range(4)
            ]
            assert [c.status_code for c in codes] == [401, 401, 401, 429]
            assert "without a token from 10.9.8.7" in codes[-1].text
            # another client behind the same proxy has a bucket of its own
            other = anonymous.get("/api/v1/workloads/904/proxy/", headers={"X-Forwarded-For": "10.9.8.8"})
            assert other.status_code == 401
    finally:
        server.stop()
