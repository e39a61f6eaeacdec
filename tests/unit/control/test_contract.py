"""The job contract's environment and paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpupool.control.contract import checkpoint_dir_for, job_environment, server_environment, workdir_for


def test_environment_has_every_contract_variable_and_hides_server_secrets() -> None:
    env = job_environment(
        base={"PATH": "/bin", "GPUPOOL_TOKEN": "secret", "GPUPOOL_DB": "x"},
        spec={"env": {"LR": "0.1"}},
        workload_id=3,
        workload_name="train",
        queue="nlp",
        attempt_number=2,
        gpu_indices=[4, 5],
        checkpoint_dir=Path("/ck"),
        node_address="10.0.0.1",
        master_port=29500,
    )
    assert env["PATH"] == "/bin" and env["LR"] == "0.1"
    assert "GPUPOOL_TOKEN" not in env and "GPUPOOL_DB" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5" and env["GPUPOOL_GPUS_PER_NODE"] == "2"
    assert env["GPUPOOL_ATTEMPT"] == "2" and env["GPUPOOL_JOB_ID"] == "3"
    assert env["MASTER_ADDR"] == env["GPUPOOL_MASTER_ADDR"] == "10.0.0.1"
    assert env["MASTER_PORT"] == env["GPUPOOL_MASTER_PORT"] == "29500"
    assert env["GPUPOOL_NODE_IPS"] == "10.0.0.1" and env["NNODES"] == "1" and env["NODE_RANK"] == "0"


def test_paths_resolve_relative_to_the_workdir_or_the_server_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert workdir_for({}, home, 9) == home / "work" / "9"
    workdir = workdir_for({"workdir": "/proj"}, home, 9)
    assert workdir == Path("/proj")
    assert checkpoint_dir_for({"checkpoint": {"dir": "ckpt"}}, workdir, home, 9) == Path("/proj/ckpt")
    assert checkpoint_dir_for({"checkpoint": {"dir": "/abs"}}, workdir, home, 9) == Path("/abs")
    assert checkpoint_dir_for({}, workdir, home, 9) == home / "checkpoints" / "9"


def test_an_array_task_knows_its_array_and_checkpoints_in_its_own_folder(tmp_path: Path) -> None:
    spec = {"array": "0-4,10%2", "checkpoint": {"dir": "ckpt"}}
    env = job_environment(
        base={},
        spec=spec,
        workload_id=14,
        workload_name="sweep",
        queue="nlp",
        attempt_number=0,
        gpu_indices=[0],
        checkpoint_dir=Path("/ck"),
        node_address="10.0.0.1",
        master_port=29500,
        array_id=9,
        array_index=10,
    )
    array = (env["GPUPOOL_ARRAY_ID"], env["GPUPOOL_ARRAY_INDEX"], env["GPUPOOL_ARRAY_COUNT"])
    assert array == ("9", "10", "6")
    assert checkpoint_dir_for(spec, Path("/proj"), tmp_path, 14, 10) == Path("/proj/ckpt/10")
    own = checkpoint_dir_for({"array": "0-4"}, Path("/proj"), tmp_path, 14, 3)
    assert own == tmp_path / "checkpoints" / "14"  # no dir given: every workload has its own already
    plain = job_environment(
        base={}, spec={}, workload_id=1, workload_name="one", queue="q", attempt_number=0, gpu_indices=[],
        checkpoint_dir=Path("/ck"), node_address="10.0.0.1", master_port=1,
    )  # fmt: skip
    assert not any(name.startswith("GPUPOOL_ARRAY") for name in plain)


def test_the_heads_own_credentials_stay_out_of_the_environment_jobs_get(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every backend builds a job's environment on server_environment() (Slurm passes it with
    --export=ALL): the head's store URL, tokens and passwords are the head's, not its jobs'."""
    head = {
        "PATH": "/usr/bin",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "LANG": "C.UTF-8",
        "GPUPOOL_DB": "postgresql://gpupool:hunter2@db/gpupool",
        "GPUPOOL_TOKEN": "gpt_admin",
        "PGPASSWORD": "hunter2",
        "AWS_SECRET_ACCESS_KEY": "aws",
        "AWS_SESSION_TOKEN": "aws-session",
        "vault_token": "v",
        "DATABASE_URL": "postgresql://u:p@h/d",
        "OPENAI_API_KEY": "sk",
        "MY_SECRET": "s",
        "GOOGLE_APPLICATION_CREDENTIALS": "/etc/head.json",
    }
    monkeypatch.setattr(os, "environ", head)
    env = job_environment(
        base=server_environment(),
        spec={"env": {"WANDB_API_KEY": "the-users-own"}},
        workload_id=1,
        workload_name="train",
        queue="default",
        attempt_number=0,
        gpu_indices=[0],
        checkpoint_dir=Path("/ck"),
        node_address="10.0.0.1",
        master_port=29500,
    )
    assert {k: env[k] for k in ("PATH", "SLURM_CONF", "LANG")} == {
        "PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/slurm.conf", "LANG": "C.UTF-8"
    }  # fmt: skip
    assert env["WANDB_API_KEY"] == "the-users-own", "the spec's env (and secrets) are added after the filter"
    leaked = sorted((set(head) - {"PATH", "SLURM_CONF", "LANG"}) & set(env))
    assert leaked == [] and not any(v in env.values() for v in ("hunter2", "gpt_admin", "aws", "sk"))
