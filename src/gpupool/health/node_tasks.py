"""What a node agent does when the head asks: inject a fault into its simulated GPUs.

The head lists its instructions in every heartbeat answer (`"instructions": [{"id", "kind", ...}]`) until
the agent's reply reaches it (`"instruction_results"` in a heartbeat), so this is level-triggered like the
rest of the protocol: a lost answer or reply is repaired by the next heartbeat. Each instruction is carried
out once (its id is remembered), in a worker thread so it never holds up the heartbeats; its
reply is kept and sent with every heartbeat until the head stops listing the instruction.

Kinds: `inject_fault` (`gpu`, `fault`, `value`) replies `{"result": "what was done"}`. A refusal or failure
replies `{"error": message, "kind": ..., "field": ...}`. The active health checks are no instruction: they
run as a gpupool job on the node like any other (control/health_jobs.py, health/check_job.py); for simulated
GPUs the agent publishes their condition where its check jobs read it (health/simulated_state.py), at start
and after every injected fault.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from gpupool.gpu import GpuProvider, SimulatedProvider
from gpupool.health import faults, simulated_state

log = logging.getLogger("gpupool.agent")

KINDS = ("inject_fault",)
REMEMBERED = 256  # instruction ids remembered as carried out (an answer listing one again does not rerun it)


class NodeTasks:
    """The agent's side of the head's instructions; thread-safe."""

    def __init__(self, gpus: GpuProvider | None, node: str, on_done: Callable[[], None]) -> None:
        self.gpus, self.node, self.on_done = gpus, node, on_done
        self._lock = threading.Lock()
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self._seen: deque[str] = deque(maxlen=REMEMBERED)
        self._results: dict[str, dict[str, Any]] = {}
        self._worker: threading.Thread | None = None
        self._publish()

    def _publish(self) -> None:
        if isinstance(self.gpus, SimulatedProvider):
            try:
                simulated_state.publish(self.gpus, self.node)
            except OSError as exc:  # check jobs then fail and say so; the agent goes on
                log.warning("event=simulated_state_unwritable node=%s error=%r", self.node, str(exc))

    def take(self, listed: list[dict[str, Any]]) -> None:
        """The instructions a heartbeat answer lists: new ones are queued; replies to instructions the head
        no longer lists have reached it (or it stopped waiting) and are dropped."""
        ids = {str(item.get("id")) for item in listed}
        with self._lock:
            for ident in [i for i in self._results if i not in ids]:
                del self._results[ident]
            fresh = [item for item in listed if str(item.get("id")) not in self._seen]
            for item in fresh:
                self._seen.append(str(item.get("id")))
                self._queue.put(item)
            if fresh and self._worker is None:
                self._worker = threading.Thread(target=self._work, name="agent-instructions", daemon=True)
                self._worker.start()

    def results(self) -> list[dict[str, Any]]:
        """Replies the head has not acknowledged yet (sent with every heartbeat)."""
        with self._lock:
            return list(self._results.values())

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            reply = {"id": str(item.get("id")), **self.carry_out(item)}
            with self._lock:
                self._results[reply["id"]] = reply
            self.on_done()

    def carry_out(self, item: dict[str, Any]) -> dict[str, Any]:
        kind = item.get("kind")
        log.info("event=instruction node=%s kind=%s id=%s", self.node, kind, item.get("id"))
        try:
            if kind == "inject_fault":
                gpu: Any = item.get("gpu")  # faults.inject refuses anything but a GPU index, naming it
                done = faults.inject(self.gpus, self.node, gpu, str(item.get("fault")), item.get("value"))
                self._publish()
                log.warning("event=fault_injected node=%s result=%r", self.node, done)
                return {"result": done}
            return {
                "error": f"this agent does not know the instruction {kind!r} (one of {', '.join(KINDS)}); "
                "upgrade the agent to the head's version",
                "kind": "conflict",
            }
        except faults.FaultRefused as exc:
            return exc.to_dict()
        except ValueError as exc:
            return {"error": str(exc), "kind": "failed"}
        except Exception as exc:  # one failed instruction must not end the agent; the head shows why
            log.exception("event=instruction_failed node=%s kind=%s", self.node, kind)
            return {"error": f"{type(exc).__name__}: {exc}", "kind": "failed"}
