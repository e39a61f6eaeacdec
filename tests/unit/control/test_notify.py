"""The notifier (control/notify.py) on a real SQLite store and a real HTTP receiver that keeps failing: it
tries TRIES times with backoff, then gives up, says so in the workload's history (not naming the URL's
secret path) and moves its cursor on; a receiver that fails or hangs holds back no other URL's message;
an event whose reading fails is read again."""

from __future__ import annotations

import threading
import time
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
    """A receiver that answers 500 on /bad, 204 elsewhere (after 3 s on /slow); the paths it was sent to."""
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/slow":
                time.sleep(3)
            paths.append(self.path)
            self.send_response(500 if self.path.startswith("/bad") else 204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", paths
    server.shutdown()
    server.server_close()


@pytest.fixture
def notifier(store: Store) -> Iterator[Notifier]:
    """A notifier allowed to reach 127.0.0.1, on a clock the test moves (`notifier.clock.now`)."""
    notifier = Notifier(store, allowed_hosts("127.0.0.1"), clock=Clock())
    notifier.prepare()
    yield notifier
    notifier.close()


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
    store: Store, receiver: tuple[str, list[str]], notifier: Notifier
) -> None:
    base, paths = receiver
    bad = _ended(store, base + "/bad?token=s3cret")  # a webhook's secret: in no history
    good = _ended(store, base + "/good", "succeeded")
    for _ in range(TRIES):
        notifier.step(wait=True)
        notifier.clock.now += 20  # past any backoff
    assert paths.count("/bad?token=s3cret") == TRIES and paths.count("/good") == 1
    assert (notifier.sent, notifier.given_up) == (1, 1)
    with store.read() as s:
        said = s.scalars(select(Event.reason).where(Event.object_id == str(bad))).all()
        assert any(r.startswith("notify: the message that it failed did not reach") for r in said), said
        assert "answered 500, 6 times" in said[-1] and "s3cret" not in said[-1] and "127.0.0.1" in said[-1]
        newest = s.scalar(select(Event.id).order_by(Event.id.desc()).limit(1))
        cursor = s.get(HeadState, CURSOR)
        assert cursor is not None and int(cursor.value) >= newest - 1  # past both (the note is not sent)
    notifier.step(wait=True)
    assert paths.count("/bad?token=s3cret") == TRIES and good > bad


def test_a_receiver_that_hangs_delays_no_other_url(
    store: Store, receiver: tuple[str, list[str]], notifier: Notifier
) -> None:
    base, paths = receiver
    _ended(store, base + "/slow")
    _ended(store, base + "/good", "succeeded")
    notifier.step()
    deadline = time.monotonic() + 2.5  # /slow answers after 3 s
    # until /good's answer is taken in (the receiver records it before the sender thread has the answer)
    while notifier.sent < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
        notifier.step()
    assert paths == ["/good"] and notifier.sent == 1
    notifier.step(wait=True)
    assert paths == ["/good", "/slow"] and notifier.sent == 2 and not notifier._waiting


def test_an_event_whose_reading_fails_is_read_again(
    store: Store, receiver: tuple[str, list[str]], notifier: Notifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store failing part way through a look loses no event: each is counted read once considered."""
    base, paths = receiver
    _ended(store, base + "/one")
    second = _ended(store, base + "/two")
    real_body = notify._body
    failed: list[int] = []

    def fail_once_on_the_second(event: Event, workload: Workload) -> dict[str, object]:
        if workload.id == second and not failed:
            failed.append(event.id)
            raise RuntimeError("database is locked")
        return real_body(event, workload)

    monkeypatch.setattr(notify, "_body", fail_once_on_the_second)
    with pytest.raises(RuntimeError):
        notifier.step(wait=True)
    notifier.step(wait=True)
    assert sorted(paths) == ["/one", "/two"] and failed


def test_with_no_host_allowed_nothing_runs_and_the_spec_host_is_checked() -> None:
    assert allowed_hosts("") == frozenset()
    assert allowed_hosts(" Hooks.Slack.com , * ") == {"hooks.slack.com", "*"}
    notify.check_allowed({"notify": {"url": "https://HOOKS.slack.com/x"}}, {"hooks.slack.com"})
    notify.check_allowed({"notify": None}, frozenset())
    with pytest.raises(notify.Invalid, match="this head sends no notifications"):
        notify.check_allowed({"notify": {"url": "https://a.example/x"}}, frozenset())


def test_an_event_that_commits_after_a_later_one_is_still_sent(
    store: Store, receiver: tuple[str, list[str]], notifier: Notifier
) -> None:
    """On PostgreSQL a transaction holding a lower event id may commit after a higher one was read."""
    base, paths = receiver
    clock = notifier.clock
    start = notifier._seen
    late = _ended(store, base + "/late")
    with store.session() as s:  # the late event's id is taken by a later one: as if it had not committed
        event = s.scalars(select(Event).where(Event.object_id == str(late))).one()
        event.id = start + 5
    notifier.step(wait=True)
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
    notifier.step(wait=True)
    assert paths == ["/late", "/later"]
    clock.now += notify.GAP_WAIT + 1  # the other missing ids never come: given up on
    notifier.step(wait=True)
    with store.read() as s:
        cursor = s.get(HeadState, CURSOR)
        assert cursor is not None and int(cursor.value) == start + 5
