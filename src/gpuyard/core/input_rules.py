"""Rules for user input that every surface (REST v1/v2, GraphQL, training) applies the
same way: environment limits, what a user-chosen name may hold, where a volume may be
mounted, integer ids in query strings, and how deeply a JSON text may nest.

Each check raises ValueError (pydantic validators turn it into the field's
VALIDATION_ERROR) or ValidationFailed naming the field. Pure: no I/O.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Mapping

from gpuyard.core.errors import ValidationFailed

# Integer ids are 32-bit in the store (PostgreSQL INTEGER): anything larger must be
# refused before it reaches a query (PostgreSQL errors, SQLite overflows past 2**63).
MAX_DB_ID = 2**31 - 1

# -- environment ---------------------------------------------------------------------

MAX_ENV_VARS = 256
MAX_ENV_NAME_CHARS = 256
MAX_ENV_VALUE_BYTES = 32 * 1024  # UTF-8
# All of them as the process sees them (``NAME=value``, UTF-8): far below Linux's
# argument-and-environment limit, so a container always starts.
MAX_ENV_TOTAL_BYTES = 256 * 1024


def env_bytes(env: Mapping[str, str | None]) -> int:
    """The environment's size as the limit counts it: ``NAME=value`` in UTF-8."""
    return sum(
        len(name) + 1 + len((value or "").encode("utf-8", "surrogatepass"))
        for name, value in env.items()
    )


def check_env_limits(env: Mapping[str, str | None]) -> None:
    """Raise ValueError when ``env`` has more than :data:`MAX_ENV_VARS` variables, a
    name longer than :data:`MAX_ENV_NAME_CHARS`, a value over :data:`MAX_ENV_VALUE_BYTES`
    or more than :data:`MAX_ENV_TOTAL_BYTES` in all. ``None`` values (removals) count
    as empty. The name pattern is core/models.py's ``validate_env``."""
    if len(env) > MAX_ENV_VARS:
        raise ValueError(f"{len(env)} environment variables; at most {MAX_ENV_VARS}")
    for name, value in env.items():
        if len(name) > MAX_ENV_NAME_CHARS:
            raise ValueError(
                f"environment variable name {name[:40]!r}... is longer than"
                f" {MAX_ENV_NAME_CHARS} characters"
            )
        size = len((value or "").encode("utf-8", "surrogatepass"))
        if size > MAX_ENV_VALUE_BYTES:
            raise ValueError(
                f"environment variable {name!r} is {size} bytes; at most {MAX_ENV_VALUE_BYTES}"
            )
    total = env_bytes(env)
    if total > MAX_ENV_TOTAL_BYTES:
        raise ValueError(
            f"the environment is {total} bytes (NAME=value, UTF-8); at most {MAX_ENV_TOTAL_BYTES}"
        )


# -- entrypoint and CUDA versions -----------------------------------------------------

# A container's ENTRYPOINT as a list of arguments: as bounded as docker_args (8 KiB).
MAX_ENTRYPOINT_ITEMS = 64
MAX_ENTRYPOINT_CHARS = 4096
MAX_ENTRYPOINT_TOTAL_CHARS = 8192
# A CUDA driver version as NVML and RunPod write it: "12", "12.4", "12.10".
CUDA_VERSION_PATTERN = r"^[0-9]+(\.[0-9]+)?$"


def check_entrypoint(entrypoint: list[str]) -> list[str]:
    """``entrypoint`` unchanged, or ValueError when it has more than
    :data:`MAX_ENTRYPOINT_ITEMS` items or more than :data:`MAX_ENTRYPOINT_TOTAL_CHARS`
    characters in all. An empty list is allowed (it clears the image's ENTRYPOINT)."""
    if len(entrypoint) > MAX_ENTRYPOINT_ITEMS:
        raise ValueError(f"{len(entrypoint)} items; at most {MAX_ENTRYPOINT_ITEMS}")
    total = sum(len(item) for item in entrypoint)
    if total > MAX_ENTRYPOINT_TOTAL_CHARS:
        raise ValueError(f"{total} characters in all; at most {MAX_ENTRYPOINT_TOTAL_CHARS}")
    return entrypoint


# -- names and display text ------------------------------------------------------------

# Characters that can make shown text lie about itself: bidirectional overrides,
# embeddings, isolates and marks (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F,
# U+061C: "Trojan Source" reordering) and line/paragraph separators. Written as regex
# escapes, which Python's re, ECMA and so JSON Schema all read the same way.
_BIDI = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
# Names: no C0 control, DEL or C1 control either (terminal escapes, line breaks).
_NAME_BAD = rf"\x00-\x1f\x7f-\x9f{_BIDI}"
# Descriptions may span lines and hold tabs; nothing else of the above.
_TEXT_BAD = rf"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f{_BIDI}"
# The rules as JSON Schema patterns, so the OpenAPI document says what is accepted.
NAME_PATTERN = f"^[^{_NAME_BAD}]*$"
TEXT_PATTERN = f"^[^{_TEXT_BAD}]*$"
# A required name: as NAME_PATTERN, with at least one character that is not white space
# (names are stripped before they are stored, so a blank one is empty).
REQUIRED_NAME_PATTERN = rf"^[^{_NAME_BAD}]*[^{_NAME_BAD}\s][^{_NAME_BAD}]*$"
_BAD_IN_NAME = re.compile(f"[{_NAME_BAD}]")
_BAD_IN_TEXT = re.compile(f"[{_TEXT_BAD}]")


