"""An attempt's output, read in chunks from the log each of its ranks writes. No HTTP here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.backends.agent_records import rank_log_path
from gpupool.control.errors import NotFound
from gpupool.control.lifecycle import RUNNING, TERMINAL
from gpupool.control.workloads import load_workload
from gpupool.store.db import Store

LOG_CHUNK_MAX = 1 << 20


def read_log(
    store: Store,
    workload_id: int,
    *,
    attempt: int | None = None,
    offset: int = 0,
    limit: int = LOG_CHUNK_MAX,
    rank: int = 0,
) -> dict[str, Any]:
    with store.read() as s:
        workload = load_workload(s, workload_id)
        if not workload.attempts:
            return {
                "attempt": None,
                "offset": 0,
                "data": "",
                "eof": workload.state in TERMINAL,
                "state": workload.state,
                "path": None,
                "attempt_ended": False,
                "latest_attempt": None,
                "reason": workload.reason,
            }
        if attempt is None:
            chosen = workload.attempts[-1]
        else:
            matches = [a for a in workload.attempts if a.number == attempt]
            if not matches:
                raise NotFound(
                    f"workload {workload_id} has no attempt {attempt} "
                    f"(attempts 0..{len(workload.attempts) - 1})"
                )
            chosen = matches[0]
        finished = chosen.state != RUNNING
        ranks = max(1, len(chosen.pods or []))
        if rank >= ranks:
            raise NotFound(
                f"attempt {chosen.number} of workload {workload_id} has no rank {rank} (ranks 0..{ranks - 1})"
            )
        path = rank_log_path(Path(chosen.log_path), rank)
        data = b""
        size = 0
        if path.exists():
            size = path.stat().st_size
        if max(0, offset) < size:  # past the end nothing is there yet (and a seek past a file's limit fails)
            with open(path, "rb") as fh:
                fh.seek(max(0, offset))
                data = fh.read(max(0, min(limit, LOG_CHUNK_MAX)))
                if fh.tell() < size or not finished:  # more may follow: a cut character comes next time
                    data = _whole_characters(data)
        next_offset = max(0, offset) + len(data)
        return {
            "attempt": chosen.number,
            "offset": next_offset,
            "data": data.decode("utf-8", errors="replace"),
            "eof": finished and next_offset >= size and workload.state != RUNNING,
            "state": workload.state,
            "path": str(path),
            # for a reader following the work: this attempt has ended, and which attempt is the newest
            "attempt_ended": finished,
            "latest_attempt": workload.attempts[-1].number,
            "reason": workload.reason,  # why it waits, while it is pending again
            # an attempt that never wrote a log (its node could not start it): why it ended
            "no_log": not path.exists(),
            "attempt_reason": chosen.reason,
        }


def _whole_characters(data: bytes) -> bytes:
    """`data` without a UTF-8 character cut off at its end (the next chunk starts with it): each chunk is
    decoded alone, and a cut character would come out as two replacement characters."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data" and 0 < exc.start >= len(data) - 3:
            return data[: exc.start]
    return data
