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
    python tools/build_native.py --clean   # remove both builds: the pure-Python code runs

`make demo` and `make test` run this; it compiles a target only when one of its sources changed since its
last build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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


def build(target: Target) -> None:
    from mypyc.build import mypycify  # imported here: only a build needs mypy and setuptools
    from setuptools import setup

    started = time.monotonic()
    sources = [target.package / f"{name}.py" for name in target.modules]
    digests = {path.name: digest(path) for path in sources}  # what is compiled, read before compiling
    with tempfile.TemporaryDirectory(prefix="gpupool-native-") as tmp:
        work = Path(tmp)
        # mypyc names modules after their path below the first folder without __init__.py: build from src/.
        relative = [str(p.relative_to(ROOT / "src")) for p in sources]
        cwd = os.getcwd()
        os.chdir(ROOT / "src")
        try:
            extensions = mypycify(
                relative, opt_level="3", group_name=target.group, target_dir=str(work / "c")
            )
            setup(
                name=f"{target.group}-native",
                ext_modules=extensions,
                script_args=[
                    "--quiet",
                    "build_ext",
                    "--build-lib",
                    str(work / "lib"),
                    "--build-temp",
                    str(work / "tmp"),
                ],
            )
        finally:
            os.chdir(cwd)
        built = list((work / "lib").rglob("*.so"))
        if not built:
            raise SystemExit(f"build_native: mypyc produced no extension modules for the {target.name}")
        if {path.name: digest(path) for path in sources} != digests:
            raise SystemExit(f"build_native: a {target.name} source changed while compiling; run it again")
        shutil.rmtree(target.native, ignore_errors=True)
        target.native.mkdir(parents=True)
        for path in built:
            shutil.copy2(path, target.native / path.name)
    manifest = {
        "abi": sysconfig.get_config_var("EXT_SUFFIX"),
        "python": sys.version.split()[0],
        "sources": digests,
    }
    (target.native / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    elapsed = time.monotonic() - started
    print(f"build_native: compiled the {target.name} ({len(target.modules)} modules) in {elapsed:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    parser.add_argument("--force", action="store_true", help="compile even when the builds are up to date")
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
    for target in stale:
        build(target)


if __name__ == "__main__":
    main()