def _refuse(pattern: re.Pattern[str], value: str, what: str) -> str:
    found = pattern.search(value)
    if found is not None:
        char = found.group()
        raise ValueError(f"must not contain {what} (U+{ord(char):04X} at position {found.start()})")
    return value


def shown_safely(value: str) -> str:
    """``value`` with every character a name may not hold (controls, bidirectional
    controls) replaced by U+FFFD: for text stored before the rules, shown on a
    terminal, where an escape sequence would act instead of being seen."""
    return _BAD_IN_NAME.sub("\ufffd", value)


def check_name(value: str) -> str:
    """``value`` unchanged, or ValueError when it holds a control character (C0, DEL,
    C1) or a bidirectional-text control. For every user-chosen name."""
    return _refuse(_BAD_IN_NAME, value, "control or bidirectional-text characters")


def check_text(value: str) -> str:
    """As :func:`check_name`, but tab, line feed and carriage return are allowed: for
    descriptions, which may span lines."""
    return _refuse(_BAD_IN_TEXT, value, "control or bidirectional-text characters")


# -- volume mount path -----------------------------------------------------------------

# Top-level directories a volume must never cover or sit under: the kernel's
# interfaces, the image's system files, and /run (plus its usual aliases).
FORBIDDEN_MOUNT_ROOTS = ("/sys", "/proc", "/dev", "/etc", "/usr", "/bin", "/sbin", "/boot", "/run")
# Debian and Ubuntu images link these into /run; the engine follows the link.
FORBIDDEN_MOUNT_ALIASES = ("/var/run", "/var/lock")
# Plain path segments only: ':' and ',' mean something in the engine's mount syntax.
_SEGMENT = re.compile(r"[A-Za-z0-9._@+=~-]+")
MAX_MOUNT_PATH_CHARS = 512
# The shape of a mount path for the OpenAPI document: absolute, plain segments (the
# system directories and "." / ".." segments are refused by check_mount_path).
MOUNT_PATH_PATTERN = r"^(/[A-Za-z0-9._@+=~-]+)+$"


def check_mount_path(path: str) -> str:
    """``path`` unchanged when it is an absolute, normalised path of plain segments
    (letters, digits, ``._@+=~-``) that is not ``/``, not under a system directory
    (:data:`FORBIDDEN_MOUNT_ROOTS`, any top-level ``/lib*``, the /run aliases) and
    holds no ``.`` or ``..`` segment. Raises ValueError saying which rule it breaks."""
    if len(path) > MAX_MOUNT_PATH_CHARS:
        raise ValueError(f"must be at most {MAX_MOUNT_PATH_CHARS} characters")
    if not path.startswith("/"):
        raise ValueError("must be an absolute path (starting with '/')")
    if path == "/":
        raise ValueError("must not be '/'")
    segments = path[1:].split("/")
    if any(s in (".", "..") for s in segments):
        raise ValueError("must not contain '.' or '..' segments")
    if "" in segments:  # "//x", "/a//b", "/a/" (normpath keeps a leading "//")
        normal = "/" + "/".join(s for s in segments if s)
        raise ValueError(f"must be a normalised path (did you mean {normal!r}?)")
    for segment in segments:
        if not _SEGMENT.fullmatch(segment):
            raise ValueError(
                f"segment {segment[:40]!r} may hold only letters, digits and '._@+=~-'"
            )
    for root in (*FORBIDDEN_MOUNT_ROOTS, *FORBIDDEN_MOUNT_ALIASES):
        if path == root or path.startswith(root + "/"):
            raise ValueError(f"must not be {root} or under it (a system directory)")
    if segments[0].startswith("lib"):
        raise ValueError(f"must not be /{segments[0]} or under it (a system directory)")
    return path


# -- integer ids -----------------------------------------------------------------------

_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def parse_id(field: str, value: str | None, *, required: bool = False) -> int | None:
    """An id from a query string or path: plain ASCII digits, 1..:data:`MAX_DB_ID`.
    None when absent (empty) and not ``required``. Raises ValidationFailed(field)."""
    if value is None or value == "":
        if required:
            raise ValidationFailed(field, "is required")
        return None
    if not _DIGITS.fullmatch(value):
        raise ValidationFailed(field, f"{value[:40]!r} is not an integer id")
    # int() of thousands of digits is refused by Python itself; anything this long is
    # out of range anyway.
    number = int(value) if len(value) <= 20 else MAX_DB_ID + 1
    if not 1 <= number <= MAX_DB_ID:
        raise ValidationFailed(field, f"must be an id between 1 and {MAX_DB_ID}")
    return number


# -- JSON nesting ----------------------------------------------------------------------

MAX_JSON_DEPTH = 64
# A string runs to its closing quote, or to the end of an unterminated text, so every
# match attempt succeeds and the scan stays linear (no quadratic retries).
_JSON_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
# Openers become 2 and closers 0, everything else goes: after the k-th bracket the
# running sum minus k is the nesting depth there.
_AS_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_too_deep(text: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON ``text`` nests arrays and objects deeper than ``limit``, judged
    before parsing, so a parser's recursion is never reached. Linear, with C-level
    iterators only (about 20 ms for a megabyte of brackets). Brackets in strings do not
    count; unbalanced text may be judged either way (the parser refuses it anyway)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False  # the common case: too few brackets to be too deep
    steps = _JSON_STRING.sub(b"", raw).translate(_AS_STEPS, _NOT_BRACKETS)
    deepest = max(map(operator.sub, itertools.accumulate(steps), itertools.count(1)), default=0)
    return deepest > limit


def value_too_deep(value: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a parsed JSON value nests lists and dicts deeper than ``limit``.
    Iterative, so any depth is safe to ask about."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[object] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
