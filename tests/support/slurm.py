"""The real Slurm clusters the tests start: the one-node testbed of gpupool.backends.slurm_testbed (the
benchmarks use it too), and a two-node one for gangs and node failures."""

from __future__ import annotations

from pathlib import Path

from gpupool.backends.slurm_testbed import SlurmCluster, _free_port, _which, missing_binaries, stop_child

__all__ = ["SlurmCluster", "TwoNodeCluster", "missing_binaries"]


class TwoNodeCluster(SlurmCluster):
    """Two Slurm nodes on this one machine (two slurmd, each with its own port, spool and `-N` name), each
    with `gpus` GRES GPUs: enough for a two-node gang, and for a node failure that leaves a node up."""

    def __init__(self, base: Path, *, gpus: int = 8, cpus: int = 8, partition: str = "gpu") -> None:
        super().__init__(base, gpus=gpus, cpus=cpus, partition=partition)
        self.nodes = ("gpupool-a", "gpupool-b")  # both on this host (`node`, its short name)

    def _write_config(self) -> None:
        super()._write_config()
        b = self.base
        lines = []
        for line in self.conf.read_text().splitlines():
            key = line.partition("=")[0]
            if key == "SlurmdSpoolDir":
                line = f"SlurmdSpoolDir={b}/spool-%n"
            elif key == "SlurmdPidFile":
                line = f"SlurmdPidFile={b}/slurmd-%n.pid"
            elif key == "SlurmdLogFile":
                line = f"SlurmdLogFile={b}/slurmd-%n.log"
            elif key == "NodeName":
                hardware = line.split(" ", 2)[2]  # CPUs=... RealMemory=... Gres=... State=...
                line = "\n".join(
                    f"NodeName={n} NodeHostname={self.node} NodeAddr=127.0.0.1 Port={_free_port()} {hardware}"
                    for n in self.nodes
                )
            elif key == "PartitionName":
                line = line.replace(
                    f"Nodes={line.split('Nodes=')[1].split()[0]}", "Nodes=" + ",".join(self.nodes)
                )
            lines.append(line)
        self.conf.write_text("\n".join(lines) + "\n")
        devices = f"{b}/dev/nvidia[0-{self.gpus - 1}]"
        (b / "gres.conf").write_text("".join(f"NodeName={n} Name=gpu File={devices}\n" for n in self.nodes))
        for n in self.nodes:
            (b / f"spool-{n}").mkdir(exist_ok=True)

    def start(self, timeout: float = 60.0) -> TwoNodeCluster:
        self.base.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._start_munge()
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-f", str(self.conf)])
        self._wait(lambda: "UP" in self.run("scontrol", "ping", check=False).stdout, timeout)
        for n in self.nodes:
            self._spawn(f"slurmd-{n}", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", n])
        for n in self.nodes:
            self._wait(lambda n=n: "State=" in self._node(n) and "UNKNOWN" not in self._node(n), timeout)
            self.run("scontrol", "update", f"nodename={n}", "state=resume", check=False)
        self._wait(self.idle, timeout)
        return self

    def _node(self, name: str) -> str:
        return self.run("scontrol", "show", "node", name, "-o", check=False).stdout

    def idle(self) -> bool:
        """Both nodes are in service (after a node failure, slurmd's next registration returns it)."""
        return all("State=IDLE" in (line := self._node(n)) and "DRAIN" not in line for n in self.nodes)

    def stop(self) -> None:
        self.cancel_all()
        for name in [n for n in self._pids if n.startswith("slurmd-")]:
            stop_child(self._pids.pop(name))
        super().stop()
