"""A service's replica count as a spec gives it: one number, or a range MIN..MAX (dstack's notation) for
`scaling` to move it in.
"""

from __future__ import annotations

import re
from typing import Any, Final

from gpupool.spec.errors import MISSING, SpecError

MAX_REPLICAS: Final = 64
RANGE: Final = re.compile(r"\s*([0-9]+)\s*\.\.\s*([0-9]+)\s*")


def replica_range(data: dict[str, Any]) -> dict[str, Any]:
    """`replicas: MIN..MAX` (dstack's notation) as `replicas: MIN` with `scaling.min` and `scaling.max`; a
    range needs `scaling` (what to follow), and `scaling` needs a range (or its own min and max)."""
    replicas = data.get("replicas")
    scaling = data.get("scaling")
    found = RANGE.fullmatch(replicas) if isinstance(replicas, str) else None
    if found is None:
        if not isinstance(scaling, dict):
            return data
        if "min" not in scaling and "max" not in scaling:
            raise SpecError(
                "replicas",
                replicas if replicas is not None else 1,
                "is one number, but scaling needs a range to scale in: give replicas as MIN..MAX (or "
                "scaling.min and scaling.max)",
                "1..4",
            )
        for bound, other in (("min", "max"), ("max", "min")):
            if bound not in scaling:
                raise SpecError(
                    f"scaling.{bound}",
                    MISSING,
                    f"is required with scaling.{other}",
                    "4" if bound == "max" else "1",
                )
        return data if replicas is not None else {**data, "replicas": scaling["min"]}
    low, high = int(found.group(1)), int(found.group(2))
    given = f"{low}..{high}"
    if low < 1 or high > MAX_REPLICAS or low > high:
        raise SpecError(
            "replicas",
            replicas,
            f"is not a range of replica counts MIN..MAX with 1 <= MIN <= MAX <= {MAX_REPLICAS}",
            "1..4",
        )
    if scaling is None:
        raise SpecError(
            "scaling",
            MISSING,
            f"is required: replicas {given} is a range, so say what load to follow",
            "{metric: rps, target: 10}",
        )
    if not isinstance(scaling, dict):
        return data  # the model says what is wrong with it
    for bound, value in (("min", low), ("max", high)):
        if bound in scaling and scaling[bound] != value:
            raise SpecError(
                f"scaling.{bound}",
                scaling[bound],
                f"disagrees with replicas: {given}; give the range once",
                str(value),
            )
    return {**data, "replicas": low, "scaling": {**scaling, "min": low, "max": high}}
