"""Under torchrun the bench is one rank of torchrun's group; rank 0 alone returns the report."""

from __future__ import annotations

import socket

import pytest

from gpupool.bench.launch import under_torchrun

torch = pytest.importorskip("torch")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _where(ctx: object) -> tuple[int, int, str]:
    from gpupool.bench.launch_torch import Rank

    assert isinstance(ctx, Rank)
    return ctx.rank, ctx.world_size, ctx.device.type


def test_torchrun_variables_make_this_process_one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.bench import launch_torch

    assert not under_torchrun()
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for name, value in {**env, "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(name, value)
    assert under_torchrun()
    # No process is started: the function runs here, in the group torchrun's variables describe.
    assert launch_torch.run(_where, (), nproc=99, backend="gloo") == (0, 1, "cpu")
