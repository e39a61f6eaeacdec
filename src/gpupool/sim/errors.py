"""The simulator's one exception: a bad input, named by the flag that carried it, with the fix."""

from __future__ import annotations


class SimError(ValueError):
    """A simulator input is wrong. `flag` is the command-line option (or file field) that carried it."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message

    def __reduce__(self) -> tuple[type[SimError], tuple[str, str]]:
        # Raised in a worker process (`--jobs`), it reaches the parent pickled: built again from both parts.
        return type(self), (self.flag, self.message)
