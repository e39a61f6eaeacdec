"""A service by its name through the head's proxy: which service a name stands for (`choose`), and how the
proxy remembers it (`by_name`): read once a TARGET_TTL, read again when its service has ended, misses
read each time with a token and once a MISSING_TTL without one (each such read counted by address), the
memory bounded. The store is stood in for by the two reads the proxy makes of it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from starlette.requests import Request
from starlette.responses import Response

from gpupool.api import auth
from gpupool.api.errors import ApiError
from gpupool.api.ratelimit import RateLimiter
from gpupool.api.routes import proxy
from gpupool.control import service_names
from gpupool.control.access import Access
from gpupool.control.errors import Conflict, NotFound
from gpupool.control.service_names import Named, choose
from gpupool.control.tokens import Caller
from tests.support.process import Clock

T = TypeVar("T")
ALICE = Named(7, Access("alice", "private"))
BOB = Named(9, Access("bob", "pool"))
OPEN = Named(11, Access("carol", "public"))
TOKENS = {"alice-token": Caller("alice", "user"), "dave-token": Caller("dave", "user")}


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


# -- which service a name stands for -------------------------------------------------------------------


def test_a_name_stands_for_its_one_service_whoever_asks() -> None:
    assert choose([ALICE], "llm", None) is ALICE
    assert choose([ALICE], "llm", "bob") is ALICE  # whether bob may reach it is `access`'s to say
    assert choose([], "llm", "alice") is None


def test_of_several_services_of_a_name_the_callers_own_wins_when_it_is_the_only_one_theirs() -> None:
    assert choose([ALICE, BOB], "llm", "alice") is ALICE
    assert choose([ALICE, BOB], "llm", "bob") is BOB


def test_several_services_of_a_name_and_none_the_callers_are_refused_with_their_ids_and_owners() -> None:
    for caller in ("dave", None):  # None: no token, so nothing is the caller's own
        with pytest.raises(Conflict) as refused:
            choose([ALICE, BOB], "llm", caller)
        said = refused.value.message
        assert "2 pending or running services are named 'llm' (ids and owners: 7 (alice), 9 (bob))" in said
        assert "/api/v1/workloads/ID/proxy/" in said and "another name" in said
        assert refused.value.field == "name"
    with pytest.raises(Conflict) as mine:  # two of the caller's own: those are listed
        choose([ALICE, Named(8, Access("alice", "pool")), BOB], "llm", "alice")
    assert "2 of your pending or running services are named 'llm' (ids and owners: 7 (alice), 8 (alice))" in (
        mine.value.message
    )
    many = [Named(i, Access(f"u{i}", "pool")) for i in range(12)]
    with pytest.raises(Conflict) as listed:
        choose(many, "llm", None)
    assert "12 pending" in listed.value.message and "9 (u9), ..." in listed.value.message


def test_only_a_name_a_workload_may_have_is_looked_for() -> None:
    assert service_names.could_be_a_name("llm-2")
    for name in ("LLM", "a_b", "-x", "x" * 64, ""):
        assert not service_names.could_be_a_name(name)
    assert service_names.services_named(None, "Not_A_Name") == ()  # type: ignore[arg-type]  # no read


# -- how the proxy remembers names ------------------------------------------------------------------------


class Store:
    """The pending or running services of each name, and the reads the proxy made of them: of the
    services of a name (`reads`), and of its past work, for whether one ended lately (`scans`)."""

    def __init__(self) -> None:
        self.services: dict[str, tuple[Named, ...]] = {}
        self.reads: list[str] = []
        self.scans: list[str] = []


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Store:
    stand_in = Store()

    def services_named(_store: Any, name: str) -> tuple[Named, ...]:
        stand_in.reads.append(name)
        return stand_in.services.get(name, ())

    def missing(store: Any, name: str) -> str:
        if store is not None:
            stand_in.scans.append(name)
        return f"none is named {name!r}" + (" (one ended)" if store is not None else "")

    monkeypatch.setattr(service_names, "services_named", services_named)
    monkeypatch.setattr(service_names, "missing", missing)
    monkeypatch.setattr(auth, "caller_of", lambda _store, token: TOKENS.get(token))
    return stand_in


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(proxy, "time", SimpleNamespace(monotonic=clock))
    return clock


def app(clock: Clock, burst: int = 100) -> SimpleNamespace:
    metrics = SimpleNamespace(
        rate_limited=SimpleNamespace(labels=lambda *_: SimpleNamespace(inc=lambda: None))
    )
    return SimpleNamespace(
        state=SimpleNamespace(
            proxy=proxy.ProxyState(),
            runtime=SimpleNamespace(store="the store", metrics=metrics),
            limiter=RateLimiter(0.001, burst, clock=clock),
            tokens=auth.TokenCache(clock=clock),
            failed_auth=RateLimiter(1.0, 20, clock=clock),
        )
    )


def request(on: SimpleNamespace, name: str, token: str | None = None, path: str = "x") -> Request:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    url = f"/api/v1/services/{name}/proxy/{path}"
    return Request(
        {
            "type": "http", "app": on, "method": "GET", "path": url, "raw_path": url.encode(),
            "query_string": b"", "headers": headers, "client": ("10.0.0.1", 5000),
        }
    )  # fmt: skip


def by_name(on: SimpleNamespace, name: str, token: str | None = None) -> tuple[int, bool]:
    return run(proxy.by_name(request(on, name, token), name))


def refused(on: SimpleNamespace, name: str, token: str | None = None) -> int:
    """The status the proxy refuses the name with."""
    with pytest.raises((ApiError, NotFound, Conflict)) as error:
        by_name(on, name, token)
    return int(error.value.status)


def told(on: SimpleNamespace, name: str, token: str) -> str:
    """What the proxy's 404 for the name says."""
    with pytest.raises(NotFound) as refused:
        by_name(on, name, token)
    return refused.value.message


