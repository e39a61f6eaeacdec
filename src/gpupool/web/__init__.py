"""The dashboard: one static page (index.html) that reads the pool through the API with the browser's token.

The page holds no data and no secret; the server serves it without a token. Its scripts call `/api/v1/...`
with the token the user gives it (the address's `#token=...` fragment, which browsers never send to a
server, as `gpupool ui` prints it, or a form), kept in that browser's local storage.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources


@cache
def page() -> str:
    return resources.files(__package__).joinpath("index.html").read_text(encoding="utf-8")


@cache
def script_sources() -> str:
    """The page's own inline scripts as CSP sources ('sha256-...' each): the browser runs those and no
    other script, so text that ever reached the page as HTML could not run as one."""
    scripts = re.findall(r"<script>(.*?)</script>", page(), flags=re.DOTALL)
    return " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'" for body in scripts
    )
