"""Every GPU check of the bench commands in one run: NCCL collectives, bf16 GEMM, ~125M-parameter GPT MFU.

Run on a machine with NVIDIA GPUs, a CUDA build of torch and gpupool's dependencies (installed, or this
checkout's src/ on the path, which this script arranges):

    python3 benchmarks/gpu_checks.py --out "$OUT"          # about 3 to 5 minutes on one H100/H200
    python3 benchmarks/gpu_checks.py --out /tmp/gc --quick # smaller sizes, under a minute

It first checks that `gpupool.main` imports (a machine without pydantic, say, stops there in seconds
with the missing module named; docs/bench.md says which wheels to carry) and that torch sees a GPU. The
checks run in order of importance, each with its own timeout, all within --budget-seconds (default 540,
so a 10-minute run limit holds): a check that fails or times out is recorded and the next one runs; one
that no longer fits is recorded as skipped. Three files under --out, rewritten after every check so that
a run stopped from outside keeps what it had: env.json (GPUs, torch, CUDA, NCCL, nvidia-smi),
summary.json (every check's command, exit status, seconds, stderr tail, headline figures, verdict and
full JSON report) and checks.tar.gz (each check's JSON and printed table). Scratch files (the token
corpus) live in a temporary folder, not under --out. The checks:
- collective_{float,bf16}: every op over NCCL with one rank per GPU (sendrecv needs two GPUs), 8 B..1 GiB:
  #wrong must be 0 everywhere; avg busbw recorded. If nccl-tests' all_reduce_perf is on PATH (or in
  $NCCL_TESTS_DIR), its all-reduce table at the same sizes goes beside ours (nccl_tests_all_reduce.txt).
- gemm_bf16, gemm_half: square matmuls; target >= 70% of the catalog's dense peak at a large size (4096^3 or
  more; the largest size's figure is reported beside it).
- train_125m (GPT-2 small shape: 12 layers, hidden 768, 12 heads, seq 1024, vocab 50304) with DDP and
  bf16 autocast; train_125m_fsdp the same with FSDP; train_data a short run on a token file made by
  prepare-data. Recorded: tokens/s, TFLOP/s per GPU (Megatron-LM's formula) and MFU.
Every check has its own timeout; one that fails or times out is recorded and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LARGE_GEMM = 4096**3  # m*n*k from which a GEMM counts as large for the 70%-of-peak target


def env_with_src() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def describe_machine(out: Path) -> dict[str, Any]:
    probe = (
        "import json, torch, torch.distributed as d\n"
        "gpus = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]\n"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,"
        " 'cuda_available': torch.cuda.is_available(), 'nccl_available': d.is_nccl_available(),"
        " 'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,"
        " 'gpus': [{'name': g.name, 'memory_bytes': g.total_memory} for g in gpus]}))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env_with_src(), timeout=120
    )
    info: dict[str, Any] = (
        json.loads(found.stdout) if found.returncode == 0 else {"error": found.stderr[-2000:]}
    )
    smi = shutil.which("nvidia-smi")
    if smi:
        info["nvidia_smi"] = subprocess.run([smi], capture_output=True, text=True, timeout=60).stdout
    info["python"] = sys.version
    (out / "env.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def cli_imports() -> str | None:
    """None when `gpupool.main` imports with this interpreter, else the error's last line."""
    found = subprocess.run(
        [sys.executable, "-c", "import gpupool.main"], capture_output=True, text=True, env=env_with_src(),
        timeout=120,
    )  # fmt: skip
    if found.returncode == 0:
        return None
    lines = found.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit {found.returncode}"


