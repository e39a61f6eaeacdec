"""Slurm's client commands (sbatch, squeue, scontrol, scancel) run and their output parsed, and the one
call of Slurm's C library (libslurm) that no command offers.

Only the one-line (`-o`) and `squeue -o FORMAT` outputs are read: they are stable across Slurm versions
from 20.11 on and need no JSON plugin on the head.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
import re
import select
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

log = logging.getLogger("gpupool.slurm")

TOOLS = ("sbatch", "squeue", "scontrol", "scancel")
COMMAND_TIMEOUT = 30.0  # seconds; slurmctld answers in milliseconds unless it is down

# GPUPOOL_SLURM_LIBRARY: the libslurm to load (a path), or "none" to do without it; unset, it is looked up.
LIBRARY_VARIABLE = "GPUPOOL_SLURM_LIBRARY"

# libslurm's slurm_complete_job (what salloc calls when its shell exits) ends a running job's allocation
# with an exit code, as the job's own end would (COMPLETED, or FAILED with that code). It runs in a child
# process, so that the library's global symbols and threads stay out of the head: one line in
# ("<job id> <exit code>"), one line out ("ok", or "error <why>").
LIBRARY_CHILD = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # its plugins (auth/munge) link against it
if hasattr(lib, "slurm_init"):
    lib.slurm_init(None)  # slurm.conf from SLURM_CONF, or Slurm's default place
lib.slurm_complete_job.argtypes = (ctypes.c_uint32, ctypes.c_uint32)
lib.slurm_strerror.restype = ctypes.c_char_p
lib.slurm_strerror.argtypes = (ctypes.c_int,)
print("ready", flush=True)
for line in sys.stdin:
    job_id, code = line.split()
    if lib.slurm_complete_job(int(job_id), (int(code) & 0xFF) << 8) == 0:  # a wait status: exited, code
        print("ok", flush=True)
    else:
        print("error", lib.slurm_strerror(lib.slurm_get_errno()).decode(errors="replace"), flush=True)
"""

# squeue's fields, "|"-separated; the job name goes last because it may contain "|".
SQUEUE_FORMAT = "%A|%T|%D|%C|%b|%u|%S|%N|%r|%j"
# How Slurm writes "no time limit" (MaxTime, TimeLimit; INFINITE in slurm.conf).
NO_TIME_LIMIT = frozenset({"UNLIMITED", "INFINITE"})


class SlurmError(RuntimeError):
    """A Slurm command failed or Slurm is not reachable; the message names the command and the fix."""


class SlurmUnreachable(SlurmError):
    """slurmctld did not take the request: it could not be contacted (nothing was done)."""


class SlurmTimeout(SlurmUnreachable):
    """A command got no answer in time: slurmctld may have done what it was asked (an sbatch accepted)."""


# What Slurm's commands print when they could not reach slurmctld at all, and when they gave up waiting
# for its answer (the request may have been carried out).
UNREACHABLE = ("Unable to contact slurm controller", "connect failure", "Connection refused")
NO_ANSWER = ("Socket timed out", "Zero Bytes were transmitted or received")


@dataclass(frozen=True, slots=True)
class JobRow:
    """One line of `squeue`: a job that is pending, running or completing."""

    job_id: str
    state: str
    num_nodes: int
    cpus: int
    tres_per_node: str
    user: str
    start_time: float | None
    nodes: tuple[str, ...]
    reason: str
    name: str


def missing_tools(path: str | None = None) -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool, path=path) is None]


