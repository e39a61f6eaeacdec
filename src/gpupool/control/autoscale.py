"""Services that follow their load: the head's proxy records each service's requests as they come and go
(`Load`), and every PERIOD seconds the `Autoscaler` compares the load over the spec's `scaling.window` with
`scaling.target` per replica and changes the replica count (`service_replicas.scale`) within
`scaling.min..max`.

Target tracking, as dstack's and SkyPilot's services and Knative do it: a service wants
ceil(load / target) replicas. It gains them once `scale_up_delay` has passed since its count last changed;
it loses some only when the most it wanted all through the last `scale_down_delay` is fewer (Kubernetes'
HPA downscale stabilization window), and then down to that most, so a dip between two bursts removes
nothing. As HPA's tolerance, a load within TOLERANCE of what the current count carries (load / target
within 0.9..1.1 of it) changes nothing: a load at the edge of a step does not add and remove a replica
by turns. The load is the proxy's own measure, in the head's memory, of the requests it passed on to a
replica (one refused because no replica takes requests is no load: a crash-looping service gains no
replicas by the requests it refuses); after a restart of the head the autoscaler removes nothing until
it has watched a whole `scale_down_delay`.

`Load` also knows, per replica, what the proxy has in flight to it (`draining`): a replica being removed
is stopped once it has answered them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from gpupool.control import service_replicas, workloads
from gpupool.control.errors import ServiceError
from gpupool.spec import ScalingSpec, format_figure
from gpupool.store.db import Store

log = logging.getLogger(__name__)

PERIOD: Final = 1.0  # seconds between two passes of the autoscaler
KEPT: Final = 3600  # seconds of load kept per workload id: the longest window a spec may ask for
TOLERANCE: Final = 0.1  # a load within this fraction of what the current count carries changes nothing
SETTLE: Final = 1.0  # seconds after the proxy last sent a replica a request during which more may follow
# (the proxy reads where replicas run at most once a second: api/routes/proxy.py TARGET_TTL)
MAX_IDS: Final = 10_000  # ids counted at once; past it (a client asking for many ids that are no service),
# the idle ones are forgotten, or else all: the services' measures start again, as after a restart


class _Counts:
    """One workload id's load: requests begun per second, request-seconds in flight per second, and what
    is in flight now."""

    __slots__ = ("buckets", "in_flight", "since")

    def __init__(self, now: float) -> None:
        self.buckets: deque[list[float]] = deque()  # [second, requests begun, request-seconds in flight]
        self.in_flight = 0
        self.since = now  # when `in_flight` last changed: what it held since is not in the buckets yet

    def _bucket(self, second: float) -> list[float]:
        buckets = self.buckets
        if not buckets or buckets[-1][0] != second:
            buckets.append([second, 0.0, 0.0])
            while buckets[0][0] < second - KEPT:
                buckets.popleft()
        return buckets[-1]

    def settle(self, now: float) -> list[float]:
        """Count what was in flight up to `now`, each second's part in that second's bucket; the bucket of
        `now`."""
        if self.in_flight and now > self.since:
            start = max(self.since, now - KEPT)
            while start < now:
                second = float(math.floor(start))
                end = min(now, second + 1.0)
                self._bucket(second)[2] += self.in_flight * (end - start)
                start = end
        self.since = max(self.since, now)
        return self._bucket(float(math.floor(now)))


class Load:
    """What each service's proxy has carried, by the workload id in the request's path (a service is
    reached by its own id or any replica's); thread safe: the proxy writes, the autoscaler reads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[int, _Counts] = {}
        # per replica (its workload id): requests in flight to it, and when the proxy last sent it one
        self._serving: dict[int, int] = {}
        self._sent: dict[int, float] = {}
        self.started = clock()  # the measure covers nothing before this

    def sent(self, replica_id: int) -> None:
        """The proxy passes a request (or a WebSocket) on to the replica `replica_id`."""
        with self._lock:
            self._serving[replica_id] = self._serving.get(replica_id, 0) + 1
            now = self._clock()
            if replica_id not in self._sent and len(self._sent) >= MAX_IDS:
                # replicas that ended without being drained (a crash, a lost node) are never asked about:
                # what is past SETTLE says nothing any more
                self._sent = {i: at for i, at in self._sent.items() if now - at < SETTLE}
            self._sent[replica_id] = now

    def answered(self, replica_id: int) -> None:
        """A request `sent` counted has its whole answer back, or failed."""
        with self._lock:
            left = self._serving.get(replica_id, 0) - 1
            if left > 0:
                self._serving[replica_id] = left
            else:
                self._serving.pop(replica_id, None)

    def draining(self, replica_id: int) -> bool:
        """Whether the proxy has requests in flight to the replica `replica_id`, or sent it one within the
        last SETTLE seconds (it may still be sending some): a replica being removed is stopped once not
        (control/observe.py), so that what it was given is answered."""
        with self._lock:
            if self._serving.get(replica_id, 0) > 0:
                return True
            last = self._sent.get(replica_id)
            if last is not None and self._clock() - last >= SETTLE:
                del self._sent[replica_id]
                return False
            return last is not None

    def began(self, workload_id: int) -> float:
        """A request (or a WebSocket) to `workload_id` is passed on by the proxy; when (for `withdraw`)."""
        now = self._clock()
        with self._lock:
            counts = self._counts.get(workload_id)
            if counts is None:
                if len(self._counts) >= MAX_IDS:
                    self._forget_idle(now)
                    if len(self._counts) >= MAX_IDS:  # all busy within the hour: memory stays bounded
                        self._counts.clear()
                counts = self._counts[workload_id] = _Counts(now)
            counts.settle(now)[1] += 1
            counts.in_flight += 1
        return now

    def withdraw(self, workload_id: int, began: float) -> None:
        """A request `began` counted at `began` ended without reaching any replica (each connection
        refused or not accepted: its replicas crash or hang): it ends, and is no request begun."""
        self.ended(workload_id)
        with self._lock:
            counts = self._counts.get(workload_id)
            if counts is not None:
                second = float(math.floor(began))
                for bucket in reversed(counts.buckets):
                    if bucket[0] == second:
                        bucket[1] = max(0.0, bucket[1] - 1)
                        break
                    if bucket[0] < second:
                        break

    def ended(self, workload_id: int) -> None:
        """A request `began` counted has its whole answer sent, or failed."""
        now = self._clock()
        with self._lock:
            counts = self._counts.get(workload_id)
            if counts is not None and counts.in_flight > 0:
                counts.settle(now)
                counts.in_flight -= 1

    def measure(self, ids: Iterable[int], metric: str, window: float, now: float | None = None) -> float:
        """The load of the workloads `ids` over the last `window` seconds (less while the measure is younger):
        requests begun per second ("rps"), or requests in flight on average ("concurrency")."""
        now = self._clock() if now is None else now
        span = max(1.0, min(window, now - self.started))
        start = now - span  # the window is exactly `span` long: of the second it begins in, the part after
        # `start` counts (a whole oldest bucket would count up to a second more: one client always waiting
        # on an answer would read as 1.33 requests in flight over 3 s, and be given a second replica)
        total = 0.0
        with self._lock:
            for workload_id in set(ids):
                counts = self._counts.get(workload_id)
                if counts is None:
                    continue
                counts.settle(now)
                for second, requests, busy in reversed(counts.buckets):
                    if second + 1.0 <= start:
                        break
                    inside = min(1.0, second + 1.0 - start)
                    total += (requests if metric == "rps" else busy) * inside
        return total / span

    def _forget_idle(self, now: float) -> None:
        """Drop the ids with nothing in flight and nothing counted in the last KEPT seconds."""
        for workload_id, counts in list(self._counts.items()):
            if counts.in_flight == 0 and (not counts.buckets or counts.buckets[-1][0] < now - KEPT):
                del self._counts[workload_id]

    def prune(self) -> None:
        with self._lock:
            self._forget_idle(self._clock())


def wanted(load: float, scaling: ScalingSpec, current: int | None = None) -> int:
    """Replicas for `load` at `scaling.target` each, within scaling.min..max; `current` itself while the
    load is within TOLERANCE of what `current` replicas carry (Kubernetes' HPA tolerance)."""
    ratio = load / scaling.target
    if current is not None and current > 0 and abs(ratio / current - 1.0) <= TOLERANCE + 1e-9:
        return min(scaling.max, max(scaling.min, current))
    return min(scaling.max, max(scaling.min, math.ceil(ratio - 1e-9)))


class Tracker:
    """One service's recent wants and when its count last changed: the rule in the module's docstring."""

    def __init__(self, now: float) -> None:
        self.since = now  # watched from
        self.changed = -math.inf  # when the count last changed (unknown before: adding is not delayed)
        self.wants: deque[tuple[float, int]] = deque()

    def next_count(self, scaling: ScalingSpec, current: int, load: float, now: float) -> int:
        want = wanted(load, scaling, current)
        wants = self.wants
        wants.append((now, want))
        while len(wants) > 1 and wants[1][0] <= now - scaling.scale_down_delay:
            wants.popleft()  # the oldest kept is the last want at or before the look-back's start
        if current < scaling.min or current > scaling.max:
            return min(scaling.max, max(scaling.min, current))
        quiet = now - self.changed
        if want > current:
            return want if quiet >= scaling.scale_up_delay else current
        if want < current and now - self.since >= scaling.scale_down_delay:
            most = max(w for _, w in wants)
            return most if most < current else current
        return current


@dataclass(frozen=True, slots=True)
class Word:
    """The autoscaler's last look at one service, as `gpupool show`, the API and /metrics give it."""

    name: str
    metric: str
    load: float  # over `window`
    window: float
    target: float
    wanted: int
    replicas: int  # the count after this look
    min: int
    max: int
    at: float  # time.time() of the look

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "metric": self.metric, "load": round(self.load, 3), "window_s": self.window,
            "target": self.target, "wanted": self.wanted, "replicas": self.replicas, "min": self.min,
            "max": self.max, "at": self.at,
        }  # fmt: skip


