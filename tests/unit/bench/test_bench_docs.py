"""docs/bench.md keeps up with the bench commands: every flag of every command is documented."""

from __future__ import annotations

from pathlib import Path

import typer

from gpupool.cli.bench import bench_app

DOC = Path(__file__).resolve().parents[3] / "docs" / "bench.md"


def test_every_bench_flag_is_in_docs_bench_md() -> None:
    text = DOC.read_text()
    group = typer.main.get_command(bench_app)
    missing = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        assert f"gpupool bench {name}" in text
        for param in command.params:
            if param.param_type_name == "option" and not any(opt in text for opt in param.opts):
                missing.append(f"{name} {'/'.join(param.opts)}")
    assert not missing, f"docs/bench.md lacks {missing}"