class SlurmCommands:
    """Runs Slurm's client tools with the head's environment (SLURM_CONF, munge socket)."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = COMMAND_TIMEOUT) -> None:
        self.env = dict(os.environ if env is None else env)
        self.timeout = timeout
        self.calls: Counter[str] = Counter()  # commands run, by name ("squeue", "sbatch", ...)
        self._library: SlurmLibrary | None = None  # started at the first complete_job
        self._library_failed = False
        self._library_lock = threading.Lock()

    def run(
        self,
        *argv: str,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run one command; raises SlurmTimeout when it does not answer in time (with what it printed on
        stderr, which names the cause where it is not slurmctld: a bad SLURM_CONF, munged), and, with
        `check`, SlurmUnreachable or SlurmError when it fails."""
        self.calls[argv[0]] += 1
        limit = self.timeout if timeout is None else timeout
        try:
            result = subprocess.run(
                list(argv),
                env=dict(env) if env is not None else self.env,
                capture_output=True,
                text=True,
                timeout=limit,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            raise SlurmError(
                f"{argv[0]} not found on PATH: install Slurm's client tools (Debian: apt-get install "
                "slurm-client munge) on the gpupool head"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            said = _last_line(exc.stderr)
            if said:
                raise SlurmTimeout(f"{argv[0]} did not answer in {limit:g}s; it said: {said}") from exc
            raise SlurmTimeout(f"{argv[0]} did not answer in {limit:g}s: is slurmctld up?") from exc
        if check and result.returncode != 0:
            said = (
                _last_line(result.stderr) or _last_line(result.stdout) or f"exit status {result.returncode}"
            )
            message = f"{' '.join(argv[:3])} failed: {said}"
            if any(text in said for text in NO_ANSWER):
                raise SlurmTimeout(message)
            if any(text in said for text in UNREACHABLE):
                raise SlurmUnreachable(message)
            raise SlurmError(message)
        return result

    # -- reading ------------------------------------------------------------------------------------

    def ping(self) -> None:
        conf = self.env.get("SLURM_CONF", "")
        if conf and not Path(conf).is_file():  # scontrol would retry reading it for 60 s before failing
            raise SlurmError(
                f"SLURM_CONF={conf}: no such file; point SLURM_CONF at the cluster's slurm.conf, or unset it "
                "to use /etc/slurm/slurm.conf or configless Slurm"
            )
        out = self.run("scontrol", "ping", check=False)
        if "UP" not in out.stdout:
            detail = (out.stderr or out.stdout).strip() or "no answer"
            raise SlurmError(
                f"slurmctld is not reachable ({detail}); check SLURM_CONF and that munged runs on the head"
            )

    def nodes(self) -> list[dict[str, str]]:
        out = self.run("scontrol", "show", "node", "-o").stdout
        return [parse_record(line, reason_last=True) for line in out.splitlines() if line.strip()]

    def partitions(self) -> list[dict[str, str]]:
        out = self.run("scontrol", "show", "partition", "-o").stdout
        return [parse_record(line) for line in out.splitlines() if line.strip()]

    def jobs(self) -> list[JobRow]:
        """Every job slurmctld holds as pending, running or completing (all users, all partitions)."""
        out = self.run("squeue", "-h", "-o", SQUEUE_FORMAT).stdout
        return [row for line in out.splitlines() if (row := parse_squeue_line(line)) is not None]

    def job(self, job_id: str) -> dict[str, str] | None:
        """`scontrol show job` for one job, or None when slurmctld no longer knows it."""
        text = self.job_text(job_id)
        return parse_record(text.splitlines()[0]) if text else None

    def job_text(self, job_id: str, *, detail: bool = False) -> str:
        """The raw one-line record (with `-d`: per-node CPU and GRES indices); "" for an unknown job."""
        argv = ["scontrol", "show", "job", "-o", *(["-d"] if detail else []), job_id]
        out = self.run(*argv, check=False)
        if "JobId=" in out.stdout:
            return out.stdout
        if out.returncode != 0 and "Invalid job id" not in out.stderr + out.stdout:
            raise SlurmError(f"scontrol show job {job_id} failed: {out.stderr.strip()}")
        return ""

    def job_ids_named(self, name: str, *, timeout: float | None = None) -> list[str]:
        out = self.run("squeue", "-h", "-n", name, "-o", "%A", timeout=timeout).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    # -- acting -------------------------------------------------------------------------------------

    def sbatch(self, args: list[str], env: Mapping[str, str]) -> str:
        out = self.run("sbatch", "--parsable", *args, env=env)
        return out.stdout.strip().split(";")[0]

    def scancel(
        self,
        job_id: str,
        *,
        signal_name: str | None = None,
        full: bool = False,
        check: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Cancel (or, with `signal_name`, signal) a job: with `full`, its batch script too; else, for a
        signal, only its steps (what `srun` started)."""
        argv = ["scancel"]
        if signal_name:
            argv.append(f"--signal={signal_name}")
        if full:
            argv.append("--full")
        self.run(*argv, job_id, check=check, timeout=timeout)

    def update_node(self, name: str, state: str, reason: str | None = None) -> None:
        argv = ["scontrol", "update", f"nodename={name}", f"state={state}"]
        if reason is not None:
            argv.append(f"reason={reason}")
        self.run(*argv)

    def update_time_limit(self, job_id: str, time_limit: str) -> None:
        """`scontrol update JobId=... TimeLimit=...` (only operators and SlurmUser may raise one, unless
        slurm.conf says `SlurmctldParameters=allow_user_incr_time`)."""
        self.run("scontrol", "update", f"JobId={job_id}", f"TimeLimit={time_limit}")

    def complete_job(self, job_id: str, exit_code: int) -> bool:
        """End a running job's allocation with its exit code, through libslurm; False when libslurm is
        not available here or slurmctld refused (the job then ends by itself)."""
        with self._library_lock:
            if not self._load_library():
                return False
            assert self._library is not None
            self.calls["slurm_complete_job"] += 1
            try:
                error = self._library.complete_job(job_id, exit_code)
            except SlurmError as exc:
                log.warning("event=slurm_library_failed job=%s error=%r", job_id, str(exc))
                self._library.close()
                self._library, self._library_failed = None, True
                return False
        if error:
            log.info("event=slurm_complete_job_refused job=%s error=%r", job_id, error)
        return not error

    def load_library(self) -> bool:
        """Start the libslurm child now (it takes a moment) rather than at the first complete_job."""
        with self._library_lock:
            return self._load_library()

    def _load_library(self) -> bool:
        if self._library is None and not self._library_failed:
            path = find_libslurm(self.env)
            try:
                self._library = SlurmLibrary(path, self.env, self.timeout) if path else None
            except SlurmError as exc:
                log.warning("event=slurm_library_unavailable path=%s error=%r", path, str(exc))
            self._library_failed = self._library is None
            log.info("event=slurm_library path=%s loaded=%s", path or "none", self._library is not None)
        return self._library is not None

    def close(self) -> None:
        with self._library_lock:
            if self._library is not None:
                self._library.close()
                self._library = None


def find_libslurm(env: Mapping[str, str]) -> str | None:
    """The libslurm to load: GPUPOOL_SLURM_LIBRARY, else the public libslurm.so.N (Debian: libslurm38,
    RHEL: slurm), else the libslurmfull.so that Slurm's own commands use (Debian: slurm-client)."""
    chosen = env.get(LIBRARY_VARIABLE, "").strip()
    if chosen:
        return None if chosen == "none" else chosen
    found = ctypes.util.find_library("slurm")
    if found:
        return found
    sbatch = shutil.which("sbatch", path=env.get("PATH"))
    if sbatch is None:
        return None
    prefix = Path(os.path.realpath(sbatch)).parent.parent
    for pattern in ("lib*/slurm*/libslurmfull.so", "lib*/*/slurm*/libslurmfull.so"):
        for path in sorted(prefix.glob(pattern)):
            return str(path)
    return None


class SlurmLibrary:
    """A child process that calls libslurm (LIBRARY_CHILD) for the head."""

    def __init__(self, path: str, env: Mapping[str, str], timeout: float) -> None:
        self.timeout = timeout
        self._proc = subprocess.Popen(
            [sys.executable, "-c", LIBRARY_CHILD, path],
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        try:
            answer = self._answer()
        except SlurmError as exc:
            self.close()
            raise SlurmError(f"libslurm at {path} did not load: {exc}") from exc
        if answer != "ready":
            self.close()
            raise SlurmError(f"libslurm at {path} did not load: {answer}")

    def complete_job(self, job_id: str, exit_code: int) -> str:
        """ "" when slurmctld took it, else why not."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(f"{int(job_id)} {int(exit_code)}\n")
            self._proc.stdin.flush()
        except (OSError, ValueError) as exc:
            raise SlurmError(f"the libslurm child is gone: {exc}") from exc
        answer = self._answer()
        if answer == "ok":
            return ""
        if answer.startswith("error"):
            return answer.removeprefix("error").strip() or "refused"
        raise SlurmError(f"the libslurm child answered {answer!r}")

    def _answer(self) -> str:
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], self.timeout)
        line = self._proc.stdout.readline() if ready else ""
        if line:
            return line.strip()
        if self._proc.poll() is None:
            raise SlurmError(f"the libslurm child did not answer in {self.timeout:g}s")
        assert self._proc.stderr is not None
        lines = self._proc.stderr.read().strip().splitlines()
        raise SlurmError(lines[-1] if lines else f"the libslurm child exited ({self._proc.returncode})")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


# -- parsing ----------------------------------------------------------------------------------------------


def parse_record(line: str, *, reason_last: bool = False) -> dict[str, str]:
    """One `scontrol show ... -o` line as a dict; a token without `=` continues the previous value
    (`OS=Linux 6.1 #1 SMP`). With `reason_last` (node records, whose free-text `Reason` comes last), the
    `Reason` keeps everything after it; a job's `Reason` is one word and more fields follow it."""
    record: dict[str, str] = {}
    text = line.strip()
    reason_at = text.find(" Reason=") if reason_last else -1
    if reason_at >= 0:
        record["Reason"] = text[reason_at + len(" Reason=") :]
        text = text[:reason_at]
    key = ""
    for token in text.split(" "):
        if not token:
            continue
        name, sep, value = token.partition("=")
        if sep and re.fullmatch(r"[A-Za-z_:/]+", name):
            key = name
            record[key] = value
        elif key:
            record[key] += " " + token
    return record


def parse_squeue_line(line: str) -> JobRow | None:
    parts = line.split("|", 9)
    if len(parts) < 10:
        return None
    job_id, state, num_nodes, cpus, tres, user, start, nodelist, reason, name = parts
    return JobRow(
        job_id=job_id.strip(),
        state=state.strip(),
        num_nodes=_int(num_nodes, 1),
        cpus=_int(cpus, 0),
        tres_per_node=tres.strip(),
        user=user.strip(),
        start_time=parse_time(start),
        nodes=expand_hostlist(nodelist.strip()),
        reason=reason.strip(),
        name=name,
    )


def parse_time_limit(text: str) -> int | None:
    """A Slurm time limit in whole minutes, read as Slurm reads one (seconds round up to the next minute):
    "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes" or
    "days-hours:minutes:seconds"; None for no limit (UNLIMITED, INFINITE). ValueError for anything else
    (NONE, NOT_SET, N/A: no limit was set, which is not "no limit")."""
    text = text.strip()
    if text.upper() in NO_TIME_LIMIT:
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if match is None:
        raise ValueError(f"not a Slurm time limit: {text!r}")
    days, first, second, third = match.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
        total = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    elif third is not None:  # hours:minutes:seconds
        total = (int(first) * 60 + int(second)) * 60 + int(third)
    else:  # minutes[:seconds]
        total = int(first) * 60 + int(second or 0)
    return -(-total // 60)


def partition_max_time(records: list[dict[str, str]], partition: str | None) -> tuple[str, int | None] | None:
    """From `scontrol show partition -o`: the partition jobs go to (`partition`, else Slurm's default one)
    and its MaxTime in minutes (None: no limit); None when there is no such partition or Slurm does not
    say a MaxTime this can read."""
    for record in records:
        name = record.get("PartitionName", "")
        if name == partition or (partition is None and record.get("Default") == "YES"):
            try:
                return name, parse_time_limit(record.get("MaxTime", ""))
            except ValueError:
                return None
    return None


def format_time_limit(minutes: int | None) -> str:
    """Minutes as Slurm's days-hours:minutes:seconds ("0-02:02:00"), which sbatch --time and scontrol's
    TimeLimit= take as they are; None: UNLIMITED. Never "0", which asks Slurm for no limit at all."""
    if minutes is None:
        return "UNLIMITED"
    if minutes < 1:
        raise ValueError(f"a Slurm time limit is at least one minute, not {minutes}")
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def parse_time(text: str) -> float | None:
    text = text.strip()
    if not text or text in ("N/A", "Unknown", "None"):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def expand_hostlist(text: str) -> tuple[str, ...]:
    """`node[01-03,7],gpu-a` -> node01, node02, node03, node7, gpu-a (Slurm's compressed host lists)."""
    if not text or text in ("(null)", "N/A"):
        return ()
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if match is None:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            if not high:
                names.append(f"{prefix}{low}{suffix}")
                continue
            width = len(low)
            names.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(int(low), int(high) + 1))
    return tuple(names)


def parse_gres(text: str) -> tuple[tuple[str, int], ...]:
    """A node's `Gres=gpu:h100:4(S:0-1),gpu:a100:2` -> (("h100", 4), ("a100", 2)); untyped gives ""."""
    found: list[tuple[str, int]] = []
    for item in re.sub(r"\([^)]*\)", "", text or "").split(","):
        fields = item.strip().split(":")
        if not fields or fields[0] not in ("gpu", "gres/gpu"):
            continue
        if len(fields) == 2 and fields[1].isdigit():
            found.append(("", int(fields[1])))
        elif len(fields) >= 3 and fields[-1].isdigit():
            found.append((fields[1], int(fields[-1])))
    return tuple(found)


def gpus_in_tres(text: str) -> float:
    """GPUs in squeue's tres-per-node (`gres:gpu:2`, `gres/gpu:h100:2`, `gres:gpu` = 1); 0 if none."""
    total = 0.0
    for item in (text or "").split(","):
        fields = item.strip().replace("gres/", "gres:").split(":")
        if len(fields) < 2 or fields[0] != "gres" or fields[1] != "gpu":
            continue
        total += float(fields[-1]) if fields[-1].isdigit() else 1.0
    return total


def gpu_indices_by_node(text: str) -> dict[str, tuple[int, ...]]:
    """From `scontrol show job -d -o`: `Nodes=a CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)` per node group."""
    found: dict[str, tuple[int, ...]] = {}
    for nodes, gres in re.findall(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S+)", text):
        indices: list[int] = []
        for span in re.findall(r"IDX:([0-9,\-]+)", gres):
            for item in span.split(","):
                low, _, high = item.partition("-")
                if low.isdigit():
                    indices.extend(range(int(low), int(high or low) + 1))
        for node in expand_hostlist(nodes):
            found[node] = tuple(indices)
    return found


def exit_status(text: str) -> tuple[int, int]:
    """scontrol's `ExitCode=2:0` -> (2, 0): the exit code and the signal that ended the job."""
    code, _, sig = (text or "0:0").partition(":")
    return _int(code, 0), _int(sig, 0)


def _last_line(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = (text or "").strip().splitlines()
    return lines[-1].strip() if lines else ""


def _int(text: str, default: int) -> int:
    try:
        return int(text.strip())
    except ValueError:
        return default
