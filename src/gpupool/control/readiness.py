"""Readiness of running services: the head asks each service that declares a `readiness_probe` for that
path on its endpoint, every PERIOD seconds, and keeps the last answer in memory. The proxy passes requests
on only to a service whose current attempt answered 2xx or 3xx (as Kubernetes' HTTP probes count success);
the API shows `ready`. An attempt starts not ready; it turns ready at its first good answer and not ready
again after FAILURES bad ones in a row (a slow answer counts as bad)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

import httpx
from sqlalchemy import select

from gpupool.control.lifecycle import RUNNING, SERVICE
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Workload

log = logging.getLogger(__name__)

PERIOD: Final = 2.0  # seconds between two rounds of probes
TIMEOUT: Final = 2.0  # seconds one probe may take
FAILURES: Final = 3  # bad answers in a row that make a ready attempt not ready
WORKERS: Final = 16  # probes asked at once


@dataclass(frozen=True, slots=True)
class Readiness:
    """The last word on one service's current attempt."""

    attempt: int  # the attempt's number: a new attempt starts over, not ready
    ready: bool
    detail: str  # what the last probe got, e.g. "GET /health answered 503"
    failures: int = 0  # bad answers in a row


def word_on(state: Mapping[int, Readiness], workload_id: int, attempt: int) -> Readiness:
    """The prober's word on a service's attempt `attempt`: not ready while it has said nothing of it."""
    known = state.get(workload_id)
    if known is None or known.attempt != attempt:
        return Readiness(attempt, False, "not probed yet")
    return known


@dataclass(frozen=True, slots=True)
class Target:
    workload_id: int
    attempt: int
    url: str
    path: str


class ReadinessProber:
    """Probes the running services; `state` maps a workload id to its `Readiness` (replaced whole each
    round, so readers never see a half-written map)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.state: Mapping[int, Readiness] = {}
        self._local = threading.local()  # each worker's own client: kept connections, one TLS context
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="probe")

    def targets(self) -> list[Target]:
        """The running services with a probe and an endpoint, each with its current attempt."""
        found = []
        with self.store.read() as s:
            rows = s.execute(
                select(Workload.id, Workload.spec, Attempt.number, Attempt.endpoint)
                .join(Attempt, Attempt.workload_id == Workload.id)
                .where(Workload.kind == SERVICE, Workload.state == RUNNING, Attempt.state == RUNNING)
            ).all()
        for workload_id, spec, number, endpoint in rows:
            path = (spec or {}).get("readiness_probe")
            if path and endpoint:
                found.append(Target(workload_id, number, f"http://{endpoint}{path}", path))
        return found

    def probe(self, target: Target, last: Readiness) -> Readiness:
        """Ask once; the attempt's new standing after `last` (see `word_on`)."""
        try:
            answer = self._client().get(target.url)
            good = 200 <= answer.status_code < 400
            detail = f"GET {target.path} answered {answer.status_code}"
        except httpx.TimeoutException:
            good, detail = False, f"GET {target.path} got no answer within {TIMEOUT:g} s"
        except httpx.HTTPError as exc:
            good, detail = False, f"GET {target.path} failed: {exc or type(exc).__name__}"
        if good:
            return Readiness(target.attempt, True, detail)
        failures = last.failures + 1
        return Readiness(target.attempt, last.ready and failures < FAILURES, detail, failures)

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(
                timeout=TIMEOUT, follow_redirects=False, trust_env=False
            )
        return client

    def round(self) -> None:
        """Probe every target once, at once; forget the services that no longer run."""
        targets = self.targets()
        state = self.state
        answers = self._pool.map(lambda t: self.probe(t, word_on(state, t.workload_id, t.attempt)), targets)
        fresh = {t.workload_id: r for t, r in zip(targets, answers, strict=True)}
        for workload_id, r in fresh.items():
            before = state.get(workload_id)
            if before is None or before.ready != r.ready or before.attempt != r.attempt:
                log.info(
                    "event=service_readiness workload=%d attempt=%d ready=%s detail=%r",
                    workload_id, r.attempt, r.ready, r.detail,
                )  # fmt: skip
        self.state = fresh

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.round()
            except Exception:  # a bad round must not end probing: the next one tries again
                log.exception("event=readiness_round_failed")
            stop.wait(PERIOD)
        self._pool.shutdown(wait=False, cancel_futures=True)
