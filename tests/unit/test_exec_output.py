"""Exec output the engine lost is told from a command's empty output, and only then
is the command run again."""

from __future__ import annotations

import subprocess

from gpuyard.runtimes.engines.exec_output import marked, run_keeping_output, unmarked


def local(argv: list[str]) -> tuple[int, str]:
    """One "exec": the command line run here, stdout and stderr together."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout


def test_the_marked_command_keeps_its_output_exit_code_and_arguments() -> None:
    code, out = local(marked(["sh", "-c", 'printf "%s|" "$@"; exit 3', "x", "a b", "$HOME", ""]))
    assert code == 3
    assert unmarked(out) == "a b|$HOME||"


def test_empty_output_is_not_lost_output() -> None:
    assert run_keeping_output(local, ["true"]) == (0, "")
    assert run_keeping_output(local, ["false"]) == (1, "")


def test_lost_output_is_asked_again() -> None:
    calls: list[list[str]] = []

    def loses_twice(argv: list[str]) -> tuple[int, str]:
        calls.append(argv)
        code, out = local(argv)
        return (code, "") if len(calls) < 3 else (code, out)

    assert run_keeping_output(loses_twice, ["echo", "epoch-7"]) == (0, "epoch-7\n")
    assert len(calls) == 3


def test_output_lost_every_time_comes_back_as_it_came() -> None:
    calls = []

    def always_loses(argv: list[str]) -> tuple[int, str]:
        calls.append(argv)
        return 0, ""

    assert run_keeping_output(always_loses, ["cat", "/etc/hostname"], attempts=3) == (0, "")
    assert len(calls) == 3
