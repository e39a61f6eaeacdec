"""A real one-node Slurm cluster on loopback (Debian's `slurm-wlm` and `munge`): for trying gpupool's slurm
backend on one machine, and for its tests and benchmark. Needs root (slurmd and munged).

It writes slurm.conf and gres.conf into a directory (eight empty files stand for /dev/nvidia0..7: Slurm
accepts them and accounts eight GPUs), starts munged (unless one already answers), slurmctld and slurmd,
resumes the node, and stops every daemon it started by pid. `SLURM_CONF` points daemons and clients at the
generated file. `python -m gpupool.backends.slurm_testbed DIR` starts one and prints how to use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
MUNGE_KEY = Path("/etc/munge/munge.key")


def missing_binaries() -> list[str]:
    """The Slurm and munge programs this machine lacks (sbin included, where Debian puts the daemons)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [name for name in BINARIES if shutil.which(name, path=path) is None]


def _which(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError(f"{name} not found: apt-get install slurm-wlm munge")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SlurmCluster:
    """slurmctld + slurmd for one node named after `hostname -s`, with `gpus` GPUs and `cpus` CPUs."""

    def __init__(
        self,
        base: Path,
        *,
        gpus: int = 8,
        cpus: int = 8,
        partition: str = "gpu",
        options: tuple[str, ...] = (),
        max_time: str = "INFINITE",
    ) -> None:
        self.base = base
        self.gpus = gpus
        self.cpus = cpus
        self.partition = partition
        self.options = options  # more slurm.conf lines (keys not set above), e.g. "Epilog=/bin/true"
        self.max_time = max_time  # the partition's MaxTime, as slurm.conf writes it ("1-00:00:00")
        self.node = socket.gethostname().split(".")[0]
        self.conf = base / "slurm.conf"
        self._pids: dict[str, int] = {}

    @property
    def env(self) -> dict[str, str]:
        """The environment under which Slurm's client commands reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    # -- start ----------------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        self.base.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._start_munge()
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0, timeout)
        self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(lambda: "slurmd" in self._node_line() or self._node_registered(), timeout)
        self.run("scontrol", "update", f"nodename={self.node}", "state=resume", check=False)
        self._wait(self._node_idle, timeout)
        return self

    def _write_config(self) -> None:
        for sub in ("state", "spool", "dev"):
            (self.base / sub).mkdir(exist_ok=True)
        for index in range(self.gpus):
            (self.base / "dev" / f"nvidia{index}").touch()
        memory_mb = int(psutil.virtual_memory().total // (1 << 20))
        b = self.base
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=gpupooltest",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "AuthType=auth/munge",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={b}/state",
                    f"SlurmdSpoolDir={b}/spool",
                    f"SlurmctldPidFile={b}/slurmctld.pid",
                    f"SlurmdPidFile={b}/slurmd.pid",
                    f"SlurmctldLogFile={b}/slurmctld.log",
                    f"SlurmdLogFile={b}/slurmd.log",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "GresTypes=gpu",
                    "ReturnToService=2",
                    "SlurmdParameters=config_overrides",
                    "MpiDefault=none",
                    "SwitchType=switch/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MailProg=/bin/true",
                    "KillWait=5",
                    *self.options,
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={memory_mb} "
                    f"Gres=gpu:{self.gpus} State=UNKNOWN",
                    f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime={self.max_time} "
                    "State=UP",
                    "",
                ]
            )
        )
        last = self.gpus - 1
        (self.base / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu File={self.base}/dev/nvidia[0-{last}]\n"
        )

    def _start_munge(self) -> None:
        if MUNGE_SOCKET.exists() and self._munge_answers():
            return
        if not MUNGE_KEY.exists():
            subprocess.run([_which("mungekey"), "-c"], check=True, capture_output=True)
            shutil.chown(MUNGE_KEY, user="munge", group="munge")
            MUNGE_KEY.chmod(0o400)
        run_dir = MUNGE_SOCKET.parent
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, user="munge", group="munge")
        # As the munge user, and without a wrapper in between, so that its pid is munged's own.
        as_munge = {"user": "munge", "group": "munge", "extra_groups": []} if os.geteuid() == 0 else {}
        self._spawn("munged", [_which("munged"), "--foreground"], **as_munge)
        self._wait(self._munge_answers, 15)

    def _munge_answers(self) -> bool:
        munge = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
        if munge.returncode != 0:
            return False
        return (
            subprocess.run(["unmunge"], input=munge.stdout, capture_output=True, timeout=10).returncode == 0
        )

    def _spawn(self, name: str, argv: list[str], **credentials: Any) -> None:
        log = open(self.base / f"{name}.out", "ab")  # noqa: SIM115 - lives as long as the daemon
        proc = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **credentials
        )
        self._pids[name] = proc.pid
        time.sleep(0.1)
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at once ({proc.returncode}):\n{self.logs()}")

    def _node_line(self) -> str:
        return self.run("scontrol", "show", "node", self.node, "-o", check=False).stdout

    def _node_registered(self) -> bool:
        line = self._node_line()
        return "State=" in line and "UNKNOWN" not in line and "NOT_RESPONDING" not in line

    def _node_idle(self) -> bool:
        line = self._node_line()
        return "State=IDLE" in line and "DRAIN" not in line

    def _wait(self, condition: object, timeout: float) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                if callable(condition) and condition():
                    return
            except (subprocess.SubprocessError, OSError):
                pass
            if time.time() > deadline:
                raise RuntimeError(f"Slurm did not come up in {timeout}s:\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out", "munged.out"):
            path = self.base / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(parts)

    # -- helpers for tests ----------------------------------------------------------------------------

    def sbatch(self, *args: str) -> str:
        """Submit a job with plain sbatch, as a user who bypasses gpupool would; returns its job id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return ""

    def node_fields(self) -> dict[str, str]:
        fields: dict[str, str] = {}
        key = ""
        for token in self._node_line().split():
            if "=" in token:
                key, value = token.split("=", 1)
                fields[key] = value
            elif key:
                fields[key] += " " + token
        return fields

    def cancel_all(self) -> None:
        self.run("scancel", "--partition", self.partition, check=False)

    # -- stop -----------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop what we started, by pid: slurmd, then slurmctld, then munged (if we started it)."""
        self.cancel_all()
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self._pids.pop(name, None)
            if pid is not None:
                stop_child(pid)


def stop_child(pid: int, wait: float = 10.0) -> None:
    """SIGTERM a daemon this process started, wait up to `wait` seconds for it, then SIGKILL it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + wait
    while time.time() < deadline:
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if finished:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def main() -> None:
    """Start a testbed in DIR (default /tmp/gpupool-slurm) and keep it up until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gpupool.backends.slurm_testbed",
        description="A real one-node Slurm (munged, slurmctld, slurmd) on loopback, with simulated GPUs, "
        "kept up until Ctrl-C: to try `gpupool server --backend slurm` (docs/slurm.md).",
    )
    parser.add_argument(
        "dir", nargs="?", default="/tmp/gpupool-slurm", help="where its config, state and logs go"
    )
    base = Path(parser.parse_args().dir)
    cluster = SlurmCluster(base).start()
    print(
        f"Slurm up: node {cluster.node}, partition {cluster.partition}, {cluster.gpus} GPUs.\n"
        f"  export SLURM_CONF={cluster.conf}\n"
        f"  gpupool server --backend slurm --partition {cluster.partition}\n"
        "Ctrl-C stops the daemons.",
        flush=True,
    )

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
