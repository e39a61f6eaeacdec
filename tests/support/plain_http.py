"""HTTP clients for the tests, which talk plain HTTP to servers on 127.0.0.1.

A new `httpx.Client` builds a TLS context from the CA bundle unless it is given one: 30 to 60 ms of CPU on
a 2-core box, and the tests make a client for nearly every request they poll with (every 50 to 100 ms).
These take the product's own choice instead (`tls_for`, as the CLI and the agent do): over plain http a
context with no certificates to load; an https URL is verified as httpx does by default.
"""

from __future__ import annotations

from typing import Any

import httpx

from gpupool.client.client import tls_for


def client(base_url: str, **kwargs: Any) -> httpx.Client:
    """An `httpx.Client` for `base_url` (other arguments as httpx takes them); no CA bundle over http."""
    return httpx.Client(base_url=base_url, verify=tls_for(base_url), **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    """`httpx.get` that loads no CA bundle over http."""
    return httpx.get(url, verify=tls_for(url), **kwargs)
