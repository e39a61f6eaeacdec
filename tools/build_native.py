"""Compile the scheduler core and the simulator's hot loop with mypyc (build outputs, not in git).

Two targets, each compiled into its package's `_native/` with a manifest of its own: the scheduler
(src/gpupool/scheduler/*.py but `__init__`) and the simulator's engine (src/gpupool/sim/engine.py, skip.py).
Both are plain, fully typed Python (`mypy --strict`); mypyc turns the same source into C extension modules
(a scheduler cycle runs about twice as fast; a replay spends less CPU in the engine). Nothing else changes:
a package imports its compiled modules only while they match its source files byte for byte (their SHA-256
is in the manifest written here) and this interpreter's ABI (`gpupool.native`); otherwise, or with
GPUPOOL_PURE_PYTHON=1, it runs the source as it is. The engine is a mypyc group of its own, never the
scheduler's: it calls the scheduler as any Python code does, so it runs with the source scheduler too.

    python tools/build_native.py           # build (needs mypy, setuptools and a C compiler)
    python tools/build_native.py --force   # compile both even when up to date
    python tools/build_native.py --no-pgo  # one plain compile (no training run)
    python tools/build_native.py --clean   # remove both builds: the pure-Python code runs

With GCC the build is profile-guided: each target is compiled instrumented, `tools/native_training.py`
replays a synthetic trace through the instrumented engine and scheduler (about 20 s), and the same C is
compiled again laid out and inlined after the counts that run wrote (the Philly week replays about 10% faster
than with one plain compile; docs/benchmarks.md). The compiled code means the same either way: a profile
changes where the compiler puts code, not what it computes. `--no-pgo`, another compiler, or a training run
that fails gives the one plain compile.

`make demo` and `make test` run this; it compiles only when a source changed since the last build (then
every stale target, together: they train together).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRAINING_TIMEOUT_S = 600


@dataclass(frozen=True)
class Target:
    name: str  # what the messages call it
    package: Path
    group: str  # mypyc's shared library becomes the top-level module <group>__mypyc
    modules: tuple[str, ...]  # compiled; never the package's __init__ (which chooses compiled or source)

    @property
    def native(self) -> Path:
        return self.package / "_native"


TARGETS = (
    Target("scheduler", ROOT / "src" / "gpupool" / "scheduler", "gpupool_scheduler", (
        "allocate", "core", "cycle", "evict_search", "explain", "fairshare", "ordering", "placement",
        "prepare", "snapshot", "state", "victims",
    )),
    Target("simulator engine", ROOT / "src" / "gpupool" / "sim", "gpupool_sim", ("engine", "skip")),
)  # fmt: skip


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def up_to_date(target: Target) -> bool:
    """Whether the target's compiled modules are those of its sources as they are now, built by this Python
    (its version too: a .venv made again from another 3.11 build gets modules compiled by it)."""
    try:
        manifest = json.loads((target.native / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    current = {f"{name}.py": digest(target.package / f"{name}.py") for name in target.modules}
    return (
        manifest.get("abi") == sysconfig.get_config_var("EXT_SUFFIX")
        and manifest.get("python") == sys.version.split()[0]
        and manifest.get("sources") == current
        and all(any(target.native.glob(f"{name}.*.so")) for name in target.modules)
    )


@dataclass
class Build:
    """One target's build in a work folder: mypyc's C sources, generated once, compiled once or twice."""

    target: Target
    work: Path
    extensions: list[Any]  # setuptools Extensions, as mypycify gives them
    digests: dict[str, str]  # the sources' SHA-256, read before generating the C
    flags: tuple[list[str], list[str]]  # mypycify's own compile and link arguments


def generate(target: Target, work: Path) -> Build:
    """mypyc's C for the target's modules, in `work`."""
    from mypyc.build import mypycify  # imported here: only a build needs mypy and setuptools

    sources = [target.package / f"{name}.py" for name in target.modules]
    digests = {path.name: digest(path) for path in sources}  # what is compiled, read before compiling
    # mypyc names modules after their path below the first folder without __init__.py: build from src/.
    relative = [str(p.relative_to(ROOT / "src")) for p in sources]
    cwd = os.getcwd()
    os.chdir(ROOT / "src")
    try:
        extensions = mypycify(relative, opt_level="3", group_name=target.group, target_dir=str(work / "c"))
    finally:
        os.chdir(cwd)
    flags = (list(extensions[0].extra_compile_args), list(extensions[0].extra_link_args))
    return Build(target, work, extensions, digests, flags)


def compile_and_install(b: Build, extra: list[str]) -> None:
    """Compile the generated C with `extra` compiler and linker flags (the same object paths every time:
    gcc names a profile after its object file) and install the modules with their manifest."""
    from setuptools import setup

    for folder in ("lib", "tmp"):
        shutil.rmtree(b.work / folder, ignore_errors=True)
    for ext in b.extensions:
        ext.extra_compile_args = [*b.flags[0], *extra]
        ext.extra_link_args = [*b.flags[1], *extra]
    cwd = os.getcwd()
    os.chdir(ROOT / "src")
    try:
        setup(
            name=f"{b.target.group}-native",
            ext_modules=b.extensions,
            script_args=["--quiet", "build_ext", "--build-lib", str(b.work / "lib"), "--build-temp",
                         str(b.work / "tmp")],
        )  # fmt: skip
    finally:
        os.chdir(cwd)
    built = list((b.work / "lib").rglob("*.so"))
    if not built:
        raise SystemExit(f"build_native: mypyc produced no extension modules for the {b.target.name}")
    sources = [b.target.package / f"{name}.py" for name in b.target.modules]
    if {path.name: digest(path) for path in sources} != b.digests:
        raise SystemExit(f"build_native: a {b.target.name} source changed while compiling; run it again")
    native = b.target.native
    shutil.rmtree(native, ignore_errors=True)
    native.mkdir(parents=True)
    for path in built:
        shutil.copy2(path, native / path.name)
    manifest = {
        "abi": sysconfig.get_config_var("EXT_SUFFIX"),
        "python": sys.version.split()[0],
        "sources": b.digests,
    }
    (native / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def gcc(compiler: str) -> bool:
    """Whether the C compiler is GCC (the profile-guided build uses its flags and profile files)."""
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and "Free Software Foundation" in done.stdout


def train(profiles: Path) -> str | None:
    """Run the training replay on the instrumented modules; None when it ran, else why it did not."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "GPUPOOL_PURE_PYTHON": ""}
    command = [sys.executable, str(ROOT / "tools" / "native_training.py")]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TRAINING_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"the training run took over {TRAINING_TIMEOUT_S} s"
    if done.returncode != 0:
        return f"the training run failed: {(done.stderr or done.stdout).strip()[-500:]}"
    if not any(profiles.rglob("*.gcda")):
        return "the training run wrote no profile"
    return None


