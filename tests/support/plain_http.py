"""HTTP clients for the tests, which talk plain HTTP to servers on 127.0.0.1.

A new `httpx.Client` builds a TLS context from the CA bundle unless it is given one: 30 to 60 ms of CPU on
a 2-core box, and the tests make a client for nearly every request they poll with (every 50 to 100 ms).
One context without certificates, built once, serves them all; a URL that did use TLS would fail its
verification with it, never pass it.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx

PLAIN = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def client(**kwargs: Any) -> httpx.Client:
    """An `httpx.Client` (its keyword arguments) with no CA bundle to load."""
    return httpx.Client(verify=PLAIN, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    """`httpx.get` with no CA bundle to load."""
    return httpx.get(url, verify=PLAIN, **kwargs)
