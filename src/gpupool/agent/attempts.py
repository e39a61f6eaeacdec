"""The attempt ranks one node runs for the head, kept in the agent's state dir so a restart re-adopts them.

Each rank lives in STATE_DIR/attempts/<attempt>.<rank>/: `rank.json` (its id, rank, fencing token and
GPUs; mode 0600: the token is a secret), the local backend's `pid` and `exit_code` files, `output.log`, and
`shipped` (how much of the log the head has acknowledged). Processes are started by the local backend (a
/bin/sh shim per rank in its own process group, which writes the exit status to disk), exactly as on a
single-machine pool.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.backends.base import Handle, Launch, LaunchError, Phase, recorded_end
from gpupool.backends.local import LocalBackend
from gpupool.environment import shared_environment

log = logging.getLogger("gpupool.agent")

LOG_CHUNK_MAX = 256 * 1024  # bytes of one rank's output per heartbeat
Key = tuple[int, int]  # (attempt id, rank)


@dataclass
class RankProcess:
    attempt_id: int
    rank: int
    token: str
    run_dir: Path
    handle: Handle | None = None
    exit_code: int | None = None
    vanished: str = ""
    # Why it ended, where the exit code does not say: "cannot start rank 0: workdir ... does not exist on
    # this node" (exit code 127); reported with the exit, kept in RUN_DIR/detail.
    detail: str = ""
    # Whose fault the end was, as the head's retry policy reads it: "failure" (the work's), or
    # "node-failure" where the agent itself killed the rank (the head was unreachable for the orphan grace).
    cause: str = "failure"
    signal_sent: int = 0
    shipped: int = 0
    gpu_indices: tuple[int, ...] = ()

    @property
    def running(self) -> bool:
        return self.handle is not None and self.exit_code is None and not self.vanished


class NodeAttempts:
    def __init__(self, state_dir: Path, on_exit: Callable[[], None] | None = None) -> None:
        self.root = state_dir / "attempts"
        self.root.mkdir(parents=True, exist_ok=True)
        self.local = LocalBackend(on_exit=on_exit)
        self._lock = threading.RLock()
        self._ranks: dict[Key, RankProcess] = {}

    # -- restart: re-adopt what the state dir says runs ---------------------------------------------------

    def load(self) -> None:
        for run_dir in sorted(self.root.iterdir()):
            try:
                meta = json.loads((run_dir / "rank.json").read_text())
            except (OSError, ValueError):
                shutil.rmtree(run_dir, ignore_errors=True)  # a start that never finished writing
                continue
            proc = RankProcess(
                int(meta["attempt_id"]),
                int(meta["rank"]),
                str(meta["token"]),
                run_dir,
                gpu_indices=tuple(int(i) for i in meta.get("gpu_indices", [])),
            )
            with contextlib.suppress(OSError):  # written 0644 before 2026-12: its fencing token is private
                (run_dir / "rank.json").chmod(0o600)
            proc.handle = self.local.find(run_dir)
            proc.shipped = _read_int(run_dir / "shipped") or 0
            proc.signal_sent = _read_int(run_dir / "signal_sent") or 0
            if proc.handle is None:
                code = _read_int(run_dir / "exit_code")
                if code is not None:
                    proc.exit_code = code
                    with contextlib.suppress(OSError):
                        proc.detail = (run_dir / "detail").read_text().strip()
                    with contextlib.suppress(OSError):
                        proc.cause = (run_dir / "cause").read_text().strip() or proc.cause
                else:
                    proc.vanished = "the agent restarted before the process was recorded"
            self._ranks[(proc.attempt_id, proc.rank)] = proc
            state = "running" if proc.running else "ended"
            log.info("event=rank_readopted attempt=%d rank=%d state=%s", proc.attempt_id, proc.rank, state)

    # -- what the head hears ---------------------------------------------------------------------------

    def report(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Each rank's state, and the next chunk of each rank's log the head has not acknowledged."""
        attempts, logs = [], []
        with self._lock:
            procs = list(self._ranks.values())
        for proc in procs:
            self._poll(proc)
            chunk = _log_chunk(proc.run_dir / "output.log", proc.shipped)
            # An end is reported once the whole log has gone with it (the head settles on the report).
            whole = len(chunk) < LOG_CHUNK_MAX
            item: dict[str, Any] = {"attempt_id": proc.attempt_id, "rank": proc.rank, "token": proc.token}
            if not whole and not proc.running:
                item.update(state="running")
            elif proc.exit_code is not None:
                item.update(state="exited", exit_code=proc.exit_code)
                ended = recorded_end(proc.run_dir)
                if ended is not None:  # how long ago, not when: the head's clock may differ from this one's
                    item["ended_ago"] = round(max(0.0, time.time() - ended), 3)
                if proc.detail:
                    item["detail"] = proc.detail
                if proc.cause != "failure":
                    item["cause"] = proc.cause
            elif proc.vanished:
                item.update(state="vanished", detail=proc.vanished)
            else:
                item.update(state="running", pid=proc.handle.pid if proc.handle else None)
            attempts.append(item)
            if chunk:
                logs.append(
                    {
                        "attempt_id": proc.attempt_id,
                        "rank": proc.rank,
                        "token": proc.token,
                        "offset": proc.shipped,
                        "data": base64.b64encode(chunk).decode(),
                    }
                )
        return attempts, logs

    def _poll(self, proc: RankProcess) -> None:
        if not proc.running or proc.handle is None:
            return
        status = self.local.status(proc.handle, proc.run_dir)
        if status.phase is Phase.EXITED:
            proc.exit_code = status.exit_code
            self.local.cleanup(proc.handle)
        elif status.phase is Phase.VANISHED:
            proc.vanished = status.detail

    def pids_by_gpu(self) -> dict[int, list[int]]:
        with self._lock:
            held: dict[int, list[int]] = {}
            for proc in self._ranks.values():
                if proc.running and proc.handle is not None:
                    for index in proc.gpu_indices:
                        held.setdefault(index, []).append(proc.handle.pid)
            return held

    # -- what the head wants ---------------------------------------------------------------------------

    def apply(self, answer: dict[str, Any]) -> None:
        """Make this node run exactly what the head lists (level-triggered)."""
        desired = {(int(e["attempt_id"]), int(e["rank"])): e for e in answer.get("attempts") or []}
        with self._lock:
            for key, proc in list(self._ranks.items()):
                entry = desired.get(key)
                if entry is None or entry.get("token") != proc.token:
                    self._drop(proc, "fenced" if proc.running else "settled")
            for key, entry in desired.items():
                wanted = self._ranks.get(key)
                if wanted is None and entry.get("launch") is not None:
                    wanted = self._start(key, entry)
                if wanted is not None:
                    self._signal(wanted, int(entry.get("signal") or 0))
            for name, size in (answer.get("logs") or {}).items():
                attempt_id, _, rank = name.partition(":")
                shipped = self._ranks.get((int(attempt_id), int(rank)))
                if shipped is not None and int(size) > shipped.shipped:
                    shipped.shipped = int(size)
                    with contextlib.suppress(OSError):  # kept for a restart only (the head drops a repeat)
                        _write(shipped.run_dir / "shipped", str(shipped.shipped))

    def _start(self, key: Key, entry: dict[str, Any]) -> RankProcess:
        launch = entry["launch"]
        run_dir = self.root / f"{key[0]}.{key[1]}"
        env = shared_environment(os.environ)  # not the agent's own credentials (gpupool/environment.py)
        env.update({str(k): str(v) for k, v in (launch.get("env") or {}).items()})
        devices = env.get("CUDA_VISIBLE_DEVICES", "")
        indices = tuple(int(i) for i in devices.split(",") if i.strip().isdigit())
        proc = RankProcess(key[0], key[1], str(entry["token"]), run_dir, gpu_indices=indices)
        self._ranks[key] = proc
        meta = {"attempt_id": key[0], "rank": key[1], "token": entry["token"], "gpu_indices": list(indices)}
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            _write(run_dir / "rank.json", json.dumps(meta))
        except OSError as exc:  # a full or broken disk: the node's fault, not the work's
            proc.exit_code, proc.cause = 127, "node-failure"
            proc.detail = (
                f"cannot start rank {key[1]}: the agent cannot write its state dir {self.root}: {exc}"
            )
            log.error("event=rank_start_failed attempt=%d rank=%d error=%r", key[0], key[1], str(exc))
            return proc
        checkpoint = env.get("GPUPOOL_CHECKPOINT_DIR")
        if checkpoint:  # the head made it on its own filesystem, which this node may not share
            try:
                Path(checkpoint).mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # the job says where it cannot write; the log says why
                log.warning("event=checkpoint_dir_unavailable attempt=%d error=%s", key[0], exc)
        try:
            if key[1] == 0 and int(env.get("GPUPOOL_NUM_NODES") or 1) > 1:
                _check_rendezvous_port(int(env.get("MASTER_PORT") or 0), "MASTER_PORT")
            if key[1] == 0 and env.get("GPUPOOL_PORT", "").isdigit():
                _check_rendezvous_port(int(env["GPUPOOL_PORT"]), "GPUPOOL_PORT")
            proc.handle = self.local.start(
                Launch(
                    attempt_id=key[0],
                    workload_id=int(launch["workload_id"]),
                    attempt_number=int(launch["attempt_number"]),
                    script=str(launch["script"]),
                    env=env,
                    workdir=Path(launch["workdir"]),
                    run_dir=run_dir,
                    log_path=run_dir / "output.log",
                )
            )
        except LaunchError as exc:
            message = f"cannot start rank {key[1]}: {exc}\n"
            proc.exit_code, proc.detail = 127, message.strip()
            if isinstance(exc, PortTaken):  # retried by the default policy, as a node failure
                proc.cause = "node-failure"
            with contextlib.suppress(OSError):  # said in the report whether or not the disk takes it
                with open(run_dir / "output.log", "a") as fh:
                    fh.write(message)
                _write(run_dir / "detail", message)
                if proc.cause != "failure":
                    _write(run_dir / "cause", proc.cause)
                _write(run_dir / "exit_code", "127")
            log.warning("event=rank_start_failed attempt=%d rank=%d error=%r", key[0], key[1], str(exc))
            return proc
        log.info(
            "event=rank_started attempt=%d rank=%d workload=%s pid=%d",
            key[0], key[1], launch["workload_id"], proc.handle.pid,
        )  # fmt: skip
        return proc

    def _signal(self, proc: RankProcess, level: int) -> None:
        """Send the rank the signal the head asks for, once: SIGTERM, then SIGKILL after the grace period
        (signal numbers are no order: SIGKILL is 9, SIGTERM 15); nothing after SIGKILL."""
        if level in (0, proc.signal_sent) or proc.signal_sent == signal.SIGKILL:
            return
        if not proc.running or proc.handle is None:
            return
        self.local.signal(proc.handle, level)
        proc.signal_sent = level
        with contextlib.suppress(OSError):  # kept for a restart only: a signal sent again does no harm
            _write(proc.run_dir / "signal_sent", str(level))
        log.info("event=rank_signalled attempt=%d rank=%d signal=%d", proc.attempt_id, proc.rank, level)

    def _drop(self, proc: RankProcess, why: str) -> None:
        """Kill a rank the head no longer lists (moved elsewhere, or settled) and forget it."""
        if proc.running and proc.handle is not None:
            self.local.cleanup(proc.handle)  # SIGKILL to its process group: it must not run twice
            log.warning(
                "event=attempt_fenced attempt=%d rank=%d pid=%d reason=%r",
                proc.attempt_id, proc.rank, proc.handle.pid,
                "the head no longer lists this attempt with this fencing token (it was moved)",
            )  # fmt: skip
        elif why == "settled":
            log.info("event=rank_forgotten attempt=%d rank=%d", proc.attempt_id, proc.rank)
        self._ranks.pop((proc.attempt_id, proc.rank), None)
        shutil.rmtree(proc.run_dir, ignore_errors=True)

    def stop_all(self, why: str) -> int:
        """Kill every running rank (orphaned: the head was unreachable for the orphan grace); their exit
        statuses stay, to be reported when the head answers again, with `why` and the cause node-failure:
        the work did not fail, its node lost the head, and the head requeues it as after a lost node."""
        stopped = 0
        with self._lock:
            for proc in self._ranks.values():
                if proc.running and proc.handle is not None:
                    proc.detail, proc.cause = f"stopped by its node's agent: {why}", "node-failure"
                    with contextlib.suppress(OSError):  # said before the kill: its exit is reported with it
                        _write(proc.run_dir / "detail", proc.detail)
                        _write(proc.run_dir / "cause", proc.cause)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.handle.pid, signal.SIGKILL)
                    stopped += 1
                    log.warning(
                        "event=rank_orphan_stopped attempt=%d rank=%d why=%r", proc.attempt_id, proc.rank, why
                    )
        return stopped

    def running_count(self) -> int:
        """Ranks whose process runs, each looked at now (one may have ended since the last report)."""
        with self._lock:
            procs = list(self._ranks.values())
        for proc in procs:
            self._poll(proc)
        return sum(1 for p in procs if p.running)


def _log_chunk(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(LOG_CHUNK_MAX)
    except OSError:
        return b""


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _write(path: Path, text: str) -> None:
    """Replace `path` whole, as a file of its user's only (rank.json holds the attempt's fencing token)."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


class PortTaken(LaunchError):
    """A rendezvous port of this node's range held by another program: the node's fault, not the work's."""


def _check_rendezvous_port(port: int, variable: str) -> None:
    """Rank 0 of a gang listens on MASTER_PORT, a service on GPUPOOL_PORT, both from the rendezvous range:
    fail its start with the fix when another program holds the port, as a node failure (the default retry
    policy tries the workload again, and the head hands the next port of the range)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            raise PortTaken(
                f"rendezvous port {port} ({variable}) is in use on this node ({exc.strerror}); keep the "
                "agent's --rendezvous-ports range free for gpupool's multi-node jobs and services"
            ) from exc