def test_a_name_is_read_once_a_target_ttl_and_its_access_kept_for_admission(
    store: Store, clock: Clock
) -> None:
    store.services["llm"] = (ALICE,)
    on = app(clock)
    assert [by_name(on, "llm", "alice-token") for _ in range(3)] == [(7, False), (7, True), (7, True)]
    assert store.reads == ["llm"]
    assert on.state.proxy.access[7] == ALICE.access  # `admit` reads no store for it
    clock.now += proxy.TARGET_TTL
    assert by_name(on, "llm", "alice-token") == (7, False)
    assert store.reads == ["llm", "llm"]


def test_a_name_without_its_service_is_forgotten_and_read_each_time_with_a_token(
    store: Store, clock: Clock
) -> None:
    store.services["llm"] = (ALICE,)
    on = app(clock)
    by_name(on, "llm", "alice-token")
    del store.services["llm"]  # ended
    clock.now += proxy.TARGET_TTL
    assert [refused(on, "llm", "alice-token") for _ in range(3)] == [404] * 3
    assert store.reads == ["llm"] * 4 and "llm" not in on.state.proxy.names
    store.services["llm"] = (BOB,)  # submitted again: reached at once
    assert by_name(on, "llm", "alice-token") == (9, False)


def test_what_ended_under_a_missing_name_is_looked_up_once_a_missing_ttl_and_within_the_tokens_limit(
    store: Store, clock: Clock
) -> None:
    on = app(clock, burst=2)
    assert [told(on, "llm", "alice-token") for _ in range(3)] == ["none is named 'llm' (one ended)"] * 3
    assert store.reads == ["llm"] * 3 and store.scans == ["llm"]  # a service submitted again is seen
    clock.now += proxy.MISSING_TTL
    assert told(on, "a", "alice-token") == "none is named 'a' (one ended)"
    assert told(on, "b", "alice-token") == "none is named 'b'"  # alice's bucket (2) is spent: not looked up
    assert store.scans == ["llm", "a"]


def test_without_a_token_a_missing_name_is_read_once_a_missing_ttl_and_answered_401(
    store: Store, clock: Clock
) -> None:
    on = app(clock)
    assert [refused(on, "llm") for _ in range(3)] == [401] * 3  # nobody learns which names exist
    assert store.reads == ["llm"]
    clock.now += proxy.MISSING_TTL
    assert refused(on, "llm") == 401
    assert store.reads == ["llm", "llm"]
    assert refused(on, "Not_A_Name") == 401 and store.reads == ["llm", "llm"]  # no read for it


