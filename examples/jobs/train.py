"""A toy training loop that honours the gpupool job contract: it checkpoints to $GPUPOOL_CHECKPOINT_DIR,
resumes from the newest checkpoint at start, and on SIGTERM saves and exits before the grace period ends."""

import json
import os
import signal
import sys
import time
from pathlib import Path

steps = int(os.environ.get("STEPS", "20"))
step_seconds = float(os.environ.get("STEP_SECONDS", "0.5"))
checkpoint = Path(os.environ["GPUPOOL_CHECKPOINT_DIR"]) / "state.json"
stopping = False


def on_sigterm(*_):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, on_sigterm)

state = {"step": 0, "loss": 4.0}
if checkpoint.exists():
    state = json.loads(checkpoint.read_text())
    print(f"resuming from checkpoint {checkpoint} at step {state['step']}", flush=True)
else:
    print(f"no checkpoint in {checkpoint.parent}; starting from step 0", flush=True)
print(
    f"job {os.environ['GPUPOOL_JOB_ID']} attempt {os.environ['GPUPOOL_ATTEMPT']} "
    f"on GPUs {os.environ.get('CUDA_VISIBLE_DEVICES')}",
    flush=True,
)

while state["step"] < steps:
    busy_until = time.time() + step_seconds * 0.6  # "compute" (keeps the simulated GPU busy)
    while time.time() < busy_until:
        pass
    time.sleep(step_seconds * 0.4)
    state["step"] += 1
    state["loss"] = round(state["loss"] * 0.93, 4)
    tmp = checkpoint.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, checkpoint)
    print(f"step {state['step']}/{steps} loss {state['loss']}", flush=True)
    if stopping:
        print(f"SIGTERM received: checkpoint saved at step {state['step']}; exiting", flush=True)
        sys.exit(143)

print("training finished", flush=True)