def run_check(out: Path, name: str, args: list[str], timeout: float, cwd: Path) -> dict[str, Any]:
    """`gpupool bench ARGS --json out/NAME.json` (prepare-data: no --json); the printed output to
    out/NAME.txt."""
    target = out / f"{name}.json"
    json_args = [] if args[0] == "prepare-data" else ["--json", str(target)]
    argv = [sys.executable, "-m", "gpupool.main", "bench", *args, *json_args]
    began = time.monotonic()
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=env_with_src(), timeout=timeout, cwd=cwd
        )
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, stdout, stderr = 124, _text(exc.stdout), _text(exc.stderr) + f"\ntimed out after {timeout}s"
    seconds = time.monotonic() - began
    (out / f"{name}.txt").write_text(f"$ {' '.join(argv)}\n{stdout}\n--- stderr ---\n{stderr}")
    report = json.loads(target.read_text()) if target.exists() else None
    print(f"{name}: exit {code} in {seconds:.0f}s", flush=True)
    return {"name": name, "command": argv[1:], "exit_code": code, "seconds": round(seconds, 1),
            "stderr_tail": stderr[-1500:], "report": report}  # fmt: skip


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def verdicts(result: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of one check and whether it met its target."""
    report, name = result["report"], result["name"]
    if result["exit_code"] != 0 or report is None:
        return {"ok": False, "why": f"exit {result['exit_code']}"}
    if name.startswith("collective"):
        ops = report.get("ops", [report])
        wrong = sum(op["wrong"] for op in ops)
        return {"ok": wrong == 0, "wrong": wrong, "avg_busbw": {op["op"]: op["avg_busbw"] for op in ops}}
    if name.startswith("gemm"):
        # Large: 4096^3 and up. Not the largest alone: a 16384^3 product lasts long enough for an H200 to
        # reach its 700 W power cap and lower its clock (docs/benchmarks.md, "On a GPU"); both are reported.
        large = [r for r in report["rows"] if r["m"] * r["n"] * r["k"] >= LARGE_GEMM]
        largest = max(report["rows"], key=lambda r: r["m"] * r["n"] * r["k"])
        best = max(large or [largest], key=lambda r: r["fraction_of_peak"] or 0.0)
        fraction = best["fraction_of_peak"]
        return {
            "ok": fraction is not None and fraction >= 0.70,
            "target": ">= 0.70 of peak at a large size (4096^3 or more)",
            "best_large": f"{best['m']}x{best['n']}x{best['k']}",
            "fraction_of_peak": fraction,
            "largest": f"{largest['m']}x{largest['n']}x{largest['k']}",
            "largest_tflops": largest["tflops"],
            "largest_fraction_of_peak": largest["fraction_of_peak"],
            "best_tflops": report["best_tflops"],
        }
    return {"ok": True, "tokens_per_s": report["tokens_per_s"], "tflops_per_gpu": report["tflops_per_gpu"],
            "mfu": report["mfu"], "parameters": report["model"]["parameters"]}  # fmt: skip


def nccl_tests_beside(out: Path, gpus: int, maxbytes: str, timeout: float) -> dict[str, Any] | None:
    """nccl-tests' all_reduce_perf at our sizes, when someone built it on this machine."""
    folder = os.environ.get("NCCL_TESTS_DIR")
    binary = shutil.which("all_reduce_perf") or (str(Path(folder) / "all_reduce_perf") if folder else None)
    if not binary or not Path(binary).exists():
        return None
    argv = [binary, "-b", "8", "-e", maxbytes, "-f", "2", "-n", "20", "-w", "5", "-g", str(gpus)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        code, text = done.returncode, f"{done.stdout}\n{done.stderr}"
    except subprocess.TimeoutExpired as exc:
        code, text = 124, f"{_text(exc.stdout)}\n{_text(exc.stderr)}\ntimed out after {timeout:.0f}s"
    (out / "nccl_tests_all_reduce.txt").write_text(f"$ {' '.join(argv)}\n{text}")
    return {"command": argv, "exit_code": code}


def skipped(name: str, argv: list[str], why: str) -> dict[str, Any]:
    print(f"{name}: skipped, {why}", flush=True)
    return {"name": name, "command": argv, "exit_code": None, "skipped": True,
            "verdict": {"ok": False, "why": f"skipped: {why}"}}  # fmt: skip


def save(out: Path, staged: Path, summary: dict[str, Any]) -> None:
    """summary.json and checks.tar.gz under --out (few files: the device tool brings back at most 8)."""
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    partial = out / "checks.tar.gz.part"
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(staged.iterdir()):
            tar.add(path, arcname=f"checks/{path.name}")
    partial.replace(out / "checks.tar.gz")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-checks")))
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer iterations")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=540.0,
        help="every check ends within this many seconds of the start (default 540: a 10-minute limit holds)",
    )
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_seconds
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-checks-"))
    staged, work = scratch / "checks", scratch / "work"
    staged.mkdir()
    work.mkdir()
    info = describe_machine(out)
    gpus = len(info.get("gpus", []))
    summary: dict[str, Any] = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "env": {
        k: v for k, v in info.items() if k != "nvidia_smi"}, "checks": []}  # fmt: skip
    broken = cli_imports()
    if broken or not gpus:
        summary["error"] = (
            f"gpupool.main does not import here ({broken}); carry the wheels docs/bench.md names"
            if broken
            else "no GPU visible to torch here; nothing to check (see env.json)"
        )
        save(out, staged, summary)
        print(summary["error"])
        sys.exit(2 if broken else 1)
    quick = args.quick
    maxbytes = "64M" if quick else "1G"
    ops = "all" if gpus >= 2 else "all_reduce,all_gather,reduce_scatter,broadcast,reduce,alltoall"
    docs = work / "docs.jsonl"
    with docs.open("w") as fh:
        for i in range(2000):
            fh.write(json.dumps({"text": f"Document {i}. " + "The pool schedules work fairly. " * 40}) + "\n")
    gpt = ["--layers", "12", "--hidden", "768", "--heads", "12", "--seq", "1024", "--vocab", "50304"]
    if quick:
        gpt = ["--layers", "4", "--hidden", "512", "--heads", "8", "--seq", "512", "--vocab", "50304"]
    iters = ["-n", "5", "-w", "2"] if quick else ["-n", "20", "-w", "5"]
    sizes = ["-b", "8", "-e", maxbytes, "-f", "2", "-n", "20", "-w", "5"]
    gemm_sizes = "2048,4096,8192" + ("" if quick else ",16384")
    train = ["train", *gpt, "--micro-batch", "16", "--precision", "bf16", *iters]
    small = ["--layers", "4", "--hidden", "512", "--heads", "8", "--seq", "512", "--micro-batch", "8"]
    prepare = ["prepare-data", str(docs), "--output", str(work / "corpus")]
    collective_bf16 = ["collective", "--op", "all_reduce", "--backend", "nccl"]
    # Most wanted first (GEMM vs peak, the NCCL table, MFU): a run cut short still answers those.
    checks: list[tuple[str, list[str], float]] = [
        ("gemm_bf16", ["gemm", "--dtype", "bf16", "--device", "all", "--sizes", gemm_sizes, "-n", "50"], 150),
        (
            "collective_float",
            ["collective", "--op", ops, "--backend", "nccl", *sizes, "--dtype", "float"],
            240,
        ),
        ("train_125m", train, 240),
        ("collective_bf16", [*collective_bf16, *sizes, "--dtype", "bf16"], 120),
        ("gemm_half", ["gemm", "--dtype", "half", "--device", "0", "--sizes", "8192", "-n", "50"], 90),
        ("train_125m_fsdp", [*train, "--parallel", "fsdp"], 240),
        ("prepare_data", prepare, 90),
        ("train_data", ["train", *small, "--data", str(work / "corpus"), "-n", "5", "-w", "2"], 120),
    ]
    for name, argv, timeout in checks:
        left = deadline - time.monotonic()
        if left < 30:
            result = skipped(name, argv, f"{left:.0f}s of the budget left")
        elif name == "train_data" and not (work / "corpus.bin").exists():
            result = skipped(name, argv, "prepare-data wrote no corpus")
        else:
            result = run_check(staged, name, argv, min(timeout, left - 10), work)
            result["verdict"] = (
                {"ok": result["exit_code"] == 0} if name == "prepare_data" else verdicts(result)
            )
        summary["checks"].append(result)
        save(out, staged, summary)
    left = deadline - time.monotonic()
    summary["nccl_tests"] = nccl_tests_beside(staged, gpus, maxbytes, left - 10) if left > 60 else None
    summary["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save(out, staged, summary)
    shutil.rmtree(scratch, ignore_errors=True)
    for check in summary["checks"]:
        print(f"{check['name']:>18s}: {json.dumps(check['verdict'])}")
    sys.exit(0 if all(c["verdict"]["ok"] for c in summary["checks"]) else 1)


if __name__ == "__main__":
    main()
