"""Notifications: the head POSTs a JSON message to the URL a workload's spec names (`notify`) when the
workload starts or ends, as Slurm mails on `--mail-type=BEGIN,END,FAIL`: for a chat channel (Slack,
Mattermost and the like read the message's `text`) or a pipeline's own receiver.

The messages come from the workloads' history: every state change is an `Event` row, committed with the
change. A thread (`Notifier.run`) reads the events after its cursor once a second, sends those the spec
asks for, and keeps the cursor in the store (`head_state`, key CURSOR) at the oldest event not yet settled
(sent, or given up after TRIES tries, which the workload's history then says), so a head that is killed
sends again, after its restart, whatever it had not settled (changes older than MAX_AGE are not announced
any more): delivery is at least once, and each message carries its event's id for a receiver that must see
each once. Messages go out on SENDERS threads, one URL's in event order on one of them, so a receiver
that does not answer (TIMEOUT a try) holds back no other URL's messages, and each failed message waits its
own backoff. Event ids come from the store as transactions write;
an id missing below the newest read (a transaction that commits later, on PostgreSQL) is looked for again
for GAP_WAIT seconds, and the cursor stays below it meanwhile.

The head sends only to hosts its operator allows (`gpupool server --notify-hosts`), checked at submit
(`check_allowed`) and again before each message, so that the head is no way into hosts it should not reach.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool import __version__
from gpupool.control.errors import Invalid
from gpupool.control.lifecycle import note
from gpupool.store import head_state
from gpupool.store.db import Store
from gpupool.store.models import Event, Workload
from gpupool.timeutil import as_utc, utcnow

log = logging.getLogger(__name__)

CURSOR: Final = "notify.cursor"  # head_state key: every event up to this id is settled
PERIOD: Final = 1.0  # seconds between looks at new events
BATCH: Final = 500  # events read in one look
TRIES: Final = 6  # sends of one message before it is given up (after 1+2+4+8+16 s of backoff)
TIMEOUT: Final = 5.0  # seconds a receiver has to answer
SENDERS: Final = 8  # threads sending at once, each one URL's due messages
MAX_AGE: Final = timedelta(hours=6)  # older changes are not announced (a head back after a long stop)
ANY_HOST: Final = "*"
NOT_ALLOWED: Final = "not allowed"  # a sender's word: the host is no longer allowed
GAP_WAIT: Final = 30.0  # seconds an event id missing below the newest read is looked for again
MAX_GAPS: Final = 10_000  # a longer run of missing ids is taken as deleted (retention), not as being written


def allowed_hosts(text: str) -> frozenset[str]:
    """`--notify-hosts` as a set: host names (lower case) or `*`; empty: notifications off."""
    return frozenset(h.strip().lower() for h in text.split(",") if h.strip())


def check_allowed(spec: Mapping[str, Any], allowed: Collection[str]) -> None:
    """Refuse (Invalid, naming notify.url) a spec whose notification goes to a host the operator does not
    allow."""
    notify = spec.get("notify")
    if not notify:
        return
    host = (urlsplit(str(notify["url"])).hostname or "").lower()
    if ANY_HOST in allowed or host in allowed:
        return
    if not allowed:
        why = "this head sends no notifications (its operator allowed no hosts)"
    else:
        why = f"this head sends notifications only to {', '.join(sorted(allowed))}"
    raise Invalid(
        f"notify.url: {host or notify['url']!r} is not a host it may notify: {why}; ask an admin to start "
        f"the server with --notify-hosts {host or 'HOST'}",
        field="notify.url",
    )


@dataclass(slots=True)
class _Message:
    event_id: int
    workload_id: int
    url: str
    body: dict[str, Any]
    secret: str | None = None
    tries: int = 0
    next_at: float = 0.0


@dataclass(slots=True)
class Notifier:
    """The thread that sends the notifications (see the module docstring)."""

    store: Store
    allowed: frozenset[str]
    clock: Any = time.monotonic
    _cursor: int | None = None  # every event up to it is settled (read from the store at first)
    _seen: int = 0  # the newest event read
    _waiting: dict[int, _Message] = field(default_factory=dict)  # by event id: not yet sent
    _gaps: dict[int, float] = field(default_factory=dict)  # event ids missing below _seen -> looked for until
    _sending: dict[str, Future[list[tuple[_Message, str | None]]]] = field(default_factory=dict)  # by URL
    _client: httpx.Client | None = None
    _senders: ThreadPoolExecutor | None = None
    sent: int = 0
    given_up: int = 0

    def prepare(self) -> None:
        """Read the cursor (at a first start: the newest event, saved), before the head takes requests:
        whatever changes after is announced."""
        if self.allowed and self._cursor is None:
            self._cursor = self._seen = self._load_cursor()
            self._save_cursor(self._cursor)

    def run(self, stop: threading.Event) -> None:
        if not self.allowed:
            return  # nothing may be sent: no thread's worth of work
        self.open()
        try:
            while not stop.wait(PERIOD):
                try:
                    self.step()
                except Exception:  # the store busy, a receiver misbehaving: the next look tries again
                    log.exception("event=notify_failed")
        finally:
            self.close()

    def open(self) -> None:
        """The HTTP client (shared by the senders: its connections are kept) and the sending threads."""
        self._client = httpx.Client(timeout=TIMEOUT, trust_env=False, follow_redirects=False)
        self._senders = ThreadPoolExecutor(SENDERS, thread_name_prefix="notify")

    def close(self) -> None:
        """Stop sending; a message in flight is sent again by the next head (its event is not settled)."""
        if self._senders is not None:
            self._senders.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()

    def step(self, *, wait: bool = False) -> None:
        """Read new events, hand what is due to the senders, take in what they finished, and move the
        cursor past what is settled. `wait`: take in this look's sends before returning (for tests)."""
        if self._cursor is None:
            self._cursor = self._seen = self._load_cursor()
        self._read()
        self._collect()
        self._dispatch()
        if wait:
            for future in list(self._sending.values()):
                future.exception()  # waits; a failure is the sender's business (it returns none)
            self._collect()
        settled = min(min(self._waiting, default=self._seen + 1), min(self._gaps, default=self._seen + 1)) - 1
        if settled != self._cursor:
            self._save_cursor(settled)
            self._cursor = settled

    def _read(self) -> None:
        """The events after the newest read, and those still missing below it: ids are handed out when a
        transaction writes, so on PostgreSQL a later id may commit first. A missing id is looked for
        again for GAP_WAIT seconds (a rolled-back transaction leaves one missing for good). Each event is
        counted read only once considered, so a failure part way reads the rest again at the next look."""
        now = self.clock()
        stale = utcnow() - MAX_AGE
        with self.store.read() as s:
            if self._gaps:
                missing = sorted(self._gaps)[:BATCH]
                for event in s.scalars(select(Event).where(Event.id.in_(missing))).all():
                    self._consider(s, event, stale)
                    del self._gaps[event.id]
            new = s.scalars(select(Event).where(Event.id > self._seen).order_by(Event.id).limit(BATCH)).all()
            for event in new:
                self._consider(s, event, stale)
                if event.id - self._seen - 1 <= MAX_GAPS:  # a longer run was deleted, not being written
                    for gap in range(self._seen + 1, event.id):
                        self._gaps[gap] = now + GAP_WAIT
                self._seen = event.id
        for gap in [gap for gap, until in self._gaps.items() if until <= now]:
            del self._gaps[gap]

    def _consider(self, s: Session, event: Event, stale: datetime) -> None:
        """Queue the message `event` calls for, if its workload's spec asks for one."""
        if event.object_kind != "workload" or event.from_state == event.to_state or event.id in self._waiting:
            return  # a node's event, a note in a workload's history (no change of state), or queued already
        at = as_utc(event.at)
        if at is not None and at < stale:
            return
        workload = s.get(Workload, int(event.object_id))
        notify = ((workload.spec or {}).get("notify") if workload is not None else None) or {}
        if workload is None or not notify or _kind(event) not in notify.get("on", ()):
            return
        url, secret = str(notify["url"]), notify.get("secret")
        self._waiting[event.id] = _Message(event.id, workload.id, url, _body(event, workload), secret)

    def _dispatch(self) -> None:
        """Hand each URL's due messages, in event order, to a sender, unless one is still at that URL."""
        if self._senders is None:
            self.open()
        assert self._senders is not None
        now = self.clock()
        due: dict[str, list[_Message]] = {}
        for message in sorted(self._waiting.values(), key=lambda m: m.event_id):
            if message.next_at <= now and message.url not in self._sending:
                due.setdefault(message.url, []).append(message)
        for url, messages in due.items():
            self._sending[url] = self._senders.submit(self._post_all, messages)

    def _post_all(self, messages: list[_Message]) -> list[tuple[_Message, str | None]]:
        """On a sender thread: post each message; what went wrong with each (None: it arrived). Changes
        nothing of the notifier's: `_collect` does, on its own thread."""
        return [(message, self._post(message)) for message in messages]

    def _post(self, message: _Message) -> str | None:
        host = (urlsplit(message.url).hostname or "").lower()
        if ANY_HOST not in self.allowed and host not in self.allowed:
            return NOT_ALLOWED
        assert self._client is not None
        content = json.dumps(message.body, separators=(",", ":")).encode()
        headers = {
            "User-Agent": f"gpupool/{__version__}",
            "Content-Type": "application/json",
            "X-Gpupool-Event": str(message.event_id),
        }
        if message.secret:
            headers.update(signature(message.secret, content, int(time.time())))
        try:
            answer = self._client.post(message.url, content=content, headers=headers)
            return None if answer.is_success else f"answered {answer.status_code}"
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"

    def _collect(self) -> None:
        """Take in the senders' finished work: drop what arrived, give up or back off on the rest."""
        for url, future in list(self._sending.items()):
            if not future.done():
                continue
            del self._sending[url]
            if future.cancelled() or future.exception() is not None:
                log.error("event=notify_sender_failed url=%s", redacted_url(url), exc_info=future.exception())
                continue  # its messages stay waiting: sent again at the next look
            now = self.clock()
            for message, failure in future.result():
                self._settle(message, failure, now)

    def _settle(self, message: _Message, failure: str | None, now: float) -> None:
        """One try's outcome: the message is done (sent or given up on), or waits its backoff."""
        message.tries += 1
        if failure is None:
            del self._waiting[message.event_id]
            self.sent += 1
        elif failure == NOT_ALLOWED:
            host = urlsplit(message.url).hostname or ""
            self._give_up(message, f"{host} is no longer among the hosts this head may notify")
        elif message.tries >= TRIES:
            self._give_up(message, f"{failure}, {TRIES} times")
        else:
            message.next_at = now + 2 ** (message.tries - 1)  # 1, 2, 4, 8, 16 s
            shown = redacted_url(message.url)
            log.warning("event=notify_retry workload=%s url=%s why=%s", message.workload_id, shown, failure)

    def _give_up(self, message: _Message, why: str) -> None:
        del self._waiting[message.event_id]
        self.given_up += 1
        shown = redacted_url(message.url)
        log.warning("event=notify_given_up workload=%s url=%s why=%s", message.workload_id, shown, why)
        with self.store.session() as s:
            workload = s.get(Workload, message.workload_id)
            if workload is not None:
                note(
                    s,
                    workload,
                    f"notify: the message that it {message.body['state']} did not reach {shown}: {why}",
                    actor="system",
                )

    def _load_cursor(self) -> int:
        with self.store.read() as s:
            saved = head_state.read(s, CURSOR)
            if saved is not None:
                return int(saved)
            # a first start: the history before it is not announced
            return int(s.scalar(select(Event.id).order_by(Event.id.desc()).limit(1)) or 0)

    def _save_cursor(self, value: int) -> None:
        with self.store.session() as s:
            head_state.write(s, CURSOR, str(value))


