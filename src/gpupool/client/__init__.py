"""The Python SDK: `Client` talks to a gpupool server over HTTP."""

from gpupool.client.client import (
    ApiError,
    Client,
    ConnectionFailed,
    GpupoolError,
    WaitTimeout,
    load_credentials,
)

__all__ = ["ApiError", "Client", "ConnectionFailed", "GpupoolError", "WaitTimeout", "load_credentials"]
