"""A small, typed httpx client for the gpupool REST API (/api/v1)."""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from gpupool.home import DEFAULT_SERVER, credentials_path

ENDED = frozenset({"succeeded", "failed", "cancelled"})  # the states a workload ends in
WAIT_PAGE = 1000  # ids `Client.wait` asks about in one listing (the API's most)
RIDE_OUT = 300.0  # seconds a caller waiting on work keeps trying a head it cannot reach (a restart)

T = TypeVar("T")


class GpupoolError(Exception):
    """Base of every error the SDK raises."""


class ConnectionFailed(GpupoolError):
    pass


class Outage:
    """How long a caller that waits on work has not reached the head. A head restarting (an upgrade, a
    crash) is not the end of the work, which goes on running: the caller tries again until `limit` seconds
    have passed without an answer, then gives up with the last ConnectionFailed."""

    def __init__(self, limit: float = RIDE_OUT) -> None:
        self.limit = limit
        self.since: float | None = None

    def failed(self, exc: ConnectionFailed) -> float:
        """Seconds without an answer so far; raises `exc` once they pass the limit."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if now - self.since > self.limit:
            raise exc
        return now - self.since

    def answered(self) -> bool:
        """The head answered; whether it had not before (an outage just ended)."""
        ended = self.since is not None
        self.since = None
        return ended


def ride_out(
    call: Callable[[], T],
    *,
    poll: float = 1.0,
    deadline: float | None = None,
    on_outage: Callable[[float | None], None] | None = None,
    outage: Outage | None = None,
) -> T:
    """`call()`, made again every `poll` seconds while the head cannot be reached (a restart), for up to
    `outage`'s limit (default RIDE_OUT seconds; then its ConnectionFailed); `on_outage(seconds)` hears each
    failure and `on_outage(None)` the answer that ends them. WaitTimeout once `deadline` (a
    time.monotonic() time) passes without an answer. Only for calls that change nothing: one made again
    must not do twice what it asks."""
    outage = outage or Outage()
    while True:
        try:
            result = call()
        except ConnectionFailed as exc:
            down = outage.failed(exc)
            if on_outage is not None:
                on_outage(down)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"the head was unreachable for {down:.0f}s", []) from exc
            time.sleep(poll)
            continue
        if outage.answered() and on_outage is not None:
            on_outage(None)
        return result


class WaitTimeout(GpupoolError):
    """`Client.wait` stopped waiting: `waiting` holds the workloads that had not ended (they go on)."""

    def __init__(self, message: str, waiting: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.waiting = waiting


class ApiError(GpupoolError):
    """The server refused the request; `message` says why and `field` names the bad input."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


@dataclass(frozen=True)
class Credentials:
    server: str | None
    token: str | None


def load_credentials(path: Path | None = None) -> Credentials:
    path = path or credentials_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return Credentials(None, None)
    return Credentials(data.get("server"), data.get("token"))


def save_credentials(server: str, token: str, path: Path | None = None) -> Path:
    """Write the credentials file readable by its owner only (0600)."""
    path = path or credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"server": server, "token": token}, fh)
        fh.write("\n")
    os.chmod(path, 0o600)
    return path


def resolve(server: str | None = None, token: str | None = None) -> tuple[str, str | None]:
    """Server: flag, $GPUPOOL_SERVER, credentials file, default; token: flag, $GPUPOOL_TOKEN, credentials."""
    saved = load_credentials()
    url = server or os.environ.get("GPUPOOL_SERVER") or saved.server or DEFAULT_SERVER
    tok = token or os.environ.get("GPUPOOL_TOKEN") or saved.token
    if not url.lower().startswith(("http://", "https://")):
        given = "--server" if server else "GPUPOOL_SERVER" if os.environ.get("GPUPOOL_SERVER") else "server"
        raise GpupoolError(
            f"{given} {url}: not an http:// or https:// address; e.g. http://{url.split('://')[-1]}"
        )
    return url.rstrip("/"), tok