def signature(secret: str, content: bytes, timestamp: int) -> dict[str, str]:
    """The headers that sign a message (as GitHub's and Slack's webhooks are signed): the time it was sent
    (Unix seconds) and an HMAC-SHA256, keyed with the spec's `notify.secret`, of that time, a dot and the
    body as sent. A receiver computes the same, compares in constant time, and refuses old timestamps
    (a replay)."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + content, hashlib.sha256)
    return {"X-Gpupool-Timestamp": str(timestamp), "X-Gpupool-Signature-256": f"sha256={mac.hexdigest()}"}


def redacted_url(url: str) -> str:
    """A notification URL as logs and histories show it: scheme and host, not the path and query, where a
    chat webhook keeps its secret."""
    parts = urlsplit(url)
    return (
        f"{parts.scheme}://{parts.hostname or ''}/..." if parts.path not in ("", "/") or parts.query else url
    )


def _kind(event: Event) -> str:
    """What a state change is called in `notify.on`: started, or the state it ended in."""
    return "started" if event.to_state == "running" else event.to_state


def _body(event: Event, workload: Workload) -> dict[str, Any]:
    at = as_utc(event.at)
    kind = _kind(event)
    code = workload.exit_code if kind == "failed" else None
    said = f" (exit code {code})" if code is not None else ""
    why = f": {event.reason}" if event.reason and kind in ("failed", "cancelled") else ""
    return {
        "text": f"gpupool: workload {workload.id} ({workload.name}) {kind}{said}{why} [queue "
        f"{workload.queue}, user {workload.user}]",
        "event_id": event.id,
        "state": event.to_state,
        "from": event.from_state,
        "kind": kind,
        "at": at.isoformat() if at else None,
        "reason": event.reason,
        "actor": event.actor,
        "exit_code": code,
        "workload": {
            "id": workload.id,
            "name": workload.name,
            "kind": workload.kind,
            "queue": workload.queue,
            "user": workload.user,
        },
    }
