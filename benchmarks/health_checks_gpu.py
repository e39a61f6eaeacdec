"""The NVML telemetry path and the node health checks on a real GPU machine, in one run.

Run where NVIDIA GPUs, their driver and a CUDA build of torch are present (this checkout's src/ is put on the
path):

    python3 benchmarks/health_checks_gpu.py --out "$OUT"            # about 2 to 4 minutes on 8 H100s
    python3 benchmarks/health_checks_gpu.py --out /tmp/hc --level quick

It writes, under --out:
- devices.json: what NvmlProvider discovers (names, UUIDs, memory, NVLink islands).
- samples.json: two samples a second apart of every GPU (every field of GpuSample: throttle reasons, PCIe
  link, ECC counters, remapped rows, NVLink links, Xids).
- passive.json: the passive verdict of those samples.
- active_quick.json / active_full.json: the active checks (GEMM, copies, memory test, all-reduce) with the
  verdict against gpupool's thresholds table (health/thresholds.py).
- metrics.txt: /metrics of a real `gpupool server --gpus nvml` started on this machine.
- server_check_job.json: that server's `health run` of its node (quick): the check job it ran holding every
  GPU, the verdict, the job and its log.
- summary.json: every step's status, seconds and headline figures.
A step that fails is recorded and the next steps still run.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from gpu_checks import env_with_src  # noqa: E402  (this folder is on the path of a script run from it)


def step(summary: dict[str, Any], name: str, run: Callable[[], Any]) -> Any:
    began = time.monotonic()
    try:
        result = run()
        summary[name] = {"ok": True, "seconds": round(time.monotonic() - began, 2)}
        print(f"{name}: ok ({summary[name]['seconds']}s)", flush=True)
        return result
    except Exception as exc:
        summary[name] = {"ok": False, "seconds": round(time.monotonic() - began, 2), "error": repr(exc),
                         "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        print(f"{name}: FAILED {exc!r}", flush=True)
        return None


def metrics_from_a_real_server(out: Path) -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    home = Path(tempfile.mkdtemp(prefix="gpupool-hc-"))
    env = {**env_with_src(), "GPUPOOL_HOME": str(home)}  # carried wheels stay on the path
    argv = [sys.executable, "-m", "gpupool.main", "server", "--port", str(port), "--gpus", "nvml"]
    with open(out / "server.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            import httpx

            deadline = time.time() + 60
            while time.time() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"gpupool server exited with {proc.returncode}; see server.log")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.3)
            time.sleep(4)  # a few samples
            token = json.loads((home / "credentials").read_text())["token"]
            text = httpx.get(
                f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
            ).text
            health = httpx.get(
                f"http://127.0.0.1:{port}/api/v1/health",
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
            ).json()
            (out / "server_health.json").write_text(json.dumps(health, indent=2))
            # The active checks as the head runs them: a check job holding every GPU (control/health_jobs.py).
            auth, api = {"Authorization": f"Bearer {token}"}, f"http://127.0.0.1:{port}/api/v1"
            asked = {"node": health[0]["node"], "level": "quick"}
            ran = httpx.post(f"{api}/health/run", json=asked, headers=auth, timeout=900).json()
            job = ran[0]["active"]["job"] if isinstance(ran, list) and ran and ran[0].get("active") else None
            if job is not None:
                shown = httpx.get(f"{api}/workloads/{job}", headers=auth, timeout=10).json()
                job_log = httpx.get(f"{api}/workloads/{job}/logs", headers=auth, timeout=10).json()
                ran.append({"job": shown, "log": job_log})
            (out / "server_check_job.json").write_text(json.dumps(ran, indent=2))
            return str(text)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--level", choices=("quick", "full", "both"), default="both")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    from gpupool.gpu.nvml import NvmlProvider
    from gpupool.health import checks
    from gpupool.health.active import TorchRunner
    from gpupool.health.checks import Baseline
    from gpupool.health.thresholds import parse_config

    config = parse_config(None)
    summary: dict[str, Any] = {}
    provider = step(summary, "nvml_open", NvmlProvider)
    samples: list[dict[str, Any]] = []
    if provider is not None:
        devices = [d.to_dict() for d in provider.devices()]
        (out / "devices.json").write_text(json.dumps(devices, indent=2))

        def sample_twice() -> list[dict[str, Any]]:
            first = [s.to_dict() for s in provider.sample()]
            time.sleep(1.0)
            return first + [s.to_dict() for s in provider.sample()]

        both = step(summary, "nvml_sample", sample_twice) or []
        (out / "samples.json").write_text(json.dumps(both, indent=2))
        samples = both[len(devices) :]
        verdict = step(
            summary,
            "passive_checks",
            lambda: checks.passive(
                samples,
                expected_gpus=len(devices),
                models={d["index"]: d["model"] for d in devices},
                config=config,
                baseline=Baseline(),
            ),
        )
        if verdict is not None:
            (out / "passive.json").write_text(json.dumps(verdict.to_dict(), indent=2))
            summary["passive_checks"]["health"] = verdict.health
            summary["passive_checks"]["evidence"] = verdict.evidence
        provider.close()
    for level in ("quick", "full") if args.level == "both" else (args.level,):
        result = step(summary, f"active_{level}", lambda level=level: TorchRunner().run(level))
        if result is not None:
            judged = checks.active(result, config)
            (out / f"active_{level}.json").write_text(
                json.dumps({"result": result.to_dict(), **judged.to_dict()}, indent=2)
            )
            summary[f"active_{level}"].update(
                health=judged.health,
                evidence=judged.evidence,
                gemm_tflops=[g.gemm_tflops for g in result.gpus],
                h2d_gbps=[g.h2d_gbps for g in result.gpus],
                d2h_gbps=[g.d2h_gbps for g in result.gpus],
                allreduce_busbw_gbps=result.allreduce_busbw_gbps,
            )
    text = step(summary, "server_metrics", lambda: metrics_from_a_real_server(out))
    if text:
        (out / "metrics.txt").write_text(text)
        summary["server_metrics"]["dcgm_series"] = sorted(
            {line.split("{")[0] for line in text.splitlines() if line.startswith("DCGM_FI_")}
        )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(
        json.dumps(
            {k: {kk: vv for kk, vv in v.items() if kk != "traceback"} for k, v in summary.items()}, indent=2
        )
    )
    return 0 if all(v["ok"] for v in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
