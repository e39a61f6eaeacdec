"""Which variables of a daemon's own environment (the head's, an agent's) never reach the work it starts:
its credentials and gpupool's own settings. A job gets the daemon's environment without them, then its
spec's `env` and secrets, then the job contract's variables (control/contract.py; agent/attempts.py), so a
user's own `HF_TOKEN` given in the spec still arrives. Imported by the head and by the node agent alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

PRIVATE_PREFIXES: Final = ("GPUPOOL_",)
PRIVATE_WORDS: Final = (
    "TOKEN", "PASSWORD", "PASSWD", "SECRET", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY",
    "DATABASE_URL", "DB_URL",
)  # fmt: skip


def private_to_the_daemon(name: str) -> bool:
    """Whether the daemon's environment variable `name` is its own (gpupool's settings, a credential)."""
    upper = name.upper()
    return upper.startswith(PRIVATE_PREFIXES) or any(word in upper for word in PRIVATE_WORDS)


def shared_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the daemon's own variables: what the work it starts may see of it."""
    return {k: v for k, v in environ.items() if not private_to_the_daemon(k)}
