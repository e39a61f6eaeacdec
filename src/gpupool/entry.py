"""The `gpupool` console script: imports the commands inside `main`, so that Ctrl-C while they load (about
half a second of imports on a cold start) ends the command as Ctrl-C does later, with status 130 and no
traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from gpupool.main import main as run
    except KeyboardInterrupt:
        sys.exit(130)
    run()
