"""GET /metrics: the Prometheus exposition (text format 0.0.4), behind the same bearer token as the API."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpupool.api.auth import require_token
from gpupool.control.tokens import Caller

router = APIRouter(tags=["metrics"])


@router.api_route(
    "/metrics",
    methods=["GET", "HEAD"],  # HEAD: probes (no body)
    summary="Prometheus metrics (dcgm-exporter GPU series and gpupool's own)",
)
def metrics(request: Request, _: Caller = Depends(require_token)) -> Response:
    return Response(
        generate_latest(request.app.state.runtime.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
