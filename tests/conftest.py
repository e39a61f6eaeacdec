"""Property tests (Hypothesis) draw the same examples on every run of the suite, CI's included: a run
passes or fails for what changed in the code, never for the luck of the draw. Searching new examples is
a run of its own, with GPUPOOL_HYPOTHESIS=explore (and, for the scheduler's properties, a bigger
GPUPOOL_SCHEDULER_EXAMPLES), e.g.

    GPUPOOL_HYPOTHESIS=explore GPUPOOL_SCHEDULER_EXAMPLES=3000 .venv/bin/python -m pytest \
        tests/unit/scheduler/test_properties.py

A failure found that way prints its example; it becomes a scenario or a test of its own once understood.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("suite", derandomize=True)  # each test's examples seeded by the test itself
settings.register_profile("explore", derandomize=False)
_PROFILE = os.environ.get("GPUPOOL_HYPOTHESIS", "suite")
if _PROFILE not in ("suite", "explore"):
    raise RuntimeError(f"GPUPOOL_HYPOTHESIS={_PROFILE!r}: give suite (the default) or explore")
settings.load_profile(_PROFILE)
