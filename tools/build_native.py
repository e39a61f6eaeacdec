"""Compile the scheduler core with mypyc into src/gpupool/scheduler/_native/ (a build output, not in git).

The scheduler is plain, fully typed Python (`mypy --strict`); mypyc turns the same source into C extension
modules that run a cycle about twice as fast. Nothing else changes: `gpupool.scheduler` imports the compiled
modules only while they match the source files byte for byte (their SHA-256 is in the manifest written
here) and this interpreter's ABI; otherwise, or with GPUPOOL_PURE_PYTHON=1, it runs the source as it is.

    python tools/build_native.py           # build (needs mypy, setuptools and a C compiler)
    python tools/build_native.py --clean   # remove the build: the pure-Python scheduler runs

`make demo` and `make test` run this; it compiles only when a scheduler source changed since the last build.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "gpupool" / "scheduler"
NATIVE = PACKAGE / "_native"
GROUP = "gpupool_scheduler"  # mypyc's shared library becomes the top-level module gpupool_scheduler__mypyc
# Every module of the core but the package's __init__ (which chooses between compiled and source).
MODULES = (
    "allocate", "core", "cycle", "evict_search", "explain", "fairshare", "ordering", "placement", "prepare",
    "snapshot", "state", "victims",
)  # fmt: skip


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def up_to_date() -> bool:
    """Whether the compiled modules are those of the sources as they are now, for this interpreter."""
    try:
        manifest = json.loads((NATIVE / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    current = {f"{name}.py": digest(PACKAGE / f"{name}.py") for name in MODULES}
    return (
        manifest.get("abi") == sysconfig.get_config_var("EXT_SUFFIX")
        and manifest.get("sources") == current
        and all(any(NATIVE.glob(f"{name}.*.so")) for name in MODULES)
    )


def build() -> None:
    from mypyc.build import mypycify  # imported here: only a build needs mypy and setuptools
    from setuptools import setup

    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        print(f"build_native: no C compiler ({compiler}) here; the pure-Python scheduler runs")
        return
    started = time.monotonic()
    sources = [PACKAGE / f"{name}.py" for name in MODULES]
    digests = {path.name: digest(path) for path in sources}  # what is compiled, read before compiling
    with tempfile.TemporaryDirectory(prefix="gpupool-native-") as tmp:
        work = Path(tmp)
        # mypyc names modules after their path below the first folder without __init__.py: build from src/.
        relative = [str(p.relative_to(ROOT / "src")) for p in sources]
        cwd = os.getcwd()
        os.chdir(ROOT / "src")
        try:
            extensions = mypycify(relative, opt_level="3", group_name=GROUP, target_dir=str(work / "c"))
            setup(
                name="gpupool-scheduler-native",
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
            raise SystemExit("build_native: mypyc produced no extension modules")
        if {path.name: digest(path) for path in sources} != digests:
            raise SystemExit("build_native: a scheduler source changed while compiling; run it again")
        shutil.rmtree(NATIVE, ignore_errors=True)
        NATIVE.mkdir(parents=True)
        for path in built:
            shutil.copy2(path, NATIVE / path.name)
    manifest = {
        "abi": sysconfig.get_config_var("EXT_SUFFIX"),
        "python": sys.version.split()[0],
        "sources": digests,
    }
    (NATIVE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"build_native: compiled {len(MODULES)} scheduler modules in {time.monotonic() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    parser.add_argument("--force", action="store_true", help="compile even when the build is up to date")
    args = parser.parse_args()
    if args.clean:
        shutil.rmtree(NATIVE, ignore_errors=True)
        print("build_native: removed; the pure-Python scheduler runs")
        return
    if not args.force and up_to_date():
        print("build_native: the compiled scheduler is up to date")
        return
    build()


if __name__ == "__main__":
    main()
