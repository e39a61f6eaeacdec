"""The attempt shim: parent of a job's command, so its exit status survives a head restart.

Started by the local backend as `python -m gpupool.backends.shim RUN_DIR -- ARGV...` in a new session
(process group). It writes `RUN_DIR/pid`, runs the command, and writes `RUN_DIR/exit_code` atomically when
the command ends. SIGTERM reaches the command through the process group; the shim itself outlives it to
record the status. Standard library only: it starts fast and imports nothing of the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m gpupool.backends.shim RUN_DIR -- COMMAND...", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    # Signals go to the whole group; the shim waits for its child rather than dying first.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)
    try:
        child = subprocess.Popen(argv[2:], stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"gpupool: cannot start {argv[2]!r}: {exc}", file=sys.stderr, flush=True)
        _write_atomically(run_dir / "exit_code", "127\n")
        return 127
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
    # Negative = killed by a signal; record it as the shell does (128 + signal number).
    status = code if code >= 0 else 128 - code
    _write_atomically(run_dir / "exit_code", f"{status}\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
