"""/api/v1/foreign-jobs: work the execution backend runs that gpupool did not start (plain sbatch jobs)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gpupool.control import inventory

router = APIRouter(prefix="/foreign-jobs", tags=["nodes"])


@router.get("", summary="Jobs submitted to Slurm outside gpupool: they hold capacity gpupool leaves alone")
def list_foreign_jobs(request: Request) -> list[dict[str, Any]]:
    return inventory.foreign_jobs(request.app.state.runtime.store)
