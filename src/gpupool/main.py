"""The `gpupool` entry point: the client commands of gpupool.cli plus `gpupool server`.

This module is the composition root: it alone joins the CLI (which never imports the server) with the
server's parts.
"""

from __future__ import annotations

import errno
import inspect
import ipaddress
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import typer
import typer.main

from gpupool.api.ratelimit import DEFAULT_BURST, DEFAULT_RATE
from gpupool.cli.app import app
from gpupool.cli.errors import CliError, click_class
from gpupool.cli.render import err_console, print_error
from gpupool.client import GpupoolError
from gpupool.home import DEFAULT_PORT, default_db_url, home_dir, make_private
from gpupool.spec import SpecError, parse_duration

log = logging.getLogger(__name__)

_LOG_LEVELS = ("debug", "info", "warning", "error")


def _log_level(value: str) -> str:
    if value.lower() not in _LOG_LEVELS:
        raise typer.BadParameter(f"{value!r} is not a log level; give one of {', '.join(_LOG_LEVELS)}")
    return value.lower()


_LOG_LEVEL = typer.Option(
    "info", "--log-level", callback=_log_level, help="how much the log says: debug, info, warning or error"
)


def _forwarded_allow_ips(value: str) -> list[str]:
    """--forwarded-allow-ips as uvicorn takes it: ["*"], or IP addresses and networks (CIDR)."""
    given = [part.strip() for part in value.split(",") if part.strip()]
    if "*" in given:
        return ["*"]
    for part in given:
        try:
            ipaddress.ip_network(part) if "/" in part else ipaddress.ip_address(part)
        except ValueError:
            raise CliError(
                f"--forwarded-allow-ips {value}: {part!r} is not an IP address or network (host bits "
                "clear); give the reverse proxy's address, e.g. 10.0.0.5 or 10.0.0.0/24 (or * for any)"
            ) from None
    return given


