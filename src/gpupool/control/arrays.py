"""Job arrays (Slurm's --array): one spec, many tasks, each a workload of its own that shares the array's
id (its first task's) and has its index (`array_id`, `array_index`; GPUPOOL_ARRAY_ID, GPUPOOL_ARRAY_INDEX).
Submitting makes them (control/submission.py); the scheduler sees each task as any other workload.

An array written with `%N` (e.g. 0-15%4) runs at most N of its tasks at once: each pass gives the
scheduler only the lowest-indexed pending tasks that fit under N beside those running; the rest wait
with the reason code `array-limit` and count toward no queue's demand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from gpupool.scheduler import Explanation

ARRAY_LIMIT: Final = "array-limit"  # the reason code of a task held back by its array's %N


def throttled(
    pending: Iterable[int], running: Iterable[int], limits: Mapping[int, tuple[int, int]]
) -> dict[int, Explanation]:
    """The pending tasks (`pending`: ids, in the order the scheduler is to see them) held back by their
    array's limit, and why; `running`: the ids of running work; `limits`: task id -> (array id, limit),
    for tasks of arrays with a limit."""
    busy: dict[int, int] = {}
    for wid in running:
        found = limits.get(wid)
        if found is not None:
            busy[found[0]] = busy.get(found[0], 0) + 1
    held: dict[int, Explanation] = {}
    for wid in pending:
        found = limits.get(wid)
        if found is None:
            continue
        array_id, limit = found
        given = busy.get(array_id, 0)
        if given < limit:
            busy[array_id] = given + 1  # given to the scheduler this pass: it may start
            continue
        held[wid] = Explanation(
            ARRAY_LIMIT,
            f"array {array_id} runs at most {limit} of its tasks at once (its %{limit}); {limit} are "
            "running or next in line",
        )
    return held
