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


def test_every_option_says_what_it_does_and_a_flag_takes_no_value() -> None:
    from typer.testing import CliRunner

    commands = _commands(reflow_help(typer.main.get_command(app)))
    silent = [
        f"{path} {option.opts[0]}"
        for path, command in commands
        for option in getattr(command, "params", [])
        if option.param_type_name == "option" and not option.help
    ]
    assert silent == []  # `--help` itself has help too

    shown = CliRunner().invoke(app, ["ps", "--help"], env={"COLUMNS": "100"})
    assert shown.exit_code == 0
    flags = [line for line in shown.output.splitlines() if line.startswith(("│ --all", "│ --json"))]
    assert len(flags) == 2 and all("<bool>" not in line for line in flags), flags  # not `--all <bool>`
    assert "<str>" in next(line for line in shown.output.splitlines() if "--queue" in line)


def test_a_log_level_that_is_none_is_refused_before_anything_starts() -> None:
    from typer.testing import CliRunner

    for command in ("server", "agent"):
        refused = CliRunner().invoke(app, [command, "--log-level", "verbose"], env={"COLUMNS": "200"})
        assert refused.exit_code == 2, refused.output  # a usage error, no traceback from logging
        assert "'verbose' is not a log level; give one of debug, info, warning, error" in refused.output
