"""The notifier (control/notify.py) on a real SQLite store and a real HTTP receiver that keeps failing: it
tries TRIES times with backoff, then gives up, says so in the workload's history and moves its cursor
on; a receiver that fails holds back no other message."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select

from gpupool.control import notify
from gpupool.control.notify import CURSOR, TRIES, Notifier, allowed_hosts
from gpupool.store.db import Store
from gpupool.store.models import Event, HeadState, Workload


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[str]]]:
    """A receiver that answers 500 on /bad and 204 elsewhere; the paths it was sent to."""
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            paths.append(self.path)
            self.send_response(500 if self.path == "/bad" else 204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", paths
    server.shutdown()
    server.server_close()


def _ended(store: Store, url: str, state: str = "failed") -> int:
    with store.session() as s:
        workload = Workload(
            name="w", queue="default", user="alice", state=state, version=1, exit_code=1,
            spec={"notify": {"url": url, "on": ["failed", "succeeded"]}},
        )  # fmt: skip
        s.add(workload)
        s.flush()
        s.add(Event(object_kind="workload", object_id=str(workload.id), from_state="running", to_state=state))
        return workload.id


def test_a_failing_receiver_is_tried_then_given_up_and_holds_back_no_other(
    store: Store, receiver: tuple[str, list[str]]
) -> None:
    base, paths = receiver
    clock = Clock()
    notifier = Notifier(store, allowed_hosts("127.0.0.1"), clock=clock)
    notifier._client = notify.httpx.Client(timeout=5)
    notifier.prepare()
    bad = _ended(store, base + "/bad")
    good = _ended(store, base + "/good", "succeeded")
    for _ in range(TRIES):
        notifier.step()
        clock.now += 20  # past any backoff
    assert paths.count("/bad") == TRIES and paths.count("/good") == 1
    assert (notifier.sent, notifier.given_up) == (1, 1)
    with store.read() as s:
        said = s.scalars(select(Event.reason).where(Event.object_id == str(bad))).all()
        assert any(r.startswith("notify: the message that it failed did not reach") for r in said), said
        assert "answered 500, 6 times" in said[-1]
        newest = s.scalar(select(Event.id).order_by(Event.id.desc()).limit(1))
        cursor = s.get(HeadState, CURSOR)
        assert cursor is not None and int(cursor.value) >= newest - 1  # past both (the note is not sent)
    notifier.step()
    assert paths.count("/bad") == TRIES and good > bad
    notifier._client.close()


def test_with_no_host_allowed_nothing_runs_and_the_spec_host_is_checked() -> None:
    assert allowed_hosts("") == frozenset()
    assert allowed_hosts(" Hooks.Slack.com , * ") == {"hooks.slack.com", "*"}
    notify.check_allowed({"notify": {"url": "https://HOOKS.slack.com/x"}}, {"hooks.slack.com"})
    notify.check_allowed({"notify": None}, frozenset())
    with pytest.raises(notify.Invalid, match="this head sends no notifications"):
        notify.check_allowed({"notify": {"url": "https://a.example/x"}}, frozenset())


def test_an_event_that_commits_after_a_later_one_is_still_sent(
    store: Store, receiver: tuple[str, list[str]]
) -> None:
    """On PostgreSQL a transaction holding a lower event id may commit after a higher one was read."""
    base, paths = receiver
    clock = Clock()
    notifier = Notifier(store, allowed_hosts("127.0.0.1"), clock=clock)
    notifier._client = notify.httpx.Client(timeout=5)
    notifier.prepare()
    start = notifier._seen
    late = _ended(store, base + "/late")
    with store.session() as s:  # the late event's id is taken by a later one: as if it had not committed
        event = s.scalars(select(Event).where(Event.object_id == str(late))).one()
        event.id = start + 5
    notifier.step()
    assert paths == ["/late"]
    with store.session() as s:  # now "the transaction" of id start + 2 commits
        workload = s.get(Workload, late)
        assert workload is not None
        s.add(Event(id=start + 2, object_kind="workload", object_id=str(late), from_state="running",
                    to_state="succeeded"))  # fmt: skip
        workload.spec = {"notify": {"url": base + "/later", "on": ["succeeded"]}}
    with store.read() as s:
        cursor = s.get(HeadState, CURSOR)
        assert cursor is not None and int(cursor.value) == start  # held below the missing ids
    clock.now += 1
    notifier.step()
    assert paths == ["/late", "/later"]
    clock.now += notify.GAP_WAIT + 1  # the other missing ids never come: given up on
    notifier.step()
    with store.read() as s:
        cursor = s.get(HeadState, CURSOR)
        assert cursor is not None and int(cursor.value) == start + 5
    notifier._client.close()
