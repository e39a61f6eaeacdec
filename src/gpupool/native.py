"""Whether a package runs its modules compiled with mypyc (`tools/build_native.py`) or as source.

A package's `_native/` holds its modules compiled and a manifest of the sources they were compiled from.
They are used only while every one of those sources is byte for byte the file in the package (SHA-256) and
the ABI is this interpreter's; else, or with GPUPOOL_PURE_PYTHON=1 set, the source runs as it is. Imported
by packages' `__init__`, so it stays light (no pathlib).
"""

import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import MutableSequence


def compiled_dir(package: str) -> str | None:
    """The package folder's folder of compiled modules when they may be used, else None."""
    if os.environ.get("GPUPOOL_PURE_PYTHON", "").strip().lower() not in ("", "0", "false", "no"):
        return None  # "0" and "false" mean off, as a reader of GPUPOOL_PURE_PYTHON=0 expects
    native = os.path.join(package, "_native")
    try:
        with open(os.path.join(native, "manifest.json"), encoding="utf-8") as file:
            manifest = json.load(file)
        if manifest.get("abi") != sysconfig.get_config_var("EXT_SUFFIX"):
            return None
        for name, expected in manifest["sources"].items():
            with open(os.path.join(package, name), "rb") as source:
                if hashlib.sha256(source.read()).hexdigest() != expected:
                    return None  # a source changed since the build: run the source
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return native


def use_compiled(init_file: str, path: MutableSequence[str]) -> bool:
    """Called by a package's `__init__` (its `__file__` and `__path__`) before it imports its submodules:
    put its compiled modules first on `path` when they may be used; whether they are."""
    native = compiled_dir(os.path.dirname(init_file))
    if native is None:
        return False
    path.insert(0, native)  # submodules resolve to the compiled ones first
    sys.path.append(native)  # where they find their shared runtime (<group>__mypyc)
    return True