def describe(metric: str, load: float, window: float) -> str:
    """The load as people read it: "23.4 requests/s over 60 s" or "3.2 requests in flight over 60 s"."""
    unit = "requests/s" if metric == "rps" else "requests in flight"
    return f"{format_figure(load)} {unit} over {window:g} s"


class Autoscaler:
    """Changes the replica count of every service with `scaling` in its spec, every PERIOD seconds;
    `words` maps a service's id to its last `Word` (replaced whole each pass)."""

    def __init__(
        self,
        store: Store,
        load: Load,
        wake: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        readiness: Callable[[], workloads.Ready] | None = None,
        live: Callable[[], workloads.Live] | None = None,
    ) -> None:
        self.store = store
        self.load = load
        self._wake = wake
        self._clock = clock
        # the prober's word and the loop's reasons: a scale-down removes the replicas that serve least
        self._readiness = readiness
        self._live = live
        self._trackers: dict[int, Tracker] = {}
        self.words: dict[int, Word] = {}

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(PERIOD):
            try:
                self.step()
            except Exception:  # one bad pass (the store busy, a service ending meanwhile) waits for the next
                log.exception("event=autoscale_failed")

    def _look(self, found: service_replicas.Autoscaled, tracker: Tracker, now: float) -> tuple[Word, bool]:
        """Measure one service, change its count if the rule says so; its word, and whether it changed.

        A changed count's word is shown before the count changes: whoever reads the new count (the API
        reads the store, then the words) reads the load that made it, not the last pass's."""
        scaling = ScalingSpec.model_validate(found.scaling)
        load = self.load.measure(found.ids, scaling.metric, scaling.window, now)
        count = tracker.next_count(scaling, found.replicas, load, now)

        def word(replicas: int) -> Word:
            return Word(
                found.name, scaling.metric, load, scaling.window, scaling.target,
                wanted(load, scaling, found.replicas),
                replicas, scaling.min, scaling.max, time.time(),
            )  # fmt: skip

        if count == found.replicas:
            return word(count), False
        measured = describe(scaling.metric, load, scaling.window)
        why = (
            f"scaled to {service_replicas.replicas_said(count)} by the autoscaler: {measured}, target "
            f"{scaling.target:g} per replica, range {scaling.min}..{scaling.max}"
        )
        self.words = {**self.words, found.service_id: word(count)}
        try:
            service_replicas.scale(
                self.store, found.service_id, count, actor="autoscaler", why=why,
                readiness=self._readiness() if self._readiness is not None else None,
                live=self._live() if self._live is not None else None,
            )  # fmt: skip
        except ServiceError as exc:  # ended or cancelled meanwhile
            log.info("event=autoscale_skipped service=%s why=%s", found.service_id, exc.message)
            return word(found.replicas), False
        log.info("event=autoscaled service=%s from=%s to=%s", found.service_id, found.replicas, count)
        tracker.changed = now
        return word(count), True

    def step(self) -> None:
        now = self._clock()
        words: dict[int, Word] = {}
        trackers: dict[int, Tracker] = {}
        changed = False
        for found in service_replicas.autoscaled(self.store):
            tracker = trackers[found.service_id] = self._trackers.get(found.service_id) or Tracker(now)
            try:
                words[found.service_id], moved = self._look(found, tracker, now)
            except Exception:  # one service's trouble leaves the others scaling
                log.exception("event=autoscale_failed service=%s", found.service_id)
                continue
            changed = changed or moved
        self._trackers = trackers
        self.words = words
        self.load.prune()
        if changed:
            self._wake()
