"""`gpupool ui` and `gpupool forward`: the dashboard's address, and a service reached at a local one."""

from __future__ import annotations

import webbrowser
from urllib.parse import quote

import typer

from gpupool.cli import refs
from gpupool.cli.app import app, client
from gpupool.cli.errors import CliError


@app.command()
def ui(open_it: bool = typer.Option(False, "--open", help="open it in this machine's web browser")) -> None:
    """The dashboard's address, with your token after '#' (browsers keep that part to themselves)."""
    c = client()
    c.queues()  # the server answers and takes the token: else its error, with the fix, and no address
    page = f"{c.server.rstrip('/')}/ui"
    url = f"{page}#token={quote(c.token, safe='')}" if c.token else page
    print(url)
    if open_it and not webbrowser.open(url):
        raise CliError("no web browser found here; open the address above in one")


@app.command()
def forward(
    service: str = typer.Argument(..., help="the service's id or name"),
    port: int = typer.Option(8000, "--port", "-p", min=0, max=65535, help="local port; 0: any free one"),
    host: str = typer.Option("127.0.0.1", "--host", help="local address to listen on"),
) -> None:
    """Reach a service at a local address (http://127.0.0.1:8000/), through the head's proxy.

    The proxy gets your token: for a browser, a notebook, or a client that cannot send the token (HTTP
    and WebSockets). Ctrl-C ends it."""
    import socket

    import uvicorn

    from gpupool.client.forward import Forwarder

    c = client()
    workload_id = refs.workload_id(c, service, reading=False)
    w = c.workload(workload_id)  # exists, and the token is good: else the server's error, with the fix
    if w.get("kind") != "service":
        raise CliError(
            f"workload {workload_id} ({w['name']}) is a job; only a service has an endpoint to forward to "
            "(kind: service, or gpupool run --service)"
        )
    if w["state"] in ("succeeded", "failed", "cancelled"):
        raise CliError(
            f"service {w['name']} (workload {workload_id}) has ended ({w['state']}) and serves no more; "
            "submit it again to forward to it"
        )
    access = (w.get("spec") or {}).get("access") or "private"
    if access == "private":  # its owner and admins alone (the proxy's rule): said now, not at each request
        me = c.whoami()
        if me.get("role") != "admin" and me.get("name") != w.get("user"):
            raise CliError(
                f"service {w['name']} (workload {workload_id}) belongs to {w.get('user')} and is private: "
                f"only they or an admin may reach it (your token: {me.get('name')}); its owner can open it "
                "with access: pool (any token of this head) or public"
            )
    try:
        listener = socket.create_server((host, port))
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another with --port") from exc
    bound = listener.getsockname()[1]
    state = w["state"] + ("" if w.get("ready") is not False else ", not ready yet")
    # given by its name, the service is forwarded to by its name: a resubmitted one is reached as well
    by_name = service == w["name"]
    follows = "; by its name, so a resubmitted one too" if by_name else ""
    print(
        f"forwarding http://{host}:{bound}/ to service {w['name']} (workload {workload_id}, {state}"
        f"{follows}) through {c.server}; Ctrl-C to stop",
        flush=True,
    )
    forwarder = Forwarder(c.server, c.token, workload_id, name=w["name"] if by_name else None)
    config = uvicorn.Config(forwarder, log_level="warning")
    uvicorn.Server(config).run(sockets=[listener])