def build(targets: list[Target], pgo: bool) -> None:
    """Compile the targets; with `pgo`, twice: instrumented, a training run, then with its profile."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpupool-native-") as tmp:
        builds = [generate(target, Path(tmp) / target.group) for target in targets]
        profiles = Path(tmp) / "profiles"
        why = None
        try:
            if pgo:
                for b in builds:
                    compile_and_install(b, [f"-fprofile-generate={profiles}"])
                why = train(profiles)
            if pgo and why is None:
                use = [f"-fprofile-use={profiles}", "-fprofile-partial-training", "-Wno-missing-profile"]
                for b in builds:
                    compile_and_install(b, use)
                how = "profile-guided (gcc; trained by tools/native_training.py)"
            else:
                if why is not None:
                    print(f"build_native: {why}; compiling without a profile")
                for b in builds:
                    compile_and_install(b, [])
                how = "without a profile"
        except BaseException:
            # never leave instrumented modules behind: they run slower and write profiles on every exit
            for target in targets:
                shutil.rmtree(target.native, ignore_errors=True)
            raise
    names = " and ".join(f"the {t.name} ({len(t.modules)} modules)" for t in targets)
    print(f"build_native: compiled {names} {how} in {time.monotonic() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    parser.add_argument("--force", action="store_true", help="compile even when the builds are up to date")
    parser.add_argument(
        "--no-pgo", dest="pgo", action="store_false",
        help="compile once, without the profile-guided second pass (faster to build, slower to run)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.clean:
        for target in TARGETS:
            shutil.rmtree(target.native, ignore_errors=True)
        print("build_native: removed the compiled scheduler and simulator engine; the pure-Python code runs")
        return
    stale = [target for target in TARGETS if args.force or not up_to_date(target)]
    for target in TARGETS:
        if target not in stale:
            print(f"build_native: the compiled {target.name} is up to date")
    if not stale:
        return
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        names = " and ".join(target.name for target in stale)
        print(f"build_native: no C compiler ({compiler}) here; the pure-Python source runs ({names})")
        return
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.exists():
        names = " and ".join(target.name for target in stale)
        print(f"build_native: no {header} (a python3-dev package); the pure-Python source runs ({names})")
        return
    pgo = args.pgo and gcc(compiler)
    if args.pgo and not pgo:
        print(f"build_native: {compiler} is not GCC; compiling without a profile")
    build(stale, pgo)


if __name__ == "__main__":
    main()