def test_without_a_token_each_read_is_counted_under_the_callers_address(store: Store, clock: Clock) -> None:
    store.services["open"] = (OPEN,)
    on = app(clock, burst=3)
    assert [by_name(on, "open") for _ in range(5)][-1] == (11, True)  # one read, one count
    assert [refused(on, f"nope-{i}") for i in range(3)] == [401, 401, 429]
    assert store.reads == ["open", "nope-0", "nope-1"]


def test_without_a_token_a_name_stands_only_for_public_services(store: Store, clock: Clock) -> None:
    on = app(clock)
    store.services["llm"] = (ALICE, BOB)
    assert refused(on, "llm") == 401  # as a private service's id would be
    store.services["both"] = (OPEN, Named(12, Access("erin", "public")))
    assert refused(on, "both") == 409  # public ones may be listed
    store.services["one"] = (ALICE,)
    assert by_name(on, "one") == (7, False)  # admitted or not by `admit`, as by id


def test_with_a_token_the_callers_own_wins_and_a_bad_token_is_refused(store: Store, clock: Clock) -> None:
    store.services["llm"] = (ALICE, BOB)
    on = app(clock)
    assert by_name(on, "llm", "alice-token") == (7, False)
    assert refused(on, "llm", "dave-token") == 409
    assert refused(on, "llm", "forged") == 401


def test_the_names_remembered_stay_bounded(
    store: Store, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proxy, "MAX_TARGETS", 3)
    on = app(clock)
    for i in range(10):
        store.services[f"s{i}"] = (Named(100 + i, Access("alice", "pool")),)
        by_name(on, f"s{i}", "alice-token")
        refused(on, f"missing-{i}")
    assert len(on.state.proxy.names) <= 3 and len(on.state.proxy.unnamed) <= 3
    assert len(on.state.proxy.access) <= 3


def test_a_remembered_name_whose_service_ended_is_read_again_and_the_request_sent_on(
    store: Store, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.services["llm"] = (ALICE,)
    on = app(clock)
    by_name(on, "llm", "alice-token")  # remembered
    store.services["llm"] = (Named(8, Access("alice", "private")),)  # cancelled, submitted again
    reached: list[int] = []

    async def reached_or_ended(_request: Request, workload_id: int, address: Any) -> Response:
        reached.append(workload_id)
        if workload_id == 7:
            raise Conflict("service llm (workload 7) has ended (cancelled) and runs no more")
        assert address.prefix == "/api/v1/services/llm/proxy"
        return Response(b"ok")

    monkeypatch.setattr(proxy, "_reached", reached_or_ended)
    answer = run(proxy.proxy_by_name(request(on, "llm", "alice-token"), "llm", "x"))
    assert answer.body == b"ok" and reached == [7, 8]
    # read afresh and it ended all the same: the refusal as it is, not tried again
    store.services["llm"] = (Named(8, Access("alice", "private")),)
    clock.now += proxy.TARGET_TTL
    monkeypatch.setattr(proxy, "_reached", _always(Conflict("ended")))
    with pytest.raises(Conflict):
        run(proxy.proxy_by_name(request(on, "llm", "alice-token"), "llm", "x"))


def _always(error: Exception) -> Callable[..., Coroutine[Any, Any, Response]]:
    async def raising(*_: Any) -> Response:
        raise error

    return raising


def test_the_path_below_proxy_is_passed_on_even_for_a_service_named_proxy() -> None:
    on = SimpleNamespace(state=SimpleNamespace())
    address = proxy.Address(proxy.BY_NAME, "proxy")
    assert proxy.rest_of_path(request(on, "proxy", path="proxy/a%20b"), address) == "/proxy/a%20b"
    assert address.prefix == "/api/v1/services/proxy/proxy"
    assert proxy.is_proxied("/api/v1/services/llm/proxy/v1")
    assert proxy.is_proxied("/api/v1/services/llm/proxy")
    assert proxy.is_proxied("/api/v1/workloads/7/proxy/") and not proxy.is_proxied("/api/v1/services/llm")
