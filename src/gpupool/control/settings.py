"""The reconcile loop's settings (control/loop.py), shared by its phases."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from gpupool import scheduler
from gpupool.control.restarts import DEFAULT_BASE
from gpupool.control.secret_keys import SecretKeys


@dataclass(frozen=True)
class ControlSettings:
    """Where the head keeps its state, the node it runs on, how its reconcile loop paces and schedules."""

    home: Path
    node_name: str = socket.gethostname()
    node_address: str = "127.0.0.1"
    tick: float = 0.5
    telemetry_interval: float = 1.0
    # Fair share by history: 0 ignores it; 1 halves the over-quota weight of a queue that used twice its
    # share (see scheduler/fairshare.py). Usage decays with this half-life (Slurm's default: 7 days).
    usage_weight: float = 0.0
    usage_half_life: float = 7 * 86400.0
    # Work started again after its own exit (a service; a job retried after a failure) that exited soon after
    # it started waits this long before its next attempt, doubling with each quick exit in a row
    # (control/restarts.py); 0: at once.
    restart_backoff: float = DEFAULT_BASE
    # The scheduling policy; None: $GPUPOOL_HOME/scheduling.yaml, else gpupool's default (control/policy.py).
    policy: scheduler.SchedulerConfig | None = None
    # The keys of users' secrets (control/secret_keys.py); None: $GPUPOOL_HOME/secrets.key, made if absent.
    secret_keys: SecretKeys | None = None
