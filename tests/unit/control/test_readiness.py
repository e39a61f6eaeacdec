"""The readiness prober's judgement of one attempt, against a real HTTP server on loopback: ready at the
first 2xx or 3xx, not ready again only after FAILURES bad answers in a row, and a new attempt starts over."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.control.readiness import FAILURES, ReadinessProber, Target, word_on
from gpupool.store.db import Store


class _Health(http.server.BaseHTTPRequestHandler):
    status = 503

    def do_GET(self) -> None:
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def service() -> Iterator[tuple[type[_Health], str]]:
    handler = type("Health", (_Health,), {})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_ready_at_the_first_good_answer_and_not_ready_only_after_failures_in_a_row(
    service: tuple[type[_Health], str], tmp_path: Path
) -> None:
    handler, endpoint = service
    prober = ReadinessProber(Store(f"sqlite:///{tmp_path / 'store.db'}"))
    target = Target(1, 0, f"http://{endpoint}/health", "/health")

    r = prober.probe(target, word_on({}, 1, 0))
    assert (r.ready, r.detail, r.failures) == (False, "GET /health answered 503", 1)
    handler.status = 302  # a redirect counts as success, as Kubernetes counts it
    r = prober.probe(target, r)
    assert (r.ready, r.detail, r.failures) == (True, "GET /health answered 302", 0)
    handler.status = 500
    for failures in range(1, FAILURES):
        r = prober.probe(target, r)
        assert (r.ready, r.failures) == (True, failures), "one bad answer does not make it not ready"
    r = prober.probe(target, r)
    assert (r.ready, r.failures) == (False, FAILURES)

    handler.status = 200
    ready = prober.probe(target, r)
    assert ready.ready
    handler.status = 500
    fresh = word_on({1: ready}, 1, 1)  # a new attempt starts over, not ready
    assert not fresh.ready and fresh.detail == "not probed yet"
    again = prober.probe(Target(1, 1, target.url, target.path), fresh)
    assert (again.attempt, again.ready, again.failures) == (1, False, 1)


def test_a_port_nobody_listens_on_is_not_ready_with_the_error(tmp_path: Path) -> None:
    prober = ReadinessProber(Store(f"sqlite:///{tmp_path / 'store.db'}"))
    r = prober.probe(Target(1, 0, "http://127.0.0.1:9/health", "/health"), word_on({}, 1, 0))
    assert not r.ready and r.detail.startswith("GET /health failed:")