@app.command()
def server(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="port to listen on"),
    gpus: str = typer.Option(
        "auto",
        "--gpus",
        help="auto (NVML, else simulated 8xH100), nvml, sim:8xH100, sim:4xA100-80GB, sim:2xL4, or none",
    ),
    db: str | None = typer.Option(
        None,
        "--db",
        help="store URL: sqlite:///path.db or postgresql://... "
        "(default $GPUPOOL_DB, else $GPUPOOL_HOME/gpupool.db; $GPUPOOL_HOME is ~/.gpupool unless set)",
    ),
    node_name: str | None = typer.Option(None, "--node-name", help="name of this machine's node"),
    backend: str | None = typer.Option(
        None,
        "--backend",
        help="where work runs: local (this machine; the default), agent (nodes whose `gpupool agent` joined; "
        "the default with --gpus none; docs/agents.md) or slurm (a Slurm cluster via sbatch; docs/slurm.md)",
    ),
    partition: str | None = typer.Option(
        None,
        "--partition",
        help="with --backend slurm: the Slurm partition to schedule (default: every node)",
    ),
    node_lease: str = typer.Option(
        "10s",
        "--node-lease",
        help="with agents: a node with no heartbeat for this long is lost, its work moved",
    ),
    usage_weight: float = typer.Option(
        0.0,
        "--usage-weight",
        help="fair share by history: 0 (default) ignores it; 1 halves the over-quota weight of a queue "
        "that used twice its share (docs/scheduler.md)",
    ),
    usage_half_life: str = typer.Option(
        "7d", "--usage-half-life", help="half-life of the usage that --usage-weight counts, e.g. 7d, 12h"
    ),
    restart_backoff: str = typer.Option(
        "10s",
        "--restart-backoff",
        help="a service (or a job retried after a failure) that exits soon after it starts waits this long "
        "before its next attempt, doubling with each quick exit in a row up to 30 times as long (0: at once)",
    ),
    new_admin_token: bool = typer.Option(
        False, "--new-admin-token", help="replace the admin token and print it"
    ),
    rate_limit: float = typer.Option(
        DEFAULT_RATE,
        "--rate-limit",
        help="API calls a second each token may make, sustained; over it calls get 429 with Retry-After "
        "(the CLI waits and retries); 0: no limit",
    ),
    rate_burst: int = typer.Option(
        DEFAULT_BURST, "--rate-burst", help="API calls each token may make at once, after a quiet while"
    ),
    telemetry_interval: str = typer.Option(
        "1s", "--telemetry-interval", help="how often this machine's GPUs are sampled (0.2s to 15s)"
    ),
    notify_hosts: str = typer.Option(
        "",
        "--notify-hosts",
        help="hosts the workloads' notifications (spec notify.url) may go to, comma-separated, e.g. "
        "hooks.slack.com; * for any; default none: notifications are refused at submit",
    ),
    private_logs: bool = typer.Option(
        False,
        "--private-logs",
        help="a workload's output is read by its owner and admins only (as Slurm's PrivateData); default: "
        "by any token",
    ),
    secrets_key_file: Path | None = typer.Option(
        None,
        "--secrets-key-file",
        envvar="GPUPOOL_SECRETS_KEY_FILE",
        help="the keys that encrypt users' secrets in the store, one per line (the first encrypts); it must "
        "exist; heads sharing one store share it (default $GPUPOOL_HOME/secrets.key, made at the first "
        "start; docs/operations.md#secrets)",
    ),
    forwarded_allow_ips: str = typer.Option(
        "",
        "--forwarded-allow-ips",
        help="addresses (IPs or CIDRs, comma-separated; * for any) of reverse proxies in front of the head "
        "whose X-Forwarded-For/-Proto it believes: the client's address then comes from them (rate limits, "
        "the service proxy's X-Forwarded-For); default none: the peer's own address",
    ),
    standby: bool = typer.Option(
        False,
        "--standby",
        help="when another head acts on the store, wait and take over once it stops (one head acts on a "
        "store at a time; without --standby a second one is refused; docs/operations.md#several-heads)",
    ),
    log_level: str = _LOG_LEVEL,
) -> None:
    """Run the gpupool head: API server, scheduler loop and the executor (local processes or Slurm jobs)."""
    import uvicorn

    from gpupool.api.app import create_app
    from gpupool.api.runtime import BACKENDS, Runtime, ServerSettings
    from gpupool.backends.slurm_commands import SlurmError
    from gpupool.client.client import save_credentials
    from gpupool.control import tokens
    from gpupool.control.accounting import load_prices
    from gpupool.control.notify import allowed_hosts
    from gpupool.control.policy import load_policy
    from gpupool.control.secret_keys import key_path, load_keys
    from gpupool.gpu import GpuUnavailable, parse_selector
    from gpupool.health.thresholds import load_config
    from gpupool.store.db import Store, StoreError, normalise_url
    from gpupool.store.head_lock import HeadLock

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per proxied request and readiness probe
    if logging.getLogger().level > logging.DEBUG:  # a line per migration; gpupool.store says it in one
        logging.getLogger("alembic").setLevel(logging.WARNING)
    url = db or default_db_url()
    home = home_dir()
    # Everything that can refuse the start is checked before anything is created: the flags and the files
    # of the home (scheduling.yaml, health.yaml, prices.yaml, the secrets key file), then the home, the
    # store, the runtime, and the admin token last, so a server that refuses to start has written no token.
    try:
        parse_selector(gpus)  # GpuSelectorError: "--gpus: unknown GPU model ..."; nvml is opened later
        load_policy(home)  # SchedulingConfigError names the file, the field and the fix
        load_config(home)  # HealthConfigError likewise
        load_prices(home)  # PricesConfigError likewise
        keys_at = key_path(home, secrets_key_file)
        if secrets_key_file is not None or keys_at.exists():  # the default one is made by the runtime
            load_keys(keys_at)  # SecretKeyError names the file and the fix
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if usage_weight < 0:
        raise CliError(f"--usage-weight {usage_weight:g}: must be 0 or more (0 turns history off; try 1)")
    half_life = parse_duration(usage_half_life, "--usage-half-life")
    lease = parse_duration(node_lease, "--node-lease")
    if lease < 1:
        raise CliError(
            f"--node-lease {node_lease}: must be at least 1s (agents heartbeat every second); try 10s"
        )
    if backend is None:
        backend = "agent" if gpus == "none" else "local"
    if backend == "agent" and gpus not in ("none", "auto"):
        raise CliError(
            f"--backend agent runs work on agents only, so --gpus {gpus} would not be used; "
            "drop --gpus (or pass --gpus none) and start `gpupool agent --gpus ...` on the nodes"
        )
    if half_life <= 0:
        raise CliError(f"--usage-half-life {usage_half_life}: must be longer than 0 (e.g. 7d)")
    backoff = parse_duration(restart_backoff, "--restart-backoff")
    if backoff < 0 or backoff > 3600:
        raise CliError(f"--restart-backoff {restart_backoff}: must be 0 to 1h (e.g. 10s; 0 turns it off)")
    if not 0 <= rate_limit <= 1_000_000:
        raise CliError(f"--rate-limit {rate_limit:g}: must be 0 (no limit) to 1000000 calls a second; try 50")
    if not 1 <= rate_burst <= 1_000_000:
        raise CliError(f"--rate-burst {rate_burst}: must be 1 to 1000000 calls; try 200")
    sample_every = _telemetry_interval(telemetry_interval)
    trusted = _forwarded_allow_ips(forwarded_allow_ips)
    if backend not in BACKENDS:
        raise CliError(f"--backend {backend}: unknown backend; one of {', '.join(BACKENDS)}")
    _check_listen(host, port, in_use_ok=standby, home=home)  # checked again once a standby takes over
    try:
        normalise_url(url)  # a kind of database gpupool does not use
    except StoreError as exc:
        raise CliError(str(exc)) from exc
    make_private(home)  # its files give the admin token, the secrets' key, users' logs: the server's user's
    if not standby:
        _claim_home(home)
    public = host if host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    server_url = f"http://{public}:{port}"
    # Before the store is opened (and maybe migrated under a head that runs an older version)
    head_lock = HeadLock(url, f"gpupool head pid {os.getpid()} on {_hostname()}, {server_url}")
    _take_head_lock(head_lock, standby)
    if standby:  # may share the home of the head it took over from (docs/operations.md#several-heads)
        _claim_home(home, wait=True)
        _check_listen(host, port)  # again: it may have waited for hours
    try:
        store = Store(url)
    except StoreError as exc:
        raise CliError(str(exc)) from exc
    settings = ServerSettings(
        usage_weight=usage_weight,
        usage_half_life=half_life,
        db_url=url,
        home=home,
        gpus=gpus,
        node_name=node_name or _hostname(),
        backend=backend,
        partition=partition,
        node_lease=lease,
        telemetry_interval=sample_every,
        restart_backoff=backoff,
        rate_limit=rate_limit,
        rate_burst=rate_burst,
        notify_hosts=allowed_hosts(notify_hosts),
        private_logs=private_logs,
        secrets_key_file=secrets_key_file,
    )
    try:
        runtime = Runtime(settings, store=store, head_lock=head_lock)
    except (GpuUnavailable, ValueError, SlurmError) as exc:
        raise CliError(str(exc)) from exc
    token = tokens.reset_admin_token(store) if new_admin_token else tokens.ensure_admin_token(store)
    if token is not None:
        path = save_credentials(server_url, token)
        err_console.print(
            f"[bold]admin token[/bold] (shown once; saved to {path}, mode 0600):\n  {token}", highlight=False
        )
    where = (
        f"gpus {gpus}"
        if backend == "local"
        else f"backend {backend}"
        + (f", partition {partition}" if partition else "")
        + (
            f", node lease {lease:g}s; agents join with `gpupool node join-token create`"
            if backend == "agent"
            else ""
        )
    )
    err_console.print(
        f"gpupool server on {server_url} (store {store.url.split('@')[-1]}, {where}, home {home})",
        highlight=False,
    )
    web = uvicorn.Server(
        uvicorn.Config(
            create_app(runtime),
            host=host,
            port=port,
            log_level=log_level.lower(),
            access_log=False,
            # uvicorn would believe X-Forwarded-For from 127.0.0.1 (or $FORWARDED_ALLOW_IPS) by default:
            # anyone on the head's machine could then pick the address rate limits count under
            proxy_headers=bool(trusted),
            forwarded_allow_ips=trusted or None,
        )
    )
    runtime.on_fenced = lambda: setattr(web, "should_exit", True)  # the API stops with the loops
    web.run()
    if runtime.fenced:  # not a clean stop: a service manager's restart (with --standby) makes it a standby
        raise CliError(f"this head stopped: {runtime.fenced}")