def _retry_after(response: httpx.Response) -> float | None:
    """The seconds a 429's `Retry-After` asks to wait (whole seconds, RFC 9110), or None."""
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def tls_for(server: str) -> ssl.SSLContext | bool:
    """TLS for the server at `server`: httpx's default (verified against certifi's CA bundle) for https. Over
    plain http no TLS is ever spoken: the bundle is not loaded (about 45 ms, a tenth of a CLI command) and
    a context that verifies and trusts nothing stands in."""
    if server.lower().startswith("https:"):
        return True
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class Client:
    """`rate_wait_max`: how long, at most, calls refused for the token's rate limit (429) are sent again
    after the wait the server asks for, before the refusal is raised."""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        rate_wait_max: float = 60.0,
    ) -> None:
        self.rate_wait_max = rate_wait_max
        self.server, self.token = resolve(server, token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(
            base_url=self.server, headers=headers, timeout=timeout, verify=tls_for(self.server)
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        waited = 0.0
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                raise ConnectionFailed(self._unanswered(method, exc)) from exc
            # Over the token's rate limit: the server refused the call before doing anything, so it is
            # sent again, unchanged, once the server's Retry-After has passed (for up to `rate_wait_max`).
            pause = _retry_after(response) if response.status_code == 429 else None
            if pause is None or waited + pause > self.rate_wait_max:
                break
            time.sleep(pause)
            waited += pause
        if response.status_code >= 400:
            try:
                error = response.json().get("error", {})
            except ValueError:
                error = {}
            message = error.get("message") or f"HTTP {response.status_code}: {response.text[:200]}"
            raise ApiError(response.status_code, error.get("code", "error"), message, error.get("field"))
        return response.json()

    def _unanswered(self, method: str, exc: httpx.TransportError) -> str:
        """Why a call got no answer, and what to do: nothing reached a server (no server there), or the
        call was sent and the connection ended before an answer (a head killed or restarted meanwhile), when
        a call that changes something may have been carried out: sent again blindly, a submit would be
        stored twice."""
        cause = exc.__class__.__name__
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return (
                f"cannot reach the gpupool server at {self.server} ({cause}); start one with `gpupool "
                "server` or point --server / GPUPOOL_SERVER at it"
            )
        if method in ("GET", "HEAD"):
            return (
                f"the gpupool server at {self.server} took the call but gave no answer ({cause}): it may be "
                "restarting; try again in a moment"
            )
        return (
            f"the gpupool server at {self.server} took the call but gave no answer ({cause}): it may have "
            "carried it out before it stopped or restarted; check with `gpupool ps` (or `gpupool show`) "
            "before you try again, or it may be done twice"
        )

    # -- health ---------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/healthz")
        return result

    # -- workloads ------------------------------------------------------------------------------------
    def submit(self, spec: dict[str, Any], *, hold: bool = False) -> dict[str, Any]:
        """Submit a spec; `hold`: it waits held until released."""
        params = {"hold": "true"} if hold else None
        result: dict[str, Any] = self._call("POST", "/api/v1/workloads", json=spec, params=params)
        return result

    def workloads(
        self,
        *,
        all: bool = False,
        state: str | None = None,
        queue: str | None = None,
        user: str | None = None,
        name: str | None = None,
        since: datetime | None = None,
        ids: list[int] | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Oldest first; the server gives the newest `limit` (1,000 unless said) of those that match
        (`ids`: only those workloads, at most 1,000; `name`: only those of this name)."""
        params: dict[str, Any] = {"all": all}
        if ids is not None:
            params["id"] = ids
        if state:
            params["state"] = state
        if queue:
            params["queue"] = queue
        if user:
            params["user"] = user
        if name is not None:  # "" too: it names no workload, and must not list every one
            params["name"] = name
        if since is not None:
            params["since"] = since.isoformat()
        if limit is not None:
            params["limit"] = limit
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/workloads", params=params)
        return result

    def wait(
        self,
        ids: Sequence[int],
        *,
        timeout: float | None = None,
        poll: float = 1.0,
        progress: Callable[[int, list[dict[str, Any]]], None] | None = None,
        outage: Outage | None = None,
        on_outage: Callable[[float | None], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Block until every workload of `ids` has ended (succeeded, failed or cancelled); them, in the order
        of `ids`. Looks every `poll` seconds, up to 1,000 ids a request; calls `progress(ended, waiting)`
        after each look that leaves some waiting. WaitTimeout after `timeout` seconds (nothing is
        cancelled); ApiError (404) when an id names no workload. A head that cannot be reached is tried
        again for `outage`'s limit (default RIDE_OUT seconds; ConnectionFailed after it), calling
        `on_outage(seconds)` each time, and `on_outage(None)` when it answers again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = outage or Outage()
        last: dict[int, dict[str, Any]] = {}

        def look() -> None:
            open_ids = [i for i in dict.fromkeys(ids) if last.get(i, {}).get("state") not in ENDED]
            for at in range(0, len(open_ids), WAIT_PAGE):
                page = open_ids[at : at + WAIT_PAGE]
                for w in self.workloads(all=True, ids=page, limit=len(page)):
                    last[w["id"]] = w

        while True:
            try:
                ride_out(look, poll=poll, deadline=deadline, on_outage=on_outage, outage=outage)
            except WaitTimeout as exc:
                waiting = [last[i] for i in ids if i in last and last[i]["state"] not in ENDED]
                raise WaitTimeout(str(exc), waiting) from exc.__cause__
            missing = [i for i in ids if i not in last]
            if missing:
                raise ApiError(
                    404, "not_found", f"no workload with id {missing[0]}; list them with `gpupool ps --all`"
                )
            waiting = [last[i] for i in ids if last[i]["state"] not in ENDED]
            if not waiting:
                return [last[i] for i in ids]
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"{len(waiting)} of {len(ids)} workloads have not ended yet", waiting)
            if progress is not None:
                progress(len(ids) - len(waiting), waiting)
            time.sleep(poll)

    def scheduling(self) -> dict[str, Any]:
        """The server's scheduling policy: `policy` (scheduling.yaml's fields), `source` (its file, or None),
        `usage_weight`, `usage_half_life_s`."""
        result: dict[str, Any] = self._call("GET", "/api/v1/scheduling")
        return result

    def workload(self, workload_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/workloads/{workload_id}")
        return result

    def cancel(self, workload_id: int, *, task: bool = False) -> dict[str, Any]:
        """`task`: for a job array's id, cancel its first task alone (else the whole array)."""
        params = {"task": "true"} if task else None
        result: dict[str, Any] = self._call("POST", f"/api/v1/workloads/{workload_id}/cancel", params=params)
        return result

    def set_priority(self, workload_id: int, priority: int | str, *, task: bool = False) -> dict[str, Any]:
        """`priority`: 0..1000 or a class name; `task`: as for `cancel`."""
        return self.update(workload_id, priority=priority, task=task)

    def update(
        self,
        workload_id: int,
        *,
        priority: int | str | None = None,
        max_duration: str | float | None = None,
        queue: str | None = None,
        task: bool = False,
    ) -> dict[str, Any]:
        """Change pending or running work (Slurm's scontrol update): `priority` (0..1000 or a class name),
        `max_duration` (seconds, or text like "4h"; "none" removes the limit), `queue` (pending work only;
        Partition=); `task`: as for `cancel`."""
        given = (("priority", priority), ("max_duration", max_duration), ("queue", queue))
        body = {k: v for k, v in given if v is not None}
        params = {"task": "true"} if task else None
        path = f"/api/v1/workloads/{workload_id}"
        result: dict[str, Any] = self._call("PATCH", path, json=body, params=params)
        return result

    def hold(self, workload_id: int, *, task: bool = False) -> dict[str, Any]:
        """Keep it pending until `release` (a running one is stopped first); `task`: as for `cancel`."""
        params = {"task": "true"} if task else None
        result: dict[str, Any] = self._call("POST", f"/api/v1/workloads/{workload_id}/hold", params=params)
        return result

    def requeue(self, workload_id: int, *, task: bool = False) -> dict[str, Any]:
        """Stop running work and let the scheduler place it again (Slurm's scontrol requeue)."""
        params = {"task": "true"} if task else None
        result: dict[str, Any] = self._call("POST", f"/api/v1/workloads/{workload_id}/requeue", params=params)
        return result

    def release(self, workload_id: int, *, task: bool = False) -> dict[str, Any]:
        params = {"task": "true"} if task else None
        result: dict[str, Any] = self._call("POST", f"/api/v1/workloads/{workload_id}/release", params=params)
        return result

    def scale(self, workload_id: int, replicas: int | str) -> dict[str, Any]:
        """`replicas`: a count, or "MIN..MAX", the range of a service that scales itself."""
        body = {"replicas": replicas}
        result: dict[str, Any] = self._call("POST", f"/api/v1/workloads/{workload_id}/scale", json=body)
        return result

    def logs(
        self, workload_id: int, *, attempt: int | None = None, offset: int = 0, rank: int = 0
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"offset": offset}
        if rank:
            params["rank"] = rank
        if attempt is not None:
            params["attempt"] = attempt
        result: dict[str, Any] = self._call("GET", f"/api/v1/workloads/{workload_id}/logs", params=params)
        return result

    # -- nodes ----------------------------------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/nodes")
        return result

    def foreign_jobs(self) -> list[dict[str, Any]]:
        """Jobs the execution backend (Slurm) runs that gpupool did not start."""
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/foreign-jobs")
        return result

    def cordon(self, name: str, reason: str | None = None) -> dict[str, Any]:
        body = {"reason": reason} if reason else None
        result: dict[str, Any] = self._call("POST", f"/api/v1/nodes/{name}/cordon", json=body)
        return result

    def uncordon(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/nodes/{name}/uncordon")
        return result

    def drain(self, name: str, reason: str | None = None) -> dict[str, Any]:
        body = {"reason": reason} if reason else None
        result: dict[str, Any] = self._call("POST", f"/api/v1/nodes/{name}/drain", json=body)
        return result

    def delete_node(self, name: str) -> dict[str, Any]:
        """Remove a node that runs nothing (admin); returns it as it was, with warnings."""
        result: dict[str, Any] = self._call("DELETE", f"/api/v1/nodes/{name}")
        return result

    # -- tokens (people and scripts) -----------------------------------------------------------------
    def whoami(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/api/v1/whoami")
        return result

    def create_token(self, name: str, role: str = "user", queues: list[str] | None = None) -> dict[str, Any]:
        """A new token (admin); the answer's `token` is shown this once."""
        body = {"name": name, "role": role, "queues": queues or []}
        result: dict[str, Any] = self._call("POST", "/api/v1/tokens", json=body)
        return result

    def tokens(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/tokens")
        return result

    def revoke_token(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("DELETE", f"/api/v1/tokens/{name}")
        return result

    # -- secrets -----------------------------------------------------------------------------------------
    def set_secret(self, name: str, value: str) -> dict[str, Any]:
        """Make or replace one of your secrets; work names it in its spec's `secrets`."""
        result: dict[str, Any] = self._call(
            "PUT", f"/api/v1/secrets/{quote(name, safe='')}", json={"value": value}
        )
        return result

    def secrets(self, owner: str | None = None) -> list[dict[str, Any]]:
        """Your secrets' names and when each was set (an admin: `owner`'s); never a value. `unreadable`: why
        the head cannot decrypt one (else None)."""
        params = {"owner": owner} if owner else None
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/secrets", params=params)
        return result

    def delete_secret(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("DELETE", f"/api/v1/secrets/{quote(name, safe='')}")
        return result

    # -- usage and cost --------------------------------------------------------------------------------
    def usage(
        self,
        since: str | None = None,
        until: str | None = None,
        by: str = "queue",
        queue: str | None = None,
        users: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """GPU-hours (and cost) over a window, a row per `by` key; `since`/`until`: ISO times or durations
        before now ("7d"); `users`: only the work they submitted (None: everyone's)."""
        params: dict[str, Any] = {
            k: v for k, v in (("since", since), ("until", until), ("queue", queue)) if v
        }
        if users is not None:
            params["user"] = list(users)
        result: dict[str, Any] = self._call("GET", "/api/v1/usage", params={**params, "by": by})
        return result

    # -- the audit log ---------------------------------------------------------------------------------
    def events(
        self,
        since: str | None = None,
        until: str | None = None,
        kind: str | None = None,
        object: str | None = None,
        actor: str | None = None,
        limit: int = 200,
    ) -> list[dict[str, Any]]:
        """The audit log (admin), newest first: who changed what; `since`/`until`: ISO times or durations
        before now ("1d"); `kind`: workload, attempt, node, queue, token, join-token."""
        given = (("since", since), ("until", until), ("kind", kind), ("object", object), ("actor", actor))
        params: dict[str, Any] = {k: v for k, v in given if v}
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/events", params={**params, "limit": limit})
        return result

    # -- join tokens (node agents) --------------------------------------------------------------------
    def create_join_token(
        self, ttl: str | None = "1h", description: str = "", gpus: int | None = None
    ) -> dict[str, Any]:
        """`ttl`: how long it admits nodes ("1h", as the head's default; None or "never": no expiry).
        `gpus`: how many GPUs each node that joins with it has; one that registers fewer is unhealthy."""
        body: dict[str, Any] = {"ttl": "never" if ttl is None else ttl, "description": description}
        if gpus is not None:
            body["gpus"] = gpus
        result: dict[str, Any] = self._call("POST", "/api/v1/join-tokens", json=body)
        return result

    def join_tokens(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/join-tokens")
        return result

    def revoke_join_token(self, ident: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/join-tokens/{ident}/revoke")
        return result

    # -- node health and telemetry -------------------------------------------------------------------
    def node_health(self, name: str | None = None) -> Any:
        """Every node's health verdict (a list), or one node's with its events (a dict)."""
        return self._call("GET", f"/api/v1/health/{name}" if name else "/api/v1/health")

    def run_health_checks(self, node: str | None = None, level: str = "quick") -> list[dict[str, Any]]:
        """Run the passive and active checks now (on `node`, or every node that can run them)."""
        result: list[dict[str, Any]] = self._call(
            "POST", "/api/v1/health/run", json={"node": node, "level": level}, timeout=1200.0
        )
        return result

    def telemetry(self, node: str, seconds: float = 600.0) -> dict[str, Any]:
        """A node's GPUs: latest sample and downsampled history over the last `seconds`."""
        result: dict[str, Any] = self._call("GET", f"/api/v1/telemetry/{node}", params={"seconds": seconds})
        return result

    def inject_fault(self, node: str, gpu: int, **fault: Any) -> dict[str, Any]:
        """Fault injection into a simulated GPU (admin): xid=79, ecc="uncorrectable", throttle="thermal",
        slow=0.5, fall_off_bus=True or clear=True."""
        result: dict[str, Any] = self._call(
            "POST", f"/api/v1/nodes/{node}/faults", json={"gpu": gpu, **fault}
        )
        return result

    def accept_gpus(self, node: str) -> dict[str, Any]:
        """Accept the GPUs the node has registered now as the ones it is expected to have (admin)."""
        result: dict[str, Any] = self._call("POST", f"/api/v1/nodes/{node}/expected-gpus")
        return result

    # -- bench results (docs/bench.md) --------------------------------------------------------------------
    def record_bench(
        self, node: str, report: dict[str, Any], *, kind: str | None = None, source: str = "cli"
    ) -> list[dict[str, Any]]:
        """Record a bench's JSON report for a node (admin); one stored result per series (op, dtype)."""
        body = {"node": node, "report": report, "source": source, **({"kind": kind} if kind else {})}
        result: list[dict[str, Any]] = self._call("POST", "/api/v1/bench-results", json=body)
        return result

    def bench_results(
        self,
        *,
        node: str | None = None,
        kind: str | None = None,
        key: str | None = None,
        latest: bool = False,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Stored bench results, newest first; `latest`: the newest of each node, kind and key."""
        params: dict[str, Any] = {"latest": latest}
        for name, value in (("node", node), ("kind", kind), ("key", key), ("limit", limit)):
            if value is not None:
                params[name] = value
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/bench-results", params=params)
        return result

    # -- queues ---------------------------------------------------------------------------------------
    def queues(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/queues")
        return result

    def queue(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/queues/{name}")
        return result

    def create_queue(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/queues", json=spec)
        return result

    def update_queue(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("PATCH", f"/api/v1/queues/{name}", json=patch)
        return result

    def delete_queue(self, name: str) -> dict[str, Any]:
        """Delete a queue with no pending or running work and no child queues; returns it as it was."""
        result: dict[str, Any] = self._call("DELETE", f"/api/v1/queues/{name}")
        return result
