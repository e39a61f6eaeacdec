"""`gpupool --help` and each command's help: sentences wrap where the terminal does, not where the source
wrapped its docstring (Typer's Rich help keeps a docstring's single line breaks)."""

from __future__ import annotations

import inspect
from typing import Any

import typer.main

from gpupool.main import app, reflow_help


def _commands(command: Any, path: str = "gpupool") -> list[tuple[str, Any]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, f"{path} {name}")
    return found


def test_every_help_paragraph_is_one_line_once_reflowed() -> None:
    commands = _commands(reflow_help(typer.main.get_command(app)))
    assert len(commands) > 40  # every command and group, nested ones too
    for path, command in commands:
        for paragraph in inspect.cleandoc(command.help or "").split("\n\n"):
            assert "\n" not in paragraph, (path, paragraph)


def test_reflowing_keeps_paragraphs_and_a_kept_as_written_block() -> None:
    class Command:
        help = "First line\n    goes on.\n\n    Second\n    paragraph.\n\n    \b\n    a\n    b"

    reflow_help(Command)
    assert Command.help == "First line goes on.\n\nSecond paragraph.\n\n\b\na\nb"