@app.command()
def agent(
    server_url: str = typer.Option(
        ...,
        "--server",
        help="the head's URL, e.g. http://head:8470; with standby heads, each one's, comma-separated (tried "
        "in turn while one does not answer; docs/operations.md#several-heads)",
    ),
    join_token: str | None = typer.Option(
        None, "--join-token", help="from `gpupool node join-token create` (needed at the first join only)"
    ),
    name: str | None = typer.Option(None, "--name", help="this node's name (default: the host name)"),
    gpus: str = typer.Option(
        "nvml",
        "--gpus",
        help="nvml (the default: this machine's GPUs; refused without a driver), none (no GPUs), "
        "sim:8xH100 (simulated), or auto (NVML, else simulated 8xH100)",
    ),
    labels: str = typer.Option("", "--labels", help="node labels, e.g. zone=a,rack=r1"),
    state_dir: str | None = typer.Option(
        None,
        "--state-dir",
        help="where the agent keeps its credential and running work "
        "(default $GPUPOOL_HOME/agent; $GPUPOOL_HOME is ~/.gpupool unless set)",
    ),
    orphan_grace: str = typer.Option(
        "60s", "--orphan-grace", help="stop this node's work after the head has been unreachable this long"
    ),
    address: str | None = typer.Option(
        None, "--address", help="address other nodes reach this one at (default: as the head sees it)"
    ),
    rendezvous_ports: str = typer.Option(
        "29500-29999",
        "--rendezvous-ports",
        help="ports kept free on this node for MASTER_PORT of the multi-node jobs whose rank 0 runs here",
    ),
    telemetry_interval: str = typer.Option(
        "1s",
        "--telemetry-interval",
        help="how often the GPUs are sampled and sent (0.2s to 15s; at most once a heartbeat)",
    ),
    log_level: str = _LOG_LEVEL,
) -> None:
    """Run the node agent: join the head and run the work it places on this node (docs/agents.md)."""
    from gpupool.agent.daemon import Agent, AgentRefused, AgentSettings
    from gpupool.gpu import GpuSelectorError, GpuUnavailable, describe, open_provider

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat otherwise
    parsed: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in labels.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--labels {labels}: {item!r} is not key=value; e.g. --labels zone=a,rack=r1")
        parsed[key.strip()] = value.strip()
    grace = parse_duration(orphan_grace, "--orphan-grace")
    if grace <= 0:  # the first missed heartbeat would kill this node's work
        raise CliError(
            f"--orphan-grace {orphan_grace}: must be longer than 0 (and than the head's --node-lease), "
            "e.g. 60s"
        )
    low, sep, high = rendezvous_ports.partition("-")
    if not (sep and low.strip().isdigit() and high.strip().isdigit() and 1 <= int(low) <= int(high) <= 65535):
        raise CliError(f"--rendezvous-ports {rendezvous_ports}: give a port range LOW-HIGH, e.g. 29500-29999")
    sample_every = _telemetry_interval(telemetry_interval)
    node = name or _hostname()
    try:
        provider = open_provider(gpus, seed=node)
    except GpuSelectorError as exc:  # says "--gpus: ..." itself
        raise CliError(str(exc)) from exc
    except GpuUnavailable as exc:
        # A node daemon never invents GPUs on its own: a GPU machine whose driver broke must not join the
        # pool with simulated ones that real work would be placed on.
        raise CliError(f"--gpus {gpus}: {exc}; on a machine without GPUs give --gpus none") from exc
    settings = AgentSettings(
        servers=_head_urls(server_url),
        state_dir=Path(state_dir).expanduser() if state_dir else home_dir() / "agent",
        name=node,
        join_token=join_token,
        labels=parsed,
        orphan_grace=grace,
        address=address,
        rendezvous_ports=(int(low), int(high)),
        telemetry_interval=sample_every,
    )
    runner = Agent(settings, provider)

    def stop(signum: int, _frame: object) -> None:  # the agent says what runs on, then exits
        signal.signal(signum, signal.SIG_DFL)  # a second one does not wait
        runner.stop(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    err_console.print(
        f"gpupool agent {node} -> {', '.join(settings.servers)} "
        f"(gpus: {describe(provider)}, state {settings.state_dir})",
        highlight=False,
    )
    try:
        runner.run()
    except AgentRefused as exc:
        raise CliError(f"the head refused this agent: {exc}") from exc
    finally:
        runner.close()


_home_lock: Any = None  # the open lock file of this server's home, held for the life of the process


def _head_urls(given: str) -> tuple[str, ...]:
    """`gpupool agent --server`: one head's URL, or several (the active head and its standbys)."""
    import httpx

    urls: list[str] = []
    for part in filter(None, (p.strip() for p in given.split(","))):
        try:
            url = httpx.URL(part)
        except (httpx.InvalidURL, ValueError) as exc:
            raise CliError(
                f"--server {given}: {part!r} is not a URL ({exc}); e.g. http://head:8470"
            ) from None
        if url.port is not None and not 1 <= url.port <= 65535:
            raise CliError(
                f"--server {given}: port {url.port} of {part!r} must be 1 to 65535; e.g. http://head:8470"
            )
        if url.scheme not in ("http", "https") or not url.host or " " in part:
            raise CliError(
                f"--server {given}: {part!r} is not a head's URL; give http://HOST:PORT, e.g. http://head:8470"
            )
        if part.rstrip("/") not in urls:
            urls.append(part.rstrip("/"))
    if not urls:
        raise CliError("--server: give the head's URL, e.g. http://head:8470")
    return tuple(urls)


def _take_head_lock(lock: Any, standby: bool) -> None:
    """Hold the store's head lock (store/head_lock.py), or refuse, or with `standby` wait for it."""
    from gpupool.store.db import StoreError
    from gpupool.store.head_lock import HeadLockHeld

    try:
        lock.acquire()
        return
    except HeadLockHeld as exc:
        holder = exc.holder or "another head"
        state = f"held by {holder}"
        if not standby:
            raise CliError(
                f"another head acts on this store: {holder}. One head acts on a store at a time (two would "
                "schedule, start and settle the same work); stop that one first, or start this one with "
                "--standby to take over when it stops (docs/operations.md#several-heads)"
            ) from None
    except StoreError as exc:
        if not standby:
            raise CliError(str(exc)) from exc
        state = f"out of reach ({exc})"

    def waiting(now: str) -> None:
        err_console.print(f"standby: waits to take over the store, {now}", highlight=False)
        log.info("event=head_standby store=%r", now)

    waiting(state)
    lock.wait(said=waiting, known=state)
    err_console.print("standby: the store is this head's now; taking over", highlight=False)
    log.info("event=head_took_over")


def _claim_home(home: Path, wait: bool = False) -> None:
    """Hold `home/server.lock` (an exclusive flock, dropped by the kernel when the process ends, kill -9
    included), or refuse: a second server on one home rewrote the first one's credentials, read its run
    dirs' exit codes as its own and placed work on GPUs the first one's jobs held. A standby that took the
    store over waits for it (`wait`): it shares the home of the head it follows, whose flock outlives it
    a while on a network filesystem."""
    import fcntl
    import time

    global _home_lock
    path = home / "server.lock"
    said = False
    while True:
        handle = path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            handle.seek(0)
            pid = handle.read().strip() or "unknown"
            handle.close()
        if wait:
            if not said:
                err_console.print(f"standby: waits for the home {home}, held by pid {pid}", highlight=False)
                said = True
            time.sleep(1.0)
            continue
        raise _home_taken(home, pid)
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _home_lock = handle


def _home_taken(home: Path, pid: str) -> CliError:
    return CliError(
        f"another gpupool server (pid {pid}) runs on the home {home}: its run dirs, logs and credentials "
        "are that server's; stop it first, or give this one a home of its own (GPUPOOL_HOME=/path "
        "gpupool server ...), or start this one with --standby to take over from it when it stops "
        "(docs/operations.md#several-heads)"
    )


def _home_holder(home: Path) -> str | None:
    """The pid of the server that holds `home/server.lock` now, or None (no server, no home): a probe
    that creates nothing."""
    import fcntl

    try:
        handle = (home / "server.lock").open("r")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return handle.read().strip() or "unknown"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _check_listen(host: str, port: int, in_use_ok: bool = False, home: Path | None = None) -> None:
    """Refuse, before anything is created, a port out of range and an address this server could not listen
    on (taken by another process, or not this machine's): a probe binds it as uvicorn will, then lets go.
    `in_use_ok`: a standby, which may wait on the port of the head it will take over from, on its machine.
    `home`: this server's; when its port is taken by the server that holds that home, that is said."""
    if not 1 <= port <= 65535:
        raise CliError(f"--port {port}: must be 1 to 65535; e.g. {DEFAULT_PORT}")
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CliError(
            f"--host {host}: not an address of this machine ({exc.strerror}); e.g. 127.0.0.1"
        ) from None
    family, kind, proto, _, address = found[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a closed server's port
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                if in_use_ok:
                    return
                holder = _home_holder(home) if home is not None else None
                if home is not None and holder is not None:  # that of the server on this home: say so
                    raise _home_taken(home, holder) from None
                raise CliError(
                    f"--port {port}: {host}:{port}: address already in use (another gpupool server?); stop "
                    "it or choose another --port"
                ) from None
            raise CliError(f"--host {host} --port {port}: cannot listen there ({exc.strerror})") from None


def _telemetry_interval(text: str) -> float:
    """--telemetry-interval, bounded: the health checks judge only samples under 30 s old."""
    seconds = parse_duration(text, "--telemetry-interval")
    if not 0.2 <= seconds <= 15:
        raise CliError(
            f"--telemetry-interval {text}: between 0.2s and 15s (the health checks judge only samples under "
            "30 s old); e.g. --telemetry-interval 5s"
        )
    return seconds


def _hostname() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def reflow_help(command: Any) -> Any:
    """`command` (a click command or group, as typer.main.get_command builds it) and its subcommands with
    each paragraph of their help on one line: Typer's Rich help keeps a docstring's line breaks, so a
    sentence broke where the source wrapped it rather than where the terminal does. A paragraph that
    starts with \\b (click's "keep as written") is left alone."""
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n")) for p in paragraphs)
    for sub in getattr(command, "commands", {}).values():
        reflow_help(sub)
    return command


def main() -> None:
    """The CLI. A flag or argument a command cannot take (`--gpu-quota two`, `--bogus`) is one `error:` line
    naming it and the command's --help, exit 2 (Click's usage error, as argparse's), not Click's box."""
    usage_error, click_exception = click_class("UsageError"), click_class("ClickException")
    try:
        code = reflow_help(typer.main.get_command(app)).main(prog_name="gpupool", standalone_mode=False)
    except (CliError, GpupoolError, SpecError) as exc:
        print_error(exc)
        sys.exit(1)
    except usage_error as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `gpupool queue` alone: its help, as asked
            exc.show()  # type: ignore[attr-defined]
            sys.exit(getattr(exc, "exit_code", 2))
        ctx = getattr(exc, "ctx", None)
        see = f" (`{ctx.command_path} --help`)" if ctx is not None else ""
        print_error(f"{exc.format_message()}{see}")  # type: ignore[attr-defined]
        sys.exit(2)
    except click_exception as exc:
        print_error(exc.format_message())  # type: ignore[attr-defined]
        sys.exit(getattr(exc, "exit_code", 1))
    except (KeyboardInterrupt, typer.Abort):
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
