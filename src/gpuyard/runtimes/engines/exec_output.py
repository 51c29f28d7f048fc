"""Telling a command's empty output from output the engine lost.

Podman's Docker-compatible exec (4.3 at least) can return a command's exit code
without the end of its output, or without any of it, when the command exits at once
(``cat`` of a small file, ``pidof``): about one call in twenty on a loaded two-core
machine. Conmon attaches before the command starts, so what is lost is the end.
"No nodes", "no pid" and "no exit code" read from such an answer would be wrong.

So the command runs under a shell that prints a marker line after it. Output that
ends with the marker arrived whole (the stream is ordered); output without it did not,
and the command is run again. Commands given to :func:`run_keeping_output` must
therefore be safe to repeat.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MARKER = "--gpuyard-exec-output-end--"
ATTEMPTS = 3

# The marker on a line of its own after whatever the command printed last.
_SUFFIX = f"\n{MARKER}\n"

Exec = Callable[[list[str]], tuple[int, str]]


def marked(argv: Sequence[str]) -> list[str]:
    """``argv`` run by ``sh``, which then prints the marker and exits with the
    command's exit code."""
    script = f'"$@"; rc=$?; printf "\\n%s\\n" {MARKER}; exit $rc'
    return ["sh", "-c", script, "sh", *argv]


def unmarked(output: str) -> str | None:
    """The command's own output, or None when the marker did not arrive."""
    return output[: -len(_SUFFIX)] if output.endswith(_SUFFIX) else None


def run_keeping_output(run: Exec, argv: Sequence[str], attempts: int = ATTEMPTS) -> tuple[int, str]:
    """Run ``argv`` through ``run`` (one exec of a command line in a container, giving
    its exit code and output) until its output arrives whole, at most ``attempts``
    times. When every attempt lost some, the last answer is returned as it came."""
    code, output = -1, ""
    for _ in range(max(1, attempts)):
        code, output = run(marked(argv))
        own = unmarked(output)
        if own is not None:
            return code, own
    return code, output
