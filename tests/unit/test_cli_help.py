"""Every command's ``--help`` reads as plain text: no reStructuredText markup from
docstrings (double backticks, roles such as ``:class:``, stray ``\\b``), and every
option says what it does."""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from gpuyard.cli.main import cli

_ROLE = re.compile(r":(param|class|func|meth|data|attr|mod|ref|exc|obj|py:\w+)[: ]")


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


COMMANDS = list(_commands(cli))


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "gpuyard")
def test_help_is_plain_text(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "``" not in text, text
    assert not _ROLE.search(text), text
    assert "\b" not in text and "\\b" not in text, text


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "gpuyard")
def test_every_option_has_help(path: tuple[str, ...]) -> None:
    command = _command(path)
    bare = [
        p.name
        for p in command.params
        if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()
    ]
    assert not bare, f"{' '.join(path)}: options without help: {bare}"
